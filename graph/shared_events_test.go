package graph

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// TestViewerFieldsAreKnown lists the schema's fields whose values depend
// on who asks, as dependsOnViewer finds them: a live event's bytes are
// shared between two viewers only if its selection has none of them. A
// field added to the schema that depends on the viewer without saying so
// would be shared across viewers; this list is the place to notice.
func TestViewerFieldsAreKnown(t *testing.T) {
	schema := loadSchema(t, "../schema.graphqls")
	var got []string
	for _, def := range schema.Types {
		if def.BuiltIn {
			continue
		}
		for _, f := range def.Fields {
			if dependsOnViewer(&ast.Field{Name: f.Name, Definition: f}) {
				got = append(got, def.Name+"."+f.Name)
			}
		}
	}
	slices.Sort(got)
	want := []string{
		"AuthPayload.user",
		"FollowPayload.viewer",
		"Mutation.deletePost",
		"Mutation.logoutEverywhere",
		"Query.homeTimeline",
		"Query.viewer",
		"Subscription.homeTimeline",
		"User.commonFollowers",
		"User.commonFollowing",
		"User.followersYouFollow",
		"User.followsViewer",
		"User.viewerIsFollowing",
	}
	if !slices.Equal(got, want) {
		t.Errorf("fields that depend on the viewer:\n%v\nwant\n%v", got, want)
	}
}

// A live event goes through gqlgen's response handler for the first
// subscriber of each selection only: the others write it from that
// marshalling themselves (wsOperation.pull). Their messages must be those
// the handler would have made: the same bytes on every socket of the same
// protocol, the legacy protocol's with its own type, each viewer's own
// where the selection depends on the viewer, and every event there, in
// order.
func TestLiveEventsWrittenFromSharedBytes(t *testing.T) {
	db := redisdb.NewDB(redistest.New(t).Client(t), redisdb.Options{})
	hub := redisdb.NewHub(db)
	t.Cleanup(func() { hub.Close() })
	auth := redisdb.NewAuthService(db)
	r := &Resolver{
		Users:   redisdb.NewUserService(db),
		Auth:    auth,
		Posts:   redisdb.NewPostService(db),
		Follows: redisdb.NewFollowService(db),
		Live:    hub,
	}
	srv := httptest.NewServer(NewHandler(HandlerConfig{Resolver: r, Sessions: hub, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	ctx := context.Background()
	signup := func(name string) *warble.AuthPayload {
		t.Helper()
		p, err := auth.Signup(ctx, warble.SignupInput{Username: name, Password: "correct horse"})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ada, bob, carol := signup("ada"), signup("bob"), signup("carol")
	if err := r.Follows.Follow(ctx, bob.User.ID, ada.User.ID); err != nil {
		t.Fatal(err)
	}
	post := func(body string) *warble.Post {
		t.Helper()
		p, err := r.Posts.CreatePost(ctx, ada.User.ID, body)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	after := warble.PostCursor(post("before").Seq)

	const (
		plain  = `subscription($a: String) { tl: globalTimeline(after: $a) { kind postId post { body author { username } } } }`
		viewer = `subscription($a: String) { globalTimeline(after: $a) { post { author { viewerIsFollowing } } } }`
	)
	type socket struct {
		name, proto, token, query string
		want                      func(p *warble.Post) string // the message
		conn                      *websocket.Conn
	}
	plainWant := func(typ string) func(p *warble.Post) string {
		return func(p *warble.Post) string {
			return `{"type":"` + typ + `","id":"s","payload":{"data":{"tl":{"kind":"POST_ADDED","postId":"` + p.ID +
				`","post":{"body":"` + p.Body + `","author":{"username":"ada"}}}}}}`
		}
	}
	viewerWant := func(follows string) func(p *warble.Post) string {
		return func(*warble.Post) string {
			return `{"type":"next","id":"s","payload":{"data":{"globalTimeline":{"post":{"author":{"viewerIsFollowing":` + follows + `}}}}}}`
		}
	}
	sockets := []*socket{
		{name: "first", proto: protoTransportWS, query: plain, want: plainWant("next")},
		{name: "second", proto: protoTransportWS, query: plain, want: plainWant("next")},
		{name: "third, signed in", proto: protoTransportWS, token: carol.Token, query: plain, want: plainWant("next")},
		{name: "legacy", proto: protoLegacyWS, query: plain, want: plainWant("data")},
		{name: "follower", proto: protoTransportWS, token: bob.Token, query: viewer, want: viewerWant("true")},
		{name: "follower again", proto: protoTransportWS, token: bob.Token, query: viewer, want: viewerWant("true")},
		{name: "stranger", proto: protoTransportWS, token: carol.Token, query: viewer, want: viewerWant("false")},
	}
	for _, s := range sockets {
		s.conn = dial(t, url, s.proto)
		init := `{"type":"connection_init"}`
		if s.token != "" {
			init = `{"type":"connection_init","payload":{"Authorization":"Bearer ` + s.token + `"}}`
		}
		send(t, s.conn, init)
		if m := readMessage(t, s.conn); m.Type != "connection_ack" {
			t.Fatalf("%s: %s %s, want connection_ack", s.name, m.Type, m.Payload)
		}
		start := "subscribe"
		if s.proto == protoLegacyWS {
			start = "start"
		}
		payload, _ := json.Marshal(map[string]any{"query": s.query, "variables": map[string]any{"a": after}})
		send(t, s.conn, `{"type":"`+start+`","id":"s","payload":`+string(payload)+`}`)
	}
	// readEvent reads the next message of s that is not a keep-alive, as
	// it came.
	readEvent := func(s *socket) string {
		t.Helper()
		for {
			s.conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net, not a speed bound
			_, data, err := s.conn.ReadMessage()
			if err != nil {
				t.Fatalf("%s: read: %v", s.name, err)
			}
			var m wsMessage
			json.Unmarshal(data, &m)
			if m.Type != "ka" && m.Type != "ping" {
				return string(data)
			}
		}
	}

	// The first post reaches every socket, by the replay of after if it
	// came before its subscription started: then all of them are live.
	before := sharedWrites.Load()
	for i := range 11 {
		p := post(fmt.Sprintf("post %d", i))
		for _, s := range sockets {
			if got, want := readEvent(s), s.want(p); got != want {
				t.Fatalf("%s, post %d:\n got %s\nwant %s", s.name, i, got, want)
			}
		}
	}
	// Each of the ten posts after the first is marshalled at least once
	// for each of three keys: the plain selection (which the signed-in and
	// the legacy sockets share, as it asks nothing of the viewer), and the
	// viewer's selection for bob and for carol. So at most 10 × (7 − 3) =
	// 40 writes come from shared bytes; a socket whose lookup came while
	// the first was still marshalling went through the handler instead
	// (about two in five, in runs with and without -race). None at all
	// would mean the path is gone.
	if n := sharedWrites.Load() - before; n == 0 || n > 40 {
		t.Errorf("%d events written from shared bytes, want 1 to 40", n)
	}
}
