package graph

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/vektah/gqlparser/v2/ast"
)

// TestNoFieldMiddleware builds the handler with every extension it can
// have: none may be field middleware, which the plain fields of the
// generated code would skip (gen_rewrite.go), so NewHandler panics on one.
func TestNoFieldMiddleware(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("NewHandler: %v", r)
		}
	}()
	NewHandler(HandlerConfig{
		Resolver:         &Resolver{},
		Introspection:    true,
		PersistedQueries: lru.New[string](10),
		Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

// TestObjectFieldsWriteEachNameOnce checks marshalFields against what
// gqlgen's FieldSet writes: fields in order, a repeated name once, the
// first value.
func TestObjectFieldsWriteEachNameOnce(t *testing.T) {
	fields := make([]graphql.CollectedField, 3)
	for i, alias := range []string{"id", "body", "id"} {
		fields[i].Field = &ast.Field{Alias: alias}
	}
	out := graphql.NewFieldSet(fields)
	out.Values[0], out.Values[1], out.Values[2] = graphql.MarshalString("1"), graphql.MarshalString(`say "hi"`), graphql.MarshalString("2")
	var want, got strings.Builder
	out.MarshalGQL(&want)
	marshalFields(fields, out).MarshalGQL(&got)
	if got.String() != want.String() || got.String() != `{"id":"1","body":"say \"hi\""}` {
		t.Fatalf("marshalFields wrote %s, gqlgen's FieldSet %s", got.String(), want.String())
	}
}

// TestPlainStringAsMarshalString checks that plainString writes the bytes
// gqlgen's MarshalString writes.
func TestPlainStringAsMarshalString(t *testing.T) {
	for _, s := range []string{
		"", "plain", `say "hi"`, `back\slash`, "tab\tcr\rlf\n", "\x00\x01\x1f\x7f", "é 日本 🐦", "\u2028\u2029", "bad \xff utf-8", "<b>&amp;</b>",
	} {
		var want, got strings.Builder
		graphql.MarshalString(s).MarshalGQL(&want)
		plainString{&s}.MarshalGQL(&got)
		if got.String() != want.String() {
			t.Errorf("plainString(%q) wrote %s, MarshalString %s", s, got.String(), want.String())
		}
	}
}

// TestPlainTimeWritesMilliseconds checks the Time scalar's shape, written
// into gqlgen's kind of buffer (its spare room) and into any other writer.
func TestPlainTimeWritesMilliseconds(t *testing.T) {
	at := time.Date(2026, 11, 22, 8, 3, 1, 120_456_000, time.FixedZone("CET", 3600))
	const want = `"2026-11-22T07:03:01.120Z"`
	var buf bytes.Buffer
	buf.WriteString("x")
	plainTime{&at}.MarshalGQL(&buf)
	var sb strings.Builder
	MarshalTime(at).MarshalGQL(&sb)
	if buf.String() != "x"+want || sb.String() != want {
		t.Fatalf("plainTime wrote %s into a bytes.Buffer after x, MarshalTime %s into a strings.Builder; want %s", buf.String(), sb.String(), want)
	}
}
