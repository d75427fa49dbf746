package redisdb

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// unfollowBeforeDelivery is a go-redis hook that runs an unfollow to its
// end just before the first pipeline that delivers to the follower is
// sent: the unfollow races that batch and loses nothing to it.
type unfollowBeforeDelivery struct {
	tb                 testing.TB
	db                 *DB
	follower, followee string
	fired              atomic.Bool
}

func (h *unfollowBeforeDelivery) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *unfollowBeforeDelivery) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *unfollowBeforeDelivery) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.delivers(cmds) && h.fired.CompareAndSwap(false, true) {
			if err := NewFollowService(h.db).Unfollow(ctx, h.follower, h.followee); err != nil {
				h.tb.Errorf("the racing unfollow: %v", err)
			}
		}
		return next(ctx, cmds)
	}
}

// delivers reports whether cmds run a delivery to h.follower's home.
func (h *unfollowBeforeDelivery) delivers(cmds []redis.Cmder) bool {
	shas := []string{deliverScript.classic.Hash(), deliverScript.sharded.Hash(), deliverBatchScript.classic.Hash()}
	for _, c := range cmds {
		args := c.Args()
		if c.Name() != "evalsha" || len(args) < 3 || !slices.Contains(shas, args[1].(string)) {
			continue
		}
		for _, a := range args[3:] {
			if p, ok := a.(*string); ok { // deliverBatchArgs's names
				a = *p
			}
			if a == homeKey(h.follower) {
				return true
			}
		}
	}
	return false
}

