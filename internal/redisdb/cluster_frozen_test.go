package redisdb

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// The tests in this file freeze one master of a cluster of their own
// (SIGSTOP: it accepts connections and answers nothing, as a host that
// stops answering does). The other masters take it for failed only after
// a minute, so the cluster stays up for the slots they serve, and what
// Warble does with those must not wait on the frozen one. Every command
// to the frozen master waits out go-redis's read timeout (3 s) before it
// fails.

// frozenStartBound is the longest something that needs only healthy
// masters may take while another is frozen: under one read timeout of
// the frozen master. Like eventWait it is a net against waiting on the
// frozen master, not a measure of speed: it takes milliseconds.
const frozenStartBound = 2 * time.Second

// frozenCluster returns a new 3-master cluster for t, and a DB over it.
func frozenCluster(t *testing.T, opts Options) (*redistest.Cluster, *DB) {
	t.Helper()
	requireClusterable(t)
	c := redistest.NewCluster(t, redistest.ClusterOptions{NodeTimeout: time.Minute})
	return c, newClusterDB(t, c, opts)
}

// freeze stops node until t ends. Call it after whatever t's cleanup
// should find thawed (a hub: closing it waits on its connections), so
// that the thaw comes first.
func freeze(t *testing.T, node *redistest.ClusterNode) {
	t.Helper()
	if err := node.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Signal(syscall.SIGCONT) })
}

// userFeedOn returns the user feed of a user id whose channel is served by
// a master for which want holds, skipping the ids in used.
func userFeedOn(t *testing.T, c *redistest.Cluster, used map[string]bool, want func(*redistest.ClusterNode) bool) warble.Feed {
	t.Helper()
	for i := 1; i < 1000; i++ {
		id := strconv.Itoa(i)
		if used[id] {
			continue
		}
		node, err := c.NodeOf(t.Context(), userChannel(id))
		if err != nil {
			t.Fatal(err)
		}
		if want(node) {
			used[id] = true
			return warble.UserFeed(id)
		}
	}
	t.Fatal("no user id on the wanted masters")
	return warble.Feed{}
}

// startWithin subscribes to feed, failing t unless the subscription has
// started within frozenStartBound. It ends the subscription.
func startWithin(t *testing.T, h *Hub, feed warble.Feed) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), frozenStartBound)
	defer cancel()
	start := time.Now()
	if _, err := h.SubscribeTimeline(ctx, feed, nil); err != nil {
		t.Fatalf("SubscribeTimeline(%s) on a healthy master: %v after %v", feed, err, time.Since(start))
	}
	return time.Since(start)
}

// TestHubSubscribesOnHealthyMastersWhileOneIsFrozen: a subscription to a
// channel of a frozen master has the hub dial that master, and each of its
// attempts waits out the read timeout; the subscriptions to channels of
// the other masters start meanwhile, without waiting behind them: the hub
// holds its lock over no round trip.
func TestHubSubscribesOnHealthyMastersWhileOneIsFrozen(t *testing.T) {
	c, db := frozenCluster(t, Options{})
	h := newTestHub(t, db)
	watched, cancelWatch := h.WatchSession(t.Context(), "nobody")
	defer cancelWatch()
	if watched.Err() != nil {
		t.Fatal("the hub's channels did not start")
	}
	// A master with none of the hub's own channels, to which the hub has
	// no connection yet.
	hubNodes := map[*redistest.ClusterNode]bool{}
	for _, channel := range []string{revokedChannel, pullChannel} {
		node, err := c.NodeOf(t.Context(), channel)
		if err != nil {
			t.Fatal(err)
		}
		hubNodes[node] = true
	}
	var frozen *redistest.ClusterNode
	for _, m := range c.Masters() {
		if !hubNodes[m] {
			frozen = m
		}
	}
	used := map[string]bool{}
	onFrozen := userFeedOn(t, c, used, func(n *redistest.ClusterNode) bool { return n == frozen })
	healthy := func(n *redistest.ClusterNode) bool { return n != frozen }
	t.Logf("healthy: a subscription started in %v", startWithin(t, h, userFeedOn(t, c, used, healthy)))
	// Found before the freeze: the test's own lookups wait on a frozen
	// master.
	feeds := make([]warble.Feed, 20)
	for i := range feeds {
		feeds[i] = userFeedOn(t, c, used, healthy)
	}

	freeze(t, frozen)
	// A subscription on the frozen master, which waits (or fails) while
	// the hub tries to reach it, again and again.
	frozenCtx, cancelFrozen := context.WithCancel(context.Background())
	t.Cleanup(cancelFrozen)
	go h.SubscribeTimeline(frozenCtx, onFrozen, nil)
	// Over several of the hub's attempts on the frozen master (the slot
	// watch sends again what waited 2 s), subscriptions on the others.
	for _, feed := range feeds {
		time.Sleep(300 * time.Millisecond)
		t.Logf("frozen: a subscription started in %v", startWithin(t, h, feed))
	}
}

