package redisdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// Moving posts to the archive.
//
// With an archive (Options.Archive), an author keeps their newest
// Options.PostsInRedis posts in Redis, and none older than
// Options.PostsInRedisFor; the rest move to the archive, in batches, by the
// fan-out workers (Worker, with WorkerOptions.Move), never on a request's
// path. Which authors have posts to move is kept in a due index per
// fan-out shard (archiveDueKey): CreatePost adds its author, due now when
// they are past the count, else due when their post comes of age; a mover
// takes an author whose time has come, leasing them (their score becomes
// the end of the lease, so that other movers leave them alone and take
// them again should this one die), moves what is due, and sets their next
// time or drops them.
//
// A post moves only once its fan-out job has delivered it: CreatePost
// marks its hash (fanOutPendingField) in the step that stores it and
// records its job, and the job clears the mark after its last batch (see
// fanOut). A job that found its post's hash gone took it for deleted, so
// a post moved before its job ran left the global timeline and reached no
// follower. A mover therefore moves an author's oldest posts up to the
// first one still marked and keeps that one and every newer one, so that
// Redis still holds an author's newest posts and the archive the older
// ones, with no gap between (user pages read them so); the author is due
// again moveWaitRetry later, for at most moveWaitMax after the post was
// made. moveScript refuses a marked post and every post after it, too. Posts from before the mark have none and move as
// they did. A job that runs again after the mover took its post, as when
// its worker died after the mark was cleared, tells the move from a
// delete by the archive (deletedPost).
//
// A move of a batch, and why it loses and duplicates nothing whenever a
// process dies:
//
//  1. moveLockScript takes the author's moving lock (movingKey, with a
//     lease: one mover per author at a time) and reads the ids of their
//     oldest posts; a pipeline reads those posts.
//  2. The posts due are upserted in the archive, and committed.
//  3. moveScript, in the author's slot, removes from Redis the posts that
//     are still there as they were read (a post key is never reused: seqs
//     come from one INCR), and adds them to the author's archived count in
//     the same step, so postsCount (posts set plus that count) never
//     changes.
//
// A death after 3 leaves each post in the archive alone. A death before 3
// leaves every post in Redis, and perhaps a row too. The author is still
// in the due index (with the dead mover's lease, which runs out), so
// another mover takes them, and that one knows how far the dead one may
// have written: step 1 records, in the author's hash (movingUpTo), the
// highest seq a move may write, and only a move that ends clears it. The
// next mover rewrites the rows of the posts it moves, and deletes the rows
// of the posts up to that seq that it keeps in Redis (deletes of older
// posts since may have made them not due any more): every post in Redis
// up to that seq is among the oldest it reads. A reader finds a post
// throughout: in Redis until 3, in the archive from 2 on. What this does
// not cover is a mover that stalls, alive, for longer than its lease
// between 1 and 3 while another takes the author over and ends: its late
// rows may then outlive a delete. The lease (Options.MoveLease, five
// minutes) is far longer than a batch takes, and 3 refuses to run for a
// mover that lost its lock.
//
// Deletes: deletePostScript, while a move of the author's posts has not
// ended (the lock is held, or movingUpTo is there), adds the id to the
// author's archiveGoneKey, since a mover may have read the post before it
// was deleted and be writing its row, or have died after writing it; the
// mover deletes the rows of those ids after 3 and only then forgets them
// (forgetting sooner would let a live mover's late write stand).
// DeletePost deletes such a post's row at once too, for readers.
// A post already archived is deleted by deleteArchivedScript (off the
// author's timelines, its id into archiveGoneKey, the count down by one,
// once however often it is retried) and then its row; a process that dies
// in between leaves the id for the mover, which the author is due for.

// moveBatchesPerClaim bounds the work on one author per claim, so that one
// author with a long history does not hold a worker from fan-out jobs;
// past it the author is due again at once. A claim, like the moving lock,
// lasts Options.MoveLease.
const moveBatchesPerClaim = 10

// moveWaitRetry is how soon an author is due again when a post of theirs
// that is due waits for its fan-out job.
const moveWaitRetry = time.Second

