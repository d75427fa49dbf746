package redisdb

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warble/warble/internal/archive"
	"github.com/warble/warble/internal/mysqltest"
	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// moverProcessEnv names the environment variable that makes this test
// binary a mover process (see TestMoverProcess).
const moverProcessEnv = "WARBLE_TEST_MOVER"

// Settings of the mover processes and of the test that kills them.
const (
	crashPostsInRedis = 10
	crashMoveBatch    = 40
	crashMoveLease    = time.Second
)

// TestMoverProcess is not a test: it is the mover process of
// TestMoverSurvivesKills, run as this test binary with moverProcessEnv
// set. It moves the posts of the Redis at REDIS_URL to the archive at
// ARCHIVE_URL until it is killed, and prints each step of each batch on
// stdout as it reaches it ("stage saved": the rows are committed, the
// posts not yet out of Redis), pausing a little there so that a kill sent
// then lands before the next step.
func TestMoverProcess(t *testing.T) {
	if os.Getenv(moverProcessEnv) != "1" {
		t.Skip("the mover process of TestMoverSurvivesKills")
	}
	client, err := redistest.ClientForURL(os.Getenv("REDIS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := archive.Open(context.Background(), os.Getenv("ARCHIVE_URL"), nil)
	if err != nil {
		t.Fatal(err)
	}
	db := NewDB(client, Options{AsyncFanOut: true, Archive: store,
		PostsInRedis: crashPostsInRedis, MoveBatch: crashMoveBatch, MoveLease: crashMoveLease})
	var mu sync.Mutex
	db.moveHook = func(stage string) {
		mu.Lock()
		fmt.Printf("stage %s\n", stage)
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	NewWorker(db, WorkerOptions{Move: true, IdleLook: 50 * time.Millisecond}).Run(context.Background())
}

// TestMoverSurvivesKills moves 4,500 posts of 50 authors to MariaDB in
// mover processes (this test binary, as TestMoverProcess) while the test
// deletes some of them, SIGKILLs a mover between a batch's commit and its
// removal from Redis, another between its read and its write, and another
// at a moment of no choosing, and lets a last mover finish. Then every
// post is exactly once in Redis or in the archive, as written, every
// deleted post is in neither, and postsCount is exact.
func TestMoverSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 4,500 posts in other processes")
	}
	srv := redistest.New(t)
	if srv.Embedded() {
		t.Skip("needs a redis-server that other processes can reach")
	}
	d := mysqltest.New(t)
	store, err := archive.Open(context.Background(), d.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	db := NewDB(srv.Client(t), Options{AsyncFanOut: true, Archive: store,
		PostsInRedis: crashPostsInRedis, MoveBatch: crashMoveBatch, MoveLease: crashMoveLease})

	const authors, perAuthor = 50, 100
	ids := make([]string, authors)
	for i := range authors {
		ids[i] = mustSignup(t, db, "author"+strconv.Itoa(i)).ID
	}
	posts := make(map[string]*warble.Post) // by id, those not deleted
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range authors {
		wg.Go(func() {
			for j := range perAuthor {
				p, err := NewPostService(db).CreatePost(ctx, ids[i], fmt.Sprintf("post %d of %d", j, i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				posts[p.ID] = p
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The posts wait in Redis for their fan-out jobs (see
	// TestMoverWaitsForFanOut); those run here first, so that the moves
	// the kills cut short are of posts that may move.
	drainFanOut(t, db)

	// startMover starts a mover process and returns the lines it prints;
	// killAt kills one once it has printed a stage for the nth time.
	startMover := func(name string) (*exec.Cmd, <-chan string) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMoverProcess$")
		cmd.Env = append(os.Environ(), moverProcessEnv+"=1", "REDIS_URL="+srv.URL, "ARCHIVE_URL="+d.URL)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		lines := make(chan string, 1000)
		go func() {
			defer close(lines)
			r := bufio.NewScanner(out)
			for r.Scan() {
				select {
				case lines <- r.Text():
				default: // nobody listens any more
				}
			}
			io.Copy(io.Discard, out)
		}()
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			if t.Failed() && stderr.Len() > 0 {
				t.Logf("%s said:\n%s", name, stderr.String())
			}
		})
		return cmd, lines
	}
	killAt := func(name, stage string, n int) {
		cmd, lines := startMover(name)
		seen := 0
		timeout := time.After(30 * time.Second)
		for seen < n {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("%s exited before it reached %q %d times", name, stage, n)
				}
				if line == "stage "+stage {
					seen++
				}
			case <-timeout:
				t.Fatalf("%s did not reach %q %d times", name, stage, n)
			}
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
	}
	// inBoth counts the posts that are both in Redis and in the archive.
	inBoth := func() int {
		archived := map[string]bool{}
		for _, id := range archivedIDs(t, store) {
			archived[id] = true
		}
		n := 0
		for _, a := range ids {
			for _, id := range db.client.ZRange(ctx, postsKey(a), 0, -1).Val() {
				if archived[id] {
					n++
				}
			}
		}
		return n
	}

	// Deletes all through, of every seventh post.
	stopDeletes := make(chan struct{})
	var deleted []string
	var deletes sync.WaitGroup
	deletes.Go(func() {
		mu.Lock()
		var victims []string
		for id, p := range posts {
			if p.Seq%7 == 0 {
				victims = append(victims, id)
			}
		}
		mu.Unlock()
		for _, id := range victims {
			select {
			case <-stopDeletes:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if err := NewPostService(db).DeletePost(ctx, warble.PostAuthorID(id), id); err != nil {
				t.Errorf("DeletePost(%s): %v", id, err)
				return
			}
			mu.Lock()
			delete(posts, id)
			deleted = append(deleted, id)
			mu.Unlock()
		}
	})

	killAt("first mover", "saved", 3)
	if n := inBoth(); n == 0 {
		t.Error("the first mover was killed after a commit, yet no post is both in Redis and in the archive")
	} else {
		t.Logf("killed the first mover between a commit and its removal from Redis: %d posts in both", n)
	}
	killAt("second mover", "read", 4)
	cmd, _ := startMover("third mover")
	time.Sleep(300 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	t.Logf("killed three movers; %d rows archived so far", len(archivedIDs(t, store)))

	startMover("last mover")
	deadline := time.Now().Add(60 * time.Second)
	for {
		done := true
		for s := range max(1, db.opts.FanOutShards) {
			if db.client.ZCard(ctx, archiveDueKey(s)).Val() != 0 {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the last mover did not finish")
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stopDeletes)
	deletes.Wait()
	// Deletes that came after the due index emptied made no move.
	t.Logf("deleted %d posts during the moves", len(deleted))

	archived := map[string]bool{}
	for _, id := range archivedIDs(t, store) {
		if archived[id] {
			t.Errorf("the archive holds %s twice", id)
		}
		archived[id] = true
	}
	rows, err := store.PostsByIDs(ctx, archivedIDs(t, store))
	if err != nil {
		t.Fatal(err)
	}
	perAuthorLeft := map[string]int{}
	for id, p := range posts {
		perAuthorLeft[p.AuthorID]++
		inRedis := db.client.ZScore(ctx, postsKey(p.AuthorID), id).Err() == nil
		if inRedis == archived[id] {
			t.Errorf("post %s: in Redis %v, in the archive %v; want exactly one", id, inRedis, archived[id])
			continue
		}
		if archived[id] {
			if r := rows[id]; r.Body != p.Body || !r.CreatedAt.Equal(p.CreatedAt) {
				t.Errorf("archived %s = %+v, want %+v", id, r, p)
			}
		}
	}
	for _, id := range deleted {
		inRedis := db.client.ZScore(ctx, postsKey(warble.PostAuthorID(id)), id).Err() == nil
		if inRedis || archived[id] {
			t.Errorf("deleted post %s: in Redis %v, in the archive %v", id, inRedis, archived[id])
		}
	}
	if len(archived) != len(posts)-len(redisAll(t, db, ids)) {
		t.Errorf("the archive holds %d rows, want %d", len(archived), len(posts)-len(redisAll(t, db, ids)))
	}
	for _, a := range ids {
		if n := postsCount(t, db, a); n != perAuthorLeft[a] {
			t.Errorf("author %s: postsCount %d, want %d", a, n, perAuthorLeft[a])
		}
		if n := len(redisPostIDs(t, db, a)); n > crashPostsInRedis {
			t.Errorf("author %s keeps %d posts in Redis, want at most %d", a, n, crashPostsInRedis)
		}
	}
}

// redisAll returns the ids of every post in the authors' posts sets.
func redisAll(tb testing.TB, db *DB, authors []string) []string {
	tb.Helper()
	var out []string
	for _, a := range authors {
		out = append(out, redisPostIDs(tb, db, a)...)
	}
	return out
}
