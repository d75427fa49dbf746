package app

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// TestRoundTripsDoNotGrowWithThePage checks that a home timeline page with
// authors and a profile with followers cost the same number of Redis round
// trips for 5 items as for 50: no field of an item makes a round trip of
// its own. Follow states, the fields most prone to it, are asked for.
//
// Loaders batch what concurrent fields ask for within a short window; the
// window here is wide, so that a loaded machine cannot split a batch and
// make the count depend on scheduling rather than on the code.
func TestRoundTripsDoNotGrowWithThePage(t *testing.T) {
	// No fan-out workers: their polling would count too, and the posts
	// reach the viewer's home by the follows' backfill.
	s := newTestServer(t, func(c *Config) { c.LoaderWait = 500 * time.Millisecond; c.FanoutWorkers = 0 })
	viewer := s.signup(t, "viewer")
	target := s.signup(t, "target")
	for i := range 60 {
		u := s.signup(t, "author")
		s.post(t, u, fmt.Sprintf("post %d", i))
		s.follow(t, viewer, u)
		s.follow(t, u, target)
		if i%2 == 0 {
			s.follow(t, u, viewer)
		}
	}
	client := s.app.db.Client()
	counter := &redistest.RoundTrips{}
	client.AddHook(counter)

	const home = `query($n: Int) { homeTimeline(first: $n) { edges { cursor node { id body createdAt
		author { username displayName followersCount postsCount viewerIsFollowing followsViewer } } } pageInfo { endCursor } } }`
	const profile = `query($u: String!, $n: Int) { user(username: $u) { username followersCount
		followers(first: $n) { totalCount edges { followedAt node { username viewerIsFollowing followsViewer } } } } }`
	cost := func(query string, vars map[string]any) int64 {
		s.mustQuery(t, viewer.Token, query, vars, new(any)) // loads the scripts it uses
		before := counter.N()
		s.mustQuery(t, viewer.Token, query, vars, new(any))
		return counter.N() - before
	}
	for _, q := range []struct {
		name  string
		query string
		vars  func(n int) map[string]any
	}{
		{"home timeline", home, func(n int) map[string]any { return map[string]any{"n": n} }},
		{"profile with followers", profile, func(n int) map[string]any { return map[string]any{"u": target.Username, "n": n} }},
	} {
		small, large := cost(q.query, q.vars(5)), cost(q.query, q.vars(50))
		t.Logf("%s: %d round trips for 5 items, %d for 50", q.name, small, large)
		if small != large {
			t.Errorf("%s: %d round trips for 5 items but %d for 50; want the same", q.name, small, large)
		}
	}
}

// TestSignedInRequestRoundTrips checks what a signed-in request costs in
// Redis round trips: one for the session and its user, and one more, for
// all three, only when the query asks for counts.
func TestSignedInRequestRoundTrips(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.LoaderWait = 500 * time.Millisecond; c.FanoutWorkers = 0 })
	viewer := s.signup(t, "viewer")
	other := s.signup(t, "other")
	s.follow(t, viewer, other)
	s.follow(t, other, viewer)
	s.post(t, viewer, "one")
	s.post(t, viewer, "two")
	client := s.app.db.Client()
	counter := &redistest.RoundTrips{}
	client.AddHook(counter)

	for _, q := range []struct {
		query string
		want  int64
	}{
		{`{ viewer { id username displayName createdAt } }`, 1},
		{`{ viewer { id username followersCount followingCount postsCount } }`, 2},
	} {
		s.mustQuery(t, viewer.Token, q.query, nil, new(any)) // loads the scripts it uses
		before := counter.N()
		var out struct {
			Viewer struct {
				ID                                         string
				FollowersCount, FollowingCount, PostsCount int
			}
		}
		s.mustQuery(t, viewer.Token, q.query, nil, &out)
		if n := counter.N() - before; n != q.want {
			t.Errorf("%s: %d round trips, want %d", q.query, n, q.want)
		}
		if out.Viewer.ID != viewer.ID {
			t.Errorf("%s: viewer %q, want %q", q.query, out.Viewer.ID, viewer.ID)
		}
		if q.want == 2 && (out.Viewer.FollowersCount != 1 || out.Viewer.FollowingCount != 1 || out.Viewer.PostsCount != 2) {
			t.Errorf("%s: counts %+v, want 1 follower, 1 followed, 2 posts", q.query, out.Viewer)
		}
	}
}

