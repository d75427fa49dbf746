package app

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/warble/warble/internal/archive"
	"github.com/warble/warble/internal/mysqltest"
	"github.com/warble/warble/internal/redistest"
)

// archiveTestEnv, set to 1, runs every end-to-end test with an archive on
// a private MariaDB and archiveTestPostsInRedis posts per author in Redis,
// so that the suites prove that nothing a client sees changes when posts
// move (CI runs internal/app once so).
const archiveTestEnv = "WARBLE_TEST_ARCHIVE"

// archiveTestPostsInRedis is POSTS_IN_REDIS under archiveTestEnv: small,
// so that the tests' few posts per author move.
const archiveTestPostsInRedis = 2

// archiveEverywhere reports whether archiveTestEnv is set.
func archiveEverywhere() bool { return os.Getenv(archiveTestEnv) == "1" }

// withArchive is a change for newTestServer: an archive on a fresh MariaDB
// database, with postsInRedis posts per author kept in Redis. It returns
// the store too, for tests that look inside.
func withArchive(t testing.TB, postsInRedis int) (func(*Config), *archive.Store) {
	t.Helper()
	d := mysqltest.New(t)
	store, err := archive.Open(context.Background(), d.URL, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return func(c *Config) {
		c.Archive, c.PostsInRedis = store, postsInRedis
	}, store
}

// waitArchived waits until the archive holds n posts.
func waitArchived(t testing.TB, store *archive.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got int
		if err := store.DB().QueryRow("SELECT COUNT(*) FROM posts").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the archive holds %d posts after 20s, want %d", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The server's own workers move posts past POSTS_IN_REDIS to the archive;
// postsCount and deletePost work the same before and after, and /metrics
// counts the moves.
func TestArchiveThroughTheAPI(t *testing.T) {
	change, store := withArchive(t, 2)
	s := newTestServer(t, change)
	ada := s.signup(t, "ada")
	var ids []string
	for i := range 5 {
		ids = append(ids, s.post(t, ada, "post "+strconv.Itoa(i)))
	}
	waitArchived(t, store, 3)

	count := func() int {
		var out struct{ User struct{ PostsCount int } }
		s.mustQuery(t, "", `query($u: String!) { user(username: $u) { postsCount } }`, map[string]any{"u": ada.Username}, &out)
		return out.User.PostsCount
	}
	if n := count(); n != 5 {
		t.Fatalf("postsCount = %d with 3 of 5 posts archived, want 5", n)
	}
	// The oldest post is archived; its author deletes it.
	res := s.query(t, ada.Token, `mutation($id: ID!) { deletePost(input: {postId: $id}) { postId } }`, map[string]any{"id": ids[0]})
	if len(res.Errors) > 0 {
		t.Fatalf("deletePost of an archived post: %+v", res.Errors)
	}
	waitArchived(t, store, 2)
	if n := count(); n != 4 {
		t.Errorf("postsCount = %d after deleting an archived post, want 4", n)
	}
	res = s.query(t, ada.Token, `mutation($id: ID!) { deletePost(input: {postId: $id}) { postId } }`, map[string]any{"id": ids[0]})
	if res.code() != "NOT_FOUND" {
		t.Errorf("deleting it again: %+v, want NOT_FOUND", res.Errors)
	}
	bob := s.signup(t, "bob")
	res = s.query(t, bob.Token, `mutation($id: ID!) { deletePost(input: {postId: $id}) { postId } }`, map[string]any{"id": ids[1]})
	if res.code() != "FORBIDDEN" {
		t.Errorf("bob deleting ada's archived post: %+v, want FORBIDDEN", res.Errors)
	}

	m := s.scrape(t)
	if m["warble_archive_moved_posts_total"] != 3 {
		t.Errorf("warble_archive_moved_posts_total = %v, want 3", m["warble_archive_moved_posts_total"])
	}
	if _, ok := m["warble_archive_lag_seconds"]; !ok {
		t.Error("/metrics has no warble_archive_lag_seconds")
	}
}

// `warble worker` takes ARCHIVE_URL and POSTS_IN_REDIS as the server does
// and moves the posts of a server that runs no workers.
func TestWarbleWorkerMovesPosts(t *testing.T) {
	rs := redistest.New(t)
	if rs.Embedded() {
		t.Skip("warble worker needs a redis-server it can reach")
	}
	d := mysqltest.New(t)
	s := startTestServer(t, rs, testConfig(t, func(c *Config) { c.FanoutWorkers = 0 }), nil)
	ada := s.signup(t, "ada")
	for i := range 4 {
		s.post(t, ada, "post "+strconv.Itoa(i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := map[string]string{"REDIS_URL": rs.URL, "ARCHIVE_URL": d.URL, "POSTS_IN_REDIS": "1", "FANOUT_WORKERS": "1", "LOG_LEVEL": "warn"}
	go func() { done <- RunWorkers(ctx, nil, func(k string) string { return env[k] }, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunWorkers: %v", err)
		}
	}()
	store, err := archive.Open(context.Background(), d.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	waitArchived(t, store, 3)
}
