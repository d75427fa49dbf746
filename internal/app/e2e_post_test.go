package app

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/warble/warble/internal/redistest"
)

const createPostMutation = `mutation($b: String!) { createPost(input: {body: $b}) { post { id body createdAt author { username postsCount } } } }`

func TestCreatePostValidation(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "writer")
	tests := []struct {
		name     string
		body     string
		want     string // the stored body when accepted
		wantCode string
	}{
		{name: "Plain", body: "hello", want: "hello"},
		{name: "Trimmed", body: "  \n hello world \t ", want: "hello world"},
		{name: "NewlineAndTabInside", body: "a\n\tb", want: "a\n\tb"},
		{name: "Exactly280CodePoints", body: strings.Repeat("ü", 280), want: strings.Repeat("ü", 280)},
		{name: "Emoji", body: "🎉 party", want: "🎉 party"},
		{name: "EmojiSequenceWithJoiner", body: "👩\u200d💻 coding", want: "👩\u200d💻 coding"},
		{name: "RightToLeftScript", body: "שלום \u200fworld", want: "שלום \u200fworld"},
		{name: "BidiOverride", body: "invoice_\u202egpj.exe", wantCode: "BAD_USER_INPUT"},
		{name: "Empty", body: "", wantCode: "BAD_USER_INPUT"},
		{name: "OnlyWhitespace", body: " \n\t ", wantCode: "BAD_USER_INPUT"},
		{name: "TooLong", body: strings.Repeat("a", 281), wantCode: "BAD_USER_INPUT"},
		{name: "ControlCharacter", body: "bell\a", wantCode: "BAD_USER_INPUT"},
		{name: "NulCharacter", body: "nul\x00", wantCode: "BAD_USER_INPUT"},
		{name: "Escape", body: "esc\x1b[31m", wantCode: "BAD_USER_INPUT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.waitFirstPass(t)
			before := redistest.Snapshot(t, s.redis.Client(t))
			r := s.query(t, u.Token, createPostMutation, map[string]any{"b": tt.body})
			if got := r.code(); got != tt.wantCode {
				t.Fatalf("createPost(%q) code = %q, want %q (%+v)", tt.body, got, tt.wantCode, r.Errors)
			}
			if tt.wantCode != "" {
				redistest.AssertUnchanged(t, s.redis.Client(t), before, "rejected post")
				return
			}
			var out struct {
				CreatePost struct {
					Post struct {
						ID, Body, CreatedAt string
						Author              struct{ Username string }
					}
				}
			}
			r.decode(t, &out)
			if p := out.CreatePost.Post; p.Body != tt.want || p.Author.Username != u.Username || !strings.HasSuffix(p.CreatedAt, "Z") {
				t.Fatalf("post = %+v, want body %q by %s with a UTC time", p, tt.want, u.Username)
			}
			var node struct{ Node struct{ Body string } }
			s.mustQuery(t, "", `query($id: ID!) { node(id: $id) { ... on Post { body } } }`, map[string]any{"id": out.CreatePost.Post.ID}, &node)
			if node.Node.Body != tt.want {
				t.Fatalf("node(post).body = %q, want %q", node.Node.Body, tt.want)
			}
		})
	}
}

