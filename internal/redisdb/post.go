package redisdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

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

// fanOutChunk is how many followers one round trip of fan-out (or of its
// undoing on delete) reads and delivers to.
const fanOutChunk = 1000

var errPostNotFound = warble.Errorf(warble.ENOTFOUND, "Post not found.")

// createPostScript stores a post and puts it on its author's own timelines,
// then announces it there. The author's keys share a slot, so this is one
// atomic step and the author never sees a half-written post.
//
// With a fan-out job to queue (ARGV[9]), it also records the job in the
// author's outbox, so that the job is queued even if this process dies
// before it queues it (see fanout.go).
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
// Returns 1.
var createPostScript = redis.NewScript(`
if ARGV[9] ~= '' then
	redis.call('ZADD', KEYS[4], ARGV[4], ARGV[9])
end
redis.call('HSET', KEYS[1], 'body', ARGV[3], 'createdAt', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[5]) + 1))
redis.call('PUBLISH', ARGV[6], ARGV[8])
redis.call('PUBLISH', ARGV[7], ARGV[8])
return 1
`)

// deliverScript adds a post to a follower's home timeline, trims it to its
// cap and announces it, if the follower still follows the author: an
// unfollow that ran while the fan-out was walking the followers has removed
// the author's posts from the timeline already, and must not get one back.
// A post that the timeline holds already (a repeated delivery) is not
// announced again, nor is one older than everything the capped timeline
// keeps (it is trimmed away at once). A follower not seen since the cutoff
// is skipped: their timeline is rebuilt when they come back (see
// inactive.go).
//
// KEYS[1] -> w:u:{<follower>}:home
// KEYS[2] -> w:u:{<follower>}:following
// KEYS[3] -> w:u:{<follower>}:seen
// ARGV[1] -> post seq
// ARGV[2] -> post id
// ARGV[3] -> author id
// ARGV[4] -> home timeline cap
// ARGV[5] -> the follower's home channel
// ARGV[6] -> the added message
// ARGV[7] -> the inactive cutoff, unix ms (0: none)
//
// Returns 1 if the post was added, 0 if it was there already or trimmed at
// once, -1 if the follower does not follow the author, -2 if the follower
// is inactive.
var deliverScript = redis.NewScript(`
if not redis.call('ZSCORE', KEYS[2], ARGV[3]) then
	return -1
end
local seen = redis.call('GET', KEYS[3])
if seen and tonumber(seen) < tonumber(ARGV[7]) then
	return -2
end
if redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) == 0 then
	return 0
end
local cap = tonumber(ARGV[4])
if redis.call('ZCARD', KEYS[1]) > cap then
	redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(cap + 1))
	if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
		return 0
	end
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
`)

// deletePostScript deletes a post and takes it off its author's own
// timelines, then announces the removal there. Deleting a deleted post
// changes nothing.
//
// With a fan-out job to queue (ARGV[5]), it records the job in the author's
// outbox, as createPostScript does.
//
// KEYS[1] -> w:u:{<author>}:p:<seq>
// KEYS[2] -> w:u:{<author>}:posts
// KEYS[3] -> w:u:{<author>}:home
// KEYS[4] -> w:u:{<author>}:outbox
// ARGV[1] -> post id
// ARGV[2] -> the author's user channel
// ARGV[3] -> the author's home channel
// ARGV[4] -> the removed message for both channels
// ARGV[5] -> the outbox entry of the fan-out job, or "" for none
// ARGV[6] -> now, unix ms
//
// Returns 1 if the post was deleted, 0 if there was no such post.
var deletePostScript = redis.NewScript(`
if redis.call('DEL', KEYS[1]) == 0 then
	return 0
end
if ARGV[5] ~= '' then
	redis.call('ZADD', KEYS[4], ARGV[6], ARGV[5])
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[4])
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
	redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return 1
`)

// undeliverScript takes a post off one timeline (the global timeline or a
// follower's home timeline) and announces the removal only if the timeline
// held it, so that subscribers hear of removals they can see.
//
// KEYS[1] -> a timeline: w:global or w:u:{<follower>}:home
// ARGV[1] -> post id
// ARGV[2] -> the timeline's channel
// ARGV[3] -> the removed message
//
// Returns 1 if the post was removed, 0 if the timeline did not hold it.
var undeliverScript = redis.NewScript(`
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
	return 0
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
`)

