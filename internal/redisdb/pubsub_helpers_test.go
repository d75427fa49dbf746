package redisdb

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
)

// listen subscribes to channels as the hub does (SSUBSCRIBE on a cluster,
// where each channel's messages come from the master of its slot, so each
// gets a connection of its own here), waits until Redis confirms, and
// returns their messages, merged. The subscriptions end with t.
func listen(t testing.TB, db *DB, channels ...string) <-chan *redis.Message {
	t.Helper()
	ctx := context.Background()
	var subs []*redis.PubSub
	if db.sharded {
		for _, ch := range channels {
			subs = append(subs, db.client.SSubscribe(ctx, ch))
		}
	} else {
		subs = append(subs, db.client.Subscribe(ctx, channels...))
	}
	out := make(chan *redis.Message, 1024)
	var wg sync.WaitGroup
	for _, ps := range subs {
		t.Cleanup(func() { ps.Close() })
		n := 1
		if !db.sharded {
			n = len(channels)
		}
		for range n {
			if _, err := ps.Receive(ctx); err != nil { // the confirmation
				t.Fatal(err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range ps.Channel() {
				out <- m
			}
		}()
	}
	go func() { wg.Wait(); close(out) }()
	return out
}

// nextMessage returns the next message of msgs. Its deadline only keeps a
// broken build from hanging; it asserts nothing.
func nextMessage(t testing.TB, msgs <-chan *redis.Message) *redis.Message {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatal("the subscription ended")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
		return nil
	}
}

// numSub returns how many subscribers Redis counts on a timeline or hub
// channel: on a cluster, to the shard channel on its master.
func numSub(t testing.TB, db *DB, channel string) int64 {
	t.Helper()
	n, err := redistest.NumSub(context.Background(), db.client, channel)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// serverChannels returns, sorted, the channels that Redis has subscribers
// on: on a cluster, the shard channels of every master (the hub's anchors,
// classic channels, are not among them).
func serverChannels(t testing.TB, db *DB) []string {
	t.Helper()
	ctx := context.Background()
	var chans []string
	if cc, ok := db.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			found, err := m.PubSubShardChannels(ctx, "*").Result()
			mu.Lock()
			chans = append(chans, found...)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	} else {
		var err error
		if chans, err = db.client.PubSubChannels(ctx, "*").Result(); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(chans)
	return chans
}

// pubsubConns returns how many pub/sub connections Redis has from clients,
// on each node of a cluster, by address.
func pubsubConns(t testing.TB, db *DB) map[string]int {
	t.Helper()
	ctx := context.Background()
	count := func(c *redis.Client) int {
		list, err := c.Do(ctx, "client", "list", "type", "pubsub").Text()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
			if strings.TrimSpace(line) != "" {
				n++
			}
		}
		return n
	}
	out := map[string]int{}
	switch c := db.client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			n := count(node)
			mu.Lock()
			out[node.Options().Addr] = n
			mu.Unlock()
			return nil
		})
	case *redis.Client:
		out[c.Options().Addr] = count(c)
	}
	return out
}

// killPubsubConns closes every client pub/sub connection on the Redis
// side (on every node of a cluster), as a network failure would.
func killPubsubConns(db *DB) error {
	ctx := context.Background()
	if cc, ok := db.client.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
			return node.Do(ctx, "client", "kill", "type", "pubsub").Err()
		})
	}
	return db.client.Do(ctx, "client", "kill", "type", "pubsub").Err()
}
