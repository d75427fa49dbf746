// Command loadtest seeds a social graph into a Redis and measures a Warble
// server on it: home pages over HTTP against { __typename } on the same
// server and against go-redis reading the same pages directly; createPost
// latency for authors with few followers, and how many of their posts a
// second are answered and fanned out; and fan-out, the time from
// createPost answering until every follower's home timeline holds the post,
// for authors with given follower counts, against a plain pipeline of
// ZADDs. It prints the figures next to the targets of the fan-out work and
// can draw them as an SVG chart. See BENCHMARKS.md for how to run it.
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
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redisdb"
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

	fanoutSizes     []int         // follower counts of the fan-out authors; none: no fan-out measurement
	fanoutTimeout   time.Duration // longest wait for one post to reach every follower
	fanoutNoWatch   bool          // time fan-out by the queue alone, not by polling the timelines meanwhile
	fanoutBusy      bool          // also time createPost while each fan-out author keeps posting
	pullThreshold   int           // the server's FANOUT_PULL_THRESHOLD, for the report; 0 if not known, -1 if off
	bucketThreshold int           // the server's FOLLOWERS_BUCKET_THRESHOLD: 0 for its default, -1 if off
	buckets         int           // the server's FOLLOWERS_BUCKETS: 0 for its default
	fewFollowers    int           // createPost is measured for authors with at most this many followers
	compactHomes    int           // home timelines to fill for the compact timelines measurement; 0: none
	homeCap         int           // the server's HOME_TIMELINE_CAP
	listpackEntries []int         // the zset-max-listpack-entries values the compact measurement compares
	chart           string        // SVG file to write, if set
	note            string        // free text for the report, such as the commit measured

	sockets     int           // live subscribers to open at once; 0: no live measurement
	socketsOnly bool          // measure only the live subscribers
	serverPID   int           // the server's process, whose RSS and CPU time the tool reads; 0: not known
	liveTimeout time.Duration // longest time to open the subscribers, and to wait for one post to reach them
	liveIdle    time.Duration // how long the subscribers stay idle before the server's RSS is read
}