// CreatePost implements warble.PostService. The author's own timelines get
// the post at once, in the atomic step that stores it. With
// Options.AsyncFanOut that step also records the post's fan-out job in the
// author's outbox, and that record is the promise: once it is written,
// CreatePost answers success, because the post will reach the global
// timeline and every follower whatever fails afterwards. The job is then
// queued for a fan-out worker (see fanout.go), and the post added to the
// global timeline at once for a prompt read; a failure of either is logged,
// and the job, queued by the outbox sweep if it was not, does both. An
// error from CreatePost therefore means that the post was not stored (or,
// for an error of the connection itself, that it may have been: Redis's
// answer was lost). Without AsyncFanOut, CreatePost delivers to the global
// timeline and the followers itself before it answers.
func (s *PostService) CreatePost(ctx context.Context, authorID, body string) (*warble.Post, error) {
	if !warble.ValidUserID(authorID) {
		return nil, fmt.Errorf("create post by %q: malformed author id", authorID)
	}
	seq, err := s.db.client.Incr(ctx, postSeqKey).Result()
	if err != nil {
		return nil, fmt.Errorf("create post by %s: %w", authorID, err)
	}
	seqText := strconv.FormatInt(seq, 10)
	id := authorID + ":" + seqText
	createdAt := s.db.now()
	added := encodeAdded(seq, id)
	job := ""
	if s.db.opts.AsyncFanOut {
		job = outboxEntry(opDeliver, id)
	}
	err = createPostScript.Run(ctx, s.db.client,
		[]string{postKey(authorID, seqText), postsKey(authorID), homeKey(authorID), outboxKey(authorID)},
		seqText, id, body, msString(createdAt), s.db.opts.HomeCap,
		userChannel(authorID), homeChannel(authorID), added, job).Err()
	if err != nil {
		return nil, fmt.Errorf("create post by %s: %w", authorID, err)
	}

	// The post and its job are recorded: from here on nothing fails the
	// request, and nothing may be cut short by a client that hangs up.
	ctx = context.WithoutCancel(ctx)
	queued := false
	if s.db.opts.AsyncFanOut {
		if err := s.db.queueJob(ctx, opDeliver, id); err != nil {
			s.db.log.WarnContext(ctx, "queue fan-out job; the outbox sweep will", "post", id, "err", err)
		} else {
			queued = true
		}
	}
	// One round trip for the rest: the global timeline, the job out of the
	// outbox (once it is queued), and the author for the answer.
	var global *redis.Cmd
	var author func() []*warble.User
	err = runScripts(ctx, s.db.client, func(pipe redis.Pipeliner) {
		global = globalAddScript.EvalSha(ctx, pipe, []string{globalKey},
			seqText, id, s.db.opts.GlobalCap, globalChannel, added)
		if queued {
			pipe.ZRem(ctx, outboxKey(authorID), job)
		}
		author = queueUsers(ctx, pipe, []string{authorID})
	}, globalAddScript)
	gerr := err // loading the script may have failed before anything was queued
	if global != nil {
		gerr = global.Err()
	}
	if gerr != nil {
		s.db.log.WarnContext(ctx, "add post to global timeline; its fan-out job will", "post", id, "err", gerr)
	}
	if !s.db.opts.AsyncFanOut {
		if err := s.db.fanOut(ctx, authorID, seq, id, startCursor, fanOutChunk, noSave); err != nil {
			s.db.log.ErrorContext(ctx, "fan out post", "post", id, "err", err)
		}
	}

	p := &warble.Post{ID: id, AuthorID: authorID, Body: body, CreatedAt: createdAt, Seq: seq}
	if err == nil {
		p.Author = author()[0]
	} else if p.Author, err = s.db.findUser(ctx, authorID); err != nil {
		// The answer's author field reads the author again then.
		s.db.log.WarnContext(ctx, "read the author of a new post", "post", id, "err", err)
	}
	return p, nil
}

