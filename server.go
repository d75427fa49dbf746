// Command warble runs the Warble service: a GraphQL API over Redis with live
// timelines on websockets. See README.md.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/99designs/gqlgen/graphql/playground"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/rs/cors"

	"github.com/warble/warble/graph"
	"github.com/warble/warble/internal/metrics"
	"github.com/warble/warble/internal/ratelimit"
	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/warble"
	"github.com/warble/warble/web"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// maxBodyBytes bounds the body of an HTTP request to /graphql.
const maxBodyBytes = 1 << 20

// config is Warble's configuration: each setting is an environment variable
// and a flag, the flag winning.
type config struct {
	Addr          string // listen address, from PORT
	RedisURL      string
	CORSOrigins   []string
	Env           string // development or production
	Playground    bool
	Introspection bool
	Suggestions   bool // "Did you mean …?" in validation errors
	HomeCap       int
	GlobalCap     int
	MaxFollowing  int
	SessionTTL    time.Duration
	RateLimitsOn  bool
	RateLimits    warble.RateLimits
	TrustXFF      bool // take client addresses from X-Forwarded-For
	LogLevel      slog.Level
	BcryptCost    int           // zero for the default; tests lower it
	WriteTimeout  time.Duration // of each websocket write; zero for the default
	LoaderWait    time.Duration // dataloaders' batching window; zero for the default
	MetricsOn     bool          // serve Prometheus metrics at GET /metrics
	MetricsAddr   string        // if set, serve them on this address instead of Addr

	FanoutWorkers   int           // fan-out workers run in this process
	FanoutClaimIdle time.Duration // how long a dead worker's job waits before another takes it
	FanoutBatch     int           // followers delivered to per round trip
	PullThreshold   int           // followers above which posts are pulled, not pushed; -1: never
	InactiveAfter   time.Duration // unseen this long, a follower is skipped by fan-out; -1: never
}

