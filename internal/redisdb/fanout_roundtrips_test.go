package redisdb

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
)

// newSmallJob makes an author with 20 followers, a post by them whose job
// is queued and not run, and a worker that reads new jobs only (its look
// for jobs of dead workers is an hour away) from the groups made already.
func newSmallJob(t *testing.T) (*DB, []string, string, *Worker) {
	t.Helper()
	db := newAsyncTestDB(t)
	author := mustSignup(t, db, "author")
	followers := manyFollowers(t, db, author.ID, 20)
	mustCreatePost(t, db, author.ID, "the first, which makes the group")
	p, err := NewPostService(db).CreatePost(context.Background(), author.ID, "measured")
	if err != nil {
		t.Fatal(err)
	}
	w := NewWorker(db, WorkerOptions{})
	w.nextClaim = time.Now().Add(time.Hour)
	for i := range w.ready {
		w.ready[i] = true
	}
	return db, followers, p.ID, w
}

// TestSmallFanOutJobRoundTrips checks what the fan-out job of an author
// whose followers fit in one batch costs on one Redis. A job that carries
// its followers (CreatePost read them with the post): reading the job; the
// global timeline, the deliveries, the check and the job's end in one
// pipeline. A job without them (queued by an older Warble, or by the
// outbox sweep): reading the job; the global timeline, the post's check
// and the followers in one pipeline; the deliveries, the check and the
// job's end in another; the first such job of an author whose followers
// side is not known good yet two more, once: the check of its followers
// against the truth, and the mark (see checkFollowers). And that each did
// the whole job: every follower has the post, the job left the stream, and
// the post no longer waits for its fan-out.
func TestSmallFanOutJobRoundTrips(t *testing.T) {
	for _, tt := range []struct {
		name      string
		carried   bool
		unchecked bool
		want      int64
	}{
		{name: "Carried", carried: true, want: 2},
		{name: "Walked", want: 3},
		{name: "WalkedUnchecked", unchecked: true, want: 5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db, followers, postID, w := newSmallJob(t)
			if !tt.carried {
				requeueWithoutFollowers(t, db, postID)
			}
			mustLoadJobScripts(t, db)
			if author, _, _ := splitPostID(postID); !tt.carried && !tt.unchecked {
				// As a Warble that wrote them would have marked it.
				if err := db.client.HSet(ctx, userKey(author), followersCheckedField, "1").Err(); err != nil {
					t.Fatal(err)
				}
			}
			counter := &redistest.RoundTrips{}
			db.client.AddHook(counter)
			if n, err := w.step(ctx); err != nil || n != 1 {
				t.Fatalf("step = %d jobs, %v; want 1", n, err)
			}
			got := counter.N()
			t.Logf("the job took %d round trips", got)
			if !db.onCluster() && got != tt.want {
				t.Errorf("the job took %d round trips, want %d", got, tt.want)
			}
			if got := holding(t, db, followers, postID); got != len(followers) {
				t.Errorf("%d of %d followers hold the post", got, len(followers))
			}
			if err := db.client.ZScore(ctx, globalKey, postID).Err(); err != nil {
				t.Errorf("the global timeline does not hold the post: %v", err)
			}
			if n := queuedJobs(t, db); n != 0 {
				t.Errorf("%d jobs left in the stream, want none", n)
			}
			author, seq, _ := splitPostID(postID)
			if pending := mustPending(t, db, author); pending != 0 {
				t.Errorf("%d jobs pending in the group, want none", pending)
			}
			if db.client.HExists(ctx, postKey(author, seq), fanOutPendingField).Val() {
				t.Error("the post still waits for its fan-out")
			}
		})
	}
}

// mustLoadJobScripts loads the scripts of a small fan-out job into Redis
// and has runScripts know it, for tests that count a job's round trips or
// pipelines: a process loads a script at its first use (and again after
// Redis answered NOSCRIPT, as it does after another test's SCRIPT FLUSH),
// which is no cost of the job. The carried job of newSmallJob's first post
// does not list its post, so a walked job is the first to use
// listGlobalScript.
func mustLoadJobScripts(tb testing.TB, db *DB) {
	tb.Helper()
	for _, s := range []*redis.Script{db.pub(listGlobalScript), db.deliveryScripts()} {
		if err := s.Load(context.Background(), db.client).Err(); err != nil {
			tb.Fatal(err)
		}
		scriptLoads.Store(s, struct{}{})
	}
}

// requeueWithoutFollowers replaces the queued job of postID, which
// CreatePost queued, by one that does not carry the author's followers,
// as an older Warble queued them.
func requeueWithoutFollowers(tb testing.TB, db *DB, postID string) {
	tb.Helper()
	ctx := context.Background()
	author, _, _ := splitPostID(postID)
	stream := fanoutStreamKey(db.fanOutShard(author))
	entries, err := db.client.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if e.Values["post"] == postID {
			if _, ok := e.Values["followers"]; !ok && !db.onCluster() {
				tb.Fatalf("CreatePost's job %v carries no followers", e.Values)
			}
			db.client.XDel(ctx, stream, e.ID)
		}
	}
	if err := db.queueJob(ctx, opDeliver, postID); err != nil {
		tb.Fatal(err)
	}
}

