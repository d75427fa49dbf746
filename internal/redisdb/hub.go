package redisdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// Hub implements warble.LiveService over one Redis pub/sub connection per
// process, shared by every subscription.
//
// Each timeline channel with local listeners has one hubChannel: a SUBSCRIBE
// when its first listener arrives, an UNSUBSCRIBE when its last one leaves,
// and one goroutine that turns the channel's messages into events. That
// goroutine keeps POST_ADDED events in increasing cursor order for all of
// the channel's listeners at once: on an "A seq" above the highest seq it
// has dispatched, it reads everything newer from the timeline's sorted set,
// the truth, and dispatches that in order, so posts that published out of
// order still arrive in order, and a post that lands below what was already
// dispatched becomes a RESYNC rather than an event out of order. When the
// goroutine starts (and after a reconnect) it reads the newest seq and
// publishes a marker on the channel in one step; messages that arrive before
// the marker announce posts that the read saw, and are dropped.
//
// Each subscription has a bounded queue and a goroutine that feeds the
// channel its caller reads. Dispatch never blocks: a full queue is replaced
// by a RESYNC.
//
// A home timeline also shows the posts of the pulled accounts its owner
// follows (see pull.go), which are announced on those accounts' user
// channels, not on the home channel. So a home channel's goroutine reads
// the merged timeline as its truth, and routes: the hub subscribes to the
// user channels of those accounts for it (once per process, however many
// home channels want one) and hands it their messages too, which make it
// read the merged timeline as its own do. Its routes are read again at
// each start, on each RESYNC message (a follow or unfollow) and when an
// account is newly pulled (pullChannel).
type Hub struct {
	db      *DB
	ps      *redis.PubSub
	id      string        // tells this hub's markers from other processes'
	markers atomic.Uint64 // markers published so far

	ctx    context.Context // Redis reads of the hub's goroutines; cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	revokedReady chan struct{} // closed when revokedChannel is first confirmed
	revokedOnce  sync.Once

	mu       sync.Mutex
	closed   bool
	channels map[string]*hubChannel
	// pending holds, per channel name, the SUBSCRIBE and UNSUBSCRIBE
	// commands whose confirmations have not arrived, in the order sent.
	// Redis confirms them in that order, which tells a confirmation of
	// our SUBSCRIBE from one that go-redis sends when it reconnects.
	pending  map[string][]pendingCommand
	sessions map[string]map[*sessionWatch]struct{} // by token hash
	// routes holds, per user channel of a pulled account, the home
	// channels that get its messages.
	routes   map[string]map[*hubChannel]struct{}
	pullSeen bool // pullChannel was confirmed once

	seenEvery time.Duration // how often a live home timeline records its owner as seen
}

var _ warble.LiveService = (*Hub)(nil)

// Limits of the hub.
const (
	subscriberBuffer = 64   // events queued for one subscriber before it gets a RESYNC instead
	hubInbox         = 1024 // messages queued for one channel's goroutine
	pullLimit        = 200  // posts one pull may dispatch before it sends a RESYNC instead
	replayLimit      = 1000 // posts a resume may replay before it sends a RESYNC instead
	recentSeqs       = 512  // dispatched seqs a channel remembers, to drop their late messages
	pubsubBuffer     = 4096 // messages go-redis buffers between the connection and the hub
)

// markerPrefix begins the marker messages that a hub publishes on a
// timeline channel when it starts listening to it (see hubChannel.start).
// They are not events: every hub ignores the markers it did not publish,
// and decodeEvent would reject them.
const markerPrefix = "M "

// Messages that the hub puts in a home channel's inbox itself. Nothing
// published looks like them: decodeEvent rejects both.
const (
	wakeMessage    = "wake"    // a route started: read what is newer
	refreshMessage = "refresh" // an account was newly pulled: read the routes again
)

// startScript reads the newest seq of a timeline and publishes a marker on
// the timeline's channel in one atomic step, so that a listener can tell
// the messages published before the read (which arrive before the marker)
// from those published after it.
//
// KEYS[1] -> a timeline: w:global, w:u:{<id>}:home or w:u:{<id>}:posts
// ARGV[1] -> the timeline's channel
// ARGV[2] -> the marker message
//
// Returns the newest seq in the timeline, "0" if it is empty.
var startScript = redis.NewScript(`
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return top[2] or '0'
`)