// moveWaitMax is how long a mover waits for a post's fan-out job: a mark
// older than that is taken for one its job will never clear (a worker of a
// version before the mark ran the job, during a rolling upgrade), and the
// post moves. Its job, should it run after all, finds it in the archive
// (deletedPost), at the cost of an archive read per batch.
const moveWaitMax = 10 * time.Minute

// moveBatchTimeout bounds one batch of a move once it has the author's
// lock, whatever its worker's context says.
const moveBatchTimeout = 30 * time.Second

// claimDueScript leases the first due author of a shard to a mover.
//
// KEYS[1] -> w:{fanout...}:archive:due
// ARGV[1] -> now, unix ms
// ARGV[2] -> the end of the lease, unix ms
//
// Returns the author's id, or nil when no author is due.
var claimDueScript = redis.NewScript(`
local a = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)[1]
if not a then
	return false
end
redis.call('ZADD', KEYS[1], ARGV[2], a)
return a
`)

// releaseDueScript ends a mover's lease of an author: it sets when the
// author is due next, or drops them, unless their entry changed since the
// claim (a new post made them due sooner), which then stands.
//
// KEYS[1] -> w:{fanout...}:archive:due
// ARGV[1] -> author id
// ARGV[2] -> the end of the lease the claim set, unix ms
// ARGV[3] -> when the author is due next, unix ms, or "" for never
//
// Returns 1 if the entry was changed, 0 if not.
var releaseDueScript = redis.NewScript(`
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
	return 0
end
if ARGV[3] == '' then
	redis.call('ZREM', KEYS[1], ARGV[1])
else
	redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
`)

// moveLockScript takes an author's moving lock, reads the ids of their
// oldest posts, and records the highest seq among them in movingUpTo (or
// keeps a higher one left by a move that did not end).
//
// KEYS[1] -> w:u:{<author>}:posts
// KEYS[2] -> w:u:{<author>}:moving
// KEYS[3] -> w:u:{<author>}     (the user hash)
// ARGV[1] -> the mover's token
// ARGV[2] -> the lock's lease, ms
// ARGV[3] -> how many ids to read
//
// Returns {posts in Redis, {ids, oldest first}, the movingUpTo a move that
// did not end left, or "0"}, or {-1, lease left in ms} if another mover
// holds the lock.
var moveLockScript = redis.NewScript(`
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return {-1, redis.call('PTTL', KEYS[2])}
end
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)
local left = redis.call('HGET', KEYS[3], 'movingUpTo')
local high = left
if #ids > 0 then
	local last = string.match(ids[#ids], ':(%d+)$')
	if last and (not high or tonumber(last) > tonumber(high)) then
		high = last
	end
end
if high then
	redis.call('HSET', KEYS[3], 'movingUpTo', high)
end
return {redis.call('ZCARD', KEYS[1]), ids, left or '0'}
`)

// moveScript removes from Redis the posts a mover has written to the
// archive, those still there as they were read, and counts them as
// archived. It stops at a post that awaits its fan-out (read unmarked, so
// never in practice: the mark is set only with the post), so that what it
// leaves in Redis is still the author's newest posts. If no deleted post awaits the mover (archiveGoneKey), the move
// ends: it clears movingUpTo and lets the author go.
//
// KEYS[1] -> w:u:{<author>}:posts
// KEYS[2] -> w:u:{<author>}:     (the user hash)
// KEYS[3] -> w:u:{<author>}:moving
// KEYS[4] -> w:u:{<author>}:archive:gone
// KEYS[5...] -> w:u:{<author>}:p:<seq>, one per post
// ARGV[1] -> the mover's token
// ARGV[2k], ARGV[2k+1] -> the id and createdAt (unix ms) of KEYS[4+k]'s post
//
// Returns {posts removed, {ids of deleted posts whose rows to delete}}, or
// {-1, {}} if the mover no longer holds the lock, and then removes nothing.
var moveScript = redis.NewScript(`
if redis.call('GET', KEYS[3]) ~= ARGV[1] then
	return {-1, {}}
end
local moved = 0
for i = 5, #KEYS do
	local j = 2 * (i - 4)
	local post = redis.call('HMGET', KEYS[i], 'createdAt', 'fanout')
	if post[2] then
		break
	end
	if post[1] == ARGV[j + 1] then
		redis.call('DEL', KEYS[i])
		redis.call('ZREM', KEYS[1], ARGV[j])
		moved = moved + 1
	end
end
if moved > 0 then
	redis.call('HINCRBY', KEYS[2], 'archivedPosts', moved)
end
local gone = redis.call('SMEMBERS', KEYS[4])
if #gone == 0 then
	redis.call('HDEL', KEYS[2], 'movingUpTo')
	redis.call('DEL', KEYS[3])
end
return {moved, gone}
`)