// TestSmallFanOutJobsBackToBack: on one Redis, a worker reads up to
// jobsAtOnce jobs at a time and runs those that carry their followers in
// one pipeline (the global timeline, the deliveries, the check and the end
// of each), which also reads the worker's next jobs: a worker with jobs
// waiting spends one round trip on all it holds, and each job read either
// way is run whole. On a Redis Cluster, whose jobs carry nothing, the
// jobs read at once run one a step.
func TestSmallFanOutJobsBackToBack(t *testing.T) {
	ctx := context.Background()
	db, followers, first, w := newSmallJob(t)
	author, _, _ := splitPostID(first)
	posts := []string{first, mustQueuePost(t, db, author, "the second"), mustQueuePost(t, db, author, "the third")}
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	if db.onCluster() {
		for range len(posts) {
			if n, err := w.step(ctx); err != nil || n != 1 {
				t.Fatalf("step = %d jobs, %v; want 1", n, err)
			}
		}
	} else {
		// The read of the three, and their pipeline.
		if n, err := w.step(ctx); err != nil || n != 3 {
			t.Fatalf("first step = %d jobs, %v; want 3", n, err)
		}
		if got := counter.N(); got != 2 {
			t.Errorf("three jobs read at once took %d round trips, want 2", got)
		}
		// Two posts come while the pipeline of the next job is on its
		// way: it reads their jobs, and the next step runs both in one
		// round trip.
		posts = append(posts, mustQueuePost(t, db, author, "the fourth"))
		var theirs int64
		db.client.AddHook(&onPipeline{script: db.deliveryScripts().Hash(), run: func() error {
			before := counter.N()
			posts = append(posts, mustQueuePost(t, db, author, "the fifth"), mustQueuePost(t, db, author, "the sixth"))
			theirs = counter.N() - before
			return nil
		}})
		before := counter.N()
		if n, err := w.step(ctx); err != nil || n != 1 {
			t.Fatalf("second step = %d jobs, %v; want 1", n, err)
		}
		if got := counter.N() - before - theirs; got != 2 {
			t.Errorf("the fourth job took %d round trips, want 2 (its read, its pipeline)", got)
		}
		if len(w.held) != 2 {
			t.Fatalf("the worker holds %d jobs, want the two its pipeline read", len(w.held))
		}
		before = counter.N()
		if n, err := w.step(ctx); err != nil || n != 2 {
			t.Fatalf("third step = %d jobs, %v; want 2", n, err)
		}
		if got := counter.N() - before; got != 1 {
			t.Errorf("the two jobs held took %d round trips, want 1", got)
		}
	}
	wantHeldByAll(t, db, followers, posts...)
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
	if pending := mustPending(t, db, author); pending != 0 {
		t.Errorf("%d jobs pending in the group, want none", pending)
	}
}

// TestCarriedJobsRunBeforeAWalk: of the jobs a worker reads at once, those
// that carry their followers run first, together, and a job that walks
// them (which may be long) after them, in a step of its own, so that it
// holds none of them up.
func TestCarriedJobsRunBeforeAWalk(t *testing.T) {
	ctx := context.Background()
	db, followers, walked, w := newSmallJob(t)
	if db.onCluster() {
		t.Skip("a Redis Cluster's jobs carry no followers")
	}
	author, _, _ := splitPostID(walked)
	requeueWithoutFollowers(t, db, walked)
	carried := []string{mustQueuePost(t, db, author, "carried 1"), mustQueuePost(t, db, author, "carried 2")}
	if n, err := w.step(ctx); err != nil || n != 2 {
		t.Fatalf("first step = %d jobs, %v; want the 2 carried", n, err)
	}
	wantHeldByAll(t, db, followers, carried...)
	if got := holding(t, db, followers, walked); got != 0 {
		t.Errorf("%d followers hold the walked job's post before its step", got)
	}
	if len(w.held) != 1 {
		t.Fatalf("the worker holds %d jobs, want the walked one", len(w.held))
	}
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("second step = %d jobs, %v; want the walked one", n, err)
	}
	if got := holding(t, db, followers, walked); got != len(followers) {
		t.Errorf("%d of %d followers hold the walked job's post", got, len(followers))
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
}

// TestHeldJobReleased: a worker that stops with a job it read as its next
// and did not start hands it over: the first worker that looks for jobs of
// dead workers takes it, rather than only once it has been idle for
// ClaimIdle (an hour here).
func TestHeldJobReleased(t *testing.T) {
	ctx := context.Background()
	db, followers, first, _ := newSmallJob(t)
	if db.onCluster() {
		t.Skip("a worker reads its next job with the end of the last only on one Redis")
	}
	author, _, _ := splitPostID(first)
	w := NewWorker(db, WorkerOptions{ClaimIdle: time.Hour})
	w.nextClaim = time.Now().Add(time.Hour)
	for i := range w.ready {
		w.ready[i] = true
	}
	// The next post comes while the first job's pipeline is on its way,
	// which reads its job.
	var next string
	db.client.AddHook(&onPipeline{script: db.deliveryScripts().Hash(), run: func() error {
		next = mustQueuePost(t, db, author, "the next")
		return nil
	}})
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("step = %d jobs, %v; want 1", n, err)
	}
	if len(w.held) != 1 {
		t.Fatalf("the worker holds %d jobs, want the next", len(w.held))
	}
	w.releaseHeld() // as Run does when it stops
	heir := NewWorker(db, WorkerOptions{ClaimIdle: time.Hour})
	if n, err := heir.step(ctx); err != nil || n != 1 {
		t.Fatalf("heir's step = %d jobs, %v; want the released one", n, err)
	}
	if got := holding(t, db, followers, next); got != len(followers) {
		t.Errorf("%d of %d followers hold the released job's post", got, len(followers))
	}
	if pending := mustPending(t, db, author); pending != 0 {
		t.Errorf("%d jobs pending in the group, want none", pending)
	}
}

