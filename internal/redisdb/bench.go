package redisdb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

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

// FanOutProgress reports how many of an author's followers have postID in
// their home timelines, out of how many followers: the load tool polls it
// to time fan-out end to end. One pipeline of ZSCOREs, after one read of
// the followers.
func (db *DB) FanOutProgress(ctx context.Context, authorID, postID string) (done, total int, err error) {
	followers, err := db.client.ZRange(ctx, followersKey(authorID), 0, -1).Result()
	if err != nil {
		return 0, 0, fmt.Errorf("followers of %s: %w", authorID, err)
	}
	pipe := db.client.Pipeline()
	cmds := make([]*redis.FloatCmd, len(followers))
	for i, f := range followers {
		cmds[i] = pipe.ZScore(ctx, homeKey(f), postID)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("fan-out progress of %s: %w", postID, err)
	}
	for _, c := range cmds {
		if c.Err() == nil {
			done++
		}
	}
	return done, len(followers), nil
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
