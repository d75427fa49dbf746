package redisdb

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/warble/warble/internal/warble"
)

// subscriber is one subscription: a bounded queue that the channel fills
// and the subscription's pump empties.
type subscriber struct {
	ch   *hubChannel
	wake chan struct{} // signalled when the queue gets an event

	mu    sync.Mutex
	queue []*hubEvent

	// Set before the pump starts and owned by it afterwards: POST_ADDED
	// events at or below floor were replayed (those in replayed) or
	// arrived too late to deliver in order (the others).
	floor    int64
	replayed map[int64]bool
}

// push queues an event without waiting. When the queue is full the
// subscriber has fallen behind: its queue is replaced by a RESYNC. A RESYNC
// that follows a RESYNC replaces it.
//
// A reset among the events replaced carries over to their replacement, so
// that the subscriber forgets its floor as it would have.
func (s *subscriber) push(e *hubEvent) {
	s.mu.Lock()
	switch n := len(s.queue); {
	case n >= subscriberBuffer:
		reset := e.reset
		for _, q := range s.queue {
			reset = reset || q.reset
		}
		clear(s.queue)
		s.queue = append(s.queue[:0], &hubEvent{ev: resyncEvent(e.newest), seq: e.newest, newest: e.newest, reset: reset})
	case e.ev.Kind == warble.Resync && n > 0 && s.queue[n-1].ev.Kind == warble.Resync:
		if s.queue[n-1].reset && !e.reset {
			e = &hubEvent{ev: e.ev, seq: e.seq, newest: e.newest, reset: true}
		}
		s.queue[n-1] = e
	default:
		s.queue = append(s.queue, e)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// pop takes the oldest queued event.
func (s *subscriber) pop() (*hubEvent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil, false
	}
	e := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	return e, true
}

// filter returns the event to send for e after a replay: nil for a post the
// replay sent already, a RESYNC for one that came too late to be sent in
// order, and e's event otherwise. A reset RESYNC lowers the floor to where
// the timeline went back to: the client refetches, and the seqs above it
// are new posts, whatever the replay held.
func (s *subscriber) filter(e *hubEvent) *warble.TimelineEvent {
	if e.reset {
		s.floor = min(s.floor, e.seq)
		s.replayed = nil
	}
	if e.ev.Kind != warble.PostAdded || e.seq > s.floor {
		return e.ev
	}
	if s.replayed[e.seq] {
		return nil
	}
	return resyncEvent(max(e.newest, s.floor))
}

// replay reads the posts of sub's feed newer than afterSeq, oldest first,
// and sets sub's floor so that its live events go on from there. It is
// read after the channel's subscription is confirmed, so that a post either
// is in the replay or comes live, or both (then the live one is dropped).
func (h *Hub) replay(ctx context.Context, sub *subscriber, afterSeq int64) ([]*warble.TimelineEvent, error) {
	ch := sub.ch
	home := ch.feed.Kind == warble.FeedHome
	args := redis.ZRangeArgs{Key: ch.key, Start: seqArg(afterSeq), Stop: "+inf", ByScore: true, Count: replayLimit + 1}
	// The entries before the oldest: an entry that leaves the set between
	// the two reads (trimmed by a cap, or moved to the archive) raises the
	// oldest, so the gap it leaves is seen, not skipped.
	pipe := h.db.client.Pipeline()
	entriesCmd := pipe.ZRangeArgsWithScores(ctx, args)
	oldestCmd := pipe.ZRangeWithScores(ctx, ch.key, 0, 0)
	newestCmd := pipe.ZRangeWithScores(ctx, ch.key, -1, -1)
	var archivedCmd *redis.StringCmd // how many of a user's posts are archived, see archivedCount
	if ch.feed.Kind == warble.FeedUser && h.db.opts.Archive != nil {
		archivedCmd = pipe.HGet(ctx, userKey(ch.feed.UserID), archivedPostsField)
	}
	var pulled []string
	if home {
		var err error
		if pulled, err = h.db.pulledAuthors(ctx); err != nil { // see pull.go
			return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
	}
	var newest int64
	if top := newestCmd.Val(); len(top) > 0 {
		newest = int64(top[0].Score)
	}
	oldest := oldestCmd.Val()
	entries := feedEntries(entriesCmd.Val())
	cut := feedCapped(ch.feed) && len(oldest) > 0 && afterSeq < int64(oldest[0].Score)
	if home && len(pulled) > 0 {
		sources, err := h.db.pulledFollowed(ctx, ch.feed.UserID, pulled)
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
		}
		if len(sources) > 0 {
			// The merged timeline's entries, and its oldest and newest.
			if entries, err = h.db.rangeMerged(ctx, ch.feed.UserID, sources, args); err != nil {
				return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
			}
			_, first, last, err := h.db.cutMerged(ctx, mergedKeys(ch.feed.UserID, sources))
			if err != nil {
				return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
			}
			// Older posts of the pulled accounts may have moved to the
			// archive, which a replay does not read: from before them,
			// the client refetches.
			floor, err := h.db.archivedFloor(ctx, sources)
			if err != nil {
				return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
			}
			cut = first > 0 && afterSeq < first || afterSeq < floor
			newest = max(newest, last)
		}
	}
	if archivedCmd != nil && archivedCmd.Val() != "" && archivedCmd.Val() != "0" &&
		(len(oldest) == 0 || afterSeq < int64(oldest[0].Score)) {
		// A user's posts set holds their newest posts: those between the
		// cursor and its oldest may have moved to the archive.
		var err error
		if entries, err = h.db.replayArchived(ctx, ch.feed.UserID, afterSeq, oldest, entries); err != nil {
			return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
		}
	}
	if cut || len(entries) > replayLimit {
		// The timeline no longer holds everything after the cursor, or
		// holds too much of it: the client should refetch instead.
		sub.floor = max(newest, afterSeq)
		return []*warble.TimelineEvent{resyncEvent(sub.floor)}, nil
	}
	posts, err := h.db.loadPosts(ctx, entries)
	if err != nil {
		return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
	}
	sub.floor = afterSeq
	sub.replayed = make(map[int64]bool, len(entries))
	for _, e := range entries {
		sub.replayed[e.seq] = true
		sub.floor = max(sub.floor, e.seq)
	}
	events := make([]*warble.TimelineEvent, len(posts))
	for i, p := range posts {
		events[i] = addedEvent(p)
	}
	return events, nil
}

// pump feeds out from sub until ctx ends or the hub closes: first the
// replay, then the live events. It is the subscription's one goroutine,
// and its one exit unregisters it and closes out.
func (h *Hub) pump(ctx context.Context, sub *subscriber, replay []*warble.TimelineEvent, out chan<- *warble.TimelineEvent) {
	defer h.wg.Done()
	defer func() {
		h.unregister(sub)
		close(out)
	}()
	send := func(ev *warble.TimelineEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		case <-h.done:
			return false
		}
	}
	for _, ev := range replay {
		if !send(ev) {
			return
		}
	}
	for {
		item, ok := sub.pop()
		if !ok {
			select {
			case <-sub.wake:
				continue
			case <-ctx.Done():
				return
			case <-h.done:
				return
			}
		}
		if ev := sub.filter(item); ev != nil && !send(ev) {
			return
		}
	}
}

