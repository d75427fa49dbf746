package redisdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults for WorkerOptions.
const (
	DefaultClaimIdle = 30 * time.Second
	DefaultBatch     = fanOutChunk
	defaultIdleLook  = time.Second
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
	// IdleLook is how often an idle worker looks for jobs of dead workers
	// to take over. New jobs wake it at once (see jobWatch).
	IdleLook time.Duration
	// Sweep has this worker also sweep the authors' outboxes for jobs that
	// were never queued (see sweepOutboxes), every SweepEvery. One worker
	// of each process is enough.
	Sweep      bool
	SweepEvery time.Duration
	// Move has this worker also move posts to the archive, when the DB
	// has one (see mover.go), between its fan-out jobs. One worker of
	// each process is enough; more move more authors at once.
	Move bool
	// FirstPass, if set, is called once, when the worker's first sweep
	// and move (those it does) have run without an error. Its one-time
	// backfills of the database (the outbox, seen and due indexes, see
	// maybeSweep and maybeMove) are then behind it, and a database that
	// was empty then gets none from it. Tests that compare Redis before
	// and after a request wait for it, so that no backfill's marker can
	// land in between.
	FirstPass func()
}

// Worker runs fan-out jobs from the stream. Any number of workers, in any
// number of processes, may run at once.
type Worker struct {
	db        *DB
	opts      WorkerOptions
	ready     []bool    // by shard: the group is known to exist
	next      int       // the shard this worker looks at first next time
	nextClaim time.Time // when this worker looks for jobs of dead workers next
	nextSweep time.Time // when this worker sweeps the outboxes next
	// backfilled is set once this worker knows the outbox index holds
	// the jobs of the outboxes from before it (see backfillOutboxIndex),
	// and seenBackfilled once it knows the seen index holds the users
	// recorded before it (see backfillSeenIndex).
	backfilled, seenBackfilled bool
	nextMove                   time.Time // when this idle mover looks for due authors next
	moveShard                  int       // the shard whose due index it looks at first
	// dueBackfilled is set once this worker knows the archive's due index
	// holds the authors of the posts from before it (backfillArchiveDue).
	dueBackfilled bool
	// held are jobs read for this worker in the pipeline that ended its
	// last job (see run), which its next steps run before it reads more.
	held []heldJob
}

// heldJob is a job read from a shard's stream and not run yet.
type heldJob struct {
	shard int
	msg   redis.XMessage
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
	if opts.IdleLook <= 0 {
		opts.IdleLook = defaultIdleLook
	}
	if opts.SweepEvery <= 0 {
		opts.SweepEvery = DefaultSweepEvery
	}
	shards := max(1, db.opts.FanOutShards)
	// Workers start at different shards, so that they spread over them.
	return &Worker{db: db, opts: opts, ready: make([]bool, shards), next: int(workerCount.Load()) % shards}
}

