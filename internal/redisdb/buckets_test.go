package redisdb

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// storedFollowers returns userID's followers as Redis holds them, follower
// -> follow time, and how many buckets hold them (0: the one set). It
// checks that the one set is gone once the followers are in buckets, and
// that each follower is in the bucket its id hashes to.
func storedFollowers(tb testing.TB, db *DB, userID string) (map[string]float64, int) {
	tb.Helper()
	ctx := context.Background()
	state := parseFollowerState(db.client.HGet(ctx, userKey(userID), followerBucketsField).Val())
	out := map[string]float64{}
	if state.buckets == 0 {
		for _, z := range db.client.ZRangeWithScores(ctx, followersKey(userID), 0, -1).Val() {
			out[z.Member.(string)] = z.Score
		}
		return out, 0
	}
	if n := db.client.Exists(ctx, followersKey(userID)).Val(); n != 0 {
		tb.Errorf("user %s: followers in %d buckets, and the one set is still there", userID, state.buckets)
	}
	for b := range state.buckets {
		for _, z := range db.client.ZRangeWithScores(ctx, followerBucketKey(userID, b), 0, -1).Val() {
			f := z.Member.(string)
			if want := followerBucket(f, state.buckets); want != b {
				tb.Errorf("user %s: follower %s is in bucket %d, want %d", userID, f, b, want)
			}
			if _, dup := out[f]; dup {
				tb.Errorf("user %s: follower %s is in two buckets", userID, f)
			}
			out[f] = z.Score
		}
	}
	return out, state.buckets
}

// followersByTruth returns who follows userID according to the following
// sets of candidates, the truth, with their follow times.
func followersByTruth(tb testing.TB, db *DB, userID string, candidates []string) map[string]float64 {
	tb.Helper()
	ctx := context.Background()
	pipe := db.client.Pipeline()
	cmds := make([]*redis.FloatCmd, len(candidates))
	for i, c := range candidates {
		cmds[i] = pipe.ZScore(ctx, followingKey(c), userID)
	}
	pipe.Exec(ctx)
	out := map[string]float64{}
	for i, c := range cmds {
		if c.Err() == nil {
			out[candidates[i]] = c.Val()
		}
	}
	return out
}

// assertMirrors fails tb where userID's stored followers differ from the
// truth, and where the count or the follower pages read through the
// services differ from either.
func assertMirrors(tb testing.TB, db *DB, userID string, candidates []string) {
	tb.Helper()
	ctx := context.Background()
	stored, _ := storedFollowers(tb, db, userID)
	truth := followersByTruth(tb, db, userID, candidates)
	for f, at := range truth {
		if got, ok := stored[f]; !ok {
			tb.Errorf("follower %s of %s is lost", f, userID)
		} else if got != at {
			tb.Errorf("follower %s of %s at %v, the following set says %v", f, userID, got, at)
		}
	}
	for f := range stored {
		if _, ok := truth[f]; !ok {
			tb.Errorf("%s is stored as a follower of %s but does not follow them", f, userID)
		}
	}
	if n := mustCounts(tb, db, userID).Followers; n != len(truth) {
		tb.Errorf("followersCount of %s is %d, %d follow them", userID, n, len(truth))
	}
	var want []followEntry
	for f, at := range truth {
		want = append(want, followEntry{member: f, at: int64(at)})
	}
	// Pages of 7 entries, as FindFollowers reads them (followers may have
	// no user hash here, and a page leaves those out).
	var got []followEntry
	set, pos := followersSet(userID, 0), followPos{}
	for {
		total, page, err := NewFollowService(db).readFollows(ctx, &set, pos, 7)
		if err != nil {
			tb.Fatal(err)
		}
		if total != int64(len(truth)) {
			tb.Errorf("a page of the followers of %s says %d in all, want %d", userID, total, len(truth))
		}
		got = append(got, page...)
		if len(page) < 7 {
			break
		}
		pos = followPos{at: page[6].at, member: page[6].member, set: true}
	}
	if !slices.Equal(got, wantOrder(want)) {
		tb.Errorf("followers pages of %s:\n got %v\nwant %v", userID, got, wantOrder(want))
	}
}

