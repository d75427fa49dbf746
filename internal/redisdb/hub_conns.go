package redisdb

import (
	"context"
	"errors"
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
//
// The hub decides what to send under its lock, and each connection's
// writer sends it (see Hub.write): a master that does not answer delays
// the commands of its own connection, not every subscription of the
// process.
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
	anchored bool // the anchor was confirmed once
	// gone is set once postsGoneChannel was confirmed on this connection:
	// it counts in postCache.live until the connection is closed.
	gone     bool
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

	// The commands for the writer (see Hub.write), in the order they
	// were queued, and whether the connection is to be closed; both
	// guarded by h.mu. wake tells the writer about either.
	commands []connCommand
	closing  bool
	wake     chan struct{}
}

// slotCheckEvery is how often a hub on a cluster checks that every
// channel is on the connection to the master that serves its slot. A
// failover is noticed at the latest this long after the cluster agreed on
// it (sooner when a connection breaks or Redis unsubscribes a channel).
const slotCheckEvery = time.Second

// slotReload is how long the slot watch lets go-redis reload the slot map,
// which it does in the background, before it looks at it.
const slotReload = 250 * time.Millisecond

// errSlotsUnknown is what connFor says before the slot watch has loaded
// the cluster's slot map once: the channel waits among the orphans, and
// the watch subscribes it as soon as the map is in.
var errSlotsUnknown = errors.New("the cluster's slot map is not loaded yet")

// openConns opens the hub's first connection: on one Redis, the one it
// keeps, subscribed to the hub's own channels. On a cluster those channels
// are shard channels like the rest, and the slot watch subscribes them,
// opening their masters' connections, once it has the slot map. Nothing
// here waits on Redis: a server starts while a master does not answer, and
// hears its channels once it does (WatchSession waits for that).
func (h *Hub) openConns() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.db.sharded {
		// Without channels, Subscribe does not connect: the writer does.
		c := &hubConn{ps: h.db.client.Subscribe(h.ctx), pending: make(map[string][]pendingCommand)}
		h.single = c
		h.startWriting(c)
		for _, channel := range []string{revokedChannel, pullChannel} {
			h.subscribe(channel, pendingCommand{}, nil)
		}
		if h.db.cache != nil {
			h.subscribe(postsGoneChannel, pendingCommand{}, nil)
		}
		return
	}
	h.orphans[revokedChannel] = false
	h.orphans[pullChannel] = false
	h.wg.Add(1)
	go h.watchSlots()
}

func (h *Hub) startReading(c *hubConn) {
	msgs := c.ps.ChannelWithSubscriptions(redis.WithChannelSize(pubsubBuffer))
	h.wg.Add(1)
	go h.read(c, msgs)
}

// startWriting starts c's writer. Callers hold h.mu.
func (h *Hub) startWriting(c *hubConn) {
	c.wake = make(chan struct{}, 1)
	h.wg.Add(1)
	go h.write(c)
}

// connCommand is a SUBSCRIBE or UNSUBSCRIBE that c's writer is to send.
type connCommand struct {
	subscribe bool
	channel   string
	// waiting, for the first SUBSCRIBE of a timeline channel, is the
	// channel whose listeners wait for it: they fail if it cannot be sent.
	waiting *hubChannel
}

// queue has c's writer send cmd after the commands queued before it, in
// that order, which is the order of c.pending. Callers hold h.mu.
func (c *hubConn) queue(cmd connCommand) {
	c.commands = append(c.commands, cmd)
	c.wakeWriter()
}

