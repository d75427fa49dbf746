package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

func TestLiveTimelines(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			ada := s.signup(t, "ada")
			bob := s.signup(t, "bob")
			s.follow(t, ada, bob)

			// Subscribing after a known cursor: nothing after it can be
			// missed, however long the subscriptions take to start.
			after := s.syncCursor(t, bob)
			// Fan-out is asynchronous: the cursor is a position in ada's
			// home once the sync post has reached it.
			eventually(t, "the sync post reaches ada's home", func() bool {
				return len(s.home(t, ada, 1).Edges) == 1
			})
			c := s.connect(t, proto, ada.Token)
			c.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
			c.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
			c.subscribe("bob", `subscription($u: String!, $a: String) { userPosts(username: $u, after: $a) { `+eventFields+` } }`,
				map[string]any{"u": bob.Username, "a": after})

			id := s.post(t, bob, "hello live")
			got := map[string]timelineEvent{}
			for range 3 {
				m := c.next()
				ev := decodeEvent(t, m)
				got[m.ID] = ev
			}
			for _, op := range []string{"home", "global", "bob"} {
				ev := got[op]
				if ev.Kind != "POST_ADDED" || ev.PostID == nil || *ev.PostID != id || ev.Post == nil ||
					ev.Post.Body != "hello live" || ev.Post.Author.Username != bob.Username || ev.Cursor == "" {
					t.Fatalf("%s event = %+v, want POST_ADDED of %s", op, ev, id)
				}
			}

			// The event cursor continues a page read exactly.
			var page struct{ HomeTimeline timelinePage }
			s.mustQuery(t, ada.Token, `query($a: String) { homeTimeline(after: $a) { `+timelineFields+` } }`,
				map[string]any{"a": got["home"].Cursor}, &page)
			if len(page.HomeTimeline.Edges) == 0 || page.HomeTimeline.Edges[0].Node.ID == id {
				t.Fatalf("page after the event cursor = %q, want the posts before it", page.HomeTimeline.bodies())
			}

			s.mustQuery(t, bob.Token, `mutation($id: ID!) { deletePost(input: {postId: $id}) { postId } }`, map[string]any{"id": id}, new(any))
			for range 3 {
				m := c.next()
				ev := decodeEvent(t, m)
				if ev.Kind != "POST_REMOVED" || ev.PostID == nil || *ev.PostID != id || ev.Post != nil {
					t.Fatalf("%s event after delete = %+v, want POST_REMOVED of %s", m.ID, ev, id)
				}
			}

			// Unfollowing rewrites the home timeline: RESYNC.
			s.mustQuery(t, ada.Token, unfollowMutation, map[string]any{"id": bob.ID}, new(any))
			ev := c.nextEvent("home")
			if ev.Kind != "RESYNC" || ev.Cursor == "" || ev.PostID != nil {
				t.Fatalf("event after unfollow = %+v, want RESYNC with a cursor", ev)
			}

			// A stop ends the subscription: the legacy protocol hears
			// complete, graphql-transport-ws nothing more for it (see
			// TestCompleteByClientIsNotEchoed).
			c.stop("global")
			if proto == protoLegacyWS {
				if m := c.next(); m.Type != "complete" || m.ID != "global" {
					t.Fatalf("after stop: %s %s %s, want complete", m.Type, m.ID, m.Payload)
				}
			}
		})
	}
}

func decodeEvent(t *testing.T, m wsMessage) timelineEvent {
	t.Helper()
	if m.Type != "next" && m.Type != "data" {
		t.Fatalf("got %s %s %s, want an event", m.Type, m.ID, m.Payload)
	}
	var p struct {
		Data   map[string]timelineEvent
		Errors []gqlError
	}
	if err := jsonUnmarshal(m.Payload, &p); err != nil || len(p.Errors) > 0 {
		t.Fatalf("event payload %s: %v %+v", m.Payload, err, p.Errors)
	}
	for _, ev := range p.Data {
		return ev
	}
	t.Fatalf("event payload %s has no data", m.Payload)
	return timelineEvent{}
}

