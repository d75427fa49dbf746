package redisdb

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// FanOutGroup is the consumer group of the fan-out workers.
const fanOutGroup = "workers"

// Job operations, the "op" field of a stream entry (and opBuckets, see
// buckets.go).
const (
	opDeliver   = "add"
	opUndeliver = "del"
)

// fanOutShard returns the shard of an author's fan-out jobs: the same one
// for all of them, so that an author's jobs are done in the order queued
// when one worker is free, as with a single stream.
func (db *DB) fanOutShard(authorID string) int { return shardOf(authorID, db.opts.FanOutShards) }

// shardOf returns the fan-out shard of a user among shards.
func shardOf(userID string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(userID))
	return int(h.Sum32() % uint32(shards))
}

// indexJob records a job in its shard's outbox index (outboxIndexKey),
// before the step that writes it to its author's outbox: a job in an
// outbox is then always in the index too, for the sweep to find.
func (db *DB) indexJob(ctx context.Context, op, postID string) error {
	authorID, _, _ := splitPostID(postID)
	err := db.client.ZAdd(ctx, outboxIndexKey(db.fanOutShard(authorID)),
		redis.Z{Score: float64(db.now().UnixMilli()), Member: outboxEntry(op, postID)}).Err()
	if err != nil {
		return fmt.Errorf("index fan-out job of %s: %w", postID, err)
	}
	return nil
}

// unqueueJobs queues the commands that take a queued job out of its
// author's outbox and then out of the index.
func unqueueJob(ctx context.Context, pipe redis.Pipeliner, shard int, op, postID string) {
	authorID, _, _ := splitPostID(postID)
	pipe.ZRem(ctx, outboxKey(authorID), outboxEntry(op, postID))
	pipe.ZRem(ctx, outboxIndexKey(shard), outboxEntry(op, postID))
}

// enqueueFanOut appends a fan-out job for a post to its shard's stream,
// then takes it out of its author's outbox and the index.
func (db *DB) enqueueFanOut(ctx context.Context, op, postID string) error {
	if err := db.queueJob(ctx, op, postID); err != nil {
		return err
	}
	authorID, _, _ := splitPostID(postID)
	_, err := db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		unqueueJob(ctx, pipe, db.fanOutShard(authorID), op, postID)
		return nil
	})
	if err != nil {
		// Queued already: a sweep will queue it again, harmlessly.
		db.log.WarnContext(ctx, "clear fan-out outbox", "post", postID, "err", err)
	}
	return nil
}

// queueJob appends a fan-out job for a post to its shard's stream. Its
// caller takes the job out of the author's outbox afterwards, and only
// then.
func (db *DB) queueJob(ctx context.Context, op, postID string) error {
	authorID, seq, ok := splitPostID(postID)
	if !ok {
		return fmt.Errorf("fan-out job for malformed post id %q", postID)
	}
	return db.client.XAdd(ctx, &redis.XAddArgs{
		Stream: fanoutStreamKey(db.fanOutShard(authorID)),
		Values: []any{"op", op, "author", authorID, "seq", seq, "post", postID},
	}).Err()
}

// outboxEntry is the outbox member of a job.
func outboxEntry(op, postID string) string { return op + " " + postID }

// Sweeping the outboxes.
const (
	DefaultSweepEvery = time.Minute      // how often a sweeping worker sweeps
	sweepAfter        = 30 * time.Second // how old a job must be to be swept: younger ones may be in flight
	sweepCount        = 1000             // index entries one read takes
	// orphanAfter is how old an index entry must be for the sweep to drop
	// it when its outbox lacks the job: the job was queued and its request
	// died before it cleared the index, or its post's step never ran. A
	// request that is still on its way that long after indexing its job
	// is not, so the entry of a job yet to be written is never dropped.
	orphanAfter = 10 * time.Minute
)