// globalAddScript adds a post to the global timeline, trims the timeline
// to its cap and announces the post. Like deliverScript it is idempotent:
// a post the timeline holds already, or one older than everything the
// capped timeline keeps, is not announced again. CreatePost runs it for a
// prompt read, and the post's fan-out job again, for the guarantee.
//
// KEYS[1] -> w:global
// ARGV[1] -> post seq
// ARGV[2] -> post id
// ARGV[3] -> the global timeline's cap
// ARGV[4] -> the global channel
// ARGV[5] -> the added message
//
// Returns 1 if the post was added, 0 otherwise.
var globalAddScript = redis.NewScript(`
if redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) == 0 then
	return 0
end
local cap = tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[1]) > cap then
	redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(cap + 1))
	if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
		return 0
	end
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
`)

// fanOut delivers a post to the home timelines of its author's followers,
// batch followers per round trip, starting at from and calling save with
// the position after each batch but the last (see Worker). Delivery is
// idempotent: running it again for the same post neither duplicates the
// post nor announces it twice.
//
// fanOutDepth batches are in flight at a time, so that Redis works through
// one while this process reads the followers of the next and writes its
// commands. The position saved after a batch is where the next one starts,
// so a resumed job repeats at most the batches that were in flight.
//
// It stops, and takes the post back off the batches it delivered, once the
// post's hash is gone: a delete raced this fan-out, and its own job may
// already have passed these followers. Each batch checks that in the same
// pipeline, after its deliveries, and a job checks it before its first
// batch, since a worker that died between a batch and its check left the
// cursor at most fanOutDepth-1 batches before it. The doc comment at the
// top of fanout.go has the whole argument.
func (db *DB) fanOut(ctx context.Context, authorID string, seq int64, postID string,
	from followerCursor, batch int, save func(followerCursor) error) error {
	seqText := strconv.FormatInt(seq, 10)
	added := encodeAdded(seq, postID)
	undo := func(followers []string) error {
		return db.undeliver(ctx, followers, seq, postID)
	}
	// A job's first step puts the post on the global timeline (CreatePost
	// did so for a prompt read, but only the job is a promise), and
	// checks, after it, that the post still exists: the same argument as
	// for the batches below then covers the global timeline too.
	var exists *redis.IntCmd
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		if from == startCursor {
			globalAddScript.EvalSha(ctx, pipe, []string{globalKey},
				seqText, postID, db.opts.GlobalCap, globalChannel, added)
		}
		exists = pipe.Exists(ctx, postKey(authorID, seqText))
	}, globalAddScript)
	if err != nil {
		return fmt.Errorf("list post %s: %w", postID, err)
	} else if exists.Val() == 0 {
		// A delete raced this job, whose global step may have run after
		// the delete's.
		if from == startCursor {
			if err := db.unlistGlobal(ctx, seq, postID); err != nil {
				return err
			}
		}
		// Undo the batches that may have been in flight when the job
		// stopped: fanOutDepth of them from the cursor on.
		pos := from
		for range fanOutDepth {
			followers, next, last, err := db.followerChunk(ctx, authorID, pos, batch)
			if err != nil {
				return err
			}
			if err := undo(followers); err != nil || last {
				return err
			}
			pos = next
		}
		return nil
	}
	// Only a job that has delivered nothing yet may turn to pull: a resumed
	// one goes on pushing, so that the undo above stays the whole story.
	if from == startCursor {
		if pulled, err := db.pullInstead(ctx, authorID, postID); err != nil || pulled {
			return err
		}
	}

	// deliver runs one batch: the deliveries, then whether the post still
	// exists, in one pipeline.
	type result struct {
		delivered int
		gone      bool
		err       error
	}
	type inFlight struct {
		followers []string
		next      followerCursor
		last      bool
		done      chan result
	}
	deliver := func(followers []string, next followerCursor, last bool) *inFlight {
		b := &inFlight{followers: followers, next: next, last: last, done: make(chan result, 1)}
		go func() {
			cmds := make([]*redis.Cmd, 0, len(followers))
			var exists *redis.IntCmd
			cutoff := db.inactiveCutoff()
			err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
				cmds = cmds[:0]
				for _, f := range followers {
					cmds = append(cmds, deliverScript.EvalSha(ctx, pipe, []string{homeKey(f), followingKey(f), seenKey(f)},
						seqText, postID, authorID, db.opts.HomeCap, homeChannel(f), added, cutoff))
				}
				exists = pipe.Exists(ctx, postKey(authorID, seqText))
			}, deliverScript)
			if err != nil {
				b.done <- result{err: fmt.Errorf("deliver post %s: %w", postID, err)}
				return
			}
			n := 0
			for _, c := range cmds {
				if v, _ := c.Int64(); v == 1 {
					n++
				}
			}
			b.done <- result{delivered: n, gone: exists.Val() == 0}
		}()
		return b
	}

	start := time.Now()
	var walked, delivered, batches int
	var queue []*inFlight // oldest first
	pos, end := from, false
	// settle waits for every batch still in flight and undoes those whose
	// own check found the post gone, so that no delivery of this job lands
	// after it returns, nor stays where it must not.
	settle := func(err error) error {
		for _, b := range queue {
			if r := <-b.done; r.gone && r.err == nil && err == nil {
				err = undo(b.followers)
			}
		}
		return err
	}
	for {
		for len(queue) < fanOutDepth && !end {
			followers, next, last, err := db.followerChunk(ctx, authorID, pos, batch)
			if err != nil {
				return settle(err)
			}
			queue = append(queue, deliver(followers, next, last))
			pos, end = next, last
		}
		cur := queue[0]
		queue = queue[1:]
		r := <-cur.done
		if r.err != nil {
			return settle(r.err)
		}
		if db.opts.Delivered != nil && r.delivered > 0 {
			db.opts.Delivered(r.delivered)
		}
		walked, delivered, batches = walked+len(cur.followers), delivered+r.delivered, batches+1
		if r.gone {
			return settle(undo(cur.followers))
		}
		if cur.last {
			if batches > 1 {
				db.log.InfoContext(ctx, "fan-out done", "post", postID, "followers", walked,
					"delivered", delivered, "took", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if batches%progressEvery == 0 {
			db.log.InfoContext(ctx, "fan-out progress", "post", postID, "followers", walked,
				"delivered", delivered, "took", time.Since(start).Round(time.Millisecond))
		}
		if err := save(cur.next); err != nil {
			return settle(err)
		}
	}
}

// fanOutDepth is how many batches of one fan-out are in flight at a time.
const fanOutDepth = 2

// progressEvery is how many batches a fan-out runs between progress logs.
const progressEvery = 20

// unFanOut takes a deleted post off its author's followers' home timelines,
// batch followers per round trip, starting at from and calling save with
// the position after each batch but the last.
func (db *DB) unFanOut(ctx context.Context, authorID string, seq int64, postID string,
	from followerCursor, batch int, save func(followerCursor) error) error {
	if from == startCursor {
		// DeletePost did so already, but only the job is a promise.
		if err := db.unlistGlobal(ctx, seq, postID); err != nil {
			return err
		}
	}
	for {
		followers, next, last, err := db.followerChunk(ctx, authorID, from, batch)
		if err != nil {
			return err
		}
		if err := db.undeliver(ctx, followers, seq, postID); err != nil {
			return err
		}
		if last {
			return nil
		}
		if err := save(next); err != nil {
			return err
		}
		from = next
	}
}

// undeliver takes a post off the home timelines of followers, in one round
// trip.
func (db *DB) undeliver(ctx context.Context, followers []string, seq int64, postID string) error {
	if len(followers) == 0 {
		return nil
	}
	removed := encodeRemoved(seq, postID)
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		for _, f := range followers {
			undeliverScript.EvalSha(ctx, pipe, []string{homeKey(f)}, postID, homeChannel(f), removed)
		}
	}, undeliverScript)
	if err != nil {
		return fmt.Errorf("undeliver post %s: %w", postID, err)
	}
	return nil
}

