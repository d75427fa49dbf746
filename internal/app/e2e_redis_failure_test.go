package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
)

// hangBound is the longest any request may take while Redis is down. It
// is a safety net that tells "fails at once" from "hangs until some far
// timeout", not a benchmark: the client settings of redisOptions answer in
// a small fraction of it.
const hangBound = 3 * time.Second

// unavailableMessage is what a client reads when Redis is out of reach
// (see unavailable in graph/errors.go).
const unavailableMessage = "The service is temporarily unavailable. Please try again."

// TestRedisFailureAndRecovery kills the redis-server under a running
// Warble and brings it back, empty, as a crash of a Redis without
// persistence would. What a client sees:
//
//   - While Redis is down, every query and mutation answers at once with
//     INTERNAL and unavailableMessage, and /healthz answers 503. Open
//     websockets stay open and quiet: a new subscription on a timeline
//     that is already live in this process is accepted, one that needs
//     Redis to start fails with the same error as a query. A new websocket
//     that signs in is refused at once, since its token cannot be checked.
//   - When Redis is back, the service recovers by itself: /healthz is 200
//     again, and every open subscription receives a RESYNC, then the live
//     events of new posts.
//   - Sessions lived in the lost data, so they are gone: the old token is
//     UNAUTHENTICATED, and a websocket signed in with it is closed, as a
//     logout closes it, instead of going on streaming a timeline whose
//     owner no longer exists (ids start again from 1, so it would soon be
//     somebody else's). With the embedded Redis, which keeps its data over
//     a restart, the session survives and its subscription goes on.
func TestRedisFailureAndRecovery(t *testing.T) {
	if os.Getenv("REDIS_URL") != "" {
		t.Skip("needs a Redis that the test can stop and restart, not REDIS_URL")
	}
	s := newTestServer(t)
	lost := !s.redis.Embedded() // a restarted redis-server is empty; the embedded one keeps its data
	client := &http.Client{Timeout: hangBound, Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	ada := signupAs(t, s, client, "ada_down")
	for i := range 3 {
		s.post(t, ada, fmt.Sprintf("before %d", i))
	}

	// Per protocol: an anonymous websocket with globalTimeline and
	// userPosts, and one signed in as ada with homeTimeline. Each resumes
	// after ada's last post, which all three timelines hold at the same
	// position, so the post below arrives however long they take to start.
	after := s.home(t, ada, 1).Edges[0].Cursor
	type stream struct {
		c  *opReader
		id string
	}
	var anon, signedIn []*opReader
	var streams []stream
	for _, proto := range protocols {
		a := newOpReader(s.connect(t, proto, ""))
		a.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
		a.subscribe("ada", `subscription($u: String!, $a: String) { userPosts(username: $u, after: $a) { `+eventFields+` } }`,
			map[string]any{"u": ada.Username, "a": after})
		h := newOpReader(s.connect(t, proto, ada.Token))
		h.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
		anon, signedIn = append(anon, a), append(signedIn, h)
		streams = append(streams, stream{a, "global"}, stream{a, "ada"}, stream{h, "home"})
	}
	// A post that every subscription receives proves them all live.
	id := s.post(t, ada, "live")
	for _, st := range streams {
		wantPostAdded(t, st.c, st.id, id, "live")
	}
	base := goroutines(client)
	t.Logf("goroutines with every subscription live: %d", base)

	s.redis.Stop(t)

	// Queries and mutations, signed in or not, over POST and GET.
	failing := []struct {
		name, token, query string
		vars               map[string]any
	}{
		{"globalTimeline", "", `{ globalTimeline { edges { cursor } } }`, nil},
		{"user", "", `query($u: String!) { user(username: $u) { id } }`, map[string]any{"u": ada.Username}},
		{"viewer (signed in)", ada.Token, `{ viewer { id } }`, nil},
		{"createPost", ada.Token, `mutation { createPost(input: {body: "lost"}) { post { id } } }`, nil},
		{"signup", "", `mutation { signup(input: {username: "cid_down", password: "correct horse"}) { token } }`, nil},
		{"login", "", `mutation($u: String!) { login(input: {username: $u, password: "correct horse"}) { token } }`, map[string]any{"u": ada.Username}},
	}
	for _, f := range failing {
		r, took := queryWithin(t, client, s, f.token, f.query, f.vars)
		wantUnavailable(t, f.name, r)
		t.Logf("%s with Redis down: %v", f.name, took)
	}
	r, took := getWithin(t, client, s.URL+"/graphql?query="+url.QueryEscape(`{ newestUsers { id } }`))
	wantUnavailable(t, "GET newestUsers", r)
	t.Logf("GET query with Redis down: %v", took)
	if code, took := healthz(t, client, s); code != http.StatusServiceUnavailable {
		t.Fatalf("healthz with Redis down = %d, want 503", code)
	} else {
		t.Logf("healthz with Redis down: %v", took)
	}

	// A burst at once: none waits on another, and none is left behind.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			token := ""
			if i%2 == 0 {
				token = ada.Token
			}
			r, _ := queryWithin(t, client, s, token, `{ globalTimeline { edges { cursor } } }`, nil)
			wantUnavailable(t, "a query of the burst", r)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Open websockets are still open and answer: a subscription that must
	// read Redis to start (a username to look up) fails like a query; one
	// on a timeline already live here starts, and hears of the recovery
	// with the others.
	for _, c := range anon {
		start := time.Now()
		c.subscribe("late-user", `subscription($u: String!) { userPosts(username: $u) { kind } }`, map[string]any{"u": ada.Username})
		errs := nextErrors(t, c, "late-user")
		if took := time.Since(start); took > hangBound {
			t.Fatalf("%s: userPosts subscription with Redis down answered after %v", c.proto, took)
		}
		if len(errs) == 0 || errs[0].Message != unavailableMessage || errs[0].Extensions["code"] != "INTERNAL" {
			t.Fatalf("%s: userPosts subscription with Redis down: %+v, want INTERNAL %q", c.proto, errs, unavailableMessage)
		}
		c.subscribe("late-global", `subscription { globalTimeline { `+eventFields+` } }`, nil)
		streams = append(streams, stream{c, "late-global"})
	}

	// A websocket that signs in needs Redis to check its token: it is
	// refused at once rather than left waiting, and not as a bad token
	// (4403, which clients take for an ended session) but with 1013, "try
	// again later", on graphql-transport-ws (connection_error on graphql-ws).
	for _, proto := range protocols {
		c, _, err := s.dialWS(t, proto, nil)
		if err != nil {
			t.Fatalf("%s: dial with Redis down: %v", proto, err)
		}
		start := time.Now()
		c.init(ada.Token)
		m, err := c.read(hangBound)
		if err == nil && m.Type != "connection_error" {
			t.Fatalf("%s: connection_init with a token and Redis down: %s %s, want it refused", proto, m.Type, m.Payload)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s: connection_init with a token and Redis down: no answer in %v", proto, hangBound)
		} else if ce := (*websocket.CloseError)(nil); errors.As(err, &ce) && ce.Code != 1013 {
			t.Fatalf("%s: connection_init with a token and Redis down: closed with %d, want 1013 (try again later)", proto, ce.Code)
		}
		t.Logf("%s: connection_init with a token and Redis down: refused after %v", proto, time.Since(start))
		c.conn.Close()
	}

	client.CloseIdleConnections()
	eventually(t, "no goroutines pile up while Redis is down", func() bool { return goroutines(client) <= base+10 })
	t.Logf("goroutines with Redis down: %d", goroutines(client))

	s.redis.Restart(t)
	start := time.Now()
	eventually(t, "healthz recovers", func() bool { code, _ := healthz(t, client, s); return code == http.StatusOK })
	t.Logf("healthz 200 again %v after Redis came back", time.Since(start))

	// Every open subscription hears that it may have missed events.
	for _, st := range streams {
		if st.id == "home" && lost {
			continue // see below
		}
		if ev := st.c.nextEvent(t, st.id); ev.Kind != "RESYNC" || ev.Cursor == "" || ev.PostID != nil {
			t.Fatalf("%s %s: first event after Redis came back = %+v, want RESYNC", st.c.proto, st.id, ev)
		}
	}
	t.Logf("every subscription had its RESYNC %v after Redis came back", time.Since(start))

	if lost {
		// The data is gone, ada's session with it.
		r, _ := queryWithin(t, client, s, ada.Token, `{ viewer { id } }`, nil)
		if r.code() != "UNAUTHENTICATED" {
			t.Fatalf("old token after the data was lost: %+v, want UNAUTHENTICATED", r.Errors)
		}
		for _, c := range signedIn {
			wantClosed(t, c)
		}
		// The same name in the same order gets the same id back, so the
		// userPosts subscription, which resolved the name to an id, goes
		// on with the new ada.
		again := signupAs(t, s, client, ada.Username)
		if again.ID != ada.ID {
			t.Fatalf("ada signed up again as %s, was %s: the test needs the id to come back", again.ID, ada.ID)
		}
		ada = again
	}
	id = s.post(t, ada, "after")
	for _, st := range streams {
		if st.id == "home" && lost {
			continue
		}
		wantPostAdded(t, st.c, st.id, id, "after")
	}
	t.Logf("live events flow again %v after Redis came back", time.Since(start))

	if r, _ := queryWithin(t, client, s, "", `{ globalTimeline { edges { node { body } } } }`, nil); len(r.Errors) > 0 {
		t.Fatalf("query after recovery: %+v", r.Errors)
	}
	client.CloseIdleConnections()
	eventually(t, "goroutines return to where they were", func() bool { return goroutines(client) <= base+5 })
	t.Logf("goroutines after the recovery: %d", goroutines(client))
}

// signupAs signs up a user with the given name.
func signupAs(t *testing.T, s *testServer, client *http.Client, name string) testUser {
	t.Helper()
	r, _ := queryWithin(t, client, s, "", `mutation($u: String!) { signup(input: {username: $u, password: "correct horse"}) { token user { id } } }`,
		map[string]any{"u": name})
	var out struct {
		Signup struct {
			Token string
			User  struct{ ID string }
		}
	}
	r.decode(t, &out)
	return testUser{ID: out.Signup.User.ID, Username: name, Token: out.Signup.Token}
}

// queryWithin POSTs a GraphQL request with client, failing t if it takes
// longer than hangBound, and returns the response and how long it took.
func queryWithin(t *testing.T, client *http.Client, s *testServer, token, query string, vars map[string]any) (gqlResponse, time.Duration) {
	t.Helper()
	return doWithin(t, client, s.request(token, query, vars))
}

// getWithin is queryWithin for a GET request.
func getWithin(t *testing.T, client *http.Client, u string) (gqlResponse, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return doWithin(t, client, req)
}

func doWithin(t *testing.T, client *http.Client, req *http.Request) (gqlResponse, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v (after %v)", req.Method, req.URL, err, time.Since(start))
		return gqlResponse{}, 0
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil {
		t.Errorf("%s %s: reading the body: %v (after %v)", req.Method, req.URL, err, took)
		return gqlResponse{}, took
	}
	var r gqlResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Errorf("%s %s: status %d, body %q is not JSON: %v", req.Method, req.URL, resp.StatusCode, raw, err)
	}
	r.Status = resp.StatusCode
	if bytes.Contains(bytes.ToLower(raw), []byte("redis")) || bytes.Contains(raw, []byte("goroutine ")) {
		t.Errorf("response leaks internals: %s", raw)
	}
	return r, took
}

