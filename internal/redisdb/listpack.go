package redisdb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Compact timelines. Redis keeps a small sorted set as a listpack, one
// block of memory holding the members and scores one after the other, and
// converts it to a skiplist (a hash table plus a skiplist, a few pointers
// per entry) once it holds more than zset-max-listpack-entries entries or
// a member longer than zset-max-listpack-value bytes. A skiplist never
// converts back, however small it gets again. Measured on Redis 7.0, a
// home timeline of 1,000 post ids of 18 bytes grows used_memory by 126 KB
// as a skiplist and by 29 KB as a listpack; the default limit is 128, so
// every full home timeline is a skiplist unless the operator raises it.
//
// The price is time: a listpack is searched and written by walking it, so
// an insertion, a lookup by member or a trim of its head costs O(n) where a
// skiplist costs O(log n). For a full home timeline that is about 16 µs
// more of Redis per delivery, twice the time (BENCHMARKS.md).
//
// A follower's deliveries, raw (rawdelivery.go) or by script
// (addTrimmedLua), add with a plain ZADD and trim only one add in
// rawTrimEvery, so a home timeline may be up to homeSlack entries past its
// cap in between, which readers do not see (clampHome). The other scripts
// that write a home timeline (an author's own post, a follow's backfill, a
// rebuild) keep it at its cap (they trim before they add, see
// addCappedLua). So Warble asks for a limit of HomeCap + homeSlack, which
// keeps every home timeline a listpack but for a run of homeSlack
// deliveries with no trim, about 4e-8 of them; a timeline that passes the
// limit is a skiplist for good (until a rewrite, addAllCapped's or a
// rebuild's).
//
// The global timeline is left to become a skiplist: it is one key, so a
// listpack would save about 100 KB in all, while every post writes it and
// every explore page reads it, on one master. Its delivery adds before it
// trims, so once full it passes GlobalCap for an instant and converts,
// whenever GlobalCap is at least the limit (as with the defaults).

// listpackEntriesConfig and listpackValueConfig are the server settings
// that decide a sorted set's encoding. Redis before 7 calls them
// zset-max-ziplist-*, which Redis 7 still accepts as aliases.
const (
	listpackEntriesConfig = "zset-max-listpack-entries"
	listpackValueConfig   = "zset-max-listpack-value"
)

// maxTimelineMember is the longest member a timeline can hold: a post id,
// "<author id>:<seq>", both below 2^53, so at most 16 digits each.
const maxTimelineMember = 2*len("9007199254740992") + 1

// ListpackNode is what CheckListpack found on one Redis server.
type ListpackNode struct {
	Addr    string
	Entries int64 // zset-max-listpack-entries, as found
	Value   int64 // zset-max-listpack-value, as found
	Err     error // the server refused CONFIG GET (or CONFIG SET, when asked)
	Set     bool  // CONFIG SET raised the settings to what Warble needs
}

// ListpackCheck is what CheckListpack found on every server.
type ListpackCheck struct {
	WantEntries, WantValue int64
	Nodes                  []ListpackNode
}

// Short reports whether some server keeps full home timelines as
// skiplists: its limits are below what a full home timeline needs, and
// CheckListpack did not raise them.
func (c ListpackCheck) Short() bool {
	for _, n := range c.Nodes {
		if n.Err == nil && !n.Set && (n.Entries < c.WantEntries || n.Value < c.WantValue) {
			return true
		}
	}
	return false
}

// ListpackEntries is the zset-max-listpack-entries that keeps home
// timelines of homeCap compact: the cap plus the slack of deliveries'
// amortized trim (homeSlack).
func ListpackEntries(homeCap int) int { return homeCap + homeSlack }

// CheckListpack reads zset-max-listpack-entries and -value on every server
// (each master and replica of a Redis Cluster: a replica applies the
// writes it is sent under its own settings, and becomes a master at a
// failover) and compares them with HomeCap plus homeSlack and the longest
// timeline member. With set, it raises the ones that are lower by CONFIG SET (not
// CONFIG REWRITE: Warble sets them again at each start). It logs, once,
// what it found: a plain warning with what to set and what it costs when a
// server is short, and that it could not check where a server refuses
// CONFIG, as managed Redis services may; neither stops Warble.
func (db *DB) CheckListpack(ctx context.Context, set bool) ListpackCheck {
	wantEntries, wantValue := int64(ListpackEntries(db.opts.HomeCap)), int64(maxTimelineMember)
	check := ListpackCheck{WantEntries: wantEntries, WantValue: wantValue}
	var mu sync.Mutex // guards check.Nodes, which the servers' goroutines fill
	inspect := func(ctx context.Context, node *redis.Client) error {
		n := ListpackNode{Addr: node.Options().Addr}
		n.Entries, n.Value, n.Err = listpackLimits(ctx, node)
		if n.Err == nil && set && (n.Entries < wantEntries || n.Value < wantValue) {
			n.Err = raiseListpackLimits(ctx, node, n, wantEntries, wantValue)
			n.Set = n.Err == nil
		}
		mu.Lock()
		defer mu.Unlock()
		check.Nodes = append(check.Nodes, n)
		return nil
	}
	switch c := db.client.(type) {
	case *redis.ClusterClient:
		if err := c.ForEachShard(ctx, inspect); err != nil {
			check.Nodes = append(check.Nodes, ListpackNode{Err: err})
		}
	case *redis.Client:
		inspect(ctx, c)
	default:
		check.Nodes = append(check.Nodes, ListpackNode{Err: errors.New("not a client of one Redis or of a Redis Cluster")})
	}
	sort.Slice(check.Nodes, func(i, j int) bool { return check.Nodes[i].Addr < check.Nodes[j].Addr })
	db.logListpackCheck(ctx, check, set)
	return check
}