// mustQueuePost creates a post whose job is queued and not run.
func mustQueuePost(tb testing.TB, db *DB, authorID, body string) string {
	tb.Helper()
	p, err := NewPostService(db).CreatePost(context.Background(), authorID, body)
	if err != nil {
		tb.Fatal(err)
	}
	return p.ID
}

// TestSmallFanOutJobRacingDelete deletes the post just before the pipeline
// that delivers its only batch (and, on one Redis, ends its job): the
// batch's check finds the hash gone, so the job must take the post back
// off those followers before it leaves the stream. The worker dies there
// (its undo fails): the job is still pending, and the worker that takes it
// over takes the post off.
func TestSmallFanOutJobRacingDelete(t *testing.T) {
	ctx := context.Background()
	db, followers, postID, w := newSmallJob(t)
	author, _, _ := splitPostID(postID)
	died := &onPipeline{script: db.pub(undeliverScript).Hash(), run: func() error {
		return errors.New("the worker died")
	}}
	died.done.Store(true) // armed after the delete, whose own step runs the script
	deleted := &onPipeline{script: db.deliveryScripts().Hash(), run: func() error {
		if err := NewPostService(db).DeletePost(ctx, author, postID); err != nil {
			t.Error(err)
		}
		died.done.Store(false)
		return nil
	}}
	db.client.AddHook(deleted)
	db.client.AddHook(died)
	if _, err := w.step(ctx); err == nil {
		t.Fatal("the job went on past its failed undo")
	}
	if !deleted.done.Load() || !died.done.Load() {
		t.Fatal("the post was not deleted during its job, or its undo did not fail")
	}
	// The create job's, and on one Redis the delete's, which the pipeline
	// that ended the create job's batch read for the worker as its next.
	want := int64(1)
	if !db.onCluster() {
		want = 2
	}
	if pending := mustPending(t, db, author); pending != want {
		t.Fatalf("%d jobs pending, want %d", pending, want)
	}
	heir := NewWorker(db, WorkerOptions{ClaimIdle: time.Millisecond, IdleLook: time.Millisecond})
	for range want {
		time.Sleep(2 * time.Millisecond)
		if n, err := heir.step(ctx); err != nil || n != 1 {
			t.Fatalf("take-over step = %d jobs, %v; want 1", n, err)
		}
	}
	if got := holding(t, db, followers, postID); got != 0 {
		t.Errorf("after the create job %d followers hold the deleted post", got)
	}
	drainFanOut(t, db) // the delete's job
	if got := holding(t, db, followers, postID); got != 0 {
		t.Errorf("%d followers hold the deleted post", got)
	}
	if err := db.client.ZScore(ctx, globalKey, postID).Err(); !errors.Is(err, redis.Nil) {
		t.Error("the global timeline holds the deleted post")
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
}

// mustPending returns how many jobs of authorID's shard are pending in
// its group.
func mustPending(tb testing.TB, db *DB, authorID string) int64 {
	tb.Helper()
	p, err := db.client.XPending(context.Background(), fanoutStreamKey(db.fanOutShard(authorID)), fanOutGroup).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return p.Count
}

// onPipeline runs run once, before the first pipeline that carries an
// EVALSHA of script; an error from run fails that pipeline, unsent.
type onPipeline struct {
	script string
	match  func(redis.Cmder) bool // in place of script, when set
	run    func() error
	done   atomic.Bool
}

func (h *onPipeline) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *onPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *onPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			args := c.Args()
			hit := len(args) > 1 && c.Name() == "evalsha" && args[1] == h.script
			if h.match != nil {
				hit = h.match(c)
			}
			if hit && h.done.CompareAndSwap(false, true) {
				if err := h.run(); err != nil {
					for _, c := range cmds {
						c.SetErr(err)
					}
					return err
				}
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestFanOutChecksAfterItsWrites checks where a job's "does the post still
// exist" checks are, which the argument for deletes racing fan-out needs
// after the writes they guard (doc.go): after the writes in their pipeline
// on one Redis, where one connection runs a pipeline in order; on a Redis
// Cluster, whose pipelines send each node its commands at once, in a
// pipeline of their own, sent after the writes' pipeline answered. The
// end of a job on one Redis (the "finish" entry of deliverBatchScript) is
// such a check. A job that carries its followers checks once, after the
// global timeline and the deliveries, in the step that makes them (the
// "carried" entry; TestCarriedJobRacingDelete sees it act); one that walks
// them after each.
func TestFanOutChecksAfterItsWrites(t *testing.T) {
	for _, tt := range []struct {
		name    string
		carried bool
		want    int // on one Redis; a cluster's jobs carry nothing
	}{
		{name: "Carried", carried: true, want: 1},
		{name: "Walked", want: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db, _, postID, w := newSmallJob(t)
			if !tt.carried {
				requeueWithoutFollowers(t, db, postID)
			}
			author, seq, _ := splitPostID(postID)
			mustLoadJobScripts(t, db)
			rec := &pipelineLog{}
			db.client.AddHook(rec)
			if n, err := w.step(ctx); err != nil || n != 1 {
				t.Fatalf("step = %d jobs, %v; want 1", n, err)
			}
			checks, wrote := 0, false
			for i, cmds := range rec.log() {
				check, writes := -1, []int{}
				for j, c := range cmds {
					args := c.Args()
					switch name, _ := args[0].(string); name {
					case "exists":
						if args[1] == postKey(author, seq) {
							check = j
						}
					case "evalsha", "eval":
						switch {
						case slices.Contains(args, any("finish")):
							check = j
						case slices.Contains(args, any("carried")):
							// The job's writes, and its check after
							// them, in one step (carriedLua).
							writes = append(writes, j)
							check = j
						default:
							writes = append(writes, j)
						}
					}
				}
				if len(writes) > 0 {
					wrote = true
				}
				if check < 0 {
					continue
				}
				checks++
				switch {
				case !wrote:
					t.Errorf("pipeline %d checks the post before any write of the job", i)
				case db.onCluster() && len(writes) > 0:
					t.Errorf("pipeline %d checks the post in the pipeline of its writes, on a cluster", i)
				case !db.onCluster() && len(writes) > 0 && writes[len(writes)-1] > check:
					t.Errorf("pipeline %d checks the post before a write", i)
				}
			}
			want := tt.want
			if db.onCluster() {
				want = 2 // the first step's and the only batch's
			}
			if checks != want {
				t.Errorf("%d pipelines check the post, want %d", checks, want)
			}
		})
	}
}

// pipelineLog is a go-redis hook that keeps the commands of every pipeline.
type pipelineLog struct {
	mu        sync.Mutex
	pipelines [][]redis.Cmder
}

func (l *pipelineLog) log() [][]redis.Cmder {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pipelines)
}

