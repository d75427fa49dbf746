package redisdb

import (
	"context"
	"testing"

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
	if _, err := follows.mirrorFollow(ctx, bob.ID, ada.ID, true, at); err != nil {
		t.Fatal(err)
	}
	if added, _, err := follows.backfill(ctx, bob.ID, ada.ID); err != nil || added != 1 {
		t.Fatalf("backfill = %d, %v; want 1 post added", added, err)
	}
	// The user follows again, which repairs a follow cut short.
	mustFollow(t, db, bob.ID, ada.ID)

	last := mustCreatePost(t, db, cat.ID, "last")
	var got, resync bool
	for {
		ev := nextEvent(t, events)
		if ev.Kind == warble.Resync {
			resync = true
			continue
		}
		if ev.Kind != warble.PostAdded {
			t.Fatalf("got %s", ev.Kind)
		}
		if *ev.PostID == backfilled.ID {
			got = true
		}
		if *ev.PostID == last.ID {
			break
		}
	}
	if !got && !resync {
		t.Errorf("post %s, added to the live home timeline by the follow's backfill, never came: neither as POST_ADDED nor as a RESYNC", backfilled.ID)
	}
}