func TestHomeSubscriptionNeedsSession(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			c := s.connect(t, proto, "")
			c.subscribe("1", `subscription { homeTimeline { kind } }`, nil)
			m := c.next()
			if m.Type != "error" && !strings.Contains(string(m.Payload), "UNAUTHENTICATED") {
				t.Fatalf("anonymous homeTimeline: %+v, want an UNAUTHENTICATED error", m)
			}
			if !strings.Contains(string(m.Payload), "UNAUTHENTICATED") {
				t.Fatalf("anonymous homeTimeline error %s lacks UNAUTHENTICATED", m.Payload)
			}
			c.subscribe("2", `subscription { userPosts(username: "nobody_at_all") { kind } }`, nil)
			for {
				m = c.next()
				if m.ID == "2" && m.Type != "complete" {
					break
				}
			}
			if !strings.Contains(string(m.Payload), "NOT_FOUND") {
				t.Fatalf("userPosts of an unknown user: %s, want NOT_FOUND", m.Payload)
			}
		})
	}
}

func TestBadTokenClosesWebsocketWith4403(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			c, _, err := s.dialWS(t, proto, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.init("not-a-real-token")
			var closeErr *websocket.CloseError
			for {
				_, err := c.read(readTimeout)
				if err != nil {
					if !errors.As(err, &closeErr) {
						t.Fatalf("read: %v, want a close frame", err)
					}
					break
				}
			}
			if closeErr.Code != 4403 {
				t.Fatalf("close code = %d, want 4403", closeErr.Code)
			}
		})
	}
}

func TestWebsocketOriginCheck(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.CORSOrigins = []string{"https://app.example"} })
	for origin, ok := range map[string]bool{
		"https://app.example":  true,
		"https://evil.example": false,
		"null":                 false, // a sandboxed frame or a file: page
		s.URL:                  true,  // same origin
	} {
		_, resp, err := s.dialWS(t, protoTransportWS, http.Header{"Origin": {origin}})
		if ok && err != nil {
			t.Errorf("origin %s refused: %v", origin, err)
		}
		if !ok && (err == nil || resp == nil || resp.StatusCode != http.StatusForbidden) {
			t.Errorf("origin %s: err %v, want a 403 refusal", origin, err)
		}
		if !ok && resp != nil {
			var body struct {
				Errors []gqlError
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Errors) != 1 ||
				body.Errors[0].Extensions["code"] != "FORBIDDEN" {
				t.Errorf("origin %s: refusal %+v (%v), want one FORBIDDEN error", origin, body, err)
			}
		}
	}
}

func TestResumeWithAfterHasNoGapAndNoDuplicate(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			u := s.signup(t, "resumer")
			for i := range 5 {
				s.post(t, u, fmt.Sprintf("before %d", i))
			}
			page := s.home(t, u, 3) // before 4, 3, 2
			resumeFrom := page.Edges[2].Cursor

			// Posts keep arriving while the subscription starts.
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range 10 {
					s.post(t, u, fmt.Sprintf("during %d", i))
				}
			}()
			c := s.connect(t, proto, u.Token)
			c.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": resumeFrom})
			<-done
			s.post(t, u, "after")

			want := []string{"before 3", "before 4"}
			for i := range 10 {
				want = append(want, fmt.Sprintf("during %d", i))
			}
			want = append(want, "after")
			var last int64
			for i, w := range want {
				ev := c.nextEvent("home")
				if ev.Kind != "POST_ADDED" || ev.Post == nil || ev.Post.Body != w {
					t.Fatalf("event %d = %+v, want POST_ADDED %q", i, ev, w)
				}
				// Cursors are opaque to clients; this test may look inside.
				seq, err := warble.ParsePostCursor(ev.Cursor)
				if err != nil || seq <= last {
					t.Fatalf("event %d cursor %q (seq %d, %v) does not come after seq %d", i, ev.Cursor, seq, err, last)
				}
				last = seq
			}
			// Nothing more: a duplicate would show up before this marker.
			s.post(t, u, "end")
			if ev := c.nextEvent("home"); ev.Post == nil || ev.Post.Body != "end" {
				t.Fatalf("event after the last = %+v, want \"end\" (a duplicate?)", ev)
			}
		})
	}
}

func TestResumeFromBeyondTheCapStartsWithResync(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.GlobalCap = 3 })
	u := s.signup(t, "capper")
	s.post(t, u, "old")
	var first struct{ GlobalTimeline timelinePage }
	s.mustQuery(t, "", `{ globalTimeline { `+timelineFields+` } }`, nil, &first)
	old := first.GlobalTimeline.Edges[0].Cursor
	for i := range 5 {
		s.post(t, u, fmt.Sprintf("new %d", i))
	}
	c := s.connect(t, protoTransportWS, "")
	c.subscribe("g", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": old})
	if ev := c.nextEvent("g"); ev.Kind != "RESYNC" || ev.Cursor == "" {
		t.Fatalf("first event = %+v, want RESYNC", ev)
	}
	c.subscribe("bad", `subscription { globalTimeline(after: "garbage") { kind } }`, nil)
	m := c.next()
	if !strings.Contains(string(m.Payload), "BAD_USER_INPUT") {
		t.Fatalf("malformed after: %+v, want BAD_USER_INPUT", m)
	}
}