func parseConfig(args []string, getenv func(string) string) (config, error) {
	fs := flag.NewFlagSet("warble", flag.ContinueOnError)
	envOr := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	port := fs.String("port", envOr("PORT", "8080"), "listen port (env PORT)")
	host := fs.String("host", envOr("HOST", ""), "listen host; empty for all interfaces (env HOST)")
	redisURL := fs.String("redis-url", getenv("REDIS_URL"), "redis:// or rediss:// URL; empty for an embedded in-memory Redis (env REDIS_URL)")
	origins := fs.String("cors-origins", getenv("CORS_ORIGINS"), "comma-separated extra allowed origins (env CORS_ORIGINS)")
	env := fs.String("env", envOr("WARBLE_ENV", "development"), "development or production (env WARBLE_ENV)")
	playgroundFlag := fs.String("playground", getenv("WARBLE_PLAYGROUND"), "serve /playground: true or false; default on except in production (env WARBLE_PLAYGROUND)")
	introspection := fs.String("introspection", getenv("WARBLE_INTROSPECTION"), "allow introspection: true or false; default on except in production (env WARBLE_INTROSPECTION)")
	suggestions := fs.String("suggestions", getenv("WARBLE_SUGGESTIONS"), `"Did you mean …?" in validation errors, which name fields the query did not: true or false; default on except in production (env WARBLE_SUGGESTIONS)`)
	homeCap := fs.String("home-cap", envOr("HOME_TIMELINE_CAP", strconv.Itoa(redisdb.DefaultHomeCap)), "entries kept per home timeline (env HOME_TIMELINE_CAP)")
	globalCap := fs.String("global-cap", envOr("GLOBAL_TIMELINE_CAP", strconv.Itoa(redisdb.DefaultGlobalCap)), "entries kept in the global timeline (env GLOBAL_TIMELINE_CAP)")
	maxFollowing := fs.String("max-following", envOr("MAX_FOLLOWING", "2000"), "how many users one user may follow (env MAX_FOLLOWING)")
	sessionTTL := fs.String("session-ttl", envOr("SESSION_TTL", redisdb.DefaultSessionTTL.String()), "how long a session lasts unused, e.g. 720h (env SESSION_TTL)")
	rateLimits := fs.String("rate-limits", envOr("RATE_LIMITS", "on"), "on or off: off disables every rate limit, for load tests (env RATE_LIMITS)")
	defaults := warble.DefaultRateLimits()
	rates := []struct {
		env  string
		text *string
		dst  *warble.Rate
	}{
		{env: "RATE_LIMIT_LOGIN_FAILURES_PER_USERNAME", dst: &defaults.LoginFailuresPerUsername},
		{env: "RATE_LIMIT_LOGIN_FAILURES_PER_ADDRESS", dst: &defaults.LoginFailuresPerAddress},
		{env: "RATE_LIMIT_SIGNUPS_PER_ADDRESS", dst: &defaults.SignupsPerAddress},
		{env: "RATE_LIMIT_POSTS_PER_USER", dst: &defaults.PostsPerUser},
		{env: "RATE_LIMIT_FOLLOWS_PER_USER", dst: &defaults.FollowsPerUser},
		{env: "RATE_LIMIT_WEBSOCKETS_PER_ADDRESS", dst: &defaults.WebsocketsPerAddress},
	}
	for i, r := range rates {
		flagName := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(r.env, "RATE_LIMIT_")), "_", "-")
		rates[i].text = fs.String("rate-"+flagName, envOr(r.env, r.dst.String()),
			"EVENTS/PERIOD[/BURST], e.g. 100/1h/20 (env "+r.env+")")
	}
	trustXFF := fs.String("trust-forwarded-for", getenv("TRUST_FORWARDED_FOR"), "true behind a proxy that appends the client address to X-Forwarded-For (env TRUST_FORWARDED_FOR)")
	metricsFlag := fs.String("metrics", getenv("METRICS"), "on, off, or a host:port to serve GET /metrics on a listener of its own; default on (on the main listener) except in production (env METRICS)")
	logLevel := fs.String("log-level", envOr("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	fanoutWorkers := fs.String("fanout-workers", envOr("FANOUT_WORKERS", "2"), "fan-out workers in this process; 0 when `warble worker` processes do it all (env FANOUT_WORKERS)")
	fanoutClaimIdle := fs.String("fanout-claim-idle", envOr("FANOUT_CLAIM_IDLE", redisdb.DefaultClaimIdle.String()), "how long a fan-out job of a dead worker waits before another worker takes it over (env FANOUT_CLAIM_IDLE)")
	fanoutBatch := fs.String("fanout-batch", envOr("FANOUT_BATCH", strconv.Itoa(redisdb.DefaultBatch)), "followers one fan-out round trip delivers to (env FANOUT_BATCH)")
	pullThreshold := fs.String("fanout-pull-threshold", envOr("FANOUT_PULL_THRESHOLD", strconv.Itoa(redisdb.DefaultPullThreshold)), "followers above which an account's posts are pulled into home timelines when read instead of fanned out, or off (env FANOUT_PULL_THRESHOLD)")
	inactiveAfter := fs.String("fanout-inactive-after", envOr("FANOUT_INACTIVE_AFTER", redisdb.DefaultInactiveAfter.String()), "how long a user may go without a request before fan-out skips them (their home timeline is rebuilt when they return), or off (env FANOUT_INACTIVE_AFTER)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}

	cfg := config{RedisURL: *redisURL, Env: *env}
	if _, err := strconv.ParseUint(*port, 10, 16); err != nil {
		return cfg, fmt.Errorf("PORT %q is not a port number", *port)
	}
	cfg.Addr = net.JoinHostPort(*host, *port)
	for _, o := range strings.Split(*origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			cfg.CORSOrigins = append(cfg.CORSOrigins, o)
		}
	}
	if cfg.Env != "development" && cfg.Env != "production" {
		return cfg, fmt.Errorf("WARBLE_ENV %q must be development or production", cfg.Env)
	}
	var err error
	dev := cfg.Env == "development"
	if cfg.Playground, err = parseBool("WARBLE_PLAYGROUND", *playgroundFlag, dev); err != nil {
		return cfg, err
	}
	if cfg.Suggestions, err = parseBool("WARBLE_SUGGESTIONS", *suggestions, dev); err != nil {
		return cfg, err
	}
	if cfg.Introspection, err = parseBool("WARBLE_INTROSPECTION", *introspection, dev); err != nil {
		return cfg, err
	}
	for _, n := range []struct {
		name string
		text string
		dst  *int
	}{{"HOME_TIMELINE_CAP", *homeCap, &cfg.HomeCap}, {"GLOBAL_TIMELINE_CAP", *globalCap, &cfg.GlobalCap}, {"MAX_FOLLOWING", *maxFollowing, &cfg.MaxFollowing}} {
		if *n.dst, err = strconv.Atoi(n.text); err != nil || *n.dst < 1 {
			return cfg, fmt.Errorf("%s %q must be a positive whole number", n.name, n.text)
		}
	}
	if cfg.SessionTTL, err = time.ParseDuration(*sessionTTL); err != nil || cfg.SessionTTL < time.Minute {
		return cfg, fmt.Errorf("SESSION_TTL %q must be a duration of at least 1m, such as 720h", *sessionTTL)
	}
	switch *rateLimits {
	case "on":
		cfg.RateLimitsOn = true
	case "off":
	default:
		return cfg, fmt.Errorf("RATE_LIMITS %q must be on or off", *rateLimits)
	}
	for _, r := range rates {
		if *r.dst, err = warble.ParseRate(*r.text); err != nil {
			return cfg, fmt.Errorf("%s: %w", r.env, err)
		}
	}
	cfg.RateLimits = defaults
	if cfg.TrustXFF, err = parseBool("TRUST_FORWARDED_FOR", *trustXFF, false); err != nil {
		return cfg, err
	}
	switch m := *metricsFlag; {
	case m == "":
		cfg.MetricsOn = dev
	case m == "on":
		cfg.MetricsOn = true
	case m == "off":
	default:
		if _, port, err := net.SplitHostPort(m); err != nil || port == "" {
			return cfg, fmt.Errorf("METRICS %q must be on, off or a host:port such as 127.0.0.1:9090", m)
		}
		cfg.MetricsOn, cfg.MetricsAddr = true, m
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(*logLevel)); err != nil {
		return cfg, fmt.Errorf("LOG_LEVEL %q: %w", *logLevel, err)
	}
	if cfg.FanoutWorkers, err = strconv.Atoi(*fanoutWorkers); err != nil || cfg.FanoutWorkers < 0 {
		return cfg, fmt.Errorf("FANOUT_WORKERS %q must be a whole number", *fanoutWorkers)
	}
	if cfg.FanoutBatch, err = strconv.Atoi(*fanoutBatch); err != nil || cfg.FanoutBatch < 1 {
		return cfg, fmt.Errorf("FANOUT_BATCH %q must be a positive whole number", *fanoutBatch)
	}
	if cfg.FanoutClaimIdle, err = time.ParseDuration(*fanoutClaimIdle); err != nil || cfg.FanoutClaimIdle <= 0 {
		return cfg, fmt.Errorf("FANOUT_CLAIM_IDLE %q must be a positive duration, such as 30s", *fanoutClaimIdle)
	}
	if *pullThreshold == "off" {
		cfg.PullThreshold = -1
	} else if cfg.PullThreshold, err = strconv.Atoi(*pullThreshold); err != nil || cfg.PullThreshold < 1 {
		return cfg, fmt.Errorf("FANOUT_PULL_THRESHOLD %q must be a positive whole number or off", *pullThreshold)
	}
	if *inactiveAfter == "off" {
		cfg.InactiveAfter = -1
	} else if cfg.InactiveAfter, err = time.ParseDuration(*inactiveAfter); err != nil || cfg.InactiveAfter < time.Hour {
		return cfg, fmt.Errorf("FANOUT_INACTIVE_AFTER %q must be a duration of an hour or more, such as 168h, or off", *inactiveAfter)
	}
	return cfg, nil
}

func parseBool(name, text string, def bool) (bool, error) {
	if text == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(text)
	if err != nil {
		return false, fmt.Errorf("%s %q must be true or false", name, text)
	}
	return b, nil
}

// run is the whole program: it reads the configuration, connects to Redis,
// listens, and serves until ctx ends, then shuts down gracefully. With the
// argument "worker" first it runs fan-out workers only (see runWorkers).
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "worker" {
		return runWorkers(ctx, args[1:], getenv, stderr)
	}
	cfg, err := parseConfig(args, getenv)
	if err != nil {
		return err
	}
	log, client, closeRedis, err := openLogged(cfg, stderr)
	if err != nil {
		return err
	}
	defer closeRedis()

	a := newApp(cfg, client, log)
	defer a.Close()

	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("listen on %s for metrics: %w", cfg.MetricsAddr, err)
		}
		go a.serveMetrics(ctx, mln)
	}

	// Listen before serving, so that a taken port is an error here rather
	// than a goroutine's lost complaint.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	return a.serve(ctx, ln)
}

