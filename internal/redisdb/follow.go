package redisdb

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// FollowService implements warble.FollowService.
//
// A follow lives in two sorted sets in two users' hash slots: the
// follower's following set, which is the truth, and the followee's
// followers set, which mirrors it. Every step that writes the mirror re-reads
// the truth afterwards and repeats until the two agree, so concurrent follows
// and unfollows of one pair, and retries after a crash, converge.
type FollowService struct{ db *DB }

// NewFollowService returns a FollowService over db.
func NewFollowService(db *DB) *FollowService { return &FollowService{db: db} }

var _ warble.FollowService = (*FollowService)(nil)

// followChunk is how many entries one round trip reads when a set is walked:
// removing a followee's posts from a home timeline, or intersecting two
// follow sets.
const followChunk = 500

var (
	errBadUserID  = warble.Errorf(warble.EINVALID, "User id is not valid.")
	errNoUser     = warble.Errorf(warble.ENOTFOUND, "User not found.")
	errFollowSelf = warble.Errorf(warble.EINVALID, "You cannot follow yourself.")
)

// followScript records that KEYS[1]'s owner follows ARGV[1], unless that
// would pass the following limit. The check and the add are one step, so
// concurrent follows cannot pass the limit together.
//
// KEYS[1] -> w:u:{<follower>}:following
// ARGV[1] -> followee id
// ARGV[2] -> followed-at, unix ms
// ARGV[3] -> the most users one may follow
//
// Returns {1, ARGV[2]} if the follow is new, {0, <followed-at of the existing
// follow>} if it already existed, and {-1, ""} if the limit is reached.
var followScript = redis.NewScript(`
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at then
	return {0, at}
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
	return {-1, ''}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return {1, ARGV[2]}
`)

// backfillScript copies a followee's posts into the follower's home timeline
// and trims it to its cap, if the follower still follows the followee: a
// concurrent unfollow may have come first, and then nothing is copied, and
// the followee's posts are taken off the timeline instead, as the
// unfollow's last step does: that unfollow may have died before its last
// step, leaving the posts fan-out delivered while this follow stood (see
// doc.go, "A racing unfollow"). Posts older than a full timeline's oldest
// entry are skipped, so that a repeated follow does not churn a full
// timeline.
//
// A change to the timeline is announced with a RESYNC in the same step: a
// live home channel dispatches the posts that messages announce without
// reading the timeline (hubChannel.added), so a post added here and
// announced in a later step that fails, or never comes (the process died,
// and the follow repeated to repair it adds nothing), would never come
// live.
//
// KEYS[1] -> w:u:{<follower>}:home
// KEYS[2] -> w:u:{<follower>}:following
// ARGV[1] -> followee id
// ARGV[2] -> home timeline cap
// ARGV[3] -> the home channel
// ARGV[4..] -> post seq, post id, post seq, post id, …
//
// Returns {added, newest}: how many posts were added (or, if the followee
// is no longer followed, -1 minus how many were taken off) and the newest
// seq in the home timeline (0 if empty).
var backfillScript = newPubScript(addCappedLua + unbackfillLua + `
local function newest()
	local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
	return top[2] or 0
end
local function announce(changed)
	if changed > 0 then
		redis.call('PUBLISH', ARGV[3], 'S ' .. newest())
	end
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
	local removed = removeAuthor(KEYS[1], ARGV[1])
	announce(removed)
	return {-1 - removed, newest()}
end
local cap = tonumber(ARGV[2])
local floor = nil
if redis.call('ZCARD', KEYS[1]) >= cap then
	floor = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
end
local entries = {}
for i = 4, #ARGV, 2 do
	if not floor or tonumber(ARGV[i]) > floor then
		entries[#entries + 1] = ARGV[i]
		entries[#entries + 1] = ARGV[i + 1]
	end
end
local added = addAllCapped(KEYS[1], cap, entries)
announce(added)
return {added, newest()}
`)

// unbackfillScript removes the posts of a followee from the follower's
// home timeline, unless the follower follows the followee again by now: a
// concurrent follow may have come last, and then its backfill stands. It
// finds them by their ids, which start with their author's, among the
// timeline's entries (at most the home timeline cap of them), not in the
// followee's posts set: that set no longer holds the posts that moved to
// the archive, whose ids home timelines keep.
//
// Posts taken off are announced with a RESYNC in the same step, as
// backfillScript announces its change, and with ARGV[3] set an unfollow
// that took none off is too: a live home timeline reads which pulled
// accounts it follows again on a RESYNC, and a pulled followee has no
// posts in the timeline to take off. One announced in a later step that
// fails, or never comes (the process died, and the unfollow repeated to
// repair it takes nothing off), would leave the followee's posts on the
// screens of the follower's live home timelines, or a pulled followee's
// new posts coming live there.
//
// KEYS[1] -> w:u:{<follower>}:home
// KEYS[2] -> w:u:{<follower>}:following
// ARGV[1] -> followee id
// ARGV[2] -> the home channel
// ARGV[3] -> "1" to announce even if no post was taken off, else "0"
//
// Returns how many posts were removed, or -1 if the followee is followed.
var unbackfillScript = newPubScript(unbackfillLua + `
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
	return -1
end
local removed = removeAuthor(KEYS[1], ARGV[1])
if removed > 0 or ARGV[3] == '1' then
	local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
	redis.call('PUBLISH', ARGV[2], 'S ' .. (top[2] or 0))
end
return removed
`)