// sweepOutboxes queues the jobs that have sat in an author's outbox since
// before cutoff: their CreatePost or DeletePost died before it queued them.
// It reads only each shard's outbox index, where every such job is, and
// returns how many jobs it queued. (Before the index, the sweep SCANned
// every key of every master for outboxes; backfillOutboxIndex does so once
// per database, for the jobs left from then.)
func (db *DB) sweepOutboxes(ctx context.Context, cutoff time.Time) (int, error) {
	queued := 0
	for shard := range max(1, db.opts.FanOutShards) {
		n, err := db.sweepShard(ctx, shard, cutoff)
		queued += n
		if err != nil {
			return queued, fmt.Errorf("sweep fan-out outboxes of shard %d: %w", shard, err)
		}
	}
	return queued, nil
}

func (db *DB) sweepShard(ctx context.Context, shard int, cutoff time.Time) (int, error) {
	index := outboxIndexKey(shard)
	entries, err := db.client.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
		Key: index, Start: "-inf", Stop: strconv.FormatInt(cutoff.UnixMilli(), 10), ByScore: true, Count: sweepCount,
	}).Result()
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	// Whether each job is still in its outbox, in one round trip.
	inOutbox := make([]*redis.FloatCmd, len(entries))
	pipe := db.client.Pipeline()
	for i, e := range entries {
		entry, _ := e.Member.(string)
		_, postID, _ := strings.Cut(entry, " ")
		authorID, _, _ := splitPostID(postID)
		inOutbox[i] = pipe.ZScore(ctx, outboxKey(authorID), entry)
	}
	pipe.Exec(ctx) // each answer is checked below
	queued := 0
	orphaned := db.opts.Now().Add(-orphanAfter).UnixMilli()
	for i, e := range entries {
		entry, _ := e.Member.(string)
		op, postID, _ := strings.Cut(entry, " ")
		if (op != opDeliver && op != opUndeliver) || !isPostID(postID) {
			db.log.ErrorContext(ctx, "malformed fan-out outbox index entry; dropped", "key", index, "entry", entry)
			db.client.ZRem(ctx, index, entry)
			continue
		}
		switch err := inOutbox[i].Err(); {
		case errors.Is(err, redis.Nil):
			if int64(e.Score) < orphaned {
				db.client.ZRem(ctx, index, entry)
			}
			continue
		case err != nil:
			return queued, err
		}
		if err := db.enqueueFanOut(ctx, op, postID); err != nil {
			return queued, err
		}
		queued++
		db.log.WarnContext(ctx, "queued a fan-out job that its request did not", "op", op, "post", postID)
	}
	return queued, nil
}

// backfillOutboxIndex adds to the outbox index every job that sits in an
// outbox without being in it: one that a Warble from before the index left
// there (its request died before queueing it, or the queue was not
// drained for the upgrade). It runs at a sweeping worker's first sweep,
// and only once per database: it SCANs every key of every master, once,
// and then records outboxBackfillKey, which later workers check with one
// EXISTS. Two workers that backfill at once add the same entries, which
// is harmless; one that dies before the marker leaves the backfill to the
// next. An empty database has nothing to backfill and gets no marker, so
// that an idle Warble writes nothing; a later start, once it holds data,
// scans it once.
func (db *DB) backfillOutboxIndex(ctx context.Context) error {
	if n, err := db.client.Exists(ctx, outboxBackfillKey).Result(); err != nil {
		return fmt.Errorf("backfill the outbox index: %w", err)
	} else if n == 1 {
		return nil
	}
	outboxes, keys, err := db.scanEveryMaster(ctx, prefix+"u:{*}:outbox")
	if err != nil {
		return fmt.Errorf("backfill the outbox index: %w", err)
	} else if keys == 0 {
		return nil
	}
	indexed := 0
	for _, key := range outboxes {
		entries, err := db.client.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			return fmt.Errorf("backfill the outbox index: read %s: %w", key, err)
		}
		pipe := db.client.Pipeline()
		for _, e := range entries {
			entry, _ := e.Member.(string)
			_, postID, _ := strings.Cut(entry, " ")
			authorID, _, ok := splitPostID(postID)
			if !ok {
				continue // the sweep's business, should it ever be indexed
			}
			// NX: an entry indexed already keeps its time.
			pipe.ZAddNX(ctx, outboxIndexKey(db.fanOutShard(authorID)), e)
			indexed++
		}
		if pipe.Len() == 0 {
			continue
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("backfill the outbox index from %s: %w", key, err)
		}
	}
	if err := db.client.Set(ctx, outboxBackfillKey, db.now().UnixMilli(), 0).Err(); err != nil {
		return fmt.Errorf("backfill the outbox index: %w", err)
	}
	db.log.InfoContext(ctx, "outbox index backfilled from the outboxes", "outboxes", len(outboxes), "jobs", indexed)
	return nil
}

