package graph

import (
	"encoding/json"
	"mime"
	"net/http"
	"strings"

	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"github.com/vektah/gqlparser/v2/parser"
)

// requireJSON refuses a POST whose body is not JSON with 415 and an error
// in JSON, where gqlgen would answer "transport not supported" in plain
// text. Form and multipart bodies are not taken at all (see NewHandler).
func requireJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Upgrade") == "" {
			if status, msg := refuseGET(r); status != 0 {
				sendCoded(w, status, msg, CodeBadUserInput)
				return
			}
		}
		if r.Method == http.MethodPost {
			mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mediaType != "application/json" {
				w.Header().Set("Content-Type", "application/json")
				transport.SendError(w, http.StatusUnsupportedMediaType, &gqlerror.Error{
					Message:    "Send GraphQL requests as application/json.",
					Extensions: map[string]any{"code": CodeBadUserInput},
				})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// refuseGET returns the status and message of the refusals that gqlgen's
// GET transport would write itself, without an extensions.code: variables
// or extensions that are not JSON objects, and an operation other than a
// query. It returns 0 for a request to hand on (a document that does not
// parse, or names no such operation, is gqlgen's to answer).
func refuseGET(r *http.Request) (int, string) {
	q := r.URL.Query()
	for _, name := range []string{"variables", "extensions"} {
		if v := q.Get(name); v != "" {
			var m map[string]any
			if json.Unmarshal([]byte(v), &m) != nil {
				return http.StatusBadRequest, name + " could not be decoded"
			}
		}
	}
	// Only a document that spells one of these keywords can hold an
	// operation other than a query: the rest are not parsed twice.
	if query := q.Get("query"); strings.Contains(query, "mutation") || strings.Contains(query, "subscription") {
		doc, err := parser.ParseQueryWithTokenLimit(&ast.Source{Input: query}, MaxTokens)
		if err != nil {
			return 0, ""
		}
		if op := doc.Operations.ForName(q.Get("operationName")); op != nil && op.Operation != ast.Query {
			return http.StatusNotAcceptable, "GET requests only allow query operations"
		}
	}
	return 0, ""
}

// sendCoded answers with one GraphQL error carrying code.
func sendCoded(w http.ResponseWriter, status int, msg, code string) {
	w.Header().Set("Content-Type", "application/json")
	transport.SendError(w, status, &gqlerror.Error{Message: msg, Extensions: map[string]any{"code": code}})
}
