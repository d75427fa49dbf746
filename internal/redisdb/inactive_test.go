package redisdb

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// testClock is a clock that tests move by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestInactiveFollowersSkipped: fan-out skips a follower not seen for a
// week, and the follower's next sign-in rebuilds their home timeline with
// what was skipped, announcing a RESYNC on their home channel.
func TestInactiveFollowersSkipped(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "inline", true: "workers"}[async], func(t *testing.T) {
			clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
			db := newTestDB(t, Options{Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour, AsyncFanOut: async})
			ctx := context.Background()
			author := mustSignup(t, db, "author").ID
			active := mustSignup(t, db, "active").ID
			away := mustSignup(t, db, "away").ID
			quiet := mustSignup(t, db, "quiet").ID // followed by away, posts nothing
			mustFollow(t, db, active, author)
			mustFollow(t, db, away, author)
			mustFollow(t, db, away, quiet)
			post := func(body string) *warble.Post {
				p := mustCreatePost(t, db, author, body)
				drainFanOut(t, db)
				return p
			}
			before := post("while everyone reads")
			if n := holding(t, db, []string{active, away}, before.ID); n != 2 {
				t.Fatalf("%d of 2 followers got the post", n)
			}

			clock.Add(6 * 24 * time.Hour)
			if err := db.Seen(ctx, active); err != nil {
				t.Fatal(err)
			}
			clock.Add(2 * 24 * time.Hour) // away: 8 days unseen; active: 2
			var missed []*warble.Post
			for _, body := range []string{"one", "two", "three"} {
				missed = append(missed, post(body))
			}
			for _, p := range missed {
				if holding(t, db, []string{active}, p.ID) != 1 {
					t.Fatalf("the active follower lacks %s", p.ID)
				}
				if holding(t, db, []string{away}, p.ID) != 0 {
					t.Fatalf("fan-out delivered %s to a follower away for 8 days", p.ID)
				}
			}
			// Unfollowed while away: not brought back.
			if err := NewFollowService(db).Unfollow(ctx, away, quiet); err != nil {
				t.Fatal(err)
			}

			// A listener on the home channel (another tab's hub, say) hears
			// the rebuild as a RESYNC message.
			ps := listen(t, db, homeChannel(away))
			if _, err := NewAuthService(db).Login(ctx, warble.LoginInput{Username: "away", Password: "password123"}); err != nil {
				t.Fatal(err)
			}
			want := []string{missed[2].ID, missed[1].ID, missed[0].ID, before.ID}
			if got := readTimeline(t, db, warble.HomeFeed(away), 10, nil); !slices.Equal(got, want) {
				t.Fatalf("home after coming back = %v, want %v", got, want)
			}
			select {
			case m := <-ps:
				if m.Payload != encodeResync(missed[2].Seq) {
					t.Fatalf("home channel got %q, want a RESYNC at the newest post", m.Payload)
				}
			case <-time.After(eventWait):
				t.Fatal("no RESYNC on the home channel")
			}
			// Back among the active: the next post is pushed.
			next := post("welcome back")
			if holding(t, db, []string{away}, next.ID) != 1 {
				t.Fatal("fan-out skipped a follower who came back")
			}
		})
	}
}

// TestSeenIsCheap: a user's visits are recorded at most once per
// seenEvery by one process, so a request costs no extra round trip.
func TestSeenIsCheap(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newTestDB(t, Options{Now: clock.Now})
	ctx := context.Background()
	u := mustSignup(t, db, "ursula").ID
	at := func() string { return db.client.Get(ctx, seenKey(u)).Val() }
	first := at()
	if first != msString(clock.Now()) {
		t.Fatalf("seen at signup = %q, want now", first)
	}
	clock.Add(time.Minute)
	if err := db.Seen(ctx, u); err != nil {
		t.Fatal(err)
	}
	if at() != first {
		t.Fatal("a visit a minute later was written")
	}
	clock.Add(time.Hour)
	if err := db.Seen(ctx, u); err != nil {
		t.Fatal(err)
	}
	if at() != msString(clock.Now()) {
		t.Fatalf("seen = %q after an hour, want now", at())
	}
}

