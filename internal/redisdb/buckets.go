package redisdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Follower buckets.
//
// An account's followers set is one key, so on a cluster one master holds
// and serves the whole of it: for an account with millions of followers,
// that master's memory and every read of the list. Past
// Options.FollowerBucketThreshold the followers move into
// Options.FollowerBuckets sorted sets, buckets, each with a hash tag of its
// own (followerBucketKey), a follower always in the bucket its id hashes to
// (followerBucket). The field followerBucketsField of the account's user
// hash says where the followers are; it and the one set share a slot, so a
// script reads the field and writes the set in one step.
//
// The move needs no downtime. A follow that takes the one set past the
// threshold marks the account queued and queues a job in the fan-out
// stream (opBuckets); a worker runs it like a fan-out job, with a saved
// cursor and take-over by another worker if it dies. The job marks the
// account migrating, copies the one set into the buckets a batch at a time,
// and then, in one step in the account's slot, marks it bucketed and
// deletes the one set. Until that step every read (pages, counts, fan-out)
// reads the one set, which stays whole; after it, the buckets, which by
// then hold exactly what the one set held:
//
//   - Every write of the followers side (mirrorFollower) writes the one set
//     in a script that reads the field in the same step. While the account
//     is migrating it then writes the bucket too, after the one set. A
//     write that saw the account not yet migrating wrote only the one set,
//     before the migration began, so the copy, which reads the one set
//     after that, carries it over.
//   - The copy adds an entry to a bucket only if the bucket lacks the
//     follower (ZADD NX: a follow that wrote the bucket meanwhile has the
//     newer time) and only if no tombstone of the follower is in the
//     bucket's slot: an unfollow while migrating leaves one there in the
//     same step that takes the follower out of the bucket, so a copy that
//     read the follower before the unfollow cannot bring them back. A
//     follow again clears the tombstone in the step that adds the
//     follower. Check and add are one script in the bucket's slot.
//   - The step that ends the migration runs after the copy read the end of
//     the one set, and a write that saw the account migrating wrote the
//     buckets too: nothing is only in the one set when it goes. A write
//     that read the field before that step and writes its bucket after it
//     lands in the buckets, where readers look by then.
//
// The followers side mirrors the following sets, the truth, as before: the
// writer re-reads the truth after writing both places and goes on until
// they agree (see FollowService.mirrorFollow), so that argument holds
// unchanged. Each step stays in one slot: the field and the one set, or a
// bucket and its tombstones.
//
// Readers that hold a position in the one set (a fan-out cursor, a page
// cursor) carry on in the buckets from the same follow time, since the
// buckets keep each follower's follow time: a page merges the buckets'
// pages by time and id (a k-way merge), and fan-out walks the buckets one
// after the other, each from that time on.

// followersLogKeep is how long an entry stays in an account's followers
// log (followersLogKey): far longer than a batch of fan-out takes from its
// read of the log's end to its read of what came after (a batch that took
// longer treats all its followers as suspects, see fanOutRaw).
const followersLogKeep = 10 * time.Minute

// Where an account's followers are, as followerBucketsField says.
const (
	bucketsQueued    = "queued:"
	bucketsMigrating = "migrating:"
)

// opBuckets is the op of a stream entry that moves an account's followers
// into buckets; its author field is the account.
const opBuckets = "buckets"

const (
	// bucketRequeueAfter is how long an account stays queued before a
	// follow queues its migration again: its job was lost (the request
	// that queued it died before the XADD).
	bucketRequeueAfter = 10 * time.Minute
	// tombstoneTTL is how long a bucket's tombstones outlive their last
	// write: far longer than a migration, which is minutes for millions
	// of followers, so that they are gone soon after it.
	tombstoneTTL = 24 * time.Hour
)

// followerState is where a user's followers are, from followerBucketsField.
type followerState struct {
	buckets   int // > 0: in this many buckets; the one set is gone
	migrating int // > 0: being copied into this many buckets; the one set is whole
}

func parseFollowerState(s string) followerState {
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return followerState{buckets: n}
	}
	if rest, ok := strings.CutPrefix(s, bucketsMigrating); ok {
		if n, err := strconv.Atoi(rest); err == nil && n > 0 {
			return followerState{migrating: n}
		}
	}
	return followerState{}
}

