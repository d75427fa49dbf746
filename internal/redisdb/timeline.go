package redisdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// maxPageReads bounds how many range reads one page may take. A page needs
// more than one only when posts it read were deleted between the range read
// and the fetch of the posts.
const maxPageReads = 4

// feedEntry is one post id in a timeline and its position there.
type feedEntry struct {
	postID string
	seq    int64
	post   *warble.Post // the post, when it was read with its position (from the archive)
}

// feedKeys returns the sorted set that holds feed and the channel that
// announces its changes. ok is false for a feed that cannot exist: an
// unknown kind or a malformed user id.
func feedKeys(feed warble.Feed) (key, channel string, ok bool) {
	switch feed.Kind {
	case warble.FeedGlobal:
		return globalKey, globalChannel, true
	case warble.FeedHome:
		if warble.ValidUserID(feed.UserID) {
			return homeKey(feed.UserID), homeChannel(feed.UserID), true
		}
	case warble.FeedUser:
		if warble.ValidUserID(feed.UserID) {
			return postsKey(feed.UserID), userChannel(feed.UserID), true
		}
	}
	return "", "", false
}

// feedCapped reports whether Warble trims feed to a cap, so that a cursor
// may point below what it still holds.
func feedCapped(feed warble.Feed) bool { return feed.Kind != warble.FeedUser }

// FindTimeline implements warble.PostService. A page costs a constant number
// of round trips whatever its size: one range read, one pipelined fetch of
// the posts and one of their authors.
//
// A page that reaches past what Redis holds of the feed goes on in the same
// page, under the same kind of cursor (a seq), from where the rest is (see
// beyondRedis): a user's older posts from the archive, a home timeline's
// older posts by pull from the accounts its owner follows, the global
// timeline's from the archive.
func (s *PostService) FindTimeline(ctx context.Context, feed warble.Feed, page warble.PageArgs) (*warble.Timeline, error) {
	if err := page.Validate(warble.MaxPageSize); err != nil {
		return nil, err
	}
	// below is the seq the page has read down to: the cursor's, then the
	// last entry read. bounded is false while there is neither.
	max, below, bounded, err := pageTop(page)
	if err != nil {
		return nil, err
	}
	tl := &warble.Timeline{Edges: []*warble.PostEdge{}}
	key, _, ok := feedKeys(feed)
	if !ok {
		return tl, nil
	}

	// A home timeline merges the posts of the pulled accounts its owner
	// follows (see pull.go). Which those are is read with the first range
	// read, so a home page costs one more round trip only for a reader
	// who follows one: two when somebody is pulled at all.
	// The global timeline may be read from a replica (see
	// Options.ReplicaReads); cursors are seqs, so a page from a replica
	// that lags and the next one from its master still meet exactly.
	db := s.db
	if feed.Kind == warble.FeedGlobal {
		db = s.db.lagging
	}
	read := func(args redis.ZRangeArgs) ([]feedEntry, error) { return db.rangeFeed(ctx, args) }
	var sources []string
	if feed.Kind == warble.FeedHome {
		known := false
		ahead, _ := ctx.Value(homeAheadKey{}).(*homeAhead)
		read = func(args redis.ZRangeArgs) ([]feedEntry, error) {
			if !known {
				known = true
				var entries []feedEntry
				var pulled []string
				var err error
				if ahead != nil && ahead.args == args {
					// Read with the session: the same command, on the
					// same key, for this very page.
					entries, pulled, err = s.db.aheadAndPulled(ctx, ahead)
				} else {
					entries, pulled, err = s.db.rangeFeedAndPulled(ctx, args)
				}
				if err != nil || len(pulled) == 0 {
					return entries, err
				}
				if sources, err = s.db.pulledFollowed(ctx, feed.UserID, pulled); err != nil || len(sources) == 0 {
					return entries, err
				}
			}
			if len(sources) == 0 {
				return s.db.rangeHome(ctx, args)
			}
			return s.db.rangeMerged(ctx, feed.UserID, sources, args)
		}
	}
	var beyond *beyondRedis // where the feed goes on, once its sorted set has no more

	// Read first+1 posts, the last only to know whether a next page
	// exists. Ids whose post is gone (a delete racing this read) are
	// skipped, and the read goes on from where it stopped to fill the page.
	want := page.First + 1
	var posts []*warble.Post
	var lastRead int64
	more := false
	fromTop := 0 // entries read from the sorted set, when the page starts at its newest
	for reads := 0; len(posts) < want; reads++ {
		if reads == maxPageReads {
			more = true // stop here; the next page goes on from lastRead
			break
		}
		need := want - len(posts)
		var entries []feedEntry
		var err error
		if beyond == nil {
			entries, err = read(pageRead(key, max, need))
		} else {
			entries, err = beyond.read(ctx, below, bounded, need)
		}
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", feed, err)
		}
		if beyond == nil {
			fromTop += len(entries)
		}
		read, err := db.loadPosts(ctx, entries)
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", feed, err)
		}
		posts = append(posts, read...)
		if len(entries) > 0 {
			lastRead = entries[len(entries)-1].seq
			max = seqArg(lastRead)
			below, bounded = lastRead, true
		}
		if len(entries) == need {
			continue
		}
		// The sorted set has no more below; whether the feed goes on
		// beyond it depends on the feed.
		if beyond != nil {
			break
		}
		if feed.Kind == warble.FeedHome && page.After == nil && len(sources) == 0 && fromTop < db.opts.HomeCap {
			// A first page that read the whole home timeline found fewer
			// entries than its cap: none were cut off, and the timeline
			// ends here, as beyondRedis would find, without its round
			// trip (a new user's home page, or a short one).
			break
		}
		if beyond, err = s.beyondRedis(ctx, db, feed, sources); err != nil {
			return nil, fmt.Errorf("find %s: %w", feed, err)
		} else if beyond == nil {
			break
		}
	}
	if len(posts) > page.First {
		posts, more = posts[:page.First], true
	}
	tl.Edges = postEdges(posts)
	tl.PageInfo.HasNextPage = more
	switch {
	case len(posts) == page.First:
		end := tl.Edges[len(tl.Edges)-1].Cursor
		tl.PageInfo.EndCursor = &end
	case more:
		// Deleted posts used up the reads: the page ends short, and the
		// next one starts after the last id read.
		end := warble.PostCursor(lastRead)
		tl.PageInfo.EndCursor = &end
	case len(tl.Edges) > 0:
		end := tl.Edges[len(tl.Edges)-1].Cursor
		tl.PageInfo.EndCursor = &end
	}
	return tl, nil
}