// bucketState returns the followerBuckets field of userID.
func bucketState(tb testing.TB, db *DB, userID string) string {
	tb.Helper()
	return db.client.HGet(context.Background(), userKey(userID), followerBucketsField).Val()
}

// signupMany signs up n users named prefix0, prefix1, … and returns their ids.
func signupMany(tb testing.TB, db *DB, prefix string, n int) []string {
	tb.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = mustSignup(tb, db, fmt.Sprintf("%s%d", prefix, i)).ID
	}
	return ids
}

// TestFollowersMoveIntoBuckets follows an account past the threshold and
// checks each step of the move: queued by the follow that crossed it, done
// by a worker, and then every read and write of the followers (follows,
// unfollows, counts, pages, common followers, fan-out and its undoing) on
// the buckets.
func TestFollowersMoveIntoBuckets(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 5, FollowerBuckets: 4})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	fans := signupMany(t, db, "fan", 12)
	for _, f := range fans[:5] {
		mustFollow(t, db, f, ada)
	}
	if s := bucketState(t, db, ada); s != "" || queuedJobs(t, db) != 0 {
		t.Fatalf("at the threshold: state %q, %d jobs; want none", s, queuedJobs(t, db))
	}
	mustFollow(t, db, fans[5], ada)
	if s := bucketState(t, db, ada); s != bucketsQueued+strconv.FormatInt(db.now().UnixMilli(), 10) && parseFollowerState(s) != (followerState{}) {
		t.Fatalf("past the threshold: state %q, want queued", s)
	}
	if n := queuedJobs(t, db); n != 1 {
		t.Fatalf("past the threshold: %d jobs queued, want 1", n)
	}
	mustFollow(t, db, fans[6], ada) // queued already: no second job
	if n := queuedJobs(t, db); n != 1 {
		t.Fatalf("a second follow queued the move again: %d jobs", n)
	}
	assertMirrors(t, db, ada, fans) // still the one set
	drainFanOut(t, db)
	if s := bucketState(t, db, ada); s != "4" {
		t.Fatalf("after the move: state %q, want 4", s)
	}
	if _, n := storedFollowers(t, db, ada); n != 4 {
		t.Fatalf("followers in %d buckets, want 4", n)
	}
	assertMirrors(t, db, ada, fans)

	// Follows and unfollows on the buckets.
	for _, f := range fans[7:] {
		mustFollow(t, db, f, ada)
	}
	for _, f := range fans[:3] {
		if err := follows.Unfollow(ctx, f, ada); err != nil {
			t.Fatal(err)
		}
	}
	assertMirrors(t, db, ada, fans)
	for b := range 4 {
		if n := db.client.Exists(ctx, followerTombstonesKey(ada, b)).Val(); n != 0 {
			t.Errorf("bucket %d has tombstones, but nobody unfollowed during the move", b)
		}
	}

	// Common followers and followers you follow, across buckets on
	// either side of the walk.
	bob := mustSignup(t, db, "bob").ID
	for _, f := range fans[2:9] {
		mustFollow(t, db, f, bob)
	}
	for _, f := range fans[4:6] {
		mustFollow(t, db, bob, f)
	}
	for _, pair := range [][2]string{{bob, ada}, {ada, bob}} {
		viewer, user := pair[0], pair[1]
		conn, err := follows.FindCommonFollowers(ctx, viewer, user, warble.PageArgs{First: 100})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range conn.Edges {
			got = append(got, e.Node.ID)
		}
		want := fans[3:9] // fans 0..2 unfollowed ada; fans 2..8 follow bob
		if slices.Sort(got); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("common followers of %s and %s = %v, want %v", viewer, user, got, want)
		}
		if n, err := conn.Count(ctx); err != nil || n != len(want) {
			t.Errorf("common followers count = %d, %v; want %d", n, err, len(want))
		}
	}
	conn, err := follows.FindFollowersYouFollow(ctx, bob, ada, warble.PageArgs{First: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(conn.Edges) != 2 {
		t.Errorf("followers of ada whom bob follows: %d, want 2", len(conn.Edges))
	}

	// Fan-out reaches every bucket, and its undoing too.
	p, err := NewPostService(db).CreatePost(ctx, ada, "to every bucket")
	if err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	following := slices.Collect(maps.Keys(followersByTruth(t, db, ada, fans)))
	if got := holding(t, db, following, p.ID); got != len(following) {
		t.Errorf("%d of %d followers got the post", got, len(following))
	}
	if got := holding(t, db, fans[:3], p.ID); got != 0 {
		t.Errorf("%d former followers got the post", got)
	}
	if err := NewPostService(db).DeletePost(ctx, ada, p.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if got := holding(t, db, following, p.ID); got != 0 {
		t.Errorf("%d followers still hold the deleted post", got)
	}
}

// TestFollowersMoveWhileFollowing runs follows and unfollows of an account
// from many goroutines while a worker moves its followers into buckets a
// few at a time, then compares the buckets with the truth, the followers'
// following sets: nobody lost, nobody brought back, every time exact.
func TestFollowersMoveWhileFollowing(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 40, FollowerBuckets: 5})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	// Followers need no user hash: ids from 1000 on.
	candidates := make([]string, 120)
	for i := range candidates {
		candidates[i] = strconv.Itoa(1000 + i)
	}
	for _, f := range candidates[:60] {
		mustFollow(t, db, f, ada)
	}
	if n := queuedJobs(t, db); n != 1 {
		t.Fatalf("%d jobs queued, want the move", n)
	}

	var during atomic.Int64 // follows and unfollows made while the account was migrating
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				f := candidates[r.IntN(len(candidates))]
				var err error
				if r.IntN(2) == 0 {
					err = follows.Follow(ctx, f, ada)
				} else {
					err = follows.Unfollow(ctx, f, ada)
				}
				if err != nil {
					t.Errorf("%s -> %s: %v", f, ada, err)
					return
				}
				if parseFollowerState(bucketState(t, db, ada)).migrating > 0 {
					during.Add(1)
				}
			}
		}()
	}
	// The move, two followers per batch, while they run; then a little
	// more churn on the buckets.
	w := NewWorker(db, WorkerOptions{Batch: 2})
	for queuedJobs(t, db) > 0 {
		if _, err := w.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	if s := bucketState(t, db, ada); s != "5" {
		t.Fatalf("after the move: state %q, want 5", s)
	}
	if during.Load() == 0 {
		t.Fatal("no follow or unfollow ran during the move")
	}
	t.Logf("%d follows and unfollows ran during the move", during.Load())
	assertMirrors(t, db, ada, candidates)
}

