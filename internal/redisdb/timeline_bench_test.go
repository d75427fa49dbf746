package redisdb

import (
	"context"
	"fmt"
	"testing"

	"github.com/warble/warble/internal/warble"
)

// BenchmarkFindTimeline reads the first home page of 20 posts, one page at
// a time: what the read path costs on its own, without HTTP and GraphQL
// around it, in the CPU time of this process (cpu-µs/op) and of Redis
// (redis-µs/op) per page. "full" is the page that BenchmarkHomePage in
// internal/app sends through the whole GraphQL stack (20 of the 25 posts
// of 5 authors); "short" a home timeline of 10 posts by 2 authors, which
// a page of 20 reads to its end, as a new user's does.
func BenchmarkFindTimeline(b *testing.B) {
	ctx := context.Background()
	db := newTestDB(b, Options{})
	seedHome := func(name string, authors int) *warble.User {
		reader := mustSignup(b, db, name)
		for i := range authors {
			author := mustSignup(b, db, fmt.Sprintf("%s%d", name, i))
			mustFollow(b, db, reader.ID, author.ID)
			for j := range 5 {
				mustCreatePost(b, db, author.ID, fmt.Sprintf("post %d of %d", j, i))
			}
		}
		return reader
	}
	for _, bench := range []struct {
		name   string
		reader *warble.User
		posts  int
	}{
		{"full", seedHome("full", 5), 20},
		{"short", seedHome("short", 2), 10},
	} {
		b.Run(bench.name, func(b *testing.B) {
			posts := NewPostService(db)
			page := func() {
				tl, err := posts.FindTimeline(ctx, warble.HomeFeed(bench.reader.ID), warble.PageArgs{First: 20})
				if err != nil || len(tl.Edges) != bench.posts {
					b.Fatalf("FindTimeline = %v, %v; want %d posts", tl, err, bench.posts)
				}
			}
			page()
			cpu, redisCPU0 := processCPU(), redisCPU(b, db)
			for b.Loop() {
				page()
			}
			b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			if redisCPU0 >= 0 {
				b.ReportMetric((redisCPU(b, db)-redisCPU0)*1e6/float64(b.N), "redis-µs/op")
			}
		})
	}
}