// errHubClosed is returned to subscriptions made after Close.
var errHubClosed = errors.New("live timelines: hub closed")

// pendingCommand is a SUBSCRIBE (with the hubChannel it is for) or an
// UNSUBSCRIBE that Redis has not confirmed yet.
type pendingCommand struct {
	subscribe bool
	ch        *hubChannel
}

// sessionWatch is one context that a revocation of its session cancels.
type sessionWatch struct{ cancel context.CancelFunc }

// NewHub returns a Hub over db's client. It subscribes at once to the
// revocations of session tokens, for WatchSession.
func NewHub(db *DB) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	var id [8]byte
	rand.Read(id[:])
	h := &Hub{
		db:           db,
		id:           hex.EncodeToString(id[:]),
		ctx:          ctx,
		cancel:       cancel,
		done:         make(chan struct{}),
		revokedReady: make(chan struct{}),
		channels:     make(map[string]*hubChannel),
		pending:      make(map[string][]pendingCommand),
		sessions:     make(map[string]map[*sessionWatch]struct{}),
		routes:       make(map[string]map[*hubChannel]struct{}),
		seenEvery:    db.seenEvery(),
	}
	// client.Subscribe does not wait for Redis: the confirmation arrives
	// through the channel below, and go-redis retries the subscription
	// when it reconnects.
	h.ps = db.client.Subscribe(ctx, revokedChannel, pullChannel)
	msgs := h.ps.ChannelWithSubscriptions(redis.WithChannelSize(pubsubBuffer))
	h.wg.Add(1)
	go h.read(msgs)
	return h
}

// Close ends every subscription (their channels close), cancels the
// contexts of WatchSession and closes the pub/sub connection. It waits for
// the hub's goroutines to end.
func (h *Hub) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	var watches []*sessionWatch
	for _, ws := range h.sessions {
		for w := range ws {
			watches = append(watches, w)
		}
	}
	h.mu.Unlock()

	close(h.done)
	h.cancel()
	for _, w := range watches {
		w.cancel()
	}
	err := h.ps.Close()
	h.wg.Wait()
	return err
}

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
			cmds[i] = pipe.Exists(h.ctx, sessionKey(hash))
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

// SubscribeTimeline implements warble.LiveService. It returns once the
// subscription is confirmed by Redis (and, with after, once the replay is
// read), so that every change made after it returns is delivered.
func (h *Hub) SubscribeTimeline(ctx context.Context, feed warble.Feed, after *string) (<-chan *warble.TimelineEvent, error) {
	afterSeq := int64(-1)
	if after != nil {
		var err error
		if afterSeq, err = warble.ParsePostCursor(*after); err != nil {
			return nil, err
		}
	}
	key, channel, ok := feedKeys(feed)
	if !ok {
		return nil, warble.Errorf(warble.ENOTFOUND, "Timeline not found.")
	}
	if feed.Kind == warble.FeedHome {
		// A returning reader's timeline is rebuilt before the subscription
		// starts, so the subscription starts from the rebuilt timeline.
		if err := h.db.Seen(ctx, feed.UserID); err != nil {
			h.db.log.WarnContext(ctx, "record a live reader's visit", "feed", feed.String(), "err", err)
		}
	}
	sub, err := h.register(feed, key, channel)
	if err != nil {
		return nil, err
	}
	if err := h.awaitStart(ctx, sub); err != nil {
		h.unregister(sub)
		return nil, err
	}
	var replay []*warble.TimelineEvent
	if after != nil {
		if replay, err = h.replay(ctx, sub, afterSeq); err != nil {
			h.unregister(sub)
			return nil, err
		}
	}
	out := make(chan *warble.TimelineEvent)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.unregister(sub)
		return nil, errHubClosed
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go h.pump(ctx, sub, replay, out)
	return out, nil
}

// startProbe is how long a subscription waits for its channel to start
// before it checks that Redis answers at all.
const startProbe = time.Second

