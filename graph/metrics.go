package graph

import (
	"context"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
)

// OperationMetrics records what the GraphQL handler does: the latency of
// each query and mutation, and the subscriptions open. internal/metrics
// implements it.
type OperationMetrics interface {
	// ObserveOperation records a query or mutation that took d; name is
	// the operation's name in its document, empty when it has none. The
	// implementation bounds the names it keeps apart.
	ObserveOperation(opType, name string, d time.Duration)
	SubscriptionStarted()
	SubscriptionEnded()
}

// metricsInterceptor feeds m. It sees only operations that parsed and
// validated. A query or mutation's time runs from when the transport began
// reading it to its first response; a subscription is open from its start
// until its context ends, which gqlgen does when the subscription completes,
// is stopped by the client, or its websocket closes.
func metricsInterceptor(m OperationMetrics) graphql.OperationMiddleware {
	return func(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
		oc := graphql.GetOperationContext(ctx)
		if oc.Operation == nil {
			return next(ctx)
		}
		if oc.Operation.Operation == ast.Subscription {
			m.SubscriptionStarted()
			context.AfterFunc(ctx, m.SubscriptionEnded)
			return next(ctx)
		}
		start := oc.Stats.OperationStart
		if start.IsZero() {
			start = time.Now()
		}
		opType, name := string(oc.Operation.Operation), oc.Operation.Name
		responses := next(ctx)
		observed := false
		return func(ctx context.Context) *graphql.Response {
			r := responses(ctx)
			if !observed {
				observed = true
				m.ObserveOperation(opType, name, time.Since(start))
			}
			return r
		}
	}
}
