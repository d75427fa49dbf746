package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redisdb"
)

// Compact timelines: what a full home timeline costs in memory, and what
// fan-out to full home timelines costs in time, under each sorted-set
// listpack limit (zset-max-listpack-entries): below the home cap, every
// full home timeline is a skiplist; at it or above, a listpack.

// compactResult is one listpack limit's figures.
type compactResult struct {
	limit         int    // zset-max-listpack-entries during the measurement
	encoding      string // of a full home timeline, once filled
	encodingAfter string // of the same timeline after the fan-out runs
	homes         int
	usedPerHome   float64 // used_memory grown by the filled timelines, per timeline, bytes
	usagePerHome  int64   // MEMORY USAGE (SAMPLES 0), median of a sample of them, bytes
	fan           fanResult
}

// compactSeqBase is where the filler posts' seqs start, and the post
// counter is moved past compactSeqBase+cap, so that the posts of the
// fan-out runs are newer than every filler entry and land at the head of a
// full timeline, as a new post does.
const compactSeqBase = 1_000_000_000

// fillerEntries returns the entries of a full home timeline: cap post ids
// as a service of a few million users and a billion posts has them (a
// 7-digit author, a 10-digit seq: 18 bytes), scored by their seq.
func fillerEntries(homeCap int) []redis.Z {
	z := make([]redis.Z, homeCap)
	for j := range z {
		seq := compactSeqBase + j
		z[j] = redis.Z{Score: float64(seq), Member: strconv.Itoa(1_000_000+j*7919%9_000_000) + ":" + strconv.Itoa(seq)}
	}
	return z
}

