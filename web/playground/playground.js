// Warble's GraphQL playground: GraphiQL, loaded from the files served beside
// this one (nothing comes from another origin), pointed at the API on this
// origin. The page's Content-Security-Policy allows scripts from this origin
// only, which is why this is a file and not an inline script.
//
// The endpoint's path comes from the page (data-endpoint), which the server
// fills in. Queries and mutations go to it with fetch; subscriptions go to
// the same path over a websocket (ws: or wss:, as the page was loaded),
// speaking graphql-transport-ws with the graphql-ws client bundled in
// graphiql.min.js.
//
// Authentication: the Headers tab's JSON is sent with every HTTP request,
// and GraphiQL opens each subscription's socket with the same object as the
// connection_init payload. Warble reads {"Authorization": "Bearer <token>"}
// from either, so one entry in the Headers tab signs in both.

/* global React, ReactDOM, GraphiQL */

const root = document.getElementById('graphiql');
const endpoint = new URL(root.dataset.endpoint, window.location.href);
const subscriptionEndpoint = new URL(endpoint);
subscriptionEndpoint.protocol = endpoint.protocol === 'https:' ? 'wss:' : 'ws:';

const graphiqlFetcher = GraphiQL.createFetcher({
  url: endpoint.href,
  subscriptionUrl: subscriptionEndpoint.href,
});

// GraphiQL works out the operation's name, and whether it is a subscription
// (which goes over the websocket), from its last parse of the editor, made a
// moment after each change. Run straight after a paste, it would send the
// previous operation's name, or a new subscription over HTTP. What counts is
// the text being sent, so the fetcher parses that.
function fetcher(params, options) {
  let documentAST;
  try {
    documentAST = GraphiQL.GraphQL.parse(params.query);
  } catch {
    return graphiqlFetcher(params, options); // the server explains the syntax error
  }
  const operations = documentAST.definitions.filter((d) => d.kind === 'OperationDefinition');
  let { operationName } = params;
  if (operations.length === 1 && !operations.some((op) => op.name?.value === operationName)) {
    operationName = operations[0].name?.value;
  }
  return graphiqlFetcher({ ...params, operationName }, { ...options, documentAST });
}

const defaultQuery = `# Welcome to Warble's GraphQL API. Run this query with the run button
# (or Ctrl+Enter); the Docs button lists every type and field.
#
# Fields that need a session (homeTimeline, createPost, follow, ...) need a
# token: run the signup or login mutation, then put
#   {"Authorization": "Bearer <token>"}
# in the Headers tab below. Subscriptions send the same headers when their
# websocket connects, so they are signed in too.

{
  globalTimeline(first: 5) {
    edges {
      node {
        body
        createdAt
        author { username displayName }
      }
    }
  }
  newestUsers(first: 5) { username displayName }
}
`;

ReactDOM.createRoot(root).render(React.createElement(GraphiQL, {
  fetcher,
  defaultQuery,
  // Headers typed in the Headers tab hold a session token: keep them out of
  // localStorage unless the person asks GraphiQL to persist them.
  shouldPersistHeaders: false,
}));
