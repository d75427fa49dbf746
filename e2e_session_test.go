package main

import (
	"errors"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// waitClosed reads c until the server closes it with 4403, as for a bad
// token, failing t if an event arrives first.
func waitClosed(t *testing.T, c *wsClient, what string) {
	t.Helper()
	for {
		m, err := c.read(readTimeout)
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("%s: %v, want the server to close the websocket", what, err)
			}
			if ce.Code != 4403 {
				t.Fatalf("%s: closed with %d %q, want 4403", what, ce.Code, ce.Text)
			}
			return
		}
		if m.Type == "next" || m.Type == "data" {
			t.Fatalf("%s: event %+v while the websocket should close", what, m)
		}
	}
}

func TestLogoutEverywhereEndsEverySession(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "everywhere")
	var login struct{ Login struct{ Token string } }
	s.mustQuery(t, "", `mutation($u: String!) { login(input: {username: $u, password: "correct horse"}) { token } }`,
		map[string]any{"u": u.Username}, &login)
	other := s.signup(t, "bystander")

	var sockets []*wsClient
	for i, token := range []string{u.Token, login.Login.Token} {
		c := s.connect(t, protocols[i], token)
		c.subscribe("home", `subscription { homeTimeline { kind } }`, nil)
		sockets = append(sockets, c)
	}
	after := s.syncCursor(t, other)
	kept := s.connect(t, protoTransportWS, other.Token)
	kept.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})

	var out struct{ LogoutEverywhere int }
	s.mustQuery(t, login.Login.Token, `mutation { logoutEverywhere }`, nil, &out)
	if out.LogoutEverywhere != 2 {
		t.Fatalf("logoutEverywhere = %d, want 2 sessions", out.LogoutEverywhere)
	}
	for i, c := range sockets {
		waitClosed(t, c, c.proto)
		if r := s.query(t, []string{u.Token, login.Login.Token}[i], `{ viewer { id } }`, nil); r.code() != "UNAUTHENTICATED" {
			t.Errorf("token %d after logoutEverywhere: code %q, want UNAUTHENTICATED", i, r.code())
		}
	}
	s.post(t, other, "still here")
	if ev := kept.nextEvent("home"); ev.Post == nil || ev.Post.Body != "still here" {
		t.Fatalf("another user's subscription got %+v, want it to go on", ev)
	}
}

// TestExpiredSessionEndsItsWebsocket uses sessions that last 1.5 seconds
// unused. A websocket whose session nobody uses is closed when the session
// expires; one whose token is in use elsewhere stays open past that time.
func TestExpiredSessionEndsItsWebsocket(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	s := newTestServer(t, func(c *config) { c.SessionTTL = ttl })
	idle := s.signup(t, "idle")
	busy := s.signup(t, "busy")
	idleWS := s.connect(t, protoTransportWS, idle.Token)
	idleWS.subscribe("home", `subscription { homeTimeline { kind } }`, nil)
	after := s.syncCursor(t, busy)
	busyWS := s.connect(t, protoLegacyWS, busy.Token)
	busyWS.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})

	// Use busy's token for twice the lifetime; idle's is left alone.
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 5) {
		s.mustQuery(t, busy.Token, `{ viewer { id } }`, nil, new(any))
	}
	waitClosed(t, idleWS, "idle session's websocket")

	// The busy session's websocket is still open and live.
	s.post(t, busy, "still live")
	if ev := busyWS.nextEvent("home"); ev.Post == nil || ev.Post.Body != "still live" {
		t.Fatalf("the busy session's subscription got %+v, want it live", ev)
	}
	// Once its token rests too, it ends as well.
	waitClosed(t, busyWS, "busy session's websocket after it rested")
}
