package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/warble/warble/internal/warble"
)

// wsConn is one websocket connection. Its reader goroutine reads the
// client's messages and has each handled in turn (see read); writes come
// from those handlers, from the goroutines of operations starting, from the
// hub's deliver goroutines and from keep-alives, one at a time (wmu).
type wsConn struct {
	t         *Websocket
	exec      graphql.GraphExecutor
	conn      *websocket.Conn
	legacy    bool // graphql-ws, not graphql-transport-ws
	closeCode atomic.Int32

	// base is the connection's context, and ctx the signed-in one, set
	// when connection_init is acked, before any operation starts. cancel
	// ends both, and every operation's.
	base     context.Context
	ctx      context.Context
	cancel   context.CancelFunc
	stopLife func() bool
	life     *lifetime // the server's, if it has one: told when the connection has closed

	wmu sync.Mutex // held while a message is written

	mu     sync.Mutex
	ops    []*wsOperation // running; few, so a slice, smaller than a map
	closed bool

	// Keep-alive state, see KeepAlive.
	heard   atomic.Bool // a message came since the last keep-alive
	pinging atomic.Bool // a keep-alive is being written
}

func newWSConn(t *Websocket, exec graphql.GraphExecutor, conn *websocket.Conn, r *http.Request) *wsConn {
	c := &wsConn{t: t, exec: exec, conn: conn, legacy: conn.Subprotocol() != protoTransportWS}
	// The request's values (the client's address, the handshake's
	// Authorization, the operation trace) without its cancellation, which
	// comes when Do returns; the server's lifetime instead.
	ctx := context.WithValue(context.WithoutCancel(r.Context()), connKey{}, c)
	c.base, c.cancel = context.WithCancel(ctx)
	c.stopLife = func() bool { return false }
	if l, ok := r.Context().Value(lifetimeKey{}).(*lifetime); ok {
		l.add()
		c.life = l
		c.stopLife = context.AfterFunc(l.ctx, c.cancel)
	}
	context.AfterFunc(c.base, c.ended)
	conn.SetReadLimit(MaxWebsocketMessage)
	return c
}

// clientMessage is a message from the client, of either protocol.
type clientMessage struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Payload json.RawMessage `json:"payload"`
}

// read reads the client's messages until the connection fails or closes;
// then it closes it, which ends its operations.
//
// It lives as long as the socket, and its stack with it: a goroutine's
// stack grows to the deepest call it made and shrinks only at a garbage
// collection, by half, and only while parked far below a quarter of it.
// So it only reads, which needs little, and each message is handled on a
// goroutine of its own (authenticating calls Redis; decoding JSON,
// starting an operation and writing go deeper than reading), one at a
// time and in order, while the reader waits.
func (c *wsConn) read() {
	var acked bool
	handled := make(chan bool, 1)
	c.conn.SetReadDeadline(time.Now().Add(c.t.initTimeout()))
	for {
		_, data, err := c.conn.ReadMessage()
		if err != nil {
			c.readFailed(err, acked)
			return
		}
		c.heard.Store(true)
		start := graphql.Now()
		go func() { handled <- c.handle(data, start, &acked) }()
		if !<-handled {
			return
		}
	}
}

// readFailed closes the connection after a failed read.
func (c *wsConn) readFailed(err error, acked bool) {
	var ne net.Error
	switch {
	case !acked && errors.As(err, &ne) && ne.Timeout():
		c.close(closeInitTimeout, "Connection initialisation timeout")
	case errors.Is(err, websocket.ErrReadLimit):
		c.close(websocket.CloseMessageTooBig, "Message too big")
	default:
		var ce *websocket.CloseError
		if !errors.As(err, &ce) && !errors.Is(err, net.ErrClosed) {
			c.reportError(err)
		}
		c.close(websocket.CloseNormalClosure, "terminated")
	}
}

