package redisdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Raw deliveries: on one Redis, a fan-out job that walks its author's one
// followers set and is big enough for it (rawJob: a job of one small
// batch keeps the guarded script, which ends the job in its pipeline), of an account whose followers side is known good
// (followersCheckedField), adds the post to each active follower's home
// timeline with a plain pipelined ZADD, with no script and no guard per
// follower, and repairs after the fact the few followers whose entry
// changed (or may not agree with the truth) meanwhile. doc.go ("Raw
// deliveries repaired after the fact") has the argument; in short, per
// batch:
//
//  1. the walk's pipeline reads the followers log's last id (h0) before the
//     range of followers (walkFollowersLogged);
//  2. one MGET of the batch's seen times keeps the inactive skip;
//  3. one pipeline adds the post to the active followers' timelines
//     (trimming one in rawTrimEvery of them back to the cap), and after
//     the adds reads what the log holds after h0, its first id, the
//     followers of the batch that are unsure, who listens to their home
//     channels, and whether the post still exists;
//  4. the suspects, the followers of the batch logged after h0 or unsure,
//     and the followers that were added and are listened to, get
//     repairScript (the truth read, then the added message if they follow
//     and are listened to, else the post taken off with a RESYNC).
//
// The job ends (Worker.finish, or for a job of one batch finishFanOutLua,
// which also clears its post's fanOutPendingField: 3 would clear it even
// when Redis refused the adds) only after all of it answered without an
// error; any error keeps the job pending, and a run that takes it over
// repairs from the log what a run that died between 3 and 4 left
// (repairFromLog).

// rawTrimEvery is how many raw deliveries to a home timeline there are, on
// average, per trim of it back to its cap: a trim is chosen for about one
// in rawTrimEvery (follower, post) pairs by a hash of both, so that it
// costs Redis an eighth of a ZREMRANGEBYRANK per delivery. Pages read
// only the top of a timeline, and readers clamp it to the cap (see
// FindTimeline), so the entries below the cap in between are memory only.
const rawTrimEvery = 8

// homeSlack is how far past its cap a home timeline may be let grow
// between trims, for the listpack limit (CheckListpack): a run of
// homeSlack raw deliveries to one timeline with no trim among them has a
// chance of (1 - 1/rawTrimEvery)^homeSlack, 4e-8 at 128, and any other
// writer of a home timeline trims it to the cap. A timeline that passes
// the limit all the same becomes a skiplist for good.
const homeSlack = 16 * rawTrimEvery

// rawTrim reports whether the raw delivery of the post of seq to follower
// trims the timeline: about one in rawTrimEvery pairs, by FNV-1a of both.
func rawTrim(follower, seqText string) bool {
	// hash/fnv's FNV-1a, written out: it is asked for every delivery, and
	// the loop hashes the strings where they are, with no []byte copy.
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(follower); i++ {
		h = (h ^ uint32(follower[i])) * prime
	}
	h = (h ^ ':') * prime
	for i := 0; i < len(seqText); i++ {
		h = (h ^ uint32(seqText[i])) * prime
	}
	return h%rawTrimEvery == 0
}

// repairScript is the repair of a raw delivery to a suspect, and the
// announce of one to a follower who is listened to: the follower's
// following set, the truth, decides. A follower who follows
// keeps the post, and hears of it if the delivery added it and someone
// listens; one who does not has it taken off their home timeline, which
// is announced with a RESYNC as unbackfillScript announces, so that a
// live timeline that showed it refetches.
//
// KEYS[1] -> w:u:{<follower>}:home
// KEYS[2] -> w:u:{<follower>}:following
// ARGV[1] -> author id
// ARGV[2] -> post id
// ARGV[3] -> the home channel
// ARGV[4] -> the added message, or "" to announce nothing
//
// Returns 1 if the follower follows the author, 0 if the post was taken
// off (or was not there).
var repairScript = newPubScript(`
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
	if ARGV[4] ~= '' then
		redis.call('PUBLISH', ARGV[3], ARGV[4])
	end
	return 1
end
if redis.call('ZREM', KEYS[1], ARGV[2]) == 1 then
	local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
	redis.call('PUBLISH', ARGV[3], 'S ' .. (top[2] or 0))
end
return 0
`)

