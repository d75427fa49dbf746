package graph

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
)

// objects is what one execution (a request's operation, or a
// subscription's, for all its events) keeps for the objects it marshals;
// the generated code holds it in its executionContext and calls it for
// every object (gen_rewrite.go puts the calls there). gqlgen makes three
// allocations of every object of every response: a field set, the slice
// of its values, and a hasher, to look up the object's collected fields;
// the marshaller Warble returned for it was a fourth. A
// home page has 61 objects. Here the field sets, their values and their
// marshallers come from chunks shared by the execution's objects, and the
// collected fields are looked up by a key that needs no hashing, so those
// 61 objects cost about 15 allocations where they cost 240.
type objects struct {
	mu        sync.Mutex
	collected []collected         // at most maxCollected
	free      []object            // the chunk field sets are taken from
	values    []graphql.Marshaler // the chunk their values are taken from
	made      int                 // objects made so far
}

// object is one object's field set, which the generated marshaller fills,
// and its fields: it is the marshaller's result, and writes them once they
// are resolved (MarshalGQL, fields.go).
type object struct {
	out    graphql.FieldSet
	fields []graphql.CollectedField
}

// collected is the fields collected for a selection and a type.
type collected struct {
	key    collectKey
	fields []graphql.CollectedField
}

// collectKey identifies a selection set and the type names it is
// collected for, as gqlgen's cache key does, without hashing the names:
// the generated code passes its package-level implementors slices, so
// their address tells them apart. (Two slices of the same names would only
// be collected twice.)
type collectKey struct {
	sel       *ast.Selection
	selLen    int
	satisfies *string
	satLen    int
}

// Chunks start small, so that an execution of a few objects (a viewer, a
// subscription's event) costs no more than gqlgen's way, and double up to
// a bound, so that a page of hundreds takes a handful.
const (
	firstObjects = 1
	maxObjects   = 64
)

// maxCollected bounds the selections an execution looks up here, one by
// one; a response has a few (a home page, six). An execution of more
// leaves the rest to gqlgen's cache.
const maxCollected = 16

// collect returns the fields of sel that apply to an object of the types
// satisfies names, as graphql.CollectFields does, and collects them once
// per execution.
func (o *objects) collect(oc *graphql.OperationContext, sel ast.SelectionSet, satisfies []string) []graphql.CollectedField {
	if len(sel) == 0 || len(satisfies) == 0 {
		return graphql.CollectFields(oc, sel, satisfies)
	}
	key := collectKey{sel: &sel[0], selLen: len(sel), satisfies: &satisfies[0], satLen: len(satisfies)}
	o.mu.Lock()
	for i := range o.collected {
		if o.collected[i].key == key {
			fields := o.collected[i].fields
			o.mu.Unlock()
			return fields
		}
	}
	o.mu.Unlock()
	// Collecting depends only on the operation and sel, so two
	// goroutines that both miss collect the same fields.
	fields := collectFields(oc, sel, satisfies)
	o.mu.Lock()
	if len(o.collected) < maxCollected {
		o.collected = append(o.collected, collected{key: key, fields: fields})
	}
	o.mu.Unlock()
	return fields
}

// collectFields returns graphql.CollectFields(oc, sel, satisfies), from
// staticFields when an execution of the same document collected them
// before.
//
// gqlgen caches collected fields for one operation only: every request
// hashes each selection set's field names for its key, collects the
// fields and caches them, about four allocations a selection set (20 of
// a home page's 527). Where a collection depends on nothing but the
// document (collectsStatically), the fields are the same for every
// execution of it: gqlgen's query cache hands every request of the same
// text the same parsed document, and the collected fields are only read.
func collectFields(oc *graphql.OperationContext, sel ast.SelectionSet, satisfies []string) []graphql.CollectedField {
	if len(sel) == 0 || len(satisfies) == 0 {
		return graphql.CollectFields(oc, sel, satisfies)
	}
	key := staticKey{sel: idOf(sel), satisfies: &satisfies[0], satLen: len(satisfies)}
	if v, ok := staticFields.Load(key); ok {
		if e := v.(*staticEntry); slices.Equal(e.sel, sel) {
			return e.fields
		}
	}
	fields := graphql.CollectFields(oc, sel, satisfies)
	if len(oc.RawQuery) <= maxStaticQuery && collectsStatically(oc.Doc, sel) {
		if staticCount.Add(1) > maxStatic {
			staticFields.Clear()
			staticCount.Store(1)
		}
		staticFields.Store(key, &staticEntry{sel: slices.Clone(sel), fields: fields})
	}
	return fields
}

