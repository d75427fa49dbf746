package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/warble"
)

// rawDB reads and writes Warble's data straight in Redis, through the keys
// of redisdb.Keys: it seeds graphs too large to build through the services
// quickly (a hundred thousand bcrypt signups would take minutes), and it
// measures Redis itself, the ceiling the server is compared with. It is not
// a service: it skips the checks and the announcements that the services
// make, and is meant for a database that holds nothing else.
// TestRawSeedMatchesServices checks that it writes what the services write.
type rawDB struct {
	client     redis.UniversalClient
	homeCap    int  // the server's HOME_TIMELINE_CAP
	bcryptCost int  // cost of the one password hash all users share
	markSeen   bool // the server skips inactive users: seed users as seen now, and index them
	// fanOutShards is the server's FANOUT_SHARDS, which spread the seen
	// index too: its default.
	fanOutShards int
	now          func() time.Time // the clock; tests pin it
	chunk        int              // users or follows one pipeline writes
	// bucketThreshold and buckets are the server's
	// FOLLOWERS_BUCKET_THRESHOLD (-1: off) and FOLLOWERS_BUCKETS: an
	// account with more followers has them in buckets.
	bucketThreshold, buckets int
}

// newRawDB returns a rawDB over client for a server with the default
// settings: follower buckets past the default threshold on a cluster,
// none on one Redis.
func newRawDB(client redis.UniversalClient) *rawDB {
	threshold, shards := -1, 1
	if _, ok := client.(*redis.ClusterClient); ok {
		threshold, shards = redisdb.DefaultFollowerBucketThreshold, redisdb.DefaultClusterFanOutShards
	}
	return &rawDB{
		client:          client,
		homeCap:         redisdb.DefaultHomeCap,
		bcryptCost:      bcrypt.MinCost,
		markSeen:        true,
		now:             time.Now,
		chunk:           1000,
		bucketThreshold: threshold,
		buckets:         redisdb.DefaultFollowerBuckets,
		fanOutShards:    shards,
	}
}

var keys = redisdb.Keys

// nowMS is the raw writer's clock in unix ms, as Warble stores times.
func (r *rawDB) nowMS() int64 { return r.now().UTC().Truncate(time.Millisecond).UnixMilli() }

// signups creates users straight in Redis, in the layout Signup writes:
// the user hash (username, displayName = username, createdAt, password),
// the username claim without expiry, ids from the user counter (one INCRBY
// for all of them), the capped newest-users set and, if markSeen, the
// user's seen time (now), so that fan-out counts them as active. All share
// one bcrypt hash of password, so that each can log in with it. It opens no
// sessions. It returns the ids in the order of usernames. An invalid
// username fails the call before anything is written; a taken one fails it
// after the pipeline holding it was written.
func (r *rawDB) signups(ctx context.Context, usernames []string, password string) ([]string, error) {
	if len(usernames) == 0 {
		return nil, nil
	}
	for _, name := range usernames {
		if err := warble.ValidateUsername(name); err != nil {
			return nil, fmt.Errorf("raw signup %q: %w", name, err)
		}
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), r.bcryptCost)
	if err != nil {
		return nil, fmt.Errorf("raw signups: hash password: %w", err)
	}
	last, err := r.client.IncrBy(ctx, keys.UserSeq(), int64(len(usernames))).Result()
	if err != nil {
		return nil, fmt.Errorf("raw signups: new user ids: %w", err)
	}
	first := last - int64(len(usernames)) + 1
	ids := make([]string, len(usernames))
	for i := range ids {
		ids[i] = strconv.FormatInt(first+int64(i), 10)
	}
	nowMS := r.nowMS()
	createdAt := strconv.FormatInt(nowMS, 10)
	for start := 0; start < len(usernames); start += r.chunk {
		end := min(start+r.chunk, len(usernames))
		pipe := r.client.Pipeline()
		claims := make([]*redis.BoolCmd, 0, end-start)
		for i := start; i < end; i++ {
			name, id := usernames[i], ids[i]
			claims = append(claims, pipe.SetNX(ctx, keys.Username(name), id, 0))
			pipe.HSet(ctx, keys.User(id), "username", name, "displayName", name, "createdAt", createdAt, "password", string(hash))
			pipe.ZAdd(ctx, keys.NewestUsers(), redis.Z{Score: float64(first + int64(i)), Member: id})
			if r.markSeen {
				pipe.Set(ctx, keys.Seen(id), createdAt, 0) // seen now, as by the signup request
				pipe.ZAdd(ctx, keys.SeenIndex(id, r.fanOutShards), redis.Z{Score: float64(nowMS), Member: id})
			}
		}
		pipe.ZRemRangeByRank(ctx, keys.NewestUsers(), 0, -int64(redisdb.DefaultNewestCap+1))
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("raw signups: %w", err)
		}
		for i, c := range claims {
			if !c.Val() {
				return nil, fmt.Errorf("raw signup %q: username is taken", usernames[start+i])
			}
		}
	}
	return ids, nil
}

