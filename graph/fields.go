package graph

import (
	"bytes"
	"context"
	"errors"
	"io"
	"time"

	"github.com/99designs/gqlgen/graphql"
)

// scalarFieldContext is gqlgen's graphql.NewScalarFieldContext with the
// Child function given rather than made: gqlgen makes an error and a
// closure around it for every scalar field it resolves, two allocations
// of the eight or so a field costs, for a function that only a directive
// or a field middleware asking for a child would call. The generated code
// calls this instead (gen_rewrite.go puts the call there), with one Child
// per scalar type, made once by childless.
func scalarFieldContext(object string, field graphql.CollectedField, isMethod, isResolver bool,
	child func(context.Context, graphql.CollectedField) (*graphql.FieldContext, error),
) (*graphql.FieldContext, error) {
	return &graphql.FieldContext{
		Object:     object,
		Field:      field,
		IsMethod:   isMethod,
		IsResolver: isResolver,
		Child:      child,
	}, nil
}

// childless returns the Child function of a field of a scalar type, which
// has no child fields: it fails as gqlgen's does, with the same words.
func childless(typeName string) func(context.Context, graphql.CollectedField) (*graphql.FieldContext, error) {
	err := errors.New("field of type " + typeName + " does not have child fields")
	return func(context.Context, graphql.CollectedField) (*graphql.FieldContext, error) { return nil, err }
}

// deferredGroup returns the field set and the label map of an object's
// deferred group, which the generated object marshallers fill with the
// fields under @defer (gen_rewrite.go puts the call there). gqlgen makes
// both for every object it marshals; without a deferred field they stay
// empty, and nil serves as well: the marshaller adds to them only for a
// deferred field, and ProcessDeferredGroup returns at once for no labels.
func deferredGroup(fields []graphql.CollectedField) (*graphql.FieldSet, map[string]*graphql.FieldSetView) {
	for _, f := range fields {
		if f.IsDeferred() {
			return graphql.NewFieldSet(nil), make(map[string]*graphql.FieldSetView)
		}
	}
	return nil, nil
}

// MarshalGQL writes an object's fields once they are resolved, as
// gqlgen's FieldSet.MarshalGQL does; the generated object marshallers
// return the object (objects.go, gen_rewrite.go). gqlgen's makes a map of
// the names written, a copy of each field and an iterator for every object
// of every response: a fifth of a home page's allocations, for a check
// that names are not written twice, which the fields, merged by name when
// collected, never are (it is kept here without a map).
func (o *object) MarshalGQL(w io.Writer) {
	sw, ok := w.(io.StringWriter) // gqlgen's buffers are
	if !ok {
		sw = stringWriter{w}
	}
	sw.WriteString("{")
	first := true
fields:
	for i := range o.fields {
		alias := o.fields[i].Alias
		for j := range i {
			if o.fields[j].Alias == alias {
				continue fields
			}
		}
		if !first {
			sw.WriteString(",")
		}
		first = false
		// An alias is a GraphQL name, [_A-Za-z][_0-9A-Za-z]*: nothing
		// in it needs escaping.
		sw.WriteString(`"`)
		sw.WriteString(alias)
		sw.WriteString(`":`)
		o.out.Values[i].MarshalGQL(w)
	}
	sw.WriteString("}")
}

// stringWriter writes strings to a writer that has no WriteString.
type stringWriter struct{ io.Writer }

func (w stringWriter) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// plainString marshals a String or ID field of a domain struct, which the
// generated code returns for such a field (gen_rewrite.go). It holds a
// pointer to the field, so that it is itself a pointer and costs no
// allocation as a graphql.Marshaler, where gqlgen's MarshalString makes a
// closure for every string of a response. The domain values of a response
// do not change once resolved, so the string it writes is the one that was
// resolved.
type plainString struct{ s *string }

// MarshalGQL writes the string as gqlgen's MarshalString does: quoted,
// with \t, \r, \n, \\, \" and \u00XX (upper-case hex) for the other
// control characters, every other byte as it is.
func (p plainString) MarshalGQL(w io.Writer) {
	sw, ok := w.(io.StringWriter)
	if !ok {
		sw = stringWriter{w}
	}
	s := *p.s
	sw.WriteString(`"`)
	done := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		sw.WriteString(s[done:i])
		switch c {
		case '"':
			sw.WriteString(`\"`)
		case '\\':
			sw.WriteString(`\\`)
		case '\t':
			sw.WriteString(`\t`)
		case '\r':
			sw.WriteString(`\r`)
		case '\n':
			sw.WriteString(`\n`)
		default:
			const hex = "0123456789ABCDEF"
			sw.WriteString(`\u00`)
			sw.WriteString(hex[c>>4 : c>>4+1])
			sw.WriteString(hex[c&0xf : c&0xf+1])
		}
		done = i + 1
	}
	sw.WriteString(s[done:])
	sw.WriteString(`"`)
}

// plainTime marshals a Time field of a domain struct from a pointer to the
// field (see plainString), and is MarshalTime's marshaller. The layout has
// no character JSON would escape, so the time is formatted straight
// between quotes, into one buffer.
type plainTime struct{ t *time.Time }

func (p plainTime) MarshalGQL(w io.Writer) {
	var b []byte
	bb, ok := w.(*bytes.Buffer) // gqlgen's buffers are: format into its spare room
	if ok {
		b = bb.AvailableBuffer()
	}
	b = append(b, '"')
	b = p.t.UTC().AppendFormat(b, timeLayout)
	w.Write(append(b, '"'))
}
