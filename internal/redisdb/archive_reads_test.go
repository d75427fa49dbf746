package redisdb

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warble/warble/internal/archive"
	"github.com/warble/warble/internal/mysqltest"
	"github.com/warble/warble/internal/warble"
)

// countedArchive is a real archive that counts the queries made of it, so
// that tests can tell a page's one query from one query per post.
type countedArchive struct {
	warble.PostArchive
	byIDs, byAuthors, latest atomic.Int64
}

func (a *countedArchive) PostsByIDs(ctx context.Context, ids []string) (map[string]*warble.Post, error) {
	a.byIDs.Add(1)
	return a.PostArchive.PostsByIDs(ctx, ids)
}

func (a *countedArchive) PostsByAuthors(ctx context.Context, authorIDs []string, beforeSeq int64, limit int) ([]*warble.Post, error) {
	a.byAuthors.Add(1)
	return a.PostArchive.PostsByAuthors(ctx, authorIDs, beforeSeq, limit)
}

func (a *countedArchive) LatestPosts(ctx context.Context, beforeSeq int64, limit int) ([]*warble.Post, error) {
	a.latest.Add(1)
	return a.PostArchive.LatestPosts(ctx, beforeSeq, limit)
}

// queries returns how many queries were made of a so far.
func (a *countedArchive) queries() int64 {
	return a.byIDs.Load() + a.byAuthors.Load() + a.latest.Load()
}

// newArchivedDB returns a DB over a fresh Redis with an archive on a
// private MariaDB (see mysqltest), and that archive.
func newArchivedDB(t testing.TB, opts Options) (*DB, *countedArchive) {
	t.Helper()
	store, err := archive.Open(context.Background(), mysqltest.New(t).URL, slog.Default())
	if err != nil {
		t.Fatalf("open archive: %v", err)
	}
	t.Cleanup(func() { store.Close() })
	a := &countedArchive{PostArchive: store}
	opts.Archive = a
	return newTestDB(t, opts), a
}

