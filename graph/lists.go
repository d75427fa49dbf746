package graph

import (
	"context"
	"reflect"
	"strings"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/warble/warble/internal/warble"
)

// marshalList marshals the elements of a list field. gqlgen marshals every
// element in a goroutine of its own, so that fields that wait on a loader
// wait together; the generated code calls this instead (gen_rewrite.go
// puts the call there), which marshals in order, on the caller's goroutine,
// when no field selected under the list can wait: then goroutines buy
// nothing and cost a stack each, grown as the element's fields go deeper.
// A home page of 20 posts spends a sixth of its CPU time on them.
func marshalList[T any](ctx context.Context, sel ast.SelectionSet, v []T, length int, workerLimit int64, omitPanicHandler bool,
	marshalElement func(ctx context.Context, i int) graphql.Marshaler,
) graphql.Array {
	if length < 2 || mayWait(sel, authorsKnown(v)) {
		return graphql.MarshalSliceConcurrently(ctx, length, workerLimit, omitPanicHandler, marshalElement)
	}
	ret := make(graphql.Array, length)
	// The elements' field contexts and indexes, made in one allocation
	// each rather than two per element.
	contexts, indexes := make([]graphql.FieldContext, length), make([]int, length)
	for i := range length {
		indexes[i] = i
		contexts[i].Index = &indexes[i]
		ok := marshalElementSafely(graphql.WithFieldContext(ctx, &contexts[i]), i, marshalElement, &ret[i])
		if !ok {
			return nil // as gqlgen does when an element panics
		}
	}
	return ret
}

// deferredPath is the path of an object's deferred group, which the
// generated code hands to ProcessDeferredGroup, which does nothing without
// deferred fields (gen_rewrite.go puts the call there). gqlgen builds the
// path whatever the group: an allocation per object of a response, 8% of
// a home page's.
func deferredPath(ctx context.Context, defers map[string]*graphql.FieldSetView) ast.Path {
	if len(defers) == 0 {
		return nil
	}
	return graphql.GetPath(ctx)
}

// marshalElementSafely marshals element i into out, in childCtx, which
// carries the element's field context, and reports false if it panicked,
// after recording the panic as the field's error.
func marshalElementSafely(childCtx context.Context, i int, marshalElement func(ctx context.Context, i int) graphql.Marshaler, out *graphql.Marshaler) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			graphql.AddError(childCtx, graphql.Recover(childCtx, r))
			ok = false
		}
	}()
	*out = marshalElement(childCtx, i)
	return true
}

// authorsKnown reports whether every post in a list of posts or post edges
// came with its author, so that Post.author needs no loader. It is false
// for other lists, where it does not matter.
func authorsKnown(list any) bool {
	switch list := list.(type) {
	case []*warble.PostEdge:
		for _, e := range list {
			if e == nil || e.Node == nil || e.Node.Author == nil {
				return false
			}
		}
		return true
	case []*warble.Post:
		for _, p := range list {
			if p == nil || p.Author == nil {
				return false
			}
		}
		return true
	}
	return false
}

// mayWait reports whether a field in sel, at any depth, may read Redis or
// wait on a loader (see waits). Post.author does not count
// when authorsKnown: its resolver then returns the author it was given.
func mayWait(sel ast.SelectionSet, authorsKnown bool) bool {
	for _, s := range sel {
		switch s := s.(type) {
		case *ast.Field:
			if s.ObjectDefinition != nil && waits(s.ObjectDefinition, s.Name) &&
				!(authorsKnown && s.ObjectDefinition.Name == "Post" && s.Name == "author") {
				return true
			}
			if mayWait(s.SelectionSet, authorsKnown) {
				return true
			}
		case *ast.InlineFragment:
			if mayWait(s.SelectionSet, authorsKnown) {
				return true
			}
		case *ast.FragmentSpread:
			if s.Definition == nil || mayWait(s.Definition.SelectionSet, authorsKnown) {
				return true
			}
		}
	}
	return false
}

// waits reports whether a field of a GraphQL type may read Redis or wait on
// a loader: it has a resolver, or is bound to a method of a domain type
// that takes a context (TestListFieldsThatWait checks that list against
// generated.go). A field selected on an interface or union waits if it does
// on any object but the root ones.
func waits(def *ast.Definition, field string) bool {
	field = strings.ToLower(field)
	if def.Kind == ast.Object {
		return resolverFields[def.Name][field] || contextMethodFields[def.Name][field]
	}
	for _, fields := range []map[string]map[string]bool{resolverFields, contextMethodFields} {
		for object, f := range fields {
			if f[field] && object != "Query" && object != "Mutation" && object != "Subscription" {
				return true
			}
		}
	}
	return false
}

// contextMethodFields holds, per GraphQL object, the fields bound to a
// method of a domain type that takes a context, lowercased.
var contextMethodFields = map[string]map[string]bool{
	"UserConnection": {"totalcount": true},
}

// resolverFields holds, per GraphQL object, the fields that have a
// resolver, lowercased: the methods of the object's resolver interface,
// read from ResolverRoot, so that a field given a resolver in gqlgen.yml
// counts without anyone updating a list.
var resolverFields = func() map[string]map[string]bool {
	fields := map[string]map[string]bool{}
	root := reflect.TypeFor[ResolverRoot]()
	for i := range root.NumMethod() {
		m := root.Method(i)
		object := map[string]bool{}
		resolvers := m.Type.Out(0)
		for j := range resolvers.NumMethod() {
			object[strings.ToLower(resolvers.Method(j).Name)] = true
		}
		fields[m.Name] = object
	}
	return fields
}()
