// Package graph is Warble's GraphQL transport: thin resolvers over the
// domain services, the error presenter, and the websocket transport.
package graph

//go:generate go tool gqlgen generate
//go:generate go run gen_rewrite.go

import (
	"context"

	"github.com/warble/warble/internal/warble"
)

// Resolver holds the services resolvers call; server.go fills it in.
type Resolver struct {
	Users   warble.UserService
	Auth    warble.AuthService
	Posts   warble.PostService
	Follows warble.FollowService
	Live    warble.LiveService
}

// timeline reads a page of a feed.
func (r *Resolver) timeline(ctx context.Context, feed warble.Feed, first *int, after *string) (*warble.Timeline, error) {
	page, err := pageArgs(first, after, warble.DefaultPageSize)
	if err != nil {
		return nil, err
	}
	return r.Posts.FindTimeline(ctx, feed, page)
}

// changeFollow runs follow or unfollow for the viewer and answers with both
// users as they are afterwards, read in one batch.
func (r *Resolver) changeFollow(ctx context.Context, input warble.FollowInput,
	change func(ctx context.Context, followerID, followeeID string) error,
) (*warble.FollowPayload, error) {
	viewer, err := requireUser(ctx)
	if err != nil {
		return nil, err
	}
	if err := change(ctx, viewer.ID, input.UserID); err != nil {
		return nil, err
	}
	users, err := r.Users.FindUsersByIDs(ctx, []string{input.UserID, viewer.ID})
	if err != nil {
		return nil, err
	}
	if users[0] == nil || users[1] == nil {
		return nil, warble.Errorf(warble.ENOTFOUND, "User not found.")
	}
	return &warble.FollowPayload{User: users[0], Viewer: users[1]}, nil
}