// archivePosts moves posts out of Redis into the archive as the mover
// leaves them: the rows written first, then each post's hash deleted, its
// id taken off its author's posts set and counted in their archived count.
// The home and global timelines keep their ids.
func archivePosts(t testing.TB, db *DB, posts ...*warble.Post) {
	t.Helper()
	ctx := context.Background()
	if err := db.opts.Archive.SavePosts(ctx, posts); err != nil {
		t.Fatalf("SavePosts: %v", err)
	}
	for _, p := range posts {
		author, seq, _ := splitPostID(p.ID)
		if err := db.client.Del(ctx, postKey(author, seq)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := db.client.ZRem(ctx, postsKey(author), p.ID).Err(); err != nil {
			t.Fatal(err)
		}
		if err := db.client.HIncrBy(ctx, userKey(author), archivedPostsField, 1).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestArchivedPostsRead: a post that moved to the archive reads as it did
// from Redis, by id and in every timeline that still holds its id, all of
// a page's in one query; a post deleted for real is found nowhere.
func TestArchivedPostsRead(t *testing.T) {
	ctx := context.Background()
	db, arch := newArchivedDB(t, Options{})
	svc := NewPostService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	var posts []*warble.Post
	for i := range 12 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, fmt.Sprint("post ", i)))
	}
	deleted := posts[9]
	if err := svc.DeletePost(ctx, ada.ID, deleted.ID); err != nil {
		t.Fatal(err)
	}
	archivePosts(t, db, posts[:8]...)
	var want []string // newest first, without the deleted post
	for _, p := range slices.Backward(posts) {
		if p != deleted {
			want = append(want, p.ID)
		}
	}

	for _, p := range []*warble.Post{posts[0], posts[7], posts[11]} {
		got, err := svc.FindPostByID(ctx, p.ID)
		if err != nil {
			t.Fatalf("FindPostByID(%s): %v", p.ID, err)
		}
		if got.Body != p.Body || !got.CreatedAt.Equal(p.CreatedAt) || got.Seq != p.Seq || got.AuthorID != ada.ID ||
			got.Author == nil || got.Author.Username != "ada" {
			t.Errorf("FindPostByID(%s) = %+v, want %+v by ada", p.ID, got, p)
		}
	}
	if _, err := svc.FindPostByID(ctx, deleted.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Errorf("FindPostByID(deleted) err = %v, want not found", err)
	}

	before := arch.byIDs.Load()
	ids := []string{posts[1].ID, deleted.ID, posts[10].ID, posts[2].ID, "1:999999"}
	got, err := svc.FindPostsByIDs(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if n := arch.byIDs.Load() - before; n != 1 {
		t.Errorf("FindPostsByIDs asked the archive %d times, want once", n)
	}
	for i, p := range got {
		wantNil := ids[i] == deleted.ID || ids[i] == "1:999999"
		if (p == nil) != wantNil || (p != nil && (p.ID != ids[i] || p.Author == nil)) {
			t.Errorf("FindPostsByIDs[%d] (%s) = %+v", i, ids[i], p)
		}
	}

	for _, feed := range []warble.Feed{warble.HomeFeed(bob.ID), warble.HomeFeed(ada.ID), warble.GlobalFeed()} {
		before := arch.queries()
		tl, err := svc.FindTimeline(ctx, feed, warble.PageArgs{First: 20})
		if err != nil {
			t.Fatal(err)
		}
		if n := arch.queries() - before; n != 1 {
			t.Errorf("%s: a page asked the archive %d times, want once", feed, n)
		}
		var got []string
		for _, e := range tl.Edges {
			got = append(got, e.Node.ID)
			if e.Node.Author == nil || e.Node.Body == "" {
				t.Errorf("%s: post %s read as %+v", feed, e.Node.ID, e.Node)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", feed, got, want)
		}
	}
}

// TestUserPostsAcrossArchive pages through a user's posts whose oldest are
// archived: the pages go on from the posts set into the archive with exact
// cursors, whatever the page size, while new posts arrive; a page that
// crosses asks the archive once; and a post in both places, as while it
// moves, is read once.
func TestUserPostsAcrossArchive(t *testing.T) {
	ctx := context.Background()
	db, arch := newArchivedDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	var posts []*warble.Post
	for i := range 25 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, fmt.Sprint("post ", i)))
		mustCreatePost(t, db, bob.ID, "noise")
	}
	archivePosts(t, db, posts[:15]...)
	// The next one is written to the archive but still in Redis, as a
	// post is between the mover's two steps.
	if err := arch.SavePosts(ctx, posts[15:16]); err != nil {
		t.Fatal(err)
	}
	want := reversed(idsOf(posts))
	feed := warble.UserFeed(ada.ID)

	before := arch.queries()
	tl, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: 20})
	if err != nil {
		t.Fatal(err)
	}
	if n := arch.queries() - before; n != 1 {
		t.Errorf("a page across the boundary asked the archive %d times, want once", n)
	}
	if len(tl.Edges) != 20 || !tl.PageInfo.HasNextPage {
		t.Fatalf("first page has %d posts, next %v", len(tl.Edges), tl.PageInfo.HasNextPage)
	}

	for _, first := range []int{1, 3, 10, 11, 100} {
		t.Run(fmt.Sprint(first), func(t *testing.T) {
			var meanwhile []string
			got := readTimeline(t, db, feed, first, func() {
				meanwhile = append(meanwhile, mustCreatePost(t, db, ada.ID, "meanwhile").ID)
			})
			if !slices.Equal(got, want) {
				t.Fatalf("pages of %d read\n%v\nwant\n%v", first, got, want)
			}
			want = append(reversed(meanwhile), want...)
		})
	}

	// Nothing of bob's is archived: his last page does not ask the archive.
	before = arch.queries()
	if got := readTimeline(t, db, warble.UserFeed(bob.ID), 10, nil); len(got) != 25 {
		t.Errorf("bob's posts: %d, want 25", len(got))
	}
	if n := arch.queries() - before; n != 0 {
		t.Errorf("reading the posts of a user with none archived asked the archive %d times", n)
	}

	// Everything archived: the posts set is empty, the pages all come from
	// the archive.
	carl := mustSignup(t, db, "carl")
	var carls []*warble.Post
	for i := range 4 {
		carls = append(carls, mustCreatePost(t, db, carl.ID, fmt.Sprint(i)))
	}
	archivePosts(t, db, carls...)
	if got := readTimeline(t, db, warble.UserFeed(carl.ID), 3, nil); !slices.Equal(got, reversed(idsOf(carls))) {
		t.Errorf("posts of an author all archived = %v, want %v", got, reversed(idsOf(carls)))
	}
}