// awaitStart waits until sub's channel has started. It fails when the
// channel cannot start (see hubChannel.fail), and when Redis does not
// answer while it waits: a SUBSCRIBE written into a connection that died
// unnoticed (a network partition, a host that went away) is not confirmed
// until Redis is back, and a subscription should fail then as a query
// does, not wait for that.
func (h *Hub) awaitStart(ctx context.Context, sub *subscriber) error {
	probe := time.NewTicker(startProbe)
	defer probe.Stop()
	for {
		select {
		case <-sub.ch.ready:
			return nil
		case <-sub.ch.failed:
			// The channel may have started after all, on a retry:
			// started wins.
			select {
			case <-sub.ch.ready:
				return nil
			default:
				return sub.ch.err
			}
		case <-probe.C:
			if err := h.db.Ping(ctx); err != nil && ctx.Err() == nil {
				return fmt.Errorf("subscribe to %s: %w", sub.ch.feed, err)
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return errHubClosed
		}
	}
}

// register adds a subscriber to the channel of feed, subscribing to the
// channel if it is the first.
func (h *Hub) register(feed warble.Feed, key, channel string) (*subscriber, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errHubClosed
	}
	ch := h.channels[channel]
	if ch == nil {
		ch = &hubChannel{
			hub:     h,
			name:    channel,
			feed:    feed,
			key:     key,
			subs:    make(map[*subscriber]struct{}),
			inbox:   make(chan string, hubInbox),
			confirm: make(chan bool, 1),
			ready:   make(chan struct{}),
			failed:  make(chan struct{}),
			quit:    make(chan struct{}),
			recent:  newSeqRing(recentSeqs),
		}
		h.channels[channel] = ch
		h.pending[channel] = append(h.pending[channel], pendingCommand{subscribe: true, ch: ch})
		h.wg.Add(1)
		go ch.run()
		// When the write fails, go-redis reconnects and subscribes again
		// to the channels it knew before this one, so this one is sent
		// once more. If that fails too, Redis is out of reach: the
		// subscriptions waiting for the channel fail at once, as any
		// request does then, rather than wait for Redis to come back.
		err := h.ps.Subscribe(h.ctx, channel)
		if err != nil {
			err = h.ps.Subscribe(h.ctx, channel)
		}
		if err != nil {
			h.db.log.Warn("subscribe to timeline channel", "channel", channel, "err", err)
			ch.fail(fmt.Errorf("subscribe to %s: %w", feed, err))
		}
	}
	sub := &subscriber{ch: ch, wake: make(chan struct{}, 1), floor: -1}
	ch.mu.Lock()
	ch.subs[sub] = struct{}{}
	ch.mu.Unlock()
	return sub, nil
}

// unregister removes a subscriber, and unsubscribes from its channel if it
// was the last.
func (h *Hub) unregister(sub *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := sub.ch
	ch.mu.Lock()
	delete(ch.subs, sub)
	empty := len(ch.subs) == 0
	ch.mu.Unlock()
	if !empty || h.channels[ch.name] != ch {
		return
	}
	delete(h.channels, ch.name)
	close(ch.quit)
	if h.closed {
		return
	}
	for _, name := range ch.routed {
		h.dropRoute(ch, name)
	}
	ch.routed = nil
	if len(h.routes[ch.name]) == 0 {
		h.unsubscribe(ch.name)
	}
}

func (h *Hub) unsubscribe(channel string) {
	h.pending[channel] = append(h.pending[channel], pendingCommand{})
	if err := h.ps.Unsubscribe(h.ctx, channel); err != nil {
		h.db.log.Warn("unsubscribe from timeline channel", "channel", channel, "err", err)
	}
}

