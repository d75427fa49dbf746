package app

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/warble/warble/graph"
	"github.com/warble/warble/internal/redistest"
)

// TestIdleSubscriptionsHoldNoGoroutine opens many sockets with two
// subscriptions each and checks, once every subscription has delivered an
// event and gone idle again, that the server holds one goroutine per
// socket (its reader) and none per subscription. gqlgen's transport held
// three per socket with one subscription, and one more per subscription.
func TestIdleSubscriptionsHoldNoGoroutine(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "idler")
	// Warm up: the first subscription starts the hub's long-lived goroutines.
	after := s.syncCursor(t, u)
	w := s.connect(t, protoTransportWS, u.Token)
	w.subscribe("w", `subscription($a: String) { globalTimeline(after: $a) { kind } }`, map[string]any{"a": after})
	s.post(t, u, "warm")
	w.nextEvent("w")
	time.Sleep(100 * time.Millisecond)
	base := warbleGoroutines()

	const sockets = 100
	clients := make([]*wsClient, sockets)
	for i := range clients {
		c := s.connect(t, protocols[i%2], u.Token)
		c.subscribe("g", `subscription($a: String) { globalTimeline(after: $a) { kind } }`, map[string]any{"a": after})
		c.subscribe("u", `subscription($u: String!, $a: String) { userPosts(username: $u, after: $a) { kind } }`,
			map[string]any{"u": u.Username, "a": after})
		clients[i] = c
	}
	// Every subscription is live: each gets the warm-up post (replayed)
	// and a new one.
	s.post(t, u, "to all")
	for _, c := range clients {
		seen := map[string]int{}
		for seen["g"] < 2 || seen["u"] < 2 {
			m := c.next()
			if m.Type != "next" && m.Type != "data" {
				t.Fatalf("got %s %s %s, want events", m.Type, m.ID, m.Payload)
			}
			seen[m.ID]++
		}
	}
	// Slack for the goroutines that come and go anyway: the hub's
	// deliveries finishing, go-redis's pool.
	const slack = 20
	eventually(t, "the idle sockets hold one goroutine each", func() bool {
		return warbleGoroutines()-base <= sockets+slack
	})
	t.Logf("%d goroutines for %d sockets with %d subscriptions", warbleGoroutines()-base, sockets, 2*sockets)
}

// TestWebsocketDuplicateOperationID: graphql-transport-ws closes a
// connection that starts an operation under an id already running with
// 4409; the legacy protocol replaces the operation, as its servers did.
// An id too long for the close frame's reason (a control frame carries at
// most 125 bytes) still gets its 4409.
func TestWebsocketDuplicateOperationID(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "dup")
	after := s.syncCursor(t, u)
	const sub = `subscription($a: String) { globalTimeline(after: $a) { ` + eventFields + ` } }`
	for _, opID := range []string{"g", strings.Repeat("é", 200)} {
		c := s.connect(t, protoTransportWS, "")
		c.subscribe(opID, sub, map[string]any{"a": after})
		c.subscribe(opID, sub, map[string]any{"a": after})
		for {
			_, err := c.read(readTimeout)
			if err != nil {
				var ce *websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != 4409 {
					t.Fatalf("after a duplicate id of %d bytes: %v, want close 4409", len(opID), err)
				}
				break
			}
		}
	}

	legacy := s.connect(t, protoLegacyWS, "")
	legacy.subscribe("g", sub, map[string]any{"a": after})
	legacy.subscribe("g", sub, map[string]any{"a": after})
	id := s.post(t, u, "once")
	for {
		ev := legacy.nextEvent("g")
		if ev.PostID != nil && *ev.PostID == id {
			break
		}
	}
	// The replaced subscription sends nothing more: the next message is
	// the one new event.
	id = s.post(t, u, "and again")
	if ev := legacy.nextEvent("g"); ev.PostID == nil || *ev.PostID != id {
		t.Fatalf("after the replacement got %+v, want post %s once", ev, id)
	}
}

