package app

import (
	"testing"
)

// TestPulledAccountEndToEnd: with a pull threshold of one follower, a post
// by an account with two reaches neither follower's stored timeline, yet
// both read it on their home timeline, a live home subscription gets it
// and its removal, and a page after the event's cursor goes on from it.
func TestPulledAccountEndToEnd(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.PullThreshold = 1 })
	star := s.signup(t, "star")
	ada := s.signup(t, "ada")
	bob := s.signup(t, "bob")
	small := s.signup(t, "small")
	s.follow(t, ada, star)
	s.follow(t, bob, star)
	s.follow(t, ada, small)

	before := s.post(t, small, "pushed before")
	eventually(t, "the pushed post reaches ada", func() bool { return len(s.home(t, ada, 5).Edges) == 1 })
	after := s.home(t, ada, 1).Edges[0].Cursor
	c := s.connect(t, protoTransportWS, ada.Token)
	c.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})

	id := s.post(t, star, "to the many")
	ev := c.nextEvent("home")
	if ev.Kind != "POST_ADDED" || ev.PostID == nil || *ev.PostID != id || ev.Post == nil || ev.Post.Author.Username != star.Username {
		t.Fatalf("live event = %+v, want POST_ADDED of the pulled post %s", ev, id)
	}
	for _, u := range []testUser{ada, bob} {
		eventually(t, u.Username+" reads the pulled post", func() bool {
			page := s.home(t, u, 5)
			return len(page.Edges) > 0 && page.Edges[0].Node.ID == id
		})
	}
	stored := s.redis.Client(t).ZScore(t.Context(), "w:u:{"+bob.ID+"}:home", id)
	if stored.Err() == nil {
		t.Fatal("the pulled post was fanned out to a follower's stored timeline")
	}
	var page struct{ HomeTimeline timelinePage }
	s.mustQuery(t, ada.Token, `query($a: String) { homeTimeline(first: 5, after: $a) { `+timelineFields+` } }`,
		map[string]any{"a": ev.Cursor}, &page)
	if len(page.HomeTimeline.Edges) != 1 || page.HomeTimeline.Edges[0].Node.ID != before {
		t.Fatalf("page after the live event = %q, want the pushed post before it", page.HomeTimeline.bodies())
	}

	s.mustQuery(t, star.Token, `mutation($id: ID!) { deletePost(input: {postId: $id}) { postId } }`, map[string]any{"id": id}, new(any))
	ev = c.nextEvent("home")
	if ev.Kind == "RESYNC" {
		// The hub learnt that star is pulled after it had dispatched the
		// post, and cannot tell whether older posts of star's were missed.
		ev = c.nextEvent("home")
	}
	if ev.Kind != "POST_REMOVED" || ev.PostID == nil || *ev.PostID != id {
		t.Fatalf("live event after delete = %+v, want POST_REMOVED of %s", ev, id)
	}
	if got := s.home(t, bob, 5).Edges; len(got) != 0 {
		t.Fatalf("bob's home after the delete holds %d posts", len(got))
	}
}
