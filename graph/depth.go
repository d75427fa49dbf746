package graph

import (
	"strings"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/validator/core"
	"github.com/vektah/gqlparser/v2/validator/rules"
)

// MaxDepth bounds how deeply an operation's fields may nest. The deepest
// useful read, a user's followers' posts with their authors, is 9 levels:
// user { followers { edges { node { posts { edges { node { author { username } } } } } } } }.
const MaxDepth = 12

// quietRules are the versions of GraphQL's rules that name no field, type,
// argument or value the query did not ask for. Each replaces the rule of
// its name less "WithoutSuggestions" when suggestions are off.
var quietRules = []core.Rule{
	rules.FieldsOnCorrectTypeRuleWithoutSuggestions,
	rules.KnownArgumentNamesRuleWithoutSuggestions,
	rules.KnownTypeNamesRuleWithoutSuggestions,
	rules.ScalarLeafsRuleWithoutSuggestions,
	rules.ValuesOfCorrectTypeRuleWithoutSuggestions,
}

// validationRules returns the rule set each document is validated with:
// GraphQL's own rules, without "Did you mean …?" unless suggestions is set,
// plus the depth limit, and a rule that refuses introspection unless
// introspection is set. Complexity bounds how much an operation reads;
// depth also bounds how long the recursive work of validating and planning
// it takes.
func validationRules(suggestions, introspection bool) func() *rules.Rules {
	return func() *rules.Rules {
		r := rules.NewDefaultRules()
		if !suggestions {
			for _, q := range quietRules {
				r.RemoveRule(strings.TrimSuffix(q.Name, "WithoutSuggestions"))
				r.AddRule(q.Name, q.RuleFunc)
			}
		}
		r.AddRule(maxDepthRule.Name, maxDepthRule.RuleFunc)
		if !introspection {
			r.AddRule(noIntrospectionRule.Name, noIntrospectionRule.RuleFunc)
		}
		return r
	}
}

var maxDepthRule = core.Rule{
	Name: "MaxDepth",
	RuleFunc: func(observers *core.Events, addError core.AddErrFunc) {
		observers.OnOperation(func(_ *core.Walker, op *ast.OperationDefinition) {
			if d := selectionDepth(op.SelectionSet, map[string]bool{}); d > MaxDepth {
				addError(
					core.Message("The operation nests fields %d levels deep; at most %d are allowed.", d, MaxDepth),
					core.At(op.Position),
				)
			}
		})
	},
}

// noIntrospectionRule refuses the introspection fields __schema and __type
// (__typename stays: clients such as Apollo ask for it on every object). It
// makes a refused introspection query a validation error with its own
// sentence, where gqlgen would fail the field at run time as an internal
// error.
var noIntrospectionRule = core.Rule{
	Name: "NoIntrospection",
	RuleFunc: func(observers *core.Events, addError core.AddErrFunc) {
		observers.OnField(func(_ *core.Walker, field *ast.Field) {
			if field.Name == "__schema" || field.Name == "__type" {
				addError(core.Message("Introspection is disabled on this server."), core.At(field.Position))
			}
		})
	},
}

// selectionDepth returns how many levels of fields set nests, following
// fragments and not counting inside introspection fields. A fragment already being expanded on the current path is not
// entered again: cycles are NoFragmentCycles's to report.
func selectionDepth(set ast.SelectionSet, expanding map[string]bool) int {
	deepest := 0
	for _, sel := range set {
		d := 0
		switch sel := sel.(type) {
		case *ast.Field:
			if sel.Name == "__schema" || sel.Name == "__type" {
				// Introspection reads the schema in memory, and the
				// standard introspection query, which every GraphQL tool
				// sends, nests 15 levels to unwrap list and non-null
				// types; gqlparser's MaxIntrospectionDepth rule bounds
				// its costly part, the recursion through types' fields.
				d = 1
				break
			}
			d = 1 + selectionDepth(sel.SelectionSet, expanding)
		case *ast.InlineFragment:
			d = selectionDepth(sel.SelectionSet, expanding)
		case *ast.FragmentSpread:
			if sel.Definition != nil && !expanding[sel.Name] {
				expanding[sel.Name] = true
				d = selectionDepth(sel.Definition.SelectionSet, expanding)
				delete(expanding, sel.Name)
			}
		}
		deepest = max(deepest, d)
	}
	return deepest
}
