package redisdb

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// The tests in this file need a real Redis Cluster, and check what only a
// cluster can get wrong: where keys and channels live, and what happens
// when slots move. They run on the shared cluster under
// REDISTEST_CLUSTER=1, and on a cluster of their own otherwise.

// testCluster returns a Redis Cluster for t: the shared one under
// REDISTEST_CLUSTER=1 (flushed), else a new 3-master cluster. It skips t
// where there is no redis-server, or where the embedded Redis is asked for.
func testCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	if redistest.OnCluster() {
		return redistest.New(t).Cluster()
	}
	requireClusterable(t)
	return redistest.NewCluster(t, redistest.ClusterOptions{})
}

// requireClusterable skips t where no cluster can be started: no
// redis-server (outside CI), or REDISTEST_EMBEDDED=1.
func requireClusterable(t *testing.T) {
	t.Helper()
	if os.Getenv("REDISTEST_EMBEDDED") == "1" {
		t.Skip("needs redis-server processes for a Redis Cluster, not the embedded Redis")
	}
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") == "" {
		t.Skip("needs redis-server for a Redis Cluster")
	}
}

// newClusterDB returns a DB over a new client of c.
func newClusterDB(t *testing.T, c *redistest.Cluster, opts Options) *DB {
	t.Helper()
	if opts.BcryptCost == 0 {
		opts.BcryptCost = bcrypt.MinCost
	}
	return NewDB(c.Client(t), opts)
}

// TestClusterKeysOfAUserShareANode checks the layout's promise on a real
// cluster: every key and channel of one user is on one node (so that the
// scripts over them run), and different users are spread over the masters.
func TestClusterKeysOfAUserShareANode(t *testing.T) {
	ctx := context.Background()
	c := testCluster(t)
	db := newClusterDB(t, c, Options{})
	nodes := map[string]bool{}
	var first string
	for i := range 12 {
		u := mustSignup(t, db, "user"+string(rune('a'+i)))
		if first == "" {
			first = u.ID
		} else {
			mustFollow(t, db, u.ID, first)
		}
		p := mustCreatePost(t, db, u.ID, "hello")
		seq := postSeqText(p)
		var home *redistest.ClusterNode
		for _, key := range []string{userKey(u.ID), postsKey(u.ID), homeKey(u.ID), followingKey(u.ID),
			postKey(u.ID, seq), homeChannel(u.ID), userChannel(u.ID)} {
			n, err := c.NodeOf(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if home == nil {
				home = n
			} else if n != home {
				t.Errorf("%s is on %s, but %s of the same user on %s", key, n.Addr, userKey(u.ID), home.Addr)
			}
			if key == userKey(u.ID) || key == postKey(u.ID, seq) {
				if exists := home.Client(t).Exists(ctx, key).Val(); exists != 1 {
					t.Errorf("%s is not on the node that serves its slot", key)
				}
			}
		}
		nodes[home.Addr] = true
	}
	if len(nodes) < 2 {
		t.Errorf("12 users all live on %v: the masters do not share the load", nodes)
	}
	globalNode, err := c.NodeOf(ctx, globalKey)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := c.NodeOf(ctx, globalChannel); n != globalNode {
		t.Errorf("the global channel is on %s, the global timeline on %s", n.Addr, globalNode.Addr)
	}
}

// postSeqText returns the seq of a post as its keys spell it.
func postSeqText(p *warble.Post) string {
	_, seq, _ := splitPostID(p.ID)
	return seq
}

// TestClusterTwoWarbles runs two Warbles (two clients, two hubs) on one
// cluster: a post made through one reaches the live subscribers of the
// other, on its home, user and global timelines.
func TestClusterTwoWarbles(t *testing.T) {
	c := testCluster(t)
	one := newClusterDB(t, c, Options{})
	two := newClusterDB(t, c, Options{})
	ada := mustSignup(t, one, "ada")
	bob := mustSignup(t, two, "bob")
	mustFollow(t, two, bob.ID, ada.ID)
	h := newTestHub(t, two)
	home := mustSubscribe(t, h, warble.HomeFeed(bob.ID), nil)
	user := mustSubscribe(t, h, warble.UserFeed(ada.ID), nil)
	global := mustSubscribe(t, h, warble.GlobalFeed(), nil)
	p := mustCreatePost(t, one, ada.ID, "from the other Warble")
	for _, events := range []<-chan *warble.TimelineEvent{home, user, global} {
		wantAdded(t, nextEvent(t, events), p)
	}
}

// TestClusterHubFollowsItsSlots moves the slot of a subscribed user's
// channels to another master, with its keys, as a resharding does: the
// master that lost it drops the shard channel, the hub subscribes to it on
// the master that has it now, its listeners get a RESYNC, and new posts
// reach them again, still on one connection per master.
func TestClusterHubFollowsItsSlots(t *testing.T) {
	ctx := context.Background()
	c := testCluster(t)
	db := newClusterDB(t, c, Options{})
	h := newTestHub(t, db)
	ada := mustSignup(t, db, "ada")
	p := mustCreatePost(t, db, ada.ID, "before")
	events := mustSubscribe(t, h, warble.UserFeed(ada.ID), nil)

	slot := redistest.Slot(userChannel(ada.ID))
	from, err := c.NodeOf(ctx, userChannel(ada.ID))
	if err != nil {
		t.Fatal(err)
	}
	to := c.Masters()[0]
	if to == from {
		to = c.Masters()[1]
	}
	if err := c.MoveSlot(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.MoveSlot(context.Background(), slot, from) }) // for the next test on a shared cluster
	if ev := nextEvent(t, events); ev.Kind != warble.Resync || ev.Cursor != warble.PostCursor(p.Seq) {
		t.Fatalf("event = %s %q, want RESYNC at the newest post", ev.Kind, ev.Cursor)
	}
	q := mustCreatePost(t, db, ada.ID, "after the move")
	wantAdded(t, nextEvent(t, events), q)
	if n := numSub(t, db, userChannel(ada.ID)); n != 1 {
		t.Errorf("the new master counts %d subscribers of the channel, want 1", n)
	}
	for addr, n := range pubsubConns(t, db) {
		if n > 1 {
			t.Errorf("%d pub/sub connections to %s, want at most 1", n, addr)
		}
	}
}

