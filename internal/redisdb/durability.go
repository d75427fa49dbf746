package redisdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// Durability of acknowledged writes.
//
// Redis replicates asynchronously: a master answers a write before its
// replicas have it, so a master that dies (SIGKILL, a lost host) before
// they do takes the write with it, and the replica promoted in its place
// never had it. With Options.WaitReplicas, the writes that a user is told
// are done (signup, createPost, follow) are confirmed by that many replicas
// of every master they touched before the answer: Redis's WAIT, which waits
// until the replicas have acknowledged everything the connection wrote.
// Each master gets, on one connection of its own, a message on a channel
// of the written key's slot (pub/sub messages travel in the replication
// stream too, so the message follows the write there, and nobody listens)
// and a WAIT, all masters at once: one round trip, plus the replication.
//
// On a cluster, the wait goes to the masters that took the writes, not to
// the masters of their slots when it comes: a master that took a write
// and failed over before the wait is replaced, in the client's slot map,
// by its promoted replica, which may never have had the write, and which
// has no replica of its own to wait for. See writeMasters.
//
// A write whose replicas do not confirm it within Options.WaitTimeout is
// answered with an error, although it may survive: the user, told it
// failed, may try again (a post then twice). Nothing acknowledged is lost
// to a failover then, short of a replica dying with its master.

// Defaults for the durability options.
const (
	DefaultWaitTimeout = time.Second
	// waitAutoEvery is how often WaitReplicas' automatic value (0) looks
	// again at the masters' replicas; a WAIT that comes back short looks
	// at once.
	waitAutoEvery = 10 * time.Second
)

// errNotDurable answers a write whose replicas did not confirm it.
var errNotDurable = warble.Errorf(warble.EINTERNAL,
	"The change was made, but the database could not confirm that it is safely stored. Check, and try again if it is missing.")

// waitAuto is the WaitReplicas that has Warble decide.
const waitAuto = 0

// must returns v, whatever err (a zero v with an error).
func must(v int64, _ error) int64 { return v }

// replicaWait knows, for a WaitReplicas of 0 (automatic), how many replicas
// each master of a cluster has online, by address, as CLUSTER SHARDS said
// at most waitAutoEvery ago: a write to a master with one waits for one,
// a write to a master with none (a single Redis, a cluster without
// replicas, or a master whose replica took over from it and has none
// yet) does not wait. It also knows the replicas' addresses: a node that
// took a write as a master and is a replica now cannot vouch for it.
type replicaWait struct {
	mu       sync.Mutex
	replicas map[string]int
	demoted  map[string]bool // the addresses of replicas
	lookAt   time.Time       // when to look again
}

// replicasOf returns how many replicas a write to the master at addr
// waits for, and whether CLUSTER SHARDS names addr as a replica's (a node
// that took writes as a master and is a replica now); with fresh, it asks
// the cluster first. With a WaitReplicas set, it does not ask: a WAIT
// fails on a replica.
//
// An address it does not know is not taken for a replica's: CLUSTER
// SHARDS names nodes by IP, which a client that knows them by hostname
// does not find there, and those writes would all fail.
func (db *DB) replicasOf(ctx context.Context, addr string, fresh bool) (int, bool) {
	if db.opts.WaitReplicas != waitAuto {
		return max(0, db.opts.WaitReplicas), false
	}
	cc, ok := db.client.(*redis.ClusterClient)
	if !ok {
		return 0, false
	}
	w := &db.replicaWait
	w.mu.Lock()
	defer w.mu.Unlock()
	if fresh || w.replicas == nil || !time.Now().Before(w.lookAt) {
		if shards, err := cc.ClusterShards(ctx).Result(); err == nil {
			w.replicas, w.demoted, w.lookAt = map[string]int{}, map[string]bool{}, time.Now().Add(waitAutoEvery)
			for _, sh := range shards {
				master, online := "", 0
				for _, node := range sh.Nodes {
					if node.Role == "replica" {
						w.demoted[net.JoinHostPort(node.IP, strconv.FormatInt(node.Port, 10))] = true
					}
					// Redis 7.0 calls a replica "loading" until its
					// offset has been gossiped, long after it synced:
					// only "failed" counts as gone.
					switch {
					case node.Health == "failed":
					case node.Role == "master":
						master = net.JoinHostPort(node.IP, strconv.FormatInt(node.Port, 10))
					case node.Role == "replica":
						online++
					}
				}
				if master != "" {
					w.replicas[master] = online
				}
			}
		}
	}
	return min(1, w.replicas[addr]), w.demoted[addr]
}

