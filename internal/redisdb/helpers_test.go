package redisdb

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/warble/warble/internal/warble"
)

// mustSignup creates a user with the password "password123" and returns it.
func mustSignup(tb testing.TB, db *DB, username string) *warble.User {
	tb.Helper()
	p, err := NewAuthService(db).Signup(context.Background(), warble.SignupInput{Username: username, Password: "password123"})
	if err != nil {
		tb.Fatalf("Signup(%q): %v", username, err)
	}
	return p.User
}

// snapshot returns every key Redis holds with a rendering of its type,
// value and whether it expires, so that a test can check that a failed call
// wrote nothing. It reads values by type rather than with DUMP, so that it
// also works on the embedded in-memory Redis.
func snapshot(tb testing.TB, db *DB) map[string]string {
	tb.Helper()
	ctx := context.Background()
	keys, err := db.client.Keys(ctx, "*").Result()
	if err != nil {
		tb.Fatal(err)
	}
	snap := make(map[string]string, len(keys))
	for _, k := range keys {
		var v any
		typ, err := db.client.Type(ctx, k).Result()
		if err == nil {
			switch typ {
			case "string":
				v, err = db.client.Get(ctx, k).Result()
			case "hash":
				v, err = db.client.HGetAll(ctx, k).Result() // fmt prints maps sorted
			case "set":
				var members []string
				members, err = db.client.SMembers(ctx, k).Result()
				slices.Sort(members)
				v = members
			case "zset":
				v, err = db.client.ZRangeWithScores(ctx, k, 0, -1).Result()
			case "list":
				v, err = db.client.LRange(ctx, k, 0, -1).Result()
			default:
				err = fmt.Errorf("unexpected type %s", typ)
			}
		}
		if err != nil {
			tb.Fatalf("snapshot of %s: %v", k, err)
		}
		expires := db.client.TTL(ctx, k).Val() > 0
		snap[k] = fmt.Sprintf("%s %v expires=%v", typ, v, expires)
	}
	return snap
}

// assertUnchanged fails tb if Redis differs from the snapshot before.
func assertUnchanged(tb testing.TB, db *DB, before map[string]string, what string) {
	tb.Helper()
	after := snapshot(tb, db)
	for k, v := range after {
		if old, ok := before[k]; !ok {
			tb.Errorf("%s wrote key %s", what, k)
		} else if old != v {
			tb.Errorf("%s changed key %s", what, k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			tb.Errorf("%s deleted key %s", what, k)
		}
	}
}

// mustFollow makes followerID follow followeeID.
func mustFollow(tb testing.TB, db *DB, followerID, followeeID string) {
	tb.Helper()
	if err := NewFollowService(db).Follow(context.Background(), followerID, followeeID); err != nil {
		tb.Fatalf("Follow(%s, %s): %v", followerID, followeeID, err)
	}
}
