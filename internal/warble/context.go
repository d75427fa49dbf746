package warble

import "context"

type contextKey int

const (
	userContextKey contextKey = iota + 1
	sessionContextKey
	eventReceiverContextKey
)

// NewContextWithUser returns a copy of ctx that carries the signed-in user.
func NewContextWithUser(ctx context.Context, u *User) context.Context {
	return context.WithValue(ctx, userContextKey, u)
}

// UserFromContext returns the signed-in user, or nil when signed out.
func UserFromContext(ctx context.Context) *User {
	u, _ := ctx.Value(userContextKey).(*User)
	return u
}

// UserIDFromContext returns the signed-in user's id, or "" when signed out.
func UserIDFromContext(ctx context.Context) string {
	if u := UserFromContext(ctx); u != nil {
		return u.ID
	}
	return ""
}

// NewContextWithSession returns a copy of ctx that carries the session the
// request authenticated with, so that logout can revoke exactly that one.
func NewContextWithSession(ctx context.Context, s *Session) context.Context {
	return context.WithValue(ctx, sessionContextKey, s)
}

// SessionFromContext returns the request's session, or nil when signed out.
func SessionFromContext(ctx context.Context) *Session {
	s, _ := ctx.Value(sessionContextKey).(*Session)
	return s
}