func (l *pipelineLog) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (l *pipelineLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (l *pipelineLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.mu.Lock()
		l.pipelines = append(l.pipelines, slices.Clone(cmds))
		l.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestCreatePostCarriesFewFollowers: on one Redis, the job that CreatePost
// queues carries the author's followers, in the order a walk reads them,
// when they are fewer than a walked job delivers raw to (carriedFollowers),
// within the pull threshold and in the one followers set; else it carries
// nothing and its worker walks them.
func TestCreatePostCarriesFewFollowers(t *testing.T) {
	for _, tt := range []struct {
		name          string
		followers     int
		pullThreshold int
		buckets       bool
		wantCarried   bool
		wantNoJob     bool
	}{
		{name: "Few", followers: 20, wantCarried: true},
		{name: "None", followers: 0, wantNoJob: true}, // TestCreatePostWithoutFollowers
		{name: "BelowRaw", followers: rawMinFollowers - 1, wantCarried: true},
		{name: "Raw", followers: rawMinFollowers}, // a walked job delivers raw from here on
		{name: "PastPullThreshold", followers: 20, pullThreshold: 19},
		{name: "AtPullThreshold", followers: 20, pullThreshold: 20, wantCarried: true},
		{name: "InBuckets", followers: 20, buckets: true},
		{name: "NoneInTheSetButBuckets", followers: 0, buckets: true}, // the buckets may hold some
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: tt.pullThreshold})
			if db.chainedPosts {
				t.Skip("a Redis Cluster queues jobs through the outbox, and they carry no followers")
			}
			author := mustSignup(t, db, "author")
			followers := manyFollowers(t, db, author.ID, tt.followers)
			if tt.buckets {
				db.client.HSet(ctx, userKey(author.ID), followerBucketsField, "2")
			}
			p, err := NewPostService(db).CreatePost(ctx, author.ID, "counted")
			if err != nil {
				t.Fatal(err)
			}
			shard := db.fanOutShard(author.ID)
			jobs, err := db.client.XRange(ctx, fanoutStreamKey(shard), "-", "+").Result()
			if tt.wantNoJob {
				if err != nil || len(jobs) != 0 {
					t.Fatalf("the stream holds %d jobs (%v), want none", len(jobs), err)
				}
				return
			}
			if err != nil || len(jobs) != 1 {
				t.Fatalf("the stream holds %d jobs (%v), want the post's", len(jobs), err)
			}
			j, ok := parseJob(shard, jobs[0])
			if !ok || j.postID != p.ID {
				t.Fatalf("queued job = %+v, want the delivery of %s", j, p.ID)
			}
			if j.carried != tt.wantCarried {
				t.Fatalf("job carries followers: %v, want %v", j.carried, tt.wantCarried)
			}
			if tt.wantCarried && !slices.Equal(j.followers, followers) && len(j.followers)+len(followers) > 0 {
				t.Errorf("job carries %v, want %v", j.followers, followers)
			}
		})
	}
}

