// Command loadtest seeds a social graph into a Redis and measures a Warble
// server on it: home pages over HTTP against { __typename } on the same
// server and against go-redis reading the same pages directly, and
// createPost latency. See BENCHMARKS.md for how to run it.
//
// It sends traffic only to loopback addresses, and refuses a Redis that
// holds data unless -flush is given.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/warble"
)

type options struct {
	serverURL   string
	redisURL    string
	users       int
	maxFollow   int
	posts       int
	runs        int
	duration    time.Duration
	concurrency int
	flush       bool
	seed        uint64
}

func main() {
	var o options
	flag.StringVar(&o.serverURL, "url", "http://127.0.0.1:8080", "the Warble server under test (loopback only), started with RATE_LIMITS=off on -redis-url")
	flag.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "the Redis the server uses (loopback only)")
	flag.IntVar(&o.users, "users", 2000, "users to seed")
	flag.IntVar(&o.maxFollow, "max-follow", 200, "most users one user follows")
	flag.IntVar(&o.posts, "posts", 5, "posts per user to seed")
	flag.IntVar(&o.runs, "runs", 5, "runs of each measurement; medians are reported")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "length of each throughput run")
	flag.IntVar(&o.concurrency, "concurrency", 16, "requests in flight")
	flag.BoolVar(&o.flush, "flush", false, "FLUSHDB the Redis first, if it holds data")
	flag.Uint64Var(&o.seed, "seed", 1, "random seed of the graph")
	flag.Parse()
	if err := run(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// loopback reports whether host names this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func run(ctx context.Context, o options, out io.Writer) error {
	su, err := url.Parse(o.serverURL)
	if err != nil || !loopback(su.Hostname()) {
		return fmt.Errorf("-url %q must be a loopback http URL", o.serverURL)
	}
	ropts, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return fmt.Errorf("-redis-url: %w", err)
	}
	if host, _, err := net.SplitHostPort(ropts.Addr); ropts.Network != "unix" && (err != nil || !loopback(host)) {
		return fmt.Errorf("-redis-url %q must be on loopback", o.redisURL)
	}
	if o.users < 2 || o.runs < 1 || o.concurrency < 1 {
		return errors.New("need -users >= 2, -runs >= 1, -concurrency >= 1")
	}
	client := redis.NewClient(ropts)
	defer client.Close()
	if n, err := client.DBSize(ctx).Result(); err != nil {
		return fmt.Errorf("redis: %w", err)
	} else if n > 0 {
		if !o.flush {
			return fmt.Errorf("redis at %s holds %d keys; pass -flush to empty it", ropts.Addr, n)
		}
		if err := client.FlushDB(ctx).Err(); err != nil {
			return err
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	db := redisdb.NewDB(client, redisdb.Options{BcryptCost: bcrypt.MinCost, MaxFollowing: o.maxFollow, Logger: quiet})

	start := time.Now()
	g, err := seed(ctx, db, o)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(out, "seeded %d users, %d follows (followers: max %d, median %d), %d posts in %s\n",
		len(g.tokens), g.follows, g.maxFollowers, g.medianFollowers, g.posts, time.Since(start).Round(time.Millisecond))

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency * 2}, Timeout: 10 * time.Second}
	gql := o.serverURL + "/graphql"
	home := func(ctx context.Context, r *rand.Rand) error {
		i := r.IntN(len(g.tokens))
		return post(ctx, hc, gql, g.tokens[i], `query Home { homeTimeline(first: 20) { edges { cursor node { id body createdAt author { id username displayName } } } pageInfo { hasNextPage endCursor } } }`, nil)
	}
	typename := func(ctx context.Context, _ *rand.Rand) error {
		return post(ctx, hc, gql, "", `query T { __typename }`, nil)
	}
	raw := func(ctx context.Context, r *rand.Rand) error {
		_, err := db.RawHomePage(ctx, g.ids[r.IntN(len(g.ids))], 20)
		return err
	}
	create := func(ctx context.Context, r *rand.Rand) error {
		i := r.IntN(len(g.tokens))
		return post(ctx, hc, gql, g.tokens[i], `mutation P($b: String!) { createPost(input: {body: $b}) { post { id } } }`,
			map[string]any{"b": fmt.Sprintf("load %d", r.Uint64())})
	}
	// A short warm-up fills connection pools and caches.
	if _, err := measure(ctx, o.concurrency, time.Second/2, home); err != nil {
		return fmt.Errorf("home page: %w", err)
	}

	var homes, types, raws, creates []result
	for range o.runs {
		for _, m := range []struct {
			fn  func(context.Context, *rand.Rand) error
			dst *[]result
		}{{home, &homes}, {typename, &types}, {raw, &raws}, {create, &creates}} {
			r, err := measure(ctx, o.concurrency, o.duration, m.fn)
			if err != nil {
				return err
			}
			*m.dst = append(*m.dst, r)
		}
	}
	fan, rawFan, err := measureFanOut(ctx, db, hc, gql, g, o.runs)
	if err != nil {
		return fmt.Errorf("fan-out: %w", err)
	}
	h, t, rw, c := median(homes), median(types), median(raws), median(creates)
	fmt.Fprintf(out, "\nmachine: %s/%s, %d CPUs (GOMAXPROCS %d); concurrency %d; %d runs of %s each, medians\n\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), o.concurrency, o.runs, o.duration)
	fmt.Fprintf(out, "| measurement | requests/s | p50 | p99 |\n|---|---|---|---|\n")
	row := func(name string, r result) {
		fmt.Fprintf(out, "| %s | %.0f | %s | %s |\n", name, r.rate, r.p50, r.p99)
	}
	row("homeTimeline(first: 20) with authors, HTTP", h)
	row("{ __typename }, HTTP", t)
	row("same page, go-redis directly (range + 2 pipelines)", rw)
	row("createPost, HTTP", c)
	fmt.Fprintf(out, "\nhome page / __typename: %.2f; home page / raw Redis: %.2f\n", h.rate/t.rate, h.rate/rw.rate)
	fmt.Fprintf(out, "\nfan-out of one post by the most followed user (%d followers), medians of %d:\n", g.maxFollowers, o.runs)
	fmt.Fprintf(out, "| measurement | insertions/s | time |\n|---|---|---|\n")
	fmt.Fprintf(out, "| createPost until every follower's home timeline has it | %.0f | %s |\n", fan.rate, fan.p50)
	fmt.Fprintf(out, "| one pipeline of plain ZADDs to the same timelines | %.0f | %s |\n", rawFan.rate, rawFan.p50)
	fmt.Fprintf(out, "\nfan-out / raw ZADD: %.2f\n", fan.rate/rawFan.rate)
	return nil
}

