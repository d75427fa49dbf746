package graph

import (
	"sync"
	"time"
)

// KeepAlive keeps every websocket of a handler alive from one goroutine,
// not a goroutine and a ticker per connection (as gqlgen's transport had):
// with ten thousand sockets open, those were a fifth of the server's
// goroutines and their stacks. Every interval it sends each connection its protocol's
// keep-alive: "ka" on graphql-ws, and on graphql-transport-ws a ping that
// the client must answer. A graphql-transport-ws connection from which
// nothing was read for two intervals in a row (no pong, nor anything else)
// reaches its read deadline and is closed.
//
// The goroutine runs while connections are open, and ends with the last.
type KeepAlive struct {
	interval time.Duration

	mu      sync.Mutex
	conns   map[*wsConn]struct{}
	running bool
}

// NewKeepAlive returns a KeepAlive that sends keep-alives every interval.
func NewKeepAlive(interval time.Duration) *KeepAlive {
	return &KeepAlive{interval: interval, conns: make(map[*wsConn]struct{})}
}

// add keeps c alive from now on. It replaces c's read deadline for
// connection_init: a graphql-ws client need not send anything.
func (k *KeepAlive) add(c *wsConn) {
	if c.legacy {
		c.conn.SetReadDeadline(time.Time{})
	} else {
		c.conn.SetReadDeadline(time.Now().Add(2 * k.interval))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.conns[c] = struct{}{}
	if !k.running {
		k.running = true
		go k.run()
	}
}

func (k *KeepAlive) remove(c *wsConn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.conns, c)
}

func (k *KeepAlive) run() {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	var conns []*wsConn
	for range t.C {
		k.mu.Lock()
		if len(k.conns) == 0 {
			k.running = false
			k.mu.Unlock()
			return
		}
		conns = conns[:0]
		for c := range k.conns {
			conns = append(conns, c)
		}
		k.mu.Unlock()
		for _, c := range conns {
			c.sendKeepAlive(k.interval)
		}
		clear(conns)
	}
}

// sendKeepAlive writes c's keep-alive on a goroutine of its own, so that a
// client that does not read holds up only itself (for the write timeout,
// after which its connection is closed). A keep-alive still being written
// from the last interval is not doubled.
func (c *wsConn) sendKeepAlive(interval time.Duration) {
	if !c.pinging.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer c.pinging.Store(false)
		typ := "ka"
		if !c.legacy {
			typ = "ping"
			// Heard since the last ping (its pong, say): the client
			// has two more intervals to answer this one.
			if c.heard.Swap(false) {
				c.conn.SetReadDeadline(time.Now().Add(2 * interval))
			}
		}
		c.writeMessage(typ, "", nil)
	}()
}