// Run runs jobs until ctx ends, then returns nil once the job in hand is
// finished or its current batch is saved; an idle worker returns at once.
// Redis errors are logged and retried with a growing pause: a worker
// outlives a Redis restart.
//
// A worker never blocks in Redis: it reads jobs without waiting, and an
// idle one waits in this process for the jobs watch (jobWatch), which
// wakes it when a job is queued, or for IdleLook to pass.
func (w *Worker) Run(ctx context.Context) error {
	watch := w.db.jobs.acquire(w.db)
	defer w.db.jobs.release()
	defer w.releaseHeld()
	pause := 0 * time.Millisecond
	for ctx.Err() == nil {
		news := watch.news()
		n, err := 0, w.maybeSweep(ctx)
		if err == nil {
			n, err = w.maybeMove(ctx)
		}
		if err == nil && w.opts.FirstPass != nil {
			w.opts.FirstPass()
			w.opts.FirstPass = nil
		}
		if err == nil {
			var jobs int
			jobs, err = w.step(ctx)
			n += jobs
		}
		if err == nil || ctx.Err() != nil {
			pause = 0
			if n == 0 {
				waited := watch.waiting()
				select {
				case <-ctx.Done():
				case <-news:
				case <-time.After(w.opts.IdleLook):
				}
				waited()
			} else {
				w.db.batcher.pace(ctx)
			}
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
// processes started together spread out. The first sweep of a database
// backfills the outbox index first. Each sweep then drops the home
// timelines of the users gone inactive (see dropIdleHomes).
func (w *Worker) maybeSweep(ctx context.Context) error {
	if !w.opts.Sweep || time.Now().Before(w.nextSweep) {
		return nil
	}
	every := w.opts.SweepEvery
	w.nextSweep = time.Now().Add(every - every/10 + rand.N(every/5+1))
	if !w.backfilled {
		if err := w.db.backfillOutboxIndex(ctx); err != nil {
			return err
		}
		w.backfilled = true
	}
	if _, err := w.db.sweepOutboxes(ctx, w.db.opts.Now().Add(-sweepAfter)); err != nil {
		return err
	}
	if w.db.opts.InactiveAfter < 0 {
		return nil
	}
	if !w.seenBackfilled {
		if err := w.db.backfillSeenIndex(ctx); err != nil {
			return err
		}
		w.seenBackfilled = true
	}
	_, err := w.db.dropIdleHomes(ctx, w.db.opts.Now().Add(-w.db.opts.InactiveAfter))
	return err
}

// maybeMove moves the due posts of one author to the archive, if this
// worker moves and the DB has an archive; an idle mover looks for due
// authors at most every IdleLook. It reports 1 if it found an author, so
// that the worker goes on without waiting. The first pass of a database
// backfills the due index first.
func (w *Worker) maybeMove(ctx context.Context) (int, error) {
	if !w.opts.Move || w.db.opts.Archive == nil || time.Now().Before(w.nextMove) {
		return 0, nil
	}
	if !w.dueBackfilled {
		if err := w.db.backfillArchiveDue(ctx); err != nil {
			return 0, err
		}
		w.dueBackfilled = true
	}
	_, found, err := w.db.moveDue(ctx, w.moveShard)
	w.moveShard = (w.moveShard + 1) % len(w.ready)
	if err != nil {
		return 0, err
	}
	if !found {
		w.nextMove = time.Now().Add(w.opts.IdleLook)
		return 0, nil
	}
	return 1, nil
}

// step runs the next jobs, without waiting for one: those that the end
// of the last ones read for this worker (see readNext), else one of a dead
// worker (looked for at most every IdleLook), else new ones, up to
// readCount. Of the jobs in hand, those that carry their followers run
// at once, in one pipeline (runCarried); any other runs alone, one a step,
// after them (see runHeld). The shards are looked at in turn, from a
// different one at each step, so that a busy shard does not starve the
// others. It reports how many jobs it ran.
func (w *Worker) step(ctx context.Context) (int, error) {
	if len(w.held) > 0 {
		return w.runHeld(ctx)
	}
	shards := len(w.ready)
	first := w.next
	w.next = (w.next + 1) % shards
	if now := time.Now(); !now.Before(w.nextClaim) {
		w.nextClaim = now.Add(w.opts.IdleLook)
		for i := range shards {
			n, err := w.stepShard(ctx, (first+i)%shards, true)
			if n > 0 || err != nil {
				return n, err
			}
		}
	}
	for i := range shards {
		n, err := w.stepShard(ctx, (first+i)%shards, false)
		if n > 0 || err != nil {
			return n, err
		}
	}
	return 0, nil
}

// jobsAtOnce is how many new jobs a worker reads at a time on one Redis.
// Those that carry their followers (most) run in one pipeline, so that a
// worker with jobs waiting spends a round trip on up to this many rather
// than one on each: a round trip costs Redis and the worker about as much
// as a small job's writes.
const jobsAtOnce = 16

// readCount is how many new jobs the worker reads at a time: jobsAtOnce
// on one Redis, and one on a Redis Cluster, whose jobs carry no followers
// and run one at a time, so that jobs it has not started are not held
// pending on it while other workers are free.
func (w *Worker) readCount() int64 {
	if w.db.onCluster() {
		return 1
	}
	return jobsAtOnce
}

// batchEvery is how often, at most, the workers of a process run a
// pipeline of carried jobs that is not full (jobsAtOnce). While posts
// come faster than one a round trip, a worker that ran each job as soon
// as it was queued would run one or two a round trip, and spend on each
// what a full pipeline shares; waiting this long lets the next pipeline
// fill. A post that finds the workers idle runs at once; one queued right
// after another waits at most this long for its fan-out.
const batchEvery = 5 * time.Millisecond

// batchTurn lets one worker of a process at a time run a pipeline of
// carried jobs, and paces those pipelines for all of them (batchEvery).
// Two workers that each ran their own pipelines, each paced on its own,
// ran up to twice as many, each about half as full, side by side, and a
// request's round trip that came in behind them waited for both; one
// worker alone had neither, but a walk of many followers held up every
// small job behind it. With the turn, walks take none: they run on
// whichever worker read them, while another runs the carried jobs. (In
// the load tool this changed createPost's p99 at 16 in flight by nothing
// measurable: BENCHMARKS.md, post-6.)
type batchTurn struct {
	token chan struct{} // holds a value while a worker has the turn
	next  atomic.Int64  // unix ns before which no pipeline that is not full runs
}

// take waits for the turn and then for its pacing, and reports false if
// ctx ended first (the worker is stopping; it then has no turn).
func (t *batchTurn) take(ctx context.Context) bool {
	select {
	case t.token <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	if !t.pace(ctx) {
		<-t.token
		return false
	}
	return true
}

// pace waits until the next pipeline that is not full may run, and
// reports false if ctx ended first. A worker that ran jobs paces before
// it reads more, so that it reads as many as came meanwhile.
func (t *batchTurn) pace(ctx context.Context) bool {
	wait := time.Until(time.Unix(0, t.next.Load()))
	if wait <= 0 {
		return true
	}
	select {
	case <-time.After(wait):
		return true
	case <-ctx.Done():
		return false
	}
}

// give hands the turn back; full says whether the pipeline that ran was
// full, after which the next may run at once.
func (t *batchTurn) give(full bool) {
	if !full {
		t.next.Store(time.Now().Add(batchEvery).UnixNano())
	}
	<-t.token
}

// stepShard runs jobs of a shard: with claim, one of a dead worker, else
// new ones, up to readCount, read and run as step says.
func (w *Worker) stepShard(ctx context.Context, shard int, claim bool) (int, error) {
	if !w.ready[shard] {
		ok, err := w.ensureGroup(ctx, shard)
		if err != nil || !ok {
			return 0, err // no job was ever queued: nothing to do yet
		}
		w.ready[shard] = true
	}
	stream := fanoutStreamKey(shard)
	var msgs []redis.XMessage
	if claim {
		claimed, _, err := w.db.client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: stream, Group: fanOutGroup, Consumer: w.opts.Name,
			MinIdle: w.opts.ClaimIdle, Start: "0-0", Count: 1,
		}).Result()
		if isNoGroup(err) {
			w.ready[shard] = false // Redis lost its data
			return 0, nil
		} else if err != nil {
			return 0, fmt.Errorf("claim fan-out jobs: %w", err)
		}
		msgs = claimed
	} else {
		streams, err := w.db.client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: fanOutGroup, Consumer: w.opts.Name,
			Streams: []string{stream, ">"}, Count: w.readCount(),
			Block: -1, // no BLOCK argument: answer at once
		}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return 0, nil
		case isNoGroup(err):
			w.ready[shard] = false
			return 0, nil
		case err != nil:
			return 0, fmt.Errorf("read fan-out jobs: %w", err)
		}
		for _, s := range streams {
			for _, m := range s.Messages {
				w.held = append(w.held, heldJob{shard: shard, msg: m})
			}
		}
		if len(w.held) == 0 {
			return 0, nil
		}
		return w.runHeld(ctx)
	}
	for i, m := range msgs {
		// A job cut short by ctx stays pending, with its cursor saved, for
		// another worker to take over; so do the rest of this batch.
		if err := w.run(ctx, shard, m, claim); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

func (w *Worker) ensureGroup(ctx context.Context, shard int) (bool, error) {
	n, err := ensureGroupScript.Run(ctx, w.db.client, []string{fanoutStreamKey(shard)}, fanOutGroup).Int64()
	if err != nil {
		return false, fmt.Errorf("create fan-out group: %w", err)
	}
	return n == 1, nil
}

// jobWatch tells the idle workers of a process that jobs were queued. One
// goroutine per shard per process, while any worker runs, waits for new
// stream entries with XREAD BLOCK, which reads without taking anything, and
// wakes every idle worker; they take jobs through the group without
// waiting. Only the watch blocks in Redis, on connections of its own (one
// per shard: a cluster refuses an XREAD over streams of several slots, and
// the shards' streams are in different slots on purpose), and stopping
// closes them, so that a worker and the watch both stop at once rather
// than at the end of a blocked read: a server stops promptly.
//
// XREAD on a stream that does not exist yet answers as soon as an XADD
// creates it, so the first job ever is run at once too, and an idle Warble
// writes nothing.
//
// The watch reads only while a worker of the process waits for news: while
// all of them are busy, which is when jobs come fastest, a read for every
// few jobs would wake no one, so the watch pauses, and reads on from the
// last entry it saw once a worker waits, which answers at once for the
// entries queued meanwhile. A worker takes its news channel before it
// looks for jobs and waits on it after, so a job queued in between closes
// the channel it waits on, whether the watch read it before or after the
// pause.
type jobWatch struct {
	mu      sync.Mutex
	users   int
	signal  chan struct{} // closed, and replaced, when jobs may have come
	idle    int           // workers waiting for news
	resume  chan struct{} // closed, and replaced, when a worker starts waiting
	stop    context.CancelFunc
	stopped chan struct{}
}

// watchBlock is how long one blocked read of the watch waits; it only
// bounds how long the watch takes to notice that Redis went away.
const watchBlock = 5 * time.Second

// acquire counts a worker in, starting the watch for the first.
func (j *jobWatch) acquire(db *DB) *jobWatch {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.users++; j.users == 1 {
		ctx, cancel := context.WithCancel(context.Background())
		j.signal, j.resume, j.stop, j.stopped = make(chan struct{}), make(chan struct{}), cancel, make(chan struct{})
		go j.run(ctx, db, j.stopped)
	}
	return j
}

// release counts a worker out, stopping the watch after the last. It waits
// for the watch to end without holding the lock: the watch may be about to
// take it in wake, for jobs it read just before it was stopped.
func (j *jobWatch) release() {
	j.mu.Lock()
	j.users--
	last, stop, stopped := j.users == 0, j.stop, j.stopped
	j.mu.Unlock()
	if last {
		stop()
		<-stopped
	}
}

// news returns a channel that is closed when jobs may have been queued
// after news was called.
func (j *jobWatch) news() <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.signal
}

// waiting counts a worker as waiting for news until the func it returns
// is called.
func (j *jobWatch) waiting() func() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.idle++; j.idle == 1 {
		close(j.resume)
		j.resume = make(chan struct{})
	}
	return func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		j.idle--
	}
}