func TestLogoutEndsThatSessionsSubscriptions(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			u := s.signup(t, "leaver")
			var other struct{ Login struct{ Token string } }
			s.mustQuery(t, "", `mutation($u: String!) { login(input: {username: $u, password: "correct horse"}) { token } }`,
				map[string]any{"u": u.Username}, &other)

			after := s.syncCursor(t, u)
			revoked := s.connect(t, proto, u.Token)
			revoked.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { kind } }`, map[string]any{"a": after})
			kept := s.connect(t, proto, other.Login.Token)
			kept.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
			s.post(t, u, "both see this")
			revoked.nextEvent("home")
			kept.nextEvent("home")

			s.mustQuery(t, u.Token, `mutation { logout }`, nil, new(any))
			waitClosed(t, revoked, "after logout")
			still := u
			still.Token = other.Login.Token
			s.post(t, still, "still live")
			if ev := kept.nextEvent("home"); ev.Post == nil || ev.Post.Body != "still live" {
				t.Fatalf("other session's subscription: %+v, want it to continue", ev)
			}
		})
	}
}

func TestManySubscriptionsLeakNoGoroutines(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "leaky")
	// Warm up: the first subscription starts the hub's long-lived goroutines.
	after := s.syncCursor(t, u)
	w := s.connect(t, protoTransportWS, u.Token)
	w.subscribe("w", `subscription($a: String) { globalTimeline(after: $a) { kind } }`, map[string]any{"a": after})
	s.post(t, u, "warm")
	w.nextEvent("w")
	w.conn.Close()
	time.Sleep(100 * time.Millisecond)
	base := warbleGoroutines()

	for i := range 60 {
		c := s.connect(t, protocols[i%2], u.Token)
		c.subscribe("h", `subscription { homeTimeline { kind } }`, nil)
		c.subscribe("g", `subscription { globalTimeline { kind } }`, nil)
		c.subscribe("u", `subscription($u: String!) { userPosts(username: $u) { kind } }`, map[string]any{"u": u.Username})
		if i%3 == 0 {
			c.stop("g")
		}
		c.conn.Close()
	}
	eventually(t, "goroutines return to where they were", func() bool {
		return warbleGoroutines() <= base+2
	})
}

func TestSlowSubscriberDoesNotStallOthers(t *testing.T) {
	// Small socket buffers on the server, or the kernel would hold every
	// event for the slow client and it would never fall behind. A long
	// write timeout keeps the slow client connected throughout (see
	// TestStalledClientIsDisconnected for what a short one does).
	//
	// The slow client's own receive buffer is the kernel's default, not
	// connectSlow's tiny one: the 1,000 events still overflow it, and a
	// tiny one makes its kernel drop a segment it has no room for. The
	// server's TCP then sends again only when a timer of its own fires
	// (retransmission, then window probes), and that timer has backed off
	// for as long as the client did not read: on a loaded machine, for
	// longer than a read waits.
	s := newTestServerOn(t, smallWriteBuffers, func(c *Config) { c.WriteTimeout = 2 * time.Minute })
	u := s.signup(t, "fast")
	after := s.syncCursor(t, u)
	slow := s.connect(t, protoTransportWS, "")
	slow.subscribe("g", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	fast := s.connect(t, protoTransportWS, "")
	fast.subscribe("g", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	s.post(t, u, "start")
	slow.nextEvent("g")
	fast.nextEvent("g")

	// The slow client stops reading; the fast one keeps up throughout.
	for i := range 1000 {
		body := fmt.Sprintf("p%d %s", i, strings.Repeat("🐢", 270))
		s.post(t, u, body)
		if ev := fast.nextEvent("g"); ev.Post == nil || ev.Post.Body != body {
			t.Fatalf("fast subscriber got %+v, want %q", ev, body)
		}
	}
	// When the slow one reads again, it has lost events and gets a RESYNC.
	// It sends a ping before each read: after seconds of a closed receive
	// window the server's TCP probes for it back off to many seconds
	// apart, and a segment from the client tells the server at once that
	// the window is open again.
	sawResync := false
	n := 0
	for range 2000 {
		slow.send(wsMessage{Type: "ping"})
		m, err := slow.read(readTimeout)
		if err != nil {
			t.Logf("slow subscriber after %d messages: %v", n, err)
			break
		}
		n++
		if ev := decodeEvent(t, m); ev.Kind == "RESYNC" {
			sawResync = true
			break
		}
	}
	if !sawResync {
		t.Fatal("the slow subscriber lost events without a RESYNC")
	}
}

// TestStalledClientIsDisconnected checks that a client that stops reading
// for longer than the write timeout is disconnected, and that its
// subscription is released with it: the hub's Redis subscription to the
// channel, which only that client wanted, goes away.
func TestStalledClientIsDisconnected(t *testing.T) {
	s := newTestServerOn(t, smallWriteBuffers, func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
	u := s.signup(t, "stalled")
	after := s.syncCursor(t, u)
	slow := s.connectSlow(t)
	slow.subscribe("g", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	s.post(t, u, "start")
	slow.nextEvent("g")

	rdb := s.redis.Client(t)
	numSub := func() int64 {
		n, err := redistest.NumSub(context.Background(), rdb, "w:ch:{w:global}")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := numSub(); n != 1 {
		t.Fatalf("subscribers of the global channel = %d, want the hub's 1", n)
	}
	// Enough to fill the socket buffers, so that a write blocks past the
	// timeout while the client reads nothing.
	for i := range 100 {
		s.post(t, u, fmt.Sprintf("p%d %s", i, strings.Repeat("🐢", 270)))
	}
	eventually(t, "the stalled client's subscription is released", func() bool { return numSub() == 0 })
	for range 200 {
		if _, err := slow.read(readTimeout); err != nil {
			return // closed by the server, after what the buffers held
		}
	}
	t.Fatal("the stalled client is still connected")
}

// TestLiveAcrossTwoServers runs two Warble servers on one Redis (on a Redis
// Cluster under REDISTEST_CLUSTER=1, where their hubs hold connections to
// the masters of the channels' slots): a post made through one server
// reaches live subscribers of the other, on the home, global and user
// timelines.
func TestLiveAcrossTwoServers(t *testing.T) {
	one := newTestServer(t)
	two := startTestServer(t, one.redis, one.app.cfg, nil)
	ada := one.signup(t, "ada")
	bob := one.signup(t, "bob")
	one.follow(t, ada, bob)
	// Subscribing after a known cursor: nothing after it can be missed,
	// however long the subscriptions take to start.
	after := one.syncCursor(t, bob)
	eventually(t, "the sync post reaches ada's home", func() bool {
		return len(one.home(t, ada, 1).Edges) == 1
	})
	c := two.connect(t, protoTransportWS, ada.Token)
	c.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	c.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	c.subscribe("bob", `subscription($u: String!, $a: String) { userPosts(username: $u, after: $a) { `+eventFields+` } }`,
		map[string]any{"u": bob.Username, "a": after})
	id := one.post(t, bob, "from the other server")
	got := map[string]bool{}
	for len(got) < 3 {
		m := c.next()
		ev := decodeEvent(t, m)
		if ev.Kind == "POST_ADDED" && ev.PostID != nil && *ev.PostID == id {
			got[m.ID] = true
		}
	}
}

// TestNewSubscriptionHasNoResyncAtItsStart: a subscription that starts on
// any timeline, with after: set to the newest cursor its client read or
// without after:, hears the next post as POST_ADDED, not a RESYNC and, from
// a cursor, not the post at that cursor again. Rounds start with the
// timeline's channel fresh (its last listener left the round before, so on
// a cluster its SSUBSCRIBE may follow its SUNSUBSCRIBE on one connection)
// and then with a listener that stays; each round's cursor is that of a
// post just written, which the channel may not have dispatched yet: then
// the new subscription got a RESYNC at its own cursor (see
// redisdb.TestHubResumeFromAPostNotDispatchedYet, which makes it happen
// every time).
func TestNewSubscriptionHasNoResyncAtItsStart(t *testing.T) {
	s := newTestServer(t)
	author := s.signup(t, "starter")
	reader := s.signup(t, "reader")
	s.follow(t, reader, author)
	s.post(t, reader, "mine") // in reader's home at once, whatever fan-out does
	feeds := []struct{ name, sub, page string }{
		{"global", `subscription($a: String) { globalTimeline(after: $a) { ` + eventFields + ` } }`,
			`{ globalTimeline(first: 1) { edges { cursor } } }`},
		{"home", `subscription($a: String) { homeTimeline(after: $a) { ` + eventFields + ` } }`,
			`{ homeTimeline(first: 1) { edges { cursor } } }`},
		{"user", `subscription($a: String) { userPosts(username: "` + author.Username + `", after: $a) { ` + eventFields + ` } }`,
			`{ user(username: "` + author.Username + `") { posts(first: 1) { edges { cursor } } } }`},
	}
	newest := func(page string) string {
		t.Helper()
		var out map[string]json.RawMessage
		s.mustQuery(t, reader.Token, page, nil, &out)
		for _, raw := range out {
			var p struct {
				Edges []struct{ Cursor string }
				Posts *struct{ Edges []struct{ Cursor string } }
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			if p.Posts != nil {
				p.Edges = p.Posts.Edges
			}
			if len(p.Edges) > 0 {
				return p.Edges[0].Cursor
			}
		}
		t.Fatalf("%s: no cursor", page)
		return ""
	}

	// Cursors are opaque to clients; this test may look inside.
	after := func(cursor, from string) bool {
		t.Helper()
		seq, err := warble.ParsePostCursor(cursor)
		fromSeq, err2 := warble.ParsePostCursor(from)
		if err != nil || err2 != nil {
			t.Fatalf("cursors %q, %q: %v, %v", cursor, from, err, err2)
		}
		return seq > fromSeq
	}

	const rounds = 10
	for round := range 2 * rounds {
		if round == rounds {
			// From now on the channels stay live between rounds.
			keep := s.connect(t, protoTransportWS, reader.Token)
			for _, f := range feeds {
				keep.subscribe(f.name, f.sub, nil)
			}
		}
		proto := protocols[round%2]
		body := fmt.Sprintf("round %d", round)
		s.post(t, author, body)
		c := s.connect(t, proto, reader.Token)
		cursors := map[string]string{}
		for _, f := range feeds {
			cursors[f.name+" after"] = newest(f.page)
			c.subscribe(f.name+" after", f.sub, map[string]any{"a": cursors[f.name+" after"]})
			c.subscribe(f.name, f.sub, nil)
		}
		// Once fan-out has delivered the round's post to reader's home,
		// the next post cannot overtake it there (which would be a RESYNC
		// of its own).
		eventually(t, body+" in reader's home", func() bool { return s.home(t, reader, 1).bodies()[0] == body })
		// Those from a cursor hear every later post however late they
		// start; those without after: the posts made once they have
		// started, which nothing tells their client. So a post is made
		// each second until every subscription has heard one, each once
		// fan-out has delivered the one before to reader's home, which it
		// could otherwise overtake there.
		msgs := make(chan wsMessage)
		go func() {
			defer close(msgs)
			for {
				m, err := c.read(readTimeout)
				if err != nil {
					return
				}
				msgs <- m
			}
		}()
		live := map[string]bool{}
		postLive := func() {
			body := fmt.Sprintf("round %d, live %d", round, len(live))
			live[s.post(t, author, body)] = true
			eventually(t, body+" in reader's home", func() bool { return s.home(t, reader, 1).bodies()[0] == body })
		}
		postLive()
		tick := time.NewTicker(time.Second)
		heard := map[string]bool{}
		for len(heard) < 2*len(feeds) {
			var m wsMessage
			select {
			case <-tick.C:
				if len(live) == 20 {
					t.Fatalf("round %d, %s: only %v heard a live post", round, proto, heard)
				}
				postLive()
				continue
			case got, ok := <-msgs:
				if !ok {
					t.Fatalf("round %d, %s: the websocket ended", round, proto)
				}
				m = got
			}
			if m.Type != "next" && m.Type != "data" {
				t.Fatalf("round %d, %s: got %s %s %s, want events", round, proto, m.Type, m.ID, m.Payload)
			}
			ev := decodeEvent(t, m)
			switch {
			case ev.Kind == "RESYNC":
				t.Fatalf("round %d, %s: %s got a RESYNC at %s", round, proto, m.ID, ev.Cursor)
			case strings.HasSuffix(m.ID, " after") && !after(ev.Cursor, cursors[m.ID]):
				t.Fatalf("round %d, %s: %s got %+v, at or before its cursor %s", round, proto, m.ID, ev, cursors[m.ID])
			case ev.PostID != nil && live[*ev.PostID]:
				heard[m.ID] = true
			}
			// The round's post may come first: without after:, the
			// subscription may have started before the channel
			// dispatched it; from a home timeline's cursor, the page
			// may have been read before fan-out delivered it there.
		}
		tick.Stop()
		c.conn.Close()
		for range msgs { // the reader ends with the connection
		}
	}
}
