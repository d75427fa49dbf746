package app

// Fixes found by the conformance suite in testdata/conformance, which runs
// GraphQL clients written elsewhere against Warble.

import "testing"

// TestLegacyConnectionErrorIsASentence: on the legacy graphql-ws protocol a
// refused token gets a connection_error before the 4403 close, and
// subscriptions-transport-ws hands its message to the app. It must be the
// same sentence as over HTTP, not the error's internal form.
func TestLegacyConnectionErrorIsASentence(t *testing.T) {
	s := newTestServer(t)
	overHTTP := s.query(t, "not-a-real-token", `{ viewer { id } }`, nil)
	if overHTTP.code() != "UNAUTHENTICATED" {
		t.Fatalf("a bad token over HTTP: %+v, want UNAUTHENTICATED", overHTTP.Errors)
	}
	want := overHTTP.Errors[0].Message

	c, _, err := s.dialWS(t, protoLegacyWS, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.init("not-a-real-token")
	m := c.next()
	if m.Type != "connection_error" {
		t.Fatalf("after a bad token got %+v, want connection_error", m)
	}
	var payload struct{ Message string }
	if err := jsonUnmarshal(m.Payload, &payload); err != nil {
		t.Fatalf("connection_error payload %s: %v", m.Payload, err)
	}
	if payload.Message != want {
		t.Fatalf("connection_error message %q, want %q as over HTTP", payload.Message, want)
	}
}
