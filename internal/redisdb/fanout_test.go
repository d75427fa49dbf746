package redisdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
)

// drainFanOut runs every fan-out job queued now to its end, as a worker
// would, and returns when none is left: tests that check followers'
// timelines call it where the server's workers would run in the background.
func drainFanOut(tb testing.TB, db *DB) {
	tb.Helper()
	runUntilDrained(tb, db, NewWorker(db, WorkerOptions{}))
}

// runUntilDrained runs w's steps until no fan-out job is left queued.
func runUntilDrained(tb testing.TB, db *DB, w *Worker) {
	tb.Helper()
	for {
		n, err := w.step(context.Background())
		if err != nil {
			tb.Fatalf("fan-out: %v", err)
		}
		if n == 0 && queuedJobs(tb, db) == 0 {
			return
		}
	}
}

// queuedJobs returns how many fan-out jobs the shards' streams hold.
func queuedJobs(tb testing.TB, db *DB) int64 {
	tb.Helper()
	n, _, err := db.FanOutQueueStats(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// newAsyncTestDB is newTestDB with fan-out left to workers.
func newAsyncTestDB(t testing.TB) *DB {
	t.Helper()
	return newTestDB(t, Options{AsyncFanOut: true})
}

// newChainedTestDB is newTestDB whose CreatePost stores posts through the
// outbox, as on a Redis Cluster, on one Redis too: for the tests of the
// outbox, whose requests die (their XADD fails) between its steps. On one
// Redis CreatePost has no such steps (createPostOneRedisScript).
func newChainedTestDB(t testing.TB, opts Options) *DB {
	t.Helper()
	db := newTestDB(t, opts)
	db.chainedPosts = true
	return db
}

// manyFollowers makes n users (ids from 1000 on, with no user hashes) follow
// authorID and returns their ids.
func manyFollowers(tb testing.TB, db *DB, authorID string, n int) []string {
	tb.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	pipe := db.client.Pipeline()
	for i := range n {
		ids[i] = strconv.Itoa(1000 + i)
		pipe.ZAdd(ctx, followersKey(authorID), redis.Z{Score: float64(i), Member: ids[i]})
		pipe.ZAdd(ctx, followingKey(ids[i]), redis.Z{Score: float64(i), Member: authorID})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		tb.Fatal(err)
	}
	return ids
}

// holding returns how many of users' home timelines hold postID.
func holding(tb testing.TB, db *DB, users []string, postID string) int {
	tb.Helper()
	ctx := context.Background()
	pipe := db.client.Pipeline()
	scores := make([]*redis.FloatCmd, len(users))
	for i, u := range users {
		scores[i] = pipe.ZScore(ctx, homeKey(u), postID)
	}
	pipe.Exec(ctx)
	n := 0
	for _, c := range scores {
		if c.Err() == nil {
			n++
		}
	}
	return n
}

// TestFanOutRacingDelete checks that a delete whose job overtakes a create
// fan-out still walking the followers leaves the post in no timeline.
func TestFanOutRacingDelete(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 250)
	p, err := NewPostService(db).CreatePost(ctx, ada.ID, "soon gone")
	if err != nil {
		t.Fatal(err)
	}
	// The create fan-out delivers one batch of 100 (and the next are in
	// flight); then the post is deleted and the delete job runs to its
	// end; then the create fan-out goes on.
	batches := 0
	err = db.fanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, 100, func(followerCursor) error {
		if batches++; batches == 1 {
			if got := holding(t, db, followers, p.ID); got < 100 {
				t.Fatalf("after the first batch %d followers hold the post, want at least 100", got)
			}
			if err := NewPostService(db).DeletePost(ctx, ada.ID, p.ID); err != nil {
				t.Fatal(err)
			}
			drainFanOut(t, db) // runs the create job from the start, then the delete job
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := holding(t, db, followers, p.ID); got != 0 {
		t.Errorf("%d followers hold the deleted post", got)
	}
}

// TestFanOutResumedAfterDelete checks the case where a worker delivered a
// batch after the delete job had passed those followers and died before it
// could check the post: whoever resumes the job takes the batch back.
func TestFanOutResumedAfterDelete(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 250)
	p, err := NewPostService(db).CreatePost(ctx, ada.ID, "soon gone")
	if err != nil {
		t.Fatal(err)
	}
	// A first batch is delivered and its cursor saved.
	stop := errors.New("stop")
	var saved followerCursor
	err = db.fanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, 100, func(c followerCursor) error {
		saved = c
		return stop
	})
	if !errors.Is(err, stop) {
		t.Fatalf("fanOut = %v, want the save error", err)
	}
	// The post is deleted and its delete job runs, without the create job.
	if err := NewPostService(db).DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	if err := db.unFanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, 100, noSave); err != nil {
		t.Fatal(err)
	}
	// The stalled worker's delivery of the second batch lands now, and the
	// worker dies before its check.
	second, _, _, err := db.followerChunk(ctx, ada.ID, saved, 100)
	if err != nil {
		t.Fatal(err)
	}
	err = runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		for _, f := range second {
			db.pub(deliverScript).EvalSha(ctx, pipe, []string{homeKey(f), followingKey(f), seenKey(f)},
				strconv.FormatInt(p.Seq, 10), p.ID, ada.ID, db.opts.HomeCap, homeChannel(f), encodeAdded(p.Seq, p.ID), 0, "0")
		}
	}, db.pub(deliverScript))
	if err != nil {
		t.Fatal(err)
	}
	if got := holding(t, db, followers, p.ID); got != 100 {
		t.Fatalf("the late batch reached %d followers, want 100", got)
	}
	// Another worker resumes the job from its cursor.
	if err := db.fanOut(ctx, ada.ID, p.Seq, p.ID, saved, 100, noSave); err != nil {
		t.Fatal(err)
	}
	if got := holding(t, db, followers, p.ID); got != 0 {
		t.Errorf("%d followers hold the deleted post", got)
	}
}

