package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// dumpForRawSeed is redistest.Snapshot less the sessions, with password
// hashes checked against "password123" and then blanked (their salts
// differ), for comparing a raw seed with the services' writes.
func dumpForRawSeed(tb testing.TB, c redis.UniversalClient) map[string]string {
	tb.Helper()
	ctx := context.Background()
	out := redistest.Snapshot(tb, c)
	for k, v := range out {
		if strings.HasPrefix(k, "w:session:") || strings.Contains(k, "}:session:") || strings.HasSuffix(k, ":sessions") {
			delete(out, k)
			continue
		}
		if strings.HasSuffix(k, ":followers-log") {
			// Its entries' ids are times: the followers, in order.
			var fs []string
			for _, m := range c.XRange(ctx, k, "-", "+").Val() {
				f, _ := m.Values["f"].(string)
				fs = append(fs, f)
			}
			out[k] = "followers log " + strings.Join(fs, " ")
			continue
		}
		if !strings.HasPrefix(v, "hash ") {
			continue
		}
		if pw := c.HGet(ctx, k, "password").Val(); pw != "" {
			if bcrypt.CompareHashAndPassword([]byte(pw), []byte("password123")) != nil {
				tb.Errorf("%s: password field is not a bcrypt hash of the password", k)
			}
			out[k] = strings.ReplaceAll(v, pw, "<bcrypt>")
		}
	}
	return out
}

// newTestDB returns the services' DB on a fresh Redis, with the clock now.
func newTestDB(t *testing.T, now func() time.Time, async bool) *redisdb.DB {
	t.Helper()
	return redisdb.NewDB(redistest.New(t).Client(t), redisdb.Options{BcryptCost: bcrypt.MinCost, Now: now, AsyncFanOut: async})
}