// TestFollowersMoveKeepsReadsWhole reads the count and the pages of an
// account's followers all through the move into buckets, with nobody
// following or unfollowing: every read sees every follower, once.
func TestFollowersMoveKeepsReadsWhole(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 30, FollowerBuckets: 3})
	ada := mustSignup(t, db, "ada").ID
	var want []followEntry
	for i := range 50 {
		f := mustSignup(t, db, fmt.Sprintf("fan%d", i)).ID
		mustFollow(t, db, f, ada)
		at, _ := db.client.ZScore(ctx, followingKey(f), ada).Result()
		want = append(want, followEntry{member: f, at: int64(at)})
	}
	want = wantOrder(want)

	done := make(chan struct{})
	var reads atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				counts, err := db.findUserCounts(ctx, []string{ada})
				if err != nil {
					t.Error(err)
					return
				}
				if counts[0].Followers != len(want) {
					t.Errorf("followersCount %d during the move, want %d", counts[0].Followers, len(want))
					return
				}
				got := pageAll(t, 9, func(page warble.PageArgs) (*warble.UserConnection, error) {
					return NewFollowService(db).FindFollowers(ctx, ada, page)
				})
				if !slices.Equal(got, want) {
					t.Errorf("followers during the move:\n got %v\nwant %v", got, want)
					return
				}
				reads.Add(1)
			}
		}()
	}
	w := NewWorker(db, WorkerOptions{Batch: 1})
	for queuedJobs(t, db) > 0 {
		if _, err := w.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	if s := bucketState(t, db, ada); s != "3" {
		t.Fatalf("after the move: state %q, want 3", s)
	}
	t.Logf("%d whole reads during the move", reads.Load())
}