// TestClusterReplicaReads gives a DB a client that reads from replicas
// (ReplicaReads, as REDIS_URL's read_only=true makes one) and checks, by
// the replicas' own command counts, that the global timeline's pages and
// profiles are read there, and that a home timeline is not.
func TestClusterReplicaReads(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of 6 nodes")
	}
	requireClusterable(t)
	ctx := context.Background()
	c := redistest.NewCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1})
	opts := c.Options()
	opts.ReadOnly = true
	replicas := redis.NewClusterClient(opts)
	t.Cleanup(func() { replicas.Close() })
	db := newClusterDB(t, c, Options{ReplicaReads: replicas})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	p := mustCreatePost(t, db, ada.ID, "hello") // waits for the replicas (WaitReplicas)
	// Redis 7.0 calls a replica "loading" until its replication offset is
	// known, which writes make so, and go-redis reads from its master
	// until then: let the client see the replicas of the keys read.
	waitFor(t, "the client to see replicas", func() bool {
		replicas.ReloadState(ctx)
		for _, key := range []string{globalKey, usernameKey("ada"), userKey(ada.ID)} {
			m, err1 := replicas.MasterForKey(ctx, key)
			r, err2 := replicas.SlaveForKey(ctx, key)
			if err1 != nil || err2 != nil || m.Options().Addr == r.Options().Addr {
				return false
			}
		}
		return true
	})

	// How many ZRANGE and HMGET calls the replicas have served.
	replicaCalls := func() int64 {
		var n int64
		for _, node := range c.Nodes {
			if node.IsMaster(ctx) {
				continue
			}
			stats := node.Client(t).Info(ctx, "commandstats").Val()
			for _, line := range strings.Split(stats, "\n") {
				if strings.HasPrefix(line, "cmdstat_zrange:") || strings.HasPrefix(line, "cmdstat_hmget:") {
					calls, _, _ := strings.Cut(strings.TrimPrefix(line[strings.Index(line, ":")+1:], "calls="), ",")
					v, _ := strconv.ParseInt(calls, 10, 64)
					n += v
				}
			}
		}
		return n
	}
	before := replicaCalls()
	if got := readTimeline(t, db, warble.HomeFeed(bob.ID), 10, nil); !slices.Equal(got, []string{p.ID}) {
		t.Fatalf("home = %v", got)
	}
	if n := replicaCalls() - before; n != 0 {
		t.Errorf("a home timeline page made %d reads on replicas, want none", n)
	}
	before = replicaCalls()
	if got := readTimeline(t, db, warble.GlobalFeed(), 10, nil); !slices.Equal(got, []string{p.ID}) {
		t.Fatalf("global = %v, want the post (on the replica once CreatePost answered)", got)
	}
	if u, err := NewUserService(db).FindUserByUsername(ctx, "ada"); err != nil || u.Username != "ada" {
		t.Fatalf("ada's profile = %+v, %v", u, err)
	}
	if n := replicaCalls() - before; n == 0 {
		t.Error("the global timeline and a profile made no reads on replicas")
	}
}

