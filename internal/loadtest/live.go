package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/warble"
)

// The live measurement: many graphql-transport-ws subscribers open on the
// server at once, most on the global timeline and the rest on the home
// timelines of one author's followers; the server's memory per idle
// subscriber, and the time from createPost answering to each subscriber's
// next message for one post of that author.

// liveResult is one live measurement.
type liveResult struct {
	global, home  int           // subscribers opened on each timeline
	open          time.Duration // to open and subscribe them all
	rssBefore     int64         // the server's RSS before the sockets opened, bytes; 0 if not known
	rssAfter      int64         // and with them open and idle
	warmLost      int           // subscribers that missed the first post (not yet live)
	p50, p99, max time.Duration // createPost answered -> next message, over those received
	globalP50     time.Duration // the same on the global timeline's subscribers alone
	globalP99     time.Duration
	homeP50       time.Duration // and on the home timelines' alone
	homeP99       time.Duration
	lost          int // subscribers the measured post did not reach within the timeout
	early         int // next messages that arrived before createPost answered (counted as 0)

	// The CPU time that the server, this tool and Redis used from just
	// before the measured post to its last delivery (-1 where unknown),
	// and how long that was: on loopback the tool's readers share the
	// machine's CPUs with the server they measure.
	window                       time.Duration
	serverCPU, toolCPU, redisCPU time.Duration
}

// perSocket is the server's RSS growth per subscriber, in bytes.
func (l liveResult) perSocket() int64 {
	n := int64(l.global + l.home)
	if n == 0 || l.rssBefore == 0 {
		return 0
	}
	return (l.rssAfter - l.rssBefore) / n
}

func (l liveResult) write(out io.Writer) {
	fmt.Fprintf(out, "\nlive: %d subscribers (%d on globalTimeline, %d on their homeTimeline), graphql-transport-ws on loopback, opened in %s\n",
		l.global+l.home, l.global, l.home, l.open.Round(time.Millisecond))
	if l.rssBefore > 0 {
		fmt.Fprintf(out, "  server RSS %.1f MB before, %.1f MB with them idle: %.1f KB per subscriber (target <= 25 KB)\n",
			float64(l.rssBefore)/1e6, float64(l.rssAfter)/1e6, float64(l.perSocket())/1e3)
	} else {
		fmt.Fprintln(out, "  server RSS not known (pass -server-pid)")
	}
	if l.warmLost > 0 {
		fmt.Fprintf(out, "  %d subscribers did not get the first (warm-up) post\n", l.warmLost)
	}
	fmt.Fprintf(out, "  one post, createPost answered -> next message: p50 %s, p99 %s (target <= 200ms), max %s; lost %d; %d arrived before the answer\n",
		l.p50.Round(time.Microsecond), l.p99.Round(time.Microsecond), l.max.Round(time.Microsecond), l.lost, l.early)
	fmt.Fprintf(out, "  p50 / p99 on the global timeline's subscribers %s / %s, on the home timelines' %s / %s\n",
		l.globalP50.Round(time.Microsecond), l.globalP99.Round(time.Microsecond),
		l.homeP50.Round(time.Microsecond), l.homeP99.Round(time.Microsecond))
	cpu := func(d time.Duration) string {
		if d < 0 {
			return "-"
		}
		return d.Round(time.Millisecond).String()
	}
	fmt.Fprintf(out, "  CPU from the post to its last delivery (%s, on %d CPUs): server %s, this tool %s, Redis %s\n",
		l.window.Round(time.Millisecond), runtime.NumCPU(), cpu(l.serverCPU), cpu(l.toolCPU), cpu(l.redisCPU))
}

// raiseFileLimit lifts the soft limit on open files to the hard one: each
// socket is a descriptor.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}

// serverRSS reads the resident memory of process pid, in bytes.
func serverRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}

// liveSocket is one subscriber's connection, read by its own goroutine.
type liveSocket struct {
	conn *websocket.Conn
	got  chan time.Time // when each next message arrived
}

const liveQuery = `subscription { %s { kind cursor postId post { id body createdAt author { id username } } } }`

