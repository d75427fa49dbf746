package redisdb

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// TestHubWaves has more subscribers on one channel than a wave delivers
// at once, half of them taking their events through a receiver, while
// posts come one after another: every subscriber gets every post, once,
// in order.
func TestHubWaves(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	n := 3*waveWidth + 5
	const posts = 20

	type reader struct {
		mu  sync.Mutex
		got []*warble.TimelineEvent
	}
	var readers []*reader
	var receivers []*takingReceiver
	for i := range n {
		if i%2 == 0 {
			tr := &takingReceiver{t: t, closed: make(chan struct{})}
			ctx, cancel := context.WithCancel(warble.NewContextWithEventReceiver(context.Background(), tr))
			t.Cleanup(cancel)
			if _, err := h.SubscribeTimeline(ctx, warble.GlobalFeed(), nil); err != nil {
				t.Fatal(err)
			}
			receivers = append(receivers, tr)
			continue
		}
		r := &reader{}
		readers = append(readers, r)
		events := mustSubscribe(t, h, warble.GlobalFeed(), nil)
		go func() {
			for ev := range events {
				r.mu.Lock()
				r.got = append(r.got, ev)
				r.mu.Unlock()
			}
		}()
	}
	var want []*warble.Post
	for i := range posts {
		want = append(want, mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i)))
	}

	check := func(who string, got []*warble.TimelineEvent) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s got %d events, want %d", who, len(got), len(want))
		}
		for i, ev := range got {
			wantAdded(t, ev, want[i])
		}
	}
	waitFor(t, "every subscriber has every post", func() bool {
		for _, r := range readers {
			r.mu.Lock()
			k := len(r.got)
			r.mu.Unlock()
			if k < posts {
				return false
			}
		}
		for _, tr := range receivers {
			if len(tr.taken()) < posts {
				return false
			}
		}
		return true
	})
	time.Sleep(50 * time.Millisecond) // room for an event too many to show
	for i, r := range readers {
		r.mu.Lock()
		got := r.got
		r.mu.Unlock()
		check("subscriber "+strconv.Itoa(i), got)
	}
	for i, tr := range receivers {
		check("receiver "+strconv.Itoa(i), tr.taken())
	}
}

// stalledReceiver is a warble.EventReceiver whose client stopped reading:
// EventReady takes the event and then blocks, as a write to that client
// would, until release is closed.
type stalledReceiver struct {
	takingReceiver
	release chan struct{}
}

func (r *stalledReceiver) EventReady(ev *warble.TimelineEvent) {
	r.takingReceiver.EventReady(ev)
	<-r.release
}

// TestHubStalledSubscriber fills a channel's wave with subscribers whose
// receivers block: a subscriber of the same channel that reads still gets
// each post, and once released, the stalled ones get theirs too, in
// order, none lost.
func TestHubStalledSubscriber(t *testing.T) {
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // before the hub closes: Close waits for them

	var stalled []*stalledReceiver
	for range waveWidth {
		r := &stalledReceiver{
			takingReceiver: takingReceiver{t: t, closed: make(chan struct{})},
			release:        release,
		}
		ctx, cancel := context.WithCancel(warble.NewContextWithEventReceiver(context.Background(), r))
		t.Cleanup(cancel)
		if _, err := h.SubscribeTimeline(ctx, warble.GlobalFeed(), nil); err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, r)
	}
	reading := mustSubscribe(t, h, warble.GlobalFeed(), nil)

	// The first post may find the reading subscriber in the first wave,
	// before the stalled ones have stalled; the second finds every
	// stalled one blocked in its receiver.
	var posts []*warble.Post
	for i := range 2 {
		p := mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i))
		posts = append(posts, p)
		wantAdded(t, nextEvent(t, reading), p)
	}

	releaseOnce()
	for i, r := range stalled {
		waitFor(t, "a released subscriber's events", func() bool { return len(r.taken()) == len(posts) })
		for j, ev := range r.taken() {
			if ev.Kind != warble.PostAdded || *ev.PostID != posts[j].ID {
				t.Fatalf("stalled subscriber %d: event %d is %s %v, want POST_ADDED of %s", i, j, ev.Kind, ev.PostID, posts[j].ID)
			}
		}
	}
}

// TestHubHomeAddedOutOfOrder adds a post to a live home timeline after a
// newer one, as two racing fan-outs may, each add announced as fan-out
// announces it: the subscriber never gets a POST_ADDED below one it got,
// and gets the older post in order or a RESYNC; posts after it arrive.
func TestHubHomeAddedOutOfOrder(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	cat := mustSignup(t, db, "cat")
	mustFollow(t, db, bob.ID, ada.ID)
	events := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)

	first := mustCreatePost(t, db, ada.ID, "first")
	wantAdded(t, nextEvent(t, events), first)
	older := mustCreatePost(t, db, cat.ID, "older")
	newer := mustCreatePost(t, db, cat.ID, "newer")
	for _, p := range []*warble.Post{newer, older} {
		if err := db.client.ZAdd(ctx, homeKey(bob.ID), redis.Z{Score: float64(p.Seq), Member: p.ID}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := db.publish(ctx, db.client, homeChannel(bob.ID), encodeAdded(p.Seq, p.ID)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	last := mustCreatePost(t, db, ada.ID, "last")

	prev := first.Seq
	var gotOlder, resync bool
	for {
		ev := nextEvent(t, events)
		if ev.Kind == warble.Resync {
			resync = true
			continue
		}
		seq := eventSeq(t, ev)
		if ev.Kind != warble.PostAdded || seq <= prev {
			t.Fatalf("got %s at %d after POST_ADDED at %d", ev.Kind, seq, prev)
		}
		prev = seq
		gotOlder = gotOlder || seq == older.Seq
		if seq == last.Seq {
			break
		}
	}
	if !gotOlder && !resync {
		t.Error("the older post came neither in order nor as a RESYNC")
	}
}