// setRoutes makes ch, a home channel, get the messages of the user channels
// of authors, and of no others.
func (h *Hub) setRoutes(ch *hubChannel, authors []string) {
	want := make([]string, len(authors))
	for i, a := range authors {
		want[i] = userChannel(a)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.channels[ch.name] != ch {
		return // dropped meanwhile
	}
	for _, name := range ch.routed {
		if !slices.Contains(want, name) {
			h.dropRoute(ch, name)
		}
	}
	for _, name := range want {
		if !slices.Contains(ch.routed, name) {
			h.addRoute(ch, name)
		}
	}
	ch.routed = want
}

// addRoute hands the messages of channel to ch from now on, subscribing to
// channel if nothing else here listens to it. A route starts with a wake:
// at once if the channel's messages flow already, else when its
// subscription is confirmed (see confirmed), so that ch reads what was
// published before. Callers hold h.mu.
func (h *Hub) addRoute(ch *hubChannel, channel string) {
	sinks := h.routes[channel]
	if sinks == nil {
		sinks = make(map[*hubChannel]struct{})
		h.routes[channel] = sinks
	}
	subscribed := len(sinks) > 0 || h.channels[channel] != nil
	sinks[ch] = struct{}{}
	if subscribed {
		ch.post(wakeMessage)
		return
	}
	h.pending[channel] = append(h.pending[channel], pendingCommand{subscribe: true})
	// On a failed write go-redis reconnects and subscribes again to the
	// channels it knows, this one included.
	if err := h.ps.Subscribe(h.ctx, channel); err != nil {
		h.db.log.Warn("subscribe to pulled account's channel", "channel", channel, "err", err)
	}
}

// dropRoute stops handing the messages of channel to ch, and unsubscribes
// from channel if nothing else here listens to it. Callers hold h.mu.
func (h *Hub) dropRoute(ch *hubChannel, channel string) {
	sinks := h.routes[channel]
	delete(sinks, ch)
	if len(sinks) > 0 {
		return
	}
	delete(h.routes, channel)
	if h.channels[channel] == nil {
		h.unsubscribe(channel)
	}
}

// read hands what the pub/sub connection receives to the channels. It never
// waits on Redis or on a subscriber, so that one slow channel cannot hold
// up the others or the connection.
func (h *Hub) read(msgs <-chan any) {
	defer h.wg.Done()
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Subscription:
			h.confirmed(m)
		case *redis.Message:
			if m.Channel == revokedChannel {
				h.revoke(m.Payload)
				continue
			}
			if m.Channel == pullChannel {
				h.refreshHomes()
				continue
			}
			h.mu.Lock()
			if ch := h.channels[m.Channel]; ch != nil {
				ch.post(m.Payload)
			}
			for ch := range h.routes[m.Channel] {
				ch.post(m.Payload)
			}
			h.mu.Unlock()
		}
	}
}

// refreshHomes has every home channel read its routes again.
func (h *Hub) refreshHomes() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ch := range h.channels {
		if ch.feed.Kind == warble.FeedHome {
			ch.post(refreshMessage)
		}
	}
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