// TestWebsocketQueriesAndMutations: operations other than subscriptions
// run over the socket as the signed-in user, with the same errors and
// codes as over HTTP.
func TestWebsocketQueriesAndMutations(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			u := s.signup(t, "socketeer")
			c := s.connect(t, proto, u.Token)
			result := func(id string) string {
				t.Helper()
				m := c.next()
				if m.ID != id || (m.Type != "next" && m.Type != "data") {
					t.Fatalf("got %s %s %s, want the result of %s", m.Type, m.ID, m.Payload, id)
				}
				if done := c.next(); done.Type != "complete" || done.ID != id {
					t.Fatalf("after the result of %s: %s %s, want complete", id, done.Type, done.ID)
				}
				return string(m.Payload)
			}
			c.subscribe("viewer", `{ viewer { username } }`, nil)
			if got := result("viewer"); !strings.Contains(got, `"username":"`+u.Username+`"`) {
				t.Fatalf("viewer over the socket: %s", got)
			}
			c.subscribe("post", `mutation($b: String!) { createPost(input: {body: $b}) { post { body } } }`, map[string]any{"b": "by socket"})
			if got := result("post"); !strings.Contains(got, `"body":"by socket"`) {
				t.Fatalf("createPost over the socket: %s", got)
			}
			c.subscribe("empty", `mutation { createPost(input: {body: ""}) { post { id } } }`, nil)
			if got := result("empty"); !strings.Contains(got, `"code":"BAD_USER_INPUT"`) {
				t.Fatalf("createPost of an empty body over the socket: %s, want BAD_USER_INPUT", got)
			}
		})
	}
}