// listpackLimits reads a server's two limits.
func listpackLimits(ctx context.Context, node *redis.Client) (entries, value int64, err error) {
	get := func(name, old string) (int64, error) {
		m, err := node.ConfigGet(ctx, name).Result()
		if err != nil {
			return 0, err
		}
		v, ok := m[name]
		if !ok { // Redis 6: only the ziplist name
			m, err = node.ConfigGet(ctx, old).Result()
			if err != nil {
				return 0, err
			}
			v, ok = m[old]
		}
		if !ok {
			return 0, fmt.Errorf("CONFIG GET %s: no such setting", name)
		}
		return strconv.ParseInt(v, 10, 64)
	}
	if entries, err = get(listpackEntriesConfig, "zset-max-ziplist-entries"); err != nil {
		return 0, 0, err
	}
	value, err = get(listpackValueConfig, "zset-max-ziplist-value")
	return entries, value, err
}

// raiseListpackLimits sets those of a server's limits that are below what
// Warble wants; it never lowers one.
func raiseListpackLimits(ctx context.Context, node *redis.Client, n ListpackNode, wantEntries, wantValue int64) error {
	if n.Entries < wantEntries {
		if err := node.ConfigSet(ctx, listpackEntriesConfig, strconv.FormatInt(wantEntries, 10)).Err(); err != nil {
			return err
		}
	}
	if n.Value < wantValue {
		return node.ConfigSet(ctx, listpackValueConfig, strconv.FormatInt(wantValue, 10)).Err()
	}
	return nil
}

// logListpackCheck says what CheckListpack found, once.
func (db *DB) logListpackCheck(ctx context.Context, check ListpackCheck, set bool) {
	var short, refused, raised []string
	for _, n := range check.Nodes {
		switch {
		case n.Err != nil:
			refused = append(refused, n.Addr)
		case n.Set:
			raised = append(raised, n.Addr)
		case n.Entries < check.WantEntries || n.Value < check.WantValue:
			short = append(short, fmt.Sprintf("%s (entries %d, value %d)", n.Addr, n.Entries, n.Value))
		}
	}
	want := fmt.Sprintf("%s %d", listpackEntriesConfig, check.WantEntries)
	if slices.ContainsFunc(check.Nodes, func(n ListpackNode) bool { return n.Err == nil && n.Value < check.WantValue }) {
		want += fmt.Sprintf(" and %s %d or more", listpackValueConfig, check.WantValue)
	}
	if len(raised) > 0 {
		db.log.InfoContext(ctx, "compact home timelines: raised the sorted-set listpack limits by CONFIG SET (REDIS_SET_LISTPACK); a timeline that is a skiplist already stays one until it is rewritten, see the README",
			"set", want, "servers", strings.Join(raised, ", "))
	}
	if len(short) > 0 {
		db.log.WarnContext(ctx, fmt.Sprintf("home timelines take about 4 times the memory they need: "+
			"this Redis keeps a sorted set of more than its %s entries as a skiplist, and a full home timeline holds up to %d (HOME_TIMELINE_CAP and the slack of fan-out's amortized trim). "+
			"Set %s in redis.conf (CONFIG SET for the running server, every master and replica), or let Warble do it at start with REDIS_SET_LISTPACK=true. "+
			"A home timeline of %d posts then takes about %d KB instead of %d KB; each delivery to a full one costs about twice the Redis time (see the README, Compact timelines)",
			listpackEntriesConfig, check.WantEntries, want, check.WantEntries, listpackKB(check.WantEntries), skiplistKB(check.WantEntries)),
			"servers", strings.Join(short, ", "))
	}
	if len(refused) > 0 {
		var first error
		for _, n := range check.Nodes {
			if n.Err != nil {
				first = n.Err
				break
			}
		}
		why := "the Redis server refused CONFIG (as managed services may)"
		var reply redis.Error
		if !errors.As(first, &reply) {
			why = "Redis did not answer"
		}
		db.log.InfoContext(ctx, "could not check whether home timelines are compact: "+why+". "+
			"Set "+want+" in its configuration to keep each home timeline about 4 times smaller",
			"servers", strings.Join(refused, ", "), "err", first)
	}
}

