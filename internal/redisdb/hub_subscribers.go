package redisdb

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/warble/warble/internal/warble"
)

// subscriber is one subscription: a bounded queue that the channel fills
// and a delivering goroutine empties. That goroutine runs only while there
// is something to deliver: an idle subscription costs no goroutine of its
// own, which is most of them on a server with thousands of sockets.
type subscriber struct {
	ch   *hubChannel
	recv warble.EventReceiver // set before begin, when the subscriber takes its events (may be nil)

	mu    sync.Mutex
	queue []*hubEvent
	// Set by begin: where events go, until the subscription's context
	// ends (done, kept rather than the context: a subscription's context
	// is gqlgen's, a chain of values that Done walks up at every call) or
	// the hub closes, and the replay to send before the queue.
	done    <-chan struct{}
	out     chan<- *warble.TimelineEvent
	replay  []*warble.TimelineEvent
	begun   bool
	running bool // a deliver goroutine is on its way, or s waits for one in its channel's wave
	ended   bool // ctx ended or the hub closed: nothing more starts

	// Set before begin and owned by the deliver goroutine afterwards
	// (one at a time): POST_ADDED events at or below floor were replayed
	// (those in replayed), are the post at the client's cursor (after, -1
	// without one), or arrived too late to deliver in order (the others).
	floor    int64
	replayed map[int64]bool
	after    int64
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
	start := s.begun && !s.ended && !s.running
	s.running = s.running || start
	s.mu.Unlock()
	if start {
		s.ch.deliveries.start(s)
	}
}

// filter returns the event to send for e after a replay: nil for a post the
// replay sent already or the post at the client's cursor, a RESYNC for one
// that came too late to be sent in order, and e's event otherwise. A reset
// RESYNC lowers the floor to where the timeline went back to: the client
// refetches, and the seqs above it are new posts, whatever the replay held
// or the cursor named.
//
// The post at the cursor comes live when the channel was behind the page
// the client read its cursor from: another listener kept the channel, and
// the post's message had not been handled when the replay read the
// timeline. The client has that post (its cursor is the post's position);
// a RESYNC for it would have every client that resumes from the newest post
// refetch for nothing, on a busy timeline.
func (s *subscriber) filter(e *hubEvent) *warble.TimelineEvent {
	if e.reset {
		s.floor = min(s.floor, e.seq)
		s.replayed = nil
		s.after = -1
	}
	if e.ev.Kind != warble.PostAdded || e.seq > s.floor {
		return e.ev
	}
	if s.replayed[e.seq] || e.seq == s.after {
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
	sub.after = afterSeq
	home := ch.feed.Kind == warble.FeedHome
	args := redis.ZRangeArgs{Key: ch.key, Start: seqArg(afterSeq), Stop: "+inf", ByScore: true, Count: replayLimit + 1}
	// The entries before the oldest: an entry that leaves the set between
	// the two reads (trimmed by a cap, or moved to the archive) raises the
	// oldest, so the gap it leaves is seen, not skipped.
	pipe := h.db.client.Pipeline()
	entriesCmd := pipe.ZRangeArgsWithScores(ctx, args)
	oldestCmd := pipe.ZRangeWithScores(ctx, ch.key, 0, 0)
	newestCmd := pipe.ZRangeWithScores(ctx, ch.key, -1, -1)
	// A home timeline's cap-th newest entry: raw deliveries leave entries
	// past the cap until a trim (see rawTrimEvery), which a resume must
	// treat as trimmed, as pages do (clampHome).
	var capCmd *redis.ZSliceCmd
	if home {
		capN := int64(h.db.opts.HomeCap)
		capCmd = pipe.ZRangeWithScores(ctx, ch.key, -capN, -capN)
	}
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
	if capCmd != nil {
		if floor := capCmd.Val(); len(floor) > 0 && afterSeq < int64(floor[0].Score) {
			cut = true
		}
	}
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

// begin starts delivering sub's events to out: first replay, then what was
// queued and what comes live, until ctx ends or the hub closes. Then sub
// is unregistered and out closed, once; the hub's wait group, added to for
// sub before begin, is done then.
func (s *subscriber) begin(ctx context.Context, replay []*warble.TimelineEvent, out chan<- *warble.TimelineEvent) {
	s.mu.Lock()
	s.done, s.out, s.replay, s.begun = ctx.Done(), out, replay, true
	if s.ended { // the hub closed meanwhile
		s.mu.Unlock()
		s.finish()
		return
	}
	start := len(replay) > 0 || len(s.queue) > 0
	s.running = start
	s.mu.Unlock()
	if start {
		s.ch.deliveries.start(s)
	}
	context.AfterFunc(ctx, s.end)
}

// end stops sub: its context ended or the hub closed. It finishes sub now
// when no deliver goroutine runs, and leaves that to the goroutine
// otherwise (which sees the same end in its send).
func (s *subscriber) end() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	finish := s.begun && !s.running
	s.mu.Unlock()
	if finish {
		s.finish()
	}
}

// finish unregisters sub and closes its out. It runs once: by end, by
// begin, or by the last deliver goroutine, whichever sees sub ended with
// no goroutine left to deliver.
//
// A receiver hears of the close on a goroutine of its own: finish may run
// inside SubscribeTimeline (the hub closed meanwhile) or in Hub.Close, for
// every subscription in turn, where a receiver writing to a stalled client
// must hold up neither.
func (s *subscriber) finish() {
	h := s.ch.hub
	h.unregister(s)
	close(s.out)
	if s.recv != nil {
		go s.recv.EventReady(nil)
	}
	h.wg.Done()
}

// next takes the next event to send: the replay's first, else the oldest
// queued one's. When there is none, or sub has ended, it marks the deliver
// goroutine gone, and reports whether sub should be finished.
func (s *subscriber) next() (replayed *warble.TimelineEvent, queued *hubEvent, finish bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		if len(s.replay) > 0 {
			ev := s.replay[0]
			s.replay[0] = nil
			s.replay = s.replay[1:]
			return ev, nil, false
		}
		if len(s.queue) > 0 {
			e := s.queue[0]
			s.queue[0] = nil
			if len(s.queue) == 1 {
				// Keep the slot: the next event then queues without
				// an allocation, where the empty tail of the array
				// had no room.
				s.queue = s.queue[:0]
			} else {
				s.queue = s.queue[1:]
			}
			return nil, e, false
		}
	}
	s.running = false
	return nil, nil, s.ended
}

// deliver sends sub's events to its out until there is none left. It
// is the one goroutine that sends on out at a time.
func (s *subscriber) deliver() {
	h := s.ch.hub
	for {
		ev, item, finish := s.next()
		if item != nil {
			if ev = s.filter(item); ev == nil {
				continue
			}
		}
		if ev == nil {
			if finish {
				s.finish()
			}
			return
		}
		select {
		case s.out <- ev:
			if s.recv != nil {
				// The receiver takes ev from out, which makes room
				// for the next.
				s.recv.EventReady(ev)
			}
		case <-s.done:
			s.end()
		case <-h.done:
			s.end()
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
