package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Archive reports how far behind the movers of posts to the archive are:
// how many authors are due for a move now, and how long the one due
// longest has waited.
type Archive interface {
	ArchiveStats(ctx context.Context) (due int64, lag time.Duration, err error)
}

// WatchArchive adds the archive's metrics, for a Warble with an archive:
// the posts moved to it, and gauges of a's backlog read at each scrape.
func (m *Metrics) WatchArchive(a Archive) {
	m.archiveMoved = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "warble",
		Subsystem: "archive",
		Name:      "moved_posts_total",
		Help:      "Posts moved from Redis to the archive by this process's workers; rate() gives rows per second.",
	})
	m.reg.MustRegister(m.archiveMoved, &archiveCollector{
		a: a,
		due: prometheus.NewDesc("warble_archive_due_authors",
			"Authors with posts due to move to the archive now, read at scrape time.", nil, nil),
		lag: prometheus.NewDesc("warble_archive_lag_seconds",
			"How long the author due longest has waited for a mover, read at scrape time; 0 when the movers keep up.", nil, nil),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "warble_archive_scrape_errors_total",
			Help: "Scrapes in which the archive's backlog could not be read; its gauges are missing from those scrapes.",
		}),
	})
}

// ArchiveMoved counts n posts moved to the archive.
func (m *Metrics) ArchiveMoved(n int) {
	if m.archiveMoved != nil {
		m.archiveMoved.Add(float64(n))
	}
}

// archiveCollector reads an Archive at each scrape.
type archiveCollector struct {
	a        Archive
	due, lag *prometheus.Desc
	failures prometheus.Counter
}

func (c *archiveCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.due
	ch <- c.lag
	c.failures.Describe(ch)
}

func (c *archiveCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	due, lag, err := c.a.ArchiveStats(ctx)
	if err != nil {
		c.failures.Inc()
	} else {
		ch <- prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(due))
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, lag.Seconds())
	}
	c.failures.Collect(ch)
}
