// Package mysqltest starts a MariaDB server for tests, as redistest starts
// redis-server: mariadb-install-db into a temporary directory, then mariadbd
// on a unix socket in it, with no TCP port and no system service. One server
// serves a whole test binary (started at its first use, stopped by Main or
// when the binary dies), and each test gets a database of its own on it.
//
// Where MariaDB is not installed the tests that need it skip, saying why;
// with CI set they fail instead, so that CI cannot pass without having run
// them.
package mysqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Database is an empty database of its own for one test, on the server the
// test binary shares.
type Database struct {
	// Name is the database's name.
	Name string
	// Socket is the path of the server's unix socket.
	Socket string
	// URL is the database as ARCHIVE_URL takes it:
	// mysql://root@/<name>?socket=<path>.
	URL string
}

// DSN returns the database in go-sql-driver/mysql's form, for tests that
// open it themselves.
func (d *Database) DSN() string {
	c := mysql.NewConfig()
	c.User = "root"
	c.Net = "unix"
	c.Addr = d.Socket
	c.DBName = d.Name
	return c.FormatDSN()
}

// Open returns a handle on the database, closed when tb ends.
func (d *Database) Open(tb testing.TB) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", d.DSN())
	if err != nil {
		tb.Fatalf("mysqltest: %v", err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// New returns a fresh, empty database for tb, dropped when tb ends. The
// server is started at the first call of the test binary. Without MariaDB
// installed it skips tb, or fails it when CI is set.
func New(tb testing.TB) *Database {
	tb.Helper()
	s := sharedServer(tb)
	name := "t_" + randomHex(6)
	if _, err := s.db.Exec("CREATE DATABASE " + name + " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		tb.Fatalf("mysqltest: create database: %v", err)
	}
	tb.Cleanup(func() {
		if _, err := s.db.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			tb.Logf("mysqltest: drop database %s: %v", name, err)
		}
	})
	return &Database{Name: name, Socket: s.socket, URL: "mysql://root@/" + name + "?socket=" + s.socket}
}

// Available reports whether New can start a server here, and if not, why.
func Available() (bool, string) {
	for _, bin := range []string{"mariadbd", "mariadb-install-db"} {
		if _, err := exec.LookPath(bin); err != nil {
			return false, bin + " not found: install mariadb-server (apt-get install mariadb-server)"
		}
	}
	return true, ""
}

// Main runs a package's tests (call it from TestMain), then stops the
// server they shared, if they started one, and removes its files.
func Main(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	if shared.server != nil {
		shared.server.stop()
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// server is one mariadbd with its data directory.
type server struct {
	dir    string
	socket string
	cmd    *exec.Cmd
	db     *sql.DB // as root, on no database: creates the tests' databases
}

var shared struct {
	mu     sync.Mutex
	server *server
	err    error // why the server could not start; every later test fails with it
}

func sharedServer(tb testing.TB) *server {
	tb.Helper()
	if ok, why := Available(); !ok {
		if os.Getenv("CI") != "" {
			tb.Fatalf("mysqltest: %s, and CI is set", why)
		}
		tb.Skipf("mysqltest: %s; skipping a test that needs MariaDB", why)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.server == nil && shared.err == nil {
		shared.server, shared.err = start()
	}
	if shared.err != nil {
		tb.Fatalf("mysqltest: %v", shared.err)
	}
	return shared.server
}

// start initializes a data directory and starts mariadbd on it. The server
// is tuned for tests: a small buffer pool and log, no binary log, and no
// flush at each commit (a crash of the machine may lose what the tests
// wrote, which they do not care about; a crash of a client loses nothing).
func start() (*server, error) {
	removeStaleDirs()
	// Unix socket paths are limited to about 100 bytes, and t.TempDir can
	// be longer than that, so the server lives in a short directory.
	dir, err := os.MkdirTemp("", "mysqltest")
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, socket: filepath.Join(dir, "mysqld.sock")}
	data := filepath.Join(dir, "data")
	// Running as root (as CI does), mariadbd must be told to; as anyone
	// else it runs as that user.
	user := []string{}
	if os.Geteuid() == 0 {
		user = []string{"--user=root"}
	}
	install := exec.Command("mariadb-install-db", append([]string{
		"--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve", "--innodb-log-file-size=16M",
		"--tmpdir=" + dir,
	}, user...)...)
	if out, err := install.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mariadb-install-db: %v\n%s", err, out)
	}
	args := append([]string{
		"--no-defaults", "--datadir=" + data, "--socket=" + s.socket,
		"--skip-networking", "--tmpdir=" + dir, "--pid-file=" + filepath.Join(dir, "mysqld.pid"),
		"--log-error=" + filepath.Join(dir, "error.log"),
		"--innodb-buffer-pool-size=64M", "--innodb-log-file-size=16M",
		"--innodb-flush-log-at-trx-commit=2", "--skip-log-bin",
		"--max-connections=300",
	}, user...)
	if s.cmd, err = spawn("mariadbd", args); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start mariadbd: %v", err)
	}
	c := mysql.NewConfig()
	c.User, c.Net, c.Addr = "root", "unix", s.socket
	connector, err := mysql.NewConnector(c)
	if err != nil {
		s.stop()
		return nil, err
	}
	s.db = sql.OpenDB(connector)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := s.db.PingContext(ctx)
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) || s.exited() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			s.stop()
			return nil, fmt.Errorf("mariadbd did not answer: %v\n%s", err, lastLines(string(log), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeStaleDirs removes the directories of servers whose test binary
// died without removing them (the kernel killed their mariadbd with it, see
// spawn): those whose server's pid is gone, or, for a directory with no
// pid yet, left for an hour.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "mysqltest*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "mysqld.pid"))
		if err != nil {
			if fi, err := os.Stat(dir); err == nil && time.Since(fi.ModTime()) > time.Hour {
				os.RemoveAll(dir)
			}
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(dir)
		}
	}
}

func (s *server) exited() bool {
	return s.cmd.ProcessState != nil || s.cmd.Process.Signal(syscall.Signal(0)) != nil
}

func (s *server) stop() {
	if s.db != nil {
		s.db.Close()
	}
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
	os.RemoveAll(s.dir)
}

func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// spawn starts a process that the kernel kills when this test binary
// exits, even by a panic or a test timeout, so that no mariadbd outlives
// its tests. The kernel ties that to the thread that started the process,
// so the process is started from a thread that never exits.
func spawn(bin string, args []string) (*exec.Cmd, error) {
	type result struct {
		cmd *exec.Cmd
		err error
	}
	done := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the binary
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		done <- result{cmd, cmd.Start()}
		select {} // keep the thread, and with it the parent-death signal's tie
	}()
	r := <-done
	return r.cmd, r.err
}
