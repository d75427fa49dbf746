package redisdb

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// hybridScenario runs the same story on db, which pushes every post or
// pulls some, and returns the reader's id: a reader follows a celebrity who
// crosses the threshold (3 followers in these tests) upwards and back down
// while posting, and two small accounts, and (with deletes) posts are
// deleted on the way.
func hybridScenario(t *testing.T, db *DB, deletes bool) string {
	t.Helper()
	ctx := context.Background()
	posts := NewPostService(db)
	reader := mustSignup(t, db, "reader").ID
	celeb := mustSignup(t, db, "celeb").ID
	small1 := mustSignup(t, db, "small1").ID
	small2 := mustSignup(t, db, "small2").ID
	fans := make([]string, 4)
	for i := range fans {
		fans[i] = mustSignup(t, db, fmt.Sprintf("fan%d", i)).ID
	}
	post := func(author string, n int) []*warble.Post {
		var out []*warble.Post
		for i := range n {
			out = append(out, mustCreatePost(t, db, author, fmt.Sprintf("post %d by %s", i, author)))
		}
		drainFanOut(t, db)
		return out
	}
	del := func(p *warble.Post) {
		if !deletes {
			return
		}
		if err := posts.DeletePost(ctx, p.AuthorID, p.ID); err != nil {
			t.Fatalf("DeletePost(%s): %v", p.ID, err)
		}
		drainFanOut(t, db)
	}

	early := post(celeb, 3) // before anyone follows: backfilled
	mustFollow(t, db, reader, celeb)
	mustFollow(t, db, reader, small1)
	mustFollow(t, db, reader, small2)
	pushed := post(celeb, 2) // 1 follower: pushed
	post(small1, 2)
	for _, f := range fans { // 5 followers: pulled from now on
		mustFollow(t, db, f, celeb)
	}
	pulled := post(celeb, 3)
	post(small2, 2)
	pulled = append(pulled, post(celeb, 2)...)
	del(pulled[1])
	del(pushed[0])
	del(early[2])
	for _, f := range fans[:3] { // 2 followers: pushed again
		if err := NewFollowService(db).Unfollow(ctx, f, celeb); err != nil {
			t.Fatal(err)
		}
	}
	post(celeb, 2)
	post(small1, 1)
	mustFollow(t, db, fans[0], small1) // the fans' timelines must not change the reader's
	return reader
}

// TestHybridTimelineMatchesPush runs one story on a Warble that pushes
// every post and on one that pulls a celebrity's, and reads the reader's
// home timeline on both at several page sizes: the same posts, in the same
// order, under the same cursors.
//
// With a cap that cuts the timeline, the merge keeps the newest HomeCap
// as the pushed timeline does, and past them both go on by pull from the
// posts of the accounts the reader follows: the whole story either way.
// (Before a home timeline went on past its cap, a post that the pushed
// timeline's cap dropped for good could show again in the merge after a
// delete; read to the end, both now show every post that is not deleted.)
func TestHybridTimelineMatchesPush(t *testing.T) {
	for _, c := range []struct {
		async   bool
		homeCap int
		deletes bool
		want    int
	}{{false, 0, true, 14}, {true, 0, true, 14}, {true, 6, false, 17}, {false, 11, false, 17}, {true, 6, true, 14}, {false, 3, true, 14}} {
		t.Run(fmt.Sprintf("async=%v,cap=%d,deletes=%v", c.async, c.homeCap, c.deletes), func(t *testing.T) {
			push := newTestDB(t, Options{PullThreshold: -1, AsyncFanOut: c.async, HomeCap: c.homeCap})
			hybrid := newTestDB(t, Options{PullThreshold: 3, AsyncFanOut: c.async, HomeCap: c.homeCap})
			deletes := c.deletes
			reader := hybridScenario(t, push, deletes)
			if got := hybridScenario(t, hybrid, deletes); got != reader {
				t.Fatalf("reader ids differ: %s and %s", reader, got)
			}
			if n := push.client.SCard(context.Background(), pullAuthorsKey).Val(); n != 0 {
				t.Fatalf("the pushing Warble pulled %d accounts", n)
			}
			if n := hybrid.client.SCard(context.Background(), pullAuthorsKey).Val(); n != 1 {
				t.Fatalf("the hybrid Warble pulled %d accounts, want the celebrity", n)
			}
			feed := warble.Feed{Kind: warble.FeedHome, UserID: reader}
			want := readTimeline(t, push, feed, 100, nil)
			if len(want) != c.want {
				t.Fatalf("the pushed timeline has %d posts: %v", len(want), want)
			}
			// The pulled posts really are missing from the hybrid's pushed
			// timeline: the merge is what puts them there.
			if stored := zsetIDs(t, hybrid, homeKey(reader)); slices.Equal(stored, reversed(want)) {
				t.Fatalf("the hybrid's home timeline stores exactly what is read: nothing was pulled")
			}
			for _, first := range []int{1, 2, 3, 5, 100} {
				if got := readTimeline(t, hybrid, feed, first, nil); !slices.Equal(got, want) {
					t.Errorf("first %d: hybrid timeline\n%v\nwant\n%v", first, got, want)
				}
			}
		})
	}
}

