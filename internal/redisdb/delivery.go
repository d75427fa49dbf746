package redisdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// fanOutChunk is how many followers one round trip of fan-out (or of its
// undoing on delete) reads and delivers to.
const fanOutChunk = 1000

// deliverScript adds a post to a follower's home timeline, trimming it
// back to its cap after one add in rawTrimEvery, as raw deliveries do (see
// addTrimmedLua), and announces it. It is idempotent: a post that the
// timeline holds already (a repeated delivery) is not announced again.
// (The global timeline has a script of its own, listGlobalScript.)
//
// It is guarded: the post is added only if the follower still follows the
// author (an unfollow that ran while the fan-out was walking the followers
// has removed the author's posts from the timeline already, and must not
// get one back), and a follower not seen since the cutoff is skipped (their
// timeline is rebuilt when they come back, see inactive.go).
//
// KEYS[1] -> w:u:{<follower>}:home
// KEYS[2] -> w:u:{<follower>}:following
// KEYS[3] -> w:u:{<follower>}:seen
// ARGV[1] -> post seq
// ARGV[2] -> post id
// ARGV[3] -> author id
// ARGV[4] -> the timeline's cap
// ARGV[5] -> the timeline's channel
// ARGV[6] -> the added message
// ARGV[7] -> the inactive cutoff, unix ms (0: none)
// ARGV[8] -> "1" to trim the timeline back to its cap after the add
// (rawTrim), else "0"
//
// Returns 1 if the post was added, 0 if it was there already, -1 if the
// follower does not follow the author, -2 if the follower is inactive.
var deliverScript = newPubScript(addTrimmedLua + `
if not redis.call('ZSCORE', KEYS[2], ARGV[3]) then
	return -1
end
local seen = redis.call('GET', KEYS[3])
if seen and tonumber(seen) < tonumber(ARGV[7]) then
	return -2
end
if addTrimmed(KEYS[1], tonumber(ARGV[4]), ARGV[1], ARGV[2], ARGV[8] == '1') == 0 then
	return 0
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1
`)

// deliverBatchScript is deliverScript's guarded home-timeline step for many
// followers in one call, for one Redis, where a script may touch the keys
// of any slot it declares. Per follower it does what deliverScript does, in
// the same order and as atomically (a racing unfollow runs wholly before
// or after the call), but without the cost of a script call per follower:
// the seen times are read with one MGET and who listens to the home
// channels with one PUBSUB NUMSUB, and only the follower's guard (the
// author's score in their following set, the truth), the add (and its
// trim, for one follower in rawTrimEvery) and,
// for a follower listened to, the announce are commands of their own. A
// Redis Cluster keeps deliverScript, one call per follower, since
// followers' keys are in as many slots as there are followers.
//
// The guard reads the following set, not the author's followers side,
// which would cost less (one range read for the batch): the followers side
// can list someone who does not follow (an unfollow that failed between
// its steps, entries left by older versions), and fan-out believing it
// would give them every new post of the author, with nothing to take them
// off (BENCHMARKS.md, fan-out's second round).
//
// Announcing only on channels that have a subscriber is what PUBLISH does
// anyway, decided in the same atomic step: a subscriber that arrives after
// the call reads the timeline, which holds the post, when it starts (see
// the hub). A pattern subscription (none in Warble, but a tool's PSUBSCRIBE
// may listen) is not counted by NUMSUB, so with any pattern subscribed on
// the server every channel is announced on. Nor are the subscribers of a
// replica, which hears the master's PUBLISH: Warble's hub subscribes on the
// server it writes to, never on a replica.
//
// KEYS[3i-2], KEYS[3i-1], KEYS[3i] -> the home timeline, following set and
// seen key of the i-th follower: w:u:{<follower>}:home, …:following, …:seen
// ARGV[1] -> post seq
// ARGV[2] -> post id
// ARGV[3] -> author id
// ARGV[4] -> the home timelines' cap
// ARGV[5] -> the added message
// ARGV[6] -> the inactive cutoff, unix ms (0: none)
// ARGV[6+i] -> the i-th follower's home channel
// ARGV[7+n] -> a character for each follower in turn, "1" to trim the
// follower's timeline back to its cap after the add (rawTrim), else "0"
// KEYS[3n+1] -> for a call in the pipeline that ends its job, the job's
// delivery mark, w:{fanout}:delivered:<entry id>, counted up once the
// call's deliveries are all done (see finishFanOutLua)
//
// Returns how many of the followers it added the post for.
//
// Called with ARGV[1] "finish", it ends a fan-out job of one batch
// instead, at the end of that batch's pipeline, after its deliveries (see
// finishFanOutLua): the same script, so that a Redis that lost its
// scripts refuses the deliveries and the end alike, and never runs the
// end of a job whose deliveries it refused. Called with ARGV[1]
// "carried", it runs jobs that carry their followers whole, their
// deliveries and their end in one step (see carriedLua).
var deliverBatchScript = newPubScript(finishFanOutLua + listGlobalLua + addTrimmedLua + seenAndLiveLua + carriedLua + `
local cap, author, msg = tonumber(ARGV[4]), ARGV[3], ARGV[5]
local cutoff = tonumber(ARGV[6])
local n = math.floor(#KEYS / 3)
local trims = ARGV[7 + n]
local seen, live = seenAndLive(0, 6, n, cutoff)
local added = 0
for i = 1, n do
	if redis.call('ZSCORE', KEYS[3 * i - 1], author) then
		local s = seen[i]
		if not (s and tonumber(s) < cutoff) and addTrimmed(KEYS[3 * i - 2], cap, ARGV[1], ARGV[2], string.byte(trims, i) == 49) == 1 then
			if live[i] then
				redis.call('PUBLISH', ARGV[6 + i], msg)
			end
			added = added + 1
		end
	end
end
if #KEYS > 3 * n then
	redis.call('INCR', KEYS[#KEYS])
end
return added
`)

// finishFanOutLua is deliverBatchScript's "finish" entry. On one Redis,
// where the posts' hashes and the jobs' stream may be in many slots, it
// ends fan-out jobs of one batch each in that batch's pipeline, after
// their deliveries: for each job whose post's hash still exists, it
// clears the post's fanOutPendingField and acknowledges the job, deletes
// it from the stream and drops its cursor (as Worker.finish does), in one
// atomic step. For a job whose hash is gone it writes nothing, and the job
// goes on as after a batch's check that found it gone: a deleted post must
// be taken back off before its job may leave the stream. It takes several
// jobs, with one XACK, one XDEL and one DEL for all of them, though its
// callers end one job a call.
//
// A pipeline runs each of its commands whatever the others answered, so
// the end would run after deliveries that Redis refused (a Redis at its
// maxmemory refuses their writes, and not the end's, which frees memory),
// and the job would leave the stream with its post on none of those
// followers. So each delivery call of the pipeline counts up the job's
// mark once its deliveries are all done, the pipeline drops the mark
// before them, and the end ends only a job whose mark counts all of its
// calls; the others stay pending, to be taken over and run again. (Jobs
// that carry their followers need no mark: carriedLua delivers and ends
// them in one step.)
//
// KEYS[1] -> w:{fanout}:jobs or w:{fanout:<i>}:jobs, the jobs' stream
// KEYS[3i-1] -> the i-th job's post, w:u:{<author>}:p:<seq>
// KEYS[3i] -> the i-th job's cursor, w:{fanout}:cursor:<entry id>
// KEYS[3i+1] -> the i-th job's mark, w:{fanout}:delivered:<entry id>
// ARGV[1] -> "finish"
// ARGV[2] -> the consumer group
// ARGV[3] -> fanOutPendingField
// ARGV[3+i] -> the i-th job's entry id
// ARGV[3+m+i] -> how many delivery calls, which count the mark, the i-th
// job's pipeline sent (m jobs)
//
// Returns, for each job in turn, 1 if the hash exists (and the job is
// finished), 0 if it does not, -1 if the job's deliveries are not all
// done (and it is not finished).
const finishFanOutLua = `
if ARGV[1] == 'finish' then
	local m = (#KEYS - 1) / 3
	local found, ids, ended = {}, {}, {}
	for i = 1, m do
		local post, mark = KEYS[3 * i - 1], KEYS[3 * i + 1]
		found[i] = redis.call('EXISTS', post)
		if found[i] == 1 and tonumber(redis.call('GET', mark) or '0') < tonumber(ARGV[3 + m + i]) then
			found[i] = -1
		end
		if found[i] == 1 then
			redis.call('HDEL', post, ARGV[3])
			ids[#ids + 1] = ARGV[3 + i]
			ended[#ended + 1] = KEYS[3 * i]
			ended[#ended + 1] = mark
		end
	end
	if #ids > 0 then
		redis.call('XACK', KEYS[1], ARGV[2], unpack(ids))
		redis.call('XDEL', KEYS[1], unpack(ids))
		redis.call('DEL', unpack(ended))
	end
	return found
end
`

