package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"golang.org/x/crypto/bcrypt"

	gqlgraph "github.com/warble/warble/graph"
	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
)

func TestLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "127.5.6.7": true,
		"10.0.0.1": false, "example.com": false, "": false,
	} {
		if got := loopback(host); got != want {
			t.Errorf("loopback(%q) = %v", host, got)
		}
	}
}

func TestRunRefusesRemoteTargets(t *testing.T) {
	for _, o := range []options{
		{serverURL: "http://example.com", redisURL: "redis://127.0.0.1:6379", users: 10, runs: 1, concurrency: 1},
		{serverURL: "http://127.0.0.1:8080", redisURL: "redis://10.1.2.3:6379", users: 10, runs: 1, concurrency: 1},
	} {
		err := run(context.Background(), o, nil)
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%+v: %v, want a refusal", o, err)
		}
	}
}

func TestMedian(t *testing.T) {
	got := median([]result{
		{rate: 3, p50: 3 * time.Millisecond, p99: 1 * time.Millisecond},
		{rate: 1, p50: 1 * time.Millisecond, p99: 9 * time.Millisecond},
		{rate: 2, p50: 2 * time.Millisecond, p99: 5 * time.Millisecond},
	})
	if got.rate != 2 || got.p50 != 2*time.Millisecond || got.p99 != 5*time.Millisecond {
		t.Errorf("median = %+v", got)
	}
}

func TestMeasure(t *testing.T) {
	r, err := measure(context.Background(), 2, 50*time.Millisecond, func(context.Context, *rand.Rand) error {
		time.Sleep(time.Millisecond)
		return nil
	})
	if err != nil || r.rate <= 0 || r.p50 <= 0 || r.p99 < r.p50 {
		t.Errorf("measure = %+v, %v", r, err)
	}
	boom := errors.New("boom")
	if _, err := measure(context.Background(), 2, time.Second, func(context.Context, *rand.Rand) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("measure with failing requests: %v", err)
	}
}

func TestParseSizes(t *testing.T) {
	for _, c := range []struct {
		in    string
		users int
		want  []int
	}{
		{"auto", 30, []int{10, 100}},
		{"auto", 2000, []int{1000, 10000, 100000}},
		{"none", 2000, nil},
		{"", 2000, nil},
		{"0", 2000, nil},
		{"100000, 1000,1000", 2000, []int{1000, 100000}},
	} {
		got, err := parseSizes(c.in, c.users)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("parseSizes(%q, %d) = %v, %v; want %v", c.in, c.users, got, err, c.want)
		}
	}
	for _, in := range []string{"10,x", "-5", "1,,2"} {
		if _, err := parseSizes(in, 2000); err == nil {
			t.Errorf("parseSizes(%q) took it", in)
		}
	}
}

// sampleReport is a report with made-up figures: some targets met, some
// missed, one size not pushed.
func sampleReport() *report {
	return &report{
		opts:     options{users: 2000, posts: 5, runs: 5, duration: 3 * time.Second, concurrency: 16, fewFollowers: 1000, fanoutSizes: []int{1000, 10000, 100000}, pullThreshold: 1000000, note: "commit <abc> & co"},
		home:     result{rate: 700, p50: 19 * time.Millisecond, p99: 97 * time.Millisecond},
		typename: result{rate: 10000, p50: time.Millisecond, p99: 8 * time.Millisecond},
		raw:      result{rate: 2000, p50: 2 * time.Millisecond, p99: 19 * time.Millisecond},
		create:   result{rate: 1000, p50: 5 * time.Millisecond, p99: 12 * time.Millisecond},
		fan: []fanResult{
			{followers: 1000, runs: 5, after: 8 * time.Millisecond, total: 10 * time.Millisecond, rate: 1e5, rawTook: 3 * time.Millisecond, rawRate: 3.3e5},
			{followers: 10000, runs: 5, after: 80 * time.Millisecond, total: 90 * time.Millisecond, rate: 1.1e5, rawTook: 20 * time.Millisecond, rawRate: 2e5},
			{followers: 100000, notPushed: "not pushed: the server pulls"},
		},
	}
}

