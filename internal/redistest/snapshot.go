package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Snapshot returns every key Redis holds with a rendering of its type,
// value and whether it expires, so that a test can check that a failed call
// wrote nothing. It reads values by type rather than with DUMP, so that it
// also works on the embedded in-memory Redis.
func Snapshot(tb testing.TB, c redis.Cmdable) map[string]string {
	tb.Helper()
	ctx := context.Background()
	keys, err := Keys(ctx, c, "*")
	if err != nil {
		tb.Fatal(err)
	}
	snap := make(map[string]string, len(keys))
	for _, k := range keys {
		var v any
		typ, err := c.Type(ctx, k).Result()
		if typ == "none" {
			// Deleted since it was listed, by a fan-out worker or the
			// like at work meanwhile (the reads are not one step): it is
			// not there.
			continue
		}
		if err == nil {
			switch typ {
			case "string":
				v, err = c.Get(ctx, k).Result()
			case "hash":
				v, err = c.HGetAll(ctx, k).Result() // fmt prints maps sorted
			case "set":
				var members []string
				members, err = c.SMembers(ctx, k).Result()
				slices.Sort(members)
				v = members
			case "zset":
				v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
			case "list":
				v, err = c.LRange(ctx, k, 0, -1).Result()
			case "stream":
				v, err = c.XRange(ctx, k, "-", "+").Result()
			default:
				err = fmt.Errorf("unexpected type %s", typ)
			}
		}
		if errors.Is(err, redis.Nil) {
			continue // deleted between its TYPE and its read
		}
		if err != nil {
			tb.Fatalf("snapshot of %s: %v", k, err)
		}
		expires := c.TTL(ctx, k).Val() > 0
		snap[k] = fmt.Sprintf("%s %v expires=%v", typ, v, expires)
	}
	return snap
}

// AssertUnchanged fails tb if Redis differs from before, a Snapshot; what
// names the operation that was to write nothing.
func AssertUnchanged(tb testing.TB, c redis.Cmdable, before map[string]string, what string) {
	tb.Helper()
	for _, d := range Diff(before, Snapshot(tb, c)) {
		switch d.Change {
		case '+':
			tb.Errorf("%s wrote key %s", what, d.Key)
		case '~':
			tb.Errorf("%s changed key %s", what, d.Key)
		default:
			tb.Errorf("%s deleted key %s", what, d.Key)
		}
	}
}

// KeyChange is a key that differs between two snapshots: Change is '+'
// (added), '~' (changed) or '-' (removed).
type KeyChange struct {
	Change byte
	Key    string
}

func (k KeyChange) String() string { return string(k.Change) + k.Key }

// Diff returns the keys that differ between two maps of key to value
// (Snapshots, or digests of the values), sorted by key.
func Diff(before, after map[string]string) []KeyChange {
	var changes []KeyChange
	for k, v := range after {
		if old, ok := before[k]; !ok {
			changes = append(changes, KeyChange{'+', k})
		} else if old != v {
			changes = append(changes, KeyChange{'~', k})
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			changes = append(changes, KeyChange{'-', k})
		}
	}
	slices.SortFunc(changes, func(a, b KeyChange) int { return strings.Compare(a.Key, b.Key) })
	return changes
}

// Keys returns the keys that match pattern, as KEYS does, on every master
// of a cluster.
func Keys(ctx context.Context, c redis.Cmdable, pattern string) ([]string, error) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return c.Keys(ctx, pattern).Result()
	}
	var mu sync.Mutex
	var keys []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		found, err := m.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, found...)
		mu.Unlock()
		return err
	})
	return keys, err
}

// NumSub returns how many subscribers Redis counts on channel: a classic
// channel on one server; on a cluster, the shard channel on the master of
// its slot, the only node that knows them.
func NumSub(ctx context.Context, c redis.UniversalClient, channel string) (int64, error) {
	var counts map[string]int64
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		m, merr := cc.MasterForKey(ctx, channel)
		if merr != nil {
			return 0, merr
		}
		counts, err = m.PubSubShardNumSub(ctx, channel).Result()
	} else {
		counts, err = c.PubSubNumSub(ctx, channel).Result()
	}
	return counts[channel], err
}