// handle acts on one message of the client, read at start. It reports
// false when the connection has been closed.
func (c *wsConn) handle(data []byte, start time.Time, acked *bool) bool {
	var m clientMessage
	if err := json.Unmarshal(data, &m); err != nil {
		c.refuse(closeBadMessage, "Invalid message")
		return false
	}
	switch {
	case m.Type == "connection_init" && *acked:
		c.refuse(closeTooManyInits, "Too many initialisation requests")
		return false
	case m.Type == "connection_init":
		*acked = c.init(m.Payload)
		return *acked
	case m.Type == "ping" && !c.legacy:
		c.writeMessage("pong", "", m.Payload)
	case m.Type == "pong" && !c.legacy:
		// heard, in read, is all a pong is for
	case m.Type == "subscribe" && !c.legacy, m.Type == "start" && c.legacy:
		if !*acked {
			c.refuse(closeUnauthorized, "Unauthorized")
			return false
		}
		if m.ID == "" {
			c.refuse(closeBadMessage, "Invalid message: an operation needs an id")
			return false
		}
		return c.start(m.ID, m.Payload, start)
	case m.Type == "complete" && !c.legacy, m.Type == "stop" && c.legacy:
		c.stop(m.ID)
	case m.Type == "connection_terminate" && c.legacy:
		c.close(websocket.CloseNormalClosure, "terminated")
		return false
	default:
		c.refuse(closeBadMessage, "Invalid message type")
		return false
	}
	return true
}

// init authenticates the connection from connection_init's payload and
// acks it, or refuses it and closes the connection.
func (c *wsConn) init(raw json.RawMessage) bool {
	var payload map[string]any
	if len(raw) > 0 && json.Unmarshal(raw, &payload) != nil {
		c.refuse(closeBadMessage, "Invalid connection_init payload")
		return false
	}
	ctx := c.base
	if c.t.Init != nil {
		var err error
		if ctx, err = c.authenticate(payload); err != nil {
			code, reason := closeForbidden, "Forbidden"
			var ir *initRefusal
			if errors.As(err, &ir) {
				code, reason = ir.code, ir.reason
			}
			// Clients of the legacy protocol, such as
			// subscriptions-transport-ws, hand connection_error's message
			// to the app: the user-facing sentence.
			c.refuseWith(code, reason, err.Error())
			return false
		}
	}
	c.ctx = ctx
	if c.writeMessage("connection_ack", "", nil) != nil {
		return false
	}
	if c.legacy {
		// Legacy clients start their keep-alive timeout at the first "ka".
		c.writeMessage("ka", "", nil)
	}
	if k := c.t.KeepAlive; k != nil {
		k.add(c)
		// A close that came meanwhile (the server stopping) may have
		// missed the add.
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			k.remove(c)
		}
	} else {
		c.conn.SetReadDeadline(time.Time{})
	}
	return true
}

// authenticate runs Init, for at most the handler's AckTimeout: past it, the
// connection is refused with 1013, try again later. A Redis that is frozen
// or unreachable (not down: a refused dial fails at once) holds each command
// for go-redis's read timeout, and a signed-in connection_init makes several
// (the session, its watch, its user's seen time, on a cluster maybe on a
// master that does not answer), where clients wait for connection_ack with
// no timeout of their own (graphql-ws's default): they would hang on, not
// knowing why. Init goes on in the background until Redis answers; the
// connection's context, which it was given, ends with the refusal.
func (c *wsConn) authenticate(payload map[string]any) (context.Context, error) {
	type result struct {
		ctx context.Context
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, err := c.t.Init(c.base, payload)
		done <- result{ctx, err}
	}()
	t := time.NewTimer(c.t.ackTimeout())
	defer t.Stop()
	select {
	case r := <-done:
		return r.ctx, r.err
	case <-t.C:
		return nil, &initRefusal{code: closeTryAgainLater, reason: "Try again later", message: unavailableMessage}
	}
}

// initRefusal is Init's error for a connection to refuse with a code other
// than 4403.
type initRefusal struct {
	code    int
	reason  string // the close frame's
	message string // connection_error's, on the legacy protocol
}

func (e *initRefusal) Error() string { return e.message }

// ended closes the connection when its context ends: the session was
// revoked or expired (4403, see endWebsocket), or the server shuts down
// (1001, going away: graphql-transport-ws clients reconnect after it, to
// another server or this one back).
func (c *wsConn) ended() {
	if code := c.closeCode.Load(); code != 0 {
		c.close(int(code), "Forbidden")
		return
	}
	c.close(websocket.CloseGoingAway, "Server shutting down")
}