func main() {
	var o options
	sizes := "auto"
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
	flag.StringVar(&sizes, "fanout-sizes", sizes, "follower counts of the authors whose fan-out is timed, comma-separated; "+
		"auto: 1000,10000,100000, or 10,100 when -users is below 1000; none: no fan-out measurement")
	flag.DurationVar(&o.fanoutTimeout, "fanout-timeout", time.Minute, "longest wait for one post to reach every follower")
	flag.BoolVar(&o.fanoutNoWatch, "fanout-no-watch", false, "time fan-out until its job leaves the queue, then check the timelines, "+
		"instead of polling the timelines while it runs (which costs Redis a pipeline of ZSCOREs a millisecond)")
	flag.BoolVar(&o.fanoutBusy, "fanout-busy", false, "after the fan-out runs, time createPost again while each -fanout-sizes author posts once per its measured fan-out time, "+
		"so that a large fan-out is under way throughout")
	pull := flag.String("pull-threshold", "", "the server's FANOUT_PULL_THRESHOLD, a number or off, for the report (empty: not known)")
	buckets := flag.String("bucket-threshold", "", "the server's FOLLOWERS_BUCKET_THRESHOLD, a number or off (empty: its default), so that the raw seed writes followers where the server keeps them")
	flag.IntVar(&o.buckets, "buckets", 0, "the server's FOLLOWERS_BUCKETS (0: its default)")
	flag.IntVar(&o.fewFollowers, "few-followers", 1000, "createPost is timed for authors with at most this many followers")
	flag.IntVar(&o.compactHomes, "compact-homes", 0, "fill this many home timelines (those of the followers of the largest fan-out author with at most this many) to the home cap "+
		"under each -listpack-entries, and report their memory and fan-out to them; 0: do not. It runs last, and replaces those timelines")
	flag.IntVar(&o.homeCap, "home-cap", 1000, "the server's HOME_TIMELINE_CAP")
	limits := flag.String("listpack-entries", "128,cap", "the zset-max-listpack-entries values -compact-homes compares, comma-separated; cap: the home cap plus the slack Warble asks for (128)")
	flag.StringVar(&o.chart, "chart", "", "write an SVG chart of the results against their targets to this file")
	flag.StringVar(&o.note, "note", "", "free text for the report and the chart, such as the commit measured")
	flag.IntVar(&o.sockets, "sockets", 0, "open this many graphql-transport-ws subscribers at once (a fifth on the home timelines of one author's followers, "+
		"the rest on the global timeline), and time one post of that author to all of them; 0: do not")
	flag.BoolVar(&o.socketsOnly, "sockets-only", false, "measure only the -sockets subscribers")
	flag.IntVar(&o.serverPID, "server-pid", 0, "the server's process id, for its CPU time a post and its RSS before and after the -sockets subscribers open (run.sh passes it)")
	flag.DurationVar(&o.liveTimeout, "live-timeout", 2*time.Minute, "longest time to open the -sockets subscribers, and to wait for one post to reach them all")
	flag.DurationVar(&o.liveIdle, "live-idle", 5*time.Second, "how long the -sockets subscribers stay idle before the server's RSS is read")
	flag.Parse()
	var err error
	if o.fanoutSizes, err = parseSizes(sizes, o.users); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest: -fanout-sizes:", err)
		os.Exit(2)
	}
	switch *pull {
	case "":
	case "off":
		o.pullThreshold = -1
	default:
		if o.pullThreshold, err = strconv.Atoi(*pull); err != nil || o.pullThreshold < 1 {
			fmt.Fprintf(os.Stderr, "loadtest: -pull-threshold %q: want a positive whole number or off\n", *pull)
			os.Exit(2)
		}
	}
	switch *buckets {
	case "":
	case "off":
		o.bucketThreshold = -1
	default:
		if o.bucketThreshold, err = strconv.Atoi(*buckets); err != nil || o.bucketThreshold < 1 {
			fmt.Fprintf(os.Stderr, "loadtest: -bucket-threshold %q: want a positive whole number or off\n", *buckets)
			os.Exit(2)
		}
	}
	if o.buckets < 0 || o.buckets == 1 {
		fmt.Fprintln(os.Stderr, "loadtest: -buckets: want 2 or more (0: the default)")
		os.Exit(2)
	}
	if o.listpackEntries, err = parseLimits(*limits, o.homeCap); err != nil || o.homeCap < 1 {
		fmt.Fprintln(os.Stderr, "loadtest: -listpack-entries or -home-cap:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// parseSizes reads -fanout-sizes: follower counts, sorted and without
// repeats; "auto" picks them from the number of users, "none" (or "" or
// "0") is none.
func parseSizes(s string, users int) ([]int, error) {
	switch strings.TrimSpace(s) {
	case "none", "", "0":
		return nil, nil
	case "auto":
		if users < 1000 {
			return []int{10, 100}, nil
		}
		return []int{1000, 10000, 100000}, nil
	}
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10_000_000 {
			return nil, fmt.Errorf("%q is not a follower count from 1 to 10000000", f)
		}
		sizes = append(sizes, n)
	}
	slices.Sort(sizes)
	return slices.Compact(sizes), nil
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
	client, addrs, err := openRedis(o.redisURL)
	if err != nil {
		return fmt.Errorf("-redis-url: %w", err)
	}
	defer client.Close()
	for _, a := range addrs {
		if host, _, err := net.SplitHostPort(a.addr); a.network != "unix" && (err != nil || !loopback(host)) {
			return fmt.Errorf("-redis-url %q must be on loopback", o.redisURL)
		}
	}
	if o.users < 2 || o.runs < 1 || o.concurrency < 1 {
		return errors.New("need -users >= 2, -runs >= 1, -concurrency >= 1")
	}
	if o.sockets < 0 || o.sockets > 100_000 {
		return errors.New("need -sockets from 0 to 100000")
	}
	if o.liveTimeout <= 0 {
		o.liveTimeout = 2 * time.Minute
	}
	if o.fanoutTimeout <= 0 {
		o.fanoutTimeout = time.Minute
	}
	if n, err := client.DBSize(ctx).Result(); err != nil { // every master's, on a cluster
		return fmt.Errorf("redis: %w", err)
	} else if n > 0 {
		if !o.flush {
			return fmt.Errorf("redis at %s holds %d keys; pass -flush to empty it", o.redisURL, n)
		}
		if err := flush(ctx, client); err != nil {
			return err
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	db := redisdb.NewDB(client, redisdb.Options{BcryptCost: bcrypt.MinCost, MaxFollowing: o.maxFollow, Logger: quiet,
		FollowerBucketThreshold: o.bucketThreshold, FollowerBuckets: o.buckets})
	rdb := newRawDB(client)
	if o.bucketThreshold != 0 {
		rdb.bucketThreshold = o.bucketThreshold
	}
	if o.buckets != 0 {
		rdb.buckets = o.buckets
	}
	rep := &report{opts: o}

	start := time.Now()
	g, err := seed(ctx, db, o)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(out, "seeded %d users, %d follows (followers: max %d, median %d), %d posts in %s\n",
		len(g.tokens), g.follows, g.maxFollowers, g.medianFollowers, g.posts, time.Since(start).Round(time.Millisecond))
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency * 2}, Timeout: 10 * time.Second}
	if o.sockets > 0 {
		// First, while the server has seen no other load.
		live, err := measureLive(ctx, db, hc, o.serverURL, o, out)
		if err != nil {
			return fmt.Errorf("live subscribers: %w", err)
		}
		live.write(out)
		if o.socketsOnly {
			return nil
		}
	}
	if len(o.fanoutSizes) > 0 {
		start = time.Now()
		if rep.fanAuthors, err = seedFans(ctx, db, rdb, o.fanoutSizes); err != nil {
			return fmt.Errorf("seed fan-out authors: %w", err)
		}
		fmt.Fprintf(out, "seeded %d more users straight into Redis (rawDB.signups, follows) and authors followed by the first %s of them, in %s\n",
			slices.Max(o.fanoutSizes), joinInts(o.fanoutSizes), time.Since(start).Round(time.Millisecond))
	}
	writers := g.withFollowersAtMost(o.fewFollowers)
	if len(writers) == 0 {
		return fmt.Errorf("no seeded user has at most %d followers (-few-followers)", o.fewFollowers)
	}
	rep.createAuthors, rep.createMaxFollowers = len(writers), slices.Max(g.followersOf(writers))

	gql := o.serverURL + "/graphql"
	home := func(ctx context.Context, r *rand.Rand) error {
		i := r.IntN(len(g.tokens))
		return post(ctx, hc, gql, g.tokens[i], `query Home { homeTimeline(first: 20) { edges { cursor node { id body createdAt author { id username displayName } } } pageInfo { hasNextPage endCursor } } }`, nil)
	}
	typename := func(ctx context.Context, _ *rand.Rand) error {
		return post(ctx, hc, gql, "", `query T { __typename }`, nil)
	}
	raw := func(ctx context.Context, r *rand.Rand) error {
		_, err := rdb.homePage(ctx, g.ids[r.IntN(len(g.ids))], 20)
		return err
	}
	create := func(ctx context.Context, r *rand.Rand) error {
		i := writers[r.IntN(len(writers))]
		return post(ctx, hc, gql, g.tokens[i], createPostQuery, map[string]any{"b": fmt.Sprintf("load %d", r.Uint64())})
	}
	// A short warm-up fills connection pools and caches.
	if _, err := measure(ctx, o.concurrency, time.Second/2, home); err != nil {
		return fmt.Errorf("home page: %w", err)
	}

	var homes, types, raws, creates, singles []result
	var drains []time.Duration
	var done []float64 // posts with their fan-out done per second, by createPost run
	var cpus []postCPU // by createPost run at o.concurrency
	for range o.runs {
		for _, m := range []struct {
			fn          func(context.Context, *rand.Rand) error
			concurrency int
			dst         *[]result
		}{
			{home, o.concurrency, &homes}, {typename, o.concurrency, &types}, {raw, o.concurrency, &raws},
			{create, o.concurrency, &creates}, {create, 1, &singles},
		} {
			before, server := markCPU(ctx, client), serverCPU(o)
			cc, cluster := client.(*redis.ClusterClient)
			var masters map[string]time.Duration
			if cluster && m.dst == &creates {
				masters = masterMarks(ctx, cc)
			}
			start := time.Now()
			r, err := measure(ctx, m.concurrency, o.duration, m.fn)
			if err != nil {
				return err
			}
			r.redisCPU, r.toolCPU = before.busy(markCPU(ctx, client))
			if masters != nil {
				rep.createMasters = mastersBusy(ctx, cc, masters, masterMarks(ctx, cc), time.Since(start), redisdb.Keys.Single())
			}
			*m.dst = append(*m.dst, r)
			if m.dst == &creates || m.dst == &singles {
				// A createPost run leaves fan-out jobs queued; the
				// next run starts once the workers are done with them.
				d, err := waitDrained(ctx, db, 5*time.Minute)
				if err != nil {
					return err
				}
				if m.dst == &creates {
					posts := r.rate * r.took.Seconds()
					drains = append(drains, d)
					done = append(done, posts/(r.took+d).Seconds())
					cpus = append(cpus, perPost(before, markCPU(ctx, client), server, serverCPU(o), posts))
				}
			}
		}
	}
	rep.home, rep.typename, rep.raw = median(homes), median(types), median(raws)
	rep.create, rep.createSingle = median(creates), median(singles)
	rep.drain, rep.createDone, rep.createCPU = medianOf(drains), medianOf(done), medianPostCPU(cpus)

	if rep.fan, err = measureFanOut(ctx, db, rdb, hc, gql, rep.fanAuthors, o); err != nil {
		return fmt.Errorf("fan-out: %w", err)
	}
	if o.fanoutBusy {
		if rep.busy, err = measureBusy(ctx, db, hc, gql, rep.fan, rep.fanAuthors, create, o); err != nil {
			return err
		}
	}
	if o.compactHomes > 0 {
		if rep.compact, err = measureCompact(ctx, db, rdb, hc, gql, rep.fanAuthors, o); err != nil {
			return fmt.Errorf("compact timelines: %w", err)
		}
	}
	rep.write(out)
	if o.chart != "" {
		f, err := os.Create(o.chart)
		if err != nil {
			return err
		}
		if err := writeChart(f, rep); err != nil {
			f.Close()
			return fmt.Errorf("chart: %w", err)
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(out, "\nchart: %s\n", o.chart)
	}
	return nil
}

const createPostQuery = `mutation P($b: String!) { createPost(input: {body: $b}) { post { id } } }`

// waitDrained waits until the fan-out stream holds no job, polling every
// 10ms, and returns how long that took.
func waitDrained(ctx context.Context, db *redisdb.DB, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		n, _, err := db.FanOutQueueStats(ctx)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("the fan-out queue still holds %d jobs after %s", n, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
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
	if v == nil && resp.StatusCode == http.StatusOK && bytes.HasPrefix(raw, dataFirst) && !bytes.Contains(raw, errorsKey) {
		return nil
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

// An answer that begins with its data and holds no errors key (the tool's
// queries alias no field "errors", and a string's quotes are escaped) is
// a success: postData knows one so, without parsing it. The tool shares
// the machine's CPUs with the server it measures, and parsing every
// answer was a third of its CPU time per request.
var dataFirst, errorsKey = []byte(`{"data":`), []byte(`"errors":`)

// result is one throughput run.
type result struct {
	rate              float64       // requests per second
	took              time.Duration // the run's wall time
	p50, p99          time.Duration
	redisCPU, toolCPU float64 // how busy Redis's main thread and the tool were, in CPUs; -1 if not known
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
	return result{rate: float64(len(all)) / elapsed.Seconds(), took: elapsed, p50: pct(0.50), p99: pct(0.99)}, nil
}

// median takes the median of each field of rs on its own.
func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return medianOf(v)
	}
	return result{
		rate:     pick(func(r result) float64 { return r.rate }),
		p50:      time.Duration(pick(func(r result) float64 { return float64(r.p50) })).Round(time.Microsecond),
		p99:      time.Duration(pick(func(r result) float64 { return float64(r.p99) })).Round(time.Microsecond),
		redisCPU: pick(func(r result) float64 { return r.redisCPU }),
		toolCPU:  pick(func(r result) float64 { return r.toolCPU }),
	}
}

// medianOf returns the median of v (the upper one of an even count), or
// zero for none. It does not reorder v.
func medianOf[T int | int64 | float64 | time.Duration](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// joinInts renders 1000,10000 as "1000, 10000".
func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// used by the report: the runtime the tool ran on.
func machine() string {
	return fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d)", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))
}

// endpoint is a Redis address as go-redis dials it.
type endpoint struct{ network, addr string }

// openRedis connects to a Redis URL as the server reads REDIS_URL: a URL
// of go-redis's cluster form (with addr= parameters) names a Redis
// Cluster, any other one server. It returns the addresses the URL names.
func openRedis(raw string) (redis.UniversalClient, []endpoint, error) {
	if u, err := url.Parse(raw); err == nil && u.Query().Has("addr") {
		opts, err := redis.ParseClusterURL(raw)
		if err != nil {
			return nil, nil, err
		}
		var addrs []endpoint
		for _, a := range opts.Addrs {
			addrs = append(addrs, endpoint{"tcp", a})
		}
		return redis.NewClusterClient(opts), addrs, nil
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, nil, err
	}
	return redis.NewClient(opts), []endpoint{{opts.Network, opts.Addr}}, nil
}

// flush empties the Redis (every master of a cluster).
func flush(ctx context.Context, client redis.UniversalClient) error {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FlushDB(ctx).Err()
		})
	}
	return client.FlushDB(ctx).Err()
}
