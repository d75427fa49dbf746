package app

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
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

// TestExpiredSessionEndsItsWebsocket uses sessions that last 3 seconds
// unused. A websocket whose session nobody uses is closed when the session
// expires; one whose token is in use elsewhere stays open past that time.
func TestExpiredSessionEndsItsWebsocket(t *testing.T) {
	const ttl = 3 * time.Second
	s := newTestServer(t, func(c *Config) { c.SessionTTL = ttl })
	// Each websocket connects right after its signup, and busy's token is
	// in use from then on, so that a slow machine cannot let a session
	// expire before the test means it to.
	idle := s.signup(t, "idle")
	idleWS := s.connect(t, protoTransportWS, idle.Token)
	idleWS.subscribe("home", `subscription { homeTimeline { kind } }`, nil)
	busy := s.signup(t, "busy")
	stop := make(chan struct{})
	used := make(chan struct{})
	go func() {
		defer close(used)
		for {
			select {
			case <-stop:
				return
			case <-time.After(ttl / 6):
				s.query(t, busy.Token, `{ viewer { id } }`, nil)
			}
		}
	}()
	after := s.syncCursor(t, busy)
	busyWS := s.connect(t, protoLegacyWS, busy.Token)
	busyWS.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})

	waitClosed(t, idleWS, "idle session's websocket")

	// The busy session's websocket is still open and live.
	s.post(t, busy, "still live")
	if ev := busyWS.nextEvent("home"); ev.Post == nil || ev.Post.Body != "still live" {
		t.Fatalf("the busy session's subscription got %+v, want it live", ev)
	}
	// Once its token rests too, it ends as well.
	close(stop)
	<-used
	waitClosed(t, busyWS, "busy session's websocket after it rested")
}

// connectWithHeader opens a websocket whose token travels in the
// handshake's Authorization header, as non-browser clients may send it, and
// an empty connection_init payload.
func (s *testServer) connectWithHeader(t *testing.T, proto, token string) *wsClient {
	t.Helper()
	c, _, err := s.dialWS(t, proto, http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		t.Fatalf("dial %s: %v", proto, err)
	}
	c.init("")
	if m := c.next(); m.Type != "connection_ack" {
		t.Fatalf("after connection_init got %+v, want connection_ack", m)
	}
	return c
}

// TestHeaderAuthenticatedWebsocketEndsWithItsSession: a websocket that
// authenticated with the handshake's Authorization header is watched like
// one that sent its token in connection_init: logout, logoutEverywhere and
// expiry each close it with 4403.
func TestHeaderAuthenticatedWebsocketEndsWithItsSession(t *testing.T) {
	ends := map[string]func(s *testServer, u testUser){
		"logout": func(s *testServer, u testUser) {
			s.mustQuery(t, u.Token, `mutation { logout }`, nil, new(any))
		},
		"logoutEverywhere": func(s *testServer, u testUser) {
			s.mustQuery(t, u.Token, `mutation { logoutEverywhere }`, nil, new(any))
		},
		"expiry": func(*testServer, testUser) {}, // the session rests until it expires
	}
	for _, proto := range protocols {
		for name, end := range ends {
			t.Run(proto+"/"+name, func(t *testing.T) {
				ttl := time.Hour
				if name == "expiry" {
					ttl = 3 * time.Second
				}
				s := newTestServer(t, func(c *Config) { c.SessionTTL = ttl })
				u := s.signup(t, "header")
				after := s.syncCursor(t, u)
				c := s.connectWithHeader(t, proto, u.Token)
				c.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
				if name != "expiry" {
					s.post(t, u, "seen live")
					if ev := c.nextEvent("home"); ev.Post == nil || ev.Post.Body != "seen live" {
						t.Fatalf("header-authenticated subscription got %+v, want the post", ev)
					}
				}
				end(s, u)
				waitClosed(t, c, "header-authenticated websocket after "+name)
			})
		}
	}
}

// TestBadHeaderTokenClosesWebsocketWith4403: a bad token in the handshake's
// header is refused as one in connection_init is.
func TestBadHeaderTokenClosesWebsocketWith4403(t *testing.T) {
	s := newTestServer(t)
	c, _, err := s.dialWS(t, protoTransportWS, http.Header{"Authorization": {"Bearer not-a-real-token"}})
	if err != nil {
		t.Fatal(err)
	}
	c.init("")
	waitClosed(t, c, "websocket with a bad header token")
}

// TestOldFormTokenWorksUntilRevoked stores a session as Warble did before
// tokens named their user (the secret alone, its session at
// w:session:<sha256>): the token still signs requests and websockets in,
// and its logout ends both.
func TestOldFormTokenWorksUntilRevoked(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "veteran")
	b := make([]byte, 32)
	rand.Read(b)
	token := base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	sha := hex.EncodeToString(sum[:])
	ctx := context.Background()
	client := s.app.db.Client()
	key := "w:session:" + sha // the old layout, which no new session uses
	if err := client.HSet(ctx, key, "userID", u.ID, "createdAt", time.Now().UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Expire(ctx, key, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.SAdd(ctx, "w:u:{"+u.ID+"}:sessions", sha).Err(); err != nil {
		t.Fatal(err)
	}

	var out struct{ Viewer struct{ ID, Username string } }
	s.mustQuery(t, token, `{ viewer { id username } }`, nil, &out)
	if out.Viewer.ID != u.ID || out.Viewer.Username != u.Username {
		t.Fatalf("viewer with an old-form token = %+v, want %s", out.Viewer, u.Username)
	}
	after := s.syncCursor(t, u)
	ws := s.connect(t, protoTransportWS, token)
	ws.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { kind } }`, map[string]any{"a": after})
	old := u
	old.Token = token
	s.post(t, old, "signed in with an old-form token")
	ws.nextEvent("home") // live before the logout
	s.mustQuery(t, token, `mutation { logout }`, nil, new(any))
	waitClosed(t, ws, "websocket of an old-form token after its logout")
	if r := s.query(t, token, `{ viewer { id } }`, nil); r.code() != "UNAUTHENTICATED" {
		t.Errorf("old-form token after logout: code %q, want UNAUTHENTICATED", r.code())
	}
	if r := s.query(t, u.Token, `{ viewer { id } }`, nil); r.code() != "" {
		t.Errorf("the user's other session after the old one's logout: code %q", r.code())
	}
}