// TestWorkerTakesOverDeadJob checks the queue's side of a crash: a job read
// by a worker that then died is taken over by another worker after the
// claim idle time, resumes at its saved cursor, and is done once.
func TestWorkerTakesOverDeadJob(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 250)
	p, err := NewPostService(db).CreatePost(ctx, ada.ID, "hello")
	if err != nil {
		t.Fatal(err)
	}
	// The dead worker read the job, delivered a batch and saved its cursor.
	dead := NewWorker(db, WorkerOptions{Name: "dead", Batch: 100})
	shard := db.fanOutShard(ada.ID)
	if ok, err := dead.ensureGroup(ctx, shard); err != nil || !ok {
		t.Fatalf("ensureGroup = %v, %v", ok, err)
	}
	streams, err := db.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: fanOutGroup, Consumer: "dead", Streams: []string{fanoutStreamKey(shard), ">"}, Count: 1, Block: -1,
	}).Result()
	if err != nil || len(streams) != 1 || len(streams[0].Messages) != 1 {
		t.Fatalf("XREADGROUP = %v, %v", streams, err)
	}
	id := streams[0].Messages[0].ID
	first, next, _, err := db.followerChunk(ctx, ada.ID, startCursor, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.fanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, 100, func(c followerCursor) error {
		if err := dead.saveCursor(ctx, shard, id, c); err != nil {
			t.Fatal(err)
		}
		return errors.New("killed")
	}); err == nil {
		t.Fatal("the dead worker's fan-out did not stop")
	}
	if got := db.client.Get(ctx, fanoutCursorKey(shard, id)).Val(); got != next.String() {
		t.Fatalf("cursor = %q, want %q", got, next)
	}

	// Before the claim idle time, another worker leaves the job alone.
	live := NewWorker(db, WorkerOptions{Name: "live", Batch: 100, ClaimIdle: 300 * time.Millisecond, IdleLook: 100 * time.Millisecond})
	if n, err := live.step(ctx); err != nil || n != 0 {
		t.Fatalf("step before the idle time = %d, %v; want 0", n, err)
	}
	// The first batch's followers get the post again on the takeover only
	// if the cursor is ignored; make that visible.
	for _, f := range first {
		db.client.ZRem(ctx, homeKey(f), p.ID)
	}
	time.Sleep(400 * time.Millisecond) // past the claim idle time
	if n, err := live.step(ctx); err != nil || n != 1 {
		t.Fatalf("step after the idle time = %d, %v; want 1", n, err)
	}
	if got := holding(t, db, followers[100:], p.ID); got != 150 {
		t.Errorf("%d of the 150 followers after the cursor hold the post", got)
	}
	if got := holding(t, db, first, p.ID); got != 0 {
		t.Errorf("the takeover started before the cursor: %d of the first batch hold the post again", got)
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("stream holds %d jobs after the takeover", n)
	}
	// The dead worker, back from a stall, has lost the job.
	if err := dead.saveCursor(ctx, shard, id, next); !errors.Is(err, errLostJob) {
		t.Errorf("saveCursor by the old owner = %v, want errLostJob", err)
	}
}

