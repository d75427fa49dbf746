package redisdb

import (
	"context"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// eventWait is how long a test waits for an event that must come. It is a
// deadline against hanging, not a measure of speed.
const eventWait = 5 * time.Second

// newTestHub returns a Hub over db, closed when tb ends.
func newTestHub(tb testing.TB, db *DB) *Hub {
	tb.Helper()
	h := NewHub(db)
	tb.Cleanup(func() { h.Close() })
	return h
}

// mustSubscribe subscribes to feed until tb ends.
func mustSubscribe(tb testing.TB, h *Hub, feed warble.Feed, after *string) <-chan *warble.TimelineEvent {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	events, err := h.SubscribeTimeline(ctx, feed, after)
	if err != nil {
		tb.Fatalf("SubscribeTimeline(%s): %v", feed, err)
	}
	return events
}

// nextEvent returns the next event of events, failing tb if none comes.
func nextEvent(tb testing.TB, events <-chan *warble.TimelineEvent) *warble.TimelineEvent {
	tb.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			tb.Fatal("subscription ended")
		}
		return ev
	case <-time.After(eventWait):
		tb.Fatal("no event came")
	}
	return nil
}

// eventSeq returns the seq an event's cursor encodes.
func eventSeq(tb testing.TB, ev *warble.TimelineEvent) int64 {
	tb.Helper()
	seq, err := warble.ParsePostCursor(ev.Cursor)
	if err != nil {
		tb.Fatalf("event %s has cursor %q: %v", ev.Kind, ev.Cursor, err)
	}
	return seq
}

// wantAdded checks that ev is the POST_ADDED of p, with its author.
func wantAdded(tb testing.TB, ev *warble.TimelineEvent, p *warble.Post) {
	tb.Helper()
	if ev.Kind != warble.PostAdded || ev.PostID == nil || *ev.PostID != p.ID || ev.Post == nil || ev.Post.ID != p.ID {
		tb.Fatalf("event = %s %v, want POST_ADDED of %s", ev.Kind, ev.PostID, p.ID)
	}
	if ev.Cursor != warble.PostCursor(p.Seq) {
		tb.Errorf("event cursor = %q, want the post's", ev.Cursor)
	}
	if ev.Post.Body != p.Body || ev.Post.Author == nil || ev.Post.Author.ID != p.AuthorID {
		tb.Errorf("event post = %+v, want %q with author %s", ev.Post, p.Body, p.AuthorID)
	}
}

// requireRealRedis skips tb on the embedded in-memory Redis (see
// redistest), which has no CLIENT LIST or CLIENT KILL and runs its
// connections as goroutines of the test process.
func requireRealRedis(tb testing.TB, db *DB) {
	tb.Helper()
	if err := db.client.Do(context.Background(), "client", "list").Err(); err != nil {
		tb.Skipf("needs a real redis-server: %v", err)
	}
}

// waitFor polls cond until it holds, failing tb after a generous deadline.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHubPostAdded(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)

	feeds := map[string]<-chan *warble.TimelineEvent{
		"Global":     mustSubscribe(t, h, warble.GlobalFeed(), nil),
		"User":       mustSubscribe(t, h, warble.UserFeed(ada.ID), nil),
		"AuthorHome": mustSubscribe(t, h, warble.HomeFeed(ada.ID), nil),
		"FollowHome": mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil),
	}
	p := mustCreatePost(t, db, ada.ID, "hello")
	for name, events := range feeds {
		t.Run(name, func(t *testing.T) { wantAdded(t, nextEvent(t, events), p) })
	}
}

// TestHubSharesAddedEvents checks that the channels a post reaches read it
// once between them: every channel hands out the same event, which the
// GraphQL layer then marshals once per selection.
func TestHubSharesAddedEvents(t *testing.T) {
	// Every channel reads the post within this, however slow the machine.
	age := sharedEventAge
	sharedEventAge = time.Minute
	t.Cleanup(func() { sharedEventAge = age })
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	feeds := []<-chan *warble.TimelineEvent{
		mustSubscribe(t, h, warble.GlobalFeed(), nil),
		mustSubscribe(t, h, warble.UserFeed(ada.ID), nil),
	}
	for _, name := range []string{"bob", "cyd", "dee"} {
		u := mustSignup(t, db, name)
		mustFollow(t, db, u.ID, ada.ID)
		feeds = append(feeds, mustSubscribe(t, h, warble.HomeFeed(u.ID), nil))
	}
	p := mustCreatePost(t, db, ada.ID, "once")
	first := nextEvent(t, feeds[0])
	wantAdded(t, first, p)
	for i, events := range feeds[1:] {
		if ev := nextEvent(t, events); ev != first {
			t.Errorf("channel %d: event %p (%+v), want the global channel's %p", i+1, ev, ev, first)
		}
	}
}