// runWorkers is `warble worker`: FANOUT_WORKERS fan-out workers (at least
// one) on the Redis at REDIS_URL, and no HTTP, until ctx ends. Any number of
// these processes may run beside the servers.
func runWorkers(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv)
	if err != nil {
		return err
	}
	if cfg.RedisURL == "" {
		return errors.New("warble worker needs REDIS_URL: the embedded Redis lives inside one server process")
	}
	log, client, closeRedis, err := openLogged(cfg, stderr)
	if err != nil {
		return err
	}
	defer closeRedis()
	n := max(cfg.FanoutWorkers, 1)
	stop := startWorkers(cfg, newDB(cfg, client, log, nil), n)
	log.Info("fan-out workers running", "workers", n)
	<-ctx.Done()
	stop()
	return nil
}

// startWorkers starts n fan-out workers on db and returns a function that
// stops them and waits until they have.
func startWorkers(cfg config, db *redisdb.DB, n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		w := redisdb.NewWorker(db, redisdb.WorkerOptions{ClaimIdle: cfg.FanoutClaimIdle, Batch: cfg.FanoutBatch, Sweep: i == 0})
		wg.Go(func() { w.Run(ctx) })
	}
	return func() { cancel(); wg.Wait() }
}

// openLogged makes the process's logger, which go-redis logs through too,
// and opens its Redis (see openRedis).
func openLogged(cfg config, stderr io.Writer) (*slog.Logger, redis.UniversalClient, func(), error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	redis.SetLogger(redisLogger{log})
	client, closeRedis, err := openRedis(cfg.RedisURL, log)
	return log, client, closeRedis, err
}

