package redisdb

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// TestHubHomeFollowCutShort leaves a follow after its backfill, before its
// RESYNC, as a crash (or a PUBLISH that failed, which Follow only logs)
// would, and repairs it by following again, with the follower's home
// timeline live: the followee's post that the backfill added, newer than
// anything the live channel had dispatched, must reach the subscriber, as
// a POST_ADDED in order or a RESYNC, by the time a later post arrives.
func TestHubHomeFollowCutShort(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	cat := mustSignup(t, db, "cat")
	mustFollow(t, db, bob.ID, cat.ID)
	events := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)
	first := mustCreatePost(t, db, cat.ID, "first")
	wantAdded(t, nextEvent(t, events), first)
	backfilled := mustCreatePost(t, db, ada.ID, "backfilled") // bob does not follow ada yet

	// Follow's steps up to its backfill, and no further.
	at := msString(db.now())
	if err := db.client.ZAdd(ctx, followingKey(bob.ID), redis.Z{Score: parseReplyScore(at), Member: ada.ID}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := follows.mirrorFollow(ctx, bob.ID, ada.ID, true, at, ""); err != nil {
		t.Fatal(err)
	}
	if added, _, err := follows.backfill(ctx, bob.ID, ada.ID); err != nil || added != 1 {
		t.Fatalf("backfill = %d, %v; want 1 post added", added, err)
	}
	// The user follows again, which repairs a follow cut short.
	mustFollow(t, db, bob.ID, ada.ID)

	last := mustCreatePost(t, db, cat.ID, "last")
	added, resync := homeEventsUntil(t, events, last.ID)
	if !slices.Contains(added, backfilled.ID) && !resync {
		t.Errorf("post %s, added to the live home timeline by the follow's backfill, never came: neither as POST_ADDED nor as a RESYNC", backfilled.ID)
	}
}

// TestHubHomeUnfollowCutShort leaves an unfollow after it took the
// followee's posts off the follower's home timeline, before its RESYNC, as
// a crash (or a PUBLISH that failed, which Unfollow only logs) would, and
// repairs it by unfollowing again, with the follower's home timeline live:
// the subscriber, who got the followee's post live, must hear that it is
// gone, by a RESYNC, by the time a later post arrives.
func TestHubHomeUnfollowCutShort(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	h := newTestHub(t, db)
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	cat := mustSignup(t, db, "cat")
	mustFollow(t, db, bob.ID, ada.ID)
	mustFollow(t, db, bob.ID, cat.ID)
	events := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)
	removed := mustCreatePost(t, db, ada.ID, "taken off by the unfollow")
	wantAdded(t, nextEvent(t, events), removed)

	// Unfollow's steps up to taking ada's posts off, and no further.
	unfollowSides(t, db, follows, bob.ID, ada.ID)
	if n, err := follows.unbackfill(ctx, bob.ID, ada.ID, true); err != nil || n != 1 {
		t.Fatalf("unbackfill = %d, %v; want 1 post taken off", n, err)
	}
	// The user unfollows again, which repairs an unfollow cut short.
	if err := follows.Unfollow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}

	last := mustCreatePost(t, db, cat.ID, "last")
	if _, resync := homeEventsUntil(t, events, last.ID); !resync {
		t.Errorf("post %s, taken off the live home timeline by the unfollow, stays on the subscriber's screen: no RESYNC came", removed.ID)
	}
}

// TestHubHomeUnfollowPulledCutShort is TestHubHomeUnfollowCutShort for a
// pulled followee, whose posts are in no home timeline, so that the
// unfollow takes nothing off: left before its RESYNC, as a crash (or a
// PUBLISH that failed) would, and repaired by unfollowing again, which
// finds the follow gone, the live home timeline must stop routing the
// followee's posts, which only a RESYNC makes it read again.
func TestHubHomeUnfollowPulledCutShort(t *testing.T) {
	db, follows, bob, celeb, events := livePulledFollow(t)
	// Unfollow's steps before its RESYNC.
	unfollowSides(t, db, follows, bob, celeb)
	// The user unfollows again, which repairs an unfollow cut short.
	if err := follows.Unfollow(context.Background(), bob, celeb); err != nil {
		t.Fatal(err)
	}

	late := mustCreatePost(t, db, celeb, "after the unfollow")
	own := mustCreatePost(t, db, bob, "bob's own")
	added, resync := homeEventsUntil(t, events, own.ID)
	if slices.Contains(added, late.ID) {
		t.Fatalf("post %s of an account bob no longer follows came live on his home timeline", late.ID)
	}
	if !resync {
		t.Error("no RESYNC after the repeated unfollow: the live home timeline would go on routing the account")
	}
}

// TestHubHomeRoutedBeforeResync has a pulled account post after an
// unfollow whose RESYNC the follower's live home timeline has not handled
// yet (on a Redis Cluster it comes on another master's connection than
// the post's routed message, so it may be handled later; here the unfollow
// stops before it): the channel still routes the account's posts, and the
// post must not come all the same.
func TestHubHomeRoutedBeforeResync(t *testing.T) {
	db, follows, bob, celeb, events := livePulledFollow(t)
	unfollowSides(t, db, follows, bob, celeb)
	late := mustCreatePost(t, db, celeb, "after the unfollow")
	own := mustCreatePost(t, db, bob, "bob's own")
	if added, _ := homeEventsUntil(t, events, own.ID); slices.Contains(added, late.ID) {
		t.Fatalf("post %s of an account bob no longer follows came live on his home timeline", late.ID)
	}
}