func TestTimelinesAndPaging(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	bob := s.signup(t, "bob")
	eve := s.signup(t, "eve") // not followed by ada
	s.follow(t, ada, bob)
	var want []string
	for i := range 7 {
		author := []testUser{ada, bob}[i%2]
		body := fmt.Sprintf("post %d", i)
		s.post(t, author, body)
		want = append(want, body)
	}
	s.post(t, eve, "not for ada")
	slices.Reverse(want)

	// Read-your-writes and fan-out: ada's home has both authors, newest first.
	eventually(t, "bob's posts reach ada's home", func() bool {
		return slices.Equal(s.home(t, ada, 20).bodies(), want)
	})

	// Paging continues exactly where it ended, even while new posts arrive.
	var got []string
	var after *string
	for page := 0; ; page++ {
		var out struct{ HomeTimeline timelinePage }
		s.mustQuery(t, ada.Token, `query($a: String) { homeTimeline(first: 3, after: $a) { `+timelineFields+` } }`,
			map[string]any{"a": after}, &out)
		got = append(got, out.HomeTimeline.bodies()...)
		if page == 0 {
			s.post(t, ada, "arrived while paging")
		}
		if !out.HomeTimeline.PageInfo.HasNextPage {
			break
		}
		after = out.HomeTimeline.PageInfo.EndCursor
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged home = %q, want %q", got, want)
	}

	var global struct{ GlobalTimeline timelinePage }
	s.mustQuery(t, "", `{ globalTimeline(first: 100) { `+timelineFields+` } }`, nil, &global)
	if n := len(global.GlobalTimeline.Edges); n != 9 {
		t.Fatalf("global timeline has %d posts, want 9", n)
	}

	var profile struct {
		User struct {
			PostsCount int
			Posts      timelinePage
		}
	}
	s.mustQuery(t, "", `query($u: String!) { user(username: $u) { postsCount posts(first: 2) { `+timelineFields+` } } }`,
		map[string]any{"u": bob.Username}, &profile)
	if profile.User.PostsCount != 3 || !slices.Equal(profile.User.Posts.bodies(), []string{"post 5", "post 3"}) || !profile.User.Posts.PageInfo.HasNextPage {
		t.Fatalf("bob's profile = %+v", profile.User)
	}
}

func TestPageArgumentErrors(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "pager")
	for _, q := range []string{
		`{ globalTimeline(first: 0) { edges { cursor } } }`,
		`{ globalTimeline(first: 101) { edges { cursor } } }`,
		`{ globalTimeline(first: -1) { edges { cursor } } }`,
		`{ globalTimeline(after: "not a cursor") { edges { cursor } } }`,
		`{ globalTimeline(after: "") { edges { cursor } } }`,
		`{ homeTimeline(after: "Zm9v") { edges { cursor } } }`,
		`{ newestUsers(first: 0) { id } }`,
		`{ newestUsers(first: 101) { id } }`,
		`{ viewer { followers(first: 500) { totalCount } } }`,
		`{ viewer { following(after: "bad") { totalCount } } }`,
	} {
		if got := s.query(t, u.Token, q, nil).code(); got != "BAD_USER_INPUT" {
			t.Errorf("%s: code %q, want BAD_USER_INPUT", q, got)
		}
	}
	var ok struct{ GlobalTimeline timelinePage }
	s.mustQuery(t, "", `{ globalTimeline(first: 100) { edges { cursor } pageInfo { hasNextPage endCursor } } }`, nil, &ok)
	if ok.GlobalTimeline.PageInfo.EndCursor != nil || ok.GlobalTimeline.PageInfo.HasNextPage {
		t.Fatalf("empty timeline pageInfo = %+v, want no next page and a null endCursor", ok.GlobalTimeline.PageInfo)
	}
}

// TestTimelineCaps: the home and global timelines keep their caps in
// Redis. A home page goes on past the cap by pull, to the first post; the
// global timeline ends at its cap without an archive (with one, see
// TestReadsPastRedis).
func TestTimelineCaps(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.HomeCap = 3; c.GlobalCap = 4 })
	u := s.signup(t, "capped")
	for i := range 6 {
		s.post(t, u, fmt.Sprintf("p%d", i))
	}
	if got := s.home(t, u, 3).bodies(); !slices.Equal(got, []string{"p5", "p4", "p3"}) {
		t.Fatalf("capped home = %q", got)
	}
	if got := s.home(t, u, 100).bodies(); !slices.Equal(got, []string{"p5", "p4", "p3", "p2", "p1", "p0"}) {
		t.Fatalf("home read past its cap = %q", got)
	}
	var global struct{ GlobalTimeline timelinePage }
	s.mustQuery(t, "", `{ globalTimeline(first: 4) { `+timelineFields+` } }`, nil, &global)
	if got := global.GlobalTimeline.bodies(); !slices.Equal(got, []string{"p5", "p4", "p3", "p2"}) {
		t.Fatalf("capped global = %q", got)
	}
	if !archiveEverywhere() {
		s.mustQuery(t, "", `{ globalTimeline(first: 100) { `+timelineFields+` } }`, nil, &global)
		if got := global.GlobalTimeline.bodies(); !slices.Equal(got, []string{"p5", "p4", "p3", "p2"}) || global.GlobalTimeline.PageInfo.HasNextPage {
			t.Fatalf("global without an archive = %q, next %v; want it to end at its cap", got, global.GlobalTimeline.PageInfo.HasNextPage)
		}
	}
	var profile struct{ User struct{ PostsCount int } }
	s.mustQuery(t, "", `query($u: String!) { user(username: $u) { postsCount } }`, map[string]any{"u": u.Username}, &profile)
	if profile.User.PostsCount != 6 {
		t.Fatalf("postsCount = %d, want 6: a user's own posts are never capped", profile.User.PostsCount)
	}
}