// replay reads the posts of sub's feed newer than afterSeq, oldest first,
// and sets sub's floor so that its live events go on from there. It is
// read after the channel's subscription is confirmed, so that a post either
// is in the replay or comes live, or both (then the live one is dropped).
func (h *Hub) replay(ctx context.Context, sub *subscriber, afterSeq int64) ([]*warble.TimelineEvent, error) {
	ch := sub.ch
	home := ch.feed.Kind == warble.FeedHome
	args := redis.ZRangeArgs{Key: ch.key, Start: seqArg(afterSeq), Stop: "+inf", ByScore: true, Count: replayLimit + 1}
	pipe := h.db.client.Pipeline()
	oldestCmd := pipe.ZRangeWithScores(ctx, ch.key, 0, 0)
	newestCmd := pipe.ZRangeWithScores(ctx, ch.key, -1, -1)
	entriesCmd := pipe.ZRangeArgsWithScores(ctx, args)
	var pulledCmd *redis.StringSliceCmd
	if home {
		pulledCmd = pipe.SMembers(ctx, pullAuthorsKey) // see pull.go
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("replay %s: %w", ch.feed, err)
	}
	var newest int64
	if top := newestCmd.Val(); len(top) > 0 {
		newest = int64(top[0].Score)
	}
	oldest := oldestCmd.Val()
	entries := feedEntries(entriesCmd.Val())
	cut := feedCapped(ch.feed) && len(oldest) > 0 && afterSeq < int64(oldest[0].Score)
	if home && len(pulledCmd.Val()) > 0 {
		sources, err := h.db.pulledFollowed(ctx, ch.feed.UserID, pulledCmd.Val())
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
			cut = first > 0 && afterSeq < first
			newest = max(newest, last)
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

// hubChannel is one subscribed timeline channel and its listeners.
type hubChannel struct {
	hub  *Hub
	name string
	feed warble.Feed
	key  string // the sorted set of the feed

	inbox    chan string   // message payloads, for run
	overflow atomic.Bool   // set when inbox was full and a message was dropped
	confirm  chan bool     // a subscription confirmation; true if after a reconnect
	ready    chan struct{} // closed when the channel has started
	failed   chan struct{} // closed, after err is set, when it could not start
	err      error
	failOnce sync.Once
	quit     chan struct{} // closed when the last listener leaves

	mu   sync.Mutex
	subs map[*subscriber]struct{}

	routed []string // a home channel's routes (see Hub.setRoutes); guarded by hub.mu

	// Owned by run.
	pulled      []string // a home channel's followed pulled accounts, as last read
	started     bool
	last        int64    // the highest seq dispatched, or known at the start
	recent      *seqRing // seqs dispatched lately
	startLast   int64    // the newest seq the last start read
	startMarker string   // the marker the last start published
	beforeMark  bool     // the last start's marker has not come back yet
}

// fail tells the subscriptions waiting for the channel to start that Redis
// could not be reached, so that they return err instead of waiting.
func (ch *hubChannel) fail(err error) {
	ch.failOnce.Do(func() {
		ch.err = err
		close(ch.failed)
	})
}

// post queues a message for run without waiting. When the queue is full
// the message is dropped, and run sends a RESYNC once it catches up.
func (ch *hubChannel) post(payload string) {
	select {
	case ch.inbox <- payload:
	default:
		ch.overflow.Store(true)
	}
}

// signal tells run that the channel's subscription is confirmed.
func (ch *hubChannel) signal(reconnected bool) {
	select {
	case ch.confirm <- reconnected:
	default:
		// One is queued; a RESYNC is sent anyway if either needs it.
		if reconnected {
			select {
			case <-ch.confirm:
			default:
			}
			ch.signal(true)
		}
	}
}

// run turns the channel's messages into events until the channel is
// dropped or the hub closes.
func (ch *hubChannel) run() {
	h := ch.hub
	defer h.wg.Done()
	// A user who watches their home timeline live is active, requests or
	// not: fan-out must not skip them (see inactive.go). SubscribeTimeline
	// recorded the visit when the subscription began.
	var seen <-chan time.Time
	if ch.feed.Kind == warble.FeedHome && h.db.opts.InactiveAfter >= 0 {
		t := time.NewTicker(h.seenEvery)
		defer t.Stop()
		seen = t.C
	}
	for {
		select {
		case <-ch.quit:
			return
		case <-h.done:
			return
		case <-seen:
			ch.touch()
		case reconnected := <-ch.confirm:
			ch.start(reconnected && ch.started)
		case payload := <-ch.inbox:
			if !ch.started {
				// The reader signals a confirmation before it posts the
				// messages received after it, so a message that finds
				// no confirmation here is one of an earlier
				// subscription to the channel, dropped with it.
				select {
				case <-ch.confirm:
					ch.start(false)
				default:
					continue
				}
			}
			if ch.overflow.Swap(false) {
				ch.start(true)
				continue
			}
			switch payload {
			case wakeMessage:
				ch.pull()
				continue
			case refreshMessage:
				if ch.refresh() {
					// Posts of a newly pulled account may sit below what
					// was dispatched: the listeners refetch.
					ch.pull()
					ch.dispatch(&hubEvent{ev: resyncEvent(ch.last), seq: ch.last})
				}
				continue
			}
			if strings.HasPrefix(payload, markerPrefix) {
				if payload == ch.startMarker {
					ch.beforeMark = false
				}
				continue // a marker of an earlier start, or of another process
			}
			ev, ok := decodeEvent(payload)
			if !ok {
				h.db.log.Warn("malformed timeline message", "channel", ch.name, "message", payload)
				continue
			}
			ch.handle(ev)
		}
	}
}

// start reads the newest seq of the timeline: live events begin after it.
// The read publishes a marker on the channel in the same atomic step, so
// the messages that come before the marker are exactly those published
// before the read: their posts are at or below the newest seq read, and run
// drops them, however late the connection delivers them. With resync,
// messages may have been lost (a reconnect, a full inbox), and the
// listeners get a RESYNC: their refetch comes after this read. Redis errors
// are retried until the channel goes away; the first one of a channel that
// has not started yet also fails the subscriptions waiting for it.
//
// A resync that finds the timeline's newest seq below the last one
// dispatched means entries were taken away meanwhile: the newest post was
// deleted, or Redis lost its data (it restarted without persistence, or
// failed over to a replica that lagged behind), and the seqs it hands out
// next may be ones dispatched before. The channel then forgets what it
// dispatched, and its RESYNC tells subscriptions to do the same (see
// subscriber.filter), so that the new posts arrive as POST_ADDED.
func (ch *hubChannel) start(resync bool) {
	h := ch.hub
	// Messages dropped so far are covered by what this reads.
	ch.overflow.Store(false)
	marker := markerPrefix + h.id + ":" + strconv.FormatUint(h.markers.Add(1), 10)
	for attempt := 0; ; attempt++ {
		ch.refresh()
		newest, err := startScript.Run(h.ctx, h.db.client, []string{ch.key}, ch.name, marker).Text()
		var pulled int64
		if err == nil {
			pulled, err = h.db.newestPulled(h.ctx, ch.pulled)
		}
		if err == nil {
			ch.startLast, _ = strconv.ParseInt(newest, 10, 64)
			ch.startLast = max(ch.startLast, pulled)
			ch.startMarker, ch.beforeMark = marker, true
			break
		}
		h.db.log.Warn("read timeline for live events", "feed", ch.feed.String(), "err", err)
		if !ch.started {
			ch.fail(fmt.Errorf("start live %s: %w", ch.feed, err))
		}
		select {
		case <-ch.quit:
			return
		case <-h.done:
			return
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, 2*time.Second)):
		}
	}
	reset := resync && ch.startLast < ch.last
	if reset {
		ch.last = ch.startLast
		ch.recent = newSeqRing(recentSeqs)
	}
	ch.last = max(ch.last, ch.startLast)
	if !ch.started {
		ch.started = true
		close(ch.ready)
	}
	if resync {
		ch.dispatch(&hubEvent{ev: resyncEvent(ch.last), seq: ch.last, reset: reset})
	}
}

