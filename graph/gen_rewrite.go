//go:build ignore

// gen_rewrite rewrites two calls in generated.go, after gqlgen, from
// go:generate in resolver.go:
//
//   - its list marshallers call marshalList (lists.go), which marshals a
//     list in order when no field of its elements can wait, instead of
//     gqlgen's goroutine per element;
//   - its object marshallers compute the path of a deferred group with
//     deferredPath (lists.go), which skips it when nothing is deferred,
//     as is almost always so, instead of building it for every object;
//   - its subscription fields marshal each event with
//     sharedTimelineEvent (shared_events.go), once per distinct selection
//     rather than once per subscriber.
package main

import (
	"bytes"
	"log"
	"os"
)

func main() {
	const file = "generated.go"
	src, err := os.ReadFile(file)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range []struct{ from, to string }{
		// Every list marshaller has the list in v and its selection in sel.
		{"graphql.MarshalSliceConcurrently(ctx, len(v),", "marshalList(ctx, sel, v, len(v),"},
		{"Path:     graphql.GetPath(ctx),", "Path:     deferredPath(ctx, deferLabelToView),"},
		// Only subscription fields return a TimelineEvent, and their
		// stream marshallers name the selection "selections".
		{"return ec.marshalNTimelineEvent2ᚖgithubᚗcomᚋwarbleᚋwarbleᚋinternalᚋwarbleᚐTimelineEvent(ctx, selections, v)",
			"return ec.sharedTimelineEvent(ctx, selections, v)"},
	} {
		if !bytes.Contains(src, []byte(r.from)) {
			log.Fatalf("%s: no %q to rewrite: has gqlgen changed?", file, r.from)
		}
		src = bytes.ReplaceAll(src, []byte(r.from), []byte(r.to))
	}
	if err := os.WriteFile(file, src, 0o644); err != nil {
		log.Fatal(err)
	}
}
