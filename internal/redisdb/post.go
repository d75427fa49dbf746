package redisdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// PostService implements warble.PostService.
//
// A post is a hash in its author's hash slot, and its id sits in sorted sets
// scored by its seq: the author's posts and home timeline (one atomic step,
// so the author reads their own write at once), the global timeline, and the
// followers' home timelines (fan-out by workers, see fanout.go).
type PostService struct{ db *DB }

// NewPostService returns a PostService over db.
func NewPostService(db *DB) *PostService { return &PostService{db: db} }

var _ warble.PostService = (*PostService)(nil)

var errPostNotFound = warble.Errorf(warble.ENOTFOUND, "Post not found.")

// storePostLua defines storePost(post, posts, home, seq, id, body,
// createdAt, homeCap, userChannel, homeChannel, msg, job), which stores a
// post and puts it on its author's own timelines, then announces it there,
// and returns how many posts the author has in Redis now, which tells
// whether they are due for the archive's mover (see mover.go). With job
// (a fan-out job is recorded in the same step) the post is marked as
// awaiting its fan-out (fanOutPendingField), which keeps the mover from
// taking it to the archive before its job has delivered it. Both forms of
// CreatePost's atomic step run it: createPostScript and, on one Redis,
// createPostOneRedisScript.
const storePostLua = `
local function storePost(post, posts, home, seq, id, body, createdAt, homeCap, userChannel, homeChannel, msg, job)
	if job then
		redis.call('HSET', post, 'body', body, 'createdAt', createdAt, 'fanout', '1')
	else
		redis.call('HSET', post, 'body', body, 'createdAt', createdAt)
	end
	redis.call('ZADD', posts, seq, id)
	addCapped(home, homeCap, seq, id)
	redis.call('PUBLISH', userChannel, msg)
	redis.call('PUBLISH', homeChannel, msg)
	return redis.call('ZCARD', posts)
end
`

// createPostScript stores a post and puts it on its author's own timelines,
// then announces it there. The author's keys share a slot, so this is one
// atomic step and the author never sees a half-written post. It is the
// atomic step of CreatePost on a Redis Cluster.
//
// With a fan-out job to queue (ARGV[9]), it also records the job in the
// author's outbox, so that the job is queued even if this process dies
// before it queues it (see queue.go).
//
// KEYS[1] -> w:u:{<author>}:p:<seq>
// KEYS[2] -> w:u:{<author>}:posts
// KEYS[3] -> w:u:{<author>}:home
// KEYS[4] -> w:u:{<author>}:outbox
// ARGV[1] -> post seq
// ARGV[2] -> post id
// ARGV[3] -> body
// ARGV[4] -> created-at, unix ms
// ARGV[5] -> home timeline cap
// ARGV[6] -> the author's user channel
// ARGV[7] -> the author's home channel
// ARGV[8] -> the added message for both channels
// ARGV[9] -> the outbox entry of the fan-out job, or "" for none
//
// Returns how many posts the author has in Redis now.
var createPostScript = newPubScript(addCappedLua + storePostLua + `
if ARGV[9] ~= '' then
	redis.call('ZADD', KEYS[4], ARGV[4], ARGV[9])
end
return storePost(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8], ARGV[9] ~= '')
`)