// dialLive opens one socket, signs in with token (if any), and subscribes
// to field. It returns once the server has acked the connection.
func dialLive(ctx context.Context, wsURL, token, field string) (*liveSocket, error) {
	// Small client buffers: the tool holds as many sockets as the server.
	d := websocket.Dialer{Subprotocols: []string{"graphql-transport-ws"}, HandshakeTimeout: 10 * time.Second, ReadBufferSize: 512, WriteBufferSize: 512}
	conn, _, err := d.DialContext(ctx, wsURL, nil)
	if err != nil {
		return nil, err
	}
	payload := map[string]any{}
	if token != "" {
		payload["Authorization"] = "Bearer " + token
	}
	type msg struct {
		Type    string `json:"type"`
		ID      string `json:"id,omitempty"`
		Payload any    `json:"payload,omitempty"`
	}
	fail := func(err error) (*liveSocket, error) { conn.Close(); return nil, err }
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := conn.WriteJSON(msg{Type: "connection_init", Payload: payload}); err != nil {
		return fail(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var ack struct{ Type string }
	if err := conn.ReadJSON(&ack); err != nil {
		return fail(err)
	}
	if ack.Type != "connection_ack" {
		return fail(fmt.Errorf("after connection_init: %q, want connection_ack", ack.Type))
	}
	conn.SetReadDeadline(time.Time{})
	if err := conn.WriteJSON(msg{Type: "subscribe", ID: "1", Payload: map[string]any{"query": fmt.Sprintf(liveQuery, field)}}); err != nil {
		return fail(err)
	}
	return &liveSocket{conn: conn, got: make(chan time.Time, 4)}, nil
}

// read reads s until its connection closes, answering pings, and notes the
// arrival of each next message. A message other than next, ping or pong
// (an error, a complete) ends it with that message reported in errs.
//
// The tool's readers share the machine's CPUs with the server they
// measure, so a reader costs as little as it can: each message is read
// into the socket's own buffer, and a next message, which Warble begins
// with its type, is known by that beginning without parsing the rest.
// Any other message is parsed whole.
func (s *liveSocket) read(errs chan<- error) {
	defer close(s.got)
	buf := make([]byte, 0, 1024)
	for {
		_, r, err := s.conn.NextReader()
		if err != nil {
			return
		}
		if buf, err = readAll(r, buf[:0]); err != nil {
			return
		}
		at := time.Now()
		switch messageType(buf) {
		case "next":
			select {
			case s.got <- at:
			default: // more than the measurement asked for
			}
		case "ping":
			s.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			s.conn.WriteMessage(websocket.TextMessage, []byte(`{"type":"pong"}`))
		case "pong":
		default:
			select {
			case errs <- fmt.Errorf("subscriber got %.200s", buf):
			default:
			}
			return
		}
	}
}

// nextPrefix begins every next message Warble sends.
var nextPrefix = []byte(`{"type":"next",`)

// messageType returns the type of a graphql-transport-ws message: "next"
// at once for one that begins as Warble's do, otherwise from the whole
// message parsed ("" if it is not a JSON object with a type).
func messageType(msg []byte) string {
	if bytes.HasPrefix(msg, nextPrefix) {
		return "next"
	}
	var m struct{ Type string }
	json.Unmarshal(msg, &m)
	return m.Type
}

// readAll appends what r holds to buf, growing it only when a message is
// longer than any before it on the socket.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		} else if err != nil {
			return buf, err
		}
	}
}

// warmUpWait is how long a warm-up post of the live scenario waits to
// reach every socket: far longer than one takes at 10,000 sockets.
const warmUpWait = 10 * time.Second

