package redisdb

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// addPost writes a post by authorID with the PostService and returns its seq.
func addPost(tb testing.TB, db *DB, authorID string) int64 {
	tb.Helper()
	p, err := NewPostService(db).CreatePost(context.Background(), authorID, "a post by "+authorID)
	if err != nil {
		tb.Fatalf("CreatePost by %s: %v", authorID, err)
	}
	drainFanOut(tb, db)
	return p.Seq
}

// home returns the post ids of userID's home timeline, oldest first.
func home(tb testing.TB, db *DB, userID string) []string {
	tb.Helper()
	ids, err := db.client.ZRange(context.Background(), homeKey(userID), 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

// postIDs returns the ids of authorID's posts with the given seqs.
func postIDs(authorID string, seqs ...int64) []string {
	ids := make([]string, len(seqs))
	for i, seq := range seqs {
		ids[i] = authorID + ":" + strconv.FormatInt(seq, 10)
	}
	return ids
}

func TestFollow(t *testing.T) {
	tests := []struct {
		name         string
		maxFollowing int
		existing     [][2]string // follower, followee usernames
		follower     string      // a username, or an id when it starts with "#"
		followee     string
		wantCode     string
	}{
		{name: "OK", follower: "ada", followee: "bob"},
		{name: "Back", existing: [][2]string{{"bob", "ada"}}, follower: "ada", followee: "bob"},
		{name: "Repeat", existing: [][2]string{{"ada", "bob"}}, follower: "ada", followee: "bob"},
		{name: "Self", follower: "ada", followee: "ada", wantCode: warble.EINVALID},
		{name: "UnknownFollowee", follower: "ada", followee: "#987654", wantCode: warble.ENOTFOUND},
		{name: "MalformedFollowee", follower: "ada", followee: "#abc", wantCode: warble.EINVALID},
		{name: "PostIDAsFollowee", follower: "ada", followee: "#1:2", wantCode: warble.EINVALID},
		{name: "EmptyFollowee", follower: "ada", followee: "#", wantCode: warble.EINVALID},
		{name: "LeadingZero", follower: "ada", followee: "#02", wantCode: warble.EINVALID},
		{name: "MalformedFollower", follower: "#x1", followee: "bob", wantCode: warble.EINVALID},
		{name: "AtTheLimit", maxFollowing: 3, existing: [][2]string{{"ada", "cal"}, {"ada", "dee"}}, follower: "ada", followee: "bob"},
		{name: "PastTheLimit", maxFollowing: 3, existing: [][2]string{{"ada", "cal"}, {"ada", "dee"}, {"ada", "eve"}}, follower: "ada", followee: "bob", wantCode: warble.EINVALID},
		{name: "RepeatAtTheLimit", maxFollowing: 3, existing: [][2]string{{"ada", "cal"}, {"ada", "dee"}, {"ada", "bob"}}, follower: "ada", followee: "bob"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t, Options{MaxFollowing: tt.maxFollowing})
			follows := NewFollowService(db)
			ids := map[string]string{}
			for _, name := range []string{"ada", "bob", "cal", "dee", "eve"} {
				ids[name] = mustSignup(t, db, name).ID
				addPost(t, db, ids[name])
			}
			for _, e := range tt.existing {
				mustFollow(t, db, ids[e[0]], ids[e[1]])
			}
			id := func(s string) string {
				if strings.HasPrefix(s, "#") {
					return s[1:]
				}
				return ids[s]
			}
			followerID, followeeID := id(tt.follower), id(tt.followee)
			wasFollowing, _ := follows.IsFollowing(ctx, followerID, followeeID)
			before := snapshot(t, db)

			err := follows.Follow(ctx, followerID, followeeID)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("Follow(%s, %s) code = %q, want %q (err %v)", tt.follower, tt.followee, got, tt.wantCode, err)
			}
			if tt.wantCode != "" || wasFollowing {
				// A failed follow and a repeated one change nothing, not
				// even the time of the follow.
				assertUnchanged(t, db, before, fmt.Sprintf("Follow(%s, %s)", tt.follower, tt.followee))
				if tt.wantCode == warble.EINVALID && tt.maxFollowing > 0 && !strings.Contains(warble.ErrorMessage(err), strconv.Itoa(tt.maxFollowing)) {
					t.Errorf("limit message %q does not name the limit", warble.ErrorMessage(err))
				}
				if tt.wantCode != "" {
					return
				}
			}
			if ok, err := follows.IsFollowing(ctx, followerID, followeeID); err != nil || !ok {
				t.Errorf("IsFollowing after Follow = %v, %v", ok, err)
			}
			assertFollowCounts(t, db)
			if post := postIDs(followeeID, postSeqOf(t, db, followeeID))[0]; !slices.Contains(home(t, db, followerID), post) {
				t.Errorf("follower's home %v lacks the followee's post", home(t, db, followerID))
			}
		})
	}
}

// postSeqOf returns the seq of authorID's newest post.
func postSeqOf(tb testing.TB, db *DB, authorID string) int64 {
	tb.Helper()
	z, err := db.client.ZRevRangeWithScores(context.Background(), postsKey(authorID), 0, 0).Result()
	if err != nil || len(z) == 0 {
		tb.Fatalf("no posts of %s: %v", authorID, err)
	}
	return int64(z[0].Score)
}

