package graph

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/gorilla/websocket"
)

// wsMessage is one protocol message as a client reads it.
type wsMessage struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// readMessage reads the next message that is not a keep-alive.
func readMessage(t *testing.T, conn *websocket.Conn) wsMessage {
	t.Helper()
	for {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net, not a speed bound
		var m wsMessage
		if err := conn.ReadJSON(&m); err != nil {
			t.Fatalf("read: %v", err)
		}
		if m.Type != "ka" && m.Type != "ping" {
			return m
		}
	}
}

// readClose reads until the server closes conn and returns the close
// frame's code, failing t if the connection ends another way.
func readClose(t *testing.T, conn *websocket.Conn) (code int, messages []wsMessage) {
	t.Helper()
	for {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net, not a speed bound
		_, data, err := conn.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("read: %v, want a close frame", err)
			}
			return ce.Code, messages
		}
		var m wsMessage
		json.Unmarshal(data, &m)
		messages = append(messages, m)
	}
}

func dial(t *testing.T, url, proto string) *websocket.Conn {
	t.Helper()
	conn, _, err := (&websocket.Dialer{Subprotocols: []string{proto}}).Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func send(t *testing.T, conn *websocket.Conn, msg string) {
	t.Helper()
	if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatal(err)
	}
}

// After the upgrade the HTTP handler returns: the connection lives on in
// its reader goroutine, without net/http's goroutine and buffers. (The
// reader may send connection_ack before the handler has returned, so the
// test waits for the return, with a bound that only keeps a regression
// from hanging it.)
func TestWebsocketHandlerReturns(t *testing.T) {
	h := NewHandler(HandlerConfig{Resolver: &Resolver{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	returned := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { returned <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	conn := dialAcked(t, "ws"+strings.TrimPrefix(srv.URL, "http"), protoTransportWS)
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler is still running 10 s after connection_ack, want it returned")
	}
	send(t, conn, `{"type":"subscribe","id":"q","payload":{"query":"{ __typename }"}}`)
	if m := readMessage(t, conn); m.Type != "next" || m.ID != "q" || string(m.Payload) != `{"data":{"__typename":"Query"}}` {
		t.Fatalf("query over the socket: %s %s %s", m.Type, m.ID, m.Payload)
	}
	if m := readMessage(t, conn); m.Type != "complete" || m.ID != "q" {
		t.Fatalf("after the result: %s %s, want complete q", m.Type, m.ID)
	}
}

// Queries run over either protocol with gqlgen's executor: results, and
// errors that the validation rules and the limits give, as gqlgen's
// transport sent them.
func TestWebsocketOperations(t *testing.T) {
	url := keepAliveServer(t, time.Hour)
	tests := []struct {
		name, proto, payload string
		wantType             string // of the first message
		wantInPayload        string
	}{
		{name: "Query", proto: protoTransportWS, payload: `{"query":"{ __typename }"}`, wantType: "next", wantInPayload: `"__typename":"Query"`},
		{name: "QueryLegacy", proto: protoLegacyWS, payload: `{"query":"{ __typename }"}`, wantType: "data", wantInPayload: `"__typename":"Query"`},
		{name: "Invalid", proto: protoTransportWS, payload: `{"query":"{ nope }"}`, wantType: "error", wantInPayload: `"GRAPHQL_VALIDATION_FAILED"`},
		{name: "InvalidLegacy", proto: protoLegacyWS, payload: `{"query":"{ nope }"}`, wantType: "error", wantInPayload: `"GRAPHQL_VALIDATION_FAILED"`},
		{name: "NotParams", proto: protoTransportWS, payload: `"text"`, wantType: "error", wantInPayload: `invalid json`},
		{name: "NeedsLogin", proto: protoTransportWS, payload: `{"query":"mutation { logout }"}`, wantType: "next", wantInPayload: `"UNAUTHENTICATED"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dialAcked(t, url, tt.proto)
			typ := "subscribe"
			if tt.proto == protoLegacyWS {
				typ = "start"
			}
			send(t, conn, `{"type":"`+typ+`","id":"op","payload":`+tt.payload+`}`)
			m := readMessage(t, conn)
			if m.Type != tt.wantType || m.ID != "op" || !strings.Contains(string(m.Payload), tt.wantInPayload) {
				t.Fatalf("got %s %s %s, want %s with %s", m.Type, m.ID, m.Payload, tt.wantType, tt.wantInPayload)
			}
			// On graphql-transport-ws an error is an operation's last
			// message; a result, and the legacy protocol's error, are
			// followed by complete.
			if tt.wantType != "error" || tt.proto == protoLegacyWS {
				if m := readMessage(t, conn); m.Type != "complete" || m.ID != "op" {
					t.Fatalf("then %s %s, want complete", m.Type, m.ID)
				}
			}
			// The connection goes on.
			send(t, conn, `{"type":"`+typ+`","id":"again","payload":{"query":"{ __typename }"}}`)
			if m := readMessage(t, conn); m.ID != "again" || !strings.Contains(string(m.Payload), "Query") {
				t.Fatalf("next operation: %s %s %s", m.Type, m.ID, m.Payload)
			}
		})
	}
}

// A client that breaks the protocol is disconnected with the close code
// graphql-transport-ws defines for it (on both protocols); a legacy client
// hears why in connection_error first.
func TestWebsocketProtocolErrors(t *testing.T) {
	url := keepAliveServer(t, time.Hour)
	big := `{"type":"connection_init","payload":{"x":"` + strings.Repeat("x", MaxWebsocketMessage) + `"}}`
	tests := []struct {
		name     string
		init     bool // complete connection_init first
		messages []string
		wantCode int
	}{
		{name: "OperationBeforeInit", messages: []string{`{"type":"subscribe","id":"1","payload":{"query":"{ __typename }"}}`}, wantCode: closeUnauthorized},
		{name: "SecondInit", init: true, messages: []string{`{"type":"connection_init"}`}, wantCode: closeTooManyInits},
		{name: "NotJSON", init: true, messages: []string{`hello`}, wantCode: closeBadMessage},
		{name: "UnknownType", init: true, messages: []string{`{"type":"next","id":"1"}`}, wantCode: closeBadMessage},
		{name: "NoID", init: true, messages: []string{`{"type":"subscribe","payload":{"query":"{ __typename }"}}`}, wantCode: closeBadMessage},
		{name: "InitPayloadNotObject", messages: []string{`{"type":"connection_init","payload":[1]}`}, wantCode: closeBadMessage},
		{name: "TooBig", messages: []string{big}, wantCode: websocket.CloseMessageTooBig},
	}
	for _, tt := range tests {
		for _, proto := range []string{protoTransportWS, protoLegacyWS} {
			t.Run(tt.name+"/"+proto, func(t *testing.T) {
				var conn *websocket.Conn
				if tt.init {
					conn = dialAcked(t, url, proto)
				} else {
					conn = dial(t, url, proto)
				}
				for _, m := range tt.messages {
					if proto == protoLegacyWS {
						m = strings.Replace(m, `"subscribe"`, `"start"`, 1)
					}
					send(t, conn, m)
				}
				code, got := readClose(t, conn)
				if code != tt.wantCode {
					t.Fatalf("closed with %d, want %d", code, tt.wantCode)
				}
				if proto == protoLegacyWS && tt.wantCode != websocket.CloseMessageTooBig &&
					(len(got) == 0 || got[len(got)-1].Type != "connection_error") {
					t.Fatalf("legacy client got %+v before the close, want connection_error", got)
				}
			})
		}
	}
}

// A client that sends no connection_init in time is closed with 4408.
func TestWebsocketInitTimeout(t *testing.T) {
	srv := handler.New(NewExecutableSchema(Config{Resolvers: &Resolver{}}))
	srv.AddTransport(&Websocket{InitTimeout: 50 * time.Millisecond})
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	conn := dial(t, "ws"+strings.TrimPrefix(hs.URL, "http"), protoTransportWS)
	if code, _ := readClose(t, conn); code != closeInitTimeout {
		t.Fatalf("closed with %d, want %d", code, closeInitTimeout)
	}
}

// A client's ping gets a pong with the same payload.
func TestWebsocketPong(t *testing.T) {
	conn := dialAcked(t, keepAliveServer(t, time.Hour), protoTransportWS)
	send(t, conn, `{"type":"ping","payload":{"n":1}}`)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var m wsMessage
	if err := conn.ReadJSON(&m); err != nil || m.Type != "pong" || string(m.Payload) != `{"n":1}` {
		t.Fatalf("after ping: %+v %v, want pong with its payload", m, err)
	}
}

// Websockets of a server whose base context carries WithWebsocketLifetime
// close with 1001 when it ends, although their handlers returned long
// before, and its wait returns once they have.
func TestWebsocketLifetime(t *testing.T) {
	h := NewHandler(HandlerConfig{Resolver: &Resolver{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	life, end := context.WithCancel(context.Background())
	defer end()
	hs := httptest.NewUnstartedServer(h)
	life, closed := WithWebsocketLifetime(life)
	hs.Config.BaseContext = func(net.Listener) context.Context { return life }
	hs.Start()
	t.Cleanup(hs.Close)
	conn := dialAcked(t, "ws"+strings.TrimPrefix(hs.URL, "http"), protoLegacyWS)
	end()
	if err := closed(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _ := readClose(t, conn); code != websocket.CloseGoingAway {
		t.Fatalf("closed with %d, want 1001 (going away)", code)
	}
}
