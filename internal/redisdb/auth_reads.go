package redisdb

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxSessionBatch bounds how many sessions one pipeline of sessionReads
// reads, so that a burst is sent as several bounded writes.
const maxSessionBatch = 128

// sessionReads sends the reads of Authenticate (a session's time to live
// and its user's fields) to Redis, and lets requests that arrive while one
// read is on its way share the next round trip: each of them is queued, and
// when the read in flight has come back, the queue goes out as one
// pipeline. A busy server pays one write, one read and one wake-up of
// Redis per batch instead of per request.
//
// A request that finds no read in flight yields its goroutine once
// (runtime.Gosched) before it sends its own. On a quiet server nothing
// else is runnable, and it goes on at once. On a busy one, the requests
// that this process is already running (their bodies read, their queries
// parsed) reach their reads meanwhile, queue, and go out with it instead
// of in the next round trip; a yield lets only goroutines that are
// runnable now run first, and they soon block at their reads or other
// I/O. If one runs long instead, the request waits for it before it
// sends; without the yield it would have waited for it after its answer,
// for a P, so the yield costs it at most one round trip. At 16 requests
// in flight, a home page's batch held 4.3 reads on average with the yield
// and 2.6 without, and Redis's CPU a page fell by a fifth
// (BenchmarkHomePage, see BENCHMARKS.md).
//
// Every read is sent after its request arrived, never joined to a pipeline
// already on its way, so a session revoked before a request came is seen
// revoked, as with a read of its own; nothing is remembered between
// batches. On a Redis Cluster each master has its own queue, so that a
// master that does not answer holds up the requests of its own users
// only, as it did when each request sent its own read; a batch goes
// through the cluster client all the same, which follows a slot that
// moved.
type sessionReads struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // client, if it is one

	mu     sync.Mutex
	one    readQueue             // the queue of a single Redis
	queues map[string]*readQueue // a cluster's, by master address
	batchN func(n int)           // if set, told the size of each batch (tests)
	yield  func()                // runtime.Gosched; tests replace it
}

// readQueue is the reads for one Redis server; its fields are guarded by
// sessionReads.mu.
type readQueue struct {
	key   string         // on a cluster, the key of the read it was made for
	busy  bool           // a read is in flight, so new ones queue
	queue []*sessionRead // reads waiting for the next batch
	spare []*sessionRead // the last batch's slice, reused
}

// sessionRead is one request's reads.
type sessionRead struct {
	left   *redis.DurationCmd // PTTL of the session
	fields *redis.SliceCmd    // HMGET of the user's fields
	done   chan struct{}      // closed when the batch of a queued read has answered

	// homeArgs, if set, is the first range read of a page of the user's
	// home timeline, sent with the two reads as home (see
	// AuthService.AuthenticateForHome).
	homeArgs *redis.ZRangeArgs
	home     *redis.StringSliceCmd
	homeCard *redis.IntCmd // the home timeline's size, for the cap (see clampHome)

	// seq, if set, is reserveSeqScript's EVALSHA, sent after the reads
	// (see AuthService.AuthenticateForPost).
	seq *redis.Cmd
}

// newSessionReads returns the session reads of client, with a queue per
// master when it is a cluster client.
func newSessionReads(client redis.UniversalClient) *sessionReads {
	cc, _ := client.(*redis.ClusterClient)
	return &sessionReads{client: client, cluster: cc, queues: make(map[string]*readQueue), yield: runtime.Gosched}
}

// queueOf returns the queue of the Redis at addr, which serves key (see
// masterOf). s.mu must be held.
//
// A cluster's masters change (a failover, a resharding, a cluster scaled),
// so when an address gets a queue (once per master, and again only after
// the masters changed; no other read pays for this), the queues of
// addresses that no longer serve the key they were made for are dropped:
// the map never holds more queues than the cluster had masters when an
// address last got one. A queue dropped while a read is in flight is
// still that read's, and its queued reads go out through it; a later read
// of its address, if that is still a master, makes a new one.
func (s *sessionReads) queueOf(ctx context.Context, addr, key string) *readQueue {
	if s.cluster == nil {
		return &s.one
	}
	q := s.queues[addr]
	if q == nil {
		for a, old := range s.queues {
			// The client's map of the slots, in memory: the read
			// that got here has just read it.
			if m, ok := s.masterOf(ctx, old.key); !ok || m != a {
				delete(s.queues, a)
			}
		}
		q = &readQueue{key: key}
		s.queues[addr] = q
	}
	return q
}

// masterOf returns the address of the cluster master that serves key, ""
// on a single Redis, and false when the cluster client cannot tell (the
// read then goes alone, and fails or finds out on the way).
func (s *sessionReads) masterOf(ctx context.Context, key string) (string, bool) {
	if s.cluster == nil {
		return "", true
	}
	master, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return "", false
	}
	return master.Options().Addr, true
}

