package graph

import (
	"os"
	"testing"

	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
)

// loadSchema parses a schema file into its complete form.
func loadSchema(t *testing.T, path string) *ast.Schema {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, gqlErr := gqlparser.LoadSchema(&ast.Source{Name: path, Input: string(src)})
	if gqlErr != nil {
		t.Fatalf("%s: %v", path, gqlErr)
	}
	return s
}

// TestSchemaProvidesTheContract checks schema.graphqls against the public API
// contract that clients are written against (a copy of the design's
// api-contract.graphqls): every type, field, argument, enum value and input
// field must be there with the same name, type and default. Additions are
// allowed.
func TestSchemaProvidesTheContract(t *testing.T) {
	contract := loadSchema(t, "../testdata/api-contract.graphqls")
	ours := loadSchema(t, "../schema.graphqls")
	for name, want := range contract.Types {
		if want.BuiltIn {
			continue
		}
		got := ours.Types[name]
		if got == nil {
			t.Errorf("type %s is missing", name)
			continue
		}
		if got.Kind != want.Kind {
			t.Errorf("type %s is %s, the contract says %s", name, got.Kind, want.Kind)
		}
		for _, iface := range want.Interfaces {
			if !contains(got.Interfaces, iface) {
				t.Errorf("type %s does not implement %s", name, iface)
			}
		}
		for _, v := range want.EnumValues {
			if got.EnumValues.ForName(v.Name) == nil {
				t.Errorf("enum value %s.%s is missing", name, v.Name)
			}
		}
		for _, wf := range want.Fields {
			gf := got.Fields.ForName(wf.Name)
			if gf == nil {
				t.Errorf("field %s.%s is missing", name, wf.Name)
				continue
			}
			if gf.Type.String() != wf.Type.String() {
				t.Errorf("field %s.%s has type %s, the contract says %s", name, wf.Name, gf.Type, wf.Type)
			}
			if !sameValue(gf.DefaultValue, wf.DefaultValue) {
				t.Errorf("input field %s.%s has default %v, the contract says %v", name, wf.Name, gf.DefaultValue, wf.DefaultValue)
			}
			for _, wa := range wf.Arguments {
				ga := gf.Arguments.ForName(wa.Name)
				switch {
				case ga == nil:
					t.Errorf("argument %s.%s(%s) is missing", name, wf.Name, wa.Name)
				case ga.Type.String() != wa.Type.String():
					t.Errorf("argument %s.%s(%s) has type %s, the contract says %s", name, wf.Name, wa.Name, ga.Type, wa.Type)
				case !sameValue(ga.DefaultValue, wa.DefaultValue):
					t.Errorf("argument %s.%s(%s) has default %v, the contract says %v", name, wf.Name, wa.Name, ga.DefaultValue, wa.DefaultValue)
				}
			}
			// A new argument must not break clients that leave it out.
			for _, ga := range gf.Arguments {
				if wf.Arguments.ForName(ga.Name) == nil && ga.Type.NonNull && ga.DefaultValue == nil {
					t.Errorf("argument %s.%s(%s) is not in the contract and is required", name, wf.Name, ga.Name)
				}
			}
		}
	}
}

// TestSchemaIsDescribed checks that every type, field, argument and enum
// value of schema.graphqls has a description: they are the API's reference.
func TestSchemaIsDescribed(t *testing.T) {
	ours := loadSchema(t, "../schema.graphqls")
	for name, def := range ours.Types {
		if def.BuiltIn {
			continue
		}
		if def.Description == "" {
			t.Errorf("type %s has no description", name)
		}
		for _, f := range def.Fields {
			if f.Description == "" && !isIntrospectionField(f.Name) {
				t.Errorf("field %s.%s has no description", name, f.Name)
			}
			for _, a := range f.Arguments {
				if a.Description == "" && !isIntrospectionField(f.Name) {
					t.Errorf("argument %s.%s(%s) has no description", name, f.Name, a.Name)
				}
			}
		}
		for _, v := range def.EnumValues {
			if v.Description == "" {
				t.Errorf("enum value %s.%s has no description", name, v.Name)
			}
		}
	}
}

func isIntrospectionField(name string) bool { return len(name) > 2 && name[:2] == "__" }

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func sameValue(a, b *ast.Value) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.String() == b.String()
}
