package graph

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/warble/warble/internal/warble"
)

// GorillaWebsocket is gqlgen's websocket transport implemented with
// gorilla/websocket. It checks the Origin of browsers against the same
// allow-list as CORS, and bounds how long a write may take.
type GorillaWebsocket struct {
	// AllowedOrigins are the origins, besides the server's own, whose pages
	// may open websockets ("https://app.example"); "*" allows any.
	AllowedOrigins []string
	// WriteTimeout bounds each write, so that a stalled client cannot hold
	// a goroutine forever. Zero means 10 seconds.
	WriteTimeout time.Duration
	// Allow, if set, is asked before each handshake is accepted, with the
	// client's address; an ERATELIMITED error refuses it with 429.
	Allow func(ctx context.Context, addr string) error
	// KeepAlive, if set, sends the keep-alive messages of every connection
	// and enforces their read deadlines, in place of gqlgen's goroutine per
	// connection (see keepAlive).
	KeepAlive *KeepAlive
}

var _ transport.WebsocketImplementation = GorillaWebsocket{}

// Accept implements transport.WebsocketImplementation.
func (g GorillaWebsocket) Accept(w http.ResponseWriter, r *http.Request, opts transport.WebsocketAcceptOptions) (transport.WebsocketConn, error) {
	upgrader := websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		// No buffers of its own: the connection reads and writes through
		// the 4 KB buffers net/http already holds for it (its handler
		// goroutine lives as long as the socket, so they cannot be freed),
		// instead of a second pair.
		Subprotocols: opts.Subprotocols,
		CheckOrigin:  g.checkOrigin,
	}
	conn, err := upgrader.Upgrade(w, r, opts.ResponseHeader)
	if err != nil {
		return nil, err // Upgrade has already answered the request
	}
	timeout := g.WriteTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	closeCode, _ := r.Context().Value(closeCodeKey{}).(*atomic.Int32)
	c := &gorillaConn{conn: conn, writeTimeout: timeout, closeCode: closeCode, keepAlive: g.KeepAlive}
	if c.keepAlive != nil {
		c.keepAlive.add(c)
	}
	return c, nil
}

// guard refuses websocket handshakes that Accept would refuse, with one
// JSON error, before gqlgen sees them: when Accept fails, gqlgen writes an
// error of its own after the upgrader's, and logs the refusal.
func (g GorillaWebsocket) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			next.ServeHTTP(w, r)
			return
		}
		// The refusals below are GraphQL errors in JSON.
		switch {
		case !websocket.IsWebSocketUpgrade(r) || r.Method != http.MethodGet:
			sendCoded(w, http.StatusBadRequest, "Only websocket upgrades are accepted here.", CodeBadUserInput)
		case !g.checkOrigin(r):
			sendCoded(w, http.StatusForbidden, "Websockets from this origin are not allowed.", CodeForbidden)
		default:
			if err := g.allow(r); err != nil {
				var werr *warble.Error
				errors.As(err, &werr)
				retry := int(werr.RetryAfter / time.Second)
				w.Header().Set("Retry-After", strconv.Itoa(retry))
				w.Header().Set("Content-Type", "application/json")
				transport.SendError(w, http.StatusTooManyRequests, &gqlerror.Error{
					Message:    werr.Message,
					Extensions: map[string]any{"code": CodeRateLimited, "retryAfter": retry},
				})
				return
			}
			// A slot for a close code other than gqlgen's own, which
			// Accept hands to the connection.
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), closeCodeKey{}, new(atomic.Int32))))
		}
	})
}

// closeForbidden is the close code for a connection whose session is bad,
// revoked or expired, as graphql-transport-ws uses it.
const closeForbidden = 4403

// closeTryAgainLater is the standard close code for a server that cannot
// serve the connection now but may soon.
const closeTryAgainLater = 1013

type closeCodeKey struct{}

// isWebsocket reports whether ctx belongs to a websocket connection.
func isWebsocket(ctx context.Context) bool {
	_, ok := ctx.Value(closeCodeKey{}).(*atomic.Int32)
	return ok
}

// subscriptionsOnWebsockets refuses subscriptions sent over plain HTTP.
// gqlgen's POST and GET transports would run one and hold the request
// open until the timeline's next event, which on a quiet timeline is never.
func subscriptionsOnWebsockets(present graphql.ErrorPresenterFunc) graphql.OperationMiddleware {
	return func(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
		op := graphql.GetOperationContext(ctx).Operation
		if op == nil || op.Operation != ast.Subscription || isWebsocket(ctx) {
			return next(ctx)
		}
		err := warble.Errorf(warble.EINVALID, "Subscriptions need a websocket: connect to /graphql with graphql-transport-ws or graphql-ws.")
		return graphql.OneShot(&graphql.Response{Errors: gqlerror.List{present(ctx, err)}})
	}
}