// openRedis connects to REDIS_URL, or starts the embedded Redis when it is
// unset.
func openRedis(url string, log *slog.Logger) (redis.UniversalClient, func(), error) {
	if url == "" {
		m := miniredis.NewMiniRedis()
		// Without it, the embedded Redis never expires keys: sessions,
		// persisted queries and rate limits would last forever.
		m.ClockTTL(true)
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, nil, fmt.Errorf("start embedded redis: %w", err)
		}
		log.Warn("REDIS_URL is not set: using an embedded in-memory Redis. Data lives in memory only and is gone when Warble stops.")
		// Its Lua runs in a fresh interpreter per call, far slower than
		// redis-server's: a fan-out pipeline of a thousand calls may
		// outlast the usual 3s read timeout.
		client := redis.NewClient(redisOptions(&redis.Options{Addr: m.Addr(), ReadTimeout: 30 * time.Second}))
		return client, func() { client.Close(); m.Close() }, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	client := redis.NewClient(redisOptions(opts))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		log.Warn("redis does not answer yet; requests will fail until it does", "addr", opts.Addr, "err", err)
	} else {
		log.Info("connected to redis", "addr", opts.Addr, "db", opts.DB)
	}
	return client, func() { client.Close() }, nil
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
	setDefault := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	// A connect to a reachable Redis takes microseconds; one that takes a
	// second is to a host that is down or unreachable.
	setDefault(&opts.DialTimeout, time.Second)
	// One dial per try: the command's own retry below is the retry, and
	// retries inside retries only multiply the wait when Redis is down.
	if opts.DialerRetries == 0 {
		opts.DialerRetries = 1
	}
	// A Redis that accepts commands and does not answer (stopped, swapping,
	// blocked by a slow script) fails the command after this long.
	setDefault(&opts.ReadTimeout, 3*time.Second)
	setDefault(&opts.WriteTimeout, 3*time.Second)
	// Waiting longer than this for a free connection means every pooled
	// connection is stuck on a Redis that does not answer: fail rather
	// than let requests pile up behind them.
	setDefault(&opts.PoolTimeout, 4*time.Second)
	// One retry covers a pooled connection that died between uses (Redis
	// restarted, a proxy dropped it) when go-redis's idle check misses it.
	// More would only multiply the wait when Redis is really gone, and
	// each retry of a write that timed out may run it twice (so Warble's
	// writes are idempotent: see the signup's username claim).
	if opts.MaxRetries == 0 {
		opts.MaxRetries = 1
	}
	return opts
}

