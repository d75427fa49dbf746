package redisdb

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// DefaultPostCacheSize is how many posts, and as many authors, a process
// keeps in its post cache by default (see Options.PostCacheSize): a few
// hours of a busy home timeline's posts, some tens of MB at most.
const DefaultPostCacheSize = 50_000

// postCacheMaxAge bounds how long an entry is served from the cache
// whatever the hub hears. An entry can only go stale when its post is
// deleted and the invalidation does not arrive; the beats (below) stop
// the cache within seconds when a connection goes silent, and this is the
// last bound, for what they cannot see (a cluster's bus lagging behind).
const postCacheMaxAge = time.Minute

// A hub proves that it still hears postsGoneChannel by hearing its own
// beats there: every cacheBeatEvery it publishes one, with the time it
// sent it, and the cache is used only while the last of its beats to come
// back was sent within cacheHeardFor beats. A connection can die without a
// word (a network partition sends no reset), and go-redis's health check
// only writes a PING, which a dead connection takes for minutes without an
// error; the beats put a few seconds on what such a connection can cost.
// On one Redis the bound is exact: a delete published before a beat is
// delivered before it on every connection. On a cluster, where a classic
// message travels to the other nodes over the cluster bus and a beat may
// be published on another node than the delete, it holds as long as the
// bus does not lag by seconds between two nodes that both answer.
const (
	cacheBeatEvery = 2 * time.Second
	cacheHeardFor  = 3
)

// beatPrefix starts a beat's message on postsGoneChannel: "beat <hub id>
// <sent, Unix ns>". No post id has a space in it.
const beatPrefix = "beat "

// postCache is a process's cache of what never changes in a post (its
// body, its time, its author) and in a user (their username, display name
// and signup time), so that a page whose posts and authors are cached
// costs no round trip for them (see loadPosts).
//
// A post can be deleted, and every process must stop serving it: the
// deleting process drops it before DeletePost answers, and the script that
// deletes it publishes its id on postsGoneChannel, atomically with the
// delete, which every process's hub hears (see Hub). While the hub is not
// subscribed to that channel (before its first confirmation, and on a
// connection Redis never confirmed again) the cache is neither read nor
// filled; on every confirmation it is emptied (see subscribed for the one
// exception), since messages may have been lost while the connection was
// down, and Redis may have lost data (and would hand out the same ids
// again).
//
// A read that was on its way while a post was dropped may have read it
// before its delete: gen counts the drops and clears, and a read fills the
// cache only if none came between its start (before its commands were
// sent) and its end (see put). Users are never deleted, but their ids,
// like post ids, come back after Redis lost data, which clears both.
type postCache struct {
	mu    sync.Mutex
	posts *simplelru.LRU[string, cachedPost]
	users *simplelru.LRU[string, cachedUser]

	gen   atomic.Uint64 // drops and clears so far
	live  atomic.Int32  // hub connections subscribed to postsGoneChannel
	heard atomic.Int64  // when the last own beat to come back was sent, Unix ns
	// ids are the user and post id counters as a hub last read them
	// (see Hub.watchIDs).
	ids [2]atomic.Int64

	beatEvery time.Duration // cacheBeatEvery, shorter in tests

	// count, if set, is told of each lookup's hits and misses, and of
	// each clear, for metrics.
	count func(hits, misses, clears int)
}

type cachedPost struct {
	body      string
	createdAt time.Time
	at        time.Time // when it was read
}

type cachedUser struct {
	user warble.User
	at   time.Time
}

// newPostCache returns a cache of size posts and size users, or nil for
// none when size is not positive.
func newPostCache(size int, count func(hits, misses, clears int)) *postCache {
	if size <= 0 {
		return nil
	}
	posts, _ := simplelru.NewLRU[string, cachedPost](size, nil)
	users, _ := simplelru.NewLRU[string, cachedUser](size, nil)
	return &postCache{posts: posts, users: users, count: count, beatEvery: cacheBeatEvery}
}

// start returns the generation a read begins at, and false when the cache
// is not to be used now (none, or the hub is not subscribed).
func (c *postCache) start() (uint64, bool) {
	if !c.usable() {
		return 0, false
	}
	return c.gen.Load(), true
}

// usable reports whether the cache may be read and filled now: a hub
// connection is subscribed to postsGoneChannel, and one of the hub's beats
// came back recently enough to show that the deletes get through.
func (c *postCache) usable() bool {
	return c != nil && c.live.Load() > 0 && time.Since(time.Unix(0, c.heard.Load())) <= cacheHeardFor*c.beatEvery
}

// heardBeat records that a beat sent at sent (Unix ns) came back.
func (c *postCache) heardBeat(sent int64) {
	if c == nil {
		return
	}
	for {
		last := c.heard.Load()
		if sent <= last || c.heard.CompareAndSwap(last, sent) {
			return
		}
	}
}

// lookup fills in posts[i], for each entry i without its post, with the
// post cached for it (a zero at for none), and users[j] with the cached
// author authorIDs[j] (nil for none), copied into room. It takes the lock
// once for a whole page.
func (c *postCache) lookup(entries []feedEntry, authorOf []int, posts []cachedPost, authorIDs []string, users []*warble.User, room []warble.User) {
	now := time.Now()
	hits, misses := 0, 0
	c.mu.Lock()
	for i, e := range entries {
		if authorOf[i] < 0 || e.post != nil {
			continue
		}
		if p, ok := c.posts.Get(e.postID); ok && now.Sub(p.at) < postCacheMaxAge {
			posts[i] = p
			hits++
		} else {
			misses++
		}
	}
	for j, id := range authorIDs {
		if u, ok := c.users.Get(id); ok && now.Sub(u.at) < postCacheMaxAge {
			room[j] = u.user
			users[j] = &room[j]
			hits++
		} else {
			misses++
		}
	}
	c.mu.Unlock()
	if c.count != nil {
		c.count(hits, misses, 0)
	}
}

