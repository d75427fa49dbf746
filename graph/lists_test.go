package graph

import (
	"os"
	"regexp"
	"testing"

	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
)

// TestListFieldsThatWait checks that marshalList knows every field that may
// wait: the fields with a resolver, and those that generated.go resolves
// by calling a method with a context. It also checks that generated.go was
// rewritten by go generate (gen_rewrite.go runs after gqlgen): its lists
// go through marshalList, its deferred groups through deferredPath, and its
// subscriptions' events through sharedTimelineEvent. A plain gqlgen
// generate undoes those rewrites; this test is what notices.
func TestListFieldsThatWait(t *testing.T) {
	src, err := os.ReadFile("generated.go")
	if err != nil {
		t.Fatal(err)
	}
	if regexp.MustCompile(`graphql\.MarshalSliceConcurrently\(|graphql\.GetPath\(ctx\),`).Match(src) {
		t.Error("generated.go calls graphql.MarshalSliceConcurrently or GetPath for a deferred group: run go generate, which rewrites them")
	}
	if n := len(regexp.MustCompile(`return ec\.sharedTimelineEvent\(ctx, selections, v, &ec\.objects\)`).FindAll(src, -1)); n != 3 {
		t.Errorf("generated.go marshals %d of the 3 timeline subscriptions' events through sharedTimelineEvent: run go generate, which rewrites them", n)
	}
	methods := regexp.MustCompile(`(?s)func \(ec \*executionContext\) _(\w+)_(\w+)\(ctx context\.Context, field graphql\.CollectedField, obj [^)]*\) \(ret graphql\.Marshaler\) \{\n(.*?)\n}\n`)
	callsWithContext := regexp.MustCompile(`return obj\.\w+\(ctx`)
	n := 0
	for _, m := range methods.FindAllSubmatch(src, -1) {
		if object, field := string(m[1]), string(m[2]); callsWithContext.Match(m[3]) {
			n++
			if !waits(&ast.Definition{Kind: ast.Object, Name: object}, field) {
				t.Errorf("%s.%s calls a method with a context, and marshalList does not know that it may wait", object, field)
			}
		}
	}
	if n == 0 {
		t.Error("found no field bound to a method with a context in generated.go: has its form changed?")
	}
	// On an interface, a field waits if it does on any object.
	iface := &ast.Definition{Kind: ast.Interface, Name: "Node"}
	if !waits(iface, "author") || waits(iface, "id") || waits(iface, "node") {
		t.Error("waits on an interface: want author (Post's resolver) to wait, and id and node (Query's) not")
	}
	for _, f := range [][2]string{{"Post", "author"}, {"User", "followersCount"}, {"User", "viewerIsFollowing"}, {"User", "followers"}} {
		if !waits(&ast.Definition{Kind: ast.Object, Name: f[0]}, f[1]) {
			t.Errorf("waits(%s, %s) = false, want true: it has a resolver", f[0], f[1])
		}
	}
	for _, f := range [][2]string{{"Post", "body"}, {"User", "username"}, {"PostEdge", "node"}} {
		if waits(&ast.Definition{Kind: ast.Object, Name: f[0]}, f[1]) {
			t.Errorf("waits(%s, %s) = true, want false", f[0], f[1])
		}
	}
}

// TestMayWait checks which selections under a list make marshalList keep
// gqlgen's goroutine per element.
func TestMayWait(t *testing.T) {
	schema := loadSchema(t, "../schema.graphqls")
	tests := []struct {
		name         string
		query        string // the list is the field named edges
		authorsKnown bool
		want         bool
	}{
		{name: "HomePage", query: `{ homeTimeline { edges { cursor node { id body createdAt author { id username } } } } }`, authorsKnown: true},
		{name: "AuthorsToLoad", query: `{ homeTimeline { edges { node { author { id } } } } }`, want: true},
		{name: "NoAuthor", query: `{ homeTimeline { edges { cursor node { id body } } } }`},
		{name: "Counts", query: `{ homeTimeline { edges { node { author { followersCount } } } } }`, authorsKnown: true, want: true},
		{name: "InFragment", query: `{ homeTimeline { edges { ...E } } } fragment E on PostEdge { node { author { viewerIsFollowing } } }`, authorsKnown: true, want: true},
		{name: "InInlineFragment", query: `{ homeTimeline { edges { ... on PostEdge { node { author { postsCount } } } } } }`, authorsKnown: true, want: true},
		{name: "PlainFragment", query: `{ homeTimeline { edges { ...E } } } fragment E on PostEdge { cursor node { body } }`},
		{name: "TotalCount", query: `{ user(username: "ada") { followers { edges { node { followers { totalCount } } } } } }`, want: true},
		{name: "Users", query: `{ user(username: "ada") { followers { edges { followedAt node { id username } } } } }`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc, errs := gqlparser.LoadQueryWithRules(schema, tt.query, nil)
			if errs != nil {
				t.Fatal(errs)
			}
			edges := findField(doc.Operations[0].SelectionSet, "edges")
			if edges == nil {
				t.Fatal("no edges field")
			}
			if got := mayWait(edges.SelectionSet, tt.authorsKnown); got != tt.want {
				t.Errorf("mayWait = %v, want %v", got, tt.want)
			}
		})
	}
}

// findField returns the first field named name in sel, depth first.
func findField(sel ast.SelectionSet, name string) *ast.Field {
	for _, s := range sel {
		if f, ok := s.(*ast.Field); ok {
			if f.Name == name {
				return f
			}
			if found := findField(f.SelectionSet, name); found != nil {
				return found
			}
		}
	}
	return nil
}
