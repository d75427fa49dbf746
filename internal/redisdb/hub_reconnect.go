package redisdb

import "github.com/redis/go-redis/v9"

// pendingCommand is a SUBSCRIBE (with the hubChannel it is for) or an
// UNSUBSCRIBE that Redis has not confirmed yet.
type pendingCommand struct {
	subscribe bool
	ch        *hubChannel
}

// confirmed handles Redis's confirmation of a SUBSCRIBE or UNSUBSCRIBE.
//
// A SUBSCRIBE confirmation that matches no command of ours comes from
// go-redis subscribing again after a reconnect: messages may have been lost
// while the connection was down, and the channel's listeners get a RESYNC.
// The first confirmation on a fresh connection says it is one (a count of
// 1: revokedChannel is always among the channels), and then the commands
// still pending were sent on the dead connection, whose confirmations will
// never come: go-redis sends the SUBSCRIBEs again itself, and those of
// channels still wanted are confirmed as a reconnect's.
func (h *Hub) confirmed(m *redis.Subscription) {
	subscribe := m.Kind == "subscribe"
	if !subscribe && m.Kind != "unsubscribe" {
		return
	}
	h.mu.Lock()
	if subscribe && m.Count == 1 {
		clear(h.pending)
	}
	if m.Channel == pullChannel {
		again := h.pullSeen
		h.pullSeen = true
		h.mu.Unlock()
		if subscribe && again {
			h.refreshHomes() // accounts may have been pulled meanwhile
		}
		return
	}
	if m.Channel == revokedChannel {
		h.mu.Unlock()
		if subscribe {
			first := false
			h.revokedOnce.Do(func() { first = true; close(h.revokedReady) })
			if !first {
				h.db.log.Warn("pub/sub connection reconnected; checking the watched sessions for revocations missed meanwhile")
				h.recheckSessions()
			}
		}
		return
	}
	ch := h.channels[m.Channel]
	target, ours := h.popPending(m.Channel, subscribe)
	if subscribe {
		for sink := range h.routes[m.Channel] {
			sink.post(wakeMessage)
		}
	}
	h.mu.Unlock()
	if !subscribe || ch == nil {
		return
	}
	switch {
	case ours && target == ch:
		ch.signal(false)
	case !ours:
		ch.signal(true)
	}
	// A confirmation of ours for a channel that has since been dropped
	// and made again belongs to the old one: the new one has its own.
}

// popPending takes the oldest pending command of the given kind on channel
// and reports whether there was one.
func (h *Hub) popPending(channel string, subscribe bool) (*hubChannel, bool) {
	queue := h.pending[channel]
	for i, c := range queue {
		if c.subscribe == subscribe {
			// Commands before it of the other kind cannot be pending
			// any more: Redis answers in order.
			if rest := queue[i+1:]; len(rest) > 0 {
				h.pending[channel] = rest
			} else {
				delete(h.pending, channel)
			}
			return c.ch, true
		}
	}
	return nil, false
}