// graph is the seeded social graph.
type graph struct {
	ids, tokens     []string
	celebrity       int // the most followed user
	follows, posts  int
	maxFollowers    int
	medianFollowers int
}

// seed signs up o.users users, has each follow a number of others drawn
// from a heavy-tailed distribution, picking whom to follow by a Zipf law
// over the users (the first users are the celebrities), and has each
// write o.posts posts, in rounds, so that home timelines interleave.
func seed(ctx context.Context, db *redisdb.DB, o options) (*graph, error) {
	auth, follows, posts := redisdb.NewAuthService(db), redisdb.NewFollowService(db), redisdb.NewPostService(db)
	g := &graph{ids: make([]string, o.users), tokens: make([]string, o.users)}
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
	followers := make([]int, o.users)
	for i := range plan {
		// Following counts are heavy-tailed too: mostly a few, some many.
		k := min(maxFollow, 1+int(math.Floor(math.Exp(rng.NormFloat64()*1.0+2.0))))
		seen := map[int]bool{i: true}
		for tries := 0; len(seen)-1 < k && tries < 20*k; tries++ {
			j := int(zipf.Uint64())
			if !seen[j] {
				seen[j] = true
				plan[i] = append(plan[i], j)
				followers[j]++
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
	g.celebrity = slices.Index(followers, slices.Max(followers))
	slices.Sort(followers)
	g.maxFollowers, g.medianFollowers = followers[len(followers)-1], followers[len(followers)/2]
	return g, nil
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

// measureFanOut times runs posts by the most followed user from the
// createPost request until every follower's home timeline holds the post
// (polled from Redis, so asynchronous fan-out counts in full), and runs of
// the plain pipelined ZADD baseline to the same timelines. Each result's
// rate is insertions per second and its p50 the time of one fan-out.
func measureFanOut(ctx context.Context, db *redisdb.DB, hc *http.Client, endpoint string, g *graph, runs int) (result, result, error) {
	author := g.ids[g.celebrity]
	var fans, raws []result
	for i := range runs {
		start := time.Now()
		var out struct {
			CreatePost struct{ Post struct{ ID string } }
		}
		if err := postData(ctx, hc, endpoint, g.tokens[g.celebrity], `mutation P($b: String!) { createPost(input: {body: $b}) { post { id } } }`,
			map[string]any{"b": fmt.Sprintf("fan-out %d", i)}, &out); err != nil {
			return result{}, result{}, err
		}
		for {
			done, total, err := db.FanOutProgress(ctx, author, out.CreatePost.Post.ID)
			if err != nil {
				return result{}, result{}, err
			}
			if done == total {
				took := time.Since(start)
				fans = append(fans, result{rate: float64(total) / took.Seconds(), p50: took})
				break
			}
			if time.Since(start) > time.Minute {
				return result{}, result{}, fmt.Errorf("post %s reached %d of %d followers in a minute", out.CreatePost.Post.ID, done, total)
			}
			time.Sleep(time.Millisecond)
		}
		n, took, err := db.RawFanOut(ctx, author, fmt.Sprintf("bench:%d", i))
		if err != nil {
			return result{}, result{}, err
		}
		raws = append(raws, result{rate: float64(n) / took.Seconds(), p50: took})
	}
	return median(fans), median(raws), nil
}

// post sends one GraphQL request and fails on any error in the answer.
func post(ctx context.Context, hc *http.Client, endpoint, token, query string, vars map[string]any) error {
	return postData(ctx, hc, endpoint, token, query, vars, nil)
}

// postData is post that decodes the answer's data into v, if v is not nil.
func postData(ctx context.Context, hc *http.Client, endpoint, token, query string, vars map[string]any, v any) error {
	body, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Data   json.RawMessage   `json:"data"`
		Errors []json.RawMessage `json:"errors"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || resp.StatusCode != http.StatusOK || len(r.Errors) > 0 {
		return fmt.Errorf("status %d: %.300s", resp.StatusCode, raw)
	}
	if v != nil {
		return json.Unmarshal(r.Data, v)
	}
	return nil
}

// result is one throughput run.
type result struct {
	rate     float64 // requests per second
	p50, p99 time.Duration
}

// measure runs fn on concurrency goroutines for d and reports the rate and
// latency percentiles. Any error ends the run with that error.
func measure(ctx context.Context, concurrency int, d time.Duration, fn func(context.Context, *rand.Rand) error) (result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(d)
	lat := make([][]time.Duration, concurrency)
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for w := range concurrency {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				if err := fn(ctx, r); err != nil {
					once.Do(func() { firstErr = err; cancel() })
					return
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return result{}, firstErr
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return result{}, errors.New("no request finished")
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	return result{rate: float64(len(all)) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99)}, nil
}

// median takes the median of each field of rs on its own.
func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return result{
		rate: pick(func(r result) float64 { return r.rate }),
		p50:  time.Duration(pick(func(r result) float64 { return float64(r.p50) })).Round(time.Microsecond),
		p99:  time.Duration(pick(func(r result) float64 { return float64(r.p99) })).Round(time.Microsecond),
	}
}