// seenAndLiveLua defines seenAndLive(f, c, n, cutoff), which reads for
// the n followers of a delivery call what its guarded deliveries skip or
// announce by, with one command each for all of them: their seen times
// (MGET of KEYS[f+3i], when cutoff is not 0) and whether anyone listens to
// their home channels, ARGV[c+1] .. ARGV[c+n] (PUBSUB NUMSUB, or all of
// them while any pattern is subscribed, which NUMSUB does not count). It
// returns the two as tables by follower.
const seenAndLiveLua = `
local function seenAndLive(f, c, n, cutoff)
	local seen, live = {}, {}
	if cutoff > 0 and n > 0 then
		local keys = {}
		for i = 1, n do
			keys[i] = KEYS[f + 3 * i]
		end
		seen = redis.call('MGET', unpack(keys))
	end
	if redis.call('PUBSUB', 'NUMPAT') > 0 then
		for i = 1, n do
			live[i] = true
		end
	elseif n > 0 then
		local subs = redis.call('PUBSUB', 'NUMSUB', unpack(ARGV, c + 1, c + n))
		for i = 1, n do
			live[i] = subs[2 * i] > 0
		end
	end
	return seen, live
end
`

// carriedLua is deliverBatchScript's "carried" entry: on one Redis it
// runs whole, in one atomic step, jobs of one shard that carry their
// authors' followers (fanOutCarried). For each job in turn it lists the
// post on the global timeline unless the job's step did (listed), and
// delivers it to the job's followers as the guarded deliveries do (the
// guard, the inactive skip, the add and its trim, the announce where
// someone listens); then, if the post's hash still exists, it clears the
// post's fanOutPendingField and ends the job: one XACK and one XDEL for
// all the jobs that ended.
//
// A pipeline of delivery calls and a "finish" call after them needed a
// mark per job, dropped before the calls and counted up by each, since a
// pipeline runs each command whatever the others answered; here the
// deliveries and the end are one step, so a job ends only if its own
// writes all went through, and there is no mark to write or read. Each job
// runs in a pcall of its own, so a command that Redis refuses (a Redis at
// its maxmemory refuses the first write of a step, a key of another type
// refuses one job's add) leaves that job pending, with its answer, and
// the others go on; a job run again delivers nothing twice. What the
// seen times and the listeners cost, one MGET and one PUBSUB NUMSUB, is
// shared by every follower of the call, and the job's script call, its
// mark's three commands and its share of the end are one call for all.
//
// KEYS[1] -> w:{fanout}:jobs or w:{fanout:<i>}:jobs, the jobs' stream
// KEYS[2] -> w:global
// KEYS[3] -> w:{w:global}:tail (with an archive, ARGV[9] 3)
// KEYS[k+j] -> the j-th job's post, w:u:{<author>}:p:<seq> (k = ARGV[9])
// KEYS[k+m+3i-2], KEYS[k+m+3i-1], KEYS[k+m+3i] -> the home timeline,
// following set and seen key of the i-th follower, the jobs' followers
// one job after another: w:u:{<follower>}:home, …:following, …:seen
// ARGV[1] -> "carried"
// ARGV[2] -> the consumer group
// ARGV[3] -> fanOutPendingField
// ARGV[4] -> the home timelines' cap
// ARGV[5] -> the inactive cutoff, unix ms (0: none)
// ARGV[6] -> the global timeline's cap
// ARGV[7] -> the global timeline's channel
// ARGV[8] -> m, how many jobs
// ARGV[9] -> k, how many keys come before the posts' (2, or 3 with a tail)
// ARGV[10+7(j-1)] .. ARGV[16+7(j-1)] -> the j-th job's entry id, post
// seq, post id, author id, added message, how many followers it carries,
// and "1" if its step listed the post, else "0"
// ARGV[9+7m+i] -> the i-th follower's home channel (n followers)
// ARGV[10+7m+n] -> a character for each follower in turn, "1" to trim the
// follower's timeline back to its cap after the add (rawTrim), else "0"
//
// Returns, for each job in turn, how many followers it added the post for
// (those before a refused command too), then 1 if the job ended, 0 if its post's hash is gone (the job goes on
// as after a check that found it gone), -1 if Redis refused one of its
// commands (the job is not ended), and then why, or "".
const carriedLua = `
if ARGV[1] == 'carried' then
	local group, field = ARGV[2], ARGV[3]
	local cap, cutoff = tonumber(ARGV[4]), tonumber(ARGV[5])
	local globalCap, globalChannel = tonumber(ARGV[6]), ARGV[7]
	local m, k = tonumber(ARGV[8]), tonumber(ARGV[9])
	local global, tail = KEYS[2], nil
	if k > 2 then
		tail = KEYS[3]
	end
	local f, a = k + m, 9 + 7 * m
	local n = (#KEYS - f) / 3
	local trims = ARGV[a + n + 1]
	local seen, live = seenAndLive(f, a, n, cutoff)
	-- How many followers the job in hand added the post for, kept when
	-- a command of the job fails after some of them. (A table: the
	-- embedded Redis's Lua detaches a local that a function which raised
	-- an error had written.)
	local tally = {added = 0}
	local function run(from, to, seq, id, author, msg, listed)
		tally.added = 0
		if listed ~= '1' then
			listGlobal(global, tail, seq, id, globalCap, globalChannel, msg)
		end
		for i = from, to do
			if redis.call('ZSCORE', KEYS[f + 3 * i - 1], author) then
				local s = seen[i]
				if not (s and tonumber(s) < cutoff) and addTrimmed(KEYS[f + 3 * i - 2], cap, seq, id, string.byte(trims, i) == 49) == 1 then
					if live[i] then
						redis.call('PUBLISH', ARGV[a + i], msg)
					end
					tally.added = tally.added + 1
				end
			end
		end
	end
	local out, ids = {}, {}
	local done = 0
	for j = 1, m do
		local b = 9 + 7 * (j - 1)
		local count = tonumber(ARGV[b + 6])
		local ok, res = pcall(run, done + 1, done + count, ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 7])
		done = done + count
		if not ok then
			if type(res) == 'table' then
				res = res.err
			end
			out[3 * j - 2], out[3 * j - 1], out[3 * j] = tally.added, -1, tostring(res)
		elseif redis.call('EXISTS', KEYS[k + j]) == 1 then
			redis.call('HDEL', KEYS[k + j], field)
			ids[#ids + 1] = ARGV[b + 1]
			out[3 * j - 2], out[3 * j - 1], out[3 * j] = tally.added, 1, ''
		else
			out[3 * j - 2], out[3 * j - 1], out[3 * j] = tally.added, 0, ''
		end
	end
	if #ids > 0 then
		redis.call('XACK', KEYS[1], group, unpack(ids))
		redis.call('XDEL', KEYS[1], unpack(ids))
	end
	return out
end
`

// finishJobs queues on pipe the end of jobs of one shard, each of one
// batch, after their deliveries (finishFanOutLua); calls[i] is how many
// delivery calls of the i-th job's pipeline count its mark. The i-th of
// the answer's values is the i-th job's.
func (db *DB) finishJobs(ctx context.Context, pipe redis.Pipeliner, shard int, jobs []carriedJob, calls []int) *redis.Cmd {
	keys := make([]string, 1, 1+3*len(jobs))
	keys[0] = fanoutStreamKey(shard)
	args := make([]any, 3, 3+2*len(jobs))
	args[0], args[1], args[2] = "finish", fanOutGroup, fanOutPendingField
	for _, j := range jobs {
		keys = append(keys, postKey(j.authorID, strconv.FormatInt(j.seq, 10)), fanoutCursorKey(shard, j.end.id), fanoutMarkKey(shard, j.end.id))
		args = append(args, j.end.id)
	}
	for _, n := range calls {
		args = append(args, n)
	}
	return db.pub(deliverBatchScript).EvalSha(ctx, pipe, keys, args...)
}

