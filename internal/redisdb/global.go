package redisdb

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// The global timeline past its cap.
//
// w:global holds the newest GlobalCap posts of everybody. With an archive,
// the timeline goes on past them: the archive holds every post that moved
// there, and the posts between the two, those the cap took off w:global
// while their authors still hold them in Redis (an author keeps up to
// PostsInRedis posts for up to PostsInRedisFor), are in the global tail
// (globalTailKey): the script that trims w:global puts what it trims
// there, in the same step. A post leaves the tail when the mover takes it
// to the archive, or when it is deleted; a page merges the tail and the
// archive by seq and reads each id once, so an id in both for a moment
// (the mover died between its move and the tail's update) costs nothing.
// The tail holds ids only, of posts in Redis: its size follows the posts
// Redis keeps, not history. Without an archive there is no tail, and the
// global timeline ends at its cap, as every post then stays in Redis and
// no index of all of them would be bounded.

// listGlobalLua defines listGlobal(key, tail, seq, id, cap, channel,
// msg), which adds a post to the global timeline, trims it to its cap and
// announces it. It is idempotent: a post the timeline holds already (a
// repeated job) is not announced again, nor one older than everything the
// capped timeline keeps. With a tail key (not nil), what the cap takes off
// goes there. It returns 1 if the post was added, 0 if it was there
// already or trimmed at once. listGlobalScript runs it, and on one Redis
// so does createPostOneRedisScript.
//
// The global timeline adds before it trims, so that it becomes a skiplist
// once full (see listpack.go).
const listGlobalLua = `
local function listGlobal(key, tail, seq, id, cap, channel, msg)
	if redis.call('ZADD', key, seq, id) == 0 then
		return 0
	end
	local over = redis.call('ZCARD', key) - cap
	if over > 0 then
		if tail then
			local old = redis.call('ZRANGE', key, 0, over - 1, 'WITHSCORES')
			for i = 1, #old, 2 do
				redis.call('ZADD', tail, old[i + 1], old[i])
			end
		end
		redis.call('ZREMRANGEBYRANK', key, 0, over - 1)
		if not redis.call('ZSCORE', key, id) then
			return 0
		end
	end
	redis.call('PUBLISH', channel, msg)
	return 1
end
`

// listGlobalScript is listGlobal (listGlobalLua) as a script of its own.
//
// KEYS[1] -> w:global
// KEYS[2] -> w:{w:global}:tail (with an archive)
// ARGV[1] -> post seq
// ARGV[2] -> post id
// ARGV[3] -> the timeline's cap
// ARGV[4] -> the timeline's channel
// ARGV[5] -> the added message
//
// Returns 1 if the post was added, 0 if it was there already or trimmed at
// once.
var listGlobalScript = newPubScript(listGlobalLua + `
return listGlobal(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5])
`)

// globalPastCap reads up to limit entries of the global timeline below a
// seq (from the top when bounded is false) past its cap: the tail's and
// the archive's, merged by seq, each id once. Two round trips: one to
// Redis, one query.
func (db *DB) globalPastCap(ctx context.Context, below int64, bounded bool, limit int) ([]feedEntry, error) {
	if bounded && below <= 1 {
		return nil, nil // seqs start at 1
	}
	max := "+inf"
	if bounded {
		max = seqArg(below)
	}
	tail, err := db.rangeFeed(ctx, redis.ZRangeArgs{
		Key: globalTailKey, Start: max, Stop: "-inf", ByScore: true, Rev: true, Count: int64(limit),
	})
	if err != nil {
		return nil, fmt.Errorf("read the global timeline's tail: %w", err)
	}
	before := int64(0)
	if bounded {
		before = below
	}
	archived, err := db.opts.Archive.LatestPosts(ctx, before, limit)
	if err != nil {
		return nil, fmt.Errorf("read archived posts: %w", err)
	}
	// The archive's first: of an id in both, the entry read with its post
	// stays.
	return mergeEntries(append(postEntries(archived), tail...), true, limit), nil
}

// untail takes posts that moved to the archive out of the global
// timeline's tail, where the archive now answers for them. A failure is
// logged: an id left there is read once, from the archive, all the same.
func (db *DB) untail(ctx context.Context, posts []*warble.Post) {
	ids := make([]any, len(posts))
	for i, p := range posts {
		ids[i] = p.ID
	}
	if err := db.client.ZRem(ctx, globalTailKey, ids...).Err(); err != nil {
		db.log.WarnContext(ctx, "take moved posts out of the global timeline's tail", "posts", len(ids), "err", err)
	}
}