func TestUnfollow(t *testing.T) {
	tests := []struct {
		name     string
		existing [][2]string
		follower string
		followee string
		wantCode string
	}{
		{name: "OK", existing: [][2]string{{"ada", "bob"}}, follower: "ada", followee: "bob"},
		{name: "KeepsTheOtherDirection", existing: [][2]string{{"ada", "bob"}, {"bob", "ada"}}, follower: "ada", followee: "bob"},
		{name: "NotFollowing", existing: [][2]string{{"bob", "ada"}}, follower: "ada", followee: "bob"},
		{name: "Self", follower: "ada", followee: "ada", wantCode: warble.EINVALID},
		{name: "Unknown", follower: "ada", followee: "#987654", wantCode: warble.ENOTFOUND},
		{name: "Malformed", follower: "ada", followee: "#abc", wantCode: warble.EINVALID},
		{name: "Empty", follower: "ada", followee: "#", wantCode: warble.EINVALID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t, Options{})
			follows := NewFollowService(db)
			ids := map[string]string{}
			for _, name := range []string{"ada", "bob"} {
				ids[name] = mustSignup(t, db, name).ID
				addPost(t, db, ids[name])
			}
			for _, e := range tt.existing {
				mustFollow(t, db, ids[e[0]], ids[e[1]])
			}
			id := func(s string) string {
				if strings.HasPrefix(s, "#") {
					return s[1:]
				}
				return ids[s]
			}
			followerID, followeeID := id(tt.follower), id(tt.followee)
			wasFollowing, _ := follows.IsFollowing(ctx, followerID, followeeID)
			before := snapshot(t, db)

			err := follows.Unfollow(ctx, followerID, followeeID)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("Unfollow(%s, %s) code = %q, want %q (err %v)", tt.follower, tt.followee, got, tt.wantCode, err)
			}
			if tt.wantCode != "" || !wasFollowing {
				assertUnchanged(t, db, before, fmt.Sprintf("Unfollow(%s, %s)", tt.follower, tt.followee))
				return
			}
			if ok, _ := follows.IsFollowing(ctx, followerID, followeeID); ok {
				t.Error("still following after Unfollow")
			}
			assertFollowCounts(t, db)
			if got, want := home(t, db, followerID), postIDs(followerID, postSeqOf(t, db, followerID)); !slices.Equal(got, want) {
				t.Errorf("home after unfollow = %v, want %v", got, want)
			}
			// Again: nothing changes.
			before = snapshot(t, db)
			if err := follows.Unfollow(ctx, followerID, followeeID); err != nil {
				t.Fatal(err)
			}
			assertUnchanged(t, db, before, "repeated Unfollow")
		})
	}
}

// assertFollowCounts checks, for every user, that the counts read with the
// user are the sizes of the sets, and that the followers sets mirror the
// following sets exactly, scores included.
func assertFollowCounts(tb testing.TB, db *DB) {
	tb.Helper()
	ctx := context.Background()
	ids, err := db.client.ZRange(ctx, newestUsersKey, 0, -1).Result()
	if err != nil {
		tb.Fatal(err)
	}
	users, err := db.findUsers(ctx, ids)
	if err != nil {
		tb.Fatal(err)
	}
	followersOf := map[string]map[string]float64{} // followee -> follower -> ms, from the following sets
	for _, id := range ids {
		for _, z := range db.client.ZRangeWithScores(ctx, followingKey(id), 0, -1).Val() {
			followee := z.Member.(string)
			if followersOf[followee] == nil {
				followersOf[followee] = map[string]float64{}
			}
			followersOf[followee][id] = z.Score
		}
	}
	for i, u := range users {
		followers, _ := storedFollowers(tb, db, ids[i])
		c := mustCounts(tb, db, u.ID)
		if c.Followers != len(followers) || int64(c.Following) != db.client.ZCard(ctx, followingKey(u.ID)).Val() ||
			int64(c.Posts) != db.client.ZCard(ctx, postsKey(u.ID)).Val() {
			tb.Errorf("user %s counts %+v differ from its sets", u.ID, c)
		}
		want := followersOf[u.ID]
		if len(followers) != len(want) {
			tb.Errorf("user %s has %d followers, but %d users follow them", u.ID, len(followers), len(want))
		}
		for f, score := range followers {
			if at, ok := want[f]; !ok || at != score {
				tb.Errorf("user %s: follower %s at %v does not mirror the following set (%v, %v)", u.ID, f, score, at, ok)
			}
		}
	}
}

func TestFollowLimitConcurrent(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{MaxFollowing: 3})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada")
	var others []string
	for i := range 10 {
		others = append(others, mustSignup(t, db, fmt.Sprintf("user%d", i)).ID)
	}
	var ok atomic.Int32
	var wg sync.WaitGroup
	for _, id := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := follows.Follow(ctx, ada.ID, id)
			if err == nil {
				ok.Add(1)
			} else if warble.ErrorCode(err) != warble.EINVALID {
				t.Errorf("Follow: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 3 {
		t.Errorf("%d concurrent follows succeeded, want 3", ok.Load())
	}
	if n := db.client.ZCard(ctx, followingKey(ada.ID)).Val(); n != 3 {
		t.Errorf("ada follows %d users, want 3", n)
	}
	assertFollowCounts(t, db)
}

func TestFollowBackfill(t *testing.T) {
	db := newTestDB(t, Options{HomeCap: 6})
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	cal := mustSignup(t, db, "cal").ID
	dee := mustSignup(t, db, "dee").ID

	d := addPost(t, db, dee)
	a1 := addPost(t, db, ada)
	var b []int64
	for range 5 {
		b = append(b, addPost(t, db, bob))
	}
	a2 := addPost(t, db, ada)
	if got, want := home(t, db, ada), postIDs(ada, a1, a2); !slices.Equal(got, want) {
		t.Fatalf("home before following = %v, want %v", got, want)
	}

	// Following bob copies his posts in seq order among ada's own, and the
	// home timeline keeps only its cap of 6 newest, which drops a1.
	mustFollow(t, db, ada, bob)
	want := append(postIDs(bob, b...), postIDs(ada, a2)...)
	if got := home(t, db, ada); !slices.Equal(got, want) {
		t.Fatalf("home after following bob = %v, want %v", got, want)
	}

	// Following cal, whose one post is the newest, pushes out the oldest.
	c := addPost(t, db, cal)
	mustFollow(t, db, ada, cal)
	want = append(want[1:], postIDs(cal, c)...)
	if got := home(t, db, ada); !slices.Equal(got, want) {
		t.Fatalf("home after following cal = %v, want %v", got, want)
	}

	// A full timeline takes no posts older than what it holds.
	mustFollow(t, db, ada, dee)
	if got := home(t, db, ada); !slices.Equal(got, want) {
		t.Errorf("following dee, whose post %d is older than the home holds, changed it to %v; want %v", d, got, want)
	}
}

func TestUnfollowRemovesOnlyFolloweesPosts(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	cal := mustSignup(t, db, "cal").ID
	mustFollow(t, db, ada, bob)
	mustFollow(t, db, ada, cal)
	mustFollow(t, db, bob, ada) // bob's home must not be touched
	var want []string
	for i := range 9 {
		author := []string{ada, bob, cal}[i%3]
		seq := addPost(t, db, author)
		if author != bob {
			want = append(want, postIDs(author, seq)[0])
		}
	}
	bobHome := home(t, db, bob)
	if err := NewFollowService(db).Unfollow(ctx, ada, bob); err != nil {
		t.Fatal(err)
	}
	if got := home(t, db, ada); !slices.Equal(got, want) {
		t.Errorf("ada's home after unfollowing bob = %v, want %v", got, want)
	}
	if got := home(t, db, bob); !slices.Equal(got, bobHome) {
		t.Errorf("bob's home changed from %v to %v", bobHome, got)
	}
}