// errUndelivered is a job's error when the end of its pipeline found that
// some of its delivery calls failed (finishFanOutLua): those answered why.
var errUndelivered = errors.New("deliveries not all done; the job stays pending")

// OneRedisScripts returns the SHA1s of the scripts Warble runs only on one
// Redis, never on a Redis Cluster, with keys of many hash slots, for tests
// that check every other script keeps to one slot.
func OneRedisScripts() []string {
	return []string{deliverBatchScript.classic.Hash(), createPostOneRedisScript.classic.Hash(), reserveSeqScript.Hash()}
}

// deliverBatch is how many followers one call of deliverBatchScript
// delivers to: a call holds Redis for its whole length, so a batch of
// fanOutChunk followers goes out as a few calls in one pipeline, and other
// clients' commands get in between them.
const deliverBatch = 250

// queueDeliveries queues on pipe the guarded delivery of a post to the
// home timelines of followers, and returns the commands whose integer
// replies add up to how many it was delivered to.
func (db *DB) queueDeliveries(ctx context.Context, pipe redis.Pipeliner, followers []string, mark string,
	seqText, postID, authorID, added string, cutoff int64) []*redis.Cmd {
	if db.onCluster() {
		return queueEach(ctx, pipe, db.pub(deliverScript).Hash(), followers, seqText, postID, authorID, db.opts.HomeCap, added, cutoff)
	}
	var cmds []*redis.Cmd
	sha := db.pub(deliverBatchScript).Hash()
	for len(followers) > 0 {
		part := followers[:min(deliverBatch, len(followers))]
		followers = followers[len(part):]
		cmd := redis.NewCmd(ctx, deliverBatchArgs(sha, part, mark, seqText, postID, authorID, db.opts.HomeCap, added, cutoff)...)
		cmd.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, cmd)
		cmds = append(cmds, cmd)
	}
	return cmds
}

// The shapes, from keys.go, of the keys a delivery declares for a follower
// (in the order deliverBatchScript takes them) and of the channel it
// announces on, for deliveryNames.
var (
	deliveryKeyShapes = [...]nameShape{shapeOf(homeKey), shapeOf(followingKey), shapeOf(seenKey)}
	homeChannelShape  = shapeOf(homeChannel)
)

// nameShape is a key or channel name of keys.go around a user id: before,
// the id, after.
type nameShape struct{ before, after string }

// shapeOf returns the shape of the names that name builds, which must hold
// the user id once (TestDeliveryNames checks those of fan-out).
func shapeOf(name func(userID string) string) nameShape {
	before, after, _ := strings.Cut(name("\x00"), "\x00")
	return nameShape{before, after}
}

func (s nameShape) len(userID string) int { return len(s.before) + len(userID) + len(s.after) }

func (s nameShape) write(b *strings.Builder, userID string) {
	b.WriteString(s.before)
	b.WriteString(userID)
	b.WriteString(s.after)
}

// deliveryNames returns the names a delivery to followers declares: the
// three keys of each follower in the order deliverBatchScript takes them,
// then each follower's home channel. Fan-out names four a follower, and
// built one by one (and boxed one by one into go-redis's arguments) they
// were most of the worker's allocations: here they are one string, sliced,
// and the callers hand go-redis pointers to them, which box without an
// allocation.
func deliveryNames(followers []string) []string {
	size := 0
	for _, f := range followers {
		for _, s := range deliveryKeyShapes {
			size += s.len(f)
		}
		size += homeChannelShape.len(f)
	}
	var b strings.Builder
	b.Grow(size)
	for _, f := range followers {
		for _, s := range deliveryKeyShapes {
			s.write(&b, f)
		}
	}
	for _, f := range followers {
		homeChannelShape.write(&b, f)
	}
	rest := b.String()
	names := make([]string, 0, 4*len(followers))
	for _, f := range followers {
		for _, s := range deliveryKeyShapes {
			names, rest = append(names, rest[:s.len(f)]), rest[s.len(f):]
		}
	}
	for _, f := range followers {
		names, rest = append(names, rest[:homeChannelShape.len(f)]), rest[homeChannelShape.len(f):]
	}
	return names
}

// deliverBatchArgs returns the EVALSHA of deliverBatchScript, whose SHA1 is
// sha, for followers.
func deliverBatchArgs(sha string, followers []string, mark, seqText, postID, authorID string, homeCap int, added string, cutoff int64) []any {
	n := len(followers)
	names := deliveryNames(followers)
	args := make([]any, 0, 4+len(names)+7)
	if mark == "" {
		args = append(args, "evalsha", sha, 3*n)
	} else {
		args = append(args, "evalsha", sha, 3*n+1)
	}
	for i := range names[:3*n] {
		args = append(args, &names[i])
	}
	if mark != "" {
		args = append(args, mark)
	}
	args = append(args, seqText, postID, authorID, homeCap, added, cutoff)
	for i := range names[3*n:] {
		args = append(args, &names[3*n+i])
	}
	return append(args, trimFlags(followers, seqText))
}

// trimFlags is deliverBatchScript's last argument for followers: a
// character for each, "1" where rawTrim chooses to trim their timeline
// after the add of the post of seqText, else "0".
func trimFlags(followers []string, seqText string) string {
	trims := make([]byte, len(followers))
	for i, f := range followers {
		trims[i] = '0'
		if rawTrim(f, seqText) {
			trims[i] = '1'
		}
	}
	return string(trims)
}

// queueEach queues on pipe an EVALSHA of deliverScript, whose SHA1 is sha,
// for each of followers (KEYS and ARGV as the script documents them), as a
// Redis Cluster needs, and returns them. The arguments every call shares
// are boxed once, and the calls' argument lists are cut from one slice.
func queueEach(ctx context.Context, pipe redis.Pipeliner, sha string, followers []string,
	seqText, postID, authorID string, homeCap int, added string, cutoff int64) []*redis.Cmd {
	n := len(followers)
	names := deliveryNames(followers)
	shared := [...]any{"evalsha", sha, 3, seqText, postID, authorID, homeCap, added, cutoff, "0", "1"}
	const width = 3 + 3 + 8 // EVALSHA sha numkeys, KEYS, ARGV
	all := make([]any, width*n)
	cmds := make([]*redis.Cmd, n)
	for i := range followers {
		args := all[width*i : width*(i+1) : width*(i+1)]
		copy(args, shared[:3])
		args[3], args[4], args[5] = &names[3*i], &names[3*i+1], &names[3*i+2]
		copy(args[6:], shared[3:7])
		args[10] = &names[3*n+i]
		args[11], args[12], args[13] = shared[7], shared[8], shared[9]
		if rawTrim(followers[i], seqText) {
			args[13] = shared[10]
		}
		cmds[i] = redis.NewCmd(ctx, args...)
		cmds[i].SetFirstKeyPos(3)
		_ = pipe.Process(ctx, cmds[i])
	}
	return cmds
}

// deliveryScripts are the scripts queueDeliveries runs on db's Redis.
func (db *DB) deliveryScripts() *redis.Script {
	if db.onCluster() {
		return db.pub(deliverScript)
	}
	return db.pub(deliverBatchScript)
}

// onCluster reports whether db's Redis is a Redis Cluster, where a script
// touches keys of one slot only. (Not db.sharded: that says how events
// are published, which a test may change on a cluster.)
func (db *DB) onCluster() bool {
	_, ok := db.client.(*redis.ClusterClient)
	return ok
}

// listGlobal queues on pipe the step that puts a post on the global
// timeline. CreatePost runs it for a prompt read, and the post's fan-out job
// again, for the guarantee.
func (db *DB) listGlobal(ctx context.Context, pipe redis.Pipeliner, seqText, postID, added string) *redis.Cmd {
	keys := []string{globalKey}
	if db.opts.Archive != nil {
		keys = append(keys, globalTailKey)
	}
	return db.pub(listGlobalScript).EvalSha(ctx, pipe, keys, seqText, postID, db.opts.GlobalCap, globalChannel, added)
}

