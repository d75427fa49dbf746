package graph

import (
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/validator/core"
	"github.com/vektah/gqlparser/v2/validator/rules"
)

// MaxDepth bounds how deeply an operation's fields may nest. The deepest
// useful read, a user's followers' posts with their authors, is 9 levels:
// user { followers { edges { node { posts { edges { node { author { username } } } } } } } }.
const MaxDepth = 12

// validationRules are GraphQL's own rules plus the depth limit. Complexity
// bounds how much an operation reads; depth also bounds how long the
// recursive work of validating and planning it takes.
func validationRules() *rules.Rules {
	r := rules.NewDefaultRules()
	r.AddRule(maxDepthRule.Name, maxDepthRule.RuleFunc)
	return r
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

// selectionDepth returns how many levels of fields set nests, following
// fragments. A fragment already being expanded on the current path is not
// entered again: cycles are NoFragmentCycles's to report.
func selectionDepth(set ast.SelectionSet, expanding map[string]bool) int {
	deepest := 0
	for _, sel := range set {
		d := 0
		switch sel := sel.(type) {
		case *ast.Field:
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
