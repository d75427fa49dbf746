package redisdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/warble"
)

// UserService implements warble.UserService.
type UserService struct{ db *DB }

// NewUserService returns a UserService over db.
func NewUserService(db *DB) *UserService { return &UserService{db: db} }

var _ warble.UserService = (*UserService)(nil)

// FindUserByID implements warble.UserService.
func (s *UserService) FindUserByID(ctx context.Context, id string) (*warble.User, error) {
	return s.db.findUser(ctx, id)
}

// FindUserByUsername implements warble.UserService.
func (s *UserService) FindUserByUsername(ctx context.Context, username string) (*warble.User, error) {
	if warble.ValidateUsername(username) != nil {
		return nil, warble.Errorf(warble.ENOTFOUND, "User not found.")
	}
	// A profile may be read from a replica (see Options.ReplicaReads).
	db := s.db.lagging
	id, err := db.client.Get(ctx, usernameKey(warble.UsernameKey(username))).Result()
	if errors.Is(err, redis.Nil) {
		return nil, warble.Errorf(warble.ENOTFOUND, "User not found.")
	} else if err != nil {
		return nil, fmt.Errorf("find user %q: %w", username, err)
	}
	return db.findUser(ctx, id)
}

// FindUsersByIDs implements warble.UserService.
func (s *UserService) FindUsersByIDs(ctx context.Context, ids []string) ([]*warble.User, error) {
	return s.db.findUsers(ctx, ids)
}

// NewestUsers implements warble.UserService.
func (s *UserService) NewestUsers(ctx context.Context, n int) ([]*warble.User, error) {
	db := s.db.lagging // may be read from a replica (see Options.ReplicaReads)
	ids, err := db.client.ZRevRange(ctx, newestUsersKey, 0, int64(n-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("newest users: %w", err)
	}
	users, err := db.findUsers(ctx, ids)
	if err != nil {
		return nil, err
	}
	return compactUsers(users), nil
}

// findUser reads one user with its counts, or returns ENOTFOUND.
func (db *DB) findUser(ctx context.Context, id string) (*warble.User, error) {
	if !warble.ValidUserID(id) {
		return nil, warble.Errorf(warble.ENOTFOUND, "User not found.")
	}
	users, err := db.findUsers(ctx, []string{id})
	if err != nil {
		return nil, err
	} else if users[0] == nil {
		return nil, warble.Errorf(warble.ENOTFOUND, "User not found.")
	}
	return users[0], nil
}

// findUsers reads users and their counts in one round trip: per user an
// HMGET of its fields and the ZCARDs of the sets its counts are sizes of.
// The result is in the order of ids, nil where there is no such user.
func (db *DB) findUsers(ctx context.Context, ids []string) ([]*warble.User, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := db.client.Pipeline()
	users := queueUsers(ctx, pipe, ids)
	if pipe.Len() == 0 {
		return make([]*warble.User, len(ids)), nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("find %d users: %w", len(ids), err)
	}
	return users(), nil
}

// queueUsers queues findUsers' commands on pipe, and returns what reads
// their answers once pipe has run.
func queueUsers(ctx context.Context, pipe redis.Pipeliner, ids []string) func() []*warble.User {
	type userCmds struct {
		fields                         *redis.SliceCmd
		followers, following, postsCnt *redis.IntCmd
	}
	cmds := make([]userCmds, len(ids))
	for i, id := range ids {
		if !warble.ValidUserID(id) {
			continue
		}
		cmds[i] = userCmds{
			fields:    pipe.HMGet(ctx, userKey(id), "username", "displayName", "createdAt"),
			followers: pipe.ZCard(ctx, followersKey(id)),
			following: pipe.ZCard(ctx, followingKey(id)),
			postsCnt:  pipe.ZCard(ctx, postsKey(id)),
		}
	}
	return func() []*warble.User {
		users := make([]*warble.User, len(ids))
		for i, id := range ids {
			c := cmds[i]
			if c.fields == nil {
				continue
			}
			vals := c.fields.Val()
			username, _ := vals[0].(string)
			if username == "" {
				continue // HMGET of a missing hash is all nils
			}
			displayName, _ := vals[1].(string)
			createdAt, _ := vals[2].(string)
			users[i] = &warble.User{
				ID:             id,
				Username:       username,
				DisplayName:    displayName,
				CreatedAt:      msTime(createdAt),
				FollowersCount: int(c.followers.Val()),
				FollowingCount: int(c.following.Val()),
				PostsCount:     int(c.postsCnt.Val()),
			}
		}
		return users
	}
}

// compactUsers drops the nil entries of users.
func compactUsers(users []*warble.User) []*warble.User {
	out := users[:0]
	for _, u := range users {
		if u != nil {
			out = append(out, u)
		}
	}
	return out
}
