package redisdb

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// BenchmarkMoveToArchive measures what the archive saves and costs, in one
// run (go test -run '^$' -bench MoveToArchive -benchtime 1x):
// ARCHIVE_BENCH_POSTS posts (default 100,000) by ARCHIVE_BENCH_AUTHORS
// authors (default 1,000), written straight into Redis as CreatePost
// leaves them (post hash, the author's posts set and home timeline), with
// 100-byte bodies; Redis's used_memory for them; then ARCHIVE_BENCH_MOVERS
// movers (default 1, as one process's workers run) move all but
// POSTS_IN_REDIS=10 per author to MariaDB, and it reports the rows moved
// per second, used_memory after, the table's size on disk, and the rate of
// home pages (first: 10, all in Redis) read by 8 goroutines with the
// movers idle and busy.
func BenchmarkMoveToArchive(b *testing.B) {
	posts := envInt("ARCHIVE_BENCH_POSTS", 100_000)
	authors := envInt("ARCHIVE_BENCH_AUTHORS", 1_000)
	movers := envInt("ARCHIVE_BENCH_MOVERS", 1)
	const keep = 10
	for b.Loop() {
		ctx := context.Background()
		db, store := newArchiveTestDB(b, Options{PostsInRedis: keep, InactiveAfter: -1})
		ids := make([]string, authors)
		for i := range authors {
			ids[i] = strconv.Itoa(i + 1)
		}
		pipe := db.client.Pipeline()
		for _, id := range ids {
			pipe.HSet(ctx, userKey(id), "username", "author"+id, "displayName", "author"+id, "createdAt", "1700000000000")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		base := usedMemory(b, db)

		body := strings.Repeat("x", 100)
		start := time.Now().Add(-time.Hour).UnixMilli()
		for seq := 1; seq <= posts; seq++ {
			author := ids[(seq-1)%authors]
			seqText := strconv.Itoa(seq)
			id := author + ":" + seqText
			pipe.HSet(ctx, postKey(author, seqText), "body", body, "createdAt", start+int64(seq))
			pipe.ZAdd(ctx, postsKey(author), redis.Z{Score: float64(seq), Member: id})
			pipe.ZAdd(ctx, homeKey(author), redis.Z{Score: float64(seq), Member: id})
			if pipe.Len() >= 3000 || seq == posts {
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		db.client.Set(ctx, postSeqKey, posts, 0)
		withPosts := usedMemory(b, db)
		now := db.now().UnixMilli()
		for _, id := range ids {
			db.markDue(ctx, pipe, id, now)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}

		idle := homePageRate(b, db, ids, 3*time.Second)
		var moved atomic.Int64
		done := make(chan struct{})
		began := time.Now()
		var wg sync.WaitGroup
		for m := range movers {
			wg.Go(func() {
				for i := m; ; i++ {
					n, found, err := db.moveDue(ctx, i)
					if err != nil {
						b.Error(err)
						return
					}
					moved.Add(int64(n))
					if !found {
						return
					}
				}
			})
		}
		go func() { wg.Wait(); close(done) }()
		time.Sleep(time.Second)
		busy := homePageRate(b, db, ids, 3*time.Second)
		select {
		case <-done:
			b.Log("the movers finished before the busy measurement ended: use more posts")
		default:
		}
		<-done
		took := time.Since(began)
		after := usedMemory(b, db)

		if _, err := store.DB().Exec("ANALYZE TABLE posts"); err != nil {
			b.Fatal(err)
		}
		var onDisk int64
		if err := store.DB().QueryRow("SELECT data_length + index_length FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'posts'").Scan(&onDisk); err != nil {
			b.Fatal(err)
		}
		want := int64(posts - keep*authors)
		if moved.Load() != want {
			b.Fatalf("moved %d posts, want %d", moved.Load(), want)
		}
		b.ReportMetric(float64(moved.Load())/took.Seconds(), "rows/s")
		b.ReportMetric(float64(withPosts-base)/float64(posts), "redis-B/post")
		b.ReportMetric(float64(withPosts-base)/1e6, "redis-MB-all-in-redis")
		b.ReportMetric(float64(after-base)/1e6, "redis-MB-archived")
		b.ReportMetric(float64(onDisk)/1e6, "mysql-MB")
		b.ReportMetric(idle, "home-pages/s-idle")
		b.ReportMetric(busy, "home-pages/s-moving")
		b.Logf("%d posts by %d authors, %d movers: %d moved in %v; Redis %.1f MB with every post, %.1f MB with %d per author; MySQL %.1f MB; home pages/s %.0f idle, %.0f moving",
			posts, authors, movers, moved.Load(), took.Round(time.Millisecond), float64(withPosts-base)/1e6, float64(after-base)/1e6, keep, float64(onDisk)/1e6, idle, busy)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// usedMemory returns Redis's used_memory.
func usedMemory(tb testing.TB, db *DB) int64 {
	tb.Helper()
	info, err := db.client.Info(context.Background(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	tb.Fatal("INFO memory has no used_memory")
	return 0
}

// homePageRate reads home pages (first: 10) of random authors from 8
// goroutines for d and returns the pages per second.
func homePageRate(tb testing.TB, db *DB, ids []string, d time.Duration) float64 {
	tb.Helper()
	svc := NewPostService(db)
	var pages atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := g; ctx.Err() == nil; i += 8 {
				_, err := svc.FindTimeline(ctx, warble.HomeFeed(ids[(i*7919)%len(ids)]), warble.PageArgs{First: 10})
				if err != nil {
					if ctx.Err() == nil {
						tb.Error(fmt.Errorf("home page: %w", err))
					}
					return
				}
				pages.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(pages.Load()) / d.Seconds()
}