// createPostOneRedisScript is the whole of CreatePost's writes on one
// Redis, where a script may touch every key it declares whatever their
// slots: it queues the post's fan-out job (XADD) and stores the post as
// createPostScript does, in one atomic step, so that the job is recorded
// with the post without an outbox (either both are written or neither
// is: the XADD, which only a key of another type could fail, comes
// first). Then, as the chain does after its promise, it puts the post on
// the global timeline (listGlobalLua) and makes the author due for the
// archive's mover when the post does; a failure of either is caught and
// answered rather than failing the script, since the post is stored by
// then. The job says (listed) that this step lists the post, and its
// worker then leaves the global timeline alone: the listing is in the
// same atomic step as the job, so it is as much a promise as the job is,
// and listing it again cost Redis a script call per post. Should the
// listing fail, the step queues the job again without listed, whose
// worker lists the post (a job run twice delivers nothing twice). A
// Redis Cluster refuses the script (its keys span slots), and CreatePost
// runs the chain there (storeChained), whose jobs list the post.
//
// The job carries the author's followers when they are few (at most
// ARGV[16]) and in the one followers set (no followerBuckets field), read
// in this step: its worker then delivers at once, without reading them
// (see fanOutCarried). An author who has none there, and whose job could
// carry them, gets no job: the step lists the post itself, and the job
// would have had no one to deliver to. A follow after the step gets the
// post from its backfill, as it does after a carried job's step, so the
// post reaches every follower all the same, and it saves Redis the job's
// XADD, its read by a worker and its end (BENCHMARKS.md, "No job for a
// post that no one follows"). Should the listing fail, the step queues
// the job after all, unlisted, and marks the post for the mover as it
// marks a post with a job. Reads fail only on a key of another type,
// before anything is written.
//
// KEYS[1] -> w:u:{<author>}:p:<seq>
// KEYS[2] -> w:u:{<author>}:posts
// KEYS[3] -> w:u:{<author>}:home
// KEYS[4] -> w:{fanout:<i>}:jobs, the author's shard's stream
// KEYS[5] -> w:global
// KEYS[6] -> w:u:{<author>}:followers
// KEYS[7] -> w:u:{<author>} (its followerBuckets field)
// KEYS[8] -> w:{fanout:<i>}:archive:due (with an archive)
// KEYS[9] -> w:{w:global}:tail (with an archive)
// ARGV[1..8] -> as createPostScript's
// ARGV[9] -> the job's op, or "" to queue no job (no AsyncFanOut)
// ARGV[10] -> author id
// ARGV[11] -> global timeline cap
// ARGV[12] -> the global timeline's channel
// ARGV[13] -> Options.PostsInRedis
// ARGV[14] -> when the author is due with more posts in Redis than that, unix ms
// ARGV[15] -> when the author is due otherwise, unix ms, or 0 for not
// ARGV[16] -> the most followers a job carries, 0 for none
// ARGV[17] -> followerBucketsField
//
// Returns the error of the global timeline's step and of the due index's,
// each "" for none.
var createPostOneRedisScript = newPubScript(addCappedLua + listGlobalLua + storePostLua + `
local job
local queued = false
if ARGV[9] ~= '' then
	job = {'op', ARGV[9], 'author', ARGV[10], 'seq', ARGV[1], 'post', ARGV[2]}
	local most = tonumber(ARGV[16])
	local count = -1
	if most > 0 and not redis.call('HGET', KEYS[7], ARGV[17]) then
		count = redis.call('ZCARD', KEYS[6])
	end
	if count > 0 and count <= most then
		job[#job + 1] = 'followers'
		job[#job + 1] = table.concat(redis.call('ZRANGE', KEYS[6], 0, -1), ' ')
	end
	job[#job + 1] = 'listed'
	job[#job + 1] = '1'
	if count ~= 0 then
		redis.call('XADD', KEYS[4], '*', unpack(job))
		queued = true
	end
end
local inRedis = storePost(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8], queued)
local function failure(ok, err)
	if ok then
		return ''
	elseif type(err) == 'table' then
		return tostring(err.err)
	end
	return tostring(err)
end
local globalErr = failure(pcall(listGlobal, KEYS[5], KEYS[9], ARGV[1], ARGV[2], tonumber(ARGV[11]), ARGV[12], ARGV[8]))
if globalErr ~= '' and job then
	job[#job], job[#job - 1] = nil, nil
	redis.call('XADD', KEYS[4], '*', unpack(job))
	if not queued then
		redis.call('HSET', KEYS[1], 'fanout', '1')
	end
end
local dueErr = ''
if KEYS[8] then
	local due = ARGV[15]
	if inRedis > tonumber(ARGV[13]) then
		due = ARGV[14]
	end
	if due ~= '0' then
		dueErr = failure(pcall(redis.call, 'ZADD', KEYS[8], 'LT', due, ARGV[10]))
	end
end
return {globalErr, dueErr}
`)