// unbackfillLua defines removeAuthor(home, author), which takes every post
// of author off a home timeline and returns how many it took.
const unbackfillLua = `
local function removeAuthor(home, author)
	local prefix = author .. ':'
	local removed = 0
	for _, id in ipairs(redis.call('ZRANGE', home, 0, -1)) do
		if string.sub(id, 1, #prefix) == prefix then
			removed = removed + redis.call('ZREM', home, id)
		end
	end
	return removed
end
`

// followPageScript reads a follow set newest first, after a keyset position
// (followed-at, member). Equal scores are ordered by member bytes, as Redis
// orders them, so ties are neither repeated nor skipped. When the entry at
// the position still exists, the read continues from its rank; when it is
// gone (an unfollow since), from the entries tied with it that sort below
// it and then from everything older. Only that rare path reads all the
// entries of one millisecond, which are few unless follows were imported in
// bulk.
//
// KEYS[1] -> a followers or following set, or a follower bucket
// KEYS[2] -> w:u:{<id>}, given with an account's one followers set only:
// its followerBuckets field says whether the set still holds the followers
// ARGV[1] -> how many entries to return
// ARGV[2] -> position's followed-at, unix ms; "" for the start
// ARGV[3] -> position's member
//
// Returns {ZCARD, member, score, member, score, …}, or {-<n>} when the
// followers are in n buckets.
var followPageScript = redis.NewScript(`
if #KEYS > 1 then
	local state = redis.call('HGET', KEYS[2], 'followerBuckets')
	if state and string.match(state, '^%d+$') then
		return {-tonumber(state)}
	end
end
local limit = tonumber(ARGV[1])
local out = {redis.call('ZCARD', KEYS[1])}
local function push(entries)
	for i = 1, #entries, 2 do
		if #out >= 1 + 2 * limit then
			return
		end
		out[#out + 1] = entries[i]
		out[#out + 1] = entries[i + 1]
	end
end
if ARGV[2] == '' then
	push(redis.call('ZRANGE', KEYS[1], '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit, 'WITHSCORES'))
	return out
end
local at, member = ARGV[2], ARGV[3]
local score = redis.call('ZSCORE', KEYS[1], member)
if score and tonumber(score) == tonumber(at) then
	local rank = redis.call('ZREVRANK', KEYS[1], member)
	push(redis.call('ZRANGE', KEYS[1], rank + 1, rank + limit, 'REV', 'WITHSCORES'))
	return out
end
-- before(a, b) is the member order of Redis: bytewise, shorter first.
local function before(a, b)
	for i = 1, math.min(#a, #b) do
		local x, y = string.byte(a, i), string.byte(b, i)
		if x ~= y then
			return x < y
		end
	end
	return #a < #b
end
local ties = redis.call('ZRANGE', KEYS[1], at, at, 'BYSCORE', 'REV', 'WITHSCORES')
for i = 1, #ties, 2 do
	if before(ties[i], member) then
		push({ties[i], ties[i + 1]})
	end
end
local left = limit - (#out - 1) / 2
if left > 0 then
	push(redis.call('ZRANGE', KEYS[1], '(' .. at, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, left, 'WITHSCORES'))
end
return out
`)

