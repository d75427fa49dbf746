package redisdb

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limits of the persisted query cache.
const (
	persistedQueryTTL = 24 * time.Hour
	// maxPersistedQuery is the longest query kept. Anyone may store a
	// query under its hash, before it is even parsed, so this bounds what
	// one request can make Redis hold; Warble's longest useful queries are
	// a few kilobytes.
	maxPersistedQuery = 32 << 10
)

// PersistedQueries is the cache of automatic persisted queries: query
// documents by the SHA-256 of their text, so that clients may send the hash
// alone. It has the methods of gqlgen's graphql.Cache[string], and is shared
// by every process on the Redis. An entry lives a day after it was last
// stored or used.
type PersistedQueries struct{ db *DB }

// NewPersistedQueries returns the cache over db's client.
func NewPersistedQueries(db *DB) *PersistedQueries { return &PersistedQueries{db: db} }

// Get returns the query stored under hash, and refreshes its expiry.
func (c *PersistedQueries) Get(ctx context.Context, hash string) (string, bool) {
	if !validQueryHash(hash) {
		return "", false
	}
	q, err := c.db.client.GetEx(ctx, persistedQueryKey(hash), persistedQueryTTL).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			// The client sends the full query next, as after any miss.
			c.db.log.WarnContext(ctx, "read persisted query", "err", err)
		}
		return "", false
	}
	return q, true
}

// Add stores query under hash, which gqlgen has checked is its SHA-256.
func (c *PersistedQueries) Add(ctx context.Context, hash, query string) {
	if !validQueryHash(hash) || len(query) > maxPersistedQuery {
		return
	}
	if err := c.db.client.Set(ctx, persistedQueryKey(hash), query, persistedQueryTTL).Err(); err != nil {
		c.db.log.WarnContext(ctx, "store persisted query", "err", err)
	}
}

// validQueryHash reports whether hash is a SHA-256 in lowercase hex.
func validQueryHash(hash string) bool {
	if len(hash) != 64 {
		return false
	}
	for i := 0; i < len(hash); i++ {
		if c := hash[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
