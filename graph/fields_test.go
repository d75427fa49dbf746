package graph

import (
	"bytes"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/validator/rules"
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

// TestObjectFieldsWriteEachNameOnce checks an object's marshaller against
// what gqlgen's FieldSet writes: fields in order, a repeated name once,
// the first value.
func TestObjectFieldsWriteEachNameOnce(t *testing.T) {
	fields := make([]graphql.CollectedField, 3)
	for i, alias := range []string{"id", "body", "id"} {
		fields[i].Field = &ast.Field{Alias: alias}
	}
	var objs objects
	object := objs.object(fields)
	out := graphql.NewFieldSet(fields)
	for _, set := range []*graphql.FieldSet{&object.out, out} {
		set.Values[0], set.Values[1], set.Values[2] = graphql.MarshalString("1"), graphql.MarshalString(`say "hi"`), graphql.MarshalString("2")
	}
	var want, got strings.Builder
	out.MarshalGQL(&want)
	object.MarshalGQL(&got)
	if got.String() != want.String() || got.String() != `{"id":"1","body":"say \"hi\""}` {
		t.Fatalf("the object wrote %s, gqlgen's FieldSet %s", got.String(), want.String())
	}
}

// TestObjectsShareNoValues takes a page's worth of objects of different
// sizes from one execution's chunks and checks that each has values of
// its own: as many as its fields, no room to grow into its neighbour's,
// and none written by another. It also checks that the chunks are what
// saves the allocations (a count, not a timing).
func TestObjectsShareNoValues(t *testing.T) {
	var objs objects
	var all []*object
	for i := range 200 {
		fields := make([]graphql.CollectedField, i%7)
		o := objs.object(fields)
		if len(o.out.Values) != len(fields) || cap(o.out.Values) != len(fields) || len(o.fields) != len(fields) {
			t.Fatalf("object %d of %d fields: %d values, room for %d, %d fields kept", i, len(fields), len(o.out.Values), cap(o.out.Values), len(o.fields))
		}
		for j := range o.out.Values {
			o.out.Values[j] = graphql.MarshalInt(i)
		}
		all = append(all, o)
	}
	for i, o := range all {
		for j, v := range o.out.Values {
			var b strings.Builder
			v.MarshalGQL(&b)
			if b.String() != strconv.Itoa(i) {
				t.Fatalf("object %d, value %d: %s", i, j, b.String())
			}
		}
	}
	fields := make([]graphql.CollectedField, 5)
	allocs := testing.AllocsPerRun(10, func() {
		var page objects
		for range 61 {
			page.object(fields)
		}
	})
	if allocs > 16 {
		t.Errorf("61 objects of 5 fields took %.0f allocations", allocs)
	}
}

// TestObjectsCollectOncePerSelection checks that the fields an execution
// collects for a selection and a type are gqlgen's, looked up again
// rather than collected again, and told apart by type.
func TestObjectsCollectOncePerSelection(t *testing.T) {
	doc, errs := gqlparser.LoadQueryWithRules(parsedSchema, `{ viewer { id username ... on User { displayName } } }`, rules.NewDefaultRules())
	if errs != nil {
		t.Fatal(errs)
	}
	oc := &graphql.OperationContext{Doc: doc, Operation: doc.Operations[0], Variables: map[string]any{}}
	sel := doc.Operations[0].SelectionSet[0].(*ast.Field).SelectionSet
	var objs objects
	got := objs.collect(oc, sel, userImplementors)
	want := graphql.CollectFields(oc, sel, userImplementors)
	var names []string
	for _, f := range got {
		names = append(names, f.Alias)
	}
	if strings.Join(names, ",") != "id,username,displayName" || len(got) != len(want) {
		t.Fatalf("collected %v, gqlgen %d fields", names, len(want))
	}
	if again := objs.collect(oc, sel, userImplementors); &again[0] != &got[0] {
		t.Error("the same selection was collected again")
	}
	if other := objs.collect(oc, sel, postImplementors); len(other) != 2 {
		t.Errorf("collected %d fields for a Post, want 2 (no fragment on User)", len(other))
	}
}

// TestCollectedFieldsSharedAcrossExecutions checks that executions of the
// same document share the fields collected for a selection set whose
// collection depends on the document alone, and that a collection that a
// variable can change (@include, @skip, also on a fragment), or of a long
// query, is made for each execution.
func TestCollectedFieldsSharedAcrossExecutions(t *testing.T) {
	load := func(query string) *ast.QueryDocument {
		t.Helper()
		doc, errs := gqlparser.LoadQueryWithRules(parsedSchema, query, rules.NewDefaultRules())
		if errs != nil {
			t.Fatal(errs)
		}
		return doc
	}
	execution := func(doc *ast.QueryDocument, vars map[string]any) *graphql.OperationContext {
		return &graphql.OperationContext{Doc: doc, Operation: doc.Operations[0], Variables: vars}
	}
	names := func(fields []graphql.CollectedField) string {
		var out []string
		for _, f := range fields {
			out = append(out, f.Alias)
		}
		return strings.Join(out, ",")
	}
	viewerSel := func(doc *ast.QueryDocument) ast.SelectionSet {
		return doc.Operations[0].SelectionSet[0].(*ast.Field).SelectionSet
	}

	doc := load(`{ viewer { id name: username ...F ... on User { createdAt } } } fragment F on User { displayName }`)
	first := collectFields(execution(doc, map[string]any{}), viewerSel(doc), userImplementors)
	second := collectFields(execution(doc, map[string]any{}), viewerSel(doc), userImplementors)
	if names(first) != "id,name,displayName,createdAt" {
		t.Fatalf("collected %s", names(first))
	}
	if &first[0] != &second[0] {
		t.Error("a second execution of the document collected the fields again")
	}
	if root := collectFields(execution(doc, map[string]any{}), doc.Operations[0].SelectionSet, queryType); names(root) != "viewer" {
		t.Errorf("collected %s at the root, want viewer", names(root))
	}
	// A long query is collected for each execution: what a client sending
	// ever new ones makes the cache keep stays small.
	long := load(`{ viewer { id username } }` + strings.Repeat(" ", maxStaticQuery))
	longExecution := func() *graphql.OperationContext {
		oc := execution(long, map[string]any{})
		oc.RawQuery = `{ viewer { id username } }` + strings.Repeat(" ", maxStaticQuery)
		return oc
	}
	if a, b := collectFields(longExecution(), viewerSel(long), userImplementors), collectFields(longExecution(), viewerSel(long), userImplementors); &a[0] == &b[0] {
		t.Error("the fields of a query longer than maxStaticQuery were kept")
	}

	for _, query := range []string{
		`query($x: Boolean!) { viewer { id username @include(if: $x) } }`,
		`query($x: Boolean!) { viewer { id ... @include(if: $x) { username } } }`,
		`query($x: Boolean!) { viewer { id ...F @include(if: $x) } } fragment F on User { username }`,
		`query($x: Boolean!) { viewer { id ...F } } fragment F on User { username @include(if: $x) }`,
	} {
		doc := load(query)
		with := collectFields(execution(doc, map[string]any{"x": true}), viewerSel(doc), userImplementors)
		without := collectFields(execution(doc, map[string]any{"x": false}), viewerSel(doc), userImplementors)
		if names(with) != "id,username" || names(without) != "id" {
			t.Errorf("%s: collected %s with x and %s without, want id,username and id", query, names(with), names(without))
		}
	}

	// Two selection sets of one document with the same first and last
	// node and length, as gqlgen's merging of fields can make, are told
	// apart by their middle.
	doc = load(`{ viewer { id username displayName createdAt } }`)
	nodes := viewerSel(doc)
	a := ast.SelectionSet{nodes[0], nodes[1], nodes[3]}
	b := ast.SelectionSet{nodes[0], nodes[2], nodes[3]}
	if got := names(collectFields(execution(doc, map[string]any{}), a, userImplementors)); got != "id,username,createdAt" {
		t.Errorf("collected %s, want id,username,createdAt", got)
	}
	if got := names(collectFields(execution(doc, map[string]any{}), b, userImplementors)); got != "id,displayName,createdAt" {
		t.Errorf("collected %s, want id,displayName,createdAt", got)
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