// follows makes each of followerIDs follow followeeID straight in Redis, in
// the layout Follow leaves (once the workers are done): the follower's
// following set and the followee's followers, both scored by the same
// follow time (unix ms: the last follower follows now, each earlier one a
// millisecond before the next, so that no two tie), and the followee's
// newest posts copied into the follower's home timeline, capped. Followers
// past bucketThreshold go into buckets, as the workers would move them:
// straight there when the followee had none, else moved once the follows
// are written. A follow that exists already keeps its time. It checks that
// the ids are well formed and that the followee exists, but not the
// following limit, and it announces nothing.
func (r *rawDB) follows(ctx context.Context, followeeID string, followerIDs []string) error {
	if !warble.ValidUserID(followeeID) {
		return fmt.Errorf("raw follows: malformed user id %q", followeeID)
	}
	for _, f := range followerIDs {
		if !warble.ValidUserID(f) || f == followeeID {
			return fmt.Errorf("raw follows of %s: bad follower id %q", followeeID, f)
		}
	}
	if n, err := r.client.Exists(ctx, keys.User(followeeID)).Result(); err != nil {
		return fmt.Errorf("raw follows of %s: %w", followeeID, err)
	} else if n == 0 {
		return fmt.Errorf("raw follows of %s: no such user", followeeID)
	}
	posts, err := r.client.ZRevRangeWithScores(ctx, keys.Posts(followeeID), 0, int64(r.homeCap-1)).Result()
	if err != nil {
		return fmt.Errorf("raw follows of %s: read posts: %w", followeeID, err)
	}
	buckets, had, err := r.followerBuckets(ctx, followeeID)
	if err != nil {
		return fmt.Errorf("raw follows of %s: %w", followeeID, err)
	}
	if buckets == 0 && had == 0 && r.bucketThreshold >= 0 && distinct(followerIDs) > r.bucketThreshold {
		buckets = r.buckets
		field, value := keys.BucketedFollowers(buckets)
		if err := r.client.HSet(ctx, keys.User(followeeID), field, value).Err(); err != nil {
			return fmt.Errorf("raw follows of %s: %w", followeeID, err)
		}
	}
	followersKey := func(f string) string {
		if buckets == 0 {
			return keys.Followers(followeeID)
		}
		return keys.FollowerBucket(followeeID, keys.BucketOf(f, buckets))
	}
	now := r.nowMS()
	if had == 0 && len(followerIDs) > 0 {
		// As the services mark a followers side whose first follower
		// they wrote into an empty set: fan-out delivers to it raw.
		first := now - int64(len(followerIDs)-1)
		if err := r.client.HSet(ctx, keys.User(followeeID), keys.FollowersChecked(), first).Err(); err != nil {
			return fmt.Errorf("raw follows of %s: %w", followeeID, err)
		}
	}
	for start := 0; start < len(followerIDs); start += r.chunk {
		end := min(start+r.chunk, len(followerIDs))
		pipe := r.client.Pipeline()
		for i := start; i < end; i++ {
			f := followerIDs[i]
			at := float64(now - int64(len(followerIDs)-1-i))
			pipe.ZAddNX(ctx, keys.Following(f), redis.Z{Score: at, Member: followeeID})
			pipe.ZAddNX(ctx, followersKey(f), redis.Z{Score: at, Member: f})
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: keys.FollowersLog(followeeID), Values: []any{"f", f}})
			if len(posts) > 0 {
				pipe.ZAdd(ctx, keys.Home(f), posts...)
				pipe.ZRemRangeByRank(ctx, keys.Home(f), 0, -int64(r.homeCap+1))
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("raw follows of %s: %w", followeeID, err)
		}
	}
	if buckets == 0 && r.bucketThreshold >= 0 {
		return r.moveToBuckets(ctx, followeeID)
	}
	return nil
}