// TestNewJobReadsNoCursor: a job read new from the stream runs from the
// start without looking for a saved cursor, which only a job taken over
// can have (TestWorkerTakesOverDeadJob).
func TestNewJobReadsNoCursor(t *testing.T) {
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 3)
	p, err := NewPostService(db).CreatePost(context.Background(), ada.ID, "new job")
	if err != nil {
		t.Fatal(err)
	}
	names := &commandNames{}
	db.client.AddHook(names)
	drainFanOut(t, db)
	if got := holding(t, db, followers, p.ID); got != 3 {
		t.Fatalf("%d followers hold the post, want 3", got)
	}
	if n := names.count("get"); n != 0 {
		t.Errorf("the worker looked for a cursor %d times for a new job", n)
	}
}

// BenchmarkCreatePost measures CreatePost for an author with 10,000
// followers, with the fan-out inside the call and queued for workers.
func BenchmarkCreatePost(b *testing.B) {
	for _, async := range []bool{false, true} {
		name := map[bool]string{false: "Inline", true: "Async"}[async]
		b.Run(name, func(b *testing.B) {
			db := newTestDB(b, Options{AsyncFanOut: async})
			ada := mustSignup(b, db, "ada")
			manyFollowers(b, db, ada.ID, 10000)
			posts := NewPostService(db)
			for b.Loop() {
				if _, err := posts.CreatePost(context.Background(), ada.ID, "hello"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFanOut measures a worker's fan-out of one post to 50,000
// followers, in deliveries per second.
func BenchmarkFanOut(b *testing.B) { benchmarkFanOut(b, 50000) }

// BenchmarkFanOut10k is BenchmarkFanOut for 10,000 followers, a job of ten
// batches, whose time (ns/op, createPost included) its start and end weigh
// on more; redis-busy is Redis's CPU over the time.
func BenchmarkFanOut10k(b *testing.B) { benchmarkFanOut(b, 10000) }

func benchmarkFanOut(b *testing.B, n int) {
	db := newTestDB(b, Options{AsyncFanOut: true, PullThreshold: -1}) // push, however many followers
	ada := mustSignup(b, db, "ada")
	manyFollowers(b, db, ada.ID, n)
	// As a Warble that wrote them into the empty set would have marked
	// it: delivered raw (see rawdelivery.go).
	if err := db.client.HSet(context.Background(), userKey(ada.ID), followersCheckedField, "1").Err(); err != nil {
		b.Fatal(err)
	}
	posts := NewPostService(db)
	cpu, own := redisCPU(b, db), processCPU()
	for b.Loop() {
		if _, err := posts.CreatePost(context.Background(), ada.ID, "hello"); err != nil {
			b.Fatal(err)
		}
		drainFanOut(b, db)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "deliveries/s")
	b.ReportMetric(float64((processCPU()-own).Nanoseconds())/1e3/float64(n*b.N), "cpu-µs/delivery")
	if cpu >= 0 {
		used := redisCPU(b, db) - cpu
		b.ReportMetric(used*1e6/float64(n*b.N), "redis-µs/delivery")
		b.ReportMetric(used/b.Elapsed().Seconds(), "redis-busy")
	}
}

// processCPU returns the CPU time (user and system) this process has used:
// the fan-out benchmarks report it per delivery next to Redis's, since the
// worker and Redis share the machine's CPUs.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the CPU seconds the Redis server has used (user and
// system, all its threads, from INFO cpu), or -1 if it does not say (the
// embedded Redis) or is a cluster: the benchmarks report Redis's time per
// delivery, which the worker's share of the same CPUs does not blur as it
// does their rate.
func redisCPU(tb testing.TB, db *DB) float64 {
	tb.Helper()
	if db.onCluster() {
		return -1
	}
	info, err := db.client.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	total, found := 0.0, false
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			total, found = total+f, true
		}
	}
	if !found {
		return -1
	}
	return total
}

// BenchmarkFanOutBuckets is BenchmarkFanOut with the followers in
// DefaultFollowerBuckets buckets, which fan-out walks one after the other.
func BenchmarkFanOutBuckets(b *testing.B) {
	db := newTestDB(b, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 1})
	ada := mustSignup(b, db, "ada")
	const n = 50000
	manyFollowers(b, db, ada.ID, n)
	if err := db.moveToBuckets(context.Background(), ada.ID, startCursor, DefaultBatch, noSave); err != nil {
		b.Fatal(err)
	}
	posts := NewPostService(db)
	cpu, own := redisCPU(b, db), processCPU()
	for b.Loop() {
		if _, err := posts.CreatePost(context.Background(), ada.ID, "hello"); err != nil {
			b.Fatal(err)
		}
		drainFanOut(b, db)
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "deliveries/s")
	b.ReportMetric(float64((processCPU()-own).Nanoseconds())/1e3/float64(n*b.N), "cpu-µs/delivery")
	if cpu >= 0 {
		b.ReportMetric((redisCPU(b, db)-cpu)*1e6/float64(n*b.N), "redis-µs/delivery")
	}
}

// TestWorkerWakesForFirstJob: a worker started before any job was ever
// queued (no stream, no group) runs the first one when it is queued, not
// when its wait for jobs runs out.
func TestWorkerWakesForFirstJob(t *testing.T) {
	db := newAsyncTestDB(t)
	requireRealRedis(t, db) // to see the worker wait, in CLIENT LIST
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 3)
	ctx, cancel := context.WithCancel(context.Background())
	w := NewWorker(db, WorkerOptions{IdleLook: time.Minute})
	stopped := make(chan struct{})
	go func() { defer close(stopped); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	waitFor(t, "the worker to wait", func() bool {
		n, _ := db.client.ClientList(context.Background()).Result()
		return strings.Contains(n, "cmd=xread")
	})
	p, err := NewPostService(db).CreatePost(context.Background(), ada.ID, "first ever")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first job to be done", func() bool { return holding(t, db, followers, p.ID) == 3 })
}

// failXAdd is a go-redis hook that fails XADD while it is on, as if the
// process had died between storing a post and queueing its job.
type failXAdd struct{ on atomic.Bool }

func (h *failXAdd) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failXAdd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && cmd.Name() == "xadd" {
			err := errors.New("xadd failed (test)")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *failXAdd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestOutboxSweep: a post whose fan-out job was never queued (its request
// died after storing it) is in its author's outbox, and a sweep queues the
// job, for a create and for a delete; jobs that were queued leave nothing
// behind.
func TestOutboxSweep(t *testing.T) {
	ctx := context.Background()
	db := newChainedTestDB(t, Options{AsyncFanOut: true})
	hook := &failXAdd{}
	db.client.AddHook(hook)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 3)
	posts := NewPostService(db)

	ok := mustCreatePost(t, db, ada.ID, "queued at once")
	if n := db.client.Exists(ctx, outboxKey(ada.ID)).Val(); n != 0 {
		t.Fatal("a queued job stayed in the outbox")
	}
	if holding(t, db, followers, ok.ID) != 3 {
		t.Fatal("the queued job was not done")
	}

	// The job cannot be queued, nor the post added to the global
	// timeline (a string where the timeline should be makes Redis refuse
	// it): the post and its job are recorded, so CreatePost answers
	// success, and the job, once swept, does both.
	hook.on.Store(true)
	if err := db.client.Set(ctx, globalKey, "not a timeline", 0).Err(); err != nil {
		t.Fatal(err)
	}
	lostPost, err := posts.CreatePost(ctx, ada.ID, "its job is lost")
	if err != nil {
		t.Fatalf("CreatePost answered %v for a post it stored with its job", err)
	}
	hook.on.Store(false)
	if err := db.client.Del(ctx, globalKey).Err(); err != nil {
		t.Fatal(err)
	}
	lost := lostPost.ID
	if got := zsetIDs(t, db, postsKey(ada.ID)); len(got) != 2 || got[1] != lost {
		t.Fatalf("ada's posts = %v, want the second to be %s", got, lost)
	}
	drainFanOut(t, db)
	if holding(t, db, followers, lost) != 0 {
		t.Fatal("a post whose job was not queued reached followers")
	}
	if n := db.client.ZCard(ctx, globalKey).Val(); n != 0 {
		t.Fatalf("the global timeline holds %d posts before the sweep", n)
	}
	sweep := func(cutoff time.Time) int {
		t.Helper()
		n, err := db.sweepOutboxes(ctx, cutoff)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := sweep(time.Now().Add(-sweepAfter)); n != 0 {
		t.Fatalf("a sweep queued %d jobs that may still be in flight", n)
	}
	if n := sweep(time.Now().Add(time.Minute)); n != 1 {
		t.Fatalf("the sweep queued %d jobs, want 1", n)
	}
	drainFanOut(t, db)
	if holding(t, db, followers, lost) != 3 {
		t.Fatal("the swept job did not deliver the post")
	}
	if _, err := db.client.ZScore(ctx, globalKey, lost).Result(); err != nil {
		t.Fatalf("the swept job did not put the post on the global timeline: %v", err)
	}

	hook.on.Store(true)
	if err := posts.DeletePost(ctx, ada.ID, lost); err != nil {
		t.Fatal(err)
	}
	hook.on.Store(false)
	drainFanOut(t, db)
	if holding(t, db, followers, lost) != 3 {
		t.Fatal("the delete's job ran though it was not queued")
	}
	if n := sweep(time.Now().Add(time.Minute)); n != 1 {
		t.Fatalf("the sweep queued %d jobs, want the delete's", n)
	}
	drainFanOut(t, db)
	if got := holding(t, db, followers, lost); got != 0 {
		t.Fatalf("after the swept delete %d followers still hold the post", got)
	}
	if n := db.client.Exists(ctx, outboxKey(ada.ID)).Val(); n != 0 {
		t.Fatal("the outbox is not empty after the sweeps")
	}
	if n := db.client.ZCard(ctx, outboxIndexKey(db.fanOutShard(ada.ID))).Val(); n != 0 {
		t.Fatalf("the outbox index holds %d jobs after the sweeps", n)
	}
	if _, err := db.client.ZScore(ctx, globalKey, lost).Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the global timeline still holds the deleted post (%v)", err)
	}
}

// TestCreateJobAfterItsDeleteLeavesNoTrace: a post's create job that runs
// only after its delete (both were left in the outbox, and the sweep queued
// the delete's first) puts the post on the global timeline and takes it
// off again, and delivers it to nobody.
func TestCreateJobAfterItsDeleteLeavesNoTrace(t *testing.T) {
	ctx := context.Background()
	db := newChainedTestDB(t, Options{AsyncFanOut: true})
	hook := &failXAdd{}
	db.client.AddHook(hook)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 3)
	posts := NewPostService(db)
	hook.on.Store(true)
	p, err := posts.CreatePost(ctx, ada.ID, "short-lived")
	if err != nil {
		t.Fatal(err)
	}
	if err := posts.DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	hook.on.Store(false)
	if err := db.enqueueFanOut(ctx, opUndeliver, p.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if err := db.enqueueFanOut(ctx, opDeliver, p.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if n := holding(t, db, followers, p.ID); n != 0 {
		t.Fatalf("%d followers hold a deleted post", n)
	}
	if n := db.client.ZCard(ctx, globalKey).Val(); n != 0 {
		t.Fatalf("the global timeline holds %d entries, want none", n)
	}
}

// TestWorkerSweepsOutboxes: a worker with Sweep queues, at its start, a job
// that a dead request left in an outbox long enough ago.
func TestWorkerSweepsOutboxes(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newChainedTestDB(t, Options{AsyncFanOut: true, Now: clock.Now})
	hook := &failXAdd{}
	db.client.AddHook(hook)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 2)
	hook.on.Store(true)
	if _, err := NewPostService(db).CreatePost(ctx, ada.ID, "its job is lost"); err != nil {
		t.Fatalf("CreatePost answered %v for a post it stored with its job", err)
	}
	hook.on.Store(false)
	lost := zsetIDs(t, db, postsKey(ada.ID))[0]
	clock.Add(time.Minute)
	for _, sweep := range []bool{false, true} {
		w := NewWorker(db, WorkerOptions{Sweep: sweep})
		if err := w.maybeSweep(ctx); err != nil {
			t.Fatal(err)
		}
		drainFanOut(t, db)
		if got, want := holding(t, db, followers, lost), map[bool]int{false: 0, true: 2}[sweep]; got != want {
			t.Fatalf("worker with Sweep %v: %d followers hold the post, want %d", sweep, got, want)
		}
	}
}

// TestIdleWorkerStopsAtOnce: an idle worker, and the watch that waits for
// jobs in Redis for it, return as soon as the worker's context ends, not
// when the watch's blocked read or the worker's idle wait would run out
// (watchBlock and IdleLook are far longer than the bound here).
func TestIdleWorkerStopsAtOnce(t *testing.T) {
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	mustCreatePost(t, db, ada.ID, "the stream and its group exist")
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); NewWorker(db, WorkerOptions{IdleLook: time.Hour}).Run(ctx) }()
	time.Sleep(100 * time.Millisecond) // let it go idle, its watch blocked in XREAD
	cancel()
	select {
	case <-stopped:
	case <-time.After(watchBlock / 2):
		t.Fatal("an idle worker did not stop when its context ended")
	}
}

// TestWorkerStopsWhileJobsArrive: a worker stopped while jobs keep coming
// stops, however its stop meets its jobs watch waking it for jobs it has
// just read. (The last worker out used to wait for the watch while holding
// the lock the watch takes to wake the workers, and the server hung on
// stop.)
func TestWorkerStopsWhileJobsArrive(t *testing.T) {
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	for _, name := range []string{"bob", "cyd", "dee"} {
		mustFollow(t, db, mustSignup(t, db, name).ID, ada.ID)
	}
	posts := NewPostService(db)
	posting, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-posting:
				return
			default:
			}
			if _, err := posts.CreatePost(context.Background(), ada.ID, "one more"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(posting); <-done }()
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		go func() { defer close(stopped); NewWorker(db, WorkerOptions{IdleLook: time.Hour}).Run(ctx) }()
		time.Sleep(time.Duration(i%7) * time.Millisecond)
		cancel()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatalf("stop %d: a worker stopped while jobs arrived did not stop", i)
		}
	}
}

