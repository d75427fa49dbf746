package app

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// BenchmarkRequests compares, in one run, a home page of 20 posts with
// their authors against { __typename } on the same server: the cost of a
// page over the bare HTTP and GraphQL plumbing. Run with
//
//	go test -run '^$' -bench BenchmarkRequests -cpu 2 .
//
// and read the ratio of the two ns/op figures; the load tool
// (internal/loadtest) measures the same at fixed concurrency.
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
	eventually(b, "the posts reach the reader", func() bool { return len(s.home(b, reader, 20).Edges) == 20 })
	for _, bench := range []struct {
		name, token, query string
	}{
		{"typename", "", `{ __typename }`},
		{"home", reader.Token, `{ homeTimeline(first: 20) { edges { cursor node { id body createdAt author { username displayName } } } pageInfo { hasNextPage endCursor } } }`},
	} {
		body := mustJSON(map[string]any{"query": bench.query})
		b.Run(bench.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			b.SetParallelism(8) // 16 requests in flight on 2 CPUs, as the load tool sends
			b.RunParallel(func(pb *testing.PB) {
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
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		})
	}
}
