package app

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
)

const followMutation = `mutation($id: ID!) { follow(input: {userId: $id}) {
	user { username followersCount viewerIsFollowing } viewer { followingCount } } }`

const unfollowMutation = `mutation($id: ID!) { unfollow(input: {userId: $id}) {
	user { username followersCount viewerIsFollowing } viewer { followingCount } } }`

type followResult struct {
	User struct {
		Username          string
		FollowersCount    int
		ViewerIsFollowing bool
	}
	Viewer struct{ FollowingCount int }
}

func TestFollowAndUnfollow(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	bob := s.signup(t, "bob")

	for range 2 { // idempotent: the repeat changes nothing
		var out struct{ Follow followResult }
		s.mustQuery(t, ada.Token, followMutation, map[string]any{"id": bob.ID}, &out)
		if f := out.Follow; f.User.FollowersCount != 1 || !f.User.ViewerIsFollowing || f.Viewer.FollowingCount != 1 {
			t.Fatalf("after follow: %+v", f)
		}
	}
	var rel struct {
		User struct {
			FollowsViewer, ViewerIsFollowing bool
			Followers                        struct {
				TotalCount int
				Edges      []struct {
					FollowedAt *string
					Node       struct{ Username string }
				}
			}
		}
	}
	s.mustQuery(t, bob.Token, `query($u: String!) { user(username: $u) { followsViewer viewerIsFollowing
		followers { totalCount edges { followedAt node { username } } } } }`, map[string]any{"u": ada.Username}, &rel)
	if !rel.User.FollowsViewer || rel.User.ViewerIsFollowing {
		t.Fatalf("from bob's side: followsViewer %v, viewerIsFollowing %v; want true, false", rel.User.FollowsViewer, rel.User.ViewerIsFollowing)
	}

	var followers struct {
		User struct {
			Followers struct {
				TotalCount int
				Edges      []struct {
					FollowedAt *string
					Node       struct{ Username string }
				}
			}
		}
	}
	s.mustQuery(t, "", `query($u: String!) { user(username: $u) { followers { totalCount edges { followedAt node { username } } } } }`,
		map[string]any{"u": bob.Username}, &followers)
	fs := followers.User.Followers
	if fs.TotalCount != 1 || len(fs.Edges) != 1 || fs.Edges[0].Node.Username != ada.Username || fs.Edges[0].FollowedAt == nil {
		t.Fatalf("bob's followers = %+v", fs)
	}

	for range 2 {
		var out struct{ Unfollow followResult }
		s.mustQuery(t, ada.Token, unfollowMutation, map[string]any{"id": bob.ID}, &out)
		if f := out.Unfollow; f.User.FollowersCount != 0 || f.User.ViewerIsFollowing || f.Viewer.FollowingCount != 0 {
			t.Fatalf("after unfollow: %+v", f)
		}
	}
}

func TestFollowErrorsWriteNothing(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.MaxFollowing = 2 })
	ada := s.signup(t, "ada")
	others := []testUser{s.signup(t, "o"), s.signup(t, "o"), s.signup(t, "o")}
	s.follow(t, ada, others[0])
	s.follow(t, ada, others[1])
	tests := []struct {
		name     string
		mutation string
		id       string
		wantCode string
	}{
		{"Self", followMutation, ada.ID, "BAD_USER_INPUT"},
		{"PastTheLimit", followMutation, others[2].ID, "BAD_USER_INPUT"},
		{"Unknown", followMutation, "987654", "NOT_FOUND"},
		{"UnfollowUnknown", unfollowMutation, "987654", "NOT_FOUND"},
		{"Malformed", followMutation, "abc", "BAD_USER_INPUT"},
		{"MalformedPostID", followMutation, "1:2", "BAD_USER_INPUT"},
		{"Empty", followMutation, "", "BAD_USER_INPUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.waitFirstPass(t)
			before := redistest.Snapshot(t, s.redis.Client(t))
			r := s.query(t, ada.Token, tt.mutation, map[string]any{"id": tt.id})
			if got := r.code(); got != tt.wantCode {
				t.Fatalf("code = %q, want %q (%+v)", got, tt.wantCode, r.Errors)
			}
			redistest.AssertUnchanged(t, s.redis.Client(t), before, "rejected "+tt.name)
		})
	}
	var v struct{ Viewer struct{ FollowingCount int } }
	s.mustQuery(t, ada.Token, `{ viewer { followingCount } }`, nil, &v)
	if v.Viewer.FollowingCount != 2 {
		t.Fatalf("followingCount = %d, want 2", v.Viewer.FollowingCount)
	}
}

