package redisdb

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
)

// workerProcessEnv names the environment variable that makes this test
// binary a fan-out worker process (see TestFanOutWorkerProcess).
const workerProcessEnv = "WARBLE_TEST_FANOUT_WORKER"

// TestFanOutWorkerProcess is not a test: it is the fan-out worker process of
// TestFanOutSurvivesKilledWorker, run as this test binary with
// workerProcessEnv set. It works the queue of the Redis at REDIS_URL until
// it is killed, with FANOUT_BATCH and FANOUT_CLAIM_IDLE as `warble worker`
// reads them.
func TestFanOutWorkerProcess(t *testing.T) {
	if os.Getenv(workerProcessEnv) != "1" {
		t.Skip("the worker process of TestFanOutSurvivesKilledWorker")
	}
	client, err := redistest.ClientForURL(os.Getenv("REDIS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := strconv.Atoi(os.Getenv("FANOUT_BATCH"))
	idle, _ := time.ParseDuration(os.Getenv("FANOUT_CLAIM_IDLE"))
	db := NewDB(client, Options{AsyncFanOut: true, PullThreshold: -1})
	NewWorker(db, WorkerOptions{Batch: batch, ClaimIdle: idle}).Run(context.Background())
}

// TestFanOutSurvivesKilledWorker runs the fan-out of a post to 50,000
// followers in a real worker process (this test binary, as
// TestFanOutWorkerProcess), SIGKILLs it part-way, lets a second worker
// process take the job over, and checks that every follower got the post
// exactly once: in the timeline, and in what was announced.
func TestFanOutSurvivesKilledWorker(t *testing.T) {
	testKilledWorker(t, func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFanOutWorkerProcess$")
		cmd.Env = append(os.Environ(), workerProcessEnv+"=1")
		return cmd
	})
}

// testKilledWorker is TestFanOutSurvivesKilledWorker with worker processes
// started by command, which sets what else they need in their environment.
func testKilledWorker(t *testing.T, command func() *exec.Cmd) {
	if testing.Short() {
		t.Skip("fans out to 50,000 followers in other processes")
	}
	srv := redistest.New(t)
	if srv.Embedded() {
		t.Skip("needs a redis-server that other processes can reach")
	}
	ctx := context.Background()

	db := NewDB(srv.Client(t), Options{BcryptCost: bcrypt.MinCost, AsyncFanOut: true, PullThreshold: -1})
	ada := mustSignup(t, db, "ada")
	const n = 50000
	follower := func(i int) string { return strconv.Itoa(100000 + i) }
	pipe := db.client.Pipeline()
	for i := range n {
		score := float64(i - i%3) // some followers tie on their follow time
		pipe.ZAdd(ctx, followersKey(ada.ID), redis.Z{Score: score, Member: follower(i)})
		pipe.ZAdd(ctx, followingKey(follower(i)), redis.Z{Score: score, Member: ada.ID})
		if pipe.Len() >= 10000 {
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	// Count what every home channel hears, on connections of their own.
	homes := make([]string, n)
	for i := range n {
		homes[i] = homeChannel(follower(i))
	}
	hear := hearChannels(t, db, homes)

	p, err := NewPostService(db).CreatePost(ctx, ada.ID, "to fifty thousand")
	if err != nil {
		t.Fatal(err)
	}
	shard := db.fanOutShard(ada.ID)
	jobs := db.client.XRange(ctx, fanoutStreamKey(shard), "-", "+").Val()
	if len(jobs) != 1 {
		t.Fatalf("stream holds %d jobs, want 1", len(jobs))
	}
	cursorKey := fanoutCursorKey(shard, jobs[0].ID)

	startWorker := func(name string, claimIdle time.Duration) (*exec.Cmd, *bytes.Buffer) {
		cmd := command()
		cmd.Env = append(cmd.Env, "REDIS_URL="+srv.URL, "FANOUT_WORKERS=1",
			"FANOUT_BATCH=200", "FANOUT_PULL_THRESHOLD=off", "FANOUT_CLAIM_IDLE="+claimIdle.String(), "LOG_LEVEL=warn")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() && out.Len() > 0 {
				t.Logf("%s said:\n%s", name, out.String())
			}
		})
		return cmd, &out
	}
	delivered := func() int {
		pipe := db.client.Pipeline()
		scores := make([]*redis.FloatCmd, n)
		for i := range n {
			scores[i] = pipe.ZScore(ctx, homeKey(follower(i)), p.ID)
		}
		pipe.Exec(ctx)
		got := 0
		for _, c := range scores {
			if c.Err() == nil {
				got++
			}
		}
		return got
	}

	start := time.Now()
	first, _ := startWorker("first worker", time.Minute)
	// Kill it once its cursor is well into the followers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := parseCursorText(db.client.Get(ctx, cursorKey).Val())
		if err == nil && c >= n/4 {
			break
		}
		if queuedJobs(t, db) == 0 {
			t.Fatal("the first worker finished before it could be killed")
		}
		if time.Now().After(deadline) {
			t.Fatal("the first worker made no progress")
		}
		time.Sleep(time.Millisecond)
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	before := delivered()
	t.Logf("killed the first worker after %v with %d of %d followers delivered to", time.Since(start).Round(time.Millisecond), before, n)
	if before == 0 || before == n {
		t.Fatalf("killed with %d of %d delivered, want part-way", before, n)
	}

	resumed := time.Now()
	startWorker("second worker", 200*time.Millisecond)
	deadline = time.Now().Add(30 * time.Second)
	for queuedJobs(t, db) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the second worker did not finish the job")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the second worker finished the job %v after it started", time.Since(resumed).Round(time.Millisecond))
	if n := db.client.Exists(ctx, cursorKey).Val(); n != 0 {
		t.Error("the finished job's cursor is still there")
	}
	if got := delivered(); got != n {
		t.Errorf("%d of %d followers hold the post", got, n)
	}

	// Every home channel heard the post exactly once: the markers come
	// after every announcement on the subscriptions' connections.
	heard := hear()
	twice, never := 0, 0
	for i := range n {
		switch heard[homeChannel(follower(i))] {
		case 0:
			never++
		case 1:
		default:
			twice++
		}
	}
	if twice != 0 || never != 0 {
		t.Errorf("of %d followers, %d heard the post more than once and %d never", n, twice, never)
	}
}