// TestCarriedFollowersMeetFollowsAfterThePost: a job carries the followers
// of the moment its post was stored, and ends as a walk of the followers
// at its run would: one who unfollowed in between does not get the post
// (the delivery's guard), one who followed in between has it (from their
// follow's backfill).
func TestCarriedFollowersMeetFollowsAfterThePost(t *testing.T) {
	ctx := context.Background()
	db, followers, postID, w := newSmallJob(t)
	author, _, _ := splitPostID(postID)
	follows := NewFollowService(db)
	gone := followers[3]
	if err := follows.Unfollow(ctx, gone, author); err != nil {
		t.Fatal(err)
	}
	late := mustSignup(t, db, "late").ID
	if err := follows.Follow(ctx, late, author); err != nil {
		t.Fatal(err)
	}
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("step = %d jobs, %v; want 1", n, err)
	}
	if got := holding(t, db, []string{gone}, postID); got != 0 {
		t.Error("the follower who unfollowed after the post has it")
	}
	if got := holding(t, db, []string{late}, postID); got != 1 {
		t.Error("the follower who followed after the post lacks it")
	}
	stayed := slices.DeleteFunc(slices.Clone(followers), func(f string) bool { return f == gone })
	if got := holding(t, db, stayed, postID); got != len(stayed) {
		t.Errorf("%d of %d followers hold the post", got, len(stayed))
	}
}

// TestCarriedJobRacingDelete deletes the post just before the one pipeline
// of a job that carries its followers: the job's check, after the global
// timeline and the deliveries, finds the hash gone, and the job takes the
// post back off both before it leaves the stream, before the delete's own
// job has run.
func TestCarriedJobRacingDelete(t *testing.T) {
	ctx := context.Background()
	db, followers, postID, w := newSmallJob(t)
	if db.onCluster() {
		t.Skip("a Redis Cluster's jobs carry no followers: TestSmallFanOutJobRacingDelete")
	}
	author, _, _ := splitPostID(postID)
	deleted := &onPipeline{script: db.deliveryScripts().Hash(), run: func() error {
		return NewPostService(db).DeletePost(ctx, author, postID)
	}}
	db.client.AddHook(deleted)
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("step = %d jobs, %v; want 1", n, err)
	}
	if !deleted.done.Load() {
		t.Fatal("the post was not deleted during its job")
	}
	if got := holding(t, db, followers, postID); got != 0 {
		t.Errorf("after the create job %d followers hold the deleted post", got)
	}
	if err := db.client.ZScore(ctx, globalKey, postID).Err(); !errors.Is(err, redis.Nil) {
		t.Error("after the create job the global timeline holds the deleted post")
	}
	if len(w.held) != 1 {
		t.Errorf("the worker holds %d jobs, want the delete's, read by the create job's pipeline", len(w.held))
	}
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("the delete's job: step = %d jobs, %v; want 1", n, err)
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
}

// TestCarriedPipelinesOneAtATime: two workers of one process with carried
// jobs waiting never have two pipelines of them in Redis at once (see
// batchTurn), and between them they run every job whole. The hook holds
// each such pipeline a while, so that without the turn the other worker,
// holding jobs of its own, would send its pipeline meanwhile.
func TestCarriedPipelinesOneAtATime(t *testing.T) {
	db, followers, first, _ := newSmallJob(t)
	if db.onCluster() {
		t.Skip("a Redis Cluster's jobs carry no followers")
	}
	author, _, _ := splitPostID(first)
	posts := []string{first}
	for range 3 * jobsAtOnce {
		posts = append(posts, mustQueuePost(t, db, author, "queued"))
	}
	var inFlight, most atomic.Int64
	db.client.AddHook(&eachPipeline{script: db.deliveryScripts().Hash(), run: func(next func() error) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		return next()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		w := NewWorker(db, WorkerOptions{})
		w.nextClaim = time.Now().Add(time.Hour)
		for i := range w.ready {
			w.ready[i] = true
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.Run(ctx)
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); queuedJobs(t, db) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if got := most.Load(); got != 1 {
		t.Errorf("%d pipelines of carried jobs in Redis at once, want 1", got)
	}
	wantHeldByAll(t, db, followers, posts...)
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
}

// eachPipeline is a hook that runs every pipeline that calls script
// through run, which sends it by calling next.
type eachPipeline struct {
	script string
	run    func(next func() error) error
}

func (h *eachPipeline) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *eachPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *eachPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if args := c.Args(); len(args) > 1 && c.Name() == "evalsha" && args[1] == h.script {
				return h.run(func() error { return next(ctx, cmds) })
			}
		}
		return next(ctx, cmds)
	}
}

