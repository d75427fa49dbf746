package redisdb

import (
	"context"
	"maps"
	"testing"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
)

// TestFirstKey checks firstKey on the commands as go-redis builds them:
// the key a durable write's master is noted for.
func TestFirstKey(t *testing.T) {
	ctx := context.Background()
	script := redis.NewScript(`return 1`)
	tests := []struct {
		name string
		cmd  redis.Cmder
		want string
	}{
		{"Incr", redis.NewIntCmd(ctx, "incr", postSeqKey), postSeqKey},
		{"EvalSha", redis.NewCmd(ctx, "evalsha", script.Hash(), 2, "w:u:{1}", "w:u:{2}", "arg"), "w:u:{1}"},
		{"EvalShaKeyPointer", redis.NewCmd(ctx, "evalsha", script.Hash(), 1, new("w:u:{3}:home"), "arg"), "w:u:{3}:home"},
		{"EvalNoKeys", redis.NewCmd(ctx, "eval", "return 1", 0, "arg"), ""},
		{"SPublish", redis.NewIntCmd(ctx, "spublish", "w:ch:{1}:wait", ""), "w:ch:{1}:wait"},
		{"ClusterShards", redis.NewClusterShardsCmd(ctx, "cluster", "shards"), ""},
		{"Wait", redis.NewCmd(ctx, "wait", 1, 1000), ""},
	}
	for _, tt := range tests {
		if got := firstKey(tt.cmd); got != tt.want {
			t.Errorf("firstKey(%s %v) = %q, want %q", tt.name, tt.cmd.Args(), got, tt.want)
		}
	}
}

// TestNoteWritesNotesTheScriptsKeys checks, on a cluster, that the hook
// notes the master of a script's key as its writes go out: a script is
// how most durable writes are made.
func TestNoteWritesNotesTheScriptsKeys(t *testing.T) {
	ctx := context.Background()
	db := newClusterDB(t, testCluster(t), Options{})
	cc := db.client.(*redis.ClusterClient)
	nctx := db.noteWrites(ctx)
	key := followingKey("42")
	if err := followScript.Run(nctx, db.client, []string{key}, "43", msString(db.now()), 10).Err(); err != nil {
		t.Fatal(err)
	}
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	w := writesOf(nctx)
	if got := w.masters[waitChannel(key)]; got != m.Options().Addr {
		t.Fatalf("noted masters %v, want %s for %s", w.masters, m.Options().Addr, waitChannel(key))
	}
	if err := db.awaitReplicas(nctx, key); err != nil {
		t.Fatal(err)
	}
}

// TestClusterDurableWritesNoteTheirMasters checks that a signup, a post
// and a follow each reach their wait with the master of a slot they
// wrote to noted, as the slot map names it: were one of them not noted,
// its wait would go to the slot's master at the time of the wait.
func TestClusterDurableWritesNoteTheirMasters(t *testing.T) {
	ctx := context.Background()
	db := newClusterDB(t, testCluster(t), Options{})
	cc := db.client.(*redis.ClusterClient)
	var noted map[string]string
	db.beforeWait = func(ctx context.Context) {
		noted = nil
		if w := writesOf(ctx); w != nil {
			noted = maps.Clone(w.masters)
		}
	}
	check := func(what, key string) {
		t.Helper()
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got := noted[waitChannel(key)]; got != m.Options().Addr {
			t.Errorf("%s: noted masters %v, want %s for %s", what, noted, m.Options().Addr, waitChannel(key))
		}
	}
	ada := mustSignup(t, db, "ada")
	check("Signup", userKey(ada.ID))
	bob := mustSignup(t, db, "bob")
	p := mustCreatePost(t, db, ada.ID, "hello")
	check("CreatePost", postKey(ada.ID, postSeqText(p)))
	mustFollow(t, db, bob.ID, ada.ID)
	check("Follow", followingKey(bob.ID))
}

// BenchmarkNoteWrites measures what noting the masters of a durable
// write costs a command on a cluster: Plain is a SET, Noted the same SET
// in a noted context, the first to its slot (a lookup in the slot map
// and a map entry); NoteAlone is that noting without the SET; CreatePost
// puts it in scale, a post that waits for a replica of each master it
// wrote to.
func BenchmarkNoteWrites(b *testing.B) {
	ctx := context.Background()
	c := redistest.NewCluster(b, redistest.ClusterOptions{Masters: 3, Replicas: 1})
	db := NewDB(c.Client(b), Options{BcryptCost: bcrypt.MinCost})
	b.Run("Plain", func(b *testing.B) {
		for b.Loop() {
			if err := db.client.Set(ctx, "w:bench", "x", 0).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Noted", func(b *testing.B) {
		for b.Loop() {
			if err := db.client.Set(db.noteWrites(ctx), "w:bench", "x", 0).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("NoteAlone", func(b *testing.B) {
		cmd := redis.NewStatusCmd(ctx, "set", "w:bench", "x")
		h := masterNoter{db.client.(*redis.ClusterClient)}
		for b.Loop() {
			h.noteAll(db.noteWrites(ctx), cmd)
		}
	})
	b.Run("CreatePost", func(b *testing.B) {
		ada := mustSignup(b, db, "ada")
		posts := NewPostService(db)
		for b.Loop() {
			if _, err := posts.CreatePost(ctx, ada.ID, "hello"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