func TestTargets(t *testing.T) {
	got := map[string]string{}
	for _, tg := range sampleReport().targets() {
		state := "missed"
		if !tg.measured {
			state = "not measured"
		} else if tg.met() {
			state = "met"
		}
		got[tg.name] = state
	}
	want := map[string]string{
		"home page / { __typename } rate":                                            "missed", // 0.07
		"home page / raw Redis page rate":                                            "met",    // 0.35
		"fan-out / raw ZADD rate, 1000 followers":                                    "missed", // 0.30
		"fan-out / raw ZADD rate, 10000 followers":                                   "met",    // 0.55
		"fan-out / raw ZADD rate, 100000 followers":                                  "not measured",
		"fan-out to 10000 followers, from createPost's answer to the last timeline":  "met", // 80ms
		"fan-out to 100000 followers, from createPost's answer to the last timeline": "not measured",
		"createPost p99, authors with ≤ 1000 followers, 16 in flight":                "missed", // 12ms
		"createPost p99, authors with ≤ 1000 followers, one at a time":               "met",    // 4ms
	}
	for name, state := range want {
		if got[name] != state {
			t.Errorf("%s: %q, want %q", name, got[name], state)
		}
	}
	if len(got) != len(want) {
		t.Errorf("targets: %v", got)
	}
}

func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{
		1343612 * time.Microsecond: "1.34s",
		145220 * time.Microsecond:  "145ms",
		7446 * time.Microsecond:    "7.45ms",
		530 * time.Microsecond:     "530µs",
		80 * time.Millisecond:      "80ms",
	} {
		if got := short(d); got != want {
			t.Errorf("short(%s) = %s, want %s", d, got, want)
		}
	}
}

