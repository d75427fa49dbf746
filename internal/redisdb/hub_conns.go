package redisdb

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// hubConn is one of the hub's pub/sub connections.
//
// On one Redis the hub holds one connection, with classic SUBSCRIBE, as
// PUBLISH reaches every subscriber of the server.
//
// On a cluster, a classic PUBLISH is broadcast to every node over the
// cluster bus, so one post to 10,000 followers would be 10,000 messages on
// every master. Warble publishes there with SPUBLISH instead, which only
// the master of the channel's slot (and its replicas) carries, and the hub
// holds at most one connection per master: each shard channel is
// SSUBSCRIBEd on the connection to the master that serves its slot. When
// slots move (a failover, a resharding), the channels go where their slots
// went (see watchSlots), and their listeners get a RESYNC, as after a
// reconnect.
//
// go-redis subscribes a connection's channels again when it reconnects, in
// one SSUBSCRIBE; on a cluster that fails (CROSSSLOT) unless they share a
// slot. So the hub does it itself, one channel per command, and the
// connection's own attempt at most confirms some of them early.
type hubConn struct {
	addr   string // the master's address; "" for the connection to one Redis
	client *redis.Client
	ps     *redis.PubSub
	// anchor, on a cluster connection, is a classic channel that nobody
	// publishes on, subscribed before anything else. go-redis subscribes
	// to classic channels before shard channels when it reconnects, so a
	// confirmation of the anchor after the first one says the connection
	// was made anew, before the confirmations of its shard channels come
	// (see confirmedOnCluster).
	anchor   string
	anchored bool                // the anchor was confirmed once
	channels map[string]struct{} // the shard channels on this connection
	// unsubs counts, per channel, our SUNSUBSCRIBEs that Redis has not
	// confirmed yet on this connection: a confirmation beyond them is
	// Redis dropping the channel (see confirmedOnCluster).
	unsubs map[string]int
	// awaiting holds when each SSUBSCRIBE not confirmed yet was sent. A
	// node that is not the slot's master yet (a replica in the middle of
	// taking over) refuses it with an error, which go-redis does not
	// hand on: the slot watch sends again what waited too long.
	awaiting map[string]time.Time
}

// slotCheckEvery is how often a hub on a cluster checks that every
// channel is on the connection to the master that serves its slot. A
// failover is noticed at the latest this long after the cluster agreed on
// it (sooner when a connection breaks or Redis unsubscribes a channel).
const slotCheckEvery = time.Second

// slotReload is how long the slot watch lets go-redis reload the slot map,
// which it does in the background, before it looks at it.
const slotReload = 250 * time.Millisecond

// openConns opens the hub's first connection: on one Redis, the one it
// keeps, subscribed to the hub's own channels. On a cluster those channels
// are shard channels like the rest, and subscribe opens their masters'
// connections.
func (h *Hub) openConns() {
	if !h.db.sharded {
		ps := h.db.client.Subscribe(h.ctx, revokedChannel, pullChannel)
		c := &hubConn{ps: ps}
		h.single = c
		h.startReading(c)
		return
	}
	h.mu.Lock()
	for _, channel := range []string{revokedChannel, pullChannel} {
		if err := h.subscribe(channel, false); err != nil {
			// The slot watch subscribes it once a master answers.
			h.db.log.Warn("subscribe to hub channel", "channel", channel, "err", err)
		}
	}
	h.mu.Unlock()
	h.wg.Add(1)
	go h.watchSlots()
}

func (h *Hub) startReading(c *hubConn) {
	msgs := c.ps.ChannelWithSubscriptions(redis.WithChannelSize(pubsubBuffer))
	h.wg.Add(1)
	go h.read(c, msgs)
}

// subscribe subscribes to channel: on one Redis on the one connection, on a
// cluster on the connection to the master of the channel's slot, opened if
// need be. resync marks the subscription as one whose listeners may have
// missed messages (a channel moved from another master). Callers hold h.mu
// and have queued the pending command the confirmation answers.
func (h *Hub) subscribe(channel string, resync bool) error {
	if h.single != nil {
		return h.single.ps.Subscribe(h.ctx, channel)
	}
	c, err := h.connFor(channel)
	if err != nil {
		// Not subscribed anywhere yet: the slot watch retries it.
		h.orphans[channel] = resync
		return err
	}
	delete(h.orphans, channel)
	c.channels[channel] = struct{}{}
	c.awaiting[channel] = time.Now()
	h.connOf[channel] = c
	return c.ps.SSubscribe(h.ctx, channel)
}

// unsubscribeConn drops channel from its connection, and closes a cluster
// connection that has no channel left. Callers hold h.mu.
func (h *Hub) unsubscribeConn(channel string) error {
	if h.single != nil {
		return h.single.ps.Unsubscribe(h.ctx, channel)
	}
	delete(h.orphans, channel)
	c := h.connOf[channel]
	if c == nil {
		return nil
	}
	delete(h.connOf, channel)
	delete(c.channels, channel)
	delete(c.awaiting, channel)
	c.unsubs[channel]++
	err := c.ps.SUnsubscribe(h.ctx, channel)
	if len(c.channels) == 0 {
		h.closeConn(c)
	}
	return err
}