func TestHubPostRemoved(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	p := mustCreatePost(t, db, ada.ID, "soon gone")

	feeds := map[string]<-chan *warble.TimelineEvent{
		"Global":     mustSubscribe(t, h, warble.GlobalFeed(), nil),
		"User":       mustSubscribe(t, h, warble.UserFeed(ada.ID), nil),
		"AuthorHome": mustSubscribe(t, h, warble.HomeFeed(ada.ID), nil),
		"FollowHome": mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil),
	}
	if err := NewPostService(db).DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	for name, events := range feeds {
		t.Run(name, func(t *testing.T) {
			ev := nextEvent(t, events)
			if ev.Kind != warble.PostRemoved || ev.PostID == nil || *ev.PostID != p.ID || ev.Post != nil {
				t.Fatalf("event = %+v, want POST_REMOVED of %s", ev, p.ID)
			}
			if ev.Cursor != warble.PostCursor(p.Seq) {
				t.Errorf("cursor = %q, want the post's", ev.Cursor)
			}
		})
	}
}

func TestHubResyncOnFollow(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	p := mustCreatePost(t, db, ada.ID, "before the follow")
	events := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)

	mustFollow(t, db, bob.ID, ada.ID)
	ev := nextEvent(t, events)
	if ev.Kind != warble.Resync || ev.Cursor != warble.PostCursor(p.Seq) {
		t.Fatalf("event = %s %q, want RESYNC at the post's cursor", ev.Kind, ev.Cursor)
	}
	// Live events go on after it.
	q := mustCreatePost(t, db, ada.ID, "after the follow")
	wantAdded(t, nextEvent(t, events), q)
}

// TestHubResume subscribes with after while another goroutine keeps
// posting: the events must be exactly the posts after the cursor, in
// order, with none skipped or repeated between the replay and live.
func TestHubResume(t *testing.T) {
	for _, tt := range []struct {
		name string
		feed func(author string) warble.Feed
	}{
		{"Global", func(string) warble.Feed { return warble.GlobalFeed() }},
		{"User", warble.UserFeed},
		{"Home", warble.HomeFeed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db := newTestDB(t, Options{})
			h := newTestHub(t, db)
			ada := mustSignup(t, db, "ada")
			const before, k, during = 30, 12, 60
			var seqs []int64
			for i := range before {
				seqs = append(seqs, mustCreatePost(t, db, ada.ID, "before "+strconv.Itoa(i)).Seq)
			}

			// Taken before the posts during the subscription start: their
			// goroutine appends to seqs.
			after := warble.PostCursor(seqs[k-1])
			var wg sync.WaitGroup
			var mu sync.Mutex
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range during {
					p, err := NewPostService(db).CreatePost(context.Background(), ada.ID, "during "+strconv.Itoa(i))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					seqs = append(seqs, p.Seq)
					mu.Unlock()
				}
			}()
			events := mustSubscribe(t, h, tt.feed(ada.ID), &after)
			wg.Wait()

			mu.Lock()
			want := slices.Clone(seqs[k:])
			mu.Unlock()
			var got []int64
			for len(got) < len(want) {
				ev := nextEvent(t, events)
				if ev.Kind != warble.PostAdded {
					t.Fatalf("after %d events: %s, want only POST_ADDED", len(got), ev.Kind)
				}
				got = append(got, eventSeq(t, ev))
			}
			if !slices.Equal(got, want) {
				t.Errorf("events %v,\nwant %v", got, want)
			}
		})
	}
}

// TestHubResumeTooOld subscribes with a cursor older than what a capped
// timeline still holds: it starts with a RESYNC, then goes on live.
func TestHubResumeTooOld(t *testing.T) {
	db := newTestDB(t, Options{GlobalCap: 5, HomeCap: 5})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	var posts []*warble.Post
	for i := range 10 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i)))
	}
	after := warble.PostCursor(posts[2].Seq)
	for _, feed := range []warble.Feed{warble.GlobalFeed(), warble.HomeFeed(ada.ID)} {
		t.Run(feed.String(), func(t *testing.T) {
			events := mustSubscribe(t, h, feed, &after)
			ev := nextEvent(t, events)
			if ev.Kind != warble.Resync || ev.Cursor != warble.PostCursor(posts[len(posts)-1].Seq) {
				t.Fatalf("first event = %s %q, want RESYNC at the newest post", ev.Kind, ev.Cursor)
			}
		})
	}
	// The user's own posts are never capped: the same cursor replays.
	events := mustSubscribe(t, h, warble.UserFeed(ada.ID), &after)
	for _, p := range posts[3:] {
		wantAdded(t, nextEvent(t, events), p)
	}
	p := mustCreatePost(t, db, ada.ID, "live")
	wantAdded(t, nextEvent(t, events), p)
}

