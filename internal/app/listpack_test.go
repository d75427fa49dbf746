package app

import (
	"bufio"
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
)

// TestStartChecksListpackLimits runs `warble worker` and the server on a
// real Redis under its default sorted-set limits: the server, by default,
// warns once with what to set and changes nothing; the worker, with
// REDIS_SET_LISTPACK=true, sets zset-max-listpack-entries to
// HOME_TIMELINE_CAP and the 128 of slack fan-out needs on every server.
func TestStartChecksListpackLimits(t *testing.T) {
	srv := redistest.New(t)
	if srv.Embedded() {
		t.Skip("the embedded Redis has no sorted-set encodings")
	}
	client := srv.Client(t)
	entries := func() []string {
		var got []string
		var mu sync.Mutex // the servers of a cluster answer at once
		each := func(ctx context.Context, n *redis.Client) error {
			v, err := n.ConfigGet(ctx, "zset-max-listpack-entries").Result()
			mu.Lock()
			defer mu.Unlock()
			got = append(got, v["zset-max-listpack-entries"])
			return err
		}
		ctx := context.Background()
		var err error
		if c, ok := client.(*redis.ClusterClient); ok {
			err = c.ForEachShard(ctx, each)
		} else {
			err = each(ctx, client.(*redis.Client))
		}
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	reset := func() {
		set := func(ctx context.Context, n *redis.Client) error {
			return n.ConfigSet(ctx, "zset-max-listpack-entries", "128").Err()
		}
		if c, ok := client.(*redis.ClusterClient); ok {
			c.ForEachShard(context.Background(), set)
		} else {
			set(context.Background(), client.(*redis.Client))
		}
	}
	reset()
	t.Cleanup(reset)

	// start runs the program until it logs until, and returns what it
	// logged by then; the program stops when the test ends.
	start := func(run func(context.Context, []string, func(string) string, io.Writer) error, args []string, env map[string]string, until string) string {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, args, func(k string) string { return env[k] }, pw)
			pw.Close()
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		})
		var log strings.Builder
		lines := bufio.NewScanner(pr)
		for lines.Scan() {
			log.WriteString(lines.Text() + "\n")
			if strings.Contains(lines.Text(), until) {
				break
			}
		}
		go io.Copy(io.Discard, pr)
		return log.String()
	}

	env := map[string]string{"REDIS_URL": srv.URL, "HOME_TIMELINE_CAP": "500", "FANOUT_WORKERS": "1", "METRICS": "off"}
	log := start(Run, []string{"-host", "127.0.0.1", "-port", "0"}, env, "warble is listening")
	if strings.Count(log, "level=WARN") != 1 || !strings.Contains(log, "Set zset-max-listpack-entries 628 in redis.conf") {
		t.Errorf("server log, want one warning that says what to set:\n%s", log)
	}
	for _, v := range entries() {
		if v != "128" {
			t.Fatalf("zset-max-listpack-entries = %s after a server start without REDIS_SET_LISTPACK, want 128 untouched", v)
		}
	}

	env["REDIS_SET_LISTPACK"] = "true"
	log = start(RunWorkers, nil, env, "fan-out workers running")
	if strings.Contains(log, "level=WARN") || !strings.Contains(log, "raised the sorted-set listpack limits") {
		t.Errorf("worker log with REDIS_SET_LISTPACK=true:\n%s", log)
	}
	for _, v := range entries() {
		if v != "628" { // the cap and the slack of fan-out's amortized trim
			t.Errorf("zset-max-listpack-entries = %s after a worker start with REDIS_SET_LISTPACK=true, want 628", v)
		}
	}
}