// TestOutboxSweepReadsOnlyTheIndex: with every job queued, a sweep reads
// one index entry range per shard and nothing else, however many authors
// and outboxes there are: no SCAN of the keyspace.
func TestOutboxSweepReadsOnlyTheIndex(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, FanOutShards: 4})
	for i := range 20 {
		u := mustSignup(t, db, fmt.Sprintf("author%d", i))
		mustCreatePost(t, db, u.ID, "queued at once")
	}
	counter := &commandNames{}
	db.client.AddHook(counter)
	if n, err := db.sweepOutboxes(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Fatalf("sweep = %d, %v; want nothing to queue", n, err)
	}
	counter.mu.Lock()
	defer counter.mu.Unlock()
	if counter.n["scan"] != 0 || counter.n["zrange"] != 4 || len(counter.n) != 1 {
		t.Errorf("the sweep sent %v, want one ZRANGE of the index per shard", counter.n)
	}
}

// TestOutboxIndexBackfill: a job that a Warble from before the outbox index
// left in an outbox (its request died before queueing it, and nothing
// indexed it) is queued by the first sweeping worker of the database,
// which fills the index from the outboxes once; later workers do not scan
// again.
func TestOutboxIndexBackfill(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newChainedTestDB(t, Options{AsyncFanOut: true, FanOutShards: 3, Now: clock.Now})
	// On an empty database there is nothing to backfill, and an idle
	// Warble writes nothing, not even the marker.
	if err := NewWorker(db, WorkerOptions{Sweep: true}).maybeSweep(ctx); err != nil {
		t.Fatal(err)
	}
	if keys, err := redistest.Keys(ctx, db.client, "*"); err != nil || len(keys) != 0 {
		t.Fatalf("a sweep of an empty database wrote %v (%v)", keys, err)
	}
	hook := &failXAdd{}
	db.client.AddHook(hook)
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 2)
	// leaveUnindexed makes a post whose job stays in ada's outbox and,
	// as with the Warble before the index, not in the index.
	leaveUnindexed := func(body string) string {
		t.Helper()
		hook.on.Store(true)
		p, err := NewPostService(db).CreatePost(ctx, ada.ID, body)
		hook.on.Store(false)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.client.Del(ctx, outboxIndexKey(db.fanOutShard(ada.ID))).Err(); err != nil {
			t.Fatal(err)
		}
		return p.ID
	}
	old := leaveUnindexed("from before the index")
	clock.Add(time.Minute)
	sweepOnce := func() {
		t.Helper()
		if err := NewWorker(db, WorkerOptions{Sweep: true}).maybeSweep(ctx); err != nil {
			t.Fatal(err)
		}
		drainFanOut(t, db)
	}
	sweepOnce()
	if got := holding(t, db, followers, old); got != 2 {
		t.Fatalf("%d followers hold the post whose job was left unindexed, want 2", got)
	}
	if n := db.client.Exists(ctx, outboxBackfillKey).Val(); n != 1 {
		t.Fatal("the backfill left no marker")
	}
	// Once per database: a later worker's first sweep does not scan.
	later := leaveUnindexed("left after the backfill")
	clock.Add(time.Minute)
	counter := &commandNames{}
	db.client.AddHook(counter)
	sweepOnce()
	if n := counter.count("scan"); n != 0 {
		t.Errorf("a second worker scanned %d times", n)
	}
	if got := holding(t, db, followers, later); got != 0 {
		t.Errorf("%d followers hold a post that only a second backfill would find", got)
	}
}