func TestDeletePost(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	bob := s.signup(t, "bob")
	s.follow(t, bob, ada)
	keep := s.post(t, ada, "keep me")
	gone := s.post(t, ada, "delete me")
	eventually(t, "both posts reach bob", func() bool { return len(s.home(t, bob, 10).Edges) == 2 })

	del := func(u testUser, id string) gqlResponse {
		return s.query(t, u.Token, `mutation($id: ID!) { deletePost(input: {postId: $id}) { postId } }`, map[string]any{"id": id})
	}
	if got := del(bob, gone).code(); got != "FORBIDDEN" {
		t.Fatalf("delete by another user: code %q, want FORBIDDEN", got)
	}
	for _, id := range []string{"1:999999", "nonsense", "", "1"} {
		if got := del(ada, id).code(); got != "NOT_FOUND" {
			t.Errorf("delete %q: code %q, want NOT_FOUND", id, got)
		}
	}
	var out struct{ DeletePost struct{ PostID string } }
	del(ada, gone).decode(t, &out)
	if out.DeletePost.PostID != gone {
		t.Fatalf("deletePost.postId = %q, want %q", out.DeletePost.PostID, gone)
	}
	if got := del(ada, gone).code(); got != "NOT_FOUND" {
		t.Fatalf("second delete: code %q, want NOT_FOUND", got)
	}

	for name, bodies := range map[string][]string{
		"ada home": s.home(t, ada, 10).bodies(),
		"bob home": s.home(t, bob, 10).bodies(),
	} {
		if !slices.Equal(bodies, []string{"keep me"}) {
			t.Errorf("%s = %q after delete", name, bodies)
		}
	}
	var res struct {
		Gone   *struct{ ID string }
		Kept   *struct{ ID string }
		User   struct{ PostsCount int }
		Global timelinePage
	}
	s.mustQuery(t, "", `query($g: ID!, $k: ID!, $u: String!) {
		gone: node(id: $g) { id } kept: node(id: $k) { id }
		user(username: $u) { postsCount }
		global: globalTimeline { `+timelineFields+` } }`,
		map[string]any{"g": gone, "k": keep, "u": ada.Username}, &res)
	if res.Gone != nil || res.Kept == nil || res.User.PostsCount != 1 || !slices.Equal(res.Global.bodies(), []string{"keep me"}) {
		t.Fatalf("after delete: node(gone) %v, node(kept) %v, postsCount %d, global %q", res.Gone, res.Kept, res.User.PostsCount, res.Global.bodies())
	}
}

func TestNodeAndUserLookups(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "lookup")
	p := s.post(t, u, "findable")
	var out struct {
		U, P               map[string]any
		Missing, Bad, BadU map[string]any
		Nobody             map[string]any
	}
	s.mustQuery(t, "", `query($u: ID!, $p: ID!) {
		u: node(id: $u) { __typename id ... on User { username } }
		p: node(id: $p) { __typename id ... on Post { body } }
		missing: node(id: "424242") { id }
		bad: node(id: "x:y") { id }
		badU: node(id: "") { id }
		nobody: user(username: "no_such_user") { id } }`,
		map[string]any{"u": u.ID, "p": p}, &out)
	if out.U["__typename"] != "User" || out.U["username"] != u.Username || out.P["__typename"] != "Post" || out.P["body"] != "findable" {
		t.Fatalf("node lookups = %+v / %+v", out.U, out.P)
	}
	if out.Missing != nil || out.Bad != nil || out.BadU != nil || out.Nobody != nil {
		t.Fatalf("missing lookups should be null: %+v", out)
	}
}
