package redisdb

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/archive"
	"github.com/warble/warble/internal/mysqltest"
	"github.com/warble/warble/internal/warble"
)

// newArchiveTestDB is newTestDB with an archive on a fresh MariaDB
// database, and the archive's store.
func newArchiveTestDB(t testing.TB, opts Options) (*DB, *archive.Store) {
	t.Helper()
	d := mysqltest.New(t)
	store, err := archive.Open(context.Background(), d.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	opts.Archive = store
	return newTestDB(t, opts), store
}

// drainMoves runs the mover until no author is due.
func drainMoves(tb testing.TB, db *DB) int {
	tb.Helper()
	total := 0
	for i := 0; ; i++ {
		moved, found, err := db.moveDue(context.Background(), i)
		if err != nil {
			tb.Fatalf("move: %v", err)
		}
		total += moved
		if !found {
			// Every shard was looked at from i on: none is due.
			return total
		}
	}
}

// archivedIDs returns the ids of the posts the archive holds, by seq.
func archivedIDs(tb testing.TB, store *archive.Store) []string {
	tb.Helper()
	posts, err := store.LatestPosts(context.Background(), 0, 1_000_000)
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]string, len(posts))
	for i, p := range posts {
		out[len(posts)-1-i] = p.ID
	}
	return out
}

// redisPostIDs returns the ids in an author's posts set, oldest first, and
// fails tb if a post hash is missing for one of them.
func redisPostIDs(tb testing.TB, db *DB, authorID string) []string {
	tb.Helper()
	ctx := context.Background()
	ids := db.client.ZRange(ctx, postsKey(authorID), 0, -1).Val()
	for _, id := range ids {
		_, seq, _ := splitPostID(id)
		if db.client.Exists(ctx, postKey(authorID, seq)).Val() != 1 {
			tb.Fatalf("post %s is in its author's posts set without its hash", id)
		}
	}
	return ids
}

func postsCount(tb testing.TB, db *DB, userID string) int {
	tb.Helper()
	return mustCounts(tb, db, userID).Posts
}

func mustPost(tb testing.TB, db *DB, authorID, body string) *warble.Post {
	tb.Helper()
	p, err := NewPostService(db).CreatePost(context.Background(), authorID, body)
	if err != nil {
		tb.Fatalf("CreatePost: %v", err)
	}
	return p
}

func TestMoverKeepsTheNewestPostsInRedis(t *testing.T) {
	var moved atomic.Int64
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 5, MoveBatch: 3, Moved: func(n int) { moved.Add(int64(n)) }})
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	var posts []*warble.Post
	for i := range 12 {
		posts = append(posts, mustPost(t, db, ada.ID, "post "+strconv.Itoa(i)))
	}
	mustPost(t, db, bob.ID, "bob's only post")

	if n := drainMoves(t, db); n != 7 {
		t.Fatalf("the mover moved %d posts, want 7", n)
	}
	if moved.Load() != 7 {
		t.Errorf("Options.Moved was told of %d posts, want 7", moved.Load())
	}
	if got, want := redisPostIDs(t, db, ada.ID), idsOf(posts[7:]); !slices.Equal(got, want) {
		t.Errorf("ada's posts in Redis = %v, want the newest five %v", got, want)
	}
	if got, want := archivedIDs(t, store), idsOf(posts[:7]); !slices.Equal(got, want) {
		t.Errorf("archive holds %v, want ada's oldest seven %v", got, want)
	}
	archived, err := store.PostsByIDs(context.Background(), idsOf(posts[:7]))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range posts[:7] {
		a := archived[p.ID]
		if a == nil || a.Body != p.Body || !a.CreatedAt.Equal(p.CreatedAt) || a.Seq != p.Seq || a.AuthorID != ada.ID {
			t.Errorf("archived %s = %+v, want %+v", p.ID, a, p)
		}
	}
	if n := postsCount(t, db, ada.ID); n != 12 {
		t.Errorf("ada's postsCount = %d after the move, want 12", n)
	}
	if n := redisPostIDs(t, db, bob.ID); len(n) != 1 {
		t.Errorf("bob's posts in Redis = %v, want his one post", n)
	}
	// Nothing is left due, locked or noted.
	ctx := context.Background()
	if n := db.client.ZCard(ctx, archiveDueKey(db.fanOutShard(ada.ID))).Val(); n != 0 {
		t.Errorf("due index holds %d authors after the moves, want 0", n)
	}
	if n := db.client.Exists(ctx, movingKey(ada.ID), archiveGoneKey(ada.ID)).Val(); n != 0 {
		t.Errorf("%d of ada's moving lock and gone set are left", n)
	}
	// Another post makes ada due again, and one more post moves.
	mustPost(t, db, ada.ID, "one more")
	if n := drainMoves(t, db); n != 1 {
		t.Errorf("after one more post the mover moved %d, want 1", n)
	}
	if n := postsCount(t, db, ada.ID); n != 13 {
		t.Errorf("ada's postsCount = %d, want 13", n)
	}
}

