package redisdb

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// pendingCommand is a SUBSCRIBE (with the hubChannel it is for) or an
// UNSUBSCRIBE that Redis has not confirmed yet on a connection (see
// hubConn.pending).
type pendingCommand struct {
	subscribe bool
	ch        *hubChannel
	resync    bool      // the channel moved to another master: its listeners get a RESYNC
	sent      time.Time // when it was sent
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
//
// Every confirmation of ours is taken off the connection's queue, also one
// that is of no interest any more, so that it cannot be taken for the
// confirmation of a later command: a subscription that is left before it
// is confirmed, and made anew at once, starts on its own confirmation.
//
// On a cluster each connection tells its own reconnects by its anchor
// channel (see hubConn), and a confirmation for a channel that has moved to
// another connection, or was left, meanwhile is of no interest. An
// unsubscribe that we did not ask for is Redis dropping the channel, as a
// master does when its slot goes elsewhere: the channel is subscribed again
// where the slot is now, with a RESYNC.
func (h *Hub) confirmed(c *hubConn, m *redis.Subscription) {
	subscribe := m.Kind == "subscribe" || m.Kind == "ssubscribe"
	if !subscribe && m.Kind != "unsubscribe" && m.Kind != "sunsubscribe" {
		return
	}
	h.mu.Lock()
	if c.closing {
		// What a connection being closed hands on is of no interest:
		// its channels are elsewhere, or left.
		h.mu.Unlock()
		return
	}
	if m.Channel == c.anchor && c.anchor != "" {
		h.anchorConfirmed(c, subscribe)
		h.mu.Unlock()
		return
	}
	if c.anchor == "" && subscribe && m.Count == 1 {
		clear(c.pending)
	}
	p, ours := c.popPending(m.Channel, subscribe)
	if m.Channel == postsGoneChannel {
		// Every confirmation, a connection's first or one that go-redis
		// got after it reconnected, may follow deletes that this process
		// did not hear: the post cache starts empty (see postCache).
		first := subscribe && !c.gone
		c.gone = c.gone || subscribe
		h.mu.Unlock()
		if subscribe {
			h.db.cache.subscribed(first)
			select {
			case h.beatNow <- struct{}{}:
			default:
			}
		}
		return
	}
	if c.anchor != "" && !h.confirmedOnCluster(c, m, subscribe, ours) {
		h.mu.Unlock()
		return
	}
	if m.Channel == pullChannel {
		again := h.pullSeen
		h.pullSeen = true
		h.mu.Unlock()
		if subscribe && again {
			// Accounts may have been pulled meanwhile.
			h.db.pulled.forget()
			h.refreshHomes()
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
	case ours && p.ch == ch:
		ch.signal(p.resync)
	case !ours:
		ch.signal(true)
	}
	// A confirmation of ours for a channel that has since been dropped
	// and made again belongs to the old one: the new one has its own.
}

// popPending takes the oldest pending command of the given kind on channel
// off c's queue and reports whether there was one. Callers hold h.mu.
func (c *hubConn) popPending(channel string, subscribe bool) (pendingCommand, bool) {
	queue := c.pending[channel]
	for i, p := range queue {
		if p.subscribe == subscribe {
			// Commands before it of the other kind cannot be pending
			// any more: Redis answers in order.
			if rest := queue[i+1:]; len(rest) > 0 {
				c.pending[channel] = rest
			} else {
				delete(c.pending, channel)
			}
			return p, true
		}
	}
	return pendingCommand{}, false
}

// anchorConfirmed handles the confirmation of a cluster connection's
// anchor. Callers hold h.mu.
func (h *Hub) anchorConfirmed(c *hubConn, subscribe bool) {
	if subscribe && c.anchored {
		// The connection was made anew: the commands still pending were
		// sent on the dead one. Its channels are subscribed again one
		// by one (see hubConn), where their slots are now (the master
		// may have failed over meanwhile), and their listeners get a
		// RESYNC.
		for channel := range c.channels {
			delete(h.connOf, channel)
			h.orphans[channel] = true
		}
		clear(c.channels)
		clear(c.pending)
		h.checkSlots()
	}
	c.anchored = c.anchored || subscribe
}

// confirmedOnCluster handles what is particular to a confirmation on a
// cluster connection, ours or not, taken off c's queue already, and
// reports whether confirmed goes on with it. Callers hold h.mu.
func (h *Hub) confirmedOnCluster(c *hubConn, m *redis.Subscription, subscribe, ours bool) bool {
	if !subscribe {
		if !ours && h.connOf[m.Channel] == c {
			// Redis dropped it: its slot went to another master.
			delete(h.connOf, m.Channel)
			delete(c.channels, m.Channel)
			h.orphans[m.Channel] = true
			h.checkSlots()
		}
		return false
	}
	// A confirmation for a channel that left this connection (it moved,
	// or was left) is of no interest.
	return h.connOf[m.Channel] == c
}