// awaitReplicas waits until the replicas of every master that took a
// write of ctx (see writeMasters; on one Redis, the one) have everything
// written to it so far, and fails with errNotDurable if they do not within
// Options.WaitTimeout, or if such a master is no longer one. keys are the
// keys written, noted as written now if ctx did not note them.
func (db *DB) awaitReplicas(ctx context.Context, keys ...string) error {
	if db.opts.WaitReplicas < 0 {
		return nil
	}
	if db.beforeWait != nil {
		db.beforeWait(ctx)
	}
	// The masters, each with a channel of a slot it took a write in.
	nodes := map[string]*redis.Client{}
	channels := map[string]string{}
	switch c := db.client.(type) {
	case *redis.Client:
		if db.opts.WaitReplicas == waitAuto {
			return nil // one Redis: no replicas to wait for unless told
		}
		if len(keys) > 0 {
			nodes[c.Options().Addr], channels[c.Options().Addr] = c, waitChannel(keys[0])
		}
	case *redis.ClusterClient:
		w := writesOf(ctx)
		if w == nil {
			w = &writeMasters{}
		}
		for _, key := range keys {
			w.note(ctx, c, waitChannel(key))
		}
		w.mu.Lock()
		noted, noteErr := maps.Clone(w.masters), w.err
		w.mu.Unlock()
		if noteErr != nil {
			return db.notDurable(ctx, noteErr)
		}
		for ch, addr := range noted {
			m, err := c.MasterForKey(ctx, ch)
			if err != nil {
				return db.notDurable(ctx, err)
			}
			if now := m.Options().Addr; now != addr {
				return db.notDurable(ctx, fmt.Errorf("the master of %s was %s at the write and is %s at the wait", ch, addr, now))
			}
			if _, ok := nodes[addr]; !ok {
				nodes[addr], channels[addr] = m, ch
			}
		}
	default:
		return nil
	}
	timeout := db.opts.WaitTimeout.Milliseconds()
	errs := make(chan error, len(nodes))
	for addr, node := range nodes {
		go func() {
			// A look at most waitAutoEvery old will do: a master
			// that has become a replica since is either named one
			// by it, or counted with the replica it had then, and
			// the WAIT fails on a replica. A replica then may be
			// the master now (it took over): look again.
			n, demoted := db.replicasOf(ctx, addr, false)
			if demoted {
				n, demoted = db.replicasOf(ctx, addr, true)
			}
			switch {
			case demoted:
				errs <- fmt.Errorf("wait for replicas of %s: it is a replica now", addr)
				return
			case n == 0:
				errs <- nil
				return
			}
			// One pipeline is one connection: the WAIT counts the
			// replicas that have this connection's message, which
			// follows every write made to the master before it.
			var wait *redis.Cmd
			_, err := node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				db.publish(ctx, pipe, channels[addr], "")
				wait = pipe.Do(ctx, "WAIT", n, timeout)
				return nil
			})
			if err != nil {
				errs <- fmt.Errorf("wait for replicas of %s: %w", addr, err)
				return
			}
			if must(wait.Int64()) >= int64(n) {
				errs <- nil
				return
			}
			if n, demoted := db.replicasOf(ctx, addr, true); n == 0 && !demoted {
				// Its replica is gone (it took over from a master
				// that failed, and has no replica yet): as durable as
				// a master alone can be.
				errs <- nil
				return
			}
			errs <- fmt.Errorf("wait for replicas of %s: %d of %d confirmed within %v", addr, must(wait.Int64()), n, db.opts.WaitTimeout)
		}()
	}
	var first error
	for range nodes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return db.notDurable(ctx, first)
	}
	return nil
}

// notDurable logs why a write was not confirmed and returns errNotDurable.
func (db *DB) notDurable(ctx context.Context, err error) error {
	db.log.ErrorContext(ctx, "a write was not confirmed by its replicas", "err", err)
	return errNotDurable
}

// writeMasters notes, for the writes of one signup, post or follow on a
// Redis Cluster, the master of each slot they touch as the client's slot
// map names it just before the first command to that slot is sent; a
// cluster client's hook (masterNoter) fills it in for a context made by
// DB.noteWrites. awaitReplicas then waits on exactly those masters, and
// fails if the slot map names another master for one of the slots now.
//
// Why that is sound: a write sent to the noted master A either ran on A,
// or was redirected or retried elsewhere because A no longer served the
// slot. If the slot map still names A at the wait, the WAIT goes to A and
// covers everything A ran before it, the write included; had A lost the
// slot, A is a replica now (the WAIT fails there) or dead (so does the
// connection), or, if the map has not caught up with a move of the slot
// to another master, the wait's message, which is sent on a channel of
// that slot, is refused with MOVED. If the map names another master, the
// slot changed hands between the write and the wait, and nothing tells
// whether the new master has the write: the answer is errNotDurable,
// although the write may well be there (it was after a CLUSTER FAILOVER
// without FORCE), as for a WAIT that timed out. What is left is a slot
// that leaves A and comes back to A between the write and the wait, two
// failovers within one request.
//
// Noting the master before the write rather than the node that ran it (a
// hook on each node's client) needs no knowledge of which node clients
// exist (go-redis tells of new ones only), and gives each noted master a
// channel of a slot it served. The cost is a lookup in the slot map and a
// map entry per command in those requests (see BenchmarkNoteWrites);
// commands outside them pay a context lookup.
type writeMasters struct {
	mu      sync.Mutex
	masters map[string]string // wait channel of a slot -> its master's address
	err     error             // a master that could not be looked up
}