// TestDedicatedClientWhileTheFirstConnectionOpens: the jobs watch makes a
// client of its own from the shared one's settings while the shared one
// may be opening its first connection, which writes some of its options
// (the race detector saw it in CI). Run with -race.
func TestDedicatedClientWhileTheFirstConnectionOpens(t *testing.T) {
	srv := redistest.New(t)
	if srv.Cluster() != nil {
		t.Skip("a cluster client's own options are not written as it runs; its nodes' are copies")
	}
	for range 20 {
		c := redis.NewClient(srv.Options())
		made := make(chan func())
		go func() {
			d, closeD := dedicatedClient(c, 1)
			made <- closeD
			d.Ping(context.Background())
		}()
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		(<-made)()
		c.Close()
	}
}

// TestDedicatedClusterClientLearnsNodesOnItsOwn: a cluster client adds the
// nodes it learns of to the array behind its options' Addrs, so the jobs
// watch's client, made from the shared one's options, must not share that
// array: both learn the masters a failover promotes at once (the race
// detector saw it in TestClusterKilledMasterLosesNoAcknowledgedWrite).
// Each client here is seeded with one master, in an array with room for
// the others, and learns them at the same time as the other. Run with
// -race.
func TestDedicatedClusterClientLearnsNodesOnItsOwn(t *testing.T) {
	c := testCluster(t)
	for range 20 {
		opts := c.Options()
		opts.Addrs = append(make([]string, 0, len(c.Nodes)), c.Masters()[0].Addr)
		cc := redis.NewClusterClient(opts)
		d, closeD := dedicatedClient(cc, 1)
		if unsafe.SliceData(d.(*redis.ClusterClient).Options().Addrs) == unsafe.SliceData(opts.Addrs) {
			t.Fatal("the dedicated client's seed addresses share the shared client's array")
		}
		pinged := make(chan error)
		go func() { pinged <- d.Ping(context.Background()).Err() }()
		if err := cc.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		if err := <-pinged; err != nil {
			t.Fatal(err)
		}
		closeD()
		cc.Close()
	}
}