// scanEveryMaster returns the keys that match pattern on every master (on
// one Redis, its keys), with a SCAN of each, and how many keys the masters
// hold in all, so that a backfill can tell an empty database, which gets
// no marker, from one without a match. The backfills of the indexes
// (backfillOutboxIndex, backfillSeenIndex, backfillArchiveDue) run it once
// per database.
func (db *DB) scanEveryMaster(ctx context.Context, pattern string) ([]string, int64, error) {
	var mu sync.Mutex
	var found []string
	var total int64
	scan := func(ctx context.Context, c redis.Cmdable) error {
		n, err := c.DBSize(ctx).Result()
		if err != nil || n == 0 {
			return err
		}
		var keys []string
		iter := c.Scan(ctx, 0, pattern, sweepCount).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		mu.Lock()
		defer mu.Unlock()
		total += n
		found = append(found, keys...)
		return iter.Err()
	}
	var err error
	if cc, ok := db.client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, db.client)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("scan for %s: %w", pattern, err)
	}
	return found, total, nil
}

// job is one entry of the stream.
type job struct {
	shard    int    // the shard whose stream holds it
	id       string // the stream entry id
	op       string
	authorID string
	seq      int64
	postID   string
	// followers are the author's followers as CreatePost read them in the
	// step that queued the job, when carried says it did (see
	// createPostOneRedisScript).
	followers []string
	carried   bool
	// listed says that the step that queued the job put the post on the
	// global timeline, atomically with the job (createPostOneRedisScript),
	// so that the job need not.
	listed bool
}

func parseJob(shard int, m redis.XMessage) (job, bool) {
	j := job{shard: shard, id: m.ID}
	j.op, _ = m.Values["op"].(string)
	j.authorID, _ = m.Values["author"].(string)
	if j.op == opBuckets {
		return j, warble.ValidUserID(j.authorID)
	}
	j.postID, _ = m.Values["post"].(string)
	j.listed = m.Values["listed"] == "1"
	var followers string
	followers, j.carried = m.Values["followers"].(string)
	j.followers = strings.Fields(followers)
	for _, f := range j.followers {
		if !warble.ValidUserID(f) {
			j.followers, j.carried = nil, false // the walk reads them
			break
		}
	}
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
// KEYS[1] -> w:{fanout}:jobs or w:{fanout:<i>}:jobs
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

// FanOutQueueStats reports how many fan-out jobs the streams hold (waiting
// or in progress: a job leaves its stream when it is done) and how long the
// oldest has waited, from its entry id's milliseconds. For metrics, read at
// each scrape: one round trip of XLEN and XRANGE COUNT 1 on each shard.
func (db *DB) FanOutQueueStats(ctx context.Context) (int64, time.Duration, error) {
	shards := max(1, db.opts.FanOutShards)
	lens := make([]*redis.IntCmd, shards)
	firsts := make([]*redis.XMessageSliceCmd, shards)
	pipe := db.client.Pipeline()
	for i := range shards {
		lens[i] = pipe.XLen(ctx, fanoutStreamKey(i))
		firsts[i] = pipe.XRangeN(ctx, fanoutStreamKey(i), "-", "+", 1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, fmt.Errorf("fan-out queue stats: %w", err)
	}
	var n int64
	var oldest time.Duration
	for i := range shards {
		n += lens[i].Val()
		msgs := firsts[i].Val()
		if len(msgs) == 0 {
			continue
		}
		ms, _, _ := strings.Cut(msgs[0].ID, "-")
		at, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			return n, 0, fmt.Errorf("fan-out queue stats: entry id %q", msgs[0].ID)
		}
		oldest = max(oldest, db.opts.Now().Sub(time.UnixMilli(at)))
	}
	return n, oldest, nil
}
