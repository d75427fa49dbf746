//go:build ignore

// gen_rewrite rewrites calls in generated.go, after gqlgen, from
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
//     rather than once per subscriber;
//   - its object marshallers make the field set and label map of a
//     deferred group with deferredGroup (fields.go), only when a field is
//     deferred, instead of two allocations per object of every response;
//   - the contexts of its scalar fields are made by scalarFieldContext
//     (fields.go) with a Child function made once per scalar type (the
//     childless* variables it appends), where gqlgen makes an error and a
//     closure for every field of every response that no one calls;
//   - a non-null scalar field read straight from a domain struct's field
//     (Post.body, User.username, PostEdge.cursor: most fields of most
//     responses) is marshalled at once, without gqlgen's field context,
//     panic handler, field middleware and two closures: eight
//     allocations a field; strings, ids and times by plainString and
//     plainTime (fields.go), which point at the field rather than hold a
//     closure. Nothing in such a field can fail, panic or wait, and
//     Warble's handler has no field middleware (see NewHandler,
//     TestNoFieldMiddleware);
//   - a non-null object field read from a domain struct's field (such as
//     PostEdge.node), when the field holds an object, is marshalled in its
//     field context without the rest of gqlgen's resolution (panic
//     handler, middleware call, closures); a nil one still goes through
//     gqlgen, which reports it;
//   - Post.author, when the post was read with its author (every post of
//     a timeline page is), is marshalled as such an object field is: its
//     resolver would only return that author (schema.resolvers.go);
//   - an object marshaller with one field that gqlgen would run
//     "concurrently" (a field with a resolver, such as Post.author) runs
//     it in place: gqlgen's FieldSet.Dispatch runs a lone such field in
//     place too, after a closure and a slice made to hold it;
//   - its object marshallers take their field sets from the execution's
//     objects (objects.go), made a chunk at a time, and return those
//     objects, which write the fields (fields.go) without gqlgen's map,
//     copies and iterator per object; they collect their fields
//     through the same objects, whose cache of collected fields needs no
//     hasher per object as gqlgen's does.
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"log"
	"os"
	"regexp"
	"slices"
)

// plainField matches gqlgen's resolution of a non-null scalar field that
// is a domain struct's field: no resolver, no method, no directive, and a
// marshaller that cannot fail. It captures the struct field and the
// marshaller.
var plainField = regexp.MustCompile(`return graphql\.ResolveField\(
\t\tctx,
\t\tec\.OperationContext,
\t\tfield,
\t\tfunc\(ctx context\.Context, field graphql\.CollectedField\) \(\*graphql\.FieldContext, error\) \{
\t\t\treturn ec\.fieldContext_\w+\(ctx, field\)
\t\t\},
\t\tfunc\(ctx context\.Context\) \(any, error\) \{
\t\t\treturn (obj\.\w+), nil
\t\t\},
\t\tnil,
\t\tfunc\(ctx context\.Context, selections ast\.SelectionSet, v [\w.]+\) graphql\.Marshaler \{
\t\t\treturn ec\.(marshalN(?:String2string|ID2string|Boolean2bool|Int2int|Time2timeᚐTime))\(ctx, selections, v\)
\t\t\},
\t\ttrue,
\t\ttrue,
\t\)`)

// objectField matches gqlgen's resolution of a non-null object field that
// is a domain struct's field holding a pointer, such as PostEdge.node. It
// captures the whole call, the field's context function, the struct field
// and the marshaller.
var objectField = regexp.MustCompile(`return (graphql\.ResolveField\(
\t\tctx,
\t\tec\.OperationContext,
\t\tfield,
\t\tfunc\(ctx context\.Context, field graphql\.CollectedField\) \(\*graphql\.FieldContext, error\) \{
\t\t\treturn ec\.(fieldContext_\w+)\(ctx, field\)
\t\t\},
\t\tfunc\(ctx context\.Context\) \(any, error\) \{
\t\t\treturn (obj\.\w+), nil
\t\t\},
\t\tnil,
\t\tfunc\(ctx context\.Context, selections ast\.SelectionSet, v \*[\w.]+\) graphql\.Marshaler \{
\t\t\treturn ec\.(marshalN\w+2ᚖ\S+)\(ctx, selections, v\)
\t\t\},
\t\ttrue,
\t\ttrue,
\t\))`)