// forgetGoneScript forgets deleted posts whose rows the archive no longer
// holds, and, for a move that ends, clears movingUpTo and lets the author
// go if the mover still holds them.
//
// KEYS[1] -> w:u:{<author>}:archive:gone
// KEYS[2] -> w:u:{<author>}:moving
// KEYS[3] -> w:u:{<author>}     (the user hash)
// ARGV[1] -> the mover's token, or "" for none
// ARGV[2] -> "end" if the move ends, "" if it failed (its rows may be
//
//	written; movingUpTo stays for the next mover)
//
// ARGV[3...] -> post ids
//
// Returns 1.
var forgetGoneScript = redis.NewScript(`
for i = 3, #ARGV do
	redis.call('SREM', KEYS[1], ARGV[i])
end
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) == ARGV[1] then
	if ARGV[2] == 'end' then
		redis.call('HDEL', KEYS[3], 'movingUpTo')
	end
	redis.call('DEL', KEYS[2])
end
return 1
`)

// deleteArchivedScript deletes an archived post from Redis's side: it
// takes the post off its author's own timelines and out of their count,
// and notes its id for its row to be deleted (archiveGoneKey), once: a
// retry finds the id noted and changes nothing. It records the fan-out
// job in the outbox as deletePostScript does.
//
// KEYS[1] -> w:u:{<author>}     (the user hash)
// KEYS[2] -> w:u:{<author>}:archive:gone
// KEYS[3] -> w:u:{<author>}:home
// KEYS[4] -> w:u:{<author>}:outbox
// ARGV[1] -> post id
// ARGV[2] -> the author's user channel
// ARGV[3] -> the author's home channel
// ARGV[4] -> the removed message for both channels
// ARGV[5] -> the outbox entry of the fan-out job, or "" for none
// ARGV[6] -> now, unix ms
// ARGV[7] -> postsGoneChannel
//
// Returns 1 if this call deleted the post, 0 if an earlier one had.
var deleteArchivedScript = newPubScript(broadcastGoneLua + `
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
	return 0
end
if ARGV[5] ~= '' then
	redis.call('ZADD', KEYS[4], ARGV[6], ARGV[5])
end
redis.call('HINCRBY', KEYS[1], 'archivedPosts', -1)
redis.call('PUBLISH', ARGV[2], ARGV[4])
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
	redis.call('PUBLISH', ARGV[3], ARGV[4])
end
broadcastGone(ARGV[7], ARGV[1])
return 1
`)

// dueAfterPost returns when a new post makes its author due for the
// mover, given how many posts they hold in Redis with it, as unix ms; 0
// for not due.
func (db *DB) dueAfterPost(postsInRedis int64, createdAt time.Time) int64 {
	switch {
	case db.opts.Archive == nil:
		return 0
	case postsInRedis > int64(db.opts.PostsInRedis):
		return createdAt.UnixMilli()
	case db.opts.PostsInRedisFor > 0:
		return createdAt.Add(db.opts.PostsInRedisFor).UnixMilli()
	}
	return 0
}

// markDue queues on pipe the command that makes authorID due at at (unix
// ms) unless they are due sooner already.
func (db *DB) markDue(ctx context.Context, pipe redis.Cmdable, authorID string, at int64) *redis.IntCmd {
	return pipe.ZAddArgs(ctx, archiveDueKey(db.fanOutShard(authorID)), redis.ZAddArgs{
		LT: true, Members: []redis.Z{{Score: float64(at), Member: authorID}},
	})
}