func TestHubBadSubscription(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	bad := "not a cursor"
	if _, err := h.SubscribeTimeline(context.Background(), warble.GlobalFeed(), &bad); warble.ErrorCode(err) != warble.EINVALID {
		t.Errorf("malformed after: err = %v, want EINVALID", err)
	}
	if _, err := h.SubscribeTimeline(context.Background(), warble.HomeFeed("x"), nil); err == nil {
		t.Error("home timeline of a malformed user id: no error")
	}
	h.mu.Lock()
	n := len(h.channels)
	h.mu.Unlock()
	if n != 0 {
		t.Errorf("hub has %d channels after failed subscriptions, want 0", n)
	}
}

// TestHubOrder posts from several goroutines at once, so that messages can
// publish out of seq order; a subscriber must still see POST_ADDED cursors
// increase.
func TestHubOrder(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	var authors []*warble.User
	for _, name := range []string{"ada", "bob", "cat", "dan"} {
		authors = append(authors, mustSignup(t, db, name))
	}
	events := mustSubscribe(t, h, warble.GlobalFeed(), nil)
	const each = 25
	var wg sync.WaitGroup
	for _, a := range authors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := NewPostService(db).CreatePost(context.Background(), a.ID, "post "+strconv.Itoa(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	last := mustCreatePost(t, db, authors[0].ID, "the end")

	var prev int64
	for {
		ev := nextEvent(t, events)
		seq := eventSeq(t, ev)
		if ev.Kind == warble.PostAdded {
			if seq <= prev {
				t.Fatalf("POST_ADDED at %d after %d", seq, prev)
			}
			prev = seq
		}
		if seq == last.Seq {
			return
		}
	}
}

// TestHubSlowConsumer leaves one subscriber unread while more posts than
// its buffer arrive: it gets a RESYNC, and another subscriber gets every
// post.
func TestHubSlowConsumer(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	slow := mustSubscribe(t, h, warble.GlobalFeed(), nil)
	fast := mustSubscribe(t, h, warble.GlobalFeed(), nil)

	var posts []*warble.Post
	for i := range subscriberBuffer + 20 {
		p := mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i))
		posts = append(posts, p)
		wantAdded(t, nextEvent(t, fast), p)
	}
	last := posts[len(posts)-1]
	resyncs := 0
	for {
		ev := nextEvent(t, slow)
		if ev.Kind == warble.Resync {
			resyncs++
		}
		if ev.Kind == warble.PostAdded && *ev.PostID == last.ID {
			break
		}
	}
	if resyncs != 1 {
		t.Errorf("slow subscriber got %d RESYNCs, want 1", resyncs)
	}
}

