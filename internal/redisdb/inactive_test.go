package redisdb

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

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
