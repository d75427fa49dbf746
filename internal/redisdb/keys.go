package redisdb

import (
	"hash/fnv"
	"strconv"

	"github.com/warble/warble/internal/warble"
)

// Redis key schema. Every key and channel Warble uses is built in this file,
// so this file is the data layout; README.md has the same table and
// testdata/layout.golden pins it.
//
// Keys owned by one user carry {<user id>} as a Redis Cluster hash tag, so a
// script over one user's keys (a post and the author's timelines, a home
// timeline and the following set that guards it) stays in one slot. Steps
// that cross users are ordered and idempotent instead of atomic.
const prefix = "w:"

const (
	userSeqKey     = prefix + "seq:user"  // STRING  INCR counter for user ids
	postSeqKey     = prefix + "seq:post"  // STRING  INCR counter for post seqs, the order of every timeline
	newestUsersKey = prefix + "users:new" // ZSET    user ids scored by user id, capped
	globalKey      = prefix + "global"    // ZSET    post ids scored by post seq, capped

	// pullAuthorsKey is the SET of the ids of the accounts whose posts were
	// pulled, not pushed, at least once: they had more followers than
	// Options.PullThreshold then (see pull.go). An account is never
	// removed: its pulled posts are merged into home timelines for good.
	pullAuthorsKey = prefix + "pull"

	// globalTailKey is a ZSET of the ids of posts that the global
	// timeline's cap took off it while they were still in Redis, scored
	// by seq, kept only with an archive: w:{w:global}:tail. Past its cap
	// the global timeline goes on from it merged with the archive, which
	// holds the older posts (see global.go). It carries the global
	// timeline's key as its hash tag, so the script that trims the one
	// writes the other. A post leaves it when it moves to the archive or
	// is deleted.
	globalTailKey = prefix + "{" + globalKey + "}:tail"

	// globalChannel carries the events of the global timeline. It carries
	// the global timeline's key as its hash tag, so that on a cluster it
	// is a shard channel of that key's slot, where the scripts that write
	// the timeline publish on it: w:ch:{w:global}.
	globalChannel = prefix + "ch:{" + globalKey + "}"

	revokedChannel = prefix + "ch:revoked" // PUBSUB  hashes of revoked session tokens
	pullChannel    = prefix + "ch:pull"    // PUBSUB  ids of accounts added to pullAuthorsKey

	// postsGoneChannel carries the ids of deleted posts, for every
	// process's post cache (see postCache). It is a classic channel also
	// on a cluster, where a PUBLISH reaches every node and so every
	// process's hub on whichever master it listens: deletes are rare, so
	// broadcasting them costs the cluster little, where a shard channel
	// would need every process to listen on the master of its one slot.
	postsGoneChannel = prefix + "ch:gone"
)

// userKey is a HASH of one user's fields: w:u:{<id>}.
// Fields: username, displayName, createdAt (unix ms), password (bcrypt
// hash), and for an account with very many followers followerBuckets
// (followerBucketsField).
func userKey(userID string) string { return prefix + "u:{" + userID + "}" }

// usernameKey is a STRING holding the id of the user who claimed a username,
// lowercased: w:uname:<username>.
func usernameKey(username string) string { return prefix + "uname:" + username }

// homeKey is a capped ZSET of post ids scored by post seq: w:u:{<id>}:home.
func homeKey(userID string) string { return userKey(userID) + ":home" }

// postsKey is the uncapped ZSET of a user's own post ids scored by post seq:
// w:u:{<id>}:posts.
func postsKey(userID string) string { return userKey(userID) + ":posts" }

// followersKey is a ZSET of the ids of a user's followers scored by the time
// of the follow, unix ms: w:u:{<id>}:followers. An account with more than
// Options.FollowerBucketThreshold followers has them in buckets
// (followerBucketKey) instead.
func followersKey(userID string) string { return userKey(userID) + ":followers" }

