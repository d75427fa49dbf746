package redisdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	if !db.seenDue(userID) {
		return nil
	}
	return db.recordSeen(ctx, userID, nil)
}

// seenDue reports whether userID's visit is to be recorded now, and counts
// it as recorded.
func (db *DB) seenDue(userID string) bool {
	return db.opts.InactiveAfter >= 0 && db.seen.due(userID, db.opts.Now(), db.seenEvery())
}

// seenWait is how long a request waits for the record of its visit (see
// seenSoon) before it goes on without it. Recording takes one round trip,
// and a returning user's rebuild a few more, which it waits for.
const seenWait = 500 * time.Millisecond

// errSeenLate says that a visit's record was not answered within seenWait,
// and goes on in the background.
var errSeenLate = fmt.Errorf("not answered within %v; it goes on in the background", seenWait)

// seenSoon is Seen for a request that does not need the record to answer:
// it waits for it at most seenWait, and then returns errSeenLate and lets
// it finish in the background. A master that does not answer (frozen, out
// of reach) would otherwise hold every signed-in request up for
// go-redis's timeouts and retries, seconds each, for a write that is best
// effort: the next request of the user records the visit if this one
// fails, and until then fan-out may skip the user, as it did before.
//
// Once Redis has answered that the user was inactive, it waits for the
// rebuild, however long it takes (up to ctx), so that the read that
// follows is complete. The record is made with ctx's values but not its
// end: a request that ends cannot cut the rebuild short, nor its undoing
// when it fails (see Seen).
func (db *DB) seenSoon(ctx context.Context, userID string) error {
	if !db.seenDue(userID) {
		return nil
	}
	return db.recordSeenSoon(ctx, userID)
}

// recordSeenSoon is seenSoon once due.
func (db *DB) recordSeenSoon(ctx context.Context, userID string) error {
	var rebuilding, abandoned atomic.Bool
	done := make(chan error, 1)
	go func() {
		err := db.recordSeen(context.WithoutCancel(ctx), userID, &rebuilding)
		done <- err
		if err != nil && abandoned.Load() {
			db.log.WarnContext(ctx, "record a user's visit, in the background", "user", userID, "err", err)
		}
	}()
	timer := time.NewTimer(seenWait)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		if rebuilding.Load() {
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
		}
	case <-ctx.Done():
	}
	abandoned.Store(true)
	select {
	case err := <-done:
		return err
	default:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errSeenLate
	}
}

