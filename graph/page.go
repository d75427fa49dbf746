package graph

import (
	"context"

	"github.com/warble/warble/internal/warble"
)

// pageArgs turns a field's first/after into PageArgs, applying the default
// size when first is null, and validates it.
func pageArgs(first *int, after *string, def int) (warble.PageArgs, error) {
	p := warble.PageArgs{First: def, After: after}
	if first != nil {
		p.First = *first
	}
	return p, p.Validate(warble.MaxPageSize)
}

// emptyConnection is the answer of viewer-relative lists when signed out.
func emptyConnection() *warble.UserConnection {
	return &warble.UserConnection{Edges: []*warble.UserEdge{}}
}

// viewerRelative runs a viewer-relative list query, or returns an empty list
// when signed out.
func viewerRelative(ctx context.Context, user *warble.User, first *int, after *string,
	find func(ctx context.Context, viewerID, userID string, page warble.PageArgs) (*warble.UserConnection, error),
) (*warble.UserConnection, error) {
	page, err := pageArgs(first, after, warble.DefaultPageSize)
	if err != nil {
		return nil, err
	}
	viewerID := warble.UserIDFromContext(ctx)
	if viewerID == "" {
		return emptyConnection(), nil
	}
	return find(ctx, viewerID, user.ID, page)
}

// nullIfNotFound turns ENOTFOUND into a null answer, as the schema says for
// lookups by name or id.
func nullIfNotFound[T any](v *T, err error) (*T, error) {
	if warble.ErrorCode(err) == warble.ENOTFOUND {
		return nil, nil
	}
	return v, err
}