// TestWalkedJobPath: a job that walks its author's followers delivers raw
// (rawdelivery.go) when the author's followers side is known good and the
// job is big enough for raw to pay (rawJob): from rawMinFollowers on, or
// in more than one batch; else with the guarded script, as every job of an
// author not known good yet, and every job on a Redis Cluster, does. A
// job that carries its followers keeps the guarded pipeline of carried
// jobs (fanOutCarried), which costs less CPU in all than raw deliveries
// for as many followers (BENCHMARKS.md, post-8). The raw batches are
// counted by rawStep, which only they call; either way every follower
// gets the post, the job leaves the stream, and the post no longer waits
// for its fan-out.
func TestWalkedJobPath(t *testing.T) {
	for _, tt := range []struct {
		name      string
		followers int
		unchecked bool
		carried   bool // the job carries the followers, as CreatePost queues it
		wantRaw   int  // raw batches of the job, on one Redis
	}{
		{name: "Carried", followers: rawMinFollowers - 1, carried: true}, // the most a job carries
		{name: "OneBatchBelowLine", followers: rawMinFollowers - 1},
		{name: "OneBatchAtLine", followers: rawMinFollowers, wantRaw: 1},
		{name: "OneBatch", followers: 600, wantRaw: 1},
		{name: "TwoBatches", followers: DefaultBatch + 1, wantRaw: 2},
		{name: "NotKnownGood", followers: 600, unchecked: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db := newAsyncTestDB(t)
			author := mustSignup(t, db, "author")
			followers := manyFollowers(t, db, author.ID, tt.followers)
			if !tt.unchecked {
				// As a Warble that wrote them into the empty set would
				// have marked it.
				if err := db.client.HSet(ctx, userKey(author.ID), followersCheckedField, "1").Err(); err != nil {
					t.Fatal(err)
				}
			}
			var raw atomic.Int64
			db.rawStep = func(stage string, _ []string) {
				if stage == "walked" {
					raw.Add(1)
				}
			}
			p, err := NewPostService(db).CreatePost(ctx, author.ID, "walked")
			if err != nil {
				t.Fatal(err)
			}
			if !tt.carried && tt.followers <= db.carriedFollowers() {
				requeueWithoutFollowers(t, db, p.ID) // else CreatePost's job carries them
			}
			drainFanOut(t, db)
			want := int64(tt.wantRaw)
			if db.onCluster() {
				want = 0
			}
			if got := raw.Load(); got != want {
				t.Errorf("the job of %d followers ran %d raw batches, want %d", tt.followers, got, want)
			}
			if got := holding(t, db, followers, p.ID); got != tt.followers {
				t.Errorf("%d of %d followers hold the post", got, tt.followers)
			}
			if n := queuedJobs(t, db); n != 0 {
				t.Errorf("%d jobs left in the stream, want none", n)
			}
			// A raw job of one batch clears it with its end, a guarded
			// one in its batch's pipeline.
			if db.client.HExists(ctx, postKey(author.ID, strconv.FormatInt(p.Seq, 10)), fanOutPendingField).Val() {
				t.Error("the post still waits for its fan-out")
			}
		})
	}
}

