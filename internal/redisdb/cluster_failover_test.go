package redisdb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// The failover tests run Warble on a 3-master cluster with a replica per
// master, with posts, signups and a live subscription going on, and fail
// over the master that holds the author, the reader and the reader's
// channel: every write that was acknowledged is there afterwards, the
// subscriber gets every post or a RESYNC, and writes succeed again within
// seconds. Writes wait for a replica (Options.WaitReplicas, automatic on a
// cluster with replicas): without that, a master killed before its replica
// had a write it acknowledged takes the write with it (see durability.go).
// Fan-out is asynchronous, as the server runs it (internal/app), with a
// worker throughout: without AsyncFanOut a post whose fan-out failed at the
// failover is acknowledged with no job to finish it, and nothing ever
// delivers it to its followers.

// TestClusterManualFailoverLosesNothing fails over with CLUSTER FAILOVER on
// the replica, as an operator does before maintenance: the replica takes
// over once it has everything, so nothing can be lost.
func TestClusterManualFailoverLosesNothing(t *testing.T) {
	runFailover(t, func(ctx context.Context, c *redistest.Cluster, master, replica *redistest.ClusterNode) {
		if err := replica.Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestClusterKilledMasterLosesNoAcknowledgedWrite kills the master with
// SIGKILL: its replica takes over once the cluster has found the master
// dead (cluster-node-timeout, 1s here). Writes made on the dead master
// since the replica last had them are lost with it, but each of those was
// still waiting for its replica, so none was acknowledged.
func TestClusterKilledMasterLosesNoAcknowledgedWrite(t *testing.T) {
	runFailover(t, func(ctx context.Context, c *redistest.Cluster, master, replica *redistest.ClusterNode) {
		master.Kill()
	})
}

// runFailover runs the scenario around fail, which fails over master to
// replica.
func runFailover(t *testing.T, fail func(ctx context.Context, c *redistest.Cluster, master, replica *redistest.ClusterNode)) {
	if testing.Short() {
		t.Skip("starts a cluster of 6 nodes and fails one over")
	}
	requireClusterable(t)
	ctx := context.Background()
	c := redistest.NewCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	db := newClusterDB(t, c, Options{AsyncFanOut: true})
	posts := NewPostService(db)
	auth := NewAuthService(db)

	// An author and a reader on the same master.
	ada := mustSignup(t, db, "ada")
	master, err := c.NodeOf(ctx, userKey(ada.ID))
	if err != nil {
		t.Fatal(err)
	}
	var bob *warble.User
	for i := 0; bob == nil; i++ {
		u := mustSignup(t, db, fmt.Sprintf("reader%d", i))
		if n, _ := c.NodeOf(ctx, userKey(u.ID)); n == master {
			bob = u
		}
	}
	mustFollow(t, db, bob.ID, ada.ID)
	if n, _ := db.replicasOf(ctx, master.Addr, true); n != 1 {
		t.Fatalf("writes to %s wait for %d replicas, want 1 (automatic on a cluster with replicas)", master.Addr, n)
	}
	replica, err := c.ReplicaOf(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	// A fan-out worker runs throughout, as in the server: it delivers the
	// posts, and is failed over with the rest.
	wctx, stopWorker := context.WithCancel(ctx)
	workerDone := make(chan error, 1)
	go func() { workerDone <- NewWorker(db, WorkerOptions{Sweep: true, ClaimIdle: time.Second}).Run(wctx) }()
	defer func() {
		stopWorker()
		if err := <-workerDone; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()
	h := newTestHub(t, db)
	home := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)

	// The subscriber's events, as they come.
	var mu sync.Mutex
	added := map[int64]bool{}
	resyncs, resyncedTo := 0, int64(0)
	go func() {
		for ev := range home {
			mu.Lock()
			switch ev.Kind {
			case warble.PostAdded:
				added[ev.Post.Seq] = true
			case warble.Resync:
				resyncs++
				if seq, err := warble.ParsePostCursor(ev.Cursor); err == nil {
					resyncedTo = max(resyncedTo, seq)
				}
			}
			mu.Unlock()
		}
	}()

	// Writes, until told to stop: a post by ada, and now and then a
	// signup, remembering those acknowledged.
	var acked []*warble.Post
	var ackedUsers []string
	lastOK := time.Now()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			p, err := posts.CreatePost(ctx, ada.ID, fmt.Sprintf("post %d", i))
			mu.Lock()
			if err == nil {
				acked, lastOK = append(acked, p), time.Now()
			}
			mu.Unlock()
			if i%5 == 0 {
				name := fmt.Sprintf("user%d", i)
				if _, err := auth.Signup(ctx, warble.SignupInput{Username: name, Password: "password123"}); err == nil {
					mu.Lock()
					ackedUsers = append(ackedUsers, name)
					mu.Unlock()
				}
			}
		}
	}()
	acknowledged := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	waitFor(t, "posts before the failover", func() bool { return acknowledged() >= 20 })

	failed := time.Now()
	fail(ctx, c, master, replica)
	waitFor(t, "the replica to take over", func() bool { return replica.IsMaster(ctx) })
	before := acknowledged()
	// Writes succeed again within seconds: cluster-node-timeout is 1s,
	// and go-redis follows the slots to the new master.
	deadline := time.Now().Add(15 * time.Second)
	for acknowledged() < before+20 {
		if time.Now().After(deadline) {
			t.Fatalf("%d posts acknowledged in the 15s after the replica took over, want 20", acknowledged()-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	<-stopped
	mu.Lock()
	t.Logf("failed over after %d posts; writes succeeded again %v after the failover began; %d posts and %d signups acknowledged in all",
		before, lastOK.Sub(failed).Round(time.Millisecond), len(acked), len(ackedUsers))
	mu.Unlock()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.WaitHealthy(hctx); err != nil {
		t.Fatal(err)
	}

	// What an acknowledgement promises is the post and its job. A job
	// cut short at the failover is taken over once it has been idle for
	// ClaimIdle; one whose XADD failed waits in its author's outbox,
	// which a worker sweeps once it is sweepAfter old: the test sweeps
	// it now.
	if _, err := db.sweepOutboxes(ctx, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var homeIDs []string
	var missing []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		homeIDs = zsetIDs(t, db, homeKey(bob.ID))
		mu.Lock()
		missing = missing[:0]
		for _, p := range acked {
			if !slices.Contains(homeIDs, p.ID) {
				missing = append(missing, p.ID)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for the jobs of the acknowledged posts to reach the follower: %v are missing; %s",
				missing, fanOutState(db, ada.ID))
		}
	}

	// Every acknowledged write is there.
	ids := zsetIDs(t, db, postsKey(ada.ID))
	for _, p := range acked {
		if got, err := posts.FindPostByID(ctx, p.ID); err != nil || got.Body != p.Body {
			t.Errorf("acknowledged post %s: %v, %v", p.ID, got, err)
		}
		if !slices.Contains(ids, p.ID) {
			t.Errorf("acknowledged post %s is not in its author's posts", p.ID)
		}
		if !slices.Contains(homeIDs, p.ID) {
			t.Errorf("acknowledged post %s is not in the follower's home timeline", p.ID)
		}
	}
	for _, name := range ackedUsers {
		if _, err := auth.Login(ctx, warble.LoginInput{Username: name, Password: "password123"}); err != nil {
			t.Errorf("acknowledged signup of %s: login: %v", name, err)
		}
	}

	// The subscriber got every post, or a RESYNC (it refetches then), and
	// live events go on.
	mu.Lock()
	missed := 0
	last := acked[len(acked)-1]
	for _, q := range acked {
		if !added[q.Seq] {
			missed++
		}
	}
	mu.Unlock()
	waitFor(t, "the subscriber to get the last acknowledged post or a RESYNC past it", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return added[last.Seq] || resyncedTo >= last.Seq
	})
	mu.Lock()
	t.Logf("the subscriber got %d of the %d posts as events, and %d RESYNCs", len(acked)-missed, len(acked), resyncs)
	if missed > 0 && resyncs == 0 {
		t.Errorf("the subscriber missed %d posts and got no RESYNC", missed)
	}
	mu.Unlock()
	// Live events go on: the hub follows the slots to the new master
	// within seconds of the failover (see Hub.watchSlots).
	deadline = time.Now().Add(15 * time.Second)
	for {
		p := mustCreatePost(t, db, ada.ID, "after the failover")
		live := false
		for end := time.Now().Add(time.Second); !live && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			live = added[p.Seq]
			mu.Unlock()
		}
		if live {
			t.Logf("live events again %v after the failover began", time.Since(failed).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no live event in the 15s after the writes resumed")
		}
	}
}

// TestClusterWaitKeepsAcknowledgedWrites shows what the wait for a replica
// buys, in the one case that asynchronous replication loses a write: the
// replica is cut off from its master (frozen, its link closed), a post is
// made on the master, and the master dies, so the replica takes over
// without the post. Without the wait, CreatePost answered success and the
// post is gone; with it, CreatePost answered an error.
func TestClusterWaitKeepsAcknowledgedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters of 6 nodes and fails them over")
	}
	requireClusterable(t)
	for _, wait := range []struct {
		name     string
		replicas int
	}{{"off", -1}, {"one replica", 1}} {
		t.Run(wait.name, func(t *testing.T) {
			ctx := context.Background()
			c := redistest.NewCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
			db := newClusterDB(t, c, Options{WaitReplicas: wait.replicas, WaitTimeout: 500 * time.Millisecond})
			ada := mustSignup(t, db, "ada")
			master, err := c.NodeOf(ctx, postsKey(ada.ID))
			if err != nil {
				t.Fatal(err)
			}
			replica, err := c.ReplicaOf(ctx, master)
			if err != nil {
				t.Fatal(err)
			}
			// The post's seq comes from w:seq:post, maybe on another
			// master: take one first, so that the post's own writes
			// are all on the dying master.
			mustCreatePost(t, db, ada.ID, "before")

			if err := replica.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			if err := master.Client(t).Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
				t.Fatal(err)
			}
			p, createErr := NewPostService(db).CreatePost(ctx, ada.ID, "only the master has it")
			master.Kill()
			if err := replica.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the replica to take over", func() bool { return replica.IsMaster(ctx) })
			hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := c.WaitHealthy(hctx); err != nil {
				t.Fatal(err)
			}
			if wait.replicas < 0 {
				if createErr != nil {
					t.Fatalf("CreatePost without the wait: %v, want success", createErr)
				}
				// Until the client has the new slot map, a read may
				// still go to the dead master.
				var err error
				waitFor(t, "an answer from the new master", func() bool {
					_, err = NewPostService(db).FindPostByID(ctx, p.ID)
					return err == nil || warble.ErrorCode(err) == warble.ENOTFOUND
				})
				if warble.ErrorCode(err) != warble.ENOTFOUND {
					t.Fatalf("the acknowledged post after the failover: %v; want it lost (NOT_FOUND)", err)
				}
				t.Logf("without the wait, post %s was acknowledged and lost", p.ID)
				return
			}
			if warble.ErrorCode(createErr) != warble.EINTERNAL {
				t.Fatalf("CreatePost with the wait, its replica cut off: %v, %v; want an INTERNAL error", p, createErr)
			}
			t.Logf("with the wait, CreatePost answered: %v", createErr)
		})
	}
}

// fanOutState says where a db's fan-out jobs are: its author's outbox,
// and each shard's outbox index, stream and pending entries.
func fanOutState(db *DB, authorID string) string {
	ctx := context.Background()
	var b strings.Builder
	fmt.Fprintf(&b, "outbox %v", db.client.ZRange(ctx, outboxKey(authorID), 0, -1).Val())
	for shard := range db.opts.FanOutShards {
		index := db.client.ZRange(ctx, outboxIndexKey(shard), 0, -1).Val()
		jobs := db.client.XRange(ctx, fanoutStreamKey(shard), "-", "+").Val()
		pending := db.client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: fanoutStreamKey(shard), Group: fanOutGroup, Start: "-", End: "+", Count: 100}).Val()
		if len(index)+len(jobs)+len(pending) > 0 {
			fmt.Fprintf(&b, "; shard %d: index %v, stream %v, pending %v", shard, index, jobs, pending)
		}
	}
	return b.String()
}

