package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"

	"github.com/warble/warble/internal/warble"
)

// One live event goes to every subscriber of its timeline: thousands of
// sockets on the global timeline get the same *warble.TimelineEvent. Most
// of them ask for it with the same query text, which the query cache
// parses once, so they hold the same selection set. sharedTimelineEvent
// (which the subscription fields call, see gen_rewrite.go) marshals the
// event once per distinct selection and hands the same bytes to the rest,
// instead of running gqlgen's field machinery once per socket.
//
// Two subscribers share the bytes only when nothing else can make them
// differ: the same event, the same parsed selection, the same values of
// the variables the selection uses (in arguments or @include/@skip), and,
// when the selection has a field whose value depends on who asks (see
// dependsOnViewer), the same signed-in user. A marshalling that reported
// an error is not shared.

// eventKey identifies one marshalling of an event.
type eventKey struct {
	ev     *warble.TimelineEvent // held here, so its address is not reused while cached
	sel    selectionID
	vars   string
	viewer string
}

// eventBytes is one marshalling, made once by the first subscriber that
// asks and read by the others.
type eventBytes struct {
	once sync.Once
	data graphql.Marshaler // nil when the marshalling reported errors
	// ready is set once data is, so that a subscriber that writes the
	// bytes itself reads data without once (see eventCache.written).
	ready atomic.Bool
}

// eventCache holds the marshallings of the last cachedEvents events.
type eventCache struct {
	mu      sync.Mutex
	entries map[eventKey]*eventBytes
	keys    map[*warble.TimelineEvent][]eventKey
	ring    [cachedEvents]*warble.TimelineEvent // events with entries, oldest next
	next    int
}

// cachedEvents bounds the events whose marshallings are kept. An event is
// marshalled by all its subscribers within moments; a subscriber that
// comes later marshals it again, which is only slower.
const cachedEvents = 256

var sharedEvents = &eventCache{
	entries: make(map[eventKey]*eventBytes),
	keys:    make(map[*warble.TimelineEvent][]eventKey),
}

// entry returns the shared marshalling of key, making an empty one.
func (c *eventCache) entry(key eventKey) *eventBytes {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		return e
	}
	if _, seen := c.keys[key.ev]; !seen {
		if old := c.ring[c.next]; old != nil {
			for _, k := range c.keys[old] {
				delete(c.entries, k)
			}
			delete(c.keys, old)
		}
		c.ring[c.next] = key.ev
		c.next = (c.next + 1) % cachedEvents
	}
	e := &eventBytes{}
	c.entries[key] = e
	c.keys[key.ev] = append(c.keys[key.ev], key)
	return e
}

// written returns the bytes of key's marshalling once it has been made
// with no error, else nil. Unlike entry it makes no entry, and it does
// not wait for a marshalling in progress.
func (c *eventCache) written(key eventKey) []byte {
	c.mu.Lock()
	e := c.entries[key]
	c.mu.Unlock()
	if e == nil {
		return nil
	}
	if !e.ready.Load() {
		return nil
	}
	return e.data.(rawJSON)
}

// sharedWrites counts the events that websocket subscriptions wrote from
// another subscriber's marshalling, without gqlgen's response handler
// (see wsOperation.pull). Tests read it.
var sharedWrites atomic.Int64

// sharedSelection is what a subscription shares its events' marshallings
// by: the parts of eventKey that stay the same for all its events, and the
// response key of its field as JSON (its alias, or its name).
type sharedSelection struct {
	sel    selectionID
	vars   string
	viewer string
	alias  []byte
}

// key is the eventKey of ev for this subscription.
func (s *sharedSelection) key(ev *warble.TimelineEvent) eventKey {
	return eventKey{ev: ev, sel: s.sel, vars: s.vars, viewer: s.viewer}
}

// noteShared hands key, whose marshalling was shared, to the websocket
// subscription of ctx, if it has none yet, so that it writes its next
// events from their shared bytes itself (see wsOperation.pull). It runs
// within that subscription's pull. The subscription's field must be the
// operation's one root field, selecting key's selection: then its alias
// is the response key of every event.
func (ec *executionContext) noteShared(ctx context.Context, key eventKey) {
	op, ok := warble.EventReceiverFromContext(ctx).(*wsOperation)
	if !ok || op.events == nil || op.shared != nil {
		return
	}
	oc := ec.OperationContext
	fields := graphql.CollectFields(oc, oc.Operation.SelectionSet, []string{"Subscription"})
	if len(fields) != 1 || len(fields[0].Selections) == 0 || idOf(fields[0].Selections) != key.sel {
		return
	}
	var alias bytes.Buffer
	graphql.MarshalString(fields[0].Alias).MarshalGQL(&alias)
	op.shared = &sharedSelection{sel: key.sel, vars: key.vars, viewer: key.viewer, alias: alias.Bytes()}
}

// selectionID identifies a selection set of a parsed document. gqlgen
// collects a field's selections into a new slice for each execution, but
// its elements are the document's own nodes: the first and the last node
// and the count tell one collected set from every other of the document,
// and nodes of different documents never compare equal.
type selectionID struct {
	first, last ast.Selection
	n           int
}

