package archive

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warble/warble/internal/mysqltest"
	"github.com/warble/warble/internal/warble"
)

func TestMain(m *testing.M) { mysqltest.Main(m) }

// newStore opens the archive on a fresh database, closed when t ends.
func newStore(t *testing.T) (*Store, *mysqltest.Database) {
	t.Helper()
	d := mysqltest.New(t)
	s, err := Open(context.Background(), d.URL, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, d
}

func post(author, seq int64, body string) *warble.Post {
	a, s := strconv.FormatInt(author, 10), strconv.FormatInt(seq, 10)
	return &warble.Post{ID: a + ":" + s, AuthorID: a, Seq: seq, Body: body,
		CreatedAt: time.UnixMilli(1_700_000_000_000 + seq).UTC()}
}

func ids(posts []*warble.Post) []string {
	out := make([]string, len(posts))
	for i, p := range posts {
		out[i] = p.ID
	}
	return out
}

func countRows(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.DB().QueryRow("SELECT COUNT(*) FROM posts").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestParseURL(t *testing.T) {
	tests := []struct {
		name     string
		url      string
		wantNet  string
		wantAddr string
		wantUser string
		wantPass string
		wantDB   string
		wantPool int
		wantErr  string
	}{
		{name: "HostPort", url: "mysql://warble:s3cret@db.example:3307/warble", wantNet: "tcp", wantAddr: "db.example:3307",
			wantUser: "warble", wantPass: "s3cret", wantDB: "warble", wantPool: DefaultMaxConns},
		{name: "DefaultPort", url: "mysql://warble@db.example/warble", wantNet: "tcp", wantAddr: "db.example:3306", wantUser: "warble", wantDB: "warble", wantPool: DefaultMaxConns},
		{name: "EncodedPassword", url: "mysql://warble:p%40ss%2Fw@[::1]:3306/warble", wantNet: "tcp", wantAddr: "[::1]:3306", wantUser: "warble", wantPass: "p@ss/w", wantDB: "warble", wantPool: DefaultMaxConns},
		{name: "Socket", url: "mysql://root@/warble?socket=/run/mysqld/mysqld.sock&maxConns=4", wantNet: "unix", wantAddr: "/run/mysqld/mysqld.sock", wantUser: "root", wantDB: "warble", wantPool: 4},
		{name: "Options", url: "mysql://u:p@h/d?tls=skip-verify&timeout=2s&readTimeout=30s&writeTimeout=30s", wantNet: "tcp", wantAddr: "h:3306", wantUser: "u", wantPass: "p", wantDB: "d", wantPool: DefaultMaxConns},
		{name: "WrongScheme", url: "postgres://u:p@h/d", wantErr: "scheme"},
		{name: "NoDatabase", url: "mysql://u:p@h:3306/", wantErr: "names no database"},
		{name: "NoHost", url: "mysql://u:p@/d", wantErr: "names no host"},
		{name: "HostAndSocket", url: "mysql://u:p@h/d?socket=/s", wantErr: "both a host"},
		{name: "UnknownOption", url: "mysql://u:p@h/d?parseTime=true", wantErr: `unknown option "parseTime"`},
		{name: "BadTLS", url: "mysql://u:p@h/d?tls=maybe", wantErr: "tls="},
		{name: "BadTimeout", url: "mysql://u:p@h/d?timeout=5", wantErr: "timeout="},
		{name: "BadPool", url: "mysql://u:p@h/d?maxConns=0", wantErr: "maxConns="},
		{name: "NotAURLHidesPassword", url: "mysql://u:s3cret@h:99999999999/d%", wantErr: "not a URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, pool, err := ParseURL(tt.url)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseURL(%q) error = %v, want one saying %q", tt.url, err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("ParseURL error %q shows the password", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseURL(%q): %v", tt.url, err)
			}
			got := fmt.Sprintf("%s %s %s %s %s %d", cfg.Net, cfg.Addr, cfg.User, cfg.Passwd, cfg.DBName, pool)
			want := fmt.Sprintf("%s %s %s %s %s %d", tt.wantNet, tt.wantAddr, tt.wantUser, tt.wantPass, tt.wantDB, tt.wantPool)
			if got != want {
				t.Fatalf("ParseURL(%q) = %s, want %s", tt.url, got, want)
			}
		})
	}
}

// Instances started together migrate one after the other: every Open
// succeeds, and each migration is recorded once.
func TestOpenConcurrently(t *testing.T) {
	d := mysqltest.New(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			s, err := Open(context.Background(), d.URL, nil)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open #%d: %v", i, err)
		}
	}
	entries, err := migrations.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	db := d.Open(t)
	var applied, distinct int
	if err := db.QueryRow("SELECT COUNT(*), COUNT(DISTINCT version_id) FROM warble_schema_version WHERE version_id > 0").Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if applied != len(entries) || distinct != len(entries) {
		t.Fatalf("version table records %d applications of %d migrations, want %d of %d", applied, distinct, len(entries), len(entries))
	}
	// And the schema is usable.
	s, err := Open(context.Background(), d.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SavePosts(context.Background(), []*warble.Post{post(1, 1, "hi")}); err != nil {
		t.Fatal(err)
	}
}

func TestOpenUnreachableSaysWhere(t *testing.T) {
	_, err := Open(context.Background(), "mysql://warble:s3cret@/warble?socket=/nonexistent/mysqld.sock&timeout=1s", nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/mysqld.sock") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open of a missing socket: %v, want an error naming the socket and not the password", err)
	}
}