// moveDue moves the posts due of at most one author, the first due in the
// shards from first on. It returns how many posts it moved and whether it
// found an author.
func (db *DB) moveDue(ctx context.Context, first int) (int, bool, error) {
	shards := max(1, db.opts.FanOutShards)
	for i := range shards {
		shard := (first + i) % shards
		now := db.opts.Now().UnixMilli()
		lease := now + db.opts.MoveLease.Milliseconds()
		authorID, err := claimDueScript.Run(ctx, db.client, []string{archiveDueKey(shard)}, now, lease).Text()
		if errors.Is(err, redis.Nil) {
			continue
		} else if err != nil {
			return 0, false, fmt.Errorf("claim an author due for the archive: %w", err)
		}
		if !warble.ValidUserID(authorID) {
			// Nothing Warble wrote: drop it rather than trip on it forever.
			db.client.ZRem(ctx, archiveDueKey(shard), authorID)
			continue
		}
		moved, next, err := db.moveAuthor(ctx, authorID)
		if err != nil {
			// The lease runs out and a mover tries again then.
			return moved, true, err
		}
		nextArg := ""
		if next > 0 {
			nextArg = strconv.FormatInt(next, 10)
		}
		if err := releaseDueScript.Run(ctx, db.client, []string{archiveDueKey(shard)}, authorID, lease, nextArg).Err(); err != nil {
			return moved, true, fmt.Errorf("release author %s for the archive: %w", authorID, err)
		}
		return moved, true, nil
	}
	return 0, false, nil
}

// moveAuthor moves an author's posts that are due, a batch at a time, up
// to moveBatchesPerClaim batches. It returns how many posts it moved and
// when the author is due next (unix ms, 0 for not at all).
func (db *DB) moveAuthor(ctx context.Context, authorID string) (int, int64, error) {
	token := strconv.FormatUint(rand.Uint64(), 36)
	total := 0
	for range moveBatchesPerClaim {
		r, err := db.moveBatch(ctx, authorID, token)
		total += r.moved
		if err != nil || !r.more {
			return total, r.nextDue, err
		}
	}
	return total, db.opts.Now().UnixMilli(), nil
}

// moveResult is what one batch of a move did.
type moveResult struct {
	moved   int   // posts taken out of Redis
	more    bool  // more posts of the author are due now
	nextDue int64 // when the author is due next, unix ms; 0 for never
}