// TestPullFollowsUnfollow: unfollowing a pulled account takes its posts off
// the home timeline at once, and following it again brings them back.
func TestPullFollowsUnfollow(t *testing.T) {
	db := newTestDB(t, Options{PullThreshold: 1})
	ctx := context.Background()
	reader := mustSignup(t, db, "reader").ID
	other := mustSignup(t, db, "other").ID
	celeb := mustSignup(t, db, "celeb").ID
	mustFollow(t, db, reader, celeb)
	mustFollow(t, db, other, celeb)
	p := mustCreatePost(t, db, celeb, "to the many")
	feed := warble.Feed{Kind: warble.FeedHome, UserID: reader}
	if got := readTimeline(t, db, feed, 10, nil); !slices.Equal(got, []string{p.ID}) {
		t.Fatalf("home = %v, want the pulled post", got)
	}
	if err := NewFollowService(db).Unfollow(ctx, reader, celeb); err != nil {
		t.Fatal(err)
	}
	if got := readTimeline(t, db, feed, 10, nil); len(got) != 0 {
		t.Fatalf("home after unfollow = %v, want empty", got)
	}
	mustFollow(t, db, reader, celeb)
	if got := readTimeline(t, db, feed, 10, nil); !slices.Equal(got, []string{p.ID}) {
		t.Fatalf("home after following again = %v, want the post", got)
	}
}

// TestPullCaps: a pulled account shows its newest HomeCap posts, as a
// follow's backfill would copy, and a home timeline that merges pulled and
// pushed posts holds the newest HomeCap of them all; a page past them goes
// on by pull, in the same order.
func TestPullCaps(t *testing.T) {
	db := newTestDB(t, Options{PullThreshold: 1, HomeCap: 4})
	reader := mustSignup(t, db, "reader").ID
	other := mustSignup(t, db, "other").ID
	celeb := mustSignup(t, db, "celeb").ID
	small := mustSignup(t, db, "small").ID
	mustFollow(t, db, reader, celeb)
	mustFollow(t, db, other, celeb)
	var celebPosts []string
	for i := range 6 {
		celebPosts = append(celebPosts, mustCreatePost(t, db, celeb, fmt.Sprint(i)).ID)
	}
	feed := warble.Feed{Kind: warble.FeedHome, UserID: reader}
	if got, want := firstPage(t, db, feed, 4), reversed(celebPosts[2:]); !slices.Equal(got, want) {
		t.Fatalf("first page = %v, want the newest 4 of the pulled account's: %v", got, want)
	}
	if got, want := readTimeline(t, db, feed, 3, nil), reversed(celebPosts); !slices.Equal(got, want) {
		t.Fatalf("home = %v, want them all: %v", got, want)
	}

	// Four pushed posts fill the home timeline: older pulled posts are
	// past its cap, where a page pulls them.
	mustFollow(t, db, reader, small)
	var smallPosts []string
	for i := range 4 {
		smallPosts = append(smallPosts, mustCreatePost(t, db, small, fmt.Sprint(i)).ID)
	}
	newest := mustCreatePost(t, db, celeb, "newest").ID
	want := append([]string{newest}, reversed(smallPosts)...)[:4]
	if got := firstPage(t, db, feed, 4); !slices.Equal(got, want) {
		t.Fatalf("first page = %v, want %v", got, want)
	}
	all := append(append([]string{newest}, reversed(smallPosts)...), reversed(celebPosts)...)
	if got := readTimeline(t, db, feed, 2, nil); !slices.Equal(got, all) {
		t.Fatalf("home = %v, want %v", got, all)
	}

	// A resume from below the cap of the merged timeline cannot replay
	// everything after it: RESYNC, as for a pushed timeline.
	h := newTestHub(t, db)
	seq, _ := postSeq(celebPosts[5])
	after := warble.PostCursor(seq)
	if ev := nextEvent(t, mustSubscribe(t, h, feed, &after)); ev.Kind != warble.Resync {
		t.Fatalf("resume from below the cap: first event %s, want RESYNC", ev.Kind)
	}
	seq, _ = postSeq(want[3])
	after = warble.PostCursor(seq)
	events := mustSubscribe(t, h, feed, &after)
	for _, id := range reversed(want[:3]) {
		if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || *ev.PostID != id {
			t.Fatalf("resume within the cap: event %s %v, want POST_ADDED of %s", ev.Kind, ev.PostID, id)
		}
	}
}

