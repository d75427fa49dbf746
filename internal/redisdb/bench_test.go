package redisdb

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/warble"
)

// dumpForRawSeed renders every key but the sessions with its type and
// value, password hashes checked against "password123" and then blanked
// (their salts differ), for comparing a raw seed with the services' writes.
func dumpForRawSeed(tb testing.TB, db *DB) map[string]string {
	tb.Helper()
	ctx := context.Background()
	keys, err := db.client.Keys(ctx, "*").Result()
	if err != nil {
		tb.Fatal(err)
	}
	out := make(map[string]string)
	for _, k := range keys {
		if strings.HasPrefix(k, prefix+"session:") || strings.HasSuffix(k, ":sessions") {
			continue
		}
		typ := db.client.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = db.client.Get(ctx, k).Val()
		case "hash":
			h := db.client.HGetAll(ctx, k).Val()
			if pw, ok := h["password"]; ok {
				if bcrypt.CompareHashAndPassword([]byte(pw), []byte("password123")) != nil {
					tb.Errorf("%s: password field is not a bcrypt hash of the password", k)
				}
				h["password"] = "<bcrypt>"
			}
			v = h
		case "zset":
			v = db.client.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "set":
			m := db.client.SMembers(ctx, k).Val()
			slices.Sort(m)
			v = m
		default:
			v = "?"
		}
		if db.client.TTL(ctx, k).Val() > 0 {
			typ += " (expires)"
		}
		out[k] = fmt.Sprintf("%s %v", typ, v)
	}
	return out
}

// TestRawSeedMatchesServices checks that RawSignups and RawFollows leave
// Redis exactly as Signup and Follow do (sessions aside), so that the load
// tool's big raw-seeded graphs are graphs the server reads like its own.
func TestRawSeedMatchesServices(t *testing.T) {
	ctx := context.Background()
	clock := func() time.Time { return time.UnixMilli(1_700_000_000_123) }

	want := newTestDB(t, Options{Now: clock})
	ada, bob := mustSignup(t, want, "Ada"), mustSignup(t, want, "bob")
	posts := NewPostService(want)
	if _, err := posts.CreatePost(ctx, ada.ID, "hello"); err != nil {
		t.Fatal(err)
	}
	mustFollow(t, want, bob.ID, ada.ID)
	if _, err := posts.CreatePost(ctx, ada.ID, "again"); err != nil {
		t.Fatal(err)
	}

	got := newTestDB(t, Options{Now: clock})
	ids, err := got.RawSignups(ctx, []string{"Ada", "bob"}, "password123")
	if err != nil {
		t.Fatal(err)
	}
	posts = NewPostService(got)
	if _, err := posts.CreatePost(ctx, ids[0], "hello"); err != nil {
		t.Fatal(err)
	}
	if err := got.RawFollows(ctx, ids[0], ids[1:]); err != nil {
		t.Fatal(err)
	}
	if _, err := posts.CreatePost(ctx, ids[0], "again"); err != nil {
		t.Fatal(err)
	}

	w, g := dumpForRawSeed(t, want), dumpForRawSeed(t, got)
	for _, k := range slices.Sorted(maps.Keys(w)) {
		if g[k] != w[k] {
			t.Errorf("%s: raw seed has %q, the services wrote %q", k, g[k], w[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(g)) {
		if _, ok := w[k]; !ok {
			t.Errorf("%s: raw seed wrote it (%q), the services did not", k, g[k])
		}
	}

	// The raw users work through the services.
	p, err := NewAuthService(got).Login(ctx, warble.LoginInput{Username: "BOB", Password: "password123"})
	if err != nil || p.User.ID != ids[1] || p.User.FollowingCount != 1 {
		t.Errorf("login as a raw user: %+v, %v", p, err)
	}
	if _, err := got.RawSignups(ctx, []string{"ada"}, "password123"); err == nil {
		t.Error("RawSignups took a username that was taken")
	}
	if err := got.RawFollows(ctx, ids[0], []string{ids[0]}); warble.ErrorCode(err) != warble.EINVALID {
		t.Errorf("RawFollows of oneself: %v", err)
	}
	if err := got.RawFollows(ctx, "999", ids[:1]); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Errorf("RawFollows of no one: %v", err)
	}
}

// TestRawFollowsManyAndWatch seeds more followers than one pipeline holds
// (with small pipelines: the embedded Redis is slow with many keys), then watches a post reach them, by hand out of order and then through the
// real asynchronous fan-out.
func TestRawFollowsManyAndWatch(t *testing.T) {
	ctx := context.Background()
	db := newAsyncTestDB(t)
	author := mustSignup(t, db, "author")
	const chunk = 50
	n := 2*watchChunk + 17
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("fan%d", i)
	}
	fans, err := db.rawSignups(ctx, names, "password123", chunk)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.rawFollows(ctx, author.ID, fans, chunk); err != nil {
		t.Fatal(err)
	}
	u, err := NewUserService(db).FindUserByID(ctx, author.ID)
	if err != nil || u.FollowersCount != n {
		t.Fatalf("author after raw follows: %+v, %v", u, err)
	}
	scores := db.client.ZRangeWithScores(ctx, followersKey(author.ID), 0, -1).Val()
	for i := 1; i < len(scores); i++ {
		if scores[i].Score <= scores[i-1].Score {
			t.Fatalf("follow times tie or go back at %d: %v, %v", i, scores[i-1], scores[i])
		}
	}
	if s := db.client.ZScore(ctx, followingKey(fans[5]), author.ID).Val(); s != scores[5].Score {
		t.Errorf("following score %v, followers score %v", s, scores[5].Score)
	}

	w, err := db.WatchFanOut(ctx, author.ID)
	if err != nil || w.Followers() != n {
		t.Fatalf("WatchFanOut: %d followers, %v", w.Followers(), err)
	}
	w.Reset("x:1")
	poll := func(want int) {
		t.Helper()
		if left, err := w.Poll(ctx); err != nil || left != want {
			t.Fatalf("Poll = %d, %v; want %d", left, err, want)
		}
	}
	poll(n)
	deliver := func(followers []string) {
		pipe := db.client.Pipeline()
		for _, f := range followers {
			pipe.ZAdd(ctx, homeKey(f), redis.Z{Score: 1, Member: "x:1"})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deliver(fans[:300])
	deliver(fans[n-1:]) // out of walk order: seen only once the walk gets there
	poll(n - 300)
	deliver(fans[300 : n-1])
	poll(0)

	post, err := NewPostService(db).CreatePost(ctx, author.ID, "to everyone")
	if err != nil {
		t.Fatal(err)
	}
	w.Reset(post.ID)
	poll(n)
	drainFanOut(t, db)
	poll(0)

	got, took, err := db.RawFanOut(ctx, author.ID, "bench:1")
	if err != nil || got != n || took <= 0 {
		t.Errorf("RawFanOut = %d, %v, %v", got, took, err)
	}
	if c := db.client.ZScore(ctx, homeKey(fans[0]), "bench:1"); c.Err() != redis.Nil {
		t.Errorf("RawFanOut left its member behind: %v", c.Err())
	}
}
