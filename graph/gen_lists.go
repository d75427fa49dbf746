//go:build ignore

// gen_lists rewrites generated.go so that its list marshallers call
// marshalList (lists.go), which marshals a list in order when no field of
// its elements can wait, instead of gqlgen's goroutine per element. It
// runs after gqlgen, from go:generate in resolver.go.
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
	// Every list marshaller has the list in v and its selection in sel.
	from := []byte("graphql.MarshalSliceConcurrently(ctx, len(v),")
	to := []byte("marshalList(ctx, sel, v, len(v),")
	if !bytes.Contains(src, from) {
		log.Fatalf("%s: no call of graphql.MarshalSliceConcurrently to rewrite: has gqlgen changed?", file)
	}
	if err := os.WriteFile(file, bytes.ReplaceAll(src, from, to), 0o644); err != nil {
		log.Fatal(err)
	}
}
