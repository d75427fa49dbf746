package redisdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reliable asynchronous fan-out.
//
// With Options.AsyncFanOut, CreatePost and DeletePost do their author's own step at once and then
// append a job to one Redis Stream, fanoutStreamKey; workers (Worker, in the
// server process or in separate `warble worker` processes, any number) read
// the stream through one consumer group and deliver the post to (or take it
// off) the home timelines of the author's followers, a batch of followers
// per round trip.
//
// The guarantee: once CreatePost has answered, every follower (as of the
// walk) eventually gets the post exactly once, even if any process dies at
// any moment after that. The argument:
//
//   - CreatePost answers only after XADD has stored the job. From then on the
//     job is in the stream until a worker acknowledges it, and a worker
//     acknowledges a job only after its last batch, in the same MULTI that
//     drops its progress cursor.
//   - A worker that dies leaves its job pending in the group. Any other
//     worker takes it over with XAUTOCLAIM once it has been idle for
//     ClaimIdle; a live worker touches its job after every batch (XCLAIM to
//     itself, with the cursor, in one script), so only stalled jobs go idle.
//   - The job's cursor (follow time score and tie offset, as
//     followerChunk walks) is saved after each batch, so a taken-over job
//     resumes at the first batch that may not have been delivered whole,
//     rather than at the start.
//   - Redelivering that batch cannot duplicate anything: deliverScript adds
//     by ZADD of the same member and score, and announces only when ZADD
//     added, so a follower who has the post already gets neither a second
//     entry nor a second POST_ADDED.
//
// Before the XADD, a job is in its author's outbox: createPostScript (and
// deletePostScript) record it there in the same atomic step that stores the
// post, and it leaves the outbox only once XADD has stored it. A process
// that dies between the two leaves it in the outbox, where a worker's
// sweep (sweepOutboxes: one worker of each process, at start and then
// about once a minute) finds it and queues it. A job queued twice that way (a sweep racing a slow
// CreatePost) is done twice, which delivery makes harmless. Jobs are as
// durable as the Redis that holds them, like the posts themselves.
//
// Deletes go through the same stream. A delete can race a create job still
// walking the followers, and the timelines must end without the post. The
// delete job starts after deletePostScript removed the post's hash (time D)
// and takes the post off every follower's timeline at some time U > D.
// Each batch of a create job checks that the hash still exists, in the same
// pipeline after its deliveries; a resumed job checks it before it starts.
// For a follower delivered at time T, either that batch's check ran after
// T and saw the hash (so T < D < U and the delete job removes the post after
// it was added), or it saw the hash gone and the create job takes the post
// back off that batch itself and stops, or the worker died before it
// learnt the answer, in which case the job's saved cursor still points at
// that batch or one of the fanOutDepth-1 before it (that many batches are
// in flight at a time, see fanOut) and whoever resumes the job checks and
// undoes fanOutDepth batches from the cursor on. So the post ends in no
// timeline, whatever the order.
//
// Each atomic step stays in one hash slot: the stream, its group and the
// cursors share the {fanout} tag; deliveries are scripts on one follower's
// keys.

// FanOutGroup is the consumer group of the fan-out workers.
const fanOutGroup = "workers"

// Defaults for WorkerOptions.
const (
	DefaultClaimIdle = 30 * time.Second
	DefaultBatch     = fanOutChunk
	defaultBlock     = time.Second
	cursorTTL        = 7 * 24 * time.Hour // a job's cursor outlives any job
)

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

// maybeSweep sweeps the outboxes if this worker sweeps and its time has
// come: at its start, then every SweepEvery, give or take a tenth so that
// processes started together spread out.
func (w *Worker) maybeSweep(ctx context.Context) error {
	if !w.opts.Sweep || time.Now().Before(w.nextSweep) {
		return nil
	}
	every := w.opts.SweepEvery
	w.nextSweep = time.Now().Add(every - every/10 + rand.N(every/5+1))
	_, err := w.db.sweepOutboxes(ctx, w.db.opts.Now().Add(-sweepAfter))
	return err
}

// WorkerOptions tune a Worker. The zero value of each field means its default.
type WorkerOptions struct {
	// Name names the worker's consumer in the group; it must be unique
	// among live workers. Default: host, process id and a counter.
	Name string
	// ClaimIdle is how long a job must have gone untouched before another
	// worker takes it over, as from a worker that died.
	ClaimIdle time.Duration
	// Batch is how many followers one round trip delivers to.
	Batch int
	// Block is how long one read waits for new jobs; it bounds how long Run
	// takes to return once its context ends.
	Block time.Duration
	// Sweep has this worker also sweep the authors' outboxes for jobs that
	// were never queued (see sweepOutboxes), every SweepEvery. One worker
	// of each process is enough.
	Sweep      bool
	SweepEvery time.Duration
}