// TestHomePastCapWithArchive reads a home timeline past its cap to the
// end when the oldest posts of the accounts the reader follows are
// archived: the pull merges their posts sets with the archive, one query
// per page, and shows each post once.
func TestHomePastCapWithArchive(t *testing.T) {
	ctx := context.Background()
	db, arch := newArchivedDB(t, Options{HomeCap: 4})
	reader := mustSignup(t, db, "reader")
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	stranger := mustSignup(t, db, "stranger")
	mustFollow(t, db, reader.ID, ada.ID)
	mustFollow(t, db, reader.ID, bob.ID)
	byAuthor := map[string][]*warble.Post{}
	var want []string
	for i := range 9 {
		for _, u := range []*warble.User{ada, stranger, bob, reader} {
			p := mustCreatePost(t, db, u.ID, fmt.Sprint(i))
			byAuthor[u.ID] = append(byAuthor[u.ID], p)
			if u != stranger {
				want = append(want, p.ID)
			}
		}
	}
	slices.Reverse(want)
	archivePosts(t, db, byAuthor[ada.ID][:6]...)
	archivePosts(t, db, byAuthor[bob.ID][:2]...)
	archivePosts(t, db, byAuthor[reader.ID][:7]...)
	archivePosts(t, db, byAuthor[stranger.ID][:5]...)
	if err := arch.SavePosts(ctx, byAuthor[bob.ID][2:3]); err != nil { // in both, as while it moves
		t.Fatal(err)
	}

	feed := warble.HomeFeed(reader.ID)
	for _, first := range []int{1, 2, 5, 100} {
		if got := readTimeline(t, db, feed, first, nil); !slices.Equal(got, want) {
			t.Fatalf("pages of %d read\n%v\nwant\n%v", first, got, want)
		}
	}
	first := firstPage(t, db, feed, 4)
	tl, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: 4, After: new(warble.PostCursor(mustSeq(t, first[3])))})
	if err != nil {
		t.Fatal(err)
	}
	before := arch.byAuthors.Load()
	if _, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: 10, After: tl.PageInfo.EndCursor}); err != nil {
		t.Fatal(err)
	}
	if n := arch.byAuthors.Load() - before; n != 1 {
		t.Errorf("a page past the cap asked the archive for posts by author %d times, want once", n)
	}

	// Nothing archived of the accounts another reader follows: the pull
	// does not ask the archive.
	other := mustSignup(t, db, "other")
	cal := mustSignup(t, db, "cal")
	mustFollow(t, db, other.ID, cal.ID)
	var cals []string
	for i := range 9 {
		cals = append(cals, mustCreatePost(t, db, cal.ID, fmt.Sprint(i)).ID)
	}
	before = arch.queries()
	if got := readTimeline(t, db, warble.HomeFeed(other.ID), 3, nil); !slices.Equal(got, reversed(cals)) {
		t.Errorf("home of other = %v, want %v", got, reversed(cals))
	}
	if n := arch.queries() - before; n != 0 {
		t.Errorf("pulling posts of accounts with none archived asked the archive %d times", n)
	}
}

