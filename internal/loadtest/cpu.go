package main

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// cpuMark is how much CPU time Redis's main thread and this process had
// used at a moment, to tell how busy each was over a measurement: on a
// machine that runs the tool, the server and Redis together, it shows
// which of them a figure is limited by. A negative time is unknown.
type cpuMark struct {
	at          time.Time
	redis, tool time.Duration
}

// markCPU reads Redis's INFO cpu (the main thread's user and system time,
// or the whole process's on a Redis without those fields) and this
// process's own CPU time from /proc (Linux only).
//
// On a cluster it adds up the masters' threads: a figure is then limited
// by Redis when that sum nears the number of masters, or one master's
// share nears 1 (which INFO of each master would tell; the sum is what the
// report has room for).
func markCPU(ctx context.Context, client redis.UniversalClient) cpuMark {
	m := cpuMark{at: time.Now(), redis: -1, tool: procCPU("self")}
	if cc, ok := client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		total := time.Duration(0)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			t := redisCPU(ctx, node)
			mu.Lock()
			defer mu.Unlock()
			if t < 0 || total < 0 {
				total = -1
			} else {
				total += t
			}
			return nil
		})
		if err == nil {
			m.redis = total
		}
		return m
	}
	m.redis = redisCPU(ctx, client)
	return m
}

// redisCPU reads one Redis's main thread's CPU time (or its whole
// process's on a Redis without those fields), -1 if it cannot.
func redisCPU(ctx context.Context, client redis.Cmdable) time.Duration {
	info, err := client.Info(ctx, "cpu").Result()
	if err != nil {
		return -1
	}
	fields := map[string]float64{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if f, err := strconv.ParseFloat(v, 64); ok && err == nil {
			fields[k] = f
		}
	}
	sum := func(a, b string) (float64, bool) {
		x, ok1 := fields[a]
		y, ok2 := fields[b]
		return x + y, ok1 && ok2
	}
	if s, ok := sum("used_cpu_user_main_thread", "used_cpu_sys_main_thread"); ok {
		return time.Duration(s * float64(time.Second))
	} else if s, ok := sum("used_cpu_user", "used_cpu_sys"); ok {
		return time.Duration(s * float64(time.Second))
	}
	return -1
}

// procCPU returns the user and system CPU time of process pid ("self":
// this one), from /proc/<pid>/stat in clock ticks of 1/100 s (USER_HZ on
// Linux), or -1.
func procCPU(pid string) time.Duration {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return -1
	}
	// The command name, in parentheses, may hold spaces: count fields
	// after its closing parenthesis. utime and stime are fields 14 and 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return -1
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(u+k) * (time.Second / 100)
}

// serverCPU returns the CPU time the server has used (its process's, given
// by -server-pid), or -1 when it is not known.
func serverCPU(o options) time.Duration {
	if o.serverPID <= 0 {
		return -1
	}
	return procCPU(strconv.Itoa(o.serverPID))
}

// postCPU is the CPU time a post of a createPost run took: the server's
// (its fan-out workers included), Redis's main thread's (the masters'
// summed, on a cluster) and this tool's, from the run's start to the end of
// the drain of the fan-out jobs it queued, over the run's posts; -1 where
// not known. On a machine that runs all three, their sum is what bounds
// the rate: two CPUs give 2 s of CPU time a second.
type postCPU struct{ server, redis, tool time.Duration }

// perPost returns postCPU for posts from CPU marks and server readings
// taken before the run and after its drain.
func perPost(before, after cpuMark, server0, server1 time.Duration, posts float64) postCPU {
	each := func(d time.Duration) time.Duration {
		if d < 0 || posts < 1 {
			return -1
		}
		return time.Duration(float64(d) / posts)
	}
	return postCPU{
		server: each(since(server0, server1)),
		redis:  each(since(before.redis, after.redis)),
		tool:   each(since(before.tool, after.tool)),
	}
}

// medianPostCPU returns each part's median over the runs where it is
// known, -1 where it is known in none.
func medianPostCPU(runs []postCPU) postCPU {
	pick := func(f func(postCPU) time.Duration) time.Duration {
		var v []time.Duration
		for _, r := range runs {
			if d := f(r); d >= 0 {
				v = append(v, d)
			}
		}
		if len(v) == 0 {
			return -1
		}
		return medianOf(v)
	}
	return postCPU{
		server: pick(func(c postCPU) time.Duration { return c.server }),
		redis:  pick(func(c postCPU) time.Duration { return c.redis }),
		tool:   pick(func(c postCPU) time.Duration { return c.tool }),
	}
}

// micros renders a CPU time to the microsecond, or "-" when unknown.
func micros(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return d.Round(time.Microsecond).String()
}

// since returns b - a, two readings of one CPU clock, or -1 if either is
// unknown.
func since(a, b time.Duration) time.Duration {
	if a < 0 || b < 0 {
		return -1
	}
	return b - a
}

// busy returns how busy Redis's main thread and this process were from
// a to b, each as a share of one CPU (-1 where unknown).
func (a cpuMark) busy(b cpuMark) (redisShare, toolShare float64) {
	wall := b.at.Sub(a.at)
	share := func(x, y time.Duration) float64 {
		if x < 0 || y < 0 || wall <= 0 {
			return -1
		}
		return float64(y-x) / float64(wall)
	}
	return share(a.redis, b.redis), share(a.tool, b.tool)
}

// percent renders a share of one CPU, or "-" when unknown.
func percent(share float64) string {
	if share < 0 {
		return "-"
	}
	return strconv.Itoa(int(share*100+0.5)) + "%"
}

// masterBusy is how busy one master of a cluster was over a measurement,
// and which of the keys of note (see singleKeys) it holds.
type masterBusy struct {
	addr  string
	busy  float64
	holds []string
}

// masterMarks reads each master's main thread CPU time, by address.
func masterMarks(ctx context.Context, cc *redis.ClusterClient) map[string]time.Duration {
	var mu sync.Mutex
	out := map[string]time.Duration{}
	cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		t := redisCPU(ctx, m)
		mu.Lock()
		out[m.Options().Addr] = t
		mu.Unlock()
		return nil
	})
	return out
}

// mastersBusy returns how busy each master was between two masterMarks
// over wall, with the keys of note each holds.
func mastersBusy(ctx context.Context, cc *redis.ClusterClient, before, after map[string]time.Duration, wall time.Duration, keys map[string]string) []masterBusy {
	var out []masterBusy
	for addr, t := range after {
		m := masterBusy{addr: addr, busy: -1}
		if b, ok := before[addr]; ok && b >= 0 && t >= 0 && wall > 0 {
			m.busy = float64(t-b) / float64(wall)
		}
		for name, key := range keys {
			if node, err := cc.MasterForKey(ctx, key); err == nil && node.Options().Addr == addr {
				m.holds = append(m.holds, name)
			}
		}
		slices.Sort(m.holds)
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b masterBusy) int { return strings.Compare(a.addr, b.addr) })
	return out
}