// Worker runs fan-out jobs from the stream. Any number of workers, in any
// number of processes, may run at once.
type Worker struct {
	db        *DB
	opts      WorkerOptions
	ready     bool      // the group is known to exist
	nextSweep time.Time // when this worker sweeps the outboxes next
}

var workerCount atomic.Int64

// NewWorker returns a Worker over db with opts, defaults filled in.
func NewWorker(db *DB, opts WorkerOptions) *Worker {
	if opts.Name == "" {
		host, _ := os.Hostname()
		opts.Name = fmt.Sprintf("%s-%d-%d", host, os.Getpid(), workerCount.Add(1))
	}
	if opts.ClaimIdle <= 0 {
		opts.ClaimIdle = DefaultClaimIdle
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultBatch
	}
	if opts.Block <= 0 {
		opts.Block = defaultBlock
	}
	if opts.SweepEvery <= 0 {
		opts.SweepEvery = DefaultSweepEvery
	}
	return &Worker{db: db, opts: opts}
}

// Run runs jobs until ctx ends, then returns nil once the job in hand is
// finished or its current batch is saved. Redis errors are logged and
// retried with a growing pause: a worker outlives a Redis restart.
func (w *Worker) Run(ctx context.Context) error {
	pause := 0 * time.Millisecond
	for ctx.Err() == nil {
		err := w.maybeSweep(ctx)
		if err == nil {
			_, err = w.step(ctx, w.opts.Block)
		}
		if err == nil || ctx.Err() != nil {
			pause = 0
			continue
		}
		pause = min(max(2*pause, 50*time.Millisecond), 2*time.Second)
		w.db.log.WarnContext(ctx, "fan-out worker", "worker", w.opts.Name, "err", err, "retry_in", pause)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
	return nil
}

// step runs at most one job: first one of a dead worker, else a new one,
// waiting up to block for it (no wait if block is negative). One job at a
// time, so that jobs this worker has not started are not held pending on it
// while other workers are free. It reports how many jobs it ran.
func (w *Worker) step(ctx context.Context, block time.Duration) (int, error) {
	if !w.ready {
		ok, err := w.ensureGroup(ctx)
		if err != nil || !ok {
			if err == nil && block > 0 {
				err = w.awaitFirstJob(ctx, block)
			}
			return 0, err
		}
		w.ready = true
	}
	claimed, _, err := w.db.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: fanoutStreamKey, Group: fanOutGroup, Consumer: w.opts.Name,
		MinIdle: w.opts.ClaimIdle, Start: "0-0", Count: 1,
	}).Result()
	if isNoGroup(err) {
		w.ready = false // Redis lost its data
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("claim fan-out jobs: %w", err)
	}
	msgs := claimed
	if len(msgs) == 0 {
		args := &redis.XReadGroupArgs{
			Group: fanOutGroup, Consumer: w.opts.Name,
			Streams: []string{fanoutStreamKey, ">"}, Count: 1, Block: block,
		}
		if block < 0 {
			args.Block = -1 // no BLOCK argument: answer at once
		}
		streams, err := w.db.client.XReadGroup(ctx, args).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return 0, nil
		case isNoGroup(err):
			w.ready = false
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("read fan-out jobs: %w", err)
		}
		for _, s := range streams {
			msgs = append(msgs, s.Messages...)
		}
	}
	for i, m := range msgs {
		// A job cut short by ctx stays pending, with its cursor saved, for
		// another worker to take over; so do the rest of this batch.
		if err := w.run(ctx, m); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

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

func (w *Worker) ensureGroup(ctx context.Context) (bool, error) {
	n, err := ensureGroupScript.Run(ctx, w.db.client, []string{fanoutStreamKey}, fanOutGroup).Int64()
	if err != nil {
		return false, fmt.Errorf("create fan-out group: %w", err)
	}
	return n == 1, nil
}

// awaitFirstJob waits up to block for the stream to get its first entry,
// when no job was ever queued: XREAD BLOCK on a stream that does not exist
// yet answers as soon as an XADD creates it, so the first post is fanned
// out at once rather than at the next poll, and an idle Warble still
// writes nothing.
func (w *Worker) awaitFirstJob(ctx context.Context, block time.Duration) error {
	err := w.db.client.XRead(ctx, &redis.XReadArgs{
		Streams: []string{fanoutStreamKey, "0-0"}, Count: 1, Block: block,
	}).Err()
	if err != nil && !errors.Is(err, redis.Nil) && ctx.Err() == nil {
		return fmt.Errorf("wait for fan-out jobs: %w", err)
	}
	return nil
}

func isNoGroup(err error) bool { return redis.HasErrorPrefix(err, "NOGROUP") }

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

// run runs one job from its saved cursor to its end and acknowledges it.
func (w *Worker) run(ctx context.Context, m redis.XMessage) error {
	j, ok := parseJob(m)
	if !ok {
		w.db.log.ErrorContext(ctx, "fan-out job malformed; dropped", "id", m.ID, "values", m.Values)
		return w.finish(ctx, m.ID)
	}
	from := startCursor
	saved, err := w.db.client.Get(ctx, fanoutCursorKey(j.id)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read cursor of fan-out job %s: %w", j.id, err)
	} else if err == nil {
		if from, ok = parseFollowerCursor(saved); !ok {
			return fmt.Errorf("fan-out job %s: malformed cursor %q", j.id, saved)
		}
	}
	save := func(next followerCursor) error { return w.saveCursor(ctx, j.id, next) }
	switch j.op {
	case opDeliver:
		err = w.db.fanOut(ctx, j.authorID, j.seq, j.postID, from, w.opts.Batch, save)
	case opUndeliver:
		err = w.db.unFanOut(ctx, j.authorID, j.seq, j.postID, from, w.opts.Batch, save)
	}
	if errors.Is(err, errLostJob) {
		return nil // another worker has it now
	} else if err != nil {
		return fmt.Errorf("fan-out job %s (%s %s): %w", j.id, j.op, j.postID, err)
	}
	return w.finish(ctx, j.id)
}

// finish acknowledges a done job, deletes it from the stream and drops its
// cursor, in one atomic step. A worker that dies just before it leaves the
// job to be taken over, and that rerun delivers nothing twice.
func (w *Worker) finish(ctx context.Context, id string) error {
	_, err := w.db.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.XAck(ctx, fanoutStreamKey, fanOutGroup, id)
		pipe.XDel(ctx, fanoutStreamKey, id)
		pipe.Del(ctx, fanoutCursorKey(id))
		return nil
	})
	if err != nil {
		return fmt.Errorf("finish fan-out job %s: %w", id, err)
	}
	return nil
}