// put caches what a read that started at gen found, unless a drop or a
// clear came since, which may be about a post the read found before its
// delete.
func (c *postCache) put(gen uint64, posts []*warble.Post, users []*warble.User, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen.Load() != gen || !c.usable() {
		return
	}
	for _, p := range posts {
		c.posts.Add(p.ID, cachedPost{body: p.Body, createdAt: p.CreatedAt, at: at})
	}
	for _, u := range users {
		if u != nil {
			c.users.Add(u.ID, cachedUser{user: *u, at: at})
		}
	}
}

// drop forgets a deleted post. The generation moves under the lock, so
// that a put either lands before the drop (and is dropped) or sees it.
func (c *postCache) drop(postID string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.gen.Add(1)
	c.posts.Remove(postID)
	c.mu.Unlock()
}

// clear forgets everything.
func (c *postCache) clear() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.gen.Add(1)
	c.posts.Purge()
	c.users.Purge()
	c.mu.Unlock()
	if c.count != nil {
		c.count(0, 0, 1)
	}
}

// subscribed is called by the hub when one of its connections is
// confirmed on postsGoneChannel, for the first time or again after a
// reconnect: deletes announced while it was not may have been missed, so
// the cache starts empty. first is true for a connection's first. A
// connection opened while the cache is usable (on a cluster, for a channel
// on a master that the hub had no connection to) missed nothing: every
// delete is broadcast to every node, and another connection heard it, as
// its beats coming back show. One that only counts in live may have died
// without a word, and the cache is emptied then.
func (c *postCache) subscribed(first bool) {
	if c == nil {
		return
	}
	if first && c.usable() {
		c.live.Add(1)
		return
	}
	c.clear()
	if first {
		c.live.Add(1)
	}
}

// unsubscribed is called by the hub when a connection that was confirmed
// on postsGoneChannel closes.
func (c *postCache) unsubscribed() {
	if c == nil {
		return
	}
	c.live.Add(-1)
}

// broadcastGoneLua is the Lua function with which the scripts that delete
// a post announce it on postsGoneChannel (see postCache), in the step that
// deletes it, so that no crash can lose the announce. Its PUBLISH is
// spelled with double quotes, which newPubScript leaves alone: the channel
// is classic on a cluster too, where it reaches every node.
const broadcastGoneLua = `
local function broadcastGone(channel, postID)
	redis.call("PUBLISH", channel, postID)
end
`

// announceGone drops a deleted post from this process's cache and
// announces its delete again on postsGoneChannel, for a delete whose
// script announced it before the archive's row was gone (a post deleted
// in the archive, or during a move): a read in between may have found it
// there, after the first announce. A failure is logged: such an entry
// then lives until it is evicted, postCacheMaxAge at most.
func (db *DB) announceGone(ctx context.Context, postID string) {
	db.cache.drop(postID)
	if err := db.client.Publish(ctx, postsGoneChannel, postID).Err(); err != nil {
		db.log.WarnContext(ctx, "announce a deleted post to the post caches", "post", postID, "err", err)
	}
}

// PostCacheInUse reports whether pages are served from the post cache
// now: it is on, and a Hub over db hears of deletes.
func (db *DB) PostCacheInUse() bool {
	_, ok := db.cache.start()
	return ok
}

// idCheckEvery is how often a hub reads Redis's id counters, to tell that
// Redis lost data (see Hub.watchIDs).
const idCheckEvery = time.Second

// watchIDs empties the post cache when one of Redis's id counters goes
// back, as it does only when Redis lost data: a FLUSHALL, or a failover to
// a replica that missed writes, closes no pub/sub connection, and on a
// cluster the master that lost data may not be one that the hub listens
// on, so no (re)subscription tells. The same ids are then handed out
// again, and an entry cached for an old post or user would be served for
// the new one until postCacheMaxAge. A loss that the counters grow back
// over within idCheckEvery goes unseen here; the maximum age bounds that.
func (h *Hub) watchIDs() {
	defer h.wg.Done()
	client := h.own
	tick := time.NewTicker(idCheckEvery)
	defer tick.Stop()
	keys := [2]string{userSeqKey, postSeqKey}
	ids := &h.db.cache.ids
	for {
		pipe := client.Pipeline()
		var cmds [2]*redis.StringCmd
		for i, key := range keys {
			cmds[i] = pipe.Get(h.ctx, key)
		}
		_, _ = pipe.Exec(h.ctx) // each command's error is looked at below
		var now [2]int64
		ok := true
		for i, cmd := range cmds {
			n, err := cmd.Int64()
			switch {
			case errors.Is(err, redis.Nil):
				now[i] = 0 // no id handed out since the data went
			case err != nil:
				ok = false
			default:
				now[i] = n
			}
		}
		if ok {
			if before := [2]int64{ids[0].Load(), ids[1].Load()}; now[0] < before[0] || now[1] < before[1] {
				h.db.log.Warn("Redis's id counters went back (it lost data): emptying the post cache",
					"users", now[0], "usersBefore", before[0], "posts", now[1], "postsBefore", before[1])
				h.db.cache.clear()
			}
			ids[0].Store(now[0])
			ids[1].Store(now[1])
		}
		select {
		case <-h.done:
			return
		case <-tick.C:
		}
	}
}