// scalarContext matches gqlgen's context of a scalar field; its last
// argument, the error of the Child that a scalar field cannot have, names
// the type.
var scalarContext = regexp.MustCompile(`graphql\.NewScalarFieldContext\(("\w+", field, (?:true|false), (?:true|false)), errors\.New\("field of type (\w+) does not have child fields"\)\)`)

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
			"return ec.sharedTimelineEvent(ctx, selections, v, &ec.objects)"},
		// Every object marshaller has its fields in fields, and ends
		// returning their values in out.
		{"deferredFieldSet := graphql.NewFieldSet(nil)\n\tdeferLabelToView := make(map[string]*graphql.FieldSetView)",
			"deferredFieldSet, deferLabelToView := deferredGroup(fields)"},
		{"\n\treturn out\n}\n", "\n\treturn object\n}\n"},
		{"out := graphql.NewFieldSet(fields)", "object := ec.objects.object(fields)\n\tout := &object.out"},
		{"graphql.CollectFields(ec.OperationContext, sel,", "ec.objects.collect(ec.OperationContext, sel,"},
		// Post.author's resolver returns the author a post was read
		// with (schema.resolvers.go): a page's posts all have theirs.
		{"func (ec *executionContext) _Post_author(ctx context.Context, field graphql.CollectedField, obj *warble.Post) (ret graphql.Marshaler) {\n",
			"func (ec *executionContext) _Post_author(ctx context.Context, field graphql.CollectedField, obj *warble.Post) (ret graphql.Marshaler) {\n" +
				"\t" + fromStructField("obj.Author", "fieldContext_Post_author", "marshalNUser2ᚖgithubᚗcomᚋwarbleᚋwarbleᚋinternalᚋwarbleᚐUser") + "\n"},
		{"type executionContext struct {\n\t*graphql.ExecutionContextState[ResolverRoot, DirectiveRoot, ComplexityRoot]\n}",
			"type executionContext struct {\n\t*graphql.ExecutionContextState[ResolverRoot, DirectiveRoot, ComplexityRoot]\n\tobjects objects\n}"},
	} {
		if !bytes.Contains(src, []byte(r.from)) {
			log.Fatalf("%s: no %q to rewrite: has gqlgen changed?", file, r.from)
		}
		src = bytes.ReplaceAll(src, []byte(r.from), []byte(r.to))
	}
	if !plainField.Match(src) {
		log.Fatalf("%s: no plain field to rewrite: has gqlgen changed?", file)
	}
	src = plainField.ReplaceAllFunc(src, func(m []byte) []byte {
		sub := plainField.FindSubmatch(m)
		switch string(sub[2]) {
		case "marshalNString2string", "marshalNID2string":
			return []byte("return plainString{&" + string(sub[1]) + "}")
		case "marshalNTime2timeᚐTime":
			return []byte("return plainTime{&" + string(sub[1]) + "}")
		}
		return []byte("return ec." + string(sub[2]) + "(ctx, field.Selections, " + string(sub[1]) + ")")
	})
	if !objectField.Match(src) {
		log.Fatalf("%s: no object field to rewrite: has gqlgen changed?", file)
	}
	src = objectField.ReplaceAll(src, []byte(fromStructField("$3", "$2", "$4")+"\n\treturn $1"))
	src = loneConcurrentFieldsInline(src)
	var scalars []string
	for _, m := range scalarContext.FindAllSubmatch(src, -1) {
		if t := string(m[2]); !slices.Contains(scalars, t) {
			scalars = append(scalars, t)
		}
	}
	if len(scalars) == 0 {
		log.Fatalf("%s: no graphql.NewScalarFieldContext to rewrite: has gqlgen changed?", file)
	}
	src = scalarContext.ReplaceAll(src, []byte("scalarFieldContext($1, childless$2)"))
	slices.Sort(scalars)
	var vars bytes.Buffer
	vars.WriteString("\n// The Child functions of scalar fields, one per type (gen_rewrite.go).\nvar (\n")
	for _, t := range scalars {
		fmt.Fprintf(&vars, "\tchildless%s = childless(%q)\n", t, t)
	}
	vars.WriteString(")\n")
	src = append(src, vars.Bytes()...)
	if src, err = format.Source(src); err != nil {
		log.Fatalf("%s after rewriting: %v", file, err)
	}
	if err := os.WriteFile(file, src, 0o644); err != nil {
		log.Fatal(err)
	}
}

// fromStructField returns the code that marshals the object in value, a
// struct field, when it is not nil: in its field context (made by the
// method fieldContext) with the marshaller marshal, without the rest of
// gqlgen's resolution.
func fromStructField(value, fieldContext, marshal string) string {
	return "if v := " + value + "; v != nil {\n" +
		"\t\tfc, _ := ec." + fieldContext + "(ctx, field)\n" +
		"\t\tfc.Result = v\n" +
		"\t\treturn ec." + marshal + "(graphql.WithFieldContext(ctx, fc), field.Selections, v)\n" +
		"\t}"
}

// concurrentField is how gqlgen's object marshallers queue a field that
// has a resolver, to run when the object's field set is dispatched.
const concurrentField = "out.Concurrently(i, func(ctx context.Context) graphql.Marshaler { return innerFunc(ctx, out) })"

// loneConcurrentFieldsInline rewrites, in each function of src that queues
// exactly one field, the queueing into running it at once.
func loneConcurrentFieldsInline(src []byte) []byte {
	funcs := bytes.SplitAfter(src, []byte("\n}\n"))
	n := 0
	for i, f := range funcs {
		if bytes.Count(f, []byte(concurrentField)) == 1 {
			funcs[i] = bytes.Replace(f, []byte(concurrentField), []byte("out.Values[i] = innerFunc(ctx, out)"), 1)
			n++
		}
	}
	if n == 0 {
		log.Fatalf("no object marshaller with one %q: has gqlgen changed?", concurrentField)
	}
	return bytes.Join(funcs, nil)
}