// measureCompact fills the home timelines of the followers of the fan-out
// author with the most followers, at most o.compactHomes, to the home cap,
// under each listpack limit of o.listpackEntries in turn, and reads what
// they take (used_memory before and after, MEMORY USAGE); then it times
// o.runs posts by the author reaching every one of those full timelines.
// It runs last: it replaces those followers' home timelines with filler,
// and moves the post counter on. It leaves the limit as it found it.
func measureCompact(ctx context.Context, db *redisdb.DB, rdb *rawDB, hc *http.Client, endpoint string, authors []fanAuthor, o options) ([]compactResult, error) {
	var author *fanAuthor
	for i, a := range authors {
		if a.followers <= o.compactHomes && (author == nil || a.followers > author.followers) {
			author = &authors[i]
		}
	}
	if author == nil {
		return nil, fmt.Errorf("no fan-out author has at most %d followers (-compact-homes, -fanout-sizes)", o.compactHomes)
	}
	client := db.Client()
	w, err := rdb.watchFanOut(ctx, author.id)
	if err != nil {
		return nil, err
	}
	homes := make([]string, len(w.followers))
	for i, f := range w.followers {
		homes[i] = redisdb.Keys.Home(f)
	}
	found, err := listpackLimit(ctx, client)
	if err != nil {
		return nil, err
	}
	defer setListpackLimit(context.WithoutCancel(ctx), client, found)
	seqKey := redisdb.Keys.PostSeq()
	if seq, err := client.Get(ctx, seqKey).Int64(); err != nil && err != redis.Nil {
		return nil, err
	} else if seq < compactSeqBase+int64(o.homeCap) {
		if err := client.Set(ctx, seqKey, compactSeqBase+2*o.homeCap, 0).Err(); err != nil {
			return nil, err
		}
	}
	filler := fillerEntries(o.homeCap)

	var results []compactResult
	for _, limit := range o.listpackEntries {
		if _, err := waitDrained(ctx, db, 5*time.Minute); err != nil {
			return nil, err
		}
		if err := setListpackLimit(ctx, client, limit); err != nil {
			return nil, err
		}
		if err := forChunks(ctx, client, homes, func(pipe redis.Pipeliner, key string) { pipe.Del(ctx, key) }); err != nil {
			return nil, err
		}
		before, err := usedMemory(ctx, client)
		if err != nil {
			return nil, err
		}
		if err := forChunks(ctx, client, homes, func(pipe redis.Pipeliner, key string) { pipe.ZAdd(ctx, key, filler...) }); err != nil {
			return nil, err
		}
		after, err := usedMemory(ctx, client)
		if err != nil {
			return nil, err
		}
		r := compactResult{limit: limit, homes: len(homes), usedPerHome: float64(after-before) / float64(len(homes))}
		var usage []int64
		for _, key := range homes[:min(25, len(homes))] {
			n, err := client.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				return nil, err
			}
			usage = append(usage, n)
		}
		r.usagePerHome = medianOf(usage)
		if r.encoding, err = client.ObjectEncoding(ctx, homes[0]).Result(); err != nil {
			return nil, err
		}

		// Fan-out to the full timelines, one post at a time.
		var samples []fanSample
		for i := range o.runs {
			s, why, err := compactFanOutOnce(ctx, db, hc, endpoint, *author, w, i, o.fanoutTimeout)
			if err != nil {
				return nil, err
			}
			if why != "" {
				r.fan.notPushed = why
				break
			}
			samples = append(samples, s)
		}
		r.fan.followers, r.fan.runs = len(homes), len(samples)
		if len(samples) > 0 {
			r.fan.answer = medianOf(sampleField(samples, func(s fanSample) time.Duration { return s.answer })).Round(10 * time.Microsecond)
			r.fan.after = medianOf(sampleField(samples, func(s fanSample) time.Duration { return s.after })).Round(10 * time.Microsecond)
			r.fan.total = medianOf(sampleField(samples, func(s fanSample) time.Duration { return s.total })).Round(10 * time.Microsecond)
			r.fan.rate = float64(len(homes)) / r.fan.total.Seconds()
			cpu := make([]float64, len(samples))
			for i, s := range samples {
				cpu[i] = s.redisCPU
			}
			r.fan.redisCPU = medianOf(cpu)
		}
		if r.encodingAfter, err = client.ObjectEncoding(ctx, homes[0]).Result(); err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

func sampleField(samples []fanSample, f func(fanSample) time.Duration) []time.Duration {
	v := make([]time.Duration, len(samples))
	for i, s := range samples {
		v[i] = f(s)
	}
	return v
}

// compactFanOutOnce is fanOutOnce without the raw ZADD pipeline after it:
// that adds an entry to each full timeline without trimming, which would
// take a listpack past its limit and make it a skiplist for good.
func compactFanOutOnce(ctx context.Context, db *redisdb.DB, hc *http.Client, endpoint string, a fanAuthor, w *fanOutWatch, i int, timeout time.Duration) (fanSample, string, error) {
	cpu, start, answered, err := postWhenIdle(ctx, db, hc, endpoint, a, w, fmt.Sprintf("compact %d", i))
	if err != nil {
		return fanSample{}, "", err
	}
	for {
		n, err := w.poll(ctx)
		if err != nil {
			return fanSample{}, "", err
		}
		now := time.Now()
		if n == 0 {
			s := fanSample{answer: answered.Sub(start), after: now.Sub(answered), total: now.Sub(start)}
			s.redisCPU, _ = cpu.busy(markCPU(ctx, db.Client()))
			return s, "", nil
		}
		if now.Sub(answered) > timeout {
			return fanSample{}, fmt.Sprintf("not delivered: %d of %d full home timelines lacked the post %s after createPost answered", n, len(w.followers), timeout), nil
		}
		time.Sleep(time.Millisecond)
	}
}

// forChunks queues fn for each key on pipelines of a few hundred keys.
func forChunks(ctx context.Context, client redis.UniversalClient, keys []string, fn func(redis.Pipeliner, string)) error {
	for chunk := range slices.Chunk(keys, 200) {
		pipe := client.Pipeline()
		for _, k := range chunk {
			fn(pipe, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// eachServer calls fn on every server behind client: each node of a
// cluster (masters and replicas, as Warble's REDIS_SET_LISTPACK does), or
// the one server.
func eachServer(ctx context.Context, client redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, fn)
	}
	c, ok := client.(*redis.Client)
	if !ok {
		return fmt.Errorf("client %T", client)
	}
	return fn(ctx, c)
}

// listpackLimit returns zset-max-listpack-entries of the first server.
func listpackLimit(ctx context.Context, client redis.UniversalClient) (int, error) {
	var once sync.Once
	limit, first := 0, error(nil)
	err := eachServer(ctx, client, func(ctx context.Context, c *redis.Client) error {
		v, err := c.ConfigGet(ctx, "zset-max-listpack-entries").Result()
		once.Do(func() { limit, first = atoiOr(v["zset-max-listpack-entries"], -1), err })
		return err
	})
	if err == nil {
		err = first
	}
	if err == nil && limit < 0 {
		err = fmt.Errorf("this Redis has no zset-max-listpack-entries (Redis 7 or later is needed)")
	}
	return limit, err
}

func atoiOr(s string, or int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return or
	}
	return n
}

// setListpackLimit sets zset-max-listpack-entries on every server.
func setListpackLimit(ctx context.Context, client redis.UniversalClient, limit int) error {
	return eachServer(ctx, client, func(ctx context.Context, c *redis.Client) error {
		return c.ConfigSet(ctx, "zset-max-listpack-entries", strconv.Itoa(limit)).Err()
	})
}

// usedMemory returns used_memory summed over the masters.
func usedMemory(ctx context.Context, client redis.UniversalClient) (int64, error) {
	var mu sync.Mutex
	var total int64
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return err
				}
				mu.Lock()
				total += n
				mu.Unlock()
				return nil
			}
		}
		return fmt.Errorf("no used_memory in INFO memory")
	}
	var err error
	if cc, ok := client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, read)
	} else if c, ok := client.(*redis.Client); ok {
		err = read(ctx, c)
	}
	return total, err
}