func TestChart(t *testing.T) {
	var b strings.Builder
	if err := writeChart(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	// Well-formed XML, with the note's markup escaped.
	d := xml.NewDecoder(strings.NewReader(svg))
	var texts []string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if c, ok := tok.(xml.CharData); ok && strings.TrimSpace(string(c)) != "" {
			texts = append(texts, string(c))
		}
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{"commit <abc> & co", "home page / { __typename } rate", "0.07×", "10000 followers", "80ms", "8ms", "target ≤ 100 ms", "target ≤ 1 s", "not pushed", "p99, 16 in flight", "p99, one at a time", "target ≥ 0.35×"} {
		if !strings.Contains(all, want) {
			t.Errorf("chart lacks %q; its text:\n%s", want, all)
		}
	}
	if !strings.HasPrefix(svg, `<svg xmlns="http://www.w3.org/2000/svg"`) {
		t.Errorf("chart starts %.60q", svg)
	}
}

// TestRunTiny runs the whole tool on a tiny graph against a real Redis and
// a Warble server in this process (the GraphQL handler and fan-out workers
// as the server wires them), and checks that it reports every figure. The
// figures themselves mean nothing here and are not checked.
func TestRunTiny(t *testing.T) {
	srv, _, url := startWarble(t, 2)
	chart := filepath.Join(t.TempDir(), "chart.svg")
	var out strings.Builder
	o := options{
		serverURL: url, redisURL: srv.URL, users: 12, maxFollow: 5, posts: 2, runs: 2,
		duration: 50 * time.Millisecond, concurrency: 2, seed: 1,
		fanoutSizes: []int{7, 30}, fanoutTimeout: time.Minute, fanoutBusy: true, fewFollowers: 1000, chart: chart,
		compactHomes: 30, homeCap: 1000, listpackEntries: []int{128, 1128},
		sockets: 10, liveIdle: 10 * time.Millisecond,
	}
	compact := []string{
		"compact timelines: 30 home timelines filled to the cap (1000 post ids",
		"| 128 | skiplist (skiplist) |", "| 1128 | listpack (listpack) |", "memory, limit 128 / limit 1128: ",
	}
	if srv.Embedded() { // no encodings, no MEMORY USAGE
		o.compactHomes, compact = 0, nil
	}
	gc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gc)
	err := run(context.Background(), o, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	// The live scenario turns the collector off around its measured post.
	if after := debug.SetGCPercent(gc); after != gc {
		t.Errorf("after run, GC percent %d, want %d as before", after, gc)
	}
	report := out.String()
	for _, want := range append(compact,
		"seeded 12 users", "seeded 30 more users straight into Redis",
		"live: 10 subscribers (8 on globalTimeline, 2 on their homeTimeline)", "; lost 0; ",
		"CPU from the post to its last delivery (", "): server -, this tool ",
		"| `homeTimeline(first: 20)` with authors, HTTP |", "| `{ __typename }`, HTTP |",
		"| same page, go-redis directly", "| `createPost`, HTTP, by the 12 users with ≤ 1000 followers",
		"| `createPost`, the same, one request at a time |",
		"home page / `__typename`: ", "The server's FANOUT_PULL_THRESHOLD was not given",
		"\n| 7 | ", "\n| 30 | ", "| fan-out / raw ZADD rate, 30 followers ≥ 0.50× |",
		"chart: "+chart,
	) {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	// A post's CPU: the server's is not known (it runs in this process,
	// and no -server-pid was given), the tool's always is.
	if !regexp.MustCompile(`CPU a post at concurrency 2, from a run's start to its drain's end \(medians\): server - \(its workers included\), Redis main thread (-|[0-9.]+[nµm]?s), this tool [0-9.]+[nµm]?s\n`).MatchString(report) {
		t.Errorf("report lacks a post's CPU:\n%s", report)
	}
	// Each author posted at least once in each of the 2 busy runs.
	if busy := regexp.MustCompile(`(?m)^\| (7|30) \| [0-9.]+[µm]?s \| ([0-9]+) \| [0-9]+ \|`).FindAllStringSubmatch(report, -1); len(busy) != 2 {
		t.Errorf("report lacks the -fanout-busy rows for 7 and 30 followers:\n%s", report)
	} else {
		for _, m := range busy {
			if n, _ := strconv.Atoi(m[2]); n < 2 {
				t.Errorf("the author with %s followers posted %d times in 2 busy runs:\n%s", m[1], n, report)
			}
		}
	}
	if strings.Contains(report, "| not pushed: ") || strings.Contains(report, "| not delivered: ") {
		t.Errorf("fan-out did not reach every follower:\n%s", report)
	}
	if svg, err := os.ReadFile(chart); err != nil || !bytes.Contains(svg, []byte("30 followers")) {
		t.Errorf("chart: %v\n%s", err, svg)
	}
	// The tool refuses to seed over data.
	if err := run(context.Background(), options{serverURL: url, redisURL: srv.URL, users: 12, runs: 1, concurrency: 1}, io.Discard); err == nil || !strings.Contains(err.Error(), "-flush") {
		t.Errorf("run on a Redis with data: %v", err)
	}
}

func TestPerPost(t *testing.T) {
	ms := time.Millisecond
	before := cpuMark{redis: 10 * ms, tool: 100 * ms}
	after := cpuMark{redis: 30 * ms, tool: 104 * ms}
	got := perPost(before, after, 50*ms, 90*ms, 100)
	if want := (postCPU{server: 400 * time.Microsecond, redis: 200 * time.Microsecond, tool: 40 * time.Microsecond}); got != want {
		t.Errorf("perPost = %+v, want %+v", got, want)
	}
	// Unknown readings, and a run without posts, give -1.
	got = perPost(cpuMark{redis: -1, tool: 100 * ms}, after, -1, 90*ms, 100)
	if got.server != -1 || got.redis != -1 || got.tool != 40*time.Microsecond {
		t.Errorf("perPost with unknown readings = %+v", got)
	}
	if got := perPost(before, after, 50*ms, 90*ms, 0); got != (postCPU{-1, -1, -1}) {
		t.Errorf("perPost of no posts = %+v", got)
	}
	// Medians over the runs where a part is known.
	runs := []postCPU{{3, 30, 300}, {1, 10, -1}, {2, -1, 200}, {5, 20, -1}}
	if got := medianPostCPU(runs); got != (postCPU{3, 20, 300}) {
		t.Errorf("medianPostCPU = %+v, want {3 20 300}", got)
	}
	if got := medianPostCPU([]postCPU{{-1, 5, -1}}); got != (postCPU{-1, 5, -1}) {
		t.Errorf("medianPostCPU, parts known in no run = %+v", got)
	}
	if micros(-1) != "-" || micros(1234567*time.Nanosecond) != "1.235ms" {
		t.Errorf("micros: %q, %q", micros(-1), micros(1234567*time.Nanosecond))
	}
}

// startWarble starts a real Redis and a Warble server in this process on
// it: the GraphQL handler and workers fan-out workers, wired as the server
// wires them. It returns the Redis, a DB on it and the server's URL.
func startWarble(t *testing.T, workers int) (*redistest.Server, *redisdb.DB, string) {
	t.Helper()
	srv := redistest.New(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	db := redisdb.NewDB(srv.Client(t), redisdb.Options{BcryptCost: bcrypt.MinCost, AsyncFanOut: true, Logger: quiet})
	hub := redisdb.NewHub(db)
	t.Cleanup(func() { hub.Close() })
	resolver := &gqlgraph.Resolver{
		Users:   redisdb.NewUserService(db),
		Auth:    redisdb.NewAuthService(db),
		Posts:   redisdb.NewPostService(db),
		Follows: redisdb.NewFollowService(db),
		Live:    hub,
	}
	h := gqlgraph.AuthMiddleware(gqlgraph.NewHandler(gqlgraph.HandlerConfig{Resolver: resolver, Sessions: hub, Logger: quiet}))
	mux := http.NewServeMux()
	mux.Handle("POST /graphql", h)
	mux.Handle("GET /graphql", h) // the live subscribers
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range workers {
		w := redisdb.NewWorker(db, redisdb.WorkerOptions{IdleLook: 50 * time.Millisecond})
		wg.Go(func() { w.Run(ctx) })
	}
	return srv, db, ts.URL
}

// TestFanOutNotPushed checks that a post that does not reach every
// follower is reported, not waited for forever: when its job leaves the
// queue without delivering (as when the server pulls the author's posts),
// and when nothing takes the job in time.
func TestFanOutNotPushed(t *testing.T) {
	ctx := context.Background()
	srv, db, url := startWarble(t, 0) // no workers: the test plays them
	rdb := newRawDB(db.Client())
	authors, err := seedFans(ctx, db, rdb, []int{3})
	if err != nil {
		t.Fatal(err)
	}
	w, err := rdb.watchFanOut(ctx, authors[0].id)
	if err != nil || len(w.followers) != 3 {
		t.Fatalf("watchFanOut: %v", err)
	}
	hc := &http.Client{Timeout: 10 * time.Second}

	// A "worker" that drops every job undone, as one that pulls would.
	client := srv.Client(t)
	dropJobs := func() {
		keys, err := redistest.Keys(ctx, client, "*")
		if err != nil {
			t.Error(err)
		}
		for _, k := range keys {
			if client.Type(ctx, k).Val() == "stream" {
				client.Del(ctx, k)
			}
		}
	}

	for i, watch := range []bool{true, false} {
		_, why, err := fanOutOnce(ctx, db, rdb, hc, url+"/graphql", authors[0], w, i, 200*time.Millisecond, watch)
		if err != nil || !strings.HasPrefix(why, "not delivered: 3 of 3 ") {
			t.Errorf("with no worker, watch %v: %q, %v", watch, why, err)
		}
		dropJobs() // the next run starts on an empty queue
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				dropJobs()
			}
		}
	})
	for i, watch := range []bool{true, false} {
		_, why, err := fanOutOnce(ctx, db, rdb, hc, url+"/graphql", authors[0], w, 2+i, time.Minute, watch)
		if err != nil || !strings.HasPrefix(why, "not pushed: ") {
			t.Errorf("with the job dropped, watch %v: %q, %v", watch, why, err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestCPUMarks(t *testing.T) {
	if runtime.GOOS == "linux" && procCPU("self") < 0 {
		t.Error("procCPU cannot read /proc/self/stat")
	}
	srv := redistest.New(t)
	m := markCPU(context.Background(), srv.Client(t))
	if !srv.Embedded() && m.redis < 0 {
		t.Error("markCPU cannot read Redis's INFO cpu")
	}
	if runtime.GOOS == "linux" && procCPU(strconv.Itoa(os.Getpid())) < 0 {
		t.Error("procCPU cannot read this process's stat by its pid")
	}
	if procCPU("no-such-process") != -1 {
		t.Error("procCPU of no process is not -1")
	}
	if since(time.Second, 3*time.Second) != 2*time.Second || since(-1, time.Second) != -1 || since(time.Second, -1) != -1 {
		t.Error("since is wrong")
	}
	a := cpuMark{at: time.Unix(10, 0), redis: time.Second, tool: -1}
	b := cpuMark{at: time.Unix(12, 0), redis: 2 * time.Second, tool: time.Second}
	if r, tool := a.busy(b); r != 0.5 || tool != -1 {
		t.Errorf("busy = %v, %v", r, tool)
	}
	if percent(0.504) != "50%" || percent(1.5) != "150%" || percent(-1) != "-" {
		t.Errorf("percent: %s %s %s", percent(0.504), percent(1.5), percent(-1))
	}
}

func TestParseLimits(t *testing.T) {
	got, err := parseLimits("128, cap,5000", 1000)
	if err != nil || !slices.Equal(got, []int{128, 1128, 5000}) {
		t.Errorf("parseLimits = %v, %v", got, err)
	}
	for _, in := range []string{"x", "-1", "128,,cap"} {
		if _, err := parseLimits(in, 1000); err == nil {
			t.Errorf("parseLimits(%q) took it", in)
		}
	}
}

func TestMessageType(t *testing.T) {
	for msg, want := range map[string]string{
		`{"type":"next","id":"1","payload":{"data":{}}}`: "next",
		`{"id":"1","type":"next","payload":{"data":{}}}`: "next",
		`{"type":"ping"}`: "ping",
		`{"type":"error","id":"1","payload":[{"message":"no"}]}`:    "error",
		`{"type":"complete","id":"1"}`:                              "complete",
		`{"type":"nextish"}`:                                        "nextish",
		`not json`:                                                  "",
		`{"payload":{"type":"next"},"type":"complete","id":"1"}`:    "complete",
		`{"type":"next"}`:                                           "next",
		`{"type":"next"   ,"id":"1"}`:                               "next",
		`{"type":"connection_ack","payload":{"type":"next","x":1}}`: "connection_ack",
	} {
		if got := messageType([]byte(msg)); got != want {
			t.Errorf("messageType(%s) = %q, want %q", msg, got, want)
		}
	}
}

func TestReadAll(t *testing.T) {
	buf := make([]byte, 0, 4)
	for _, msg := range []string{"ab", "a longer message than the buffer", "", "xyz"} {
		var err error
		// iotest.OneByteReader: a message that arrives a byte at a time.
		if buf, err = readAll(iotest.OneByteReader(strings.NewReader(msg)), buf[:0]); err != nil || string(buf) != msg {
			t.Errorf("readAll = %q, %v; want %q", buf, err, msg)
		}
	}
	if cap(buf) < len("a longer message than the buffer") {
		t.Errorf("the buffer did not keep its growth: cap %d", cap(buf))
	}
	failing := iotest.TimeoutReader(iotest.OneByteReader(strings.NewReader("abc")))
	if _, err := readAll(failing, nil); err == nil {
		t.Error("readAll of a reader that fails returned no error")
	}
}

func TestPostDataChecksTheAnswer(t *testing.T) {
	answers := map[string]struct {
		status int
		body   string
		ok     bool
	}{
		"data":                 {200, `{"data":{"createPost":{"post":{"id":"1"}}}}`, true},
		"data with a quote":    {200, `{"data":{"b":"say \"errors\": none"}}`, true},
		"errors first":         {200, `{"errors":[{"message":"no"}],"data":null}`, false},
		"errors after data":    {200, `{"data":null,"errors":[{"message":"no"}]}`, false},
		"data, bad status":     {500, `{"data":{}}`, false},
		"not json":             {200, `oops`, false},
		"data with extensions": {200, `{"data":{"x":1},"extensions":{"a":1}}`, true},
	}
	for name, a := range answers {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(a.status)
			io.WriteString(w, a.body)
		}))
		err := post(context.Background(), srv.Client(), srv.URL, "", `{ x }`, nil)
		if (err == nil) != a.ok {
			t.Errorf("%s: post = %v, want ok %v", name, err, a.ok)
		}
		srv.Close()
	}
}