// moveBatch moves one batch of an author's posts: see the top of this
// file for its steps.
func (db *DB) moveBatch(ctx context.Context, authorID, token string) (moveResult, error) {
	now := db.opts.Now()
	batch := db.opts.MoveBatch
	res, err := moveLockScript.Run(ctx, db.client, []string{postsKey(authorID), movingKey(authorID), userKey(authorID)},
		token, db.opts.MoveLease.Milliseconds(), batch).Slice()
	if err != nil {
		return moveResult{}, fmt.Errorf("move posts of %s: lock: %w", authorID, err)
	}
	count, _ := res[0].(int64)
	if count < 0 {
		left, _ := res[1].(int64)
		return moveResult{nextDue: now.UnixMilli() + max(left, 1000)}, nil
	}
	ids := toStrings(res[1])
	left, _ := strconv.ParseInt(fmt.Sprint(res[2]), 10, 64) // how far a dead mover may have written

	// A batch that has begun ends, even when its worker is being stopped:
	// a batch cut short leaves the author to the next mover after the
	// lease. It is short, but the archive may hang: it gets this long.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moveBatchTimeout)
	defer cancel()

	// The posts, read after the lock: a delete from now on leaves its id
	// for this mover.
	pipe := db.client.Pipeline()
	fields := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		_, seq, ok := splitPostID(id)
		if !ok {
			continue
		}
		fields[i] = pipe.HMGet(ctx, postKey(authorID, seq), "body", "createdAt", fanOutPendingField)
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			db.unlockMove(ctx, authorID, token)
			return moveResult{}, fmt.Errorf("move posts of %s: read: %w", authorID, err)
		}
	}
	over := int(count) - db.opts.PostsInRedis
	var cutoff int64 // posts created before it are due by age
	if db.opts.PostsInRedisFor > 0 {
		cutoff = now.Add(-db.opts.PostsInRedisFor).UnixMilli()
	}
	var posts []*warble.Post
	var createdAts []string
	var keptAt int64     // createdAt of the oldest post kept, unix ms; 0 if none
	var waiting bool     // a post due waits for its fan-out, and so do the newer ones
	var orphans []string // posts kept in Redis that a dead mover may have written
	var stale []string   // marks older than moveWaitMax on posts that move
	waitFrom := now.Add(-moveWaitMax).UnixMilli()
	for i, id := range ids {
		if fields[i] == nil {
			continue
		}
		vals := fields[i].Val()
		body, ok1 := vals[0].(string)
		at, ok2 := vals[1].(string)
		if !ok1 || !ok2 {
			continue // deleted since its id was read
		}
		ms, _ := strconv.ParseInt(at, 10, 64)
		seq, _ := postSeq(id)
		due := i < over || ms < cutoff
		pending := vals[2] != nil && ms >= waitFrom
		if keptAt > 0 || !due || pending {
			if keptAt == 0 {
				keptAt, waiting = ms, due
			}
			if seq > left {
				break
			}
			orphans = append(orphans, id)
			continue
		}
		if vals[2] != nil {
			stale = append(stale, postKey(authorID, strconv.FormatInt(seq, 10)))
		}
		posts = append(posts, &warble.Post{ID: id, AuthorID: authorID, Body: body, CreatedAt: time.UnixMilli(ms).UTC(), Seq: seq})
		createdAts = append(createdAts, at)
	}
	db.moveStage("read")

	if len(orphans) > 0 {
		// They stay in Redis, so a row of theirs is one too many.
		if err := db.opts.Archive.DeletePosts(ctx, orphans); err != nil {
			db.unlockMove(ctx, authorID, token)
			return moveResult{}, fmt.Errorf("move posts of %s: delete the rows a dead mover left: %w", authorID, err)
		}
	}

	if len(posts) > 0 {
		if err := db.opts.Archive.SavePosts(ctx, posts); err != nil {
			db.unlockMove(ctx, authorID, token)
			return moveResult{}, fmt.Errorf("move posts of %s: %w", authorID, err)
		}
	}
	db.moveStage("saved")

	if len(stale) > 0 {
		// moveScript stops at a mark. Only CreatePost sets one, so none
		// comes back once cleared.
		pipe := db.client.Pipeline()
		for _, key := range stale {
			pipe.HDel(ctx, key, fanOutPendingField)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			db.unlockMove(ctx, authorID, token)
			return moveResult{}, fmt.Errorf("move posts of %s: clear stale fan-out marks: %w", authorID, err)
		}
	}
	keys := []string{postsKey(authorID), userKey(authorID), movingKey(authorID), archiveGoneKey(authorID)}
	args := []any{token}
	for i, p := range posts {
		_, seq, _ := splitPostID(p.ID)
		keys = append(keys, postKey(authorID, seq))
		args = append(args, p.ID, createdAts[i])
	}
	res, err = moveScript.Run(ctx, db.client, keys, args...).Slice()
	if err != nil {
		// The lock's lease runs out; the rows written are written again
		// by the next move.
		return moveResult{}, fmt.Errorf("move posts of %s: remove from Redis: %w", authorID, err)
	}
	moved, _ := res[0].(int64)
	if moved < 0 {
		db.log.WarnContext(ctx, "a move outlived its lease; another mover took the author over", "author", authorID)
		return moveResult{nextDue: now.UnixMilli()}, nil
	}
	if db.opts.Moved != nil && moved > 0 {
		db.opts.Moved(int(moved))
	}
	if moved > 0 {
		db.untail(ctx, posts)
	}
	db.moveStage("moved")
	if gone := toStrings(res[1]); len(gone) > 0 {
		if err := db.forgetGone(ctx, authorID, token, gone); err != nil {
			return moveResult{moved: int(moved)}, err
		}
	}

	r := moveResult{moved: int(moved)}
	switch {
	case waiting:
		// Its job may be behind a backlog: the author is due again soon,
		// not at once.
		r.nextDue = now.Add(moveWaitRetry).UnixMilli()
	case len(posts) > 0 && len(posts) == len(ids) && len(ids) == batch:
		// The whole batch was due: the next one may be too.
		r.more, r.nextDue = true, now.UnixMilli()
	case over > len(posts):
		r.more, r.nextDue = true, now.UnixMilli()
	case keptAt > 0 && cutoff > 0:
		r.nextDue = time.UnixMilli(keptAt).Add(db.opts.PostsInRedisFor).UnixMilli()
	}
	return r, nil
}