// mustSeq returns the seq of a post id.
func mustSeq(t *testing.T, id string) int64 {
	t.Helper()
	seq, ok := postSeq(id)
	if !ok {
		t.Fatalf("malformed post id %q", id)
	}
	return seq
}

// TestGlobalPastCapWithArchive reads the global timeline past its cap: it
// goes on with every older post, newest first, whether it is still in
// Redis (the cap put its id in the tail) or archived, and an id both in the
// tail and the archive (a move whose tail update did not run) is read
// once. A deleted post leaves the tail. Without an archive the timeline
// ends at its cap.
func TestGlobalPastCapWithArchive(t *testing.T) {
	db, _ := newArchivedDB(t, Options{GlobalCap: 5})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	var all []*warble.Post
	for i := range 8 {
		all = append(all, mustCreatePost(t, db, ada.ID, fmt.Sprint(i)))
		all = append(all, mustCreatePost(t, db, bob.ID, fmt.Sprint(i)))
	}
	// adas[0..2] and bobs[0..4] move to the archive; archivePosts, like a
	// mover that died before its tail update, leaves their ids in the
	// tail.
	archivePosts(t, db, all[0], all[2], all[4])
	archivePosts(t, db, all[1], all[3], all[5], all[7], all[9])
	if n := db.client.ZCard(context.Background(), globalTailKey).Val(); n != int64(len(all)-5) {
		t.Fatalf("the global timeline's tail holds %d ids, want the %d its cap took off", n, len(all)-5)
	}
	want := reversed(idsOf(all))
	for _, first := range []int{1, 4, 5, 100} {
		if got := readTimeline(t, db, warble.GlobalFeed(), first, nil); !slices.Equal(got, want) {
			t.Errorf("pages of %d read\n%v\nwant\n%v", first, got, want)
		}
	}

	// A deleted post, in the tail (all[6]) or archived (all[0]), is gone
	// from it, and from the tail.
	posts := NewPostService(db)
	for _, p := range []*warble.Post{all[6], all[0]} {
		if err := posts.DeletePost(context.Background(), p.AuthorID, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	drainFanOut(t, db)
	if db.client.ZScore(context.Background(), globalTailKey, all[6].ID).Err() == nil {
		t.Errorf("deleted post %s is still in the global timeline's tail", all[6].ID)
	}
	want = reversed(idsOf(append(slices.Clone(all[1:6]), all[7:]...)))
	if got := readTimeline(t, db, warble.GlobalFeed(), 3, nil); !slices.Equal(got, want) {
		t.Errorf("after two deletes, pages of 3 read\n%v\nwant\n%v", got, want)
	}

	plain := newTestDB(t, Options{GlobalCap: 5})
	carl := mustSignup(t, plain, "carl")
	for i := range 8 {
		mustCreatePost(t, plain, carl.ID, fmt.Sprint(i))
	}
	if got := readTimeline(t, plain, warble.GlobalFeed(), 2, nil); len(got) != 5 {
		t.Errorf("global timeline without an archive = %v, want its 5 newest", got)
	}
}

// TestReplayArchived subscribes with after: to timelines whose posts moved
// to the archive since the cursor: the replay reads them from there, oldest
// first, and goes on live. A user's posts past what their posts set holds
// are replayed from the archive too.
func TestReplayArchived(t *testing.T) {
	db, _ := newArchivedDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	var posts []*warble.Post
	for i := range 6 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, fmt.Sprint(i)))
	}
	archivePosts(t, db, posts[:4]...)
	h := newTestHub(t, db)
	after := warble.PostCursor(posts[0].Seq)
	for _, feed := range []warble.Feed{warble.UserFeed(ada.ID), warble.HomeFeed(bob.ID), warble.GlobalFeed()} {
		events := mustSubscribe(t, h, feed, &after)
		for _, p := range posts[1:] {
			ev := nextEvent(t, events)
			if ev.Kind != warble.PostAdded || *ev.PostID != p.ID || ev.Post == nil || ev.Post.Body != p.Body || ev.Post.Author == nil {
				t.Fatalf("%s: replayed %s %v %+v, want POST_ADDED of %s", feed, ev.Kind, ev.PostID, ev.Post, p.ID)
			}
		}
		live := mustCreatePost(t, db, ada.ID, "live")
		if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || *ev.PostID != live.ID {
			t.Fatalf("%s: then %s %v, want POST_ADDED of %s", feed, ev.Kind, ev.PostID, live.ID)
		}
		posts = append(posts, live)
	}

	// Everything of carl's archived: the replay is the archive's.
	carl := mustSignup(t, db, "carl")
	var carls []*warble.Post
	for i := range 3 {
		carls = append(carls, mustCreatePost(t, db, carl.ID, fmt.Sprint(i)))
	}
	archivePosts(t, db, carls...)
	after = warble.PostCursor(carls[0].Seq)
	events := mustSubscribe(t, h, warble.UserFeed(carl.ID), &after)
	for _, p := range carls[1:] {
		if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || *ev.PostID != p.ID {
			t.Fatalf("carl: replayed %s %v, want POST_ADDED of %s", ev.Kind, ev.PostID, p.ID)
		}
	}
}