// deletePostScript deletes a post and takes it off its author's own
// timelines, then announces the removal there. Deleting a deleted post
// changes nothing.
//
// With a fan-out job to queue (ARGV[5]), it records the job in the author's
// outbox, as createPostScript does. While a move of the author's posts has
// not ended (it holds KEYS[5], or a mover that died left movingUpTo in
// KEYS[7]), it notes the id for the movers, since one may have written
// the post to the archive (see mover.go).
//
// KEYS[1] -> w:u:{<author>}:p:<seq>
// KEYS[2] -> w:u:{<author>}:posts
// KEYS[3] -> w:u:{<author>}:home
// KEYS[4] -> w:u:{<author>}:outbox
// KEYS[5] -> w:u:{<author>}:moving
// KEYS[6] -> w:u:{<author>}:archive:gone
// KEYS[7] -> w:u:{<author>}     (the user hash)
// ARGV[1] -> post id
// ARGV[2] -> the author's user channel
// ARGV[3] -> the author's home channel
// ARGV[4] -> the removed message for both channels
// ARGV[5] -> the outbox entry of the fan-out job, or "" for none
// ARGV[6] -> now, unix ms
// ARGV[7] -> postsGoneChannel
//
// Returns 1 if the post was deleted, 2 if it was and its id was noted for
// the movers, 0 if there was no such post.
var deletePostScript = newPubScript(broadcastGoneLua + `
if redis.call('DEL', KEYS[1]) == 0 then
	return 0
end
local noted = 0
if redis.call('EXISTS', KEYS[5]) == 1 or redis.call('HEXISTS', KEYS[7], 'movingUpTo') == 1 then
	noted = redis.call('SADD', KEYS[6], ARGV[1])
end
if ARGV[5] ~= '' then
	redis.call('ZADD', KEYS[4], ARGV[6], ARGV[5])
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[4])
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
	redis.call('PUBLISH', ARGV[3], ARGV[4])
end
broadcastGone(ARGV[7], ARGV[1])
return 1 + noted
`)

// CreatePost implements warble.PostService. The author's own timelines get
// the post at once, in the atomic step that stores it. With
// Options.AsyncFanOut that step also records the post's fan-out job, and
// that record is the promise: once it is written, CreatePost answers
// success, because the post will reach the global timeline and every
// follower whatever fails afterwards.
//
// On one Redis the step is createPostOneRedisScript, which queues the job
// and lists the post on the global timeline too: two round trips in all,
// the seq and the step. (The answer's author is the signed-in user; a
// caller without one has the author read with the seq.) On a Redis
// Cluster the step records the job in the author's outbox (see
// storeChained), and the job is then queued for a fan-out worker (see
// queue.go), and the post added to the global timeline at once for a
// prompt read; a failure of either is logged, and the job, queued by the
// outbox sweep if it was not, does both.
//
// An error from CreatePost therefore means that the post was not stored
// (or, for an error of the connection itself, that it may have been:
// Redis's answer was lost). Without AsyncFanOut, CreatePost delivers to the
// global timeline and the followers itself before it answers, and a
// delivery that fails part-way is logged, and the post still answered as
// created: it is stored, on its author's timelines, and an error would have
// the client post it again, a second post. What was not delivered stays
// so: no job was recorded in the step that stored the post, and one queued
// after the failure could fail as the delivery did. That promise is what
// AsyncFanOut adds, and why the server always sets it; without it is for
// tests and tools (see Options.AsyncFanOut).
func (s *PostService) CreatePost(ctx context.Context, authorID, body string) (*warble.Post, error) {
	ctx = s.db.noteWrites(ctx) // see awaitReplicas
	if !warble.ValidUserID(authorID) {
		return nil, fmt.Errorf("create post by %q: malformed author id", authorID)
	}
	body, err := warble.NormalizePostBody(body)
	if err != nil {
		return nil, err
	}
	// The answer's author is the signed-in user when they are the author,
	// as they are for a request (read with the session a moment ago);
	// otherwise it is read with the seq.
	var seqCmd *redis.IntCmd
	var author *warble.User
	var readAuthor func(context.Context) ([]*warble.User, error)
	var readErr error
	if u := warble.UserFromContext(ctx); u != nil && u.ID == authorID {
		signedIn := *u
		author = &signedIn
		if seq, ok := takeSeqAhead(ctx, authorID); ok {
			// Taken with the session (AuthService.AuthenticateForPost).
			seqCmd = redis.NewIntCmd(ctx)
			seqCmd.SetVal(seq)
		} else {
			seqCmd = s.db.client.Incr(ctx, postSeqKey)
		}
	} else {
		_, readErr = s.db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			seqCmd = pipe.Incr(ctx, postSeqKey)
			reads := newHashReads(1)
			readAuthor = s.db.queueUsers(ctx, reads, []string{authorID})
			reads.queue(ctx, pipe)
			return nil
		})
	}
	seq, err := seqCmd.Result()
	if err != nil {
		return nil, fmt.Errorf("create post by %s: %w", authorID, err)
	}
	p := &warble.Post{AuthorID: authorID, Body: body, CreatedAt: s.db.now(), Seq: seq}
	seqText := strconv.FormatInt(seq, 10)
	p.ID = authorID + ":" + seqText
	if s.db.chainedPosts {
		err = s.storeChained(ctx, p, seqText)
	} else {
		err = s.storeOneStep(ctx, p, seqText)
	}
	if err != nil {
		return nil, fmt.Errorf("create post by %s: %w", authorID, err)
	}

	// The post and its job are recorded: from here on nothing fails the
	// request, and nothing may be cut short by a client that hangs up.
	ctx = context.WithoutCancel(ctx)
	if !s.db.opts.AsyncFanOut {
		// The fan-out's writes are not waited for, and its failure fails
		// nothing (see above).
		if err := s.db.fanOut(skipNotes(ctx), authorID, seq, p.ID, startCursor, fanOutChunk, noSave); err != nil {
			s.db.log.ErrorContext(ctx, "fan out post", "post", p.ID, "err", err)
		}
	}
	if readAuthor != nil && readErr == nil {
		var authors []*warble.User
		if authors, readErr = readAuthor(ctx); readErr == nil {
			author = authors[0]
		}
	}
	p.Author = author
	if readErr != nil {
		if p.Author, err = s.db.findUser(ctx, authorID); err != nil {
			// The answer's author field reads the author again then.
			s.db.log.WarnContext(ctx, "read the author of a new post", "post", p.ID, "err", err)
		}
	}
	// The seq, the post with its job, and on a cluster the job's index
	// entry, on their replicas (on one Redis, one WAIT covers them).
	if err := s.db.awaitReplicas(ctx, postSeqKey, postKey(authorID, seqText), outboxIndexKey(s.db.fanOutShard(authorID))); err != nil {
		return nil, err
	}
	return p, nil
}