// followersLogKey is a STREAM, in an account's slot, of the changes of its
// followers side: mirrorFollowersScript appends an entry with one field,
// f (the follower), for each follower it adds, moves or removes (and for
// each write of a bucketed account's), trimmed in the same step to the
// last followersLogKeep: w:u:{<id>}:followers-log. Fan-out without a
// per-follower guard reads it to find the followers whose entry changed
// while it delivered (see doc.go, "Raw deliveries repaired after the
// fact").
func followersLogKey(userID string) string { return userKey(userID) + ":followers-log" }

// followersUnsureKey is a HASH, in an account's slot, of the followers
// whose followers-side entry may not agree with their following set, the
// truth: a follow or unfollow counts the follower up before it writes the
// truth (see FollowService.checkPair), and down once it has read the truth
// again after its last write of the followers side (mirrorFollow); a
// field is dropped at 0. A writer that dies between leaves its count
// above 0 for good: w:u:{<id>}:followers-unsure. Fields: follower ids,
// values: counts; and "<follower id>:<token>", value 1, for each writer
// counted and not yet confirmed (see unsureScript).
func followersUnsureKey(userID string) string { return userKey(userID) + ":followers-unsure" }

// followerBucketsField is the field of a user's hash (userKey) that says
// where their followers are kept, for an account that outgrew one sorted
// set (see buckets.go). No field: in followersKey alone. "queued:<unix
// ms>": a migration into buckets was queued then. "migrating:<n>": being
// copied into n buckets, with followersKey still whole and read.
// "<n>": in n buckets (followerBucketKey), followersKey gone. It sits in
// the user hash so that reading a user, which reads the hash anyway,
// learns it for free.
const followerBucketsField = "followerBuckets"

// followersCheckedField is the field of a user's hash (userKey) that says
// their followers side is known to list only followers, or followers whose
// entry is logged as unsure (followersUnsureKey): set, to a unix ms, when
// a follow writes the first follower into an empty one set (nothing there
// can be stale then), or by a fan-out job that walked the whole one set
// with the guarded delivery and checked every entry against the truth
// (see fanOutJob and checkFollowers). Fan-out delivers without a per-follower guard only to the
// followers of an account that has it.
const followersCheckedField = "followersChecked"

// followerBucketKey is one of the ZSETs that hold the followers of an
// account past Options.FollowerBucketThreshold, the followers whose
// followerBucket is b, scored like followersKey: w:fb:{<id>:<b>}. Each
// bucket is a hash tag of its own, so that on a cluster the buckets of
// one account spread over the masters.
func followerBucketKey(userID string, b int) string {
	return prefix + "fb:{" + userID + ":" + strconv.Itoa(b) + "}"
}

// followerTombstonesKey is a SET, in its bucket's slot, of the followers
// who unfollowed while the account's followers were being copied into
// buckets, so that the copy does not bring them back:
// w:fb:{<id>:<b>}:gone. It expires a day after its last write (see
// tombstoneTTL); the copy of a bucket never takes that long.
func followerTombstonesKey(userID string, b int) string {
	return followerBucketKey(userID, b) + ":gone"
}

// followerBucket returns the bucket of followerID among n buckets: FNV-1a
// of the id, modulo n. It depends on the follower only, so a follow and
// its unfollow meet in one bucket, and on n, which an account keeps once
// bucketed.
func followerBucket(followerID string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(followerID))
	return int(h.Sum32() % uint32(n))
}

// followingKey is a ZSET of the ids of the users a user follows scored by the
// time of the follow, unix ms: w:u:{<id>}:following.
func followingKey(userID string) string { return userKey(userID) + ":following" }

// outboxKey is a ZSET of the fan-out jobs of a user's posts that may not be
// in the stream yet, "<op> <post id>" scored by when they were recorded
// (unix ms): w:u:{<id>}:outbox. A job leaves it once queued (see fanout.go).
func outboxKey(userID string) string { return userKey(userID) + ":outbox" }