// TestUnfollowRemovesManyPosts unfollows someone with more posts than one
// chunk of removal holds.
func TestUnfollowRemovesManyPosts(t *testing.T) {
	ctx := context.Background()
	const n = 3*followChunk + 7
	db := newTestDB(t, Options{HomeCap: 2 * n})
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	first := addPost(t, db, ada)
	for range n {
		addPost(t, db, bob)
	}
	last := addPost(t, db, ada)
	mustFollow(t, db, ada, bob)
	if got := len(home(t, db, ada)); got != n+2 {
		t.Fatalf("home after follow has %d posts, want %d", got, n+2)
	}
	if err := NewFollowService(db).Unfollow(ctx, ada, bob); err != nil {
		t.Fatal(err)
	}
	if got, want := home(t, db, ada), postIDs(ada, first, last); !slices.Equal(got, want) {
		t.Errorf("home after unfollow = %v, want %v", got, want)
	}
}

func TestFollowPublishesResync(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	cal := mustSignup(t, db, "cal").ID
	eve := mustSignup(t, db, "eve").ID // no posts
	a := addPost(t, db, ada)
	b := addPost(t, db, bob)
	c := addPost(t, db, cal)

	sub := listen(t, db, homeChannel(ada), homeChannel(eve))
	next := func() string {
		t.Helper()
		msg := nextMessage(t, sub)
		return msg.Channel + " " + msg.Payload
	}
	want := func(userID string, seq int64) string { return homeChannel(userID) + " " + encodeResync(seq) }

	// Each step's message differs from the one before it, so a message
	// published by a repeat, which must publish nothing, would show.
	mustFollow(t, db, ada, bob)
	if got := next(); got != want(ada, b) {
		t.Errorf("after follow: %q, want %q", got, want(ada, b))
	}
	mustFollow(t, db, ada, bob) // a repeat
	mustFollow(t, db, ada, cal)
	if got := next(); got != want(ada, c) {
		t.Errorf("after following cal: %q, want %q", got, want(ada, c))
	}
	if err := follows.Unfollow(ctx, ada, cal); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != want(ada, b) {
		t.Errorf("after unfollowing cal: %q, want %q", got, want(ada, b))
	}
	if err := follows.Unfollow(ctx, ada, cal); err != nil { // a repeat
		t.Fatal(err)
	}
	if err := follows.Unfollow(ctx, ada, bob); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != want(ada, a) {
		t.Errorf("after unfollowing bob: %q, want %q", got, want(ada, a))
	}
	// An empty home timeline's newest position is 0.
	if err := follows.Follow(ctx, eve, ada); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != want(eve, a) {
		t.Errorf("eve after follow: %q, want %q", got, want(eve, a))
	}
	if err := follows.Unfollow(ctx, eve, ada); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != want(eve, 0) {
		t.Errorf("eve after unfollow: %q, want %q", got, want(eve, 0))
	}
}

// TestFollowRepairsAfterCrash leaves a follow and an unfollow after their
// first step, as a crash would, and checks that calling them again repairs
// the rest.
func TestFollowRepairsAfterCrash(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	a := addPost(t, db, ada)
	b := addPost(t, db, bob)

	// Follow stopped after the following set.
	if err := db.client.ZAdd(ctx, followingKey(ada), redis.Z{Score: 1234, Member: bob}).Err(); err != nil {
		t.Fatal(err)
	}
	mustFollow(t, db, ada, bob)
	assertFollowCounts(t, db)
	if got := db.client.ZScore(ctx, followersKey(bob), ada).Val(); got != 1234 {
		t.Errorf("repaired follower entry has followed-at %v, want the original 1234", got)
	}
	if got, want := home(t, db, ada), []string{postIDs(ada, a)[0], postIDs(bob, b)[0]}; !slices.Equal(got, want) {
		t.Errorf("repaired home = %v, want %v", got, want)
	}

	// Unfollow stopped after the following set.
	if err := db.client.ZRem(ctx, followingKey(ada), bob).Err(); err != nil {
		t.Fatal(err)
	}
	if err := follows.Unfollow(ctx, ada, bob); err != nil {
		t.Fatal(err)
	}
	assertFollowCounts(t, db)
	if got, want := home(t, db, ada), postIDs(ada, a); !slices.Equal(got, want) {
		t.Errorf("repaired home = %v, want %v", got, want)
	}
}

// TestFollowRace follows and unfollows the same pairs from many goroutines
// at once, then checks that the followers sets mirror the following sets,
// that counts are set sizes, and that each home timeline holds a user's post
// exactly when its owner follows that user. It runs again with a follower
// bucket threshold of 2 and workers that move accounts into buckets while
// the follows go on.
func TestFollowRace(t *testing.T) {
	t.Run("one set", func(t *testing.T) { testFollowRace(t, Options{}) })
	t.Run("buckets", func(t *testing.T) {
		testFollowRace(t, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 2, FollowerBuckets: 3})
	})
}

