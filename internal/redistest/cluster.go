package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
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

	"github.com/redis/go-redis/v9"
)

// ClusterOptions shape a test cluster.
type ClusterOptions struct {
	// Masters is how many masters share the 16384 slots; default 3.
	Masters int
	// Replicas is how many replicas each master has; default 0.
	Replicas int
	// NodeTimeout is the cluster-node-timeout: how long a node may be
	// unreachable before its replicas fail it over. Default 1s, so that
	// failover tests see a failover within seconds.
	NodeTimeout time.Duration
}

// Cluster is a real Redis Cluster of redis-server processes on loopback,
// for tests that need one.
type Cluster struct {
	// Nodes are the cluster's nodes: the masters first, in slot order,
	// then the replicas (Replicas of them per master, in the masters'
	// order).
	Nodes []*ClusterNode
	// URL names every master in go-redis's cluster URL form,
	// redis://host:port?addr=host:port&addr=host:port, as REDIS_URL takes it.
	URL string

	opts ClusterOptions
	dir  string
}

// ClusterNode is one redis-server of a Cluster.
type ClusterNode struct {
	// Addr is the node's host:port.
	Addr string
	// ID is the node's cluster id.
	ID string

	bin    string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	port   int
	opts   ClusterOptions
}

// clusterEnv is the switch that runs every New-based test on a cluster.
const clusterEnv = "REDISTEST_CLUSTER"

// OnCluster reports whether this test binary runs its tests on a Redis
// Cluster (REDISTEST_CLUSTER=1): then New hands every test the same
// 3-master cluster, flushed.
func OnCluster() bool { return os.Getenv(clusterEnv) == "1" }

// NewCluster starts a Redis Cluster for tb and stops it when tb ends. It
// returns once every node agrees the cluster is ok, every replica has
// synced with its master, and a cluster client sees every slot.
func NewCluster(tb testing.TB, opts ClusterOptions) *Cluster {
	tb.Helper()
	c, err := startCluster(opts)
	if c != nil {
		tb.Cleanup(func() {
			if tb.Failed() {
				c.logTo(tb)
			}
			c.stop()
		})
	}
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return c
}

// shared holds the clusters that New hands out under REDISTEST_CLUSTER=1.
// A test usually needs one; one that compares two Warbles calls New twice
// and gets a second cluster, which is started at the first such call and
// then serves every test that needs a second. inUse counts the clusters
// held by the running tests (which do not run in parallel): a test's n-th
// New takes cluster n, and gives it back when it ends.
var shared struct {
	mu       sync.Mutex
	clusters []*Cluster
	inUse    int
}

// sharedCluster returns the next cluster for tb under REDISTEST_CLUSTER=1,
// starting it at its first use. The clusters live as long as the test
// binary: their processes are killed when the binary exits, however it
// exits (see spawn), and Main removes their files.
func sharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	n := shared.inUse
	if n == len(shared.clusters) {
		c, err := startCluster(ClusterOptions{})
		if err != nil {
			if c != nil {
				c.stop()
			}
			tb.Fatalf("redistest: %s=1: %v", clusterEnv, err)
		}
		shared.clusters = append(shared.clusters, c)
	}
	shared.inUse++
	tb.Cleanup(func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		shared.inUse--
	})
	return shared.clusters[n]
}

// Main runs a package's tests (call it from TestMain) and then stops the
// clusters they shared, if they started any, and removes their files. It
// calls each of also then too: the cleanups of other shared test servers,
// such as mysqltest.Stop, which cannot each call m.Run.
func Main(m *testing.M, also ...func()) {
	code := m.Run()
	for _, c := range shared.clusters {
		c.stop()
	}
	for _, f := range also {
		f()
	}
	os.Exit(code)
}

// StartCluster starts a Redis Cluster for a program that is not a test (the
// conformance suite's and the load tool's, through cmd/redis-cluster);
// Stop stops it. Its processes die with the program, however it exits.
func StartCluster(opts ClusterOptions) (*Cluster, error) {
	c, err := startCluster(opts)
	if err != nil && c != nil {
		c.stop()
	}
	return c, err
}

// Stop kills every node of a cluster from StartCluster and removes its
// files.
func (c *Cluster) Stop() { c.stop() }