// read sends r's commands, alone or with others (see sessionReads), and
// returns once they have answered, their results and errors in their
// commands, or when ctx ends first. key is the key whose Redis serves
// both.
func (s *sessionReads) read(ctx context.Context, key string, r *sessionRead) error {
	addr, ok := s.masterOf(ctx, key)
	if !ok {
		s.exec(ctx, []*sessionRead{r})
		return nil
	}
	s.mu.Lock()
	q := s.queueOf(ctx, addr, key)
	if q.busy {
		r.done = make(chan struct{})
		q.queue = append(q.queue, r)
		s.mu.Unlock()
		select {
		case <-r.done:
			return nil
		case <-ctx.Done():
			return ctx.Err() // the batch answers into r all the same
		}
	}
	q.busy = true
	s.mu.Unlock()
	// Deferred, so that a read that panics (recovered by the server, as
	// a request's panic is) does not leave q busy, and every later read
	// queued behind one that never comes back.
	defer s.handOn(ctx, q)
	s.yield()
	s.mu.Lock()
	if len(q.queue) > 0 {
		// First in the batch, so that it goes out whatever the queue's
		// length; the others queued while this one yielded.
		q.queue = slices.Insert(q.queue, 0, r)
		s.mu.Unlock()
		s.sendQueued(context.WithoutCancel(ctx), q)
		return nil
	}
	s.mu.Unlock()
	batch := [1]*sessionRead{r}
	s.exec(ctx, batch[:])
	return nil
}

// handOn ends the read in flight of q: the reads queued meanwhile go out,
// or the next read goes out on its own.
func (s *sessionReads) handOn(ctx context.Context, q *readQueue) {
	s.mu.Lock()
	if len(q.queue) == 0 {
		q.busy = false
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	// The queued reads go out from a goroutine of their own, so that this
	// request answers now, and a queued request that gives up waiting
	// cannot leave the others without a sender. It runs on ctx's values
	// but not its end: one request's client going away must not fail the
	// reads of the others.
	go s.drain(context.WithoutCancel(ctx), q)
}

// drain sends q in batches until it is empty, then lets the next read go
// out on its own again.
func (s *sessionReads) drain(ctx context.Context, q *readQueue) {
	for s.sendQueued(ctx, q) {
	}
}

// sendQueued sends the first maxSessionBatch reads of q's queue as one
// batch, and reports true; a read's done, if it has one, is closed once
// its batch has answered. If the queue is empty, it lets the next read go
// out on its own again, and reports false.
func (s *sessionReads) sendQueued(ctx context.Context, q *readQueue) bool {
	s.mu.Lock()
	batch := q.queue
	if len(batch) == 0 {
		q.busy = false
		s.mu.Unlock()
		return false
	}
	if len(batch) > maxSessionBatch {
		q.queue = append(q.spare[:0], batch[maxSessionBatch:]...)
		batch = batch[:maxSessionBatch]
		q.spare = nil
	} else {
		q.queue, q.spare = q.spare[:0], nil
	}
	s.mu.Unlock()
	s.execQueued(ctx, batch)
	for _, r := range batch {
		if r.done != nil {
			close(r.done)
		}
	}
	clear(batch)
	s.mu.Lock()
	q.spare = batch[:0]
	s.mu.Unlock()
	return true
}

// execQueued sends a batch of queued reads (see exec). A panic on the
// way would be drain's, where no request's recover catches it, and would
// end the process: it fails the batch's reads instead, as an error of the
// pipeline would (their requests answer an internal error, and the server
// logs the panic with it), and drain goes on with the queue.
func (s *sessionReads) execQueued(ctx context.Context, batch []*sessionRead) {
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("session reads panicked: %v", p)
			for _, r := range batch {
				r.left.SetErr(err)
				r.fields.SetErr(err)
				if r.home != nil {
					r.home.SetErr(err)
				}
				if r.homeCard != nil {
					r.homeCard.SetErr(err)
				}
				if r.seq != nil {
					r.seq.SetErr(err)
				}
			}
		}
	}()
	s.exec(ctx, batch)
}

// exec sends one batch's commands in one pipeline. An error of the whole
// pipeline is in every command; the callers read their own.
func (s *sessionReads) exec(ctx context.Context, batch []*sessionRead) {
	if s.batchN != nil {
		s.batchN(len(batch))
	}
	pipe := s.client.Pipeline()
	for _, r := range batch {
		_ = pipe.Process(ctx, r.left)
		_ = pipe.Process(ctx, r.fields)
		if r.homeArgs != nil {
			// Queued by the pipeline's own method, so that it is the
			// very command that rangeFeed would send.
			r.home = pipe.ZRangeArgs(ctx, *r.homeArgs)
			r.homeCard = pipe.ZCard(ctx, r.homeArgs.Key)
		}
		if r.seq != nil {
			_ = pipe.Process(ctx, r.seq)
		}
	}
	_, _ = pipe.Exec(ctx)
}

// newSessionRead returns the reads of the session at key and the fields of
// the user at userKey that Authenticate needs.
func newSessionRead(ctx context.Context, key, userKey string) *sessionRead {
	return &sessionRead{
		left:   redis.NewDurationCmd(ctx, time.Millisecond, "pttl", key),
		fields: redis.NewSliceCmd(ctx, "hmget", userKey, "username", "displayName", "createdAt"),
	}
}
