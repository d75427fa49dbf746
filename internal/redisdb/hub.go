package redisdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// Hub implements warble.LiveService over one Redis pub/sub connection per
// process (on a cluster, at most one per master), shared by every
// subscription (see "Live timelines" in the package documentation and
// hub_conns.go).
type Hub struct {
	db      *DB
	id      string        // tells this hub's markers from other processes'
	markers atomic.Uint64 // markers published so far

	ctx    context.Context // Redis reads of the hub's goroutines; cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	// Channels start their goroutine when they have something to do (see
	// hubChannel.claim), from goroutines that may hold mu or not; Close
	// sets runClosed before it waits for wg, so that none starts then.
	runMu     sync.Mutex
	runClosed bool

	revokedReady chan struct{} // closed when revokedChannel is first confirmed
	revokedOnce  sync.Once

	mu       sync.Mutex
	closed   bool
	channels map[string]*hubChannel
	sessions map[string]map[*sessionWatch]struct{} // by token hash
	// routes holds, per user channel of a pulled account, the home
	// channels that get its messages.
	routes   map[string]map[*hubChannel]struct{}
	pullSeen bool // pullChannel was confirmed once

	seenEvery time.Duration // how often a live home timeline records its owner as seen

	eventsMu sync.Mutex
	events   map[string]*sharedEvent // by post id (see hub_events.go)

	// The connections (see hub_conns.go): single on one Redis; on a
	// cluster, conns by master address, connOf by channel, the channels
	// that could not be subscribed yet (with whether they need a RESYNC
	// when they are), and a request to check the slots.
	single     *hubConn
	conns      map[string]*hubConn
	connOf     map[string]*hubConn
	orphans    map[string]bool
	slotsMoved chan struct{}
	slotsKnown atomic.Bool // the slot watch has loaded the slot map once

	beatNow chan struct{} // asks beat for a beat at once (see postCache)
	// own is the hub's client for its beats and watchIDs, a
	// dedicatedClient of one connection: their commands, every few
	// seconds, stay out of the DB client's pool and hooks, where they
	// would count as a request's round trips. closeOwn closes it; both are
	// nil without a post cache.
	own      redis.UniversalClient
	closeOwn func()
}

var _ warble.LiveService = (*Hub)(nil)

// Limits of the hub.
const (
	subscriberBuffer = 64   // events queued for one subscriber before it gets a RESYNC instead
	hubInbox         = 1024 // messages queued for one channel's run
	pullLimit        = 200  // posts one pull may dispatch before it sends a RESYNC instead
	replayLimit      = 1000 // posts a resume may replay before it sends a RESYNC instead
	recentSeqs       = 512  // dispatched seqs a channel remembers, to drop their late messages
	pubsubBuffer     = 4096 // messages go-redis buffers between the connection and the hub
)

// errHubClosed is returned to subscriptions made after Close.
var errHubClosed = errors.New("live timelines: hub closed")

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
		sessions:     make(map[string]map[*sessionWatch]struct{}),
		routes:       make(map[string]map[*hubChannel]struct{}),
		seenEvery:    db.seenEvery(),
		events:       make(map[string]*sharedEvent),
		conns:        make(map[string]*hubConn),
		connOf:       make(map[string]*hubConn),
		orphans:      make(map[string]bool),
		slotsMoved:   make(chan struct{}, 1),
		beatNow:      make(chan struct{}, 1),
	}
	// Subscribing does not wait for Redis: the connections' writers
	// send the commands, the confirmations arrive through their readers,
	// and go-redis retries the subscriptions when it reconnects.
	h.openConns()
	if db.cache != nil {
		h.own, h.closeOwn = dedicatedClient(db.client, 1)
		h.wg.Add(2)
		go h.beat()
		go h.watchIDs()
	}
	return h
}

// beat publishes the hub's beat on postsGoneChannel every cacheBeatEvery,
// and at once when a connection is confirmed there, so that the post
// cache is used from then on without waiting for the next (see postCache).
// A beat that fails is not retried: the next one is due soon, and until
// one comes back the cache is not used.
func (h *Hub) beat() {
	defer h.wg.Done()
	t := time.NewTicker(h.db.cache.beatEvery)
	defer t.Stop()
	for {
		msg := beatPrefix + h.id + " " + strconv.FormatInt(time.Now().UnixNano(), 10)
		if err := h.own.Publish(h.ctx, postsGoneChannel, msg).Err(); err != nil && h.ctx.Err() == nil {
			h.db.log.Debug("post cache beat", "err", err)
		}
		select {
		case <-t.C:
		case <-h.beatNow:
		case <-h.done:
			return
		}
	}
}