func idsOf(posts []*warble.Post) []string {
	out := make([]string, len(posts))
	for i, p := range posts {
		out[i] = p.ID
	}
	return out
}

func TestMoverMovesPostsPastTheirAge(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	db, store := newArchiveTestDB(t, Options{PostsInRedisFor: time.Hour, Now: clock})
	ada := mustSignup(t, db, "ada")
	first := mustPost(t, db, ada.ID, "first")
	advance(30 * time.Minute)
	second := mustPost(t, db, ada.ID, "second")

	if n := drainMoves(t, db); n != 0 {
		t.Fatalf("the mover moved %d posts younger than an hour", n)
	}
	advance(40 * time.Minute) // first is 70 minutes old, second 40
	if n := drainMoves(t, db); n != 1 {
		t.Fatalf("the mover moved %d posts, want the one past an hour", n)
	}
	if got := archivedIDs(t, store); !slices.Equal(got, []string{first.ID}) {
		t.Fatalf("archive holds %v, want %s", got, first.ID)
	}
	// ada is due again when her second post comes of age.
	due := db.client.ZScore(context.Background(), archiveDueKey(db.fanOutShard(ada.ID)), ada.ID).Val()
	if want := second.CreatedAt.Add(time.Hour).UnixMilli(); int64(due) != want {
		t.Errorf("ada is due at %d, want %d (her second post's time plus an hour)", int64(due), want)
	}
	advance(30 * time.Minute)
	if n := drainMoves(t, db); n != 1 {
		t.Fatalf("the mover moved %d posts, want the second one", n)
	}
	if n := postsCount(t, db, ada.ID); n != 2 {
		t.Errorf("postsCount = %d, want 2", n)
	}
	if n := db.client.ZCard(context.Background(), archiveDueKey(db.fanOutShard(ada.ID))).Val(); n != 0 {
		t.Errorf("due index holds %d authors with nothing left in Redis, want 0", n)
	}
}

// A delete at any step of a move leaves the post nowhere: not in Redis,
// not in the archive; and postsCount counts it out once.
func TestDeleteDuringAMove(t *testing.T) {
	for _, stage := range []string{"read", "saved", "moved"} {
		t.Run(stage, func(t *testing.T) {
			db, store := newArchiveTestDB(t, Options{PostsInRedis: 2, MoveBatch: 10})
			ctx := context.Background()
			ada := mustSignup(t, db, "ada")
			var posts []*warble.Post
			for i := range 6 {
				posts = append(posts, mustPost(t, db, ada.ID, "post "+strconv.Itoa(i)))
			}
			victim := posts[1] // one of the four the move takes
			var deleteErr error
			deleted := false
			db.moveHook = func(s string) {
				if s == stage && !deleted {
					deleted = true
					deleteErr = NewPostService(db).DeletePost(ctx, ada.ID, victim.ID)
				}
			}
			drainMoves(t, db)
			db.moveHook = nil
			if !deleted || deleteErr != nil {
				t.Fatalf("delete at %q: ran %v, error %v", stage, deleted, deleteErr)
			}
			if slices.Contains(redisPostIDs(t, db, ada.ID), victim.ID) {
				t.Error("the deleted post is still in Redis")
			}
			if slices.Contains(archivedIDs(t, store), victim.ID) {
				t.Error("the deleted post is in the archive")
			}
			inRedis, inArchive := redisPostIDs(t, db, ada.ID), archivedIDs(t, store)
			if len(inRedis)+len(inArchive) != 5 {
				t.Errorf("Redis holds %v and the archive %v, want the 5 posts left once each", inRedis, inArchive)
			}
			if n := postsCount(t, db, ada.ID); n != 5 {
				t.Errorf("postsCount = %d, want 5", n)
			}
			if n := db.client.Exists(ctx, movingKey(ada.ID), archiveGoneKey(ada.ID)).Val(); n != 0 {
				t.Errorf("%d of ada's moving lock and gone set are left", n)
			}
			if err := NewPostService(db).DeletePost(ctx, ada.ID, victim.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
				t.Errorf("deleting it again: %v, want ENOTFOUND", err)
			}
		})
	}
}

