package redistest

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips is a go-redis hook that counts round trips to Redis: each
// command sent alone and each pipeline counts once. Add it to a client with
// AddHook and read N before and after the work measured. The handshake of
// a new connection (HELLO, CLIENT SETINFO) is not counted: it is the
// pool's, made whenever concurrent work needs one more connection, and not
// the cost of the work.
type RoundTrips struct{ n atomic.Int64 }

var _ redis.Hook = (*RoundTrips)(nil)

// N returns the round trips counted so far.
func (c *RoundTrips) N() int64 { return c.n.Load() }

// DialHook implements redis.Hook.
func (c *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return !handshake(c) }) {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// handshake reports whether cmd is one that go-redis sends on a new
// connection before any other.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}
