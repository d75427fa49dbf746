package redisdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// FanOutGroup is the consumer group of the fan-out workers.
const fanOutGroup = "workers"

// Job operations, the "op" field of a stream entry.
const (
	opDeliver   = "add"
	opUndeliver = "del"
)

// enqueueFanOut appends a fan-out job for a post to the stream, then takes
// it out of its author's outbox.
func (db *DB) enqueueFanOut(ctx context.Context, op, postID string) error {
	if err := db.queueJob(ctx, op, postID); err != nil {
		return err
	}
	authorID, _, _ := splitPostID(postID)
	if err := db.client.ZRem(ctx, outboxKey(authorID), outboxEntry(op, postID)).Err(); err != nil {
		// Queued already: a sweep will queue it again, harmlessly.
		db.log.WarnContext(ctx, "clear fan-out outbox", "post", postID, "err", err)
	}
	return nil
}

// queueJob appends a fan-out job for a post to the stream. Its caller takes
// the job out of the author's outbox afterwards, and only then.
func (db *DB) queueJob(ctx context.Context, op, postID string) error {
	authorID, seq, ok := splitPostID(postID)
	if !ok {
		return fmt.Errorf("fan-out job for malformed post id %q", postID)
	}
	return db.client.XAdd(ctx, &redis.XAddArgs{
		Stream: fanoutStreamKey,
		Values: []any{"op", op, "author", authorID, "seq", seq, "post", postID},
	}).Err()
}

// outboxEntry is the outbox member of a job.
func outboxEntry(op, postID string) string { return op + " " + postID }

// Sweeping the outboxes.
const (
	DefaultSweepEvery = time.Minute      // how often a sweeping worker sweeps
	sweepAfter        = 30 * time.Second // how old a job must be to be swept: younger ones may be in flight
	sweepCount        = 1000             // keys one SCAN step asks for
)

// sweepOutboxes queues the jobs that have sat in an author's outbox since
// before cutoff: their CreatePost or DeletePost died before it queued them.
// It walks the keys with SCAN (on each master of a cluster), reading only,
// and returns how many jobs it queued.
func (db *DB) sweepOutboxes(ctx context.Context, cutoff time.Time) (int, error) {
	pattern := prefix + "u:{*}:outbox"
	scan := func(ctx context.Context, c redis.Cmdable) ([]string, error) {
		var keys []string
		iter := c.Scan(ctx, 0, pattern, sweepCount).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return keys, iter.Err()
	}
	var keys []string
	var err error
	if cc, ok := db.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			found, err := scan(ctx, c)
			mu.Lock()
			keys = append(keys, found...)
			mu.Unlock()
			return err
		})
	} else {
		keys, err = scan(ctx, db.client)
	}
	if err != nil {
		return 0, fmt.Errorf("sweep fan-out outboxes: %w", err)
	}
	queued := 0
	for _, key := range keys {
		entries, err := db.client.ZRangeArgs(ctx, redis.ZRangeArgs{
			Key: key, Start: "-inf", Stop: strconv.FormatInt(cutoff.UnixMilli(), 10), ByScore: true,
		}).Result()
		if err != nil {
			return queued, fmt.Errorf("sweep fan-out outbox %s: %w", key, err)
		}
		for _, e := range entries {
			op, postID, _ := strings.Cut(e, " ")
			if (op != opDeliver && op != opUndeliver) || !isPostID(postID) {
				db.log.ErrorContext(ctx, "malformed fan-out outbox entry; dropped", "key", key, "entry", e)
				db.client.ZRem(ctx, key, e)
				continue
			}
			if err := db.enqueueFanOut(ctx, op, postID); err != nil {
				return queued, fmt.Errorf("sweep fan-out outbox %s: %w", key, err)
			}
			queued++
			db.log.WarnContext(ctx, "queued a fan-out job that its request did not", "op", op, "post", postID)
		}
	}
	return queued, nil
}

// job is one entry of the stream.
type job struct {
	id       string // the stream entry id
	op       string
	authorID string
	seq      int64
	postID   string
}

func parseJob(m redis.XMessage) (job, bool) {
	j := job{id: m.ID}
	j.op, _ = m.Values["op"].(string)
	j.authorID, _ = m.Values["author"].(string)
	j.postID, _ = m.Values["post"].(string)
	seqText, _ := m.Values["seq"].(string)
	var err error
	j.seq, err = strconv.ParseInt(seqText, 10, 64)
	ok := err == nil && (j.op == opDeliver || j.op == opUndeliver) &&
		j.postID == j.authorID+":"+seqText && isPostID(j.postID)
	return j, ok
}

func isNoGroup(err error) bool { return redis.HasErrorPrefix(err, "NOGROUP") }

// ensureGroupScript creates the consumer group if the stream exists and
// the group does not: at a worker's first start, or after Redis lost its
// data. The group starts at the beginning of the stream, so that jobs added
// before any worker ran are done. Until the first job, there is no stream
// and no group, so an idle Warble writes nothing to Redis. A group that
// exists already (another worker was first) is no error: the script
// swallows XGROUP's BUSYGROUP rather than answer with it.
//
// KEYS[1] -> w:{fanout}:jobs
// ARGV[1] -> the consumer group
//
// Returns 1 if the group exists now, 0 if there is no stream yet.
var ensureGroupScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then
	return 0
end
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')
return 1
`)

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