func TestDeleteArchivedPost(t *testing.T) {
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 1})
	ctx := context.Background()
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	mustFollow(t, db, bob.ID, ada.ID)
	old := mustPost(t, db, ada.ID, "old")
	mustPost(t, db, ada.ID, "new")
	drainMoves(t, db)
	if got := archivedIDs(t, store); !slices.Equal(got, []string{old.ID}) {
		t.Fatalf("archive holds %v, want %s", got, old.ID)
	}
	posts := NewPostService(db)
	if err := posts.DeletePost(ctx, bob.ID, old.ID); warble.ErrorCode(err) != warble.EFORBIDDEN {
		t.Fatalf("bob deleting ada's archived post: %v, want EFORBIDDEN", err)
	}
	if err := posts.DeletePost(ctx, ada.ID, old.ID); err != nil {
		t.Fatalf("DeletePost of an archived post: %v", err)
	}
	if got := archivedIDs(t, store); len(got) != 0 {
		t.Errorf("archive holds %v after the delete, want nothing", got)
	}
	for _, key := range []string{homeKey(ada.ID), homeKey(bob.ID), globalKey} {
		if _, err := db.client.ZScore(ctx, key, old.ID).Result(); err == nil {
			t.Errorf("%s still holds the deleted post", key)
		}
	}
	if n := postsCount(t, db, ada.ID); n != 1 {
		t.Errorf("postsCount = %d, want 1", n)
	}
	if err := posts.DeletePost(ctx, ada.ID, old.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Errorf("deleting it again: %v, want ENOTFOUND", err)
	}
	if err := posts.DeletePost(ctx, bob.ID, old.ID); warble.ErrorCode(err) != warble.ENOTFOUND {
		t.Errorf("bob deleting the deleted post: %v, want ENOTFOUND", err)
	}
}

// A delete of an archived post that died after its Redis step and before
// the row went: a retry counts it out once, and if nobody retries, the
// mover deletes the row.
func TestDeleteArchivedPostCutShort(t *testing.T) {
	for _, retry := range []bool{true, false} {
		t.Run(fmt.Sprintf("retry=%v", retry), func(t *testing.T) {
			db, store := newArchiveTestDB(t, Options{PostsInRedis: 1})
			ctx := context.Background()
			ada := mustSignup(t, db, "ada")
			old := mustPost(t, db, ada.ID, "old")
			mustPost(t, db, ada.ID, "new")
			drainMoves(t, db)
			// The first half of deleteArchived, as a process that died
			// after it would leave it.
			if err := db.markDue(ctx, db.client, ada.ID, db.now().UnixMilli()).Err(); err != nil {
				t.Fatal(err)
			}
			err := db.pub(deleteArchivedScript).Run(ctx, db.client,
				[]string{userKey(ada.ID), archiveGoneKey(ada.ID), homeKey(ada.ID), outboxKey(ada.ID)},
				old.ID, userChannel(ada.ID), homeChannel(ada.ID), encodeRemoved(old.Seq, old.ID), "", msString(db.now()), postsGoneChannel).Err()
			if err != nil {
				t.Fatal(err)
			}
			if retry {
				if err := NewPostService(db).DeletePost(ctx, ada.ID, old.ID); err != nil {
					t.Fatalf("retried DeletePost: %v", err)
				}
			} else {
				drainMoves(t, db)
			}
			if got := archivedIDs(t, store); len(got) != 0 {
				t.Errorf("archive holds %v, want nothing", got)
			}
			if n := postsCount(t, db, ada.ID); n != 1 {
				t.Errorf("postsCount = %d, want 1", n)
			}
			if n := db.client.Exists(ctx, archiveGoneKey(ada.ID)).Val(); n != 0 {
				t.Error("the gone set is left")
			}
		})
	}
}

