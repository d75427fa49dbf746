package redisdb

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// forEachNode calls fn on every server behind c: each node of a cluster,
// or the one server.
func forEachNode(tb testing.TB, c redis.UniversalClient, fn func(*redis.Client) error) {
	tb.Helper()
	ctx := context.Background()
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error { return fn(n) })
	case *redis.Client:
		err = fn(c)
	default:
		tb.Fatalf("client %T", c)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// setListpackLimits sets the sorted-set listpack limits of every server
// behind c, and puts Redis's defaults back when tb ends (the shared
// cluster outlives the test).
func setListpackLimits(tb testing.TB, c redis.UniversalClient, entries, value int) {
	tb.Helper()
	set := func(entries, value int) func(*redis.Client) error {
		return func(n *redis.Client) error {
			ctx := context.Background()
			if err := n.ConfigSet(ctx, listpackEntriesConfig, strconv.Itoa(entries)).Err(); err != nil {
				return err
			}
			return n.ConfigSet(ctx, listpackValueConfig, strconv.Itoa(value)).Err()
		}
	}
	forEachNode(tb, c, set(entries, value))
	tb.Cleanup(func() { forEachNode(tb, c, set(128, 64)) })
}

// newListpackTestDB returns a DB on a fresh real Redis (skipping on the
// embedded one, which has no encodings), its client, and its log.
func newListpackTestDB(t *testing.T, opts Options) (*DB, redis.UniversalClient, *bytes.Buffer) {
	t.Helper()
	srv := redistest.New(t)
	if srv.Embedded() {
		t.Skip("the embedded Redis has no sorted-set encodings")
	}
	var log bytes.Buffer
	opts.Logger = slog.New(slog.NewTextHandler(&log, nil))
	opts.BcryptCost = bcrypt.MinCost
	client := srv.Client(t)
	return NewDB(client, opts), client, &log
}

func encoding(tb testing.TB, db *DB, key string) string {
	tb.Helper()
	enc, err := db.client.ObjectEncoding(context.Background(), key).Result()
	if err != nil {
		tb.Fatalf("OBJECT ENCODING %s: %v", key, err)
	}
	return enc
}

// TestHomeTimelinesStayListpacks: with zset-max-listpack-entries at the
// home cap plus homeSlack, as CheckListpack asks, every way a home
// timeline is written (own posts, fan-out, the backfill of a follow, the
// rebuild of a returning user) keeps it a listpack holding the newest
// HomeCap posts (fan-out's deliveries, past the cap between their trims,
// as the trim rule says), while the global timeline becomes a skiplist
// once full. A home that was a skiplist becomes a listpack when a follow
// rewrites it.
func TestHomeTimelinesStayListpacks(t *testing.T) {
	const homeCap = 10
	const limit = homeCap + homeSlack
	db, client, _ := newListpackTestDB(t, Options{HomeCap: homeCap, GlobalCap: limit})
	setListpackLimits(t, client, limit, 64)
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	cy := mustSignup(t, db, "cyd").ID
	mustFollow(t, db, bob, ada)

	var adas, cys, bobs []string
	var adaPosts []*warble.Post
	for i := range limit + 1 {
		p := mustCreatePost(t, db, ada, "ada "+strconv.Itoa(i))
		adas, adaPosts = append(adas, p.ID), append(adaPosts, p)
	}
	newest := func(ids []string) []string { return ids[max(0, len(ids)-homeCap):] }
	if got := zsetIDs(t, db, homeKey(ada)); !slices.Equal(got, newest(adas)) {
		t.Fatalf("ada's own home = %v, want %v", got, newest(adas))
	}
	if got, want := zsetIDs(t, db, homeKey(bob)), trimmedHome(bob, adaPosts, homeCap); !slices.Equal(got, want) {
		t.Fatalf("bob's home after fan-out = %v, want %v", got, want)
	}
	for _, u := range []string{ada, bob} {
		if enc := encoding(t, db, homeKey(u)); enc != "listpack" {
			t.Errorf("home of %s after %d posts is a %s, want a listpack", u, limit+1, enc)
		}
	}
	if enc := encoding(t, db, globalKey); enc != "skiplist" {
		t.Errorf("the full global timeline is a %s, want a skiplist", enc)
	}

	// Following cy, whose posts are newer than some of bob's timeline,
	// makes the backfill merge: it cannot add them all without trimming.
	for i := range homeCap / 2 {
		cys = append(cys, mustCreatePost(t, db, cy, "cy "+strconv.Itoa(i)).ID)
		bobs = append(bobs, mustCreatePost(t, db, bob, "bob "+strconv.Itoa(i)).ID)
	}
	mustFollow(t, db, bob, cy)
	want := newest(slices.Concat(adas, interleave(cys, bobs)))
	if got := zsetIDs(t, db, homeKey(bob)); !slices.Equal(got, want) {
		t.Fatalf("bob's home after following cy = %v, want %v", got, want)
	}
	if enc := encoding(t, db, homeKey(bob)); enc != "listpack" {
		t.Errorf("bob's home after a follow's backfill is a %s, want a listpack", enc)
	}

	// A home that became a skiplist under a lower limit stays one as it
	// is trimmed, until a rewrite.
	setListpackLimits(t, client, 4, 64)
	dee := mustSignup(t, db, "dee").ID
	mustFollow(t, db, dee, ada)
	if enc := encoding(t, db, homeKey(dee)); enc != "skiplist" {
		t.Fatalf("dee's home under a limit of 4 is a %s, want a skiplist", enc)
	}
	setListpackLimits(t, client, limit, 64)
	mustCreatePost(t, db, ada, "one more")
	if enc := encoding(t, db, homeKey(dee)); enc != "skiplist" {
		t.Fatalf("dee's home after a delivery is a %s; Redis never converts back, so this test means nothing", enc)
	}
	mustFollow(t, db, dee, cy)
	if enc := encoding(t, db, homeKey(dee)); enc != "listpack" {
		t.Errorf("dee's home after a follow rewrote it is a %s, want a listpack", enc)
	}
	if n, err := db.client.ZCard(context.Background(), homeKey(dee)).Result(); err != nil || n != homeCap {
		t.Errorf("dee's home holds %d posts (%v), want %d", n, err, homeCap)
	}
}

