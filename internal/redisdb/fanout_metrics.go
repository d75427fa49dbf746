package redisdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FanOutQueueStats reports how many fan-out jobs the stream holds (waiting
// or in progress: a job leaves the stream when it is done) and how long the
// oldest has waited, from its entry id's milliseconds. For metrics, read at
// each scrape: one round trip of XLEN and XRANGE COUNT 1 on one key.
func (db *DB) FanOutQueueStats(ctx context.Context) (int64, time.Duration, error) {
	pipe := db.client.Pipeline()
	n := pipe.XLen(ctx, fanoutStreamKey)
	first := pipe.XRangeN(ctx, fanoutStreamKey, "-", "+", 1)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, fmt.Errorf("fan-out queue stats: %w", err)
	}
	msgs := first.Val()
	if len(msgs) == 0 {
		return n.Val(), 0, nil
	}
	ms, _, _ := strings.Cut(msgs[0].ID, "-")
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return n.Val(), 0, fmt.Errorf("fan-out queue stats: entry id %q", msgs[0].ID)
	}
	return n.Val(), max(0, db.opts.Now().Sub(time.UnixMilli(at))), nil
}