// TestHubCloseEndsIdleSubscriptions closes the hub under subscriptions
// that have nothing to deliver: each one's channel closes.
func TestHubCloseEndsIdleSubscriptions(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	subs := []<-chan *warble.TimelineEvent{
		mustSubscribe(t, h, warble.GlobalFeed(), nil),
		mustSubscribe(t, h, warble.UserFeed(ada.ID), nil),
		mustSubscribe(t, h, warble.HomeFeed(ada.ID), nil),
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	for i, events := range subs {
		select {
		case ev, ok := <-events:
			if ok {
				t.Errorf("subscription %d: got %+v after Close, want its channel closed", i, ev)
			}
		case <-time.After(10 * time.Second): // a safety net, not a speed bound
			t.Fatalf("subscription %d is still open after Close", i)
		}
	}
}

// TestHubSubscriptionsEnd opens and ends many subscriptions: every
// goroutine they started ends, and the hub unsubscribes from every channel.
func TestHubSubscriptionsEnd(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	requireRealRedis(t, db)
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	// Warm up: the first subscription makes the pools' connections.
	warm, stop := context.WithCancel(ctx)
	if _, err := h.SubscribeTimeline(warm, warble.GlobalFeed(), nil); err != nil {
		t.Fatal(err)
	}
	stop()
	waitFor(t, "the warm-up to end", func() bool { return hubChannels(h) == 0 })
	baseline := runtime.NumGoroutine()

	subCtx, cancel := context.WithCancel(ctx)
	var subs []<-chan *warble.TimelineEvent
	for i := range 200 {
		var feed warble.Feed
		switch i % 4 {
		case 0:
			feed = warble.GlobalFeed()
		case 1:
			feed = warble.UserFeed(ada.ID)
		case 2:
			feed = warble.HomeFeed(strconv.Itoa(1000 + i))
		case 3:
			feed = warble.UserFeed(strconv.Itoa(1000 + i))
		}
		after := warble.PostCursor(0)
		var afterp *string
		if i%5 == 0 {
			afterp = &after
		}
		events, err := h.SubscribeTimeline(subCtx, feed, afterp)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, events)
	}
	if n := hubChannels(h); n != 2+100 {
		t.Errorf("hub has %d channels, want 102", n)
	}
	// Idle subscriptions and idle channels hold no goroutine of their
	// own (at 10,000 sockets, one per subscription was a fifth of the
	// server's goroutines, and one per home channel 8 KB of stack per
	// signed-in subscriber); on a cluster the pub/sub connections to the
	// other masters have a few.
	waitFor(t, "the replays to be delivered", func() bool { return runtime.NumGoroutine() <= baseline+20 })
	p := mustCreatePost(t, db, ada.ID, "to all")
	wantAdded(t, nextEvent(t, subs[0]), p)
	cancel()
	for _, events := range subs {
		for range events { // drain until the pump closes it
		}
	}

	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= baseline })
	// The hub's own channels stay: on a cluster serverChannels lists the
	// shard channels alone, and the post cache's is classic.
	own := []string{pullChannel, revokedChannel}
	if !db.sharded {
		own = []string{postsGoneChannel, pullChannel, revokedChannel}
	}
	waitFor(t, "Redis to drop the channels", func() bool {
		return slices.Equal(serverChannels(t, db), own)
	})
	// The hub forgets each UNSUBSCRIBE once Redis confirms it.
	waitFor(t, "the hub to hold no channels and no pending commands", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		pending := 0
		for _, c := range append(slices.Collect(maps.Values(h.conns)), h.single) {
			if c != nil {
				pending += len(c.pending)
			}
		}
		return len(h.channels) == 0 && pending == 0
	})
}

// hubChannels returns how many channels h is subscribed to.
func hubChannels(h *Hub) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.channels)
}

// TestHubOneConnection checks that all subscriptions share one pub/sub
// connection: on a cluster, one per master at most, on which Redis counts
// each channel once.
func TestHubOneConnection(t *testing.T) {
	db := newTestDB(t, Options{})
	requireRealRedis(t, db)
	h := newTestHub(t, db)
	for i := range 20 {
		mustSubscribe(t, h, warble.UserFeed(strconv.Itoa(1+i%10)), nil)
	}
	mustSubscribe(t, h, warble.GlobalFeed(), nil)
	conns := pubsubConns(t, db)
	total := 0
	for addr, n := range conns {
		if n > 1 {
			t.Errorf("%d pub/sub connections to %s, want at most 1", n, addr)
		}
		total += n
	}
	if !db.sharded && total != 1 {
		t.Errorf("%d pub/sub connections, want 1", total)
	}
	if db.sharded && (total < 2 || total > len(conns)) {
		// The 11 channels and the hub's own fall on more than one master.
		t.Errorf("%d pub/sub connections to %d nodes, want one to each master that has channels", total, len(conns))
	}
	for _, ch := range []string{globalChannel, userChannel("1"), userChannel("7"), revokedChannel, pullChannel} {
		if n := numSub(t, db, ch); n != 1 {
			t.Errorf("%s has %d subscribers on Redis, want 1", ch, n)
		}
	}
}

func TestHubWatchSession(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)

	revoked, _ := h.WatchSession(ctx, "abc")
	parent, cancelParent := context.WithCancel(ctx)
	other, _ := h.WatchSession(parent, "def")
	if err := db.publish(ctx, db.client, revokedChannel, "abc").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-revoked.Done():
	case <-time.After(eventWait):
		t.Fatal("revoked session's context not cancelled")
	}
	if other.Err() != nil {
		t.Error("another session's context was cancelled")
	}
	cancelParent()
	<-other.Done()
	waitFor(t, "the watches to go", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.sessions) == 0
	})

	// Through the real logout.
	auth := NewAuthService(db)
	payload, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	_, sess, err := auth.Authenticate(ctx, payload.Token)
	if err != nil {
		t.Fatal(err)
	}
	watched, _ := h.WatchSession(ctx, sess.TokenHash)
	events, err := h.SubscribeTimeline(watched, warble.HomeFeed(sess.UserID), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.Logout(ctx, sess); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-events:
		if ok {
			t.Fatal("event after logout, want the subscription to end")
		}
	case <-time.After(eventWait):
		t.Fatal("subscription did not end at logout")
	}
}