// interleave returns a[0], b[0], a[1], b[1], …: posts made in turns.
func interleave(a, b []string) []string {
	var out []string
	for i := range a {
		out = append(out, a[i], b[i])
	}
	return out
}

// TestCheckListpack: Warble reads the limits of every server, warns
// plainly when they are below the home cap and its slack (1,000 + 128),
// raises them when asked, and
// only says it could not check on a server that refuses CONFIG.
func TestCheckListpack(t *testing.T) {
	ctx := context.Background()
	db, client, log := newListpackTestDB(t, Options{HomeCap: 1000})
	setListpackLimits(t, client, 128, 32)

	check := db.CheckListpack(ctx, false)
	if !check.Short() || len(check.Nodes) == 0 {
		t.Fatalf("CheckListpack under Redis's defaults = %+v, want short", check)
	}
	for _, n := range check.Nodes {
		if n.Err != nil || n.Entries != 128 || n.Value != 32 || n.Set {
			t.Errorf("node %+v, want entries 128, value 32, not set", n)
		}
	}
	if got := strings.Count(log.String(), "level=WARN"); got != 1 {
		t.Errorf("%d warnings, want 1:\n%s", got, log)
	}
	if !strings.Contains(log.String(), "zset-max-listpack-entries 1128 and zset-max-listpack-value 33") {
		t.Errorf("the warning does not say what to set:\n%s", log)
	}

	log.Reset()
	check = db.CheckListpack(ctx, true)
	if check.Short() || strings.Contains(log.String(), "level=WARN") {
		t.Fatalf("CheckListpack(set) = %+v, log:\n%s", check, log)
	}
	forEachNode(t, client, func(n *redis.Client) error {
		entries, value, err := listpackLimits(ctx, n)
		if err != nil || entries != 1000+homeSlack || value != 33 {
			t.Errorf("%s after CONFIG SET: entries %d, value %d, %v; want %d, 33", n.Options().Addr, entries, value, err, 1000+homeSlack)
		}
		return nil
	})

	// Set again, with higher limits than needed: nothing is lowered.
	setListpackLimits(t, client, 5000, 64)
	if check = db.CheckListpack(ctx, true); check.Short() || slices.ContainsFunc(check.Nodes, func(n ListpackNode) bool { return n.Set }) {
		t.Errorf("CheckListpack over limits high enough = %+v", check)
	}

	// A user that may not run CONFIG, as on a managed Redis.
	forEachNode(t, client, func(n *redis.Client) error {
		return n.Do(ctx, "ACL", "SETUSER", "noconfig", "on", ">not-a-secret", "~*", "&*", "+@all", "-config").Err()
	})
	t.Cleanup(func() {
		forEachNode(t, client, func(n *redis.Client) error { return n.Do(ctx, "ACL", "DELUSER", "noconfig").Err() })
	})
	var limited redis.UniversalClient
	switch c := client.(type) {
	case *redis.ClusterClient:
		opts := *c.Options()
		opts.Username, opts.Password = "noconfig", "not-a-secret"
		limited = redis.NewClusterClient(&opts)
	case *redis.Client:
		opts := *c.Options()
		opts.Username, opts.Password = "noconfig", "not-a-secret"
		limited = redis.NewClient(&opts)
	}
	t.Cleanup(func() { limited.Close() })
	log.Reset()
	db = NewDB(limited, Options{HomeCap: 1000, Logger: db.log})
	check = db.CheckListpack(ctx, true)
	for _, n := range check.Nodes {
		if n.Err == nil {
			t.Errorf("node %+v answered CONFIG GET for a user denied it", n)
		}
	}
	if strings.Contains(log.String(), "level=WARN") || strings.Contains(log.String(), "level=ERROR") ||
		!strings.Contains(log.String(), "could not check whether home timelines are compact") {
		t.Errorf("log for a server that refuses CONFIG:\n%s", log)
	}
}