// untilWaited returns when a worker waits for news, or false when ctx ends
// first.
func (j *jobWatch) untilWaited(ctx context.Context) bool {
	j.mu.Lock()
	idle, resume := j.idle, j.resume
	j.mu.Unlock()
	if idle > 0 {
		return true
	}
	select {
	case <-resume:
		return true
	case <-ctx.Done():
		return false
	}
}

func (j *jobWatch) wake() {
	j.mu.Lock()
	defer j.mu.Unlock()
	close(j.signal)
	j.signal = make(chan struct{})
}

func (j *jobWatch) run(ctx context.Context, db *DB, stopped chan<- struct{}) {
	defer close(stopped)
	shards := max(1, db.opts.FanOutShards)
	client, closeClient := dedicatedClient(db.client, shards)
	context.AfterFunc(ctx, closeClient) // ends the blocked reads at once
	var wg sync.WaitGroup
	for shard := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j.watch(ctx, db, client, shard)
		}()
	}
	wg.Wait()
}

// watch follows one shard's stream until ctx ends.
func (j *jobWatch) watch(ctx context.Context, db *DB, client redis.UniversalClient, shard int) {
	// From the start of the stream: the stream holds only jobs not done,
	// so this wakes the workers once for those, then follows new ones.
	last := "0-0"
	pause := time.Duration(0)
	for j.untilWaited(ctx) {
		streams, err := client.XRead(ctx, &redis.XReadArgs{
			Streams: []string{fanoutStreamKey(shard), last}, Count: 100, Block: watchBlock,
		}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // nothing new
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			// Workers still look every IdleLook meanwhile.
			pause = min(max(2*pause, 100*time.Millisecond), 2*time.Second)
			db.log.Warn("watch for fan-out jobs", "err", err, "retry_in", pause)
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			continue
		}
		pause = 0
		for _, s := range streams {
			if n := len(s.Messages); n > 0 {
				last = s.Messages[n-1].ID
			}
		}
		j.wake()
	}
}

