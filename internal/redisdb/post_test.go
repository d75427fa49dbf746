package redisdb

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// mustCreatePost creates a post by authorID, runs its fan-out to the end,
// and returns it.
func mustCreatePost(tb testing.TB, db *DB, authorID, body string) *warble.Post {
	tb.Helper()
	p, err := NewPostService(db).CreatePost(context.Background(), authorID, body)
	if err != nil {
		tb.Fatalf("CreatePost(%s, %q): %v", authorID, body, err)
	}
	drainFanOut(tb, db)
	return p
}

// zsetIDs returns the members of a timeline, oldest first.
func zsetIDs(tb testing.TB, db *DB, key string) []string {
	tb.Helper()
	ids, err := db.client.ZRange(context.Background(), key, 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

func TestCreatePost(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	cat := mustSignup(t, db, "cat")
	mustFollow(t, db, bob.ID, ada.ID)

	p := mustCreatePost(t, db, ada.ID, "hello, world")
	if p.AuthorID != ada.ID || p.Body != "hello, world" || p.Seq <= 0 {
		t.Fatalf("CreatePost = %+v", p)
	}
	if want := ada.ID + ":" + strconv.FormatInt(p.Seq, 10); p.ID != want {
		t.Errorf("post id = %q, want %q", p.ID, want)
	}
	if p.Author == nil || p.Author.ID != ada.ID || mustCounts(t, db, ada.ID).Posts != 1 {
		t.Errorf("post author = %+v, want ada with 1 post", p.Author)
	}
	if p.CreatedAt.IsZero() {
		t.Error("CreatedAt is zero")
	}

	for _, tt := range []struct {
		name string
		key  string
		want bool
	}{
		{"AuthorPosts", postsKey(ada.ID), true},
		{"AuthorHome", homeKey(ada.ID), true},
		{"Global", globalKey, true},
		{"FollowerHome", homeKey(bob.ID), true},
		{"NonFollowerHome", homeKey(cat.ID), false},
	} {
		if got := slices.Contains(zsetIDs(t, db, tt.key), p.ID); got != tt.want {
			t.Errorf("%s: %s holds post = %v, want %v", tt.name, tt.key, got, tt.want)
		}
	}

	got, err := NewPostService(db).FindPostByID(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Body != p.Body || !got.CreatedAt.Equal(p.CreatedAt) || got.Seq != p.Seq || got.Author == nil || got.Author.Username != "ada" {
		t.Errorf("FindPostByID = %+v, want %+v with author ada", got, p)
	}
}

// TestCreatePostValidatesItsBody: the service normalizes and validates the
// body itself, whoever calls it, and a body it refuses writes nothing.
func TestCreatePostValidatesItsBody(t *testing.T) {
	db := newAsyncTestDB(t)
	ada := mustSignup(t, db, "ada")
	posts := NewPostService(db)
	before := snapshot(t, db)
	for _, body := range []string{"", "  \n\t ", strings.Repeat("x", warble.MaxPostLen+1), "bell\a", "\xff\xfe", "bidi \u202e"} {
		if _, err := posts.CreatePost(context.Background(), ada.ID, body); warble.ErrorCode(err) != warble.EINVALID {
			t.Errorf("CreatePost(%q) = %v, want EINVALID", body, err)
		}
	}
	assertUnchanged(t, db, before, "refused posts")
	p, err := posts.CreatePost(context.Background(), ada.ID, "  trimmed\n")
	if err != nil || p.Body != "trimmed" {
		t.Fatalf("CreatePost with surrounding space = %+v, %v; want the body trimmed", p, err)
	}
	if got, err := posts.FindPostByID(context.Background(), p.ID); err != nil || got.Body != "trimmed" {
		t.Fatalf("stored post = %+v, %v; want the body trimmed", got, err)
	}
}

func TestCreatePostCaps(t *testing.T) {
	db := newTestDB(t, Options{HomeCap: 5, GlobalCap: 5, AsyncFanOut: true})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	var ids []string
	var posts []*warble.Post
	for i := range 12 {
		p := mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i))
		ids, posts = append(ids, p.ID), append(posts, p)
	}
	newest := ids[len(ids)-5:]
	for _, key := range []string{homeKey(ada.ID), globalKey} {
		if got := zsetIDs(t, db, key); !slices.Equal(got, newest) {
			t.Errorf("%s = %v, want the newest 5 %v", key, got, newest)
		}
	}
	// A follower's deliveries trim at one in rawTrimEvery (addTrimmedLua).
	if got, want := zsetIDs(t, db, homeKey(bob.ID)), trimmedHome(bob.ID, posts, 5); !slices.Equal(got, want) {
		t.Errorf("bob's home = %v, want %v", got, want)
	}
	if got := zsetIDs(t, db, postsKey(ada.ID)); !slices.Equal(got, ids) {
		t.Errorf("posts = %v, want all 12 (never capped)", got)
	}
}

func TestDeletePost(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true})
	posts := NewPostService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	keep := mustCreatePost(t, db, ada.ID, "keep")
	gone := mustCreatePost(t, db, ada.ID, "gone")

	if err := posts.DeletePost(ctx, ada.ID, gone.ID); err != nil {
		t.Fatalf("DeletePost: %v", err)
	}
	drainFanOut(t, db)
	for _, key := range []string{postsKey(ada.ID), homeKey(ada.ID), homeKey(bob.ID), globalKey} {
		if got := zsetIDs(t, db, key); !slices.Equal(got, []string{keep.ID}) {
			t.Errorf("%s = %v, want only %s", key, got, keep.ID)
		}
	}
	if n := db.client.Exists(ctx, postKey(ada.ID, strconv.FormatInt(gone.Seq, 10))).Val(); n != 0 {
		t.Error("post hash still exists")
	}
	if _, err := posts.FindPostByID(ctx, gone.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Errorf("FindPostByID(deleted) err = %v, want ENOTFOUND", err)
	}
	if n := mustCounts(t, db, ada.ID).Posts; n != 1 {
		t.Errorf("posts count = %d, want 1", n)
	}
	if err := posts.DeletePost(ctx, ada.ID, gone.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Errorf("DeletePost twice: err = %v, want ENOTFOUND", err)
	}
}