// TestFollowerWalkAcrossBuckets walks an account's followers as fan-out
// does, a few at a time, with every cursor saved and read back: once in
// the one set while the followers move into buckets halfway, and once in
// buckets. Every follower is walked, and only those tied on the time where
// the walk left the one set are walked twice.
func TestFollowerWalkAcrossBuckets(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 1000, FollowerBuckets: 4})
	ada := mustSignup(t, db, "ada").ID
	followers := map[string]float64{}
	pipe := db.client.Pipeline()
	for i := range 90 {
		f := strconv.Itoa(1000 + i)
		score := float64(i - i%3) // followers tie in threes
		followers[f] = score
		pipe.ZAdd(ctx, followersKey(ada), redis.Z{Score: score, Member: f})
		pipe.ZAdd(ctx, followingKey(f), redis.Z{Score: score, Member: ada})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var leftAt float64 // the follow time where the walk left the one set
	walk := func(moveAfter int) map[string]int {
		seen := map[string]int{}
		c := startCursor
		for chunks := 0; ; chunks++ {
			if chunks == moveAfter {
				if err := db.moveToBuckets(ctx, ada, startCursor, 7, noSave); err != nil {
					t.Fatal(err)
				}
				leftAt, _ = strconv.ParseFloat(c.at, 64)
			}
			got, next, last, err := db.followerChunk(ctx, ada, c, 4)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range got {
				seen[f]++
			}
			if last {
				return seen
			}
			var ok bool
			if c, ok = parseFollowerCursor(next.String()); !ok || c != next {
				t.Fatalf("cursor %q does not read back: %+v", next.String(), c)
			}
		}
	}
	// The one set for 5 chunks (20 followers, the last of them at score
	// 18 with 19 and 20 still to come), then buckets.
	seen := walk(5)
	if leftAt != 18 {
		t.Fatalf("the walk left the one set at %v, want 18", leftAt)
	}
	for f, score := range followers {
		want := 1
		if score == leftAt {
			want = seen[f] // walked once or twice: tied on the time the walk left the one set
		}
		if seen[f] != want || seen[f] == 0 || seen[f] > 2 {
			t.Errorf("follower %s (at %v) walked %d times", f, score, seen[f])
		}
	}
	if _, n := storedFollowers(t, db, ada); n != 4 {
		t.Fatalf("followers in %d buckets, want 4", n)
	}
	seen = walk(-1)
	for f := range followers {
		if seen[f] != 1 {
			t.Errorf("in buckets, follower %s walked %d times", f, seen[f])
		}
	}
	if len(seen) != len(followers) {
		t.Errorf("walked %d followers, want %d", len(seen), len(followers))
	}
}

// TestFanOutResumedAfterDeleteInBuckets is TestFanOutResumedAfterDelete
// for followers in buckets: a batch delivered late by a worker that died
// is taken back by whoever resumes the job, whichever bucket it was in.
func TestFanOutResumedAfterDeleteInBuckets(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 10, FollowerBuckets: 3})
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 250)
	if err := db.moveToBuckets(ctx, ada.ID, startCursor, 100, noSave); err != nil {
		t.Fatal(err)
	}
	if _, n := storedFollowers(t, db, ada.ID); n != 3 {
		t.Fatalf("followers in %d buckets, want 3", n)
	}
	p, err := NewPostService(db).CreatePost(ctx, ada.ID, "soon gone")
	if err != nil {
		t.Fatal(err)
	}
	var saved followerCursor
	stop := fmt.Errorf("stop")
	err = db.fanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, 60, func(c followerCursor) error {
		saved = c
		return stop
	})
	if err != stop {
		t.Fatalf("fanOut = %v, want the save error", err)
	}
	if err := NewPostService(db).DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	if err := db.unFanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, 60, noSave); err != nil {
		t.Fatal(err)
	}
	// Two late batches from the cursor land, across a bucket's end.
	pos := saved
	late := 0
	for range 2 {
		batch, next, _, err := db.followerChunk(ctx, ada.ID, pos, 60)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range batch {
			db.client.ZAdd(ctx, homeKey(f), redis.Z{Score: float64(p.Seq), Member: p.ID})
		}
		late += len(batch)
		pos = next
	}
	if got := holding(t, db, followers, p.ID); got != late || late == 0 {
		t.Fatalf("the late batches reached %d followers, want %d", got, late)
	}
	if err := db.fanOut(ctx, ada.ID, p.Seq, p.ID, saved, 60, noSave); err != nil {
		t.Fatal(err)
	}
	if got := holding(t, db, followers, p.ID); got != 0 {
		t.Errorf("%d followers hold the deleted post", got)
	}
}