// wantUnavailable checks that r is the error of a service whose Redis is
// down: no data, INTERNAL, and the sentence for it.
func wantUnavailable(t *testing.T, what string, r gqlResponse) {
	t.Helper()
	if len(r.Errors) == 0 {
		t.Errorf("%s with Redis down: no error, data %s", what, r.Data)
		return
	}
	for _, e := range r.Errors {
		if e.Extensions["code"] != "INTERNAL" || e.Message != unavailableMessage {
			t.Errorf("%s with Redis down: error %+v, want INTERNAL %q", what, e, unavailableMessage)
		}
	}
}

// healthz returns the status of GET /healthz and how long it took.
func healthz(t *testing.T, client *http.Client, s *testServer) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := client.Get(s.URL + "/healthz")
	if err != nil {
		t.Fatalf("healthz: %v (after %v)", err, time.Since(start))
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// goroutines counts the goroutines of the process, less the idle
// connections of client and the embedded Redis's own.
func goroutines(client *http.Client) int {
	client.CloseIdleConnections()
	return warbleGoroutines()
}

// wantPostAdded reads the next event of operation op on c and checks that
// it is the POST_ADDED of post id with body.
func wantPostAdded(t *testing.T, c *opReader, op, id, body string) {
	t.Helper()
	ev := c.nextEvent(t, op)
	if ev.Kind != "POST_ADDED" || ev.PostID == nil || *ev.PostID != id || ev.Post == nil || ev.Post.Body != body {
		t.Fatalf("%s %s: event %+v, want POST_ADDED of %s %q", c.proto, op, ev, id, body)
	}
}

// nextErrors reads the messages of operation op until one carries errors,
// and returns them. The two protocols carry them differently: an "error"
// message whose payload is the list (graphql-transport-ws) or one error
// (graphql-ws), or a "next"/"data" message with an errors field.
func nextErrors(t *testing.T, c *opReader, op string) []gqlError {
	t.Helper()
	for {
		m := c.next(t, op)
		switch m.Type {
		case "error":
			var list []gqlError
			if json.Unmarshal(m.Payload, &list) == nil {
				return list
			}
			var one gqlError
			if err := json.Unmarshal(m.Payload, &one); err != nil {
				t.Fatalf("%s: error payload %s: %v", c.proto, m.Payload, err)
			}
			return []gqlError{one}
		case "next", "data":
			var p struct{ Errors []gqlError }
			if err := json.Unmarshal(m.Payload, &p); err != nil || len(p.Errors) == 0 {
				t.Fatalf("%s: %s of %s is %s, want errors", c.proto, m.Type, op, m.Payload)
			}
			return p.Errors
		case "complete":
			t.Fatalf("%s: %s completed without an error", c.proto, op)
		}
	}
}

// wantClosed reads c until the server closes it, failing t on anything but
// a RESYNC before that.
func wantClosed(t *testing.T, c *opReader) {
	t.Helper()
	for {
		m, err := c.read()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("%s: %v, want the server to close the websocket", c.proto, err)
			}
			return
		}
		if m.Type == "complete" {
			continue
		}
		if m.Type != "next" && m.Type != "data" || !strings.Contains(string(m.Payload), "RESYNC") {
			t.Fatalf("%s: %s %s %s before the websocket closed, want at most a RESYNC", c.proto, m.Type, m.ID, m.Payload)
		}
	}
}