func TestDeletePostRejected(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true})
	posts := NewPostService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	p := mustCreatePost(t, db, ada.ID, "mine")

	tests := []struct {
		name     string
		userID   string
		postID   string
		wantCode string
	}{
		{name: "OtherAuthor", userID: bob.ID, postID: p.ID, wantCode: warble.EFORBIDDEN},
		{name: "OtherAuthorUnknownPost", userID: bob.ID, postID: ada.ID + ":999", wantCode: warble.ENOTFOUND},
		{name: "UnknownPost", userID: ada.ID, postID: ada.ID + ":999", wantCode: warble.ENOTFOUND},
		{name: "UserID", userID: ada.ID, postID: ada.ID, wantCode: warble.ENOTFOUND},
		{name: "Empty", userID: ada.ID, postID: "", wantCode: warble.ENOTFOUND},
		{name: "Garbage", userID: ada.ID, postID: "x:y", wantCode: warble.ENOTFOUND},
		{name: "LeadingZero", userID: ada.ID, postID: ada.ID + ":0" + strconv.FormatInt(p.Seq, 10), wantCode: warble.ENOTFOUND},
		{name: "ExtraColon", userID: ada.ID, postID: p.ID + ":1", wantCode: warble.ENOTFOUND},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snapshot(t, db)
			err := posts.DeletePost(ctx, tt.userID, tt.postID)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("DeletePost(%s, %q) code = %q, want %q (err %v)", tt.userID, tt.postID, got, tt.wantCode, err)
			}
			assertUnchanged(t, db, before, "rejected DeletePost")
		})
	}
}

func TestFindPostByIDMalformed(t *testing.T) {
	db := newTestDB(t, Options{AsyncFanOut: true})
	for _, id := range []string{"", "1", "1:", ":1", "a:1", "1:b", "1:1:1", "01:1"} {
		if _, err := NewPostService(db).FindPostByID(context.Background(), id); warble.ErrorCode(err) != warble.ENOTFOUND {
			t.Errorf("FindPostByID(%q) err = %v, want ENOTFOUND", id, err)
		}
	}
}