// staticKey identifies a selection set by its document's nodes (see
// selectionID) and the type names it is collected for (by the address of
// the generated code's implementors slice, see collectKey).
type staticKey struct {
	sel       selectionID
	satisfies *string
	satLen    int
}

// staticEntry is the collected fields of a selection set. The set itself
// is kept to be compared node by node: two selection sets that gqlgen
// merged from fields of the same response key may share their first and
// last node and their length, and differ in between.
type staticEntry struct {
	sel    ast.SelectionSet
	fields []graphql.CollectedField
}

// staticFields holds, across executions, the collected fields of
// selection sets whose collection depends on their document alone
// (collectsStatically). The sets of a document that gqlgen's query cache
// has dropped stay until the map is cleared, once it has had maxStatic
// entries. An entry keeps its document's nodes and, through their
// positions, its text: the bounds keep what a client sending ever new
// queries can make it hold to about maxStatic small documents, fewer
// than the query cache itself keeps.
var (
	staticFields sync.Map // staticKey -> *staticEntry
	staticCount  atomic.Int64
)

// Bounds of staticFields: its entries (an application's operations have a
// few selection sets each), and the length of a query whose selection
// sets it keeps (an application's are shorter; a longer one is collected
// for each execution, as gqlgen does).
const (
	maxStatic      = 1024
	maxStaticQuery = 4 << 10
)

// collectsStatically reports whether collecting the fields of sel depends
// on its document alone, and not on the operation's variables: no field,
// fragment spread, inline fragment or fragment that the collection walks
// has a directive (@skip, @include and @defer may take a variable), and
// every fragment spread names a fragment of doc.
func collectsStatically(doc *ast.QueryDocument, sel ast.SelectionSet) bool {
	for _, s := range sel {
		switch s := s.(type) {
		case *ast.Field:
			if len(s.Directives) > 0 {
				return false
			}
		case *ast.InlineFragment:
			if len(s.Directives) > 0 || !collectsStatically(doc, s.SelectionSet) {
				return false
			}
		case *ast.FragmentSpread:
			f := doc.Fragments.ForName(s.Name)
			if len(s.Directives) > 0 || f == nil || len(f.Directives) > 0 || !collectsStatically(doc, f.SelectionSet) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// object returns a field set for an object whose fields are fields, with
// a value for each, as graphql.NewFieldSet does.
func (o *objects) object(fields []graphql.CollectedField) *object {
	n := len(fields)
	o.mu.Lock()
	if len(o.free) == 0 {
		o.free = make([]object, chunkSize(o.made, firstObjects, maxObjects))
	}
	obj := &o.free[0]
	o.free = o.free[1:]
	if len(o.values) < n {
		// Five fields an object is a usual size.
		o.values = make([]graphql.Marshaler, max(n, 5*chunkSize(o.made, firstObjects, maxObjects)))
	}
	values := o.values[:n:n]
	o.values = o.values[n:]
	o.made++
	o.mu.Unlock()
	obj.out.Values = values
	obj.fields = fields
	return obj
}

// release drops the chunks, which hold the objects made so far, so that
// they can be collected once their response is written; the next object
// starts a new chunk, small again.
func (o *objects) release() {
	o.mu.Lock()
	o.free, o.values, o.made = nil, nil, 0
	o.mu.Unlock()
}

// chunkSize is the size of the next chunk of an execution that has made
// made objects: as many as it has made, within [least, most].
func chunkSize(made, least, most int) int {
	return min(max(made, least), most)
}
