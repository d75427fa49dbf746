package warble

import (
	"context"
	"time"
)

// DefaultMaxFollowing is how many users one user may follow by default.
const DefaultMaxFollowing = 2000

// FollowInput names the user to follow or unfollow.
type FollowInput struct {
	UserID string
}

// FollowPayload is the answer to follow and unfollow: both users as they are
// afterwards.
type FollowPayload struct {
	User   *User
	Viewer *User
}

// FollowState is how the viewer and another user follow each other.
type FollowState struct {
	ViewerFollows bool // the viewer follows the user
	FollowsViewer bool // the user follows the viewer
}

// UserConnection is a page of users, such as someone's followers.
type UserConnection struct {
	Edges    []*UserEdge
	PageInfo PageInfo

	// Total is the size of the whole list when it was cheap to know. Where
	// knowing it costs a walk of a set, Count computes it instead, and only
	// if a client asks for it.
	Total int
	Count func(ctx context.Context) (int, error)
}

// TotalCount returns the size of the whole list, not just this page.
func (c *UserConnection) TotalCount(ctx context.Context) (int, error) {
	if c.Count != nil {
		return c.Count(ctx)
	}
	return c.Total, nil
}

// UserEdge is one user in a UserConnection.
type UserEdge struct {
	Cursor     string
	Node       *User
	FollowedAt *time.Time // when the follow this edge stands for was made
}

// FollowService manages who follows whom.
type FollowService interface {
	// Follow makes followerID follow followeeID and copies the followee's
	// recent posts into the follower's home timeline. Following someone
	// already followed changes nothing. Following oneself or past the
	// following limit is EINVALID; an unknown followee is ENOTFOUND.
	Follow(ctx context.Context, followerID, followeeID string) error

	// Unfollow undoes Follow and removes the followee's posts from the
	// follower's home timeline. Unfollowing someone not followed changes nothing.
	Unfollow(ctx context.Context, followerID, followeeID string) error

	// IsFollowing reports whether followerID follows followeeID.
	IsFollowing(ctx context.Context, followerID, followeeID string) (bool, error)

	// FindFollowStates returns, in one batch, whether viewerID follows
	// each of userIDs and whether each follows viewerID, in their order.
	FindFollowStates(ctx context.Context, viewerID string, userIDs []string) ([]FollowState, error)

	// FindFollowers returns who follows userID, newest follow first.
	FindFollowers(ctx context.Context, userID string, page PageArgs) (*UserConnection, error)

	// FindFollowing returns whom userID follows, newest follow first.
	FindFollowing(ctx context.Context, userID string, page PageArgs) (*UserConnection, error)

	// FindCommonFollowers returns users who follow both viewerID and userID.
	FindCommonFollowers(ctx context.Context, viewerID, userID string, page PageArgs) (*UserConnection, error)

	// FindCommonFollowing returns users whom both viewerID and userID follow.
	FindCommonFollowing(ctx context.Context, viewerID, userID string, page PageArgs) (*UserConnection, error)

	// FindFollowersYouFollow returns userID's followers whom viewerID follows.
	FindFollowersYouFollow(ctx context.Context, viewerID, userID string, page PageArgs) (*UserConnection, error)
}
