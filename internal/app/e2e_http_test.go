package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warble/warble/internal/redistest"
)

func TestGETServesQueriesOnly(t *testing.T) {
	s := newTestServer(t)
	get := func(q string) gqlResponse {
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?query="+url.QueryEscape(q), nil)
		return s.send(t, req)
	}
	if r := get(`{ globalTimeline { edges { cursor } } }`); r.Status != http.StatusOK || len(r.Errors) > 0 {
		t.Fatalf("query over GET: status %d, errors %+v", r.Status, r.Errors)
	}
	r := get(`mutation { signup(input: {username: "viaget", password: "password1"}) { token } }`)
	if r.Status != http.StatusNotAcceptable || r.code() != "BAD_USER_INPUT" {
		t.Fatalf("mutation over GET: status %d, code %q, want a refusal with BAD_USER_INPUT", r.Status, r.code())
	}
	if n := s.redis.Client(t).DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("a refused GET mutation wrote %d keys", n)
	}
	// Refusals that gqlgen's GET transport would write without a code.
	for _, vars := range []string{"variables=%5B%5D", "variables=x", "extensions=1"} {
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?query="+url.QueryEscape(`{ __typename }`)+"&"+vars, nil)
		if r := s.send(t, req); r.Status != http.StatusBadRequest || r.code() != "BAD_USER_INPUT" {
			t.Errorf("GET with %s: status %d, code %q, want 400 BAD_USER_INPUT", vars, r.Status, r.code())
		}
	}
	op := url.QueryEscape(`query A { __typename } mutation B { logout }`)
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?query="+op+"&operationName=A", nil)
	if r := s.send(t, req); r.Status != http.StatusOK || len(r.Errors) > 0 {
		t.Errorf("GET of the query in a document with a mutation: status %d, errors %+v", r.Status, r.Errors)
	}
}

