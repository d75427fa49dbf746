package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"slices"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// openLogged makes the process's logger, which go-redis logs through too,
// and opens its Redis (see openRedis).
func openLogged(cfg Config, stderr io.Writer) (*slog.Logger, redisClients, func(), error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	redis.SetLogger(redisLogger{log})
	clients, closeRedis, err := openRedis(cfg.RedisURL, log)
	return log, clients, closeRedis, err
}

// redisClients are the process's Redis clients: primary for everything,
// and, when a cluster URL asks for reads from replicas (read_only=true,
// route_by_latency=true or route_randomly=true), replicas for the reads
// that may lag behind the writes (see redisdb.Options.ReplicaReads); nil
// otherwise.
type redisClients struct {
	primary, replicas redis.UniversalClient
}

// openRedis connects to REDIS_URL, or starts the embedded Redis when it is
// unset.
func openRedis(url string, log *slog.Logger) (redisClients, func(), error) {
	if url == "" {
		m := miniredis.NewMiniRedis()
		// Without it, the embedded Redis never expires keys: sessions,
		// persisted queries and rate limits would last forever.
		m.ClockTTL(true)
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return redisClients{}, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		log.Warn("REDIS_URL is not set: using an embedded in-memory Redis. Data lives in memory only and is gone when Warble stops.")
		// Its Lua runs in a fresh interpreter per call, far slower than
		// redis-server's: a fan-out pipeline of a thousand calls may
		// outlast the usual 3s read timeout.
		client := redis.NewClient(redisOptions(&redis.Options{Addr: m.Addr(), ReadTimeout: 30 * time.Second}))
		return redisClients{primary: client}, func() { client.Close(); m.Close() }, nil
	}
	if isClusterURL(url) {
		opts, err := redis.ParseClusterURL(url)
		if err != nil {
			return redisClients{}, nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		// Every read goes to the masters but those that may lag (see
		// redisdb.Options.ReplicaReads), which get a client of their own
		// with the URL's routing.
		var replicas *redis.ClusterClient
		if opts.ReadOnly || opts.RouteByLatency || opts.RouteRandomly {
			ro := *opts
			// Each cluster client appends the nodes it learns of to its
			// Addrs: the two must not share one array.
			ro.Addrs = slices.Clone(opts.Addrs)
			replicas = redis.NewClusterClient(clusterOptions(&ro))
			opts.ReadOnly, opts.RouteByLatency, opts.RouteRandomly = false, false, false
		}
		client := redis.NewClusterClient(clusterOptions(opts))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := client.Ping(ctx).Err(); err != nil {
			log.Warn("redis cluster does not answer yet; requests will fail until it does", "addrs", opts.Addrs, "err", err)
		} else {
			log.Info("connected to redis cluster", "addrs", opts.Addrs, "replica_reads", replicas != nil)
		}
		if replicas == nil {
			return redisClients{primary: client}, func() { client.Close() }, nil
		}
		return redisClients{primary: client, replicas: replicas}, func() { client.Close(); replicas.Close() }, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return redisClients{}, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	client := redis.NewClient(redisOptions(opts))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Warn("redis does not answer yet; requests will fail until it does", "addr", opts.Addr, "err", err)
	} else {
		log.Info("connected to redis", "addr", opts.Addr, "db", opts.DB)
	}
	return redisClients{primary: client}, func() { client.Close() }, nil
}

// isClusterURL reports whether a REDIS_URL is in go-redis's cluster form,
// redis://host:port?addr=host:port (one or more addr parameters), which
// names nodes of a Redis Cluster; any other URL names one server.
func isClusterURL(raw string) bool {
	u, err := neturl.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		return false
	}
	return u.Query().Has("addr")
}

// redisOptions sets the go-redis settings that decide what a request does
// when Redis is slow or gone, where opts leaves them unset (a REDIS_URL may
// set them, e.g. ?dial_timeout=3s&max_retries=2), and returns opts.
//
// The aim is a prompt answer, never a hang. With Redis down, a request
// fails at its first command, at once: dials are refused, and one dial per
// try with one retry keeps go-redis from dialling 20 times per command
// (its defaults: 5 attempts 100ms apart inside each of 4 tries, nearly 2s
// against a refused port). A Redis that is up but does not answer is
// given 3s per reply: a healthy one answers in well under a millisecond,
// but a reply that waits behind a busy host's scheduler can take a second
// or more, and a timeout there would retry a write that already happened.
// The tests' server uses these settings too (see newTestServerOn), so the
// end-to-end tests check them rather than go-redis's defaults.
func redisOptions(opts *redis.Options) *redis.Options {
	setTimeoutDefaults(timeouts{&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout, &opts.PoolTimeout, &opts.DialerRetries, &opts.MaxRetries})
	return opts
}

// clusterOptions is redisOptions for a Redis Cluster: the same settings,
// which the cluster client hands to its client of each node. Only the
// commands that it routes itself differ: one that meets a failed-over or
// moved slot is sent again to the node that serves it now, up to
// MaxRedirects times, as go-redis does by default.
func clusterOptions(opts *redis.ClusterOptions) *redis.ClusterOptions {
	setTimeoutDefaults(timeouts{&opts.DialTimeout, &opts.ReadTimeout, &opts.WriteTimeout, &opts.PoolTimeout, &opts.DialerRetries, &opts.MaxRetries})
	return opts
}

// timeouts points at the settings that redisOptions and clusterOptions set
// alike.
type timeouts struct {
	dial, read, write, pool   *time.Duration
	dialerRetries, maxRetries *int
}

func setTimeoutDefaults(t timeouts) {
	setDefault := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	// A connect to a reachable Redis takes microseconds; one that takes a
	// second is to a host that is down or unreachable.
	setDefault(t.dial, time.Second)
	// One dial per try: the command's own retry below is the retry, and
	// retries inside retries only multiply the wait when Redis is down.
	if *t.dialerRetries == 0 {
		*t.dialerRetries = 1
	}
	// A Redis that accepts commands and does not answer (stopped, swapping,
	// blocked by a slow script) fails the command after this long.
	setDefault(t.read, 3*time.Second)
	setDefault(t.write, 3*time.Second)
	// Waiting longer than this for a free connection means every pooled
	// connection is stuck on a Redis that does not answer: fail rather
	// than let requests pile up behind them.
	setDefault(t.pool, 4*time.Second)
	// One retry covers a pooled connection that died between uses (Redis
	// restarted, a proxy dropped it) when go-redis's idle check misses it.
	// More would only multiply the wait when Redis is really gone, and
	// each retry of a write that timed out may run it twice (so Warble's
	// writes are idempotent: see the signup's username claim).
	if *t.maxRetries == 0 {
		*t.maxRetries = 1
	}
}

// redisLogger sends go-redis's own complaints (a connection pool that cannot
// dial, a pub/sub reconnect) to slog, so that they carry its format and level.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}
