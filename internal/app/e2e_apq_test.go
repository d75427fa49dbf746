package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/warble/warble/internal/redistest"
)

// TestAutomaticPersistedQueries follows the protocol as Apollo's clients
// use it: the hash alone first; on PERSISTED_QUERY_NOT_FOUND the hash with
// the query, which stores it; then the hash alone works, over POST and GET,
// from any client.
func TestAutomaticPersistedQueries(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "apq")
	s.post(t, u, "persisted")
	const query = `{ globalTimeline(first: 1) { edges { node { body } } } }`
	sum := sha256.Sum256([]byte(query))
	hash := hex.EncodeToString(sum[:])
	ext := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hash}}
	send := func(withQuery bool, extensions map[string]any) gqlResponse {
		body := map[string]any{"extensions": extensions}
		if withQuery {
			body["query"] = query
		}
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", jsonBody(body))
		req.Header.Set("Content-Type", "application/json")
		return s.send(t, req)
	}
	wantBody := func(r gqlResponse, what string) {
		t.Helper()
		var out struct {
			GlobalTimeline struct {
				Edges []struct{ Node struct{ Body string } }
			}
		}
		r.decode(t, &out)
		if e := out.GlobalTimeline.Edges; len(e) != 1 || e[0].Node.Body != "persisted" {
			t.Fatalf("%s: %+v", what, out)
		}
	}

	if r := send(false, ext); r.code() != "PERSISTED_QUERY_NOT_FOUND" {
		t.Fatalf("an unknown hash: %+v, want PERSISTED_QUERY_NOT_FOUND", r.Errors)
	}
	wantBody(send(true, ext), "the hash with its query")
	wantBody(send(false, ext), "the hash alone, once stored")

	extJSON, _ := json.Marshal(ext)
	get, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?extensions="+url.QueryEscape(string(extJSON)), nil)
	wantBody(s.send(t, get), "the hash alone over GET")

	// The store is Redis, shared by every process, and entries expire.
	rdb := s.redis.Client(t)
	if ttl := rdb.TTL(context.Background(), "w:apq:"+hash).Val(); ttl <= 0 {
		t.Fatalf("persisted query TTL = %v, want an expiry", ttl)
	}

	// A document that does not validate is not kept.
	const invalid = `{ noSuchField }`
	invalidSum := sha256.Sum256([]byte(invalid))
	invalidHash := hex.EncodeToString(invalidSum[:])
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", jsonBody(map[string]any{"query": invalid,
		"extensions": map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": invalidHash}}}))
	req.Header.Set("Content-Type", "application/json")
	if r := s.send(t, req); r.code() != "GRAPHQL_VALIDATION_FAILED" {
		t.Fatalf("an invalid document: %+v, want GRAPHQL_VALIDATION_FAILED", r.Errors)
	}
	if n := rdb.Exists(context.Background(), "w:apq:"+invalidHash).Val(); n != 0 {
		t.Fatal("a document that failed validation was stored")
	}

	bad := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hex.EncodeToString(make([]byte, 32))}}
	if r := send(true, bad); r.code() != "BAD_USER_INPUT" {
		t.Fatalf("a hash that does not match its query: %+v, want BAD_USER_INPUT", r.Errors)
	}
	garbage := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": "../../etc"}}
	if r := send(false, garbage); r.code() != "PERSISTED_QUERY_NOT_FOUND" {
		t.Fatalf("a malformed hash: %+v, want PERSISTED_QUERY_NOT_FOUND", r.Errors)
	}
}

// TestPersistedMutationOverGETIsRefusedWithACode: a mutation stored as a
// persisted query (over POST, where mutations belong) and then sent over
// GET by its hash alone is refused as one spelled out in query= is: 406
// with BAD_USER_INPUT, and nothing written.
func TestPersistedMutationOverGETIsRefusedWithACode(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "apqget")
	const mutation = `mutation { createPost(input: {body: "over GET"}) { post { id } } }`
	sum := sha256.Sum256([]byte(mutation))
	ext := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hex.EncodeToString(sum[:])}}
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", jsonBody(map[string]any{"query": mutation, "extensions": ext}))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+u.Token)
	if r := s.send(t, req); len(r.Errors) > 0 {
		t.Fatalf("storing the mutation over POST: %+v", r.Errors)
	}
	before := s.home(t, u, 10).bodies()

	extJSON, _ := json.Marshal(ext)
	get, _ := http.NewRequest(http.MethodGet, s.URL+"/graphql?extensions="+url.QueryEscape(string(extJSON)), nil)
	get.Header.Set("Authorization", "Bearer "+u.Token)
	if r := s.send(t, get); r.Status != http.StatusNotAcceptable || r.code() != "BAD_USER_INPUT" {
		t.Fatalf("the mutation's hash over GET: status %d, errors %+v, want 406 with BAD_USER_INPUT", r.Status, r.Errors)
	}
	if after := s.home(t, u, 10).bodies(); len(after) != len(before) {
		t.Fatalf("the refused GET posted: home %q, before %q", after, before)
	}
}

// TestPersistedQueryWithBadTokenIsNotStored: a query sent with its hash
// and a wrong or revoked token is answered UNAUTHENTICATED, and nothing is
// written, its persisted query neither: a request whose token fails runs
// nothing, and stores nothing on its way.
func TestPersistedQueryWithBadTokenIsNotStored(t *testing.T) {
	s := newTestServer(t)
	gone := s.signup(t, "apqgone")
	var out struct{ Logout bool }
	s.mustQuery(t, gone.Token, `mutation { logout }`, nil, &out)
	userID, _, _ := strings.Cut(gone.Token, ".")
	wrong := userID + "." + strings.Repeat("A", 43)
	rdb := s.redis.Client(t)
	for i, token := range []string{wrong, gone.Token} {
		query := fmt.Sprintf(`{ globalTimeline(first: %d) { edges { node { body } } } }`, i+1)
		sum := sha256.Sum256([]byte(query))
		ext := map[string]any{"persistedQuery": map[string]any{"version": 1, "sha256Hash": hex.EncodeToString(sum[:])}}
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", jsonBody(map[string]any{"query": query, "extensions": ext}))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		s.waitFirstPass(t)
		before := redistest.Snapshot(t, rdb)
		if r := s.send(t, req); r.code() != "UNAUTHENTICATED" {
			t.Fatalf("a persisted query with a bad token: %+v, want UNAUTHENTICATED", r.Errors)
		}
		redistest.AssertUnchanged(t, rdb, before, "a persisted query with a bad token")
	}
}
