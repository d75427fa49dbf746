package redisdb

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/warble/warble/internal/warble"
)

// hubChannel is one subscribed timeline channel and its listeners.
//
// What the channel receives waits in its mailbox, which run empties. run is
// a goroutine only while the mailbox holds something (see claim): a server
// with thousands of sockets has a home channel per signed-in subscriber,
// nearly all idle, and a parked goroutine for each was 8 KB of stack.
// One run at a time keeps the channel's messages in order.
type hubChannel struct {
	hub  *Hub
	name string
	feed warble.Feed
	key  string // the sorted set of the feed

	ready    chan struct{} // closed when the channel has started
	failed   chan struct{} // closed, after err is set, when it could not start
	err      error
	failOnce sync.Once
	quit     chan struct{} // closed when the last listener leaves

	boxMu     sync.Mutex
	inbox     []string    // message payloads, at most inboxMax
	inboxMax  int         // see inboxSize
	overflow  bool        // inbox was full and a message was dropped
	confirmed bool        // a subscription confirmation is queued
	resync    bool        // one of the confirmations queued came after a reconnect
	touchDue  bool        // the owner of a home channel is due to be recorded as seen
	seen      *time.Timer // sets touchDue; nil once stopped
	running   bool        // a run goroutine is on its way

	mu   sync.Mutex
	subs map[*subscriber]struct{}

	deliveries deliveries // runs the subscribers' deliver goroutines (hub_deliveries.go)

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
	ch.boxMu.Lock()
	if len(ch.inbox) < ch.inboxMax {
		ch.inbox = append(ch.inbox, payload)
	} else {
		ch.overflow = true
	}
	start := ch.claim()
	ch.boxMu.Unlock()
	if start {
		ch.hub.runChannel(ch)
	}
}

// signal tells run that the channel's subscription is confirmed. Two
// confirmations not taken yet are one, which needs a RESYNC if either does.
func (ch *hubChannel) signal(reconnected bool) {
	ch.boxMu.Lock()
	ch.confirmed = true
	ch.resync = ch.resync || reconnected
	start := ch.claim()
	ch.boxMu.Unlock()
	if start {
		ch.hub.runChannel(ch)
	}
}

// startSeen records the owner of a home channel as seen every
// hub.seenEvery, for as long as the channel lives: a user who watches their
// home timeline live is active, requests or not, and fan-out must not skip
// them (see inactive.go). SubscribeTimeline recorded the visit when the
// subscription began.
func (ch *hubChannel) startSeen() {
	if ch.feed.Kind != warble.FeedHome || ch.hub.db.opts.InactiveAfter < 0 {
		return
	}
	ch.boxMu.Lock()
	ch.seen = time.AfterFunc(ch.hub.seenEvery, ch.seenDue)
	ch.boxMu.Unlock()
}

func (ch *hubChannel) seenDue() {
	ch.boxMu.Lock()
	if ch.seen == nil { // stopped meanwhile
		ch.boxMu.Unlock()
		return
	}
	ch.seen.Reset(ch.hub.seenEvery)
	ch.touchDue = true
	start := ch.claim()
	ch.boxMu.Unlock()
	if start {
		ch.hub.runChannel(ch)
	}
}

// stopSeen stops startSeen's timer: the channel was dropped or the hub
// closed.
func (ch *hubChannel) stopSeen() {
	ch.boxMu.Lock()
	if ch.seen != nil {
		ch.seen.Stop()
		ch.seen = nil
	}
	ch.boxMu.Unlock()
}

// claim reports whether the caller, which has just put something in the
// mailbox, should start run: none runs, or the one running has already
// looked and found the mailbox empty. Callers hold boxMu.
func (ch *hubChannel) claim() bool {
	if ch.running {
		return false
	}
	ch.running = true
	return true
}

// Kinds of what run takes from the mailbox.
const (
	takeNone = iota
	takeTouch
	takeConfirm
	takeMessage
)

// take returns the next thing in the mailbox: a due touch, then a
// confirmation (with whether it needs a RESYNC), then the oldest message.
// When there is none it marks run gone, in the same step, so that the next
// post starts it again.
//
// When confirmations and messages came through two Go channels, run took
// them in one select, in either order: a confirmation first is one of
// those orders, so nothing here depends on the new one.
func (ch *hubChannel) take() (kind int, resync bool, payload string) {
	ch.boxMu.Lock()
	defer ch.boxMu.Unlock()
	switch {
	case ch.touchDue:
		ch.touchDue = false
		return takeTouch, false, ""
	case ch.confirmed:
		resync = ch.resync
		ch.confirmed, ch.resync = false, false
		return takeConfirm, resync, ""
	case len(ch.inbox) > 0:
		payload = ch.inbox[0]
		ch.inbox[0] = ""
		ch.inbox = ch.inbox[1:]
		if len(ch.inbox) == 0 {
			// The global channel's burst may have grown it large.
			ch.inbox = nil
		}
		return takeMessage, false, payload
	}
	ch.running = false
	return takeNone, false, ""
}