// handle dispatches the events that one channel message stands for.
func (ch *hubChannel) handle(ev channelEvent) {
	switch ev.op {
	case opAdded:
		switch {
		case ev.seq > ch.last:
			ch.pull()
		case ch.beforeMark && ev.seq <= ch.startLast:
			// Published before the last start read the timeline.
		case ch.recent.has(ev.seq):
			// An earlier pull dispatched it already.
		default:
			// It landed below what was dispatched already: it cannot be
			// delivered in order.
			ch.dispatch(&hubEvent{ev: resyncEvent(ch.last), seq: ch.last})
		}
	case opRemoved:
		id := ev.postID
		ch.dispatch(&hubEvent{ev: &warble.TimelineEvent{
			Kind: warble.PostRemoved, Cursor: warble.PostCursor(ev.seq), PostID: &id,
		}, seq: ev.seq})
	case opResync:
		ch.refresh() // a follow or unfollow: the routes may change
		ch.last = max(ch.last, ev.seq)
		ch.dispatch(&hubEvent{ev: resyncEvent(ev.seq), seq: ev.seq})
	}
}

// pull dispatches, oldest first, the posts of the timeline newer than the
// last seq dispatched.
func (ch *hubChannel) pull() {
	h := ch.hub
	args := redis.ZRangeArgs{Key: ch.key, Start: seqArg(ch.last), Stop: "+inf", ByScore: true, Count: pullLimit + 1}
	var entries []feedEntry
	var err error
	if len(ch.pulled) > 0 {
		entries, err = h.db.rangeMerged(h.ctx, ch.feed.UserID, ch.pulled, args)
	} else {
		entries, err = h.db.rangeFeed(h.ctx, args)
	}
	var posts []*warble.Post
	if err == nil && len(entries) <= pullLimit {
		posts, err = h.db.loadPosts(h.ctx, entries)
	}
	if err != nil {
		if h.ctx.Err() == nil {
			h.db.log.Warn("read new posts for live events", "feed", ch.feed.String(), "err", err)
			ch.dispatch(&hubEvent{ev: resyncEvent(ch.last), seq: ch.last})
		}
		return
	}
	if len(entries) > pullLimit {
		// Too many at once: the listeners refetch instead. Everything up
		// to the newest entry counts as delivered by that.
		ch.start(true)
		return
	}
	for _, e := range entries {
		ch.recent.add(e.seq)
		ch.last = max(ch.last, e.seq)
	}
	for _, p := range posts {
		ch.dispatch(&hubEvent{ev: addedEvent(p), seq: p.Seq})
	}
}

