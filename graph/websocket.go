package graph

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/warble/warble/internal/warble"
)

// Websocket is Warble's websocket transport for gqlgen's handler, speaking
// graphql-transport-ws and the legacy graphql-ws. Operations go through
// gqlgen's executor, so that validation, the limits, persisted queries,
// operation middleware and the error presenter apply as over HTTP.
//
// It exists for memory. gqlgen's transport keeps, for every socket, the
// net/http handler goroutine (its read loop runs inside ServeHTTP) with
// net/http's 4 KB buffers, a goroutine that waits for the connection to
// end, and a goroutine per subscription parked on its channel: 53 KB per
// idle subscriber. Here Do returns once the connection is upgraded; a
// socket has one goroutine, its reader, with a small read buffer, and
// writes through buffers shared by all; and a subscription has none of its
// own: the hub hands each event to it from the goroutine that delivers it
// (see warble.EventReceiver), which writes it to the socket: through
// gqlgen's response handler for the first subscriber of each selection,
// and from that marshalling's bytes for the others (wsOperation.pull).
type Websocket struct {
	// AllowedOrigins are the origins, besides the server's own, whose pages
	// may open websockets ("https://app.example"); "*" allows any.
	AllowedOrigins []string
	// WriteTimeout bounds each write, so that a stalled client cannot hold
	// a goroutine forever; the connection of a write that times out is
	// closed. Zero means 10 seconds.
	WriteTimeout time.Duration
	// InitTimeout is how long a client has to send connection_init. Zero
	// means 10 seconds.
	InitTimeout time.Duration
	// AckTimeout bounds how long Init may take to authenticate a
	// connection: past it, the connection is closed with 1013 (try again
	// later). Zero means 5 seconds.
	AckTimeout time.Duration
	// Allow, if set, is asked before each handshake is accepted, with the
	// client's address; an ERATELIMITED error refuses it with 429.
	Allow func(ctx context.Context, addr string) error
	// Init authenticates a connection from its connection_init payload
	// (see websocketInit); nil accepts every connection as anonymous.
	Init func(ctx context.Context, payload map[string]any) (context.Context, error)
	// KeepAlive sends the keep-alive messages of every connection and
	// enforces their read deadlines.
	KeepAlive *KeepAlive
	// OnError, if set, hears of read and write errors, for a debug log.
	OnError func(ctx context.Context, err error)
}

var _ graphql.Transport = (*Websocket)(nil)

// Subprotocols, and the close codes of graphql-transport-ws, which the
// legacy protocol shares here (it defines none of its own).
const (
	protoTransportWS = "graphql-transport-ws"
	protoLegacyWS    = "graphql-ws"

	closeBadMessage    = 4400 // a message that is not JSON, or of an unknown type
	closeUnauthorized  = 4401 // an operation before connection_ack
	closeForbidden     = 4403 // a bad, revoked or expired session
	closeInitTimeout   = 4408 // no connection_init in time
	closeDuplicateID   = 4409 // an operation id already running
	closeTooManyInits  = 4429 // a second connection_init
	closeTryAgainLater = 1013 // the server cannot serve the connection now, but may soon
)

// wsReadBuffer is the read buffer of a connection. Clients send little:
// connection_init, operations and pongs; a longer message is read through
// it in parts. gorilla/websocket needs at least a control frame's 125
// bytes.
const wsReadBuffer = 256

// wsWriteBuffers are the write buffers of every connection: one is taken
// for each message written and put back after, so that an idle socket
// holds none.
var wsWriteBuffers = &sync.Pool{}

// Supports implements graphql.Transport: it takes every upgrade request,
// refusing those it cannot serve with a JSON error.
func (t *Websocket) Supports(r *http.Request) bool {
	return r.Header.Get("Upgrade") != ""
}

