package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/warble/warble/internal/redisdb"
)

// busyResult is createPost timed while a large author keeps posting.
type busyResult struct {
	followers int           // the large author's
	every     time.Duration // how often it posted
	posted    int           // its posts during the runs, in all
	create    result        // createPost of the small authors, medians over the runs
}

// measureBusy times createPost by the small authors (create, at the tool's
// concurrency) while each measured fan-out author in turn posts once every
// median request → last timeline of its own fan-out measured alone, so
// that one of its fan-outs is under way for most of the run. It answers
// how much a large fan-out in progress costs other writers: the fan-out's
// pipelines and the createPost commands wait in the same Redis.
func measureBusy(ctx context.Context, db *redisdb.DB, hc *http.Client, endpoint string, fans []fanResult, authors []fanAuthor, create func(context.Context, *rand.Rand) error, o options) ([]busyResult, error) {
	var results []busyResult
	for i, f := range fans {
		if f.runs == 0 || f.total <= 0 {
			continue // not pushed: the server pulls this author's posts
		}
		res := busyResult{followers: f.followers, every: f.total}
		var runs []result
		for run := range o.runs {
			if _, err := waitDrained(ctx, db, 5*time.Minute); err != nil {
				return nil, err
			}
			r, posted, err := whileBusy(ctx, hc, endpoint, authors[i], f.total, run, func() (result, error) {
				before := markCPU(ctx, db.Client())
				r, err := measure(ctx, o.concurrency, o.duration, create)
				r.redisCPU, r.toolCPU = before.busy(markCPU(ctx, db.Client()))
				return r, err
			})
			if err != nil {
				return nil, fmt.Errorf("createPost while an author with %d followers posts: %w", f.followers, err)
			}
			res.posted += posted
			runs = append(runs, r)
		}
		res.create = median(runs)
		results = append(results, res)
	}
	if _, err := waitDrained(ctx, db, 5*time.Minute); err != nil {
		return nil, err
	}
	return results, nil
}

// whileBusy runs fn while a posts once every interval, and answers fn's
// result and how many posts a wrote meanwhile.
func whileBusy(ctx context.Context, hc *http.Client, endpoint string, a fanAuthor, every time.Duration, run int, fn func() (result, error)) (result, int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var posted atomic.Int64
	errc := make(chan error, 1)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for n := 0; ; n++ {
			err := post(ctx, hc, endpoint, a.token, createPostQuery, map[string]any{"b": fmt.Sprintf("busy %d.%d", run, n)})
			if ctx.Err() != nil {
				errc <- nil
				return
			} else if err != nil {
				errc <- err
				return
			}
			posted.Add(1)
			select {
			case <-ctx.Done():
				errc <- nil
				return
			case <-t.C:
			}
		}
	}()
	r, err := fn()
	cancel()
	if berr := <-errc; err == nil {
		err = berr
	}
	return r, int(posted.Load()), err
}

// writeBusy prints measureBusy's results next to createPost alone.
func (r *report) writeBusy(out io.Writer) {
	if len(r.busy) == 0 {
		return
	}
	fmt.Fprintf(out, "\n`createPost` by the same %d small authors at concurrency %d while one large author posts again and again (-fanout-busy), medians of %d runs:\n\n",
		r.createAuthors, r.opts.concurrency, r.opts.runs)
	fmt.Fprintf(out, "| large author's followers | one post every | its posts | requests/s | p50 | p99 | Redis main thread busy | tool busy |\n|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(out, "| none | | | %.0f | %s | %s | %s | %s |\n", r.create.rate, r.create.p50, r.create.p99, percent(r.create.redisCPU), percent(r.create.toolCPU))
	for _, b := range r.busy {
		fmt.Fprintf(out, "| %d | %s | %d | %.0f | %s | %s | %s | %s |\n", b.followers, b.every.Round(100*time.Microsecond), b.posted,
			b.create.rate, b.create.p50, b.create.p99, percent(b.create.redisCPU), percent(b.create.toolCPU))
	}
}
