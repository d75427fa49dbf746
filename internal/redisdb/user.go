package redisdb

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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

// FindUserCounts implements warble.UserService.
func (s *UserService) FindUserCounts(ctx context.Context, ids []string) ([]warble.UserCounts, error) {
	return s.db.findUserCounts(ctx, ids)
}

// findUser reads one user, or returns ENOTFOUND.
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

// findUsers reads users in one round trip, an HMGET each. The result is in
// the order of ids, nil where there is no such user.
func (db *DB) findUsers(ctx context.Context, ids []string) ([]*warble.User, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := db.client.Pipeline()
	reads := newHashReads(len(ids))
	users := db.queueUsers(ctx, reads, ids)
	reads.queue(ctx, pipe)
	if pipe.Len() == 0 {
		return make([]*warble.User, len(ids)), nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("find %d users: %w", len(ids), err)
	}
	return users(ctx)
}

// queueUsers queues findUsers' commands on reads, and returns what reads
// their answers once the pipeline they went in has run, which costs no
// round trip more.
func (db *DB) queueUsers(ctx context.Context, reads *hashReads, ids []string) func(context.Context) ([]*warble.User, error) {
	cmds := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		if warble.ValidUserID(id) {
			cmds[i] = reads.add(ctx, userKey(id), "username", "displayName", "createdAt")
		}
	}
	return func(context.Context) ([]*warble.User, error) {
		users := make([]*warble.User, len(ids))
		found := make([]warble.User, len(ids)) // one allocation for them all
		for i, id := range ids {
			if cmds[i] == nil {
				continue
			}
			vals := cmds[i].Val()
			username, _ := vals[0].(string)
			if username == "" {
				continue // HMGET of a missing hash is all nils
			}
			displayName, _ := vals[1].(string)
			createdAt, _ := vals[2].(string)
			found[i] = warble.User{ID: id, Username: username, DisplayName: displayName, CreatedAt: msTime(createdAt)}
			users[i] = &found[i]
		}
		return users, nil
	}
}

// findUserCounts reads the counts of users in one round trip: per user the
// ZCARDs of the sets its counts are sizes of, and a second round trip for
// users whose followers are in buckets, which sums the buckets' sizes.
func (db *DB) findUserCounts(ctx context.Context, ids []string) ([]warble.UserCounts, error) {
	type countCmds struct {
		followers, following, posts *redis.IntCmd
		fields                      *redis.SliceCmd // where the followers are; how many posts are archived
	}
	counts := make([]warble.UserCounts, len(ids))
	cmds := make([]countCmds, len(ids))
	pipe := db.client.Pipeline()
	for i, id := range ids {
		if !warble.ValidUserID(id) {
			continue
		}
		// The followers count before the field that says where the
		// followers are: a count read after the one set was deleted comes
		// with a state that says they moved (see buckets.go).
		followers := pipe.ZCard(ctx, followersKey(id))
		cmds[i] = countCmds{
			followers: followers,
			fields:    pipe.HMGet(ctx, userKey(id), followerBucketsField, archivedPostsField),
			following: pipe.ZCard(ctx, followingKey(id)),
			posts:     pipe.ZCard(ctx, postsKey(id)),
		}
	}
	if pipe.Len() == 0 {
		return counts, nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("count %d users: %w", len(ids), err)
	}
	var bucketed []int // indexes of users whose followers are in buckets
	var buckets []int  // how many, for each
	for i, c := range cmds {
		if c.followers == nil {
			continue
		}
		fields := c.fields.Val()
		state, _ := fields[0].(string)
		// Posts moved to the archive count as much as those in Redis.
		archived, _ := fields[1].(string)
		archivedN, _ := strconv.Atoi(archived)
		counts[i] = warble.UserCounts{Followers: int(c.followers.Val()), Following: int(c.following.Val()), Posts: int(c.posts.Val()) + archivedN}
		if n := parseFollowerState(state).buckets; n > 0 {
			bucketed, buckets = append(bucketed, i), append(buckets, n)
		}
	}
	if len(bucketed) == 0 {
		return counts, nil
	}
	pipe = db.client.Pipeline()
	cards := make([][]*redis.IntCmd, len(bucketed))
	for j, i := range bucketed {
		for _, key := range followersSet(ids[i], buckets[j]).keys {
			cards[j] = append(cards[j], pipe.ZCard(ctx, key))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("count followers in buckets: %w", err)
	}
	for j, i := range bucketed {
		counts[i].Followers = 0
		for _, c := range cards[j] {
			counts[i].Followers += int(c.Val())
		}
	}
	return counts, nil
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
