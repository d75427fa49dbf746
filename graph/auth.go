package graph

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/warble/warble/internal/warble"
)

// SessionWatcher ends contexts when their session is revoked.
type SessionWatcher interface {
	// WatchSession returns a context that is cancelled when the session with
	// tokenHash is revoked or ctx ends, and a func that releases it.
	WatchSession(ctx context.Context, tokenHash string) (context.Context, context.CancelFunc)
}

type (
	authHeaderKey    struct{}
	upgradeHeaderKey struct{}
)

// AuthMiddleware keeps the Authorization header of HTTP requests for
// authOperation, which authenticates the request's operation once it is
// parsed: knowing the operation, it can read a home page's timeline in
// the session's round trip. A request without Authorization is anonymous;
// one with a bad or revoked token fails as UNAUTHENTICATED instead of
// running signed out.
//
// A websocket handshake is not authenticated there: its Authorization
// header is kept for websocketInit, which authenticates every websocket the
// same way, whichever way its token came, so that each one is closed when
// its session is revoked or expires.
func AuthMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		header := r.Header.Get("Authorization")
		if header == "" {
			next.ServeHTTP(w, r)
			return
		}
		key := any(authHeaderKey{})
		if r.Header.Get("Upgrade") != "" {
			key = upgradeHeaderKey{}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), key, header)))
	})
}

// authenticate checks an Authorization value ("Bearer <token>") and returns
// ctx with the user and session. With home set, it asks for the viewer's
// home page to be read with the session (see AuthenticateForHome); with
// post, for the seq of the viewer's new post to be taken with it (see
// AuthenticateForPost).
func authenticate(ctx context.Context, auth warble.AuthService, header string, home *warble.PageArgs, post bool) (context.Context, error) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return ctx, warble.Errorf(warble.EUNAUTHENTICATED, `Authorization must be "Bearer <token>".`)
	}
	token = strings.TrimSpace(token)
	var u *warble.User
	var s *warble.Session
	var err error
	switch {
	case home != nil:
		ctx, u, s, err = auth.AuthenticateForHome(ctx, token, *home)
	case post:
		ctx, u, s, err = auth.AuthenticateForPost(ctx, token)
	default:
		u, s, err = auth.Authenticate(ctx, token)
	}
	if err != nil {
		return ctx, err
	}
	return warble.NewContextWithSession(warble.NewContextWithUser(ctx, u), s), nil
}

// authOperation authenticates the operation of an HTTP request that came
// with an Authorization header (see AuthMiddleware), before anything of it
// runs, and answers it with the error when the token fails. Operation
// middleware runs outside gqlgen's response context, so the error goes
// through present here. r.Auth is read for each operation, so that a
// benchmark can swap it as it swaps r.Posts.
//
// Operations that do not parse or validate never get here, and are
// answered with their error without a read of the session.
func authOperation(r *Resolver, present graphql.ErrorPresenterFunc) graphql.OperationMiddleware {
	return func(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
		header, _ := ctx.Value(authHeaderKey{}).(string)
		if header == "" {
			return next(ctx)
		}
		oc := graphql.GetOperationContext(ctx)
		var home *warble.PageArgs
		if page, ok := homePage(oc); ok {
			home = &page
		}
		authCtx, err := authenticate(ctx, r.Auth, header, home, home == nil && onePost(oc))
		if err != nil {
			return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{present(ctx, err)}})
		}
		return next(authCtx)
	}
}

// queryType is what a root field of a query satisfies.
var queryType = []string{"Query"}

// homePage returns the page that a query's homeTimeline field asks for,
// its arguments taken as the resolver takes them, and false when the
// operation is not a query or has no such field, or an argument that the
// resolver would refuse. Of several, the first: FindTimeline uses what was
// read ahead only for the page it was read for.
func homePage(oc *graphql.OperationContext) (warble.PageArgs, bool) {
	if oc == nil || oc.Operation == nil || oc.Operation.Operation != ast.Query {
		return warble.PageArgs{}, false
	}
	for _, f := range collectFields(oc, oc.Operation.SelectionSet, queryType) {
		if f.Name != "homeTimeline" {
			continue
		}
		args := f.ArgumentMap(oc.Variables)
		var first *int
		if v := args["first"]; v != nil {
			n, err := graphql.UnmarshalInt(v)
			if err != nil {
				return warble.PageArgs{}, false
			}
			first = &n
		}
		var after *string
		if v := args["after"]; v != nil {
			s, err := graphql.UnmarshalString(v)
			if err != nil {
				return warble.PageArgs{}, false
			}
			after = &s
		}
		page, err := pageArgs(first, after, warble.DefaultPageSize)
		return page, err == nil
	}
	return warble.PageArgs{}, false
}

// mutationType is what a root field of a mutation satisfies.
var mutationType = []string{"Mutation"}

// onePost reports whether an operation is a mutation with one createPost
// field, whose body is one that CreatePost takes: its seq may then be
// taken with the session (AuthenticateForPost). A body that CreatePost
// would refuse, or a second post, gets no seq ahead, so that a refused
// body takes none (a post its rate limit refuses leaves its seq unused:
// see ratelimit.Auth).
func onePost(oc *graphql.OperationContext) bool {
	if oc == nil || oc.Operation == nil || oc.Operation.Operation != ast.Mutation {
		return false
	}
	posts, ok := 0, false
	for _, f := range collectFields(oc, oc.Operation.SelectionSet, mutationType) {
		if f.Name != "createPost" {
			continue
		}
		posts++
		input, _ := f.ArgumentMap(oc.Variables)["input"].(map[string]any)
		body, isString := input["body"].(string)
		_, err := warble.NormalizePostBody(body)
		ok = isString && err == nil
	}
	return posts == 1 && ok
}

