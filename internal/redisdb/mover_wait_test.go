package redisdb

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warble/warble/internal/warble"
)

// TestMoverWaitsForFanOut: a post whose fan-out job has not run stays in
// Redis, and so does every newer post of its author; once the job has
// run, the post is on the global timeline and its follower's home, and
// then it moves, and stays on both. (A mover that moved it first made the
// job take it for deleted: POST_REMOVED on the global timeline, and no
// delivery.) Once on one Redis's one script and once through the
// cluster's chain with its outbox.
func TestMoverWaitsForFanOut(t *testing.T) {
	for _, chained := range []bool{false, true} {
		t.Run("chained="+strconv.FormatBool(chained), func(t *testing.T) {
			clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
			db, store := newArchiveTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, PostsInRedis: 1, Now: clock.Now})
			db.chainedPosts = db.chainedPosts || chained
			ada := mustSignup(t, db, "ada")
			bob := mustSignup(t, db, "bob")
			mustFollow(t, db, bob.ID, ada.ID)

			first := mustPost(t, db, ada.ID, "fanned out before the move")
			drainFanOut(t, db)
			var posts []*warble.Post
			for i := range 3 {
				posts = append(posts, mustPost(t, db, ada.ID, "waits for its job "+strconv.Itoa(i)))
			}
			// Only the post whose job ran may move.
			if n := drainMoves(t, db); n != 1 {
				t.Errorf("the mover moved %d posts before their jobs ran, want 1 (the one whose job ran)", n)
			}
			if got, want := redisPostIDs(t, db, ada.ID), idsOf(posts); !slices.Equal(got, want) {
				t.Errorf("ada's posts in Redis = %v, want those whose jobs have not run %v", got, want)
			}
			drainFanOut(t, db)
			clock.Add(time.Minute)
			if n := drainMoves(t, db); n != 2 {
				t.Errorf("the mover moved %d posts once their jobs ran, want 2", n)
			}
			all := append([]*warble.Post{first}, posts...)
			if got, want := archivedIDs(t, store), idsOf(all[:3]); !slices.Equal(got, want) {
				t.Errorf("archive holds %v, want %v", got, want)
			}
			if got := zsetIDs(t, db, globalKey); !slices.Equal(got, idsOf(all)) {
				t.Errorf("global timeline = %v, want %v", got, idsOf(all))
			}
			if got := zsetIDs(t, db, homeKey(bob.ID)); !slices.Equal(got, idsOf(all)) {
				t.Errorf("bob's home = %v, want %v", got, idsOf(all))
			}
			if got := readTimeline(t, db, warble.HomeFeed(bob.ID), 10, nil); !slices.Equal(got, reversed(idsOf(all))) {
				t.Errorf("bob's home reads %v, want %v", got, reversed(idsOf(all)))
			}
		})
	}
}

// TestFanOutAgainAfterTheMove: a post's job that runs again after the
// mover took the post (its worker died before it acknowledged the job, or
// the outbox sweep queued it twice) finds the post in the archive and
// leaves it on the timelines; one deleted since, in the archive, stays off
// them. Raw: the same for jobs delivered raw (one batch, whose end finds
// no post hash to clear the mark of, and ends the job all the same).
func TestFanOutAgainAfterTheMove(t *testing.T) {
	for _, raw := range []bool{false, true} {
		t.Run(map[bool]string{false: "Guarded", true: "Raw"}[raw], func(t *testing.T) { fanOutAgainAfterTheMove(t, raw) })
	}
}

func fanOutAgainAfterTheMove(t *testing.T, raw bool) {
	ctx := context.Background()
	db, _ := newArchiveTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, PostsInRedis: 1})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	if raw {
		if db.onCluster() {
			t.Skip("raw deliveries are for one Redis")
		}
		db.rawFrom = 1
		var walked atomic.Int64
		db.rawStep = func(stage string, _ []string) {
			if stage == "walked" {
				walked.Add(1)
			}
		}
		t.Cleanup(func() {
			if walked.Load() == 0 {
				t.Error("no job was delivered raw: the test makes no case")
			}
		})
	}
	moved := mustPost(t, db, ada.ID, "moves after its job")
	deleted := mustPost(t, db, ada.ID, "moves, then is deleted")
	kept := mustPost(t, db, ada.ID, "stays in Redis")
	drainFanOut(t, db)
	if n := drainMoves(t, db); n != 2 {
		t.Fatalf("the mover moved %d posts, want 2", n)
	}
	if err := NewPostService(db).DeletePost(ctx, ada.ID, deleted.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	want := []string{moved.ID, kept.ID}
	for _, p := range []*warble.Post{moved, deleted} {
		if err := db.queueJob(ctx, opDeliver, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	drainFanOut(t, db)
	if got := zsetIDs(t, db, globalKey); !slices.Equal(got, want) {
		t.Errorf("global timeline after the jobs ran again = %v, want %v", got, want)
	}
	if got := zsetIDs(t, db, homeKey(bob.ID)); !slices.Equal(got, want) {
		t.Errorf("bob's home after the jobs ran again = %v, want %v", got, want)
	}
	if got := readTimeline(t, db, warble.HomeFeed(bob.ID), 10, nil); !slices.Equal(got, reversed(want)) {
		t.Errorf("bob's home reads %v, want %v", got, reversed(want))
	}
}

// TestMoverWaitIsBounded: a post whose mark its job never clears (a worker
// of the previous version, which knows no mark, ran the job during a
// rolling upgrade) does not keep its author's posts in Redis for ever: once
// the mark is older than moveWaitMax, the post moves with the rest, and a
// job that runs again then finds it in the archive (deletedPost).
func TestMoverWaitIsBounded(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db, store := newArchiveTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, PostsInRedis: 1, Now: clock.Now})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	var posts []*warble.Post
	for i := range 3 {
		posts = append(posts, mustPost(t, db, ada.ID, "its job ran "+strconv.Itoa(i)))
	}
	drainFanOut(t, db)
	// The job of the oldest ran on a worker that left its mark.
	_, seq, _ := splitPostID(posts[0].ID)
	if err := db.client.HSet(ctx, postKey(ada.ID, seq), fanOutPendingField, "1").Err(); err != nil {
		t.Fatal(err)
	}
	if n := drainMoves(t, db); n != 0 {
		t.Errorf("the mover moved %d posts behind a fresh mark, want 0", n)
	}
	clock.Add(moveWaitMax + time.Minute)
	if n := drainMoves(t, db); n != 2 {
		t.Errorf("the mover moved %d posts once the mark was older than moveWaitMax, want 2", n)
	}
	if got, want := archivedIDs(t, store), idsOf(posts[:2]); !slices.Equal(got, want) {
		t.Errorf("archive holds %v, want %v", got, want)
	}
	if err := db.queueJob(ctx, opDeliver, posts[0].ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if got := zsetIDs(t, db, homeKey(bob.ID)); !slices.Equal(got, idsOf(posts)) {
		t.Errorf("bob's home after the job ran again = %v, want %v", got, idsOf(posts))
	}
}
