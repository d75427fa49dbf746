// Package redistest starts Redis servers for tests, as httptest starts HTTP
// servers: a real redis-server on a private unix socket, or the server named
// by REDIS_URL. Where no redis-server is installed it falls back to the
// embedded in-memory Redis and logs that it did; with CI set, a missing
// redis-server fails the test instead. REDISTEST_EMBEDDED=1 picks the
// embedded Redis on purpose, to check that Warble's zero-setup mode works.
// REDISTEST_CLUSTER=1 runs every test on one real 3-master Redis Cluster
// that the test binary starts (see NewCluster), flushed between tests, so
// that the same suites prove Warble on a cluster.
package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Server is a Redis server for one test.
type Server struct {
	// Addr is the server's address for go-redis: a unix socket path or host:port.
	Addr string
	// Network is "unix" or "tcp".
	Network string
	// URL is a redis:// or unix:// URL of the server, as REDIS_URL takes it.
	URL string

	cmd     *exec.Cmd
	mini    *miniredis.Miniredis
	cluster *Cluster
	dir     string
	conf    []string
}

// New returns a fresh, empty Redis for tb, stopped when tb ends. With
// REDIS_URL set it flushes and returns that server's database instead, so
// packages must then not run in parallel: use go test -p 1.
func New(tb testing.TB) *Server {
	tb.Helper()
	if OnCluster() {
		c := sharedCluster(tb)
		if err := c.Flush(context.Background()); err != nil {
			tb.Fatalf("redistest: %v", err)
		}
		return c.Server()
	}
	if url := os.Getenv("REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			tb.Fatalf("redistest: REDIS_URL: %v", err)
		}
		c := redis.NewClient(opts)
		defer c.Close()
		if err := c.FlushDB(context.Background()).Err(); err != nil {
			tb.Fatalf("redistest: flush %s: %v", url, err)
		}
		return &Server{Addr: opts.Addr, Network: opts.Network, URL: url}
	}
	if os.Getenv("REDISTEST_EMBEDDED") == "1" {
		return newEmbedded(tb)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("redistest: redis-server not found and CI is set: install redis-server (%v)", err)
		}
		tb.Log("redistest: redis-server not found; using the embedded in-memory Redis instead")
		return newEmbedded(tb)
	}
	// Unix socket paths are limited to about 100 bytes, and t.TempDir can be
	// longer than that, so the socket lives in a short directory of its own.
	dir, err := os.MkdirTemp("", "redistest")
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	s := &Server{dir: dir, Network: "unix", Addr: filepath.Join(dir, "redis.sock")}
	s.URL = "unix://" + s.Addr
	s.conf = []string{
		"--port", "0",
		"--unixsocket", s.Addr,
		"--unixsocketperm", "700",
		"--dir", dir,
		"--save", "",
		"--appendonly", "no",
		"--loglevel", "warning",
		"--logfile", filepath.Join(dir, "redis.log"),
	}
	s.start(tb, bin)
	tb.Cleanup(func() {
		s.stop()
		if tb.Failed() {
			// The server's warnings and crash reports may explain the failure.
			if log := serverLog(filepath.Join(dir, "redis.log")); log != "" {
				tb.Logf("redistest: log of redis-server:\n%s", log)
			}
		}
		os.RemoveAll(dir)
	})
	return s
}

// newEmbedded starts the embedded in-memory Redis that `go run .` uses.
func newEmbedded(tb testing.TB) *Server {
	m := miniredis.RunT(tb)
	m.ClockTTL(true) // expire keys in real time, as Warble's embedded mode does
	return &Server{Addr: m.Addr(), Network: "tcp", URL: "redis://" + m.Addr(), mini: m}
}

// Server returns c as a Server, as New returns the shared cluster, for a
// test that needs a cluster of its own (one it freezes a node of, say).
func (c *Cluster) Server() *Server {
	return &Server{Network: "tcp", Addr: c.Masters()[0].Addr, URL: c.URL, cluster: c}
}

// Embedded reports whether s is the embedded in-memory Redis.
func (s *Server) Embedded() bool { return s.mini != nil }

// Cluster returns the Redis Cluster that s is, or nil if s is one server.
func (s *Server) Cluster() *Cluster { return s.cluster }

