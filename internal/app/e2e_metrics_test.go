package app

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/warble/warble/internal/metrics"
)

// scrape GETs /metrics and returns each sample's value by its series as the
// text format prints it, e.g. `warble_graphql_subscriptions_open` or
// `warble_redis_errors_total{command="get"}` (labels in name order).
func (s *testServer) scrape(t testing.TB) map[string]float64 {
	t.Helper()
	resp, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: status %d: %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics: Content-Type %q, want the text format", ct)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("GET /metrics: bad line %q", line)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return out
}

func opCount(typ, name string) string {
	return fmt.Sprintf(`warble_graphql_operation_duration_seconds_count{operation_name=%q,operation_type=%q}`, name, typ)
}

func TestMetricsSeries(t *testing.T) {
	s := newTestServer(t)
	m := s.scrape(t)
	for _, series := range []string{
		"go_goroutines",
		"process_resident_memory_bytes",
		"warble_graphql_subscriptions_open",
		"warble_fanout_deliveries_total",
		"warble_fanout_queue_length",
		"warble_fanout_queue_lag_seconds",
	} {
		if _, ok := m[series]; !ok {
			t.Errorf("no series %s", series)
		}
	}
	if _, ok := m["process_resident_memory_bytes"]; !ok {
		t.Log("(process collector is not supported on this OS)")
	}
}

func TestMetricsOperationLatency(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	before := s.scrape(t)

	const n = 3
	for range n {
		var out struct{ Viewer struct{ ID string } }
		s.mustQuery(t, ada.Token, `query MetricsProbe { viewer { id } }`, nil, &out)
	}
	s.post(t, ada, "counted") // an anonymous mutation
	var out struct {
		Typename string `json:"__typename"`
	}
	s.mustQuery(t, "", `{ __typename }`, nil, &out)
	// A document that does not validate is no operation, and names nothing.
	if r := s.query(t, "", `query NotValid { noSuchField }`, nil); len(r.Errors) == 0 {
		t.Fatalf("invalid query answered %s", r.Data)
	}

	after := s.scrape(t)
	delta := func(series string) float64 { return after[series] - before[series] }
	if got := delta(opCount("query", "MetricsProbe")); got != n {
		t.Errorf("MetricsProbe count went up by %v, want %d", got, n)
	}
	if got := delta(opCount("mutation", metrics.AnonymousOperation)); got != 1 {
		t.Errorf("anonymous mutation count went up by %v, want 1", got)
	}
	if got := delta(opCount("query", metrics.AnonymousOperation)); got != 1 {
		t.Errorf("anonymous query count went up by %v, want 1", got)
	}
	if _, ok := after[opCount("query", "NotValid")]; ok {
		t.Error("an operation that failed validation has a series")
	}
	sum := after[`warble_graphql_operation_duration_seconds_sum{operation_name="MetricsProbe",operation_type="query"}`]
	if sum <= 0 || sum > 60 {
		t.Errorf("MetricsProbe took %vs in all, want a small positive time", sum)
	}
	inf := after[`warble_graphql_operation_duration_seconds_bucket{operation_name="MetricsProbe",operation_type="query",le="+Inf"}`]
	if inf != n {
		t.Errorf("MetricsProbe +Inf bucket is %v, want %d", inf, n)
	}
}

func TestMetricsOperationNamesAreBounded(t *testing.T) {
	s := newTestServer(t)
	for i := range metrics.MaxOperationNames + 5 {
		var out struct {
			Typename string `json:"__typename"`
		}
		s.mustQuery(t, "", fmt.Sprintf(`query Random%d { __typename }`, i), nil, &out)
	}
	long := "L" + strings.Repeat("o", 200) + "ng"
	var out struct {
		Typename string `json:"__typename"`
	}
	s.mustQuery(t, "", `query `+long+` { __typename }`, nil, &out)

	m := s.scrape(t)
	names := 0
	for series := range m {
		if strings.HasPrefix(series, "warble_graphql_operation_duration_seconds_count{") {
			names++
		}
	}
	if names > metrics.MaxOperationNames+1 {
		t.Errorf("%d operation series, want at most %d names and %q", names, metrics.MaxOperationNames, metrics.OtherOperation)
	}
	// The first names keep their own series; the rest, the long one
	// included, count as "other".
	if m[opCount("query", "Random0")] != 1 {
		t.Errorf("Random0 has no series of its own")
	}
	if got := m[opCount("query", metrics.OtherOperation)]; got != 6 {
		t.Errorf("%q count is %v, want 6", metrics.OtherOperation, got)
	}
}

