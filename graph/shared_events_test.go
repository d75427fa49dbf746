package graph

import (
	"slices"
	"testing"

	"github.com/vektah/gqlparser/v2/ast"
)

// TestViewerFieldsAreKnown lists the schema's fields whose values depend
// on who asks, as dependsOnViewer finds them: a live event's bytes are
// shared between two viewers only if its selection has none of them. A
// field added to the schema that depends on the viewer without saying so
// would be shared across viewers; this list is the place to notice.
func TestViewerFieldsAreKnown(t *testing.T) {
	schema := loadSchema(t, "../schema.graphqls")
	var got []string
	for _, def := range schema.Types {
		if def.BuiltIn {
			continue
		}
		for _, f := range def.Fields {
			if dependsOnViewer(&ast.Field{Name: f.Name, Definition: f}) {
				got = append(got, def.Name+"."+f.Name)
			}
		}
	}
	slices.Sort(got)
	want := []string{
		"AuthPayload.user",
		"FollowPayload.viewer",
		"Mutation.deletePost",
		"Mutation.logoutEverywhere",
		"Query.homeTimeline",
		"Query.viewer",
		"Subscription.homeTimeline",
		"User.commonFollowers",
		"User.commonFollowing",
		"User.followersYouFollow",
		"User.followsViewer",
		"User.viewerIsFollowing",
	}
	if !slices.Equal(got, want) {
		t.Errorf("fields that depend on the viewer:\n%v\nwant\n%v", got, want)
	}
}
