package redisdb

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/warble"
)

// Defaults for Options.
const (
	DefaultHomeCap    = 1000
	DefaultGlobalCap  = 1000
	DefaultNewestCap  = 1000
	DefaultSessionTTL = 30 * 24 * time.Hour
	// DefaultClusterFanOutShards is how many fan-out shards a DB on a
	// Redis Cluster has by default: enough for their streams to land on
	// every master of a small cluster.
	DefaultClusterFanOutShards = 8
	// DefaultPullThreshold is how many followers an account may have and
	// still have its posts fanned out; see Options.PullThreshold.
	DefaultPullThreshold = 10_000
	// DefaultFollowerBucketThreshold is how many followers an account
	// keeps in one sorted set on a Redis Cluster before they are split
	// into buckets; see Options.FollowerBucketThreshold.
	DefaultFollowerBucketThreshold = 100_000
	// DefaultFollowerBuckets is how many buckets such an account's
	// followers are split into: a few per master of a small cluster.
	DefaultFollowerBuckets = 16
	// DefaultPostsInRedis is how many of an author's newest posts stay in
	// Redis with an archive; see Options.PostsInRedis.
	DefaultPostsInRedis = 1000
	// DefaultMoveBatch is how many posts a move writes per statement.
	DefaultMoveBatch = 1000
	// DefaultMoveLease is how long a mover holds an author: far longer
	// than a batch takes.
	DefaultMoveLease = 5 * time.Minute
)

// Options tune a DB. The zero value of each field means its default.
type Options struct {
	HomeCap      int           // entries kept in each home timeline
	GlobalCap    int           // entries kept in the global timeline
	MaxFollowing int           // how many users one user may follow
	SessionTTL   time.Duration // how long a session lasts
	BcryptCost   int           // password hashing cost; tests lower it
	Logger       *slog.Logger
	Now          func() time.Time // the clock; tests may replace it
	// AsyncFanOut has CreatePost and DeletePost queue their followers'
	// part for Workers (see fanout.go) and answer at once. Without it they
	// do that part themselves before answering, one batch at a time, and
	// a fan-out that fails part-way (Redis out of reach, a failover) is
	// logged and not tried again: no job is queued for it. Only with
	// AsyncFanOut does every follower of an acknowledged post get it in
	// the end, so the server always sets it; without is for tests and
	// tools that want a post's fan-out done when it answers.
	AsyncFanOut bool
	// PullThreshold is how many followers an account may have and still
	// have its posts pushed to their home timelines. The posts of an
	// account with more are pulled instead: merged into a follower's home
	// timeline when it is read (see pull.go). Zero means
	// DefaultPullThreshold; negative means every account is pushed.
	PullThreshold int
	// InactiveAfter is how long a user may go without a request and still
	// have posts fanned out to their home timeline, which is rebuilt when
	// they come back (see inactive.go). Zero means DefaultInactiveAfter;
	// negative means nobody is skipped.
	InactiveAfter time.Duration
	// ReplicaReads, if set, is a client of the same Redis Cluster that
	// routes reads to replicas (go-redis's ReadOnly, RouteByLatency or
	// RouteRandomly). The reads that may lag behind the writes go through
	// it: pages of the global timeline, the newest users, and user
	// profiles looked up by username, with their counts. A replica is a
	// few milliseconds behind its master at most in the usual case (and
	// has every signup, post and follow that waited for it, see
	// WaitReplicas), and none of those reads is the reader's own write
	// read back. The rest stay on the masters: the viewer and their home
	// timeline, which must show their own post or follow at once; follow
	// lists and states, read to answer follows; sessions, which a login
	// must find at once; and the live hub's reads, which must see what
	// the masters published.
	ReplicaReads redis.UniversalClient
	// FanOutShards is how many streams the fan-out jobs are split over
	// (see fanoutTag), each in its own hash slot, so that on a cluster the
	// jobs and their workers' commands spread over the masters. Zero
	// means 1 on one Redis and DefaultClusterFanOutShards on a cluster.
	// Lowering it strands the jobs queued in the shards it drops: let the
	// queue drain first.
	FanOutShards int
	// WaitReplicas is how many replicas of each master must confirm the
	// writes of a signup, a post or a follow before they are answered
	// (see durability.go). Zero, the default, waits for one on a Redis
	// Cluster whose every master has a replica, and for none elsewhere; a
	// negative number waits for none.
	WaitReplicas int
	// WaitTimeout bounds that wait; zero means DefaultWaitTimeout.
	WaitTimeout time.Duration
	// PulledStaleness bounds how old this process's copy of the set of
	// pulled accounts may be (see pulledSet). Zero means
	// DefaultPulledStaleness.
	PulledStaleness time.Duration
	// FollowerBucketThreshold is how many followers an account may have
	// in one sorted set, on one master. Past it, workers move its
	// followers into FollowerBuckets sorted sets with hash tags of their
	// own, spread over the masters (see buckets.go), while follows,
	// reads and fan-out go on. Zero means DefaultFollowerBucketThreshold
	// on a Redis Cluster and none on one Redis, where buckets would only
	// cost; negative means none.
	FollowerBucketThreshold int
	// FollowerBuckets is how many buckets an account's followers are
	// split into when it crosses the threshold; an account keeps the
	// number it got. Zero means DefaultFollowerBuckets; at least 2.
	FollowerBuckets int
	// Archive, if set, is where posts go when they leave Redis (see
	// Options.PostsInRedis): reads that reach past what Redis holds
	// continue in it. Nil keeps every post in Redis.
	Archive warble.PostArchive
	// PostsInRedis is how many of an author's newest posts stay in Redis
	// with an archive: the workers move the older ones (see mover.go).
	// Zero means DefaultPostsInRedis.
	PostsInRedis int
	// PostsInRedisFor, if positive, also moves posts older than this,
	// however few the author has. Zero or negative: by count alone.
	PostsInRedisFor time.Duration
	// MoveBatch is how many posts one move writes to the archive in one
	// statement. Zero means DefaultMoveBatch.
	MoveBatch int
	// MoveLease is how long a mover holds an author before another may
	// take them over, as from a mover that died. Zero means
	// DefaultMoveLease.
	MoveLease time.Duration
	// Moved, if set, is told how many posts each move took out of Redis,
	// for metrics.
	Moved func(n int)
	// Delivered, if set, is told how many home timelines each fan-out
	// batch added a post to, for metrics.
	Delivered func(n int)
	// PostCacheSize is how many posts, and as many authors, this process
	// keeps in its cache of what never changes in them (see postCache),
	// used while a Hub over the DB hears of deletes. Zero means
	// DefaultPostCacheSize; negative means no cache.
	PostCacheSize int
	// PostCacheCounts, if set, is told of the post cache's hits and
	// misses (posts and authors alike) and of its clears, for metrics.
	PostCacheCounts func(hits, misses, clears int)
}