// parseCursorText returns the score of a saved follower cursor.
func parseCursorText(s string) (int, error) {
	c, ok := parseFollowerCursor(s)
	if !ok {
		return 0, fmt.Errorf("malformed cursor %q", s)
	}
	f, err := strconv.ParseFloat(c.at, 64)
	return int(f), err
}

// hearChannels counts the messages on channels from now on, on connections
// of its own, and returns a func that waits until everything published
// before it was called has arrived and returns the counts by channel. On
// one Redis that is one pattern subscription; on a cluster, where shard
// channels have no patterns, one connection per master subscribes to the
// channels of its slots, and a marker on each connection tells when it has
// delivered everything.
func hearChannels(t *testing.T, db *DB, channels []string) func() map[string]int {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	heard := make(map[string]int)
	type conn struct {
		ps       *redis.PubSub
		marker   string
		channels []string
	}
	var conns []*conn
	if cc, ok := db.client.(*redis.ClusterClient); ok {
		byAddr := map[string]*conn{}
		var clients []*redis.Client
		connOf := func(channel string) *conn {
			m, err := cc.MasterForKey(ctx, channel)
			if err != nil {
				t.Fatal(err)
			}
			addr := m.Options().Addr
			c := byAddr[addr]
			if c == nil {
				client := redis.NewClient(&redis.Options{Addr: m.Options().Addr})
				clients = append(clients, client)
				c = &conn{ps: client.SSubscribe(ctx)}
				byAddr[addr] = c
				conns = append(conns, c)
			}
			return c
		}
		for _, ch := range channels {
			c := connOf(ch)
			c.channels = append(c.channels, ch)
		}
		for i := 0; slices.ContainsFunc(conns, func(c *conn) bool { return c.marker == "" }); i++ {
			marker := "marker:{" + strconv.Itoa(i) + "}"
			if c := connOf(marker); c.marker == "" {
				c.marker = marker
			}
		}
		t.Cleanup(func() {
			for _, c := range clients {
				c.Close()
			}
		})
	} else {
		conns = []*conn{{ps: db.client.PSubscribe(ctx, homeChannel("*")), marker: homeChannel("marker")}}
	}
	var markers sync.WaitGroup
	for _, c := range conns {
		t.Cleanup(func() { c.ps.Close() })
		msgs := c.ps.ChannelWithSubscriptions(redis.WithChannelSize(len(channels) + 10))
		want := 1 // a pattern
		if db.sharded {
			want = len(c.channels) + 1
			// One channel per SSUBSCRIBE: on a cluster, the channels of
			// one command must share a slot.
			for _, ch := range append(c.channels, c.marker) {
				if err := c.ps.SSubscribe(ctx, ch); err != nil {
					t.Fatal(err)
				}
			}
		}
		for want > 0 { // the confirmations
			if _, ok := (<-msgs).(*redis.Subscription); ok {
				want--
			}
		}
		markers.Add(1)
		go func() {
			for m := range msgs {
				msg, ok := m.(*redis.Message)
				if !ok {
					continue
				}
				if msg.Channel == c.marker {
					markers.Done()
					return
				}
				mu.Lock()
				heard[msg.Channel]++
				mu.Unlock()
			}
		}()
	}
	return func() map[string]int {
		for _, c := range conns {
			db.publish(ctx, db.client, c.marker, "marker")
		}
		done := make(chan struct{})
		go func() { markers.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the markers were not heard")
		}
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(heard)
	}
}
