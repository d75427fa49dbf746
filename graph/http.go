package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
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
			if !isJSON(r.Header.Get("Content-Type")) {
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
		refuseOperation(r.Context(), w, exec, opCtx, errs, media)
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

// refuseOperation answers an operation that could not be made (errs from
// CreateOperationContext). Parse and validation errors are 422 in
// application/json and 400 in application/graphql-response+json, as its
// spec says; the others (an over-complex query, say) are 200.
func refuseOperation(ctx context.Context, w http.ResponseWriter, exec graphql.GraphExecutor,
	opCtx *graphql.OperationContext, errs gqlerror.List, media string) {
	status := http.StatusOK
	if errcode.GetErrorKind(errs) == errcode.KindProtocol {
		status = http.StatusUnprocessableEntity
		if media == mediaGraphQLResponse {
			status = http.StatusBadRequest
		}
	}
	w.WriteHeader(status)
	writeJSON(w, exec.DispatchError(graphql.WithOperationContext(ctx, opCtx), errs))
}

// postTransport serves queries and mutations over POST with a JSON body,
// as gqlgen's transport.POST does (the same statuses, content types and
// errors), but writes a response through writeJSON.
type postTransport struct{}

var _ graphql.Transport = postTransport{}

func (postTransport) Supports(r *http.Request) bool {
	if r.Method != http.MethodPost || r.Header.Get("Upgrade") != "" {
		return false
	}
	return isJSON(r.Header.Get("Content-Type"))
}

// isJSON reports whether a Content-Type is application/json, with or
// without parameters. The type as clients send it most, alone, is told
// without parsing, which makes a map of parameters.
func isJSON(contentType string) bool {
	if contentType == mediaJSON {
		return true
	}
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == mediaJSON
}

func (postTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	ctx := r.Context()
	media := responseMedia(r.Header.Get("Accept"))
	w.Header().Set("Content-Type", media)
	raw := &graphql.RawParams{}
	raw.ReadTime.Start = graphql.Now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeJSON(w, exec.DispatchError(ctx, gqlerror.List{gqlerror.Errorf("could not read request body: %+v", err)}))
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // Int arguments stay exact
	if err := dec.Decode(raw); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		writeJSON(w, exec.DispatchError(ctx, gqlerror.List{gqlerror.Errorf("json request body could not be decoded: %+v body:%s", err, body)}))
		return
	}
	raw.Headers = r.Header
	raw.ReadTime.End = graphql.Now()

	opCtx, errs := exec.CreateOperationContext(ctx, raw)
	if errs != nil {
		refuseOperation(ctx, w, exec, opCtx, errs, media)
		return
	}
	responses, ctx := exec.DispatchOperation(ctx, opCtx)
	writeJSON(w, responses(ctx))
}

// writeJSON writes resp. A response of data alone, as most are, is written
// around its data as it is: encoding/json would check and compact the whole
// of it again, which gqlgen's marshallers wrote compact, a tenth of a home
// page's CPU time. Data with a character encoding/json escapes in its
// output (<, >, &, U+2028 and U+2029) goes through encoding/json, so that
// every response has the same bytes either way.
func writeJSON(w http.ResponseWriter, resp *graphql.Response) {
	if len(resp.Errors) == 0 && resp.Label == "" && resp.Path == nil && resp.HasNext == nil && len(resp.Extensions) == 0 &&
		len(resp.Data) > 0 && !escapedByEncodingJSON(resp.Data) {
		b := make([]byte, 0, len(`{"data":}`)+len(resp.Data))
		b = append(b, `{"data":`...)
		b = append(b, resp.Data...)
		w.Write(append(b, '}'))
		return
	}
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

// escapedByEncodingJSON reports whether data may hold a character that
// encoding/json escapes in its output: <, > and &, and U+2028 and U+2029,
// which begin with the byte 0xE2 in UTF-8 (as do other characters, which
// then take encoding/json's way for nothing, and come out the same).
func escapedByEncodingJSON(data []byte) bool {
	for _, c := range data {
		switch c {
		case '<', '>', '&', 0xE2:
			return true
		}
	}
	return false
}