// heardBeat hands a beat's time to the post cache if the beat is this
// hub's: "<hub id> <sent, Unix ns>". Other processes' beats are of no use
// here, since their times are on other clocks.
func (h *Hub) heardBeat(beat string) {
	id, sent, _ := strings.Cut(beat, " ")
	if id != h.id {
		return
	}
	if ns, err := strconv.ParseInt(sent, 10, 64); err == nil {
		h.db.cache.heardBeat(ns)
	}
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
	h.runMu.Lock()
	h.runClosed = true
	h.runMu.Unlock()
	// Subscriptions and channels with nothing to do have no goroutine
	// that would see done: they are ended here.
	h.mu.Lock()
	var subs []*subscriber
	for _, ch := range h.channels {
		ch.stopSeen()
		ch.mu.Lock()
		for sub := range ch.subs {
			subs = append(subs, sub)
		}
		ch.mu.Unlock()
	}
	h.mu.Unlock()
	for _, sub := range subs {
		sub.end()
	}
	for _, w := range watches {
		w.cancel()
	}
	h.mu.Lock()
	if h.single != nil {
		h.closeConn(h.single)
	}
	for _, c := range h.conns {
		h.closeConn(c)
	}
	h.mu.Unlock()
	h.wg.Wait()
	if h.closeOwn != nil {
		h.closeOwn()
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
		// The record itself is best effort, and waited for only briefly.
		if err := h.db.seenSoon(ctx, feed.UserID); err != nil {
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
	// A receiver in ctx takes each event from the deliver goroutine (see
	// warble.EventReceiver): the buffer of one holds the event it takes.
	recv := warble.EventReceiverFromContext(ctx)
	out := make(chan *warble.TimelineEvent)
	if recv != nil {
		out = make(chan *warble.TimelineEvent, 1)
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.unregister(sub)
		return nil, errHubClosed
	}
	h.wg.Add(1)
	h.mu.Unlock()
	if recv != nil {
		sub.recv = recv
		recv.Attached(out)
	}
	sub.begin(ctx, replay, out)
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
			if err := h.pingServer(ctx, sub.ch.name); err != nil && ctx.Err() == nil {
				return fmt.Errorf("subscribe to %s: %w", sub.ch.feed, err)
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return errHubClosed
		}
	}
}

// pingServer pings the Redis that serves channel: on a cluster the master
// of its slot, not any node, so that another master that does not answer
// cannot fail a subscription whose own master does.
func (h *Hub) pingServer(ctx context.Context, channel string) error {
	cc, ok := h.db.client.(*redis.ClusterClient)
	if !ok {
		return h.db.Ping(ctx)
	}
	master, err := cc.MasterForKey(ctx, channel)
	if err == nil {
		err = master.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("ping the master of %s: %w", channel, err)
	}
	return nil
}

// read hands what the pub/sub connection receives to the channels. It never
// waits on Redis or on a subscriber, so that one slow channel cannot hold
// up the others or the connection.
func (h *Hub) read(c *hubConn, msgs <-chan any) {
	defer h.wg.Done()
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Subscription:
			h.confirmed(c, m)
		case *redis.Message:
			if m.Channel == revokedChannel {
				h.revoke(m.Payload)
				continue
			}
			if m.Channel == pullChannel {
				h.db.pulled.forget()
				h.refreshHomes()
				continue
			}
			if m.Channel == postsGoneChannel {
				if beat, ok := strings.CutPrefix(m.Payload, beatPrefix); ok {
					h.heardBeat(beat)
				} else {
					h.db.cache.drop(m.Payload)
				}
				continue
			}
			h.mu.Lock()
			if ch := h.channels[m.Channel]; ch != nil {
				ch.post(m.Payload)
			}
			for ch := range h.routes[m.Channel] {
				ch.post(routedPrefix + m.Payload)
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
