package redisdb

import (
	"context"
	"fmt"

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