// TestCreatePostRoundTrips: on one Redis a signed-in createPost costs two
// round trips, the session with the post's seq, then the step that stores
// the post with its job; one when its body is refused, the session alone:
// no seq is taken ahead for it, nor any after. (A Redis Cluster stores a
// post by a chain of round trips, storeChained.)
func TestCreatePostRoundTrips(t *testing.T) {
	if redistest.OnCluster() {
		t.Skip("a post's round trips on one Redis")
	}
	s := newTestServer(t, func(c *Config) { c.FanoutWorkers = 0 })
	author := s.signup(t, "author")
	s.post(t, author, "loads the scripts")
	client := s.app.db.Client()
	counter := &redistest.RoundTrips{}
	client.AddHook(counter)
	const mutation = `mutation($b: String!) { createPost(input: {body: $b}) { post { id body } } }`
	before := counter.N()
	var out struct {
		CreatePost struct{ Post struct{ ID, Body string } }
	}
	s.mustQuery(t, author.Token, mutation, map[string]any{"b": "two round trips"}, &out)
	if n := counter.N() - before; n != 2 {
		t.Errorf("createPost: %d round trips, want 2", n)
	}
	if out.CreatePost.Post.Body != "two round trips" {
		t.Errorf("createPost answered %+v", out.CreatePost)
	}
	seq, err := client.Get(context.Background(), "w:seq:post").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s:%d", author.ID, seq); out.CreatePost.Post.ID != want {
		t.Errorf("post id %s, want %s: the seq taken with the session", out.CreatePost.Post.ID, want)
	}
	before = counter.N()
	r := s.query(t, author.Token, mutation, map[string]any{"b": strings.Repeat("x", 1000)})
	if r.code() != "BAD_USER_INPUT" {
		t.Fatalf("a body too long: %+v, want BAD_USER_INPUT", r.Errors)
	}
	if n := counter.N() - before; n != 1 {
		t.Errorf("a refused createPost: %d round trips, want 1 (the session alone)", n)
	}
	if after, _ := client.Get(context.Background(), "w:seq:post").Int64(); after != seq {
		t.Errorf("a refused createPost moved the seq from %d to %d", seq, after)
	}
	// Two posts in one mutation: none ahead; each draws its own seq.
	before = counter.N()
	var two struct {
		A, B struct{ Post struct{ ID string } }
	}
	s.mustQuery(t, author.Token, `mutation { a: createPost(input: {body: "one"}) { post { id } } b: createPost(input: {body: "two"}) { post { id } } }`, nil, &two)
	if n := counter.N() - before; n != 5 {
		t.Errorf("two createPosts: %d round trips, want 5 (the session, then a seq and a step each)", n)
	}
	if want := []string{fmt.Sprintf("%s:%d", author.ID, seq+1), fmt.Sprintf("%s:%d", author.ID, seq+2)}; two.A.Post.ID != want[0] || two.B.Post.ID != want[1] {
		t.Errorf("two createPosts made %s and %s, want %v", two.A.Post.ID, two.B.Post.ID, want)
	}
}