// TestHubStartsWhileAMasterIsFrozen: a hub that starts while the master of
// the revocations channel is frozen does not wait for it: subscriptions to
// channels of the other masters start, and the revocations are heard once
// the master is back (until then WatchSession waits).
func TestHubStartsWhileAMasterIsFrozen(t *testing.T) {
	c, db := frozenCluster(t, Options{})
	frozen, err := c.NodeOf(t.Context(), revokedChannel)
	if err != nil {
		t.Fatal(err)
	}
	feed := userFeedOn(t, c, map[string]bool{}, func(n *redistest.ClusterNode) bool { return n != frozen })
	// The cluster client's first load of the slot map asks the nodes one
	// after another, and asking the frozen one first would wait out its
	// read timeout: a server loads it before it starts.
	if err := db.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	freeze(t, frozen)
	made := make(chan *Hub, 1)
	start := time.Now()
	go func() { made <- NewHub(db) }()
	var h *Hub
	select {
	case h = <-made:
		t.Logf("NewHub returned in %v", time.Since(start))
		t.Cleanup(func() { h.Close() })
	case <-time.After(frozenStartBound):
		t.Cleanup(func() { (<-made).Close() })
		t.Fatalf("NewHub has not returned after %v with a master frozen", frozenStartBound)
	}
	t.Logf("a subscription on a healthy master started in %v", startWithin(t, h, feed))

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if watched, _ := h.WatchSession(ctx, "nobody"); watched.Err() == nil {
		t.Fatal("WatchSession returned while the revocations' master is frozen")
	}
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	ctx, cancel = context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if watched, _ := h.WatchSession(ctx, "nobody"); watched.Err() != nil {
		t.Fatal("the hub did not hear the revocations once their master was back")
	}
	t.Logf("the revocations were heard %v after the master was back", time.Since(thawed))
}

// TestAuthenticateWhileTheSeenIndexIsFrozen: a signed-in request records
// the user's visit (DB.Seen) in the user's slot and in a seen index, which
// may be on another master. With that master frozen, Authenticate answers
// without waiting for it, and the visit is recorded in full once the
// master is back.
func TestAuthenticateWhileTheSeenIndexIsFrozen(t *testing.T) {
	c, db := frozenCluster(t, Options{})
	ctx := t.Context()
	var token, userID string
	var frozen *redistest.ClusterNode
	for i := 0; frozen == nil; i++ {
		p, err := NewAuthService(db).Signup(ctx, warble.SignupInput{Username: "away" + strconv.Itoa(i), Password: "password123"})
		if err != nil {
			t.Fatal(err)
		}
		home, err := c.NodeOf(ctx, userKey(p.User.ID))
		if err != nil {
			t.Fatal(err)
		}
		index, err := c.NodeOf(ctx, seenIndexKey(db.fanOutShard(p.User.ID)))
		if err != nil {
			t.Fatal(err)
		}
		if index != home {
			token, userID, frozen = p.Token, p.User.ID, index
		}
	}
	recorded := func() float64 {
		return db.client.ZScore(ctx, seenIndexKey(db.fanOutShard(userID)), userID).Val()
	}
	before := recorded()
	// Another process, which has not recorded the user's visit lately,
	// with the slot map loaded (as a server that has served requests).
	other := newClusterDB(t, c, Options{})
	if err := other.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // a visit recorded later than the signup's, in ms

	freeze(t, frozen)
	type result struct {
		u   *warble.User
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		u, _, err := NewAuthService(other).Authenticate(ctx, token)
		done <- result{u, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.u.ID != userID {
			t.Fatalf("Authenticate with the seen index frozen = %v, %v; want user %s", r.u, r.err, userID)
		}
		t.Logf("Authenticate answered in %v with the seen index's master frozen", time.Since(start))
	case <-time.After(frozenStartBound):
		t.Fatalf("Authenticate has not answered after %v with the seen index's master frozen", frozenStartBound)
	}

	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the visit to be recorded in the seen index", func() bool { return recorded() > before })
}
