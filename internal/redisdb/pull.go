package redisdb

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// pullInstead reports whether a post by authorID is to be pulled rather
// than pushed, because the author has more followers than the threshold.
// It then records the author in pullAuthorsKey first, so that reads merge
// the post before the job that skips its fan-out is done, and announces a
// newly added author on pullChannel. followers is the author's followers
// count if the caller read it (countFollowers), else -1.
func (db *DB) pullInstead(ctx context.Context, authorID, postID string, followers int64) (bool, error) {
	if db.opts.PullThreshold < 0 {
		return false, nil
	}
	n := followers
	if n < 0 {
		var err error
		if n, err = db.countFollowers(ctx, authorID); err != nil {
			return false, err
		}
	}
	if n <= int64(db.opts.PullThreshold) {
		return false, nil
	}
	added, err := db.client.SAdd(ctx, pullAuthorsKey, authorID).Result()
	if err != nil {
		return false, fmt.Errorf("mark %s as pulled: %w", authorID, err)
	}
	db.pulled.forget()
	if added == 1 {
		db.log.InfoContext(ctx, "account's posts are pulled from now on", "user", authorID,
			"followers", n, "threshold", db.opts.PullThreshold, "post", postID)
		if err := db.publish(ctx, db.client, pullChannel, authorID).Err(); err != nil {
			// Hubs pick the author up at their next refresh instead.
			db.log.WarnContext(ctx, "announce pulled account", "user", authorID, "err", err)
		}
	}
	return true, nil
}

// pulledFollowed returns which of the pulled authors userID follows, in one
// round trip (none when there are no pulled authors).
func (db *DB) pulledFollowed(ctx context.Context, userID string, pulled []string) ([]string, error) {
	if len(pulled) == 0 {
		return nil, nil
	}
	cmd := zmscore(ctx, db.client, followingKey(userID), pulled)
	scores, err := parseScores(cmd, len(pulled))
	if err != nil {
		return nil, fmt.Errorf("read followed pulled accounts of %s: %w", userID, err)
	}
	var out []string
	for i, at := range scores {
		if at >= 0 {
			out = append(out, pulled[i])
		}
	}
	slices.Sort(out)
	return out, nil
}

// homeSources returns the pulled authors that userID follows: two round
// trips, or one when no author is pulled. Reads that have a pipeline to
// send anyway queue the SMEMBERS there and call pulledFollowed.
func (db *DB) homeSources(ctx context.Context, userID string) ([]string, error) {
	pulled, err := db.pulledAuthors(ctx)
	if err != nil {
		return nil, err
	}
	return db.pulledFollowed(ctx, userID, pulled)
}

// DefaultPulledStaleness bounds how old a process's copy of pullAuthorsKey
// may be: an announcement on pullChannel that it missed (its pub/sub
// connection was down) delays a newly pulled account's posts in home
// timelines by at most this long.
const DefaultPulledStaleness = 5 * time.Second

// pulledSet is this process's copy of pullAuthorsKey. Every home page,
// replay and live refresh needs it, and on a cluster the set is one key on
// one master that every reader would ask: instead each process reads it
// when its copy is older than Options.PulledStaleness, or when the hub hears of a
// newly pulled account on pullChannel (see Hub), or after this process
// pulled one itself. The set only grows, so a stale copy lacks accounts
// pulled lately and never holds one that is not.
type pulledSet struct {
	mu      sync.Mutex
	ids     []string
	readAt  time.Time // zero when the copy must be read again
	forgets uint64    // how many times forget was called
}

// forget makes the next read of the set go to Redis.
func (p *pulledSet) forget() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readAt = time.Time{}
	p.forgets++
}