// TestBucketsOff checks that with buckets off no follow queues a move, and
// that a move queued before they were turned off only clears its mark.
func TestBucketsOff(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: -1})
	ada := mustSignup(t, db, "ada").ID
	followers := manyFollowers(t, db, ada, 3)
	mustFollow(t, db, mustSignup(t, db, "bob").ID, ada)
	if n := queuedJobs(t, db); n != 0 {
		t.Fatalf("%d jobs queued with buckets off", n)
	}
	db.client.HSet(ctx, userKey(ada), followerBucketsField, bucketsQueued+"1")
	if err := db.queueBucketsJob(ctx, ada); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if s := bucketState(t, db, ada); s != "" {
		t.Errorf("state %q after a move with buckets off, want none", s)
	}
	if got, _ := storedFollowers(t, db, ada); len(got) != len(followers)+1 {
		t.Errorf("%d followers in the one set, want %d", len(got), len(followers)+1)
	}
}

// TestBucketMoveRequeued checks that a move whose job was lost (queued,
// then the request died before the XADD) is queued again by a follow once
// bucketRequeueAfter has passed, and not before.
func TestBucketMoveRequeued(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 2, Now: clock.Now})
	ada := mustSignup(t, db, "ada").ID
	fans := signupMany(t, db, "fan", 5)
	for _, f := range fans[:3] {
		mustFollow(t, db, f, ada)
	}
	// The job is lost.
	for shard := range db.opts.FanOutShards {
		db.client.Del(ctx, fanoutStreamKey(shard))
	}
	mustFollow(t, db, fans[3], ada)
	if n := queuedJobs(t, db); n != 0 {
		t.Fatalf("queued again at once: %d jobs", n)
	}
	clock.ms.Add(bucketRequeueAfter.Milliseconds())
	mustFollow(t, db, fans[4], ada)
	if n := queuedJobs(t, db); n != 1 {
		t.Fatalf("%d jobs after bucketRequeueAfter, want 1", n)
	}
	drainFanOut(t, db)
	if _, n := storedFollowers(t, db, ada); n != DefaultFollowerBuckets {
		t.Errorf("followers in %d buckets, want %d", n, DefaultFollowerBuckets)
	}
	assertMirrors(t, db, ada, fans)
}

// beforeCopy runs its func once, just before the first pipeline that
// copies followers into buckets reaches Redis, with the first follower of
// that pipeline: the moment between the copy's read of the one set and
// its write of a bucket.
type beforeCopy struct {
	once sync.Once
	run  func(follower string)
}

func (h *beforeCopy) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *beforeCopy) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *beforeCopy) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			args := cmd.Args()
			if len(args) > 6 && fmt.Sprint(args[0]) == "evalsha" && fmt.Sprint(args[1]) == copyFollowersScript.Hash() {
				h.once.Do(func() { h.run(fmt.Sprint(args[6])) })
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestBucketCopyRace puts a follow change between the copy's read of a
// follower and its write of the bucket, the one order the copy cannot
// see: an unfollow must not be undone by the copy (the tombstone), and an
// unfollow and a follow again must leave the new follow time.
func TestBucketCopyRace(t *testing.T) {
	for _, refollow := range []bool{false, true} {
		t.Run(fmt.Sprintf("refollow=%v", refollow), func(t *testing.T) {
			ctx := context.Background()
			clock := &fakeClock{}
			clock.ms.Store(1_700_000_000_000)
			db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 3, FollowerBuckets: 2, Now: clock.Now})
			follows := NewFollowService(db)
			ada := mustSignup(t, db, "ada").ID
			fans := signupMany(t, db, "fan", 6)
			for _, f := range fans {
				clock.ms.Add(1)
				mustFollow(t, db, f, ada)
			}
			var changed string
			db.client.AddHook(&beforeCopy{run: func(f string) {
				changed = f
				clock.ms.Add(1000)
				if err := follows.Unfollow(ctx, f, ada); err != nil {
					t.Error(err)
				}
				if refollow {
					clock.ms.Add(1000)
					mustFollow(t, db, f, ada)
				}
			}})
			drainFanOut(t, db)
			if changed == "" {
				t.Fatal("the hook never ran")
			}
			stored, n := storedFollowers(t, db, ada)
			if n != 2 {
				t.Fatalf("followers in %d buckets, want 2", n)
			}
			at, ok := stored[changed]
			if !refollow && ok {
				t.Errorf("follower %s unfollowed during the copy and is back", changed)
			}
			if refollow && (!ok || int64(at) != clock.ms.Load()) {
				t.Errorf("follower %s followed again during the copy: stored %v, %v; want the new time %d", changed, at, ok, clock.ms.Load())
			}
			assertMirrors(t, db, ada, fans)
		})
	}
}