// redisLogger sends go-redis's own complaints (a connection pool that cannot
// dial, a pub/sub reconnect) to slog, so that they carry its format and level.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// app is Warble's services and HTTP handler over one Redis client.
type app struct {
	cfg     config
	log     *slog.Logger
	db      *redisdb.DB
	hub     *redisdb.Hub
	metrics *metrics.Metrics
	handler http.Handler

	stopWorkers func()
}

// newDB returns the services' DB over client; delivered, if set, counts
// fan-out deliveries.
func newDB(cfg config, client redis.UniversalClient, log *slog.Logger, delivered func(int)) *redisdb.DB {
	return redisdb.NewDB(client, redisdb.Options{
		HomeCap:       cfg.HomeCap,
		GlobalCap:     cfg.GlobalCap,
		MaxFollowing:  cfg.MaxFollowing,
		SessionTTL:    cfg.SessionTTL,
		BcryptCost:    cfg.BcryptCost,
		Logger:        log,
		AsyncFanOut:   true, // by the in-process workers or `warble worker`
		PullThreshold: cfg.PullThreshold,
		InactiveAfter: cfg.InactiveAfter,
		Delivered:     delivered,
	})
}

func newApp(cfg config, client redis.UniversalClient, log *slog.Logger) *app {
	m := metrics.New()
	db := newDB(cfg, client, log, m.FanOutDelivered)
	hub := redisdb.NewHub(db)
	client.AddHook(redisdb.ErrorHook(m.RedisError))
	m.WatchFanOutQueue(db)
	resolver := &graph.Resolver{
		Users:   redisdb.NewUserService(db),
		Auth:    redisdb.NewAuthService(db),
		Posts:   redisdb.NewPostService(db),
		Follows: redisdb.NewFollowService(db),
		Live:    hub,
	}
	var allowWebsocket func(context.Context, string) error
	if cfg.RateLimitsOn {
		limiter, limits := redisdb.NewRateLimiter(db), cfg.RateLimits
		resolver.Auth = ratelimit.Auth{AuthService: resolver.Auth, Limiter: limiter, Limits: limits}
		resolver.Posts = ratelimit.Posts{PostService: resolver.Posts, Limiter: limiter, Limits: limits}
		resolver.Follows = ratelimit.Follows{FollowService: resolver.Follows, Limiter: limiter, Limits: limits}
		allowWebsocket = ratelimit.Websockets{Limiter: limiter, Limits: limits}.Allow
	}
	a := &app{cfg: cfg, log: log, db: db, hub: hub, metrics: m}
	a.stopWorkers = startWorkers(cfg, db, cfg.FanoutWorkers)
	gql := graph.NewHandler(graph.HandlerConfig{
		Resolver:       resolver,
		Sessions:       hub,
		AllowedOrigins: cfg.CORSOrigins,
		Introspection:  cfg.Introspection,
		Suggestions:    cfg.Suggestions,
		Logger:         log,
		WriteTimeout:   cfg.WriteTimeout,
		AllowWebsocket: allowWebsocket,

		PersistedQueries: redisdb.NewPersistedQueries(db),
		LoaderWait:       cfg.LoaderWait,
		Metrics:          m,
	})

	mux := http.NewServeMux()
	// Methods are named so that "GET /" below does not claim /graphql's
	// other methods; anything else gets 405 from the mux.
	api := limitBody(graph.ClientAddress(cfg.TrustXFF, graph.AuthMiddleware(resolver.Auth, gql)))
	mux.Handle("GET /graphql", api)
	mux.Handle("POST /graphql", api)
	mux.Handle("OPTIONS /graphql", api)
	if cfg.Playground {
		mux.Handle("GET /playground", playground.Handler("Warble", "/graphql"))
	}
	mux.HandleFunc("GET /healthz", a.healthz)
	if cfg.MetricsOn && cfg.MetricsAddr == "" {
		mux.Handle("GET /metrics", m.Handler())
	}
	mux.Handle("GET /", web.Handler())

	corsOptions := cors.Options{
		// A func rather than AllowedOrigins: rs/cors reads an empty list as
		// "any origin", and CORS_ORIGINS unset means none but our own.
		AllowOriginFunc: func(origin string) bool { return graph.OriginAllowed(cfg.CORSOrigins, origin) },
		AllowedMethods:  []string{http.MethodGet, http.MethodPost},
		AllowedHeaders:  []string{"Authorization", "Content-Type", "Accept"},
		MaxAge:          600,
	}
	a.handler = cors.New(corsOptions).Handler(mux)
	return a
}