// undeliverScript takes a post off one timeline (the global timeline or a
// follower's home timeline) and announces the removal only if the timeline
// held it, so that subscribers hear of removals they can see.
//
// KEYS[1] -> a timeline: w:global or w:u:{<follower>}:home
// ARGV[1] -> post id
// ARGV[2] -> the timeline's channel
// ARGV[3] -> the removed message
//
// Returns 1 if the post was removed, 0 if the timeline did not hold it.
var undeliverScript = newPubScript(`
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
	return 0
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
`)

// fanOut delivers a post to the home timelines of its author's followers,
// batch followers per round trip, starting at from and calling save with
// the position after each batch but the last (see Worker). Delivery is
// idempotent: running it again for the same post neither duplicates the
// post nor announces it twice.
//
// fanOutDepth batches are in flight at a time, so that Redis works through
// one while this process writes the commands of the next. The followers
// are walked ahead of them, on a goroutine of their own (walkAhead), and a
// batch's position is saved while the next batch goes out, so that neither
// round trip stands between a batch done and the next one sent. The
// position saved after a batch is where the next one starts, saved only
// once its check has answered and after the position before it, so a
// resumed job repeats at most the batches that were in flight.
//
// It stops, and takes the post back off the batches it delivered, once the
// post is deleted: a delete raced this fan-out, and its own job may
// already have passed these followers. Each batch checks that after its
// deliveries (in their pipeline on one Redis, in the next round trip on a
// cluster: see fanOutJob), and a job checks it before its first
// batch, since a worker that died between a batch and its check left
// batches in flight after its cursor. The package doc (doc.go) has the
// whole argument. A post whose hash is gone may have moved to the archive
// rather than been deleted (see deletedPost), and then the job goes on.
//
// Once the last batch has been delivered, after every batch before it,
// the job clears the post's fanOutPendingField, which lets the archive's
// mover take it: in the last batch's pipeline when no other batch is in
// flight (a job of one batch, most of them; with the job's end for one
// delivered raw), else in a round trip of its own.
func (db *DB) fanOut(ctx context.Context, authorID string, seq int64, postID string,
	from followerCursor, batch int, save func(followerCursor) error) error {
	return db.fanOutJob(ctx, authorID, seq, postID, from, batch, save, nil)
}

// jobEnd names the queued job of a fanOut, for fanOutJob to finish in its
// last batch's pipeline; finished reports that it did. With readNext, that
// pipeline also queues, after the job's end, the worker's read of its next
// job (see Worker.run); its answer, or failure, is the worker's business
// and fails nothing here.
type jobEnd struct {
	shard    int
	id       string
	finished bool
	readNext func(redis.Pipeliner)
	// followers are the followers the job carries, when carried (see
	// fanOutCarried).
	followers []string
	carried   bool
	// listed says that the step that queued the job listed the post on
	// the global timeline, so that fanOutCarried does not (see
	// createPostOneRedisScript).
	listed bool
	// claimed says that the job was taken over from another worker,
	// which may have run part of it.
	claimed bool
}

