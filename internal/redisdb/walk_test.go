package redisdb

import (
	"context"
	"slices"
	"strconv"
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
