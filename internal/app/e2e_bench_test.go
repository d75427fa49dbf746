package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/warble/warble/internal/warble"
)

// BenchmarkRequests compares, in one run, requests of a signed-in user
// against { __typename } on the same server: the cost of authentication,
// of a home page of 20 posts with their authors, and of a post to 20
// followers, over the bare HTTP and GraphQL plumbing. Run with
//
//	go test -run '^$' -bench BenchmarkRequests -benchmem -cpu 2 .
//
// and read the ratios of the ns/op figures to typename's; the load tool
// (internal/loadtest) measures the same at fixed concurrency. On a busy
// machine the CPU time per request is steadier than the time: cpu-µs/op is
// this process's (Warble and the benchmark's HTTP client), redis-µs/op the
// Redis server's.
func BenchmarkRequests(b *testing.B) {
	s := newTestServer(b, func(c *Config) { c.RateLimitsOn = false })
	reader := seedReader(b, s)
	poster := s.signup(b, "poster")
	for i := range 20 {
		s.follow(b, s.signup(b, fmt.Sprintf("fan%d", i)), poster)
	}
	eventually(b, "the posts reach the reader", func() bool { return len(s.home(b, reader, 20).Edges) == 20 })
	for _, bench := range []struct {
		name, token, query string
	}{
		{"typename", "", `{ __typename }`},
		{"viewer", reader.Token, `{ viewer { id username } }`},
		{"home", reader.Token, homeQuery},
		{"createPost", poster.Token, `mutation { createPost(input: {body: "a post to 20 followers"}) { post { id } } }`},
	} {
		b.Run(bench.name, func(b *testing.B) { benchRequest(b, s, s.URL, bench.token, bench.query, 16) })
	}
}

// homeQuery is the home page the issue measures: 20 posts with their
// authors, and the page's end.
const homeQuery = `{ homeTimeline(first: 20) { edges { cursor node { id body createdAt author { id username } } } pageInfo { hasNextPage endCursor } } }`

// BenchmarkHomePage compares, in one run, the home page of 20 posts with the
// same page served from memory through the same stack, and with
// { __typename }, at 16 requests in flight and one at a time. Run with
//
//	go test -run '^$' -bench BenchmarkHomePage -benchmem -cpu 2 .
//
// The in-memory server is a measuring instrument, not a way to run Warble:
// it is a second App on the same Redis, built by New like any other, whose
// post service answers FindTimeline with one page read from Redis before
// the benchmark (memoryTimeline), and whose session read does not carry the
// home timeline's range read (memoryAuth). Everything else a request goes
// through is the real thing: CORS, the body limit, the session read from Redis, the
// GraphQL handler with its middleware, metrics and loaders, and the
// response's marshalling. So home-memory is the ceiling of the page for
// this stack, and home / home-memory what the read from Redis costs it.
// The load tool (internal/loadtest) compares the page with go-redis
// reading the same page directly.
func BenchmarkHomePage(b *testing.B) {
	s := newTestServer(b, func(c *Config) { c.RateLimitsOn = false })
	reader := seedReader(b, s)
	eventually(b, "the posts reach the reader", func() bool { return len(s.home(b, reader, 20).Edges) == 20 })

	mem := startTestServer(b, s.redis, testConfig(b, func(c *Config) { c.RateLimitsOn = false; c.FanoutWorkers = 0 }), nil)
	userID, _, _ := strings.Cut(reader.Token, ".")
	page, err := mem.app.resolver.Posts.FindTimeline(context.Background(), warble.HomeFeed(userID), warble.PageArgs{First: 20})
	if err != nil || len(page.Edges) != 20 {
		b.Fatalf("FindTimeline = %d posts, %v; want 20", len(page.Edges), err)
	}
	mem.app.resolver.Posts = memoryTimeline{PostService: mem.app.resolver.Posts, page: page}
	mem.app.resolver.Auth = memoryAuth{AuthService: mem.app.resolver.Auth}

	for _, bench := range []struct {
		name     string
		url      string
		token    string
		query    string
		inFlight int
	}{
		{"typename", s.URL, "", `{ __typename }`, 16},
		{"home", s.URL, reader.Token, homeQuery, 16},
		{"home-memory", mem.URL, reader.Token, homeQuery, 16},
		{"typename-1", s.URL, "", `{ __typename }`, 1},
		{"home-1", s.URL, reader.Token, homeQuery, 1},
		{"home-memory-1", mem.URL, reader.Token, homeQuery, 1},
	} {
		b.Run(bench.name, func(b *testing.B) { benchRequest(b, s, bench.url, bench.token, bench.query, bench.inFlight) })
	}
}

// memoryTimeline is a PostService whose FindTimeline answers every feed
// with one page held in memory, for BenchmarkHomePage only. The page and
// its posts are shared by every request, as nothing in a response changes
// them.
type memoryTimeline struct {
	warble.PostService
	page *warble.Timeline
}

func (m memoryTimeline) FindTimeline(context.Context, warble.Feed, warble.PageArgs) (*warble.Timeline, error) {
	return m.page, nil
}

// memoryAuth is the AuthService of memoryTimeline's server: the session
// read alone, without the range read of the home timeline that the real
// server sends with it, which that page would not use.
type memoryAuth struct{ warble.AuthService }

func (m memoryAuth) AuthenticateForHome(ctx context.Context, token string, _ warble.PageArgs) (context.Context, *warble.User, *warble.Session, error) {
	u, s, err := m.Authenticate(ctx, token)
	return ctx, u, s, err
}