// Do implements graphql.Transport. It refuses a handshake that is not a
// websocket's, from an origin not allowed, or over its rate limit, with one
// GraphQL error in JSON; otherwise it upgrades the connection, starts its
// reader and returns.
func (t *Websocket) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	switch {
	case !websocket.IsWebSocketUpgrade(r) || r.Method != http.MethodGet:
		sendCoded(w, http.StatusBadRequest, "Only websocket upgrades are accepted here.", CodeBadUserInput)
		return
	case !t.checkOrigin(r):
		sendCoded(w, http.StatusForbidden, "Websockets from this origin are not allowed.", CodeForbidden)
		return
	}
	if err := t.allow(r); err != nil {
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
	upgrader := websocket.Upgrader{
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   wsReadBuffer,
		WriteBufferPool:  wsWriteBuffers,
		Subprotocols:     []string{protoTransportWS, protoLegacyWS},
		CheckOrigin:      t.checkOrigin,
	}
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // Upgrade has already answered the request
	}
	c := newWSConn(t, exec, conn, r)
	go c.read()
}

// WithWebsocketLifetime returns a copy of ctx, the base context of an
// http.Server, that bounds the websockets the server upgrades: when ctx
// ends, they close, with 1001 (going away). A request's own context cannot:
// net/http ends it when the handler returns, which Websocket.Do does right
// after the upgrade.
//
// wait returns once every websocket upgraded under the returned context has
// closed (its close frame written, or its write timed out), or when its own
// ctx ends. http.Server.Shutdown does not wait for them, as they are
// hijacked connections: a process that exits after Shutdown alone cuts the
// close frames short, and its clients see an abnormal closure (1006)
// instead.
func WithWebsocketLifetime(ctx context.Context) (_ context.Context, wait func(context.Context) error) {
	l := &lifetime{ctx: ctx}
	return context.WithValue(ctx, lifetimeKey{}, l), l.wait
}

type lifetimeKey struct{}

// lifetime counts the open websockets of a server, for its shutdown.
type lifetime struct {
	ctx  context.Context
	mu   sync.Mutex
	open int
	idle chan struct{} // made by wait, closed when open drops to 0
}

func (l *lifetime) add() {
	l.mu.Lock()
	l.open++
	l.mu.Unlock()
}

func (l *lifetime) done() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open--; l.open == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
}

func (l *lifetime) wait(ctx context.Context) error {
	l.mu.Lock()
	if l.open == 0 {
		l.mu.Unlock()
		return nil
	}
	if l.idle == nil {
		l.idle = make(chan struct{})
	}
	idle := l.idle
	l.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// connKey holds the *wsConn of a websocket's context.
type connKey struct{}

// isWebsocket reports whether ctx belongs to a websocket connection.
func isWebsocket(ctx context.Context) bool {
	_, ok := ctx.Value(connKey{}).(*wsConn)
	return ok
}

// endWebsocket closes the connection of ctx with code, ending its
// operations.
func endWebsocket(ctx context.Context, code int32) {
	if c, ok := ctx.Value(connKey{}).(*wsConn); ok {
		c.closeCode.Store(code)
		c.cancel()
	}
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

// allow asks t.Allow about r, and returns only a rate limit's refusal:
// when the limiter itself fails (Redis is unreachable), the connection is
// let through, as a limiter must not become the outage.
func (t *Websocket) allow(r *http.Request) error {
	if t.Allow == nil {
		return nil
	}
	err := t.Allow(r.Context(), warble.ClientAddressFromContext(r.Context()))
	if warble.ErrorCode(err) != warble.ERATELIMITED {
		return nil
	}
	return err
}

// checkOrigin allows requests without an Origin (not from a browser), from
// the server's own origin, and from the allow-list.
func (t *Websocket) checkOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	return strings.EqualFold(u.Host, r.Host) || OriginAllowed(t.AllowedOrigins, origin)
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

func (t *Websocket) writeTimeout() time.Duration {
	if t.WriteTimeout <= 0 {
		return 10 * time.Second
	}
	return t.WriteTimeout
}

func (t *Websocket) ackTimeout() time.Duration {
	if t.AckTimeout <= 0 {
		return 5 * time.Second
	}
	return t.AckTimeout
}

func (t *Websocket) initTimeout() time.Duration {
	if t.InitTimeout <= 0 {
		return 10 * time.Second
	}
	return t.InitTimeout
}
