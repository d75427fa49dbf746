package app

import (
	"fmt"
	"testing"
	"time"

	"github.com/warble/warble/internal/redistest"
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