// refuse closes the connection for a protocol error, telling a legacy
// client why with connection_error first.
func (c *wsConn) refuse(code int, reason string) { c.refuseWith(code, reason, reason) }

func (c *wsConn) refuseWith(code int, reason, message string) {
	if c.legacy {
		b, _ := json.Marshal(&gqlerror.Error{Message: message})
		c.writeMessage("connection_error", "", b)
	}
	c.close(code, reason)
}

// close closes the connection once, with a close frame of code unless it
// is 0 (the connection is broken), and ends its operations. A normal
// closure becomes the code endWebsocket left. The server's lifetime hears
// of it once the close frame is written and the connection closed.
func (c *wsConn) close(code int, reason string) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	ops := c.ops
	c.ops = nil
	c.mu.Unlock()
	if override := c.closeCode.Load(); override != 0 && code == websocket.CloseNormalClosure {
		code, reason = int(override), "Forbidden"
	}
	if code != 0 {
		msg := websocket.FormatCloseMessage(code, closeReason(reason))
		c.conn.WriteControl(websocket.CloseMessage, msg, time.Now().Add(c.t.writeTimeout()))
	}
	c.conn.Close()
	if k := c.t.KeepAlive; k != nil {
		k.remove(c)
	}
	c.stopLife()
	for _, op := range ops {
		op.finish(false)
	}
	c.cancel()
	if c.life != nil {
		c.life.done()
	}
}

// closeReason cuts reason to what a close frame holds: a control frame
// carries at most 125 bytes, 2 of them the code, and gorilla/websocket
// sends no close frame at all for a longer one (4409's reason names the
// client's id, which may be long). The cut falls between characters, as
// the reason must be UTF-8.
func closeReason(reason string) string {
	const room = 123
	if len(reason) <= room {
		return reason
	}
	n := room
	for n > 0 && !utf8.RuneStart(reason[n]) {
		n--
	}
	return reason[:n]
}

func (c *wsConn) reportError(err error) {
	if c.t.OnError != nil {
		c.t.OnError(c.base, err)
	}
}

// Server message types, by protocol.
func (c *wsConn) dataType() string {
	if c.legacy {
		return "data"
	}
	return "next"
}

// writeMessage writes one message {"type", "id", "payload"} (id and payload
// left out when empty).
func (c *wsConn) writeMessage(typ, id string, payload json.RawMessage) error {
	return c.write(func(w io.Writer) error {
		writeMessageStart(w, typ, quoteID(id))
		if len(payload) > 0 {
			io.WriteString(w, `,"payload":`)
			w.Write(payload)
		}
		_, err := io.WriteString(w, "}")
		return err
	})
}

// writeMessageStart writes {"type":typ and, unless nil, "id":id, where id
// is the operation's id as JSON (quoteID).
func writeMessageStart(w io.Writer, typ string, id []byte) {
	io.WriteString(w, `{"type":"`)
	io.WriteString(w, typ)
	io.WriteString(w, `"`)
	if id != nil {
		io.WriteString(w, `,"id":`)
		w.Write(id)
	}
}

// quoteID returns id as a JSON string, or nil when it is empty.
func quoteID(id string) []byte {
	if id == "" {
		return nil
	}
	b, _ := json.Marshal(id)
	return b
}

// write writes the message that build writes, within the write timeout,
// through a buffer of the shared pool. A failed write closes the
// connection: after a timeout gorilla/websocket cannot write on it again,
// and a client that stalls is disconnected (it reconnects and resumes with
// after:) rather than holding the writes of its subscriptions.
func (c *wsConn) write(build func(w io.Writer) error) error {
	c.wmu.Lock()
	err := c.writeLocked(build)
	c.wmu.Unlock()
	if err != nil {
		c.reportError(err)
		c.close(0, "")
	}
	return err
}

