package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/warble/warble/internal/redisdb"
)

// fanResult is the fan-out of one author's posts, medians over the runs.
type fanResult struct {
	followers int
	runs      int           // runs measured
	answer    time.Duration // createPost's round trip
	after     time.Duration // from createPost's answer until the last follower's home timeline held the post
	total     time.Duration // from sending createPost until then
	rate      float64       // followers / total: timeline insertions per second, end to end
	rawTook   time.Duration // one pipeline of plain ZADDs to the same timelines
	rawRate   float64       // followers / rawTook
	redisCPU  float64       // how busy Redis's main thread was from the request to the last timeline, in CPUs; -1 if not known
	// notPushed, if set, says why the post did not reach every follower's
	// home timeline (the server pulls this author's posts, or too slow);
	// the fields above are then from the runs before, if any.
	notPushed string
}

// ratio is the fan-out's end-to-end insertion rate over the raw ZADD rate.
func (f fanResult) ratio() float64 {
	if f.runs == 0 || f.rawRate == 0 {
		return 0
	}
	return f.rate / f.rawRate
}

// fanSample is one run of fanResult.
type fanSample struct {
	answer, after, total, rawTook time.Duration
	redisCPU                      float64
}

// measureFanOut times o.runs posts by each author, one post at a time on
// an otherwise idle server: from the createPost request, and from its
// answer, until every follower's home timeline holds the post (polled from
// Redis, so asynchronous fan-out counts in full); then, each time, one
// pipeline of plain ZADDs to the same timelines (rawDB.fanOut).
func measureFanOut(ctx context.Context, db *redisdb.DB, rdb *rawDB, hc *http.Client, endpoint string, authors []fanAuthor, o options) ([]fanResult, error) {
	var results []fanResult
	for _, a := range authors {
		w, err := rdb.watchFanOut(ctx, a.id)
		if err != nil {
			return nil, err
		}
		res := fanResult{followers: len(w.followers)}
		var samples []fanSample
		for i := range o.runs {
			s, why, err := fanOutOnce(ctx, db, rdb, hc, endpoint, a, w, i, o.fanoutTimeout, !o.fanoutNoWatch)
			if err != nil {
				return nil, fmt.Errorf("author with %d followers: %w", a.followers, err)
			}
			if why != "" {
				res.notPushed = why
				break
			}
			samples = append(samples, s)
		}
		res.runs = len(samples)
		pick := func(f func(fanSample) time.Duration) time.Duration {
			v := make([]time.Duration, len(samples))
			for i, s := range samples {
				v[i] = f(s)
			}
			return medianOf(v).Round(10 * time.Microsecond)
		}
		if res.runs > 0 {
			res.answer = pick(func(s fanSample) time.Duration { return s.answer })
			res.after = pick(func(s fanSample) time.Duration { return s.after })
			res.total = pick(func(s fanSample) time.Duration { return s.total })
			res.rawTook = pick(func(s fanSample) time.Duration { return s.rawTook })
			res.rate = float64(res.followers) / res.total.Seconds()
			res.rawRate = float64(res.followers) / res.rawTook.Seconds()
			cpu := make([]float64, len(samples))
			for i, s := range samples {
				cpu[i] = s.redisCPU
			}
			res.redisCPU = medianOf(cpu)
		}
		results = append(results, res)
	}
	return results, nil
}

// postWhenIdle waits for the fan-out queue to drain (nothing queued from
// before), marks Redis's CPU, posts body as a, and points w at the new
// post. It returns the mark, when the request was sent and when it was
// answered.
func postWhenIdle(ctx context.Context, db *redisdb.DB, hc *http.Client, endpoint string, a fanAuthor, w *fanOutWatch, body string) (cpuMark, time.Time, time.Time, error) {
	if _, err := waitDrained(ctx, db, 5*time.Minute); err != nil {
		return cpuMark{}, time.Time{}, time.Time{}, err
	}
	var out struct {
		CreatePost struct{ Post struct{ ID string } }
	}
	cpu := markCPU(ctx, db.Client())
	start := time.Now()
	if err := postData(ctx, hc, endpoint, a.token, createPostQuery, map[string]any{"b": body}, &out); err != nil {
		return cpuMark{}, time.Time{}, time.Time{}, err
	}
	answered := time.Now()
	w.reset(out.CreatePost.Post.ID)
	return cpu, start, answered, nil
}

// fanOutOnce posts once as a and waits for the post to reach every
// follower's home timeline. If it does not, because the fan-out job left
// the queue without delivering to everyone (the server pulls a's posts
// instead) or in timeout, it returns why.
//
// With watch, it polls the home timelines while the fan-out runs, as
// readers would; without, it polls only the queue, which costs Redis two
// commands a millisecond, until the job has left it, and then looks at the
// timelines: the fan-out then runs alone, and its end is the job's.
func fanOutOnce(ctx context.Context, db *redisdb.DB, rdb *rawDB, hc *http.Client, endpoint string, a fanAuthor, w *fanOutWatch, i int, timeout time.Duration, watch bool) (fanSample, string, error) {
	cpu, start, answered, err := postWhenIdle(ctx, db, hc, endpoint, a, w, fmt.Sprintf("fan-out %d", i))
	if err != nil {
		return fanSample{}, "", err
	}
	var drained time.Time // without watch: when the queue was seen empty
	for !watch && drained.IsZero() {
		n, _, err := db.FanOutQueueStats(ctx)
		if err != nil {
			return fanSample{}, "", err
		}
		if n == 0 {
			drained = time.Now()
		} else if time.Since(answered) > timeout {
			break // the loop below says so
		} else {
			time.Sleep(time.Millisecond)
		}
	}
	left, progressAt, queueAt := len(w.followers), answered, time.Time{}
	for {
		// The queue is read before the timelines: if it was empty then
		// and a follower still lacks the post, the job was done before
		// the look, and it will not come.
		queued := int64(-1)
		if time.Since(queueAt) >= 50*time.Millisecond {
			n, _, err := db.FanOutQueueStats(ctx)
			if err != nil {
				return fanSample{}, "", err
			}
			queued, queueAt = n, time.Now()
		}
		n, err := w.poll(ctx)
		if err != nil {
			return fanSample{}, "", err
		}
		now := time.Now()
		if n == 0 && !drained.IsZero() {
			now = drained
		}
		if n == 0 {
			s := fanSample{answer: answered.Sub(start), after: now.Sub(answered), total: now.Sub(start)}
			s.redisCPU, _ = cpu.busy(markCPU(ctx, db.Client()))
			_, s.rawTook, err = rdb.fanOut(ctx, a.id, fmt.Sprintf("bench:%d", i))
			return s, "", err
		}
		if n < left {
			left, progressAt = n, now
		}
		if queued == 0 && now.Sub(progressAt) >= time.Second {
			return fanSample{}, fmt.Sprintf("not pushed: with no fan-out job left in the queue, %d of %d home timelines lacked the post; the server pulls this author's posts (FANOUT_PULL_THRESHOLD below %d?)",
				n, len(w.followers), len(w.followers)), nil
		}
		if now.Sub(answered) > timeout {
			return fanSample{}, fmt.Sprintf("not delivered: %d of %d home timelines lacked the post %s after createPost answered (-fanout-timeout)",
				n, len(w.followers), timeout), nil
		}
		time.Sleep(time.Millisecond)
	}
}