// TestCreatePostRoundTripsWithLimits: with rate limits on (the default),
// a signed-in createPost costs three round trips, the session with the
// post's seq, the post's limit, and the step. A post that the limit refuses
// has taken its seq, a gap in the seqs as a failed step leaves, and
// writes no post.
func TestCreatePostRoundTripsWithLimits(t *testing.T) {
	if redistest.OnCluster() {
		t.Skip("a post's round trips on one Redis")
	}
	s := newTestServer(t, func(c *Config) {
		withLimits(func(l *warble.RateLimits) { l.PostsPerUser = every(2) })(c)
		c.FanoutWorkers = 0
	})
	author := s.signup(t, "author")
	s.post(t, author, "loads the scripts, the limiter's too")
	client := s.app.db.Client()
	counter := &redistest.RoundTrips{}
	client.AddHook(counter)
	const mutation = `mutation($b: String!) { createPost(input: {body: $b}) { post { id } } }`
	var out struct {
		CreatePost struct{ Post struct{ ID string } }
	}
	before := counter.N()
	s.mustQuery(t, author.Token, mutation, map[string]any{"b": "three round trips"}, &out)
	if n := counter.N() - before; n != 3 {
		t.Errorf("createPost with limits: %d round trips, want 3", n)
	}
	ctx := context.Background()
	seq, err := client.Get(ctx, "w:seq:post").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s:%d", author.ID, seq); out.CreatePost.Post.ID != want {
		t.Errorf("post id %s, want %s: the seq taken with the session", out.CreatePost.Post.ID, want)
	}

	// The third post is over the limit of two.
	before = counter.N()
	assertRateLimited(t, s.query(t, author.Token, mutation, map[string]any{"b": "one too many"}), "a third post")
	if n := counter.N() - before; n != 2 {
		t.Errorf("a post over the limit: %d round trips, want 2 (the session with the seq, the limit)", n)
	}
	after, err := client.Get(ctx, "w:seq:post").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if after != seq+1 {
		t.Fatalf("seq %d after a post over the limit, want %d (taken with the session, left unused)", after, seq+1)
	}
	var node struct {
		Node *struct{ ID string }
		User struct{ PostsCount int }
	}
	s.mustQuery(t, author.Token, `query($id: ID!, $u: String!) { node(id: $id) { id } user(username: $u) { postsCount } }`,
		map[string]any{"id": fmt.Sprintf("%s:%d", author.ID, after), "u": author.Username}, &node)
	if node.Node != nil || node.User.PostsCount != 2 {
		t.Errorf("after a post over the limit: node %+v, %d posts; want no post there and 2 posts", node.Node, node.User.PostsCount)
	}
}

// TestHomePageRoundTrips checks that a signed-in home page costs two Redis
// round trips: the session read with the range read of the home timeline,
// then the posts with their authors. It was three, the range read on its
// own after the session's. With the post cache, a page whose posts and
// authors were read before costs the first alone. The first page (read
// once before) and a page after a cursor (not), and the first page again
// in a fragment.
func TestHomePageRoundTrips(t *testing.T) {
	for _, tt := range []struct {
		name      string
		cacheSize int
		want      [3]int64 // round trips of the first page, the next, the fragment's
	}{
		{name: "Cached", cacheSize: 1000, want: [3]int64{1, 2, 1}},
		{name: "NoCache", cacheSize: 0, want: [3]int64{2, 2, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// No fan-out workers: their polling would count too, and the
			// posts reach the viewer's home by the follow's backfill.
			s := newTestServer(t, func(c *Config) {
				c.LoaderWait = 500 * time.Millisecond
				c.FanoutWorkers = 0
				c.PostCacheSize = tt.cacheSize
			})
			viewer := s.signup(t, "viewer")
			other := s.signup(t, "other")
			for i := range 50 {
				s.post(t, other, fmt.Sprintf("post %d", i))
			}
			s.follow(t, viewer, other)
			client := s.app.db.Client()
			counter := &redistest.RoundTrips{}
			client.AddHook(counter)

			const home = `query($after: String) { homeTimeline(first: 20, after: $after) { edges { cursor node { id body
		author { id username } } } pageInfo { endCursor hasNextPage } } }`
			var after any
			// Reads which accounts are pulled, and fills the cache; the
			// hub's subscription for the cache's deletes comes first.
			if tt.cacheSize > 0 {
				waitCacheInUse(t, s)
			}
			s.mustQuery(t, viewer.Token, home, map[string]any{"after": nil}, new(any))
			for page := range 2 {
				before := counter.N()
				var out struct {
					HomeTimeline timelinePage
				}
				s.mustQuery(t, viewer.Token, home, map[string]any{"after": after}, &out)
				if n := counter.N() - before; n != tt.want[page] {
					t.Errorf("home page %d: %d round trips, want %d", page+1, n, tt.want[page])
				}
				if got := len(out.HomeTimeline.Edges); got != 20 || !out.HomeTimeline.PageInfo.HasNextPage {
					t.Fatalf("home page %d: %d posts, hasNextPage %v; want 20 and a next page", page+1, got, out.HomeTimeline.PageInfo.HasNextPage)
				}
				after = *out.HomeTimeline.PageInfo.EndCursor
			}

			// The page's size in a variable, the field in a fragment, under
			// an alias: the same.
			const fragment = `query($n: Int) { ...Home } fragment Home on Query { mine: homeTimeline(first: $n) {
		edges { node { id author { username } } } } }`
			before := counter.N()
			var out struct{ Mine timelinePage }
			s.mustQuery(t, viewer.Token, fragment, map[string]any{"n": 7}, &out)
			if n := counter.N() - before; n != tt.want[2] || len(out.Mine.Edges) != 7 {
				t.Errorf("home page in a fragment: %d round trips and %d posts, want %d and 7", n, len(out.Mine.Edges), tt.want[2])
			}
		})
	}
}