// TestUnfollowArchivedPosts: unfollowing takes the followee's posts off the
// home timeline, those that moved to the archive too, whose ids the home
// timeline kept and its posts set did not.
func TestUnfollowArchivedPosts(t *testing.T) {
	ctx := context.Background()
	db, _ := newArchivedDB(t, Options{})
	reader := mustSignup(t, db, "reader")
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, reader.ID, ada.ID)
	mustFollow(t, db, reader.ID, bob.ID)
	var adas []*warble.Post
	var bobs []string
	for i := range 4 {
		adas = append(adas, mustCreatePost(t, db, ada.ID, fmt.Sprint(i)))
		bobs = append(bobs, mustCreatePost(t, db, bob.ID, fmt.Sprint(i)).ID)
	}
	archivePosts(t, db, adas[:3]...)
	if err := NewFollowService(db).Unfollow(ctx, reader.ID, ada.ID); err != nil {
		t.Fatal(err)
	}
	if got, want := readTimeline(t, db, warble.HomeFeed(reader.ID), 10, nil), reversed(bobs); !slices.Equal(got, want) {
		t.Errorf("home after unfollowing ada = %v, want bob's only: %v", got, want)
	}
}

// TestReadsSameAfterMove reads every timeline, page by page, and every post
// by id, before and after the mover took most posts to the archive: the
// same posts, in the same order, under the same cursors.
func TestReadsSameAfterMove(t *testing.T) {
	ctx := context.Background()
	db, _ := newArchiveTestDB(t, Options{PostsInRedis: 3, HomeCap: 6, GlobalCap: 100})
	reader := mustSignup(t, db, "reader")
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, reader.ID, ada.ID)
	mustFollow(t, db, reader.ID, bob.ID)
	var ids []string
	for i := range 10 {
		for _, u := range []*warble.User{ada, bob, reader} {
			ids = append(ids, mustCreatePost(t, db, u.ID, fmt.Sprint(u.Username, " ", i)).ID)
		}
	}
	feeds := []warble.Feed{
		warble.UserFeed(ada.ID), warble.UserFeed(reader.ID), warble.HomeFeed(reader.ID),
		warble.HomeFeed(ada.ID), warble.GlobalFeed(),
	}
	// read returns every page of every feed, and every post by id, as text.
	read := func() []string {
		var out []string
		for _, feed := range feeds {
			for _, first := range []int{4, 7} {
				var after *string
				for {
					tl, err := NewPostService(db).FindTimeline(ctx, feed, warble.PageArgs{First: first, After: after})
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range tl.Edges {
						out = append(out, fmt.Sprint(feed, " ", e.Cursor, " ", e.Node.ID, " ", e.Node.Body, " ", e.Node.CreatedAt, " ", e.Node.Author.Username))
					}
					if !tl.PageInfo.HasNextPage {
						break
					}
					after = tl.PageInfo.EndCursor
				}
			}
		}
		posts, err := NewPostService(db).FindPostsByIDs(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range posts {
			out = append(out, fmt.Sprint(p.ID, " ", p.Body, " ", p.CreatedAt, " ", p.Author.Username))
		}
		return out
	}
	before := read()
	if moved := drainMoves(t, db); moved != 21 {
		t.Fatalf("the mover moved %d posts, want 21", moved)
	}
	after := read()
	if !slices.Equal(before, after) {
		t.Errorf("reads before the move:\n%v\nafter:\n%v", strings.Join(before, "\n"), strings.Join(after, "\n"))
	}
}