// pageRead is the range read of up to count entries of a timeline below
// max (a ZRANGE BYSCORE bound), newest first, that FindTimeline makes.
func pageRead(key, max string, count int) redis.ZRangeArgs {
	return redis.ZRangeArgs{Key: key, Start: max, Stop: "-inf", ByScore: true, Rev: true, Count: int64(count)}
}

// homeAhead is the first range read of a page of a home timeline, made in
// the round trip of the request's session (AuthService.AuthenticateForHome),
// which FindTimeline takes in place of its own when its first read has the
// same arguments.
type homeAhead struct {
	args redis.ZRangeArgs
	ids  []string // what the read answered
	card int64    // the timeline's size, read with it (see clampHome)
}

type homeAheadKey struct{}

// homeFirstRead returns the first range read that FindTimeline makes for
// page of userID's home timeline, and false for a page that it refuses
// before reading.
func homeFirstRead(userID string, page warble.PageArgs) (redis.ZRangeArgs, bool) {
	if page.Validate(warble.MaxPageSize) != nil || !warble.ValidUserID(userID) {
		return redis.ZRangeArgs{}, false
	}
	max, _, _, err := pageTop(page)
	if err != nil {
		return redis.ZRangeArgs{}, false
	}
	return pageRead(homeKey(userID), max, page.First+1), true
}