func (c *hubConn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// write sends c's queued commands, one at a time, until c is closed, and
// then closes it. Sending may wait on Redis: dialling a master that does
// not answer waits out go-redis's timeouts (seconds) before it fails,
// and so does a command behind a reconnect. So it is done here, one
// goroutine per connection, and never under h.mu, which every
// subscription of the process takes: a master that does not answer
// holds up its own connection's commands only.
//
// c's reader starts once the first commands are sent (on a cluster, the
// anchor first), so that the connection it makes is subscribed already.
func (h *Hub) write(c *hubConn) {
	defer h.wg.Done()
	reading := false
	for {
		h.mu.Lock()
		closing, next := c.closing, len(c.commands) > 0
		var cmd connCommand
		if !closing && next {
			cmd = c.commands[0]
			c.commands = c.commands[1:]
		}
		h.mu.Unlock()
		switch {
		case closing:
			// The reader ends once the PubSub is closed; the commands
			// still queued are of no use any more.
			c.ps.Close()
			if c.client != nil {
				c.client.Close()
			}
			return
		case next:
			h.send(c, cmd)
			continue
		case !reading:
			h.startReading(c)
			reading = true
		}
		<-c.wake
	}
}

// send writes one command on c. When the write of a SUBSCRIBE fails,
// go-redis reconnects and subscribes again to the channels it knew before
// this one, so this one is sent once more. If that fails too, Redis is out
// of reach: the subscriptions waiting for the channel fail at once, as any
// request does then, rather than wait for Redis to come back (go-redis
// still subscribes the channel when it reconnects).
func (h *Hub) send(c *hubConn, cmd connCommand) {
	err := c.write(h.ctx, cmd)
	if err != nil && cmd.subscribe && h.ctx.Err() == nil {
		err = c.write(h.ctx, cmd)
	}
	if err == nil || h.ctx.Err() != nil {
		return
	}
	if cmd.subscribe {
		h.db.log.Warn("subscribe to channel", "channel", cmd.channel, "addr", c.addr, "err", err)
		if ch := cmd.waiting; ch != nil {
			ch.fail(fmt.Errorf("subscribe to %s: %w", ch.feed, err))
		}
		return
	}
	h.db.log.Warn("unsubscribe from channel", "channel", cmd.channel, "addr", c.addr, "err", err)
}

// write sends cmd: classic pub/sub on one Redis and for a cluster
// connection's anchor and postsGoneChannel, sharded for the rest.
func (c *hubConn) write(ctx context.Context, cmd connCommand) error {
	sharded := c.addr != "" && cmd.channel != c.anchor && cmd.channel != postsGoneChannel
	switch {
	case cmd.subscribe && sharded:
		return c.ps.SSubscribe(ctx, cmd.channel)
	case cmd.subscribe:
		return c.ps.Subscribe(ctx, cmd.channel)
	case sharded:
		return c.ps.SUnsubscribe(ctx, cmd.channel)
	default:
		return c.ps.Unsubscribe(ctx, cmd.channel)
	}
}

// subscribe subscribes to channel: on one Redis on the one connection, on a
// cluster on the connection to the master of the channel's slot, opened if
// need be. It queues cmd (the hubChannel it is for, if any, and whether its
// listeners get a RESYNC) on that connection for the confirmation, and the
// SUBSCRIBE for its writer; waiting is the channel whose listeners fail if
// it cannot be sent. It reports an error only when the channel's master
// is not known. Callers hold h.mu.
func (h *Hub) subscribe(channel string, cmd pendingCommand, waiting *hubChannel) error {
	cmd.subscribe, cmd.sent = true, time.Now()
	if c := h.single; c != nil {
		c.pending[channel] = append(c.pending[channel], cmd)
		c.queue(connCommand{subscribe: true, channel: channel, waiting: waiting})
		return nil
	}
	c, err := h.connFor(channel)
	if err != nil {
		// Not subscribed anywhere yet: the slot watch retries it.
		h.orphans[channel] = cmd.resync
		if errors.Is(err, errSlotsUnknown) {
			return nil
		}
		return err
	}
	delete(h.orphans, channel)
	c.channels[channel] = struct{}{}
	c.pending[channel] = append(c.pending[channel], cmd)
	h.connOf[channel] = c
	c.queue(connCommand{subscribe: true, channel: channel, waiting: waiting})
	return nil
}

// unsubscribe drops channel from its connection, and closes a cluster
// connection that has no channel left. Callers hold h.mu.
func (h *Hub) unsubscribe(channel string) {
	if c := h.single; c != nil {
		c.pending[channel] = append(c.pending[channel], pendingCommand{sent: time.Now()})
		c.queue(connCommand{channel: channel})
		return
	}
	delete(h.orphans, channel)
	c := h.connOf[channel]
	if c == nil {
		return
	}
	delete(h.connOf, channel)
	delete(c.channels, channel)
	c.pending[channel] = append(c.pending[channel], pendingCommand{sent: time.Now()})
	c.queue(connCommand{channel: channel})
	if len(c.channels) == 0 {
		h.closeConn(c)
	}
}

// connFor returns the connection to the master that serves channel's slot,
// as the cluster client last heard, opening it if there is none. It waits
// on nothing: the slot map is loaded already (a first load is round trips,
// which the slot watch makes), and the connection is made by its writer.
// Callers hold h.mu.
func (h *Hub) connFor(channel string) (*hubConn, error) {
	if !h.slotsKnown.Load() {
		return nil, errSlotsUnknown
	}
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
		ps:       client.Subscribe(h.ctx), // without channels: no connection yet
		anchor:   prefix + "ch:hub:" + h.id + ":" + addr,
		channels: make(map[string]struct{}),
		pending:  make(map[string][]pendingCommand),
	}
	h.conns[addr] = c
	h.startWriting(c)
	c.queue(connCommand{subscribe: true, channel: c.anchor})
	if h.db.cache != nil {
		// A classic channel, which every node carries: each connection
		// hears the deletes, so the cache stays in use as long as one of
		// them is up (see postCache).
		c.queue(connCommand{subscribe: true, channel: postsGoneChannel})
	}
	return c, nil
}

// closeConn closes a connection: its writer closes it, outside h.mu (a
// close waits for a reconnect in progress), and then its reader ends; the
// confirmations still pending on it never come, and the confirmations
// that it still hands on are of no interest. Callers hold h.mu.
func (h *Hub) closeConn(c *hubConn) {
	if c.addr != "" {
		delete(h.conns, c.addr)
		for channel := range c.channels {
			delete(h.connOf, channel)
		}
	}
	if c.gone {
		c.gone = false
		h.db.cache.unsubscribed()
	}
	c.closing = true
	c.wakeWriter()
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
		if !h.slotsKnown.Load() {
			// The cluster client's first load of the slot map is round
			// trips, to one node after another until one answers: made
			// here, outside h.mu. Once it has a map it reloads in the
			// background.
			if _, err := cc.MasterForKey(h.ctx, revokedChannel); err == nil {
				h.slotsKnown.Store(true)
			} else if h.ctx.Err() == nil {
				h.db.log.Warn("load the cluster's slot map", "err", err)
			}
		}
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
		h.moveChannels()
		h.mu.Unlock()
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
		if len(c.commands) > 0 {
			// Its writer is still busy (its master may not answer):
			// sending again would only queue more behind it.
			continue
		}
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
			h.unsubscribe(channel)
		}
		if err := h.subscribe(channel, pendingCommand{ch: h.channels[channel], resync: resync}, nil); err != nil {
			h.db.log.Warn("move channel to its slot's master", "channel", channel, "err", err)
		} else if c := h.connOf[channel]; c != nil && resync {
			// (An orphan without resync was never subscribed: a
			// channel of the hub's own at start, or made before the
			// slot map was in.)
			h.db.log.Info("moved channel to its slot's master", "channel", channel, "addr", c.addr)
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
