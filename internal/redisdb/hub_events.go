package redisdb

import (
	"context"
	"time"

	"github.com/warble/warble/internal/warble"
)

// A post reaches the global channel, its author's user channel and the
// home channel of every follower watching live, and each of those channels
// reads the post when its message comes. With thousands of home channels
// that is thousands of reads of the same post at the same moment, and as
// many POST_ADDED events that the GraphQL layer marshals one by one,
// because they are different values. addedEvents makes the read once per
// post and hands every channel the same event, which the GraphQL layer
// then marshals once per distinct selection (graph/shared_events.go).

// sharedEvent is the POST_ADDED event of one post, read by the first
// channel that asks and waited for by the others.
type sharedEvent struct {
	done chan struct{} // closed when ev and err are set
	ev   *warble.TimelineEvent
	err  error
	at   time.Time
}

// Bounds of the shared events. An event is shared only for a moment, so
// that a post's author renamed since, or a post deleted since, is read
// again soon; a channel that reads a post deleted within that moment
// still sends its POST_ADDED, and the POST_REMOVED that follows.
var sharedEventAge = time.Second // a var for a test on a slow machine

const sharedEventMax = 4096 // above this many, the expired ones are dropped at once

// addedEvents returns the POST_ADDED events of the posts of entries, in
// order, leaving out posts that are gone, as loadPosts does.
func (h *Hub) addedEvents(ctx context.Context, entries []feedEntry) ([]*warble.TimelineEvent, error) {
	now := time.Now()
	shared := make([]*sharedEvent, len(entries))
	var mine []feedEntry
	var mineAt []int
	h.eventsMu.Lock()
	if len(h.events) > sharedEventMax {
		for id, s := range h.events {
			if now.Sub(s.at) >= sharedEventAge {
				delete(h.events, id)
			}
		}
	}
	for i, e := range entries {
		if s := h.events[e.postID]; s != nil && now.Sub(s.at) < sharedEventAge {
			shared[i] = s
			continue
		}
		s := &sharedEvent{done: make(chan struct{}), at: now}
		h.events[e.postID] = s
		shared[i] = s
		mine = append(mine, e)
		mineAt = append(mineAt, i)
	}
	h.eventsMu.Unlock()

	if len(mine) > 0 {
		posts, err := h.db.loadPosts(ctx, mine)
		byID := make(map[string]*warble.Post, len(posts))
		for _, p := range posts {
			byID[p.ID] = p
		}
		for _, i := range mineAt {
			s := shared[i]
			if err != nil {
				s.err = err
			} else if p := byID[entries[i].postID]; p != nil {
				s.ev = addedEvent(p)
			}
			close(s.done)
		}
		if err != nil {
			// The next channel to ask reads it again.
			h.eventsMu.Lock()
			for _, i := range mineAt {
				if h.events[entries[i].postID] == shared[i] {
					delete(h.events, entries[i].postID)
				}
			}
			h.eventsMu.Unlock()
		}
	}

	events := make([]*warble.TimelineEvent, 0, len(entries))
	for _, s := range shared {
		select {
		case <-s.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if s.err != nil {
			return nil, s.err
		}
		if s.ev != nil {
			events = append(events, s.ev)
		}
	}
	return events, nil
}
