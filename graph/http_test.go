package graph

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"
)

// TestWriteJSONAsEncodingJSON checks that writeJSON writes the bytes
// encoding/json writes, whether it takes its own way for data alone or
// not: data with characters encoding/json escapes, errors, extensions.
func TestWriteJSONAsEncodingJSON(t *testing.T) {
	hasNext := false
	for _, resp := range []*graphql.Response{
		{Data: json.RawMessage(`{"viewer":{"id":"1","username":"ada"}}`)},
		{Data: json.RawMessage(`{"post":{"body":"a <b> & c"}}`)},
		{Data: json.RawMessage(`{"post":{"body":"line\u2028separator"}}`)},
		{Data: json.RawMessage(`{"post":{"body":"a dash — and an arrow →"}}`)},
		{Data: json.RawMessage(`{"post":{"body":"\"quoted\" \\ é"}}`)},
		{Data: json.RawMessage(`null`), Errors: gqlerror.List{{Message: "Internal error."}}},
		{Data: json.RawMessage(`{"a":1}`), Extensions: map[string]any{"k": "v"}},
		{Data: json.RawMessage(`{"a":1}`), HasNext: &hasNext},
		{},
	} {
		want, err := json.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		writeJSON(rec, resp)
		if got := rec.Body.String(); got != string(want) {
			t.Errorf("writeJSON(%s) = %s, encoding/json writes %s", resp.Data, got, want)
		}
	}
}
