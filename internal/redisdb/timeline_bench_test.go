package redisdb

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/warble/warble/internal/warble"
)

// BenchmarkFindTimeline reads the first home page of 20 posts by 5 authors,
// the page that BenchmarkHomePage in internal/app sends through the whole
// GraphQL stack, one page at a time: what the read path costs on its own,
// without HTTP and GraphQL around it, in the CPU time of this process
// (cpu-µs/op) and of Redis (redis-µs/op) per page.
func BenchmarkFindTimeline(b *testing.B) {
	ctx := context.Background()
	db := newTestDB(b, Options{})
	reader := mustSignup(b, db, "reader")
	for i := range 5 {
		author := mustSignup(b, db, fmt.Sprintf("author%d", i))
		mustFollow(b, db, reader.ID, author.ID)
		for j := range 5 {
			mustCreatePost(b, db, author.ID, fmt.Sprintf("post %d of %d", j, i))
		}
	}
	posts := NewPostService(db)
	page := func() {
		tl, err := posts.FindTimeline(ctx, warble.HomeFeed(reader.ID), warble.PageArgs{First: 20})
		if err != nil || len(tl.Edges) != 20 {
			b.Fatalf("FindTimeline = %v, %v; want 20 posts", tl, err)
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
}

// processCPU returns the user and system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
