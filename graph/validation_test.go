package graph

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// postQuery sends query to h as a JSON POST and decodes the errors.
func postQuery(t *testing.T, h http.Handler, query string) []struct {
	Message    string
	Extensions map[string]any
} {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"query": query})
	req := httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var resp struct {
		Errors []struct {
			Message    string
			Extensions map[string]any
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		t.Fatalf("%s: answer %q: %v", query, rec.Body.String(), err)
	}
	return resp.Errors
}

// TestSuggestionsFollowTheirSetting: every validation rule that can say
// "Did you mean …?" says it with suggestions on, and none does with them
// off. Only the validation stage runs, so the resolvers need no services.
func TestSuggestionsFollowTheirSetting(t *testing.T) {
	queries := map[string]string{
		"FieldsOnCorrectType": `{ viewr { id } }`,
		"KnownArgumentNames":  `{ globalTimeline(frist: 1) { edges { cursor } } }`,
		"KnownTypeNames":      `{ ...F } fragment F on Qurey { viewer { id } }`,
		"ScalarLeafs":         `{ viewer }`,
		"ValuesOfCorrectType": `mutation { createPost(input: {bdy: "hello"}) { post { id } } }`,
	}
	log := slog.New(slog.DiscardHandler)
	for _, suggestions := range []bool{true, false} {
		h := NewHandler(HandlerConfig{Resolver: &Resolver{}, Suggestions: suggestions, Logger: log})
		for rule, q := range queries {
			errs := postQuery(t, h, q)
			if len(errs) == 0 {
				t.Fatalf("%s: no errors, want GRAPHQL_VALIDATION_FAILED", rule)
			}
			suggested := false
			for _, e := range errs {
				if e.Extensions["code"] != "GRAPHQL_VALIDATION_FAILED" {
					t.Fatalf("%s: %+v, want GRAPHQL_VALIDATION_FAILED", rule, errs)
				}
				suggested = suggested || strings.Contains(e.Message, "Did you mean")
			}
			if suggested != suggestions {
				t.Errorf("suggestions %v: %s says %+v", suggestions, rule, errs)
			}
		}
	}
}

// TestRefusedIntrospectionIsAClientError: with introspection off, asking
// for the schema is a validation error with a plain sentence, wherever the
// field hides (a fragment, __type), and nothing is logged above debug;
// __typename still works.
func TestRefusedIntrospectionIsAClientError(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := NewHandler(HandlerConfig{Resolver: &Resolver{}, Logger: log})
	for _, q := range []string{
		`{ __schema { queryType { name } } }`,
		`{ __type(name: "Post") { name } }`,
		`query { ...F } fragment F on Query { __schema { types { name } } }`,
	} {
		errs := postQuery(t, h, q)
		if len(errs) == 0 {
			t.Errorf("%s: no error, want introspection refused", q)
		}
		for _, e := range errs {
			if e.Extensions["code"] != "GRAPHQL_VALIDATION_FAILED" || e.Message != "Introspection is disabled on this server." {
				t.Errorf("%s: %+v, want GRAPHQL_VALIDATION_FAILED saying introspection is disabled", q, errs)
			}
		}
	}
	if errs := postQuery(t, h, `{ __typename }`); len(errs) != 0 {
		t.Errorf("__typename: %+v", errs)
	}
	if logged.Len() > 0 {
		t.Errorf("refused introspection was logged:\n%s", logged.String())
	}

	open := NewHandler(HandlerConfig{Resolver: &Resolver{}, Introspection: true, Logger: log})
	if errs := postQuery(t, open, `{ __schema { queryType { name } } }`); len(errs) != 0 {
		t.Errorf("introspection on: %+v", errs)
	}
}

// TestStandardIntrospectionQueryPasses: the introspection query that
// GraphQL tools send (graphql-js's getIntrospectionQuery, whose TypeRef
// fragment unwraps eight levels of list and non-null) is not refused by the
// depth limit, while an operation as deep in ordinary fields is.
func TestStandardIntrospectionQueryPasses(t *testing.T) {
	typeRef := "kind name"
	for range 8 {
		typeRef = "kind name ofType { " + typeRef + " }"
	}
	query := `query IntrospectionQuery {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types { ...FullType }
    directives { name description locations args { ...InputValue } }
  }
}
fragment FullType on __Type {
  kind name description
  fields(includeDeprecated: true) { name description args { ...InputValue } type { ...TypeRef } isDeprecated deprecationReason }
  inputFields { ...InputValue }
  interfaces { ...TypeRef }
  enumValues(includeDeprecated: true) { name description isDeprecated deprecationReason }
  possibleTypes { ...TypeRef }
}
fragment InputValue on __InputValue { name description type { ...TypeRef } defaultValue }
fragment TypeRef on __Type { ` + typeRef + ` }`
	h := NewHandler(HandlerConfig{Resolver: &Resolver{}, Introspection: true, Logger: slog.New(slog.DiscardHandler)})
	if errs := postQuery(t, h, query); len(errs) != 0 {
		t.Fatalf("the standard introspection query: %+v", errs)
	}
	deep := "id"
	for range MaxDepth {
		deep = "author { " + deep + " }"
	}
	if errs := postQuery(t, h, "{ node(id: \"1:1\") { ... on Post { "+deep+" } } }"); len(errs) == 0 || errs[0].Extensions["code"] != "GRAPHQL_VALIDATION_FAILED" {
		t.Fatalf("an operation nested past MaxDepth: %+v, want GRAPHQL_VALIDATION_FAILED", errs)
	}
}