// opReader reads the messages of a websocket by operation, keeping those
// of other operations for later, since several subscriptions share one
// websocket and their events interleave.
type opReader struct {
	*wsClient
	queued map[string][]wsMessage
}

func newOpReader(c *wsClient) *opReader {
	return &opReader{wsClient: c, queued: make(map[string][]wsMessage)}
}

// next returns the next message of operation op.
func (r *opReader) next(t *testing.T, op string) wsMessage {
	t.Helper()
	if q := r.queued[op]; len(q) > 0 {
		r.queued[op] = q[1:]
		return q[0]
	}
	for {
		m, err := r.wsClient.read(readTimeout)
		if err != nil {
			t.Fatalf("%s: waiting for a message of %s: %v", r.proto, op, err)
		}
		if m.ID == op {
			return m
		}
		r.queued[m.ID] = append(r.queued[m.ID], m)
	}
}

// read returns the next message of any operation, queued ones first.
func (r *opReader) read() (wsMessage, error) {
	for op, q := range r.queued {
		if len(q) > 0 {
			r.queued[op] = q[1:]
			return q[0], nil
		}
	}
	return r.wsClient.read(readTimeout)
}

// nextEvent returns the next event of operation op.
func (r *opReader) nextEvent(t *testing.T, op string) timelineEvent {
	t.Helper()
	return decodeEvent(t, r.next(t, op))
}

