package app

import (
	"encoding/json"
	"strings"
	"testing"
)

// One event goes to many sockets, and its payload is marshalled once per
// distinct selection (graph/shared_events.go): each socket still gets
// exactly what its own selection, variables and viewer ask for.
func TestLiveEventSharedOnlyBetweenIdenticalSelections(t *testing.T) {
	s := newTestServer(t)
	bob := s.signup(t, "bob")
	ada := s.signup(t, "ada")
	carol := s.signup(t, "carol")
	s.follow(t, ada, bob)
	after := s.syncCursor(t, bob)

	const (
		small   = `subscription($a: String) { globalTimeline(after: $a) { kind postId } }`
		large   = `subscription($a: String) { globalTimeline(after: $a) { kind cursor post { body author { username } } } }`
		include = `subscription($a: String, $b: Boolean!) { globalTimeline(after: $a) { kind post @include(if: $b) { body } } }`
		viewer  = `subscription($a: String) { globalTimeline(after: $a) { post { author { username viewerIsFollowing } } } }`
	)
	subs := []struct {
		name, token, query string
		vars               map[string]any
		want               string // the event's JSON
	}{
		{"small", "", small, nil, `{"kind":"POST_ADDED","postId":"ID"}`},
		{"large", "", large, nil, `{"kind":"POST_ADDED","cursor":"CURSOR","post":{"body":"shared","author":{"username":"BOB"}}}`},
		{"small again", "", small, nil, `{"kind":"POST_ADDED","postId":"ID"}`},
		{"included", "", include, map[string]any{"b": true}, `{"kind":"POST_ADDED","post":{"body":"shared"}}`},
		{"excluded", "", include, map[string]any{"b": false}, `{"kind":"POST_ADDED"}`},
		{"follower", ada.Token, viewer, nil, `{"post":{"author":{"username":"BOB","viewerIsFollowing":true}}}`},
		{"stranger", carol.Token, viewer, nil, `{"post":{"author":{"username":"BOB","viewerIsFollowing":false}}}`},
		{"signed out", "", viewer, nil, `{"post":{"author":{"username":"BOB","viewerIsFollowing":false}}}`},
	}
	clients := make([]*wsClient, len(subs))
	for i, sub := range subs {
		vars := map[string]any{"a": after}
		for k, v := range sub.vars {
			vars[k] = v
		}
		clients[i] = s.connect(t, protoTransportWS, sub.token)
		clients[i].subscribe("1", sub.query, vars)
	}

	id := s.post(t, bob, "shared")
	for i, sub := range subs {
		m := clients[i].next()
		if m.Type != "next" {
			t.Fatalf("%s: got %s %s, want next", sub.name, m.Type, m.Payload)
		}
		var p struct {
			Data struct{ GlobalTimeline json.RawMessage }
		}
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			t.Fatal(err)
		}
		var got struct {
			Cursor string
		}
		json.Unmarshal(p.Data.GlobalTimeline, &got)
		want := sub.want
		for _, r := range [][2]string{{`"ID"`, `"` + id + `"`}, {`"BOB"`, `"` + bob.Username + `"`}, {`"CURSOR"`, `"` + got.Cursor + `"`}} {
			want = strings.ReplaceAll(want, r[0], r[1])
		}
		if string(p.Data.GlobalTimeline) != want {
			t.Errorf("%s: got %s, want %s", sub.name, p.Data.GlobalTimeline, want)
		}
	}
}
