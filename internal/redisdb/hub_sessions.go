package redisdb

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// sessionWatch is one context that a revocation of its session cancels.
type sessionWatch struct{ cancel context.CancelFunc }

// WatchSession returns a context that is cancelled when the session with
// tokenHash is revoked (a logout announces the hash on revokedChannel), when
// parent ends, or when the hub closes. It waits until the hub's subscription
// to revocations is confirmed, so that a revocation published after it
// returns is not missed.
func (h *Hub) WatchSession(parent context.Context, tokenHash string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	w := &sessionWatch{cancel: cancel}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		cancel()
		return ctx, cancel
	}
	ws := h.sessions[tokenHash]
	if ws == nil {
		ws = make(map[*sessionWatch]struct{})
		h.sessions[tokenHash] = ws
	}
	ws[w] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if ws := h.sessions[tokenHash]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(h.sessions, tokenHash)
			}
		}
	})
	select {
	case <-h.revokedReady:
	case <-ctx.Done():
	}
	return ctx, cancel
}

// revoke cancels the watched contexts of the session with tokenHash.
func (h *Hub) revoke(tokenHash string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.sessions[tokenHash] {
		w.cancel() // its AfterFunc removes it, once this lock is released
	}
}

// recheckSessions starts a check of every watched session, in the
// background: those that no longer exist are revoked. It runs when the
// pub/sub connection is back, since the revocations announced while it was
// down were missed, and a Redis that came back empty has lost every session
// (and will hand their user ids to new users).
func (h *Hub) recheckSessions() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for attempt := 0; ; attempt++ {
			err := h.revokeMissingSessions()
			if err == nil {
				return
			}
			h.db.log.Warn("check watched sessions after a reconnect", "err", err)
			select {
			case <-h.done:
				return
			case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)):
			}
		}
	}()
}

// revokeMissingSessions revokes the watched sessions whose keys are gone.
func (h *Hub) revokeMissingSessions() error {
	h.mu.Lock()
	hashes := make([]string, 0, len(h.sessions))
	for hash := range h.sessions {
		hashes = append(hashes, hash)
	}
	h.mu.Unlock()
	if len(hashes) == 0 {
		return nil
	}
	// One EXISTS per key, as the keys are in different hash slots.
	cmds := make([]*redis.IntCmd, len(hashes))
	_, err := h.db.client.Pipelined(h.ctx, func(pipe redis.Pipeliner) error {
		for i, hash := range hashes {
			cmds[i] = pipe.Exists(h.ctx, sessionKeyOf(hash))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check %d sessions: %w", len(hashes), err)
	}
	for i, cmd := range cmds {
		if cmd.Val() == 0 {
			h.db.log.Info("session no longer exists: ending its live subscriptions")
			h.revoke(hashes[i])
		}
	}
	return nil
}