// pageTop returns where a page's first range read starts (a ZRANGE BYSCORE
// bound: "+inf", or below its cursor), and the cursor's seq, bounded false
// for a page without one.
func pageTop(page warble.PageArgs) (max string, after int64, bounded bool, err error) {
	if page.After == nil {
		return "+inf", 0, false, nil
	}
	after, err = warble.ParsePostCursor(*page.After)
	if err != nil {
		return "", 0, false, err
	}
	return "(" + strconv.FormatInt(after, 10), after, true, nil
}

// postEdges returns the edges of posts, in their order, with their
// cursors: in four allocations for the page, where an edge and its cursor
// at a time took three per post.
func postEdges(posts []*warble.Post) []*warble.PostEdge {
	edges := make([]*warble.PostEdge, len(posts))
	if len(posts) == 0 {
		return edges
	}
	each := make([]warble.PostEdge, len(posts))
	// The cursors are written into one string and cut from it.
	var b strings.Builder
	b.Grow(len(posts) * 16) // a cursor of a seq below 10^11 is at most 16 bytes
	var buf [32]byte
	ends := make([]int, len(posts))
	for i, p := range posts {
		b.Write(warble.AppendPostCursor(buf[:0], p.Seq))
		ends[i] = b.Len()
	}
	all := b.String()
	start := 0
	for i, p := range posts {
		each[i] = warble.PostEdge{Cursor: all[start:ends[i]], Node: p}
		edges[i] = &each[i]
		start = ends[i]
	}
	return edges
}

// beyondRedis reads the part of a feed that its sorted set does not hold:
// up to limit entries below a seq, newest first, from wherever the rest of
// the feed is.
type beyondRedis struct {
	read func(ctx context.Context, below int64, bounded bool, limit int) ([]feedEntry, error)
}

// beyondRedis returns where feed goes on once its sorted set has no more
// entries below a page's position, or nil when the feed ends there:
//
//   - A user's posts set holds their newest posts; the older ones, if
//     the user has any archived, are in the archive, one query per page
//     on (author, seq).
//   - A home timeline that is at its cap (merged with the pulled accounts
//     its owner follows, see rangeMerged) has lost older entries to the
//     cap: the rest is pulled from the posts of the accounts the owner
//     follows now, and their own (see pullHome). A home timeline short of
//     its cap holds everything, and ends.
//   - The global timeline goes on, with an archive, from the posts its cap
//     took off it that are still in Redis (its tail) merged with the
//     archive (see global.go); without an archive it ends at its cap.
//
// It costs one round trip, or none.
func (s *PostService) beyondRedis(ctx context.Context, db *DB, feed warble.Feed, sources []string) (*beyondRedis, error) {
	archive := db.opts.Archive
	switch feed.Kind {
	case warble.FeedUser:
		if archive == nil {
			return nil, nil
		}
		if n, err := db.archivedCount(ctx, feed.UserID); err != nil || n == 0 {
			return nil, err // none archived: most users' last page asks Redis, not the archive
		}
		return &beyondRedis{read: func(ctx context.Context, below int64, bounded bool, limit int) ([]feedEntry, error) {
			return archivedEntries(ctx, below, bounded, func(before int64) ([]*warble.Post, error) {
				return archive.PostsByAuthors(ctx, []string{feed.UserID}, before, limit)
			})
		}}, nil
	case warble.FeedGlobal:
		if archive == nil {
			return nil, nil
		}
		// Whether or not w:global is at its cap now: deletes may have
		// taken it below after the cap had trimmed it.
		return &beyondRedis{read: db.globalPastCap}, nil
	case warble.FeedHome:
		authors, full, err := s.db.homeAuthors(ctx, feed.UserID, sources)
		if err != nil || !full {
			return nil, err
		}
		return &beyondRedis{read: func(ctx context.Context, below int64, bounded bool, limit int) ([]feedEntry, error) {
			if !bounded {
				below = 0
			} else if below <= 1 {
				return nil, nil // seqs start at 1
			}
			return s.db.pullHome(ctx, authors, below, limit)
		}}, nil
	}
	return nil, nil
}