// TestFanOutSkipsUnfollowed: a follower whose unfollow raced the fan-out
// holds none of the author's posts once both are done, even when a follow
// of the same pair interleaves. Here the follow's write of the followers
// side is slow and lands after the unfollow has ended (both sides written,
// the posts taken off): the followers side lists a follower who does not
// follow when the post is delivered, and the delivery, which reads the
// following set, gives them nothing. The follow's last steps (it reads the
// truth again, writes the followers side out, and its backfill finds no
// follow) leave nothing either. Followers in the one set and in buckets
// alike.
func TestFanOutSkipsUnfollowed(t *testing.T) {
	for _, buckets := range []bool{false, true} {
		t.Run(map[bool]string{false: "one set", true: "buckets"}[buckets], func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t, Options{AsyncFanOut: true})
			s := NewFollowService(db)
			ada := mustSignup(t, db, "ada")
			bob := mustSignup(t, db, "bob")
			if buckets {
				mustFollow(t, db, mustSignup(t, db, "cyd").ID, ada.ID)
				if err := db.moveToBuckets(ctx, ada.ID, startCursor, DefaultBatch, noSave); err != nil {
					t.Fatal(err)
				}
			}
			p := mustCreatePost(t, db, ada.ID, "hello")

			// The follow's first step, the truth.
			res, err := followScript.Run(ctx, db.client, []string{followingKey(bob.ID)},
				ada.ID, msString(db.now()), db.opts.MaxFollowing).Slice()
			if err != nil {
				t.Fatal(err)
			}
			at := replyString(res[1])
			if err := s.Unfollow(ctx, bob.ID, ada.ID); err != nil {
				t.Fatal(err)
			}
			// The follow's write of the followers side, late.
			if _, err := db.mirrorFollower(ctx, bob.ID, ada.ID, formatScore(parseReplyScore(at))); err != nil {
				t.Fatal(err)
			}
			if err := db.fanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, fanOutChunk, noSave); err != nil {
				t.Fatal(err)
			}
			if got := zsetIDs(t, db, homeKey(bob.ID)); len(got) != 0 {
				t.Fatalf("home of the follower in the race right after the fan-out = %v, want empty", got)
			}
			// The follow's last steps.
			if _, err := s.mirrorFollow(ctx, bob.ID, ada.ID, true, at, ""); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.backfill(ctx, bob.ID, ada.ID); err != nil {
				t.Fatal(err)
			}
			if got := zsetIDs(t, db, homeKey(bob.ID)); len(got) != 0 {
				t.Errorf("home of a non-follower = %v, want empty", got)
			}
			if following, _ := s.IsFollowing(ctx, bob.ID, ada.ID); following {
				t.Error("bob follows ada")
			}
		})
	}
}

// TestFanOutIdempotent checks that delivering a post again neither
// duplicates it nor announces it twice, and survives a script cache flush.
func TestFanOutIdempotent(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	p := mustCreatePost(t, db, ada.ID, "hello")

	ps := listen(t, db, homeChannel(bob.ID))
	if err := db.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := db.fanOut(ctx, ada.ID, p.Seq, p.ID, startCursor, fanOutChunk, noSave); err != nil {
		t.Fatalf("fanOut after SCRIPT FLUSH: %v", err)
	}
	if got := zsetIDs(t, db, homeKey(bob.ID)); !slices.Equal(got, []string{p.ID}) {
		t.Errorf("home = %v, want [%s]", got, p.ID)
	}
	// A marker published after the repeated delivery must be the first
	// message: the delivery announced nothing.
	db.publish(ctx, db.client, homeChannel(bob.ID), "marker")
	if msg := nextMessage(t, ps); msg.Payload != "marker" {
		t.Errorf("repeated delivery published %q", msg.Payload)
	}
}