// TestLiveReaderStaysActive: a user who makes no request for a week but
// watches their home timeline live the whole time is not skipped.
func TestLiveReaderStaysActive(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newTestDB(t, Options{Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour})
	h := NewHub(db)
	h.seenEvery = 20 * time.Millisecond
	t.Cleanup(func() { h.Close() })
	author := mustSignup(t, db, "author").ID
	watcher := mustSignup(t, db, "watcher").ID
	mustFollow(t, db, watcher, author)
	events := mustSubscribe(t, h, warble.HomeFeed(watcher), nil)
	for range 8 {
		clock.Add(24 * time.Hour)
		now := msString(clock.Now())
		waitFor(t, "the live timeline to record its reader", func() bool {
			return db.client.Get(context.Background(), seenKey(watcher)).Val() == now
		})
	}
	p := mustCreatePost(t, db, author, "still there?")
	wantAdded(t, nextEvent(t, events), p)
	if holding(t, db, []string{watcher}, p.ID) != 1 {
		t.Fatal("fan-out skipped a user watching live")
	}
}

// TestSubscribingRebuilds: a returning user whose first act is to open a
// live home timeline gets it rebuilt before the subscription starts.
func TestSubscribingRebuilds(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newTestDB(t, Options{Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour})
	h := newTestHub(t, db)
	author := mustSignup(t, db, "author").ID
	away := mustSignup(t, db, "away").ID
	mustFollow(t, db, away, author)
	clock.Add(8 * 24 * time.Hour)
	p := mustCreatePost(t, db, author, "while you were away")
	if holding(t, db, []string{away}, p.ID) != 0 {
		t.Fatal("fan-out delivered to an inactive follower")
	}
	mustSubscribe(t, h, warble.HomeFeed(away), nil)
	if holding(t, db, []string{away}, p.ID) != 1 {
		t.Fatal("subscribing did not rebuild the home timeline")
	}
}

// homeIDs returns a user's home timeline as a page read shows it, newest
// first.
func homeIDs(tb testing.TB, db *DB, userID string) []string {
	tb.Helper()
	return readTimeline(tb, db, warble.HomeFeed(userID), 50, nil)
}

func inSeenIndex(tb testing.TB, db *DB, userID string) bool {
	tb.Helper()
	err := db.client.ZScore(context.Background(), seenIndexKey(db.fanOutShard(userID)), userID).Err()
	if err != nil && err != redis.Nil {
		tb.Fatal(err)
	}
	return err == nil
}