// A mover that died between writing its rows and taking the posts out of
// Redis left both; the next move of the author ends with each post once,
// and a delete in between takes the row too.
func TestMoveAfterAMoverDied(t *testing.T) {
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 1, MoveBatch: 10})
	ctx := context.Background()
	ada := mustSignup(t, db, "ada")
	var posts []*warble.Post
	for i := range 4 {
		posts = append(posts, mustPost(t, db, ada.ID, "post "+strconv.Itoa(i)))
	}
	dieAfterSaving(db)
	if got := archivedIDs(t, store); len(got) != 3 {
		t.Fatalf("archive holds %v after the dead move, want its 3 rows", got)
	}
	// Its post 0 is deleted now, while it is in both.
	if err := NewPostService(db).DeletePost(ctx, ada.ID, posts[0].ID); err != nil {
		t.Fatal(err)
	}
	// The lock's and the claim's leases run out.
	db.client.Del(ctx, movingKey(ada.ID))
	db.client.ZAdd(ctx, archiveDueKey(db.fanOutShard(ada.ID)), redis.Z{Score: float64(db.now().UnixMilli()), Member: ada.ID})
	drainMoves(t, db)
	if got, want := archivedIDs(t, store), idsOf(posts[1:3]); !slices.Equal(got, want) {
		t.Errorf("archive holds %v, want %v", got, want)
	}
	if got, want := redisPostIDs(t, db, ada.ID), idsOf(posts[3:]); !slices.Equal(got, want) {
		t.Errorf("Redis holds %v, want %v", got, want)
	}
	if n := postsCount(t, db, ada.ID); n != 3 {
		t.Errorf("postsCount = %d, want 3", n)
	}
}

// Two movers on one author at once: the second waits for the first's lock,
// and every post ends in one place.
func TestMoversTakeTurnsOnAnAuthor(t *testing.T) {
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 10, MoveBatch: 7})
	ada := mustSignup(t, db, "ada")
	for i := range 100 {
		mustPost(t, db, ada.ID, "post "+strconv.Itoa(i))
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				_, _, lockErr := db.moveAuthor(context.Background(), ada.ID)
				if lockErr != nil {
					t.Error(lockErr)
					return
				}
			}
		})
	}
	wg.Wait()
	inRedis, inArchive := redisPostIDs(t, db, ada.ID), archivedIDs(t, store)
	if len(inRedis) != 10 || len(inArchive) != 90 {
		t.Errorf("Redis holds %d posts and the archive %d, want 10 and 90", len(inRedis), len(inArchive))
	}
	if n := postsCount(t, db, ada.ID); n != 100 {
		t.Errorf("postsCount = %d, want 100", n)
	}
}

// Authors with posts from before the archive are found by the first mover.
func TestMoverBackfillsTheDueIndex(t *testing.T) {
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 2})
	ada := mustSignup(t, db, "ada")
	plain := NewDB(db.client, Options{}) // a Warble without an archive
	for i := range 5 {
		mustPost(t, plain, ada.ID, "old "+strconv.Itoa(i))
	}
	if n := drainMoves(t, db); n != 0 {
		t.Fatalf("moved %d posts before the backfill", n)
	}
	w := NewWorker(db, WorkerOptions{Move: true})
	if _, err := w.maybeMove(context.Background()); err != nil {
		t.Fatal(err)
	}
	drainMoves(t, db)
	if got := archivedIDs(t, store); len(got) != 3 {
		t.Errorf("archive holds %v after the backfill, want ada's 3 oldest", got)
	}
}