func TestFollowBackfillsAndUnfollowRemoves(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	bob := s.signup(t, "bob")
	s.post(t, ada, "ada 1")
	for i := range 3 {
		s.post(t, bob, fmt.Sprintf("bob %d", i))
	}
	s.post(t, ada, "ada 2")

	s.follow(t, ada, bob)
	if got, want := s.home(t, ada, 20).bodies(), []string{"ada 2", "bob 2", "bob 1", "bob 0", "ada 1"}; !slices.Equal(got, want) {
		t.Fatalf("home after follow = %q, want %q (in time order)", got, want)
	}
	var out struct{ Unfollow followResult }
	s.mustQuery(t, ada.Token, unfollowMutation, map[string]any{"id": bob.ID}, &out)
	if got, want := s.home(t, ada, 20).bodies(), []string{"ada 2", "ada 1"}; !slices.Equal(got, want) {
		t.Fatalf("home after unfollow = %q, want %q", got, want)
	}
}

func TestConcurrentFollowsKeepCountsEqualToLists(t *testing.T) {
	s := newTestServer(t)
	users := make([]testUser, 6)
	for i := range users {
		users[i] = s.signup(t, "racer")
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 40 {
				a, b := users[rng.IntN(len(users))], users[rng.IntN(len(users))]
				if a.ID == b.ID {
					continue
				}
				m := followMutation
				if rng.IntN(2) == 0 {
					m = unfollowMutation
				}
				if r := s.query(t, a.Token, m, map[string]any{"id": b.ID}); len(r.Errors) > 0 {
					t.Errorf("%+v", r.Errors)
				}
			}
		}()
	}
	wg.Wait()

	type listed struct {
		Username       string
		FollowersCount int
		FollowingCount int
		Followers      struct {
			TotalCount int
			Edges      []struct{ Node struct{ Username string } }
		}
		Following struct {
			TotalCount int
			Edges      []struct{ Node struct{ Username string } }
		}
	}
	followersOf := map[string][]string{}
	followingOf := map[string][]string{}
	for _, u := range users {
		var out struct{ User listed }
		s.mustQuery(t, "", `query($u: String!) { user(username: $u) { username followersCount followingCount
			followers(first: 100) { totalCount edges { node { username } } }
			following(first: 100) { totalCount edges { node { username } } } } }`, map[string]any{"u": u.Username}, &out)
		l := out.User
		if l.FollowersCount != len(l.Followers.Edges) || l.Followers.TotalCount != l.FollowersCount ||
			l.FollowingCount != len(l.Following.Edges) || l.Following.TotalCount != l.FollowingCount {
			t.Fatalf("%s: counts %d/%d but lists %d/%d", u.Username, l.FollowersCount, l.FollowingCount, len(l.Followers.Edges), len(l.Following.Edges))
		}
		for _, e := range l.Followers.Edges {
			followersOf[u.Username] = append(followersOf[u.Username], e.Node.Username)
		}
		for _, e := range l.Following.Edges {
			followingOf[e.Node.Username] = append(followingOf[e.Node.Username], u.Username)
		}
	}
	for _, u := range users {
		a, b := followersOf[u.Username], followingOf[u.Username]
		slices.Sort(a)
		slices.Sort(b)
		if !slices.Equal(a, b) {
			t.Fatalf("%s: followers list %q, but these follow them: %q", u.Username, a, b)
		}
	}
}

func TestViewerRelativeLists(t *testing.T) {
	s := newTestServer(t)
	viewer := s.signup(t, "viewer")
	target := s.signup(t, "target")
	both := s.signup(t, "both")    // follows viewer and target; both follow it
	onlyT := s.signup(t, "only_t") // follows target only
	onlyV := s.signup(t, "only_v") // followed by viewer only
	s.follow(t, both, viewer)
	s.follow(t, both, target)
	s.follow(t, onlyT, target)
	s.follow(t, viewer, both)
	s.follow(t, target, both)
	s.follow(t, viewer, onlyV)
	s.follow(t, viewer, onlyT)

	const q = `query($u: String!) { user(username: $u) {
		commonFollowers { totalCount edges { node { username } } }
		commonFollowing { totalCount edges { node { username } } }
		followersYouFollow { totalCount edges { node { username } } } } }`
	type conn struct {
		TotalCount int
		Edges      []struct{ Node struct{ Username string } }
	}
	names := func(c conn) []string {
		var out []string
		for _, e := range c.Edges {
			out = append(out, e.Node.Username)
		}
		slices.Sort(out)
		return out
	}
	var out struct {
		User struct{ CommonFollowers, CommonFollowing, FollowersYouFollow conn }
	}
	s.mustQuery(t, viewer.Token, q, map[string]any{"u": target.Username}, &out)
	u := out.User
	if got := names(u.CommonFollowers); !slices.Equal(got, []string{both.Username}) || u.CommonFollowers.TotalCount != 1 {
		t.Errorf("commonFollowers = %q (total %d), want [%s]", got, u.CommonFollowers.TotalCount, both.Username)
	}
	if got := names(u.CommonFollowing); !slices.Equal(got, []string{both.Username}) || u.CommonFollowing.TotalCount != 1 {
		t.Errorf("commonFollowing = %q (total %d), want [%s]", got, u.CommonFollowing.TotalCount, both.Username)
	}
	want := []string{both.Username, onlyT.Username}
	slices.Sort(want)
	if got := names(u.FollowersYouFollow); !slices.Equal(got, want) || u.FollowersYouFollow.TotalCount != 2 {
		t.Errorf("followersYouFollow = %q (total %d), want %q", got, u.FollowersYouFollow.TotalCount, want)
	}

	var anon struct {
		User struct{ CommonFollowers, CommonFollowing, FollowersYouFollow conn }
	}
	s.mustQuery(t, "", q, map[string]any{"u": target.Username}, &anon)
	if a := anon.User; len(a.CommonFollowers.Edges)+len(a.CommonFollowing.Edges)+len(a.FollowersYouFollow.Edges) != 0 {
		t.Fatalf("signed out, the viewer-relative lists must be empty: %+v", a)
	}
}