// pulledAuthors returns the ids in pullAuthorsKey, from this process's
// copy while it is fresh (see pulledSet). The slice is shared: callers
// must not change it.
func (db *DB) pulledAuthors(ctx context.Context) ([]string, error) {
	p := &db.pulled
	p.mu.Lock()
	if !p.readAt.IsZero() && time.Since(p.readAt) < db.opts.PulledStaleness {
		ids := p.ids
		p.mu.Unlock()
		return ids, nil
	}
	forgets := p.forgets
	p.mu.Unlock()
	started := time.Now()
	ids, err := db.client.SMembers(ctx, pullAuthorsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("read pulled accounts: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// A forget that came while this read was on its way may be about an
	// account the read missed: then the copy is not kept.
	if p.forgets == forgets && started.After(p.readAt) {
		p.ids, p.readAt = ids, started
	}
	return ids, nil
}

// rangeMerged reads userID's home timeline merged with the posts of the
// pulled authors in sources, as ZRANGE with args (BYSCORE, with Count, in
// either direction) would read one sorted set holding them all: one
// pipeline, whatever the number of sources.
//
// A page read (args.Rev) also keeps the cap exact: a pushed timeline holds
// its newest HomeCap entries, and so does the merge. Counting the entries
// above the page bounds how deep the page is; only a page that may reach
// past the cap pays for finding where the cap falls (cutMerged).
//
// A pulled author's posts are in their posts set alone, and with an
// archive their older ones moved there: a page read also merges those, in
// one archive query for the sources that have posts archived and whose
// range came back short of the page (readers who follow no such account
// never ask the archive). Reads in ascending order (the live hub's) are of
// new posts, which are in Redis; a replay from an older cursor checks
// archivedFloor.
//
// The same pipeline reads whether userID still follows each source, and
// a source no longer followed adds nothing. The caller's list may be older
// than an unfollow: a live home channel's routes change on the unfollow's
// RESYNC, which on a Redis Cluster comes on another master's connection
// than a pulled account's post, so the post's message can be handled
// first; a post made after the unfollow answered must not come.
func (db *DB) rangeMerged(ctx context.Context, userID string, sources []string, args redis.ZRangeArgs) ([]feedEntry, error) {
	capN := int64(db.opts.HomeCap)
	keys := mergedKeys(userID, sources)
	above := ""
	if start, _ := args.Start.(string); args.Rev && start != "+inf" {
		above = strings.TrimPrefix(start, "(") // entries at or above the page's upper bound
	}
	archive := db.opts.Archive
	if !args.Rev {
		archive = nil
	}
	pipe := db.client.Pipeline()
	ranges := make([]*redis.ZSliceCmd, len(keys))
	floors := make([]*redis.ZSliceCmd, len(keys))
	counts := make([]*redis.IntCmd, len(keys))
	archived := make([]*redis.StringCmd, len(keys))
	var follows *redis.Cmd
	if len(sources) > 0 {
		follows = zmscore(ctx, pipe, followingKey(userID), sources)
	}
	for i, key := range keys {
		args.Key = key
		ranges[i] = pipe.ZRangeArgsWithScores(ctx, args)
		floors[i] = pipe.ZRangeWithScores(ctx, key, -capN, -capN) // the cap-th newest
		if above != "" {
			counts[i] = pipe.ZCount(ctx, key, above, "+inf")
		}
		if archive != nil && i > 0 {
			archived[i] = pipe.HGet(ctx, userKey(sources[i-1]), archivedPostsField)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, err
	}
	// followed[i] for keys[i]: the home timeline, and the sources still
	// followed.
	followed := make([]bool, len(keys))
	followed[0] = true
	kept := keys[:1:1]
	if follows != nil {
		scores, err := parseScores(follows, len(sources))
		if err != nil {
			return nil, err
		}
		for i, at := range scores {
			if followed[i+1] = at >= 0; followed[i+1] {
				kept = append(kept, keys[i+1])
			}
		}
	}
	var older []feedEntry // the pulled sources' archived posts in the page
	var short []string
	for i := 1; archive != nil && i < len(keys); i++ {
		if !followed[i] {
			continue
		}
		if n, _ := archived[i].Int64(); n > 0 && int64(len(ranges[i].Val())) < args.Count {
			short = append(short, sources[i-1])
		}
	}
	if len(short) > 0 {
		var before int64 // no bound on a first page
		if above != "" {
			before, _ = strconv.ParseInt(above, 10, 64)
		}
		posts, err := archive.PostsByAuthors(ctx, short, before, int(args.Count))
		if err != nil {
			return nil, fmt.Errorf("read archived posts of %d pulled accounts: %w", len(short), err)
		}
		older = postEntries(posts)
	}
	// A source's entries below its own cap-th newest are past the cap of
	// the whole, which the source alone fills above them.
	var merged []feedEntry
	var deep int64
	for i := range keys {
		if !followed[i] {
			continue
		}
		floor := int64(-1)
		if f := floors[i].Val(); len(f) == 1 {
			floor = int64(f[0].Score)
		}
		for _, e := range feedEntries(ranges[i].Val()) {
			if e.seq >= floor {
				merged = append(merged, e)
			}
		}
		if counts[i] != nil {
			deep += counts[i].Val()
		}
	}
	merged = mergeEntries(append(older, merged...), args.Rev, int(args.Count))
	if args.Rev && deep+int64(len(merged)) > capN {
		cut, _, _, err := db.cutMerged(ctx, kept)
		if err != nil {
			return nil, err
		}
		n := 0
		for n < len(merged) && merged[n].seq >= cut {
			n++
		}
		merged = merged[:n]
	}
	return merged, nil
}

// archivedFloor returns the seq below which a merged home timeline's
// sorted sets may lack posts of the pulled accounts in sources: the oldest
// seq in the posts set of each that has posts archived (the highest of
// them), or math.MaxInt64 if such a set is empty; 0 when none has any, or
// without an archive. One round trip, none without an archive.
func (db *DB) archivedFloor(ctx context.Context, sources []string) (int64, error) {
	if db.opts.Archive == nil || len(sources) == 0 {
		return 0, nil
	}
	pipe := db.client.Pipeline()
	oldest := make([]*redis.ZSliceCmd, len(sources))
	archived := make([]*redis.StringCmd, len(sources))
	for i, a := range sources {
		oldest[i] = pipe.ZRangeWithScores(ctx, postsKey(a), 0, 0)
		archived[i] = pipe.HGet(ctx, userKey(a), archivedPostsField)
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return 0, err
	}
	var floor int64
	for i := range sources {
		if n, _ := archived[i].Int64(); n <= 0 {
			continue
		}
		if o := oldest[i].Val(); len(o) == 1 {
			floor = max(floor, int64(o[0].Score))
		} else {
			floor = math.MaxInt64
		}
	}
	return floor, nil
}

// mergedKeys returns the sorted sets that a merged home timeline reads.
func mergedKeys(userID string, sources []string) []string {
	keys := make([]string, 0, 1+len(sources))
	keys = append(keys, homeKey(userID))
	for _, a := range sources {
		keys = append(keys, postsKey(a))
	}
	return keys
}

// cutMerged returns the seq of the HomeCap-th newest entry of the union
// of keys (0 if the union holds fewer), and the oldest and newest seqs the
// merged timeline holds (0 if none): each key's newest HomeCap, merged.
func (db *DB) cutMerged(ctx context.Context, keys []string) (cut, oldest, newest int64, err error) {
	capN := int64(db.opts.HomeCap)
	pipe := db.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(keys))
	for i, key := range keys {
		cmds[i] = pipe.ZRangeWithScores(ctx, key, -capN, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, 0, err
	}
	var all []feedEntry
	for _, c := range cmds {
		all = append(all, feedEntries(c.Val())...)
	}
	all = mergeEntries(all, true, int(capN))
	if len(all) == 0 {
		return 0, 0, 0, nil
	}
	// Short of the cap, each key had fewer than HomeCap entries, all read.
	oldest, newest = all[len(all)-1].seq, all[0].seq
	if int64(len(all)) < capN {
		return 0, oldest, newest, nil
	}
	return oldest, oldest, newest, nil
}

// mergeEntries sorts entries by seq (newest first if rev), drops repeats of
// a seq (keeping the first of them), and keeps at most limit (all if limit
// <= 0).
func mergeEntries(entries []feedEntry, rev bool, limit int) []feedEntry {
	slices.SortStableFunc(entries, func(a, b feedEntry) int {
		if rev {
			return cmp.Compare(b.seq, a.seq)
		}
		return cmp.Compare(a.seq, b.seq)
	})
	entries = slices.CompactFunc(entries, func(a, b feedEntry) bool { return a.seq == b.seq })
	if limit > 0 && len(entries) > limit {
		entries = entries[:limit]
	}
	return entries
}

// newestPulled returns the newest seq among the posts sets of sources, 0 if
// they are empty, in one round trip (none without sources).
func (db *DB) newestPulled(ctx context.Context, sources []string) (int64, error) {
	if len(sources) == 0 {
		return 0, nil
	}
	pipe := db.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(sources))
	for i, a := range sources {
		cmds[i] = pipe.ZRangeWithScores(ctx, postsKey(a), -1, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	var newest int64
	for _, c := range cmds {
		if top := c.Val(); len(top) == 1 {
			newest = max(newest, int64(top[0].Score))
		}
	}
	return newest, nil
}

// seqArg is a seq as a ZRANGE BYSCORE bound, exclusive.
func seqArg(seq int64) string { return "(" + strconv.FormatInt(seq, 10) }

// homeAuthors returns the accounts whose posts make up userID's home
// timeline (those userID follows now, and userID), and whether the home
// timeline is at its cap, merged with the pulled accounts in sources as
// rangeMerged reads it: whether its cap may have cut older posts off, which
// a page past its oldest entry then pulls (see pullHome). One round trip,
// in userID's slot when sources is empty; a second only for a merged
// timeline whose sets are neither one at the cap nor together short of it.
func (db *DB) homeAuthors(ctx context.Context, userID string, sources []string) (authors []string, full bool, err error) {
	capN := int64(db.opts.HomeCap)
	keys := mergedKeys(userID, sources)
	pipe := db.client.Pipeline()
	following := pipe.ZRange(ctx, followingKey(userID), 0, -1)
	cards := make([]*redis.IntCmd, len(keys))
	for i, key := range keys {
		cards[i] = pipe.ZCard(ctx, key)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, false, fmt.Errorf("read whom %s follows: %w", userID, err)
	}
	authors = append(following.Val(), userID)
	var sum int64
	for _, c := range cards {
		if c.Val() >= capN {
			return authors, true, nil
		}
		sum += c.Val()
	}
	if sum < capN {
		return authors, false, nil
	}
	cut, _, _, err := db.cutMerged(ctx, keys)
	if err != nil {
		return nil, false, fmt.Errorf("read the cap of the home timeline of %s: %w", userID, err)
	}
	return authors, cut > 0, nil
}

// pullHome reads up to limit posts of authorIDs with a seq below below (no
// bound when below <= 0), newest first, as entries: the part of a home
// timeline past what its capped sorted set holds. Each author's newest
// posts are in their posts set, and older ones in the archive, so the
// newest limit of all are among each posts set's newest limit below the
// bound and the archive's newest limit of the authors whose sets fall
// short. One pipeline of a bounded ZRANGE per author with their archived
// count (on a cluster go-redis sends each master its share at once), then
// one archive query by the authors who may have some of the page there. A
// post that is in both while it moves is one entry.
//
// A reader follows at most MaxFollowing accounts (2,000 by default), so a
// page reads at most MaxFollowing+1 ranges of limit ids each from Redis,
// and the archive query names at most as many authors.
func (db *DB) pullHome(ctx context.Context, authorIDs []string, below int64, limit int) ([]feedEntry, error) {
	start := "+inf"
	if below > 0 {
		start = seqArg(below)
	}
	archive := db.opts.Archive
	pipe := db.client.Pipeline()
	ranges := make([]*redis.ZSliceCmd, len(authorIDs))
	counts := make([]*redis.StringCmd, len(authorIDs))
	for i, a := range authorIDs {
		ranges[i] = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: postsKey(a), Start: start, Stop: "-inf", ByScore: true, Rev: true, Count: int64(limit),
		})
		if archive != nil {
			counts[i] = pipe.HGet(ctx, userKey(a), archivedPostsField)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, err
	}
	var entries []feedEntry
	for _, c := range ranges {
		entries = append(entries, feedEntries(c.Val())...)
	}
	if archive == nil {
		return mergeEntries(entries, true, limit), nil
	}

	// An author's archived posts are older than those in their posts set
	// (the mover takes the oldest first, and counts them in the step that
	// takes them out of the set). So the archive can add to the page only
	// posts of authors with some archived whose range came back short of
	// limit; and of those, only of authors whose range did not already go
	// below the limit-th newest entry read.
	floor := int64(-1)
	if len(entries) >= limit {
		floor = mergeEntries(slices.Clone(entries), true, limit)[limit-1].seq
	}
	var needed []string
	for i, a := range authorIDs {
		r := ranges[i].Val()
		n, _ := counts[i].Int64()
		switch {
		case n <= 0, len(r) == limit:
		case len(r) > 0 && int64(r[len(r)-1].Score) <= floor:
		default:
			needed = append(needed, a)
		}
	}
	if len(needed) > 0 {
		posts, err := archive.PostsByAuthors(ctx, needed, below, limit)
		if err != nil {
			return nil, fmt.Errorf("read archived posts of %d accounts: %w", len(needed), err)
		}
		// The archive's entries first: the sort is stable, so a post in
		// both is the archive's, which needs no read from Redis.
		entries = append(postEntries(posts), entries...)
	}
	return mergeEntries(entries, true, limit), nil
}

// archivedNewerThan returns, as entries newest first, up to limit archived
// posts of authorIDs newer than after (any, when after <= 0), for a read
// that took each author's newest limit posts above after from their posts
// set (ranges, in the order of authorIDs): the posts that moved while a
// returning user was away belong in their rebuilt home timeline. Only the
// authors with posts archived whose range came back short are asked, in
// one query after one round trip for their counts; nothing without an
// archive.
func (db *DB) archivedNewerThan(ctx context.Context, authorIDs []string, ranges []*redis.ZSliceCmd, after int64, limit int) ([]feedEntry, error) {
	archive := db.opts.Archive
	if archive == nil {
		return nil, nil
	}
	pipe := db.client.Pipeline()
	counts := make([]*redis.StringCmd, len(authorIDs))
	for i, a := range authorIDs {
		if len(ranges[i].Val()) < limit {
			counts[i] = pipe.HGet(ctx, userKey(a), archivedPostsField)
		}
	}
	if pipe.Len() == 0 {
		return nil, nil
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, err
	}
	var needed []string
	for i, a := range authorIDs {
		if counts[i] == nil {
			continue
		}
		if n, _ := counts[i].Int64(); n > 0 {
			needed = append(needed, a)
		}
	}
	if len(needed) == 0 {
		return nil, nil
	}
	posts, err := archive.PostsByAuthors(ctx, needed, 0, limit)
	if err != nil {
		return nil, fmt.Errorf("read archived posts of %d accounts: %w", len(needed), err)
	}
	var entries []feedEntry
	for _, e := range postEntries(posts) {
		if e.seq > after {
			entries = append(entries, e)
		}
	}
	return entries, nil
}