// measureLive opens o.sockets subscribers (o.sockets/5 of them on their
// home timelines, followers of one new author, the rest on the global
// timeline), times one post of that author to all of them, and reads the
// server's RSS before and after opening them when o.serverPID is set.
// Opening is bounded by o.liveTimeout, and so is the wait for each post.
func measureLive(ctx context.Context, db *redisdb.DB, hc *http.Client, serverURL string, o options, out io.Writer) (liveResult, error) {
	var r liveResult
	limit, err := raiseFileLimit()
	if err != nil {
		return r, fmt.Errorf("open files limit: %w", err)
	}
	if uint64(o.sockets)+256 > limit {
		return r, fmt.Errorf("-sockets %d needs more open files than the limit %d allows (ulimit -n)", o.sockets, limit)
	}
	r.home = o.sockets / 5
	r.global = o.sockets - r.home

	// The author and its followers, through the services: the home
	// subscribers need sessions.
	auth, follows := redisdb.NewAuthService(db), redisdb.NewFollowService(db)
	author, err := auth.Signup(ctx, warble.SignupInput{Username: "liveauthor", Password: "load test password"})
	if err != nil {
		return r, err
	}
	tokens := make([]string, r.home)
	err = parallel(r.home, func(i int) error {
		p, err := auth.Signup(ctx, warble.SignupInput{Username: fmt.Sprintf("live%d", i), Password: "load test password"})
		if err != nil {
			return err
		}
		tokens[i] = p.Token
		return follows.Follow(ctx, p.User.ID, author.User.ID)
	})
	if err != nil {
		return r, fmt.Errorf("seed live followers: %w", err)
	}
	if _, err := waitDrained(ctx, db, 5*time.Minute); err != nil {
		return r, err
	}

	if o.serverPID > 0 {
		runtimeSettle()
		if r.rssBefore, err = serverRSS(o.serverPID); err != nil {
			return r, fmt.Errorf("server RSS: %w", err)
		}
	}
	wsURL := "ws" + strings.TrimPrefix(serverURL, "http") + "/graphql"
	sockets := make([]*liveSocket, o.sockets)
	defer func() {
		for _, s := range sockets {
			if s != nil {
				s.conn.Close()
			}
		}
	}()
	openCtx, cancel := context.WithTimeout(ctx, o.liveTimeout)
	defer cancel()
	start := time.Now()
	var opened atomic.Int64
	errs := make(chan error, 1)
	err = parallel(o.sockets, func(i int) error {
		token, field := "", "globalTimeline"
		if i < r.home {
			token, field = tokens[i], "homeTimeline"
		}
		s, err := dialLive(openCtx, wsURL, token, field)
		if err != nil {
			return fmt.Errorf("socket %d of %d (%d open): %w", i, o.sockets, opened.Load(), err)
		}
		sockets[i] = s
		opened.Add(1)
		go s.read(errs)
		return nil
	})
	if err != nil {
		return r, err
	}
	r.open = time.Since(start)

	// A first post shows every subscription live (a subscription whose
	// operation the server has not started yet would miss it); the
	// measured post comes after the sockets have been idle a while.
	publish := func(body string) (time.Time, error) {
		err := post(ctx, hc, serverURL+"/graphql", author.Token, createPostQuery, map[string]any{"b": body})
		return time.Now(), err
	}
	var homeLat, globalLat []time.Duration
	// collect waits up to wait in all for the post to reach every socket.
	// Once the wait is over, each socket still without it counts as lost
	// at once: the deadline stays passed.
	collect := func(answered time.Time, wait time.Duration) (lat []time.Duration, lost, early int, err error) {
		deadline := make(chan struct{})
		timer := time.AfterFunc(wait, func() { close(deadline) })
		defer timer.Stop()
		homeLat, globalLat = nil, nil
		for i, s := range sockets {
			select {
			case at, ok := <-s.got:
				if !ok {
					lost++
					continue
				}
				d := at.Sub(answered)
				if d < 0 {
					early++
					d = 0
				}
				lat = append(lat, d)
				if i < r.home {
					homeLat = append(homeLat, d)
				} else {
					globalLat = append(globalLat, d)
				}
			case err := <-errs:
				return nil, 0, 0, err
			case <-deadline:
				lost++
			}
		}
		return lat, lost, early, nil
	}
	// A socket whose subscription was not started yet misses a warm-up
	// post for good, so a warm-up waits only warmUpWait for it, not the
	// whole live timeout, before it tries again.
	for range 10 {
		answered, err := publish("live warm-up")
		if err != nil {
			return r, err
		}
		if _, r.warmLost, _, err = collect(answered, min(o.liveTimeout, warmUpWait)); err != nil {
			return r, err
		}
		if r.warmLost == 0 {
			break
		}
		// Drop what came late, and try again.
		fmt.Fprintf(out, "live: %d subscribers missed the warm-up post\n", r.warmLost)
		time.Sleep(time.Second)
		for _, s := range sockets {
			for len(s.got) > 0 {
				<-s.got
			}
		}
	}
	time.Sleep(o.liveIdle)
	if o.serverPID > 0 {
		if r.rssAfter, err = serverRSS(o.serverPID); err != nil {
			return r, fmt.Errorf("server RSS: %w", err)
		}
	}
	// The tool's garbage collector stays off while the measured post is
	// delivered: a collection then would scan its 10,000 readers' stacks
	// on the CPUs the server needs (a quarter of the tool's CPU over the
	// burst in a profile), and the burst allocates little.
	runtime.GC()
	gc := debug.SetGCPercent(-1)
	mark, server := markCPU(ctx, db.Client()), serverCPU(o)
	answered, err := publish("live: the measured post")
	if err != nil {
		debug.SetGCPercent(gc)
		return r, err
	}
	lat, lost, early, err := collect(answered, o.liveTimeout)
	end := markCPU(ctx, db.Client())
	debug.SetGCPercent(gc)
	if err != nil {
		return r, err
	}
	r.window = end.at.Sub(mark.at)
	r.serverCPU, r.toolCPU, r.redisCPU = since(server, serverCPU(o)), since(mark.tool, end.tool), since(mark.redis, end.redis)
	r.lost, r.early = lost, early
	pct := func(lat []time.Duration, p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		slices.Sort(lat)
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	r.p50, r.p99, r.max = pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1)
	r.globalP50, r.globalP99 = pct(globalLat, 0.5), pct(globalLat, 0.99)
	r.homeP50, r.homeP99 = pct(homeLat, 0.5), pct(homeLat, 0.99)
	return r, nil
}

// runtimeSettle gives the server a moment after the seeding, so that the
// RSS read before the sockets is not in the middle of a burst.
func runtimeSettle() { time.Sleep(2 * time.Second) }
