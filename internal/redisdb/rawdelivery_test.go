package redisdb

import (
	"context"
	"errors"
	"hash/fnv"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// rawSetup is an author with many followers (seeded, then marked checked
// as a Warble that logged them all would have) and one follower who
// follows through FollowService, a post whose job is left queued, and the
// job's end, for tests that run the job by fanOutJob.
type rawSetup struct {
	db        *DB
	follows   *FollowService
	ada, fred string
	followers []string // the seeded ones
	seq       int64
	postID    string
	end       *jobEnd
}

func newRawSetup(t *testing.T, opts Options) *rawSetup {
	t.Helper()
	opts.AsyncFanOut = true
	db := newTestDB(t, opts)
	if db.onCluster() {
		t.Skip("raw deliveries are for one Redis; a Redis Cluster keeps the guarded script per follower")
	}
	ctx := context.Background()
	s := &rawSetup{db: db, follows: NewFollowService(db)}
	s.ada = mustSignup(t, db, "ada").ID
	s.fred = mustSignup(t, db, "fred").ID
	s.followers = manyFollowers(t, db, s.ada, 600)
	mustFollow(t, db, s.fred, s.ada)
	if err := db.client.HSet(ctx, userKey(s.ada), followersCheckedField, "1").Err(); err != nil {
		t.Fatal(err)
	}
	p, err := NewPostService(db).CreatePost(ctx, s.ada, "to many")
	if err != nil {
		t.Fatal(err)
	}
	s.seq, s.postID = p.Seq, p.ID
	s.end = &jobEnd{shard: 0, id: strconv.FormatInt(time.Now().UnixMilli(), 10) + "-0"}
	return s
}

// run runs the post's job from its start, 250 followers a batch.
func (s *rawSetup) run(ctx context.Context) error {
	return s.db.fanOutJob(ctx, s.ada, s.seq, s.postID, startCursor, 250, noSave, s.end)
}

// holds reports whether userID's home timeline holds the post.
func (s *rawSetup) holds(t *testing.T, userID string) bool {
	t.Helper()
	_, err := s.db.client.ZScore(context.Background(), homeKey(userID), s.postID).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return err == nil
}

// TestRawDeliveries: a job of an author whose followers side is checked
// delivers by plain ZADDs (no delivery script runs), reaches every active
// follower once, skips the inactive, counts what it added, announces only
// on the channels someone listens to, and leaves a followers side of an
// unchecked author to the guarded script.
func TestRawDeliveries(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{now: time.Now()}
	var delivered int
	s := newRawSetup(t, Options{Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour, Delivered: func(n int) { delivered += n }})
	db := s.db
	away := s.followers[10]
	if err := db.client.Set(ctx, seenKey(away), clock.Now().Add(-8*24*time.Hour).UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	msgs := listen(t, db, homeChannel(s.followers[0]), homeChannel(s.followers[300]))
	scripts := &countScripts{}
	db.client.AddHook(scripts)
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := scripts.deliveries.Load(); n != 0 {
		t.Errorf("a raw job ran %d delivery scripts", n)
	}
	for _, f := range append(slices.Clone(s.followers), s.fred) {
		if got, want := s.holds(t, f), f != away; got != want {
			t.Errorf("follower %s holds the post: %v, want %v", f, got, want)
		}
	}
	if want := len(s.followers); delivered != want {
		t.Errorf("delivered = %d, want %d", delivered, want)
	}
	for range 2 {
		m := nextMessage(t, msgs)
		if m.Payload != encodeAdded(s.seq, s.postID) {
			t.Errorf("message on %s = %q, want the post added", m.Channel, m.Payload)
		}
	}
	// Again: nothing added, nothing announced.
	delivered = 0
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if delivered != 0 {
		t.Errorf("a repeated job delivered %d", delivered)
	}
	db.publish(ctx, db.client, homeChannel(s.followers[0]), "marker")
	if m := nextMessage(t, msgs); m.Payload != "marker" {
		t.Errorf("a repeated job announced %q", m.Payload)
	}

	// Unchecked: the guarded script.
	if err := db.client.HDel(ctx, userKey(s.ada), followersCheckedField).Err(); err != nil {
		t.Fatal(err)
	}
	p := mustCreatePostNoDrain(t, db, s.ada)
	s.seq, s.postID = p.Seq, p.ID
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if scripts.deliveries.Load() == 0 {
		t.Error("a job of an unchecked author ran no delivery script")
	}
	if !s.holds(t, s.followers[599]) {
		t.Error("the guarded job did not deliver")
	}
}

// TestRawDeliveriesRacingUnfollow walks an unfollow's three steps (the
// following set, the followers side, the home timeline's posts taken off)
// through every place among a raw batch's steps (the log's end and the
// walk, the adds and the reads after them, the repair), and a follow that
// races it, and checks the end: a follower who does not follow holds no
// post of the author once the job and the unfollow are done; one who
// follows holds it.
func TestRawDeliveriesRacingUnfollow(t *testing.T) {
	// An unfollow's steps: 1 the truth, 2 the followers side, 3 the posts
	// taken off. Each case runs some steps at one of the batch's stages
	// and the rest at a later one ("" for after the job; "never" for a
	// writer that died).
	type at struct{ steps, stage string }
	tests := []struct {
		name   string
		plan   []at
		follow bool // a Follow of the pair at the end, after the unfollow
	}{
		// The interleaving the guard used to prevent: the whole unfollow
		// between the walk and the adds. Only the repair takes it off.
		{name: "AllBetweenWalkAndAdds", plan: []at{{"123", "walked"}}},
		{name: "AllBetweenSeenAndAdds", plan: []at{{"123", "seen"}}},
		{name: "TruthAndSideBeforeAddsPostsAfter", plan: []at{{"12", "walked"}, {"3", "added"}}},
		{name: "TruthBeforeAddsRestAfter", plan: []at{{"1", "walked"}, {"23", "added"}}},
		{name: "TruthBeforeAddsRestAfterRepair", plan: []at{{"1", "walked"}, {"23", "repaired"}}},
		{name: "AllAfterAdds", plan: []at{{"123", "added"}}},
		{name: "TruthThenDied", plan: []at{{"1", "walked"}, {"23", "never"}}},
		{name: "TruthAndSideThenDied", plan: []at{{"12", "walked"}, {"3", "never"}}},
		{name: "FollowAgainAfter", plan: []at{{"123", "walked"}}, follow: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := newRawSetup(t, Options{})
			db := s.db
			var token string // the unfollow's count in the unsure hash
			step := func(n rune) {
				t.Helper()
				var err error
				switch n {
				case '1':
					if token, err = s.follows.checkPair(ctx, s.fred, s.ada, nil); err == nil {
						err = db.client.ZRem(ctx, followingKey(s.fred), s.ada).Err()
					}
				case '2':
					_, err = s.follows.mirrorFollow(ctx, s.fred, s.ada, false, "", token)
				case '3':
					_, err = s.follows.unbackfill(ctx, s.fred, s.ada, true)
				}
				if err != nil {
					t.Errorf("unfollow step %c: %v", n, err)
				}
			}
			fired := map[string]bool{}
			db.rawStep = func(stage string, followers []string) {
				if !slices.Contains(followers, s.fred) {
					return
				}
				for _, a := range tt.plan {
					if a.stage == stage && !fired[stage] {
						for _, n := range a.steps {
							step(n)
						}
					}
				}
				fired[stage] = true
			}
			if err := s.run(ctx); err != nil {
				t.Fatal(err)
			}
			db.rawStep = nil
			for _, a := range tt.plan {
				if a.stage != "never" && !fired[a.stage] {
					t.Fatalf("stage %q never came for fred: the test makes no case", a.stage)
				}
			}
			if tt.follow {
				mustFollow(t, db, s.fred, s.ada)
				if !s.holds(t, s.fred) {
					t.Error("fred follows again and his follow's backfill did not bring the post")
				}
				return
			}
			if s.holds(t, s.fred) {
				t.Error("fred, who unfollowed, holds the post once the job is done")
			}
			if !s.holds(t, s.followers[0]) || !s.holds(t, s.followers[599]) {
				t.Error("followers who stayed lack the post")
			}
		})
	}
}

// TestRawDeliveriesTakenOver: a worker that dies between a batch's adds
// and their repair, after an unfollow ran whole between the walk and the
// adds, leaves the post with the follower who left, whom a run of the job
// from the start no longer walks; the worker that takes the job over
// repairs it from the followers log.
func TestRawDeliveriesTakenOver(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	dying, die := context.WithCancel(ctx)
	db.rawStep = func(stage string, followers []string) {
		if !slices.Contains(followers, s.fred) {
			return
		}
		switch stage {
		case "walked":
			if err := s.follows.Unfollow(ctx, s.fred, s.ada); err != nil {
				t.Errorf("the racing unfollow: %v", err)
			}
		case "added":
			die() // the repair's round trip fails
		}
	}
	if err := s.db.fanOutJob(dying, s.ada, s.seq, s.postID, startCursor, 250, noSave, s.end); err == nil {
		t.Fatal("the dying run ended without an error")
	}
	db.rawStep = nil
	if !s.holds(t, s.fred) {
		t.Fatal("the dying run left fred without the post: the test makes no case")
	}
	s.end.claimed = true
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if s.holds(t, s.fred) {
		t.Error("fred, who unfollowed, holds the post after the job was taken over and done")
	}
	if !s.holds(t, s.followers[599]) {
		t.Error("the job taken over did not deliver to the rest")
	}
}

// TestRawJobTakenOverAnnounces: a worker that dies between a raw batch's
// adds and their announce leaves a listened follower holding the post
// unannounced, and the worker that takes the job over must announce it
// (doc.go), also when the job would no longer be delivered raw from its
// start (its author's count crossed rawMinFollowers since, here by
// rawFrom): the guarded script announces only what its ZADD adds, and the
// first run's ZADD added it already.
func TestRawJobTakenOverAnnounces(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	listener := s.followers[0]
	msgs := listen(t, db, homeChannel(listener))
	dying, die := context.WithCancel(ctx)
	db.rawStep = func(stage string, _ []string) {
		if stage == "added" {
			die() // the repair's round trip, which announces, fails
		}
	}
	if err := db.fanOutJob(dying, s.ada, s.seq, s.postID, startCursor, DefaultBatch, noSave, s.end); err == nil {
		t.Fatal("the dying run ended without an error")
	}
	db.rawStep = nil
	if !s.holds(t, listener) {
		t.Fatal("the dying run did not add the post: the test makes no case")
	}
	db.rawFrom = math.MaxInt
	s.end.claimed = true
	if err := db.fanOutJob(ctx, s.ada, s.seq, s.postID, startCursor, DefaultBatch, noSave, s.end); err != nil {
		t.Fatal(err)
	}
	const last = "the test's last message"
	if err := db.client.Publish(ctx, homeChannel(listener), last).Err(); err != nil {
		t.Fatal(err)
	}
	if m := nextMessage(t, msgs); m.Payload == last {
		t.Error("the job taken over did not announce the post to a listened follower who holds it")
	}
}

// TestRawDeliveriesLogTrimmed: a batch whose log was trimmed past the end
// it read (here: the log deleted and written again, as a trim of old
// entries would leave it) checks every one of its followers against the
// truth, so a follower who left without a trace in the log, and without
// an unsure count, loses the post.
func TestRawDeliveriesLogTrimmed(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	other := mustSignup(t, db, "otto").ID
	db.rawStep = func(stage string, followers []string) {
		if stage != "walked" || !slices.Contains(followers, s.fred) {
			return
		}
		// fred leaves with no trace: the truth and the followers side
		// only, as an unlogged writer would.
		pipe := db.client.Pipeline()
		pipe.ZRem(ctx, followingKey(s.fred), s.ada)
		pipe.ZRem(ctx, followersKey(s.ada), s.fred)
		pipe.Del(ctx, followersLogKey(s.ada))
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: followersLogKey(s.ada), Values: []any{"f", other}})
		if _, err := pipe.Exec(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	db.rawStep = nil
	if s.holds(t, s.fred) {
		t.Error("fred, gone with his trace trimmed from the log, holds the post")
	}
	if !s.holds(t, s.followers[0]) {
		t.Error("a follower lacks the post")
	}
}

// mustCreatePostNoDrain creates a post and leaves its job queued.
func mustCreatePostNoDrain(t *testing.T, db *DB, authorID string) *warble.Post {
	t.Helper()
	p, err := NewPostService(db).CreatePost(context.Background(), authorID, "another")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// countScripts counts the EVALSHAs of the delivery scripts.
type countScripts struct {
	deliveries atomic.Int64
}

func (h *countScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h *countScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

func (h *countScripts) count(cmds []redis.Cmder) {
	shas := []string{deliverScript.classic.Hash(), deliverBatchScript.classic.Hash()}
	for _, c := range cmds {
		args := c.Args()
		if c.Name() == "evalsha" && len(args) > 3 && slices.Contains(shas, args[1].(string)) &&
			!strings.EqualFold(argString(args[3]), "finish") && args[3] != fanoutStreamKey(0) {
			h.deliveries.Add(1)
		}
	}
}

func argString(a any) string {
	if p, ok := a.(*string); ok {
		return *p
	}
	s, _ := a.(string)
	return s
}

// TestHomePastItsCap: a home timeline that raw deliveries left past its
// cap reads as the cap would have left it, by FindTimeline alone and with
// the page read in the session's round trip, first page and pages after a
// cursor; past the cap, pages go on by pull from the accounts followed,
// without a post twice. A delivery by script whose trim rawTrim chooses
// (addTrimmedLua) trims it back to the cap.
func TestHomePastItsCap(t *testing.T) {
	const homeCap = 5
	ctx := context.Background()
	db := newTestDB(t, Options{HomeCap: homeCap})
	auth := NewAuthService(db)
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignupSession(t, auth, "bob")
	mustFollow(t, db, bob.User.ID, ada)
	var seqs []int64
	for range 9 {
		seqs = append(seqs, mustCreatePost(t, db, ada, "a post").Seq)
	}
	// As raw deliveries leave it: every post, past the cap.
	home := homeKey(bob.User.ID)
	for _, seq := range seqs {
		if err := db.client.ZAdd(ctx, home, redis.Z{Score: float64(seq), Member: postIDs(ada, seq)[0]}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.client.ZCard(ctx, home).Val(); n != 9 {
		t.Fatalf("home holds %d, want 9: the test makes no case", n)
	}
	posts := NewPostService(db)
	feed := warble.Feed{Kind: warble.FeedHome, UserID: bob.User.ID}
	read := func(page warble.PageArgs, withSession bool) []int64 {
		t.Helper()
		c := ctx
		if withSession {
			var err error
			if c, _, _, err = auth.AuthenticateForHome(ctx, bob.Token, page); err != nil {
				t.Fatal(err)
			}
		}
		tl, err := posts.FindTimeline(c, feed, page)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, e := range tl.Edges {
			got = append(got, e.Node.Seq)
		}
		return got
	}
	newest := slices.Clone(seqs)
	slices.Reverse(newest)
	for _, withSession := range []bool{false, true} {
		// A page of 3 from the top, then one after its cursor: the
		// second reaches the cap's boundary and goes on by pull.
		if got := read(warble.PageArgs{First: 3}, withSession); !slices.Equal(got, newest[:3]) {
			t.Errorf("first page (session %v) = %v, want %v", withSession, got, newest[:3])
		}
		cursor := warble.PostCursor(newest[2])
		if got := read(warble.PageArgs{First: 6, After: &cursor}, withSession); !slices.Equal(got, newest[3:9]) {
			t.Errorf("page after %v (session %v) = %v, want %v", newest[2], withSession, got, newest[3:9])
		}
	}
	// What the clamp does, seen directly: a read of the whole timeline
	// keeps the newest cap.
	entries, err := db.rangeHome(ctx, redis.ZRangeArgs{Key: home, Start: "+inf", Stop: "-inf", ByScore: true, Rev: true, Count: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != homeCap || entries[homeCap-1].seq != newest[homeCap-1] {
		t.Errorf("rangeHome of a timeline past its cap = %v, want the newest %d", entries, homeCap)
	}
	// A delivery by script that rawTrim chooses to trim trims back to the
	// cap, the new post included. (The seq counter is moved on to such a
	// post's.)
	for {
		next := db.client.Get(ctx, postSeqKey).Val()
		n, _ := strconv.ParseInt(next, 10, 64)
		if rawTrim(bob.User.ID, strconv.FormatInt(n+1, 10)) {
			break
		}
		db.client.Incr(ctx, postSeqKey)
	}
	p := mustCreatePost(t, db, ada, "by the small path")
	if got := zsetIDs(t, db, home); len(got) != homeCap || got[homeCap-1] != p.ID {
		t.Errorf("home after a delivery by script = %v, want the newest %d ending with %s", got, homeCap, p.ID)
	}
}

// TestRawDeliveriesTrim: raw deliveries of many posts to full home
// timelines trim them about one add in rawTrimEvery, never letting one
// pass its cap by homeSlack.
func TestRawDeliveriesTrim(t *testing.T) {
	const homeCap = 10
	ctx := context.Background()
	s := newRawSetup(t, Options{HomeCap: homeCap})
	maxCard := int64(0)
	for i := range 40 {
		if i > 0 {
			p := mustCreatePostNoDrain(t, s.db, s.ada)
			s.seq, s.postID = p.Seq, p.ID
		}
		if err := s.run(ctx); err != nil {
			t.Fatal(err)
		}
		for _, f := range s.followers[:50] {
			maxCard = max(maxCard, s.db.client.ZCard(ctx, homeKey(f)).Val())
		}
	}
	if maxCard <= homeCap || maxCard > homeCap+homeSlack {
		t.Errorf("the fullest home held %d after 40 raw deliveries, want past the cap %d and within its slack", maxCard, homeCap)
	}
	// 40 posts: about 5 trims each, so none holds all 40.
	for _, f := range s.followers[:50] {
		if n := s.db.client.ZCard(ctx, homeKey(f)).Val(); n >= 40 {
			t.Errorf("home of %s holds %d of 40 posts: never trimmed", f, n)
		}
	}
}

// TestFollowersCheckedByAGuardedWalk: the followers side of an author from
// an earlier Warble (no followersChecked, entries that list people who do
// not follow) is delivered to by the guarded script; the job that walks it
// whole marks the stale entries unsure and the side checked, and the next
// job, raw, keeps the stale ones' home timelines without the post.
func TestFollowersCheckedByAGuardedWalk(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	if err := db.client.HDel(ctx, userKey(s.ada), followersCheckedField).Err(); err != nil {
		t.Fatal(err)
	}
	stale := []string{s.followers[5], s.followers[400]}
	for _, f := range stale {
		if err := db.client.ZRem(ctx, followingKey(f), s.ada).Err(); err != nil {
			t.Fatal(err)
		}
	}
	scripts := &countScripts{}
	db.client.AddHook(scripts)
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if scripts.deliveries.Load() == 0 {
		t.Fatal("the unchecked author's job ran no delivery script")
	}
	if v := db.client.HGet(ctx, userKey(s.ada), followersCheckedField).Val(); v == "" {
		t.Fatal("a guarded walk of the whole followers set did not mark it checked")
	}
	unsure := db.client.HGetAll(ctx, followersUnsureKey(s.ada)).Val()
	if len(unsure) != len(stale) || unsure[stale[0]] != "1" || unsure[stale[1]] != "1" {
		t.Fatalf("unsure after the checking walk = %v, want %v at 1", unsure, stale)
	}
	p := mustCreatePostNoDrain(t, db, s.ada)
	s.seq, s.postID = p.Seq, p.ID
	before := scripts.deliveries.Load()
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if scripts.deliveries.Load() != before {
		t.Error("the job after the checking walk ran delivery scripts, want raw deliveries")
	}
	for _, f := range stale {
		if s.holds(t, f) {
			t.Errorf("stale follower %s got the raw job's post", f)
		}
	}
	if !s.holds(t, s.followers[0]) || !s.holds(t, s.fred) {
		t.Error("followers lack the raw job's post")
	}
}

// TestHubAnnounceAfterItsAdd: a raw delivery announces a post after the
// ZADD, in another step, so a live home channel may start in between (its
// start reads the post) and then hear the announce, after newer posts
// even. It never dispatches the post a second time: the late announce is
// below what it dispatched, a RESYNC.
func TestHubAnnounceAfterItsAdd(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada, bob := mustSignup(t, db, "ada").ID, mustSignup(t, db, "bob").ID
	mustFollow(t, db, bob, ada)
	p1 := mustCreatePostNoDrain(t, db, ada)
	// The raw ZADD, unannounced (the job is not run).
	if err := db.client.ZAdd(ctx, homeKey(bob), redis.Z{Score: float64(p1.Seq), Member: p1.ID}).Err(); err != nil {
		t.Fatal(err)
	}
	events := mustSubscribe(t, h, warble.HomeFeed(bob), nil)
	// A newer post reaches bob, announced in the step that adds it.
	if err := db.client.Del(ctx, fanoutStreamKey(0)).Err(); err != nil {
		t.Fatal(err)
	}
	p2 := mustCreatePost(t, db, ada, "newer")
	wantAdded(t, nextEvent(t, events), p2)
	// The raw delivery's late announce.
	if err := db.publish(ctx, db.client, homeChannel(bob), encodeAdded(p1.Seq, p1.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Kind != warble.Resync {
		t.Errorf("after a late announce of %s: %s (post %v), want a RESYNC", p1.ID, ev.Kind, ev.PostID)
	}
}

// TestRawTrimIsFNV1a: rawTrim's hand-written hash chooses the same trims
// as hash/fnv's FNV-1a of "<follower>:<seq>", which doc comments and the
// listpack bound (homeSlack) assume.
func TestRawTrimIsFNV1a(t *testing.T) {
	trims := 0
	for f := range 2000 {
		follower, seq := strconv.Itoa(f), strconv.Itoa(7*f+3)
		h := fnv.New32a()
		h.Write([]byte(follower + ":" + seq))
		want := h.Sum32()%rawTrimEvery == 0
		if got := rawTrim(follower, seq); got != want {
			t.Fatalf("rawTrim(%q, %q) = %v, want %v", follower, seq, got, want)
		}
		if want {
			trims++
		}
	}
	if trims < 2000/rawTrimEvery/2 || trims > 2000/rawTrimEvery*2 {
		t.Fatalf("rawTrim chose %d trims of 2000, want about %d", trims, 2000/rawTrimEvery)
	}
}

// TestFanOutWalksAhead: while fanOutDepth batches are in flight, the job
// walks the next ones already (walkAhead of them, and one more that waits
// to be sent), so that a batch goes out the moment one in flight is done;
// and it walks no further than that. Every follower gets the post once the
// batches go on.
func TestFanOutWalksAhead(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	var walked atomic.Int32
	release := make(chan struct{})
	db.rawStep = func(stage string, _ []string) {
		switch stage {
		case "walked":
			walked.Add(1)
		case "seen":
			<-release // every batch waits before its adds
		}
	}
	done := make(chan error, 1)
	go func() {
		// 601 followers, 50 a batch: 13 batches.
		done <- db.fanOutJob(ctx, s.ada, s.seq, s.postID, startCursor, 50, noSave, s.end)
	}()
	want := int32(fanOutDepth + walkAhead + 1)
	for deadline := time.Now().Add(10 * time.Second); walked.Load() < want && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // room to walk too far, if it would
	if n := walked.Load(); n != want {
		t.Errorf("with %d batches in flight and none done, the job walked %d batches; want %d", fanOutDepth, n, want)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	db.rawStep = nil
	for _, f := range append(s.followers, s.fred) {
		if !s.holds(t, f) {
			t.Fatalf("follower %s lacks the post after the job", f)
		}
	}
}

// TestFanOutLostJobUndoesItsLateBatches: a worker learns that another took
// its job over only from a save that fails, and the next batch has gone out
// by then; the new owner, finding the post deleted, has already undone from
// the cursor on. Whatever of this worker's batches lands after that undo
// finds the post gone, and this worker takes it back off itself: else the
// deleted post stays in those timelines.
func TestFanOutLostJobUndoesItsLateBatches(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	everyone := append(slices.Clone(s.followers), s.fred)
	// The save after the first batch meets the job taken over: the post was
	// deleted meanwhile and the new owner undid every follower.
	taken := make(chan struct{})
	var saves atomic.Int32
	save := func(followerCursor) error {
		if saves.Add(1) == 1 {
			if err := NewPostService(db).DeletePost(ctx, s.ada, s.postID); err != nil {
				t.Error(err)
			}
			if err := db.undeliver(ctx, everyone, s.seq, s.postID); err != nil {
				t.Error(err)
			}
			close(taken)
		}
		return errLostJob
	}
	// A batch that goes out once the first is done waits for the takeover
	// before its adds, so that they land after the new owner's undo.
	var seen atomic.Int32
	db.rawStep = func(stage string, _ []string) {
		if stage == "seen" && seen.Add(1) > fanOutDepth {
			select {
			case <-taken:
			case <-time.After(10 * time.Second):
			}
		}
	}
	// 601 followers, 50 a batch: 13 batches.
	err := db.fanOutJob(ctx, s.ada, s.seq, s.postID, startCursor, 50, save, s.end)
	db.rawStep = nil
	if !errors.Is(err, errLostJob) {
		t.Fatalf("fanOutJob = %v, want errLostJob", err)
	}
	var stale []string
	for _, f := range everyone {
		if s.holds(t, f) {
			stale = append(stale, f)
		}
	}
	if len(stale) > 0 {
		t.Errorf("%d followers hold the deleted post after the job was lost, %s the first", len(stale), stale[0])
	}
}