// dedicatedClient returns a client of its own for the server (or cluster)
// that c talks to, with the same options and room for conns commands at
// once, and a func that closes it. A command blocked on it ends as soon as
// it is closed, which a command on a shared pool cannot be made to do. For
// a client of another kind it returns c itself, and closing does nothing.
func dedicatedClient(c redis.UniversalClient, conns int) (redis.UniversalClient, func()) {
	switch c := c.(type) {
	case *redis.Client:
		d := redis.NewClient(serverOptions(c.Options(), conns))
		return d, func() { d.Close() }
	case *redis.ClusterClient:
		// Its pool per node grows to the blocked reads on that node.
		opts := *c.Options()
		opts.PoolSize, opts.MinIdleConns, opts.MaxIdleConns = conns, 0, conns
		// A cluster client appends the nodes it learns of to the array
		// behind its options' Addrs: two clients that share one write
		// the same spare slots, from their own goroutines (a data race
		// at every failover, and each client's seeds overwritten by the
		// other's). This one gets an array of its own.
		opts.Addrs = slices.Clone(opts.Addrs)
		d := redis.NewClusterClient(&opts)
		return d, func() { d.Close() }
	}
	return c, func() {}
}

// serverOptions returns options for a client of the server that o's client
// talks to, with the same connection settings and room for conns
// connections. It copies the settings one by one rather than the whole
// struct: go-redis writes some of its client's options while it runs (the
// maintenance notifications' mode, when its first connection finds that
// the server has none), and a copy of the whole would read them
// unsynchronized.
func serverOptions(o *redis.Options, conns int) *redis.Options {
	return &redis.Options{
		Network:                    o.Network,
		Addr:                       o.Addr,
		Dialer:                     o.Dialer,
		Protocol:                   o.Protocol,
		Username:                   o.Username,
		Password:                   o.Password,
		CredentialsProvider:        o.CredentialsProvider,
		CredentialsProviderContext: o.CredentialsProviderContext,
		DB:                         o.DB,
		ClientName:                 o.ClientName,
		TLSConfig:                  o.TLSConfig,
		DialTimeout:                o.DialTimeout,
		DialerRetries:              o.DialerRetries,
		ReadTimeout:                o.ReadTimeout,
		WriteTimeout:               o.WriteTimeout,
		PoolTimeout:                o.PoolTimeout,
		MaxRetries:                 o.MaxRetries,
		MinRetryBackoff:            o.MinRetryBackoff,
		MaxRetryBackoff:            o.MaxRetryBackoff,
		PoolSize:                   conns,
		MaxIdleConns:               conns,
	}
}