// fanOutJob is fanOut for a queued job, which end names (nil: none). On
// one Redis, a job whose followers fit in one batch (most of them) is
// finished in that batch's pipeline (finishFanOutLua), and
// end.finished says so; its worker then has nothing left to do.
//
// A job from its start reads its first batch of followers in the same
// pipeline as its first step, after the check, so that a job of one batch
// costs two round trips: that read, and the deliveries with the check and
// the job's end. Those followers also tell whether the author is to be
// pulled (pullInstead) when they are all of them: fewer than the batch and
// the threshold.
func (db *DB) fanOutJob(ctx context.Context, authorID string, seq int64, postID string,
	from followerCursor, batch int, save func(followerCursor) error, end *jobEnd) error {
	if end != nil && end.carried && from == startCursor && len(end.followers) <= batch && !db.onCluster() {
		return db.fanOutCarried(ctx, []carriedJob{{authorID: authorID, seq: seq, postID: postID, end: end}}, end.readNext)[0]
	}
	seqText := strconv.FormatInt(seq, 10)
	added := encodeAdded(seq, postID)
	undo := func(followers []string) error {
		return db.undeliver(ctx, followers, seq, postID)
	}
	// A job's first step puts the post on the global timeline (CreatePost
	// did so for a prompt read, but only the job is a promise), and
	// checks, after it, that the post still exists: the same argument as
	// for the batches below then covers the global timeline too.
	//
	// On one Redis the check shares the listing's pipeline, which runs in
	// order on its connection. A Redis Cluster pipeline sends each node's
	// commands at once, in no order between nodes, so there the check
	// waits for the listing's answer: one round trip more.
	// A job on one Redis delivers raw (see rawdelivery.go) to the batches
	// it reads from its author's one followers set, when the author's
	// followers side is known good (followersCheckedField).
	mayRaw := end != nil && !db.onCluster()
	var exists *redis.IntCmd
	var firstRead *redis.StringSliceCmd
	var firstEnd *redis.ZSliceCmd
	var firstState, checked *redis.StringCmd
	var firstLog *redis.XMessageSliceCmd
	var count *redis.IntCmd
	check := func(pipe redis.Pipeliner) {
		exists = pipe.Exists(ctx, postKey(authorID, seqText))
		if mayRaw {
			checked = pipe.HGet(ctx, userKey(authorID), followersCheckedField)
		}
		if mayRaw && from == startCursor {
			// Before the first batch's walk, as walkFollowersLogged reads it.
			firstLog = pipe.XRevRangeN(ctx, followersLogKey(authorID), "+", "-", 1)
		}
		if from == startCursor {
			// How big the job is, for the choice of raw (rawJob) and of
			// pull (pullInstead), before the followerBuckets field, as
			// countFollowers reads it.
			count = pipe.ZCard(ctx, followersKey(authorID))
			// As walkFollowers reads from the start of the one set, with
			// the followerBuckets field after the range; the followers'
			// ids alone, and the score of the batch's last by its rank,
			// for the cursor: Redis formats every score it sends with a
			// printf, which made a range of 1,001 WITHSCORES cost it 231
			// µs against 26 without (BENCHMARKS.md, sixth round of
			// fan-out).
			firstRead = pipe.ZRangeArgs(ctx, redis.ZRangeArgs{
				Key: followersKey(authorID), Start: "-inf", Stop: "+inf", ByScore: true, Count: int64(batch + 1),
			})
			firstEnd = pipe.ZRangeWithScores(ctx, followersKey(authorID), int64(batch-1), int64(batch-1))
			firstState = pipe.HGet(ctx, userKey(authorID), followerBucketsField)
		}
	}
	cluster := db.onCluster()
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		if from == startCursor {
			db.listGlobal(ctx, pipe, seqText, postID, added)
		}
		if !cluster {
			check(pipe)
		}
	}, db.pub(listGlobalScript))
	if err == nil && cluster {
		_, err = db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error { check(pipe); return nil })
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("list post %s: %w", postID, err)
	}
	// first is the first batch as followerChunk would read it, when the
	// followers are in the one set; else the walk reads it.
	// oneSet: the first step read the start of the one set, and count is
	// all of the followers.
	oneSet := firstRead != nil && parseFollowerState(firstState.Val()).buckets == 0
	var first *prefetched
	if oneSet {
		read := firstRead.Val()
		first = &prefetched{followers: read[:min(batch, len(read))], next: startCursor, last: len(read) <= batch}
		if firstLog != nil && parseFollowerState(firstState.Val()) == (followerState{}) {
			first.h0 = lastLogID(firstLog)
		}
		if !first.last {
			// The cursor after the batch, which a job of one batch does
			// not need. A pipeline is not one step: a follow or unfollow
			// between the two reads moves the ranks, and then the walk
			// reads the first batch itself.
			end := firstEnd.Val()
			if len(end) == 1 && end[0].Member == read[batch-1] {
				first.next.at, first.next.member = formatScore(end[0].Score), read[batch-1]
			} else {
				first = nil
			}
		}
	}
	deleted := false
	if exists.Val() == 0 {
		if deleted, err = db.deletedPost(ctx, authorID, postID); err != nil {
			return err
		}
	}
	if deleted {
		// A delete raced this job, whose global step may have run after
		// the delete's.
		if from == startCursor {
			if err := db.unlistGlobal(ctx, seq, postID); err != nil {
				return err
			}
		}
		// Undo the batches that may have been in flight when the job
		// stopped, which start at the cursor: every follower from the
		// cursor on. Counting fanOutDepth batches would not do, since
		// the chunks read now need not be the ones read then (a follow
		// into a bucket not yet walked, or the move into buckets,
		// changes them), and this path is as rare as a worker dying
		// while the post is deleted.
		pos := from
		for {
			followers, next, last, err := db.followerChunk(ctx, authorID, pos, batch)
			if err != nil {
				return err
			}
			if err := undo(followers); err != nil || last {
				return err
			}
			pos = next
		}
	}
	known := mayRaw && checked.Val() != ""
	// A job resumed from a cursor goes on raw: it was big enough when it
	// started, and the count it would read now is no better. So does any
	// job taken over: its first run may have delivered raw and died
	// before its announce, which only a raw run makes to followers who
	// hold the post already (rawBatch.again); the guarded script
	// announces what it adds.
	raw := known && (from != startCursor || end.claimed || db.rawJob(count.Val(), batch))
	// A job of an author whose followers side is not known good, walked
	// from its start through the one set with the guarded script, checks
	// every follower it walks against the truth, marks unsure those who do
	// not follow, and at its end marks the followers side known good (see
	// doc.go, "Raw deliveries repaired after the fact").
	checking := mayRaw && !known && from == startCursor && first != nil && parseFollowerState(firstState.Val()) == (followerState{})
	// A job taken over repairs what its first run may have left between
	// a raw batch's adds and its repair, whichever way this run delivers:
	// that run chose by a count that may have changed since.
	if known && end.claimed {
		if err := db.repairFromLog(ctx, authorID, seqText, postID, end.id); err != nil {
			return err
		}
	}
	// Only a job that has delivered nothing yet may turn to pull: a resumed
	// one goes on pushing, so that the undo above stays the whole story.
	whole := first != nil && first.last && len(first.followers) <= db.opts.PullThreshold
	if from == startCursor && !whole {
		// The count read with the first batch is the whole of it when
		// the followers are in the one set (countFollowers).
		n := int64(-1)
		if oneSet {
			n = count.Val()
		}
		if pulled, err := db.pullInstead(ctx, authorID, postID, n); err != nil {
			return err
		} else if pulled {
			// The global timeline was its one delivery.
			return db.fannedOut(ctx, authorID, seqText, postID)
		}
	}

	// deliver runs one batch: the deliveries, then whether the post still
	// exists, and with clear the end of the post's wait for its fan-out
	// after that check: in one pipeline on one Redis, in a second round
	// trip after the deliveries' answers on a cluster (see the first
	// step).
	type result struct {
		delivered int
		gone      bool
		finished  bool // its pipeline finished the job (finishFanOutLua)
		checked   bool // its followers were checked against the truth (checking)
		err       error
	}
	type inFlight struct {
		followers []string
		next      followerCursor
		last      bool
		cleared   bool // its pipeline cleared fanOutPendingField
		unmarks   bool // the job's end is to clear it (a raw batch)
		done      chan result
	}
	deliver := func(followers []string, next followerCursor, last, clear bool, h0 string, walked time.Time, verify bool) *inFlight {
		b := &inFlight{followers: followers, next: next, last: last, cleared: clear, done: make(chan result, 1)}
		if h0 != "" {
			// Raw: the job ends after the batch's repair has answered,
			// in a round trip of its own, which for a job of one batch
			// also clears the post's wait for its fan-out (see the loop
			// below). The adds pipeline must not: a Redis at its
			// maxmemory refuses the ZADDs and not an HDEL, which frees
			// memory, and the mover could then take a post whose job is
			// pending, its deliveries refused.
			b.cleared, b.unmarks = false, clear
			go func() {
				n, found, err := db.deliverRaw(ctx, rawBatch{authorID: authorID, seqText: seqText, postID: postID,
					added: added, followers: followers, h0: h0, walked: walked, again: end.claimed})
				if err != nil {
					b.done <- result{err: fmt.Errorf("deliver post %s: %w", postID, err)}
					return
				}
				gone := false
				if found == 0 {
					if gone, err = db.deletedPost(ctx, authorID, postID); err != nil {
						b.done <- result{err: err}
						return
					}
				}
				b.done <- result{delivered: n, gone: gone}
			}()
			return b
		}
		// A job's only batch in flight at its end finishes the job, on one
		// Redis, where a script may touch the keys of two slots.
		finishing := clear && end != nil && !db.onCluster()
		go func() {
			var cmds []*redis.Cmd
			var exists *redis.IntCmd
			var finish *redis.Cmd
			cutoff := db.inactiveCutoff()
			// Whether the post still exists, and with clear the end of its
			// wait for its fan-out after that (both in the post's slot, so
			// in that order on a cluster too).
			check := func(pipe redis.Pipeliner) {
				exists = pipe.Exists(ctx, postKey(authorID, seqText))
				if clear {
					pipe.HDel(ctx, postKey(authorID, seqText), fanOutPendingField)
				}
			}
			err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
				mark := ""
				if finishing {
					mark = fanoutMarkKey(end.shard, end.id)
					pipe.Del(ctx, mark)
				}
				cmds = db.queueDeliveries(ctx, pipe, followers, mark, seqText, postID, authorID, added, cutoff)
				if finishing {
					finish = db.finishJobs(ctx, pipe, end.shard,
						[]carriedJob{{authorID: authorID, seq: seq, postID: postID, end: end}}, []int{len(cmds)})
					if end.readNext != nil {
						end.readNext(pipe)
					}
					return
				}
				if !cluster {
					check(pipe)
				}
			}, db.deliveryScripts())
			if err == nil && cluster {
				// After the deliveries' answers: see the first step.
				_, err = db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error { check(pipe); return nil })
			}
			if err != nil && finish != nil && end.readNext != nil {
				// The pipeline's error may be the next job's read (none
				// queued answers redis.Nil): only this job's commands count.
				err = finish.Err()
				for _, c := range cmds {
					if err == nil {
						err = c.Err()
					}
				}
			}
			if err != nil {
				b.done <- result{err: fmt.Errorf("deliver post %s: %w", postID, err)}
				return
			}
			n := 0
			for _, c := range cmds {
				if v, _ := c.Int64(); v > 0 {
					n += int(v)
				}
			}
			found := int64(0)
			if finishing {
				if f, _ := finish.Int64Slice(); len(f) == 1 {
					found = f[0]
				}
				if found == -1 {
					b.done <- result{err: fmt.Errorf("deliver post %s: %w", postID, errUndelivered)}
					return
				}
			} else {
				found = exists.Val()
			}
			gone := false
			if found == 0 {
				if gone, err = db.deletedPost(ctx, authorID, postID); err != nil {
					b.done <- result{err: err}
					return
				}
			}
			checkedAll := verify && !gone && db.checkFollowers(ctx, authorID, followers) == nil
			b.done <- result{delivered: n, gone: gone, finished: finishing && found == 1, checked: checkedAll}
		}()
		return b
	}

	start := time.Now()
	var reached, delivered, batches int
	var queue []*inFlight      // oldest first
	pos, walked := from, false // walked: the last batch is sent
	// saving is the cursor's save in flight: it runs while the next batch
	// goes out and the job waits for the oldest, one save at a time, in
	// the order of the batches; waitSave returns its answer.
	var saving chan error
	waitSave := func() error {
		if saving == nil {
			return nil
		}
		err := <-saving
		saving = nil
		return err
	}
	// settle waits for every batch still in flight and undoes those whose
	// own check found the post gone, and for the save in flight, so that
	// no delivery of this job lands after it returns, nor stays where it
	// must not.
	//
	// A job taken over (errLostJob) undoes them too: this worker learns of
	// it from a save that ran while the next batch went out, so that batch
	// may land after the new owner, finding the post deleted, undid every
	// follower from the cursor on. The job stays lost all the same.
	settle := func(err error) error {
		serr := waitSave()
		undoing := err == nil || errors.Is(err, errLostJob) || errors.Is(serr, errLostJob)
		for _, b := range queue {
			if r := <-b.done; r.gone && r.err == nil && undoing {
				if uerr := undo(b.followers); uerr != nil {
					err, undoing = uerr, false
				}
			}
		}
		if err == nil {
			err = serr
		}
		return err
	}
	// chunk is a batch walked and not yet sent, or the walk's error.
	type chunk struct {
		followers []string
		next      followerCursor
		last      bool
		h0        string
		readAt    time.Time
		err       error
	}
	// walk reads the batch at pos, the first step's first if it read one.
	walk := func() chunk {
		c := chunk{readAt: time.Now()}
		if first != nil {
			c.followers, c.next, c.last = first.followers, first.next, first.last
			if raw {
				c.h0 = first.h0
			}
			first = nil
		} else if raw {
			wl := &walkLog{authorID: authorID}
			c.followers, c.next, c.last, c.err = db.followerChunkLogged(ctx, authorID, pos, batch, wl)
			if wl.state == (followerState{}) {
				c.h0 = wl.last // "" for a chunk of buckets
			}
		} else {
			c.followers, c.next, c.last, c.err = db.followerChunk(ctx, authorID, pos, batch)
		}
		if c.err == nil && c.h0 != "" && db.rawStep != nil {
			db.rawStep("walked", c.followers)
		}
		pos = c.next
		return c
	}
	// The walk runs ahead of the deliveries, on a goroutine of its own,
	// up to walkAhead batches and the one it is walking: a walk waits in
	// Redis's queue behind the batches in flight, and this way the batch
	// it reads is there the moment one of them is done.
	chunks := make(chan chunk, walkAhead)
	stop := make(chan struct{})
	var walker sync.WaitGroup
	walker.Add(1)
	go func() {
		defer walker.Done()
		for {
			c := walk()
			select {
			case chunks <- c:
			case <-stop:
				return
			}
			if c.err != nil || c.last {
				return
			}
		}
	}()
	defer func() {
		close(stop)
		walker.Wait()
	}()
	for {
		for len(queue) < fanOutDepth && !walked {
			c := <-chunks
			if c.err != nil {
				return settle(c.err)
			}
			if c.next.buckets > 0 {
				checking = false // the walk went on in buckets
			}
			queue = append(queue, deliver(c.followers, c.next, c.last, c.last && len(queue) == 0, c.h0, c.readAt, checking))
			walked = c.last
		}
		cur := queue[0]
		queue = queue[1:]
		r := <-cur.done
		if r.err != nil {
			return settle(r.err)
		}
		if db.opts.Delivered != nil && r.delivered > 0 {
			db.opts.Delivered(r.delivered)
		}
		reached, delivered, batches = reached+len(cur.followers), delivered+r.delivered, batches+1
		if r.gone {
			return settle(undo(cur.followers))
		}
		checking = checking && r.checked
		if cur.last && checking {
			// Best effort: the next job of the author checks again.
			if err := db.client.HSet(ctx, userKey(authorID), followersCheckedField, db.now().UnixMilli()).Err(); err != nil {
				db.log.WarnContext(ctx, "mark followers checked", "user", authorID, "err", err)
			}
		}
		if cur.last {
			// No save may land after the job's end, which drops its cursor.
			if err := waitSave(); err != nil {
				return err
			}
			if r.finished {
				end.finished = true
			} else if cur.unmarks {
				// A raw job of one batch ends, and its post stops waiting
				// for its fan-out, in one step (finishFanOutLua, with no
				// delivery call to count), in the round trip that
				// Worker.finish would take.
				var finish *redis.Cmd
				err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
					finish = db.finishJobs(ctx, pipe, end.shard,
						[]carriedJob{{authorID: authorID, seq: seq, postID: postID, end: end}}, []int{0})
				}, db.deliveryScripts())
				if err != nil {
					return fmt.Errorf("finish fan-out job %s: %w", end.id, err)
				}
				// Else its hash is gone (moved to the archive since; a
				// deleted post was taken back off above), with no field
				// left to clear: Worker.finish ends the job.
				f, _ := finish.Int64Slice()
				end.finished = len(f) == 1 && f[0] == 1
			} else if !cur.cleared {
				if err := db.fannedOut(ctx, authorID, seqText, postID); err != nil {
					return err
				}
			}
			if batches > 1 {
				db.log.InfoContext(ctx, "fan-out done", "post", postID, "followers", reached,
					"delivered", delivered, "took", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if batches%progressEvery == 0 {
			db.log.InfoContext(ctx, "fan-out progress", "post", postID, "followers", reached,
				"delivered", delivered, "took", time.Since(start).Round(time.Millisecond))
		}
		// The cursor moves past this batch while the next batch goes out:
		// its round trip no longer stands between the two.
		if err := waitSave(); err != nil {
			return settle(err)
		}
		saving = make(chan error, 1)
		go func(next followerCursor) { saving <- save(next) }(cur.next)
	}
}

