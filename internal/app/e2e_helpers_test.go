package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
)

// testServer is Warble's real HTTP handler on a real Redis.
type testServer struct {
	URL   string
	app   *App
	redis *redistest.Server
}

// newTestServer starts Warble for t. change may adjust the configuration.
func newTestServer(t testing.TB, change ...func(*Config)) *testServer {
	t.Helper()
	return newTestServerOn(t, nil, change...)
}

// newTestServerOn is newTestServer with the listener wrapped by wrap, if not nil.
func newTestServerOn(t testing.TB, wrap func(net.Listener) net.Listener, change ...func(*Config)) *testServer {
	t.Helper()
	return startTestServer(t, redistest.New(t), testConfig(t, change...), wrap)
}

// testConfig is the configuration of a test server, changed by change.
// Under WARBLE_TEST_ARCHIVE=1 it has an archive (see withArchive) unless
// change set one.
func testConfig(t testing.TB, change ...func(*Config)) Config {
	t.Helper()
	cfg, err := ParseConfig(nil, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	cfg.BcryptCost = bcrypt.MinCost
	// Tests sign up and post far faster than people do; the rate limit
	// tests turn the limits back on.
	cfg.RateLimitsOn = false
	for _, f := range change {
		f(&cfg)
	}
	if archiveEverywhere() && cfg.Archive == nil {
		withArchive, _ := withArchive(t, archiveTestPostsInRedis)
		withArchive(&cfg)
	}
	return cfg
}

// startTestServer starts Warble with cfg on rs, the Redis of another test
// server too, for tests of two Warbles on one Redis.
func startTestServer(t testing.TB, rs *redistest.Server, cfg Config, wrap func(net.Listener) net.Listener) *testServer {
	t.Helper()
	a := newTestApp(t, rs, cfg)
	hs := httptest.NewUnstartedServer(a.handler)
	if wrap != nil {
		hs.Listener = wrap(hs.Listener)
	}
	hs.Start()
	t.Cleanup(func() {
		a.Close()
		hs.CloseClientConnections()
		hs.Close()
	})
	return &testServer{URL: hs.URL, app: a, redis: rs}
}

// waitFirstPass waits until the first fan-out worker has made its first
// pass over the database. That pass backfills indexes of a database that
// holds data, once, on the worker's own time (see
// redisdb.WorkerOptions.FirstPass), so a test that compares Redis before
// and after a request calls this before its first snapshot: the pass's
// writes would otherwise be taken for the request's. Not every test can
// wait for it: one that starts a server with a master frozen gets no
// pass until it thaws.
func (s *testServer) waitFirstPass(t testing.TB) {
	t.Helper()
	select {
	case <-s.app.firstPass:
	case <-time.After(30 * time.Second):
		t.Fatal("the first fan-out worker made no first pass in 30s")
	}
}

// newTestApp is Warble with cfg on rs, not serving yet.
func newTestApp(t testing.TB, rs *redistest.Server, cfg Config) *App {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// The client has production's settings (see redisOptions), which
	// decide how requests behave when Redis fails, and redistest's check
	// of Redis Cluster hash slots.
	var client redis.UniversalClient
	if opts := rs.ClusterOptions(); opts != nil {
		client = redis.NewClusterClient(clusterOptions(opts))
	} else {
		client = redis.NewClient(redisOptions(rs.Options()))
	}
	client.AddHook(redistest.NewSlotGuard(t))
	t.Cleanup(func() { client.Close() })
	return New(cfg, client, log)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// gqlResponse is a GraphQL response as a client sees it.
type gqlResponse struct {
	Data   json.RawMessage `json:"data"`
	Errors []gqlError      `json:"errors"`
	Status int             `json:"-"`
}

type gqlError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

// code returns the extensions.code of the first error, or "".
func (r gqlResponse) code() string {
	if len(r.Errors) == 0 {
		return ""
	}
	c, _ := r.Errors[0].Extensions["code"].(string)
	return c
}

// decode unmarshals data into v, failing t on errors in the response.
func (r gqlResponse) decode(t testing.TB, v any) {
	t.Helper()
	if len(r.Errors) > 0 {
		t.Fatalf("unexpected errors: %+v", r.Errors)
	}
	if err := json.Unmarshal(r.Data, v); err != nil {
		t.Fatalf("decode %s: %v", r.Data, err)
	}
}

// query POSTs a GraphQL request with an optional bearer token.
func (s *testServer) query(t testing.TB, token, query string, vars map[string]any) gqlResponse {
	t.Helper()
	return s.send(t, s.request(token, query, vars))
}

// request is the POST of a GraphQL request with an optional bearer token.
func (s *testServer) request(token, query string, vars map[string]any) *http.Request {
	body, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

func (s *testServer) send(t testing.TB, req *http.Request) gqlResponse {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var r gqlResponse
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("%s %s: status %d, body %q is not JSON: %v", req.Method, req.URL, resp.StatusCode, raw, err)
	}
	r.Status = resp.StatusCode
	if bytes.Contains(raw, []byte("redis")) || bytes.Contains(raw, []byte("goroutine ")) {
		t.Fatalf("response leaks internals: %s", raw)
	}
	return r
}

// mustQuery is query that fails t on any error and decodes data into v.
func (s *testServer) mustQuery(t testing.TB, token, query string, vars map[string]any, v any) {
	t.Helper()
	s.query(t, token, query, vars).decode(t, v)
}

// testUser is a signed-up user of a testServer.
type testUser struct {
	ID       string
	Username string
	Token    string
}

var userSeq atomic.Int64

// signup creates a user with a unique name starting with prefix.
func (s *testServer) signup(t testing.TB, prefix string) testUser {
	t.Helper()
	name := fmt.Sprintf("%s_%d", prefix, userSeq.Add(1))
	var out struct {
		Signup struct {
			Token string
			User  struct{ ID string }
		}
	}
	s.mustQuery(t, "", `mutation($u: String!) { signup(input: {username: $u, password: "correct horse"}) { token user { id } } }`,
		map[string]any{"u": name}, &out)
	return testUser{ID: out.Signup.User.ID, Username: name, Token: out.Signup.Token}
}

// post creates a post by u and returns its id.
func (s *testServer) post(t testing.TB, u testUser, body string) string {
	t.Helper()
	var out struct {
		CreatePost struct{ Post struct{ ID string } }
	}
	s.mustQuery(t, u.Token, `mutation($b: String!) { createPost(input: {body: $b}) { post { id } } }`,
		map[string]any{"b": body}, &out)
	return out.CreatePost.Post.ID
}

// follow makes u follow other.
func (s *testServer) follow(t testing.TB, u, other testUser) {
	t.Helper()
	var out json.RawMessage
	s.mustQuery(t, u.Token, `mutation($id: ID!) { follow(input: {userId: $id}) { user { id } } }`,
		map[string]any{"id": other.ID}, &out)
}

// timelineEdge is a post in a timeline page as tests read it.
type timelineEdge struct {
	Cursor string
	Node   struct {
		ID     string
		Body   string
		Author struct{ Username string }
	}
}

type timelinePage struct {
	Edges    []timelineEdge
	PageInfo struct {
		HasNextPage bool
		EndCursor   *string
	}
}

// bodies lists the bodies of a page's posts in order.
func (p timelinePage) bodies() []string {
	out := make([]string, len(p.Edges))
	for i, e := range p.Edges {
		out[i] = e.Node.Body
	}
	return out
}

const timelineFields = `edges { cursor node { id body author { username } } } pageInfo { hasNextPage endCursor }`

// home reads the first page of u's home timeline.
func (s *testServer) home(t testing.TB, u testUser, first int) timelinePage {
	t.Helper()
	var out struct{ HomeTimeline timelinePage }
	s.mustQuery(t, u.Token, `query($n: Int) { homeTimeline(first: $n) { `+timelineFields+` } }`,
		map[string]any{"n": first}, &out)
	return out.HomeTimeline
}

// The websocket subprotocols Warble speaks.
const (
	protoTransportWS = "graphql-transport-ws" // the graphql-ws npm client
	protoLegacyWS    = "graphql-ws"           // subscriptions-transport-ws
)

var protocols = []string{protoTransportWS, protoLegacyWS}

// wsClient is a GraphQL websocket client speaking either subprotocol.
type wsClient struct {
	t     testing.TB
	conn  *websocket.Conn
	proto string
}

// wsMessage is one protocol message.
type wsMessage struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// dialWS opens a websocket with proto and sends connection_init with token
// (if any). It does not wait for the ack: see init.
func (s *testServer) dialWS(t testing.TB, proto string, header http.Header) (*wsClient, *http.Response, error) {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{proto}, HandshakeTimeout: 5 * time.Second}
	conn, resp, err := d.Dial("ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", header)
	if err != nil {
		return nil, resp, err
	}
	c := &wsClient{t: t, conn: conn, proto: proto}
	t.Cleanup(func() { conn.Close() })
	return c, resp, nil
}

// connect dials and completes connection_init, failing t unless acked.
func (s *testServer) connect(t testing.TB, proto, token string) *wsClient {
	t.Helper()
	c, _, err := s.dialWS(t, proto, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", proto, err)
	}
	c.init(token)
	if m := c.next(); m.Type != "connection_ack" {
		t.Fatalf("after connection_init got %+v, want connection_ack", m)
	}
	return c
}

func (c *wsClient) init(token string) {
	payload := map[string]any{}
	if token != "" {
		payload["Authorization"] = "Bearer " + token
	}
	c.send(wsMessage{Type: "connection_init", Payload: mustJSON(payload)})
}

func (c *wsClient) send(m wsMessage) {
	c.t.Helper()
	if err := c.conn.WriteJSON(m); err != nil {
		c.t.Fatalf("websocket write: %v", err)
	}
}

// subscribe starts an operation with the given id.
func (c *wsClient) subscribe(id, query string, vars map[string]any) {
	typ := "subscribe"
	if c.proto == protoLegacyWS {
		typ = "start"
	}
	c.send(wsMessage{Type: typ, ID: id, Payload: mustJSON(map[string]any{"query": query, "variables": vars})})
}

// stop ends an operation.
func (c *wsClient) stop(id string) {
	typ := "complete"
	if c.proto == protoLegacyWS {
		typ = "stop"
	}
	c.send(wsMessage{Type: typ, ID: id})
}

// settle sends a ping and reads up to its pong, failing on anything else
// but a RESYNC, which the hub may send any time (when its connection to
// Redis is made anew): the server handles a socket's messages one at a
// time and in order, so once the pong is back everything sent before the
// ping has taken effect (a complete, for instance, after which no event of
// its operation may come). Legacy graphql-ws has no ping.
func (c *wsClient) settle() {
	c.t.Helper()
	c.send(wsMessage{Type: "ping"})
	for {
		c.conn.SetReadDeadline(time.Now().Add(readTimeout))
		var m wsMessage
		if err := c.conn.ReadJSON(&m); err != nil {
			c.t.Fatalf("websocket read: %v", err)
		}
		switch m.Type {
		case "pong":
			return
		case "ka":
			continue
		case "ping":
			c.conn.WriteJSON(wsMessage{Type: "pong"})
			continue
		case "next":
			if eventOf(c.t, m).Kind == "RESYNC" {
				continue
			}
		}
		c.t.Fatalf("waiting for pong, got %s %s %s", m.Type, m.ID, m.Payload)
	}
}

// readTimeout bounds each wait for a websocket message. It is a safety net
// against a hung test, not an assertion about speed.
const readTimeout = 10 * time.Second

// next returns the next message that is not a keep-alive, answering pings.
func (c *wsClient) next() wsMessage {
	c.t.Helper()
	m, err := c.read(readTimeout)
	if err != nil {
		c.t.Fatalf("websocket read: %v", err)
	}
	return m
}

func (c *wsClient) read(timeout time.Duration) (wsMessage, error) {
	for {
		c.conn.SetReadDeadline(time.Now().Add(timeout))
		var m wsMessage
		if err := c.conn.ReadJSON(&m); err != nil {
			return m, err
		}
		switch m.Type {
		case "ka", "pong":
			continue
		case "ping":
			c.conn.WriteJSON(wsMessage{Type: "pong"})
			continue
		}
		return m, nil
	}
}

// timelineEvent is a TimelineEvent as tests read it.
type timelineEvent struct {
	Kind   string
	Cursor string
	PostID *string
	Post   *struct {
		ID     string
		Body   string
		Author struct{ Username string }
	}
}

// nextEvent returns the next event of operation id, failing on anything else.
func (c *wsClient) nextEvent(id string) timelineEvent {
	c.t.Helper()
	m := c.next()
	if m.ID != id || (m.Type != "next" && m.Type != "data") {
		c.t.Fatalf("got %s %s %s, want an event of %s", m.Type, m.ID, m.Payload, id)
	}
	return eventOf(c.t, m)
}

// eventOf returns the timeline event that m carries, failing t when m is
// an event with errors or none; a message that is not an event gives the
// zero event.
func eventOf(t testing.TB, m wsMessage) timelineEvent {
	t.Helper()
	if m.Type != "next" && m.Type != "data" {
		return timelineEvent{}
	}
	var p struct {
		Data   map[string]timelineEvent
		Errors []gqlError
	}
	if err := json.Unmarshal(m.Payload, &p); err != nil || len(p.Errors) > 0 {
		t.Fatalf("event payload %s: %v", m.Payload, err)
	}
	for _, ev := range p.Data {
		return ev
	}
	t.Fatalf("event payload %s has no data", m.Payload)
	return timelineEvent{}
}

const eventFields = `kind cursor postId post { id body author { username } }`

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// eventually polls cond until it holds or a generous deadline passes. It is
// for effects that land asynchronously, never for measuring speed.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s", what)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// syncCursor has u write a post and returns its cursor. Subscribing with
// after: set to it receives every later post, however long the subscription
// takes to start, so tests need no sleeps.
func (s *testServer) syncCursor(t testing.TB, u testUser) string {
	t.Helper()
	s.post(t, u, "sync")
	var out struct{ GlobalTimeline timelinePage }
	s.mustQuery(t, "", `{ globalTimeline(first: 1) { `+timelineFields+` } }`, nil, &out)
	return out.GlobalTimeline.Edges[0].Cursor
}

// connectSlow is connect for a client whose socket buffers are tiny, so that
// when it stops reading the server notices soon. Its kernel may drop a
// segment that does not fit, which the server resends only when a backed
// off timer of its TCP fires, seconds later: fine for a client that is
// never to read again, not for one that resumes (see
// TestSlowSubscriberDoesNotStallOthers).
func (s *testServer) connectSlow(t testing.TB) *wsClient {
	t.Helper()
	d := websocket.Dialer{
		Subprotocols:    []string{protoTransportWS},
		ReadBufferSize:  1024,
		WriteBufferSize: 1024,
		NetDial: func(network, addr string) (net.Conn, error) {
			conn, err := net.Dial(network, addr)
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetReadBuffer(4096)
			}
			return conn, err
		},
	}
	conn, _, err := d.Dial("ws"+strings.TrimPrefix(s.URL, "http")+"/graphql", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &wsClient{t: t, conn: conn, proto: protoTransportWS}
	c.init("")
	if m := c.next(); m.Type != "connection_ack" {
		t.Fatalf("got %+v, want connection_ack", m)
	}
	return c
}

// smallWriteBuffers makes the server's sockets buffer little of what it
// writes, so that a client that stops reading blocks the server's writes to
// it soon, as a slow client on a real network does.
func smallWriteBuffers(ln net.Listener) net.Listener { return smallBufferListener{ln} }

type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return conn, err
}

// warbleGoroutines counts the process's goroutines less those of the
// embedded Redis, which runs in the same process with one goroutine per
// client connection: go-redis grows its pool under load and keeps idle
// connections, so those come and go with no leak in Warble.
func warbleGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "github.com/alicebob/miniredis") {
			count++
		}
	}
	return count
}
