package redisdb

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultInactiveAfter is the default of Options.InactiveAfter.
const DefaultInactiveAfter = 7 * 24 * time.Hour

// seenEvery is how often one process records that a user was seen: a small
// part of InactiveAfter, at most an hour.
func (db *DB) seenEvery() time.Duration { return min(time.Hour, db.opts.InactiveAfter/8) }

// inactiveCutoff is the seenKey value below which a follower is skipped,
// as deliverScript takes it: unix ms, or 0 when nobody is skipped.
func (db *DB) inactiveCutoff() int64 {
	if db.opts.InactiveAfter < 0 {
		return 0
	}
	return db.now().Add(-db.opts.InactiveAfter).UnixMilli()
}

// seenCache remembers when this process last recorded users as seen.
type seenCache struct {
	mu   sync.Mutex
	when map[string]time.Time
}

// due reports whether userID's seen time is to be recorded at now, and
// counts it as recorded.
func (c *seenCache) due(userID string, now time.Time, every time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.when == nil || len(c.when) > 100_000 {
		c.when = make(map[string]time.Time) // forget rather than grow
	}
	if last, ok := c.when[userID]; ok && now.Sub(last) < every && now.Sub(last) >= 0 {
		return false
	}
	c.when[userID] = now
	return true
}

func (c *seenCache) forget(userID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.when, userID)
}

// touchScript records that a user was seen, and returns what the caller
// needs to rebuild the home timeline of a user who was inactive: the time
// recorded before, and the newest seq in the home timeline at the moment
// fan-out stops skipping the user. Every post it skipped is newer than that
// (fan-out skipped everything since the user went inactive) and was stored
// before this step; every post after it is delivered.
//
// KEYS[1] -> w:u:{<id>}:seen
// KEYS[2] -> w:u:{<id>}:home
// ARGV[1] -> now, unix ms
//
// Returns {the time recorded before ("" if none), the newest seq ("0" if
// the timeline is empty)}.
var touchScript = redis.NewScript(`
local old = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1])
local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
return {old or '', top[2] or '0'}
`)

// Seen records that userID made a request. A user who had been inactive
// gets their home timeline rebuilt first. It costs no round trip when this
// process recorded the user lately.
func (db *DB) Seen(ctx context.Context, userID string) error {
	if db.opts.InactiveAfter < 0 || !db.seen.due(userID, db.opts.Now(), db.seenEvery()) {
		return nil
	}
	res, err := touchScript.Run(ctx, db.client, []string{seenKey(userID), homeKey(userID)}, db.now().UnixMilli()).Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected answer %v", res)
	}
	if err != nil {
		db.seen.forget(userID)
		return fmt.Errorf("record that %s was seen: %w", userID, err)
	}
	old := replyString(res[0])
	if at, err := strconv.ParseInt(old, 10, 64); err != nil || at >= db.inactiveCutoff() {
		return nil
	}
	newest, _ := strconv.ParseInt(replyString(res[1]), 10, 64)
	if err := db.rebuildHome(ctx, userID, newest); err != nil {
		// Inactive again, so that the next request rebuilds (the posts
		// delivered meanwhile are newer than what it will read from).
		db.seen.forget(userID)
		if err := db.client.Set(ctx, seenKey(userID), old, 0).Err(); err != nil {
			db.log.ErrorContext(ctx, "home timeline of a returning user not rebuilt", "user", userID, "err", err)
		}
		return err
	}
	return nil
}

// rebuildScript adds the posts that fan-out skipped to a returning user's
// home timeline, those of authors the user still follows, trims it to its
// cap, and announces a RESYNC if anything was added.
//
// KEYS[1] -> w:u:{<id>}:home
// KEYS[2] -> w:u:{<id>}:following
// ARGV[1] -> home timeline cap
// ARGV[2] -> the home channel
// ARGV[3..] -> post seq, post id, author id, …
//
// Returns how many posts were added.
var rebuildScript = newPubScript(addCappedLua + `
local entries = {}
for i = 3, #ARGV, 3 do
	if redis.call('ZSCORE', KEYS[2], ARGV[i + 2]) then
		entries[#entries + 1] = ARGV[i]
		entries[#entries + 1] = ARGV[i + 1]
	end
end
local added = addAllCapped(KEYS[1], tonumber(ARGV[1]), entries)
if added > 0 then
	local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
	redis.call('PUBLISH', ARGV[2], 'S ' .. (top[2] or '0'))
end
return added
`)

// rebuildHome brings the home timeline of a user back from inactivity: the
// posts of everyone the user follows that are newer than newest, the
// timeline's newest entry when fan-out stopped skipping the user, at most
// HomeCap of them, merged by seq. Three round trips: the following set;
// the followees' posts; the write.
func (db *DB) rebuildHome(ctx context.Context, userID string, newest int64) error {
	following, err := db.client.ZRange(ctx, followingKey(userID), 0, -1).Result()
	if err != nil {
		return fmt.Errorf("rebuild home of %s: %w", userID, err)
	}
	if len(following) == 0 {
		return nil
	}
	capN := int64(db.opts.HomeCap)
	pipe := db.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(following))
	for i, f := range following {
		cmds[i] = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: postsKey(f), Start: "+inf", Stop: seqArg(newest), ByScore: true, Rev: true, Count: capN,
		})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("rebuild home of %s: read posts: %w", userID, err)
	}
	var entries []feedEntry
	for _, c := range cmds {
		entries = append(entries, feedEntries(c.Val())...)
	}
	entries = mergeEntries(entries, true, int(capN))
	if len(entries) == 0 {
		return nil
	}
	args := make([]any, 0, 2+3*len(entries))
	args = append(args, db.opts.HomeCap, homeChannel(userID))
	for _, e := range entries {
		args = append(args, strconv.FormatInt(e.seq, 10), e.postID, postAuthor(e.postID))
	}
	added, err := db.pub(rebuildScript).Run(ctx, db.client, []string{homeKey(userID), followingKey(userID)}, args...).Int()
	if err != nil {
		return fmt.Errorf("rebuild home of %s: %w", userID, err)
	}
	db.log.InfoContext(ctx, "rebuilt the home timeline of a returning user", "user", userID,
		"following", len(following), "added", added)
	return nil
}

// postAuthor returns the author id of a well-formed post id.
func postAuthor(postID string) string {
	author, _, _ := splitPostID(postID)
	return author
}
