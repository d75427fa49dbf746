// Package archive keeps the posts that left Redis in a MySQL database
// (MySQL 8 or MariaDB 10.11 and later), through go-sql-driver/mysql. It
// implements warble.PostArchive.
//
// Warble creates and migrates the schema itself when it opens the archive:
// the migrations are SQL files embedded in the binary (migrations/), run by
// goose under a named lock of the server (GET_LOCK), so that instances
// started together migrate one after the other and the later ones find
// nothing to do.
package archive

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"

	"github.com/warble/warble/internal/warble"
)

// BatchRows is the most rows SavePosts writes in one statement. A thousand
// posts of up to 280 code points are at most about 1.2 MB, well below the
// servers' default max_allowed_packet (16 MB on MariaDB, 64 MB on MySQL).
const BatchRows = 1000

// Store is the archive on one MySQL database. It is safe for concurrent
// use.
type Store struct {
	db *sql.DB
}

var _ warble.PostArchive = (*Store)(nil)

//go:embed migrations/*.sql
var migrations embed.FS

// migrateLock names the server-wide lock (GET_LOCK) taken around the
// migrations. It carries the database's name, so that databases on one
// server migrate independently.
func migrateLock(dbName string) string { return "warble.migrate." + dbName }

// migrateLockWait is how long an instance waits for another's migrations
// before it gives up starting.
const migrateLockWait = 5 * time.Minute

// Open connects to the database that url names (see ParseURL), creates or
// migrates its schema, and returns the archive on it. log, if set, also
// gets what the driver logs (a connection the server closed, say), which
// it would print to stderr otherwise.
func Open(ctx context.Context, url string, log *slog.Logger) (*Store, error) {
	if log != nil {
		// The driver has one logger for the whole process: the first
		// archive opened with a logger gives it.
		setDriverLogger.Do(func() { mysql.SetLogger(driverLogger{log}) })
	}
	cfg, pool, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("archive: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	// A server closes connections idle past its wait_timeout (8 hours by
	// default; often less behind a proxy): drop them before it does.
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("archive: connect to %s: %w", describe(cfg), err)
	}
	if err := migrate(ctx, db, cfg.DBName, log); err != nil {
		db.Close()
		return nil, fmt.Errorf("archive: migrate %s: %w", describe(cfg), err)
	}
	return &Store{db: db}, nil
}

// describe names a database for errors and logs, without its password.
func describe(cfg *mysql.Config) string {
	return fmt.Sprintf("mysql %s %s/%s as %s", cfg.Net, cfg.Addr, cfg.DBName, cfg.User)
}

// migrate brings the schema up to the newest embedded migration, holding
// the database's migration lock throughout. goose's own checks before it
// locks (does the version table exist, is anything pending) race when two
// instances meet an empty database: one sees the table the other has just
// created, but not yet its first row, and fails. So the lock is taken
// around all of goose, on a connection of its own.
func migrate(ctx context.Context, db *sql.DB, dbName string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	provider, err := goose.NewProvider(goose.DialectMySQL, db, migrationsDir(),
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName("warble_schema_version"),
		goose.WithSlog(log),
	)
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	lock := namedLock{name: migrateLock(dbName), wait: migrateLockWait}
	if err := lock.take(ctx, conn); err != nil {
		return err
	}
	// The server releases the lock when the connection ends, should the
	// release fail or this process die.
	defer lock.release(context.WithoutCancel(ctx), conn)
	results, err := provider.Up(ctx)
	for _, r := range results {
		log.InfoContext(ctx, "archive schema migrated", "migration", r.Source.Path, "took", r.Duration)
	}
	return err
}

// Close closes the connections to the database.
func (s *Store) Close() error { return s.db.Close() }

// DB returns the database handle, for tests and tools that look inside.
func (s *Store) DB() *sql.DB { return s.db }

const postColumns = "seq, author_id, body, created_at"