// TestIdleHomesDropped: the workers drop the home timelines of the users
// unseen for InactiveAfter, found through the seen index (users recorded
// before it through a one-time backfill), and keep those of active users
// and of users with no seen time; a returning user's next request rebuilds
// the whole timeline, their own posts too.
func TestIdleHomesDropped(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	week := 7 * 24 * time.Hour
	db := newTestDB(t, Options{Now: clock.Now, InactiveAfter: week, AsyncFanOut: true})
	ctx := context.Background()
	author := mustSignup(t, db, "author").ID
	away := mustSignup(t, db, "away").ID
	active := mustSignup(t, db, "active").ID
	legacy := mustSignup(t, db, "legacy").ID // no seen time: counts as active
	old := mustSignup(t, db, "old").ID       // seen before the index existed
	for _, u := range []string{away, active, legacy, old} {
		mustFollow(t, db, u, author)
	}
	mustCreatePost(t, db, away, "away's own")
	for i := range 3 {
		mustCreatePost(t, db, author, "before "+strconv.Itoa(i))
	}
	awayBefore := homeIDs(t, db, away)
	if len(awayBefore) != 4 {
		t.Fatalf("away's home = %v, want 4 posts", awayBefore)
	}
	db.client.Del(ctx, seenKey(legacy))
	db.client.ZRem(ctx, seenIndexKey(db.fanOutShard(legacy)), legacy)
	db.client.ZRem(ctx, seenIndexKey(db.fanOutShard(old)), old)

	clock.Add(6 * 24 * time.Hour)
	if err := db.Seen(ctx, active); err != nil {
		t.Fatal(err)
	}
	clock.Add(2 * 24 * time.Hour)
	missed := mustCreatePost(t, db, author, "while away was away")

	if err := db.backfillSeenIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if !inSeenIndex(t, db, old) || inSeenIndex(t, db, legacy) {
		t.Fatalf("after the backfill: old indexed %v (want true), legacy %v (want false)", inSeenIndex(t, db, old), inSeenIndex(t, db, legacy))
	}
	dropped, err := db.dropIdleHomes(ctx, clock.Now().Add(-week))
	if err != nil || dropped != 3 { // away, old, and author, who posted 8 days ago
		t.Fatalf("dropIdleHomes = %d, %v; want 3", dropped, err)
	}
	for u, want := range map[string]int64{away: 0, old: 0, author: 0, active: 1, legacy: 1} {
		if n := db.client.Exists(ctx, homeKey(u)).Val(); n != want {
			t.Errorf("home of %s exists = %d after the drop, want %d", u, n, want)
		}
		if inSeenIndex(t, db, u) != (want == 1 && u != legacy) {
			t.Errorf("%s in the seen index = %v after the drop", u, inSeenIndex(t, db, u))
		}
	}
	if dropped, err := db.dropIdleHomes(ctx, clock.Now().Add(-week)); err != nil || dropped != 0 {
		t.Fatalf("second dropIdleHomes = %d, %v; want 0", dropped, err)
	}

	// Back: the first request rebuilds everything, and indexes the user.
	if err := db.Seen(ctx, away); err != nil {
		t.Fatal(err)
	}
	want := append([]string{missed.ID}, awayBefore...)
	if got := homeIDs(t, db, away); !slices.Equal(got, want) {
		t.Fatalf("away's home after coming back = %v, want %v", got, want)
	}
	if !inSeenIndex(t, db, away) {
		t.Error("a returning user is not in the seen index")
	}

	// A worker whose clock runs a week ahead drops the home of a user the
	// servers count as active; their next request still rebuilds it.
	clock.Add(2 * time.Hour)
	if dropped, err := db.dropIdleHomes(ctx, clock.Now().Add(time.Hour)); err != nil || dropped != 2 { // away, active
		t.Fatalf("dropIdleHomes a week ahead = %d, %v; want 2", dropped, err)
	}
	clock.Add(2 * time.Hour)
	if err := db.Seen(ctx, away); err != nil {
		t.Fatal(err)
	}
	if got := homeIDs(t, db, away); !slices.Equal(got, want) {
		t.Fatalf("away's home after a drop by a worker ahead of time = %v, want %v", got, want)
	}
}

