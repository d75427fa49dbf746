package redisdb

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestWalkFollowersEnds checks that a walk that reads only its pages' end
// scores (walkFollowersLogged with ends, as fan-out walks) pages through a
// followers set as the walk that reads every score does: the same
// followers, whether there are more, and the next position, with followers
// tied on a time across pages, and with the follower at the position gone
// between two pages (then the tied followers before it are walked by the
// script, walkTiedFollowers).
func TestWalkFollowersEnds(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	key := followersKey(ada.ID)
	var zs []redis.Z
	for i := range 95 {
		// Ties of 7 on a time, across every page boundary of 10 or 4.
		zs = append(zs, redis.Z{Score: float64(1795740000000 + i/7), Member: strconv.Itoa(5000 + (i*37)%95)})
	}
	if err := db.client.ZAdd(ctx, key, zs...).Err(); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{1, 4, 10, 100} {
		for _, removeAt := range []int{-1, 2} {
			t.Run(strconv.Itoa(limit)+"/"+strconv.Itoa(removeAt), func(t *testing.T) {
				var walked [2][]string
				for e, ends := range []bool{false, true} {
					at, member := "-inf", ""
					for page := 0; ; page++ {
						if page == removeAt && member != "" {
							// The follower at the position leaves, and comes back
							// as the newest, in both walks.
							if err := db.client.ZAdd(ctx, key, redis.Z{Score: 1795740000999, Member: member}).Err(); err != nil {
								t.Fatal(err)
							}
						}
						got, more, _, err := db.walkFollowersLogged(ctx, key, userKey(ada.ID), at, member, limit, nil, ends)
						if err != nil {
							t.Fatal(err)
						}
						for i, g := range got {
							walked[e] = append(walked[e], g.member)
							if !ends || i == len(got)-1 && more {
								if g.score == "" {
									t.Fatalf("page %d: no score for %s", page, g.member)
								}
								s, err := db.client.ZScore(ctx, key, g.member).Result()
								if err != nil || formatScore(s) != g.score {
									t.Fatalf("page %d: score of %s = %q, want %v (%v)", page, g.member, g.score, s, err)
								}
							}
						}
						if !more {
							break
						}
						at, member = got[len(got)-1].score, got[len(got)-1].member
					}
					if removeAt >= 0 {
						// Put it back where it was, for the other walk.
						if err := db.client.ZAdd(ctx, key, zs...).Err(); err != nil {
							t.Fatal(err)
						}
					}
				}
				if !slices.Equal(walked[0], walked[1]) {
					t.Errorf("walk with every score: %v\nwith the ends' scores: %v", walked[0], walked[1])
				}
				if removeAt < 0 && len(walked[1]) != len(zs) {
					t.Errorf("walked %d followers, want %d", len(walked[1]), len(zs))
				}
			})
		}
	}
}

// splitPipeline runs a pipeline that holds a command cut matches in two
// parts, the commands before it and the rest, and between them between,
// once: what another client may do while Redis runs one pipeline.
type splitPipeline struct {
	cut     func(redis.Cmder) bool
	between func() error
	done    atomic.Bool
}

func (h *splitPipeline) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *splitPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *splitPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for i, c := range cmds {
			if i > 0 && h.cut(c) && h.done.CompareAndSwap(false, true) {
				err := next(ctx, cmds[:i])
				if err := h.between(); err != nil {
					return err
				}
				if err2 := next(ctx, cmds[i:]); err == nil {
					err = err2
				}
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// TestFirstBatchAcrossAnUnfollow: a job's first step reads its first
// batch of followers' ids, and then the score of the batch's last by its
// rank, for the cursor; an unfollow between the two reads moves the
// ranks, and the job then walks the first batch itself. It must still
// reach every follower but the one who left, and end.
func TestFirstBatchAcrossAnUnfollow(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	author := mustSignup(t, db, "author")
	followers := manyFollowers(t, db, author.ID, DefaultBatch+50)
	if err := db.client.HSet(ctx, userKey(author.ID), followersCheckedField, "1").Err(); err != nil {
		t.Fatal(err)
	}
	// A first post loads the scripts, so that no pipeline below runs
	// twice for a NOSCRIPT.
	mustCreatePost(t, db, author.ID, "before")
	drainFanOut(t, db)
	leaver := followers[10]
	fromStart := atomic.Int64{} // reads of the followers' ids from the first
	split := &splitPipeline{
		cut: func(c redis.Cmder) bool {
			args := c.Args()
			return c.Name() == "zrange" && len(args) == 5 && argString(args[1]) == followersKey(author.ID) &&
				argString(args[4]) == "withscores"
		},
		between: func() error {
			return NewFollowService(db).Unfollow(ctx, leaver, author.ID)
		},
	}
	db.client.AddHook(split)
	db.client.AddHook(&countCommands{match: func(c redis.Cmder) bool {
		args := c.Args()
		// The ids of a page from the first; a walk's reads of its ends'
		// scores are not counted.
		return c.Name() == "zrange" && len(args) > 2 && argString(args[1]) == followersKey(author.ID) &&
			argString(args[2]) == "-inf" && argString(args[len(args)-1]) != "withscores"
	}, n: &fromStart})
	p, err := NewPostService(db).CreatePost(ctx, author.ID, "read across an unfollow")
	if err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	if !split.done.Load() {
		t.Fatal("no first step read its first batch's last score: the test makes no case")
	}
	if got := fromStart.Load(); got != 2 {
		t.Errorf("%d reads of the followers' ids from the first, want 2 (the first step's and the walk's)", got)
	}
	stayed := slices.DeleteFunc(slices.Clone(followers), func(f string) bool { return f == leaver })
	if got := holding(t, db, stayed, p.ID); got != len(stayed) {
		t.Errorf("%d of %d followers hold the post", got, len(stayed))
	}
	if holding(t, db, []string{leaver}, p.ID) != 0 {
		t.Error("the follower who left holds the post")
	}
	if n := queuedJobs(t, db); n != 0 {
		t.Errorf("%d jobs left in the stream, want none", n)
	}
}

// countCommands counts the commands that match, sent alone or in a
// pipeline.
type countCommands struct {
	match func(redis.Cmder) bool
	n     *atomic.Int64
}

func (h *countCommands) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if h.match(c) {
			h.n.Add(1)
		}
		return next(ctx, c)
	}
}

func (h *countCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if h.match(c) {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}