// distinct returns how many different ids ids holds.
func distinct(ids []string) int {
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		seen[id] = true
	}
	return len(seen)
}

// followerBuckets returns how many buckets hold userID's followers (0:
// the one set), and how many followers the one set holds.
func (r *rawDB) followerBuckets(ctx context.Context, userID string) (buckets int, inSet int64, err error) {
	field, _ := keys.BucketedFollowers(0)
	pipe := r.client.Pipeline()
	card := pipe.ZCard(ctx, keys.Followers(userID))
	state := pipe.HGet(ctx, keys.User(userID), field)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, err
	}
	if n, err := strconv.Atoi(state.Val()); err == nil && n > 0 {
		return n, 0, nil
	}
	return 0, card.Val(), nil
}

// moveToBuckets moves userID's followers from the one set into buckets, as
// the workers do, if they are more than bucketThreshold.
func (r *rawDB) moveToBuckets(ctx context.Context, userID string) error {
	if n, err := r.client.ZCard(ctx, keys.Followers(userID)).Result(); err != nil {
		return fmt.Errorf("raw follows of %s: count followers: %w", userID, err)
	} else if n <= int64(r.bucketThreshold) {
		return nil
	}
	followers, err := r.client.ZRangeWithScores(ctx, keys.Followers(userID), 0, -1).Result()
	if err != nil {
		return fmt.Errorf("raw follows of %s: read followers: %w", userID, err)
	}
	for start := 0; start < len(followers); start += r.chunk {
		pipe := r.client.Pipeline()
		for _, z := range followers[start:min(start+r.chunk, len(followers))] {
			pipe.ZAddNX(ctx, keys.FollowerBucket(userID, keys.BucketOf(z.Member.(string), r.buckets)), z)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("raw follows of %s: into buckets: %w", userID, err)
		}
	}
	field, value := keys.BucketedFollowers(r.buckets)
	pipe := r.client.Pipeline()
	pipe.HSet(ctx, keys.User(userID), field, value)
	pipe.Del(ctx, keys.Followers(userID))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("raw follows of %s: into buckets: %w", userID, err)
	}
	return nil
}

