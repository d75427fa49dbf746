package graph

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/handler"
	"github.com/99designs/gqlgen/graphql/handler/extension"
	"github.com/99designs/gqlgen/graphql/handler/lru"
	"github.com/99designs/gqlgen/graphql/handler/transport"
	"github.com/vektah/gqlparser/v2/ast"
)

// Limits on what one request may ask for.
const (
	// MaxComplexity bounds the cost of an operation: each field costs 1,
	// and a list field costs its page size times its selection (see
	// complexity). A home page of 100 posts with their authors fits.
	MaxComplexity = 2000
	// MaxTokens bounds the size of a query document, in parser tokens.
	MaxTokens = 5000
	// MaxWebsocketMessage bounds one websocket message from a client, in bytes.
	MaxWebsocketMessage = 64 << 10
	// MaxWebsocketOperations bounds the operations running at once on one
	// websocket, each subscription a registration in the hub and, for a
	// timeline no one else follows here, a Redis channel: the handshake's
	// rate limit counts sockets, not what each one asks for.
	MaxWebsocketOperations = 100
)

// HandlerConfig configures the GraphQL handler.
type HandlerConfig struct {
	Resolver       *Resolver
	Sessions       SessionWatcher
	AllowedOrigins []string // for the websocket Origin check, as for CORS
	Introspection  bool
	Suggestions    bool // "Did you mean …?" in validation errors
	Logger         *slog.Logger

	// KeepAlive is the interval of keep-alive messages on websockets: "ka"
	// on graphql-ws, ping (expecting pong) on graphql-transport-ws. Zero
	// means 15 seconds.
	KeepAlive time.Duration

	// WriteTimeout bounds each websocket write; a client that takes longer
	// to accept one is disconnected. Zero means 10 seconds.
	WriteTimeout time.Duration

	// AllowWebsocket, if set, is asked before each websocket handshake with
	// the client's address; an ERATELIMITED error refuses it.
	AllowWebsocket func(ctx context.Context, addr string) error

	// PersistedQueries, if set, stores automatic persisted queries, so that
	// clients may send a query's SHA-256 instead of its text.
	PersistedQueries graphql.Cache[string]

	// LoaderWait is how long dataloaders collect keys before a batch; zero
	// means DefaultLoaderWait.
	LoaderWait time.Duration

	// Metrics, if set, records operation latencies and open subscriptions.
	Metrics OperationMetrics
}

// NewHandler returns the GraphQL handler for POST, GET (queries only) and
// websockets (graphql-transport-ws and the legacy graphql-ws). Form and
// multipart transports are left out on purpose: browsers send those across
// origins without a CORS preflight.
func NewHandler(cfg HandlerConfig) http.Handler {
	keepAlive := cfg.KeepAlive
	if keepAlive <= 0 {
		keepAlive = 15 * time.Second
	}
	present := ErrorPresenter(cfg.Logger)
	srv := handler.New(NewExecutableSchema(Config{Resolvers: cfg.Resolver, Complexity: complexity()}))
	srv.AddTransport(&Websocket{
		AllowedOrigins: cfg.AllowedOrigins,
		WriteTimeout:   cfg.WriteTimeout,
		Allow:          cfg.AllowWebsocket,
		Init:           websocketInit(cfg.Resolver.Auth, cfg.Sessions),
		KeepAlive:      NewKeepAlive(keepAlive),
		OnError: func(ctx context.Context, err error) {
			cfg.Logger.DebugContext(ctx, "websocket error", "err", err)
		},
	})
	srv.AddTransport(transport.Options{})
	srv.AddTransport(getTransport{})
	srv.AddTransport(postTransport{})

	srv.SetQueryCache(lru.New[*ast.QueryDocument](1000))
	srv.SetParserTokenLimit(MaxTokens)
	srv.SetValidationRulesFn(validationRules(cfg.Suggestions, cfg.Introspection))
	srv.SetDisableSuggestion(!cfg.Suggestions)
	srv.SetErrorPresenter(present)
	srv.SetRecoverFunc(RecoverFunc(cfg.Logger))
	// Extensions go through use, which refuses field middleware: the
	// generated code serves plain fields without it (gen_rewrite.go). For
	// the same reason there is no srv.AroundFields here.
	use := func(ext graphql.HandlerExtension) {
		if _, ok := ext.(graphql.FieldInterceptor); ok {
			panic(fmt.Sprintf("graph: extension %s is field middleware, which plain fields would skip (see gen_rewrite.go)", ext.ExtensionName()))
		}
		srv.Use(ext)
	}
	if cfg.Introspection {
		use(extension.Introspection{})
	}
	if cfg.PersistedQueries != nil {
		// gqlgen's extension would store a query before it is parsed, so
		// that anyone could park any text in Redis; it gets a cache that
		// only reads, and queries are stored once they have passed
		// validation and the limits.
		use(extension.AutomaticPersistedQuery{Cache: readOnlyCache{cfg.PersistedQueries}})
	}
	use(extension.FixedComplexityLimit(MaxComplexity))
	if cfg.Metrics != nil {
		srv.AroundOperations(metricsInterceptor(cfg.Metrics)) // first, so it times the rest
	}
	srv.AroundOperations(authOperation(cfg.Resolver, present))
	if cfg.PersistedQueries != nil {
		// After authOperation: a request whose token fails stores nothing.
		srv.AroundOperations(storeValidatedQuery(cfg.PersistedQueries))
	}
	srv.AroundOperations(subscriptionsOnWebsockets(present))
	loaderWait := cfg.LoaderWait
	if loaderWait <= 0 {
		loaderWait = DefaultLoaderWait
	}
	srv.AroundResponses(cfg.Resolver.withLoaders(loaderWait))
	return requireJSON(srv)
}

// readOnlyCache is a cache whose Add does nothing.
type readOnlyCache struct{ graphql.Cache[string] }

func (readOnlyCache) Add(context.Context, string, string) {}

// storeValidatedQuery stores the query of an operation that came with its
// persisted query hash. Operation middleware runs only for documents that
// parsed, validated and stayed within the limits.
func storeValidatedQuery(cache graphql.Cache[string]) graphql.OperationMiddleware {
	return func(ctx context.Context, next graphql.OperationHandler) graphql.ResponseHandler {
		if apq := extension.GetApqStats(ctx); apq != nil && apq.SentQuery {
			cache.Add(ctx, apq.Hash, graphql.GetOperationContext(ctx).RawQuery)
		}
		return next(ctx)
	}
}