// TestFanOutManyFollowers crosses several chunks of the followers walk,
// with many followers tied on the same follow time.
func TestFanOutManyFollowers(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true})
	ada := mustSignup(t, db, "ada")
	const n = 2*fanOutChunk + 17
	pipe := db.client.Pipeline()
	for i := range n {
		id := strconv.Itoa(1000 + i)
		score := float64(i / 700) // ties across chunk boundaries
		pipe.ZAdd(ctx, followersKey(ada.ID), redis.Z{Score: score, Member: id})
		pipe.ZAdd(ctx, followingKey(id), redis.Z{Score: score, Member: ada.ID})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	p := mustCreatePost(t, db, ada.ID, "to many")
	pipe = db.client.Pipeline()
	scores := make([]*redis.FloatCmd, n)
	for i := range n {
		scores[i] = pipe.ZScore(ctx, homeKey(strconv.Itoa(1000+i)), p.ID)
	}
	pipe.Exec(ctx)
	missing := 0
	for _, c := range scores {
		if c.Err() != nil {
			missing++
		}
	}
	if missing != 0 {
		t.Errorf("%d of %d followers did not get the post", missing, n)
	}

	if err := NewPostService(db).DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	left := 0
	for i := range n {
		if db.client.ZCard(ctx, homeKey(strconv.Itoa(1000+i))).Val() != 0 {
			left++
		}
	}
	if left != 0 {
		t.Errorf("%d followers still hold the deleted post", left)
	}
}

// failScriptLoad is a go-redis hook that fails SCRIPT LOAD.
type failScriptLoad struct{}

func (failScriptLoad) DialHook(next redis.DialHook) redis.DialHook { return next }