func idOf(sel ast.SelectionSet) selectionID {
	return selectionID{first: sel[0], last: sel[len(sel)-1], n: len(sel)}
}

// selectionUse is what a selection set depends on besides its event.
type selectionUse struct {
	vars   []string // names of the variables it uses
	viewer bool     // it has a field about the viewer
}

// selectionUses caches selectionUse by selection set.
var selectionUses sync.Map // selectionID -> selectionUse

func usesOf(sel ast.SelectionSet) selectionUse {
	id := idOf(sel)
	if u, ok := selectionUses.Load(id); ok {
		return u.(selectionUse)
	}
	var u selectionUse
	seen := map[string]bool{}
	var value func(v *ast.Value)
	value = func(v *ast.Value) {
		if v == nil {
			return
		}
		if v.Kind == ast.Variable && !seen[v.Raw] {
			seen[v.Raw] = true
			u.vars = append(u.vars, v.Raw)
		}
		for _, c := range v.Children {
			value(c.Value)
		}
	}
	directives := func(ds ast.DirectiveList) {
		for _, d := range ds {
			for _, a := range d.Arguments {
				value(a.Value)
			}
		}
	}
	var walk func(set ast.SelectionSet)
	walk = func(set ast.SelectionSet) {
		for _, s := range set {
			switch s := s.(type) {
			case *ast.Field:
				if dependsOnViewer(s) {
					u.viewer = true
				}
				for _, a := range s.Arguments {
					value(a.Value)
				}
				directives(s.Directives)
				walk(s.SelectionSet)
			case *ast.InlineFragment:
				directives(s.Directives)
				walk(s.SelectionSet)
			case *ast.FragmentSpread:
				directives(s.Directives)
				if s.Definition != nil {
					directives(s.Definition.Directives)
					walk(s.Definition.SelectionSet)
				}
			}
		}
	}
	walk(sel)
	selectionUses.Store(id, u)
	return u
}

// sharedTimelineEvent marshals v for sel, or returns the bytes another
// subscriber's identical marshalling made (see above). objs are the
// execution's (objects.go); the generated code passes them, because only
// its rewritten executionContext has them.
func (ec *executionContext) sharedTimelineEvent(ctx context.Context, sel ast.SelectionSet, v *warble.TimelineEvent, objs *objects) graphql.Marshaler {
	if v == nil || len(sel) == 0 {
		return ec.marshalNTimelineEvent2ᚖgithubᚗcomᚋwarbleᚋwarbleᚋinternalᚋwarbleᚐTimelineEvent(ctx, sel, v)
	}
	u := usesOf(sel)
	key := eventKey{ev: v, sel: idOf(sel)}
	if len(u.vars) > 0 {
		vals := make([]any, len(u.vars))
		for i, name := range u.vars {
			vals[i] = ec.Variables[name]
		}
		b, err := json.Marshal(vals)
		if err != nil {
			return ec.marshalNTimelineEvent2ᚖgithubᚗcomᚋwarbleᚋwarbleᚋinternalᚋwarbleᚐTimelineEvent(ctx, sel, v)
		}
		key.vars = string(b)
	}
	if u.viewer {
		key.viewer = warble.UserIDFromContext(ctx)
	}
	e := sharedEvents.entry(key)
	var mine []byte
	e.once.Do(func() {
		before := len(graphql.GetErrors(ctx))
		var buf bytes.Buffer
		ec.marshalNTimelineEvent2ᚖgithubᚗcomᚋwarbleᚋwarbleᚋinternalᚋwarbleᚐTimelineEvent(ctx, sel, v).MarshalGQL(&buf)
		mine = buf.Bytes()
		// A subscription's execution lives as long as its socket: do
		// not let its chunks keep this event's objects until the next.
		objs.release()
		if len(graphql.GetErrors(ctx)) == before {
			// Made an interface value once, not once a subscriber.
			e.data = rawJSON(mine)
			e.ready.Store(true)
		}
	})
	switch {
	case e.data != nil:
		ec.noteShared(ctx, key)
		return e.data
	case mine != nil:
		return rawJSON(mine)
	default: // the first one's had errors: this one makes its own
		return ec.marshalNTimelineEvent2ᚖgithubᚗcomᚋwarbleᚋwarbleᚋinternalᚋwarbleᚐTimelineEvent(ctx, sel, v)
	}
}

// rawJSON is a marshaller of JSON already written.
type rawJSON []byte

func (r rawJSON) MarshalGQL(w io.Writer) { w.Write(r) }

// dependsOnViewer reports whether a field's value depends on who asks. The
// schema says so of every such field: its name has "viewer" in it
// (viewer, viewerIsFollowing, followsViewer), or its description speaks of
// "the signed-in user" (commonFollowers, commonFollowing,
// followersYouFollow). A new field of that kind must say so too;
// TestViewerFieldsAreKnown lists the schema's.
func dependsOnViewer(f *ast.Field) bool {
	if strings.Contains(strings.ToLower(f.Name), "viewer") {
		return true
	}
	return f.Definition != nil && strings.Contains(f.Definition.Description, "signed-in user")
}