// Close stops the fan-out workers and ends every live subscription.
func (a *app) Close() error {
	a.stopWorkers()
	return a.hub.Close()
}

// serve answers requests on ln until ctx ends, then stops accepting, ends
// websocket subscriptions (their contexts derive from BaseContext) and waits
// for requests in flight.
func (a *app) serve(ctx context.Context, ln net.Listener) error {
	baseCtx, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	srv := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	a.log.Info("warble is listening", "url", "http://"+ln.Addr().String(), "env", a.cfg.Env, "playground", a.cfg.Playground)

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	a.log.Info("shutting down")
	cancelBase() // ends websockets, which Shutdown does not wait for
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// serveMetrics serves GET /metrics alone on ln until ctx ends, for METRICS
// set to an address: a port that a firewall can keep private while the
// main one is public.
func (a *app) serveMetrics(ctx context.Context, ln net.Listener) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.metrics.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	a.log.Info("metrics are listening", "url", "http://"+ln.Addr().String()+"/metrics")
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		a.log.Error("serve metrics", "err", err)
	}
}

// healthz answers 200 when Redis answers, 503 otherwise.
func (a *app) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := a.db.Ping(ctx); err != nil {
		a.log.Warn("health check: redis unavailable", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"status":"unavailable","redis":"down"}`+"\n")
		return
	}
	io.WriteString(w, `{"status":"ok","redis":"up"}`+"\n")
}

// limitBody refuses request bodies over maxBodyBytes with 413. It reads
// the body itself, so that one without a Content-Length (chunked) that runs
// over is refused the same way rather than failing inside gqlgen, which
// reads whole bodies anyway.
func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tooLarge := func() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			io.WriteString(w, `{"errors":[{"message":"The request body is too large.","extensions":{"code":"BAD_USER_INPUT"}}]}`+"\n")
		}
		if r.ContentLength > maxBodyBytes {
			tooLarge()
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge()
			return
		} else if err != nil {
			return // the client went away mid-body; there is no one to answer
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}