// rawReads is how many commands, at most, a batch's adds pipeline sends
// besides its adds and trims: the log's two reads, the unsure HMGET, NUMPAT,
// NUMSUB and EXISTS.
const rawReads = 6

// rawScratch is the memory of a batch's adds pipeline, kept from batch to
// batch in rawScratches: the commands, their arguments and the queue of
// them, a few tens of kilobytes a batch that the garbage collector no
// longer marks and sweeps each time (the worker's CPU per delivery,
// BENCHMARKS.md). Nothing holds them after deliverRaw returns: go-redis
// forgets a pipeline's commands once it has read their answers.
type rawScratch struct {
	cmds  []redis.IntCmd
	args  []any
	queue []redis.Cmder
}

var rawScratches = sync.Pool{New: func() any { return new(rawScratch) }}

// release clears s, so that a pooled scratch keeps no batch's names or
// context alive, and puts it back.
func (s *rawScratch) release() {
	clear(s.cmds[:cap(s.cmds)])
	clear(s.args[:cap(s.args)])
	clear(s.queue[:cap(s.queue)])
	rawScratches.Put(s)
}

// grow returns (*s)[:n], with *s made anew if it has less room.
func grow[T any](s *[]T, n int) []T {
	if cap(*s) < n {
		*s = make([]T, n)
	}
	*s = (*s)[:n]
	return *s
}

// rawBatch is a batch of followers to deliver to raw.
type rawBatch struct {
	authorID, seqText, postID, added string
	followers                        []string
	h0                               string    // the followers log's last id before the walk read followers
	walked                           time.Time // when h0 was read
	// again says that the job was taken over: its first worker may have
	// died between a batch's adds and their announce, so a follower who
	// holds the post already is announced it too (see deliverRaw).
	again bool
}