func TestSavePostsTwiceLeavesOneRowEach(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	var posts []*warble.Post
	for seq := int64(1); seq <= 2500; seq++ { // three statements in one transaction
		posts = append(posts, post(seq%7+1, seq, "post "+strconv.FormatInt(seq, 10)))
	}
	for range 2 {
		if err := s.SavePosts(ctx, posts); err != nil {
			t.Fatal(err)
		}
	}
	if n := countRows(t, s); n != len(posts) {
		t.Fatalf("%d rows after saving %d posts twice, want %d", n, len(posts), len(posts))
	}
	got, err := s.PostsByIDs(ctx, ids(posts))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range posts {
		g := got[p.ID]
		if g == nil || *g != *p {
			t.Fatalf("PostsByIDs[%s] = %+v, want %+v", p.ID, g, p)
		}
	}
}

func TestSavePostsKeepsBodiesExact(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	bodies := []string{
		strings.Repeat("🐦", warble.MaxPostLen), // 280 code points of 4 bytes
		"quotes ' \" and \\ backslash; DROP TABLE posts; --",
		"tab\tand\nnewline",
		"Ünïcödé and 日本語 and e\u0301",
	}
	var posts []*warble.Post
	for i, b := range bodies {
		posts = append(posts, post(3, int64(i+1), b))
	}
	if err := s.SavePosts(ctx, posts); err != nil {
		t.Fatal(err)
	}
	got, err := s.PostsByIDs(ctx, ids(posts))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range posts {
		if got[p.ID] == nil || got[p.ID].Body != p.Body {
			t.Fatalf("body of %s came back as %+v, want %q", p.ID, got[p.ID], p.Body)
		}
	}
}

func TestSavePostsRefusesMalformedPosts(t *testing.T) {
	s, _ := newStore(t)
	bad := post(1, 5, "x")
	bad.ID = "2:5" // another author's id
	if err := s.SavePosts(context.Background(), []*warble.Post{post(1, 4, "ok"), bad}); err == nil {
		t.Fatal("SavePosts of a post whose id is not its author's and seq: no error")
	}
	if n := countRows(t, s); n != 0 {
		t.Fatalf("%d rows after a refused batch, want 0", n)
	}
}