func startCluster(opts ClusterOptions) (*Cluster, error) {
	if opts.Masters <= 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = time.Second
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("a cluster needs redis-server: %w", err)
	}
	removeStaleClusterDirs()
	dir, err := os.MkdirTemp("", fmt.Sprintf("redistest-cluster-%d-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, dir: dir}
	n := opts.Masters * (1 + opts.Replicas)
	for i := range n {
		node := &ClusterNode{bin: bin, dir: filepath.Join(dir, strconv.Itoa(i)), opts: opts}
		if err := os.Mkdir(node.dir, 0o700); err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, node)
		if err := node.startOnFreePort(); err != nil {
			return c, err
		}
	}
	addrs := make([]string, opts.Masters)
	for i, node := range c.Masters() {
		addrs[i] = node.Addr
	}
	c.URL = "redis://" + addrs[0]
	for i, a := range addrs[1:] {
		if i == 0 {
			c.URL += "?"
		} else {
			c.URL += "&"
		}
		c.URL += "addr=" + a
	}
	if err := c.form(); err != nil {
		return c, err
	}
	return c, nil
}

// Masters returns the nodes that were made masters when the cluster
// formed (after a failover, a replica may have taken one's place).
func (c *Cluster) Masters() []*ClusterNode { return c.Nodes[:c.opts.Masters] }

// Options returns go-redis options for the cluster.
func (c *Cluster) Options() *redis.ClusterOptions {
	opts, err := redis.ParseClusterURL(c.URL)
	if err != nil {
		panic(err) // the URL is ours
	}
	return opts
}

// Client returns a new client of the cluster, closed when tb ends, with a
// SlotGuard.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(c.Options())
	cc.AddHook(NewSlotGuard(tb))
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Flush empties every master (and so its replicas).
func (c *Cluster) Flush(ctx context.Context) error {
	for _, node := range c.Nodes {
		if node.cmd == nil {
			continue // killed by a test
		}
		nc := node.client()
		role, err := nc.Do(ctx, "ROLE").Slice()
		if err == nil && len(role) > 0 && role[0] == "master" {
			err = nc.FlushAll(ctx).Err()
		}
		nc.Close()
		if err != nil {
			return fmt.Errorf("flush %s: %w", node.Addr, err)
		}
	}
	return nil
}

// NodeOf returns the node that serves key's slot now, as the cluster says.
func (c *Cluster) NodeOf(ctx context.Context, key string) (*ClusterNode, error) {
	return c.nodeOfSlot(ctx, Slot(key))
}

// stop kills every node and removes the cluster's files.
func (c *Cluster) stop() {
	for _, node := range c.Nodes {
		node.kill()
	}
	os.RemoveAll(c.dir)
}

// logTo hands tb what the nodes logged beyond their start.
func (c *Cluster) logTo(tb testing.TB) {
	for _, node := range c.Nodes {
		if log := serverLog(filepath.Join(node.dir, "redis.log")); log != "" {
			tb.Logf("redistest: log of cluster node %s:\n%s", node.Addr, log)
		}
	}
}

// form makes one cluster of the started nodes: each master gets its share
// of the slots and a config epoch of its own (as redis-cli --cluster create
// does, so that no two masters start with the same epoch), every node
// meets the first, the replicas follow their masters, and it waits until
// the whole cluster says it is ok.
func (c *Cluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	masters := c.Masters()
	for i, node := range c.Nodes {
		nc := node.client()
		id, err := nc.Do(ctx, "CLUSTER", "MYID").Text()
		if err == nil && i < len(masters) {
			first, last := i*16384/len(masters), (i+1)*16384/len(masters)-1
			err = nc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", first, last).Err()
			if err == nil {
				err = nc.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err()
			}
		}
		if err == nil && i > 0 {
			host, port, _ := net.SplitHostPort(c.Nodes[0].Addr)
			err = nc.Do(ctx, "CLUSTER", "MEET", host, port).Err()
		}
		nc.Close()
		if err != nil {
			return fmt.Errorf("form cluster: node %s: %w", node.Addr, err)
		}
		node.ID = id
	}
	// A replica can follow a master only once it knows it.
	for i, node := range c.Nodes[len(masters):] {
		master := masters[i/c.opts.Replicas]
		err := waitFor(ctx, func() error {
			nc := node.client()
			defer nc.Close()
			return nc.Do(ctx, "CLUSTER", "REPLICATE", master.ID).Err()
		})
		if err != nil {
			return fmt.Errorf("form cluster: replica %s of %s: %w", node.Addr, master.Addr, err)
		}
	}
	return c.WaitHealthy(ctx)
}

