package redisdb

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warble/warble/internal/warble"
)

// BenchmarkReadsPastRedis compares, in one run, timeline pages that Redis
// holds with the same kind of page read past it: a user's posts page from
// the posts set and one from the archive (on a private MariaDB), and a home
// page within the cap and one past it, by pull from the posts sets of the
// 50 accounts the reader follows and the archive (and from the posts sets
// alone, without an archive). Each page is 20 posts with their authors, at
// the service (no HTTP), 16 reads in flight. Run with
//
//	go test -run '^$' -bench BenchmarkReadsPastRedis -cpu 2 ./internal/redisdb
//
// and read the ratios of req/s and p99-ms side by side.
func BenchmarkReadsPastRedis(b *testing.B) {
	ctx := context.Background()
	const follows, postsEach = 50, 10
	seed := func(db *DB, archived bool) (reader string, authors []string) {
		reader = mustSignup(b, db, "reader").ID
		for i := range follows {
			a := mustSignup(b, db, fmt.Sprint("author", i)).ID
			mustFollow(b, db, reader, a)
			authors = append(authors, a)
		}
		byAuthor := map[string][]*warble.Post{}
		for j := range postsEach {
			for _, a := range authors {
				byAuthor[a] = append(byAuthor[a], mustCreatePost(b, db, a, fmt.Sprint("post ", j, " by ", a)))
			}
		}
		if archived {
			// The older half of each account's posts in the archive.
			for _, a := range authors {
				archivePosts(b, db, byAuthor[a][:postsEach/2]...)
			}
		}
		return reader, authors
	}
	db, arch := newArchivedDB(b, Options{HomeCap: 100})
	reader, authors := seed(db, true)
	inRedis := mustSignup(b, db, "inredis").ID
	moved := mustSignup(b, db, "moved").ID
	var movedPosts []*warble.Post
	for range 60 {
		mustCreatePost(b, db, inRedis, "a post that stays in Redis")
		movedPosts = append(movedPosts, mustCreatePost(b, db, moved, "a post that moves to the archive"))
	}
	archivePosts(b, db, movedPosts[:40]...)
	plain := newTestDB(b, Options{HomeCap: 100})
	plainReader, _ := seed(plain, false)

	// after returns the cursor after the n-th post of feed.
	after := func(db *DB, feed warble.Feed, n int) *string {
		var cursor *string
		for n > 0 {
			first := min(n, warble.MaxPageSize)
			tl, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: first, After: cursor})
			if err != nil || len(tl.Edges) != first {
				b.Fatalf("FindTimeline(%s, %d): %v", feed, first, err)
			}
			cursor, n = tl.PageInfo.EndCursor, n-first
		}
		return cursor
	}
	cases := []struct {
		name string
		db   *DB
		feed warble.Feed
		at   int // the page starts after this many posts
	}{
		{"user/redis", db, warble.UserFeed(inRedis), 20},
		{"user/archive", db, warble.UserFeed(moved), 20},
		{"home/within-cap", db, warble.HomeFeed(reader), 20},
		{"home/past-cap", db, warble.HomeFeed(reader), 300},
		{"home/past-cap-no-archive", plain, warble.HomeFeed(plainReader), 300},
	}
	for _, c := range cases {
		page := warble.PageArgs{First: 20, After: after(c.db, c.feed, c.at)}
		if tl, err := NewPostService(c.db).FindTimeline(ctx, c.feed, page); err != nil || len(tl.Edges) != 20 {
			b.Fatalf("%s: page of %d posts, err %v", c.name, len(tl.Edges), err)
		}
		b.Run(c.name, func(b *testing.B) {
			measureReads(b, func() error {
				_, err := NewPostService(c.db).FindTimeline(ctx, c.feed, page)
				return err
			})
		})
	}
	// The archive's share of the page past the cap: its one query, for
	// the 50 accounts and the reader, alone.
	seq, err := warble.ParsePostCursor(*after(db, warble.HomeFeed(reader), 300))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("home/past-cap-archive-query", func(b *testing.B) {
		measureReads(b, func() error {
			_, err := arch.PostsByAuthors(ctx, append(authors, reader), seq, 21)
			return err
		})
	})
}

// measureReads runs read b.N times, 16 at a time on 2 CPUs, and reports
// reads per second and the 99th percentile latency.
func measureReads(b *testing.B, read func() error) {
	var mu sync.Mutex
	var took []time.Duration
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			if err := read(); err != nil {
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
	p99 := took[(len(took)*99)/100]
	b.ReportMetric(float64(len(took))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
}
