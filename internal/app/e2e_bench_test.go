package app

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"
)

// BenchmarkRequests compares, in one run, requests of a signed-in user
// against { __typename } on the same server: the cost of authentication,
// of a home page of 20 posts with their authors, and of a post to 20
// followers, over the bare HTTP and GraphQL plumbing. Run with
//
//	go test -run '^$' -bench BenchmarkRequests -benchmem -cpu 2 .
//
// and read the ratios of the ns/op figures to typename's; the load tool
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
		})
	}
}