// benchRequest sends query with token to url b.N times, inFlight at a
// time (16, as the load tool sends, or 1), and fails on any error in an
// answer. Besides ns/op it reports the CPU time per request of this
// process (Warble, its fan-out workers and the benchmark's HTTP client,
// cpu-µs/op) and of s's Redis (redis-µs/op), the fan-out jobs that the
// requests queued included.
func benchRequest(b *testing.B, s *testServer, url, token, query string, inFlight int) {
	body := mustJSON(map[string]any{"query": query})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	do := func(out *bytes.Buffer) {
		req, _ := http.NewRequest(http.MethodPost, url+"/graphql", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out.Reset()
		io.Copy(out, resp.Body)
		resp.Body.Close()
		// A request that failed is cheap and would flatter the figures.
		if resp.StatusCode != http.StatusOK || bytes.Contains(out.Bytes(), []byte(`"errors"`)) {
			b.Fatalf("status %d: %s", resp.StatusCode, out.Bytes())
		}
	}
	var out bytes.Buffer
	do(&out) // opens the connection, outside the timing
	cpu0, redis0 := processCPU(), redisCPU(b, s)
	b.ResetTimer()
	if inFlight == 1 {
		for b.Loop() {
			do(&out)
		}
	} else {
		b.SetParallelism(inFlight / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			var out bytes.Buffer
			for pb.Next() {
				do(&out)
			}
		})
	}
	b.StopTimer()
	// The fan-out jobs that the requests queued are part of what they
	// cost: the clocks are read once the workers have done them all, and
	// not before (a queue left behind would also be charged to the next
	// round's requests).
	for {
		n, _, err := s.app.db.FanOutQueueStats(context.Background())
		if err != nil {
			b.Fatal(err)
		} else if n == 0 {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64((redisCPU(b, s)-redis0).Microseconds())/float64(b.N), "redis-µs/op")
}

// processCPU returns the user and system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU returns the CPU time of the test server's Redis so far.
func redisCPU(b *testing.B, s *testServer) time.Duration {
	info, err := s.app.db.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// seedReader signs up a reader who follows five authors of five posts each,
// and returns them: a home page of 20 posts by five authors.
func seedReader(b *testing.B, s *testServer) testUser {
	reader := s.signup(b, "reader")
	for i := range 5 {
		author := s.signup(b, fmt.Sprintf("author%d", i))
		s.follow(b, reader, author)
		for j := range 5 {
			s.post(b, author, fmt.Sprintf("post %d of %d", j, i))
		}
	}
	return reader
}

// liveSubscribers is how many sockets BenchmarkLiveDelivery opens.
const liveSubscribers = 1000

// BenchmarkLiveDelivery times one post to liveSubscribers subscribers of
// the global timeline, each on a websocket of its own, all with the
// selection the load tool's live scenario asks for: an op is a createPost
// and every subscriber's next message. It reports the time and this
// process's CPU per delivery, the benchmark's readers included (they
// read as little as the load tool's do), where the load tool's 10,000
// sockets measure the same with a noise too large for changes of a few
// per cent. Run with
//
//	go test -run '^$' -bench BenchmarkLiveDelivery -cpu 2 .
func BenchmarkLiveDelivery(b *testing.B) {
	s := newTestServer(b, func(c *Config) { c.RateLimitsOn = false })
	author := s.signup(b, "liveauthor")
	got := make(chan struct{}, liveSubscribers)
	for range liveSubscribers {
		c := s.connect(b, protoTransportWS, "")
		c.subscribe("1", `subscription { globalTimeline { kind cursor postId post { id body createdAt author { id username } } } }`, nil)
		go readNexts(c.conn, got)
	}
	// Every subscription is live once a post reaches them all: one whose
	// operation had not started yet misses a post for good.
	wait := func(timeout time.Duration) int {
		deadline := time.After(timeout)
		for n := range liveSubscribers {
			select {
			case <-got:
			case <-deadline:
				return n
			}
		}
		return liveSubscribers
	}
	for i := 0; ; i++ {
		s.post(b, author, "warm-up")
		if wait(10*time.Second) == liveSubscribers {
			break
		} else if i == 10 {
			b.Fatal("the subscribers never all got a post")
		}
		time.Sleep(100 * time.Millisecond)
		for len(got) > 0 {
			<-got
		}
	}
	cpu0 := processCPU()
	for b.Loop() {
		s.post(b, author, "live")
		if n := wait(time.Minute); n < liveSubscribers {
			b.Fatalf("a post reached %d of %d subscribers", n, liveSubscribers)
		}
	}
	deliveries := float64(b.N * liveSubscribers)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/deliveries, "ns/delivery")
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/deliveries, "cpu-ns/delivery")
}

// readNexts reads conn until it closes, sending on got for each next
// message (known by the beginning Warble writes them with) and answering
// pings, with one buffer for the socket's messages. It reads with no
// deadline: the one that connect set for the connection's ack would end
// the reads of a run longer than readTimeout.
func readNexts(conn *websocket.Conn, got chan<- struct{}) {
	conn.SetReadDeadline(time.Time{})
	next := []byte(`{"type":"next",`)
	var buf bytes.Buffer
	for {
		_, r, err := conn.NextReader()
		if err != nil {
			return
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return
		}
		switch msg := buf.Bytes(); {
		case bytes.HasPrefix(msg, next):
			got <- struct{}{}
		case bytes.HasPrefix(msg, []byte(`{"type":"ping"`)):
			conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"pong"}`))
		}
	}
}
