package redisdb

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

var update = flag.Bool("update", false, "rewrite testdata/layout.golden from what the test sees")

// TestLayout pins the Redis data layout: it runs a small scenario through the
// real services (users, follows, posts, sessions, an account over the pull
// threshold and over the follower bucket threshold, another under both)
// and compares every
// key Redis then holds, with its type, fields and expiry, against
// testdata/layout.golden. A change to the layout shows as a diff in review;
// refresh it with go test -run TestLayout -update.
func TestLayout(t *testing.T) {
	ctx := context.Background()
	// Two fan-out shards, as on a cluster, whatever the server: the layout
	// is the same on both.
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: 1, FanOutShards: 2, FollowerBucketThreshold: 1, FollowerBuckets: 2})
	auth := NewAuthService(db)
	ada, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	bob, err := auth.Signup(ctx, warble.SignupInput{Username: "Bob", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	if err := NewFollowService(db).Follow(ctx, bob.User.ID, ada.User.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := NewPostService(db).CreatePost(ctx, ada.User.ID, "hello"); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)
	// A second follower puts ada over the threshold: her next post is pulled.
	cy, err := auth.Signup(ctx, warble.SignupInput{Username: "cyd", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	if err := NewFollowService(db).Follow(ctx, cy.User.ID, ada.User.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := NewPostService(db).CreatePost(ctx, ada.User.ID, "hello, many"); err != nil {
		t.Fatal(err)
	}
	// The second follower also put ada over the follower bucket
	// threshold: the workers move her followers into buckets. Bob keeps
	// his one follower in one set.
	if err := NewFollowService(db).Follow(ctx, cy.User.ID, bob.User.ID); err != nil {
		t.Fatal(err)
	}
	drainFanOut(t, db)

	var lines []string
	keys, err := redistest.Keys(ctx, db.client, "*")
	if err != nil {
		t.Fatal(err)
	}
	hashes := regexp.MustCompile(`[0-9a-f]{64}`)
	for _, key := range keys {
		typ := db.client.Type(ctx, key).Val()
		line := fmt.Sprintf("%-28s %-6s", hashes.ReplaceAllString(key, "<sha256>"), typ)
		if typ == "hash" {
			fields := db.client.HKeys(ctx, key).Val()
			slices.Sort(fields)
			line += " " + strings.Join(fields, ",")
		}
		if ttl := db.client.TTL(ctx, key).Val(); ttl > 0 {
			line += " (expires)"
		}
		lines = append(lines, strings.TrimRight(line, " "))
	}
	slices.Sort(lines)
	lines = append(lines, "",
		"channels:",
		globalChannel,
		homeChannel(ada.User.ID),
		userChannel(ada.User.ID),
		revokedChannel,
		pullChannel,
		postsGoneChannel,
	)
	got := strings.Join(lines, "\n") + "\n"

	golden := filepath.Join("testdata", "layout.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestLayout -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("Redis layout changed; if that is intended, run go test -run TestLayout -update and review the diff.\ngot:\n%s\nwant:\n%s", got, want)
	}
}