// TestClusterShardedPubSubStaysOnItsMaster fans one post out to 10,000
// followers on a 3-master cluster, with classic PUBLISH and with SPUBLISH,
// and counts the pub/sub messages each master received from the others
// over the cluster bus (CLUSTER INFO): a classic message is broadcast to
// every node, a shard message goes only to its master's replicas (there
// are none here). It logs the counts, which BENCHMARKS.md reports.
func TestClusterShardedPubSubStaysOnItsMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("fans out to 10,000 followers twice")
	}
	const n = 10000
	c := testCluster(t)
	ctx := context.Background()
	received := func() map[string]int64 {
		out := map[string]int64{}
		for _, m := range c.Masters() {
			info := m.Client(t).ClusterInfo(ctx).Val()
			for _, line := range strings.Split(info, "\n") {
				k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
				if k == "cluster_stats_messages_publish_received" || k == "cluster_stats_messages_publishshard_received" {
					x, _ := strconv.ParseInt(v, 10, 64)
					out[m.Addr] += x
				}
			}
		}
		return out
	}
	for _, sharded := range []bool{false, true} {
		db := newClusterDB(t, c, Options{PullThreshold: -1, InactiveAfter: -1})
		db.sharded = sharded // classic PUBLISH, as Warble did on a cluster before
		ada := mustSignup(t, db, fmt.Sprintf("ada%v", sharded))
		manyFollowers(t, db, ada.ID, n)
		before := received()
		mustCreatePost(t, db, ada.ID, "to ten thousand") // fans out inline
		after := received()
		total := int64(0)
		for _, m := range c.Masters() {
			got := after[m.Addr] - before[m.Addr]
			total += got
			t.Logf("sharded=%v: master %s received %d pub/sub messages over the cluster bus", sharded, m.Addr, got)
			switch {
			case sharded && got != 0:
				t.Errorf("with SPUBLISH, master %s received %d messages, want 0", m.Addr, got)
			case !sharded && got < n/3:
				// Each master gets every follower's message but those
				// published on it (about a third).
				t.Errorf("with PUBLISH, master %s received %d messages, want most of %d", m.Addr, got, n)
			}
		}
		t.Logf("sharded=%v: %d messages over the bus in all for one post to %d followers", sharded, total, n)
	}
}

// TestClusterFollowerBucketsSpreadOverMasters checks what follower buckets
// are for: once an account's followers are in buckets, the buckets sit on
// different masters, each holding its share of the followers, and the
// one set is gone from the account's master.
func TestClusterFollowerBucketsSpreadOverMasters(t *testing.T) {
	ctx := context.Background()
	c := testCluster(t)
	db := newClusterDB(t, c, Options{AsyncFanOut: true, PullThreshold: -1, FollowerBucketThreshold: 10, FollowerBuckets: 8})
	ada := mustSignup(t, db, "ada").ID
	fans := make([]string, 40)
	for i := range fans {
		fans[i] = strconv.Itoa(1000 + i)
		mustFollow(t, db, fans[i], ada)
	}
	drainFanOut(t, db)
	stored, n := storedFollowers(t, db, ada)
	if n != 8 || len(stored) != len(fans) {
		t.Fatalf("%d followers in %d buckets, want %d in 8", len(stored), n, len(fans))
	}
	held := map[string]int{} // master -> followers its buckets hold
	for b := range n {
		node, err := c.NodeOf(ctx, followerBucketKey(ada, b))
		if err != nil {
			t.Fatal(err)
		}
		// Read on the node itself: the bucket is there, not elsewhere.
		held[node.Addr] += int(node.Client(t).ZCard(ctx, followerBucketKey(ada, b)).Val())
	}
	if len(held) != len(c.Masters()) {
		t.Errorf("the 8 buckets are on %d masters (%v), want all %d", len(held), held, len(c.Masters()))
	}
	total := 0
	for addr, k := range held {
		if k == 0 {
			t.Errorf("the buckets on %s hold no follower", addr)
		}
		total += k
	}
	if total != len(fans) {
		t.Errorf("the masters' buckets hold %d followers, want %d", total, len(fans))
	}
	home, err := c.NodeOf(ctx, userKey(ada))
	if err != nil {
		t.Fatal(err)
	}
	if n := home.Client(t).Exists(ctx, followersKey(ada)).Val(); n != 0 {
		t.Error("the one followers set is still on the account's master")
	}
	assertMirrors(t, db, ada, fans)
}