// livePulledFollow has bob follow celeb, a pulled account (PullThreshold
// 1, and another follower), and listen to his home timeline, which has
// shown one of celeb's posts live. It returns bob's and celeb's ids and
// the home timeline's events.
func livePulledFollow(t *testing.T) (*DB, *FollowService, string, string, <-chan *warble.TimelineEvent) {
	t.Helper()
	db := newTestDB(t, Options{PullThreshold: 1})
	h := newTestHub(t, db)
	bob := mustSignup(t, db, "bob")
	other := mustSignup(t, db, "other")
	celeb := mustSignup(t, db, "celeb")
	mustFollow(t, db, bob.ID, celeb.ID)
	mustFollow(t, db, other.ID, celeb.ID)
	mustCreatePost(t, db, celeb.ID, "pulled from now on")
	events := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)
	routed := mustCreatePost(t, db, celeb.ID, "routed")
	wantAdded(t, nextEvent(t, events), routed)
	return db, NewFollowService(db), bob.ID, celeb.ID, events
}

// heldRead makes the first command named name whose first key is key wait,
// once armed, until release is called; entered is closed when it does.
type heldRead struct {
	name, key string
	armed     atomic.Bool
	entered   chan struct{}
	gate      chan struct{}
	once      sync.Once
}

func (h *heldRead) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 1 && cmd.Name() == h.name && args[1] == h.key && h.armed.CompareAndSwap(true, false) {
			h.once.Do(func() { close(h.entered) })
			<-h.gate
		}
		return next(ctx, cmd)
	}
}

func (h *heldRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestHubHomeUnfollowedPulledPost unfollows a pulled account while the
// follower's home timeline is live, and has the account post while the
// home channel reads its routes again on the unfollow's RESYNC, so that
// the post's message, routed to the home channel before the routes
// change, is handled after they did: the post, of an account the user no
// longer follows, must not come live on their home timeline.
func TestHubHomeUnfollowedPulledPost(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{PullThreshold: 1})
	h := newTestHub(t, db)
	bob := mustSignup(t, db, "bob")
	other := mustSignup(t, db, "other")
	celeb := mustSignup(t, db, "celeb")
	mustFollow(t, db, bob.ID, celeb.ID)
	mustFollow(t, db, other.ID, celeb.ID)
	mustCreatePost(t, db, celeb.ID, "pulled from now on")
	events := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)
	routed := mustCreatePost(t, db, celeb.ID, "routed")
	wantAdded(t, nextEvent(t, events), routed)

	hold := &heldRead{name: "zmscore", key: followingKey(bob.ID), entered: make(chan struct{}), gate: make(chan struct{})}
	db.client.AddHook(hold)
	hold.armed.Store(true)
	defer hold.once.Do(func() {})
	if err := NewFollowService(db).Unfollow(ctx, bob.ID, celeb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hold.entered: // the home channel reads who bob follows among the pulled
	case <-time.After(eventWait):
		t.Fatal("the home channel did not read its routes again")
	}
	late := mustCreatePost(t, db, celeb.ID, "after the unfollow")
	h.mu.Lock()
	ch := h.channels[homeChannel(bob.ID)]
	h.mu.Unlock()
	for deadline := time.Now().Add(eventWait); ; time.Sleep(time.Millisecond) {
		ch.boxMu.Lock()
		n := len(ch.inbox)
		ch.boxMu.Unlock()
		if n > 0 {
			break // the post's message, routed while the read waits
		} else if time.Now().After(deadline) {
			t.Fatal("the post's message was not routed to the home channel")
		}
	}
	close(hold.gate)

	own := mustCreatePost(t, db, bob.ID, "bob's own")
	if added, _ := homeEventsUntil(t, events, own.ID); slices.Contains(added, late.ID) {
		t.Fatalf("post %s of an account bob no longer follows came live on his home timeline", late.ID)
	}
}

// unfollowSides runs the first two steps of an unfollow and no more: the
// follower's following set, the truth, then the followee's followers side.
func unfollowSides(t *testing.T, db *DB, follows *FollowService, followerID, followeeID string) {
	t.Helper()
	ctx := context.Background()
	if err := db.client.ZRem(ctx, followingKey(followerID), followeeID).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := follows.mirrorFollow(ctx, followerID, followeeID, false, "", ""); err != nil {
		t.Fatal(err)
	}
}

// homeEventsUntil reads a home timeline's events until the POST_ADDED of
// lastID, and returns the ids of the posts added, lastID's included, and
// whether a RESYNC came meanwhile. Any other kind of event fails the test.
func homeEventsUntil(t *testing.T, events <-chan *warble.TimelineEvent, lastID string) (added []string, resync bool) {
	t.Helper()
	for {
		ev := nextEvent(t, events)
		switch ev.Kind {
		case warble.Resync:
			resync = true
		case warble.PostAdded:
			added = append(added, *ev.PostID)
			if *ev.PostID == lastID {
				return added, resync
			}
		default:
			t.Fatalf("got %s", ev.Kind)
		}
	}
}