// mirrorFollowersScript writes one follower into or out of an account's
// one followers set, unless the followers are in buckets, and answers
// where they are. A follow that takes the set past the threshold marks the
// account queued and answers that the caller is to queue the move; so
// does any write to an account queued longer than bucketRequeueAfter ago.
//
// A write that changes the one set is logged in the same step: the
// follower is appended to the account's followers log, trimmed there to
// the entries of the last followersLogKeep by Redis's own clock (so that
// the clocks of Warble's processes do not matter). A write for an account
// whose followers are in buckets is logged whatever it changes, before the
// bucket's write, a later step: fan-out without a guard walks the one set
// only, but a batch it read there just before the move ended must still
// see a removal made in a bucket after it (see doc.go, "Raw deliveries
// repaired after the fact"). A follow into an empty one set marks the
// account's followers side checked (followersCheckedField): it lists
// nobody yet, so nothing in it can be stale, and every change from now on
// is logged.
//
// KEYS[1] -> w:u:{<followee>}:followers
// KEYS[2] -> w:u:{<followee>} (its followerBuckets and followersChecked fields)
// KEYS[3] -> w:u:{<followee>}:followers-log
// ARGV[1] -> follower id
// ARGV[2] -> followed-at, unix ms; "" to remove the follower
// ARGV[3] -> the bucket threshold; negative for none
// ARGV[4] -> now, unix ms
// ARGV[5] -> bucketRequeueAfter, ms
// ARGV[6] -> followersLogKeep, ms
//
// Returns {the field before the write ("" if none), 1 to queue the move or 0}.
var mirrorFollowersScript = redis.NewScript(`
local function log()
	local t = redis.call('TIME')
	local minID = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[6]))
	redis.call('XADD', KEYS[3], 'MINID', '~', minID, '*', 'f', ARGV[1])
end
local state = redis.call('HGET', KEYS[2], 'followerBuckets') or ''
if string.match(state, '^%d+$') then
	log()
	return {state, 0}
end
local changed
if ARGV[2] == '' then
	changed = redis.call('ZREM', KEYS[1], ARGV[1])
else
	if state == '' and redis.call('EXISTS', KEYS[1]) == 0 then
		redis.call('HSET', KEYS[2], 'followersChecked', ARGV[4])
	end
	changed = redis.call('ZADD', KEYS[1], 'CH', ARGV[2], ARGV[1])
end
if changed > 0 then
	log()
end
local queue = 0
local queuedAt = string.match(state, '^queued:(%d+)$')
if state == '' and ARGV[2] ~= '' and tonumber(ARGV[3]) >= 0 and
		redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[3]) then
	queue = 1
elseif queuedAt and tonumber(ARGV[4]) - tonumber(queuedAt) >= tonumber(ARGV[5]) then
	queue = 1
end
if queue == 1 then
	redis.call('HSET', KEYS[2], 'followerBuckets', 'queued:' .. ARGV[4])
end
return {state, queue}
`)

// mirrorBucketScript writes one follower into or out of their bucket.
// While the account is migrating, a removal leaves a tombstone, so that
// the copy does not bring the follower back (see copyFollowersScript), and
// an add clears it.
//
// KEYS[1] -> w:fb:{<followee>:<b>}
// KEYS[2] -> w:fb:{<followee>:<b>}:gone
// ARGV[1] -> follower id
// ARGV[2] -> followed-at, unix ms; "" to remove the follower
// ARGV[3] -> "1" while the account is migrating, else "0"
// ARGV[4] -> tombstoneTTL, ms
//
// Returns 1.
var mirrorBucketScript = redis.NewScript(`
if ARGV[2] == '' then
	redis.call('ZREM', KEYS[1], ARGV[1])
	if ARGV[3] == '1' then
		redis.call('SADD', KEYS[2], ARGV[1])
		redis.call('PEXPIRE', KEYS[2], ARGV[4])
	end
else
	redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
	redis.call('SREM', KEYS[2], ARGV[1])
end
return 1
`)

