package redisdb

import (
	"context"
	"fmt"
	"strconv"

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
func (s *PostService) FindTimeline(ctx context.Context, feed warble.Feed, page warble.PageArgs) (*warble.Timeline, error) {
	if err := page.Validate(warble.MaxPageSize); err != nil {
		return nil, err
	}
	max := "+inf"
	if page.After != nil {
		after, err := warble.ParsePostCursor(*page.After)
		if err != nil {
			return nil, err
		}
		max = "(" + strconv.FormatInt(after, 10)
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
	if feed.Kind == warble.FeedHome {
		var sources []string
		known := false
		read = func(args redis.ZRangeArgs) ([]feedEntry, error) {
			if !known {
				known = true
				entries, pulled, err := s.db.rangeFeedAndPulled(ctx, args)
				if err != nil || len(pulled) == 0 {
					return entries, err
				}
				if sources, err = s.db.pulledFollowed(ctx, feed.UserID, pulled); err != nil || len(sources) == 0 {
					return entries, err
				}
			}
			if len(sources) == 0 {
				return s.db.rangeFeed(ctx, args)
			}
			return s.db.rangeMerged(ctx, feed.UserID, sources, args)
		}
	}

	// Read first+1 posts, the last only to know whether a next page
	// exists. Ids whose post is gone (a delete racing this read) are
	// skipped, and the read goes on from where it stopped to fill the page.
	want := page.First + 1
	var posts []*warble.Post
	var lastRead int64
	more := false
	for reads := 0; len(posts) < want; reads++ {
		if reads == maxPageReads {
			more = true // stop here; the next page goes on from lastRead
			break
		}
		need := want - len(posts)
		entries, err := read(redis.ZRangeArgs{
			Key: key, Start: max, Stop: "-inf", ByScore: true, Rev: true, Count: int64(need),
		})
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", feed, err)
		}
		read, err := db.loadPosts(ctx, entries)
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", feed, err)
		}
		posts = append(posts, read...)
		if len(entries) < need {
			break // the feed has no more
		}
		lastRead = entries[len(entries)-1].seq
		max = "(" + strconv.FormatInt(lastRead, 10)
	}
	if len(posts) > page.First {
		posts, more = posts[:page.First], true
	}
	for _, p := range posts {
		tl.Edges = append(tl.Edges, &warble.PostEdge{Cursor: warble.PostCursor(p.Seq), Node: p})
	}
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

// rangeFeed reads entries of a timeline with ZRANGE and args, WITHSCORES.
func (db *DB) rangeFeed(ctx context.Context, args redis.ZRangeArgs) ([]feedEntry, error) {
	zs, err := db.client.ZRangeArgsWithScores(ctx, args).Result()
	if err != nil {
		return nil, err
	}
	return feedEntries(zs), nil
}

// rangeFeedAndPulled is rangeFeed and the pulled accounts (see
// pulledAuthors).
func (db *DB) rangeFeedAndPulled(ctx context.Context, args redis.ZRangeArgs) ([]feedEntry, []string, error) {
	pulled, err := db.pulledAuthors(ctx)
	if err != nil {
		return nil, nil, err
	}
	entries, err := db.rangeFeed(ctx, args)
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
// and findUsers' commands for the distinct authors. The posts come back in
// the order of entries; an entry whose post is gone (deleted) or whose id is
// malformed is left out. A post whose author cannot be read keeps a nil
// Author.
func (db *DB) loadPosts(ctx context.Context, entries []feedEntry) ([]*warble.Post, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.SliceCmd, len(entries))
	var authorIDs []string
	authorIndex := make(map[string]int)
	pipe := db.client.Pipeline()
	for i, e := range entries {
		author, seq, ok := splitPostID(e.postID)
		if !ok {
			continue
		}
		cmds[i] = pipe.HMGet(ctx, postKey(author, seq), "body", "createdAt")
		if _, seen := authorIndex[author]; !seen {
			authorIndex[author] = len(authorIDs)
			authorIDs = append(authorIDs, author)
		}
	}
	if pipe.Len() == 0 {
		return nil, nil
	}
	authors := db.queueUsers(ctx, pipe, authorIDs)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read %d posts: %w", len(entries), err)
	}
	users, err := authors(ctx)
	if err != nil {
		return nil, fmt.Errorf("read %d posts: %w", len(entries), err)
	}

	posts := make([]*warble.Post, 0, len(entries))
	for i, e := range entries {
		if cmds[i] == nil {
			continue
		}
		vals := cmds[i].Val()
		body, ok := vals[0].(string)
		if !ok {
			continue // HMGET of a missing hash is all nils: the post is gone
		}
		createdAt, _ := vals[1].(string)
		author := warble.PostAuthorID(e.postID)
		seq, _ := postSeq(e.postID)
		posts = append(posts, &warble.Post{
			ID: e.postID, AuthorID: author, Body: body, CreatedAt: msTime(createdAt), Seq: seq,
			Author: users[authorIndex[author]],
		})
	}
	return posts, nil
}