// TestCarriedJobListedByItsStep: on one Redis the step that stores a post
// and queues its job also lists the post on the global timeline, and the
// job says so, so its worker sends no listing of its own; the post is on
// the global timeline once the job is done. When that listing fails (a
// string where the timeline should be makes Redis refuse it), the step
// queues the job again without the mark, whose worker lists the post once
// the timeline can take it, and every follower holds the post once.
func TestCarriedJobListedByItsStep(t *testing.T) {
	ctx := context.Background()
	db, followers, postID, w := newSmallJob(t)
	if db.chainedPosts {
		t.Skip("a Redis Cluster queues jobs through the outbox, and lists the post in its job")
	}
	author, _, _ := splitPostID(postID)
	listing := db.pub(listGlobalScript).Hash()
	log := &pipelineLog{}
	db.client.AddHook(log)
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("step = %d jobs, %v; want 1", n, err)
	}
	for _, pipe := range log.log() {
		for _, c := range pipe {
			if args := c.Args(); c.Name() == "evalsha" && args[1] == listing {
				t.Errorf("the job of a post its step listed sent %v", args)
			}
		}
	}
	if err := db.client.ZScore(ctx, globalKey, postID).Err(); err != nil {
		t.Errorf("the global timeline does not hold %s: %v", postID, err)
	}

	if err := db.client.Set(ctx, globalKey, "not a timeline", 0).Err(); err != nil {
		t.Fatal(err)
	}
	unlisted := mustQueuePost(t, db, author, "its listing fails")
	if err := db.client.Del(ctx, globalKey).Err(); err != nil {
		t.Fatal(err)
	}
	shard := db.fanOutShard(author)
	msgs, err := db.client.XRange(ctx, fanoutStreamKey(shard), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var marks []bool
	for _, m := range msgs {
		if j, ok := parseJob(shard, m); ok && j.postID == unlisted {
			marks = append(marks, j.listed)
		}
	}
	if !slices.Equal(marks, []bool{true, false}) {
		t.Fatalf("jobs queued for the post whose listing failed, listed: %v; want [true false]", marks)
	}
	drainFanOut(t, db)
	if err := db.client.ZScore(ctx, globalKey, unlisted).Err(); err != nil {
		t.Errorf("the global timeline does not hold %s: %v", unlisted, err)
	}
	if got := holding(t, db, followers, unlisted); got != len(followers) {
		t.Errorf("%d of %d followers hold %s", got, len(followers), unlisted)
	}
	for _, f := range followers {
		if n := db.client.ZCard(ctx, homeKey(f)).Val(); n != 3 {
			t.Fatalf("%s's home holds %d posts, want the 3 posts once each", f, n)
		}
	}
}

// TestCarriedJobsEndTogether: the jobs run in one pipeline run and end in
// one call, each by its own check after its deliveries: of three jobs
// whose middle post is deleted just before the pipeline, the first and
// the last end there, and the middle one takes its post back off the
// followers and the global timeline and then ends, so that none is left
// pending.
func TestCarriedJobsEndTogether(t *testing.T) {
	ctx := context.Background()
	db, followers, first, w := newSmallJob(t)
	if db.onCluster() {
		t.Skip("a Redis Cluster's jobs carry no followers: TestSmallFanOutJobRacingDelete")
	}
	author, _, _ := splitPostID(first)
	deleted := mustQueuePost(t, db, author, "deleted during its job")
	last := mustQueuePost(t, db, author, "the last")
	log := &pipelineLog{}
	db.client.AddHook(log)
	db.client.AddHook(&onPipeline{script: db.deliveryScripts().Hash(), run: func() error {
		return NewPostService(db).DeletePost(ctx, author, deleted)
	}})
	if n, err := w.step(ctx); err != nil || n != 3 {
		t.Fatalf("step = %d jobs, %v; want 3", n, err)
	}
	if calls := carriedCalls(t, log); len(calls) != 1 {
		t.Errorf("the three jobs ended in %d calls, want 1", len(calls))
	}
	wantHeldByAll(t, db, followers, first, last)
	if got := holding(t, db, followers, deleted); got != 0 {
		t.Errorf("%d followers hold the deleted post", got)
	}
	if err := db.client.ZScore(ctx, globalKey, deleted).Err(); !errors.Is(err, redis.Nil) {
		t.Error("the global timeline holds the deleted post")
	}
	if n, err := w.step(ctx); err != nil || n != 1 {
		t.Fatalf("the delete's job: step = %d jobs, %v; want 1", n, err)
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
	if pending := mustPending(t, db, author); pending != 0 {
		t.Errorf("%d jobs pending in the group, want none", pending)
	}
}

// TestRefusedDeliveriesKeepTheJobPending: a Redis at its maxmemory
// (noeviction) refuses a job's deliveries, whose first write is a ZADD,
// and not the end of the job in the same pipeline, whose commands free
// memory or leave it be (HDEL, XACK, XDEL, DEL). The job must stay
// pending then, so that it is run again once Redis has room, rather than
// end with its post on none of its followers' timelines: a job that
// carries its followers (its pipeline ends it with others, fanOutCarried)
// and one of one batch that walks them (fanOutJob). Nor may its post stop
// waiting for its fan-out (fanOutPendingField), which would let the mover
// take it while its job is pending: the end of a job delivered raw, of
// several batches or of one, comes after its adds have answered.
func TestRefusedDeliveriesKeepTheJobPending(t *testing.T) {
	for _, kind := range []string{"Carried", "Walked", "WalkedRaw", "WalkedRawOneBatch"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			carried, raw := kind == "Carried", strings.HasPrefix(kind, "WalkedRaw")
			db, followers, postID, w := newSmallJob(t)
			if db.onCluster() {
				t.Skip("a Redis Cluster ends a job in a MULTI after its deliveries answered")
			} else if os.Getenv("REDISTEST_EMBEDDED") == "1" {
				t.Skip("needs redis-server's maxmemory, which the embedded Redis has not")
			}
			if !carried {
				requeueWithoutFollowers(t, db, postID)
			}
			author, _, _ := splitPostID(postID)
			if raw {
				// Delivered by plain ZADDs (see rawdelivery.go), which a
				// job of one batch is not.
				if err := db.client.HSet(ctx, userKey(author), followersCheckedField, "1").Err(); err != nil {
					t.Fatal(err)
				}
				if kind == "WalkedRawOneBatch" {
					db.rawFrom = 1 // its 20 followers, one batch
				} else {
					w.opts.Batch = 8
				}
			}
			limit := db.client.ConfigGet(ctx, "maxmemory").Val()["maxmemory"]
			policy := db.client.ConfigGet(ctx, "maxmemory-policy").Val()["maxmemory-policy"]
			t.Cleanup(func() {
				db.client.ConfigSet(ctx, "maxmemory", limit)
				db.client.ConfigSet(ctx, "maxmemory-policy", policy)
			})
			refuse := &onPipeline{script: db.deliveryScripts().Hash(), run: func() error {
				if err := db.client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					return err
				}
				return db.client.ConfigSet(ctx, "maxmemory", "1").Err()
			}}
			if raw {
				refuse.match = func(c redis.Cmder) bool {
					args := c.Args()
					if c.Name() != "zadd" || len(args) < 2 {
						return false
					}
					return strings.HasSuffix(argString(args[1]), ":home")
				}
			}
			db.client.AddHook(refuse)
			if _, err := w.step(ctx); err == nil {
				t.Error("step at maxmemory: no error")
			}
			if !refuse.done.Load() {
				t.Fatal("no delivery was refused: the test makes no case")
			}
			if err := db.client.ConfigSet(ctx, "maxmemory", limit).Err(); err != nil {
				t.Fatal(err)
			}
			if pending := mustPending(t, db, author); pending == 0 {
				t.Error("no job pending after its deliveries were refused")
			}
			if _, seq, _ := splitPostID(postID); !db.client.HExists(ctx, postKey(author, seq), fanOutPendingField).Val() {
				t.Error("the post no longer waits for its fan-out, whose deliveries were refused")
			}
			takeOverJobs(ctx, t, w)
			wantJobDone(ctx, t, db, author, followers, postID)
		})
	}
}

