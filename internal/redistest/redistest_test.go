package redistest

import (
	"context"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestNewIsEmptyAndWritable(t *testing.T) {
	s := New(t)
	c := s.Client(t)
	ctx := context.Background()
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSize = %d, %v; want 0, nil", n, err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.Get(ctx, "k").Val(); got != "v" {
		t.Fatalf("Get(k) = %q, want %q", got, "v")
	}
}

func TestStopAndRestart(t *testing.T) {
	s := New(t)
	if s.cmd == nil {
		t.Skip("needs a redis-server started by redistest")
	}
	c := s.Client(t)
	ctx := context.Background()
	s.Stop(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("Ping after Stop succeeded")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping after Restart: %v", err)
	}
}

// TestSlot checks hash slots against what CLUSTER KEYSLOT of a
// cluster-enabled redis-server 7.0 answered for the same keys.
func TestSlot(t *testing.T) {
	for key, want := range map[string]int{
		"foo":                  12182,
		"bar":                  5061,
		"{user1000}.following": 3443,
		"{user1000}.followers": 3443,
		"w:u:{42}:home":        8000,
		"42":                   8000,
		"a{}b":                 13694, // an empty tag hashes the whole key
	} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
}

// TestSlotGuard checks that the guard flags a script and a transaction that
// span slots, and passes ones that do not.
func TestSlotGuard(t *testing.T) {
	s := New(t)
	ctx := context.Background()
	script := redis.NewScript(`return #KEYS`)
	run := func(keys ...string) bool {
		ft := &fakeTB{TB: t}
		c := redis.NewClient(s.Options())
		defer c.Close()
		c.AddHook(NewSlotGuard(ft))
		script.Run(ctx, c, keys)
		c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Incr(ctx, k)
			}
			p.Publish(ctx, "some-channel", "x")
			return nil
		})
		ft.cleanup()
		return ft.failed
	}
	if run("w:u:{1}:home", "w:u:{1}:following") {
		t.Error("keys of one hash tag were flagged")
	}
	if !run("w:u:{1}:home", "w:u:{2}:home") {
		t.Error("keys of two hash tags were not flagged")
	}

	// Keys passed as pointers to strings, as fan-out passes them, are
	// the strings they point to.
	byPointer := func(keys ...string) bool {
		ft := &fakeTB{TB: t}
		c := redis.NewClient(s.Options())
		defer c.Close()
		c.AddHook(NewSlotGuard(ft))
		args := []any{"evalsha", script.Hash(), len(keys)}
		for i := range keys {
			args = append(args, &keys[i])
		}
		script.Load(ctx, c)
		c.Process(ctx, redis.NewCmd(ctx, args...))
		ft.cleanup()
		return ft.failed
	}
	if byPointer("w:u:{1}:home", "w:u:{1}:following") {
		t.Error("keys of one hash tag, by pointer, were flagged")
	}
	if !byPointer("w:u:{1}:home", "w:u:{2}:home") {
		t.Error("keys of two hash tags, by pointer, were not flagged")
	}
}

// fakeTB records errors instead of failing the test, and runs its
// cleanups when asked.
type fakeTB struct {
	testing.TB
	failed   bool
	cleanups []func()
}

func (f *fakeTB) Error(...any)      { f.failed = true }
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }
func (f *fakeTB) cleanup() {
	for _, fn := range f.cleanups {
		fn()
	}
}

func TestDiff(t *testing.T) {
	before := map[string]string{"a": "1", "b": "2", "c": "3"}
	after := map[string]string{"a": "1", "b": "two", "d": "4"}
	var got []string
	for _, d := range Diff(before, after) {
		got = append(got, d.String())
	}
	if want := []string{"~b", "-c", "+d"}; !slices.Equal(got, want) {
		t.Errorf("Diff = %v, want %v", got, want)
	}
	if d := Diff(before, before); len(d) != 0 {
		t.Errorf("Diff of a map with itself = %v", d)
	}
}