// TestFanOutLostJobUndoesItsLateBatchesGuarded is
// TestFanOutLostJobUndoesItsLateBatches for batches delivered by the
// guarded scripts, as on a Redis Cluster: a batch that goes out once the
// save that meets the job taken over has begun lands after the new owner's
// undo, finds the post deleted, and the worker takes it back off itself.
func TestFanOutLostJobUndoesItsLateBatchesGuarded(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada").ID
	followers := manyFollowers(t, db, ada, 600)
	p, err := NewPostService(db).CreatePost(ctx, ada, "to many")
	if err != nil {
		t.Fatal(err)
	}
	// The save after the first batch meets the job taken over: the post
	// was deleted meanwhile and the new owner undid every follower. Its
	// commands pass the gate below.
	owner := context.WithValue(ctx, newOwnerKey{}, true)
	taken := make(chan struct{})
	var saves atomic.Int32
	save := func(followerCursor) error {
		if saves.Add(1) == 1 {
			if err := NewPostService(db).DeletePost(owner, ada, p.ID); err != nil {
				t.Error(err)
			}
			if err := db.undeliver(owner, followers, p.Seq, p.ID); err != nil {
				t.Error(err)
			}
			close(taken)
		}
		return errLostJob
	}
	// The batches after the first fanOutDepth go out once the first is
	// done, with its save: they wait for the takeover before their adds.
	late := make(map[string]bool)
	for _, f := range followers[fanOutDepth*50:] {
		late[homeKey(f)] = true
	}
	db.client.AddHook(&deliveryGate{late: late, wait: func(ctx context.Context) {
		if ctx.Value(newOwnerKey{}) == nil {
			select {
			case <-taken:
			case <-time.After(10 * time.Second):
			}
		}
	}})
	// 600 followers, 50 a batch, delivered by the guarded scripts (no job
	// end: see mayRaw).
	if err := db.fanOut(ctx, ada, p.Seq, p.ID, startCursor, 50, save); !errors.Is(err, errLostJob) {
		t.Fatalf("fanOut = %v, want errLostJob", err)
	}
	if n := holding(t, db, followers, p.ID); n != 0 {
		t.Errorf("%d followers hold the deleted post after the job was lost", n)
	}
}