// TestHubReconnect kills the hub's pub/sub connection on the Redis side:
// go-redis reconnects, and the subscribers, who may have lost messages,
// get a RESYNC, then live events again.
func TestHubReconnect(t *testing.T) {
	db := newTestDB(t, Options{})
	requireRealRedis(t, db)
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	p := mustCreatePost(t, db, ada.ID, "before")
	global := mustSubscribe(t, h, warble.GlobalFeed(), nil)
	user := mustSubscribe(t, h, warble.UserFeed(ada.ID), nil)

	if err := killPubsubConns(db); err != nil {
		t.Fatal(err)
	}
	for _, events := range []<-chan *warble.TimelineEvent{global, user} {
		ev := nextEvent(t, events)
		if ev.Kind != warble.Resync || ev.Cursor != warble.PostCursor(p.Seq) {
			t.Fatalf("event = %s %q, want RESYNC at the newest post", ev.Kind, ev.Cursor)
		}
	}
	q := mustCreatePost(t, db, ada.ID, "after")
	wantAdded(t, nextEvent(t, global), q)
	wantAdded(t, nextEvent(t, user), q)
}

// TestHubReconnectChecksSessions ends the watches of sessions that went
// away while the pub/sub connection was down, whose revocations it missed,
// and keeps the others.
func TestHubReconnectChecksSessions(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	requireRealRedis(t, db)
	h := newTestHub(t, db)
	auth := NewAuthService(db)
	var watched []context.Context
	for _, name := range []string{"ada", "bob"} {
		p, err := auth.Signup(ctx, warble.SignupInput{Username: name, Password: "password123"})
		if err != nil {
			t.Fatal(err)
		}
		w, _ := h.WatchSession(ctx, hashToken(p.Token))
		watched = append(watched, w)
		if name == "ada" {
			// Gone without an announcement, as when a logout's
			// PUBLISH is sent while the connection is down.
			if err := db.client.Del(ctx, sessionKeyOf(hashToken(p.Token))).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Sessions of tokens of the old form, kept elsewhere: one of them gone.
	for i, name := range []string{"ada", "bob"} {
		id := db.client.Get(ctx, usernameKey(name)).Val()
		hash := hashToken(oldSession(t, db, id, time.Hour))
		w, _ := h.WatchSession(ctx, hash)
		watched = append(watched, w)
		if i == 0 {
			if err := db.client.Del(ctx, legacySessionKey(hash)).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := killPubsubConns(db); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 2} {
		select {
		case <-watched[i].Done():
		case <-time.After(eventWait):
			t.Fatalf("session %d went away but is still watched after the reconnect", i)
		}
	}
	// Once the check has run, the others are known to have passed it.
	waitFor(t, "the check to end", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.sessions) == 2
	})
	for _, i := range []int{1, 3} {
		if watched[i].Err() != nil {
			t.Errorf("session %d exists but was ended by the reconnect", i)
		}
	}
}

// TestHubRedisRestart kills redis-server under a hub and starts it again
// empty, as a Redis without persistence comes back from a crash: its
// sequences start again from 1. Open subscriptions get a RESYNC, then the
// new posts as POST_ADDED, though their seqs were dispatched before; a
// session that was lost ends its watch; a subscription that needs Redis to
// start fails while Redis is down instead of waiting for it.
func TestHubRedisRestart(t *testing.T) {
	if os.Getenv("REDIS_URL") != "" {
		t.Skip("needs a redis-server that the test can stop and restart")
	}
	ctx := context.Background()
	srv := redistest.New(t)
	if srv.Embedded() {
		t.Skip("needs a redis-server: the embedded Redis keeps its data over a restart")
	}
	db := NewDB(srv.Client(t), Options{BcryptCost: bcrypt.MinCost})
	h := newTestHub(t, db)
	signup, err := NewAuthService(db).Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	ada := signup.User
	var posts []*warble.Post
	for range 3 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, "before"))
	}
	global := mustSubscribe(t, h, warble.GlobalFeed(), nil)
	user := mustSubscribe(t, h, warble.UserFeed(ada.ID), nil)
	// A resumed subscription has a floor: its replay's newest post.
	after := warble.PostCursor(posts[0].Seq)
	resumed := mustSubscribe(t, h, warble.GlobalFeed(), &after)
	wantAdded(t, nextEvent(t, resumed), posts[1])
	wantAdded(t, nextEvent(t, resumed), posts[2])
	// Messages of these posts reach the channels' recent seqs.
	live := mustCreatePost(t, db, ada.ID, "live")
	for _, events := range []<-chan *warble.TimelineEvent{global, user, resumed} {
		wantAdded(t, nextEvent(t, events), live)
	}
	session, _ := h.WatchSession(ctx, hashToken(signup.Token))

	srv.Stop(t)
	subCtx, cancel := context.WithTimeout(ctx, eventWait)
	_, err = h.SubscribeTimeline(subCtx, warble.HomeFeed(ada.ID), nil)
	if err == nil || subCtx.Err() != nil {
		t.Fatalf("SubscribeTimeline with Redis down: %v, want it to fail before the test's deadline", err)
	}
	cancel()
	srv.Restart(t)

	for _, events := range []<-chan *warble.TimelineEvent{global, user, resumed} {
		if ev := nextEvent(t, events); ev.Kind != warble.Resync || ev.Cursor != warble.PostCursor(0) {
			t.Fatalf("event after the restart = %s %q, want RESYNC at the empty timeline's start", ev.Kind, ev.Cursor)
		}
	}
	select {
	case <-session.Done():
	case <-time.After(eventWait):
		t.Fatal("a session lost with Redis's data is still watched")
	}

	again := mustSignup(t, db, "ada")
	p := mustCreatePost(t, db, again.ID, "after")
	if again.ID != ada.ID || p.Seq > live.Seq {
		t.Fatalf("after the restart: user %s, post seq %d; the test needs ids and seqs that were used before", again.ID, p.Seq)
	}
	for _, events := range []<-chan *warble.TimelineEvent{global, user, resumed} {
		wantAdded(t, nextEvent(t, events), p)
	}
	home := mustSubscribe(t, h, warble.HomeFeed(again.ID), nil)
	q := mustCreatePost(t, db, again.ID, "home")
	wantAdded(t, nextEvent(t, home), q)
}

