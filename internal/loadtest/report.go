package main

import (
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"
	"time"
)

// report is everything one run of the tool measured.
type report struct {
	opts                        options
	home, typename, raw, create result        // at opts.concurrency
	createSingle                result        // createPost one request at a time
	createAuthors               int           // users createPost was timed for
	createMaxFollowers          int           // the most followers one of them has
	drain                       time.Duration // for the queue to empty after a createPost run
	// createDone is how many posts a second a createPost run completed,
	// answered and fanned out: its posts over the run and its drain.
	createDone float64
	createCPU  postCPU // a post's, at opts.concurrency, medians of the runs
	fanAuthors []fanAuthor
	fan        []fanResult
	busy       []busyResult    // createPost while a fan-out author keeps posting (-fanout-busy)
	compact    []compactResult // by listpack limit
	// On a Redis Cluster, each master's main thread during the last
	// concurrent createPost run, and where the single keys live.
	createMasters []masterBusy
}

// The targets of the fan-out work (issue "Fan-out at scale").
const (
	goalHomeVsTypename = 0.35 // home page rate / { __typename } rate, at least
	goalHomeVsRaw      = 0.3  // home page rate / raw Redis page rate, at least
	goalFanVsRaw       = 0.5  // fan-out insertions/s / raw ZADD insertions/s, at least
	goalCreateP99      = 10 * time.Millisecond
	goalCreateFollows  = 1000 // createPost's target is for authors with at most this many followers
)

// fanGoals are the latency targets of fan-out by follower count: from
// createPost's answer until the last follower's home timeline has the post.
var fanGoals = map[int]time.Duration{10_000: 100 * time.Millisecond, 100_000: time.Second}

// target is one figure against its target.
type target struct {
	name     string
	value    float64 // in unit
	goal     float64 // in unit
	unit     string  // "×" or "ms"
	atLeast  bool    // the value must reach the goal, not stay under it
	measured bool
	note     string // why not measured
}

func (t target) met() bool {
	if t.atLeast {
		return t.value >= t.goal
	}
	return t.value <= t.goal
}

func (t target) String() string {
	op := "≤"
	if t.atLeast {
		op = "≥"
	}
	return fmt.Sprintf("%s %s %s", t.name, op, formatUnit(t.goal, t.unit))
}