// TestRefusedListingKeepsTheJobPending: a job that carries its followers
// and whose step did not list its post (that listing failed, so the step
// queued it without listed) lists the post in its pipeline, before its
// deliveries. Redis refusing that listing alone (here a string where the
// global timeline should be: WRONGTYPE, not maxmemory, which would refuse
// the deliveries too) must keep the job pending, to be run again once the
// timeline takes the post, rather than end it with the post on no global
// timeline.
func TestRefusedListingKeepsTheJobPending(t *testing.T) {
	ctx := context.Background()
	db, followers, postID, w := newSmallJob(t)
	if db.chainedPosts {
		t.Skip("a Redis Cluster queues jobs through the outbox, and lists the post before its deliveries")
	}
	author, _, _ := splitPostID(postID)
	stepAll(ctx, t, w)
	if err := db.client.Set(ctx, globalKey, "not a timeline", 0).Err(); err != nil {
		t.Fatal(err)
	}
	unlisted := mustQueuePost(t, db, author, "its listings fail")
	if _, err := w.step(ctx); err == nil {
		t.Error("step with its listing refused: no error")
	}
	if pending := mustPending(t, db, author); pending == 0 {
		t.Error("no job pending after its listing was refused")
	}
	if err := db.client.Del(ctx, globalKey).Err(); err != nil {
		t.Fatal(err)
	}
	takeOverJobs(ctx, t, w)
	if err := db.client.ZScore(ctx, globalKey, unlisted).Err(); err != nil {
		t.Errorf("the global timeline does not hold %s: %v", unlisted, err)
	}
	wantJobDone(ctx, t, db, author, followers, unlisted)
}

