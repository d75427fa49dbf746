package graph

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// keepAliveServer serves a handler whose keep-alive interval is short. The
// connections here only sign in anonymously, which needs no services.
func keepAliveServer(t *testing.T, interval time.Duration) string {
	t.Helper()
	h := NewHandler(HandlerConfig{Resolver: &Resolver{}, KeepAlive: interval, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// dialAcked opens a websocket with proto and completes connection_init.
func dialAcked(t *testing.T, url, proto string) *websocket.Conn {
	t.Helper()
	conn, _, err := (&websocket.Dialer{Subprotocols: []string{proto}}).Dial(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"connection_init"}`)); err != nil {
		t.Fatal(err)
	}
	if typ := readType(t, conn); typ != "connection_ack" {
		t.Fatalf("after connection_init: %q, want connection_ack", typ)
	}
	return conn
}

// readType reads one message and returns its type; a failed read fails t.
func readType(t *testing.T, conn *websocket.Conn) string {
	t.Helper()
	typ, err := tryReadType(conn)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return typ
}

func tryReadType(conn *websocket.Conn) (string, error) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net, not a speed bound
	_, data, err := conn.ReadMessage()
	if err != nil {
		return "", err
	}
	var m struct{ Type string }
	if err := json.Unmarshal(data, &m); err != nil {
		return "", err
	}
	return m.Type, nil
}

// The handler's one keep-alive goroutine pings graphql-transport-ws
// clients, keeps those that answer, and closes one that stops answering;
// graphql-ws clients get "ka".
func TestKeepAliveFromOneGoroutine(t *testing.T) {
	// Long enough that a loaded machine (CI runs the suites side by side
	// on two cores) answers each ping well within two intervals.
	const interval = 200 * time.Millisecond
	url := keepAliveServer(t, interval)

	answering := dialAcked(t, url, "graphql-transport-ws")
	silent := dialAcked(t, url, "graphql-transport-ws")
	legacy := dialAcked(t, url, "graphql-ws")

	// Many intervals: a client that answers every ping stays connected
	// past the two intervals of a read deadline.
	for i := range 6 {
		if typ := readType(t, answering); typ != "ping" {
			t.Fatalf("ping %d: got %q", i, typ)
		}
		if err := answering.WriteMessage(websocket.TextMessage, []byte(`{"type":"pong"}`)); err != nil {
			t.Fatalf("pong %d: %v", i, err)
		}
		if typ := readType(t, legacy); typ != "ka" {
			t.Fatalf("keep-alive %d on graphql-ws: got %q", i, typ)
		}
	}

	// The silent client got pings too, and was closed for not answering.
	pings := 0
	for {
		typ, err := tryReadType(silent)
		if err != nil {
			if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
				t.Fatalf("a client that never answered is still open after %d pings", pings)
			}
			break
		}
		if typ != "ping" {
			t.Fatalf("silent client got %q", typ)
		}
		pings++
	}
	if pings == 0 {
		t.Fatal("the silent client was closed before it was pinged")
	}
}