// A mover that died after writing its rows, and then deletes that leave
// some of the posts it wrote among the newest, kept in Redis: the next
// mover deletes the rows of those, so that each post is in one place.
func TestMoverDiedThenDeletesKeptItsPosts(t *testing.T) {
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 3, MoveBatch: 10})
	ctx := context.Background()
	ada := mustSignup(t, db, "ada")
	var posts []*warble.Post
	for i := range 8 {
		posts = append(posts, mustPost(t, db, ada.ID, "post "+strconv.Itoa(i)))
	}
	dieAfterSaving(db)
	if got := archivedIDs(t, store); len(got) != 5 {
		t.Fatalf("archive holds %v after the dead move, want its 5 rows", got)
	}
	// The lock's lease runs out; then posts 5 and 6, which it did not
	// write, are deleted: of the five it wrote, 3 and 4 are now among the
	// newest three, with 7, and stay in Redis.
	db.client.Del(ctx, movingKey(ada.ID))
	for _, p := range posts[5:7] {
		if err := NewPostService(db).DeletePost(ctx, ada.ID, p.ID); err != nil {
			t.Fatal(err)
		}
	}
	db.client.ZAdd(ctx, archiveDueKey(db.fanOutShard(ada.ID)), redis.Z{Score: float64(db.now().UnixMilli()), Member: ada.ID})
	drainMoves(t, db)
	inRedis, inArchive := redisPostIDs(t, db, ada.ID), archivedIDs(t, store)
	if want := []string{posts[3].ID, posts[4].ID, posts[7].ID}; !slices.Equal(inRedis, want) {
		t.Errorf("Redis holds %v, want %v", inRedis, want)
	}
	if want := idsOf(posts[:3]); !slices.Equal(inArchive, want) {
		t.Errorf("archive holds %v, want %v", inArchive, want)
	}
	if n := postsCount(t, db, ada.ID); n != 6 {
		t.Errorf("postsCount = %d, want 6", n)
	}
	if v := db.client.HExists(ctx, userKey(ada.ID), "movingUpTo").Val(); v {
		t.Error("movingUpTo is left after a move that ended")
	}
}

// A mover that died after writing its rows, then a delete of one of them,
// after the mover's lock ran out, by a process that died after its Redis
// step: the next mover deletes the row.
func TestMoverDiedThenADeleteDied(t *testing.T) {
	db, store := newArchiveTestDB(t, Options{PostsInRedis: 1, MoveBatch: 10})
	ctx := context.Background()
	ada := mustSignup(t, db, "ada")
	var posts []*warble.Post
	for i := range 3 {
		posts = append(posts, mustPost(t, db, ada.ID, "post "+strconv.Itoa(i)))
	}
	dieAfterSaving(db)
	db.client.Del(ctx, movingKey(ada.ID))
	victim := posts[0]
	_, seq, _ := splitPostID(victim.ID)
	n, err := db.pub(deletePostScript).Run(ctx, db.client,
		[]string{postKey(ada.ID, seq), postsKey(ada.ID), homeKey(ada.ID), outboxKey(ada.ID),
			movingKey(ada.ID), archiveGoneKey(ada.ID), userKey(ada.ID)},
		victim.ID, userChannel(ada.ID), homeChannel(ada.ID), encodeRemoved(victim.Seq, victim.ID), "", msString(db.now()), postsGoneChannel).Int64()
	if err != nil || n != 2 {
		t.Fatalf("deletePostScript = %d, %v; want 2 (deleted, and noted for the movers)", n, err)
	}
	db.client.ZAdd(ctx, archiveDueKey(db.fanOutShard(ada.ID)), redis.Z{Score: float64(db.now().UnixMilli()), Member: ada.ID})
	drainMoves(t, db)
	if got, want := archivedIDs(t, store), []string{posts[1].ID}; !slices.Equal(got, want) {
		t.Errorf("archive holds %v, want %v", got, want)
	}
	if n := postsCount(t, db, ada.ID); n != 2 {
		t.Errorf("postsCount = %d, want 2", n)
	}
	if n := db.client.Exists(ctx, archiveGoneKey(ada.ID)).Val(); n != 0 {
		t.Error("the gone set is left")
	}
}

// dieAfterSaving runs a move that stops dead after it wrote its rows, as
// a mover killed there would: the hook panics out of the move.
func dieAfterSaving(db *DB) {
	db.moveHook = func(s string) {
		if s == "saved" {
			panic("killed")
		}
	}
	defer func() { db.moveHook = nil }()
	defer func() { recover() }()
	db.moveDue(context.Background(), 0)
}
