package app

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
	reader := s.signup(b, "reader")
	for i := range 5 {
		author := s.signup(b, fmt.Sprintf("author%d", i))
		s.follow(b, reader, author)
		for j := range 5 {
			s.post(b, author, fmt.Sprintf("post %d of %d", j, i))
		}
	}
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
		{"home", reader.Token, `{ homeTimeline(first: 20) { edges { cursor node { id body createdAt author { id username } } } pageInfo { hasNextPage endCursor } } }`},
		{"createPost", poster.Token, `mutation { createPost(input: {body: "a post to 20 followers"}) { post { id } } }`},
	} {
		body := mustJSON(map[string]any{"query": bench.query})
		b.Run(bench.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			cpu0, redis0 := processCPU(), redisCPU(b, s)
			b.SetParallelism(8) // 16 requests in flight on 2 CPUs, as the load tool sends
			b.RunParallel(func(pb *testing.PB) {
				var out bytes.Buffer
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", bytes.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					if bench.token != "" {
						req.Header.Set("Authorization", "Bearer "+bench.token)
					}
					resp, err := client.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					out.Reset()
					io.Copy(&out, resp.Body)
					resp.Body.Close()
					// A request that failed is cheap and would flatter the figures.
					if resp.StatusCode != http.StatusOK || bytes.Contains(out.Bytes(), []byte(`"errors"`)) {
						b.Fatalf("status %d: %s", resp.StatusCode, out.Bytes())
					}
				}
			})
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64((redisCPU(b, s)-redis0).Microseconds())/float64(b.N), "redis-µs/op")
		})
	}
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
