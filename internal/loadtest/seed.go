package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/warble"
)

// graph is the seeded social graph.
type graph struct {
	ids, tokens     []string
	followers       []int // per user
	follows, posts  int
	maxFollowers    int
	medianFollowers int
}

// withFollowersAtMost returns the indexes of the users with at most n
// followers.
func (g *graph) withFollowersAtMost(n int) []int {
	var out []int
	for i, f := range g.followers {
		if f <= n {
			out = append(out, i)
		}
	}
	return out
}

// followersOf returns the follower counts of the users at indexes.
func (g *graph) followersOf(indexes []int) []int {
	out := make([]int, len(indexes))
	for i, j := range indexes {
		out[i] = g.followers[j]
	}
	return out
}

// seed signs up o.users users, has each follow a number of others drawn
// from a heavy-tailed distribution, picking whom to follow by a Zipf law
// over the users (the first users are the celebrities), and has each
// write o.posts posts, in rounds, so that home timelines interleave. It
// goes through the services, as the server would.
func seed(ctx context.Context, db *redisdb.DB, o options) (*graph, error) {
	auth, follows, posts := redisdb.NewAuthService(db), redisdb.NewFollowService(db), redisdb.NewPostService(db)
	g := &graph{ids: make([]string, o.users), tokens: make([]string, o.users), followers: make([]int, o.users)}
	err := parallel(o.users, func(i int) error {
		p, err := auth.Signup(ctx, warble.SignupInput{Username: fmt.Sprintf("load%d", i), Password: "load test password"})
		if err != nil {
			return err
		}
		g.ids[i], g.tokens[i] = p.User.ID, p.Token
		return nil
	})
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(o.seed, 42))
	zipf := rand.NewZipf(rng, 1.2, 1, uint64(o.users-1))
	maxFollow := min(o.maxFollow, o.users-1)
	plan := make([][]int, o.users)
	for i := range plan {
		// Following counts are heavy-tailed too: mostly a few, some many.
		k := min(maxFollow, 1+int(math.Floor(math.Exp(rng.NormFloat64()*1.0+2.0))))
		seen := map[int]bool{i: true}
		for tries := 0; len(seen)-1 < k && tries < 20*k; tries++ {
			j := int(zipf.Uint64())
			if !seen[j] {
				seen[j] = true
				plan[i] = append(plan[i], j)
				g.followers[j]++
			}
		}
		g.follows += len(plan[i])
	}
	err = parallel(o.users, func(i int) error {
		for _, j := range plan[i] {
			if err := follows.Follow(ctx, g.ids[i], g.ids[j]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for round := range o.posts {
		err = parallel(o.users, func(i int) error {
			_, err := posts.CreatePost(ctx, g.ids[i], fmt.Sprintf("post %d by user %d: a little text of ordinary length to read", round, i))
			return err
		})
		if err != nil {
			return nil, err
		}
		g.posts += o.users
	}
	sorted := slices.Sorted(slices.Values(g.followers))
	g.maxFollowers, g.medianFollowers = sorted[len(sorted)-1], sorted[len(sorted)/2]
	return g, nil
}

// fanAuthor is a user whose posts' fan-out is timed.
type fanAuthor struct {
	followers int
	id, token string
}

// seedFans writes max(sizes) users ("fan0", "fan1", …) and their follows
// straight into Redis (bcrypt for a hundred thousand signups would take
// minutes), and signs up one author per size ("fanout<size>") through the
// service, for a session, followed by the first size of them.
func seedFans(ctx context.Context, db *redisdb.DB, rdb *rawDB, sizes []int) ([]fanAuthor, error) {
	names := make([]string, slices.Max(sizes))
	for i := range names {
		names[i] = fmt.Sprintf("fan%d", i)
	}
	fans, err := rdb.signups(ctx, names, "load test password")
	if err != nil {
		return nil, err
	}
	auth := redisdb.NewAuthService(db)
	authors := make([]fanAuthor, len(sizes))
	for i, n := range sizes {
		p, err := auth.Signup(ctx, warble.SignupInput{Username: fmt.Sprintf("fanout%d", n), Password: "load test password"})
		if err != nil {
			return nil, err
		}
		if err := rdb.follows(ctx, p.User.ID, fans[:n]); err != nil {
			return nil, err
		}
		authors[i] = fanAuthor{followers: n, id: p.User.ID, token: p.Token}
	}
	return authors, nil
}

// parallel runs fn for 0..n-1 on a few goroutines, returning the first error.
func parallel(n int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := fn(i); err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}
