package redisdb

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// readTimeline pages through feed first posts at a time, calling between
// pages, and returns the post ids it read, newest first.
func readTimeline(tb testing.TB, db *DB, feed warble.Feed, first int, between func()) []string {
	tb.Helper()
	var ids []string
	var after *string
	for pages := 0; ; pages++ {
		if pages > 1000 {
			tb.Fatal("paging does not end")
		}
		tl, err := NewPostService(db).FindTimeline(context.Background(), feed, warble.PageArgs{First: first, After: after})
		if err != nil {
			tb.Fatalf("FindTimeline(%s): %v", feed, err)
		}
		if len(tl.Edges) > first {
			tb.Fatalf("page has %d edges, want at most %d", len(tl.Edges), first)
		}
		for _, e := range tl.Edges {
			if e.Node.Author == nil || e.Node.Author.ID != e.Node.AuthorID {
				tb.Errorf("post %s has author %+v", e.Node.ID, e.Node.Author)
			}
			if e.Cursor != warble.PostCursor(e.Node.Seq) {
				tb.Errorf("post %s cursor does not encode its seq", e.Node.ID)
			}
			ids = append(ids, e.Node.ID)
		}
		if !tl.PageInfo.HasNextPage {
			return ids
		}
		if tl.PageInfo.EndCursor == nil {
			tb.Fatal("HasNextPage without EndCursor")
		}
		after = tl.PageInfo.EndCursor
		if between != nil {
			between()
		}
	}
}

// firstPage returns the ids of the first page of feed, first posts long.
func firstPage(tb testing.TB, db *DB, feed warble.Feed, first int) []string {
	tb.Helper()
	tl, err := NewPostService(db).FindTimeline(context.Background(), feed, warble.PageArgs{First: first})
	if err != nil {
		tb.Fatalf("FindTimeline(%s): %v", feed, err)
	}
	var ids []string
	for _, e := range tl.Edges {
		ids = append(ids, e.Node.ID)
	}
	return ids
}

func TestFindTimelinePaging(t *testing.T) {
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	var adas, all []string // oldest first
	for i := range 23 {
		author := ada.ID
		if i%3 == 0 {
			author = bob.ID
		}
		p := mustCreatePost(t, db, author, "post "+strconv.Itoa(i))
		all = append(all, p.ID)
		if author == ada.ID {
			adas = append(adas, p.ID)
		}
	}
	tests := []struct {
		name string
		feed warble.Feed
		key  string
		base []string // posts the feed holds at least, oldest first
	}{
		{"Global", warble.GlobalFeed(), globalKey, all},
		{"Home", warble.HomeFeed(bob.ID), homeKey(bob.ID), all},
		{"User", warble.UserFeed(ada.ID), postsKey(ada.ID), adas},
	}
	for _, tt := range tests {
		for _, first := range []int{1, 5, 23, 100} {
			t.Run(tt.name+"/"+strconv.Itoa(first), func(t *testing.T) {
				// What the feed holds now, newest first; earlier
				// subtests have added posts of their own.
				want, err := db.client.ZRevRange(context.Background(), tt.key, 0, -1).Result()
				if err != nil {
					t.Fatal(err)
				}
				base := slices.Clone(tt.base)
				slices.Reverse(base)
				if len(want) < len(base) || !slices.Equal(want[len(want)-len(base):], base) {
					t.Fatalf("feed %v does not end with %v", want, base)
				}
				// New posts between pages must neither repeat nor
				// shift what the next page holds.
				got := readTimeline(t, db, tt.feed, first, func() {
					mustCreatePost(t, db, ada.ID, "meanwhile")
				})
				if !slices.Equal(got, want) {
					t.Errorf("pages read %v,\nwant %v", got, want)
				}
			})
		}
	}
}