// forgetGone deletes the rows of deleted posts and then forgets their ids,
// letting the author go if token (a mover's, or "") still holds them.
// Once the rows are gone, their deletes are announced again to the post
// caches: their scripts announced them before, while a read could still
// find the posts in the archive (see announceGone).
func (db *DB) forgetGone(ctx context.Context, authorID, token string, ids []string) error {
	if err := db.opts.Archive.DeletePosts(ctx, ids); err != nil {
		db.unlockMove(ctx, authorID, token)
		return fmt.Errorf("delete the archived rows of %d deleted posts of %s: %w", len(ids), authorID, err)
	}
	for _, id := range ids {
		db.announceGone(ctx, id)
	}
	end := ""
	if token != "" {
		end = "end"
	}
	args := []any{token, end}
	for _, id := range ids {
		args = append(args, id)
	}
	if err := forgetGoneScript.Run(ctx, db.client, []string{archiveGoneKey(authorID), movingKey(authorID), userKey(authorID)}, args...).Err(); err != nil {
		return fmt.Errorf("forget %d deleted posts of %s: %w", len(ids), authorID, err)
	}
	return nil
}

// unlockMove lets an author go after a failed move, so that the next
// mover need not wait for the lock's lease. Should this fail too, the
// lease ends it.
func (db *DB) unlockMove(ctx context.Context, authorID, token string) {
	forgetGoneScript.Run(context.WithoutCancel(ctx), db.client, []string{archiveGoneKey(authorID), movingKey(authorID), userKey(authorID)}, token, "")
}

// moveStage calls the test hook between the steps of a move.
func (db *DB) moveStage(stage string) {
	if db.moveHook != nil {
		db.moveHook(stage)
	}
}

// deleteArchived deletes a post of authorID's that is in the archive and
// not in Redis: ENOTFOUND if it is in neither.
func (s *PostService) deleteArchived(ctx context.Context, authorID, postID string, seq int64) error {
	archive := s.db.opts.Archive
	if archive == nil {
		return errPostNotFound
	}
	found, err := archive.PostsByIDs(ctx, []string{postID})
	if err != nil {
		return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
	} else if found[postID] == nil {
		return errPostNotFound
	}
	// The author is due, so that a mover deletes the row should this
	// process die before it does.
	if err := s.db.markDue(ctx, s.db.client, authorID, s.db.now().UnixMilli()).Err(); err != nil {
		return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
	}
	job := ""
	if s.db.opts.AsyncFanOut {
		job = outboxEntry(opUndeliver, postID)
		if err := s.db.indexJob(ctx, opUndeliver, postID); err != nil {
			return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
		}
	}
	err = s.db.pub(deleteArchivedScript).Run(ctx, s.db.client,
		[]string{userKey(authorID), archiveGoneKey(authorID), homeKey(authorID), outboxKey(authorID)},
		postID, userChannel(authorID), homeChannel(authorID), encodeRemoved(seq, postID), job, msString(s.db.now()), postsGoneChannel).Err()
	if err != nil {
		return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
	}
	s.db.cache.drop(postID)
	ctx = context.WithoutCancel(ctx)
	// The script announced the delete, crash or not; forgetGone announces
	// it once more when the row is gone, for a read that found the post
	// in the archive in between.
	if err := s.db.forgetGone(ctx, authorID, "", []string{postID}); err != nil {
		s.db.log.WarnContext(ctx, "delete an archived post's row; a mover will", "post", postID, "err", err)
	}
	s.afterDelete(ctx, authorID, seq, postID)
	return nil
}

