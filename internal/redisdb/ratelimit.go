package redisdb

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/warble/warble/internal/warble"
)

// RateLimiter implements warble.RateLimiter with redis_rate, a GCRA
// (generic cell rate algorithm) limiter in one Lua script per call: one key
// per kind and subject, holding the time the next event is due, expiring
// when the subject's budget is full again. Limits hold across every Warble
// process that shares the Redis.
type RateLimiter struct{ limiter *redis_rate.Limiter }

// NewRateLimiter returns a RateLimiter over db's client.
func NewRateLimiter(db *DB) *RateLimiter {
	return &RateLimiter{limiter: redis_rate.NewLimiter(db.client)}
}

var _ warble.RateLimiter = (*RateLimiter)(nil)

// Take implements warble.RateLimiter.
func (l *RateLimiter) Take(ctx context.Context, kind, subject string, r warble.Rate) error {
	res, err := l.limiter.Allow(ctx, rateKey(kind, subject), limitOf(r))
	if err != nil {
		return fmt.Errorf("rate limit %s of %s: %w", kind, subject, err)
	}
	if res.Allowed == 0 {
		return warble.RateLimited(res.RetryAfter)
	}
	return nil
}

// Check implements warble.RateLimiter. redis_rate answers an event of cost
// 0 with how many events the budget still holds, counting none; fewer than
// one means the next would be refused.
func (l *RateLimiter) Check(ctx context.Context, kind, subject string, r warble.Rate) error {
	lim := limitOf(r)
	res, err := l.limiter.AllowN(ctx, rateKey(kind, subject), lim, 0)
	if err != nil {
		return fmt.Errorf("rate limit %s of %s: %w", kind, subject, err)
	}
	if res.Remaining >= 1 {
		return nil
	}
	// The budget holds one event again once the time due for the next
	// event (now + ResetAfter) is no more than Burst-1 intervals ahead.
	interval := lim.Period / time.Duration(lim.Rate)
	return warble.RateLimited(res.ResetAfter - time.Duration(lim.Burst-1)*interval)
}

// Count implements warble.RateLimiter. An event past the limit is not
// recorded by redis_rate, which is right for failures: the budget is
// already empty, and Check refuses until it refills.
func (l *RateLimiter) Count(ctx context.Context, kind, subject string, r warble.Rate) error {
	if _, err := l.limiter.Allow(ctx, rateKey(kind, subject), limitOf(r)); err != nil {
		return fmt.Errorf("rate limit %s of %s: %w", kind, subject, err)
	}
	return nil
}

func limitOf(r warble.Rate) redis_rate.Limit {
	return redis_rate.Limit{Rate: r.Events, Period: r.Per, Burst: r.Burst}
}
