// Package graph is Warble's GraphQL transport: thin resolvers over the
// domain services, the error presenter, and the websocket adapter.
package graph

//go:generate go tool gqlgen generate

import "github.com/warble/warble/internal/warble"

// Resolver holds the services resolvers call; server.go fills it in.
type Resolver struct {
	Users   warble.UserService
	Auth    warble.AuthService
	Posts   warble.PostService
	Follows warble.FollowService
	Live    warble.LiveService
}