// seenKey is a STRING holding when a user last made a request, unix ms,
// written at most about hourly: w:u:{<id>}:seen. Fan-out skips users not
// seen for a while (see inactive.go).
func seenKey(userID string) string { return userKey(userID) + ":seen" }

// sessionsKey is a SET of the token hashes (see hashToken) of a user's
// sessions: w:u:{<id>}:sessions.
func sessionsKey(userID string) string { return userKey(userID) + ":sessions" }

// sessionKey is a HASH of one session, in its user's slot and keyed by the
// SHA-256 of its token in hex, expiring with the session:
// w:u:{<id>}:session:<hash>. Fields: userID, createdAt. Its token names the
// user, so that one round trip reads the session and its user.
func sessionKey(userID, sha string) string { return userKey(userID) + ":session:" + sha }

// postKey is a HASH of one post, in its author's slot: w:u:{<author>}:p:<seq>.
// Fields: body, createdAt (unix ms), and fanOutPendingField while its
// fan-out job has not delivered it.
func postKey(authorID, seq string) string { return userKey(authorID) + ":p:" + seq }

// fanOutPendingField marks a post hash whose fan-out job has not yet
// delivered it: CreatePost sets it in the step that stores the post and
// records its job, the job's last batch clears it, and the archive's
// mover leaves the post, and every newer post of its author, in Redis
// while it is there (see mover.go). Posts from before it have none.
const fanOutPendingField = "fanout"

// legacySessionKey is a HASH of one session made before tokens named their
// user, keyed by the SHA-256 of its token in hex: w:session:<hash>. Fields:
// userID, createdAt. No new session is stored there; those left expire.
func legacySessionKey(sha string) string { return prefix + "session:" + sha }

// persistedQueryKey is a STRING holding a GraphQL query document, keyed by
// the SHA-256 of its text in hex, expiring a day after its last use:
// w:apq:<hash>.
func persistedQueryKey(hash string) string { return prefix + "apq:" + hash }

// rateKey names a rate limit's state, as redis_rate is given it: it adds
// its own prefix, so the key in Redis is rate:w:rl:<kind>:<subject>, a
// STRING holding when the subject's next event is due, expiring when the
// budget is full again. Subjects are user ids, lowercased usernames and
// client addresses.
func rateKey(kind, subject string) string { return prefix + "rl:" + kind + ":" + subject }

// The fan-out jobs are split over Options.FanOutShards shards, each a
// stream with its own hash tag, so that on a cluster they spread over the
// masters; an author's jobs always go to one shard (see fanOutShard). Shard
// 0's tag is {fanout}, the one stream of a single Redis (and of Warble
// before shards); shard i's is {fanout:<i>}.
func fanoutTag(shard int) string {
	if shard == 0 {
		return "{fanout}"
	}
	return "{fanout:" + strconv.Itoa(shard) + "}"
}

// fanoutStreamKey is the STREAM of one shard's fan-out jobs, read by the
// consumer group "workers" (see queue.go): w:{fanout}:jobs,
// w:{fanout:<i>}:jobs. Fields: op (add or del), author, seq, post, and for
// a post's job on one Redis whose author has few followers, followers (their
// ids, space-separated; see createPostOneRedisScript), and for a post's job
// on one Redis, listed ("1": the step that queued it listed the post on the
// global timeline). A job is deleted once done, so the stream holds only
// jobs to do.
func fanoutStreamKey(shard int) string { return prefix + fanoutTag(shard) + ":jobs" }

// fanoutCursorKey is a STRING holding how far a fan-out job has walked its
// author's followers ("<score> <tied>", see followerCursor), in its
// stream's slot, deleted with the job and expiring after a week:
// w:{fanout}:cursor:<entry id>, w:{fanout:<i>}:cursor:<entry id>.
func fanoutCursorKey(shard int, entryID string) string {
	return prefix + fanoutTag(shard) + ":cursor:" + entryID
}