// recordSeen is Seen once due. It sets rebuilding, if not nil, when the
// user turns out to have been inactive, before the rebuild.
func (db *DB) recordSeen(ctx context.Context, userID string, rebuilding *atomic.Bool) error {
	// The seen index first, in the same round trip: the index only says
	// where to look (dropIdleHomes checks seenKey itself), so the order of
	// the two does not matter.
	now := db.now().UnixMilli()
	var touch *redis.Cmd
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		pipe.ZAdd(ctx, seenIndexKey(db.fanOutShard(userID)), redis.Z{Score: float64(now), Member: userID})
		touch = touchScript.EvalSha(ctx, pipe, []string{seenKey(userID), homeKey(userID)}, now)
	}, touchScript)
	var res []any
	if err == nil {
		res, err = touch.Slice()
	}
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
	if rebuilding != nil {
		rebuilding.Store(true)
	}
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
// home timeline, those of the user and of authors the user still follows,
// trims it to its cap, and announces a RESYNC if anything was added.
//
// KEYS[1] -> w:u:{<id>}:home
// KEYS[2] -> w:u:{<id>}:following
// ARGV[1] -> home timeline cap
// ARGV[2] -> the home channel
// ARGV[3] -> the user's id
// ARGV[4..] -> post seq, post id, author id, …
//
// Returns how many posts were added.
var rebuildScript = newPubScript(addCappedLua + `
local entries = {}
for i = 4, #ARGV, 3 do
	if ARGV[i + 2] == ARGV[3] or redis.call('ZSCORE', KEYS[2], ARGV[i + 2]) then
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
// posts of everyone the user follows, and the user's own, that are newer
// than newest, the timeline's newest entry when fan-out stopped skipping
// the user, at most HomeCap of them, merged by seq. (The user's own posts
// are in a timeline that fan-out skipped, but not in one that
// dropIdleHomes dropped, which has newest 0.) Three round trips: the
// following set; the posts; the write. With an archive, a fourth and one
// query when some followed account's posts set falls short of what the
// rebuild needs: their posts that moved meanwhile.
func (db *DB) rebuildHome(ctx context.Context, userID string, newest int64) error {
	following, err := db.client.ZRange(ctx, followingKey(userID), 0, -1).Result()
	if err != nil {
		return fmt.Errorf("rebuild home of %s: %w", userID, err)
	}
	following = append(following, userID)
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
	archived, err := db.archivedNewerThan(ctx, following, cmds, newest, int(capN))
	if err != nil {
		return fmt.Errorf("rebuild home of %s: %w", userID, err)
	}
	entries = mergeEntries(append(archived, entries...), true, int(capN))
	if len(entries) == 0 {
		return nil
	}
	args := make([]any, 0, 3+3*len(entries))
	args = append(args, db.opts.HomeCap, homeChannel(userID), userID)
	for _, e := range entries {
		args = append(args, strconv.FormatInt(e.seq, 10), e.postID, postAuthor(e.postID))
	}
	added, err := db.pub(rebuildScript).Run(ctx, db.client, []string{homeKey(userID), followingKey(userID)}, args...).Int()
	if err != nil {
		return fmt.Errorf("rebuild home of %s: %w", userID, err)
	}
	db.log.InfoContext(ctx, "rebuilt the home timeline of a returning user", "user", userID,
		"following", len(following)-1, "added", added)
	return nil
}

// postAuthor returns the author id of a well-formed post id.
func postAuthor(postID string) string {
	author, _, _ := splitPostID(postID)
	return author
}

// Idle home timelines. A user unseen for InactiveAfter gets nothing from
// fan-out, and their home timeline is rebuilt when they come back, so
// keeping it only costs memory: about 29 KB as a listpack, 126 KB as a
// skiplist, for a full one. The sweeping worker of each process drops
// those timelines (dropIdleHomes), finding their owners in the seen index
// of each fan-out shard (seenIndexKey) rather than by scanning keys.
//
// A drop and a return cannot leave a user with an empty home timeline.
// dropHomeScript checks the user's seenKey in the same atomic step as the
// DEL, so it drops nothing of a user that touchScript has recorded; and
// it sets seenKey to 0, so that the return that follows a drop always
// finds the user inactive, whatever the clocks of the worker and of the
// server say, and rebuilds the timeline from everything (touchScript then
// reads no newest entry: newest 0). The index entry of a dropped user
// leaves only if it still holds the time the worker read, so a return that
// indexed the user again meanwhile keeps its entry.
const (
	dropBatch    = 500    // users one round trip of dropIdleHomes looks at
	dropPerSweep = 20_000 // users one sweep looks at, at most: a backlog waits for the next
)

// dropHomeScript drops the home timeline of a user not seen since the
// cutoff, and marks the user as seen at 0, so that their next request
// rebuilds it.
//
// KEYS[1] -> w:u:{<id>}:seen
// KEYS[2] -> w:u:{<id>}:home
// ARGV[1] -> the inactive cutoff, unix ms
//
// Returns -1 if it dropped the timeline (or the user had none), -2 if the
// user has no seenKey (counts as active, see doc.go), else the time the
// user was seen, at or after the cutoff.
var dropHomeScript = redis.NewScript(`
local seen = redis.call('GET', KEYS[1])
if not seen then
	return -2
end
if tonumber(seen) >= tonumber(ARGV[1]) then
	return tonumber(seen)
end
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[1], '0')
return -1
`)

// reindexSeenScript updates entries of a seen index that still hold the
// score the caller read: each is removed, or given a new score.
//
// KEYS[1] -> w:{fanout}:seen (or a shard's)
// ARGV[1..] -> user id, score read, new score ("" to remove), …
//
// Returns how many entries it changed.
var reindexSeenScript = redis.NewScript(`
local changed = 0
for i = 1, #ARGV, 3 do
	local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
	if score and tonumber(score) == tonumber(ARGV[i + 1]) then
		if ARGV[i + 2] == '' then
			redis.call('ZREM', KEYS[1], ARGV[i])
		else
			redis.call('ZADD', KEYS[1], ARGV[i + 2], ARGV[i])
		end
		changed = changed + 1
	end