// TestPullSkipsFanOut: a job for a post by an account over the threshold
// writes to no follower's timeline, yet every follower reads the post.
func TestPullSkipsFanOut(t *testing.T) {
	db := newTestDB(t, Options{AsyncFanOut: true, PullThreshold: 100})
	celeb := mustSignup(t, db, "celeb").ID
	fans := manyFollowers(t, db, celeb, 101)
	p := mustCreatePost(t, db, celeb, "hello, all of you")
	drainFanOut(t, db)
	if n := holding(t, db, fans, p.ID); n != 0 {
		t.Fatalf("%d followers' timelines hold the pulled post", n)
	}
	for _, f := range []string{fans[0], fans[50], fans[100]} {
		tl, err := NewPostService(db).FindTimeline(context.Background(), warble.Feed{Kind: warble.FeedHome, UserID: f}, warble.PageArgs{First: 5})
		if err != nil {
			t.Fatal(err)
		}
		if len(tl.Edges) != 1 || tl.Edges[0].Node.ID != p.ID || tl.Edges[0].Node.Author == nil {
			t.Fatalf("follower %s reads %d posts, want the pulled one with its author", f, len(tl.Edges))
		}
	}
}

// TestHubPulledLive: a live home timeline gets the posts and removals of a
// pulled account it follows, in order with pushed ones; it resumes over
// them; and it hears of an account that crosses the threshold while it is
// open.
func TestHubPulledLive(t *testing.T) {
	db := newTestDB(t, Options{PullThreshold: 1})
	h := newTestHub(t, db)
	ctx := context.Background()
	reader := mustSignup(t, db, "reader").ID
	other := mustSignup(t, db, "other").ID
	celeb := mustSignup(t, db, "celeb").ID
	rising := mustSignup(t, db, "rising").ID
	small := mustSignup(t, db, "small").ID
	mustFollow(t, db, reader, celeb)
	mustFollow(t, db, other, celeb)
	mustFollow(t, db, reader, small)
	mustFollow(t, db, reader, rising)
	first := mustCreatePost(t, db, celeb, "first") // pulls celeb
	feed := warble.Feed{Kind: warble.FeedHome, UserID: reader}
	events := mustSubscribe(t, h, feed, nil)

	p1 := mustCreatePost(t, db, celeb, "pulled")
	wantAdded(t, nextEvent(t, events), p1)
	p2 := mustCreatePost(t, db, small, "pushed")
	wantAdded(t, nextEvent(t, events), p2)
	if err := NewPostService(db).DeletePost(ctx, celeb, p1.ID); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Kind != warble.PostRemoved || *ev.PostID != p1.ID {
		t.Fatalf("event = %s %v, want POST_REMOVED of %s", ev.Kind, ev.PostID, p1.ID)
	}

	p3 := mustCreatePost(t, db, celeb, "pulled again")
	wantAdded(t, nextEvent(t, events), p3)

	// A resume replays pulled posts with pushed ones, in order; one from
	// before the oldest entry starts with a RESYNC.
	after := warble.PostCursor(first.Seq)
	replay := mustSubscribe(t, h, feed, &after)
	wantAdded(t, nextEvent(t, replay), p2)
	wantAdded(t, nextEvent(t, replay), p3)
	after = warble.PostCursor(first.Seq - 1)
	if ev := nextEvent(t, mustSubscribe(t, h, feed, &after)); ev.Kind != warble.Resync {
		t.Fatalf("resume from before the oldest entry: first event %s, want RESYNC", ev.Kind)
	}

	// rising crosses the threshold with this post: its fan-out is
	// skipped, and the open subscription still gets it.
	mustFollow(t, db, other, rising)
	crossing := mustCreatePost(t, db, rising, "now I am big")
	if n := holding(t, db, []string{reader}, crossing.ID); n != 0 {
		t.Fatal("the crossing post was pushed")
	}
	// The hub learns of the crossing after the post, so a RESYNC may come
	// along (see refreshMessage); a POST_ADDED must.
	wantAdded(t, nextPostEvent(t, events), crossing)
	next := mustCreatePost(t, db, rising, "and again")
	wantAdded(t, nextPostEvent(t, events), next)
}