func (failScriptLoad) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "script" {
			cmd.SetErr(errors.New("script load failed (test)"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (failScriptLoad) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestCreatePostWhenGlobalScriptFails: on a Redis Cluster's chain of
// steps, when the script that adds a post to the global timeline cannot be
// loaded, the post is still created and answered with its author; only the
// global timeline misses it (until its fan-out job runs). (On one Redis the
// whole of CreatePost is one script: see TestCreatePostOneRedis.)
func TestCreatePostWhenGlobalScriptFails(t *testing.T) {
	db := newChainedTestDB(t, Options{AsyncFanOut: true})
	ada := mustSignup(t, db, "ada")
	db.client.AddHook(failScriptLoad{})
	scriptLoads.Delete(db.pub(deliverScript))
	t.Cleanup(func() { scriptLoads.Delete(db.pub(deliverScript)) })
	p, err := NewPostService(db).CreatePost(context.Background(), ada.ID, "still here")
	if err != nil {
		t.Fatal(err)
	}
	if p.Author == nil || p.Author.ID != ada.ID {
		t.Fatalf("post author = %+v, want ada", p.Author)
	}
	if got := zsetIDs(t, db, postsKey(ada.ID)); len(got) != 1 || got[0] != p.ID {
		t.Fatalf("ada's posts = %v", got)
	}
}

// roundTrips is a go-redis hook that counts round trips: single commands
// and pipelines.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestCreatePostOneRedis: on one Redis, CreatePost is two round trips, the
// seq (with the author unless the author is signed in) and one script, which stores the post and queues its
// job in one atomic step, without the outbox: the job is queued with the
// post or, when Redis refuses the step, neither is written and CreatePost
// answers an error. A global timeline that refuses the post does not fail
// the request; the job lists the post there. A script Redis forgot is
// loaded again.
func TestCreatePostOneRedis(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	if db.chainedPosts {
		t.Skip("a Redis Cluster stores posts through the outbox: see TestOutboxSweep")
	}
	ada := mustSignup(t, db, "ada")
	followers := manyFollowers(t, db, ada.ID, 3)
	posts := NewPostService(db)
	mustCreatePost(t, db, ada.ID, "loads the script")
	shard := db.fanOutShard(ada.ID)

	trips, names := &roundTrips{}, &commandNames{}
	db.client.AddHook(trips)
	db.client.AddHook(names)
	p, err := posts.CreatePost(ctx, ada.ID, "in one step")
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load(); n != 2 {
		t.Errorf("CreatePost took %d round trips, want 2", n)
	}
	if p.Author == nil || p.Author.Username != "ada" {
		t.Errorf("post author = %+v, want ada", p.Author)
	}
	jobs, err := db.client.XRange(ctx, fanoutStreamKey(shard), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 {
		t.Fatalf("the stream holds %d jobs, want the new post's", len(jobs))
	}
	if j, ok := parseJob(shard, jobs[0]); !ok || j.op != opDeliver || j.postID != p.ID || j.seq != p.Seq || j.authorID != ada.ID {
		t.Fatalf("queued job = %+v (well-formed: %v), want the delivery of %s", j, ok, p.ID)
	}
	if n := db.client.Exists(ctx, outboxKey(ada.ID), outboxIndexKey(shard)).Val(); n != 0 {
		t.Error("the one step wrote the outbox or its index")
	}
	if _, err := db.client.ZScore(ctx, globalKey, p.ID).Result(); err != nil {
		t.Errorf("the global timeline lacks the post before its job ran: %v", err)
	}
	drainFanOut(t, db)
	if got := holding(t, db, followers, p.ID); got != 3 {
		t.Fatalf("%d followers hold the post, want 3", got)
	}
	// Signed in as the author, as a request is, the answer's author is
	// the signed-in user, not read again.
	trips.n.Store(0)
	reads := names.count("hmget")
	signedIn, err := posts.CreatePost(warble.NewContextWithUser(ctx, ada), ada.ID, "signed in")
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load(); n != 2 {
		t.Errorf("CreatePost signed in took %d round trips, want 2", n)
	}
	if n := names.count("hmget") - reads; n != 0 {
		t.Errorf("CreatePost signed in read the author %d times", n)
	}
	if signedIn.Author == nil || *signedIn.Author != *ada {
		t.Errorf("post author = %+v, want %+v", signedIn.Author, ada)
	}
	drainFanOut(t, db)
	if got := holding(t, db, followers, signedIn.ID); got != 3 {
		t.Fatalf("%d followers hold the post, want 3", got)
	}

	// The global timeline refuses the post: the post and its job are
	// recorded all the same, and the job lists it.
	p = postWithGlobalRefusing(t, db, ada.ID)
	drainFanOut(t, db)
	if got := holding(t, db, followers, p.ID); got != 3 {
		t.Fatalf("%d followers hold the post, want 3", got)
	}
	if _, err := db.client.ZScore(ctx, globalKey, p.ID).Result(); err != nil {
		t.Fatalf("the job did not list the post on the global timeline: %v", err)
	}

	// Redis forgot the script (a restart, a SCRIPT FLUSH): it is loaded
	// again, and the post stored once.
	if err := db.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p, err = posts.CreatePost(ctx, ada.ID, "after a flush")
	if err != nil {
		t.Fatalf("CreatePost after SCRIPT FLUSH: %v", err)
	}
	if got := zsetIDs(t, db, postsKey(ada.ID)); got[len(got)-1] != p.ID || slices.Contains(got[:len(got)-1], p.ID) {
		t.Fatalf("ada's posts = %v, want %s once, last", got, p.ID)
	}
	drainFanOut(t, db)

	// Redis refuses the step (the stream is a string, or the script
	// cannot be loaded): nothing is written.
	before := zsetIDs(t, db, postsKey(ada.ID))
	postKeys := func() int {
		t.Helper()
		keys, err := redistest.Keys(ctx, db.client, postKey(ada.ID, "*"))
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	keysBefore := postKeys()
	refused := func(why string) {
		t.Helper()
		if p, err := posts.CreatePost(ctx, ada.ID, "refused"); err == nil {
			t.Fatalf("%s: CreatePost stored %s", why, p.ID)
		}
		if got := zsetIDs(t, db, postsKey(ada.ID)); !slices.Equal(got, before) {
			t.Fatalf("%s: ada's posts = %v, want %v", why, got, before)
		}
		if n := postKeys(); n != keysBefore {
			t.Fatalf("%s: %d post hashes, want %d", why, n, keysBefore)
		}
	}
	if err := db.client.Set(ctx, fanoutStreamKey(shard), "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	refused("the stream is a string")
	if err := db.client.Del(ctx, fanoutStreamKey(shard)).Err(); err != nil {
		t.Fatal(err)
	}
	db.client.AddHook(failScriptLoad{})
	script := db.pub(createPostOneRedisScript)
	scriptLoads.Delete(script)
	t.Cleanup(func() { scriptLoads.Delete(script) })
	refused("the script cannot be loaded")
	if n := queuedJobs(t, db); n != 0 {
		t.Fatalf("%d jobs queued for refused posts", n)
	}
}

// TestCreatePostWithoutFollowers: on one Redis, a post by an author whom no
// one follows queues no fan-out job. Its step lists it on the global
// timeline and its author's own, as for any post, and leaves its hash
// unmarked for the mover; a follow after it gets the post from its
// backfill, and the author's next post, which has a follower to reach,
// queues a job again. When the global timeline refuses the post, the step
// queues the job that lists it after all, and marks the hash until that
// job has run.
func TestCreatePostWithoutFollowers(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	if db.chainedPosts {
		t.Skip("a Redis Cluster queues every post's job through the outbox: see TestOutboxSweep")
	}
	posts := NewPostService(db)
	ada := mustSignup(t, db, "ada")
	mustCreatePost(t, db, ada.ID, "loads the script")

	trips := &roundTrips{}
	db.client.AddHook(trips)
	p, err := posts.CreatePost(ctx, ada.ID, "to no one yet")
	if err != nil {
		t.Fatal(err)
	}
	if n := trips.n.Load(); n != 2 {
		t.Errorf("CreatePost took %d round trips, want 2 (the seq, the step)", n)
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Fatalf("%d jobs queued for a post with no one to deliver to", n)
	}
	for _, key := range []string{globalKey, postsKey(ada.ID), homeKey(ada.ID)} {
		if _, err := db.client.ZScore(ctx, key, p.ID).Result(); err != nil {
			t.Errorf("%s lacks the post: %v", key, err)
		}
	}
	if db.client.HExists(ctx, postKey(ada.ID, strconv.FormatInt(p.Seq, 10)), fanOutPendingField).Val() {
		t.Error("the post is marked as awaiting a fan-out that no job will do")
	}

	bob := mustSignup(t, db, "bob")
	if err := NewFollowService(db).Follow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if holding(t, db, []string{bob.ID}, p.ID) != 1 {
		t.Fatal("a follow after the post did not get it from its backfill")
	}
	next, err := posts.CreatePost(ctx, ada.ID, "to bob")
	if err != nil {
		t.Fatal(err)
	}
	if n := queuedJobs(t, db); n != 1 {
		t.Fatalf("%d jobs queued for a post with a follower, want 1", n)
	}
	drainFanOut(t, db)
	if holding(t, db, []string{bob.ID}, next.ID) != 1 {
		t.Fatal("the follower lacks the post")
	}

	// The global timeline refuses the post.
	cy := mustSignup(t, db, "cyd")
	p = postWithGlobalRefusing(t, db, cy.ID)
	if n := queuedJobs(t, db); n != 1 {
		t.Fatalf("%d jobs queued for a post the global timeline refused, want the one that lists it", n)
	}
	cyPost := postKey(cy.ID, strconv.FormatInt(p.Seq, 10))
	if !db.client.HExists(ctx, cyPost, fanOutPendingField).Val() {
		t.Error("the post is not marked for the mover while its job is queued")
	}
	drainFanOut(t, db)
	if _, err := db.client.ZScore(ctx, globalKey, p.ID).Result(); err != nil {
		t.Fatalf("the job did not list the post on the global timeline: %v", err)
	}
	if db.client.HExists(ctx, cyPost, fanOutPendingField).Val() {
		t.Error("the post is still marked after its job ran")
	}
}

// postWithGlobalRefusing creates a post by authorID while the global
// timeline refuses it (a string where it should be), which must not fail
// the request, and then mends the global timeline.
func postWithGlobalRefusing(t *testing.T, db *DB, authorID string) *warble.Post {
	t.Helper()
	ctx := context.Background()
	if err := db.client.Set(ctx, globalKey, "not a timeline", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p, err := NewPostService(db).CreatePost(ctx, authorID, "the global timeline is broken")
	if err != nil {
		t.Fatalf("CreatePost answered %v for a post it stored", err)
	}
	if err := db.client.Del(ctx, globalKey).Err(); err != nil {
		t.Fatal(err)
	}
	return p
}