// run runs one job from its saved cursor to its end and acknowledges it.
// Only a job taken over from another worker (claimed) can have a cursor:
// one read new from the stream was never delivered to a worker, and a
// cursor is saved only by the worker that holds the job (saveCursor), so
// a new job starts at the start without a round trip to look. (Should its
// group have been lost and made again from the stream's start, a job that
// was under way is read as new and runs from the start, which delivers
// nothing twice.)
func (w *Worker) run(ctx context.Context, shard int, m redis.XMessage, claimed bool) error {
	j, ok := parseJob(shard, m)
	if !ok {
		w.db.log.ErrorContext(ctx, "fan-out job malformed; dropped", "id", m.ID, "values", m.Values)
		return w.finish(ctx, shard, m.ID)
	}
	from := startCursor
	var err error
	if claimed {
		var saved string
		saved, err = w.db.client.Get(ctx, fanoutCursorKey(shard, j.id)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("read cursor of fan-out job %s: %w", j.id, err)
		} else if err == nil {
			if from, ok = parseFollowerCursor(saved); !ok {
				return fmt.Errorf("fan-out job %s: malformed cursor %q", j.id, saved)
			}
		}
	}
	save := func(next followerCursor) error { return w.saveCursor(ctx, shard, j.id, next) }
	end := &jobEnd{shard: shard, id: j.id, claimed: claimed}
	if !claimed {
		// A job taken over may have been run in part, by a worker that
		// walked the followers: it walks them too (see fanOutCarried).
		end.followers, end.carried, end.listed = j.followers, j.carried, j.listed
	}
	var reads *[]*redis.XStreamSliceCmd
	end.readNext, reads = w.readNext(ctx)
	defer w.holdNext(reads)
	switch j.op {
	case opDeliver:
		err = w.db.fanOutJob(ctx, j.authorID, j.seq, j.postID, from, w.opts.Batch, save, end)
	case opUndeliver:
		err = w.db.unFanOut(ctx, j.authorID, j.seq, j.postID, from, w.opts.Batch, save)
	case opBuckets:
		err = w.db.moveToBuckets(ctx, j.authorID, from, w.opts.Batch, save)
	}
	if errors.Is(err, errLostJob) {
		return nil // another worker has it now
	} else if err != nil {
		return fmt.Errorf("fan-out job %s (%s %s): %w", j.id, j.op, j.postID, err)
	} else if end.finished {
		return nil // its last batch finished it
	}
	return w.finish(ctx, shard, j.id)
}