func TestPostsByIDsNeedsTheRightAuthor(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.SavePosts(ctx, []*warble.Post{post(1, 10, "a"), post(2, 11, "b")}); err != nil {
		t.Fatal(err)
	}
	got, err := s.PostsByIDs(ctx, []string{"1:10", "2:10", "1:11", "9:99", "garbage", "", "1:10"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["1:10"] == nil {
		t.Fatalf("PostsByIDs = %v, want 1:10 alone", got)
	}
}

func TestDeletePosts(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	if err := s.SavePosts(ctx, []*warble.Post{post(1, 10, "a"), post(2, 11, "b"), post(1, 12, "c")}); err != nil {
		t.Fatal(err)
	}
	// 2:10 names no post (10 is 1's): it must not delete 1:10.
	if err := s.DeletePosts(ctx, []string{"1:12", "2:10", "5:500", "nonsense"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeletePosts(ctx, []string{"1:12"}); err != nil { // again: no error
		t.Fatal(err)
	}
	got, err := s.PostsByIDs(ctx, []string{"1:10", "2:11", "1:12"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["1:10"] == nil || got["2:11"] == nil {
		t.Fatalf("after deleting 1:12, PostsByIDs = %v, want 1:10 and 2:11", got)
	}
}

func TestPostsByAuthorsAndLatestPosts(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	// Authors 1, 2 and 3 take turns: seq 1 is 1's, 2 is 2's, 3 is 3's, ...
	var posts []*warble.Post
	for seq := int64(1); seq <= 30; seq++ {
		posts = append(posts, post((seq-1)%3+1, seq, "p"))
	}
	if err := s.SavePosts(ctx, posts); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		authors []string
		before  int64
		limit   int
		want    string
	}{
		{name: "OneAuthorNoBound", authors: []string{"2"}, limit: 3, want: "2:29 2:26 2:23"},
		{name: "OneAuthorBefore", authors: []string{"2"}, before: 23, limit: 3, want: "2:20 2:17 2:14"},
		{name: "TwoAuthorsMerged", authors: []string{"1", "3"}, before: 20, limit: 4, want: "1:19 3:18 1:16 3:15"},
		{name: "PastTheStart", authors: []string{"1", "2"}, before: 3, limit: 10, want: "2:2 1:1"},
		{name: "UnknownAndMalformedAuthors", authors: []string{"9", "x", "1"}, before: 5, limit: 10, want: "1:4 1:1"},
		{name: "NoAuthors", limit: 10, want: ""},
		{name: "ZeroLimit", authors: []string{"1"}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.PostsByAuthors(ctx, tt.authors, tt.before, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			if g := strings.Join(ids(got), " "); g != tt.want {
				t.Fatalf("PostsByAuthors(%v, %d, %d) = %q, want %q", tt.authors, tt.before, tt.limit, g, tt.want)
			}
		})
	}
	latest, err := s.LatestPosts(ctx, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	if g := strings.Join(ids(latest), " "); g != "3:30 2:29 1:28 3:27" {
		t.Fatalf("LatestPosts(0, 4) = %q", g)
	}
	latest, err = s.LatestPosts(ctx, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	if g := strings.Join(ids(latest), " "); g != "2:2 1:1" {
		t.Fatalf("LatestPosts(3, 4) = %q", g)
	}
}

// The reads the archive serves are range scans of an index, not scans of
// the table: EXPLAIN says so for each query the store builds.
func TestQueriesAreRangeScans(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	var posts []*warble.Post
	for seq := int64(1); seq <= 3000; seq++ {
		posts = append(posts, post(seq%50+1, seq, "p"))
	}
	if err := s.SavePosts(ctx, posts); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec("ANALYZE TABLE posts"); err != nil {
		t.Fatal(err)
	}
	queries := map[string]string{
		"by author": fmt.Sprintf("SELECT %s FROM posts WHERE author_id = 7%s ORDER BY seq DESC LIMIT 20", postColumns, seqBound(" AND", 2000)),
		"latest":    fmt.Sprintf("SELECT %s FROM posts%s ORDER BY seq DESC LIMIT 20", postColumns, seqBound(" WHERE", 2000)),
		"by ids":    "SELECT " + postColumns + " FROM posts WHERE seq IN (5,6,7)",
		"delete":    "DELETE FROM posts WHERE (seq, author_id) IN ((5,6),(7,8))",
	}
	for name, q := range queries {
		rows, err := s.DB().Query("EXPLAIN " + q)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			row := map[string]string{}
			for i, c := range cols {
				if b, ok := vals[i].([]byte); ok {
					row[c] = string(b)
				}
			}
			if row["type"] != "range" && row["type"] != "ref" {
				t.Errorf("%s: EXPLAIN %s: type %q key %q, want a range scan", name, q, row["type"], row["key"])
			}
		}
		rows.Close()
	}
}
