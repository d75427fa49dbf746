// Package redisdb implements Warble's domain services on Redis: users and
// sessions, posts and the timelines they appear in, follows, live timelines,
// and the fan-out workers that deliver posts to followers.
//
// A newcomer finds each concern in a file of its name: keys.go is the whole
// data layout; post.go, user.go, auth.go and follow.go are the services;
// timeline.go reads pages of timelines, with postcache.go's cache of
// posts and authors; delivery.go is the fan-out engine,
// which queue.go feeds with jobs and worker.go runs; buckets.go splits the
// followers of huge accounts over the masters; pull.go merges the posts of
// accounts too big to fan out into home timelines; inactive.go
// skips followers who are away; mover.go moves old posts to the archive
// (Options.Archive), and its top comment argues why a crash loses and
// duplicates none; the hub*.go files are the live timelines.
// scripts.go runs pipelines of Lua scripts; durability.go waits for
// replicas. The design behind them follows.
//
// # Posts and timelines
//
// A post is a hash in its author's hash slot, and its id, "<author>:<seq>",
// sits in sorted sets scored by its seq (from one INCR, so that every
// timeline orders posts alike and a cursor is a seq): the author's posts and
// home timeline, written in one atomic step with the post so that the author
// reads their own write at once; the global timeline; and the followers'
// home timelines, written by fan-out. Timelines hold ids only: a page is one
// range read and one pipeline of the posts with their authors.
//
// # The post cache
//
// What never changes in a post (body, time, author) and in a user
// (username, display name, signup time) is kept in a bounded LRU per
// process (postcache.go), so that the pipeline of the posts and authors
// reads only what is not cached, and a page of cached posts is its range
// read alone. Counts are never cached. A delete is what can make an entry
// wrong: the scripts that delete a post publish its id on
// postsGoneChannel in the same atomic step (a classic channel, broadcast
// to every node of a cluster), the deleting process drops it before it
// answers, and every other process's hub drops it when the message
// arrives. A read that was on its way across a drop does not fill the
// cache (a generation counter, taken before its commands are sent). The
// cache is used only while the hub's subscription to that channel stands,
// and emptied on its every confirmation but a further connection's first
// while another one listens (a reconnect may have lost
// messages, and Redis may have lost data and will hand out the same ids
// again), and whenever the hub reads an id counter lower than the time
// before (a FLUSHALL or a failover, which no reconnect tells). A
// connection can also die without a word: the hub publishes a beat on
// the channel every cacheBeatEvery, and the cache is used only while one
// of its own came back from within cacheHeardFor beats; an entry lives
// postCacheMaxAge at most in any case.
//
// # Reading past Redis
//
// Redis holds the recent part of each timeline; pages go on past it in
// the same order and under the same cursors, since a cursor is a seq and a
// post keeps its seq wherever it is (see FindTimeline and beyondRedis):
//
//   - A user's posts set holds their newest posts, and with
//     Options.Archive the older ones are archived: a page that runs out of
//     the set goes on in the archive, in the same page, one query.
//   - A home timeline at its cap has lost older entries: a page past its
//     oldest goes on by pull, merging by seq the older posts of the
//     accounts the owner follows now and their own, from each one's posts
//     set (one pipeline of bounded ranges) and the archive (one query by
//     all of them), see pullHome. A home timeline short of its cap holds
//     all of it and ends.
//   - A pulled account's posts are in its posts set alone: a merged home
//     page reads the archived ones of the pulled accounts whose set falls
//     short of the page from the archive too (rangeMerged).
//   - The global timeline at its cap goes on from the archive; nothing
//     indexes the posts below its cap that are still in Redis, so those
//     are not shown there, and without an archive it ends at its cap.
//
// Timelines keep the ids of posts that moved to the archive, and loadPosts
// reads those from it, all of a page in one query; a post deleted for real
// is in neither place. The same read serves node(id:) and the replay of
// live subscriptions, which also replays a user's archived posts newer
// than its cursor (replayArchived).
//
// # Reliable asynchronous fan-out
//
// With Options.AsyncFanOut, CreatePost and DeletePost do their author's own
// step at once and leave the rest to a job: workers (Worker, in the server
// process or in separate `warble worker` processes, any number) read jobs
// from Redis Streams through one consumer group each and put the post on the
// global timeline and on the home timelines of the author's followers (or
// take it off them), a batch of followers per round trip.
//
// The guarantee: once CreatePost has answered, the post reaches the global
// timeline and every follower (as of the walk) exactly once, even if any
// process dies at any moment after that. The argument:
//
//   - On one Redis, createPostOneRedisScript queues the job (XADD) in the
//     atomic step that stores the post, and CreatePost answers only after
//     that step: the job is in the stream if and only if the post was
//     stored (and has followers to reach: below), and no outbox is
//     needed. (A script there may touch every key it declares, whatever
//     their slots.) The same step lists the post on the global timeline,
//     and the job says so (listed), so that its worker does not list it
//     again; if that listing fails, the step queues the job a second time
//     without listed. A job of an author with few followers carries
//     them, read in that step, and its worker delivers without walking
//     them (fanOutCarried): those are the followers "as of the walk", and
//     one who follows after the step gets the post from their follow's
//     backfill, which finds it in the author's posts set. By the same
//     argument, a post whose author has no followers in that step gets no
//     job at all: the step has listed it. (Should that listing fail, the
//     step queues the job that lists it, without listed, as above.)
//   - On a Redis Cluster, the post's keys and the stream are in different
//     slots, so the job is recorded in its author's outbox by
//     createPostScript (and, on either, by deletePostScript), in the same
//     atomic step that stores the post, and CreatePost answers only after
//     that step. Then XADD queues the job, and only once it is queued does
//     the job leave the outbox. A job that a dying process (or a failed
//     XADD) left in an outbox is queued by a worker's sweep
//     (sweepOutboxes: one worker of each process, at start and then about
//     once a minute). A job queued twice that way (a sweep racing a slow
//     CreatePost) is done twice, which delivery makes harmless.
//   - The sweep finds those jobs through its shard's outbox index
//     (outboxIndexKey), not by scanning every key: the job is added to the
//     index in a command that has answered before the post's step runs, so
//     a job in an outbox is in the index, and it leaves the index only
//     after it left the outbox (once queued), or when the sweep finds it in
//     no outbox ten minutes (orphanAfter) after it was indexed: its step
//     never ran, or it was queued by a request that died before it cleared
//     the index; only a request that spent those ten minutes between its
//     two first commands could still write it. The jobs that a Warble from
//     before the index left in outboxes are indexed by the first sweeping
//     worker of the database, once (backfillOutboxIndex).
//   - A queued job is in the stream until a worker acknowledges it, and a
//     worker acknowledges a job only after its last batch, in the same
//     atomic step that drops its progress cursor: a MULTI, or on one Redis,
//     for a job of one batch, a script at the end of that batch's pipeline
//     that acknowledges only if the batch's check finds the post and the
//     pipeline's deliveries all ran (finishFanOutLua: a pipeline runs a
//     command whatever the others answered).
//   - A worker that dies leaves its job pending in the group. Any other
//     worker takes it over with XAUTOCLAIM once it has been idle for
//     ClaimIdle; a live worker touches its job after every batch (XCLAIM to
//     itself, with the cursor, in one script), so only stalled jobs go idle.
//   - The job's cursor (the last follower walked and their follow time, a
//     keyset position, as followerChunk walks; with the bucket it is in,
//     for followers in buckets) is saved after each batch, so a taken-over
//     job resumes at the first batch that may not have been delivered
//     whole, rather than at the start. A keyset position stays exact when
//     followers come and go during the walk, and means the same in the
//     buckets as in the one set, so a job that began before its author's
//     followers moved into buckets goes on there (see followerChunk).
//   - Redelivering that batch cannot duplicate anything: deliverScript adds
//     by ZADD of the same member and score, and announces only when ZADD
//     added, so a follower who has the post already gets neither a second
//     entry nor a second POST_ADDED. The global timeline's step is the same
//     script. On one Redis, deliverBatchScript does the same for many
//     followers in one call, follower after follower, each as atomically:
//     everything said here of deliverScript holds for it.
//
// Jobs are as durable as the Redis that holds them, like the posts
// themselves.
//
// Deletes go through the same stream. A delete can race a create job still
// walking the followers, and the timelines must end without the post. The
// delete job starts after deletePostScript removed the post's hash (time D)
// and takes the post off the global timeline and every follower's timeline
// at some time U > D. A create job's first step adds the post to the global
// timeline and then checks that the hash still exists; each of its batches
// checks that too, after its deliveries; a resumed job checks it before it
// starts. "After" is what the check's place gives: on one Redis the check
// follows the writes in their pipeline, which one connection runs in
// order; a Redis Cluster pipeline sends each node its commands at once, in
// no order between nodes, so there the check is a round trip of its own,
// sent once the writes have answered. For a timeline written at time T, either
// that step's check ran after T and saw the hash (so T < D < U and the
// delete job removes the post after it was added), or it saw the hash gone
// and the create job takes the post back off itself and stops, or the
// worker died before it learnt the answer, in which case the batch is at
// or after the job's saved cursor (the cursor moves past a batch only once
// its check is answered, see fanOut) and whoever resumes the job checks
// and undoes every follower from the cursor on (and the global timeline,
// for a job that had not got past its start). A worker that stalled and
// lost its job to another lives on: it learns of the loss from a save that
// ran while its next batch went out, which may then land after the new
// owner's undo, so it too undoes every batch whose check found the post
// gone. So the post ends in no timeline, whatever the order.
//
// With an archive, a hash also goes when the mover takes the post, which
// is not a delete. The mover leaves a post in Redis while its job has not
// delivered it (the post's hash is marked from its creating step until
// the job's last batch, see mover.go), so a job normally never meets a
// moved post. One that runs again after that (its worker died before it
// acknowledged the job, or the sweep queued it twice) asks, for a hash it
// finds gone, whether the post was deleted (deletedPost): noted in its
// author's archiveGoneKey, or in neither Redis nor the archive. A check
// that finds it moved and not deleted ran before any delete (D above),
// so the argument holds with that check in place of the hash's.
//
// # A racing unfollow
//
// Once an unfollow has answered and the fan-out job of a post is done, the
// follower's home timeline holds no post of the author, in whatever order
// the two ran (and any follow of the same pair that raced them). Unfollow
// writes (1) the following set, the truth, (2) the followers side, by
// mirrorFollow, which writes it and then reads the truth again until what
// it wrote is still the truth, and (3) takes the author's posts off the
// home timeline (unbackfill). Follow writes (1) and (2) alike, and its (3),
// backfill, takes the author's posts off instead of copying them when the
// truth no longer has the follow.
//
// Every delivery reads the truth in the step that adds, for each follower:
// deliverScript, one follower per call (a Redis Cluster), and
// deliverBatchScript, a batch of followers per call (one Redis), alike;
// raw deliveries do not, and repair instead (see the next section).
// The unfollow's (1) came first and nothing is added, or the add came
// first and the unfollow's (3), later still, takes it off. The followers
// side only says whom to try: a follower it lists who does not follow (a
// write of (2) still to come, or an entry left by an older version) gets
// nothing.
//
// An unfollow that dies between (1) and (3) leaves the author's posts
// delivered before its (1) in the home timeline, and fan-out adds none
// after it; a racing Follow's backfill that finds the follow gone, or the
// next Unfollow of the pair, takes them off. A client that hangs up is no
// crash: once the truth is written, Follow and Unfollow run to their end
// without its context.
//
// # Raw deliveries repaired after the fact
//
// On one Redis, a job that walks its author's one followers set, big
// enough for it (rawJob) or taken over, of an author whose followers side is known good
// (followersCheckedField, see below), delivers each batch without a script or a guard per follower
// (rawdelivery.go): plain ZADDs, then a repair. The guarantee above holds
// for it by another argument, which needs two things of every follow and
// unfollow: each change of the author's followers side is appended, in
// the step that makes it, to the author's followers log (followersLogKey),
// and each follow or unfollow counts its follower up in the author's
// unsure hash (followersUnsureKey) before its (1), down once its (2) is
// confirmed against the truth, each writer once (under a token of its own,
// so that a command that Redis runs twice, retried by go-redis, does not
// count twice: one count down too many would clear a racing writer that
// may still die between its (1) and its (2)).
//
// A batch reads the log's last id H0 and then the followers (the walk, at
// tw, after H0; one MULTI, so that the page's ends, whose scores it reads
// apart, are those of its range), the ZADDs (at ta), then, after them,
// what the log holds after H0 and which of the batch are unsure (at td),
// and repairs each suspect, a follower of the batch logged after H0 or
// unsure: one step on the follower's keys reads the truth and takes the
// post off (with a RESYNC) if they do not follow. Take F, listed by the
// walk, who does not follow once the unfollow (or the job) is done:
//
//   - F's entry was removed after tw (by an unfollow's (2), or a follow's
//     correction of a stale add). That write logged an id above H0. If it
//     came before td, the batch sees it and repairs F after td, when the
//     truth, written before (2), says F does not follow. If it came after
//     td, the writer's (3) (unbackfill, or the backfill of a follow that
//     finds the follow gone) runs after it, so after ta, and takes the
//     post off.
//   - F's entry was not removed after tw. Some unfollow of the pair wrote
//     the (1) that F's not following comes from. If that (1) came after
//     ta, the post was delivered before it, the case of an unfollow that
//     dies between (1) and (3) above (its (2) and (3), if they come, take
//     the post off). If it came before tw, the entry still listed at tw
//     means that its (2) had not removed it, or that a writer wrote the
//     entry back after it: a follow that read the truth before that (1)
//     and wrote after its (2), which reads the truth again, and is counted
//     until it has taken the entry out again, a removal after tw (the
//     case above). Else its (2) comes after tw (the case above) or never,
//     and then its count, raised before its (1) and never lowered, marks
//     F unsure at td, and F is repaired. If it came between tw and ta,
//     its count went up before it, and came down only after a (2) that
//     removed the entry after tw: F is unsure at td, or logged after H0.
//   - That leaves a followers side listing a non-follower with nothing
//     counted, which only a writer that never counted can leave: an
//     earlier version (see below).
//
// The log keeps followersLogKeep by Redis's clock. A batch whose log lost
// entries after H0 (its first id is past H0) or whose H0 is older than
// half that checks every follower of the batch. A worker that dies between
// the ZADDs and the repair leaves no suspect for the next run, whose walk
// no longer lists a follower who left; so a job taken over first repairs
// every follower logged since the job was queued (less a minute;
// repairFromLog), which covers the followers of any batch its first
// worker ran. A job taken over later than the log keeps its entries
// cannot do that, and says so in the log: the one case where a stale post
// may stay (it needs an unfollow between a batch's walk and its ZADDs, a
// worker dying right after them, and the job left pending ten minutes).
// That worker may also have died before its announce: the job taken over
// finds the post in those timelines (its ZADD adds nothing), so it
// announces it to every listened follower who holds it, and a home
// channel that had it already drops the second announce.
//
// A deleted post is handled as for the guarded batches: the batch's check
// (EXISTS) follows its ZADDs in the same pipeline. A post found gone is
// repaired all the same: it may have moved to the archive (a job run
// again, see deletedPost), and then the job goes on, and the archive
// serves it to whoever holds its id. The inactive skip reads the batch's
// seen times in a round trip before the ZADDs: a follower who comes back
// between is rebuilt from the posts sets, which hold the post. The
// announce goes out after the reads that follow the adds, for the
// followers the ZADD added (or, in a job taken over, who hold the post)
// and someone listens to, each in the step that repairs them (every one
// of them gets it, suspect or not): it reads the truth first, so an
// unfollow whose (1) comes after the batch's reads either comes after the
// announce, and its (3) takes the post off with a RESYNC after it, or
// before, and the step takes the post off instead of announcing it (a home
// channel dispatches an announced post without reading the timeline). A
// live home channel that started between the ZADD and the announce read
// the post at its start and takes the announce as a post below what it
// dispatched, a RESYNC (hubChannel.handle), never as a second POST_ADDED.
//
// Known good: the followers side of an author lists only followers, or
// followers counted unsure, when every writer since it was empty counted
// and logged; so followersCheckedField is set when a follow writes the
// first follower into an empty set. A followers side from an earlier
// version keeps the guarded delivery until a job walks all of it from its
// start in the one set: after each guarded batch, the job reads each
// follower's truth and counts those who do not follow up in the unsure
// hash, for good (checkFollowers), and once the last batch is done it
// sets followersCheckedField. An entry it found agreeing agreed at that
// read, and any change of it since was made by a writer that counts and
// logs. Processes of earlier versions write without counting: an upgrade
// must replace all of them (README).
//
// Each atomic step stays in one hash slot: a shard's stream, its group,
// its cursors and its outbox index share its tag ({fanout} or
// {fanout:<i>}); deliveries are scripts on one follower's keys. The jobs
// are split over Options.FanOutShards streams by author, so that on a
// cluster they spread over the masters; a worker reads new jobs (one at a
// time on a cluster, up to jobsAtOnce on one Redis) from the shards in
// turn, and each process watches every shard's stream with a blocked
// XREAD on a connection of its own (see jobWatch). On one Redis, the jobs
// that carry their followers run together in one pipeline, which also
// reads the worker's next jobs (Worker.readNext; a worker that stops hands
// back those it holds), one worker of a process at a time (batchTurn),
// at most every batchEvery while the pipelines are not full, so that they
// fill; any other job runs alone, on any worker, meanwhile. An author's jobs
// are all in one shard, queued in order, as they were in the one stream.
//
// # Hybrid push/pull
//
// Fan-out on write costs one write per follower, which for an account with
// millions of followers is minutes of work per post. So a fan-out job for an
// author with more than Options.PullThreshold followers delivers nothing to
// followers: it adds the author to pullAuthorsKey and stops. A home timeline
// is then read as a k-way merge by seq of the pushed timeline and the posts
// sets of the pulled authors its owner follows (usually none, and then a
// home page costs what it did). Seqs are global, so the merge interleaves
// exactly as pushing would have, cursors (a seq) mean the same in both, and
// a post that was pushed and is also in its author's posts set (pushed
// before the author crossed the threshold) is one entry, not two.
//
// What a pushed timeline would hold, the merge holds too: only posts of
// authors the owner follows (unfollowing removes the author from the merge,
// as it removes their pushed posts), and of those the newest HomeCap, the
// cap of the whole (see rangeMerged). A deleted post leaves its author's
// posts set in the delete's first atomic step, so it leaves every merged
// timeline at once. Past the cap, pushed or merged, a page goes on by pull
// from the posts of everyone the owner follows (see "Reading past Redis"),
// so both read alike to the end, deletes included.
//
// Crossing the threshold needs no migration. Upwards, the posts pushed
// before stay pushed, and the merge dedupes them. Downwards, the author
// stays in pullAuthorsKey for good, so the posts that were pulled stay
// merged, and new posts are pushed as well. Live home subscriptions (see
// Hub) listen to the user channels of the pulled authors their owner
// follows, and hear of an author newly added through pullChannel.
//
// # Follower buckets
//
// An account's followers set is one key, on one master of a cluster. Past
// Options.FollowerBucketThreshold the workers move the followers into
// Options.FollowerBuckets sorted sets with hash tags of their own, with no
// downtime: a job in the fan-out stream copies them a batch at a time
// while follows and unfollows write both the one set and the buckets, with
// tombstones so that the copy cannot bring back a follower who left, and
// then switches readers to the buckets in one step. The followers side
// still mirrors the following sets, which stay the truth. Counts sum the
// buckets, pages merge them, fan-out walks them in turn. buckets.go has the
// argument.
//
// # Inactive users
//
// Most of a big account's followers are not reading. Fan-out skips a
// follower who has not been seen (made an authenticated request) for
// Options.InactiveAfter: deliverScript compares the follower's seenKey with
// a cutoff, in the follower's slot with the rest of the delivery. When the
// follower comes back, the request that sees them first finds them inactive
// and rebuilds their home timeline from the people they follow before it
// goes on (rebuildHome), so the read that follows is complete. A request
// waits for the record of its visit only briefly, though (seenSoon): a
// master that does not answer must not hold up every signed-in request
// for a best-effort write, which then finishes in the background; a
// rebuild, once Redis has said it is needed, is waited for.
//
// A user with no seenKey (one from before Warble recorded it) counts as
// active, so that turning this on needs no migration. Recording is cheap:
// each process writes a user's seenKey at most once per seenEvery.
//
// The home timeline of an inactive user is then only memory, so the
// sweeping worker of each process drops it (dropIdleHomes), finding the
// users in a seen index per fan-out shard rather than by SCAN, and marks
// the user seen at 0, so that the next request rebuilds all of it. The
// drop checks seenKey in the step that drops, so it cannot take the
// timeline of a user who is back; inactive.go has the argument.
//
// # Compact timelines
//
// listpack.go: a home timeline kept as a listpack takes a quarter of the
// memory of a skiplist. Warble checks at start that Redis's limit allows
// its cap and the slack of deliveries (homeSlack): a follower's
// deliveries, raw or by script, trim one add in rawTrimEvery, and the
// other scripts that write a home timeline never take it past its cap, so
// that it stays one. Readers never see past the cap (clampHome).
//
// # Live timelines
//
// Hub implements warble.LiveService over one Redis pub/sub connection per
// process, shared by every subscription. On a Redis Cluster, timeline
// events are shard messages (SPUBLISH, from the script that writes the
// timeline, on a channel in the timeline's slot), which only the master of
// that slot carries, and the hub holds one connection per master that
// serves one of its channels (hub_conns.go): it follows the slots when
// they move or a master fails over, and its channels' listeners get a
// RESYNC then, as after a reconnect.
//
// Each timeline channel with local listeners has one hubChannel
// (hub_channels.go): a SUBSCRIBE when its first listener arrives, an
// UNSUBSCRIBE when its last one leaves, and a mailbox of its messages that
// one goroutine at a time turns into events (a goroutine started when the
// mailbox gets something and gone when it is empty: most channels on a
// server with thousands of sockets are idle home timelines). That
// goroutine keeps POST_ADDED events in
// increasing cursor order for all of the channel's listeners at once: on an
// "A seq" above the highest seq it has dispatched, it reads everything newer
// from the timeline's sorted set, the truth, and dispatches that in order,
// so posts that published out of order still arrive in order, and a post
// that lands below what was already dispatched becomes a RESYNC rather than
// an event out of order. A home channel (not merged with pulled accounts)
// dispatches the announced post without that read, since every add to a
// home timeline is announced in the step that adds it (hubChannel.added):
// for a post announced after a newer one, that always means a RESYNC.
// When the channel starts (and after a reconnect) it reads the newest seq
// and publishes a marker on the channel in one step; messages that arrive
// before the marker announce posts that the read saw, and are dropped.
//
// Each subscription (hub_subscribers.go) has a bounded queue, and a
// goroutine that feeds the channel its caller reads while the queue holds
// something (an idle subscription has none: thousands of sockets sit idle
// on a server). A channel runs those goroutines in waves
// (hub_deliveries.go), so that a post to thousands of subscribers of one
// channel does not keep the others waiting behind it, and a subscriber
// that stalls leaves its wave. Dispatch never blocks: a full queue is
// replaced by a RESYNC. A subscription with after: subscribes first, then
// replays from the sorted set, then drops live events at or below the last
// replayed position: no gap, no duplicate.
//
// A home timeline also shows the posts of the pulled accounts its owner
// follows, which are announced on those accounts' user channels, not on the
// home channel. So a home channel's goroutine reads the merged timeline as
// its truth, and routes: the hub subscribes to the user channels of those
// accounts for it (once per process, however many home channels want one)
// and hands it their messages too, which make it read the merged timeline as
// its own do. Its routes are read again at each start, on each RESYNC
// message (a follow or unfollow) and when an account is newly pulled
// (pullChannel).
//
// The hub also ends the contexts of sessions that are revoked
// (hub_sessions.go), and tells its own SUBSCRIBE confirmations from those of
// go-redis reconnecting, after which every channel sends RESYNC
// (hub_reconnect.go).
package redisdb