// deliverRaw delivers b's post raw and repairs it (see the top of this
// file). It returns how many followers hold the post now who did not
// before, and whether the post still existed after the adds (0 or 1, as
// EXISTS answers); with it at 0, nothing was announced, and the caller
// takes the post back off if it was deleted, as for a guarded batch. The
// repair runs in either case: a post that moved to the archive meanwhile
// is not deleted, the job goes on (deletedPost), and the archive serves
// it to a follower who left between the walk and the adds.
//
// A follower who is listened to hears of the post once the adds and the
// repair have answered, if the ZADD added it, or, in a job taken over
// (b.again), if the timeline holds it: the ZADD and the announce are not
// one step, and the first worker may have died between them, after which
// a ZADD adds nothing. A home channel that dispatched the post already
// drops the second announce, or takes it for a RESYNC once the post has
// left its recent seqs (hubChannel.handle): never a second POST_ADDED.
func (db *DB) deliverRaw(ctx context.Context, b rawBatch) (delivered int, exists int64, err error) {
	// The names of the batch's keys and channels, one string sliced (see
	// deliveryNames): home, following and seen keys, then home channels.
	n := len(b.followers)
	names := deliveryNames(b.followers)
	active := make([]int, 0, n) // indexes into b.followers
	scratch := rawScratches.Get().(*rawScratch)
	defer scratch.release()
	if cutoff := db.inactiveCutoff(); cutoff > 0 && n > 0 {
		// The keys as pointers into names, which box with no allocation,
		// and the answer as strings, a missing one "", which need no box
		// each either (the worker's CPU per delivery, BENCHMARKS.md).
		args := grow(&scratch.args, 1+n)
		args[0] = "mget"
		for i := range b.followers {
			args[1+i] = &names[3*i+2]
		}
		mget := redis.NewStringSliceCmd(ctx, args...)
		seen, err := mget, db.client.Process(ctx, mget)
		if err != nil {
			return 0, 0, fmt.Errorf("read seen times: %w", err)
		}
		times := seen.Val()
		for i := range b.followers {
			// A follower with no time read is delivered to: an answer
			// short of one is no reason to skip anyone.
			if i < len(times) && times[i] != "" {
				if at, err := strconv.ParseInt(times[i], 10, 64); err == nil && at < cutoff {
					continue // inactive: rebuilt when they come back
				}
			}
			active = append(active, i)
		}
	} else {
		for i := range b.followers {
			active = append(active, i)
		}
	}
	activeIDs := make([]string, len(active))
	for j, i := range active {
		activeIDs[j] = b.followers[i]
	}
	if db.rawStep != nil {
		db.rawStep("seen", activeIDs)
	}
	// The commands' arguments, boxed once where they are shared, and the
	// names as pointers, which box without an allocation.
	zadd, trim, seqArg, postArg := any("zadd"), any("zremrangebyrank"), any(b.seqText), any(b.postID)
	zero, floor := any(0), any(-int64(db.opts.HomeCap)-1)
	// The adds and trims are commands of one slice, queued at once, with
	// their arguments in another: memory of the batch that a worker's next
	// batch reuses (rawScratch).
	trims := 0
	for _, i := range active {
		if rawTrim(b.followers[i], b.seqText) {
			trims++
		}
	}
	m := len(active)
	cmds := grow(&scratch.cmds, m+trims)
	adds, trimCmds := cmds[:m], cmds[m:]
	args := grow(&scratch.args, 4*(m+trims)+2*(2+m))
	addArgs, trimArgs, hmget, sub := args[:4*m], args[4*m:4*(m+trims)], args[4*(m+trims):4*(m+trims)+2+m], args[4*(m+trims)+2+m:]
	queue := grow(&scratch.queue, m+trims+rawReads)[:0]
	t := 0
	for j, i := range active {
		a := addArgs[4*j : 4*j+4 : 4*j+4]
		a[0], a[1], a[2], a[3] = zadd, &names[3*i], seqArg, postArg
		adds[j] = *redis.NewIntCmd(ctx, a...)
		queue = append(queue, &adds[j])
		if rawTrim(b.followers[i], b.seqText) {
			a := trimArgs[4*t : 4*t+4 : 4*t+4]
			a[0], a[1], a[2], a[3] = trim, &names[3*i], zero, floor
			trimCmds[t] = *redis.NewIntCmd(ctx, a...)
			queue = append(queue, &trimCmds[t])
			t++
		}
	}
	// After the adds: a change of the followers side that this misses
	// comes after them, and so does its writer's last step.
	logKey := followersLogKey(b.authorID)
	after := redis.NewXMessageSliceCmd(ctx, "xrange", logKey, "("+b.h0, "+")
	first := redis.NewXMessageSliceCmd(ctx, "xrange", logKey, "-", "+", "count", 1)
	queue = append(queue, after, first)
	var unsure, numsub *redis.StringSliceCmd
	var numpat *redis.IntCmd
	if m > 0 {
		// As the seen times: fields and channels as pointers, the answers
		// as strings.
		hmget[0], hmget[1] = "hmget", followersUnsureKey(b.authorID)
		for j := range activeIDs {
			hmget[2+j] = &activeIDs[j]
		}
		unsure = redis.NewStringSliceCmd(ctx, hmget...)
		numpat = redis.NewIntCmd(ctx, "pubsub", "numpat")
		sub[0], sub[1] = "pubsub", "numsub"
		for j, i := range active {
			sub[2+j] = &names[3*n+i]
		}
		numsub = redis.NewStringSliceCmd(ctx, sub...)
		queue = append(queue, unsure, numpat, numsub)
	}
	found := redis.NewIntCmd(ctx, "exists", postKey(b.authorID, b.seqText))
	queue = append(queue, found)
	_, err = db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		return pipe.BatchProcess(ctx, queue...)
	})
	if err != nil {
		return 0, 0, err
	}
	if db.rawStep != nil {
		db.rawStep("added", activeIDs)
	}
	if len(active) == 0 {
		return 0, found.Val(), nil
	}

	// The suspects: followers whose entry changed after h0, or whose
	// entry may disagree with the truth. All of the batch when the log may
	// have lost entries after h0: trimmed past it, or h0 read so long ago
	// that its trim may have.
	logged := map[string]bool{}
	for _, m := range after.Val() {
		if f, ok := m.Values["f"].(string); ok {
			logged[f] = true
		}
	}
	all := time.Since(b.walked) > followersLogKeep/2
	if msgs := first.Val(); len(msgs) > 0 && b.h0 != "0-0" && streamIDAfter(msgs[0].ID, b.h0) {
		all = true
	}
	unsureOf := unsure.Val()
	// NUMSUB answers channel, count, channel, count, … in the order asked;
	// a missing unsure count reads "".
	subs := numsub.Val()
	everyone := numpat.Val() > 0 // a pattern subscriber, which NUMSUB does not count
	type repair struct {
		j   int
		cmd *redis.Cmd
	}
	var repairs []repair
	if err := db.loadScript(ctx, db.pub(repairScript), false); err != nil {
		return 0, 0, fmt.Errorf("repair deliveries: %w", err)
	}
	msgs := make([]string, len(active)) // the added message to announce, or ""
	for j := range active {
		listened := everyone
		if 2*j+1 < len(subs) {
			if c, _ := strconv.ParseInt(subs[2*j+1], 10, 64); c > 0 {
				listened = true
			}
		}
		if found.Val() == 1 && (adds[j].Val() == 1 || b.again) && listened {
			msgs[j] = b.added
		}
	}
	// A follower to announce to gets repairScript too, whether a suspect
	// or not: it announces only after it has read the truth, in one step,
	// so that an unfollow whose first step comes after the batch's reads
	// cannot take the post off, with its RESYNC, before the announce,
	// which a live home channel would then dispatch (hubChannel.added).
	_, err = db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for j, i := range active {
			f := b.followers[i]
			if msgs[j] != "" || all || logged[f] || (unsureOf[j] != "" && unsureOf[j] != "0") {
				cmd := db.pub(repairScript).EvalSha(ctx, pipe, []string{names[3*i], names[3*i+1]},
					b.authorID, b.postID, names[3*n+i], msgs[j])
				repairs = append(repairs, repair{j: j, cmd: cmd})
			}
		}
		return nil
	})
	for _, r := range repairs {
		if redis.HasErrorPrefix(r.cmd.Err(), "NOSCRIPT") {
			// Redis lost the script (a flush, a restart): the repairs
			// and the announces did not run, or not all of them.
			if err := db.loadScript(ctx, db.pub(repairScript), true); err != nil {
				return 0, 0, fmt.Errorf("repair deliveries: %w", err)
			}
			delivered, err := db.deliverRawRepairAgain(ctx, b, activeIDs, adds, msgs)
			if err == nil && db.rawStep != nil {
				db.rawStep("repaired", activeIDs)
			}
			if found.Val() == 0 {
				delivered = 0
			}
			return delivered, found.Val(), err
		}
	}
	if err != nil {
		return 0, 0, fmt.Errorf("repair deliveries: %w", err)
	}
	removed := map[int]bool{}
	for _, r := range repairs {
		if v, _ := r.cmd.Int64(); v == 0 {
			removed[r.j] = true
		}
	}
	for j := range active {
		if adds[j].Val() == 1 && !removed[j] && found.Val() == 1 {
			delivered++
		}
	}
	if db.rawStep != nil {
		db.rawStep("repaired", activeIDs)
	}
	return delivered, found.Val(), nil
}