// archivedCount returns how many of userID's posts are in the archive. The
// mover counts a post there in the step that takes it out of the posts
// set, so a posts set read before the count lacks no archived post when
// the count is 0.
func (db *DB) archivedCount(ctx context.Context, userID string) (int64, error) {
	n, err := db.client.HGet(ctx, userKey(userID), archivedPostsField).Int64()
	if err == redis.Nil {
		return 0, nil
	}
	return n, err
}

// archivedEntries runs query with the bound of a page read below seq below
// (none unless bounded), and returns the posts it read as entries.
func archivedEntries(ctx context.Context, below int64, bounded bool, query func(before int64) ([]*warble.Post, error)) ([]feedEntry, error) {
	if bounded && below <= 1 {
		return nil, nil // seqs start at 1; the archive reads no bound as "none"
	}
	if !bounded {
		below = 0
	}
	posts, err := query(below)
	if err != nil {
		return nil, fmt.Errorf("read archived posts: %w", err)
	}
	return postEntries(posts), nil
}

// postEntries returns posts read in full as timeline entries.
func postEntries(posts []*warble.Post) []feedEntry {
	entries := make([]feedEntry, 0, len(posts))
	for _, p := range posts {
		entries = append(entries, feedEntry{postID: p.ID, seq: p.Seq, post: p})
	}
	return entries
}

// rangeFeed reads entries of a timeline with ZRANGE and args. A timeline
// scores each post id by the seq that the id ends with, so the ids alone
// say where each entry is: without WITHSCORES, Redis formats no scores and
// go-redis parses none (a tenth less of Redis's CPU per home page). A
// member that is not a post id (which Warble never writes) has no seq to
// read, so then the range is read again with its scores, to keep a page's
// position exact.
func (db *DB) rangeFeed(ctx context.Context, args redis.ZRangeArgs) ([]feedEntry, error) {
	ids, err := db.client.ZRangeArgs(ctx, args).Result()
	if err != nil {
		return nil, err
	}
	return db.idEntries(ctx, ids, args)
}

// idEntries returns the entries of the ids that a range read with args
// answered (see rangeFeed).
func (db *DB) idEntries(ctx context.Context, ids []string, args redis.ZRangeArgs) ([]feedEntry, error) {
	entries := make([]feedEntry, len(ids))
	for i, id := range ids {
		seq, ok := postSeq(id)
		if !ok {
			zs, err := db.client.ZRangeArgsWithScores(ctx, args).Result()
			if err != nil {
				return nil, err
			}
			return feedEntries(zs), nil
		}
		entries[i] = feedEntry{postID: id, seq: seq}
	}
	return entries, nil
}

// rangeHome is rangeFeed for a home timeline: with the range, in the same
// round trip, it reads the timeline's size, and keeps only the entries a
// timeline at its cap holds (clampHome).
func (db *DB) rangeHome(ctx context.Context, args redis.ZRangeArgs) ([]feedEntry, error) {
	pipe := db.client.Pipeline()
	rng := pipe.ZRangeArgs(ctx, args)
	card := pipe.ZCard(ctx, args.Key)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	entries, err := db.idEntries(ctx, rng.Val(), args)
	if err != nil {
		return nil, err
	}
	return db.clampHome(ctx, args, entries, card.Val())
}

// clampHome drops, from a range read of a home timeline with args, the
// entries that rank at or past its cap, given the timeline's size read
// with the range: raw deliveries let a home timeline grow past its cap
// between their trims (see rawTrimEvery), and readers never see more than
// the cap, as if every add had trimmed. Only a timeline past its cap, and
// a read that reaches its oldest entries, costs a second round trip, for
// the cap-th newest entry's seq, and of those only a read below a cursor
// or as long as the cap: one from the newest entry down holds fewer than
// the cap, all of them above it (most home pages are first pages, and a
// full timeline is past its cap most of the time). A page read (newest
// first) stops there, and goes on past it by pull, as past the cap of a
// trimmed timeline.
func (db *DB) clampHome(ctx context.Context, args redis.ZRangeArgs, entries []feedEntry, card int64) ([]feedEntry, error) {
	capN := int64(db.opts.HomeCap)
	if card <= capN || len(entries) == 0 {
		return entries, nil
	}
	if start, _ := args.Start.(string); args.Rev && start == "+inf" && int64(len(entries)) < capN {
		return entries, nil
	}
	floor, err := db.client.ZRangeWithScores(ctx, args.Key, -capN, -capN).Result()
	if err != nil {
		return nil, err
	} else if len(floor) == 0 {
		return entries, nil // trimmed to less than the cap since
	}
	kept := entries[:0:0]
	for _, e := range entries {
		if float64(e.seq) >= floor[0].Score {
			kept = append(kept, e)
		}
	}
	return kept, nil
}