// Follow implements warble.FollowService.
//
// The steps cross hash slots and are ordered so that each may be retried:
// (1) the follower's following set, with the limit; (2) the followee's
// followers set, made to mirror (1); (3) the followee's recent posts copied
// into the follower's home timeline; (4) a RESYNC to the follower's live home
// timeline. Steps 2 to 4 run even when (1) finds the follow made already, so
// that calling Follow again repairs a follow that a crash cut short.
func (s *FollowService) Follow(ctx context.Context, followerID, followeeID string) error {
	ctx = s.db.noteWrites(ctx) // see awaitReplicas
	token, err := s.checkPair(ctx, followerID, followeeID, errFollowSelf)
	if err != nil {
		return err
	}
	res, err := followScript.Run(ctx, s.db.client, []string{followingKey(followerID)},
		followeeID, msString(s.db.now()), s.db.opts.MaxFollowing).Slice()
	if err != nil {
		return fmt.Errorf("follow %s -> %s: %w", followerID, followeeID, err)
	}
	status, _ := res[0].(int64)
	if status < 0 {
		// Nothing was written: the count checkPair made goes.
		if err := confirmMirrorScript.Run(ctx, s.db.client, []string{followersUnsureKey(followeeID)}, followerID, token).Err(); err != nil {
			return fmt.Errorf("follow %s -> %s: %w", followerID, followeeID, err)
		}
		return warble.Errorf(warble.EINVALID,
			"You can follow at most %d users. Unfollow someone before following anyone else.", s.db.opts.MaxFollowing)
	}
	// The truth is written: the rest runs to its end even if the client
	// hangs up, since fan-out walks the followers side, and a follower it
	// does not list would get none of the followee's posts while the
	// truth says they follow.
	ctx = context.WithoutCancel(ctx)
	written, err := s.mirrorFollow(ctx, followerID, followeeID, true, replyString(res[1]), token)
	if err != nil {
		return err
	}
	added, newest, err := s.backfill(ctx, followerID, followeeID)
	if err != nil {
		return err
	}
	// The backfill announced what it changed (added > 0, or added < -1:
	// an unfollow came last, and posts of the followee were taken off the
	// timeline; see backfillScript). A new follow that changed nothing
	// there still tells the live home timeline, which reads its pulled
	// accounts again on a RESYNC: the followee may be one.
	if status == 1 && added <= 0 && added >= -1 {
		s.publishResync(ctx, followerID, newest)
	}
	return s.db.awaitReplicas(ctx, append(written, followingKey(followerID))...)
}

// Unfollow implements warble.FollowService. It undoes Follow's steps in
// reverse: the following set first, so that fan-out stops delivering the
// followee's new posts, then the followers set, then the followee's posts
// in the home timeline with a RESYNC.
func (s *FollowService) Unfollow(ctx context.Context, followerID, followeeID string) error {
	token, err := s.checkPair(ctx, followerID, followeeID,
		warble.Errorf(warble.EINVALID, "You cannot unfollow yourself."))
	if err != nil {
		return err
	}
	removedFollow, err := s.db.client.ZRem(ctx, followingKey(followerID), followeeID).Result()
	if err != nil {
		return fmt.Errorf("unfollow %s -> %s: %w", followerID, followeeID, err)
	}
	// As in Follow: once the truth is written, a client that hangs up
	// must not leave the followee's posts in the home timeline (the user
	// sees they no longer follow, and does not unfollow again) nor the
	// followers side listing the follower, which fan-out would go on
	// trying.
	ctx = context.WithoutCancel(ctx)
	if _, err := s.mirrorFollow(ctx, followerID, followeeID, false, "", token); err != nil {
		return err
	}
	// Announced in the step that takes the posts off (see
	// unbackfillScript), also when it takes none: for a new unfollow,
	// and for a repeated one of a pulled account, which may repair an
	// unfollow cut short before its announcement. A repeated unfollow of
	// a pushed account announces only posts it takes off.
	announce := removedFollow > 0
	if !announce {
		pulled, err := s.db.pulledAuthors(ctx)
		announce = err != nil || slices.Contains(pulled, followeeID)
	}
	_, err = s.unbackfill(ctx, followerID, followeeID, announce)
	return err
}

// checkPair returns the error for a follow or unfollow of followeeID by
// followerID that cannot be made: malformed ids, oneself (selfErr), or a
// user who does not exist. For a pair that can be, it counts the follower
// up in the followee's unsure hash in the same step (unsureScript), which
// the caller's mirrorFollow counts down, and returns the token that names
// this writer's count there.
func (s *FollowService) checkPair(ctx context.Context, followerID, followeeID string, selfErr error) (token string, err error) {
	if !warble.ValidUserID(followerID) || !warble.ValidUserID(followeeID) {
		return "", errBadUserID
	}
	if followerID == followeeID {
		return "", selfErr
	}
	token = strconv.FormatUint(rand.Uint64(), 36)
	n, err := unsureScript.Run(ctx, s.db.client, []string{userKey(followeeID), followersUnsureKey(followeeID)}, followerID, token).Int()
	if err != nil {
		return "", fmt.Errorf("follow %s -> %s: find followee: %w", followerID, followeeID, err)
	} else if n == 0 {
		return "", errNoUser
	}
	return token, nil
}

