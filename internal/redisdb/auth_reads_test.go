package redisdb

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// heldReads makes the first batch of auth's session reads wait until
// release is called, so that a test can queue requests behind it, and
// records the size of every batch.
type heldReads struct {
	auth    *AuthService
	release func()
	mu      sync.Mutex
	sizes   []int
}

func holdReads(auth *AuthService) *heldReads {
	h := &heldReads{auth: auth}
	gate := make(chan struct{})
	h.release = sync.OnceFunc(func() { close(gate) })
	first := true
	auth.reads.batchN = func(n int) {
		h.mu.Lock()
		h.sizes = append(h.sizes, n)
		wait := first
		first = false
		h.mu.Unlock()
		if wait {
			<-gate
		}
	}
	return h
}

// recordReads records the size of every batch of auth's session reads,
// holding none.
func recordReads(auth *AuthService) *heldReads {
	h := &heldReads{auth: auth, release: func() {}}
	auth.reads.batchN = func(n int) {
		h.mu.Lock()
		h.sizes = append(h.sizes, n)
		h.mu.Unlock()
	}
	return h
}

// waitQueued waits until the held read has reached Redis's door and n
// reads are queued behind it.
func (h *heldReads) waitQueued(tb testing.TB, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		queued := h.auth.reads.queued()
		if len(h.batches()) > 0 && queued == n {
			return
		} else if time.Now().After(deadline) {
			tb.Fatalf("%d batches sent and %d reads queued, want 1 and %d", len(h.batches()), queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// queued returns how many reads wait in s's queues.
func (s *sessionReads) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.one.queue)
	for _, q := range s.queues {
		n += len(q.queue)
	}
	return n
}

func (h *heldReads) batches() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sizes)
}

type authResult struct {
	user *warble.User
	err  error
}

// usersOfOneQueue signs n users up, with a session each, whose session
// reads share a queue: on a cluster, users whose keys share one master.
func usersOfOneQueue(tb testing.TB, auth *AuthService, n int) ([]string, []*warble.User) {
	tb.Helper()
	var tokens []string
	var users []*warble.User
	for i := 0; len(users) < n; i++ {
		p := mustSignupSession(tb, auth, fmt.Sprintf("user%d", i))
		if len(users) > 0 && masterOf(tb, auth, users[0].ID) != masterOf(tb, auth, p.User.ID) {
			continue
		}
		tokens, users = append(tokens, p.Token), append(users, p.User)
	}
	return tokens, users
}