func TestRefusesFormAndMultipartBodies(t *testing.T) {
	s := newTestServer(t)
	for _, ct := range []string{"application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/plain"} {
		body := `query=mutation{signup(input:{username:"viaform",password:"password1"}){token}}`
		resp, err := http.Post(s.URL+"/graphql", ct, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var out gqlResponse
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnsupportedMediaType || err != nil || out.code() != "BAD_USER_INPUT" {
			t.Errorf("POST with %s: status %d, %+v (%v), want 415 with BAD_USER_INPUT in JSON", ct, resp.StatusCode, out.Errors, err)
		}
	}
	if n := s.redis.Client(t).DBSize(context.Background()).Val(); n != 0 {
		t.Fatalf("refused requests wrote %d keys", n)
	}
}

func TestBodyLimit(t *testing.T) {
	s := newTestServer(t)
	big := `{"query":"{ __typename }","variables":{"x":"` + strings.Repeat("a", maxBodyBytes) + `"}}`
	resp, err := http.Post(s.URL+"/graphql", "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
	// Without a Content-Length (chunked), the same.
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = -1
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked: status %d, want 413", resp.StatusCode)
	}
}

func TestMalformedRequestBodies(t *testing.T) {
	s := newTestServer(t)
	for _, body := range []string{
		`{"query": "{ __typename }"`,                      // not JSON
		`{"query": "{ __typename }", "variables": "x"}`,   // variables not an object
		`{"query": "{ __typename }", "operationName": 7}`, // operationName not a string
		`["{ __typename }"]`,                              // not an object
	} {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		r := s.send(t, req)
		if r.Status != http.StatusBadRequest || r.code() != "BAD_USER_INPUT" || strings.Contains(r.Errors[0].Message, "__typename") {
			t.Errorf("body %s: status %d, errors %+v; want 400 BAD_USER_INPUT that does not echo the body", body, r.Status, r.Errors)
		}
	}
}

func TestQueryLimits(t *testing.T) {
	s := newTestServer(t)
	deep := `{ globalTimeline(first: 100) { edges { node { author { followers(first: 100) { edges { node {
		followers(first: 100) { edges { node { username } } } } } } } } } } }`
	if r := s.query(t, "", deep, nil); r.code() != "COMPLEXITY_LIMIT_EXCEEDED" && len(r.Errors) == 0 {
		t.Fatalf("an expensive query ran: %+v", r)
	}
	// Deep but cheap: every level is a single object, so only the depth
	// limit stops it. Fragments count where they are spread.
	nested := `{ viewer { ...a } } fragment a on User { posts(first: 1) { edges { node { author { posts(first: 1) { edges { node {
		author { posts(first: 1) { edges { node { author { username } } } } } } } } } } } } }`
	if r := s.query(t, "", nested, nil); r.code() != "GRAPHQL_VALIDATION_FAILED" || !strings.Contains(r.Errors[0].Message, "levels deep") {
		t.Fatalf("an operation 14 levels deep: %+v, want GRAPHQL_VALIDATION_FAILED for its depth", r.Errors)
	}
	nineDeep := `{ user(username: "nobody") { followers { edges { node { posts { edges { node { author { username } } } } } } } } }`
	if r := s.query(t, "", nineDeep, nil); len(r.Errors) > 0 {
		t.Fatalf("the deepest useful read was refused: %+v", r.Errors)
	}
	huge := "{ " + strings.Repeat("__typename ", 6000) + "}"
	if r := s.query(t, "", huge, nil); len(r.Errors) == 0 {
		t.Fatal("a query over the token limit ran")
	}
}

func TestHealthz(t *testing.T) {
	s := newTestServer(t)
	check := func() (int, string) {
		resp, err := http.Get(s.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := check(); code != http.StatusOK || !strings.Contains(body, `"ok"`) {
		t.Fatalf("healthz = %d %s, want 200 ok", code, body)
	}
	s.redis.Stop(t)
	if code, _ := check(); code != http.StatusServiceUnavailable {
		t.Fatalf("healthz with Redis down = %d, want 503", code)
	}
	// With Redis down, errors say nothing of Redis (send checks for leaks).
	if r := s.query(t, "", `{ globalTimeline { edges { cursor } } }`, nil); r.code() != "INTERNAL" || r.Errors[0].Message != unavailableMessage {
		t.Fatalf("query with Redis down = %+v, want INTERNAL %q", r.Errors, unavailableMessage)
	}
	s.redis.Restart(t)
	eventually(t, "healthz recovers", func() bool { code, _ := check(); return code == http.StatusOK })
}

func TestPlaygroundAndProductionMode(t *testing.T) {
	dev := newTestServer(t)
	resp, err := http.Get(dev.URL + "/playground")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("/graphql")) || !bytes.Contains(bytes.ToLower(b), []byte("graphiql")) {
		t.Fatalf("playground: %d", resp.StatusCode)
	}
	if r := dev.query(t, "", `{ __schema { queryType { name } } }`, nil); len(r.Errors) > 0 {
		t.Fatalf("introspection in development: %+v", r.Errors)
	}
	if r := dev.query(t, "", `{ globalTimelin { edges { cursor } } }`, nil); len(r.Errors) == 0 || !strings.Contains(r.Errors[0].Message, "Did you mean") {
		t.Fatalf("development validation error %+v: want a suggestion", r.Errors)
	}

	prod := newTestServer(t, func(c *Config) {
		c.Env, c.Playground, c.Introspection, c.Suggestions = "production", false, false, false
	})
	resp, err = http.Get(prod.URL + "/playground")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Contains(bytes.ToLower(b), []byte("graphiql")) {
		t.Fatal("playground is served in production")
	}
	if r := prod.query(t, "", `{ __schema { queryType { name } } }`, nil); len(r.Errors) == 0 {
		t.Fatal("introspection works in production")
	}
	r := prod.query(t, "", `{ globalTimelin { edges { cursor } } }`, nil)
	if len(r.Errors) == 0 || strings.Contains(r.Errors[0].Message, "Did you mean") {
		t.Fatalf("production validation error %+v: want no suggestions", r.Errors)
	}
}

func TestProductionConfigFromEnvironment(t *testing.T) {
	cfg, err := ParseConfig(nil, func(k string) string {
		return map[string]string{"WARBLE_ENV": "production", "PORT": "9999", "CORS_ORIGINS": "https://a.example, https://b.example"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Playground || cfg.Introspection || cfg.Suggestions || cfg.Addr != ":9999" || len(cfg.CORSOrigins) != 2 {
		t.Fatalf("config = %+v", cfg)
	}
	if cfg, err := ParseConfig(nil, func(k string) string {
		return map[string]string{"WARBLE_ENV": "production", "WARBLE_SUGGESTIONS": "true"}[k]
	}); err != nil || !cfg.Suggestions || cfg.Introspection {
		t.Fatalf("production with WARBLE_SUGGESTIONS=true: %+v, %v", cfg, err)
	}
	if _, err := ParseConfig([]string{"-playground=true"}, func(k string) string {
		return map[string]string{"WARBLE_ENV": "production"}[k]
	}); err != nil {
		t.Fatal(err)
	}
	if cfg.PullThreshold != 10000 || cfg.InactiveAfter != 7*24*time.Hour {
		t.Fatalf("fan-out defaults: pull above %d followers, skip after %v unseen", cfg.PullThreshold, cfg.InactiveAfter)
	}
	cfg, err = ParseConfig(nil, func(k string) string {
		return map[string]string{"FANOUT_PULL_THRESHOLD": "off", "FANOUT_INACTIVE_AFTER": "off"}[k]
	})
	if err != nil || cfg.PullThreshold != -1 || cfg.InactiveAfter != -1 {
		t.Fatalf("fan-out off: %+v, %v", cfg, err)
	}
	for _, bad := range []map[string]string{{"PORT": "http"}, {"WARBLE_ENV": "staging"}, {"HOME_TIMELINE_CAP": "0"}, {"SESSION_TTL": "5s"}, {"SESSION_TTL": "forever"},
		{"FANOUT_PULL_THRESHOLD": "0"}, {"FANOUT_PULL_THRESHOLD": "many"}, {"FANOUT_INACTIVE_AFTER": "7d"}, {"FANOUT_INACTIVE_AFTER": "1m"}} {
		if _, err := ParseConfig(nil, func(k string) string { return bad[k] }); err == nil {
			t.Errorf("config %v accepted", bad)
		}
	}
}

func TestCORS(t *testing.T) {
	// With CORS_ORIGINS unset no other origin may call the API.
	preflight(t, newTestServer(t), map[string]bool{"https://app.example": false})
	s := newTestServer(t, func(c *Config) { c.CORSOrigins = []string{"https://app.example", "https://*.staging.example"} })
	preflight(t, s, map[string]bool{
		"https://app.example":         true,
		"https://evil.example":        false,
		"https://pr7.staging.example": true,
		"https://staging.example":     false,
	})
	// The websocket check uses the same list.
	for origin, ok := range map[string]bool{"https://pr7.staging.example": true, "https://staging.example": false} {
		if _, _, err := s.dialWS(t, protoTransportWS, http.Header{"Origin": {origin}}); (err == nil) != ok {
			t.Errorf("websocket from %s: err %v, want allowed = %v", origin, err, ok)
		}
	}
}

// preflight sends a CORS preflight from each origin and checks that it is
// allowed exactly when want says.
func preflight(t *testing.T, s *testServer, want map[string]bool) {
	t.Helper()
	for origin, allowed := range want {
		req, _ := http.NewRequest(http.MethodOptions, s.URL+"/graphql", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Access-Control-Allow-Origin") == origin; got != allowed {
			t.Errorf("preflight from %s: allowed = %v, want %v", origin, got, allowed)
		}
	}
}

// TestRunEmbedded runs the whole program in-process with REDIS_URL unset, as
// `go run .` does on a fresh machine, and uses it end to end.
func TestRunEmbedded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"-host", "127.0.0.1", "-port", "0"}, func(string) string { return "" }, pw)
		pw.Close()
	}()
	var base string
	logs := bufio.NewScanner(pr)
	var sawEmbedded bool
	for logs.Scan() {
		line := logs.Text()
		sawEmbedded = sawEmbedded || strings.Contains(line, "embedded in-memory Redis")
		if i := strings.Index(line, "url=http://"); i >= 0 {
			base = strings.Fields(line[i+len("url="):])[0]
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if base == "" || !sawEmbedded {
		t.Fatalf("no listening line (base %q) or no embedded-Redis warning (%v)", base, sawEmbedded)
	}
	s := &testServer{URL: base}
	u := s.signup(t, "embedded")
	s.post(t, u, "first")
	// Resuming after "first" makes the next post arrive whether it lands
	// before the subscription is live (replay) or after (live).
	after := s.home(t, u, 1).Edges[0].Cursor
	c := s.connect(t, protoTransportWS, u.Token)
	c.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	s.post(t, u, "from embedded mode")
	if ev := c.nextEvent("home"); ev.Post == nil || ev.Post.Body != "from embedded mode" {
		t.Fatalf("event = %+v", ev)
	}

	cancel() // graceful shutdown also ends the websocket
	for {
		// The server may say "complete" for the subscription first.
		m, err := c.read(readTimeout)
		if err != nil {
			break
		}
		if m.Type != "complete" {
			t.Fatalf("after shutdown got %+v, want the websocket closed", m)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), time.Second); err == nil {
		t.Fatal("still listening after shutdown")
	}
}

// TestSubscriptionsNeedAWebsocket checks that a subscription sent over POST
// or GET is refused at once, rather than held open until the timeline's
// next event.
func TestSubscriptionsNeedAWebsocket(t *testing.T) {
	s := newTestServer(t)
	const sub = `subscription { globalTimeline { kind } }`
	post, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", jsonBody(map[string]any{"query": sub}))
	post.Header.Set("Content-Type", "application/json")
	get, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?query="+url.QueryEscape(sub), nil)
	for _, req := range []*http.Request{post, get} {
		// The client's timeout only keeps a regression from hanging the test.
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		r := s.send(t, req.WithContext(ctx))
		cancel()
		switch {
		case len(r.Errors) == 0:
			t.Errorf("%s subscription: ran, want it refused", req.Method)
		case req.Method == http.MethodPost && (r.code() != "BAD_USER_INPUT" || !strings.Contains(r.Errors[0].Message, "websocket")):
			t.Errorf("POST subscription: %+v, want BAD_USER_INPUT that points to websockets", r.Errors)
		}
		// GET is gqlgen's to refuse, as for mutations: queries only.
	}
}

// TestShutdownLetsRequestsInFlightFinish: a request that is being answered
// when the server starts to stop is answered in full (net/http's Shutdown
// waits for it), not cut short by the end of the server's context: its
// next Redis command would fail at once with "context canceled" and the
// client read "Internal error.". Here the request waits on a frozen
// redis-server while the server stops, then Redis thaws.
//
// "Being answered" means in the handler: net/http drops, unanswered, a
// request whose header it finishes reading after Shutdown has begun, so
// the test waits for the handler, not for the request's first bytes.
func TestShutdownLetsRequestsInFlightFinish(t *testing.T) {
	rs := redistest.New(t)
	a := newTestApp(t, rs, testConfig(t))
	t.Cleanup(func() { a.Close() })
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &closeListener{Listener: inner, closed: make(chan struct{})}
	handling := make(chan struct{}, 1)
	next := a.handler
	a.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case handling <- struct{}{}:
		default:
		}
		next.ServeHTTP(w, r)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, ln) }()
	s := &testServer{URL: "http://" + inner.Addr().String(), app: a, redis: rs}
	u := s.signup(t, "lastword")
	<-handling // the signup's

	rs.Signal(t, syscall.SIGSTOP)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			rs.Signal(t, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	answered := make(chan gqlResponse, 1)
	go func() {
		client := &http.Client{Transport: &http.Transport{}}
		resp, err := client.Do(s.request(u.Token, `mutation { createPost(input: {body: "while stopping"}) { post { body } } }`, nil))
		var r gqlResponse
		if err != nil {
			r.Errors = []gqlError{{Message: err.Error()}}
		} else {
			json.NewDecoder(resp.Body).Decode(&r)
			resp.Body.Close()
		}
		answered <- r
	}()
	<-handling // the createPost's, now waiting on the frozen Redis
	cancel()
	<-ln.closed // Shutdown has begun: it closes the listener first
	thaw()
	if r := <-answered; len(r.Errors) > 0 || !strings.Contains(string(r.Data), "while stopping") {
		t.Fatalf("createPost in flight during the shutdown: %s %+v, want it answered", r.Data, r.Errors)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// closeListener tells when it is closed.
type closeListener struct {
	net.Listener
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *closeListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}
