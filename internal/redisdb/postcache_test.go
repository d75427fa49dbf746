package redisdb

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// postReads counts the HMGETs (of posts and users) that a client sends.
func postReads(db *DB) *atomic.Int64 {
	n := new(atomic.Int64)
	db.client.AddHook(&countCommands{n: n, match: func(c redis.Cmder) bool { return c.Name() == "hmget" }})
	return n
}

// waitCacheLive waits until db's hub listens for deletes, from when on
// its post cache is used.
func waitCacheLive(t testing.TB, db *DB) {
	t.Helper()
	waitFor(t, "the post cache to be in use", func() bool { _, ok := db.cache.start(); return ok })
}

// processDB returns a DB over a client of its own of srv, as another
// process would have, with its hub; dial, if set, is the client's dialer.
func processDB(t testing.TB, srv *redistest.Server, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *DB {
	t.Helper()
	db := NewDB(processClient(t, srv, dial), Options{BcryptCost: bcrypt.MinCost})
	newTestHub(t, db)
	waitCacheLive(t, db)
	return db
}

// processClient returns a client of its own of srv, as another process
// would have; dial, if set, is its dialer.
func processClient(t testing.TB, srv *redistest.Server, dial func(ctx context.Context, network, addr string) (net.Conn, error)) redis.UniversalClient {
	t.Helper()
	var client redis.UniversalClient
	if o := srv.ClusterOptions(); o != nil {
		o.Dialer = dial
		cc := redis.NewClusterClient(o)
		cc.AddHook(redistest.NewSlotGuard(t))
		t.Cleanup(func() { cc.Close() })
		client = cc
	} else {
		o := srv.Options()
		if dial != nil {
			o.Dialer = dial
		}
		c := redis.NewClient(o)
		c.AddHook(redistest.NewSlotGuard(t))
		t.Cleanup(func() { c.Close() })
		client = c
	}
	return client
}

// samePosts fails t unless got and want are the same posts with the same
// authors, in the same order.
func samePosts(t testing.TB, got, want []*warble.Post) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d posts, want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.Body != w.Body || !g.CreatedAt.Equal(w.CreatedAt) || g.Seq != w.Seq || g.AuthorID != w.AuthorID {
			t.Fatalf("post %d = %+v, want %+v", i, g, w)
		}
		if g.Author == nil || w.Author == nil || *g.Author != *w.Author {
			t.Fatalf("post %d's author = %+v, want %+v", i, g.Author, w.Author)
		}
	}
}

func pagePosts(tl *warble.Timeline) []*warble.Post {
	var posts []*warble.Post
	for _, e := range tl.Edges {
		posts = append(posts, e.Node)
	}
	return posts
}

// TestPostCacheServesAPage: a page read a second time takes its posts and
// their authors from the cache, without a read of them, and they are the
// same; with the cache off, every page reads them.
func TestPostCacheServesAPage(t *testing.T) {
	for _, tt := range []struct {
		name      string
		size      int
		wantReads bool
	}{
		{name: "On", wantReads: false},
		{name: "Off", size: -1, wantReads: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t, Options{PostCacheSize: tt.size})
			newTestHub(t, db)
			if tt.size >= 0 {
				waitCacheLive(t, db)
			}
			posts := NewPostService(db)
			ada, bob := mustSignup(t, db, "ada"), mustSignup(t, db, "bob")
			for i := range 6 {
				mustCreatePost(t, db, ada.ID, "ada "+string(rune('a'+i)))
				mustCreatePost(t, db, bob.ID, "bob "+string(rune('a'+i)))
			}
			reads := postReads(db)
			page := warble.PageArgs{First: 10}
			first, err := posts.FindTimeline(ctx, warble.GlobalFeed(), page)
			if err != nil {
				t.Fatal(err)
			}
			if reads.Load() == 0 {
				t.Fatal("the first page read no post")
			}
			reads.Store(0)
			second, err := posts.FindTimeline(ctx, warble.GlobalFeed(), page)
			if err != nil {
				t.Fatal(err)
			}
			samePosts(t, pagePosts(second), pagePosts(first))
			if got := reads.Load(); (got > 0) != tt.wantReads {
				t.Errorf("the second page sent %d HMGETs; want reads %v", got, tt.wantReads)
			}
			if second.Edges[0].Node == first.Edges[0].Node || second.Edges[0].Node.Author == first.Edges[0].Node.Author {
				t.Error("two pages share a post or an author: callers may change what they get")
			}

			// node(id:) takes the same path.
			reads.Store(0)
			p, err := posts.FindPostByID(ctx, first.Edges[3].Node.ID)
			if err != nil {
				t.Fatal(err)
			}
			samePosts(t, []*warble.Post{p}, []*warble.Post{first.Edges[3].Node})
			if got := reads.Load(); (got > 0) != tt.wantReads {
				t.Errorf("FindPostByID sent %d HMGETs; want reads %v", got, tt.wantReads)
			}
		})
	}
}

