package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestOperationNames(t *testing.T) {
	m := New()
	if got := m.operationName(""); got != AnonymousOperation {
		t.Errorf("empty name -> %q", got)
	}
	long := strings.Repeat("x", 100)
	if got := m.operationName(long); got != long[:MaxOperationNameLen] {
		t.Errorf("long name -> %q", got)
	}
	for i := range MaxOperationNames {
		m.operationName(fmt.Sprintf("Op%d", i))
	}
	if got := m.operationName("OneTooMany"); got != OtherOperation {
		t.Errorf("name past the limit -> %q, want %q", got, OtherOperation)
	}
	if got := m.operationName("Op0"); got != "Op0" {
		t.Errorf("a name seen before the limit -> %q, want its own", got)
	}
}

type fakeQueue struct {
	n   int64
	lag time.Duration
	err error
}

func (q *fakeQueue) FanOutQueueStats(context.Context) (int64, time.Duration, error) {
	return q.n, q.lag, q.err
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, body)
	}
	return string(body)
}

func TestHandler(t *testing.T) {
	m := New()
	q := &fakeQueue{n: 7, lag: 1500 * time.Millisecond}
	m.WatchFanOutQueue(q)
	m.ObserveOperation("query", "Home", 3*time.Millisecond)
	m.SubscriptionStarted()
	m.SubscriptionStarted()
	m.SubscriptionEnded()
	m.RedisError("get")
	m.FanOutDelivered(5)

	body := scrape(t, m)
	for _, want := range []string{
		`warble_graphql_operation_duration_seconds_count{operation_name="Home",operation_type="query"} 1`,
		"warble_graphql_subscriptions_open 1\n",
		`warble_redis_errors_total{command="get"} 1`,
		"warble_fanout_deliveries_total 5\n",
		"warble_fanout_queue_length 7\n",
		"warble_fanout_queue_lag_seconds 1.5\n",
		"warble_fanout_queue_scrape_errors_total 0\n",
		"go_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in\n%s", want, body)
		}
	}

	q.err = errors.New("redis down")
	body = scrape(t, m)
	if strings.Contains(body, "warble_fanout_queue_length ") {
		t.Error("queue length reported though the queue could not be read")
	}
	if !strings.Contains(body, "warble_fanout_queue_scrape_errors_total 1\n") {
		t.Error("failed read of the queue not counted")
	}
}

func TestRegistriesAreSeparate(t *testing.T) {
	a, b := New(), New()
	a.RedisError("set")
	if strings.Contains(scrape(t, b), `command="set"`) {
		t.Error("one app's metrics show in another's registry")
	}
}