// WaitHealthy waits until every live node says cluster_state:ok and knows
// every live node, every live replica's link to its master is up, and a
// new cluster client routes every slot to a node that answers.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	live := 0
	for _, node := range c.Nodes {
		if node.cmd != nil {
			live++
		}
	}
	for _, node := range c.Nodes {
		if node.cmd == nil {
			continue
		}
		err := waitFor(ctx, func() error {
			nc := node.client()
			defer nc.Close()
			info, err := nc.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return errors.New("cluster_state is not ok")
			}
			if !strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", live)) &&
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\n", live)) {
				// Nodes killed by a test stay known; only a fresh
				// cluster must know exactly its live nodes.
				if live == len(c.Nodes) {
					return errors.New("not every node is known yet")
				}
			}
			repl, err := nc.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
				return errors.New("replica not in sync with its master")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("cluster node %s: %w", node.Addr, err)
		}
	}
	cc := redis.NewClusterClient(c.Options())
	defer cc.Close()
	return waitFor(ctx, func() error {
		cc.ReloadState(ctx)
		shards, err := cc.ClusterShards(ctx).Result()
		if err != nil {
			return err
		}
		covered := 0
		for _, sh := range shards {
			for _, s := range sh.Slots {
				covered += int(s.End - s.Start + 1)
			}
		}
		if covered != 16384 {
			return fmt.Errorf("%d of 16384 slots served", covered)
		}
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
	})
}

// waitFor retries f until it succeeds or ctx ends, returning f's last error
// then.
func waitFor(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// client returns a single-node client of the node.
func (n *ClusterNode) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.Addr, DialerRetries: 1, MaxRetries: -1})
}

// Client returns a single-node client of the node, closed when tb ends.
func (n *ClusterNode) Client(tb testing.TB) *redis.Client {
	nc := n.client()
	tb.Cleanup(func() { nc.Close() })
	return nc
}

// Kill kills the node with SIGKILL, as a crash would.
func (n *ClusterNode) Kill() { n.kill() }

func (n *ClusterNode) kill() {
	if n.cmd != nil {
		n.cmd.Process.Kill()
		<-n.exited
	}
	n.cmd = nil
}

// startOnFreePort starts the node on a port whose cluster bus port (port +
// 10000) is free too. Another process can take either between the probe
// and the start, so a node that does not come up is tried again elsewhere.
func (n *ClusterNode) startOnFreePort() error {
	var last error
	for range 20 {
		port := 20000 + rand.N(35000) // its bus port stays below 65536
		if !portFree(port) || !portFree(port+10000) {
			continue
		}
		n.port, n.Addr = port, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if last = n.start(); last == nil {
			return nil
		}
		n.kill()
	}
	return fmt.Errorf("start a cluster node: %w", last)
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func (n *ClusterNode) start() error {
	os.Remove(filepath.Join(n.dir, "nodes.conf"))
	if err := n.run(); err != nil {
		return err
	}
	// Dial before pinging, so that go-redis does not log every refused
	// dial of the wait.
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", n.Addr, time.Second)
		if err == nil {
			conn.Close()
			nc := n.client()
			err = nc.Ping(context.Background()).Err()
			nc.Close()
		}
		if err == nil {
			return nil
		}
		select {
		case <-n.exited:
			return fmt.Errorf("redis-server on port %d exited: %s", n.port, serverLog(filepath.Join(n.dir, "redis.log")))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on port %d did not answer: %w", n.port, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// run starts the node's redis-server on its port with its directory.
func (n *ClusterNode) run() error {
	cmd, err := spawn(n.bin, []string{
		"--port", strconv.Itoa(n.port),
		"--bind", "127.0.0.1",
		"--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
		"--cluster-node-timeout", strconv.FormatInt(n.opts.NodeTimeout.Milliseconds(), 10),
		// A replica may take over however long it was cut off: failover
		// tests kill masters on purpose.
		"--cluster-replica-validity-factor", "0",
		// Replicas sync at once, not after the default 5s wait for others.
		"--repl-diskless-sync-delay", "0",
		"--dir", n.dir,
		"--save", "",
		"--appendonly", "no",
		"--loglevel", "notice",
		"--logfile", filepath.Join(n.dir, "redis.log"),
	})
	if err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
	return nil
}

// Restart starts a killed node again on its port, with its cluster
// configuration file, so that it rejoins the cluster (as a replica of
// whoever took its slots over).
func (n *ClusterNode) Restart(tb testing.TB) {
	tb.Helper()
	if err := n.run(); err != nil {
		tb.Fatalf("redistest: restart %s: %v", n.Addr, err)
	}
}

// spawn starts a process that the kernel kills when this test binary
// exits, even by a panic or a test timeout, so that no redis-server
// outlives its tests. The kernel ties that to the thread that started the
// process, so every process is started from one thread that never exits.
func spawn(bin string, args []string) (*exec.Cmd, error) {
	spawner.once.Do(func() {
		spawner.requests = make(chan spawnRequest)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the binary
			for r := range spawner.requests {
				cmd := exec.Command(r.bin, r.args...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				cmd.Stderr = os.Stderr // what it says before its log file is open
				r.done <- spawnResult{cmd, cmd.Start()}
			}
		}()
	})
	done := make(chan spawnResult)
	spawner.requests <- spawnRequest{bin, args, done}
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	return r.cmd, nil
}

var spawner struct {
	once     sync.Once
	requests chan spawnRequest
}

type spawnRequest struct {
	bin  string
	args []string
	done chan<- spawnResult
}

type spawnResult struct {
	cmd *exec.Cmd
	err error
}

// removeStaleClusterDirs removes the files of clusters whose test binary
// died without removing them (a panic skips TestMain's cleanup).
func removeStaleClusterDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "redistest-cluster-*"))
	for _, d := range dirs {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "redistest-cluster-"), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(d)
		}
	}
}