type newOwnerKey struct{}

// deliveryGate calls wait, with the pipeline's context, before every
// pipeline that writes one of the home timelines late.
type deliveryGate struct {
	late map[string]bool
	wait func(ctx context.Context)
}

func (h *deliveryGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *deliveryGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *deliveryGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if slices.ContainsFunc(cmd.Args(), func(a any) bool {
				switch a := a.(type) {
				case string:
					return h.late[a]
				case *string: // deliverBatchArgs
					return h.late[*a]
				}
				return false
			}) {
				h.wait(ctx)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestWorkerFirstPass: a worker's FirstPass is called once, after its
// first sweep has backfilled a database that holds data: the marker is
// there by then, and nothing of the pass comes after it.
func TestWorkerFirstPass(t *testing.T) {
	ctx := context.Background()
	db := newChainedTestDB(t, Options{AsyncFanOut: true})
	mustSignup(t, db, "ada") // data: the first sweep backfills
	var calls atomic.Int32
	markerThen := make(chan int64, 2)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- NewWorker(db, WorkerOptions{Sweep: true, FirstPass: func() {
			calls.Add(1)
			markerThen <- db.client.Exists(ctx, outboxBackfillKey).Val()
		}}).Run(wctx)
	}()
	select {
	case n := <-markerThen:
		if n != 1 {
			t.Error("FirstPass was called before the backfill's marker was written")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("FirstPass was not called")
	}
	// A later pass, which a queued job wakes the worker for, does not
	// call it again.
	if _, err := NewPostService(db).CreatePost(ctx, mustSignup(t, db, "bob").ID, "wakes the worker"); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("FirstPass was called %d times, want once", n)
	}
}
