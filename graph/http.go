package graph

import (
	"mime"
	"net/http"

	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// requireJSON refuses a POST whose body is not JSON with 415 and an error
// in JSON, where gqlgen would answer "transport not supported" in plain
// text. Form and multipart bodies are not taken at all (see NewHandler).
func requireJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