// connFor returns the connection to the master that serves channel's slot,
// as the cluster client last heard, opening it if there is none. Callers
// hold h.mu.
func (h *Hub) connFor(channel string) (*hubConn, error) {
	cc := h.db.client.(*redis.ClusterClient)
	master, err := cc.MasterForKey(h.ctx, channel)
	if err != nil {
		return nil, fmt.Errorf("find the master of %s: %w", channel, err)
	}
	addr := master.Options().Addr
	if c := h.conns[addr]; c != nil {
		return c, nil
	}
	// A client of its own, with the cluster's settings: the cluster
	// client closes its node clients when nodes leave the cluster, and
	// this connection must live until the hub moves its channels off.
	client := redis.NewClient(nodeOptions(cc.Options(), addr))
	c := &hubConn{
		addr:     addr,
		client:   client,
		anchor:   prefix + "ch:hub:" + h.id + ":" + addr,
		channels: make(map[string]struct{}),
		unsubs:   make(map[string]int),
		awaiting: make(map[string]time.Time),
	}
	c.ps = client.Subscribe(h.ctx, c.anchor)
	h.conns[addr] = c
	h.startReading(c)
	return c, nil
}

// closeConn closes a cluster connection; its reader ends. Callers hold h.mu.
func (h *Hub) closeConn(c *hubConn) {
	delete(h.conns, c.addr)
	for channel := range c.channels {
		delete(h.connOf, channel)
	}
	// Closing waits for nothing that needs h.mu: the reader's queue is
	// closed and it ends on its own.
	c.ps.Close()
	c.client.Close()
}

// checkSlots asks the hub to check where its channels' slots are now,
// soon: a connection broke, or Redis unsubscribed a channel itself, as a
// master does for the shard channels of slots it lost.
func (h *Hub) checkSlots() {
	select {
	case h.slotsMoved <- struct{}{}:
	default:
	}
}

// watchSlots keeps, on a cluster, every channel on the connection to the
// master of its slot: every slotCheckEvery, and when asked (checkSlots), it
// reloads the cluster's slot map and moves each channel whose slot is
// served elsewhere now. A moved channel may have missed messages while its
// old master was failing, so its confirmation on the new connection gives
// its listeners a RESYNC (see pendingCommand.resync); the hub's own
// channels are checked as after a reconnect.
func (h *Hub) watchSlots() {
	defer h.wg.Done()
	cc := h.db.client.(*redis.ClusterClient)
	tick := time.NewTicker(slotCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-h.done:
			return
		case <-tick.C:
		case <-h.slotsMoved:
		}
		// The reload runs in the background: give it time to land.
		cc.ReloadState(h.ctx)
		select {
		case <-h.done:
			return
		case <-time.After(slotReload):
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		h.moveChannels()
		h.mu.Unlock()
	}
}

// moveChannels moves every channel whose slot is served by another master
// than its connection's, and subscribes the channels that are on no
// connection (their master could not be reached). Callers hold h.mu.
func (h *Hub) moveChannels() {
	cc := h.db.client.(*redis.ClusterClient)
	moves := make(map[string]bool) // channel -> resync
	for channel, c := range h.connOf {
		master, err := cc.MasterForKey(h.ctx, channel)
		if err != nil || master.Options().Addr == c.addr {
			continue
		}
		moves[channel] = true
	}
	for channel, resync := range h.orphans {
		moves[channel] = resync
	}
	for _, c := range h.conns {
		for channel, sent := range c.awaiting {
			if time.Since(sent) > 2*slotCheckEvery {
				moves[channel] = true
			}
		}
	}
	defer func() {
		for _, c := range h.conns {
			if len(c.channels) == 0 {
				h.closeConn(c)
			}
		}
	}()
	for channel, resync := range moves {
		if h.connOf[channel] != nil {
			// Its old master may be dead: the SUNSUBSCRIBE is for
			// go-redis, which would otherwise subscribe it there again.
			h.unsubscribeConn(channel)
		}
		h.pending[channel] = []pendingCommand{{subscribe: true, ch: h.channels[channel], resync: resync}}
		if err := h.subscribe(channel, resync); err != nil {
			h.db.log.Warn("move channel to its slot's master", "channel", channel, "err", err)
		} else {
			h.db.log.Info("moved channel to its slot's master", "channel", channel, "addr", h.connOf[channel].addr)
		}
	}
}

// nodeOptions returns options for a client of one node of a cluster with
// the cluster client's settings, for a connection of its own.
func nodeOptions(o *redis.ClusterOptions, addr string) *redis.Options {
	return &redis.Options{
		Addr:            addr,
		Dialer:          o.Dialer,
		Protocol:        o.Protocol,
		Username:        o.Username,
		Password:        o.Password,
		ClientName:      o.ClientName,
		TLSConfig:       o.TLSConfig,
		DialTimeout:     o.DialTimeout,
		DialerRetries:   o.DialerRetries,
		ReadTimeout:     o.ReadTimeout,
		WriteTimeout:    o.WriteTimeout,
		PoolTimeout:     o.PoolTimeout,
		MaxRetries:      o.MaxRetries,
		MinRetryBackoff: o.MinRetryBackoff,
		MaxRetryBackoff: o.MaxRetryBackoff,
		PoolSize:        1,
	}
}