// TestFanOutBatchGuards: delivery to many followers at once (a script call
// per batch of them on one Redis, one per follower on a cluster) keeps
// every guarantee of the one-follower delivery for each follower of the
// batch: a follower who unfollowed before it, or whose unfollow ran just
// before the batch landed, gets nothing, nor does one whose unfollow has
// taken only its first step (the following set, the truth), whom the
// followers set still lists; an inactive one is skipped; a home that holds the post already is not written nor announced
// again; a full home drops its oldest post at the delivery's trim (one in
// rawTrimEvery); and the post is announced on
// the home channel of every follower it was delivered to, and of no other.
func TestFanOutBatchGuards(t *testing.T) {
	const homeCap = 5
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	var delivered atomic.Int64
	db := newTestDB(t, Options{AsyncFanOut: true, HomeCap: homeCap, Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour,
		Delivered: func(n int) { delivered.Add(int64(n)) }})
	ctx := context.Background()
	ada := mustSignup(t, db, "ada").ID
	const n = 700 // two chunks of 400, each more than one script call
	followers := manyFollowers(t, db, ada, n)
	// The post's job stays queued: the fan-out below is its run.
	p, err := NewPostService(db).CreatePost(ctx, ada, "to many")
	if err != nil {
		t.Fatal(err)
	}

	racing := followers[450]
	kind := func(i int) string {
		switch {
		case followers[i] == racing:
			return "racing unfollow"
		case i%7 == 2:
			return "unfollowed"
		case i%17 == 6:
			return "mid-unfollow"
		case i%5 == 1:
			return "inactive"
		case i%11 == 3:
			return "holds it"
		case i%13 == 4:
			return "full"
		}
		return "plain"
	}
	old := strconv.FormatInt(clock.Now().Add(-8*24*time.Hour).UnixMilli(), 10)
	recent := strconv.FormatInt(clock.Now().Add(-time.Hour).UnixMilli(), 10)
	pipe := db.client.Pipeline()
	for i, f := range followers {
		switch kind(i) {
		case "unfollowed": // both sides, as an unfollow whose last step is to come
			pipe.ZRem(ctx, followingKey(f), ada)
			pipe.ZRem(ctx, followersKey(ada), f)
		case "mid-unfollow":
			pipe.ZRem(ctx, followingKey(f), ada) // the truth only, as an unfollow's first step
		case "inactive":
			pipe.Set(ctx, seenKey(f), old, 0)
		case "holds it":
			pipe.ZAdd(ctx, homeKey(f), redis.Z{Score: float64(p.Seq), Member: p.ID})
		case "full":
			for j := range homeCap {
				pipe.ZAdd(ctx, homeKey(f), redis.Z{Score: float64(p.Seq) * float64(j+1) / 10, Member: "9:" + strconv.Itoa(j+1)}) // older than p
			}
		case "plain":
			if i%2 == 0 {
				pipe.Set(ctx, seenKey(f), recent, 0)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// Listen on the home channels of a few followers of each kind.
	var sample []int
	count := map[string]int{}
	for i := range followers {
		if k := kind(i); count[k] < 3 {
			count[k]++
			sample = append(sample, i)
		}
	}
	channels := make([]string, len(sample))
	for j, i := range sample {
		channels[j] = homeChannel(followers[i])
	}
	msgs := listen(t, db, channels...)

	// The scripts are loaded first: a batch that meets NOSCRIPT after
	// another one in flight loaded the script has run some of its calls,
	// and runScripts runs it again whole, which delivers nothing twice
	// but counts those deliveries as held already.
	for _, s := range []*redis.Script{db.pub(deliverScript), db.pub(deliverBatchScript)} {
		if err := s.Load(ctx, db.client).Err(); err != nil {
			t.Fatal(err)
		}
	}
	race := &unfollowBeforeDelivery{tb: t, db: db, follower: racing, followee: ada}
	db.client.AddHook(race)
	if err := db.fanOut(ctx, ada, p.Seq, p.ID, startCursor, 400, noSave); err != nil {
		t.Fatal(err)
	}
	if !race.fired.Load() {
		t.Fatal("no delivery to the racing follower was seen")
	}
	want, trimmed := 0, 0
	for i, f := range followers {
		k := kind(i)
		home, err := db.client.ZRangeWithScores(ctx, homeKey(f), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]string, len(home))
		for j, z := range home {
			ids[j] = z.Member.(string)
		}
		var expect []string
		switch k {
		case "plain":
			expect = []string{p.ID}
		case "holds it":
			expect = []string{p.ID}
		case "full":
			// Trimmed back to the cap by one delivery in rawTrimEvery
			// (addTrimmedLua), else one past it until a later one.
			expect = []string{"9:1", "9:2", "9:3", "9:4", "9:5", p.ID}
			if rawTrim(f, strconv.FormatInt(p.Seq, 10)) {
				expect = expect[1:]
				trimmed++
			}
		}
		if !slices.Equal(ids, expect) {
			t.Errorf("home of follower %s (%s) = %v, want %v", f, k, ids, expect)
		}
		if k == "plain" || k == "full" {
			want++
		}
	}
	if got := delivered.Load(); got != int64(want) {
		t.Errorf("fan-out counted %d deliveries, want %d", got, want)
	}
	if trimmed == 0 {
		t.Error("no full home was trimmed: the test checks no trim")
	}

	// A marker after the fan-out on each channel: what came before it is
	// what the fan-out announced there.
	for _, ch := range channels {
		db.publish(ctx, db.client, ch, "marker")
	}
	heard := map[string][]string{}
	for markers := 0; markers < len(channels); {
		m := nextMessage(t, msgs)
		switch {
		case m.Payload == "marker":
			markers++
		case !strings.HasPrefix(m.Payload, "S "): // not the racing unfollow's resync
			heard[m.Channel] = append(heard[m.Channel], m.Payload)
		}
	}
	for _, i := range sample {
		var expect []string
		if k := kind(i); k == "plain" || k == "full" {
			expect = []string{encodeAdded(p.Seq, p.ID)}
		}
		if got := heard[homeChannel(followers[i])]; !slices.Equal(got, expect) {
			t.Errorf("follower %s (%s) heard %q, want %q", followers[i], kind(i), got, expect)
		}
	}
}

// TestFanOutBatchKeepsListpacks: with zset-max-listpack-entries at the
// home cap plus homeSlack, as CheckListpack asks, the guarded batch's
// deliveries to full home timelines leave each a listpack holding what
// the trim rule says (a trim back to the cap at one delivery in
// rawTrimEvery, rawTrim's choice), whose newest cap entries are the
// newest posts.
func TestFanOutBatchKeepsListpacks(t *testing.T) {
	const homeCap = 8
	db, client, _ := newListpackTestDB(t, Options{AsyncFanOut: true, HomeCap: homeCap})
	setListpackLimits(t, client, homeCap+homeSlack, 64)
	// The guarded batch is what this is about: the jobs that
	// mustCreatePost runs would deliver raw to 300 followers.
	db.rawFrom = math.MaxInt
	ctx := context.Background()
	ada := mustSignup(t, db, "ada").ID
	followers := manyFollowers(t, db, ada, 300)
	var posts []*warble.Post
	for i := range 5 * homeCap {
		p := mustCreatePost(t, db, ada, "post "+strconv.Itoa(i))
		if err := db.fanOut(ctx, ada, p.Seq, p.ID, startCursor, fanOutChunk, noSave); err != nil {
			t.Fatal(err)
		}
		posts = append(posts, p)
	}
	pastCap := 0
	for _, f := range []string{followers[0], followers[255], followers[299]} {
		got, want := zsetIDs(t, db, homeKey(f)), trimmedHome(f, posts, homeCap)
		if !slices.Equal(got, want) {
			t.Errorf("home of %s = %v, want %v", f, got, want)
		}
		if len(got) > homeCap {
			pastCap++
		}
		if enc := encoding(t, db, homeKey(f)); enc != "listpack" {
			t.Errorf("home of %s is a %s, want a listpack", f, enc)
		}
	}
	if pastCap == 0 {
		t.Error("no home was past its cap between trims: the test checks no slack")
	}
}

// trimmedHome returns the home timeline of follower, oldest first, that
// deliveries of posts in turn leave on an empty one: each adds its post
// and, when rawTrim chooses the pair, trims back to the newest homeCap.
func trimmedHome(follower string, posts []*warble.Post, homeCap int) []string {
	var home []string
	for _, p := range posts {
		home = append(home, p.ID)
		if rawTrim(follower, strconv.FormatInt(p.Seq, 10)) {
			home = home[max(0, len(home)-homeCap):]
		}
	}
	return home
}

// TestDeliveryNames: the names fan-out builds for a batch of followers, in
// one string, are the keys and channels of keys.go, in the order the
// delivery scripts take them.
func TestDeliveryNames(t *testing.T) {
	followers := []string{"7", "1024", "98765432101", "42"}
	var want []string
	for _, f := range followers {
		want = append(want, homeKey(f), followingKey(f), seenKey(f))
	}
	for _, f := range followers {
		want = append(want, homeChannel(f))
	}
	if got := deliveryNames(followers); !slices.Equal(got, want) {
		t.Errorf("deliveryNames(%q) =\n%q\nwant\n%q", followers, got, want)
	}
}