// addedEvent is the POST_ADDED event of p.
func addedEvent(p *warble.Post) *warble.TimelineEvent {
	id := p.ID
	return &warble.TimelineEvent{Kind: warble.PostAdded, Cursor: warble.PostCursor(p.Seq), PostID: &id, Post: p}
}

// resyncEvent is a RESYNC whose newest position is seq.
func resyncEvent(seq int64) *warble.TimelineEvent {
	return &warble.TimelineEvent{Kind: warble.Resync, Cursor: warble.PostCursor(seq)}
}

// replayArchived adds to entries, the replay of userID's posts newer than
// afterSeq that their posts set holds, the posts between afterSeq and the
// set's oldest (oldest, empty when the set is) that are in the archive:
// one query, for at most replayLimit+1 of them. The result is oldest first,
// each post once, and longer than replayLimit when the replay would be.
func (db *DB) replayArchived(ctx context.Context, userID string, afterSeq int64, oldest []redis.Z, entries []feedEntry) ([]feedEntry, error) {
	var before int64 // no bound: the set holds none of the user's posts
	if len(oldest) > 0 {
		before = int64(oldest[0].Score)
	}
	posts, err := db.opts.Archive.PostsByAuthors(ctx, []string{userID}, before, replayLimit+1)
	if err != nil {
		return nil, fmt.Errorf("read archived posts: %w", err)
	}
	var archived []feedEntry
	for _, e := range postEntries(posts) {
		if e.seq > afterSeq {
			archived = append(archived, e)
		}
	}
	if len(archived) == 0 {
		return entries, nil
	}
	// Archived first: a post in both while it moves is then the
	// archive's, read already.
	return mergeEntries(append(archived, entries...), false, 0), nil
}