end
return changed
`)

// dropIdleHomes drops the home timelines of the users not seen since
// cutoff, at most dropPerSweep of them, and returns how many it dropped.
func (db *DB) dropIdleHomes(ctx context.Context, cutoff time.Time) (int, error) {
	dropped, looked := 0, 0
	for shard := range max(1, db.opts.FanOutShards) {
		for looked < dropPerSweep {
			n, seen, err := db.dropIdleBatch(ctx, shard, cutoff.UnixMilli())
			dropped, looked = dropped+n, looked+seen
			if err != nil {
				return dropped, fmt.Errorf("drop idle home timelines of shard %d: %w", shard, err)
			}
			if seen < dropBatch {
				break
			}
		}
	}
	if dropped > 0 {
		db.log.InfoContext(ctx, "dropped the home timelines of inactive users; each is rebuilt on the user's next request",
			"dropped", dropped, "inactive_since", cutoff)
	}
	return dropped, nil
}

// dropIdleBatch drops the home timelines of the users of one batch of a
// shard's seen index that are older than cutoff (unix ms). It returns how
// many it dropped and how many users it looked at.
func (db *DB) dropIdleBatch(ctx context.Context, shard int, cutoff int64) (dropped, looked int, err error) {
	index := seenIndexKey(shard)
	entries, err := db.client.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
		Key: index, Start: "-inf", Stop: "(" + strconv.FormatInt(cutoff, 10), ByScore: true, Count: dropBatch,
	}).Result()
	if err != nil || len(entries) == 0 {
		return 0, 0, err
	}
	if db.dropStep != nil {
		db.dropStep("read")
	}
	results := make([]*redis.Cmd, len(entries))
	err = runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		for i, e := range entries {
			userID, _ := e.Member.(string)
			results[i] = dropHomeScript.EvalSha(ctx, pipe, []string{seenKey(userID), homeKey(userID)}, cutoff)
		}
	}, dropHomeScript)
	if err != nil {
		return 0, 0, err
	}
	if db.dropStep != nil {
		db.dropStep("dropped")
	}
	args := make([]any, 0, 3*len(entries))
	for i, e := range entries {
		userID, _ := e.Member.(string)
		seen, err := results[i].Int64()
		if err != nil {
			return 0, 0, err
		}
		next := "" // dropped, or no seenKey: out of the index
		if seen == -1 {
			dropped++
		} else if seen >= 0 {
			next = strconv.FormatInt(seen, 10) // seen since: back when they may be idle
		}
		args = append(args, userID, strconv.FormatFloat(e.Score, 'f', -1, 64), next)
	}
	if err := reindexSeenScript.Run(ctx, db.client, []string{index}, args...).Err(); err != nil {
		return dropped, len(entries), err
	}
	return dropped, len(entries), nil
}

// backfillSeenIndex adds to the seen indexes every user recorded as seen by
// a Warble from before them, so that their home timelines too are dropped
// once they are idle (most of them, a release after the upgrade: those who
// come back are indexed by Seen anyway). Like backfillOutboxIndex, it SCANs
// every master once per database, at a sweeping worker's first sweep, and
// then records seenBackfillKey; two workers that do it at once add the
// same entries (NX: an entry's time stays); an empty database gets no
// marker.
func (db *DB) backfillSeenIndex(ctx context.Context) error {
	if n, err := db.client.Exists(ctx, seenBackfillKey).Result(); err != nil {
		return fmt.Errorf("backfill the seen index: %w", err)
	} else if n == 1 {
		return nil
	}
	keys, total, err := db.scanEveryMaster(ctx, prefix+"u:{*}:seen")
	if err != nil {
		return fmt.Errorf("backfill the seen index: %w", err)
	} else if total == 0 {
		return nil
	}
	indexed := 0
	for chunk := range slices.Chunk(keys, sweepCount) {
		pipe := db.client.Pipeline()
		gets := make([]*redis.StringCmd, len(chunk))
		for i, key := range chunk {
			gets[i] = pipe.Get(ctx, key)
		}
		pipe.Exec(ctx) // each answer is checked below
		pipe = db.client.Pipeline()
		for i, key := range chunk {
			at, err := gets[i].Int64()
			if errors.Is(err, redis.Nil) || (err == nil && at == 0) {
				continue // gone, or dropped already
			} else if err != nil {
				return fmt.Errorf("backfill the seen index: read %s: %w", key, err)
			}
			userID := strings.TrimSuffix(strings.TrimPrefix(key, prefix+"u:{"), "}:seen")
			pipe.ZAddNX(ctx, seenIndexKey(db.fanOutShard(userID)), redis.Z{Score: float64(at), Member: userID})
			indexed++
		}
		if pipe.Len() == 0 {
			continue
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("backfill the seen index: %w", err)
		}
	}
	if err := db.client.Set(ctx, seenBackfillKey, db.now().UnixMilli(), 0).Err(); err != nil {
		return fmt.Errorf("backfill the seen index: %w", err)
	}
	db.log.InfoContext(ctx, "seen index backfilled from the users' seen times", "users", indexed)
	return nil
}
