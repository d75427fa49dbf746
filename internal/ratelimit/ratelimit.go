// Package ratelimit applies Warble's rate limits to its services. Each type
// here wraps a domain service and asks a warble.RateLimiter before the
// calls that cost or can be abused, so that neither the resolvers nor the
// storage know about limits, and RATE_LIMITS=off simply leaves them out.
package ratelimit

import (
	"context"

	"github.com/warble/warble/internal/warble"
)

// Kinds of events, as they name rate limit keys.
const (
	kindLoginUser = "login-user"
	kindLoginAddr = "login-addr"
	kindSignup    = "signup"
	kindPost      = "post"
	kindFollow    = "follow"
	kindWebsocket = "websocket"
)

// Auth limits failed logins per username and per client address, and
// signups per client address. AuthenticateForPost is the wrapped
// service's: the post's seq may be taken with the session, before the
// post's limit (Posts) is, so that a post costs three round trips rather
// than four; a post that the limit refuses leaves its seq unused, a gap in
// the seqs.
type Auth struct {
	warble.AuthService
	Limiter warble.RateLimiter
	Limits  warble.RateLimits
}

// Signup implements warble.AuthService.
func (a Auth) Signup(ctx context.Context, in warble.SignupInput) (*warble.AuthPayload, error) {
	if addr := warble.ClientAddressFromContext(ctx); addr != "" {
		if err := a.Limiter.Take(ctx, kindSignup, addr, a.Limits.SignupsPerAddress); err != nil {
			return nil, err
		}
	}
	return a.AuthService.Signup(ctx, in)
}

// Login implements warble.AuthService. Only wrong passwords count, and
// they are checked for before the password is, so that a guesser who is
// over the limit learns nothing from further tries. A username that does
// not exist counts like a wrong password, so that limits do not tell which
// usernames exist.
func (a Auth) Login(ctx context.Context, in warble.LoginInput) (*warble.AuthPayload, error) {
	name := warble.UsernameKey(in.Username)
	addr := warble.ClientAddressFromContext(ctx)
	if err := a.Limiter.Check(ctx, kindLoginUser, name, a.Limits.LoginFailuresPerUsername); err != nil {
		return nil, err
	}
	if addr != "" {
		if err := a.Limiter.Check(ctx, kindLoginAddr, addr, a.Limits.LoginFailuresPerAddress); err != nil {
			return nil, err
		}
	}
	p, err := a.AuthService.Login(ctx, in)
	if warble.ErrorCode(err) == warble.EUNAUTHENTICATED {
		// The answer to the caller is the wrong-login error either way;
		// a failure to count is the limiter's to report in its logs.
		_ = a.Limiter.Count(ctx, kindLoginUser, name, a.Limits.LoginFailuresPerUsername)
		if addr != "" {
			_ = a.Limiter.Count(ctx, kindLoginAddr, addr, a.Limits.LoginFailuresPerAddress)
		}
	}
	return p, err
}

// Posts limits new posts per user.
type Posts struct {
	warble.PostService
	Limiter warble.RateLimiter
	Limits  warble.RateLimits
}

// CreatePost implements warble.PostService.
func (p Posts) CreatePost(ctx context.Context, authorID, body string) (*warble.Post, error) {
	if err := p.Limiter.Take(ctx, kindPost, authorID, p.Limits.PostsPerUser); err != nil {
		return nil, err
	}
	return p.PostService.CreatePost(ctx, authorID, body)
}

// Follows limits follows and unfollows per user, together.
type Follows struct {
	warble.FollowService
	Limiter warble.RateLimiter
	Limits  warble.RateLimits
}

// Follow implements warble.FollowService.
func (f Follows) Follow(ctx context.Context, followerID, followeeID string) error {
	if err := f.Limiter.Take(ctx, kindFollow, followerID, f.Limits.FollowsPerUser); err != nil {
		return err
	}
	return f.FollowService.Follow(ctx, followerID, followeeID)
}

// Unfollow implements warble.FollowService.
func (f Follows) Unfollow(ctx context.Context, followerID, followeeID string) error {
	if err := f.Limiter.Take(ctx, kindFollow, followerID, f.Limits.FollowsPerUser); err != nil {
		return err
	}
	return f.FollowService.Unfollow(ctx, followerID, followeeID)
}

// Websockets limits the websocket connections a client address opens.
type Websockets struct {
	Limiter warble.RateLimiter
	Limits  warble.RateLimits
}

// Allow counts a new connection from addr and returns ERATELIMITED if it
// is one too many.
func (w Websockets) Allow(ctx context.Context, addr string) error {
	return w.Limiter.Take(ctx, kindWebsocket, addr, w.Limits.WebsocketsPerAddress)
}
