package redisdb

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// scriptLoads remembers which scripts this process has loaded, so that
// pipelines can send EVALSHA without a failed first round trip.
var scriptLoads sync.Map // *redis.Script -> struct{}

// runScripts runs the commands fill queues, EVALSHAs of scripts among
// them, as one pipeline. Each script is loaded at its first use; when Redis
// answers NOSCRIPT anyway (a SCRIPT FLUSH, a restart or a failover since),
// the scripts are loaded again and the whole pipeline runs once more, which
// is why every command that runScripts runs must be idempotent.
func runScripts(ctx context.Context, c redis.UniversalClient, fill func(redis.Pipeliner), scripts ...*redis.Script) error {
	load := func(force bool) error {
		for _, script := range scripts {
			if _, ok := scriptLoads.Load(script); ok && !force {
				continue
			}
			if err := script.Load(ctx, c).Err(); err != nil {
				return err
			}
			scriptLoads.Store(script, struct{}{})
		}
		return nil
	}
	if err := load(false); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			fill(pipe)
			return nil
		})
		noScript := redis.HasErrorPrefix(err, "NOSCRIPT")
		for _, cmd := range cmds {
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				noScript = true
			}
		}
		if !noScript || attempt > 0 {
			return err
		}
		if err := load(true); err != nil {
			return err
		}
	}
}

// runScript runs one script by EVALSHA, as runScripts runs a pipeline of
// them, without the pipeline: for a request that waits on that script
// alone, go-redis's pipeline costs allocations and CPU for nothing. The
// script is loaded at its first use, and again, and run once more, when
// Redis answers NOSCRIPT (then it ran nothing).
func runScript(ctx context.Context, c redis.UniversalClient, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	for attempt := 0; ; attempt++ {
		if _, ok := scriptLoads.Load(script); !ok || attempt > 0 {
			if err := script.Load(ctx, c).Err(); err != nil {
				cmd := redis.NewCmd(ctx)
				cmd.SetErr(err)
				return cmd
			}
			scriptLoads.Store(script, struct{}{})
		}
		cmd := script.EvalSha(ctx, c, keys, args...)
		if attempt > 0 || !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			return cmd
		}
	}
}

// pubScript is a Lua script that announces what it wrote on a timeline
// channel, in the two forms of Redis pub/sub: classic PUBLISH, and the
// sharded SPUBLISH of Redis 7 that a cluster needs (see DB.sharded). Its
// source is written with PUBLISH; the sharded form is the same source with
// SPUBLISH (and PUBSUB SHARDNUMSUB for NUMSUB, which counts the
// subscribers of that form). A channel it publishes on carries the hash tag
// of the keys it writes (see keys.go), which SPUBLISH in a script requires
// on a cluster.
type pubScript struct{ classic, sharded *redis.Script }

func newPubScript(src string) pubScript {
	sharded := strings.NewReplacer("redis.call('PUBLISH',", "redis.call('SPUBLISH',",
		"redis.call('PUBSUB', 'NUMSUB',", "redis.call('PUBSUB', 'SHARDNUMSUB',").Replace(src)
	return pubScript{classic: redis.NewScript(src), sharded: redis.NewScript(sharded)}
}

// pub returns the form of s that db's Redis takes.
func (db *DB) pub(s pubScript) *redis.Script {
	if db.sharded {
		return s.sharded
	}
	return s.classic
}

// publish announces message on channel through c (db's client or a
// pipeline of it), as the scripts do: SPUBLISH on a cluster, else PUBLISH.
func (db *DB) publish(ctx context.Context, c redis.Cmdable, channel string, message any) *redis.IntCmd {
	if db.sharded {
		return c.SPublish(ctx, channel, message)
	}
	return c.Publish(ctx, channel, message)
}