// unsureScript counts a follower up in an existing account's unsure hash,
// before a follow or unfollow of the pair writes the truth: from then
// until mirrorFollow confirms that the followers side agrees with the
// truth, the follower's entry there may be stale (see doc.go, "Raw
// deliveries repaired after the fact"). Counted after the truth, a writer
// that died between the truth and the followers side would leave a stale
// entry that nothing marks. It does nothing for an account that does not
// exist.
//
// Each writer counts once, under a token of its own, which it leaves in
// the hash (field "<follower>:<token>") until its confirm: go-redis sends
// a command again when a read timed out or the connection broke after it
// was written, and a count up or down that Redis ran twice would miscount
// the writers; one down too many would clear a racing writer that may
// still die between the truth and the followers side, whose stale entry
// then nothing marks.
//
// KEYS[1] -> w:u:{<followee>}
// KEYS[2] -> w:u:{<followee>}:followers-unsure
// ARGV[1] -> follower id
// ARGV[2] -> the writer's token
//
// Returns 1 if the account exists, else 0.
var unsureScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then
	return 0
end
if redis.call('HSETNX', KEYS[2], ARGV[1] .. ':' .. ARGV[2], 1) == 1 then
	redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
end
return 1
`)

// mirrorFollow makes the followee's followers set agree with the follower's
// following set, the truth, which the caller last saw as (following, at).
// It writes the mirror, then reads the truth again, and goes on until the
// truth it wrote is still the truth after the write. Whichever writer of a
// pair's mirror writes last therefore writes the final truth, however
// follows and unfollows of the pair interleave.
//
// The write and the read are separate round trips on purpose: on Redis
// Cluster the two keys are on different nodes, and a pipeline would not keep
// the read after the write. A write of the mirror is the one set, and the
// follower's bucket too for an account whose followers are in buckets or
// moving there (mirrorFollower). It returns the keys of the last write.
//
// Once the truth agrees with the last write, it counts the follower down
// in the followee's unsure hash, which the caller counted up before it
// wrote the truth (checkPair). A writer that dies or fails between leaves
// the follower counted for good, which costs fan-out a check of the truth
// for that follower per job (see doc.go, "Raw deliveries repaired after
// the fact").
//
// token names the caller's count (checkPair); "" for a caller that made
// none, which then counts nothing down.
func (s *FollowService) mirrorFollow(ctx context.Context, followerID, followeeID string, following bool, at, token string) ([]string, error) {
	for {
		mirrorAt := ""
		if following {
			mirrorAt = formatScore(parseReplyScore(at))
		}
		written, err := s.db.mirrorFollower(ctx, followerID, followeeID, mirrorAt)
		if err != nil {
			return nil, fmt.Errorf("follow %s -> %s: update followers: %w", followerID, followeeID, err)
		}
		if s.db.mirrorWritten != nil {
			s.db.mirrorWritten(followerID, followeeID)
		}
		score, err := s.db.client.ZScore(ctx, followingKey(followerID), followeeID).Result()
		nowFollowing := err == nil
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("follow %s -> %s: check following: %w", followerID, followeeID, err)
		}
		nowAt := ""
		if nowFollowing {
			nowAt = strconv.FormatFloat(score, 'f', -1, 64)
		}
		if nowFollowing == following && (!following || parseReplyScore(nowAt) == parseReplyScore(at)) {
			err := confirmMirrorScript.Run(ctx, s.db.client, []string{followersUnsureKey(followeeID)}, followerID, token).Err()
			if err != nil {
				return nil, fmt.Errorf("follow %s -> %s: confirm followers: %w", followerID, followeeID, err)
			}
			return written, nil
		}
		following, at = nowFollowing, nowAt
	}
}

// confirmMirrorScript counts a follower down in an account's unsure hash
// (see unsureScript), once a writer has confirmed that the followers side
// agrees with the truth, and drops the field once no writer is left
// unconfirmed. It counts down only if the writer's token is still there,
// so that run twice it counts down once.
//
// KEYS[1] -> w:u:{<followee>}:followers-unsure
// ARGV[1] -> follower id
// ARGV[2] -> the writer's token
//
// Returns the count left.
var confirmMirrorScript = redis.NewScript(`
if redis.call('HDEL', KEYS[1], ARGV[1] .. ':' .. ARGV[2]) == 0 then
	return tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or 0)
end
local left = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if left <= 0 then
	redis.call('HDEL', KEYS[1], ARGV[1])