// TestHubCloseCompletesSubscriptions: when the server's hub closes (the
// server is stopping), each subscription hears complete. The socket is
// anonymous: closing the hub also ends its session watches, which would
// close a signed-in socket (a server stopping closes its sockets first,
// see graph.WithWebsocketLifetime).
func TestHubCloseCompletesSubscriptions(t *testing.T) {
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			s := newTestServer(t)
			u := s.signup(t, "closer")
			after := s.syncCursor(t, u)
			c := s.connect(t, proto, "")
			c.subscribe("user", `subscription($u: String!, $a: String) { userPosts(username: $u, after: $a) { kind } }`,
				map[string]any{"u": u.Username, "a": after})
			c.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { kind } }`, map[string]any{"a": after})
			s.post(t, u, "live")
			got := map[string]bool{}
			for len(got) < 2 {
				got[c.next().ID] = true
			}
			s.app.hub.Close()
			completed := map[string]bool{}
			for len(completed) < 2 {
				m := c.next()
				if m.Type != "complete" {
					t.Fatalf("got %s %s %s, want complete", m.Type, m.ID, m.Payload)
				}
				completed[m.ID] = true
			}
		})
	}
}

// TestWebsocketOperationLimit: a websocket runs at most
// graph.MaxWebsocketOperations operations at once, so that one socket,
// past the handshake's rate limit, cannot hold subscriptions without end.
// One more is refused with an error message and BAD_USER_INPUT, the socket
// stays open, and once an operation ends another may start.
func TestWebsocketOperationLimit(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "many")
	const sub = `subscription($a: String) { globalTimeline(after: $a) { ` + eventFields + ` } }`
	for _, proto := range protocols {
		// From a cursor, so that a subscription that starts after the
		// post below still has it, replayed.
		vars := map[string]any{"a": s.syncCursor(t, u)}
		c := s.connect(t, proto, "")
		// The next message but RESYNCs, which the hub may send any time
		// (on a Redis Cluster, when its connection is made anew).
		next := func() wsMessage {
			for {
				m := c.next()
				if (m.Type != "next" && m.Type != "data") || !strings.Contains(string(m.Payload), `"RESYNC"`) {
					return m
				}
			}
		}
		for i := range graph.MaxWebsocketOperations {
			c.subscribe(strconv.Itoa(i), sub, vars)
		}
		c.subscribe("one more", sub, vars)
		m := next()
		if m.Type != "error" || m.ID != "one more" || !strings.Contains(string(m.Payload), `"BAD_USER_INPUT"`) {
			t.Fatalf("%s: operation %d got %s %s %s, want an error with BAD_USER_INPUT", proto, graph.MaxWebsocketOperations+1, m.Type, m.ID, m.Payload)
		}
		// The server handles a connection's messages in order: "again"
		// starts once 0 has made room, whether or not the client heard
		// of it (the legacy protocol answers a stop with complete).
		c.stop("0")
		if proto == protoLegacyWS {
			if m := next(); m.Type != "complete" || m.ID != "0" {
				t.Fatalf("%s: after stopping 0 got %s %s %s, want complete 0", proto, m.Type, m.ID, m.Payload)
			}
		}
		c.subscribe("again", sub, vars)
		if proto != protoLegacyWS {
			// The stop of 0 handled before the post (above, its complete
			// says so): else 0 could still take it.
			c.settle()
		}
		id := s.post(t, u, "to every subscription of "+proto)
		seen := map[string]bool{}
		for len(seen) < graph.MaxWebsocketOperations {
			ev := next()
			if ev.Type != "next" && ev.Type != "data" || !strings.Contains(string(ev.Payload), id) || ev.ID == "0" {
				t.Fatalf("%s: got %s %s %s, want post %s on each running subscription", proto, ev.Type, ev.ID, ev.Payload, id)
			}
			seen[ev.ID] = true
		}
		if !seen["again"] {
			t.Fatalf("%s: the subscription started after one stopped got no event", proto)
		}
	}
}

// TestCompleteByClientIsNotEchoed: on graphql-transport-ws a client's
// complete ends its operation and the server sends nothing more for it,
// complete included (the protocol's Complete, and what graphql-ws's own
// server does), so that a client may start a new operation under the same
// id at once: an echoed complete would reach it after that new subscribe
// and end the new operation on the client. The legacy protocol's servers
// answer a stop with complete, and Warble does as they did.
func TestCompleteByClientIsNotEchoed(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "quiet")
	const sub = `subscription($a: String) { globalTimeline(after: $a) { ` + eventFields + ` } }`
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			after := s.syncCursor(t, u)
			c := s.connect(t, proto, "")
			c.subscribe("g", sub, map[string]any{"a": after})
			c.stop("g")
			// The same id again, in the same breath: the server reads a
			// connection's messages in order, so everything it sends for
			// the first operation comes before the second's events.
			c.subscribe("g", sub, map[string]any{"a": after})
			// The post is made once the server has handled all three
			// (the legacy stop's complete, or a ping's pong, says so):
			// before, the first operation could still take it.
			if proto == protoLegacyWS {
				for {
					m := c.next()
					if m.Type == "complete" && m.ID == "g" {
						break
					}
					// A RESYNC of the first operation may come first, if
					// the hub's connection to Redis was renewed meanwhile
					// (a busy machine).
					if ev := eventOf(t, m); m.ID != "g" || ev.Kind != "RESYNC" {
						t.Fatalf("after stop: %s %s %s, want complete", m.Type, m.ID, m.Payload)
					}
				}
			} else {
				c.settle()
			}
			id := s.post(t, u, "after a complete, on "+proto)
			for {
				ev := c.nextEvent("g")
				if ev.Kind == "RESYNC" {
					continue // as above
				}
				if ev.PostID == nil || *ev.PostID != id {
					t.Fatalf("the operation started again under its id got %+v, want post %s", ev, id)
				}
				break
			}
		})
	}
}

// TestShutdownClosesWebsocketsWithGoingAway: a server that stops sends every
// open websocket, signed in or not, on either protocol, a close frame with
// 1001 (going away), and Serve returns only once those frames are written
// and the connections closed, so that a process exiting right after does
// not cut them short (its clients would see an abnormal closure, 1006).
// The server's connections write close frames slowly here, as on a slow
// network: a Serve that did not wait for them returns first.
func TestShutdownClosesWebsocketsWithGoingAway(t *testing.T) {
	rs := redistest.New(t)
	a := newTestApp(t, rs, testConfig(t))
	t.Cleanup(func() { a.Close() })
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &closeFrameListener{Listener: inner}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	s := &testServer{URL: "http://" + inner.Addr().String(), app: a, redis: rs}

	u := s.signup(t, "leaving")
	after := s.syncCursor(t, u)
	var clients []*wsClient
	for _, proto := range protocols {
		anon := s.connect(t, proto, "")
		anon.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
		home := s.connect(t, proto, u.Token)
		home.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
		clients = append(clients, anon, home)
	}
	id := s.post(t, u, "before the shutdown")
	for _, c := range clients {
		m := c.next()
		if (m.Type != "next" && m.Type != "data") || !strings.Contains(string(m.Payload), id) {
			t.Fatalf("%s: got %s %s %s, want post %s", c.proto, m.Type, m.ID, m.Payload, id)
		}
	}

	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if sent, written := ln.closeFrames(); sent != len(clients) || written != len(clients) {
		t.Fatalf("when Serve returned, %d close frames were begun and %d written, want %d of each", sent, written, len(clients))
	}
	for _, c := range clients {
		for {
			_, err := c.read(readTimeout)
			if err == nil {
				continue // a complete of a legacy subscription, a keep-alive
			}
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
				t.Fatalf("%s: after the shutdown: %v, want close 1001 (going away)", c.proto, err)
			}
			break
		}
	}
}

// closeFrameListener's connections write websocket close frames slowly,
// and count them.
type closeFrameListener struct {
	net.Listener
	begun, written atomic.Int32
}

func (l *closeFrameListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &closeFrameConn{Conn: conn, l: l}, nil
}

func (l *closeFrameListener) closeFrames() (begun, written int) {
	return int(l.begun.Load()), int(l.written.Load())
}

type closeFrameConn struct {
	net.Conn
	l *closeFrameListener
}

// Write delays a close frame from the server (final, opcode 8, unmasked:
// gorilla/websocket writes a control frame in one Write).
func (c *closeFrameConn) Write(p []byte) (int, error) {
	if len(p) < 2 || p[0] != 0x88 {
		return c.Conn.Write(p)
	}
	c.l.begun.Add(1)
	time.Sleep(200 * time.Millisecond)
	n, err := c.Conn.Write(p)
	if err == nil {
		c.l.written.Add(1)
	}
	return n, err
}

// TestErrorEndsOperation: on graphql-transport-ws an error message ends its
// operation, and nothing follows it (the protocol's Error; graphql-ws's
// server sends no complete after one), so that a client may start another
// operation under the same id as soon as it hears the error: neither a late
// complete nor a close for a duplicate id (4409) may meet it.
func TestErrorEndsOperation(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "erring")
	const sub = `subscription($a: String) { globalTimeline(after: $a) { ` + eventFields + ` } }`
	c := s.connect(t, protoTransportWS, "")
	for round := range 20 {
		after := s.syncCursor(t, u)
		c.subscribe("x", `subscription { noSuchField }`, nil)
		if m := c.next(); m.Type != "error" || m.ID != "x" {
			t.Fatalf("round %d: an invalid subscription got %s %s %s, want error", round, m.Type, m.ID, m.Payload)
		}
		c.subscribe("x", sub, map[string]any{"a": after})
		id := s.post(t, u, "after an error")
		if ev := c.nextEvent("x"); ev.PostID == nil || *ev.PostID != id {
			t.Fatalf("round %d: the operation started again under its id got %+v first, want post %s", round, ev, id)
		}
		c.stop("x")
		// Else the next round's sync post may reach this operation
		// before the server has read its complete.
		c.settle()
	}
}