// copyFollowersScript copies followers read from the one set into their
// bucket, each unless the bucket holds them already (a follow wrote a
// newer time there) or a tombstone says they unfollowed since.
//
// KEYS[1] -> w:fb:{<followee>:<b>}
// KEYS[2] -> w:fb:{<followee>:<b>}:gone
// ARGV[1..] -> followed-at, follower id, followed-at, follower id, …
//
// Returns how many were added.
var copyFollowersScript = redis.NewScript(`
local added = 0
for i = 1, #ARGV, 2 do
	if redis.call('SISMEMBER', KEYS[2], ARGV[i + 1]) == 0 then
		added = added + redis.call('ZADD', KEYS[1], 'NX', ARGV[i], ARGV[i + 1])
	end
end
return added
`)

// beginBucketsScript starts (or resumes) moving an account's followers
// into buckets: it marks the account migrating, unless it is already. With
// buckets off, it only drops a queued mark.
//
// KEYS[1] -> w:u:{<id>} (its followerBuckets field)
// ARGV[1] -> how many buckets
// ARGV[2] -> "1" if buckets are on, else "0"
//
// Returns the number of buckets to copy into, or 0 if there is nothing to
// do: the followers are in buckets already, or buckets are off.
var beginBucketsScript = redis.NewScript(`
local state = redis.call('HGET', KEYS[1], 'followerBuckets')
if state and string.match(state, '^%d+$') then
	return 0
end
local n = state and string.match(state, '^migrating:(%d+)$')
if n then
	return tonumber(n)
end
if ARGV[2] ~= '1' then
	if state then
		redis.call('HDEL', KEYS[1], 'followerBuckets')
	end
	return 0
end
redis.call('HSET', KEYS[1], 'followerBuckets', 'migrating:' .. ARGV[1])
return tonumber(ARGV[1])
`)

// endBucketsScript ends a move into buckets once the copy is done: it
// marks the account bucketed and deletes the one set (UNLINK: its memory
// is freed off Redis's main thread).
//
// KEYS[1] -> w:u:{<id>} (its followerBuckets field)
// KEYS[2] -> w:u:{<id>}:followers
// ARGV[1] -> how many buckets
//
// Returns 1 if it ended the move, 0 if the account was not migrating into
// that many buckets (another worker ended it).
var endBucketsScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'followerBuckets') ~= 'migrating:' .. ARGV[1] then
	return 0
end
redis.call('HSET', KEYS[1], 'followerBuckets', ARGV[1])
redis.call('UNLINK', KEYS[2])
return 1
`)

// walkFollowersScript reads followers oldest follow first after a keyset
// position (followed-at, member), as fan-out and the move into buckets
// walk them, for walkFollowers when followers tie on the position's time.
// Equal scores are ordered by member bytes, as Redis orders them, so ties
// are neither repeated nor skipped, even when the entry at the position
// was removed since. Given the account's hash as well, it reads the one
// set only while the followers are there.
//
// KEYS[1] -> w:u:{<id>}:followers, or a bucket w:fb:{<id>:<b>}
// KEYS[2] -> w:u:{<id>}, with the one set only (its followerBuckets field)
// ARGV[1] -> how many entries to return
// ARGV[2] -> position's followed-at, or -inf
// ARGV[3] -> position's member; "" to read every entry at ARGV[2] on
//
// Returns {"", member, score, member, score, …}, or {<n>} when the
// followers are in n buckets.
var walkFollowersScript = redis.NewScript(`
if #KEYS > 1 then
	local state = redis.call('HGET', KEYS[2], 'followerBuckets')
	if state and string.match(state, '^%d+$') then
		return {state}
	end