// fanoutMarkKey is a STRING counting the delivery calls of a walked fan-out
// job's last pipeline that are done, for the end in that pipeline
// (finishFanOutLua), in its stream's slot, deleted with the job:
// w:{fanout}:delivered:<entry id>, w:{fanout:<i>}:delivered:<entry id>.
// (A job that carries its followers needs none: carriedLua.)
func fanoutMarkKey(shard int, entryID string) string {
	return prefix + fanoutTag(shard) + ":delivered:" + entryID
}

// outboxIndexKey is a ZSET of the fan-out jobs of one shard that may sit in
// their author's outbox unqueued, "<op> <post id>" scored by when they were
// recorded (unix ms): w:{fanout}:outboxes, w:{fanout:<i>}:outboxes. A job
// is added before its post's step writes the outbox, and leaves once it is
// queued; the outbox sweep reads only the old entries (see sweepOutboxes).
func outboxIndexKey(shard int) string { return prefix + fanoutTag(shard) + ":outboxes" }

// outboxBackfillKey is a STRING holding when the outbox indexes were
// filled from the outboxes that Warble from before the index left (unix
// ms), in shard 0's slot: w:{fanout}:outboxes:backfilled. It is written
// once per database, by the first sweeping worker (see
// backfillOutboxIndex), and never expires.
var outboxBackfillKey = outboxIndexKey(0) + ":backfilled"

// seenIndexKey is a ZSET of the users of one fan-out shard (fanOutShard of
// the user id) whose home timeline may be dropped once they go inactive,
// scored by when they were last recorded seen (unix ms): w:{fanout}:seen,
// w:{fanout:<i>}:seen. Seen adds a user; dropIdleHomes reads the oldest
// entries and takes out the users whose home it dropped (see inactive.go).
// It is an index, not the truth: seenKey is.
func seenIndexKey(shard int) string { return prefix + fanoutTag(shard) + ":seen" }

// seenBackfillKey is a STRING holding when the seen indexes were filled
// from the seenKeys of users recorded before them (unix ms), in shard 0's
// slot: w:{fanout}:seen:backfilled. Written once per database (see
// backfillSeenIndex), it never expires.
var seenBackfillKey = seenIndexKey(0) + ":backfilled"

// archiveDueKey is a ZSET of the authors of one fan-out shard (see
// fanOutShard) who have posts to move to the archive, scored by when they
// are due (unix ms): now for an author past Options.PostsInRedis posts,
// their oldest post's time plus Options.PostsInRedisFor otherwise; while
// a mover works on an author, the end of its lease. Kept only with an
// archive: w:{fanout}:archive:due, w:{fanout:<i>}:archive:due. See mover.go.
func archiveDueKey(shard int) string { return prefix + fanoutTag(shard) + ":archive:due" }

// archiveBackfillKey is a STRING holding when the due indexes were filled
// from the posts sets that Warble had before its archive (unix ms), in
// shard 0's slot: w:{fanout}:archive:due:backfilled. Written once per
// database, by the first mover (see backfillArchiveDue).
var archiveBackfillKey = archiveDueKey(0) + ":backfilled"

// movingKey is a STRING holding the token of the mover moving some of a
// user's posts to the archive now, expiring with its lease:
// w:u:{<id>}:moving. While it exists, a deleted post's id goes into
// archiveGoneKey, since the mover may have written its row.
func movingKey(userID string) string { return userKey(userID) + ":moving" }

// archiveGoneKey is a SET of the ids of a user's deleted posts whose rows
// may still be in the archive: deleted while a mover held movingKey, or
// archived posts being deleted. The mover deletes those rows and then the
// ids: w:u:{<id>}:archive:gone.
func archiveGoneKey(userID string) string { return userKey(userID) + ":archive:gone" }