// rangeFeedAndPulled is rangeHome and the pulled accounts (see
// pulledAuthors).
func (db *DB) rangeFeedAndPulled(ctx context.Context, args redis.ZRangeArgs) ([]feedEntry, []string, error) {
	pulled, err := db.pulledAuthors(ctx)
	if err != nil {
		return nil, nil, err
	}
	entries, err := db.rangeHome(ctx, args)
	if err != nil {
		return nil, nil, err
	}
	return entries, pulled, nil
}

// aheadAndPulled is rangeFeedAndPulled for a range read already made
// (see homeAhead).
func (db *DB) aheadAndPulled(ctx context.Context, ahead *homeAhead) ([]feedEntry, []string, error) {
	entries, err := db.idEntries(ctx, ahead.ids, ahead.args)
	if err != nil {
		return nil, nil, err
	}
	if entries, err = db.clampHome(ctx, ahead.args, entries, ahead.card); err != nil {
		return nil, nil, err
	}
	pulled, err := db.pulledAuthors(ctx)
	if err != nil {
		return nil, nil, err
	}
	return entries, pulled, nil
}

// feedEntries turns sorted set members and scores into timeline entries.
func feedEntries(zs []redis.Z) []feedEntry {
	entries := make([]feedEntry, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		entries = append(entries, feedEntry{postID: id, seq: int64(z.Score)})
	}
	return entries
}