// deliverRawRepairAgain runs a batch's repair once more, every follower a
// suspect, after Redis lost repairScript: the first try may have run
// anything before the missing script, and a repair twice is harmless.
// msgs holds the added message that each follower's repair was to
// announce, or "".
func (db *DB) deliverRawRepairAgain(ctx context.Context, b rawBatch, active []string, adds []redis.IntCmd, msgs []string) (int, error) {
	cmds := make([]*redis.Cmd, len(active))
	_, err := db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, f := range active {
			cmds[i] = db.pub(repairScript).EvalSha(ctx, pipe, []string{homeKey(f), followingKey(f)},
				b.authorID, b.postID, homeChannel(f), msgs[i])
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("repair deliveries: %w", err)
	}
	delivered := 0
	for i := range active {
		if v, _ := cmds[i].Int64(); v == 1 && adds[i].Val() == 1 {
			delivered++
		}
	}
	return delivered, nil
}

// repairFromLog repairs, for a raw job that another worker may have run
// in part, the deliveries that worker may have left unrepaired: it died
// between a batch's adds and their repair, and a follower of that batch
// who left meanwhile is not in the walk any more, to be found a suspect
// again. Such a follower's change is in the log after that batch's h0,
// which was read after the job was queued: every follower logged since
// then, less a minute for Redis's clock, gets repairScript. A log that
// may have been trimmed past that (a job taken over more than
// followersLogKeep, less that minute and one more, after it was queued)
// cannot tell, which is logged as a warning.
func (db *DB) repairFromLog(ctx context.Context, authorID, seqText, postID, jobID string) error {
	ms, _, _ := cutStreamID(jobID)
	from := strconv.FormatUint(max(ms, uint64(time.Minute.Milliseconds()))-uint64(time.Minute.Milliseconds()), 10) + "-0"
	pipe := db.client.Pipeline()
	since := pipe.XRange(ctx, followersLogKey(authorID), from, "+")
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("read followers log of %s: %w", authorID, err)
	}
	if time.Since(time.UnixMilli(int64(ms))) > followersLogKeep-2*time.Minute {
		db.log.WarnContext(ctx, "fan-out job taken over after its followers log was trimmed: a follower who left while its first worker died may keep the post",
			"post", postID, "job", jobID)
	}
	seen := map[string]bool{}
	var followers []string
	for _, m := range since.Val() {
		if f, ok := m.Values["f"].(string); ok && !seen[f] {
			seen[f] = true
			followers = append(followers, f)
		}
	}
	err := runScripts(ctx, db.client, func(pipe redis.Pipeliner) {
		for _, f := range followers {
			db.pub(repairScript).EvalSha(ctx, pipe, []string{homeKey(f), followingKey(f)}, authorID, postID, homeChannel(f), "")
		}
	}, db.pub(repairScript))
	if err != nil {
		return fmt.Errorf("repair deliveries of post %s: %w", postID, err)
	}
	return nil
}