// SavePosts implements warble.PostArchive: an upsert of BatchRows rows per
// statement, in one transaction when posts need more than one.
func (s *Store) SavePosts(ctx context.Context, posts []*warble.Post) error {
	if len(posts) == 0 {
		return nil
	}
	rows := make([]postRow, 0, len(posts))
	for _, p := range posts {
		r, err := rowOf(p)
		if err != nil {
			return err
		}
		rows = append(rows, r)
	}
	if len(rows) <= BatchRows {
		if err := upsert(ctx, s.db, rows); err != nil {
			return fmt.Errorf("archive: save %d posts: %w", len(rows), err)
		}
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("archive: save %d posts: %w", len(rows), err)
	}
	defer tx.Rollback()
	for i := 0; i < len(rows); i += BatchRows {
		if err := upsert(ctx, tx, rows[i:min(i+BatchRows, len(rows))]); err != nil {
			return fmt.Errorf("archive: save %d posts: %w", len(rows), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("archive: save %d posts: %w", len(rows), err)
	}
	return nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// upsert writes rows in one INSERT ... ON DUPLICATE KEY UPDATE. Posts never
// change, so a row already there is rewritten with what it holds; updating
// every column still makes a second save of a batch leave what the first
// did, whatever was there.
func upsert(ctx context.Context, db execer, rows []postRow) error {
	var q strings.Builder
	q.WriteString("INSERT INTO posts (" + postColumns + ") VALUES ")
	args := make([]any, 0, 2*len(rows))
	for i, r := range rows {
		if i > 0 {
			q.WriteByte(',')
		}
		// The numbers are ours, printed from integers; only the body
		// is a parameter.
		fmt.Fprintf(&q, "(%d,%d,?,%d)", r.seq, r.authorID, r.createdAt)
		args = append(args, r.body)
	}
	q.WriteString(" ON DUPLICATE KEY UPDATE author_id = VALUES(author_id), body = VALUES(body), created_at = VALUES(created_at)")
	_, err := db.ExecContext(ctx, q.String(), args...)
	return err
}

// DeletePosts implements warble.PostArchive. A row goes only if it is the
// post of the author its id names.
func (s *Store) DeletePosts(ctx context.Context, ids []string) error {
	keys := parseIDs(ids)
	if len(keys) == 0 {
		return nil
	}
	var q strings.Builder
	q.WriteString("DELETE FROM posts WHERE (seq, author_id) IN (")
	for i, k := range keys {
		if i > 0 {
			q.WriteByte(',')
		}
		fmt.Fprintf(&q, "(%d,%d)", k.seq, k.authorID)
	}
	q.WriteByte(')')
	if _, err := s.db.ExecContext(ctx, q.String()); err != nil {
		return fmt.Errorf("archive: delete %d posts: %w", len(keys), err)
	}
	return nil
}

// PostsByIDs implements warble.PostArchive: one query on the primary key.
func (s *Store) PostsByIDs(ctx context.Context, ids []string) (map[string]*warble.Post, error) {
	keys := parseIDs(ids)
	out := make(map[string]*warble.Post, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	var q strings.Builder
	q.WriteString("SELECT " + postColumns + " FROM posts WHERE seq IN (")
	for i, k := range keys {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString(strconv.FormatUint(k.seq, 10))
	}
	q.WriteByte(')')
	posts, err := s.query(ctx, q.String())
	if err != nil {
		return nil, fmt.Errorf("archive: find %d posts: %w", len(keys), err)
	}
	asked := make(map[string]bool, len(keys))
	for _, k := range keys {
		asked[k.id] = true
	}
	for _, p := range posts {
		// An id whose seq is another author's post names no post.
		if asked[p.ID] {
			out[p.ID] = p
		}
	}
	return out, nil
}

// PostsByAuthors implements warble.PostArchive. Each author's newest posts
// before the cursor are a range scan of posts_by_author read backwards and
// stopped at limit; the query is the union of those scans, so that it
// reads at most limit rows per author however many posts they have.
func (s *Store) PostsByAuthors(ctx context.Context, authorIDs []string, beforeSeq int64, limit int) ([]*warble.Post, error) {
	if limit <= 0 || len(authorIDs) == 0 {
		return nil, nil
	}
	var q strings.Builder
	n := 0
	for _, a := range authorIDs {
		id, ok := parseUserID(a)
		if !ok {
			continue
		}
		if n > 0 {
			q.WriteString(" UNION ALL ")
		}
		n++
		fmt.Fprintf(&q, "(SELECT %s FROM posts WHERE author_id = %d%s ORDER BY seq DESC LIMIT %d)",
			postColumns, id, seqBound(" AND", beforeSeq), limit)
	}
	if n == 0 {
		return nil, nil
	}
	if n > 1 {
		fmt.Fprintf(&q, " ORDER BY seq DESC LIMIT %d", limit)
	}
	posts, err := s.query(ctx, q.String())
	if err != nil {
		return nil, fmt.Errorf("archive: posts of %d authors before %d: %w", n, beforeSeq, err)
	}
	return posts, nil
}

// LatestPosts implements warble.PostArchive: a backward range scan of the
// primary key.
func (s *Store) LatestPosts(ctx context.Context, beforeSeq int64, limit int) ([]*warble.Post, error) {
	if limit <= 0 {
		return nil, nil
	}
	q := fmt.Sprintf("SELECT %s FROM posts%s ORDER BY seq DESC LIMIT %d", postColumns, seqBound(" WHERE", beforeSeq), limit)
	posts, err := s.query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("archive: latest posts before %d: %w", beforeSeq, err)
	}
	return posts, nil
}

// seqBound is the condition "seq < beforeSeq" after word, or nothing for no
// bound.
func seqBound(word string, beforeSeq int64) string {
	if beforeSeq <= 0 {
		return ""
	}
	return fmt.Sprintf("%s seq < %d", word, beforeSeq)
}

func (s *Store) query(ctx context.Context, q string, args ...any) ([]*warble.Post, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var posts []*warble.Post
	for rows.Next() {
		var r postRow
		if err := rows.Scan(&r.seq, &r.authorID, &r.body, &r.createdAt); err != nil {
			return nil, err
		}
		posts = append(posts, r.post())
	}
	return posts, rows.Err()
}

// postRow is a post as the posts table holds it.
type postRow struct {
	seq       uint64
	authorID  uint64
	body      string
	createdAt int64 // unix ms
}

func rowOf(p *warble.Post) (postRow, error) {
	author, ok := parseUserID(p.AuthorID)
	if !ok || p.Seq <= 0 || p.ID != p.AuthorID+":"+strconv.FormatInt(p.Seq, 10) {
		return postRow{}, fmt.Errorf("archive: post %q by %q with seq %d: malformed", p.ID, p.AuthorID, p.Seq)
	}
	return postRow{seq: uint64(p.Seq), authorID: author, body: p.Body, createdAt: p.CreatedAt.UnixMilli()}, nil
}

func (r postRow) post() *warble.Post {
	author := strconv.FormatUint(r.authorID, 10)
	seq := strconv.FormatUint(r.seq, 10)
	return &warble.Post{
		ID:        author + ":" + seq,
		AuthorID:  author,
		Body:      r.body,
		CreatedAt: time.UnixMilli(r.createdAt).UTC(),
		Seq:       int64(r.seq),
	}
}

// postKey is a well-formed post id taken apart.
type postKey struct {
	id       string
	authorID uint64
	seq      uint64
}

// parseIDs returns the well-formed ids among ids, taken apart, once each.
// An id that is not a post id names no archived post.
func parseIDs(ids []string) []postKey {
	keys := make([]postKey, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] || !warble.IsPostID(id) {
			continue
		}
		seen[id] = true
		a, s, _ := strings.Cut(id, ":")
		author, _ := strconv.ParseUint(a, 10, 64)
		seq, _ := strconv.ParseUint(s, 10, 64)
		keys = append(keys, postKey{id: id, authorID: author, seq: seq})
	}
	return keys
}

func parseUserID(id string) (uint64, bool) {
	if !warble.ValidUserID(id) {
		return 0, false
	}
	n, err := strconv.ParseUint(id, 10, 64)
	return n, err == nil
}

// namedLock is a server-wide lock (GET_LOCK) held by one connection. The
// server releases it when that connection ends, so an instance that dies
// while it migrates does not leave the others waiting.
type namedLock struct {
	name string
	wait time.Duration
}

func (l *namedLock) take(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", l.name, int(l.wait.Seconds())).Scan(&got)
	if err != nil {
		return fmt.Errorf("take lock %s: %w", l.name, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("take lock %s: another instance held it for %s", l.name, l.wait)
	}
	return nil
}

func (l *namedLock) release(ctx context.Context, conn *sql.Conn) {
	conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", l.name)
}

var setDriverLogger sync.Once

// driverLogger hands the driver's log lines to slog, as warnings.
type driverLogger struct{ log *slog.Logger }

func (l driverLogger) Print(v ...any) { l.log.Warn("mysql driver", "msg", fmt.Sprint(v...)) }

var errNoDatabase = errors.New("names no database: mysql://user:password@host:port/database")