// nextPostEvent is nextEvent past any RESYNC.
func nextPostEvent(tb testing.TB, events <-chan *warble.TimelineEvent) *warble.TimelineEvent {
	tb.Helper()
	for {
		if ev := nextEvent(tb, events); ev.Kind != warble.Resync {
			return ev
		}
	}
}

// TestPulledSetCopyFollowsAnnouncements runs two Warbles on one Redis: the
// one that reads home timelines keeps its copy of the pulled accounts, so
// that a warm home page sends no SMEMBERS, and hears through its hub when
// the other Warble pulls an account, after which the account's pulled
// posts are in the reader's home timeline.
func TestPulledSetCopyFollowsAnnouncements(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	// Its copy would last an hour without the announcement.
	reader := NewDB(srv.Client(t), Options{BcryptCost: bcrypt.MinCost, PullThreshold: 1, PulledStaleness: time.Hour})
	writer := NewDB(srv.Client(t), Options{BcryptCost: bcrypt.MinCost, PullThreshold: 1})
	newTestHub(t, reader)
	celeb := mustSignup(t, writer, "celeb")
	fan := mustSignup(t, writer, "fan")
	other := mustSignup(t, writer, "other")
	mustFollow(t, writer, fan.ID, celeb.ID)
	readTimeline(t, reader, warble.HomeFeed(fan.ID), 10, nil) // reads the set: none pulled yet

	counter := &commandNames{}
	reader.client.AddHook(counter)
	readTimeline(t, reader, warble.HomeFeed(fan.ID), 10, nil)
	if n := counter.count("smembers"); n != 0 {
		t.Errorf("a warm home page sent %d SMEMBERS of the pulled accounts, want 0", n)
	}

	mustFollow(t, writer, other.ID, celeb.ID) // two followers: over the threshold
	p := mustCreatePost(t, writer, celeb.ID, "pulled")
	if n := writer.client.SIsMember(ctx, pullAuthorsKey, celeb.ID).Val(); !n {
		t.Fatal("the celebrity was not pulled")
	}
	if got := zsetIDs(t, writer, homeKey(fan.ID)); slices.Contains(got, p.ID) {
		t.Fatal("the post was pushed, want it pulled")
	}
	waitFor(t, "the reader's home timeline to hold the pulled post", func() bool {
		return slices.Contains(readTimeline(t, reader, warble.HomeFeed(fan.ID), 10, nil), p.ID)
	})
}

// TestPulledSetCopyIsBounded checks the bound on the copy's age: a
// Warble that hears no announcement (it has no hub) reads the set again
// once its copy is older than PulledStaleness.
func TestPulledSetCopyIsBounded(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	reader := NewDB(srv.Client(t), Options{BcryptCost: bcrypt.MinCost, PulledStaleness: 200 * time.Millisecond})
	if ids, err := reader.pulledAuthors(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("pulled accounts = %v, %v; want none", ids, err)
	}
	if err := srv.Client(t).SAdd(ctx, pullAuthorsKey, "7").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the copy to be read again", func() bool {
		ids, err := reader.pulledAuthors(ctx)
		return err == nil && slices.Equal(ids, []string{"7"})
	})
}

// commandNames is a go-redis hook that counts the commands sent, by name.
type commandNames struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandNames) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *commandNames) note(cmds ...redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	for _, cmd := range cmds {
		c.n[cmd.Name()]++
	}
}

func (c *commandNames) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandNames) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.note(cmd)
		return next(ctx, cmd)
	}
}

func (c *commandNames) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.note(cmds...)
		return next(ctx, cmds)
	}
}

