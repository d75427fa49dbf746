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
	// pending holds, per channel, the subscribe and unsubscribe commands
	// sent on this connection whose confirmations have not arrived, in
	// the order sent. Redis confirms one connection's commands in that
	// order, which tells a confirmation of ours from one that go-redis
	// sends when it reconnects, or Redis dropping a channel itself, and
	// a confirmation of a subscription made earlier from one of the
	// subscription made anew since (see Hub.confirmed). The order holds
	// on one connection only: a channel that leaves one connection for
	// another (a move, a connection closed and opened again) leaves its
	// commands on the connection that carried them.
	//
	// On a cluster, a node that is not the slot's master yet (a replica
	// in the middle of taking over) refuses an SSUBSCRIBE with an error,
	// which go-redis does not hand on: the slot watch sends again what
	// waited too long (see moveChannels).
	pending map[string][]pendingCommand
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
		c := &hubConn{ps: ps, pending: make(map[string][]pendingCommand)}
		h.single = c
		h.startReading(c)
		return
	}
	h.mu.Lock()
	for _, channel := range []string{revokedChannel, pullChannel} {
		if err := h.subscribe(channel, pendingCommand{}); err != nil {
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
// need be. It queues cmd (the hubChannel it is for, if any, and whether its
// listeners get a RESYNC) on that connection for the confirmation. Callers
// hold h.mu.
func (h *Hub) subscribe(channel string, cmd pendingCommand) error {
	cmd.subscribe, cmd.sent = true, time.Now()
	if c := h.single; c != nil {
		c.pending[channel] = append(c.pending[channel], cmd)
		return c.ps.Subscribe(h.ctx, channel)
	}
	c, err := h.connFor(channel)
	if err != nil {
		// Not subscribed anywhere yet: the slot watch retries it.
		h.orphans[channel] = cmd.resync
		return err
	}
	delete(h.orphans, channel)
	c.channels[channel] = struct{}{}
	c.pending[channel] = append(c.pending[channel], cmd)
	h.connOf[channel] = c
	return c.ps.SSubscribe(h.ctx, channel)
}

// unsubscribeConn drops channel from its connection, and closes a cluster
// connection that has no channel left. Callers hold h.mu.
func (h *Hub) unsubscribeConn(channel string) error {
	if c := h.single; c != nil {
		c.pending[channel] = append(c.pending[channel], pendingCommand{sent: time.Now()})
		return c.ps.Unsubscribe(h.ctx, channel)
	}
	delete(h.orphans, channel)
	c := h.connOf[channel]
	if c == nil {
		return nil
	}
	delete(h.connOf, channel)
	delete(c.channels, channel)
	c.pending[channel] = append(c.pending[channel], pendingCommand{sent: time.Now()})
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
		pending:  make(map[string][]pendingCommand),
	}
	c.ps = client.Subscribe(h.ctx, c.anchor)
	h.conns[addr] = c
	h.startReading(c)
	return c, nil
}

// closeConn closes a cluster connection; its reader ends, and the
// confirmations still pending on it never come. Callers hold h.mu.
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
		for channel := range c.channels {
			// The channel's last command on c is its SSUBSCRIBE.
			if q := c.pending[channel]; len(q) > 0 && time.Since(q[len(q)-1].sent) > 2*slotCheckEvery {
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
		if err := h.subscribe(channel, pendingCommand{ch: h.channels[channel], resync: resync}); err != nil {
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
