package app

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkReadsPastRedis compares, in one run over HTTP, pages that Redis
// holds with the same pages read past it, with an archive on a private
// MariaDB and POSTS_IN_REDIS=20:
//
//   - profile/redis and profile/archive: a user's posts page of 20, the
//     first (all in Redis) and the second (all archived);
//   - home/within-cap: a home page of 20 (HOME_TIMELINE_CAP=100) of a reader
//     following 50 accounts of 30 posts each;
//   - home/past-cap-redis: the same reader's page after 300 posts, pulled
//     from the accounts' posts sets in Redis;
//   - home/past-cap-archive: the page after 1,100 posts, past what the
//     accounts keep in Redis, pulled from the archive.
//
// Each post comes with its author; 16 requests in flight on 2 CPUs, as
// BenchmarkRequests sends. Run with
//
//	go test -run '^$' -bench BenchmarkReadsPastRedis -cpu 2 ./internal/app
//
// and read the ratios of req/s and p99-ms side by side.
func BenchmarkReadsPastRedis(b *testing.B) {
	const follows, postsEach, inRedis = 50, 30, 20
	change, store := withArchive(b, inRedis)
	s := newTestServer(b, change, func(c *Config) { c.HomeCap = 100 })
	reader := s.signup(b, "reader")
	for i := range follows {
		author := s.signup(b, fmt.Sprintf("author%d", i))
		s.follow(b, reader, author)
		for j := range postsEach {
			s.post(b, author, fmt.Sprintf("post %d of %d", j, i))
		}
	}
	profile := s.signup(b, "profile")
	for j := range 2 * inRedis {
		s.post(b, profile, fmt.Sprintf("post %d", j))
	}
	waitArchived(b, store, follows*(postsEach-inRedis)+inRedis)

	const profileQuery = `query($u: String!, $after: String) { user(username: $u) { posts(first: 20, after: $after) {
		edges { cursor node { id body createdAt author { username displayName } } } pageInfo { hasNextPage endCursor } } } }`
	const homeQuery = `query($after: String) { homeTimeline(first: 20, after: $after) {
		edges { cursor node { id body createdAt author { username displayName } } } pageInfo { hasNextPage endCursor } } }`
	// homeAfter returns the cursor after the n newest posts of the
	// reader's home timeline.
	homeAfter := func(n int) string {
		var after *string
		for n > 0 {
			first := min(n, 100)
			var out struct{ HomeTimeline timelinePage }
			s.mustQuery(b, reader.Token, `query($n: Int, $after: String) { homeTimeline(first: $n, after: $after) { `+timelineFields+` } }`,
				map[string]any{"n": first, "after": after}, &out)
			if len(out.HomeTimeline.Edges) != first {
				b.Fatalf("home page of %d has %d posts", first, len(out.HomeTimeline.Edges))
			}
			after, n = out.HomeTimeline.PageInfo.EndCursor, n-first
		}
		return *after
	}
	var firstProfile struct{ User struct{ Posts timelinePage } }
	s.mustQuery(b, "", profileQuery, map[string]any{"u": profile.Username}, &firstProfile)

	for _, c := range []struct {
		name, token, query string
		vars               map[string]any
	}{
		{"profile/redis", "", profileQuery, map[string]any{"u": profile.Username}},
		{"profile/archive", "", profileQuery, map[string]any{"u": profile.Username, "after": *firstProfile.User.Posts.PageInfo.EndCursor}},
		{"home/within-cap", reader.Token, homeQuery, map[string]any{"after": homeAfter(20)}},
		{"home/past-cap-redis", reader.Token, homeQuery, map[string]any{"after": homeAfter(300)}},
		{"home/past-cap-archive", reader.Token, homeQuery, map[string]any{"after": homeAfter(1100)}},
	} {
		body := mustJSON(map[string]any{"query": c.query, "variables": c.vars})
		// Each page must be a full page of posts, not an error.
		if res := s.query(b, c.token, c.query, c.vars); len(res.Errors) > 0 || bytes.Count(res.Data, []byte(`"cursor"`)) != 20 {
			b.Fatalf("%s: %s %v", c.name, res.Data, res.Errors)
		}
		b.Run(c.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			measureRequests(b, func() error {
				req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if c.token != "" {
					req.Header.Set("Authorization", "Bearer "+c.token)
				}
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d", resp.StatusCode)
				}
				return nil
			})
		})
	}
}

// measureRequests runs send b.N times, 16 at a time on 2 CPUs, and reports
// requests per second and the 99th percentile latency.
func measureRequests(b *testing.B, send func() error) {
	var mu sync.Mutex
	var took []time.Duration
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := send(); err != nil {
				b.Error(err)
				return
			}
			mine = append(mine, time.Since(t0))
		}
		mu.Lock()
		took = append(took, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	b.ReportMetric(float64(len(took))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}