// TestFollowCopiesArchivedPosts: following copies the followee's newest
// posts up to the home timeline cap, those that moved to the archive too.
func TestFollowCopiesArchivedPosts(t *testing.T) {
	db, _ := newArchivedDB(t, Options{HomeCap: 5})
	reader := mustSignup(t, db, "reader")
	ada := mustSignup(t, db, "ada")
	var adas []*warble.Post
	for i := range 7 {
		adas = append(adas, mustCreatePost(t, db, ada.ID, fmt.Sprint(i)))
	}
	archivePosts(t, db, adas[:5]...)
	mustFollow(t, db, reader.ID, ada.ID)
	if got, want := zsetIDs(t, db, homeKey(reader.ID)), idsOf(adas[2:]); !slices.Equal(got, want) {
		t.Errorf("home after follow = %v, want ada's newest 5: %v", got, want)
	}

	// All archived: the copy is the archive's alone.
	bob := mustSignup(t, db, "bob")
	var bobs []*warble.Post
	for i := range 3 {
		bobs = append(bobs, mustCreatePost(t, db, bob.ID, fmt.Sprint(i)))
	}
	archivePosts(t, db, bobs...)
	fan := mustSignup(t, db, "fan")
	mustFollow(t, db, fan.ID, bob.ID)
	if got, want := readTimeline(t, db, warble.HomeFeed(fan.ID), 2, nil), reversed(idsOf(bobs)); !slices.Equal(got, want) {
		t.Errorf("home after following bob = %v, want %v", got, want)
	}
}

// TestPulledAccountArchived: the posts of an account that is pulled, not
// pushed, are in its posts set alone; once the oldest move to the archive,
// the home timelines of its followers still show them, merged in order,
// one query per page. A resume from before what the posts set holds gets
// a RESYNC (the replay does not read the archive), one after it a replay.
func TestPulledAccountArchived(t *testing.T) {
	db, arch := newArchivedDB(t, Options{PullThreshold: 1})
	reader := mustSignup(t, db, "reader")
	other := mustSignup(t, db, "other")
	celeb := mustSignup(t, db, "celeb")
	small := mustSignup(t, db, "small")
	mustFollow(t, db, reader.ID, celeb.ID)
	mustFollow(t, db, other.ID, celeb.ID)
	mustFollow(t, db, reader.ID, small.ID)
	var celebs []*warble.Post
	var want []string
	for i := range 8 {
		p := mustCreatePost(t, db, celeb.ID, fmt.Sprint(i))
		celebs = append(celebs, p)
		want = append(want, p.ID)
		if i%3 == 0 {
			want = append(want, mustCreatePost(t, db, small.ID, fmt.Sprint(i)).ID)
		}
	}
	if n := db.client.SCard(context.Background(), pullAuthorsKey).Val(); n != 1 {
		t.Fatalf("%d accounts pulled, want the celebrity", n)
	}
	archivePosts(t, db, celebs[:5]...)
	slices.Reverse(want)
	feed := warble.HomeFeed(reader.ID)
	for _, first := range []int{1, 2, 3, 100} {
		before := arch.queries()
		got := readTimeline(t, db, feed, first, nil)
		if !slices.Equal(got, want) {
			t.Fatalf("pages of %d read\n%v\nwant\n%v", first, got, want)
		}
		if first == 100 && arch.queries()-before != 1 {
			t.Errorf("one page asked the archive %d times, want once", arch.queries()-before)
		}
	}

	h := newTestHub(t, db)
	after := warble.PostCursor(celebs[3].Seq)
	if ev := nextEvent(t, mustSubscribe(t, h, feed, &after)); ev.Kind != warble.Resync {
		t.Errorf("resume from before the posts set: %s, want RESYNC", ev.Kind)
	}
	after = warble.PostCursor(celebs[6].Seq)
	events := mustSubscribe(t, h, feed, &after)
	for _, id := range reversed(want[:slices.Index(want, celebs[6].ID)]) {
		if ev := nextEvent(t, events); ev.Kind != warble.PostAdded || *ev.PostID != id {
			t.Fatalf("resume from within the posts set: %s %v, want POST_ADDED of %s", ev.Kind, ev.PostID, id)
		}
	}
}