// loadPosts reads the posts of entries with their authors in one round
// trip: a post id names its author, so one pipeline holds an HMGET per post
// and findUsers' commands for the distinct authors. An entry that carries
// its post already (read from the archive) costs only its author. The posts
// come back in the order of entries; an entry whose post is gone (deleted)
// or whose id is malformed is left out. A post whose author cannot be read
// keeps a nil Author.
//
// Posts and authors in the process's cache (see postCache) are not read:
// a page whose posts and authors are all cached costs no round trip here.
// What the pipeline and the archive read is cached, unless it came from a
// replica, which may not have applied a delete that this process has
// heard of already.
//
// With an archive, an entry whose hash is gone may be a post that moved
// there since its id was read (a timeline keeps the ids of moved posts):
// those are asked of the archive in one query, after the pipeline. A post
// deleted for real is in neither, and stays left out. The mover writes a
// post to the archive before it leaves Redis, so a post in flight is
// found in one place or the other.
func (db *DB) loadPosts(ctx context.Context, entries []feedEntry) ([]*warble.Post, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	// First the distinct authors and each entry's (-1 for a malformed id),
	// so that the reads are counted before they are queued.
	authorOf := make([]int, len(entries))
	var authorIDs []string
	authorIndex := make(map[string]int)
	for i, e := range entries {
		author, _, ok := splitPostID(e.postID)
		if !ok {
			authorOf[i] = -1
			continue
		}
		j, seen := authorIndex[author]
		if !seen {
			j = len(authorIDs)
			authorIndex[author] = j
			authorIDs = append(authorIDs, author)
		}
		authorOf[i] = j
	}
	if len(authorIDs) == 0 {
		return nil, nil
	}
	// The generation is taken before any command is sent (see postCache).
	gen, cached := db.cache.start()
	started := time.Now()
	users := make([]*warble.User, len(authorIDs))
	var hits []cachedPost // by entry; a zero at for a miss
	if cached {
		hits = make([]cachedPost, len(entries))
		db.cache.lookup(entries, authorOf, hits, authorIDs, users, make([]warble.User, len(authorIDs)))
	}
	hit := func(i int) bool { return hits != nil && !hits[i].at.IsZero() }
	hashes, fromCache := 0, 0
	for i, e := range entries {
		switch {
		case authorOf[i] < 0 || e.post != nil:
		case hit(i):
			fromCache++
		default:
			hashes++
		}
	}
	var missing []string // the authors to read, and where each goes in users
	var missingAt []int
	for j, u := range users {
		if u == nil {
			missing, missingAt = append(missing, authorIDs[j]), append(missingAt, j)
		}
	}

	cmds := make([]*redis.SliceCmd, len(entries))
	if hashes+len(missing) > 0 {
		reads := newHashReads(hashes + len(missing))
		for i, e := range entries {
			if authorOf[i] >= 0 && e.post == nil && !hit(i) {
				author, seq, _ := splitPostID(e.postID)
				cmds[i] = reads.add(ctx, postKey(author, seq), "body", "createdAt")
			}
		}
		authors := db.queueUsers(ctx, reads, missing)
		pipe := db.client.Pipeline()
		reads.queue(ctx, pipe)
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("read %d posts: %w", len(entries), err)
		}
		read, err := authors(ctx)
		if err != nil {
			return nil, fmt.Errorf("read %d posts: %w", len(entries), err)
		}
		for k, u := range read {
			users[missingAt[k]] = u
		}
	}

	found := make([]*warble.Post, len(entries))
	read := make([]warble.Post, 0, hashes+fromCache) // one allocation for the posts read
	var moved []string
	for i, e := range entries {
		switch {
		case authorOf[i] < 0:
			// A malformed id: neither read nor an author.
		case e.post != nil:
			found[i] = e.post
		case hit(i):
			read = append(read, warble.Post{
				ID: e.postID, AuthorID: authorIDs[authorOf[i]], Body: hits[i].body, CreatedAt: hits[i].createdAt, Seq: e.seq,
			})
			found[i] = &read[len(read)-1]
		default:
			vals := cmds[i].Val()
			body, ok := vals[0].(string)
			if !ok {
				// HMGET of a missing hash is all nils: the post is
				// gone, or archived.
				if db.opts.Archive != nil {
					moved = append(moved, e.postID)
				}
				continue
			}
			createdAt, _ := vals[1].(string)
			seq, _ := postSeq(e.postID)
			read = append(read, warble.Post{
				ID: e.postID, AuthorID: authorIDs[authorOf[i]], Body: body, CreatedAt: msTime(createdAt), Seq: seq,
			})
			found[i] = &read[len(read)-1]
		}
	}
	if len(moved) > 0 {
		archived, err := db.opts.Archive.PostsByIDs(ctx, moved)
		if err != nil {
			return nil, fmt.Errorf("read %d archived posts: %w", len(moved), err)
		}
		for i, e := range entries {
			if found[i] == nil && cmds[i] != nil {
				found[i] = archived[e.postID]
			}
		}
	}
	if cached && !db.replica && (hashes > 0 || len(missing) > 0) {
		db.cacheRead(gen, started, cmds, found, users, missingAt)
	}

	posts := make([]*warble.Post, 0, len(entries))
	for i, p := range found {
		if p == nil {
			continue
		}
		p.Author = users[authorOf[i]]
		posts = append(posts, p)
	}
	return posts, nil
}

// cacheRead caches the posts and authors that loadPosts read, as a read
// that started at gen (see postCache.put): the posts it asked Redis for
// and found there or in the archive (cmds[i] set), and the authors it read
// (readAt). Posts that entries carried were read before gen was taken, and
// are not cached.
func (db *DB) cacheRead(gen uint64, started time.Time, cmds []*redis.SliceCmd, found []*warble.Post, users []*warble.User, readAt []int) {
	var posts []*warble.Post
	for i, p := range found {
		if p != nil && cmds[i] != nil {
			posts = append(posts, p)
		}
	}
	authors := make([]*warble.User, 0, len(readAt))
	for _, j := range readAt {
		authors = append(authors, users[j])
	}
	db.cache.put(gen, posts, authors, started)
}