// TestPostCacheWithoutHub: a DB whose deletes nobody listens for (no hub,
// as in a `warble worker`) reads every post from Redis.
func TestPostCacheWithoutHub(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	p := mustCreatePost(t, db, ada.ID, "hello")
	posts := NewPostService(db)
	reads := postReads(db)
	for range 2 {
		if _, err := posts.FindPostByID(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads.Load(); got != 4 {
		t.Errorf("two reads sent %d HMGETs, want 4 (the post and its author, each time)", got)
	}
}

// TestPostCacheDeleteElsewhere: a post deleted through one process is
// gone at once there, and from another process's cache once the delete's
// announce reaches it, for a post in Redis and for one in neither.
func TestPostCacheDeleteElsewhere(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	a, b := processDB(t, srv, nil), processDB(t, srv, nil)
	ada := mustSignup(t, a, "ada")
	p := mustCreatePost(t, a, ada.ID, "soon gone")
	inA, inB := NewPostService(a), NewPostService(b)
	for _, s := range []*PostService{inA, inB} {
		if _, err := s.FindPostByID(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	reads := postReads(b)
	if _, err := inB.FindPostByID(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Fatalf("B read the post again (%d HMGETs): it was not cached, and this test could not fail", n)
	}

	if err := inA.DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := inA.FindPostByID(ctx, p.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Fatalf("A's FindPostByID after its delete: %v, want not found", err)
	}
	waitFor(t, "B to stop serving the deleted post", func() bool {
		_, err := inB.FindPostByID(ctx, p.ID)
		return warble.ErrorCode(err) == warble.ENOTFOUND
	})
}

// holdRead holds the reply of a pipeline that reads key, once armed,
// until released: the read has been answered by Redis, and its caller has
// not seen the answer yet.
type holdRead struct {
	key      string
	armed    atomic.Bool
	answered chan struct{}
	release  chan struct{}
}

func (h *holdRead) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *holdRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "hmget" && len(c.Args()) > 1 && c.Args()[1] == h.key && h.armed.CompareAndSwap(true, false) {
				close(h.answered)
				<-h.release
				break
			}
		}
		return err
	}
}

// TestPostCacheReadAcrossADelete: a read that found a post before its
// delete, and ends after the delete's announce was applied, must not
// put the post into the cache: the next read would serve a deleted post.
func TestPostCacheReadAcrossADelete(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	a, b := processDB(t, srv, nil), processDB(t, srv, nil)
	ada := mustSignup(t, a, "ada")
	p := mustCreatePost(t, a, ada.ID, "read across its delete")
	_, seq, _ := splitPostID(p.ID)
	hold := &holdRead{key: postKey(ada.ID, seq), answered: make(chan struct{}), release: make(chan struct{})}
	b.client.AddHook(hold)
	hold.armed.Store(true)
	inB := NewPostService(b)

	var wg sync.WaitGroup
	var read *warble.Post
	var readErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		read, readErr = inB.FindPostByID(ctx, p.ID)
	}()
	<-hold.answered
	gen := b.cache.gen.Load()
	if err := NewPostService(a).DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B to hear of the delete", func() bool { return b.cache.gen.Load() != gen })
	close(hold.release)
	wg.Wait()
	if readErr != nil || read == nil || read.ID != p.ID {
		t.Fatalf("the read across the delete = %v, %v; want the post, as read before its delete", read, readErr)
	}
	if got, err := inB.FindPostByID(ctx, p.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Fatalf("B's next read = %v, %v; want not found: the read across the delete cached the post", got, err)
	}
}