// rawMinFollowers is how many followers an author whose followers side is
// known good needs for a walked job to deliver raw when all of them fit in
// one batch. Raw deliveries take four round trips where the guarded script
// takes two (the job ends in its pipeline), but cost Redis about half as
// much per follower: in BenchmarkWalkedJob, one batch of 100 followers
// costs Redis 2.1-3.0 µs a delivery raw against 3.4-4.1 guarded, and the
// job is 10-20% shorter, while one of 20 followers saves Redis a tenth
// and costs the worker 30-40% more CPU raw. Redis's time is what
// every request waits in line for (BENCHMARKS.md, post-7), so the
// line is drawn where raw starts to save it.
const rawMinFollowers = 100

// rawJob reports whether a walked job, from its start, of an author whose
// followers side is known good and who has followers followers, delivers
// raw, in batches of batch followers: a job of more than one batch always
// (every batch after the first is a walk of its own, as long for either
// path), one of one batch from rawMinFollowers on. (A job taken over
// delivers raw whatever its count: see fanOutJob.)
func (db *DB) rawJob(followers int64, batch int) bool {
	if db.rawFrom > 0 {
		return followers >= int64(db.rawFrom)
	}
	return followers > int64(batch) || followers >= rawMinFollowers
}

// carriedFollowers is how many followers, at most, a post's job carries
// from CreatePost (createPostOneRedisScript): fewer than rawMinFollowers,
// from which a walked job of a known-good followers side delivers raw, at
// about half of the guarded script's cost to Redis per follower, and none
// past the pull threshold, whose authors' jobs decide between push and
// pull. Against carrying up to deliverBatch (250), small authors'
// createPost p99 at 16 in flight was lower in four pairs of five, its
// median 9.69 ms against 10.7 (BENCHMARKS.md, "Fewer followers carried").
func (db *DB) carriedFollowers() int {
	if db.opts.PullThreshold >= 0 {
		return min(rawMinFollowers-1, db.opts.PullThreshold)
	}
	return rawMinFollowers - 1
}