// TestRebuildReadsArchive: the home timeline of a user back from a long
// absence is rebuilt with the posts fan-out skipped meanwhile, those that
// moved to the archive since too.
func TestRebuildReadsArchive(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db, _ := newArchivedDB(t, Options{Now: clock.Now, InactiveAfter: 7 * 24 * time.Hour})
	ctx := context.Background()
	author := mustSignup(t, db, "author")
	away := mustSignup(t, db, "away")
	mustFollow(t, db, away.ID, author.ID)
	want := []string{mustCreatePost(t, db, author.ID, "while away reads").ID}
	clock.Add(8 * 24 * time.Hour)
	var missed []*warble.Post
	for i := range 4 {
		missed = append(missed, mustCreatePost(t, db, author.ID, fmt.Sprint("missed ", i)))
	}
	if n := holding(t, db, []string{away.ID}, missed[3].ID); n != 0 {
		t.Fatal("fan-out delivered to a follower away for 8 days")
	}
	archivePosts(t, db, missed[:2]...)
	if _, err := NewAuthService(db).Login(ctx, warble.LoginInput{Username: "away", Password: "password123"}); err != nil {
		t.Fatal(err)
	}
	want = reversed(append(want, idsOf(missed)...))
	if got := readTimeline(t, db, warble.HomeFeed(away.ID), 10, nil); !slices.Equal(got, want) {
		t.Errorf("home after coming back = %v, want %v", got, want)
	}
}

// TestGlobalTailFollowsTheMover: the global timeline's tail holds the ids
// of the posts its cap took off while they are in Redis; the mover takes
// the ids of the posts it moves out of it, and the timeline reads the same
// before and after.
func TestGlobalTailFollowsTheMover(t *testing.T) {
	ctx := context.Background()
	db, _ := newArchiveTestDB(t, Options{GlobalCap: 3, PostsInRedis: 4})
	ada := mustSignup(t, db, "ada")
	var posts []*warble.Post
	for i := range 10 {
		posts = append(posts, mustCreatePost(t, db, ada.ID, fmt.Sprint(i)))
	}
	want := reversed(idsOf(posts))
	if got := readTimeline(t, db, warble.GlobalFeed(), 4, nil); !slices.Equal(got, want) {
		t.Fatalf("before the move, pages of 4 read\n%v\nwant\n%v", got, want)
	}
	if moved := drainMoves(t, db); moved != 6 {
		t.Fatalf("the mover moved %d posts, want 6", moved)
	}
	tail, err := db.client.ZRange(ctx, globalTailKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// 7 ids went to the tail (10 posts, a cap of 3); the 6 oldest moved.
	if want := []string{posts[6].ID}; !slices.Equal(tail, want) {
		t.Errorf("the global timeline's tail after the move = %v, want %v", tail, want)
	}
	if got := readTimeline(t, db, warble.GlobalFeed(), 4, nil); !slices.Equal(got, want) {
		t.Errorf("after the move, pages of 4 read\n%v\nwant\n%v", got, want)
	}
}