func formatUnit(v float64, unit string) string {
	if unit == "×" {
		return fmt.Sprintf("%.2f×", v)
	}
	if unit == "ms" && v >= 1000 {
		return fmt.Sprintf("%.3g s", v/1000)
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// targets returns every target with what this run measured for it.
func (r *report) targets() []target {
	ts := []target{
		{name: "home page / { __typename } rate", value: r.home.rate / r.typename.rate, goal: goalHomeVsTypename, unit: "×", atLeast: true, measured: true},
		{name: "home page / raw Redis page rate", value: r.home.rate / r.raw.rate, goal: goalHomeVsRaw, unit: "×", atLeast: true, measured: true},
	}
	for _, f := range r.fan {
		t := target{name: fmt.Sprintf("fan-out / raw ZADD rate, %d followers", f.followers), value: f.ratio(), goal: goalFanVsRaw, unit: "×", atLeast: true, measured: f.runs > 0, note: f.notPushed}
		ts = append(ts, t)
	}
	for _, n := range slices.Sorted(maps.Keys(fanGoals)) {
		t := target{name: fmt.Sprintf("fan-out to %d followers, from createPost's answer to the last timeline", n), goal: ms(fanGoals[n]), unit: "ms", note: "not measured (-fanout-sizes)"}
		for _, f := range r.fan {
			if f.followers == n {
				t.value, t.measured, t.note = ms(f.after), f.runs > 0, f.notPushed
			}
		}
		ts = append(ts, t)
	}
	for _, c := range []struct {
		how string
		r   result
	}{{fmt.Sprintf("%d in flight", r.opts.concurrency), r.create}, {"one at a time", r.createSingle}} {
		t := target{name: fmt.Sprintf("createPost p99, authors with ≤ %d followers, %s", goalCreateFollows, c.how), value: ms(c.r.p99), goal: ms(goalCreateP99), unit: "ms", measured: true}
		if r.opts.fewFollowers > goalCreateFollows {
			t.measured, t.note = false, fmt.Sprintf("measured for authors with up to %d followers (-few-followers)", r.opts.fewFollowers)
		}
		ts = append(ts, t)
	}
	return ts
}

// pullNote says which fan-out path the server takes for the sizes measured.
func (r *report) pullNote() string {
	if len(r.opts.fanoutSizes) == 0 {
		return ""
	}
	largest := slices.Max(r.opts.fanoutSizes)
	switch t := r.opts.pullThreshold; {
	case t < 0:
		return "the server ran with FANOUT_PULL_THRESHOLD=off, so every author is pushed (fan-out workers)"
	case t == 0:
		return "the server's FANOUT_PULL_THRESHOLD was not given (-pull-threshold); authors above it, if the server pulls, show as not pushed"
	case t >= largest:
		return fmt.Sprintf("the server ran with FANOUT_PULL_THRESHOLD=%d, above every size, so this is the push path (fan-out workers)", t)
	default:
		return fmt.Sprintf("the server ran with FANOUT_PULL_THRESHOLD=%d: authors with more followers are pulled at read time, not pushed", t)
	}
}

// write prints the report as Markdown tables.
func (r *report) write(out io.Writer) {
	o := r.opts
	if o.note != "" {
		fmt.Fprintf(out, "\n%s", o.note)
	}
	fmt.Fprintf(out, "\nmachine: %s; concurrency %d; %d runs of %s each, medians\n\n", machine(), o.concurrency, o.runs, o.duration)
	fmt.Fprintf(out, "| measurement | requests/s | p50 | p99 | Redis main thread busy | tool busy |\n|---|---|---|---|---|---|\n")
	row := func(name string, r result) {
		fmt.Fprintf(out, "| %s | %.0f | %s | %s | %s | %s |\n", name, r.rate, r.p50, r.p99, percent(r.redisCPU), percent(r.toolCPU))
	}
	row("`homeTimeline(first: 20)` with authors, HTTP", r.home)
	row("`{ __typename }`, HTTP", r.typename)
	row("same page, go-redis directly (range + 2 pipelines)", r.raw)
	defer r.writeMasters(out)
	row(fmt.Sprintf("`createPost`, HTTP, by the %d users with ≤ %d followers (most: %d)", r.createAuthors, o.fewFollowers, r.createMaxFollowers), r.create)
	row("`createPost`, the same, one request at a time", r.createSingle)
	fmt.Fprintf(out, "\nhome page / `__typename`: %.2f (target ≥ %.2f); home page / raw Redis: %.2f (target ≥ %.2f)\n",
		r.home.rate/r.typename.rate, goalHomeVsTypename, r.home.rate/r.raw.rate, goalHomeVsRaw)
	fmt.Fprintf(out, "the fan-out jobs each createPost run queued took %s (median) to drain after it\n", r.drain.Round(time.Millisecond))
	fmt.Fprintf(out, "posts answered and fanned out per second at concurrency %d: %.0f (median; a run's posts over its time and its drain's)\n", o.concurrency, r.createDone)
	c := r.createCPU
	fmt.Fprintf(out, "CPU a post at concurrency %d, from a run's start to its drain's end (medians): server %s (its workers included), Redis main thread %s, this tool %s\n",
		o.concurrency, micros(c.server), micros(c.redis), micros(c.tool))
	fmt.Fprintf(out, "busy: CPU time over wall time, 100%% = one CPU of %d; what is left went to the server, its workers and anything else on the machine\n", runtime.NumCPU())

	if len(r.fan) > 0 {
		how := "the tool polled the home timelines while it ran (a pipeline of ZSCOREs a millisecond)"
		if o.fanoutNoWatch {
			how = "the tool polled only the queue while it ran, and looked at the timelines once its job had left it (-fanout-no-watch)"
		}
		fmt.Fprintf(out, "\nfan-out of one post at a time on an otherwise idle server, medians of up to %d runs; %s.\n%s.\n\n", o.runs, how, upperFirst(r.pullNote()))
		fmt.Fprintf(out, "| followers | `createPost` answer | answer → last timeline | request → last timeline | Redis main thread busy | insertions/s | raw `ZADD` pipeline | raw insertions/s | fan-out / raw |\n")
		fmt.Fprintf(out, "|---|---|---|---|---|---|---|---|---|\n")
		for _, f := range r.fan {
			if f.runs == 0 {
				fmt.Fprintf(out, "| %d | %s |\n", f.followers, f.notPushed)
				continue
			}
			fmt.Fprintf(out, "| %d | %s | %s | %s | %s | %.0f | %s | %.0f | %.2f |\n",
				f.followers, f.answer, f.after, f.total, percent(f.redisCPU), f.rate, f.rawTook, f.rawRate, f.ratio())
			if f.notPushed != "" {
				fmt.Fprintf(out, "|  | later runs: %s |\n", f.notPushed)
			}
		}
	}

	r.writeBusy(out)
	r.writeCompact(out)

	fmt.Fprintf(out, "\ntargets:\n\n| target | measured | |\n|---|---|---|\n")
	for _, t := range r.targets() {
		switch {
		case !t.measured:
			fmt.Fprintf(out, "| %s | %s | not measured |\n", t, cell(t.note))
		case t.met():
			fmt.Fprintf(out, "| %s | %s | met |\n", t, formatUnit(t.value, t.unit))
		default:
			fmt.Fprintf(out, "| %s | %s | **missed** |\n", t, formatUnit(t.value, t.unit))
		}
	}
}

// cell makes s fit in a table cell.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return strings.ReplaceAll(s, "|", "/")
}

// upperFirst capitalises the first letter of s.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// writeMasters reports, on a cluster, how busy each master was during the
// last concurrent createPost run, and which master holds the keys that
// every post writes (the post sequence and the global timeline).
func (r *report) writeMasters(out io.Writer) {
	if len(r.createMasters) == 0 {
		return
	}
	fmt.Fprintf(out, "\nRedis Cluster masters during the last `createPost` run at concurrency %d:\n\n", r.opts.concurrency)
	fmt.Fprintf(out, "| master | main thread busy | holds |\n|---|---|---|\n")
	for _, m := range r.createMasters {
		fmt.Fprintf(out, "| %s | %s | %s |\n", m.addr, percent(m.busy), strings.Join(m.holds, ", "))
	}
}
