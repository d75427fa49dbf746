package app

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
)

// TestOpenRedisCluster checks what REDIS_URL makes of a cluster: a URL of
// go-redis's cluster form gives a cluster client, one that asks for reads
// from replicas also a second client that does them (and the first reads
// from masters only), and a plain URL stays one server.
func TestOpenRedisCluster(t *testing.T) {
	if os.Getenv("REDISTEST_EMBEDDED") == "1" {
		t.Skip("needs redis-server processes for a Redis Cluster")
	}
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") == "" {
		t.Skip("needs redis-server for a Redis Cluster")
	}
	var c *redistest.Cluster
	if redistest.OnCluster() {
		c = redistest.New(t).Cluster()
	} else {
		c = redistest.NewCluster(t, redistest.ClusterOptions{})
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(url string) redisClients {
		t.Helper()
		clients, closeRedis, err := openRedis(url, log)
		if err != nil {
			t.Fatalf("openRedis(%s): %v", url, err)
		}
		t.Cleanup(closeRedis)
		return clients
	}

	plain := open(c.URL)
	cc, ok := plain.primary.(*redis.ClusterClient)
	if !ok || plain.replicas != nil {
		t.Fatalf("cluster URL: %T and %v, want a cluster client alone", plain.primary, plain.replicas)
	}
	if err := cc.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if o := cc.Options(); o.ReadTimeout == 0 || o.MaxRetries != 1 || o.DialerRetries != 1 {
		t.Errorf("cluster client options %+v lack the defaults of redisOptions", o)
	}

	ro := open(c.URL + "&read_only=true")
	primary, ok1 := ro.primary.(*redis.ClusterClient)
	replicas, ok2 := ro.replicas.(*redis.ClusterClient)
	if !ok1 || !ok2 {
		t.Fatalf("read_only URL: %T and %T, want two cluster clients", ro.primary, ro.replicas)
	}
	if primary.Options().ReadOnly || !replicas.Options().ReadOnly {
		t.Errorf("read_only URL: primary ReadOnly=%v, replicas ReadOnly=%v; want false, true",
			primary.Options().ReadOnly, replicas.Options().ReadOnly)
	}
	// A cluster client adds the nodes it learns of to the array behind its
	// Addrs: two clients sharing one would write it at once at a failover.
	if unsafe.SliceData(primary.Options().Addrs) == unsafe.SliceData(replicas.Options().Addrs) {
		t.Error("read_only URL: the two clients share one array of seed addresses")
	}

	single := open("redis://" + c.Masters()[0].Addr)
	if _, ok := single.primary.(*redis.Client); !ok || single.replicas != nil {
		t.Errorf("plain URL: %T, want a client of one server", single.primary)
	}
}