// TestRawSeedMatchesServices checks that rawDB's signups and follows leave
// Redis exactly as Signup and Follow do (sessions aside), so that the load
// tool's big raw-seeded graphs are graphs the server reads like its own.
func TestRawSeedMatchesServices(t *testing.T) {
	ctx := context.Background()
	clock := func() time.Time { return time.UnixMilli(1_700_000_000_123) }

	want := newTestDB(t, clock, false)
	auth := redisdb.NewAuthService(want)
	signup := func(name string) *warble.User {
		p, err := auth.Signup(ctx, warble.SignupInput{Username: name, Password: "password123"})
		if err != nil {
			t.Fatal(err)
		}
		return p.User
	}
	ada, bob := signup("Ada"), signup("bob")
	posts := redisdb.NewPostService(want)
	if _, err := posts.CreatePost(ctx, ada.ID, "hello"); err != nil {
		t.Fatal(err)
	}
	if err := redisdb.NewFollowService(want).Follow(ctx, bob.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := posts.CreatePost(ctx, ada.ID, "again"); err != nil {
		t.Fatal(err)
	}

	got := newTestDB(t, clock, false)
	raw := newRawDB(got.Client())
	raw.now = clock
	ids, err := raw.signups(ctx, []string{"Ada", "bob"}, "password123")
	if err != nil {
		t.Fatal(err)
	}
	posts = redisdb.NewPostService(got)
	if _, err := posts.CreatePost(ctx, ids[0], "hello"); err != nil {
		t.Fatal(err)
	}
	if err := raw.follows(ctx, ids[0], ids[1:]); err != nil {
		t.Fatal(err)
	}
	if _, err := posts.CreatePost(ctx, ids[0], "again"); err != nil {
		t.Fatal(err)
	}

	w, g := dumpForRawSeed(t, want.Client()), dumpForRawSeed(t, got.Client())
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
	p, err := redisdb.NewAuthService(got).Login(ctx, warble.LoginInput{Username: "BOB", Password: "password123"})
	if err != nil || p.User.ID != ids[1] {
		t.Errorf("login as a raw user: %+v, %v", p, err)
	} else if c, err := redisdb.NewUserService(got).FindUserCounts(ctx, []string{p.User.ID}); err != nil || c[0].Following != 1 {
		t.Errorf("counts of a raw user: %+v, %v", c, err)
	}
	if _, err := raw.signups(ctx, []string{"ada"}, "password123"); err == nil {
		t.Error("raw signups took a username that was taken")
	}
	if err := raw.follows(ctx, ids[0], []string{ids[0]}); err == nil {
		t.Error("raw follows of oneself succeeded")
	}
	if err := raw.follows(ctx, "999", ids[:1]); err == nil {
		t.Error("raw follows of no one succeeded")
	}
}

// TestRawSeedMatchesServicesInBuckets is TestRawSeedMatchesServices for an
// account past the follower bucket threshold: the raw seed leaves its
// followers where the services and their workers leave them, whether the
// raw follows put them in buckets at once or move them there afterwards,
// and the services read them back.
func TestRawSeedMatchesServicesInBuckets(t *testing.T) {
	ctx := context.Background()
	const now = 1_700_000_000_123
	var at atomic.Int64
	at.Store(now)
	clock := func() time.Time { return time.UnixMilli(at.Load()) }
	opts := redisdb.Options{BcryptCost: bcrypt.MinCost, Now: clock, AsyncFanOut: true, FollowerBucketThreshold: 2, FollowerBuckets: 3}
	names := []string{"ada", "fan0", "fan1", "fan2", "fan3"}

	want := redisdb.NewDB(redistest.New(t).Client(t), opts)
	auth := redisdb.NewAuthService(want)
	var ids []string
	for _, name := range names {
		p, err := auth.Signup(ctx, warble.SignupInput{Username: name, Password: "password123"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.User.ID)
	}
	// Follow times as the raw seed gives them: a millisecond apart, the
	// last one now.
	for i, f := range ids[1:] {
		at.Store(now - int64(len(ids)-2-i))
		if err := redisdb.NewFollowService(want).Follow(ctx, f, ids[0]); err != nil {
			t.Fatal(err)
		}
	}
	at.Store(now)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		redisdb.NewWorker(want, redisdb.WorkerOptions{IdleLook: 10 * time.Millisecond}).Run(wctx)
	}()
	field, bucketed := keys.BucketedFollowers(3)
	for deadline := time.Now().Add(10 * time.Second); want.Client().HGet(ctx, keys.User(ids[0]), field).Val() != bucketed; {
		if time.Now().After(deadline) {
			t.Fatal("the workers did not move the followers into buckets")
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	<-done
	w := dumpForRawSeed(t, want.Client())
	for k, v := range w {
		if strings.HasPrefix(v, "stream ") && !strings.HasSuffix(k, ":followers-log") {
			delete(w, k) // the workers' stream, which the raw seed needs not
		}
	}

	for _, split := range []int{4, 1} { // all follows at once, or the one set first
		t.Run(fmt.Sprintf("split=%d", split), func(t *testing.T) {
			got := redisdb.NewDB(redistest.New(t).Client(t), opts)
			raw := newRawDB(got.Client())
			raw.now, raw.bucketThreshold, raw.buckets = clock, 2, 3
			rawIDs, err := raw.signups(ctx, names, "password123")
			if err != nil {
				t.Fatal(err)
			}
			// The raw seed times its follows back from now, per call.
			at.Store(now - int64(4-split))
			if err := raw.follows(ctx, rawIDs[0], rawIDs[1:1+split]); err != nil {
				t.Fatal(err)
			}
			at.Store(now)
			if err := raw.follows(ctx, rawIDs[0], rawIDs[1+split:]); err != nil {
				t.Fatal(err)
			}
			g := dumpForRawSeed(t, got.Client())
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
			c, err := redisdb.NewUserService(got).FindUserCounts(ctx, rawIDs[:1])
			if err != nil || c[0].Followers != 4 {
				t.Errorf("the raw account's counts through the services: %+v, %v", c, err)
			}
			followers, err := raw.followersOf(ctx, rawIDs[0])
			if err != nil || len(followers) != 4 {
				t.Errorf("followersOf = %v, %v; want 4 followers", followers, err)
			}
		})
	}
}

// TestRawFollowsManyAndWatch seeds more followers than one pipeline holds
// (with small pipelines: the embedded Redis is slow with many keys), then
// watches a post reach them, by hand out of order and then through the
// real asynchronous fan-out.
func TestRawFollowsManyAndWatch(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, nil, true)
	raw := newRawDB(db.Client())
	raw.chunk = 50
	p, err := redisdb.NewAuthService(db).Signup(ctx, warble.SignupInput{Username: "author", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	author := p.User
	n := 2*watchChunk + 17
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("fan%d", i)
	}
	fans, err := raw.signups(ctx, names, "password123")
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.follows(ctx, author.ID, fans); err != nil {
		t.Fatal(err)
	}
	counts, err := redisdb.NewUserService(db).FindUserCounts(ctx, []string{author.ID})
	if err != nil || counts[0].Followers != n {
		t.Fatalf("author's counts after raw follows: %+v, %v", counts, err)
	}
	c := db.Client()
	scores := c.ZRangeWithScores(ctx, keys.Followers(author.ID), 0, -1).Val()
	for i := 1; i < len(scores); i++ {
		if scores[i].Score <= scores[i-1].Score {
			t.Fatalf("follow times tie or go back at %d: %v, %v", i, scores[i-1], scores[i])
		}
	}
	if s := c.ZScore(ctx, keys.Following(fans[5]), author.ID).Val(); s != scores[5].Score {
		t.Errorf("following score %v, followers score %v", s, scores[5].Score)
	}

	w, err := raw.watchFanOut(ctx, author.ID)
	if err != nil || len(w.followers) != n {
		t.Fatalf("watchFanOut: %d followers, %v", len(w.followers), err)
	}
	w.reset("x:1")
	poll := func(want int) {
		t.Helper()
		if left, err := w.poll(ctx); err != nil || left != want {
			t.Fatalf("poll = %d, %v; want %d", left, err, want)
		}
	}
	poll(n)
	deliver := func(followers []string) {
		pipe := c.Pipeline()
		for _, f := range followers {
			pipe.ZAdd(ctx, keys.Home(f), redis.Z{Score: 1, Member: "x:1"})
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

	post, err := redisdb.NewPostService(db).CreatePost(ctx, author.ID, "to everyone")
	if err != nil {
		t.Fatal(err)
	}
	w.reset(post.ID)
	poll(n)
	worker := redisdb.NewWorker(db, redisdb.WorkerOptions{})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); worker.Run(wctx) }()
	deadline := time.Now().Add(time.Minute)
	for {
		left, err := w.poll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fan-out left %d followers without the post", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done

	got, took, err := raw.fanOut(ctx, author.ID, "bench:1")
	if err != nil || got != n || took <= 0 {
		t.Errorf("raw fanOut = %d, %v, %v", got, took, err)
	}
	if c := c.ZScore(ctx, keys.Home(fans[0]), "bench:1"); c.Err() != redis.Nil {
		t.Errorf("raw fanOut left its member behind: %v", c.Err())
	}
}
