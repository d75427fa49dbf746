package app

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// TestReadsPastRedis reads, through the API, the timelines of a server
// whose workers moved most posts to the archive (POSTS_IN_REDIS=2) and
// whose home and global timelines are capped small: a user's posts, a home
// timeline and the global timeline page on past what Redis holds with
// exact cursors, and node(id:) finds archived posts.
func TestReadsPastRedis(t *testing.T) {
	change, store := withArchive(t, 2)
	s := newTestServer(t, change, func(c *Config) { c.HomeCap = 3; c.GlobalCap = 4 })
	ada := s.signup(t, "ada")
	bob := s.signup(t, "bob")
	reader := s.signup(t, "reader")
	s.follow(t, reader, ada)
	var all, adas []string // bodies, newest first
	var adaIDs []string    // oldest first
	for i := range 6 {
		for _, u := range []testUser{ada, bob} {
			body := fmt.Sprintf("%s %d", u.Username, i)
			id := s.post(t, u, body)
			all = append([]string{body}, all...)
			if u == ada {
				adas = append([]string{body}, adas...)
				adaIDs = append(adaIDs, id)
			}
		}
	}
	waitArchived(t, store, 8) // the oldest 4 of each author's 6

	// readAll pages through a timeline and returns the bodies it read;
	// page picks the timeline out of a response's data.
	readAll := func(token, query string, vars map[string]any, page func(data json.RawMessage) timelinePage) []string {
		t.Helper()
		var got []string
		var after *string
		for pages := 0; ; pages++ {
			if pages > 50 {
				t.Fatal("paging does not end")
			}
			v := map[string]any{"after": after}
			for k, x := range vars {
				v[k] = x
			}
			var data json.RawMessage
			s.mustQuery(t, token, query, v, &data)
			p := page(data)
			got = append(got, p.bodies()...)
			if !p.PageInfo.HasNextPage {
				return got
			}
			after = p.PageInfo.EndCursor
		}
	}
	decode := func(data json.RawMessage, v any) {
		t.Helper()
		if err := json.Unmarshal(data, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, first := range []int{1, 2, 5} {
		// The global timeline holds the 4 newest ids, 2 of them of posts
		// archived since; below its cap it goes on in the archive.
		global := readAll("", fmt.Sprintf(`query($after: String) { globalTimeline(first: %d, after: $after) { %s } }`, first, timelineFields),
			nil, func(data json.RawMessage) timelinePage {
				var out struct{ GlobalTimeline timelinePage }
				decode(data, &out)
				return out.GlobalTimeline
			})
		if !slices.Equal(global, all) {
			t.Errorf("global, pages of %d = %q, want %q", first, global, all)
		}
		// The reader's home holds ada's 3 newest; past them, pulled.
		home := readAll(reader.Token, fmt.Sprintf(`query($after: String) { homeTimeline(first: %d, after: $after) { %s } }`, first, timelineFields),
			nil, func(data json.RawMessage) timelinePage {
				var out struct{ HomeTimeline timelinePage }
				decode(data, &out)
				return out.HomeTimeline
			})
		if !slices.Equal(home, adas) {
			t.Errorf("reader's home, pages of %d = %q, want ada's %q", first, home, adas)
		}
		posts := readAll("", fmt.Sprintf(`query($u: String!, $after: String) { user(username: $u) { posts(first: %d, after: $after) { %s } } }`, first, timelineFields),
			map[string]any{"u": ada.Username}, func(data json.RawMessage) timelinePage {
				var out struct{ User struct{ Posts timelinePage } }
				decode(data, &out)
				return out.User.Posts
			})
		if !slices.Equal(posts, adas) {
			t.Errorf("ada's posts, pages of %d = %q, want %q", first, posts, adas)
		}
	}

	var node struct {
		Node struct {
			Body   string
			Author struct{ Username string }
		}
	}
	s.mustQuery(t, "", `query($id: ID!) { node(id: $id) { ... on Post { body author { username } } } }`,
		map[string]any{"id": adaIDs[0]}, &node)
	if node.Node.Body != ada.Username+" 0" || node.Node.Author.Username != ada.Username {
		t.Errorf("node of an archived post = %+v", node.Node)
	}
}