func testFollowRace(t *testing.T, opts Options) {
	ctx := context.Background()
	db := newTestDB(t, opts)
	follows := NewFollowService(db)
	if opts.AsyncFanOut {
		workCtx, stop := context.WithCancel(ctx)
		var workers sync.WaitGroup
		for range 2 {
			workers.Add(1)
			go func() {
				defer workers.Done()
				NewWorker(db, WorkerOptions{Batch: 1, IdleLook: 10 * time.Millisecond}).Run(workCtx)
			}()
		}
		defer func() {
			stop()
			workers.Wait()
			drainFanOut(t, db)
			assertFollowCounts(t, db)
			bucketed := 0
			for _, id := range db.client.ZRange(ctx, newestUsersKey, 0, -1).Val() {
				if _, n := storedFollowers(t, db, id); n > 0 {
					bucketed++
				}
			}
			if bucketed == 0 {
				t.Error("no account's followers moved into buckets")
			}
		}()
	}
	var ids []string
	posts := map[string]string{}
	for i := range 5 {
		id := mustSignup(t, db, fmt.Sprintf("user%d", i)).ID
		ids = append(ids, id)
		posts[id] = postIDs(id, addPost(t, db, id))[0]
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 150 {
				a, b := ids[r.IntN(len(ids))], ids[r.IntN(len(ids))]
				if a == b {
					continue
				}
				var err error
				if r.IntN(2) == 0 {
					err = follows.Follow(ctx, a, b)
				} else {
					err = follows.Unfollow(ctx, a, b)
				}
				if err != nil {
					t.Errorf("%s -> %s: %v", a, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	assertFollowCounts(t, db)
	for _, a := range ids {
		got := home(t, db, a)
		for _, b := range ids {
			if a == b {
				continue
			}
			following, _ := follows.IsFollowing(ctx, a, b)
			if has := slices.Contains(got, posts[b]); has != following {
				t.Errorf("%s following %s: %v, but its home holds their post: %v", a, b, following, has)
			}
		}
	}
}

// fakeClock is a settable clock for Options.Now.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// wantOrder sorts entries the way follow lists are ordered: newest first,
// ties by member bytes, descending, as Redis orders a REV range.
func wantOrder(entries []followEntry) []followEntry {
	out := slices.Clone(entries)
	sort.Slice(out, func(i, j int) bool {
		if out[i].at != out[j].at {
			return out[i].at > out[j].at
		}
		return bytes.Compare([]byte(out[i].member), []byte(out[j].member)) > 0
	})
	return out
}

// pageAll reads a whole connection with the given page size and returns its
// entries in order, checking page sizes and hasNextPage on the way.
func pageAll(tb testing.TB, first int, find func(page warble.PageArgs) (*warble.UserConnection, error)) []followEntry {
	tb.Helper()
	var got []followEntry
	var after *string
	for pages := 0; ; pages++ {
		if pages > 1000 {
			tb.Fatal("paging does not end")
		}
		conn, err := find(warble.PageArgs{First: first, After: after})
		if err != nil {
			tb.Fatalf("page %d: %v", pages, err)
		}
		if len(conn.Edges) > first || (conn.PageInfo.HasNextPage && len(conn.Edges) != first) {
			tb.Fatalf("page %d has %d edges for first %d, hasNextPage %v", pages, len(conn.Edges), first, conn.PageInfo.HasNextPage)
		}
		for _, e := range conn.Edges {
			got = append(got, followEntry{member: e.Node.ID, at: e.FollowedAt.UnixMilli()})
		}
		if !conn.PageInfo.HasNextPage {
			return got
		}
		if conn.PageInfo.EndCursor == nil || *conn.PageInfo.EndCursor != conn.Edges[len(conn.Edges)-1].Cursor {
			tb.Fatalf("page %d: endCursor is not the last edge's cursor", pages)
		}
		after = conn.PageInfo.EndCursor
	}
}

func TestFindFollowersPaging(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{}
	db := newTestDB(t, Options{Now: clock.Now})
	follows := NewFollowService(db)
	clock.ms.Store(1_700_000_000_000)
	star := mustSignup(t, db, "star").ID
	var fans []string
	for i := range 12 {
		fans = append(fans, mustSignup(t, db, fmt.Sprintf("fan%d", i)).ID)
	}
	// The fans follow in groups of five per millisecond. The fans have ids
	// 2 to 13, so the middle group, 7 to 11, ties ids whose order by bytes
	// is not their order by number: 9, 8, 7, 11, 10.
	var want []followEntry
	for i, fan := range fans {
		clock.ms.Store(1_700_000_001_000 + int64(i/5)*1000)
		mustFollow(t, db, fan, star)
		want = append(want, followEntry{member: fan, at: clock.ms.Load()})
	}
	want = wantOrder(want)

	for first := 1; first <= 3; first++ {
		got := pageAll(t, first, func(page warble.PageArgs) (*warble.UserConnection, error) {
			return follows.FindFollowers(ctx, star, page)
		})
		if !slices.Equal(got, want) {
			t.Errorf("first=%d: followers %v, want %v", first, got, want)
		}
	}
	conn, err := follows.FindFollowers(ctx, star, warble.PageArgs{First: 100})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := conn.TotalCount(ctx); n != len(fans) {
		t.Errorf("totalCount = %d, want %d", n, len(fans))
	}
	if conn.PageInfo.HasNextPage {
		t.Error("hasNextPage on the only page")
	}

	// Following lists page the same way.
	clock.ms.Store(1_700_000_100_000)
	var wantFollowing []followEntry
	for _, fan := range fans[:7] {
		mustFollow(t, db, star, fan)
		wantFollowing = append(wantFollowing, followEntry{member: fan, at: clock.ms.Load()})
	}
	got := pageAll(t, 2, func(page warble.PageArgs) (*warble.UserConnection, error) {
		return follows.FindFollowing(ctx, star, page)
	})
	if want := wantOrder(wantFollowing); !slices.Equal(got, want) {
		t.Errorf("following %v, want %v", got, want)
	}
}

// TestFindFollowersCursorGone continues paging after the user at the cursor
// has unfollowed: the next page starts exactly where the last one ended.
func TestFindFollowersCursorGone(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	db := newTestDB(t, Options{Now: clock.Now})
	follows := NewFollowService(db)
	star := mustSignup(t, db, "star").ID
	var all []followEntry
	for i := range 12 {
		fan := mustSignup(t, db, fmt.Sprintf("fan%d", i)).ID
		clock.ms.Store(1_700_000_001_000 + int64(i/6)*1000) // two groups of six ties
		mustFollow(t, db, fan, star)
		all = append(all, followEntry{member: fan, at: clock.ms.Load()})
	}
	all = wantOrder(all)
	for _, cut := range []int{2, 6, 8} {
		t.Run(strconv.Itoa(cut), func(t *testing.T) {
			conn, err := follows.FindFollowers(ctx, star, warble.PageArgs{First: cut})
			if err != nil {
				t.Fatal(err)
			}
			gone := conn.Edges[len(conn.Edges)-1].Node.ID
			if err := follows.Unfollow(ctx, gone, star); err != nil {
				t.Fatal(err)
			}
			defer func() {
				clock.ms.Store(all[cut-1].at)
				mustFollow(t, db, gone, star)
			}()
			rest, err := follows.FindFollowers(ctx, star, warble.PageArgs{First: 100, After: conn.PageInfo.EndCursor})
			if err != nil {
				t.Fatal(err)
			}
			var got []followEntry
			for _, e := range rest.Edges {
				got = append(got, followEntry{member: e.Node.ID, at: e.FollowedAt.UnixMilli()})
			}
			if want := all[cut:]; !slices.Equal(got, want) {
				t.Errorf("after the cursor of a gone follower: %v, want %v", got, want)
			}
		})
	}
}

func TestFindFollowsBadPage(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	finds := map[string]func(page warble.PageArgs) (*warble.UserConnection, error){
		"FindFollowers": func(page warble.PageArgs) (*warble.UserConnection, error) {
			return follows.FindFollowers(ctx, ada, page)
		},
		"FindFollowing": func(page warble.PageArgs) (*warble.UserConnection, error) {
			return follows.FindFollowing(ctx, ada, page)
		},
		"FindCommonFollowers": func(page warble.PageArgs) (*warble.UserConnection, error) {
			return follows.FindCommonFollowers(ctx, ada, bob, page)
		},
		"FindCommonFollowing": func(page warble.PageArgs) (*warble.UserConnection, error) {
			return follows.FindCommonFollowing(ctx, ada, bob, page)
		},
		"FindFollowersYouFollow": func(page warble.PageArgs) (*warble.UserConnection, error) {
			return follows.FindFollowersYouFollow(ctx, ada, bob, page)
		},
	}
	tests := []struct {
		name   string
		page   warble.PageArgs
		common bool // whether the common connections take it
		follow bool // whether followers and following take it
	}{
		{name: "FirstOne", page: warble.PageArgs{First: 1}, common: true, follow: true},
		{name: "FirstMax", page: warble.PageArgs{First: warble.MaxPageSize}, common: true, follow: true},
		{name: "FirstZero", page: warble.PageArgs{First: 0}},
		{name: "FirstTooBig", page: warble.PageArgs{First: warble.MaxPageSize + 1}},
		{name: "Garbage", page: warble.PageArgs{First: 10, After: strPtr("!!")}},
		{name: "PostCursor", page: warble.PageArgs{First: 10, After: strPtr(warble.PostCursor(5))}},
		{name: "FollowCursor", page: warble.PageArgs{First: 10, After: strPtr(warble.FollowCursor(time.UnixMilli(5), "1"))}, follow: true},
		{name: "CommonCursor", page: warble.PageArgs{First: 10, After: strPtr(formatCommonCursor(sideUser, 5, "1"))}, common: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for what, find := range finds {
				ok := tt.follow
				if strings.Contains(what, "Common") || strings.Contains(what, "YouFollow") {
					ok = tt.common
				}
				wantCode := warble.EINVALID
				if ok {
					wantCode = ""
				}
				if _, err := find(tt.page); warble.ErrorCode(err) != wantCode {
					t.Errorf("%s: code %q, want %q (err %v)", what, warble.ErrorCode(err), wantCode, err)
				}
			}
		})
	}
}

func TestCommonCursor(t *testing.T) {
	tests := []struct {
		name   string
		cursor string
		ok     bool
	}{
		{name: "User", cursor: formatCommonCursor(sideUser, 1_700_000_000_000, "42"), ok: true},
		{name: "Viewer", cursor: formatCommonCursor(sideViewer, 0, "1"), ok: true},
		{name: "BadSide", cursor: formatCommonCursor('x', 5, "1")},
		{name: "BadMember", cursor: formatCommonCursor(sideUser, 5, "01")},
		{name: "FollowCursor", cursor: warble.FollowCursor(time.UnixMilli(5), "1")},
		{name: "Empty", cursor: ""},
		{name: "NotBase64", cursor: "c*"},
		{name: "NoColon", cursor: "Y3U1"}, // "cu5"
		{name: "TooLong", cursor: strings.Repeat("A", 65)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseCommonCursor(tt.cursor)
			if (err == nil) != tt.ok {
				t.Fatalf("parseCommonCursor(%q) err = %v, want ok %v", tt.cursor, err, tt.ok)
			}
			if err != nil && warble.ErrorCode(err) != warble.EINVALID {
				t.Errorf("code = %q, want EINVALID", warble.ErrorCode(err))
			}
		})
	}
}

// commonScenario is a small graph for the intersections, seen by viewer
// looking at target's profile.
type commonScenario struct {
	db             *DB
	viewer, target string
	names          map[string]string // id -> username
}

// newCommonScenario builds users who follow or are followed by the viewer
// and the target in every combination, and pads the viewer's or the
// target's sets with members that have no user (padViewer, padTarget), so
// that a test can choose which set the walk takes.
func newCommonScenario(t *testing.T, padViewer, padTarget int) *commonScenario {
	t.Helper()
	ctx := context.Background()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	db := newTestDB(t, Options{Now: clock.Now})
	s := &commonScenario{db: db, names: map[string]string{}}
	s.viewer = mustSignup(t, db, "viewer").ID
	s.target = mustSignup(t, db, "target").ID
	for i := range 9 {
		// Every follow of round i is made in the same millisecond, so each
		// set holds ties.
		clock.ms.Add(1000)
		for _, kind := range []string{"both", "onlyv", "onlyt"} {
			u := mustSignup(t, db, fmt.Sprintf("%s%d", kind, i))
			s.names[u.ID] = u.Username
			follow := func(a, b string) { mustFollow(t, db, a, b) }
			switch kind {
			case "both":
				follow(u.ID, s.viewer)
				follow(u.ID, s.target)
				follow(s.target, u.ID)
				follow(s.viewer, u.ID)
			case "onlyv":
				follow(u.ID, s.viewer)
				follow(s.viewer, u.ID)
				if i%3 == 0 {
					follow(u.ID, s.target) // a follower of target the viewer follows
				}
			case "onlyt":
				follow(u.ID, s.target)
				follow(s.target, u.ID)
			}
		}
	}
	// Each set gets padding of its own, so that no two sets share any.
	pad := func(key string, n, from int) {
		pipe := db.client.Pipeline()
		for i := range n {
			pipe.ZAdd(ctx, key, redis.Z{Score: float64(1_600_000_000_000 + i), Member: strconv.Itoa(from + i)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pad(followersKey(s.viewer), padViewer, 100_000)
	pad(followingKey(s.viewer), padViewer, 200_000)
	pad(followersKey(s.target), padTarget, 300_000)
	pad(followingKey(s.target), padTarget, 400_000)
	return s
}

// bruteIntersection computes an intersection the slow way, for checking:
// the members of userSet that viewerSet also holds and that are users, with
// their scores in userSet, in the order of walked.
func (s *commonScenario) bruteIntersection(t *testing.T, userSet, viewerSet string, walkUser bool) []followEntry {
	t.Helper()
	ctx := context.Background()
	scores := func(key string) map[string]int64 {
		m := map[string]int64{}
		for _, z := range s.db.client.ZRangeWithScores(ctx, key, 0, -1).Val() {
			m[z.Member.(string)] = int64(z.Score)
		}
		return m
	}
	u, v := scores(userSet), scores(viewerSet)
	walked := v
	if walkUser {
		walked = u
	}
	var order, out []followEntry
	for m, at := range walked {
		if _, ok := u[m]; ok {
			if _, ok := v[m]; ok && s.names[m] != "" {
				order = append(order, followEntry{member: m, at: at})
			}
		}
	}
	for _, e := range wantOrder(order) {
		out = append(out, followEntry{member: e.member, at: u[e.member]})
	}
	return out
}

func TestFindCommon(t *testing.T) {
	for _, pad := range []struct {
		name                 string
		padViewer, padTarget int
		walkUser             bool
	}{
		{name: "WalkTarget", padViewer: 50, walkUser: true},
		{name: "WalkViewer", padTarget: 50},
		{name: "WalkTargetInChunks", padViewer: 3 * followChunk, padTarget: followChunk + 1, walkUser: true},
		{name: "WalkViewerInChunks", padViewer: followChunk + 1, padTarget: 3 * followChunk},
	} {
		t.Run(pad.name, func(t *testing.T) {
			ctx := context.Background()
			s := newCommonScenario(t, pad.padViewer, pad.padTarget)
			follows := NewFollowService(s.db)
			kinds := []struct {
				name               string
				find               func(ctx context.Context, viewerID, userID string, page warble.PageArgs) (*warble.UserConnection, error)
				userSet, viewerSet string
			}{
				{"CommonFollowers", follows.FindCommonFollowers, followersKey(s.target), followersKey(s.viewer)},
				{"CommonFollowing", follows.FindCommonFollowing, followingKey(s.target), followingKey(s.viewer)},
				{"FollowersYouFollow", follows.FindFollowersYouFollow, followersKey(s.target), followingKey(s.viewer)},
			}
			for _, k := range kinds {
				want := s.bruteIntersection(t, k.userSet, k.viewerSet, pad.walkUser)
				if len(want) < 3 {
					t.Fatalf("%s: scenario gives only %d users", k.name, len(want))
				}
				for first := 1; first <= 3; first++ {
					got := pageAll(t, first, func(page warble.PageArgs) (*warble.UserConnection, error) {
						return k.find(ctx, s.viewer, s.target, page)
					})
					if !slices.Equal(got, want) {
						t.Errorf("%s first=%d:\n got %v\nwant %v", k.name, first, got, want)
					}
				}
				conn, err := k.find(ctx, s.viewer, s.target, warble.PageArgs{First: 1})
				if err != nil {
					t.Fatal(err)
				}
				side, _, err := parseCommonCursor(conn.Edges[0].Cursor)
				if wantSide := map[bool]byte{true: sideUser, false: sideViewer}[pad.walkUser]; err != nil || side != wantSide {
					t.Errorf("%s: cursor side %c (%v), want %c", k.name, side, err, wantSide)
				}
				n, err := conn.TotalCount(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if wantN := len(want); n != wantN {
					t.Errorf("%s: totalCount %d, want %d", k.name, n, wantN)
				}
				// Signed out: empty.
				conn, err = k.find(ctx, "", s.target, warble.PageArgs{First: 10})
				if err != nil || len(conn.Edges) != 0 || conn.PageInfo.HasNextPage {
					t.Errorf("%s signed out = %+v, %v; want empty", k.name, conn, err)
				} else if n, _ := conn.TotalCount(ctx); n != 0 {
					t.Errorf("%s signed out: totalCount %d", k.name, n)
				}
			}
		})
	}
}

// commandCounter is a go-redis hook that counts round trips and notes the
// largest reply, to show that a page read stays small.
type commandCounter struct {
	mu         sync.Mutex
	roundTrips int
	commands   int
	largest    int // elements in the largest array reply
	largestCmd string
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.note(cmd)
		c.mu.Lock()
		c.roundTrips++
		c.mu.Unlock()
		return err
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.note(cmd)
		}
		c.mu.Lock()
		c.roundTrips++
		c.mu.Unlock()
		return err
	}
}

func (c *commandCounter) note(cmd redis.Cmder) {
	n := 0
	switch cmd := cmd.(type) {
	case *redis.Cmd:
		v, _ := cmd.Slice()
		n = len(v)
	case *redis.StringSliceCmd:
		n = len(cmd.Val())
	case *redis.ZSliceCmd:
		n = len(cmd.Val())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commands++
	if n > c.largest {
		c.largest, c.largestCmd = n, cmd.Name()
	}
}

func (c *commandCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roundTrips, c.commands, c.largest, c.largestCmd = 0, 0, 0, ""
}

// buildLargeFollowers gives userID n followers without user hashes, with
// pipelined ZADDs straight into its followers set.
func buildLargeFollowers(tb testing.TB, db *DB, userID string, n int) {
	tb.Helper()
	ctx := context.Background()
	const perCmd, perPipe = 1000, 50
	pipe := db.client.Pipeline()
	for start := 0; start < n; start += perCmd {
		zs := make([]redis.Z, 0, perCmd)
		for i := start; i < min(start+perCmd, n); i++ {
			zs = append(zs, redis.Z{Score: float64(1_600_000_000_000 + i), Member: strconv.Itoa(10_000_000 + i)})
		}
		pipe.ZAdd(ctx, followersKey(userID), zs...)
		if pipe.Len() == perPipe {
			if _, err := pipe.Exec(ctx); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		tb.Fatal(err)
	}
}

// TestFindCommonFollowersLargeSet intersects an account with 20,000
// followers with a small one, and checks that the answers are right and
// that a page read takes a few round trips and never reads the large set.
func TestFindCommonFollowersLargeSet(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	db := newTestDB(t, Options{Now: clock.Now})
	follows := NewFollowService(db)
	celeb := mustSignup(t, db, "celeb").ID
	viewer := mustSignup(t, db, "viewer").ID
	const large = 20_000
	buildLargeFollowers(t, db, celeb, large)
	follow := func(a, b string) {
		clock.ms.Add(1)
		mustFollow(t, db, a, b)
	}
	var fans []string // follow both
	for i := range 7 {
		id := mustSignup(t, db, fmt.Sprintf("fan%d", i)).ID
		follow(id, celeb)
		follow(id, viewer)
		fans = append(fans, id)
	}
	for i := range 5 { // follow only the viewer
		follow(mustSignup(t, db, fmt.Sprintf("friend%d", i)).ID, viewer)
	}
	slices.Reverse(fans) // newest first

	// Load the scripts, so that the counts below are of a warm server.
	if _, err := follows.FindCommonFollowers(ctx, viewer, celeb, warble.PageArgs{First: 1}); err != nil {
		t.Fatal(err)
	}
	counter := &commandCounter{}
	db.client.AddHook(counter)
	for _, tc := range []struct {
		name           string
		viewer, target string
	}{
		{"ViewerSmall", viewer, celeb},
		{"ViewerLarge", celeb, viewer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter.reset()
			conn, err := follows.FindCommonFollowers(ctx, tc.viewer, tc.target, warble.PageArgs{First: 3})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("first page: %d round trips, %d commands, largest reply %d elements (%s)",
				counter.roundTrips, counter.commands, counter.largest, counter.largestCmd)
			if counter.roundTrips > 4 || counter.largest > 50 {
				t.Errorf("first page took %d round trips and a reply of %d elements (%s); want a few small ones",
					counter.roundTrips, counter.largest, counter.largestCmd)
			}
			var got []string
			for _, e := range conn.Edges {
				got = append(got, e.Node.ID)
				// followedAt is when the edge user followed the target.
				at := db.client.ZScore(ctx, followersKey(tc.target), e.Node.ID).Val()
				if e.FollowedAt.UnixMilli() != int64(at) {
					t.Errorf("%s followedAt %v, want %v", e.Node.ID, e.FollowedAt.UnixMilli(), int64(at))
				}
			}
			if !slices.Equal(got, fans[:3]) || !conn.PageInfo.HasNextPage {
				t.Errorf("first page = %v (next %v), want %v and more", got, conn.PageInfo.HasNextPage, fans[:3])
			}

			counter.reset()
			rest := pageAll(t, 2, func(page warble.PageArgs) (*warble.UserConnection, error) {
				if page.After == nil {
					page.After = conn.PageInfo.EndCursor
				}
				return follows.FindCommonFollowers(ctx, tc.viewer, tc.target, page)
			})
			var restIDs []string
			for _, e := range rest {
				restIDs = append(restIDs, e.member)
			}
			if !slices.Equal(restIDs, fans[3:]) {
				t.Errorf("later pages = %v, want %v", restIDs, fans[3:])
			}
			if counter.largest > 50 {
				t.Errorf("later pages read a reply of %d elements (%s)", counter.largest, counter.largestCmd)
			}

			counter.reset()
			n, err := conn.TotalCount(ctx)
			if err != nil || n != len(fans) {
				t.Errorf("totalCount = %d, %v; want %d", n, err, len(fans))
			}
			if counter.largest > 50 {
				t.Errorf("totalCount read a reply of %d elements (%s)", counter.largest, counter.largestCmd)
			}
		})
	}
}

// BenchmarkFindCommonFollowers intersects a set of 1,000,000 followers with
// a small one (the viewer's 200 followers, of whom 50 follow both): a page
// of 20, and the totalCount walk.
func BenchmarkFindCommonFollowers(b *testing.B) {
	ctx := context.Background()
	db := newTestDB(b, Options{})
	follows := NewFollowService(db)
	celeb := mustSignup(b, db, "celeb").ID
	viewer := mustSignup(b, db, "viewer").ID
	buildLargeFollowers(b, db, celeb, 1_000_000)
	pipe := db.client.Pipeline()
	for i := range 200 {
		id := strconv.Itoa(20_000_000 + i)
		if i < 50 {
			id = mustSignup(b, db, fmt.Sprintf("fan%d", i)).ID
			pipe.ZAdd(ctx, followersKey(celeb), redis.Z{Score: float64(1_700_000_000_000 + i), Member: id})
		}
		pipe.ZAdd(ctx, followersKey(viewer), redis.Z{Score: float64(1_700_000_000_000 + i), Member: id})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}

	b.Run("Page", func(b *testing.B) {
		for b.Loop() {
			conn, err := follows.FindCommonFollowers(ctx, viewer, celeb, warble.PageArgs{First: 20})
			if err != nil || len(conn.Edges) != 20 {
				b.Fatalf("page: %d edges, %v", len(conn.Edges), err)
			}
		}
	})
	b.Run("TotalCount", func(b *testing.B) {
		conn, err := follows.FindCommonFollowers(ctx, viewer, celeb, warble.PageArgs{First: 20})
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if n, err := conn.TotalCount(ctx); err != nil || n != 50 {
				b.Fatalf("totalCount = %d, %v", n, err)
			}
		}
	})
}

// cancelAfterCommand is a go-redis hook that cancels a request's context
// once a command it matches has succeeded, as a client that hangs up at
// that moment does, after running before (if set) ahead of that command.
type cancelAfterCommand struct {
	match  func(args []any) bool
	before func()
	cancel context.CancelFunc
	fired  atomic.Bool
}

func (h *cancelAfterCommand) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cancelAfterCommand) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *cancelAfterCommand) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		hit := !h.fired.Load() && h.match(cmd.Args())
		if hit && h.before != nil {
			h.before()
		}
		err := next(ctx, cmd)
		if hit && err == nil && h.fired.CompareAndSwap(false, true) {
			h.cancel()
		}
		return err
	}
}

// TestFollowCutShortByItsClient: a Follow or an Unfollow whose client
// hangs up once its first step (the following set, the truth) is written
// still runs to its end: the followers side agrees with the truth, and no
// post of the followee is left in the home timeline, neither one made
// before (the Unfollow's last step takes it off; the user, told they no
// longer follow, would not unfollow again) nor one made after. For the
// Unfollow, its client hangs up right after the following set; for the
// Follow, an unfollow takes the truth back while the follow writes the
// followers side, and its client hangs up before it reads the truth
// again.
func TestFollowCutShortByItsClient(t *testing.T) {
	for _, tc := range []string{"Unfollow", "FollowRacingUnfollow"} {
		t.Run(tc, func(t *testing.T) {
			db := newTestDB(t, Options{})
			ada, bob := mustSignup(t, db, "ada").ID, mustSignup(t, db, "bob").ID
			follows := NewFollowService(db)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hook := &cancelAfterCommand{cancel: cancel}
			var err error
			if tc == "Unfollow" {
				mustFollow(t, db, bob, ada)
				mustCreatePost(t, db, ada, "before the cut")
				if len(home(t, db, bob)) == 0 {
					t.Fatal("bob did not get ada's post while following: the test makes no case")
				}
				hook.match = func(args []any) bool {
					return len(args) == 3 && args[0] == "zrem" && args[1] == followingKey(bob) && args[2] == ada
				}
				db.client.AddHook(hook)
				err = follows.Unfollow(ctx, bob, ada)
			} else {
				// The follow's write of ada's followers, which adds bob.
				hook.match = func(args []any) bool {
					name, _ := args[0].(string)
					return (name == "evalsha" || name == "eval") && len(args) > 7 &&
						args[3] == followersKey(ada) && args[6] == bob && args[7] != ""
				}
				hook.before = func() {
					// The racing unfollow: its following set, as it
					// writes it first.
					if err := db.client.ZRem(context.Background(), followingKey(bob), ada).Err(); err != nil {
						t.Error(err)
					}
				}
				db.client.AddHook(hook)
				err = follows.Follow(ctx, bob, ada)
			}
			if !hook.fired.Load() {
				t.Fatal("the client never hung up")
			}
			t.Logf("%s whose client hung up: %v", tc, err)
			p := mustCreatePost(t, db, ada, "after the cut")
			for _, id := range home(t, db, bob) {
				if strings.HasPrefix(id, ada+":") {
					t.Errorf("bob, who does not follow ada, holds %s (post %s) in his home timeline", id, p.ID)
				}
			}
			if _, err := db.client.ZScore(context.Background(), followingKey(bob), ada).Result(); err != redis.Nil {
				t.Fatalf("bob follows ada in the end (%v): the test makes no case", err)
			}
			if _, err := db.client.ZScore(context.Background(), followersKey(ada), bob).Result(); err != redis.Nil {
				t.Errorf("ada's followers side lists bob, who does not follow her (%v)", err)
			}
		})
	}
}

// followersLog returns the followers named by the entries of userID's
// followers log, oldest first.
func followersLog(tb testing.TB, db *DB, userID string) []string {
	tb.Helper()
	entries, err := db.client.XRange(context.Background(), followersLogKey(userID), "-", "+").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		f, _ := e.Values["f"].(string)
		out = append(out, f)
	}
	return out
}

