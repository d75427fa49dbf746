package redisdb

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrorHook returns a go-redis hook that calls count with the name of each
// command that fails, for metrics. A nil reply (redis.Nil) is an answer, not
// a failure, and so is NOSCRIPT, on which go-redis sends the script itself.
// HELLO and CLIENT are left out too: go-redis sends them when it connects
// (CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS) and ignores their errors from
// Redis versions that lack them; Warble sends neither. In a pipeline each
// failed command counts.
func ErrorHook(count func(command string)) redis.Hook { return errorHook{count} }

type errorHook struct{ count func(string) }

func (h errorHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h errorHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// go-redis sets cmd's error only after the hooks return.
		err := next(ctx, cmd)
		if err == nil {
			err = cmd.Err()
		}
		h.check(cmd.Name(), err)
		return err
	}
}

func (h errorHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		stamped := false
		for _, cmd := range cmds {
			if cmd.Err() != nil {
				stamped = true
				h.check(cmd.Name(), cmd.Err())
			}
		}
		if !stamped {
			h.check("pipeline", err) // failed as a whole, with no command's error set
		}
		return err
	}
}

// check counts err if it is a failure.
func (h errorHook) check(name string, err error) {
	if err == nil || errors.Is(err, redis.Nil) || strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return
	}
	switch name {
	case "hello", "client":
		return
	}
	h.count(name)
}