// MoveSlot moves a hash slot, with its keys, from the master that serves
// it to the master to, as a resharding does: to imports it, the source
// migrates it, its keys are moved with MIGRATE, and every master is told
// the new owner.
func (c *Cluster) MoveSlot(ctx context.Context, slot int, to *ClusterNode) error {
	from, err := c.nodeOfSlot(ctx, slot)
	if err != nil {
		return err
	}
	if from == to {
		return nil
	}
	src, dst := from.client(), to.client()
	defer src.Close()
	defer dst.Close()
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.ID).Err(); err != nil {
		return fmt.Errorf("move slot %d: %w", slot, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID).Err(); err != nil {
		return fmt.Errorf("move slot %d: %w", slot, err)
	}
	host, port, _ := net.SplitHostPort(to.Addr)
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return fmt.Errorf("move slot %d: %w", slot, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("move slot %d: %w", slot, err)
		}
	}
	// The new owner first, then the old one, then the rest, as
	// redis-cli does.
	for _, node := range append([]*ClusterNode{to, from}, c.Masters()...) {
		if node.cmd == nil {
			continue
		}
		nc := node.client()
		err := nc.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID).Err()
		nc.Close()
		if err != nil {
			return fmt.Errorf("move slot %d: tell %s: %w", slot, node.Addr, err)
		}
	}
	return nil
}

// nodeOfSlot returns the node that serves slot, as the cluster says.
func (c *Cluster) nodeOfSlot(ctx context.Context, slot int) (*ClusterNode, error) {
	for _, node := range c.Nodes {
		if node.cmd == nil {
			continue
		}
		nc := node.client()
		shards, err := nc.ClusterShards(ctx).Result()
		nc.Close()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			for _, s := range sh.Slots {
				if int(s.Start) > slot || slot > int(s.End) {
					continue
				}
				for _, sn := range sh.Nodes {
					if sn.Role != "master" || sn.Health != "online" {
						continue
					}
					for _, n := range c.Nodes {
						if n.Addr == net.JoinHostPort(sn.IP, strconv.FormatInt(sn.Port, 10)) {
							return n, nil
						}
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("no node serves slot %d", slot)
}

// ReplicaOf returns a live replica of master, as the replicas say.
func (c *Cluster) ReplicaOf(ctx context.Context, master *ClusterNode) (*ClusterNode, error) {
	_, port, _ := net.SplitHostPort(master.Addr)
	for _, node := range c.Nodes {
		if node.cmd == nil || node == master {
			continue
		}
		nc := node.client()
		info, err := nc.Info(ctx, "replication").Result()
		nc.Close()
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port+"\r") {
			return node, nil
		}
	}
	return nil, fmt.Errorf("no replica of %s", master.Addr)
}

// IsMaster reports whether the node says it is a master now.
func (n *ClusterNode) IsMaster(ctx context.Context) bool {
	nc := n.client()
	defer nc.Close()
	info, err := nc.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "role:master")
}

// Signal sends sig to the node's process: SIGSTOP and SIGCONT freeze and
// thaw it, as a host that stops answering for a while would.
func (n *ClusterNode) Signal(sig os.Signal) error {
	if n.cmd == nil {
		return fmt.Errorf("node %s is not running", n.Addr)
	}
	return n.cmd.Process.Signal(sig)
}