// fanOutCarried runs jobs that carry their authors' followers, read in
// the atomic step that stored each post and queued its job, on one Redis,
// all in one pipeline: calls of deliverBatchScript's "carried" entry
// (carriedLua), each of which runs jobs of one shard whole, in one step:
// for each job it puts the post on the global timeline (unless the step
// that queued the job did, atomically with it: listed), delivers it to
// those followers, checks that the post still exists and, if it does,
// ends the job. Then the pipeline may read the worker's next jobs
// (readNext, when not nil). It saves a job the first round trip of a
// walk, which reads the followers (fanOutJob), and costs what a job of
// one batch costs after it, less the round trip itself and a script call
// for every job after the first: the same writes, each as idempotent, and
// the same check after them, the global timeline's included, so the
// argument of doc.go holds for each job (a post found deleted is taken
// back off the followers and the global timeline before its job may leave
// the stream). A call takes jobs until they carry deliverBatch followers
// (a job carries fewer), so that one call holds Redis no longer than a
// guarded delivery call does.
//
// The followers are those of the moment the post was stored rather than
// of the job's walk: one who follows after that gets the post from
// Follow's backfill, which finds it in the author's posts set, and one
// who unfollows is skipped by the delivery's guard, as in a walk. Only a
// job read new runs this way; one taken over from a worker that died
// walks the followers (fanOutJob), since that worker, of an older
// version, may have walked them, and its undo covers whom it may have
// delivered to.
//
// It returns each job's error, nil for a job done (its end.finished says
// whether its call ended it: a post moved to the archive meanwhile is
// delivered, and left for the worker to end).
func (db *DB) fanOutCarried(ctx context.Context, jobs []carriedJob, readNext func(redis.Pipeliner)) []error {
	type call struct {
		cmd         *redis.Cmd
		first, jobs int // jobs[first : first+jobs]
	}
	var calls []call
	cutoff := db.inactiveCutoff()
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		calls = calls[:0]
		for first := 0; first < len(jobs); {
			end, followers := first+1, len(jobs[first].end.followers)
			for end < len(jobs) && jobs[end].end.shard == jobs[first].end.shard &&
				followers+len(jobs[end].end.followers) <= deliverBatch {
				followers += len(jobs[end].end.followers)
				end++
			}
			calls = append(calls, call{db.runCarried(ctx, pipe, jobs[first:end], cutoff), first, end - first})
			first = end
		}
		if readNext != nil {
			readNext(pipe)
		}
	}, db.pub(deliverBatchScript))
	errs := make([]error, len(jobs))
	if len(calls) == 0 {
		// No pipeline was sent: the scripts did not load.
		for i, j := range jobs {
			errs[i] = fmt.Errorf("deliver post %s: %w", j.postID, err)
		}
		return errs
	}
	for _, c := range calls {
		// Its own answer: another command of the pipeline may have failed
		// (the next jobs' read answers redis.Nil when there are none).
		answer, cerr := c.cmd.Slice()
		if cerr == nil && len(answer) != 3*c.jobs {
			cerr = fmt.Errorf("carried jobs: %d values for %d jobs", len(answer), c.jobs)
		}
		for k := range c.jobs {
			i, j := c.first+k, jobs[c.first+k]
			if cerr != nil {
				errs[i] = fmt.Errorf("deliver post %s: %w", j.postID, cerr)
				continue
			}
			added, _ := answer[3*k].(int64)
			status, _ := answer[3*k+1].(int64)
			if db.opts.Delivered != nil && added > 0 {
				db.opts.Delivered(int(added))
			}
			switch status {
			case 1:
				j.end.finished = true
			case -1:
				why, _ := answer[3*k+2].(string)
				errs[i] = fmt.Errorf("deliver post %s: %w: %s", j.postID, errUndelivered, why)
			default:
				errs[i] = db.undoCarried(ctx, j)
			}
		}
	}
	return errs
}

// runCarried queues on pipe the call of carriedLua that runs jobs, all of
// one shard, and returns it.
func (db *DB) runCarried(ctx context.Context, pipe redis.Pipeliner, jobs []carriedJob, cutoff int64) *redis.Cmd {
	m, n := len(jobs), 0
	for _, j := range jobs {
		n += len(j.end.followers)
	}
	followers := make([]string, 0, n)
	trims := make([]byte, 0, n)
	seqs := make([]string, m)
	for i, j := range jobs {
		seqs[i] = strconv.FormatInt(j.seq, 10)
		followers = append(followers, j.end.followers...)
		for _, f := range j.end.followers {
			trim := byte('0')
			if rawTrim(f, seqs[i]) {
				trim = '1'
			}
			trims = append(trims, trim)
		}
	}
	names := deliveryNames(followers)
	k := 2
	if db.opts.Archive != nil {
		k = 3
	}
	args := make([]any, 0, 3+k+m+3*n+9+7*m+n+1)
	args = append(args, "evalsha", db.pub(deliverBatchScript).Hash(), k+m+3*n, fanoutStreamKey(jobs[0].end.shard), globalKey)
	if k == 3 {
		args = append(args, globalTailKey)
	}
	for i, j := range jobs {
		args = append(args, postKey(j.authorID, seqs[i]))
	}
	for i := range names[:3*n] {
		args = append(args, &names[i])
	}
	args = append(args, "carried", fanOutGroup, fanOutPendingField, db.opts.HomeCap, cutoff, db.opts.GlobalCap, globalChannel, m, k)
	for i, j := range jobs {
		listed := "0"
		if j.end.listed {
			listed = "1"
		}
		args = append(args, j.end.id, seqs[i], j.postID, j.authorID, encodeAdded(j.seq, j.postID), len(j.end.followers), listed)
	}
	for i := range names[3*n:] {
		args = append(args, &names[3*n+i])
	}
	args = append(args, string(trims))
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = pipe.Process(ctx, cmd)
	return cmd
}

// carriedJob is a job that carries its followers (in end), for
// fanOutCarried.
type carriedJob struct {
	authorID string
	seq      int64
	postID   string
	end      *jobEnd
}

// undoCarried takes the post of a carried job whose check found its hash
// gone off the job's followers and the global timeline, if it was
// deleted; one moved to the archive is delivered.
func (db *DB) undoCarried(ctx context.Context, j carriedJob) error {
	gone, err := db.deletedPost(ctx, j.authorID, j.postID)
	if err != nil || !gone {
		// Moved to the archive: delivered, and the worker ends the job.
		return err
	}
	if err := db.undeliver(ctx, j.end.followers, j.seq, j.postID); err != nil {
		return err
	}
	return db.unlistGlobal(ctx, j.seq, j.postID)
}

// fannedOut clears a post's fanOutPendingField, for a job that has
// delivered it everywhere, in a round trip of its own. A job that fails
// here is run again, which delivers nothing twice.
func (db *DB) fannedOut(ctx context.Context, authorID, seqText, postID string) error {
	if err := db.client.HDel(ctx, postKey(authorID, seqText), fanOutPendingField).Err(); err != nil {
		return fmt.Errorf("post %s fanned out: %w", postID, err)
	}
	return nil
}

// deletedPost reports whether a post whose hash a fan-out job found gone
// was deleted, rather than moved to the archive. The mover takes a post
// only once its job has cleared fanOutPendingField, but the job may run
// again after that: its worker died before it acknowledged the job, or
// the outbox sweep queued it twice. Without an archive a post's hash goes
// only with a delete.
//
// It reads the author's archiveGoneKey first, and then the archive: a post
// deleted before the read is noted there (deleteArchivedScript, or
// deletePostScript during a move) until the mover has deleted its row, so
// one or the other tells; one deleted after it was deleted after the
// deliveries the job checked, and its delete job takes them off (doc.go).
// A moved post's row was written before its hash went (see mover.go).
func (db *DB) deletedPost(ctx context.Context, authorID, postID string) (bool, error) {
	if db.opts.Archive == nil {
		return true, nil
	}
	noted, err := db.client.SIsMember(ctx, archiveGoneKey(authorID), postID).Result()
	if err != nil {
		return false, fmt.Errorf("check whether post %s was deleted: %w", postID, err)
	} else if noted {
		return true, nil
	}
	archived, err := db.archived(ctx, postID)
	if err != nil {
		return false, fmt.Errorf("check whether post %s was deleted: %w", postID, err)
	}
	return !archived, nil
}

// fanOutDepth is how many batches of one fan-out are in flight at a time.
// With two, Redis sat idle between the end of one and the arrival of the
// next after the followers' read that waited behind it; with three, fan-out
// to 100,000 followers took 8–12% less time (BENCHMARKS.md, Fan-out).
// More is not better for everyone else: each batch in flight is up to a
// thousand ZADDs that other clients' commands wait behind, and with six,
// small authors' createPost p99 during a 100,000-follower fan-out rose
// 1.6× (BENCHMARKS.md, -fanout-busy).
const fanOutDepth = 3

// walkAhead is how many batches of followers a fan-out job walks ahead of
// those it has sent, besides the one it is walking. A walk sent while
// fanOutDepth batches are in flight waits in Redis's queue behind their
// adds, up to a millisecond; walked in the job's loop, between a batch
// done and the next sent, it left Redis idle for that long at every batch.
// Ahead, with the cursor's save off that path too, a job to 10,000
// followers took 16.6–21.4 ms from the request against 22.7–34.0, and
// one to 100,000 180–205 ms against 210–223 (BENCHMARKS.md, Fan-out,
// eighth round).
const walkAhead = 1