func TestMetricsOpenSubscriptions(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	const open = "warble_graphql_subscriptions_open"
	if got := s.scrape(t)[open]; got != 0 {
		t.Fatalf("%s = %v before any subscription", open, got)
	}
	c1 := s.connect(t, protoTransportWS, ada.Token)
	c2 := s.connect(t, protoLegacyWS, "")
	after := s.syncCursor(t, ada)
	c1.subscribe("home", `subscription($a: String) { homeTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	c1.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	c2.subscribe("global", `subscription($a: String) { globalTimeline(after: $a) { `+eventFields+` } }`, map[string]any{"a": after})
	// A post that each subscription receives proves them all running.
	id := s.post(t, ada, "hello")
	for _, c := range []struct {
		c   *wsClient
		ids []string
	}{{c1, []string{"home", "global"}}, {c2, []string{"global"}}} {
		seen := map[string]bool{}
		for len(seen) < len(c.ids) {
			m := c.c.next()
			if (m.Type == "next" || m.Type == "data") && strings.Contains(string(m.Payload), id) {
				seen[m.ID] = true
			} else {
				t.Fatalf("got %s %s %s, want post %s", m.Type, m.ID, m.Payload, id)
			}
		}
	}
	if got := s.scrape(t)[open]; got != 3 {
		t.Fatalf("%s = %v with three subscriptions, want 3", open, got)
	}

	c1.stop("home") // a client stopping one subscription
	eventually(t, open+" = 2", func() bool { return s.scrape(t)[open] == 2 })
	c1.conn.Close() // and a websocket closed under the others
	c2.conn.Close()
	eventually(t, open+" = 0", func() bool { return s.scrape(t)[open] == 0 })
}

func TestMetricsRedisErrors(t *testing.T) {
	s := newTestServer(t)
	ada := s.signup(t, "ada")
	total := func(m map[string]float64) float64 {
		var sum float64
		for series, v := range m {
			if strings.HasPrefix(series, "warble_redis_errors_total{") {
				sum += v
			}
		}
		return sum
	}
	// Nil replies are answers, not errors: a user that does not exist,
	// and scripts (which may answer NOSCRIPT first) run by createPost.
	var out struct{ User *struct{ ID string } }
	s.mustQuery(t, "", `{ user(username: "nobody_at_all") { id } }`, nil, &out)
	s.post(t, ada, "scripted")
	if m := s.scrape(t); total(m) != 0 {
		for series, v := range m {
			if strings.HasPrefix(series, "warble_redis_errors_total{") {
				t.Errorf("%s %v", series, v)
			}
		}
		t.Fatalf("redis errors = %v with Redis up, want 0", total(m))
	}

	s.redis.Stop(t)
	if r := s.query(t, ada.Token, `query ViewerDown { viewer { id } }`, nil); r.code() != "INTERNAL" {
		t.Fatalf("with Redis stopped, viewer answered %s %+v, want INTERNAL", r.Data, r.Errors)
	}
	m := s.scrape(t)
	if got := total(m); got < 1 {
		t.Errorf("redis errors = %v after a failed request, want at least 1", got)
	}
	for series := range m {
		if strings.HasPrefix(series, "warble_redis_errors_total{") && !strings.Contains(series, `command="`) {
			t.Errorf("series %s has no command label", series)
		}
	}
	s.redis.Restart(t)
}

func TestMetricsConfig(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		on   bool
		addr string
	}{
		{map[string]string{}, true, ""},
		{map[string]string{"WARBLE_ENV": "production"}, false, ""},
		{map[string]string{"WARBLE_ENV": "production", "METRICS": "on"}, true, ""},
		{map[string]string{"METRICS": "off"}, false, ""},
		{map[string]string{"METRICS": "127.0.0.1:9090"}, true, "127.0.0.1:9090"},
		{map[string]string{"METRICS": ":9090"}, true, ":9090"},
	} {
		cfg, err := ParseConfig(nil, func(k string) string { return tc.env[k] })
		if err != nil {
			t.Errorf("%v: %v", tc.env, err)
			continue
		}
		if cfg.MetricsOn != tc.on || cfg.MetricsAddr != tc.addr {
			t.Errorf("%v: on %v addr %q, want %v %q", tc.env, cfg.MetricsOn, cfg.MetricsAddr, tc.on, tc.addr)
		}
	}
	for _, bad := range []string{"yes", "9090", "localhost"} {
		if _, err := ParseConfig(nil, func(k string) string {
			if k == "METRICS" {
				return bad
			}
			return ""
		}); err == nil {
			t.Errorf("METRICS=%s was accepted", bad)
		}
	}

	s := newTestServer(t, func(c *Config) { c.MetricsOn = false })
	resp, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=") {
		t.Errorf("METRICS=off still serves /metrics")
	}
}

// TestMetricsFanOutDeliveries: the in-process workers count each home
// timeline they add a post to.
func TestMetricsFanOutDeliveries(t *testing.T) {
	s := newTestServer(t)
	author := s.signup(t, "author")
	for _, name := range []string{"fan1", "fan2", "fan3"} {
		s.follow(t, s.signup(t, name), author)
	}
	before := s.scrape(t)["warble_fanout_deliveries_total"]
	s.post(t, author, "to three")
	eventually(t, "three deliveries counted", func() bool {
		return s.scrape(t)["warble_fanout_deliveries_total"]-before == 3
	})
}

// TestMetricsPostCache: a page read twice counts its posts and author as
// misses the first time and hits the second, and the cache's start as a
// clear (its subscription's first confirmation).
func TestMetricsPostCache(t *testing.T) {
	s := newTestServer(t)
	author := s.signup(t, "author")
	for i := range 3 {
		s.post(t, author, fmt.Sprintf("post %d", i))
	}
	waitCacheInUse(t, s)
	const page = `{ globalTimeline(first: 3) { edges { node { id body author { username } } } } }`
	m := s.scrape(t)
	hits, misses := m[`warble_post_cache_lookups_total{result="hit"}`], m[`warble_post_cache_lookups_total{result="miss"}`]
	if m["warble_post_cache_clears_total"] < 1 {
		t.Errorf("warble_post_cache_clears_total = %v, want at least 1", m["warble_post_cache_clears_total"])
	}
	s.mustQuery(t, "", page, nil, new(any))
	m = s.scrape(t)
	if got := m[`warble_post_cache_lookups_total{result="miss"}`] - misses; got != 4 {
		t.Errorf("first page: %v misses, want 4 (3 posts, 1 author)", got)
	}
	s.mustQuery(t, "", page, nil, new(any))
	m = s.scrape(t)
	if got := m[`warble_post_cache_lookups_total{result="hit"}`] - hits; got != 4 {
		t.Errorf("second page: %v hits, want 4", got)
	}
}