// storeOneStep stores p on one Redis with createPostOneRedisScript, in one
// round trip. An error means the post was not stored.
func (s *PostService) storeOneStep(ctx context.Context, p *warble.Post, seqText string) error {
	authorID, createdAt := p.AuthorID, p.CreatedAt
	shard := s.db.fanOutShard(authorID)
	keys := []string{postKey(authorID, seqText), postsKey(authorID), homeKey(authorID), fanoutStreamKey(shard), globalKey,
		followersKey(authorID), userKey(authorID)}
	if s.db.opts.Archive != nil {
		keys = append(keys, archiveDueKey(shard), globalTailKey)
	}
	op := ""
	if s.db.opts.AsyncFanOut {
		op = opDeliver
	}
	postsInRedis := int64(s.db.opts.PostsInRedis)
	cmd := runScript(ctx, s.db.client, s.db.pub(createPostOneRedisScript), keys,
		seqText, p.ID, p.Body, createdAt.UnixMilli(), s.db.opts.HomeCap,
		userChannel(authorID), homeChannel(authorID), encodeAdded(p.Seq, p.ID),
		op, authorID, s.db.opts.GlobalCap, globalChannel,
		postsInRedis, s.db.dueAfterPost(postsInRedis+1, createdAt), s.db.dueAfterPost(postsInRedis, createdAt),
		s.db.carriedFollowers(), followerBucketsField)
	if err := cmd.Err(); err != nil {
		return err
	}
	// The post and its job are recorded.
	failed, _ := cmd.StringSlice()
	if len(failed) == 2 && failed[0] != "" {
		s.db.log.WarnContext(ctx, "add post to global timeline; a fan-out job will", "post", p.ID, "err", failed[0])
	}
	if len(failed) == 2 && failed[1] != "" {
		// The author's next post marks them again.
		s.db.log.WarnContext(ctx, "mark author due for the archive", "author", authorID, "err", failed[1])
	}
	return nil
}