// TestAuthenticateSharesRoundTrips checks that requests which arrive while
// a session read is in flight go to Redis together, in one round trip, and
// that each gets its own answer: its own user, or UNAUTHENTICATED for a
// token that is wrong or was revoked, even one revoked while it waited.
func TestAuthenticateSharesRoundTrips(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	tokens, users := usersOfOneQueue(t, auth, 6)
	// The last user's session is revoked while its request waits; a token
	// naming the first user with a wrong secret never was a session.
	_, revoked, err := auth.Authenticate(ctx, tokens[5])
	if err != nil {
		t.Fatal(err)
	}
	tokens = append(tokens, users[0].ID+"."+strings.Repeat("A", secretLen))

	held := holdReads(auth)
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	results := make([]chan authResult, len(tokens))
	for i, token := range tokens {
		results[i] = make(chan authResult, 1)
		go func() {
			u, _, err := auth.Authenticate(ctx, token)
			results[i] <- authResult{u, err}
		}()
		held.waitQueued(t, i) // the first is the held read, the others queue behind it
	}
	if err := auth.Logout(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	before := counter.N()
	held.release()
	for i, ch := range results {
		r := <-ch
		switch {
		case i == 5 || i == 6:
			if warble.ErrorCode(r.err) != warble.EUNAUTHENTICATED {
				t.Errorf("token %d (revoked or wrong): user %v, err %v; want EUNAUTHENTICATED", i, r.user, r.err)
			}
		case r.err != nil:
			t.Errorf("token %d: %v", i, r.err)
		case *r.user != *users[i]:
			t.Errorf("token %d: user %+v, want %+v", i, r.user, users[i])
		}
	}
	if got, want := held.batches(), []int{1, len(tokens) - 1}; !slices.Equal(got, want) {
		t.Errorf("batches of %v reads, want %v", got, want)
	}
	// The held read's pipeline, the batch's, and nothing else: the
	// sessions are fresh, so none of them moved its expiry.
	if n := counter.N() - before; n != 2 {
		t.Errorf("%d round trips after the release, want 2", n)
	}

	// With nothing in flight, a read goes out alone again.
	if u, _, err := auth.Authenticate(ctx, tokens[1]); err != nil || *u != *users[1] {
		t.Errorf("Authenticate after the batch = %+v, %v; want %+v", u, err, users[1])
	}
	if got := held.batches(); got[len(got)-1] != 1 {
		t.Errorf("batches %v: the last read did not go out alone", got)
	}
}

// TestAuthenticateYieldsBeforeSending checks that a request which finds
// no read in flight yields once before it sends its own, and that the
// reads queued meanwhile (here, by requests the test starts from its
// yield) go out in its batch, each request getting its own user; a read
// that queues behind one in flight does not yield.
func TestAuthenticateYieldsBeforeSending(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	tokens, users := usersOfOneQueue(t, auth, 6)
	check := func(i int, u *warble.User, err error) {
		t.Helper()
		if err != nil || *u != *users[i] {
			t.Errorf("token %d: user %+v, err %v; want %+v", i, u, err, users[i])
		}
	}
	recorded := recordReads(auth)

	// Alone: it yields, finds no company, and goes.
	var yields atomic.Int32
	auth.reads.yield = func() { yields.Add(1) }
	u, _, err := auth.Authenticate(ctx, tokens[0])
	check(0, u, err)
	if got, want := recorded.batches(), []int{1}; yields.Load() != 1 || !slices.Equal(got, want) {
		t.Errorf("alone: %d yields, batches of %v reads; want 1, %v", yields.Load(), got, want)
	}

	// The others' requests, started from the first one's yield, which
	// returns once they have queued: they go out with it.
	var others sync.WaitGroup
	auth.reads.yield = func() {
		if yields.Add(1) != 2 {
			return
		}
		for i := 1; i < len(tokens); i++ {
			others.Go(func() {
				u, _, err := auth.Authenticate(ctx, tokens[i])
				check(i, u, err)
			})
		}
		recorded.waitQueued(t, len(tokens)-1)
	}
	u, _, err = auth.Authenticate(ctx, tokens[0])
	check(0, u, err)
	others.Wait()
	if got, want := recorded.batches(), []int{1, len(tokens)}; yields.Load() != 2 || !slices.Equal(got, want) {
		t.Errorf("with company: %d yields in all, batches of %v reads; want 2, %v", yields.Load(), got, want)
	}

	// With nothing in flight, a read goes alone again.
	u, _, err = auth.Authenticate(ctx, tokens[1])
	check(1, u, err)
	if got, want := recorded.batches(), []int{1, len(tokens), 1}; yields.Load() != 3 || !slices.Equal(got, want) {
		t.Errorf("alone again: %d yields in all, batches of %v reads; want 3, %v", yields.Load(), got, want)
	}
}

// TestAuthenticateQueuedGivesUp checks that a request that stops waiting
// for its batch (its client went away) gets its context's error, and that
// the requests queued with it still get their answers, and later ones too.
func TestAuthenticateQueuedGivesUp(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p := mustSignupSession(t, auth, "ada")
	held := holdReads(auth)
	results := make(chan authResult, 2)
	auth1 := func(ctx context.Context) {
		u, _, err := auth.Authenticate(ctx, p.Token)
		results <- authResult{u, err}
	}
	go auth1(ctx) // the held read
	held.waitQueued(t, 0)
	leaving, leave := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, _, err := auth.Authenticate(leaving, p.Token)
		gaveUp <- err
	}()
	held.waitQueued(t, 1)
	go auth1(ctx)
	held.waitQueued(t, 2)
	leave()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Errorf("Authenticate whose context ended: err = %v, want context.Canceled", err)
	}
	held.release()
	for range 2 {
		if r := <-results; r.err != nil || *r.user != *p.User {
			t.Errorf("Authenticate = %+v, %v; want %+v", r.user, r.err, p.User)
		}
	}
	if u, _, err := auth.Authenticate(ctx, p.Token); err != nil || *u != *p.User {
		t.Errorf("Authenticate after the batch = %+v, %v; want %+v", u, err, p.User)
	}
}

// masterOf returns the address of the master that serves userID's keys,
// or "" on a single Redis.
func masterOf(tb testing.TB, auth *AuthService, userID string) string {
	tb.Helper()
	addr, ok := auth.reads.masterOf(context.Background(), userKey(userID))
	if !ok {
		tb.Fatalf("no master known for user %s", userID)
	}
	return addr
}

// TestAuthenticateQueuesPerMaster checks that on a Redis Cluster a read
// held on its way to one master (as if it did not answer) holds up no
// request of a user on another master: each master has its own queue.
func TestAuthenticateQueuesPerMaster(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	if _, ok := db.client.(*redis.ClusterClient); !ok {
		t.Skip("one Redis has one queue; run with REDISTEST_CLUSTER=1")
	}
	auth := NewAuthService(db)
	var first *warble.AuthPayload
	for i := 0; ; i++ {
		p := mustSignupSession(t, auth, fmt.Sprintf("user%d", i))
		if first == nil {
			first = p
			continue
		}
		if masterOf(t, auth, p.User.ID) == masterOf(t, auth, first.User.ID) {
			continue
		}
		held := holdReads(auth)
		done := make(chan error, 1)
		go func() {
			_, _, err := auth.Authenticate(ctx, first.Token)
			done <- err
		}()
		held.waitQueued(t, 0)
		// Bounded, so that a read queued behind the held one fails the
		// test rather than hanging it.
		bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		u, _, err := auth.Authenticate(bounded, p.Token)
		if err != nil || *u != *p.User {
			t.Errorf("Authenticate on another master while one read is held = %+v, %v; want %+v", u, err, p.User)
		}
		held.release()
		if err := <-done; err != nil {
			t.Error(err)
		}
		return
	}
}