// skipOnCluster skips tb, saying why, when s is a cluster: tests that stop
// and restart their server need one of their own.
func (s *Server) skipOnCluster(tb testing.TB, what string) {
	tb.Helper()
	if s.cluster != nil {
		tb.Skipf("redistest: %s needs a server of its own; on the shared cluster the failover tests cover it", what)
	}
}

func (s *Server) start(tb testing.TB, bin string) {
	tb.Helper()
	s.cmd = exec.Command(bin, s.conf...)
	s.cmd.Stderr = os.Stderr // what it says before its log file is open
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("redistest: start redis-server: %v", err)
	}
	c := s.Client(tb)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: redis-server did not answer: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *Server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		s.cmd = nil
	}
}

// Stop kills the server, as a crash would, keeping its socket path so that
// Restart can bring it back at the same address (with no data).
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.skipOnCluster(tb, "Stop")
	if s.mini != nil {
		s.mini.Close()
		return
	}
	if s.cmd == nil {
		tb.Fatal("redistest: Stop needs a redis-server started by redistest")
	}
	s.stop()
}

// Signal sends sig to the server's process: SIGSTOP and SIGCONT freeze and
// thaw it, as a host that stops answering for a while would (connections
// are still accepted, by the kernel, and nothing is answered).
func (s *Server) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	s.skipOnCluster(tb, "Signal")
	if s.cmd == nil || s.cmd.Process == nil {
		tb.Skip("redistest: Signal needs a redis-server started by redistest")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// Restart starts a stopped server again at the same address.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.skipOnCluster(tb, "Restart")
	if s.mini != nil {
		if err := s.mini.Restart(); err != nil {
			tb.Fatalf("redistest: restart: %v", err)
		}
		return
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(err)
	}
	s.start(tb, bin)
}

// Options returns go-redis options for the server; on a cluster, for its
// first master alone (use ClusterOptions for the cluster).
func (s *Server) Options() *redis.Options {
	if s.cluster != nil {
		return &redis.Options{Network: s.Network, Addr: s.Addr}
	}
	if os.Getenv("REDIS_URL") != "" && s.cmd == nil && s.mini == nil {
		opts, _ := redis.ParseURL(s.URL)
		return opts
	}
	opts := &redis.Options{Network: s.Network, Addr: s.Addr}
	if s.mini != nil {
		// The embedded Redis runs each Lua script in a fresh interpreter,
		// far slower than redis-server: a pipeline of a thousand script
		// calls can take longer than go-redis's default 3s read timeout.
		opts.ReadTimeout = 30 * time.Second
	}
	return opts
}

// ClusterOptions returns go-redis options for the cluster that s is, or nil
// if s is one server.
func (s *Server) ClusterOptions() *redis.ClusterOptions {
	if s.cluster == nil {
		return nil
	}
	return s.cluster.Options()
}

// Client returns a new client of the server, closed when tb ends: a
// *redis.ClusterClient on a cluster, else a *redis.Client. It carries a
// SlotGuard, so tb fails if an atomic step would not run on Redis Cluster.
func (s *Server) Client(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	if s.cluster != nil {
		return s.cluster.Client(tb)
	}
	c := redis.NewClient(s.Options())
	c.AddHook(NewSlotGuard(tb))
	tb.Cleanup(func() { c.Close() })
	return c
}

// ClientForURL returns a client for a URL that New's Server has: a cluster
// client for a URL of go-redis's cluster form (with addr= parameters), else
// a client of one server. Test helper processes use it to reach the
// server of the test that started them.
func ClientForURL(url string) (redis.UniversalClient, error) {
	if strings.Contains(url, "addr=") {
		opts, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

// String describes the server for test logs.
func (s *Server) String() string {
	if s.cluster != nil {
		return "redis cluster at " + s.URL
	}
	return fmt.Sprintf("redis at %s %s", s.Network, s.Addr)
}

// serverLog returns what a redis-server logged, less the lines every start
// logs, or "" if nothing else is there.
func serverLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var kept []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !startupLine(line) {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

func startupLine(line string) bool {
	for _, s := range []string{"Redis is starting", "Redis version=", "Configuration loaded", "Server initialized", "Memory overcommit must be enabled"} {
		if strings.Contains(line, s) || strings.TrimSpace(line) == "" {
			return true
		}
	}
	return false
}