// waitCacheInUse waits until s's post cache is in use: its hub has
// subscribed to the announces of deletes.
func waitCacheInUse(t *testing.T, s *testServer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !s.app.db.PostCacheInUse() {
		if time.Now().After(deadline) {
			t.Fatal("the post cache is not in use after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// commandNames is a go-redis hook that records the names of the commands
// sent.
type commandNames struct {
	mu    sync.Mutex
	names []string
}

func (c *commandNames) add(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cmd := range cmds {
		c.names = append(c.names, cmd.Name())
	}
}

func (c *commandNames) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.names
	c.names = nil
	return names
}

func (c *commandNames) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *commandNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.add(cmds...)
		return next(ctx, cmds)
	}
}

// TestHomePageWithBadToken checks that a home page asked for with a wrong
// or a revoked token is answered UNAUTHENTICATED before anything of the
// query runs: Redis gets the session's one pipeline, which carries the
// range read of the home timeline that the token names as a right token's
// would (its answer is dropped), and nothing is written.
func TestHomePageWithBadToken(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.FanoutWorkers = 0 })
	viewer := s.signup(t, "viewer")
	other := s.signup(t, "other")
	s.post(t, other, "a post")
	s.follow(t, viewer, other)
	gone := s.signup(t, "gone")
	var out struct{ Logout bool }
	s.mustQuery(t, gone.Token, `mutation { logout }`, nil, &out)
	userID, _, _ := strings.Cut(viewer.Token, ".")
	wrong := userID + "." + strings.Repeat("A", 43)

	client := s.app.db.Client()
	counter := &redistest.RoundTrips{}
	names := &commandNames{}
	client.AddHook(counter)
	client.AddHook(names)
	const home = `{ homeTimeline(first: 20) { edges { node { id body author { username } } } } }`
	for _, token := range []string{wrong, gone.Token} {
		s.waitFirstPass(t)
		before := redistest.Snapshot(t, client)
		names.take()
		n := counter.N()
		r := s.query(t, token, home, nil)
		if r.code() != "UNAUTHENTICATED" || string(r.Data) != "null" && len(r.Data) > 0 {
			t.Errorf("home page with a bad token: data %s, errors %+v; want UNAUTHENTICATED and no data", r.Data, r.Errors)
		}
		if got := counter.N() - n; got != 1 {
			t.Errorf("home page with a bad token: %d round trips, want the session's 1", got)
		}
		sent := names.take()
		slices.Sort(sent)
		// zcard: the home timeline's size, read with its range for the cap
		// (a timeline may be past it between fan-out's trims).
		if want := []string{"hmget", "pttl", "zcard", "zrange"}; !slices.Equal(sent, want) {
			t.Errorf("home page with a bad token sent %v, want %v", sent, want)
		}
		redistest.AssertUnchanged(t, client, before, "a home page with a bad token")
	}
}