// What a home timeline of that many entries takes in each encoding, in KB:
// used_memory per entry of 1,000-entry timelines of 18-byte post ids on
// Redis 7.0, 28.8 and 126.3 bytes (BENCHMARKS.md).
func listpackKB(entries int64) int64 { return (entries*288 + 5000) / 10000 }
func skiplistKB(entries int64) int64 { return (entries*1263 + 5000) / 10000 }

// addTrimmedLua defines addTrimmed(key, cap, score, member, trim), the add
// of one post to a home timeline by a guarded delivery (deliverScript,
// deliverBatchScript): a plain ZADD, then, when trim, a trim back to the
// newest cap entries. The caller passes trim for about one delivery in
// rawTrimEvery, chosen by rawTrim as raw deliveries choose theirs, so that
// every delivery, raw or guarded, keeps to homeSlack's argument and the
// listpack limit that CheckListpack asks for. Pages read only the top, and
// readers clamp a timeline to its cap (FindTimeline), so the entries past
// it in between are memory only. Against addCapped, which read the set's
// length (and, when full, its newest and its floor) before every add, this
// is one command a delivery, and an eighth of a trim (BENCHMARKS.md,
// "Guarded deliveries trimmed as raw ones are").
//
// It returns 1 if it added the entry, 0 if the set held it already. An
// entry older than everything the cap keeps (a delivery of an old post to
// a full timeline, after a long delay) is added all the same, and falls to
// the next trim; readers never see it, as they never see an entry past the
// cap.
const addTrimmedLua = `
local function addTrimmed(key, cap, score, member, trim)
	local added = redis.call('ZADD', key, score, member)
	if trim then
		redis.call('ZREMRANGEBYRANK', key, 0, -cap - 1)
	end
	return added
end
`

// addCappedLua defines two Lua functions for the scripts that write a home
// timeline other than a follower's delivery (addTrimmedLua). Both add to a
// sorted set capped at cap entries without making it hold more than cap
// even for an instant, so that a listpack sized to the cap stays one.
//
// addCapped(key, cap, score, member) adds one entry, first trimming the
// oldest if the set is full, down to the cap with the entry (raw
// deliveries leave a set past its cap between their trims, see
// rawTrimEvery). It returns 1 if it added the entry, 0 if the set held it
// already or it is older than everything a full set keeps.
//
// addAllCapped(key, cap, entries) adds entries, a list {score, member,
// score, member, …} with the scores as Redis gives and takes them
// (strings: Lua would print a number above 10^14 in floating-point
// notation), and keeps the newest cap of the whole. When they do not all
// fit, it rewrites the set: reads it, merges, deletes it and adds back the
// newest cap, which also makes a set that had become a skiplist a
// listpack again. It returns how many of entries the set holds after it
// that it did not hold before.
const addCappedLua = `
local function addCapped(key, cap, score, member)
	local n = redis.call('ZCARD', key)
	if n >= cap then
		-- Newer than the newest entry, the usual case, it cannot be in
		-- the set, nor older than the oldest: no other look, and no
		-- lookup by member, which walks a listpack.
		local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
		if tonumber(score) <= tonumber(newest[2]) then
			-- The oldest entry the cap keeps: the cap-th newest (a
			-- timeline may be past its cap, see rawTrimEvery).
			local floor = redis.call('ZRANGE', key, n - cap, n - cap, 'WITHSCORES')
			if tonumber(score) < tonumber(floor[2]) or redis.call('ZSCORE', key, member) then
				return 0
			end
		end
		-- Down to the cap less one, however far past it the set was.
		redis.call('ZREMRANGEBYRANK', key, 0, n - cap)
	end
	return redis.call('ZADD', key, score, member)
end

local function zaddAll(key, list)
	for i = 1, #list, 1000 do
		redis.call('ZADD', key, unpack(list, i, math.min(i + 999, #list)))
	end
end

local function addAllCapped(key, cap, entries)
	local fresh = {}
	for i = 1, #entries, 2 do
		if not redis.call('ZSCORE', key, entries[i + 1]) then
			fresh[#fresh + 1] = entries[i]
			fresh[#fresh + 1] = entries[i + 1]
		end
	end
	if #fresh == 0 then
		return 0
	end
	if redis.call('ZCARD', key) + #fresh / 2 <= cap then
		zaddAll(key, fresh)
		return #fresh / 2
	end
	local all = {}
	local old = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
	for i = 1, #old, 2 do
		all[#all + 1] = {old[i + 1], old[i], false}
	end
	for i = 1, #fresh, 2 do
		all[#all + 1] = {fresh[i], fresh[i + 1], true}
	end
	table.sort(all, function(a, b) return tonumber(a[1]) > tonumber(b[1]) end)
	local keep, added = {}, 0
	for i = 1, math.min(cap, #all) do
		keep[#keep + 1] = all[i][1]
		keep[#keep + 1] = all[i][2]
		if all[i][3] then
			added = added + 1
		end
	end
	redis.call('DEL', key)
	zaddAll(key, keep)
	return added
end
`