// archivedPostsField is the field of a user's hash (userKey) that counts
// their posts in the archive, so that postsCount, the size of their posts
// set plus this, stays exact as posts move.
const archivedPostsField = "archivedPosts"

// The mover also keeps movingUpTo in a user's hash while a move of their
// posts has not ended: the highest seq it may have written to the archive
// (see mover.go).

// homeChannel carries the events of one user's home timeline, with the
// user's hash tag, so that on a cluster it is a shard channel of the home
// timeline's slot: w:ch:{<id>}:home.
func homeChannel(userID string) string { return prefix + "ch:{" + userID + "}:home" }

// userChannel carries the events of one user's own posts, in the slot of
// their posts: w:ch:{<id>}:user.
func userChannel(userID string) string { return prefix + "ch:{" + userID + "}:user" }

// Layout names keys of the data layout for programs outside this package
// that read or write Redis directly: the load tool, which seeds large graphs
// and measures Redis itself (internal/loadtest). They build no key by hand,
// so a change of the layout reaches them, and a test there compares what
// they write with what the services write.
type Layout struct{}

// Keys is the data layout, for programs outside this package.
var Keys Layout

// PostSeq is the counter of post seqs.
func (Layout) PostSeq() string { return postSeqKey }

// UserSeq is the counter of user ids.
func (Layout) UserSeq() string { return userSeqKey }

// NewestUsers is the capped set of the newest user ids.
func (Layout) NewestUsers() string { return newestUsersKey }

// User is a user's hash.
func (Layout) User(userID string) string { return userKey(userID) }

// Home is a user's home timeline.
func (Layout) Home(userID string) string { return homeKey(userID) }

// Posts is the set of a user's own posts.
func (Layout) Posts(userID string) string { return postsKey(userID) }

// Followers is the set of a user's followers.
func (Layout) Followers(userID string) string { return followersKey(userID) }

// FollowerBucket is bucket b of a bucketed account's followers.
func (Layout) FollowerBucket(userID string, b int) string { return followerBucketKey(userID, b) }

// BucketOf returns which of n buckets holds followerID.
func (Layout) BucketOf(followerID string, n int) int { return followerBucket(followerID, n) }

// BucketedFollowers returns the field of the user hash, and its value,
// that say an account's followers are in n buckets.
func (Layout) BucketedFollowers(n int) (field, value string) {
	return followerBucketsField, strconv.Itoa(n)
}

// FollowersLog is the stream of the changes of a user's followers side,
// each entry a field "f" holding the follower.
func (Layout) FollowersLog(userID string) string { return followersLogKey(userID) }

// FollowersChecked is the field of the user hash, set to a unix ms, that
// says the followers side lists only followers: set when the first
// follower was written into an empty set.
func (Layout) FollowersChecked() string { return followersCheckedField }

// Following is the set of the users a user follows.
func (Layout) Following(userID string) string { return followingKey(userID) }

// Seen holds when a user was last seen.
func (Layout) Seen(userID string) string { return seenKey(userID) }

// SeenIndex is the seen index that holds a user, among shards fan-out
// shards (see Options.FanOutShards).
func (Layout) SeenIndex(userID string, shards int) string {
	return seenIndexKey(shardOf(userID, shards))
}

// Post is a post's hash.
func (Layout) Post(authorID, seq string) string { return postKey(authorID, seq) }

// Single names the keys that are one key for the whole of Warble, with
// what they are: every post writes the first two, which on a cluster live
// on one master each.
func (Layout) Single() map[string]string {
	return map[string]string{
		"`w:seq:post`": postSeqKey,
		"`w:global`":   globalKey,
		"`w:seq:user`": userSeqKey,
		"`w:pull`":     pullAuthorsKey,
	}
}

// Username is the key of a username's claim; it lowercases the name as
// Signup does.
func (Layout) Username(name string) string { return usernameKey(warble.UsernameKey(name)) }