// storeChained stores p on a Redis Cluster, where its writes are in three
// slots (the author's, the fan-out shard's and the global timeline's), as
// a chain of round trips, each waiting on the one before: the job's entry
// in the outbox index, the post with the job in its author's outbox
// (createPostScript: the promise), XADD of the job, and one pipeline of
// the global timeline, the job out of the outbox and the index, and the
// author into the archive's due index. An error means the post was not
// stored; what fails after the promise is logged, for the sweep and the
// job to finish.
func (s *PostService) storeChained(ctx context.Context, p *warble.Post, seqText string) error {
	authorID, id, createdAt := p.AuthorID, p.ID, p.CreatedAt
	added := encodeAdded(p.Seq, id)
	job := ""
	if s.db.opts.AsyncFanOut {
		job = outboxEntry(opDeliver, id)
		if err := s.db.indexJob(ctx, opDeliver, id); err != nil {
			return err
		}
	}
	inRedis, err := s.db.pub(createPostScript).Run(ctx, s.db.client,
		[]string{postKey(authorID, seqText), postsKey(authorID), homeKey(authorID), outboxKey(authorID)},
		seqText, id, p.Body, msString(createdAt), s.db.opts.HomeCap,
		userChannel(authorID), homeChannel(authorID), added, job).Int64()
	if err != nil {
		return err
	}

	ctx = context.WithoutCancel(ctx)
	queued := false
	if s.db.opts.AsyncFanOut {
		if err := s.db.queueJob(ctx, opDeliver, id); err != nil {
			s.db.log.WarnContext(ctx, "queue fan-out job; the outbox sweep will", "post", id, "err", err)
		} else {
			queued = true
		}
	}
	var global *redis.Cmd
	var due *redis.IntCmd
	dueAt := s.db.dueAfterPost(inRedis, createdAt)
	err = runScripts(ctx, s.db.client, func(pipe redis.Pipeliner) {
		global = s.db.listGlobal(ctx, pipe, seqText, id, added)
		if queued {
			unqueueJob(ctx, pipe, s.db.fanOutShard(authorID), opDeliver, id)
		}
		if dueAt > 0 {
			due = s.db.markDue(ctx, pipe, authorID, dueAt)
		}
	}, s.db.pub(listGlobalScript))
	gerr := err // loading the script may have failed before anything was queued
	if global != nil {
		gerr = global.Err()
	}
	if gerr != nil {
		s.db.log.WarnContext(ctx, "add post to global timeline; its fan-out job will", "post", id, "err", gerr)
	}
	if due != nil && due.Err() != nil {
		// The author's next post marks them again.
		s.db.log.WarnContext(ctx, "mark author due for the archive", "author", authorID, "err", due.Err())
	}
	return nil
}

// *redis.Script -> struct{}

// DeletePost implements warble.PostService. The author's own timelines lose
// the post in one atomic step; the global timeline follows, and the
// followers' home timelines, through a fan-out job (see fanout.go) with
// Options.AsyncFanOut, else before DeletePost answers. A failure
// after the first step is logged rather than returned: the post is gone by
// then, and timeline reads skip ids whose post is gone.
func (s *PostService) DeletePost(ctx context.Context, authorID, postID string) error {
	owner, seqText, ok := splitPostID(postID)
	if !ok {
		return errPostNotFound
	}
	seq, _ := strconv.ParseInt(seqText, 10, 64)
	if owner != authorID {
		n, err := s.db.client.Exists(ctx, postKey(owner, seqText)).Result()
		if err != nil {
			return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
		}
		if n == 0 {
			if archived, err := s.db.archived(ctx, postID); err != nil {
				return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
			} else if !archived {
				return errPostNotFound
			}
		}
		return warble.Errorf(warble.EFORBIDDEN, "You can only delete your own posts.")
	}
	removed := encodeRemoved(seq, postID)
	job := ""
	if s.db.opts.AsyncFanOut {
		job = outboxEntry(opUndeliver, postID)
		// A post that is not there is refused before anything is written.
		// (One deleted by a racing request meanwhile leaves this index
		// entry, which the sweep drops as an orphan.)
		if n, err := s.db.client.Exists(ctx, postKey(authorID, seqText)).Result(); err != nil {
			return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
		} else if n == 0 {
			return s.deleteArchived(ctx, authorID, postID, seq)
		}
		if err := s.db.indexJob(ctx, opUndeliver, postID); err != nil {
			return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
		}
	}
	n, err := s.db.pub(deletePostScript).Run(ctx, s.db.client,
		[]string{postKey(authorID, seqText), postsKey(authorID), homeKey(authorID), outboxKey(authorID),
			movingKey(authorID), archiveGoneKey(authorID), userKey(authorID)},
		postID, userChannel(authorID), homeChannel(authorID), removed, job, msString(s.db.now()), postsGoneChannel).Int64()
	if err != nil {
		return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
	} else if n == 0 {
		// Gone, or moved to the archive since it was looked for.
		return s.deleteArchived(ctx, authorID, postID, seq)
	}
	// The script announced the delete to every process; this one forgets
	// the post before it answers.
	s.db.cache.drop(postID)

	ctx = context.WithoutCancel(ctx)
	if n == 2 {
		// A move may have written the post's row. The mover deletes it,
		// and forgets the id, once its own writes are done; this deletes
		// it now for readers, and covers a mover that stalled past its
		// lease (see mover.go).
		if err := s.db.opts.Archive.DeletePosts(ctx, []string{postID}); err != nil {
			s.db.log.WarnContext(ctx, "delete post from the archive; a mover will", "post", postID, "err", err)
		}
		// A read between the script and the row's delete may have
		// found the post in the archive, after its announce.
		s.db.announceGone(ctx, postID)
	}
	s.afterDelete(ctx, authorID, seq, postID)
	return nil
}