// setCloseCode makes the connection of ctx close with code instead of the
// normal closure gqlgen sends when a connection's context ends.
func setCloseCode(ctx context.Context, code int32) {
	if c, ok := ctx.Value(closeCodeKey{}).(*atomic.Int32); ok {
		c.Store(code)
	}
}

// allow asks g.Allow about r, and returns only a rate limit's refusal:
// when the limiter itself fails (Redis is unreachable), the connection is
// let through, as a limiter must not become the outage.
func (g GorillaWebsocket) allow(r *http.Request) error {
	if g.Allow == nil {
		return nil
	}
	err := g.Allow(r.Context(), warble.ClientAddressFromContext(r.Context()))
	if warble.ErrorCode(err) != warble.ERATELIMITED {
		return nil
	}
	return err
}

// checkOrigin allows requests without an Origin (not from a browser), from
// the server's own origin, and from the allow-list.
func (g GorillaWebsocket) checkOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	return strings.EqualFold(u.Host, r.Host) || OriginAllowed(g.AllowedOrigins, origin)
}

// OriginAllowed reports whether origin is on the allow-list: equal to an
// entry ignoring case and a trailing slash, matched by an entry with one
// "*" standing for any text ("https://*.example.com"), or allowed by an
// entry "*". An empty list allows no other origin. The HTTP CORS handler
// and the websocket check both use it, so that they always agree.
func OriginAllowed(allowed []string, origin string) bool {
	origin = strings.ToLower(origin)
	for _, a := range allowed {
		a = strings.ToLower(strings.TrimSuffix(a, "/"))
		if a == "*" || a == origin {
			return true
		}
		if before, after, ok := strings.Cut(a, "*"); ok &&
			len(origin) >= len(before)+len(after) && strings.HasPrefix(origin, before) && strings.HasSuffix(origin, after) {
			return true
		}
	}
	return false
}

// gorillaConn adapts a *websocket.Conn to transport.WebsocketConn. gqlgen
// serialises its own writes; wmu serialises them with the keep-alives.
type gorillaConn struct {
	conn         *websocket.Conn
	writeTimeout time.Duration
	closeCode    *atomic.Int32 // replaces a normal closure when set; may be nil

	wmu       sync.Mutex
	keepAlive *KeepAlive  // nil: gqlgen keeps the connection alive
	heard     atomic.Bool // a message came since the last keep-alive
	pinging   atomic.Bool // a keep-alive is being written
	closed    atomic.Bool
}

var (
	_ transport.WebsocketConn          = (*gorillaConn)(nil)
	_ transport.WebsocketReadLimiter   = (*gorillaConn)(nil)
	_ transport.WebsocketReadDeadliner = (*gorillaConn)(nil)
)

func (c *gorillaConn) NextReader() (int, io.Reader, error) {
	typ, r, err := c.conn.NextReader()
	if err == nil {
		c.heard.Store(true)
	}
	var closeErr *websocket.CloseError
	if errors.As(err, &closeErr) && (closeErr.Code == websocket.CloseNormalClosure ||
		closeErr.Code == websocket.CloseGoingAway || closeErr.Code == websocket.CloseNoStatusReceived) {
		return typ, nil, transport.ErrWebsocketClosed
	}
	return typ, r, err
}

// WriteJSON writes one message within the write timeout. A failed write
// closes the connection: gqlgen only reports write errors and goes on, and
// after a timeout gorilla cannot write on that connection again, so without
// this a stalled client would keep its subscriptions running for a socket
// that can no longer carry them. The close makes gqlgen's read fail, which
// ends the connection and its subscriptions; the client reconnects and
// resumes with after:.
func (c *gorillaConn) WriteJSON(v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	if err == nil {
		err = c.conn.WriteJSON(v)
	}
	if err != nil {
		c.Close()
	}
	return err
}

// writeRaw is WriteJSON for a message already encoded.
func (c *gorillaConn) writeRaw(msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	if err == nil {
		err = c.conn.WriteMessage(websocket.TextMessage, msg)
	}
	if err != nil {
		c.Close()
	}
	return err
}

func (c *gorillaConn) WriteClose(code int, message string) error {
	if c.closeCode != nil && code == websocket.CloseNormalClosure {
		if override := c.closeCode.Load(); override != 0 {
			code, message = int(override), "Forbidden"
		}
	}
	msg := websocket.FormatCloseMessage(code, message)
	return c.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(c.writeTimeout))
}

func (c *gorillaConn) Close() error {
	if c.keepAlive != nil && !c.closed.Swap(true) {
		c.keepAlive.remove(c)
	}
	return c.conn.Close()
}

func (c *gorillaConn) Subprotocol() string      { return c.conn.Subprotocol() }
func (c *gorillaConn) SetReadLimit(limit int64) { c.conn.SetReadLimit(limit) }

// SetReadDeadline sets the read deadline, unless KeepAlive owns it.
func (c *gorillaConn) SetReadDeadline(t time.Time) error {
	if c.keepAlive != nil {
		return nil
	}
	return c.conn.SetReadDeadline(t)
}