end
return left
`)

// backfill copies the followee's newest posts, up to the home timeline cap,
// into the follower's home timeline. It returns how many were added (or,
// when the followee is no longer followed, -1 minus how many posts of
// theirs it took off) and the newest seq the home timeline then holds. Those that are not in the
// followee's posts set (they moved to the archive) are read from the
// archive, one query, when the set holds fewer than the cap and the
// followee has posts archived.
func (s *FollowService) backfill(ctx context.Context, followerID, followeeID string) (added, newest int64, err error) {
	capN := s.db.opts.HomeCap
	pipe := s.db.client.Pipeline()
	postsCmd := pipe.ZRevRangeWithScores(ctx, postsKey(followeeID), 0, int64(capN-1))
	archivedCmd := pipe.HGet(ctx, userKey(followeeID), archivedPostsField)
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return 0, 0, fmt.Errorf("follow %s -> %s: read posts: %w", followerID, followeeID, err)
	}
	posts := postsCmd.Val()
	if n, _ := archivedCmd.Int64(); n > 0 && s.db.opts.Archive != nil && len(posts) < capN {
		var before int64 // no bound when the set is empty
		if len(posts) > 0 {
			before = int64(posts[len(posts)-1].Score)
		}
		older, err := s.db.opts.Archive.PostsByAuthors(ctx, []string{followeeID}, before, capN-len(posts))
		if err != nil {
			return 0, 0, fmt.Errorf("follow %s -> %s: read archived posts: %w", followerID, followeeID, err)
		}
		for _, p := range older {
			posts = append(posts, redis.Z{Score: float64(p.Seq), Member: p.ID})
		}
	}
	args := make([]any, 0, 3+2*len(posts))
	args = append(args, followeeID, s.db.opts.HomeCap, homeChannel(followerID))
	for _, p := range posts {
		args = append(args, strconv.FormatFloat(p.Score, 'f', -1, 64), p.Member)
	}
	res, err := s.db.pub(backfillScript).Run(ctx, s.db.client, []string{homeKey(followerID), followingKey(followerID)}, args...).Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("follow %s -> %s: copy posts to home timeline: %w", followerID, followeeID, err)
	}
	added, _ = res[0].(int64)
	return added, int64(parseReplyScore(replyString(res[1]))), nil
}

// unbackfill removes the followee's posts from the follower's home timeline,
// and announces it, in one step (see unbackfillScript), with announce also
// when it removes none. It returns how many were removed.
func (s *FollowService) unbackfill(ctx context.Context, followerID, followeeID string, announce bool) (int64, error) {
	flag := "0"
	if announce {
		flag = "1"
	}
	n, err := s.db.pub(unbackfillScript).Run(ctx, s.db.client, []string{homeKey(followerID), followingKey(followerID)},
		followeeID, homeChannel(followerID), flag).Int64()
	if err != nil {
		return 0, fmt.Errorf("unfollow %s -> %s: remove posts from home timeline: %w", followerID, followeeID, err)
	}
	return max(n, 0), nil // -1: followed again meanwhile; that follow's backfill stands
}

// publishResync tells the follower's live home timelines that a follow or
// unfollow rewrote it. Pub/sub is at most once anyway, so a failure is
// logged, not returned: the follow itself is done.
func (s *FollowService) publishResync(ctx context.Context, userID string, newest int64) {
	if err := s.db.publish(ctx, s.db.client, homeChannel(userID), encodeResync(newest)).Err(); err != nil {
		s.db.log.WarnContext(ctx, "publish home timeline resync", "user", userID, "err", err)
	}
}

// IsFollowing implements warble.FollowService.
func (s *FollowService) IsFollowing(ctx context.Context, followerID, followeeID string) (bool, error) {
	if !warble.ValidUserID(followerID) || !warble.ValidUserID(followeeID) {
		return false, nil
	}
	err := s.db.client.ZScore(ctx, followingKey(followerID), followeeID).Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("is %s following %s: %w", followerID, followeeID, err)
	}
	return true, nil
}

// FindFollowStates implements warble.FollowService in one round trip: a
// ZMSCORE of the users in the viewer's following set, and per user a
// ZSCORE of the viewer in theirs.
func (s *FollowService) FindFollowStates(ctx context.Context, viewerID string, userIDs []string) ([]warble.FollowState, error) {
	states := make([]warble.FollowState, len(userIDs))
	if !warble.ValidUserID(viewerID) || len(userIDs) == 0 {
		return states, nil
	}
	pipe := s.db.client.Pipeline()
	viewerFollows := zmscore(ctx, pipe, followingKey(viewerID), userIDs)
	followsViewer := make([]*redis.FloatCmd, len(userIDs))
	for i, id := range userIDs {
		if warble.ValidUserID(id) {
			followsViewer[i] = pipe.ZScore(ctx, followingKey(id), viewerID)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("follow states of %s: %w", viewerID, err)
	}
	scores, err := parseScores(viewerFollows, len(userIDs))
	if err != nil {
		return nil, fmt.Errorf("follow states of %s: %w", viewerID, err)
	}
	for i := range userIDs {
		states[i].ViewerFollows = scores[i] >= 0
		states[i].FollowsViewer = followsViewer[i] != nil && followsViewer[i].Err() == nil
	}
	return states, nil
}

// FindFollowers implements warble.FollowService.
func (s *FollowService) FindFollowers(ctx context.Context, userID string, page warble.PageArgs) (*warble.UserConnection, error) {
	return s.findFollows(ctx, "followers of "+userID, userID, followersSet(userID, 0), page)
}

// FindFollowing implements warble.FollowService.
func (s *FollowService) FindFollowing(ctx context.Context, userID string, page warble.PageArgs) (*warble.UserConnection, error) {
	return s.findFollows(ctx, "following of "+userID, userID, followingSet(userID), page)
}

// findFollows reads a page of one follow set: one script call for the
// entries and the set's size, then one batch for the users. Followers in
// buckets take one round trip more, in which every bucket answers its
// page, and the pages are merged.
func (s *FollowService) findFollows(ctx context.Context, what, userID string, set followSet, page warble.PageArgs) (*warble.UserConnection, error) {
	if err := page.Validate(warble.MaxPageSize); err != nil {
		return nil, err
	}
	var pos followPos
	if page.After != nil {
		ms, member, err := warble.ParseFollowCursor(*page.After)
		if err != nil {
			return nil, err
		}
		pos = followPos{at: ms, member: member, set: true}
	}
	if !warble.ValidUserID(userID) {
		return nil, errNoUser
	}
	total, entries, err := s.readFollows(ctx, &set, pos, page.First+1)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", what, err)
	}
	matches := make([]followMatch, len(entries))
	for i, e := range entries {
		matches[i] = followMatch{followEntry: e, followedAt: e.at}
	}
	conn, err := s.connection(ctx, matches, page.First, func(e followEntry) string {
		return warble.FollowCursor(time.UnixMilli(e.at), e.member)
	})
	if err != nil {
		return nil, err
	}
	conn.Total = int(total)
	return conn, nil
}

// followPos is a keyset position in a follow set; the zero value is the start.
type followPos struct {
	at     int64 // followed-at, unix ms
	member string
	set    bool
}

// followEntry is one member of a follow set and its score.
type followEntry struct {
	member string
	at     int64
}

// followMatch is an entry of a walked set that belongs in a connection, with
// the followed-at its edge shows.
type followMatch struct {
	followEntry
	followedAt int64
}

// readFollows reads up to limit entries of set after pos, newest first,
// and the set's size. A set that turns out to have moved into buckets is
// changed to them, and read there.
func (s *FollowService) readFollows(ctx context.Context, set *followSet, pos followPos, limit int) (int64, []followEntry, error) {
	for {
		var read func() (int64, []followEntry, error)
		err := runScripts(ctx, s.db.client, func(pipe redis.Pipeliner) {
			read = queuePage(ctx, pipe, *set, pos, limit)
		}, followPageScript)
		if err != nil {
			return 0, nil, err
		}
		total, entries, err := read()
		if set.follow(err) {
			continue
		}
		return total, entries, err
	}
}

// parseFollowPage decodes the answer of followPageScript.
func parseFollowPage(cmd *redis.Cmd) (int64, []followEntry, error) {
	res, err := cmd.Slice()
	if err != nil {
		return 0, nil, err
	}
	if len(res) == 0 || len(res)%2 != 1 {
		return 0, nil, fmt.Errorf("follow page: unexpected answer of %d elements", len(res))
	}
	total, _ := res[0].(int64)
	entries := make([]followEntry, 0, (len(res)-1)/2)
	for i := 1; i+1 < len(res); i += 2 {
		entries = append(entries, followEntry{member: replyString(res[i]), at: int64(parseReplyScore(replyString(res[i+1])))})
	}
	return total, entries, nil
}

// connection turns up to first+1 matches into a page of users, reading the
// users in one batch.
func (s *FollowService) connection(ctx context.Context, matches []followMatch, first int, cursor func(followEntry) string) (*warble.UserConnection, error) {
	conn := &warble.UserConnection{Edges: []*warble.UserEdge{}}
	if len(matches) > first {
		conn.PageInfo.HasNextPage = true
		matches = matches[:first]
	}
	ids := make([]string, len(matches))
	for i, m := range matches {
		ids[i] = m.member
	}
	users, err := s.db.findUsers(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i, m := range matches {
		c := cursor(m.followEntry)
		// The cursor moves past every entry read, even one whose user is
		// missing, so that the next page starts after it.
		conn.PageInfo.EndCursor = &c
		if users[i] == nil {
			continue
		}
		at := time.UnixMilli(m.followedAt).UTC()
		conn.Edges = append(conn.Edges, &warble.UserEdge{Cursor: c, Node: users[i], FollowedAt: &at})
	}
	return conn, nil
}

// FindCommonFollowers implements warble.FollowService: the users who follow
// both viewerID and userID. An edge's followedAt is when its user followed
// userID.
func (s *FollowService) FindCommonFollowers(ctx context.Context, viewerID, userID string, page warble.PageArgs) (*warble.UserConnection, error) {
	return s.findCommon(ctx, "common followers", viewerID, userID,
		followSetRef{userID: userID, followers: true}, followSetRef{userID: viewerID, followers: true}, page)
}

// FindCommonFollowing implements warble.FollowService: the users whom both
// viewerID and userID follow. An edge's followedAt is when userID followed
// its user.
func (s *FollowService) FindCommonFollowing(ctx context.Context, viewerID, userID string, page warble.PageArgs) (*warble.UserConnection, error) {
	return s.findCommon(ctx, "common following", viewerID, userID,
		followSetRef{userID: userID}, followSetRef{userID: viewerID}, page)
}

// FindFollowersYouFollow implements warble.FollowService: userID's followers
// whom viewerID follows. An edge's followedAt is when its user followed
// userID.
func (s *FollowService) FindFollowersYouFollow(ctx context.Context, viewerID, userID string, page warble.PageArgs) (*warble.UserConnection, error) {
	return s.findCommon(ctx, "followers you follow", viewerID, userID,
		followSetRef{userID: userID, followers: true}, followSetRef{userID: viewerID}, page)
}

// Sides of an intersection: which of the two sets a common cursor walks.
const (
	sideUser   = 'u' // the set of the user whose profile is shown
	sideViewer = 'v' // the viewer's set
)

// findCommon reads a page of the intersection of userSet, whose scores the
// edges show, and viewerSet. The two sets may be in different hash slots
// (and followers may be in buckets), so it cannot use ZINTER. Instead it
// walks the smaller set newest first, in chunks, and asks the other set
// about each chunk with ZMSCORE; each round trip carries the ZMSCORE of
// one chunk and the read of the next. The cursor names the set walked, so
// that later pages walk the same one.
func (s *FollowService) findCommon(ctx context.Context, what, viewerID, userID string, userRef, viewerRef followSetRef, page warble.PageArgs) (*warble.UserConnection, error) {
	if err := page.Validate(warble.MaxPageSize); err != nil {
		return nil, err
	}
	var side byte
	var pos followPos
	if page.After != nil {
		var err error
		if side, pos, err = parseCommonCursor(*page.After); err != nil {
			return nil, err
		}
	}
	if viewerID == "" || !warble.ValidUserID(viewerID) || !warble.ValidUserID(userID) {
		return &warble.UserConnection{Edges: []*warble.UserEdge{}}, nil
	}
	what = fmt.Sprintf("find %s of %s and %s", what, viewerID, userID)
	sets, counts, err := s.db.resolveSets(ctx, userRef, viewerRef)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if side == 0 {
		side = sideUser
		if counts[1] < counts[0] {
			side = sideViewer
		}
	}
	walked, probed := sets[0], sets[1]
	if side == sideViewer {
		walked, probed = sets[1], sets[0]
	}

	want := page.First + 1
	var matches []followMatch
	err = s.walkIntersection(ctx, &walked, &probed, pos, func(e followEntry, probedAt int64) bool {
		m := followMatch{followEntry: e, followedAt: e.at}
		if side == sideViewer {
			m.followedAt = probedAt
		}
		matches = append(matches, m)
		return len(matches) < want
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	conn, err := s.connection(ctx, matches, page.First, func(e followEntry) string {
		return formatCommonCursor(side, e.at, e.member)
	})
	if err != nil {
		return nil, err
	}
	conn.Count = func(ctx context.Context) (int, error) {
		n, err := s.countIntersection(ctx, userRef, viewerRef)
		if err != nil {
			return 0, fmt.Errorf("count %s: %w", what, err)
		}
		return n, nil
	}
	return conn, nil
}

// walkIntersection walks walked newest first from after pos and calls match
// for each entry that probed also holds, with its score there, until match
// returns false or walked ends. A set that turns out to have moved into
// buckets is changed to them, and the round trip is made again there.
func (s *FollowService) walkIntersection(ctx context.Context, walked, probed *followSet, pos followPos, match func(e followEntry, probedAt int64) bool) error {
	var chunk []followEntry // read and not yet probed
	more := true            // whether walked may hold entries after pos
	for chunk != nil || more {
		members := make([]string, len(chunk))
		for i, e := range chunk {
			members[i] = e.member
		}
		var readScores func() ([]int64, error)
		var readNext func() (int64, []followEntry, error)
		err := runScripts(ctx, s.db.client, func(pipe redis.Pipeliner) {
			readScores, readNext = nil, nil
			if len(chunk) > 0 {
				readScores = queueScores(ctx, pipe, *probed, members)
			}
			if more {
				readNext = queuePage(ctx, pipe, *walked, pos, followChunk)
			}
		}, followPageScript, probeFollowersScript)
		if err != nil {
			return err
		}
		var scores []int64
		if readScores != nil {
			if scores, err = readScores(); probed.follow(err) {
				continue
			} else if err != nil {
				return err
			}
		}
		var next []followEntry
		if readNext != nil {
			if _, next, err = readNext(); walked.follow(err) {
				continue
			} else if err != nil {
				return err
			}
		}
		for i, at := range scores {
			if at >= 0 && !match(chunk[i], at) {
				return nil
			}
		}
		chunk = nil
		if more {
			if len(next) > 0 {
				chunk = next
				last := next[len(next)-1]
				pos = followPos{at: last.at, member: last.member, set: true}
			}
			more = len(next) == followChunk
		}
	}
	return nil
}

// countIntersection counts the members two sets share by walking the
// smaller in chunks and asking the other about each chunk with ZMSCORE,
// the next chunk's read riding in the same round trip. Members that move
// while it walks may be counted once too often or not at all; it is a
// count for display.
func (s *FollowService) countIntersection(ctx context.Context, a, b followSetRef) (int, error) {
	sets, counts, err := s.db.resolveSets(ctx, a, b)
	if err != nil {
		return 0, err
	}
	walked, probed := sets[0], sets[1]
	if counts[1] < counts[0] {
		walked, probed = sets[1], sets[0]
	}
	n := 0
	err = s.walkIntersection(ctx, &walked, &probed, followPos{}, func(followEntry, int64) bool {
		n++
		return true
	})
	return n, err
}

// A common cursor is the position of an entry in the set an intersection
// walks, and which set that is: "c", the side letter, followed-at ms, ":"
// and the member, base64url-encoded like the domain's cursors.
const commonCursorKind = "c"

// formatCommonCursor returns the cursor of the entry (at, member) in the set
// of the given side.
func formatCommonCursor(side byte, at int64, member string) string {
	raw := commonCursorKind + string(side) + strconv.FormatInt(at, 10) + ":" + member
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

// parseCommonCursor returns the side and position a common cursor encodes,
// or EINVALID.
func parseCommonCursor(cursor string) (side byte, pos followPos, err error) {
	bad := warble.Errorf(warble.EINVALID, "The cursor is not valid.")
	if len(cursor) > 64 {
		return 0, pos, bad
	}
	b, derr := base64.RawURLEncoding.DecodeString(cursor)
	raw := string(b)
	// Only the form formatCommonCursor makes: the decoder also takes
	// strings with CR or LF in them, or other unused bits at the end.
	if derr != nil || base64.RawURLEncoding.EncodeToString(b) != cursor ||
		len(raw) < 2 || !strings.HasPrefix(raw, commonCursorKind) {
		return 0, pos, bad
	}
	side = raw[1]
	msText, member, found := strings.Cut(raw[2:], ":")
	ms, perr := strconv.ParseInt(msText, 10, 64)
	if (side != sideUser && side != sideViewer) || !found || perr != nil || ms < 0 ||
		strconv.FormatInt(ms, 10) != msText || !warble.ValidUserID(member) {
		return 0, pos, bad
	}
	return side, followPos{at: ms, member: member, set: true}, nil
}

// doer sends a command: a client or a pipeline.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// zmscore sends (or queues) ZMSCORE of members in key. It is sent as a plain
// command, not go-redis's ZMScore, which reads a missing member as the score 0.
func zmscore(ctx context.Context, pipe doer, key string, members []string) *redis.Cmd {
	args := make([]any, 0, 2+len(members))
	args = append(args, "zmscore", key)
	for _, m := range members {
		args = append(args, m)
	}
	return pipe.Do(ctx, args...)
}

// parseScores reads the answer of zmscore for n members: each score as an
// integer, -1 for a member the set does not hold.
func parseScores(cmd *redis.Cmd, n int) ([]int64, error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, err
	} else if len(res) != n {
		return nil, fmt.Errorf("zmscore: %d scores for %d members", len(res), n)
	}
	scores := make([]int64, n)
	for i, v := range res {
		switch v := v.(type) {
		case nil:
			scores[i] = -1
		case float64: // RESP3
			scores[i] = int64(v)
		case string: // RESP2
			scores[i] = int64(parseReplyScore(v))
		default:
			return nil, fmt.Errorf("zmscore: unexpected score %T", v)
		}
	}
	return scores, nil
}

// replyString returns a script answer element as a string.
func replyString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return ""
}

// parseReplyScore reads a score as Redis prints it; "" and garbage give 0.
func parseReplyScore(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}