// touch records that a home channel's owner was seen.
func (ch *hubChannel) touch() {
	h := ch.hub
	if err := h.db.Seen(h.ctx, ch.feed.UserID); err != nil && h.ctx.Err() == nil {
		h.db.log.Warn("record a live reader's visit", "feed", ch.feed.String(), "err", err)
	}
}

// refresh reads which pulled accounts a home channel's owner follows, and
// routes their channels' messages to it. It reports whether they changed.
// A Redis error keeps the old ones: the next start or refresh reads them.
func (ch *hubChannel) refresh() bool {
	if ch.feed.Kind != warble.FeedHome {
		return false
	}
	h := ch.hub
	sources, err := h.db.homeSources(h.ctx, ch.feed.UserID)
	if err != nil {
		if h.ctx.Err() == nil {
			h.db.log.Warn("read pulled accounts for live events", "feed", ch.feed.String(), "err", err)
		}
		return false
	}
	changed := !slices.Equal(sources, ch.pulled)
	ch.pulled = sources
	h.setRoutes(ch, sources)
	return changed
}

// dispatch queues an event for every listener of the channel.
func (ch *hubChannel) dispatch(e *hubEvent) {
	e.newest = ch.last
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for sub := range ch.subs {
		sub.push(e)
	}
}

// hubEvent is an event on its way to subscribers, with the numbers they
// need to filter it.
type hubEvent struct {
	ev     *warble.TimelineEvent
	seq    int64 // the event's position
	newest int64 // the channel's newest position when it was dispatched
	reset  bool  // a RESYNC after the timeline went back to seq (see hubChannel.start)
}

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

// addedEvent is the POST_ADDED event of p.
func addedEvent(p *warble.Post) *warble.TimelineEvent {
	id := p.ID
	return &warble.TimelineEvent{Kind: warble.PostAdded, Cursor: warble.PostCursor(p.Seq), PostID: &id, Post: p}
}

// resyncEvent is a RESYNC whose newest position is seq.
func resyncEvent(seq int64) *warble.TimelineEvent {
	return &warble.TimelineEvent{Kind: warble.Resync, Cursor: warble.PostCursor(seq)}
}

// seqRing is a set of the last n seqs added to it.
type seqRing struct {
	ring []int64
	next int
	set  map[int64]int // seq -> how many times it is in ring
}

func newSeqRing(n int) *seqRing {
	return &seqRing{ring: make([]int64, 0, n), set: make(map[int64]int, n)}
}

func (r *seqRing) add(seq int64) {
	if len(r.ring) < cap(r.ring) {
		r.ring = append(r.ring, seq)
	} else {
		old := r.ring[r.next]
		if r.set[old]--; r.set[old] == 0 {
			delete(r.set, old)
		}
		r.ring[r.next] = seq
		r.next = (r.next + 1) % len(r.ring)
	}
	r.set[seq]++
}

func (r *seqRing) has(seq int64) bool { return r.set[seq] > 0 }
