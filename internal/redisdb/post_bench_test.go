package redisdb

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// BenchmarkSmallPost splits what Redis spends on a post by an author with
// 20 followers, whose home timelines are full (1,000 entries), into its
// parts, one at a time on one connection: a round trip that does nothing
// (PING), CreatePost as a request makes it (the signed-in author: the
// seq, then the atomic step), the post's fan-out job run by one worker,
// and the job's delivery call alone (deliverBatchScript for the 20). It
// reports Redis's CPU time per operation (redis-µs/op, all its threads)
// and the round trips (round-trips/op). Run with
//
//	go test -run '^$' -bench BenchmarkSmallPost -cpu 2 ./internal/redisdb
//
// BenchmarkRequests (internal/app) measures whole requests, 16 in flight.
func BenchmarkSmallPost(b *testing.B) {
	ctx := context.Background()
	db := newTestDB(b, Options{AsyncFanOut: true})
	if db.onCluster() {
		b.Skip("on one Redis")
	}
	author := mustSignup(b, db, "author")
	fans := manyFollowers(b, db, author.ID, 20)
	pipe := db.client.Pipeline()
	for _, f := range fans {
		pipe.Set(ctx, seenKey(f), time.Now().UnixMilli(), 0)
		for i := 1; i <= db.opts.HomeCap; i++ {
			pipe.ZAdd(ctx, homeKey(f), redis.Z{Score: float64(i), Member: "9:" + strconv.Itoa(i)})
		}
	}
	pipe.Set(ctx, postSeqKey, db.opts.HomeCap, 0)
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	posts := NewPostService(db)
	signedIn := warble.NewContextWithUser(ctx, author)
	loner := mustSignup(b, db, "loner")
	alone := warble.NewContextWithUser(ctx, loner)
	mustCreatePost(b, db, author.ID, "loads the scripts, makes the group")
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	measure := func(b *testing.B, run func()) {
		cpu, trips := redisCPU(b, db), counter.N()
		b.ResetTimer()
		run()
		b.StopTimer()
		b.ReportMetric((redisCPU(b, db)-cpu)*1e6/float64(b.N), "redis-µs/op")
		b.ReportMetric(float64(counter.N()-trips)/float64(b.N), "round-trips/op")
	}

	b.Run("ping", func(b *testing.B) {
		measure(b, func() {
			for range b.N {
				db.client.Ping(ctx)
			}
		})
	})
	b.Run("request", func(b *testing.B) {
		measure(b, func() {
			for range b.N {
				if _, err := posts.CreatePost(signedIn, author.ID, "a post to 20 followers"); err != nil {
					b.Fatal(err)
				}
			}
		})
		drainFanOut(b, db)
	})
	b.Run("nobody", func(b *testing.B) {
		// A post by an author whom no one follows, with its job, if it
		// has one, run to its end by one worker.
		w := NewWorker(db, WorkerOptions{})
		measure(b, func() {
			for range b.N {
				if _, err := posts.CreatePost(alone, loner.ID, "a post to no one"); err != nil {
					b.Fatal(err)
				}
			}
			runUntilDrained(b, db, w)
		})
	})
	b.Run("job", func(b *testing.B) {
		for range b.N {
			if _, err := posts.CreatePost(signedIn, author.ID, "a post to 20 followers"); err != nil {
				b.Fatal(err)
			}
		}
		w := NewWorker(db, WorkerOptions{})
		measure(b, func() {
			for {
				n, err := w.step(ctx)
				if err != nil {
					b.Fatal(err)
				} else if n == 0 {
					return
				}
			}
		})
	})
	b.Run("deliverBatch", func(b *testing.B) {
		// Seqs of posts of its own, newer than every one in the homes.
		last, err := db.client.IncrBy(ctx, postSeqKey, int64(b.N)).Result()
		if err != nil {
			b.Fatal(err)
		}
		seq0 := last - int64(b.N) + 1
		script := db.pub(deliverBatchScript)
		measure(b, func() {
			for i := range b.N {
				seq := seq0 + int64(i)
				id := author.ID + ":" + strconv.FormatInt(seq, 10)
				keys := make([]string, 0, 3*len(fans))
				args := []any{seq, id, author.ID, db.opts.HomeCap, encodeAdded(seq, id), db.inactiveCutoff()}
				for _, f := range fans {
					keys = append(keys, homeKey(f), followingKey(f), seenKey(f))
					args = append(args, homeChannel(f))
				}
				args = append(args, trimFlags(fans, strconv.FormatInt(seq, 10)))
				if err := runScript(ctx, db.client, script, keys, args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkWalkedJob compares, for a job that walks its author's followers,
// raw deliveries (rawdelivery.go) with the guarded script, the author's
// followers side known good either way, and for as many followers as a
// post's job carries, with the carried job's guarded pipeline
// (fanOutCarried): per job, one at a time by one worker with the server's
// batch (DefaultBatch), Redis's CPU and this process's per delivery, the
// round trips, and the job's time (ns/op). It is what rawJob's rule, and
// the carried jobs' pipeline, rest on. Run with
//
//	go test -run '^$' -bench BenchmarkWalkedJob -cpu 2 ./internal/redisdb
func BenchmarkWalkedJob(b *testing.B) {
	ctx := context.Background()
	carriedUpTo := min(rawMinFollowers-1, DefaultPullThreshold) // carriedFollowers
	for _, n := range []int{20, 100, 250, 300, 500, 1000, 2000, 4000} {
		for _, path := range []string{"raw", "guarded", "carried"} {
			if path == "carried" && n > carriedUpTo {
				continue
			}
			b.Run(fmt.Sprintf("followers=%d/%s", n, path), func(b *testing.B) {
				db := newTestDB(b, Options{AsyncFanOut: true})
				if db.onCluster() {
					b.Skip("raw deliveries are for one Redis")
				}
				db.rawFrom = map[string]int{"raw": 1, "guarded": math.MaxInt}[path] // a carried job never asks
				author := mustSignup(b, db, "author")
				fans := manyFollowers(b, db, author.ID, n)
				pipe := db.client.Pipeline()
				for _, f := range fans {
					pipe.Set(ctx, seenKey(f), time.Now().UnixMilli(), 0)
				}
				pipe.HSet(ctx, userKey(author.ID), followersCheckedField, "1")
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
				mustCreatePost(b, db, author.ID, "loads the scripts, makes the group")
				drainFanOut(b, db)
				var last string
				for range b.N {
					p, err := NewPostService(db).CreatePost(ctx, author.ID, "a post to its followers")
					if err != nil {
						b.Fatal(err)
					}
					last = p.ID
					if path != "carried" && n <= db.carriedFollowers() {
						// A job that walks its followers, as one the outbox
						// sweep queued.
						requeueWithoutFollowers(b, db, p.ID)
					}
				}
				w := NewWorker(db, WorkerOptions{})
				counter := &redistest.RoundTrips{}
				db.client.AddHook(counter)
				cpu, own, trips := redisCPU(b, db), processCPU(), counter.N()
				b.ResetTimer()
				runUntilDrained(b, db, w)
				b.StopTimer()
				deliveries := float64(n * b.N)
				b.ReportMetric((redisCPU(b, db)-cpu)*1e6/deliveries, "redis-µs/delivery")
				b.ReportMetric(float64((processCPU()-own).Nanoseconds())/1e3/deliveries, "cpu-µs/delivery")
				b.ReportMetric(float64(counter.N()-trips)/float64(b.N), "round-trips/job")
				if got := holding(b, db, fans, last); got != n {
					b.Fatalf("%d of %d followers hold the last post", got, n)
				}
			})
		}
	}
}