type writeMastersKey struct{}

// noteWrites returns ctx with a writeMasters for awaitReplicas, on a
// Redis Cluster whose writes wait for their replicas; ctx otherwise.
func (db *DB) noteWrites(ctx context.Context) context.Context {
	if _, ok := db.client.(*redis.ClusterClient); !ok || db.opts.WaitReplicas < 0 {
		return ctx
	}
	return context.WithValue(ctx, writeMastersKey{}, &writeMasters{})
}

// skipNotes returns ctx without its writeMasters, for work whose writes
// are not waited for (a post's inline fan-out).
func skipNotes(ctx context.Context) context.Context {
	if writesOf(ctx) == nil {
		return ctx
	}
	return context.WithValue(ctx, writeMastersKey{}, (*writeMasters)(nil))
}

func writesOf(ctx context.Context) *writeMasters {
	w, _ := ctx.Value(writeMastersKey{}).(*writeMasters)
	return w
}

// note notes the master of channel's slot, unless one is noted already.
func (w *writeMasters) note(ctx context.Context, cc *redis.ClusterClient, channel string) {
	w.mu.Lock()
	_, noted := w.masters[channel]
	w.mu.Unlock()
	if noted {
		return
	}
	m, err := cc.MasterForKey(ctx, channel)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err != nil:
		w.err = cmp.Or(w.err, fmt.Errorf("look up the master of %s: %w", channel, err))
	case w.masters == nil:
		w.masters = map[string]string{channel: m.Options().Addr}
	default:
		if _, ok := w.masters[channel]; !ok {
			w.masters[channel] = m.Options().Addr
		}
	}
}

// firstKey returns the first key of cmd, or "" for one without keys. A
// command whose first argument is taken for a key that is none costs
// an extra wait on the master of that argument's slot, nothing more.
func firstKey(cmd redis.Cmder) string {
	args, pos := cmd.Args(), 1
	switch cmd.Name() {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		if len(args) < 4 || fmt.Sprint(args[2]) == "0" {
			return ""
		}
		pos = 3
	case "cluster", "wait", "ping", "info", "client", "command", "hello", "script", "function", "publish", "multi", "exec", "discard":
		return ""
	}
	if len(args) <= pos {
		return ""
	}
	switch key := args[pos].(type) {
	case string:
		return key
	case *string: // fan-out's names (see queueDeliveries)
		if key != nil {
			return *key
		}
	}
	return ""
}

// masterNoter is the cluster client's hook that fills in the
// writeMasters of a context made by noteWrites.
type masterNoter struct{ cc *redis.ClusterClient }

func (h masterNoter) noteAll(ctx context.Context, cmds ...redis.Cmder) {
	w := writesOf(ctx)
	if w == nil {
		return
	}
	for _, cmd := range cmds {
		if key := firstKey(cmd); key != "" {
			w.note(ctx, h.cc, waitChannel(key))
		}
	}
}

func (h masterNoter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h masterNoter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.noteAll(ctx, cmd)
		return next(ctx, cmd)
	}
}

func (h masterNoter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.noteAll(ctx, cmds...)
		return next(ctx, cmds)
	}
}

// waitChannel names the channel on which awaitReplicas sends its message
// for the master of key's slot: it carries key's hash tag (or the whole
// key as one), so that it is in key's slot.
func waitChannel(key string) string {
	tag := key
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			tag = key[i+1 : i+1+j]
		}
	}
	return prefix + "ch:{" + tag + "}:wait"
}

// slotReloader is a go-redis hook that has a cluster client reload its slot
// map when a pipeline could not reach a node. go-redis does so itself for
// a single command, but a pipeline to a master that died keeps going to it
// until something else reloads the map; after a failover, page reads (all
// pipelines) would fail until then.
type slotReloader struct{ cc *redis.ClusterClient }

func (r slotReloader) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r slotReloader) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (r slotReloader) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		var netErr net.Error
		if errors.As(err, &netErr) || errors.Is(err, io.EOF) || redis.HasErrorPrefix(err, "CLUSTERDOWN") {
			r.cc.ReloadState(ctx) // in the background, at most every 200ms
		}
		return err
	}
}