// TestFollowersLog checks what follows and unfollows leave in the
// followee's followers log and unsure hash: one log entry per write of the
// followers side, and an unsure count only for a write whose writer did
// not confirm it.
func TestFollowersLog(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	follows := NewFollowService(db)
	ada, bob, cy := mustSignup(t, db, "ada"), mustSignup(t, db, "bob"), mustSignup(t, db, "cyd")
	// The counts by follower, without the tokens of the writers counted.
	unsure := func() map[string]string {
		t.Helper()
		m, err := db.client.HGetAll(ctx, followersUnsureKey(ada.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		maps.DeleteFunc(m, func(field, _ string) bool { return strings.Contains(field, ":") })
		return m
	}
	checked := func() string {
		t.Helper()
		v, _ := db.client.HGet(ctx, userKey(ada.ID), followersCheckedField).Result()
		return v
	}

	if err := follows.Follow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if got := followersLog(t, db, ada.ID); !slices.Equal(got, []string{bob.ID}) {
		t.Fatalf("log after a follow = %v, want [%s]", got, bob.ID)
	}
	if got := unsure(); len(got) != 0 {
		t.Fatalf("unsure after a confirmed follow = %v, want none", got)
	}
	if checked() == "" {
		t.Fatal("a follow into an empty followers set did not mark the set checked")
	}
	if err := follows.Unfollow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if got := followersLog(t, db, ada.ID); !slices.Equal(got, []string{bob.ID, bob.ID}) {
		t.Fatalf("log after the unfollow = %v, want [%s %s]", got, bob.ID, bob.ID)
	}
	if got := unsure(); len(got) != 0 {
		t.Fatalf("unsure after a confirmed unfollow = %v, want none", got)
	}

	// A repeated unfollow changes nothing in the followers side: nothing
	// logged.
	if err := follows.Unfollow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if got := followersLog(t, db, ada.ID); len(got) != 2 {
		t.Fatalf("log after a repeated unfollow = %v, want the 2 entries of before", got)
	}
	// An unfollow that dies after it wrote the truth and before the
	// followers side leaves the follower unsure for good: cyd follows,
	// and then the unfollow's first two steps only.
	if err := follows.Follow(ctx, cy.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := follows.checkPair(ctx, cy.ID, ada.ID, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.client.ZRem(ctx, followingKey(cy.ID), ada.ID).Err(); err != nil {
		t.Fatal(err)
	}
	if got := unsure(); got[cy.ID] != "1" {
		t.Fatalf("unsure after an unfollow cut short = %v, want %s: 1", got, cy.ID)
	}
	// A follow racing an unfollow of the pair: the follow's first write is
	// stale by the time it reads the truth, so it writes again; each
	// change is logged, and both writers confirm theirs.
	raced := false
	db.mirrorWritten = func(followerID, followeeID string) {
		if raced || followerID != bob.ID {
			return
		}
		raced = true
		if err := follows.Unfollow(ctx, bob.ID, ada.ID); err != nil {
			t.Errorf("the racing unfollow: %v", err)
		}
	}
	if err := follows.Follow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	db.mirrorWritten = nil
	// bob, bob, cyd; then the follow's add of bob and the unfollow's
	// removal (the follow's second write, a removal too, changes nothing).
	if got, want := followersLog(t, db, ada.ID), []string{bob.ID, bob.ID, cy.ID, bob.ID, bob.ID}; !slices.Equal(got, want) {
		t.Fatalf("log after the race = %v, want %v", got, want)
	}
	if n, _ := db.client.ZScore(ctx, followersKey(ada.ID), bob.ID).Result(); n != 0 {
		t.Fatalf("bob is in ada's followers after a follow that lost to an unfollow (score %v)", n)
	}
	if got := unsure(); len(got) != 1 || got[cy.ID] != "1" {
		t.Fatalf("unsure after the race = %v, want only %s: 1", got, cy.ID)
	}
}

// TestFollowersCheckedOnlyFromEmpty checks that a follow into a followers
// set that holds entries already (written by an earlier Warble, which did
// not log) does not mark it checked.
func TestFollowersCheckedOnlyFromEmpty(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	ada, bob, cy := mustSignup(t, db, "ada"), mustSignup(t, db, "bob"), mustSignup(t, db, "cyd")
	if err := db.client.ZAdd(ctx, followersKey(ada.ID), redis.Z{Score: 1, Member: cy.ID}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := NewFollowService(db).Follow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if v, err := db.client.HGet(ctx, userKey(ada.ID), followersCheckedField).Result(); err != redis.Nil {
		t.Fatalf("followersChecked = %q (%v) after a follow into a set with an unlogged entry, want none", v, err)
	}
}