// TestFollowersInBuckets follows an account past FOLLOWERS_BUCKET_THRESHOLD
// through the API: the server's workers move its followers into buckets,
// and followersCount, the followers pages (newest follow first, with
// cursors), commonFollowers and fan-out read them there.
func TestFollowersInBuckets(t *testing.T) {
	ctx := context.Background()
	s := newTestServer(t, func(c *Config) { c.BucketThreshold, c.FollowerBuckets, c.PullThreshold = 3, 4, -1 })
	ada, bob := s.signup(t, "ada"), s.signup(t, "bob")
	var fans []testUser
	for range 7 {
		f := s.signup(t, "fan")
		s.follow(t, f, ada)
		fans = append(fans, f)
	}
	for _, f := range fans[2:5] {
		s.follow(t, f, bob)
	}
	field, bucketed := redisdb.Keys.BucketedFollowers(4)
	rc := s.redis.Client(t)
	eventually(t, "ada's followers are in buckets", func() bool {
		return rc.HGet(ctx, redisdb.Keys.User(ada.ID), field).Val() == bucketed
	})
	if n := rc.Exists(ctx, redisdb.Keys.Followers(ada.ID)).Val(); n != 0 {
		t.Fatal("ada's one followers set is still there")
	}

	type page struct {
		TotalCount int
		Edges      []struct{ Node struct{ Username string } }
		PageInfo   struct {
			HasNextPage bool
			EndCursor   *string
		}
	}
	var got []string
	var after *string
	for {
		var out struct {
			User struct {
				FollowersCount int
				Followers      page
			}
		}
		s.mustQuery(t, "", `query($u: String!, $after: String) { user(username: $u) { followersCount
			followers(first: 3, after: $after) { totalCount edges { node { username } } pageInfo { hasNextPage endCursor } } } }`,
			map[string]any{"u": ada.Username, "after": after}, &out)
		if out.User.FollowersCount != len(fans) || out.User.Followers.TotalCount != len(fans) {
			t.Fatalf("followersCount %d, totalCount %d; want %d", out.User.FollowersCount, out.User.Followers.TotalCount, len(fans))
		}
		for _, e := range out.User.Followers.Edges {
			got = append(got, e.Node.Username)
		}
		if !out.User.Followers.PageInfo.HasNextPage {
			break
		}
		after = out.User.Followers.PageInfo.EndCursor
	}
	var want []string
	for _, f := range slices.Backward(fans) {
		want = append(want, f.Username)
	}
	if !slices.Equal(got, want) {
		t.Errorf("ada's followers, newest first:\n got %v\nwant %v", got, want)
	}

	var common struct {
		User struct{ CommonFollowers page }
	}
	s.mustQuery(t, bob.Token, `query($u: String!) { user(username: $u) { commonFollowers { totalCount edges { node { username } } } } }`,
		map[string]any{"u": ada.Username}, &common)
	if c := common.User.CommonFollowers; c.TotalCount != 3 || len(c.Edges) != 3 {
		t.Errorf("common followers of ada and bob: %+v, want fans 2 to 4", c)
	}

	body := "to every bucket"
	s.post(t, ada, body)
	for _, f := range fans {
		eventually(t, f.Username+" gets ada's post", func() bool {
			return slices.Contains(s.home(t, f, 5).bodies(), body)
		})
	}
}