// followersOf returns authorID's followers in the order fan-out walks
// them: by follow time, then id, in the one set or bucket after bucket.
func (r *rawDB) followersOf(ctx context.Context, authorID string) ([]string, error) {
	buckets, _, err := r.followerBuckets(ctx, authorID)
	if err != nil {
		return nil, fmt.Errorf("followers of %s: %w", authorID, err)
	}
	if buckets == 0 {
		return r.client.ZRange(ctx, keys.Followers(authorID), 0, -1).Result()
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.StringSliceCmd, buckets)
	for b := range cmds {
		cmds[b] = pipe.ZRange(ctx, keys.FollowerBucket(authorID, b), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("followers of %s: %w", authorID, err)
	}
	var out []string
	for _, c := range cmds {
		out = append(out, c.Val()...)
	}
	return out, nil
}

// homePage reads the newest n posts of a user's home timeline with their
// authors' usernames as directly as go-redis allows: one range read, one
// pipeline of the posts, one pipeline of the distinct authors. It returns
// how many posts it read. It is the ceiling a home page is compared with,
// not a service: it skips the domain types and the counts that a GraphQL
// User carries.
func (r *rawDB) homePage(ctx context.Context, userID string, n int) (int, error) {
	ids, err := r.client.ZRangeArgs(ctx, redis.ZRangeArgs{Key: keys.Home(userID), Start: 0, Stop: n - 1, Rev: true}).Result()
	if err != nil {
		return 0, fmt.Errorf("raw home page of %s: %w", userID, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	pipe := r.client.Pipeline()
	authors := make(map[string]bool)
	for _, id := range ids {
		if author, seq, ok := strings.Cut(id, ":"); ok {
			pipe.HMGet(ctx, keys.Post(author, seq), "body", "createdAt")
			authors[author] = true
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("raw home page posts: %w", err)
	}
	pipe = r.client.Pipeline()
	for author := range authors {
		pipe.HMGet(ctx, keys.User(author), "username", "displayName")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("raw home page authors: %w", err)
	}
	return len(ids), nil
}

// fanOut is the baseline for fan-out: it adds member to the home timelines
// of an author's followers with one pipeline of plain ZADDs, timed, then
// takes it off again (untimed). It returns how many timelines it wrote and
// how long the ZADDs took.
func (r *rawDB) fanOut(ctx context.Context, authorID, member string) (int, time.Duration, error) {
	followers, err := r.followersOf(ctx, authorID)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	pipe := r.client.Pipeline()
	for _, f := range followers {
		pipe.ZAdd(ctx, keys.Home(f), redis.Z{Score: 0, Member: member})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, fmt.Errorf("raw fan-out: %w", err)
	}
	took := time.Since(start)
	pipe = r.client.Pipeline()
	for _, f := range followers {
		pipe.ZRem(ctx, keys.Home(f), member)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, fmt.Errorf("raw fan-out cleanup: %w", err)
	}
	return len(followers), took, nil
}

// fanOutWatch follows one post on its way to the home timelines of its
// author's followers, to time fan-out end to end. The followers are read
// once, when the watch is made, so that reading them does not delay the
// first look after the post is made.
type fanOutWatch struct {
	client    redis.UniversalClient
	followers []string // in the order fan-out walks them
	post      string
	left      []string // not yet seen holding post, in walk order
}

// watchChunk is how many home timelines one round trip of poll looks at.
const watchChunk = 256

// watchFanOut returns a watch over the followers authorID has now. Call
// reset with a post id before poll.
func (r *rawDB) watchFanOut(ctx context.Context, authorID string) (*fanOutWatch, error) {
	followers, err := r.followersOf(ctx, authorID)
	if err != nil {
		return nil, err
	}
	return &fanOutWatch{client: r.client, followers: followers}, nil
}

// reset starts watching for postID, with no follower seen holding it.
func (w *fanOutWatch) reset(postID string) {
	w.post = postID
	w.left = append(w.left[:0], w.followers...)
}

// poll looks at the home timelines of the followers not yet seen holding
// the post, in the order fan-out walks them, watchChunk per round trip
// (ZSCOREs in a pipeline), and stops after the first round trip that finds
// one without it: the rest are most likely without it too, and are looked
// at again by the next poll. A timeline seen holding the post is not looked
// at again. poll returns how many followers are left; 0 means every
// follower's home timeline held the post when poll looked.
func (w *fanOutWatch) poll(ctx context.Context) (int, error) {
	keep, i := 0, 0
	for i < len(w.left) {
		chunk := w.left[i:min(i+watchChunk, len(w.left))]
		pipe := w.client.Pipeline()
		cmds := make([]*redis.FloatCmd, len(chunk))
		for j, f := range chunk {
			cmds[j] = pipe.ZScore(ctx, keys.Home(f), w.post)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return len(w.left), fmt.Errorf("fan-out progress of %s: %w", w.post, err)
		}
		missing := false
		for j, c := range cmds {
			if errors.Is(c.Err(), redis.Nil) {
				w.left[keep] = chunk[j]
				keep++
				missing = true
			} else if c.Err() != nil {
				return len(w.left), fmt.Errorf("fan-out progress of %s: %w", w.post, c.Err())
			}
		}
		i += len(chunk)
		if missing {
			break
		}
	}
	keep += copy(w.left[keep:], w.left[i:])
	w.left = w.left[:keep]
	return keep, nil
}