// errLostJob is what saveCursor returns when another worker took the job
// over: this worker leaves it to the new owner.
var errLostJob = errors.New("fan-out job taken over by another worker")

// saveProgressScript saves a job's cursor and resets the job's idle time,
// so that no other worker takes over a job that is moving, but only while
// this worker still owns it: a worker that stalled for longer than the
// claim idle time and lost its job must not take it back.
//
// KEYS[1] -> w:{fanout}:jobs
// KEYS[2] -> w:{fanout}:cursor:<entry id>
// ARGV[1] -> the consumer group
// ARGV[2] -> this worker's consumer name
// ARGV[3] -> the job's entry id
// ARGV[4] -> the cursor
// ARGV[5] -> the cursor's time to live, seconds
//
// Returns 1 if saved, 0 if the job is no longer this worker's.
var saveProgressScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then
	return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[5])
return 1
`)

func (w *Worker) saveCursor(ctx context.Context, id string, c followerCursor) error {
	n, err := saveProgressScript.Run(ctx, w.db.client,
		[]string{fanoutStreamKey, fanoutCursorKey(id)},
		fanOutGroup, w.opts.Name, id, c.String(), int64(cursorTTL/time.Second)).Int64()
	if err != nil {
		return fmt.Errorf("save cursor: %w", err)
	} else if n == 0 {
		return errLostJob
	}
	return nil
}

// noSave is a fanOut save function that saves nothing, for a fan-out
// that runs inside a request and has no job to resume.
func noSave(followerCursor) error { return nil }

// startCursor is the position before every follower.
var startCursor = followerCursor{min: "-inf"}

// followerCursor is a position in a followers set, walked by score: the
// lowest score still to read and how many followers at that score were
// read already.
type followerCursor struct {
	min  string // a score, or -inf at the start
	tied int64
}

func (c followerCursor) String() string { return c.min + " " + strconv.FormatInt(c.tied, 10) }

func parseFollowerCursor(s string) (followerCursor, bool) {
	min, tiedText, ok := strings.Cut(s, " ")
	tied, err := strconv.ParseInt(tiedText, 10, 64)
	if !ok || err != nil || tied < 0 {
		return followerCursor{}, false
	}
	if _, err := strconv.ParseFloat(min, 64); err != nil && min != "-inf" {
		return followerCursor{}, false
	}
	return followerCursor{min: min, tied: tied}, true
}

// isPostID reports whether id is a well-formed post id.
func isPostID(id string) bool {
	_, _, ok := splitPostID(id)
	return ok
}