// TestHomePastCap reads a home timeline whose cap cut off most of it, to
// the end: past the entries it holds, pages go on by pull from the posts
// of the accounts the reader follows now and the reader's own, in seq
// order and with exact cursors, while new posts push entries out of the
// capped timeline between pages. Posts of an account the reader no longer
// follows, or never did, and deleted posts, are not pulled.
func TestHomePastCap(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{HomeCap: 5})
	reader := mustSignup(t, db, "reader").ID
	ada := mustSignup(t, db, "ada").ID
	bob := mustSignup(t, db, "bob").ID
	stranger := mustSignup(t, db, "stranger").ID
	left := mustSignup(t, db, "left").ID
	late := mustSignup(t, db, "late").ID
	mustFollow(t, db, reader, ada)
	mustFollow(t, db, reader, bob)
	mustFollow(t, db, reader, left)

	var want []string // oldest first
	for i := range 3 {
		want = append(want, mustCreatePost(t, db, late, fmt.Sprint("early ", i)).ID)
	}
	var deleted string
	for i := range 8 {
		for _, author := range []string{ada, stranger, bob, left, reader} {
			id := mustCreatePost(t, db, author, fmt.Sprint(i)).ID
			switch {
			case author == ada && i == 2:
				deleted = id
			case author == stranger || author == left:
			default:
				want = append(want, id)
			}
		}
	}
	if err := NewPostService(db).DeletePost(ctx, ada, deleted); err != nil {
		t.Fatal(err)
	}
	if err := NewFollowService(db).Unfollow(ctx, reader, left); err != nil {
		t.Fatal(err)
	}
	mustFollow(t, db, reader, late) // its posts are older than the cap: none is copied
	slices.Reverse(want)
	if n := db.client.ZCard(ctx, homeKey(reader)).Val(); n != 5 {
		t.Fatalf("home timeline holds %d entries, want its cap, 5", n)
	}

	feed := warble.HomeFeed(reader)
	for _, first := range []int{1, 2, 5, 7, 100} {
		t.Run(fmt.Sprint(first), func(t *testing.T) {
			// Posts between pages push the entries a page read out
			// of the capped timeline: the next page still goes on
			// where the last ended.
			var meanwhile []string
			got := readTimeline(t, db, feed, first, func() {
				meanwhile = append(meanwhile, mustCreatePost(t, db, ada, "meanwhile").ID)
			})
			if !slices.Equal(got, want) {
				t.Fatalf("pages of %d read\n%v\nwant\n%v", first, got, want)
			}
			want = append(reversed(meanwhile), want...)
		})
	}
}

// TestHomePastCapRoundTrips: a page past a home timeline's cap costs the
// same round trips whatever its size and however many accounts the reader
// follows; and a home timeline short of its cap ends without a pull.
func TestHomePastCapRoundTrips(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{HomeCap: 3})
	reader := mustSignup(t, db, "reader").ID
	few := mustSignup(t, db, "few").ID
	for i := range 40 {
		author := mustSignup(t, db, fmt.Sprint("author", i)).ID
		mustFollow(t, db, reader, author)
		if i < 4 {
			mustFollow(t, db, few, author)
		}
		for j := range 2 {
			mustCreatePost(t, db, author, fmt.Sprint(j))
		}
	}
	short := mustSignup(t, db, "short").ID
	mustCreatePost(t, db, short, "alone")

	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	cost := func(userID string, first int) (int64, int) {
		t.Helper()
		feed := warble.HomeFeed(userID)
		page, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: 2})
		if err != nil {
			t.Fatal(err)
		}
		after := page.PageInfo.EndCursor
		before := counter.N()
		tl, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: first, After: after})
		if err != nil {
			t.Fatal(err)
		}
		return counter.N() - before, len(tl.Edges)
	}
	small, n := cost(reader, 5)
	if n != 5 {
		t.Fatalf("page of 5 past the cap has %d posts", n)
	}
	large, n := cost(reader, 50)
	if n != 50 {
		t.Fatalf("page of 50 past the cap has %d posts", n)
	}
	fewer, n := cost(few, 3)
	if n != 3 {
		t.Fatalf("page of 3 past the cap has %d posts", n)
	}
	t.Logf("round trips past the cap: %d for 5 posts, %d for 50, %d following 4 accounts", small, large, fewer)
	if small != large || small != fewer {
		t.Errorf("round trips past the cap: %d for 5 posts, %d for 50 of 40 accounts, %d for 3 of 4; want the same", small, large, fewer)
	}
	if got := readTimeline(t, db, warble.HomeFeed(short), 5, nil); len(got) != 1 {
		t.Errorf("short home timeline = %v, want its one post", got)
	}
}