// TestSignedInWebsocketWhileRevocationsUnheard: a server that started while
// the master of the revocations channel (w:ch:revoked) was frozen cannot hear
// a logout yet, so it cannot take a signed-in websocket, whose session's own
// master answers: its connection_init is refused with 1013 (try again later)
// once the transport's bound has passed (graph.Websocket.AckTimeout), rather
// than left waiting in WatchSession for that master, with no answer, for as
// long as it stays frozen. Anonymous websockets are served meanwhile.
func TestSignedInWebsocketWhileRevocationsUnheard(t *testing.T) {
	c := clusterWithAFrozenMaster(t)
	rs := c.Server()
	first := startTestServer(t, rs, testConfig(t), nil)
	revokedMaster, err := c.NodeOf(t.Context(), "w:ch:revoked")
	if err != nil {
		t.Fatal(err)
	}
	// A user whose session lives on another master.
	var u testUser
	for i := 0; ; i++ {
		u = first.signup(t, fmt.Sprintf("frozen%d", i))
		node, err := c.NodeOf(t.Context(), "w:u:{"+u.ID+"}")
		if err != nil {
			t.Fatal(err)
		}
		if node != revokedMaster {
			break
		}
	}

	if err := revokedMaster.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	// No visits recorded: their index may be on the frozen master, and
	// this test is about the revocations alone.
	s := startTestServer(t, rs, testConfig(t, func(c *Config) { c.InactiveAfter = -1 }), nil)
	t.Logf("a server started in %v with a master frozen", time.Since(started))
	// Thawed before the server stops, which would wait on it.
	t.Cleanup(func() { revokedMaster.Signal(syscall.SIGCONT) })

	s.connect(t, protoTransportWS, "")
	t.Logf("an anonymous websocket is acked")
	for _, proto := range protocols {
		ws, _, err := s.dialWS(t, proto, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ws.init(u.Token)
		m, err := ws.read(8 * hangBound)
		if err == nil && proto == protoLegacyWS && m.Type == "connection_error" {
			m, err = ws.read(2 * hangBound)
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 1013 {
			t.Fatalf("%s: connection_init with a token while revocations are unheard: %s %s %v after %v, want close 1013", proto, m.Type, m.Payload, err, time.Since(start))
		}
		t.Logf("%s: connection_init with a token while revocations are unheard: closed with 1013 after %v", proto, time.Since(start))
	}
}

// TestSignedInWebsocketWhileRedisFrozen: with the redis-server frozen
// (SIGSTOP: it accepts connections and answers nothing, as a host that
// stops answering does), a websocket that signs in cannot be checked, and
// its connection_init is refused with 1013 (try again later) once the
// transport's bound on it has passed (graph.Websocket.AckTimeout), rather
// than after go-redis's timeouts have run their course for each command
// the check makes. An anonymous one is acked: it needs no Redis.
func TestSignedInWebsocketWhileRedisFrozen(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "frozen")
	s.redis.Signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { s.redis.Signal(t, syscall.SIGCONT) })

	s.connect(t, protoTransportWS, "")
	for _, proto := range protocols {
		ws, _, err := s.dialWS(t, proto, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		ws.init(u.Token)
		m, err := ws.read(frozenBound)
		if err == nil && proto == protoLegacyWS && m.Type == "connection_error" {
			m, err = ws.read(frozenBound)
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != 1013 {
			t.Fatalf("%s: connection_init with a token and Redis frozen: %s %s %v after %v, want close 1013", proto, m.Type, m.Payload, err, time.Since(start))
		}
		t.Logf("%s: connection_init with a token and Redis frozen: closed with 1013 after %v", proto, time.Since(start))
	}
}

// frozenBound is the longest a signed-in connection_init may wait while
// Redis does not answer: the transport's 5 s bound and slack. Like
// hangBound it is a safety net, not a benchmark.
const frozenBound = 8 * time.Second

// TestSignedInRequestWhileTheSeenIndexIsFrozen: a signed-in request records
// the user's visit, in the user's slot and in a seen index that may be on
// another master. With that master frozen, the request is answered
// without waiting for it: the record is best effort, and finishes in the
// background (see redisdb's seenSoon).
func TestSignedInRequestWhileTheSeenIndexIsFrozen(t *testing.T) {
	c := clusterWithAFrozenMaster(t)
	rs := c.Server()
	cfg := testConfig(t)
	first := startTestServer(t, rs, cfg, nil)
	shards := cfg.FanoutShards
	if shards == 0 {
		shards = redisdb.DefaultClusterFanOutShards
	}
	// A user whose keys and seen index are on different masters.
	var u testUser
	var indexMaster *redistest.ClusterNode
	for i := 0; indexMaster == nil; i++ {
		u = first.signup(t, fmt.Sprintf("away%d", i))
		home, err := c.NodeOf(t.Context(), redisdb.Layout{}.User(u.ID))
		if err != nil {
			t.Fatal(err)
		}
		index, err := c.NodeOf(t.Context(), redisdb.Layout{}.SeenIndex(u.ID, shards))
		if err != nil {
			t.Fatal(err)
		}
		if index != home {
			indexMaster = index
		}
	}
	// Another server, which has not recorded the user's visit yet. Its
	// cluster client loads the slot map at its first read: made before
	// the freeze, since it asks the nodes one after another and would
	// wait out the frozen one's read timeout if it asked that one first.
	s := startTestServer(t, rs, cfg, nil)
	var found struct{ User struct{ ID string } }
	s.mustQuery(t, "", `query($u: String!) { user(username: $u) { id } }`, map[string]any{"u": u.Username}, &found)

	if err := indexMaster.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Thawed before the servers stop, which would wait on it.
	t.Cleanup(func() { indexMaster.Signal(syscall.SIGCONT) })
	type result struct {
		id  string
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, err := http.DefaultClient.Do(s.request(u.Token, `{ viewer { id } }`, nil))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var out struct {
			Data struct{ Viewer struct{ ID string } }
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		done <- result{id: out.Data.Viewer.ID, err: err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.id != u.ID {
			t.Fatalf("viewer with the seen index's master frozen = %q, %v; want %s", r.id, r.err, u.ID)
		}
		t.Logf("a signed-in request was answered in %v with the seen index's master frozen", time.Since(start))
	case <-time.After(hangBound):
		t.Fatalf("a signed-in request has not been answered after %v with the seen index's master frozen", hangBound)
	}
}

// clusterWithAFrozenMaster starts a Redis Cluster of its own for a test that
// freezes one of its masters (SIGSTOP): the other masters take the frozen
// one for failed only after a minute, and the cluster stays up for the
// slots they serve meanwhile. It skips on the embedded Redis, and where
// redis-server is missing outside CI.
func clusterWithAFrozenMaster(t *testing.T) *redistest.Cluster {
	t.Helper()
	if os.Getenv("REDISTEST_EMBEDDED") == "1" {
		t.Skip("needs redis-server processes for a Redis Cluster")
	}
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") == "" {
		t.Skip("needs redis-server for a Redis Cluster")
	}
	return redistest.NewCluster(t, redistest.ClusterOptions{NodeTimeout: time.Minute})
}
