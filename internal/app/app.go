// Package app is Warble's composition root: it turns a Config into a Redis
// client, the services over it, the GraphQL handler and an HTTP server, and
// stops them gracefully. server.go's main calls Run (or RunWorkers, for
// `warble worker`); the end-to-end tests here run the same App in-process.
package app

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/rs/cors"

	"github.com/warble/warble/graph"
	"github.com/warble/warble/internal/metrics"
	"github.com/warble/warble/internal/ratelimit"
	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/web"
)

// App is Warble's services and HTTP handler over one Redis client.
type App struct {
	cfg     Config
	log     *slog.Logger
	db      *redisdb.DB
	hub     *redisdb.Hub
	metrics *metrics.Metrics
	handler http.Handler

	// resolver is the handler's; a benchmark swaps a service in it for an
	// in-memory one before the first request, to measure the stack alone.
	resolver *graph.Resolver

	stopWorkers func()
	// firstPass is closed once the first fan-out worker has made its
	// first pass over the database (see redisdb.WorkerOptions.FirstPass),
	// or at once without workers.
	firstPass chan struct{}
}

// newDB returns the services' DB over client; delivered and moved, if set,
// count fan-out deliveries and posts moved to the archive, and cached the
// post cache's hits, misses and clears.
func newDB(cfg Config, clients redisClients, log *slog.Logger, delivered, moved func(int), cached func(hits, misses, clears int)) *redisdb.DB {
	cacheSize := cfg.PostCacheSize
	if cacheSize == 0 {
		cacheSize = -1 // off
	}
	return redisdb.NewDB(clients.primary, redisdb.Options{
		ReplicaReads:  clients.replicas,
		HomeCap:       cfg.HomeCap,
		GlobalCap:     cfg.GlobalCap,
		MaxFollowing:  cfg.MaxFollowing,
		SessionTTL:    cfg.SessionTTL,
		BcryptCost:    cfg.BcryptCost,
		Logger:        log,
		AsyncFanOut:   true, // by the in-process workers or `warble worker`
		PullThreshold: cfg.PullThreshold,
		FanOutShards:  cfg.FanoutShards,
		WaitReplicas:  cfg.WaitReplicas,
		WaitTimeout:   cfg.WaitTimeout,
		InactiveAfter: cfg.InactiveAfter,
		Delivered:     delivered,

		FollowerBucketThreshold: cfg.BucketThreshold,
		FollowerBuckets:         cfg.FollowerBuckets,

		Archive:         cfg.Archive,
		PostsInRedis:    cfg.PostsInRedis,
		PostsInRedisFor: cfg.PostsInRedisFor,
		Moved:           moved,

		PostCacheSize:   cacheSize,
		PostCacheCounts: cached,
	})
}

// New wires Warble over client: the services, their rate limits, the live
// hub, metrics, FanoutWorkers fan-out workers, and the HTTP handler.
func New(cfg Config, client redis.UniversalClient, log *slog.Logger) *App {
	return newApp(cfg, redisClients{primary: client}, log)
}

// newApp is New with a client for the reads that may go to replicas.
func newApp(cfg Config, clients redisClients, log *slog.Logger) *App {
	client := clients.primary
	m := metrics.New()
	db := newDB(cfg, clients, log, m.FanOutDelivered, m.ArchiveMoved, m.PostCacheCounted)
	hub := redisdb.NewHub(db)
	client.AddHook(redisdb.ErrorHook(m.RedisError))
	m.WatchFanOutQueue(db)
	if cfg.Archive != nil {
		m.WatchArchive(db)
	}
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
	a := &App{cfg: cfg, log: log, db: db, hub: hub, metrics: m, resolver: resolver}
	a.firstPass = make(chan struct{})
	a.stopWorkers = startWorkers(cfg, db, cfg.FanoutWorkers, func() { close(a.firstPass) })
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
	api := limitBody(graph.ClientAddress(cfg.TrustXFF, graph.AuthMiddleware(gql)))
	mux.Handle("GET /graphql", api)
	mux.Handle("POST /graphql", api)
	mux.Handle("OPTIONS /graphql", api)
	if cfg.Playground {
		playground := web.Playground("/graphql")
		mux.Handle("GET /playground", playground)
		mux.Handle("GET /playground/", playground)
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

// Handler returns the App's HTTP handler.
func (a *App) Handler() http.Handler { return a.handler }

// Close stops the fan-out workers and ends every live subscription.
func (a *App) Close() error {
	a.stopWorkers()
	return a.hub.Close()
}

// startWorkers starts n fan-out workers on db and returns a function that
// stops them and waits until they have. The first also sweeps the outboxes
// and, with an archive, moves posts to it; firstPass, if set, is called
// when it has made its first pass (at once if n is 0).
func startWorkers(cfg Config, db *redisdb.DB, n int, firstPass func()) (stop func()) {
	if n == 0 && firstPass != nil {
		firstPass()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		opts := redisdb.WorkerOptions{ClaimIdle: cfg.FanoutClaimIdle, Batch: cfg.FanoutBatch, Sweep: i == 0, Move: i == 0}
		if i == 0 {
			opts.FirstPass = firstPass
		}
		w := redisdb.NewWorker(db, opts)
		wg.Go(func() { w.Run(ctx) })
	}
	return func() { cancel(); wg.Wait() }
}