// readNext returns a func that has the pipeline that ends jobs (on one
// Redis: carried jobs, see runCarried, or a job of one batch, see
// fanOutJob) also read this worker's next jobs, up to readCount, from
// the shard it looks at first next (as step would), after the jobs' ends:
// a worker busy with small jobs costs Redis one round trip less, and the
// next jobs are taken just as the worker is done with these, when step
// would take them. It also returns the reads that the pipeline sent
// (go-redis sends it again after Redis lost its scripts), for holdNext.
//
// It returns nils when the worker is stopping, holds jobs already, or is
// due to look for jobs of dead workers (step does that first, so that a
// busy worker does not put them off).
func (w *Worker) readNext(ctx context.Context) (func(redis.Pipeliner), *[]*redis.XStreamSliceCmd) {
	shard := w.next
	if ctx.Err() != nil || len(w.held) > 0 || !time.Now().Before(w.nextClaim) || !w.ready[shard] {
		return nil, nil
	}
	reads := new([]*redis.XStreamSliceCmd)
	return func(pipe redis.Pipeliner) {
		w.next = (shard + 1) % len(w.ready)
		*reads = append(*reads, pipe.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: fanOutGroup, Consumer: w.opts.Name,
			Streams: []string{fanoutStreamKey(shard), ">"}, Count: w.readCount(),
			Block: -1,
		}))
	}, reads
}

// runHeld runs the jobs this worker holds (read new, never run): every
// one that carries its followers at once (runCarried), else the first,
// alone. A job that does not carry them may be long (a walk of many
// followers): the carried ones run before it, so that they never wait for
// it; the other jobs that do not carry them do, one after the other.
// (Handing them back before a walk, to the next look for jobs of dead
// workers, would not do: that look takes one job per IdleLook per worker,
// and where authors with more followers than a job carries post now and
// then among many small ones, the jobs handed back would pile up.) Jobs
// of one author may run out of their queued order then, as they do on two
// workers: a delete job that runs before its post's create job leaves
// that job to find the post gone and take it off again (doc.go).
func (w *Worker) runHeld(ctx context.Context) (int, error) {
	var carried []job
	var rest []heldJob
	for _, h := range w.held {
		if j, ok := parseJob(h.shard, h.msg); ok && w.runsCarried(j) {
			carried = append(carried, j)
		} else {
			rest = append(rest, h)
		}
	}
	if len(carried) > 0 {
		if !w.db.batcher.take(ctx) {
			return 0, nil // stopping: releaseHeld hands them all back
		}
		w.held = rest
		return w.runCarried(ctx, carried)
	}
	h := w.held[0]
	w.held = w.held[1:]
	if err := w.run(ctx, h.shard, h.msg, false); err != nil {
		return 0, err
	}
	return 1, nil
}

// runsCarried reports whether j, read new, runs with other such jobs in
// one pipeline (fanOutCarried): a delivery that carries its followers,
// no more than a batch, on one Redis, as fanOutJob would run it alone.
func (w *Worker) runsCarried(j job) bool {
	return j.op == opDeliver && j.carried && len(j.followers) <= w.opts.Batch && !w.db.onCluster()
}

