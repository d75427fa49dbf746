package redisdb

import (
	"context"
	"errors"
	"fmt"
	"io"
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
// yet) does not wait.
type replicaWait struct {
	mu       sync.Mutex
	replicas map[string]int
	lookAt   time.Time // when to look again
}

// replicasOf returns how many replicas a write to the master at addr
// waits for; with fresh, it asks the cluster first.
func (db *DB) replicasOf(ctx context.Context, addr string, fresh bool) int {
	if db.opts.WaitReplicas != waitAuto {
		return max(0, db.opts.WaitReplicas)
	}
	cc, ok := db.client.(*redis.ClusterClient)
	if !ok {
		return 0
	}
	w := &db.replicaWait
	w.mu.Lock()
	defer w.mu.Unlock()
	if fresh || w.replicas == nil || !time.Now().Before(w.lookAt) {
		if shards, err := cc.ClusterShards(ctx).Result(); err == nil {
			w.replicas, w.lookAt = map[string]int{}, time.Now().Add(waitAutoEvery)
			for _, sh := range shards {
				master, online := "", 0
				for _, node := range sh.Nodes {
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
	return min(1, w.replicas[addr])
}

// awaitReplicas waits until the replicas of every master that serves one
// of keys (see replicasOf) have everything written to it so far, and fails
// with errNotDurable if they do not within Options.WaitTimeout.
func (db *DB) awaitReplicas(ctx context.Context, keys ...string) error {
	if db.opts.WaitReplicas < 0 {
		return nil
	}
	if _, ok := db.client.(*redis.Client); ok && db.opts.WaitReplicas == waitAuto {
		return nil // one Redis: no replicas to wait for unless told
	}
	// The masters, each with a key of its own slots.
	nodes := map[string]*redis.Client{}
	channels := map[string]string{}
	for _, key := range keys {
		var node *redis.Client
		switch c := db.client.(type) {
		case *redis.ClusterClient:
			m, err := c.MasterForKey(ctx, key)
			if err != nil {
				return fmt.Errorf("wait for replicas: %w", err)
			}
			node = m
		case *redis.Client:
			node = c
		default:
			return nil
		}
		addr := node.Options().Addr
		if _, ok := nodes[addr]; !ok {
			nodes[addr], channels[addr] = node, waitChannel(key)
		}
	}
	timeout := db.opts.WaitTimeout.Milliseconds()
	errs := make(chan error, len(nodes))
	for addr, node := range nodes {
		go func() {
			n := db.replicasOf(ctx, addr, false)
			if n == 0 {
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
			switch {
			case err != nil:
				errs <- fmt.Errorf("wait for replicas of %s: %w", addr, err)
			case must(wait.Int64()) >= int64(n):
				errs <- nil
			case db.replicasOf(ctx, addr, true) == 0:
				// Its replica is gone (it took over from a master
				// that failed, and has no replica yet): as durable as
				// a master alone can be.
				errs <- nil
			default:
				errs <- fmt.Errorf("wait for replicas of %s: %d of %d confirmed within %v", addr, must(wait.Int64()), n, db.opts.WaitTimeout)
			}
		}()
	}
	var first error
	for range nodes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		db.log.ErrorContext(ctx, "a write was not confirmed by its replicas", "err", first)
		return errNotDurable
	}
	return nil
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