func TestHubClose(t *testing.T) {
	db := newTestDB(t, Options{})
	h := NewHub(db)
	events, err := h.SubscribeTimeline(context.Background(), warble.GlobalFeed(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, ok := <-events; ok {
		t.Error("event after Close, want the channel closed")
	}
	if _, err := h.SubscribeTimeline(context.Background(), warble.GlobalFeed(), nil); err == nil {
		t.Error("SubscribeTimeline after Close: no error")
	}
}

// TestHubChurn subscribes to and leaves one channel over and over, with a
// reconnect in the middle, so that SUBSCRIBEs and UNSUBSCRIBEs of the
// channel are in flight together: every subscription must still start, and
// the last must get live events.
func TestHubChurn(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	requireRealRedis(t, db)
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	for i := range 200 {
		if i == 100 {
			if err := killPubsubConns(db); err != nil {
				t.Fatal(err)
			}
		}
		subCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		events, err := h.SubscribeTimeline(subCtx, warble.UserFeed(ada.ID), nil)
		if err != nil {
			t.Fatalf("subscription %d: %v", i, err)
		}
		cancel()
		for range events {
		}
	}
	events := mustSubscribe(t, h, warble.UserFeed(ada.ID), nil)
	p := mustCreatePost(t, db, ada.ID, "still live")
	for {
		ev := nextEvent(t, events)
		if ev.Kind == warble.Resync {
			continue // the reconnect's, if it came late
		}
		wantAdded(t, ev, p)
		break
	}
	waitFor(t, "Redis to hold one subscription to the channel", func() bool {
		return numSub(t, db, userChannel(ada.ID)) == 1
	})
}

// TestHubLateAdd plays the messages of posts that publish out of order:
// a pull dispatches every post newer than the last one in order, a message
// of a post it dispatched already is dropped, and a post that lands below
// what was dispatched becomes a RESYNC.
func TestHubLateAdd(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	events := mustSubscribe(t, h, warble.GlobalFeed(), nil)

	add := func(seq int64, publish bool) {
		t.Helper()
		id := ada.ID + ":" + strconv.FormatInt(seq, 10)
		db.client.HSet(ctx, postKey(ada.ID, strconv.FormatInt(seq, 10)), "body", "post", "createdAt", "1")
		db.client.ZAdd(ctx, globalKey, redis.Z{Score: float64(seq), Member: id})
		if publish {
			db.publish(ctx, db.client, globalChannel, encodeAdded(seq, id))
		}
	}
	add(101, false)
	add(102, true) // 102 publishes before 101
	for _, want := range []int64{101, 102} {
		if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || eventSeq(t, ev) != want {
			t.Fatalf("event = %s at %d, want POST_ADDED at %d", ev.Kind, eventSeq(t, ev), want)
		}
	}
	db.publish(ctx, db.client, globalChannel, encodeAdded(101, ada.ID+":101")) // dispatched already
	add(100, true)                                                             // too late
	add(103, true)
	if ev := nextEvent(t, events); ev.Kind != warble.Resync || eventSeq(t, ev) != 102 {
		t.Fatalf("event = %s at %d, want RESYNC at 102", ev.Kind, eventSeq(t, ev))
	}
	if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || eventSeq(t, ev) != 103 {
		t.Fatalf("event = %s at %d, want POST_ADDED at 103", ev.Kind, eventSeq(t, ev))
	}
}

// TestHubResumeFromAPostNotDispatchedYet: a subscription that resumes from
// the cursor of a post that its live channel has not dispatched yet (another
// listener keeps the channel, and the post's message is on its way) hears
// nothing of that post, which its client has, where it got a RESYNC at its
// own cursor. A post below the cursor that arrives then still gets a
// RESYNC: the client may never have seen it.
func TestHubResumeFromAPostNotDispatchedYet(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	add := func(seq int64, publish bool) {
		t.Helper()
		id := ada.ID + ":" + strconv.FormatInt(seq, 10)
		db.client.HSet(ctx, postKey(ada.ID, strconv.FormatInt(seq, 10)), "body", "post", "createdAt", "1")
		db.client.ZAdd(ctx, globalKey, redis.Z{Score: float64(seq), Member: id})
		if publish {
			db.publish(ctx, db.client, globalChannel, encodeAdded(seq, id))
		}
	}
	kept := mustSubscribe(t, h, warble.GlobalFeed(), nil)
	add(100, true)
	if ev := nextEvent(t, kept); eventSeq(t, ev) != 100 {
		t.Fatalf("kept: event = %s at %d, want 100", ev.Kind, eventSeq(t, ev))
	}

	add(102, false) // in the timeline, its message not handled yet
	after := warble.PostCursor(102)
	events := mustSubscribe(t, h, warble.GlobalFeed(), &after)
	db.publish(ctx, db.client, globalChannel, encodeAdded(102, ada.ID+":102"))
	add(103, true)
	if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || eventSeq(t, ev) != 103 {
		t.Fatalf("resumed from 102: event = %s at %d, want POST_ADDED at 103", ev.Kind, eventSeq(t, ev))
	}
	add(101, true) // below the cursor, landed late
	if ev := nextEvent(t, events); ev.Kind != warble.Resync || eventSeq(t, ev) != 103 {
		t.Fatalf("resumed from 102, then 101 landed: event = %s at %d, want RESYNC at 103", ev.Kind, eventSeq(t, ev))
	}
	for _, want := range []int64{102, 103} {
		if ev := nextEvent(t, kept); ev.Kind != warble.PostAdded || eventSeq(t, ev) != want {
			t.Fatalf("kept: event = %s at %d, want POST_ADDED at %d", ev.Kind, eventSeq(t, ev), want)
		}
	}
}

// takingReceiver is a warble.EventReceiver that takes each event from the
// subscription's channel in EventReady, as the websocket transport does,
// and fails if it has to wait for one, or finds another than it was told.
type takingReceiver struct {
	t        *testing.T
	events   <-chan *warble.TimelineEvent // set by Attached
	attached bool

	mu     sync.Mutex
	got    []*warble.TimelineEvent
	closed chan struct{} // closed when EventReady finds the channel closed
}

func (r *takingReceiver) Attached(events <-chan *warble.TimelineEvent) {
	r.attached = true
	r.events = events
}

func (r *takingReceiver) EventReady(want *warble.TimelineEvent) {
	select {
	case ev, ok := <-r.events:
		if !ok {
			if want != nil {
				r.t.Errorf("EventReady(%v) found the channel closed", want)
			}
			close(r.closed)
			return
		}
		if ev != want {
			r.t.Errorf("EventReady(%v) found %v in the channel", want, ev)
		}
		r.mu.Lock()
		r.got = append(r.got, ev)
		r.mu.Unlock()
	default:
		r.t.Error("EventReady with nothing waiting in the channel")
	}
}

func (r *takingReceiver) taken() []*warble.TimelineEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestHubHandsEventsToReceiver subscribes with an EventReceiver in the
// context: its EventReady finds each event already in the channel, replay
// first and in order, and finds the channel closed when the subscription
// ends.
func TestHubHandsEventsToReceiver(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	var posts []*warble.Post
	for i := range 3 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, "before "+strconv.Itoa(i)))
	}
	r := &takingReceiver{t: t, closed: make(chan struct{})}
	ctx, cancel := context.WithCancel(warble.NewContextWithEventReceiver(context.Background(), r))
	defer cancel()
	after := warble.PostCursor(posts[0].Seq)
	events, err := h.SubscribeTimeline(ctx, warble.GlobalFeed(), &after)
	if err != nil {
		t.Fatal(err)
	}
	if !r.attached {
		t.Fatal("SubscribeTimeline returned without calling Attached")
	}
	if cap(events) != 1 {
		t.Fatalf("channel capacity = %d, want 1", cap(events))
	}
	if r.events != events {
		t.Fatal("Attached was given another channel than SubscribeTimeline returned")
	}
	for i := range 5 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, "live "+strconv.Itoa(i)))
	}
	waitFor(t, "every event is taken", func() bool { return len(r.taken()) == len(posts)-1 })
	for i, ev := range r.taken() {
		wantAdded(t, ev, posts[i+1])
	}
	cancel()
	select {
	case <-r.closed:
	case <-time.After(eventWait):
		t.Fatal("no EventReady for the closed channel after the context ended")
	}
}

