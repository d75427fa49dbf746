package graph

import (
	"encoding/json"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"
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
				sendCoded(w, http.StatusUnsupportedMediaType, "Send GraphQL requests as application/json.", CodeBadUserInput)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// getTransport serves queries over GET as gqlgen's transport.GET does (the
// same statuses and content types), but every refusal it writes carries an
// extensions.code, and the check that the operation is a query runs on the
// operation as the executor resolved it: a persisted query sent by its hash
// alone is refused as a mutation too, not only a document in query=.
type getTransport struct{}

var _ graphql.Transport = getTransport{}

// Media types a GET may be answered in.
const (
	mediaJSON            = "application/json"
	mediaGraphQLResponse = "application/graphql-response+json"
)

func (getTransport) Supports(r *http.Request) bool {
	return r.Method == http.MethodGet && r.Header.Get("Upgrade") == ""
}

func (getTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	media := responseMedia(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", media)
	refuse := func(status int, msg string) {
		w.WriteHeader(status)
		writeJSON(w, &graphql.Response{Errors: gqlerror.List{{Message: msg, Extensions: map[string]any{"code": CodeBadUserInput}}}})
	}
	params, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		refuse(http.StatusBadRequest, "The query string could not be decoded.")
		return
	}
	raw := &graphql.RawParams{
		Query:         params.Get("query"),
		OperationName: params.Get("operationName"),
		Headers:       r.Header,
	}
	raw.ReadTime.Start = graphql.Now()
	for name, dst := range map[string]*map[string]any{"variables": &raw.Variables, "extensions": &raw.Extensions} {
		if v := params.Get(name); v != "" {
			dec := json.NewDecoder(strings.NewReader(v))
			dec.UseNumber() // as POST decodes them: Int arguments stay exact
			if dec.Decode(dst) != nil {
				refuse(http.StatusBadRequest, name+" could not be decoded")
				return
			}
		}
	}
	raw.ReadTime.End = graphql.Now()

	opCtx, errs := exec.CreateOperationContext(r.Context(), raw)
	if errs != nil {
		status := http.StatusOK
		if errcode.GetErrorKind(errs) == errcode.KindProtocol {
			// Parse and validation errors: 422 in application/json, 400
			// in application/graphql-response+json, as its spec says.
			status = http.StatusUnprocessableEntity
			if media == mediaGraphQLResponse {
				status = http.StatusBadRequest
			}
		}
		w.WriteHeader(status)
		writeJSON(w, exec.DispatchError(graphql.WithOperationContext(r.Context(), opCtx), errs))
		return
	}
	if opCtx.Operation.Operation != ast.Query {
		// Mutations over GET would let any page that can embed an image
		// change data; subscriptions need a websocket.
		refuse(http.StatusNotAcceptable, "GET requests only allow query operations")
		return
	}
	responses, ctx := exec.DispatchOperation(r.Context(), opCtx)
	writeJSON(w, responses(ctx))
}

// responseMedia picks the media type of an answer from the Accept header,
// as gqlgen's transports do: the first of the two GraphQL answers' types
// that Accept names, application/json for none or a wildcard, and
// application/graphql-response+json for anything else.
func responseMedia(accept string) string {
	if accept == "" {
		return mediaJSON
	}
	for part := range strings.SplitSeq(accept, ",") {
		mediaType, _, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		switch mediaType {
		case "*/*", "application/*", mediaJSON:
			return mediaJSON
		case mediaGraphQLResponse:
			return mediaGraphQLResponse
		}
	}
	return mediaGraphQLResponse
}

func writeJSON(w http.ResponseWriter, resp *graphql.Response) {
	b, err := json.Marshal(resp)
	if err != nil {
		// A response is built of marshallable values only; this would be a
		// bug, and the client gets a coded error rather than half a body.
		b = []byte(`{"errors":[{"message":"Internal error.","extensions":{"code":"INTERNAL"}}]}`)
	}
	w.Write(b)
}

// sendCoded answers with one GraphQL error carrying code.
func sendCoded(w http.ResponseWriter, status int, msg, code string) {
	w.Header().Set("Content-Type", "application/json")
	transport.SendError(w, status, &gqlerror.Error{Message: msg, Extensions: map[string]any{"code": code}})
}