// progressEvery is how many batches a fan-out runs between progress logs.
const progressEvery = 20

// unFanOut takes a deleted post off its author's followers' home timelines,
// batch followers per round trip, starting at from and calling save with
// the position after each batch but the last.
func (db *DB) unFanOut(ctx context.Context, authorID string, seq int64, postID string,
	from followerCursor, batch int, save func(followerCursor) error) error {
	if from == startCursor {
		// DeletePost did so already, but only the job is a promise.
		if err := db.unlistGlobal(ctx, seq, postID); err != nil {
			return err
		}
	}
	for {
		followers, next, last, err := db.followerChunk(ctx, authorID, from, batch)
		if err != nil {
			return err
		}
		if err := db.undeliver(ctx, followers, seq, postID); err != nil {
			return err
		}
		if last {
			return nil
		}
		if err := save(next); err != nil {
			return err
		}
		from = next
	}
}

// undeliver takes a post off the home timelines of followers, in one round
// trip.
func (db *DB) undeliver(ctx context.Context, followers []string, seq int64, postID string) error {
	if len(followers) == 0 {
		return nil
	}
	removed := encodeRemoved(seq, postID)
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		for _, f := range followers {
			db.pub(undeliverScript).EvalSha(ctx, pipe, []string{homeKey(f)}, postID, homeChannel(f), removed)
		}
	}, db.pub(undeliverScript))
	if err != nil {
		return fmt.Errorf("undeliver post %s: %w", postID, err)
	}
	return nil
}

// unlistGlobal takes a post off the global timeline, announcing the
// removal if the timeline held it.
func (db *DB) unlistGlobal(ctx context.Context, seq int64, postID string) error {
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		db.pub(undeliverScript).EvalSha(ctx, pipe, []string{globalKey}, postID, globalChannel, encodeRemoved(seq, postID))
		if db.opts.Archive != nil {
			pipe.ZRem(ctx, globalTailKey, postID)
		}
	}, db.pub(undeliverScript))
	if err != nil {
		return fmt.Errorf("take post %s off the global timeline: %w", postID, err)
	}
	return nil
}

// followerChunk returns up to n followers of authorID after position c,
// oldest follow first, the position after them, and whether they are the
// last.
//
// The walk goes by keyset (follow time, then id), not by rank: an unfollow
// during the walk would shift every later rank down and make a rank walk
// skip a follower, and so would an offset among followers tied on one
// time. A new follow has the newest time, so it lands at the end, and its
// backfill copies the post anyway.
//
// An account's followers in buckets are walked one bucket after the
// other, each by keyset from the cursor's floor on. A walk that began in
// the one set and finds the followers moved into buckets (see buckets.go)
// goes on in every bucket from the follow time it had reached: the buckets
// keep each follower's follow time, so what is older was walked already,
// and the followers tied on that time are delivered to again, harmlessly.
// A follow made meanwhile into a bucket walked already is, again, newer
// than the post, and backfilled.
func (db *DB) followerChunk(ctx context.Context, authorID string, c followerCursor, n int) ([]string, followerCursor, bool, error) {
	return db.followerChunkLogged(ctx, authorID, c, n, nil)
}

// followerChunkLogged is followerChunk, reading with a chunk of the one
// set, given log, what raw deliveries need (see walkFollowersLogged);
// log.last is "" for a chunk read elsewhere (in buckets).
func (db *DB) followerChunkLogged(ctx context.Context, authorID string, c followerCursor, n int, log *walkLog) ([]string, followerCursor, bool, error) {
	var followers []string
	if log != nil {
		log.last = ""
	}
	if c.buckets == 0 {
		entries, more, moved, err := db.walkFollowersLogged(ctx, followersKey(authorID), userKey(authorID), c.at, c.member, n, log, true)
		if err != nil {
			return nil, c, false, fmt.Errorf("read followers of %s: %w", authorID, err)
		}
		if moved == 0 {
			followers = make([]string, len(entries))
			for i, e := range entries {
				followers[i] = e.member
			}
			// A page that ends the set may come without its last score
			// (walkFollowersLogged with ends): then the position stays
			// where it was, before the page, which a resumed walk would
			// only read again.
			if n := len(entries); n > 0 && entries[n-1].score != "" {
				c.at, c.member = entries[n-1].score, entries[n-1].member
			}
			return followers, c, !more, nil
		}
		if log != nil {
			log.last = ""
		}
		c = followerCursor{buckets: moved, floor: c.at, at: c.at}
	}
	for c.bucket < c.buckets && len(followers) < n {
		want := n - len(followers)
		entries, more, _, err := db.walkFollowers(ctx, followerBucketKey(authorID, c.bucket), "", c.at, c.member, want)
		if err != nil {
			return nil, c, false, fmt.Errorf("read followers of %s in bucket %d: %w", authorID, c.bucket, err)
		}
		for _, e := range entries {
			followers = append(followers, e.member)
		}
		if !more {
			c = followerCursor{buckets: c.buckets, bucket: c.bucket + 1, floor: c.floor, at: c.floor}
		} else if len(entries) > 0 {
			c.at, c.member = entries[len(entries)-1].score, entries[len(entries)-1].member
		}
	}
	return followers, c, c.bucket >= c.buckets, nil
}

// prefetched is a chunk of followers as followerChunk returns it, read
// ahead (see fanOutJob).
type prefetched struct {
	followers []string
	next      followerCursor
	last      bool
	h0        string // the followers log's last id before the read, for raw deliveries; "" for none
}

// noSave is a fanOut save function that saves nothing, for a fan-out
// that runs inside a request and has no job to resume.
func noSave(followerCursor) error { return nil }

// startCursor is the position before every follower.
var startCursor = followerCursor{at: "-inf"}

// followerCursor is a position in an account's followers, after the entry
// (at, member) of the one set, or of one of its buckets. With member "",
// it is before every entry whose score is at or more.
type followerCursor struct {
	buckets int    // 0 in the one set; else how many buckets the walk goes through
	bucket  int    // the bucket the walk is in; buckets when it is done
	floor   string // the score each next bucket is walked from: -inf, or where the walk left the one set
	at      string // a score as Redis prints it, or -inf
	member  string
}

// String is the cursor as a job saves it: "k <at> <member>" in the one
// set, "b <buckets> <bucket> <floor> <at> <member>" in buckets, with "-"
// for no member.
func (c followerCursor) String() string {
	member := c.member
	if member == "" {
		member = "-"
	}
	if c.buckets == 0 {
		return "k " + c.at + " " + member
	}
	return "b " + strconv.Itoa(c.buckets) + " " + strconv.Itoa(c.bucket) + " " + c.floor + " " + c.at + " " + member
}

// parseFollowerCursor reads a saved cursor. It also reads the "<score>
// <tied>" of Warble before keyset cursors, as the position before every
// follower at that score: the followers tied on it are delivered to again,
// which delivery makes harmless.
func parseFollowerCursor(s string) (followerCursor, bool) {
	isScore := func(v string) bool {
		_, err := strconv.ParseFloat(v, 64)
		return err == nil || v == "-inf"
	}
	isMember := func(v string) bool { return v == "-" || warble.ValidUserID(v) }
	member := func(v string) string {
		if v == "-" {
			return ""
		}
		return v
	}
	f := strings.Fields(s)
	switch {
	case len(f) == 2: // the old form
		tied, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || tied < 0 || !isScore(f[0]) {
			return followerCursor{}, false
		}
		return followerCursor{at: f[0]}, true
	case len(f) == 3 && f[0] == "k":
		if !isScore(f[1]) || !isMember(f[2]) {
			return followerCursor{}, false
		}
		return followerCursor{at: f[1], member: member(f[2])}, true
	case len(f) == 6 && f[0] == "b":
		n, nerr := strconv.Atoi(f[1])
		b, berr := strconv.Atoi(f[2])
		if nerr != nil || berr != nil || n < 1 || b < 0 || b > n || !isScore(f[3]) || !isScore(f[4]) || !isMember(f[5]) {
			return followerCursor{}, false
		}
		return followerCursor{buckets: n, bucket: b, floor: f[3], at: f[4], member: member(f[5])}, true
	}
	return followerCursor{}, false
}