end
local limit = tonumber(ARGV[1])
local out = {''}
local function push(entries)
	for i = 1, #entries, 2 do
		if #out >= 1 + 2 * limit then
			return
		end
		out[#out + 1] = entries[i]
		out[#out + 1] = entries[i + 1]
	end
end
local at, member = ARGV[2], ARGV[3]
if member == '' then
	push(redis.call('ZRANGE', KEYS[1], at, '+inf', 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES'))
	return out
end
local score = redis.call('ZSCORE', KEYS[1], member)
if score and tonumber(score) == tonumber(at) then
	local rank = redis.call('ZRANK', KEYS[1], member)
	push(redis.call('ZRANGE', KEYS[1], rank + 1, rank + limit, 'WITHSCORES'))
	return out
end
-- after(a, b) is the member order of Redis: bytewise, shorter first.
local function after(a, b)
	for i = 1, math.min(#a, #b) do
		local x, y = string.byte(a, i), string.byte(b, i)
		if x ~= y then
			return x > y
		end
	end
	return #a > #b
end
local ties = redis.call('ZRANGE', KEYS[1], at, at, 'BYSCORE', 'WITHSCORES')
for i = 1, #ties, 2 do
	if after(ties[i], member) then
		push({ties[i], ties[i + 1]})
	end
end
local left = limit - (#out - 1) / 2
if left > 0 then
	push(redis.call('ZRANGE', KEYS[1], '(' .. at, '+inf', 'BYSCORE', 'LIMIT', 0, left, 'WITHSCORES'))
end
return out
`)

// probeFollowersScript is ZMSCORE of members in an account's one followers
// set, or, when its followers are in buckets by now, how many buckets.
//
// KEYS[1] -> w:u:{<id>}:followers
// KEYS[2] -> w:u:{<id>} (its followerBuckets field)
// ARGV[1..] -> members
//
// Returns the scores ("-1" for a member not in the set: a Lua false would
// reach a RESP3 client as a boolean), or -<n> when the followers are in n
// buckets.
var probeFollowersScript = redis.NewScript(`
local state = redis.call('HGET', KEYS[2], 'followerBuckets')
if state and string.match(state, '^%d+$') then
	return -tonumber(state)
end
local scores = redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
for i = 1, #ARGV do
	scores[i] = scores[i] or '-1'
end
return scores
`)

// mirrorFollower writes followerID into followeeID's followers (at, the
// follow time as Redis prints it) or out of them (at ""), wherever they
// are kept, and queues the move into buckets when this follow takes the
// account past the threshold. It returns the keys it wrote, for
// awaitReplicas.
func (db *DB) mirrorFollower(ctx context.Context, followerID, followeeID, at string) ([]string, error) {
	keys := []string{followersKey(followeeID), userKey(followeeID), followersLogKey(followeeID)}
	res, err := mirrorFollowersScript.Run(ctx, db.client, keys, followerID, at, db.opts.FollowerBucketThreshold,
		db.now().UnixMilli(), bucketRequeueAfter.Milliseconds(), followersLogKeep.Milliseconds()).Slice()
	if err != nil {
		return nil, err
	}
	state := parseFollowerState(replyString(res[0]))
	if queue, _ := res[1].(int64); queue == 1 {
		if err := db.queueBucketsJob(ctx, followeeID); err != nil {
			// The follow itself is done; a follow after
			// bucketRequeueAfter queues the move again.
			db.log.WarnContext(ctx, "queue moving followers into buckets", "user", followeeID, "err", err)
		}
	}
	written := []string{followersKey(followeeID)}
	n := max(state.buckets, state.migrating)
	if n == 0 {
		return written, nil
	}
	b := followerBucket(followerID, n)
	migrating := "0"
	if state.migrating > 0 {
		migrating = "1"
	}
	keys = []string{followerBucketKey(followeeID, b), followerTombstonesKey(followeeID, b)}
	if err := mirrorBucketScript.Run(ctx, db.client, keys, followerID, at, migrating, tombstoneTTL.Milliseconds()).Err(); err != nil {
		return nil, err
	}
	return append(written, keys[0]), nil
}

// queueBucketsJob queues the job that moves userID's followers into
// buckets, in the fan-out shard of userID's posts.
func (db *DB) queueBucketsJob(ctx context.Context, userID string) error {
	err := db.client.XAdd(ctx, &redis.XAddArgs{
		Stream: fanoutStreamKey(db.fanOutShard(userID)),
		Values: []any{"op", opBuckets, "author", userID},
	}).Err()
	if err != nil {
		return fmt.Errorf("queue follower buckets of %s: %w", userID, err)
	}
	db.log.InfoContext(ctx, "account's followers go into buckets", "user", userID,
		"threshold", db.opts.FollowerBucketThreshold, "buckets", db.opts.FollowerBuckets)
	return nil
}

// moveToBuckets is the job of opBuckets: it copies userID's followers
// from the one set into buckets, batch followers per round trip, starting
// after from and calling save with the position after each batch but the
// last, and then ends the move. Running it again, or two at once, is
// harmless: the copy adds nothing twice, and only one ends the move.
func (db *DB) moveToBuckets(ctx context.Context, userID string, from followerCursor, batch int, save func(followerCursor) error) error {
	on := "0"
	if db.opts.FollowerBucketThreshold >= 0 {
		on = "1"
	}
	n, err := beginBucketsScript.Run(ctx, db.client, []string{userKey(userID)}, db.opts.FollowerBuckets, on).Int()
	if err != nil {
		return fmt.Errorf("begin follower buckets of %s: %w", userID, err)
	} else if n == 0 {
		return nil
	}
	start, copied := time.Now(), 0
	pos := from
	for {
		entries, more, moved, err := db.walkFollowers(ctx, followersKey(userID), userKey(userID), pos.at, pos.member, batch)
		if err != nil {
			return fmt.Errorf("copy followers of %s: %w", userID, err)
		} else if moved > 0 {
			return nil // another worker ended the move
		}
		byBucket := make(map[int][]any)
		for _, e := range entries {
			b := followerBucket(e.member, n)
			byBucket[b] = append(byBucket[b], e.score, e.member)
		}
		err = runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
			for b, args := range byBucket {
				copyFollowersScript.EvalSha(ctx, pipe, []string{followerBucketKey(userID, b), followerTombstonesKey(userID, b)}, args...)
			}
		}, copyFollowersScript)
		if err != nil {
			return fmt.Errorf("copy followers of %s into buckets: %w", userID, err)
		}
		copied += len(entries)
		if !more {
			break
		}
		last := entries[len(entries)-1]
		pos = followerCursor{at: last.score, member: last.member}
		if err := save(pos); err != nil {
			return err
		}
	}
	ended, err := endBucketsScript.Run(ctx, db.client, []string{userKey(userID), followersKey(userID)}, n).Int()
	if err != nil {
		return fmt.Errorf("end follower buckets of %s: %w", userID, err)
	}
	if ended == 1 {
		db.log.InfoContext(ctx, "account's followers are in buckets", "user", userID, "buckets", n,
			"copied", copied, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// walkEntry is a follower read by walkFollowers, with the score as Redis
// takes it back.
type walkEntry struct {
	member, score string
}

// walkFollowers reads up to limit followers from key, oldest follow first,
// after the keyset position (at, member): equal follow times are ordered
// by id bytes, as Redis orders them, so that followers tied on a time are
// neither repeated nor skipped, even when the one at the position left
// since. With member "", the position is before every follower at at or
// later. It reports whether key may hold more after them.
//
// Given userHash, key is the account's one set, and the hash's
// followerBuckets field is read after the range in the same round trip:
// when it says the followers are in buckets, the range may have read the
// set after it was deleted, so walkFollowers returns how many buckets
// instead; when it does not, the range was read before the move ended (the
// two keys share a slot, so a node, which runs the pipeline in order), and
// the set was whole.
//
// It reads with a plain ZRANGE from at on, a little more than limit: fan-out
// reads every follower this way, and a script's reply costs Redis a
// conversion into Lua and back (fan-out to 50,000 followers ran 0.94x as
// fast with walkFollowersScript for every chunk). The range is exact when
// no follower it read ties with the position and sorts before it: then
// what it read is the follower at the position, if still there, and
// those after it. Else, with followers tied on the position's time,
// walkFollowersScript reads the page in one step.
func (db *DB) walkFollowers(ctx context.Context, key, userHash, at, member string, limit int) (entries []walkEntry, more bool, buckets int, err error) {
	return db.walkFollowersLogged(ctx, key, userHash, at, member, limit, nil, false)
}

// walkLog is what a walk of an account's one followers set reads besides
// the followers, for raw deliveries (see fanOutRaw): the followers log's
// last id before the range, and where the followers are kept after it.
type walkLog struct {
	authorID string
	last     string // the log's last id, "0-0" if it is empty
	state    followerState
}

// walkFollowersLogged is walkFollowers, reading also, given log (and
// userHash), the followers log's last id in the same pipeline before the
// range and the account's followerBuckets field after it.
//
// With ends, it reads the followers' scores only where the walk needs
// them, at the two ends of the page: the first (whether it ties with the
// position) and the last (the next position); the entries between come
// back with score "", and so does the last one of a page that ends the
// set (more false), which needs no next position. Redis 7.0 formats every
// score it sends with a "%.17g" printf, which made a ZRANGE of 1,001
// followers WITHSCORES cost it 231 µs against 26 µs without (sixth round
// of fan-out, BENCHMARKS.md): a fifth of its time per raw delivery. The
// three ranges are one MULTI, so that the ends are those of the page.
func (db *DB) walkFollowersLogged(ctx context.Context, key, userHash, at, member string, limit int, log *walkLog, ends bool) (entries []walkEntry, more bool, buckets int, err error) {
	count := limit + 1 // one more, to learn whether there are more
	if member != "" {
		count++ // and the follower at the position, read again unless they left
	}
	pipe := db.client.Pipeline()
	if ends {
		pipe = db.client.TxPipeline()
	}
	var last *redis.XMessageSliceCmd
	if log != nil {
		last = pipe.XRevRangeN(ctx, followersLogKey(log.authorID), "+", "-", 1)
	}
	var rng, head, tail *redis.ZSliceCmd
	var ids *redis.StringSliceCmd
	if ends {
		ids = pipe.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, Start: at, Stop: "+inf", ByScore: true, Count: int64(count)})
		head = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: at, Stop: "+inf", ByScore: true, Count: 1})
		// The page's last entry is at offset limit-1, or limit when the
		// follower at the position is read again and left out.
		tail = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: key, Start: at, Stop: "+inf", ByScore: true, Offset: int64(max(limit-1, 0)), Count: 2,
		})
	} else {
		rng = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: key, Start: at, Stop: "+inf", ByScore: true, Count: int64(count),
		})
	}
	var state *redis.StringCmd
	if userHash != "" {
		state = pipe.HGet(ctx, userHash, followerBucketsField)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, 0, err
	}
	if state != nil {
		if log != nil {
			log.last, log.state = lastLogID(last), parseFollowerState(state.Val())
		}
		if n := parseFollowerState(state.Val()).buckets; n > 0 {
			return nil, false, n, nil
		}
	}
	atScore, _ := strconv.ParseFloat(at, 64) // -inf for "-inf"
	if ends {
		read := ids.Val()
		skip := 0
		if h := head.Val(); member != "" && len(read) > 0 && len(h) == 1 && h[0].Score == atScore {
			// Followers tied on the position's time come first, ordered
			// by id: the first one alone tells whether one sorts before
			// the position, and whether it is the follower at it.
			if read[0] < member {
				return db.walkTiedFollowers(ctx, key, userHash, at, member, limit)
			} else if read[0] == member {
				skip = 1
			}
		}
		entries = make([]walkEntry, len(read)-skip)
		for i := range entries {
			entries[i].member = read[skip+i]
		}
		more = len(entries) > limit
		entries = entries[:min(limit, len(entries))]
		if n := len(entries); n > 0 {
			// The last entry's offset in the range read.
			if j := skip + n - 1 - max(limit-1, 0); j >= 0 && j < len(tail.Val()) && tail.Val()[j].Member == entries[n-1].member {
				entries[n-1].score = formatScore(tail.Val()[j].Score)
			} else if more {
				return nil, false, 0, fmt.Errorf("walk followers: the page's last follower %q is not the one its score was read for", entries[n-1].member)
			}
		}
		return entries, more, 0, nil
	}
	read := rng.Val()
	entries = make([]walkEntry, 0, len(read))
	for _, z := range read {
		f, _ := z.Member.(string)
		if member != "" && z.Score == atScore {
			if f < member {
				return db.walkTiedFollowers(ctx, key, userHash, at, member, limit)
			} else if f == member {
				continue
			}
		}
		entries = append(entries, walkEntry{member: f, score: formatScore(z.Score)})
	}
	more = len(entries) > limit
	return entries[:min(limit, len(entries))], more, 0, nil
}

// lastLogID returns the id that an XREVRANGE … COUNT 1 of a followers log
// answered, "0-0" for an empty log.
func lastLogID(cmd *redis.XMessageSliceCmd) string {
	if msgs := cmd.Val(); len(msgs) > 0 {
		return msgs[0].ID
	}
	return "0-0"
}

// walkTiedFollowers is walkFollowers by walkFollowersScript.
func (db *DB) walkTiedFollowers(ctx context.Context, key, userHash, at, member string, limit int) ([]walkEntry, bool, int, error) {
	keys := []string{key}
	if userHash != "" {
		keys = append(keys, userHash)
	}
	res, err := walkFollowersScript.Run(ctx, db.client, keys, limit+1, at, member).Slice()
	if err != nil {
		return nil, false, 0, err
	} else if len(res) == 0 || len(res)%2 != 1 {
		return nil, false, 0, fmt.Errorf("walk followers: unexpected answer of %d elements", len(res))
	}
	if n := parseFollowerState(replyString(res[0])).buckets; n > 0 {
		return nil, false, n, nil
	}
	entries := make([]walkEntry, 0, len(res)/2)
	for i := 1; i+1 < len(res); i += 2 {
		entries = append(entries, walkEntry{member: replyString(res[i]), score: replyString(res[i+1])})
	}
	more := len(entries) > limit
	return entries[:min(limit, len(entries))], more, 0, nil
}

// followSet is where one follow set is read: a following set, an
// account's one followers set, or its follower buckets.
type followSet struct {
	keys  []string // the one sorted set, or the buckets in order
	owner string   // whose followers these are; "" for a following set
}

func followingSet(userID string) followSet { return followSet{keys: []string{followingKey(userID)}} }

// followersSet is userID's followers in n buckets, or in the one set
// when n is 0.
func followersSet(userID string, n int) followSet {
	if n == 0 {
		return followSet{keys: []string{followersKey(userID)}, owner: userID}
	}
	keys := make([]string, n)
	for b := range keys {
		keys[b] = followerBucketKey(userID, b)
	}
	return followSet{keys: keys, owner: userID}
}

func (f followSet) bucketed() bool { return len(f.keys) > 1 }

// movedError is the answer of a read of an account's one followers set
// that found its followers moved into buckets since the set was chosen.
type movedError struct {
	owner   string
	buckets int
}

func (e *movedError) Error() string {
	return fmt.Sprintf("followers of %s moved into %d buckets", e.owner, e.buckets)
}

// follow moves f to the buckets when err says its followers moved there,
// and reports whether it did: the read that failed is then to be made
// again, from the same position, which means the same in the buckets.
func (f *followSet) follow(err error) bool {
	var moved *movedError
	if errors.As(err, &moved) && moved.owner == f.owner && !f.bucketed() {
		*f = followersSet(f.owner, moved.buckets)
		return true
	}
	return false
}

// queuePage queues on pipe the read of up to limit entries of f, newest
// first, after pos, and returns what reads the answer once pipe has run:
// the set's size and the entries, merged by (followed-at, member)
// descending across buckets, or a movedError. Each bucket answers its own
// newest entries after pos, so the merge's first limit are the set's.
func queuePage(ctx context.Context, pipe redis.Pipeliner, f followSet, pos followPos, limit int) func() (int64, []followEntry, error) {
	at, member := "", ""
	if pos.set {
		at, member = strconv.FormatInt(pos.at, 10), pos.member
	}
	if !f.bucketed() {
		keys := []string{f.keys[0]}
		if f.owner != "" {
			keys = append(keys, userKey(f.owner))
		}
		cmd := followPageScript.EvalSha(ctx, pipe, keys, limit, at, member)
		return func() (int64, []followEntry, error) {
			total, entries, err := parseFollowPage(cmd)
			if err == nil && total < 0 {
				return 0, nil, &movedError{owner: f.owner, buckets: int(-total)}
			}
			return total, entries, err
		}
	}
	cmds := make([]*redis.Cmd, len(f.keys))
	for i, key := range f.keys {
		cmds[i] = followPageScript.EvalSha(ctx, pipe, []string{key}, limit, at, member)
	}
	return func() (int64, []followEntry, error) {
		var total int64
		var all []followEntry
		for _, cmd := range cmds {
			n, entries, err := parseFollowPage(cmd)
			if err != nil {
				return 0, nil, err
			}
			total += n
			all = append(all, entries...)
		}
		slices.SortFunc(all, func(a, b followEntry) int {
			if c := cmp.Compare(b.at, a.at); c != 0 {
				return c
			}
			return strings.Compare(b.member, a.member)
		})
		return total, all[:min(limit, len(all))], nil
	}
}

// queueScores queues on pipe the follow times of members in f, and
// returns what reads them once pipe has run: one per member, -1 for one f
// lacks, or a movedError.
func queueScores(ctx context.Context, pipe redis.Pipeliner, f followSet, members []string) func() ([]int64, error) {
	if !f.bucketed() {
		if f.owner == "" {
			cmd := zmscore(ctx, pipe, f.keys[0], members)
			return func() ([]int64, error) { return parseScores(cmd, len(members)) }
		}
		args := make([]any, len(members))
		for i, m := range members {
			args[i] = m
		}
		cmd := probeFollowersScript.EvalSha(ctx, pipe, []string{f.keys[0], userKey(f.owner)}, args...)
		return func() ([]int64, error) {
			if n, err := cmd.Int64(); err == nil {
				return nil, &movedError{owner: f.owner, buckets: int(-n)}
			}
			return parseScores(cmd, len(members))
		}
	}
	byBucket := make(map[int][]int) // bucket -> indexes into members
	for i, m := range members {
		b := followerBucket(m, len(f.keys))
		byBucket[b] = append(byBucket[b], i)
	}
	type probe struct {
		indexes []int
		cmd     *redis.Cmd
	}
	probes := make([]probe, 0, len(byBucket))
	for b, indexes := range byBucket {
		names := make([]string, len(indexes))
		for j, i := range indexes {
			names[j] = members[i]
		}
		probes = append(probes, probe{indexes: indexes, cmd: zmscore(ctx, pipe, f.keys[b], names)})
	}
	return func() ([]int64, error) {
		scores := make([]int64, len(members))
		for _, p := range probes {
			got, err := parseScores(p.cmd, len(p.indexes))
			if err != nil {
				return nil, err
			}
			for j, i := range p.indexes {
				scores[i] = got[j]
			}
		}
		return scores, nil
	}
}

// followSetRef names a follow set: a user's followers, or whom they follow.
type followSetRef struct {
	userID    string
	followers bool
}

// resolveSets returns where each set is kept and how many members it has,
// in one round trip, and a second only for followers in buckets.
func (db *DB) resolveSets(ctx context.Context, refs ...followSetRef) ([]followSet, []int64, error) {
	sets := make([]followSet, len(refs))
	counts := make([]int64, len(refs))
	cards := make([]*redis.IntCmd, len(refs))
	states := make([]*redis.StringCmd, len(refs))
	pipe := db.client.Pipeline()
	for i, r := range refs {
		if !r.followers {
			sets[i] = followingSet(r.userID)
			cards[i] = pipe.ZCard(ctx, followingKey(r.userID))
			continue
		}
		// The count first, then the field: a count read after the one
		// set was deleted comes with a field that says so.
		cards[i] = pipe.ZCard(ctx, followersKey(r.userID))
		states[i] = pipe.HGet(ctx, userKey(r.userID), followerBucketsField)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, err
	}
	var bucketCards [][]*redis.IntCmd
	pipe = db.client.Pipeline()
	for i, r := range refs {
		counts[i] = cards[i].Val()
		if states[i] == nil {
			continue
		}
		sets[i] = followersSet(r.userID, parseFollowerState(states[i].Val()).buckets)
		if sets[i].bucketed() {
			cmds := make([]*redis.IntCmd, len(sets[i].keys))
			for b, key := range sets[i].keys {
				cmds[b] = pipe.ZCard(ctx, key)
			}
			bucketCards = append(bucketCards, cmds)
		}
	}
	if pipe.Len() == 0 {
		return sets, counts, nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, err
	}
	for i := range refs {
		if !sets[i].bucketed() {
			continue
		}
		counts[i] = 0
		for _, c := range bucketCards[0] {
			counts[i] += c.Val()
		}
		bucketCards = bucketCards[1:]
	}
	return sets, counts, nil
}

// countFollowers returns how many followers userID has, wherever they are.
func (db *DB) countFollowers(ctx context.Context, userID string) (int64, error) {
	_, counts, err := db.resolveSets(ctx, followSetRef{userID: userID, followers: true})
	if err != nil {
		return 0, fmt.Errorf("count followers of %s: %w", userID, err)
	}
	return counts[0], nil
}