// TestPullThresholdCountsBuckets checks that the pull threshold counts an
// account's followers in its buckets: past it, a post is pulled, not
// pushed, though the one set is gone.
func TestPullThresholdCountsBuckets(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: 4, FollowerBucketThreshold: 2, FollowerBuckets: 3})
	ada := mustSignup(t, db, "ada").ID
	fans := signupMany(t, db, "fan", 5)
	for _, f := range fans {
		mustFollow(t, db, f, ada)
	}
	drainFanOut(t, db)
	if _, n := storedFollowers(t, db, ada); n != 3 {
		t.Fatalf("followers in %d buckets, want 3", n)
	}
	p, err := NewPostService(db).CreatePost(ctx, ada, "pulled")
	if err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if pulled, err := db.client.SIsMember(ctx, pullAuthorsKey, ada).Result(); err != nil || !pulled {
		t.Errorf("ada with 5 followers in buckets and a pull threshold of 4 is not pulled (%v)", err)
	}
	if got := holding(t, db, fans, p.ID); got != 0 {
		t.Errorf("the pulled post was pushed to %d home timelines", got)
	}
}

// TestFollowRepairsAfterCrashInBuckets: a follow cut short between its
// writes is repaired by following again, as with one set, while the
// account's followers move into buckets (the one set written, the bucket
// not, an old tombstone still there) and once they are in buckets (only
// the following set written).
func TestFollowRepairsAfterCrashInBuckets(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 2, FollowerBuckets: 2})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	fans := signupMany(t, db, "fan", 4)
	for _, f := range fans[:3] {
		mustFollow(t, db, f, ada)
	}
	// The move has begun (as its job's first step does) and fan0 left.
	db.client.HSet(ctx, userKey(ada), followerBucketsField, bucketsMigrating+"2")
	if err := follows.Unfollow(ctx, fans[0], ada); err != nil {
		t.Fatal(err)
	}
	b := followerBucket(fans[0], 2)
	if ok := db.client.SIsMember(ctx, followerTombstonesKey(ada, b), fans[0]).Val(); !ok {
		t.Fatal("an unfollow during the move left no tombstone")
	}
	// fan0 follows again, and the request dies after the one set.
	db.client.ZAdd(ctx, followingKey(fans[0]), redis.Z{Score: 1234, Member: ada})
	db.client.ZAdd(ctx, followersKey(ada), redis.Z{Score: 1234, Member: fans[0]})
	mustFollow(t, db, fans[0], ada)
	if ok := db.client.SIsMember(ctx, followerTombstonesKey(ada, b), fans[0]).Val(); ok {
		t.Error("the repaired follow left its tombstone")
	}
	if err := db.moveToBuckets(ctx, ada, startCursor, 1, noSave); err != nil {
		t.Fatal(err)
	}
	if stored, n := storedFollowers(t, db, ada); n != 2 || stored[fans[0]] != 1234 {
		t.Fatalf("after the move: %v in %d buckets, want fan %s at 1234", stored, n, fans[0])
	}
	// In buckets: fan3's follow dies after the following set.
	db.client.ZAdd(ctx, followingKey(fans[3]), redis.Z{Score: 5678, Member: ada})
	mustFollow(t, db, fans[3], ada)
	if stored, _ := storedFollowers(t, db, ada); stored[fans[3]] != 5678 {
		t.Errorf("repaired follower %s at %v, want the original 5678", fans[3], stored[fans[3]])
	}
	assertMirrors(t, db, ada, fans)
}