// archived reports whether the archive holds postID.
func (db *DB) archived(ctx context.Context, postID string) (bool, error) {
	if db.opts.Archive == nil {
		return false, nil
	}
	found, err := db.opts.Archive.PostsByIDs(ctx, []string{postID})
	return found[postID] != nil, err
}

// ArchiveStats returns how many authors are due for a move now, and how
// long the one due longest has waited past their time: zero when the
// movers keep up. An author a mover holds is not due until its lease ends.
func (db *DB) ArchiveStats(ctx context.Context) (int64, time.Duration, error) {
	if db.opts.Archive == nil {
		return 0, 0, nil
	}
	shards := max(1, db.opts.FanOutShards)
	now := db.opts.Now().UnixMilli()
	nowArg := strconv.FormatInt(now, 10)
	pipe := db.client.Pipeline()
	due := make([]*redis.IntCmd, shards)
	oldest := make([]*redis.ZSliceCmd, shards)
	for i := range shards {
		due[i] = pipe.ZCount(ctx, archiveDueKey(i), "-inf", nowArg)
		oldest[i] = pipe.ZRangeWithScores(ctx, archiveDueKey(i), 0, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("archive stats: %w", err)
	}
	var n, lag int64
	for i := range shards {
		n += due[i].Val()
		if z := oldest[i].Val(); len(z) == 1 {
			lag = max(lag, now-int64(z[0].Score))
		}
	}
	return n, time.Duration(lag) * time.Millisecond, nil
}

// backfillArchiveDue adds to the due index every author who holds posts in
// Redis, as CreatePost would have: the posts of a Warble from before its
// archive. It runs at a mover's first pass, once per database, as
// backfillOutboxIndex does (see there), and writes archiveBackfillKey.
func (db *DB) backfillArchiveDue(ctx context.Context) error {
	if n, err := db.client.Exists(ctx, archiveBackfillKey).Result(); err != nil {
		return fmt.Errorf("backfill the archive's due index: %w", err)
	} else if n == 1 {
		return nil
	}
	keys, _, err := db.scanEveryMaster(ctx, prefix+"u:{*}:posts")
	if err != nil {
		return fmt.Errorf("backfill the archive's due index: %w", err)
	}
	authors := make([]string, len(keys))
	for i, key := range keys {
		authors[i] = key[strings.Index(key, "{")+1 : strings.Index(key, "}")]
	}
	for start := 0; start < len(authors); start += sweepCount {
		chunk := authors[start:min(start+sweepCount, len(authors))]
		pipe := db.client.Pipeline()
		counts := make([]*redis.IntCmd, len(chunk))
		oldest := make([]*redis.StringSliceCmd, len(chunk))
		for i, a := range chunk {
			counts[i] = pipe.ZCard(ctx, postsKey(a))
			oldest[i] = pipe.ZRange(ctx, postsKey(a), 0, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("backfill the archive's due index: %w", err)
		}
		pipe = db.client.Pipeline()
		ats := make([]*redis.StringCmd, len(chunk))
		for i, a := range chunk {
			if ids := oldest[i].Val(); len(ids) == 1 {
				if _, seq, ok := splitPostID(ids[0]); ok {
					ats[i] = pipe.HGet(ctx, postKey(a, seq), "createdAt")
				}
			}
		}
		if pipe.Len() > 0 {
			pipe.Exec(ctx) // a post deleted meanwhile answers nil
		}
		pipe = db.client.Pipeline()
		for i, a := range chunk {
			if ats[i] == nil || ats[i].Err() != nil {
				continue
			}
			at := msTime(ats[i].Val())
			if due := db.dueAfterPost(counts[i].Val(), at); due > 0 {
				db.markDue(ctx, pipe, a, due)
			}
		}
		if pipe.Len() > 0 {
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("backfill the archive's due index: %w", err)
			}
		}
	}
	if len(authors) == 0 {
		return nil // an empty database: nothing written, as backfillOutboxIndex
	}
	return db.client.Set(ctx, archiveBackfillKey, db.opts.Now().UnixMilli(), 0).Err()
}

// toStrings returns the strings of a script's array reply.
func toStrings(v any) []string {
	items, _ := v.([]any)
	out := make([]string, 0, len(items))
	for _, item := range items {
		if s, ok := item.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