// panicOnce is a hook whose first pipeline after arming panics, as a bug
// in the client or a hook would: net/http and gqlgen recover a request's
// panic and the server goes on.
type panicOnce struct{ armed atomic.Bool }

func (p *panicOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (p *panicOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (p *panicOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.armed.CompareAndSwap(true, false) {
			panic("pipeline panicked")
		}
		return next(ctx, cmds)
	}
}

// TestAuthenticateAfterPanic checks that a session read that panics on its
// way (its request's panic is recovered, as the HTTP server does) does not
// leave its Redis's queue marked busy: the requests after it are answered
// rather than queued behind a read that never comes back.
func TestAuthenticateAfterPanic(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p := mustSignupSession(t, auth, "ada")
	hook := &panicOnce{}
	db.client.AddHook(hook)
	hook.armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the read did not panic")
			}
		}()
		auth.Authenticate(ctx, p.Token)
	}()
	// Bounded, so that a read queued behind the lost one fails the test
	// rather than hanging it.
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if u, _, err := auth.Authenticate(bounded, p.Token); err != nil || *u != *p.User {
		t.Errorf("Authenticate after a read panicked = %+v, %v; want %+v", u, err, p.User)
	}
}

// TestAuthenticateAfterBatchPanics checks that a batch of queued session
// reads that panics on its way, in the goroutine that sends the queued
// reads, where no request's recover catches it, does not take the process
// down: that batch's requests fail with an internal error, and the queue
// serves the requests after it.
func TestAuthenticateAfterBatchPanics(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p := mustSignupSession(t, auth, "ada")
	hook := &panicOnce{}
	db.client.AddHook(hook)
	held := holdReads(auth)
	// The held read's pipeline goes through; the next one, the queued
	// reads' batch, panics.
	hold := auth.reads.batchN
	auth.reads.batchN = func(n int) {
		hold(n)
		if len(held.batches()) == 2 {
			hook.armed.Store(true)
		}
	}
	results := make(chan authResult, 3)
	for i := range 3 {
		go func() {
			u, _, err := auth.Authenticate(ctx, p.Token)
			results <- authResult{u, err}
		}()
		held.waitQueued(t, i)
	}
	held.release()
	var failed int
	for range 3 {
		r := <-results
		switch {
		case r.err == nil && *r.user == *p.User:
		case r.err != nil && warble.ErrorCode(r.err) == warble.EINTERNAL:
			failed++
		default:
			t.Errorf("Authenticate = %+v, %v; want %+v, or an internal error for the batch that panicked", r.user, r.err, p.User)
		}
	}
	if failed != 2 {
		t.Errorf("%d requests failed, want the 2 of the batch that panicked", failed)
	}
	// Bounded, so that a read queued behind a batch that never ended
	// fails the test rather than hanging it.
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if u, _, err := auth.Authenticate(bounded, p.Token); err != nil || *u != *p.User {
		t.Errorf("Authenticate after a batch panicked = %+v, %v; want %+v", u, err, p.User)
	}
	if got, want := held.batches(), []int{1, 2, 1}; !slices.Equal(got, want) {
		t.Errorf("batches of %v reads, want %v: the last read did not go out alone", got, want)
	}
}

// TestAuthenticateForgetsGoneMasters fails over the master of a user's
// keys, as an operator does with CLUSTER FAILOVER, and checks that the
// session reads keep no queue of the address that no longer serves them:
// on a cluster whose masters change, queues of gone addresses would pile
// up for as long as the process runs.
func TestAuthenticateForgetsGoneMasters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of 6 nodes and fails one over")
	}
	requireClusterable(t)
	ctx := context.Background()
	c := redistest.NewCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	db := newClusterDB(t, c, Options{})
	auth := NewAuthService(db)
	p := mustSignupSession(t, auth, "ada")
	if _, _, err := auth.Authenticate(ctx, p.Token); err != nil {
		t.Fatal(err)
	}
	gone := masterOf(t, auth, p.User.ID)
	master, err := c.NodeOf(ctx, userKey(p.User.ID))
	if err != nil {
		t.Fatal(err)
	}
	replica, err := c.ReplicaOf(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.Client(t).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	// Signed-in requests go on through the failover; the client finds the
	// new master on the way.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, _, err := auth.Authenticate(ctx, p.Token)
		if err == nil && masterOf(t, auth, p.User.ID) != gone {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the user's keys are still served by %s (last error %v)", gone, err)
		}
	}
	if _, _, err := auth.Authenticate(ctx, p.Token); err != nil {
		t.Fatal(err)
	}
	auth.reads.mu.Lock()
	addrs := slices.Sorted(maps.Keys(auth.reads.queues))
	auth.reads.mu.Unlock()
	if want := []string{masterOf(t, auth, p.User.ID)}; !slices.Equal(addrs, want) {
		t.Errorf("queues of %v after %s failed over, want %v", addrs, gone, want)
	}
}
