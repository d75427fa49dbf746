package redisdb

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// TestRawDeliveriesTakenOverAnnounce: a worker that dies between a raw
// batch's adds and their announce leaves the post in the timelines of the
// batch, unannounced; the worker that takes the job over finds the post
// there already (its ZADD adds nothing), and must announce it all the
// same, or a live home timeline that listens never shows it (a home
// channel dispatches what it is told, without reading the timeline).
func TestRawDeliveriesTakenOverAnnounce(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	msgs := listen(t, db, homeChannel(s.fred))
	dying, die := context.WithCancel(ctx)
	db.rawStep = func(stage string, followers []string) {
		if stage == "added" && slices.Contains(followers, s.fred) {
			die() // the round trip of the repair and the announce fails
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
	db.publish(ctx, db.client, homeChannel(s.fred), "marker")
	if m := nextMessage(t, msgs); m.Payload != encodeAdded(s.seq, s.postID) {
		t.Errorf("fred's home channel heard %q first after the job was taken over, want the post added", m.Payload)
	}
}

// TestRawDeliveriesRepairLostScriptAnnounces: a suspect who follows (an
// unsure count left by a writer that died) is announced by the repair
// itself; when Redis lost repairScript between its load and the repair's
// pipeline (a SCRIPT FLUSH, a restart), the repair that runs again must
// still announce the post to that follower.
func TestRawDeliveriesRepairLostScriptAnnounces(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	if err := db.client.HIncrBy(ctx, followersUnsureKey(s.ada), s.fred, 1).Err(); err != nil {
		t.Fatal(err)
	}
	msgs := listen(t, db, homeChannel(s.fred))
	// Loaded before the flush, so that the batch does not load it again.
	if err := db.loadScript(ctx, db.pub(repairScript), false); err != nil {
		t.Fatal(err)
	}
	db.rawStep = func(stage string, followers []string) {
		if stage == "added" && slices.Contains(followers, s.fred) {
			if err := db.client.ScriptFlush(ctx).Err(); err != nil {
				t.Error(err)
			}
		}
	}
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	db.rawStep = nil
	if !s.holds(t, s.fred) {
		t.Fatal("fred, who follows, lacks the post")
	}
	db.publish(ctx, db.client, homeChannel(s.fred), "marker")
	if m := nextMessage(t, msgs); m.Payload != encodeAdded(s.seq, s.postID) {
		t.Errorf("fred's home channel heard %q first, want the post added", m.Payload)
	}
}

// TestRawDeliveriesArchivedPostRepaired: a job that runs again after its
// post moved to the archive (its first worker died before it acknowledged
// the job, or the mover stopped waiting for it) goes on delivering; a
// follower whose whole unfollow ran between its walk and its adds must
// not keep the post, which the batch's ZADD put back and the archive
// serves.
func TestRawDeliveriesArchivedPostRepaired(t *testing.T) {
	ctx := context.Background()
	db, _ := newArchiveTestDB(t, Options{AsyncFanOut: true, PullThreshold: -1, PostsInRedis: 1})
	if db.onCluster() {
		t.Skip("raw deliveries are for one Redis")
	}
	follows := NewFollowService(db)
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	fred := mustSignup(t, db, "fred").ID
	mustFollow(t, db, bob, ada) // into an empty set: ada's followers side is checked
	mustFollow(t, db, fred, ada)
	p := mustPost(t, db, ada, "moves to the archive")
	mustPost(t, db, ada, "stays")
	drainFanOut(t, db)
	if n := drainMoves(t, db); n != 1 {
		t.Fatalf("the mover moved %d posts, want 1", n)
	}
	_, seqText, _ := splitPostID(p.ID)
	if db.client.Exists(ctx, postKey(ada, seqText)).Val() != 0 {
		t.Fatal("the post's hash is still in Redis: the test makes no case")
	}
	raced := false
	db.rawStep = func(stage string, followers []string) {
		if stage == "walked" && slices.Contains(followers, fred) {
			raced = true
			if err := follows.Unfollow(ctx, fred, ada); err != nil {
				t.Errorf("the racing unfollow: %v", err)
			}
		}
	}
	// A follower a batch: a job of one batch keeps the guarded script.
	end := &jobEnd{shard: 0, id: strconv.FormatInt(time.Now().UnixMilli(), 10) + "-0"}
	if err := db.fanOutJob(ctx, ada, p.Seq, p.ID, startCursor, 1, noSave, end); err != nil {
		t.Fatal(err)
	}
	db.rawStep = nil
	if !raced {
		t.Fatal("no raw batch walked fred: the test makes no case")
	}
	if db.client.ZScore(ctx, homeKey(fred), p.ID).Err() == nil {
		t.Error("fred, who unfollowed, holds the archived post once its job ran again")
	}
	if db.client.ZScore(ctx, homeKey(bob), p.ID).Err() != nil {
		t.Error("bob, who follows, lacks the post")
	}
}

// TestRawDeliveriesRacingStaleFollow: a follow that lost the race to an
// unfollow of the same pair writes a stale entry into the followers side
// (its mirror write comes after the unfollow's) and then corrects it, and
// its backfill takes the author's posts off; a raw batch that walks the
// stale entry delivers to a follower who does not follow. Whenever the
// correction comes (between the walk and the adds, after the batch's
// reads, after its repair, or never: the follow died), the follower holds
// no post of the author once the unfollow has answered and the job is
// done.
func TestRawDeliveriesRacingStaleFollow(t *testing.T) {
	for _, release := range []string{"walked", "added", "repaired", "never"} {
		t.Run(release, func(t *testing.T) {
			ctx := context.Background()
			s := newRawSetup(t, Options{})
			db := s.db
			score, err := db.client.ZScore(ctx, followingKey(s.fred), s.ada).Result()
			if err != nil {
				t.Fatal(err)
			}
			// The follow read the truth as following at score, counted
			// fred, and is about to write the followers side; meanwhile
			// the unfollow runs whole.
			token, err := s.follows.checkPair(ctx, s.fred, s.ada, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.follows.Unfollow(ctx, s.fred, s.ada); err != nil {
				t.Fatal(err)
			}
			at := strconv.FormatFloat(score, 'f', -1, 64)
			var stale, proceed, done chan struct{}
			if release == "never" {
				// The follow writes its stale entry and dies.
				if _, err := db.mirrorFollower(ctx, s.fred, s.ada, formatScore(score)); err != nil {
					t.Fatal(err)
				}
			} else {
				stale, proceed, done = make(chan struct{}), make(chan struct{}), make(chan struct{})
				var writes atomic.Int32
				db.mirrorWritten = func(followerID, _ string) {
					if followerID == s.fred && writes.Add(1) == 1 {
						close(stale)
						<-proceed
					}
				}
				go func() {
					defer close(done)
					if _, err := s.follows.mirrorFollow(ctx, s.fred, s.ada, true, at, token); err != nil {
						t.Errorf("the follow's mirror: %v", err)
					}
					if _, _, err := s.follows.backfill(ctx, s.fred, s.ada); err != nil {
						t.Errorf("the follow's backfill: %v", err)
					}
				}()
				<-stale
			}
			if db.client.ZScore(ctx, followersKey(s.ada), s.fred).Err() != nil {
				t.Fatal("the followers side does not list fred: the test makes no case")
			}
			db.rawStep = func(stage string, followers []string) {
				if stage == release && slices.Contains(followers, s.fred) {
					close(proceed)
					<-done
				}
			}
			if err := s.run(ctx); err != nil {
				t.Fatal(err)
			}
			db.rawStep = nil
			if done != nil {
				select {
				case <-done:
				default:
					t.Fatalf("stage %q never came for fred: the test makes no case", release)
				}
			}
			if s.holds(t, s.fred) {
				t.Error("fred, who does not follow, holds the post once the unfollow answered and the job is done")
			}
			if !s.holds(t, s.followers[0]) {
				t.Error("a follower lacks the post")
			}
		})
	}
}

// twiceConfirmed sends every call of confirmMirrorScript twice, as go-redis
// sends a command again (MaxRetries) after a read timed out or the
// connection broke once the command was written: Redis may have run it.
type twiceConfirmed struct{}

func (twiceConfirmed) DialHook(next redis.DialHook) redis.DialHook { return next }

func (twiceConfirmed) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && args[0] == "evalsha" && args[1] == confirmMirrorScript.Hash() {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (twiceConfirmed) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRawDeliveriesRetriedConfirm: a follow's count down of its follower in
// the unsure hash that Redis runs twice (a retry of a command that had
// run) must not count down a racing unfollow that is still unconfirmed: if
// that unfollow then dies between the truth and the followers side, the
// entry it leaves is stale, and only its count makes a raw batch check it.
func TestRawDeliveriesRetriedConfirm(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	// The unfollow counts fred, then the follow (fred follows already)
	// runs whole, its confirm sent twice; then the unfollow writes the
	// truth and dies.
	if _, err := s.follows.checkPair(ctx, s.fred, s.ada, nil); err != nil {
		t.Fatal(err)
	}
	db.client.AddHook(twiceConfirmed{})
	mustFollow(t, db, s.fred, s.ada)
	if err := db.client.ZRem(ctx, followingKey(s.fred), s.ada).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if s.holds(t, s.fred) {
		t.Error("fred, who does not follow, holds the post: the retried confirm took the dead unfollow's count")
	}
}

// TestRawDeliveriesBuckets: a raw batch walked the one set just before the
// followers moved into buckets, and a follower then left by a write of
// their bucket alone (the one set is gone): the log still names them, and
// the batch takes the post back off. A job of an account whose followers
// are moving into buckets, or are in them, runs the guarded script.
func TestRawDeliveriesBuckets(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{FollowerBuckets: 4, FollowerBucketThreshold: 100_000})
	db := s.db
	walks := 0
	db.rawStep = func(stage string, followers []string) {
		if stage != "walked" {
			return
		}
		walks++
		if !slices.Contains(followers, s.fred) {
			return
		}
		if err := db.moveToBuckets(ctx, s.ada, startCursor, 250, noSave); err != nil {
			t.Errorf("move into buckets: %v", err)
		}
		if n := parseFollowerState(db.client.HGet(ctx, userKey(s.ada), followerBucketsField).Val()).buckets; n != 4 {
			t.Errorf("followers in %d buckets after the move, want 4", n)
		}
		if err := s.follows.Unfollow(ctx, s.fred, s.ada); err != nil {
			t.Errorf("the racing unfollow: %v", err)
		}
	}
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	if s.holds(t, s.fred) {
		t.Error("fred, who left through his bucket, holds the post")
	}
	if !s.holds(t, s.followers[599]) {
		t.Error("a follower lacks the post")
	}

	for _, state := range []string{"4", bucketsMigrating + "4"} {
		if err := db.client.HSet(ctx, userKey(s.ada), followerBucketsField, state).Err(); err != nil {
			t.Fatal(err)
		}
		if state == "4" && db.client.Exists(ctx, followersKey(s.ada)).Val() != 0 {
			t.Fatal("the one set outlived the move")
		}
		if state != "4" {
			// Migrating: the one set is whole and read.
			for _, f := range s.followers {
				db.client.ZAdd(ctx, followersKey(s.ada), redis.Z{Score: 1, Member: f})
			}
		}
		p := mustCreatePostNoDrain(t, db, s.ada)
		s.seq, s.postID = p.Seq, p.ID
		walks = 0
		scripts := &countScripts{}
		db.client.AddHook(scripts)
		if err := s.run(ctx); err != nil {
			t.Fatal(err)
		}
		if walks != 0 {
			t.Errorf("followers %q: %d batches delivered raw", state, walks)
		}
		if scripts.deliveries.Load() == 0 || !s.holds(t, s.followers[0]) {
			t.Errorf("followers %q: the guarded script did not deliver", state)
		}
	}
}

// TestHomeReplayPastItsCap: a live home timeline resumed from a cursor
// that a home timeline at its cap would have trimmed, but that raw
// deliveries left in place past the cap, gets a RESYNC, as from a trimmed
// timeline, and not a replay of more posts than the cap, some of which no
// page shows.
func TestHomeReplayPastItsCap(t *testing.T) {
	const homeCap = 5
	ctx := context.Background()
	db := newTestDB(t, Options{HomeCap: homeCap})
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	mustFollow(t, db, bob, ada)
	var seqs []int64
	for range 9 {
		seqs = append(seqs, mustCreatePost(t, db, ada, "a post").Seq)
	}
	// As raw deliveries leave it: every post, past the cap.
	for _, seq := range seqs {
		if err := db.client.ZAdd(ctx, homeKey(bob), redis.Z{Score: float64(seq), Member: postIDs(ada, seq)[0]}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Two posts older than the cap's oldest: a cursor no page gives now,
	// but one that a page gave while they were within the cap.
	after := warble.PostCursor(seqs[1])
	events := mustSubscribe(t, newTestHub(t, db), warble.HomeFeed(bob), &after)
	if ev := nextEvent(t, events); ev.Kind != warble.Resync {
		t.Errorf("first event resumed from past the cap = %v at %s, want a RESYNC", ev.Kind, ev.Cursor)
	}
}

// TestRawDeliveriesAnnounceAfterUnfollow: a follower who is listened to,
// and whose whole unfollow runs between a raw batch's reads after its adds
// and its announce, hears the unfollow's RESYNC (the post taken off) and
// then nothing of the post: a live home channel dispatches an announced
// post without reading the timeline, so an announce after the RESYNC
// would show a post of an account no longer followed.
func TestRawDeliveriesAnnounceAfterUnfollow(t *testing.T) {
	ctx := context.Background()
	s := newRawSetup(t, Options{})
	db := s.db
	msgs := listen(t, db, homeChannel(s.fred))
	db.rawStep = func(stage string, followers []string) {
		if stage == "added" && slices.Contains(followers, s.fred) {
			if err := s.follows.Unfollow(ctx, s.fred, s.ada); err != nil {
				t.Errorf("the racing unfollow: %v", err)
			}
		}
	}
	if err := s.run(ctx); err != nil {
		t.Fatal(err)
	}
	db.rawStep = nil
	if s.holds(t, s.fred) {
		t.Error("fred, who unfollowed, holds the post")
	}
	if m := nextMessage(t, msgs); !strings.HasPrefix(m.Payload, "S ") {
		t.Fatalf("fred's home channel heard %q first, want the unfollow's RESYNC", m.Payload)
	}
	db.publish(ctx, db.client, homeChannel(s.fred), "marker")
	if m := nextMessage(t, msgs); m.Payload != "marker" {
		t.Errorf("fred's home channel heard %q after the unfollow's RESYNC, want nothing of the post", m.Payload)
	}
}
