package redisdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults for WorkerOptions.
const (
	DefaultClaimIdle = 30 * time.Second
	DefaultBatch     = fanOutChunk
	defaultBlock     = time.Second
	cursorTTL        = 7 * 24 * time.Hour // a job's cursor outlives any job
)

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