// DB is Warble's data on one Redis (or Redis Cluster) client. The services
// in this package share it.
type DB struct {
	client redis.UniversalClient
	opts   Options
	log    *slog.Logger
	seen   seenCache // see Seen
	pulled pulledSet // this process's copy of pullAuthorsKey

	replicaWait replicaWait // see replicasOf

	// lagging is the DB for reads that may go to replicas (see
	// Options.ReplicaReads): one over that client, or db itself.
	lagging *DB
	// replica is set on that DB over the replicas: what it reads may
	// predate a delete that this process has heard of, and is not cached.
	replica bool
	// cache holds what never changes in posts and their authors (see
	// postCache); nil for none. db and lagging share it.
	cache *postCache
	jobs  jobWatch // wakes this process's idle fan-out workers
	// batcher lets one fan-out worker of this process at a time run a
	// pipeline of carried jobs (see Worker.runCarried).
	batcher batchTurn
	// sharded is set on a Redis Cluster: timeline events then go out by
	// SPUBLISH to shard channels, which only the master of the channel's
	// slot carries, where a classic PUBLISH would reach every node of the
	// cluster (see Hub). One Redis keeps classic pub/sub: there it costs
	// the same, and the embedded Redis has no SPUBLISH.
	sharded bool
	// chainedPosts is set on a Redis Cluster: CreatePost stores a post
	// through its author's outbox in a chain of round trips
	// (storeChained), where one Redis takes one script for all of it
	// (createPostOneRedisScript). Tests of the outbox set it on one Redis.
	chainedPosts bool

	// dropStep, if set, runs inside dropIdleBatch after its read of the
	// seen index ("read") and after its drops ("dropped"): tests make a
	// user return there.
	dropStep func(step string)
	// moveHook, if set, is called between the steps of a move to the
	// archive, by tests that put a delete or a crash there (see mover.go).
	moveHook func(stage string)
	// beforeWait, if set, is called with its context as awaitReplicas
	// begins, by tests that fail a master over between a write and its
	// wait, or look at what it waits for.
	beforeWait func(ctx context.Context)
	// mirrorWritten, if set, is called by mirrorFollow after each write of
	// the followers side and before its read of the truth, by tests that
	// race a fan-out or another writer against it there.
	mirrorWritten func(followerID, followeeID string)
	// rawStep, if set, is called between the steps of a batch of raw
	// deliveries: "walked" once its followers are read, "seen" once its
	// inactive followers are known, "added" once the adds and the reads
	// after them have answered, "repaired" at its end (see deliverRaw),
	// with the batch's (active) followers, by tests that put a follow or
	// unfollow there.
	rawStep func(stage string, followers []string)
	// rawFrom, if above 0, is how many followers a walked job's author
	// must have for the job to deliver raw, in place of rawJob's rule:
	// benchmarks and tests set it to compare or pin the two paths.
	rawFrom int
}