// TestHubRejoin leaves a channel and joins it again at once, over and
// over, as a reader who reloads a page does: each new subscription must
// start and get live events. Half the rounds first abandon a subscription
// before Redis confirms it (a socket that closes while it subscribes), so
// that its confirmation arrives after the channel was left, before or
// after the next subscription is made. On a cluster
// the user channel is one whose master carries no other channel of the
// hub, so that leaving it closes the connection and joining opens a new
// one; the global channel shares its connection with the hub's own.
func TestHubRejoin(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	loner := mustSignup(t, db, "loner")
	if db.sharded {
		loner = lonelyUser(t, db)
	}
	for _, feed := range []warble.Feed{warble.GlobalFeed(), warble.UserFeed(loner.ID)} {
		author := ada
		if feed.Kind == warble.FeedUser {
			author = loner
		}
		for i := range 40 {
			if i%2 == 1 {
				gone, cancel := context.WithCancel(ctx)
				cancel()
				// It fails, or, when its channel was ready as soon
				// as its context was done (a select picks either),
				// it ends at once: its events close.
				if events, err := h.SubscribeTimeline(gone, feed, nil); err == nil {
					for range events {
					}
				}
				if i%4 == 3 {
					// Its confirmations arrive before the next
					// subscription is made, not after.
					time.Sleep(20 * time.Millisecond)
				}
			}
			// A subscription that does not start fails when ctx ends,
			// instead of hanging the test.
			subCtx, cancel := context.WithTimeout(ctx, 2*eventWait)
			events, err := h.SubscribeTimeline(subCtx, feed, nil)
			if err != nil {
				cancel()
				t.Fatalf("%s round %d: %v", feed, i, err)
			}
			p := mustCreatePost(t, db, author.ID, "round "+strconv.Itoa(i))
			wantAdded(t, nextEvent(t, events), p)
			cancel()
			for range events {
			}
		}
	}
}

// lonelyUser signs up users on a cluster until one's user channel is served
// by a master that serves neither of the hub's own channels.
func lonelyUser(t *testing.T, db *DB) *warble.User {
	t.Helper()
	ctx := context.Background()
	cc := db.client.(*redis.ClusterClient)
	masterOf := func(channel string) string {
		t.Helper()
		m, err := cc.MasterForKey(ctx, channel)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	busy := map[string]bool{masterOf(revokedChannel): true, masterOf(pullChannel): true}
	for i := range 50 {
		u := mustSignup(t, db, "loner"+strconv.Itoa(i))
		if !busy[masterOf(userChannel(u.ID))] {
			return u
		}
	}
	t.Fatal("no user channel on a master without the hub's channels")
	return nil
}