func TestFindTimelineEmpty(t *testing.T) {
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	tl, err := NewPostService(db).FindTimeline(context.Background(), warble.HomeFeed(ada.ID), warble.PageArgs{First: 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(tl.Edges) != 0 || tl.PageInfo.HasNextPage || tl.PageInfo.EndCursor != nil {
		t.Errorf("empty timeline = %+v", tl)
	}
}

func TestFindTimelineBadPage(t *testing.T) {
	db := newTestDB(t, Options{})
	str := func(s string) *string { return &s }
	tests := []struct {
		name string
		page warble.PageArgs
	}{
		{"FirstZero", warble.PageArgs{First: 0}},
		{"FirstNegative", warble.PageArgs{First: -1}},
		{"FirstTooBig", warble.PageArgs{First: warble.MaxPageSize + 1}},
		{"CursorGarbage", warble.PageArgs{First: 5, After: str("!!")}},
		{"CursorEmpty", warble.PageArgs{First: 5, After: str("")}},
		{"CursorOfFollow", warble.PageArgs{First: 5, After: str(warble.FollowCursor(db.now(), "1"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPostService(db).FindTimeline(context.Background(), warble.GlobalFeed(), tt.page)
			if got := warble.ErrorCode(err); got != warble.EINVALID {
				t.Errorf("FindTimeline code = %q, want %q (err %v)", got, warble.EINVALID, err)
			}
		})
	}
}

// TestFindTimelineSkipsDeleted reads a timeline whose ids outlive their
// posts, as when a delete races the read: the gone posts are skipped and
// the page is filled from further down.
func TestFindTimelineSkipsDeleted(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	var ids []string
	for i := range 10 {
		ids = append(ids, mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i)).ID)
	}
	// Delete the hashes of posts 9, 7 and 6 only, leaving their ids.
	for _, i := range []int{9, 7, 6} {
		author, seq, _ := splitPostID(ids[i])
		if err := db.client.Del(ctx, postKey(author, seq)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	tl, err := NewPostService(db).FindTimeline(ctx, warble.GlobalFeed(), warble.PageArgs{First: 4})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range tl.Edges {
		got = append(got, e.Node.ID)
	}
	if want := []string{ids[8], ids[5], ids[4], ids[3]}; !slices.Equal(got, want) {
		t.Errorf("page = %v, want %v", got, want)
	}
	if !tl.PageInfo.HasNextPage {
		t.Error("HasNextPage = false, want true")
	}
	if rest := readTimeline(t, db, warble.GlobalFeed(), 100, nil); len(rest) != 7 {
		t.Errorf("whole timeline has %d posts, want 7", len(rest))
	}
}

// TestFindTimelineForeignMember checks that a member of a timeline that is
// not a post id (Warble writes none: data from elsewhere) is left out of
// pages without moving where they end: its position comes from its score,
// as a post's comes from its id, so paging still reads every post once.
func TestFindTimelineForeignMember(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	ada := mustSignup(t, db, "ada")
	var ids []string
	for i := range 6 {
		ids = append(ids, mustCreatePost(t, db, ada.ID, "post "+strconv.Itoa(i)).ID)
	}
	// Between posts 4 and 3, so that it ends the first read of a page of 2
	// (posts 5 and 4, and it, the one read to know whether a next page
	// exists).
	seq3, _ := postSeq(ids[3])
	if err := db.client.ZAdd(ctx, globalKey, redis.Z{Score: float64(seq3) + 0.5, Member: "not a post"}).Err(); err != nil {
		t.Fatal(err)
	}
	got := readTimeline(t, db, warble.GlobalFeed(), 2, nil)
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Errorf("timeline = %v, want %v", got, want)
	}
}

// TestFindTimelineRoundTrips checks that a page costs a constant number of
// round trips: one range read, one fetch of the posts with their authors.
func TestFindTimelineRoundTrips(t *testing.T) {
	db := newTestDB(t, Options{})
	users := []*warble.User{mustSignup(t, db, "ada"), mustSignup(t, db, "bob"), mustSignup(t, db, "cat")}
	for i := range 60 {
		mustCreatePost(t, db, users[i%3].ID, "post "+strconv.Itoa(i))
	}
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	counts := map[int]int64{}
	for _, first := range []int{5, 20, 50} {
		before := counter.N()
		tl, err := NewPostService(db).FindTimeline(context.Background(), warble.GlobalFeed(), warble.PageArgs{First: first})
		if err != nil {
			t.Fatal(err)
		}
		if len(tl.Edges) != first {
			t.Fatalf("page of %d has %d edges", first, len(tl.Edges))
		}
		counts[first] = counter.N() - before
	}
	if counts[5] != 2 || counts[20] != 2 || counts[50] != 2 {
		t.Errorf("round trips per page by size = %v, want 2 for each", counts)
	}

	// A home timeline shorter than its first page, and short of its cap,
	// holds all of it: the page ends there, with nothing to ask about
	// older posts the cap might have cut off.
	// (The first home page of a process also reads which accounts are
	// pulled, which it then keeps for a while.)
	mustFollow(t, db, users[0].ID, users[1].ID)
	firstPage(t, db, warble.HomeFeed(users[0].ID), 50)
	before := counter.N()
	tl, err := NewPostService(db).FindTimeline(context.Background(), warble.HomeFeed(users[0].ID), warble.PageArgs{First: 50})
	if err != nil {
		t.Fatal(err)
	}
	if len(tl.Edges) != 40 || tl.PageInfo.HasNextPage {
		t.Errorf("home page of 50 has %d edges, HasNextPage %v; want the 40 posts of ada and bob, and no next page", len(tl.Edges), tl.PageInfo.HasNextPage)
	}
	if n := counter.N() - before; n != 2 {
		t.Errorf("a short home timeline's first page took %d round trips, want 2", n)
	}
}

// pageOf returns what a client sees of tl: its posts' ids with their
// cursors, and where it ends.
func pageOf(tl *warble.Timeline) string {
	var b []byte
	for _, e := range tl.Edges {
		b = append(b, e.Node.ID+"@"+e.Cursor+" "...)
	}
	end := "<nil>"
	if tl.PageInfo.EndCursor != nil {
		end = *tl.PageInfo.EndCursor
	}
	return string(b) + "next=" + strconv.FormatBool(tl.PageInfo.HasNextPage) + " end=" + end
}

// TestHomePageReadWithTheSession checks that a home page read in the
// context AuthenticateForHome returns costs one round trip less than after
// Authenticate (the range read goes with the session's reads), and is the
// same page: the first one, and one after a cursor. What was read ahead is
// used only for the page and the timeline it was read for.
func TestHomePageReadWithTheSession(t *testing.T) {
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	posts := NewPostService(db)
	ctx := context.Background()
	reader := mustSignupSession(t, auth, "reader")
	other := mustSignup(t, db, "other")
	mustFollow(t, db, reader.User.ID, other.ID)
	for i := range 30 {
		mustCreatePost(t, db, other.ID, "post "+strconv.Itoa(i))
	}
	home := warble.HomeFeed(reader.User.ID)
	firstPage(t, db, home, 20) // reads which accounts are pulled, which it then keeps
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)

	// read authenticates with or without the read ahead of ahead, then
	// reads page of feed, and returns the page and the round trips.
	read := func(ahead *warble.PageArgs, feed warble.Feed, page warble.PageArgs) (string, int64) {
		t.Helper()
		before := counter.N()
		var c context.Context
		var err error
		if ahead != nil {
			c, _, _, err = auth.AuthenticateForHome(ctx, reader.Token, *ahead)
		} else {
			c = ctx
			_, _, err = auth.Authenticate(ctx, reader.Token)
		}
		if err != nil {
			t.Fatal(err)
		}
		tl, err := posts.FindTimeline(c, feed, page)
		if err != nil {
			t.Fatal(err)
		}
		return pageOf(tl), counter.N() - before
	}
	first := warble.PageArgs{First: 20}
	want, plain := read(nil, home, first)
	got, n := read(&first, home, first)
	if got != want {
		t.Errorf("first page read with the session:\n%s\nwant\n%s", got, want)
	}
	if plain != 3 || n != 2 {
		t.Errorf("first page: %d round trips with the session's read, %d without; want 2 and 3", n, plain)
	}

	tl, err := posts.FindTimeline(ctx, home, first)
	if err != nil {
		t.Fatal(err)
	}
	next := warble.PageArgs{First: 20, After: tl.PageInfo.EndCursor}
	want, plain = read(nil, home, next)
	got, n = read(&next, home, next)
	if got != want {
		t.Errorf("page after a cursor read with the session:\n%s\nwant\n%s", got, want)
	}
	if n != plain-1 {
		t.Errorf("page after a cursor: %d round trips with the session's read, %d without; want one less", n, plain)
	}

	// Read ahead for another page, or used for another timeline: each
	// page is read as it would be without.
	want, plain = read(nil, home, first)
	small := warble.PageArgs{First: 5}
	if got, n = read(&small, home, first); got != want || n != plain {
		t.Errorf("page of 20 after a read ahead for 5: %d round trips, want %d; page\n%s\nwant\n%s", n, plain, got, want)
	}
	theirs := warble.HomeFeed(other.ID)
	want, _ = read(nil, theirs, first)
	if got, _ = read(&first, theirs, first); got != want {
		t.Errorf("another user's home page after a read ahead of the reader's:\n%s\nwant\n%s", got, want)
	}
}

// TestHomeReadAheadOfBadToken checks that a wrong or revoked token gets
// EUNAUTHENTICATED from AuthenticateForHome in its one round trip, with
// nothing read ahead in its context and nothing written.
func TestHomeReadAheadOfBadToken(t *testing.T) {
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	ctx := context.Background()
	reader := mustSignupSession(t, auth, "reader")
	gone := mustSignupSession(t, auth, "gone")
	if err := auth.Logout(ctx, &warble.Session{TokenHash: hashToken(gone.Token), UserID: gone.User.ID}); err != nil {
		t.Fatal(err)
	}
	// The same form and user as the reader's token, another secret.
	userID, _, _ := strings.Cut(reader.Token, ".")
	wrong := userID + "." + strings.Repeat("A", secretLen)
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	for _, token := range []string{wrong, gone.Token} {
		before := snapshot(t, db)
		n := counter.N()
		c, u, s, err := auth.AuthenticateForHome(ctx, token, warble.PageArgs{First: 20})
		if warble.ErrorCode(err) != warble.EUNAUTHENTICATED || u != nil || s != nil {
			t.Errorf("AuthenticateForHome(%q) = %v, %v, %v; want EUNAUTHENTICATED", token, u, s, err)
		}
		if c.Value(homeAheadKey{}) != nil {
			t.Errorf("AuthenticateForHome(%q) returned a context with a read ahead", token)
		}
		if got := counter.N() - n; got != 1 {
			t.Errorf("AuthenticateForHome(%q) took %d round trips, want 1", token, got)
		}
		assertUnchanged(t, db, before, "a bad token's AuthenticateForHome")
	}
}
