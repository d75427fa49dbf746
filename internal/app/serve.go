package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/warble/warble/graph"
	"github.com/warble/warble/internal/redisdb"
)

// maxBodyBytes bounds the body of an HTTP request to /graphql.
const maxBodyBytes = 1 << 20

// Run is the whole server: it reads the configuration, connects to Redis,
// listens, and serves until ctx ends, then shuts down gracefully.
func Run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := ParseConfig(args, getenv)
	if err != nil {
		return err
	}
	log, clients, closeRedis, err := openLogged(cfg, stderr)
	if err != nil {
		return err
	}
	defer closeRedis()
	closeArchive, err := openArchive(ctx, &cfg, log)
	if err != nil {
		return err
	}
	defer closeArchive()

	a := newApp(cfg, clients, log)
	defer a.Close()
	checkListpack(ctx, cfg, a.db)

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
	return a.Serve(ctx, ln)
}

// RunWorkers is `warble worker`: FANOUT_WORKERS fan-out workers (at least
// one) on the Redis at REDIS_URL, and no HTTP, until ctx ends. Any number of
// these processes may run beside the servers.
func RunWorkers(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := ParseConfig(args, getenv)
	if err != nil {
		return err
	}
	if cfg.RedisURL == "" {
		return errors.New("warble worker needs REDIS_URL: the embedded Redis lives inside one server process")
	}
	log, clients, closeRedis, err := openLogged(cfg, stderr)
	if err != nil {
		return err
	}
	defer closeRedis()
	closeArchive, err := openArchive(ctx, &cfg, log)
	if err != nil {
		return err
	}
	defer closeArchive()
	n := max(cfg.FanoutWorkers, 1)
	db := newDB(cfg, redisClients{primary: clients.primary}, log, nil, nil, nil) // no hub: its post cache stays unused
	checkListpack(ctx, cfg, db)
	stop := startWorkers(cfg, db, n, nil)
	log.Info("fan-out workers running", "workers", n)
	<-ctx.Done()
	stop()
	return nil
}

// checkListpack checks, at the start of a server or of `warble worker`,
// that Redis keeps full home timelines compact, and with REDIS_SET_LISTPACK
// makes it (see redisdb.DB.CheckListpack). It logs what it found; nothing
// it finds stops Warble. The embedded Redis has no encodings to check.
func checkListpack(ctx context.Context, cfg Config, db *redisdb.DB) {
	if cfg.RedisURL == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	db.CheckListpack(ctx, cfg.SetListpack)
}

// Serve answers requests on ln until ctx ends, then stops accepting, closes
// websockets (their lifetime is in BaseContext, see
// graph.WithWebsocketLifetime) and waits for requests in flight and for the
// websockets' close frames, for at most 10 seconds in all.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	life, endWebsockets := context.WithCancel(context.WithoutCancel(ctx))
	defer endWebsockets()
	life, websocketsClosed := graph.WithWebsocketLifetime(life)
	// Requests carry the websockets' lifetime, not its end: one in flight
	// when the server stops runs to its end, as Shutdown waits for it, where
	// a cancelled context would fail its next Redis command at once.
	baseCtx := context.WithoutCancel(life)
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
	endWebsockets() // Shutdown does not wait for them
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := websocketsClosed(shutdownCtx); err != nil {
		a.log.Warn("websockets still closing at the end of the shutdown", "err", err)
	}
	return nil
}

// serveMetrics serves GET /metrics alone on ln until ctx ends, for METRICS
// set to an address: a port that a firewall can keep private while the
// main one is public.
func (a *App) serveMetrics(ctx context.Context, ln net.Listener) {
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
func (a *App) healthz(w http.ResponseWriter, r *http.Request) {
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

// limitBody refuses request bodies over maxBodyBytes with 413. A body
// without a Content-Length (chunked) it reads itself, so that one that runs
// over is refused the same way rather than failing inside gqlgen, which
// reads whole bodies anyway; one with a Content-Length is refused by it
// alone and otherwise passed on as it is.
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
		if r.ContentLength >= 0 {
			// net/http ends a body at its Content-Length, so this one
			// cannot run over; gqlgen reads it once, with no copy first.
			next.ServeHTTP(w, r)
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