// NewDB returns a DB over client with opts, defaults filled in.
func NewDB(client redis.UniversalClient, opts Options) *DB {
	if opts.HomeCap <= 0 {
		opts.HomeCap = DefaultHomeCap
	}
	if opts.GlobalCap <= 0 {
		opts.GlobalCap = DefaultGlobalCap
	}
	if opts.MaxFollowing <= 0 {
		opts.MaxFollowing = warble.DefaultMaxFollowing
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	if opts.BcryptCost == 0 {
		opts.BcryptCost = bcrypt.DefaultCost
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.InactiveAfter == 0 {
		opts.InactiveAfter = DefaultInactiveAfter
	}
	if opts.PullThreshold == 0 {
		opts.PullThreshold = DefaultPullThreshold
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = DefaultWaitTimeout
	}
	if opts.PulledStaleness <= 0 {
		opts.PulledStaleness = DefaultPulledStaleness
	}
	cc, sharded := client.(*redis.ClusterClient)
	if sharded {
		cc.AddHook(slotReloader{cc})
		cc.AddHook(masterNoter{cc})
	}
	if opts.FanOutShards <= 0 {
		opts.FanOutShards = 1
		if sharded {
			opts.FanOutShards = DefaultClusterFanOutShards
		}
	}
	if opts.FollowerBucketThreshold == 0 {
		opts.FollowerBucketThreshold = -1
		if sharded {
			opts.FollowerBucketThreshold = DefaultFollowerBucketThreshold
		}
	}
	if opts.PostsInRedis <= 0 {
		opts.PostsInRedis = DefaultPostsInRedis
	}
	if opts.MoveBatch <= 0 {
		opts.MoveBatch = DefaultMoveBatch
	}
	if opts.MoveLease <= 0 {
		opts.MoveLease = DefaultMoveLease
	}
	if opts.FollowerBuckets <= 0 {
		opts.FollowerBuckets = DefaultFollowerBuckets
	}
	if opts.PostCacheSize == 0 {
		opts.PostCacheSize = DefaultPostCacheSize
	}
	opts.FollowerBuckets = max(2, opts.FollowerBuckets)
	db := &DB{client: client, opts: opts, log: opts.Logger, sharded: sharded, chainedPosts: sharded,
		cache: newPostCache(opts.PostCacheSize, opts.PostCacheCounts)}
	db.batcher.token = make(chan struct{}, 1)
	db.lagging = db
	if opts.ReplicaReads != nil {
		db.lagging = &DB{client: opts.ReplicaReads, opts: opts, log: opts.Logger, sharded: sharded, replica: true, cache: db.cache}
		db.lagging.lagging = db.lagging
	}
	return db
}

// Client returns the Redis client, for health checks.
func (db *DB) Client() redis.UniversalClient { return db.client }

// Ping reports whether Redis answers.
func (db *DB) Ping(ctx context.Context) error {
	if err := db.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// now returns the current time at the millisecond precision Warble stores.
func (db *DB) now() time.Time { return db.opts.Now().UTC().Truncate(time.Millisecond) }

// msTime turns a stored unix-ms string into a time; bad input gives the zero time.
func msTime(s string) time.Time {
	ms, _ := strconv.ParseInt(s, 10, 64)
	return time.UnixMilli(ms).UTC()
}

// msString stores a time as unix ms.
func msString(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// hashReads queues the HMGETs of a batched read (a page's posts and their
// authors) for one pipeline, with their arguments and commands in three
// allocations in all. go-redis's HMGet makes an argument slice, boxes the
// key and each field name, and allocates the command, for each hash, and
// the pipeline grows its list of commands as they come; for the 26 hashes
// of a home page of 20 posts those were some 160 allocations of the page's
// 1,271.
type hashReads struct {
	args   []any
	cmds   []redis.SliceCmd
	queued []redis.Cmder
}

// maxReadFields is the most fields that one of a hashReads' HMGETs reads
// (a user's three) without allocating room of its own.
const maxReadFields = 3

// newHashReads returns a hashReads with room for n HMGETs.
func newHashReads(n int) *hashReads {
	return &hashReads{
		args:   make([]any, 0, n*(2+maxReadFields)),
		cmds:   make([]redis.SliceCmd, 0, n),
		queued: make([]redis.Cmder, 0, n),
	}
}

// add queues HMGET key fields. Past the room that newHashReads made, it
// allocates as go-redis would.
func (r *hashReads) add(ctx context.Context, key string, fields ...any) *redis.SliceCmd {
	start := len(r.args)
	r.args = append(append(r.args, "hmget", key), fields...)
	args := r.args[start:len(r.args):len(r.args)]
	var cmd *redis.SliceCmd
	if len(r.cmds) < cap(r.cmds) {
		r.cmds = append(r.cmds, *redis.NewSliceCmd(ctx, args...))
		cmd = &r.cmds[len(r.cmds)-1]
	} else {
		cmd = redis.NewSliceCmd(ctx, args...)
	}
	r.queued = append(r.queued, cmd)
	return cmd
}

// queue adds the reads to pipe, in the order they were added.
func (r *hashReads) queue(ctx context.Context, pipe redis.Pipeliner) {
	if len(r.queued) > 0 {
		_ = pipe.BatchProcess(ctx, r.queued...) // a Pipeline's BatchProcess only queues
	}
}
