package redisdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/warble"
)

// This file holds helpers for the load tool (internal/loadtest): raw reads
// and writes that measure Redis itself or seed large graphs quickly. They
// are not services: they skip the checks and the announcements that the
// services make, and are meant for a database that holds nothing else.

// rawChunk is how many users or follows one pipeline of the seeding helpers
// writes.
const rawChunk = 1000

// RawSignups creates users straight in Redis, rawChunk users per pipeline,
// in the layout Signup writes: the user hash w:u:{<id>} (username,
// displayName = username, createdAt, password), the username claim
// w:uname:<lowercase name> without expiry, the ids from w:seq:user (one
// INCRBY for all of them), the capped newest-users set and, unless the DB
// skips no inactive users, w:u:{<id>}:seen (now), so that fan-out counts
// them as active. All share one
// bcrypt hash of password, made once at the DB's cost, so that each can log
// in with it. It opens no sessions. It returns the ids in the order of
// usernames. A username that is invalid fails the call before anything is
// written; one that is taken fails it after the chunk holding it was
// written.
func (db *DB) RawSignups(ctx context.Context, usernames []string, password string) ([]string, error) {
	return db.rawSignups(ctx, usernames, password, rawChunk)
}

// rawSignups is RawSignups with chunk users per pipeline.
func (db *DB) rawSignups(ctx context.Context, usernames []string, password string, chunk int) ([]string, error) {
	if len(usernames) == 0 {
		return nil, nil
	}
	for _, name := range usernames {
		if err := warble.ValidateUsername(name); err != nil {
			return nil, fmt.Errorf("raw signup %q: %w", name, err)
		}
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), db.opts.BcryptCost)
	if err != nil {
		return nil, fmt.Errorf("raw signups: hash password: %w", err)
	}
	last, err := db.client.IncrBy(ctx, userSeqKey, int64(len(usernames))).Result()
	if err != nil {
		return nil, fmt.Errorf("raw signups: new user ids: %w", err)
	}
	first := last - int64(len(usernames)) + 1
	ids := make([]string, len(usernames))
	for i := range ids {
		ids[i] = fmt.Sprint(first + int64(i))
	}
	createdAt := msString(db.now())
	for start := 0; start < len(usernames); start += chunk {
		end := min(start+chunk, len(usernames))
		pipe := db.client.Pipeline()
		claims := make([]*redis.BoolCmd, 0, end-start)
		for i := start; i < end; i++ {
			name, id := usernames[i], ids[i]
			claims = append(claims, pipe.SetNX(ctx, usernameKey(warble.UsernameKey(name)), id, 0))
			pipe.HSet(ctx, userKey(id), "username", name, "displayName", name, "createdAt", createdAt, "password", string(hash))
			pipe.ZAdd(ctx, newestUsersKey, redis.Z{Score: float64(first + int64(i)), Member: id})
			if db.opts.InactiveAfter >= 0 {
				pipe.Set(ctx, seenKey(id), createdAt, 0) // seen now, as by the signup request
			}
		}
		pipe.ZRemRangeByRank(ctx, newestUsersKey, 0, -int64(DefaultNewestCap+1))
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

// RawFollows makes each of followerIDs follow followeeID straight in Redis,
// rawChunk follows per pipeline, in the layout Follow leaves: the
// follower's following set and the followee's followers set, both scored
// by the same follow time (unix ms: the last follower follows now, each
// earlier one a millisecond before the next, so that no two tie), and the
// followee's newest posts copied into the follower's home timeline, capped.
// A follow that exists already keeps its time. It checks that the ids are
// well formed and that the followee exists, but not the following limit,
// and it announces nothing.
func (db *DB) RawFollows(ctx context.Context, followeeID string, followerIDs []string) error {
	return db.rawFollows(ctx, followeeID, followerIDs, rawChunk)
}

// rawFollows is RawFollows with chunk follows per pipeline.
func (db *DB) rawFollows(ctx context.Context, followeeID string, followerIDs []string, chunk int) error {
	if !warble.ValidUserID(followeeID) {
		return errBadUserID
	}
	for _, f := range followerIDs {
		if !warble.ValidUserID(f) {
			return errBadUserID
		} else if f == followeeID {
			return errFollowSelf
		}
	}
	if n, err := db.client.Exists(ctx, userKey(followeeID)).Result(); err != nil {
		return fmt.Errorf("raw follows of %s: %w", followeeID, err)
	} else if n == 0 {
		return errNoUser
	}
	posts, err := db.client.ZRevRangeWithScores(ctx, postsKey(followeeID), 0, int64(db.opts.HomeCap-1)).Result()
	if err != nil {
		return fmt.Errorf("raw follows of %s: read posts: %w", followeeID, err)
	}
	now := db.now().UnixMilli()
	for start := 0; start < len(followerIDs); start += chunk {
		end := min(start+chunk, len(followerIDs))
		pipe := db.client.Pipeline()
		for i := start; i < end; i++ {
			f := followerIDs[i]
			at := float64(now - int64(len(followerIDs)-1-i))
			pipe.ZAddNX(ctx, followingKey(f), redis.Z{Score: at, Member: followeeID})
			pipe.ZAddNX(ctx, followersKey(followeeID), redis.Z{Score: at, Member: f})
			if len(posts) > 0 {
				pipe.ZAdd(ctx, homeKey(f), posts...)
				pipe.ZRemRangeByRank(ctx, homeKey(f), 0, -int64(db.opts.HomeCap+1))
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("raw follows of %s: %w", followeeID, err)
		}
	}
	return nil
}

// RawHomePage reads the newest n posts of a user's home timeline with their
// authors' usernames as directly as go-redis allows: one range read, one
// pipeline of the posts, one pipeline of the distinct authors. It returns
// how many posts it read. It is the load tool's ceiling for a home page
// (internal/loadtest), not a service: it skips the domain types and the
// counts that a GraphQL User carries.
func (db *DB) RawHomePage(ctx context.Context, userID string, n int) (int, error) {
	ids, err := db.client.ZRangeArgs(ctx, redis.ZRangeArgs{Key: homeKey(userID), Start: 0, Stop: n - 1, Rev: true}).Result()
	if err != nil {
		return 0, fmt.Errorf("raw home page of %s: %w", userID, err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	pipe := db.client.Pipeline()
	authors := make(map[string]bool)
	for _, id := range ids {
		if author, seq, ok := splitPostID(id); ok {
			pipe.HMGet(ctx, postKey(author, seq), "body", "createdAt")
			authors[author] = true
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("raw home page posts: %w", err)
	}
	pipe = db.client.Pipeline()
	for author := range authors {
		pipe.HMGet(ctx, userKey(author), "username", "displayName")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("raw home page authors: %w", err)
	}
	return len(ids), nil
}

// FanOutWatch follows one post on its way to the home timelines of its
// author's followers, for the load tool to time fan-out end to end. The
// followers are read once, when the watch is made, so that reading them does
// not delay the first look after the post is made.
type FanOutWatch struct {
	db        *DB
	followers []string // in the order fan-out walks them
	post      string
	left      []string // not yet seen holding post, in walk order
}

// watchChunk is how many home timelines one round trip of Poll looks at.
const watchChunk = 256

// WatchFanOut returns a watch over the followers authorID has now. Call
// Reset with a post id before Poll.
func (db *DB) WatchFanOut(ctx context.Context, authorID string) (*FanOutWatch, error) {
	// By score, then member: the order followerChunk walks.
	followers, err := db.client.ZRange(ctx, followersKey(authorID), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("followers of %s: %w", authorID, err)
	}
	return &FanOutWatch{db: db, followers: followers}, nil
}

// Followers reports how many followers the watch covers.
func (w *FanOutWatch) Followers() int { return len(w.followers) }

// Reset starts watching for postID, with no follower seen holding it.
func (w *FanOutWatch) Reset(postID string) {
	w.post = postID
	w.left = append(w.left[:0], w.followers...)
}

// Poll looks at the home timelines of the followers not yet seen holding
// the post, in the order fan-out walks them, watchChunk per round trip
// (ZSCOREs in a pipeline), and stops after the first round trip that finds
// one without it: the rest are most likely without it too, and are looked
// at again by the next Poll. A timeline seen holding the post is not looked
// at again. Poll returns how many followers are left; 0 means every
// follower's home timeline held the post when Poll looked.
func (w *FanOutWatch) Poll(ctx context.Context) (int, error) {
	keep, i := 0, 0
	for i < len(w.left) {
		chunk := w.left[i:min(i+watchChunk, len(w.left))]
		pipe := w.db.client.Pipeline()
		cmds := make([]*redis.FloatCmd, len(chunk))
		for j, f := range chunk {
			cmds[j] = pipe.ZScore(ctx, homeKey(f), w.post)
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

// RawFanOut is the load tool's baseline for fan-out: it adds member to the
// home timelines of an author's followers with one pipeline of plain ZADDs,
// timed, then takes it off again (untimed). It returns how many timelines
// it wrote and how long the ZADDs took.
func (db *DB) RawFanOut(ctx context.Context, authorID, member string) (int, time.Duration, error) {
	followers, err := db.client.ZRange(ctx, followersKey(authorID), 0, -1).Result()
	if err != nil {
		return 0, 0, fmt.Errorf("followers of %s: %w", authorID, err)
	}
	start := time.Now()
	pipe := db.client.Pipeline()
	for _, f := range followers {
		pipe.ZAdd(ctx, homeKey(f), redis.Z{Score: 0, Member: member})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, fmt.Errorf("raw fan-out: %w", err)
	}
	took := time.Since(start)
	pipe = db.client.Pipeline()
	for _, f := range followers {
		pipe.ZRem(ctx, homeKey(f), member)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, 0, fmt.Errorf("raw fan-out cleanup: %w", err)
	}
	return len(followers), took, nil
}
