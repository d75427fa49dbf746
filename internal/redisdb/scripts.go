package redisdb

import (
	"context"
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