// parseLimits reads -listpack-entries: limits, "cap" standing for the
// limit Warble asks for with a home cap of homeCap (the cap plus the slack
// of fan-out's amortized trim, redisdb.ListpackEntries).
func parseLimits(s string, homeCap int) ([]int, error) {
	var limits []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "cap" {
			limits = append(limits, redisdb.ListpackEntries(homeCap))
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is neither a limit (0 or more) nor cap", f)
		}
		limits = append(limits, n)
	}
	return limits, nil
}

// writeCompact prints the compact timelines section of the report.
func (r *report) writeCompact(out io.Writer) {
	if len(r.compact) == 0 {
		return
	}
	c0 := r.compact[0]
	fmt.Fprintf(out, "\ncompact timelines: %d home timelines filled to the cap (%d post ids of 18 bytes each), under each `zset-max-listpack-entries`; then fan-out of one post at a time to all of them, medians of up to %d runs.\n\n",
		c0.homes, r.opts.homeCap, r.opts.runs)
	fmt.Fprintf(out, "| zset-max-listpack-entries | encoding (after fan-out) | used_memory per home timeline | MEMORY USAGE per home timeline | used_memory for %d | fan-out: answer → last timeline | request → last timeline | insertions/s | Redis main thread busy | Redis time per insertion |\n", c0.homes)
	fmt.Fprintf(out, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range r.compact {
		perInsert := "-"
		if c.fan.redisCPU >= 0 && c.fan.runs > 0 {
			perInsert = (time.Duration(c.fan.redisCPU*float64(c.fan.total)) / time.Duration(c.homes)).Round(10 * time.Nanosecond).String()
		}
		fan := fmt.Sprintf("%s | %s | %.0f | %s | %s", c.fan.after, c.fan.total, c.fan.rate, percent(c.fan.redisCPU), perInsert)
		if c.fan.runs == 0 {
			fan = cell(c.fan.notPushed) + " | | | |"
		}
		fmt.Fprintf(out, "| %d | %s (%s) | %.1f KB | %.1f KB | %.1f MB | %s |\n", c.limit, c.encoding, c.encodingAfter,
			c.usedPerHome/1000, float64(c.usagePerHome)/1000, c.usedPerHome*float64(c.homes)/1e6, fan)
	}
	if len(r.compact) >= 2 {
		a, b := r.compact[0], r.compact[len(r.compact)-1]
		line := fmt.Sprintf("\nmemory, limit %d / limit %d: %.2f×", a.limit, b.limit, a.usedPerHome/b.usedPerHome)
		if a.fan.runs > 0 && b.fan.runs > 0 {
			line += fmt.Sprintf("; fan-out insertions/s, limit %d / limit %d: %.2f×", b.limit, a.limit, b.fan.rate/a.fan.rate)
		}
		fmt.Fprintln(out, line)
	}
}