// websocketInit authenticates a websocket from its connection_init payload
// ({"Authorization": "Bearer <token>"}, key matched ignoring case), or, for
// clients that can set headers on the handshake (browsers cannot), from the
// handshake's Authorization header; the payload wins when both are there.
// Without either the connection is anonymous. A bad token closes it with
// 4403. The returned context ends, closing the connection and its
// subscriptions, when the session is revoked or expires.
func websocketInit(auth warble.AuthService, watcher SessionWatcher) func(context.Context, map[string]any) (context.Context, error) {
	return func(ctx context.Context, payload map[string]any) (context.Context, error) {
		header, _ := ctx.Value(upgradeHeaderKey{}).(string)
		for k, v := range payload {
			if s, ok := v.(string); ok && strings.EqualFold(k, "Authorization") {
				header = s
			}
		}
		if header == "" {
			return ctx, nil
		}
		authCtx, err := authenticate(ctx, auth, header, nil, false)
		if err != nil && warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
			// The token could not be checked (Redis is unreachable): not
			// a verdict on the session, so a code that says to retry.
			return ctx, &initRefusal{code: closeTryAgainLater, reason: "Try again later", message: warble.ErrorMessage(err)}
		}
		if err != nil {
			// The legacy protocol's connection_error carries the
			// user-facing sentence, not the error's internal form.
			return ctx, &initRefusal{code: closeForbidden, reason: "Forbidden", message: warble.ErrorMessage(err)}
		}
		// The connection ends when its session is revoked or expires, with
		// 4403 as for a bad token, so that a client knows to log in again
		// rather than reconnect.
		sess := warble.SessionFromContext(authCtx)
		forbid := func() { endWebsocket(ctx, closeForbidden) }
		if watcher != nil {
			// It waits until a logout would be heard: on a cluster whose
			// master of the revocations' channel does not answer, until
			// the transport's bound refuses the connection (AckTimeout).
			revoked, _ := watcher.WatchSession(authCtx, sess.TokenHash)
			context.AfterFunc(revoked, func() {
				if authCtx.Err() == nil { // revoked, not closed
					forbid()
				}
			})
			// A logout between authenticate and the watch was announced
			// before the connection listened: the session is read again
			// now that a revocation would be heard.
			if _, err := auth.SessionExpiry(authCtx, sess.TokenHash); warble.ErrorCode(err) == warble.EUNAUTHENTICATED {
				return ctx, &initRefusal{code: closeForbidden, reason: "Forbidden", message: warble.ErrorMessage(err)}
			} else if err != nil {
				return ctx, &initRefusal{code: closeTryAgainLater, reason: "Try again later", message: warble.ErrorMessage(err)}
			}
		}
		endAtExpiry(authCtx, auth, sess, forbid)
		return authCtx, nil
	}
}

// expiryRecheck is how soon endAtExpiry asks again when it cannot tell
// whether a session has expired (Redis is unreachable).
const expiryRecheck = 5 * time.Second

// endAtExpiry calls expire when sess expires, unless ctx ends first. A
// websocket does not extend its session; requests made with the same token
// elsewhere do, so at the expiry it last knew it asks again, and waits on
// if the session has been extended.
func endAtExpiry(ctx context.Context, auth warble.AuthService, sess *warble.Session, expire func()) {
	var mu sync.Mutex // held until timer is set, which check uses
	var timer *time.Timer
	check := func() {
		at, err := auth.SessionExpiry(ctx, sess.TokenHash)
		if warble.ErrorCode(err) == warble.EUNAUTHENTICATED {
			expire()
			return
		} else if err != nil {
			at = time.Now().Add(expiryRecheck)
		}
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			// The connection ended during the check, and stopped the
			// timer already: setting it again would check forever.
			return
		}
		timer.Reset(time.Until(at))
	}
	mu.Lock()
	defer mu.Unlock()
	timer = time.AfterFunc(time.Until(sess.ExpiresAt), check)
	context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		timer.Stop()
	})
}

// ClientAddress puts the address of the client in the request context, for
// per-address rate limits: the connection's address, or with
// trustForwardedFor (Warble behind a proxy that appends the address it saw
// to X-Forwarded-For) the last address of that header.
func ClientAddress(trustForwardedFor bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			addr = r.RemoteAddr
		}
		if trustForwardedFor {
			if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
				hops := strings.Split(xff[len(xff)-1], ",")
				if last := strings.TrimSpace(hops[len(hops)-1]); last != "" {
					addr = last
				}
			}
		}
		next.ServeHTTP(w, r.WithContext(warble.NewContextWithClientAddress(r.Context(), addr)))
	})
}

// requireUser returns the signed-in user or an UNAUTHENTICATED error.
func requireUser(ctx context.Context) (*warble.User, error) {
	if u := warble.UserFromContext(ctx); u != nil {
		return u, nil
	}
	return nil, warble.Errorf(warble.EUNAUTHENTICATED, "You need to log in to do this.")
}