// TestIdleHomeDropRacesReturn: a user who comes back while their home
// timeline is being dropped ends with the whole timeline and in the seen
// index, in every order: back at each step of the drop, and back at the
// same moment, many times over.
func TestIdleHomeDropRacesReturn(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	week := 7 * 24 * time.Hour
	db := newTestDB(t, Options{Now: clock.Now, InactiveAfter: week, HomeCap: 20, AsyncFanOut: true})
	ctx := context.Background()
	author := mustSignup(t, db, "author").ID
	away := mustSignup(t, db, "away").ID
	mustFollow(t, db, away, author)
	// Only away's home is in play.
	db.client.ZRem(ctx, seenIndexKey(db.fanOutShard(author)), author)
	var all []string // newest first, what away's home must show
	post := func(by, body string) {
		all = append([]string{mustCreatePost(t, db, by, body).ID}, all...)
	}
	post(away, "away's own")
	post(author, "first")

	// Back at each step of a drop: between the read of the index and the
	// drop, nothing is dropped; between the drop and the update of the
	// index, the rebuild brings back everything and the user stays indexed.
	for _, step := range []string{"read", "dropped"} {
		clock.Add(8 * 24 * time.Hour)
		post(author, "skipped before "+step)
		db.dropStep = func(at string) {
			if at == step {
				if err := db.Seen(ctx, away); err != nil {
					t.Error(err)
				}
			}
		}
		dropped, err := db.dropIdleHomes(ctx, clock.Now().Add(-week))
		db.dropStep = nil
		if err != nil || dropped != map[string]int{"read": 0, "dropped": 1}[step] {
			t.Fatalf("back at %q: dropIdleHomes = %d, %v", step, dropped, err)
		}
		if got := homeIDs(t, db, away); !slices.Equal(got, all) {
			t.Fatalf("back at %q: home = %v, want %v", step, got, all)
		}
		if !inSeenIndex(t, db, away) {
			t.Fatalf("back at %q: the user left the seen index", step)
		}
	}

	// At the same moment, with the return a little later or earlier each
	// round.
	drops := 0
	for round := range 30 {
		clock.Add(8 * 24 * time.Hour)
		post(author, "round "+strconv.Itoa(round))
		var wg sync.WaitGroup
		wg.Go(func() {
			n, err := db.dropIdleHomes(ctx, clock.Now().Add(-week))
			if err != nil {
				t.Error(err)
			}
			drops += n
		})
		wg.Go(func() {
			time.Sleep(time.Duration(round%10) * 100 * time.Microsecond)
			if err := db.Seen(ctx, away); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		// Past its cap of 20 a home page goes on by pull: read to the
		// end, the timeline is all of it.
		if got := homeIDs(t, db, away); !slices.Equal(got, all) {
			t.Fatalf("round %d: home of a user back while it was dropped = %v, want %v", round, got, all)
		}
		if !inSeenIndex(t, db, away) {
			t.Fatalf("round %d: a user back while their home was dropped left the seen index", round)
		}
	}
	t.Logf("the drop came first in %d of 30 rounds", drops)
}

// TestWorkersDropIdleHomes: the sweeping fan-out worker drops idle home
// timelines by itself.
func TestWorkersDropIdleHomes(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newTestDB(t, Options{Now: clock.Now, AsyncFanOut: true})
	ctx := context.Background()
	author := mustSignup(t, db, "author").ID
	away := mustSignup(t, db, "away").ID
	mustFollow(t, db, away, author)
	mustCreatePost(t, db, author, "hello")
	clock.Add(DefaultInactiveAfter + time.Hour)

	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		NewWorker(db, WorkerOptions{Sweep: true}).Run(wctx)
		close(done)
	}()
	defer func() { stop(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for db.client.Exists(ctx, homeKey(away)).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeping worker did not drop an idle home timeline in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReturningUserHomeReadWithTheSession: the home page of a user who
// comes back after a week away, read ahead with the session by the request
// that finds them inactive, has the posts that fan-out skipped: the read
// made before the rebuild is not used.
func TestReturningUserHomeReadWithTheSession(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db := newTestDB(t, Options{Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour})
	auth := NewAuthService(db)
	ctx := context.Background()
	author := mustSignup(t, db, "author").ID
	away := mustSignupSession(t, auth, "away")
	mustFollow(t, db, away.User.ID, author)
	before := mustCreatePost(t, db, author, "while they read")
	clock.Add(8 * 24 * time.Hour)
	missed := mustCreatePost(t, db, author, "while they were away")
	if holding(t, db, []string{away.User.ID}, missed.ID) != 0 {
		t.Fatal("fan-out delivered a post to a follower away for 8 days")
	}

	page := warble.PageArgs{First: 10}
	c, _, _, err := auth.AuthenticateForHome(ctx, away.Token, page)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := NewPostService(db).FindTimeline(c, warble.HomeFeed(away.User.ID), page)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range tl.Edges {
		got = append(got, e.Node.ID)
	}
	if want := []string{missed.ID, before.ID}; !slices.Equal(got, want) {
		t.Fatalf("home page of a returning user = %v, want %v", got, want)
	}
}