// takeOverflow reports whether messages were dropped since the last call,
// or since the last start.
func (ch *hubChannel) takeOverflow() bool {
	ch.boxMu.Lock()
	defer ch.boxMu.Unlock()
	dropped := ch.overflow
	ch.overflow = false
	return dropped
}

// runChannel starts ch's run on a goroutine of its own, unless the hub is
// closing. Then ch's mailbox stays marked running, so nothing starts it
// again.
func (h *Hub) runChannel(ch *hubChannel) {
	h.runMu.Lock()
	if h.runClosed {
		h.runMu.Unlock()
		return
	}
	h.wg.Add(1)
	h.runMu.Unlock()
	go ch.run()
}

// run turns what the channel's mailbox holds into events until the mailbox
// is empty, the channel is dropped or the hub closes.
func (ch *hubChannel) run() {
	h := ch.hub
	defer h.wg.Done()
	for {
		select {
		case <-ch.quit:
			return // left marked running: nothing starts it again
		case <-h.done:
			return
		default:
		}
		kind, resync, payload := ch.take()
		switch kind {
		case takeNone:
			return
		case takeTouch:
			ch.touch()
		case takeConfirm:
			ch.start(resync && ch.started)
		case takeMessage:
			ch.receive(payload)
		}
	}
}

// receive handles one message of the channel.
func (ch *hubChannel) receive(payload string) {
	h := ch.hub
	if !ch.started {
		// The reader signals a confirmation before it posts the messages
		// received after it, and take hands out a confirmation before any
		// message, so a message that finds the channel not started is one
		// of an earlier subscription to the channel, dropped with it.
		return
	}
	if ch.takeOverflow() {
		ch.start(true)
		return
	}
	payload, routed := strings.CutPrefix(payload, routedPrefix)
	switch payload {
	case wakeMessage:
		ch.pull()
		return
	case refreshMessage:
		if ch.refresh() {
			// Posts of a newly pulled account may sit below what was
			// dispatched: the listeners refetch.
			ch.pull()
			ch.dispatch(&hubEvent{ev: resyncEvent(ch.last), seq: ch.last})
		}
		return
	}
	if strings.HasPrefix(payload, markerPrefix) {
		if payload == ch.startMarker {
			ch.beforeMark = false
		}
		return // a marker of an earlier start, or of another process
	}
	ev, ok := decodeEvent(payload)
	if !ok {
		h.db.log.Warn("malformed timeline message", "channel", ch.name, "message", payload)
		return
	}
	ch.handle(ev, routed)
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
	ch.takeOverflow()
	marker := markerPrefix + h.id + ":" + strconv.FormatUint(h.markers.Add(1), 10)
	for attempt := 0; ; attempt++ {
		ch.refresh()
		newest, err := h.db.pub(startScript).Run(h.ctx, h.db.client, []string{ch.key}, ch.name, marker).Text()
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

// handle dispatches the events that one channel message stands for;
// routed says it came from a pulled account's channel (see Hub.addRoute).
//
// A routed post is read from the merged timeline, never dispatched as
// announced: its message may have been routed before an unfollow's RESYNC
// took the route away, and be handled after it, when the home channel no
// longer merges the account, whose post must then not come.
func (ch *hubChannel) handle(ev channelEvent, routed bool) {
	switch ev.op {
	case opAdded:
		switch {
		case ev.seq > ch.last && !routed && ch.feed.Kind == warble.FeedHome && len(ch.pulled) == 0:
			ch.added(ev)
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
	var events []*warble.TimelineEvent
	if err == nil && len(entries) <= pullLimit {
		events, err = h.addedEvents(h.ctx, entries)
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
	for _, ev := range events {
		ch.dispatch(&hubEvent{ev: ev, seq: ev.Post.Seq})
	}
}

// added dispatches the post that a home channel's message announces
// without reading the timeline, as pull would. A home timeline is written
// only by steps that announce what they write on its channel (an "A" per
// post added, an "S" for a rewrite), except that fan-out leaves out the
// announce where nobody listens, and a channel that nobody listened to
// yet reads the newest seq when it starts. So the messages come in the
// order of the adds, and whatever was added before this post has been
// dispatched already, or is at or below what the channel's start read, or
// was in a message that was lost, which starts the channel again with a
// RESYNC. Only a post added after a newer one (two fan-outs that raced)
// is not delivered in order: its message finds it below what was
// dispatched, and it becomes a RESYNC, which pull avoids when its read
// comes after that add. That is rare on one user's home timeline, and the
// read it saves is a round trip per live home timeline for every post,
// which the home subscribers of a followed author waited for
// (BENCHMARKS.md, "Waves, and a home channel that reads less"). A home
// timeline merged with pulled accounts still reads: its other sources
// announce on their own channels.
func (ch *hubChannel) added(ev channelEvent) {
	h := ch.hub
	events, err := h.addedEvents(h.ctx, []feedEntry{{postID: ev.postID, seq: ev.seq}})
	if err != nil {
		if h.ctx.Err() == nil {
			// The listeners refetch, after the post was added.
			h.db.log.Warn("read new post for live events", "feed", ch.feed.String(), "err", err)
			ch.last = ev.seq
			ch.dispatch(&hubEvent{ev: resyncEvent(ch.last), seq: ch.last})
		}
		return
	}
	ch.recent.add(ev.seq)
	ch.last = ev.seq
	for _, e := range events { // none when the post is gone already
		ch.dispatch(&hubEvent{ev: e, seq: e.Post.Seq})
	}
}

// touch records that a home channel's owner was seen.
func (ch *hubChannel) touch() {
	h := ch.hub
	// Waited for briefly: events wait behind it.
	if err := h.db.seenSoon(h.ctx, ch.feed.UserID); err != nil && h.ctx.Err() == nil {
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
var startScript = newPubScript(`
local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return top[2] or '0'
`)

// markerPrefix begins the marker messages that a hub publishes on a
// timeline channel when it starts listening to it (see hubChannel.start).
// They are not events: every hub ignores the markers it did not publish,
// and decodeEvent would reject them.
const markerPrefix = "M "

// routedPrefix begins a message that a home channel's inbox got from the
// channel of a pulled account it routes (see Hub.addRoute), before the
// message as published. Nothing published begins with it: decodeEvent
// would reject it.
const routedPrefix = "via "

// Messages that the hub puts in a home channel's inbox itself. Nothing
// published looks like them: decodeEvent rejects both.
const (
	wakeMessage    = "wake"    // a route started: read what is newer
	refreshMessage = "refresh" // an account was newly pulled: read the routes again
)

// hubEvent is an event on its way to subscribers, with the numbers they
// need to filter it.
type hubEvent struct {
	ev     *warble.TimelineEvent
	seq    int64 // the event's position
	newest int64 // the channel's newest position when it was dispatched
	reset  bool  // a RESYNC after the timeline went back to seq (see hubChannel.start)
}

// seqRing is a set of the last n seqs added to it.
type seqRing struct {
	n    int
	ring []int64
	next int
	set  map[int64]int // seq -> how many times it is in ring
}

// newSeqRing returns an empty ring of n seqs. It grows as seqs are added:
// most channels of a server are home timelines that see a few posts an
// hour, and a full ring and set up front would cost them 20 KB each.
func newSeqRing(n int) *seqRing {
	return &seqRing{n: n, set: make(map[int64]int)}
}

func (r *seqRing) add(seq int64) {
	if len(r.ring) < r.n {
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

// inboxSize is the inbox of a channel of feed: the global timeline gets
// every post of the site, a home or user timeline few of them, and there
// are as many of those channels as signed-in sockets, so they get a
// smaller one (a full inbox still turns into a RESYNC, as for any).
func inboxSize(feed warble.Feed) int {
	if feed.Kind == warble.FeedGlobal {
		return hubInbox
	}
	return hubInbox / 8
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
			hub:      h,
			name:     channel,
			feed:     feed,
			key:      key,
			subs:     make(map[*subscriber]struct{}),
			inboxMax: inboxSize(feed),
			ready:    make(chan struct{}),
			failed:   make(chan struct{}),
			quit:     make(chan struct{}),
			recent:   newSeqRing(recentSeqs),
		}
		h.channels[channel] = ch
		ch.startSeen()
		// The connection's writer sends it, and fails the channel if it
		// cannot (see Hub.send); here it fails only when the channel's
		// master is not known.
		if err := h.subscribe(channel, pendingCommand{ch: ch}, ch); err != nil {
			h.db.log.Warn("subscribe to timeline channel", "channel", channel, "err", err)
			ch.fail(fmt.Errorf("subscribe to %s: %w", feed, err))
		}
	}
	sub := &subscriber{ch: ch, floor: -1, after: -1}
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
	ch.stopSeen()
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
	// On a failed write go-redis reconnects and subscribes again to the
	// channels it knows, this one included.
	if err := h.subscribe(channel, pendingCommand{}, nil); err != nil {
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