// unlistGlobal takes a post off the global timeline, announcing the
// removal if the timeline held it.
func (db *DB) unlistGlobal(ctx context.Context, seq int64, postID string) error {
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		undeliverScript.EvalSha(ctx, pipe, []string{globalKey}, postID, globalChannel, encodeRemoved(seq, postID))
	}, undeliverScript)
	if err != nil {
		return fmt.Errorf("take post %s off the global timeline: %w", postID, err)
	}
	return nil
}

// followerChunk returns up to n followers of authorID from position c on,
// oldest follow first, the position after them, and whether they are the
// last.
//
// The walk goes by score (follow time), not by rank: an unfollow during the
// walk would shift every later rank down and make a rank walk skip a
// follower. A new follow has the newest score, so it lands at the end, and
// its backfill copies the post anyway. Followers tied on the last score read
// are skipped by offset; a tie that an unfollow shifts can at worst deliver
// twice, which delivery ignores.
func (db *DB) followerChunk(ctx context.Context, authorID string, c followerCursor, n int) ([]string, followerCursor, bool, error) {
	chunk, err := db.client.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
		Key: followersKey(authorID), Start: c.min, Stop: "+inf", ByScore: true,
		Offset: c.tied, Count: int64(n),
	}).Result()
	if err != nil {
		return nil, c, false, fmt.Errorf("read followers of %s: %w", authorID, err)
	}
	followers := make([]string, len(chunk))
	for i, z := range chunk {
		followers[i], _ = z.Member.(string)
	}
	if len(chunk) < n {
		return followers, c, true, nil
	}
	last := chunk[len(chunk)-1].Score
	tied := int64(0)
	for _, z := range chunk {
		if z.Score == last {
			tied++
		}
	}
	next := followerCursor{min: formatScore(last), tied: tied}
	if next.min == c.min {
		next.tied += c.tied // the whole chunk shares the score of the one before
	}
	return followers, next, false, nil
}