func (c *wsConn) writeLocked(build func(w io.Writer) error) error {
	if err := c.conn.SetWriteDeadline(time.Now().Add(c.t.writeTimeout())); err != nil {
		return err
	}
	w, err := c.conn.NextWriter(websocket.TextMessage)
	if err != nil {
		return err
	}
	err = build(w)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// sendResponse writes resp as the next event or result of the operation
// whose id is id (as JSON: quoteID).
func (c *wsConn) sendResponse(id []byte, resp *graphql.Response) error {
	return c.write(func(w io.Writer) error {
		writeMessageStart(w, c.dataType(), id)
		io.WriteString(w, `,"payload":`)
		if err := writeResponse(w, resp); err != nil {
			return err
		}
		_, err := io.WriteString(w, "}")
		return err
	})
}

// sendData writes data, the JSON of an event of a subscription field
// whose response key is alias (as JSON), as the next event of the
// operation whose id is id (as JSON): the message that gqlgen's response
// handler and sendResponse make of it, byte for byte.
func (c *wsConn) sendData(id, alias []byte, data []byte) error {
	return c.write(func(w io.Writer) error {
		writeMessageStart(w, c.dataType(), id)
		io.WriteString(w, `,"payload":{"data":{`)
		w.Write(alias)
		io.WriteString(w, ":")
		w.Write(data)
		_, err := io.WriteString(w, "}}}")
		return err
	})
}

// writeResponse writes resp as JSON. The data is already JSON that gqlgen
// wrote: it is copied as is, where encoding/json would check and compact
// it again, once for every socket an event goes to.
func writeResponse(w io.Writer, resp *graphql.Response) error {
	if resp.Label != "" || resp.Path != nil || resp.HasNext != nil {
		b, err := json.Marshal(resp)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	io.WriteString(w, "{")
	if len(resp.Errors) > 0 {
		b, err := json.Marshal(resp.Errors)
		if err != nil {
			return err
		}
		io.WriteString(w, `"errors":`)
		w.Write(b)
		io.WriteString(w, ",")
	}
	io.WriteString(w, `"data":`)
	if len(resp.Data) == 0 {
		io.WriteString(w, "null")
	} else {
		w.Write(resp.Data)
	}
	if len(resp.Extensions) > 0 {
		b, err := json.Marshal(resp.Extensions)
		if err != nil {
			return err
		}
		io.WriteString(w, `,"extensions":`)
		w.Write(b)
	}
	_, err := io.WriteString(w, "}")
	return err
}

// sendErrors writes an error message for operation id, which ends it.
func (c *wsConn) sendErrors(id string, errs gqlerror.List) error {
	b, err := json.Marshal(errs)
	if err != nil {
		return err
	}
	return c.writeMessage("error", id, b)
}

// start begins operation id on a goroutine of its own, which parses,
// validates and dispatches it, and for a query or mutation writes its
// result; a subscription's events come from the hub (see wsOperation). It
// reports false when the connection was closed for a duplicate id.
func (c *wsConn) start(id string, payload json.RawMessage, readStart time.Time) bool {
	op := &wsOperation{conn: c, id: id, quotedID: quoteID(id)}
	var ctx context.Context
	ctx, op.cancel = context.WithCancel(c.ctx)
	op.ctx = ctx
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		op.cancel()
		return false
	}
	old := c.find(id)
	if old != nil && !c.legacy {
		c.mu.Unlock()
		op.cancel()
		c.close(closeDuplicateID, "Subscriber for "+id+" already exists")
		return false
	}
	if old == nil && len(c.ops) >= MaxWebsocketOperations {
		c.mu.Unlock()
		op.cancel()
		// The client hears why this one did not start, and may start it
		// once another ends.
		c.sendErrors(id, gqlerror.List{{
			Message:    fmt.Sprintf("A websocket runs at most %d operations at once: complete one first.", MaxWebsocketOperations),
			Extensions: map[string]any{"code": CodeBadUserInput},
		}})
		return true
	}
	if old != nil {
		c.remove(old)
	}
	c.ops = append(c.ops, op)
	c.mu.Unlock()
	if old != nil {
		// The legacy protocol's servers replace an operation started
		// again with the same id.
		old.finish(false)
	}
	go op.run(ctx, payload, readStart)
	return true
}

// find returns the running operation id, or nil; c.mu is held.
func (c *wsConn) find(id string) *wsOperation {
	for _, op := range c.ops {
		if op.id == id {
			return op
		}
	}
	return nil
}

// remove removes op from the running operations; c.mu is held.
func (c *wsConn) remove(op *wsOperation) {
	if i := slices.Index(c.ops, op); i >= 0 {
		c.ops = slices.Delete(c.ops, i, i+1)
	}
}

// stop ends operation id at the client's request. On graphql-transport-ws
// the server sends nothing more for it, complete included: the client may
// start another operation under the same id at once, and an echoed complete
// would reach it after that subscribe and end the new one. The legacy
// protocol's servers answered a stop with complete, and so does this.
//
// An event being written meanwhile is let finish first (pullMu), so that
// none follows once the complete is handled; the operation ends before
// that, so that an event that is being taken is not waited for.
func (c *wsConn) stop(id string) {
	c.mu.Lock()
	op := c.find(id)
	c.mu.Unlock()
	if op == nil || !op.finish(false) {
		return
	}
	op.pullMu.Lock()
	op.pullMu.Unlock() //lint:ignore SA2001 waiting for a write in progress is the point
	if c.legacy {
		c.writeMessage("complete", id, nil)
	}
}

// wsOperation is one operation of a connection. A subscription that the
// hub accepted (Attached) takes its events in EventReady, called from the
// hub's deliver goroutine, or from the starting goroutine for events that
// came before dispatch returned.
type wsOperation struct {
	conn     *wsConn
	id       string
	quotedID []byte // id as JSON, written with each of its messages
	// ctx is the operation's own context, which cancel ends, as does the
	// connection's end; the run's contexts (rctx) derive from it with
	// values only.
	ctx    context.Context
	cancel context.CancelFunc
	rc     *graphql.OperationContext
	// events is the subscription's channel, set by the hub (Attached)
	// during dispatch and read after it; nil for other operations.
	events <-chan *warble.TimelineEvent

	mu        sync.Mutex
	responses graphql.ResponseHandler // nil until dispatch returned
	rctx      context.Context
	pending   int // EventReady calls before responses was set
	done      bool

	pullMu sync.Mutex // held while an event is taken and written
	// shared is set once an event of the subscription has been
	// marshalled for every subscriber of its selection (by
	// sharedTimelineEvent, within pull), and lets pull write the next
	// events from their shared bytes itself. Guarded by pullMu.
	shared *sharedSelection
}

var _ warble.EventReceiver = (*wsOperation)(nil)

// run parses, validates and dispatches the operation. Its messages and
// their order are gqlgen's transport's: a document that does not parse or
// validate gets an error message, other errors come as a result with
// errors; then complete.
func (op *wsOperation) run(ctx context.Context, payload json.RawMessage, readStart time.Time) {
	c := op.conn
	ctx = graphql.StartOperationTrace(ctx)
	params := &graphql.RawParams{}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if err := dec.Decode(params); err != nil {
		op.fail(gqlerror.List{{Message: "invalid json"}})
		return
	}
	params.ReadTime = graphql.TraceTiming{Start: readStart, End: graphql.Now()}
	rc, errs := c.exec.CreateOperationContext(ctx, params)
	if errs != nil && op.isDone() {
		return
	} else if errs != nil {
		resp := c.exec.DispatchError(graphql.WithOperationContext(ctx, rc), errs)
		if errcode.GetErrorKind(errs) == errcode.KindProtocol {
			op.fail(resp.Errors)
			return
		}
		c.sendResponse(op.quotedID, &graphql.Response{Errors: errs})
		op.finish(true)
		return
	}
	op.rc = rc
	ctx = graphql.WithOperationContext(ctx, rc)
	if rc.Operation != nil && rc.Operation.Operation == ast.Subscription {
		ctx = warble.NewContextWithEventReceiver(ctx, op)
	}
	defer op.recover(ctx)
	responses, ctx := c.exec.DispatchOperation(ctx, rc)
	if op.events != nil {
		op.mu.Lock()
		op.responses, op.rctx = responses, ctx
		n := op.pending
		op.pending = 0
		op.mu.Unlock()
		for range n {
			op.pull(nil)
		}
		return
	}
	// A query, a mutation, or an operation that failed before its
	// subscription started.
	for {
		resp := responses(ctx)
		if resp == nil || op.isDone() { // stopped, or replaced, meanwhile
			break
		}
		if c.sendResponse(op.quotedID, resp) != nil {
			break
		}
	}
	op.finish(true)
}

func (op *wsOperation) isDone() bool {
	op.mu.Lock()
	defer op.mu.Unlock()
	return op.done
}

// recover turns a panic of the operation into an error message for it,
// and ends it, as gqlgen's transport does.
func (op *wsOperation) recover(ctx context.Context) {
	r := recover()
	if r == nil {
		return
	}
	var gerr *gqlerror.Error
	if op.rc != nil {
		if err := op.rc.Recover(ctx, r); !errors.As(err, &gerr) {
			gerr = &gqlerror.Error{Message: "internal system error"}
		}
	} else {
		gerr = &gqlerror.Error{Message: "internal system error"}
	}
	op.fail(gqlerror.List{gerr})
}

// fail ends the operation with an error message. On graphql-transport-ws
// the error is the operation's last message (no complete follows it), and
// the operation leaves the connection before it is written, so that a
// client that starts another under the same id on hearing it is not taken
// for a duplicate (4409). The legacy protocol's complete follows the error,
// as it did.
func (op *wsOperation) fail(errs gqlerror.List) {
	c := op.conn
	if c.legacy {
		c.sendErrors(op.id, errs)
		op.finish(true)
		return
	}
	if op.finish(false) { // not ended meanwhile by the client's complete
		c.sendErrors(op.id, errs)
	}
}

// Attached implements warble.EventReceiver.
func (op *wsOperation) Attached(events <-chan *warble.TimelineEvent) {
	op.events = events
}

// EventReady implements warble.EventReceiver: it takes the event waiting
// in the subscription's channel and writes it, or completes the operation
// when the channel was closed.
func (op *wsOperation) EventReady(ev *warble.TimelineEvent) {
	op.mu.Lock()
	if op.responses == nil {
		op.pending++ // run takes it once dispatch has returned
		op.mu.Unlock()
		return
	}
	op.mu.Unlock()
	op.pull(ev)
}

// pull takes one event and writes it. The receive does not block: the hub
// calls EventReady once for each event it put in the channel, and once for
// its close.
//
// An event goes through gqlgen's response handler, whose subscription
// field receives it and marshals it (sharedTimelineEvent), unless ev, the
// event waiting, was marshalled already for another subscriber of the same
// selection, as it is for all of them but the first: then pull takes it
// from the channel itself and writes those bytes in the message that the
// response handler would have made of them. That skips, for
// each socket an event goes to, the handler's response context, its
// middleware and the copy of the bytes into a response (BENCHMARKS.md,
// "Live events written from their shared bytes"). Nothing else is lost
// on the way: those bytes carry no error (sharedTimelineEvent shares no
// marshalling that reported one), no extension adds to a subscription's
// events, and the operation's middleware (metrics, authentication) runs
// once for the operation, not per event. A subscription whose context has
// ended goes through the handler, which ends it.
func (op *wsOperation) pull(ev *warble.TimelineEvent) {
	op.pullMu.Lock()
	defer op.pullMu.Unlock()
	if op.isDone() {
		return
	}
	// op.ctx has ended when rctx has (and it is read without walking
	// rctx's chain of values).
	if ev != nil && op.shared != nil && op.ctx.Err() == nil {
		if data := sharedEvents.written(op.shared.key(ev)); data != nil {
			<-op.events // ev (see warble.EventReceiver)
			if op.conn.sendData(op.quotedID, op.shared.alias, data) == nil {
				sharedWrites.Add(1)
			}
			return
		}
	}
	defer op.recover(op.rctx)
	resp := op.responses(op.rctx)
	if resp == nil {
		op.finish(true) // the subscription ended
		return
	}
	if op.isDone() { // the client completed it meanwhile (see stop)
		return
	}
	op.conn.sendResponse(op.quotedID, resp)
}

// finish ends the operation once: it leaves the connection's operations,
// the client hears complete if asked, and its context ends, which ends its
// subscription in the hub. It reports whether it ended the operation: false
// when it had ended already.
func (op *wsOperation) finish(complete bool) bool {
	op.mu.Lock()
	if op.done {
		op.mu.Unlock()
		return false
	}
	op.done = true
	op.mu.Unlock()
	c := op.conn
	c.mu.Lock()
	c.remove(op)
	c.mu.Unlock()
	if complete {
		c.writeMessage("complete", op.id, nil)
	}
	op.cancel()
	return true
}