// gate holds a client's dials while shut.
type gate struct {
	mu   sync.Mutex
	open chan struct{}
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) shut() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) reopen() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// TestPostCacheDeleteDuringAnOutage: a post deleted while another
// process's pub/sub connection is down (its announce is lost there) is
// not served by that process once it has reconnected.
func TestPostCacheDeleteDuringAnOutage(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	g := newGate()
	a, b := processDB(t, srv, nil), processDB(t, srv, g.dial)
	requireRealRedis(t, a)
	ada := mustSignup(t, a, "ada")
	posts := []*warble.Post{mustCreatePost(t, a, ada.ID, "stays"), mustCreatePost(t, a, ada.ID, "goes")}
	inB := NewPostService(b)
	ids := []string{posts[0].ID, posts[1].ID}
	if _, err := inB.FindPostsByIDs(ctx, ids); err != nil {
		t.Fatal(err)
	}
	reads := postReads(b)
	if _, err := inB.FindPostsByIDs(ctx, ids); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Fatalf("B read the posts again (%d HMGETs): they were not cached, and this test could not fail", n)
	}

	// B cannot reconnect until the gate opens; A's hub can.
	g.shut()
	clears := b.cache.gen.Load()
	if err := killPubsubConns(a); err != nil {
		t.Fatal(err)
	}
	if err := NewPostService(a).DeletePost(ctx, ada.ID, posts[1].ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // where a live connection would have heard it
	if b.cache.gen.Load() != clears {
		t.Fatal("B heard of the delete while its connection was down: the outage did not happen")
	}
	g.reopen()
	waitFor(t, "B to stop serving the post deleted during its outage", func() bool {
		found, err := inB.FindPostsByIDs(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		return found[0] != nil && found[1] == nil
	})
}

// TestPostCacheBroadcastOnEveryNode: deletes run on whichever master holds
// their post (on a cluster), and each reaches every process's hub.
func TestPostCacheBroadcastOnEveryNode(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	a, b := processDB(t, srv, nil), processDB(t, srv, nil)
	// Posts of authors in different slots: on a cluster their deletes run
	// on different masters, and each must reach B's hub.
	var authors []*warble.User
	var ps []*warble.Post
	for _, name := range []string{"ada", "bob", "cyd", "dee", "eve", "fay"} {
		u := mustSignup(t, a, name)
		authors = append(authors, u)
		ps = append(ps, mustCreatePost(t, a, u.ID, "by "+name))
	}
	inB := NewPostService(b)
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	if _, err := inB.FindPostsByIDs(ctx, ids); err != nil {
		t.Fatal(err)
	}
	reads := postReads(b)
	if _, err := inB.FindPostsByIDs(ctx, ids); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Fatalf("B read the posts again (%d HMGETs): they were not cached, and this test could not fail", n)
	}
	for i, p := range ps {
		if err := NewPostService(a).DeletePost(ctx, authors[i].ID, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "B to stop serving every deleted post", func() bool {
		found, err := inB.FindPostsByIDs(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(found, func(p *warble.Post) bool { return p != nil })
	})
}

// TestPostCacheDeleteArchived: a post read from the archive is cached too,
// and its delete (of the archive's row) reaches other processes' caches.
func TestPostCacheDeleteArchived(t *testing.T) {
	ctx := context.Background()
	a, store := newArchivedDB(t, Options{})
	newTestHub(t, a)
	// Another process: a DB of its own, with its own cache and hub.
	b := NewDB(a.client, Options{Archive: store, BcryptCost: bcrypt.MinCost})
	newTestHub(t, b)
	waitCacheLive(t, a)
	waitCacheLive(t, b)
	ada := mustSignup(t, a, "ada")
	p := mustCreatePost(t, a, ada.ID, "archived, then deleted")
	archivePosts(t, a, p)
	inA, inB := NewPostService(a), NewPostService(b)
	if _, err := inB.FindPostByID(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	queries := store.queries()
	if got, err := inB.FindPostByID(ctx, p.ID); err != nil || got.Body != p.Body {
		t.Fatalf("FindPostByID = %v, %v; want the archived post", got, err)
	}
	if store.queries() != queries {
		t.Fatal("B asked the archive again: the post was not cached, and this test could not fail")
	}
	if err := inA.DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := inA.FindPostByID(ctx, p.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Fatalf("A's FindPostByID after its delete: %v, want not found", err)
	}
	waitFor(t, "B to stop serving the deleted archived post", func() bool {
		_, err := inB.FindPostByID(ctx, p.ID)
		return warble.ErrorCode(err) == warble.ENOTFOUND
	})
}

// TestPostCacheNeedsItsBeats: a process whose pub/sub connection goes
// silent without a reset (a network partition: what it writes is lost, and
// nothing comes back) stops using its cache within a few beats, so that a
// post deleted meanwhile is not served from it for long.
func TestPostCacheNeedsItsBeats(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	a := processDB(t, srv, nil)
	requireRealRedis(t, a)
	hole := new(blackhole)
	b := NewDB(processClient(t, srv, hole.dial), Options{BcryptCost: bcrypt.MinCost})
	b.cache.beatEvery = 50 * time.Millisecond
	newTestHub(t, b)
	waitCacheLive(t, b)
	ada := mustSignup(t, a, "ada")
	p := mustCreatePost(t, a, ada.ID, "goes")
	inB := NewPostService(b)
	if _, err := inB.FindPostByID(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	reads := postReads(b)
	if _, err := inB.FindPostByID(ctx, p.ID); err != nil || reads.Load() != 0 {
		t.Fatalf("B's second read = %v with %d HMGETs: the post was not cached, and this test could not fail", err, reads.Load())
	}

	hole.swallow(true)
	t.Cleanup(func() { hole.swallow(false) })
	gen := b.cache.gen.Load()
	if err := NewPostService(a).DeletePost(ctx, ada.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	// Well within postCacheMaxAge, the other bound.
	deadline := time.Now().Add(20 * b.cache.beatEvery * cacheHeardFor)
	for {
		got, err := inB.FindPostByID(ctx, p.ID)
		if warble.ErrorCode(err) == warble.ENOTFOUND {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("B still serves %v from its cache %s after its delete, with its pub/sub connection silent", got, 20*b.cache.beatEvery*cacheHeardFor)
		}
		time.Sleep(b.cache.beatEvery / 5)
	}
	if b.cache.gen.Load() != gen {
		t.Fatal("B heard of the delete: its connection was not silent, and this test proves nothing")
	}
}

// blackhole wraps the pub/sub connections it dials (those that send a
// SUBSCRIBE) so that, while swallowing, what they write is dropped and
// nothing is read: a connection cut without a reset.
type blackhole struct{ on atomic.Bool }

func (h *blackhole) swallow(on bool) { h.on.Store(on) }

func (h *blackhole) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &holeConn{Conn: c, hole: h}, nil
}

type holeConn struct {
	net.Conn
	hole   *blackhole
	pubsub atomic.Bool
}

func (c *holeConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.pubsub.Store(true)
	}
	if c.pubsub.Load() && c.hole.on.Load() {
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// Read drops what arrives while swallowing, a read already waiting
// included; the connection's stream is broken after that, as after a
// partition, and go-redis reconnects once it reads on.
func (c *holeConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.pubsub.Load() || !c.hole.on.Load() {
			return n, err
		}
	}
}

// TestPostCacheDataLost: Redis emptied under running processes (FLUSHALL
// closes no connection, so no subscription is confirmed again) hands out
// the same user and post ids again, and a process that cached the old ones
// must serve the new post and author once its hub has had time to notice
// (its id counters went back: more posts were made before than after), not
// the old ones for up to postCacheMaxAge.
func TestPostCacheDataLost(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	a, b := processDB(t, srv, nil), processDB(t, srv, nil)
	ada := mustSignup(t, a, "ada")
	old := mustCreatePost(t, a, ada.ID, "from before the flush")
	for range 2 {
		mustCreatePost(t, a, ada.ID, "and more")
	}
	inB := NewPostService(b)
	if _, err := inB.FindPostByID(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	reads := postReads(b)
	if _, err := inB.FindPostByID(ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Fatalf("B read the post again (%d HMGETs): it was not cached, and this test could not fail", n)
	}
	// B's hub has read the counters since: ids handed out again below
	// them are what it can tell.
	last := mustSeq(t, old.ID) + 2
	waitFor(t, "B's hub to read the id counters", func() bool { return b.cache.ids[1].Load() >= last })

	if c := srv.Cluster(); c != nil {
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	} else if err := a.client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	zed := mustSignup(t, a, "zed")
	p := mustCreatePost(t, a, zed.ID, "after the flush")
	if p.ID != old.ID {
		t.Fatalf("the new post's id is %s, not the old one's %s: this test could not fail", p.ID, old.ID)
	}
	waitFor(t, "B to serve the new post with its author", func() bool {
		got, err := inB.FindPostByID(ctx, p.ID)
		return err == nil && got.Body == p.Body && got.Author != nil && got.Author.Username == "zed"
	})
}

// TestPostCacheNewConnection: on a cluster, a subscription to a timeline
// on a master that the hub had no connection to opens one, subscribed to
// postsGoneChannel too; while another connection was hearing every delete
// (they are broadcast to every node) nothing was missed, and the cache
// keeps what it holds.
func TestPostCacheNewConnection(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	if srv.Cluster() == nil {
		t.Skip("one Redis: the hub has one connection")
	}
	a := processDB(t, srv, nil)
	b := NewDB(a.client, Options{BcryptCost: bcrypt.MinCost})
	h := newTestHub(t, b)
	waitCacheLive(t, b)
	ada := mustSignup(t, a, "ada")
	p := mustCreatePost(t, a, ada.ID, "cached")
	inB := NewPostService(b)
	if _, err := inB.FindPostByID(ctx, p.ID); err != nil {
		t.Fatal(err)
	}

	// A user whose channels are on a master the hub has no connection to.
	cc := b.client.(*redis.ClusterClient)
	var other *warble.User
	for i := 0; other == nil; i++ {
		if i == 50 {
			t.Fatal("no user on a master the hub has no connection to")
		}
		u := mustSignup(t, a, "user"+strconv.Itoa(i))
		m, err := cc.MasterForKey(ctx, userChannel(u.ID))
		if err != nil {
			t.Fatal(err)
		}
		h.mu.Lock()
		_, open := h.conns[m.Options().Addr]
		h.mu.Unlock()
		if !open {
			other = u
		}
	}
	clears := b.cache.gen.Load()
	// It returns once its channel is confirmed, after postsGoneChannel's
	// on the new connection (Redis answers in order).
	mustSubscribe(t, h, warble.UserFeed(other.ID), nil)
	if b.cache.live.Load() < 2 {
		t.Fatalf("%d connections subscribed to %s, want 2: no connection was opened, and this test could not fail", b.cache.live.Load(), postsGoneChannel)
	}
	reads := postReads(b)
	if _, err := inB.FindPostByID(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("the post was read again (%d HMGETs; %d drops or clears): a new connection emptied the cache", n, b.cache.gen.Load()-clears)
	}
}