// scriptLoads remembers which scripts this process has loaded, so that
// pipelines can send EVALSHA without a failed first round trip.
var scriptLoads sync.Map // *redis.Script -> struct{}

// runScripts runs the commands fill queues, EVALSHAs of scripts among
// them, as one pipeline. Each script is loaded at its first use; when Redis
// answers NOSCRIPT anyway (a SCRIPT FLUSH, a restart or a failover since),
// the scripts are loaded again and the whole pipeline runs once more, which
// is why every command that runScripts runs must be idempotent.
func runScripts(ctx context.Context, c redis.UniversalClient, fill func(redis.Pipeliner), scripts ...*redis.Script) error {
	load := func(force bool) error {
		for _, script := range scripts {
			if _, ok := scriptLoads.Load(script); ok && !force {
				continue
			}
			if err := script.Load(ctx, c).Err(); err != nil {
				return err
			}
			scriptLoads.Store(script, struct{}{})
		}
		return nil
	}
	if err := load(false); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cmds, err := c.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			fill(pipe)
			return nil
		})
		noScript := redis.HasErrorPrefix(err, "NOSCRIPT")
		for _, cmd := range cmds {
			if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				noScript = true
			}
		}
		if !noScript || attempt > 0 {
			return err
		}
		if err := load(true); err != nil {
			return err
		}
	}
}

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
	if owner != authorID {
		n, err := s.db.client.Exists(ctx, postKey(owner, seqText)).Result()
		if err != nil {
			return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
		} else if n == 0 {
			return errPostNotFound
		}
		return warble.Errorf(warble.EFORBIDDEN, "You can only delete your own posts.")
	}
	seq, _ := strconv.ParseInt(seqText, 10, 64)
	removed := encodeRemoved(seq, postID)
	job := ""
	if s.db.opts.AsyncFanOut {
		job = outboxEntry(opUndeliver, postID)
	}
	n, err := deletePostScript.Run(ctx, s.db.client,
		[]string{postKey(authorID, seqText), postsKey(authorID), homeKey(authorID), outboxKey(authorID)},
		postID, userChannel(authorID), homeChannel(authorID), removed, job, msString(s.db.now())).Int64()
	if err != nil {
		return fmt.Errorf("delete post %s by %s: %w", postID, authorID, err)
	} else if n == 0 {
		return errPostNotFound
	}

	ctx = context.WithoutCancel(ctx)
	err = s.db.unlistGlobal(ctx, seq, postID)
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
	return nil
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
