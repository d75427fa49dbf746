package redisdb

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
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

	// Count what every home channel hears, on a connection of its own.
	ps := db.client.PSubscribe(ctx, homeChannel("*"))
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	heard := make(map[string]int)
	marker := homeChannel("marker")
	markerHeard := make(chan struct{})
	go func() {
		for msg := range ps.Channel(redis.WithChannelSize(n + 10)) {
			if msg.Channel == marker {
				close(markerHeard)
				return
			}
			mu.Lock()
			heard[msg.Channel]++
			mu.Unlock()
		}
	}()

	p, err := NewPostService(db).CreatePost(ctx, ada.ID, "to fifty thousand")
	if err != nil {
		t.Fatal(err)
	}
	jobs := db.client.XRange(ctx, fanoutStreamKey, "-", "+").Val()
	if len(jobs) != 1 {
		t.Fatalf("stream holds %d jobs, want 1", len(jobs))
	}
	cursorKey := fanoutCursorKey(jobs[0].ID)

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
		if db.client.XLen(ctx, fanoutStreamKey).Val() == 0 {
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
	for db.client.XLen(ctx, fanoutStreamKey).Val() != 0 {
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

	// Every home channel heard the post exactly once: the marker comes
	// after every announcement on the subscription's connection.
	db.client.Publish(ctx, marker, "marker")
	select {
	case <-markerHeard:
	case <-time.After(30 * time.Second):
		t.Fatal("the marker was not heard")
	}
	mu.Lock()
	defer mu.Unlock()
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
	score, _, _ := strings.Cut(s, " ")
	f, err := strconv.ParseFloat(score, 64)
	return int(f), err
}