// cutStreamID splits a stream entry id "<ms>-<seq>".
func cutStreamID(id string) (ms, seq uint64, ok bool) {
	a, b, found := cutByte(id, '-')
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}

func cutByte(s string, c byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// streamIDAfter reports whether stream id a is after b.
func streamIDAfter(a, b string) bool {
	am, as, _ := cutStreamID(a)
	bm, bs, _ := cutStreamID(b)
	return am > bm || am == bm && as > bs
}

// loadScript loads script into db's Redis unless this process did so
// already (or, with force, again), as runScripts does, for a pipeline that
// must not run twice.
func (db *DB) loadScript(ctx context.Context, script *redis.Script, force bool) error {
	if _, ok := scriptLoads.Load(script); ok && !force {
		return nil
	}
	if err := script.Load(ctx, db.client).Err(); err != nil {
		return err
	}
	scriptLoads.Store(script, struct{}{})
	return nil
}

// checkFollowers reads, for followers of authorID walked from the one set,
// whether each follows authorID (the truth), and counts those who do not
// up in authorID's unsure hash, for good: their entries are stale (left by
// an earlier Warble, or by a writer that has not confirmed yet), and raw
// deliveries must check them each time. It is one step of the walk that
// makes a followers side known good (fanOutJob's checking), once per
// author.
func (db *DB) checkFollowers(ctx context.Context, authorID string, followers []string) error {
	scores := make([]*redis.FloatCmd, len(followers))
	_, err := db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, f := range followers {
			scores[i] = pipe.ZScore(ctx, followingKey(f), authorID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	var stale []string
	for i, c := range scores {
		if errors.Is(c.Err(), redis.Nil) {
			stale = append(stale, followers[i])
		} else if c.Err() != nil {
			return c.Err()
		}
	}
	if len(stale) == 0 {
		return nil
	}
	_, err = db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, f := range stale {
			pipe.HIncrBy(ctx, followersUnsureKey(authorID), f, 1)
		}
		return nil
	})
	return err
}