// TestClusterWaitOnTheMasterThatTookTheWrite fails a master over between
// a post's writes and their wait: the master took the post with its
// replica cut off, dies, and its replica takes over without the post (and
// with no replica of its own yet); the client learns the new slot map
// before the wait. A wait on the slot's master at the time of the wait
// asks the new master, which has nothing to wait for, and the lost post
// was acknowledged; CreatePost must answer an error instead.
func TestClusterWaitOnTheMasterThatTookTheWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of 6 nodes and fails one over")
	}
	requireClusterable(t)
	ctx := context.Background()
	c := redistest.NewCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	db := newClusterDB(t, c, Options{WaitTimeout: 500 * time.Millisecond})
	cc := db.client.(*redis.ClusterClient)
	ada := mustSignup(t, db, "ada")
	mustCreatePost(t, db, ada.ID, "before")
	master, err := c.NodeOf(ctx, postsKey(ada.ID))
	if err != nil {
		t.Fatal(err)
	}
	replica, err := c.ReplicaOf(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := db.replicasOf(ctx, master.Addr, true); n != 1 {
		t.Fatalf("writes to %s wait for %d replicas, want 1", master.Addr, n)
	}
	if err := replica.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := master.Client(t).Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	failedOver := false
	db.beforeWait = func(context.Context) {
		if failedOver {
			return
		}
		failedOver = true
		master.Kill()
		if err := replica.Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
			return
		}
		if err := replica.Client(t).Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
			t.Error(err)
			return
		}
		waitFor(t, "the replica to take over", func() bool { return replica.IsMaster(ctx) })
		waitFor(t, "the client to name the replica as the master of the post's slot", func() bool {
			cc.ReloadState(ctx)
			m, err := cc.MasterForKey(ctx, postsKey(ada.ID))
			return err == nil && m.Options().Addr == replica.Addr
		})
	}
	p, createErr := NewPostService(db).CreatePost(ctx, ada.ID, "only the dead master had it")
	if !failedOver {
		t.Fatal("CreatePost did not wait for its replicas")
	}
	if createErr == nil {
		_, err := NewPostService(db).FindPostByID(ctx, p.ID)
		t.Fatalf("CreatePost answered success although its master died before its replica had the post; the post now: %v", err)
	}
	if warble.ErrorCode(createErr) != warble.EINTERNAL {
		t.Fatalf("CreatePost: %v; want an INTERNAL error", createErr)
	}
	t.Logf("CreatePost answered: %v", createErr)
}