// afterDelete takes a deleted post off the global timeline and the
// followers' home timelines. Failures are logged: the post is gone by
// then, and timeline reads skip ids whose post is gone.
func (s *PostService) afterDelete(ctx context.Context, authorID string, seq int64, postID string) {
	err := s.db.unlistGlobal(ctx, seq, postID)
	if err != nil {
		s.db.log.ErrorContext(ctx, "remove post from global timeline", "post", postID, "err", err)
	}
	if !s.db.opts.AsyncFanOut {
		err = s.db.unFanOut(ctx, authorID, seq, postID, startCursor, fanOutChunk, noSave)
	} else {
		err = s.db.enqueueFanOut(ctx, opUndeliver, postID)
	}
	if err != nil {
		s.db.log.ErrorContext(ctx, "remove post from followers' timelines", "post", postID, "err", err)
	}
}

// FindPostByID implements warble.PostService.
func (s *PostService) FindPostByID(ctx context.Context, id string) (*warble.Post, error) {
	seq, ok := postSeq(id)
	if !ok {
		return nil, errPostNotFound
	}
	posts, err := s.db.loadPosts(ctx, []feedEntry{{postID: id, seq: seq}})
	if err != nil {
		return nil, fmt.Errorf("find post %s: %w", id, err)
	} else if len(posts) == 0 {
		return nil, errPostNotFound
	}
	return posts[0], nil
}

// FindPostsByIDs implements warble.PostService: two round trips whatever
// the number of ids, one for the posts and one for their authors.
func (s *PostService) FindPostsByIDs(ctx context.Context, ids []string) ([]*warble.Post, error) {
	entries := make([]feedEntry, 0, len(ids))
	for _, id := range ids {
		if seq, ok := postSeq(id); ok {
			entries = append(entries, feedEntry{postID: id, seq: seq})
		}
	}
	posts, err := s.db.loadPosts(ctx, entries)
	if err != nil {
		return nil, fmt.Errorf("find %d posts: %w", len(ids), err)
	}
	byID := make(map[string]*warble.Post, len(posts))
	for _, p := range posts {
		byID[p.ID] = p
	}
	out := make([]*warble.Post, len(ids))
	for i, id := range ids {
		out[i] = byID[id]
	}
	return out, nil
}

// splitPostID returns the author id and the seq of a well-formed post id.
func splitPostID(id string) (authorID, seq string, ok bool) {
	if !warble.IsPostID(id) {
		return "", "", false
	}
	authorID, seq, _ = strings.Cut(id, ":")
	return authorID, seq, true
}

// postSeq returns the seq of a well-formed post id.
func postSeq(id string) (int64, bool) {
	_, seqText, ok := splitPostID(id)
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseInt(seqText, 10, 64)
	return seq, err == nil
}

// formatScore prints a sorted set score as Redis takes it back: timeline
// scores and follow times are integers below 2^53, which print exactly.
func formatScore(score float64) string { return strconv.FormatFloat(score, 'f', -1, 64) }

// isPostID reports whether id is a well-formed post id.
func isPostID(id string) bool {
	_, _, ok := splitPostID(id)
	return ok
}
