// Package metrics holds Warble's Prometheus metrics: one registry per
// process (per app, so that tests can run servers side by side), the
// handler that serves it, and methods that the other layers call through
// small interfaces of their own, so that neither graph nor redisdb imports
// Prometheus.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Bounds on the operation_name label, so that clients sending made-up
// operation names cannot grow the series without end.
const (
	// MaxOperationNames is how many distinct operation names get their own
	// series; operations with names seen after that are labelled "other".
	MaxOperationNames = 200
	// MaxOperationNameLen is the length at which names are cut.
	MaxOperationNameLen = 64
)

// Label values for operations without a name of their own.
const (
	AnonymousOperation = "anonymous"
	OtherOperation     = "other"
)

// Metrics is one process's metrics.
type Metrics struct {
	reg *prometheus.Registry

	operations    *prometheus.HistogramVec
	subscriptions prometheus.Gauge
	redisErrors   *prometheus.CounterVec
	deliveries    prometheus.Counter
	archiveMoved  prometheus.Counter // nil without an archive (see WatchArchive)
	cacheHits     prometheus.Counter // of warble_post_cache_lookups_total, resolved once
	cacheMisses   prometheus.Counter
	cacheClears   prometheus.Counter

	mu    sync.Mutex
	names map[string]struct{} // operation names with series of their own
}

// New returns Metrics on a registry of their own, with the Go runtime's and
// the process's collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "warble",
			Subsystem: "graphql",
			Name:      "operation_duration_seconds",
			Help: "Time from the start of a GraphQL query or mutation (after parsing and validation) " +
				"to its response, by operation type and name. Subscriptions are counted in warble_graphql_subscriptions_open instead.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"operation_type", "operation_name"}),
		subscriptions: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "warble",
			Subsystem: "graphql",
			Name:      "subscriptions_open",
			Help:      "GraphQL subscriptions running now, on every websocket.",
		}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "warble",
			Subsystem: "redis",
			Name:      "errors_total",
			Help:      "Redis commands that failed (not counting nil replies and NOSCRIPT), by command name.",
		}, []string{"command"}),
		deliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "warble",
			Subsystem: "fanout",
			Name:      "deliveries_total",
			Help:      "Posts added to followers' home timelines by fan-out; rate() gives deliveries per second.",
		}),
		names: make(map[string]struct{}),
	}
	cacheLookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "warble",
		Subsystem: "post_cache",
		Name:      "lookups_total",
		Help: "Posts and authors that pages looked up in this process's post cache, by result (hit or miss); " +
			"a miss is read from Redis. None while the cache is off or not in use (its pub/sub channel not subscribed).",
	}, []string{"result"})
	m.cacheHits, m.cacheMisses = cacheLookups.WithLabelValues("hit"), cacheLookups.WithLabelValues("miss")
	m.cacheClears = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "warble",
		Subsystem: "post_cache",
		Name:      "clears_total",
		Help:      "Times the post cache was emptied: each (re)subscription of its pub/sub channel, since deletes may have been missed, and each time Redis's id counters went back, since Redis lost data.",
	})
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.operations, m.subscriptions, m.redisErrors, m.deliveries, cacheLookups, m.cacheClears,
	)
	return m
}

// Registry returns the registry, for tests and for further collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text (or OpenMetrics) format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:            m.reg, // counts the handler's own errors
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

// ObserveOperation records that a query or mutation took d. opType is
// "query" or "mutation"; name is the operation's name in its document,
// empty for an anonymous operation.
func (m *Metrics) ObserveOperation(opType, name string, d time.Duration) {
	m.operations.WithLabelValues(opType, m.operationName(name)).Observe(d.Seconds())
}

// operationName bounds the names used as label values: empty becomes
// "anonymous", long names are cut, and once MaxOperationNames names have
// series, every new one becomes "other". The names reach here only from
// operations that passed validation, so each is a GraphQL name.
func (m *Metrics) operationName(name string) string {
	if name == "" {
		return AnonymousOperation
	}
	if len(name) > MaxOperationNameLen {
		name = name[:MaxOperationNameLen] // GraphQL names are ASCII
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.names[name]; ok {
		return name
	}
	if len(m.names) >= MaxOperationNames {
		return OtherOperation
	}
	m.names[name] = struct{}{}
	return name
}

// SubscriptionStarted counts a subscription that begins; SubscriptionEnded
// is its end.
func (m *Metrics) SubscriptionStarted() { m.subscriptions.Inc() }

// SubscriptionEnded counts the end of a subscription.
func (m *Metrics) SubscriptionEnded() { m.subscriptions.Dec() }

// RedisError counts one failed Redis command.
func (m *Metrics) RedisError(command string) { m.redisErrors.WithLabelValues(command).Inc() }

// PostCacheCounted counts the post cache's hits, misses and clears.
func (m *Metrics) PostCacheCounted(hits, misses, clears int) {
	if hits > 0 {
		m.cacheHits.Add(float64(hits))
	}
	if misses > 0 {
		m.cacheMisses.Add(float64(misses))
	}
	if clears > 0 {
		m.cacheClears.Add(float64(clears))
	}
}

// FanOutDelivered counts n posts added to followers' home timelines.
func (m *Metrics) FanOutDelivered(n int) { m.deliveries.Add(float64(n)) }

// FanOutQueue reports the state of the fan-out queue: how many jobs wait
// (or are being worked on), and how long the oldest of them has waited.
type FanOutQueue interface {
	FanOutQueueStats(ctx context.Context) (length int64, lag time.Duration, err error)
}

// WatchFanOutQueue adds gauges of q's length and lag, read from q at each
// scrape.
func (m *Metrics) WatchFanOutQueue(q FanOutQueue) {
	m.reg.MustRegister(&queueCollector{
		q: q,
		length: prometheus.NewDesc("warble_fanout_queue_length",
			"Fan-out jobs waiting or in progress, read at scrape time.", nil, nil),
		lag: prometheus.NewDesc("warble_fanout_queue_lag_seconds",
			"Age of the oldest fan-out job waiting or in progress, read at scrape time; 0 when there is none.", nil, nil),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warble_fanout_queue_scrape_errors_total",
			Help: "Scrapes in which the fan-out queue could not be read; its gauges are missing from those scrapes.",
		}),
	})
}

// queueCollector reads a FanOutQueue at each scrape.
type queueCollector struct {
	q           FanOutQueue
	length, lag *prometheus.Desc
	failures    prometheus.Counter
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.length
	ch <- c.lag
	c.failures.Describe(ch)
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, lag, err := c.q.FanOutQueueStats(ctx)
	if err != nil {
		c.failures.Inc()
	} else {
		ch <- prometheus.MustNewConstMetric(c.length, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, lag.Seconds())
	}
	c.failures.Collect(ch)
}