// TestCarriedJobRefusedAlone: jobs that carry their followers run in one
// call (carriedLua), and a command Redis refuses fails only its own job:
// of three jobs in one call, the middle one's author has a follower whose
// home timeline is a string (WRONGTYPE), and that job stays pending, its
// post still waiting for its fan-out, while the first and the last end
// with their posts on every follower's timeline. Once the key is a
// timeline again, the job taken over delivers to everyone.
func TestCarriedJobRefusedAlone(t *testing.T) {
	ctx := context.Background()
	db, followers, first, w := newSmallJob(t)
	if db.onCluster() {
		t.Skip("a Redis Cluster's jobs carry no followers")
	}
	author, _, _ := splitPostID(first)
	other := mustSignup(t, db, "other")
	fans := []string{"2000", "2001", "2002"}
	for i, f := range fans {
		if err := db.client.ZAdd(ctx, followersKey(other.ID), redis.Z{Score: float64(i), Member: f}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := db.client.ZAdd(ctx, followingKey(f), redis.Z{Score: float64(i), Member: other.ID}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.client.Set(ctx, homeKey(fans[1]), "not a timeline", 0).Err(); err != nil {
		t.Fatal(err)
	}
	refused := mustQueuePost(t, db, other.ID, "one follower's timeline refuses it")
	last := mustQueuePost(t, db, author, "the last")
	log := &pipelineLog{}
	db.client.AddHook(log)
	var delivered atomic.Int64
	db.opts.Delivered = func(n int) { delivered.Add(int64(n)) }
	if _, err := w.step(ctx); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("step = %v; want the refused job's WRONGTYPE", err)
	}
	// The two ended jobs' followers, and the refused job's first follower,
	// whose timeline took the post before the second refused it.
	if got, want := delivered.Load(), int64(2*len(followers)+1); got != want {
		t.Errorf("%d deliveries counted, want %d", got, want)
	}
	if calls := carriedCalls(t, log); len(calls) != 1 {
		t.Errorf("the three jobs ran in %d calls, want 1", len(calls))
	}
	wantHeldByAll(t, db, followers, first, last)
	if pending := mustPending(t, db, author); pending != 1 {
		t.Errorf("%d jobs pending, want the refused one", pending)
	}
	if _, seq, _ := splitPostID(refused); !db.client.HExists(ctx, postKey(other.ID, seq), fanOutPendingField).Val() {
		t.Error("the refused job's post no longer waits for its fan-out")
	}
	if err := db.client.Del(ctx, homeKey(fans[1])).Err(); err != nil {
		t.Fatal(err)
	}
	takeOverJobs(ctx, t, w)
	wantJobDone(ctx, t, db, other.ID, fans, refused)
}

// TestCarriedCallsHoldFewFollowers: the jobs of a pipeline share a call
// while their followers add up to deliverBatch, so that no call holds
// Redis longer than a guarded delivery call does: three jobs that carry
// 99 followers each go out as two calls, two jobs and one, and each ends
// with its post on every follower's timeline.
func TestCarriedCallsHoldFewFollowers(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	if db.onCluster() {
		t.Skip("a Redis Cluster's jobs carry no followers")
	}
	author := mustSignup(t, db, "author")
	followers := manyFollowers(t, db, author.ID, db.carriedFollowers())
	if 3*len(followers) <= deliverBatch || 2*len(followers) > deliverBatch {
		t.Fatalf("%d followers a job: the test needs two jobs to fit in a call and three not to", len(followers))
	}
	mustCreatePost(t, db, author.ID, "the first, which makes the group")
	var posts []string
	for range 3 {
		posts = append(posts, mustQueuePost(t, db, author.ID, "carried"))
	}
	w := NewWorker(db, WorkerOptions{})
	w.nextClaim = time.Now().Add(time.Hour)
	for i := range w.ready {
		w.ready[i] = true
	}
	log := &pipelineLog{}
	db.client.AddHook(log)
	if n, err := w.step(ctx); err != nil || n != 3 {
		t.Fatalf("step = %d jobs, %v; want 3", n, err)
	}
	if jobs := carriedCalls(t, log); !slices.Equal(jobs, []int{2, 1}) {
		t.Errorf("jobs a call: %v, want [2 1]", jobs)
	}
	wantHeldByAll(t, db, followers, posts...)
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
}

// wantHeldByAll checks that every one of followers holds each of posts.
func wantHeldByAll(t *testing.T, db *DB, followers []string, posts ...string) {
	t.Helper()
	for _, id := range posts {
		if got := holding(t, db, followers, id); got != len(followers) {
			t.Errorf("%d of %d followers hold %s", got, len(followers), id)
		}
	}
}

// carriedCalls returns, for each call of carriedLua that log saw, how
// many jobs it ran.
func carriedCalls(t *testing.T, log *pipelineLog) []int {
	t.Helper()
	var jobs []int
	for _, pipe := range log.log() {
		for _, c := range pipe {
			args := c.Args()
			i := slices.Index(args, any("carried"))
			if c.Name() != "evalsha" || i < 0 || i+7 >= len(args) {
				continue
			}
			m, ok := args[i+7].(int)
			if !ok {
				t.Fatalf("carriedLua's job count is %T %v", args[i+7], args[i+7])
			}
			jobs = append(jobs, m)
		}
	}
	return jobs
}

// wantJobDone checks what a refused job run again must have left: every
// follower holds postID, which no longer waits for its fan-out, none of
// author's jobs is pending, and no job's delivery mark is left.
func wantJobDone(ctx context.Context, t *testing.T, db *DB, author string, followers []string, postID string) {
	t.Helper()
	if got := holding(t, db, followers, postID); got != len(followers) {
		t.Errorf("%d of %d followers hold %s", got, len(followers), postID)
	}
	if _, seq, _ := splitPostID(postID); db.client.HExists(ctx, postKey(author, seq), fanOutPendingField).Val() {
		t.Errorf("%s still waits for its fan-out", postID)
	}
	if pending := mustPending(t, db, author); pending != 0 {
		t.Errorf("%d jobs pending once run again, want none", pending)
	}
	if marks := db.client.Keys(ctx, prefix+"*:delivered:*").Val(); len(marks) != 0 {
		t.Errorf("delivery marks outlived their jobs: %v", marks)
	}
}

// stepAll runs w's steps until one finds no job.
func stepAll(ctx context.Context, t *testing.T, w *Worker) {
	t.Helper()
	for {
		n, err := w.step(ctx)
		if err != nil {
			t.Fatal(err)
		} else if n == 0 {
			return
		}
	}
}

// takeOverJobs does what a worker that takes over the jobs left pending
// does: it claims them at once, and runs them and any new ones.
func takeOverJobs(ctx context.Context, t *testing.T, w *Worker) {
	t.Helper()
	w.nextClaim = time.Time{}
	w.opts.ClaimIdle = time.Millisecond
	time.Sleep(5 * time.Millisecond) // past ClaimIdle
	stepAll(ctx, t, w)
}