// runCarried runs jobs read new that carry their followers, in one
// pipeline that ends them (fanOutCarried) and may read this worker's next
// jobs (readNext). The worker holds the process's batch turn (batchTurn)
// when it is called, and gives it back once that pipeline has run. It
// reports how many it finished, and the first error:
// a job that failed stays pending in the group, for another worker to
// take over after ClaimIdle, as a job that fails alone does.
func (w *Worker) runCarried(ctx context.Context, jobs []job) (int, error) {
	cj := make([]carriedJob, len(jobs))
	for i, j := range jobs {
		cj[i] = carriedJob{authorID: j.authorID, seq: j.seq, postID: j.postID,
			end: &jobEnd{shard: j.shard, id: j.id, followers: j.followers, carried: true, listed: j.listed}}
	}
	queue, reads := w.readNext(ctx)
	errs := func() []error {
		// Deferred, so that no way out of the pipeline keeps the turn
		// from the process's other workers.
		defer w.db.batcher.give(len(jobs) >= jobsAtOnce)
		return w.db.fanOutCarried(ctx, cj, queue)
	}()
	w.holdNext(reads)
	done := 0
	var first error
	for i, j := range cj {
		err := errs[i]
		if err == nil && !j.end.finished {
			err = w.finish(ctx, j.end.shard, j.end.id)
		}
		if err != nil {
			if first == nil {
				first = fmt.Errorf("fan-out job %s (%s %s): %w", j.end.id, opDeliver, j.postID, err)
			}
			continue
		}
		done++
	}
	return done, first
}

// holdNext keeps the jobs that reads (from readNext) took, for the next
// steps to run. A read whose answer was lost (the connection failed)
// leaves its job pending in the group, for another worker to take over
// after ClaimIdle, as a lost answer of any read of jobs does.
func (w *Worker) holdNext(reads *[]*redis.XStreamSliceCmd) {
	if reads == nil {
		return
	}
	for _, r := range *reads {
		for _, s := range r.Val() {
			shard, ok := w.shardOf(s.Stream)
			if !ok {
				continue
			}
			for _, m := range s.Messages {
				w.held = append(w.held, heldJob{shard: shard, msg: m})
			}
		}
	}
}

// shardOf returns the shard whose stream is key.
func (w *Worker) shardOf(key string) (int, bool) {
	for shard := range w.ready {
		if fanoutStreamKey(shard) == key {
			return shard, true
		}
	}
	return 0, false
}

// releaseHeld hands the jobs this stopping worker holds and has not
// started to the other workers: it marks them idle for ClaimIdle, so that
// the next worker that looks for jobs of dead workers (at most IdleLook
// later) takes them over, rather than ClaimIdle later. A job it cannot
// mark waits for ClaimIdle, as the job of a worker that died does.
func (w *Worker) releaseHeld() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, h := range w.held {
		err := w.db.client.Do(ctx, "XCLAIM", fanoutStreamKey(h.shard), fanOutGroup, w.opts.Name, 0, h.msg.ID,
			"IDLE", w.opts.ClaimIdle.Milliseconds(), "JUSTID").Err()
		if err != nil {
			w.db.log.WarnContext(ctx, "release a held fan-out job", "id", h.msg.ID, "err", err)
		}
	}
	w.held = nil
}

// finish acknowledges a done job, deletes it from the stream and drops its
// cursor, in one atomic step. A worker that dies just before it leaves the
// job to be taken over, and that rerun delivers nothing twice.
func (w *Worker) finish(ctx context.Context, shard int, id string) error {
	_, err := w.db.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.XAck(ctx, fanoutStreamKey(shard), fanOutGroup, id)
		pipe.XDel(ctx, fanoutStreamKey(shard), id)
		pipe.Del(ctx, fanoutCursorKey(shard, id), fanoutMarkKey(shard, id))
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
// KEYS[1] -> w:{fanout}:jobs or w:{fanout:<i>}:jobs
// KEYS[2] -> w:{fanout}:cursor:<entry id>, in the stream's slot
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

func (w *Worker) saveCursor(ctx context.Context, shard int, id string, c followerCursor) error {
	n, err := saveProgressScript.Run(ctx, w.db.client,
		[]string{fanoutStreamKey(shard), fanoutCursorKey(shard, id)},
		fanOutGroup, w.opts.Name, id, c.String(), int64(cursorTTL/time.Second)).Int64()
	if err != nil {
		return fmt.Errorf("save cursor: %w", err)
	} else if n == 0 {
		return errLostJob
	}
	return nil
}
