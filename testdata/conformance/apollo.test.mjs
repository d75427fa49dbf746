// Apollo Client against Warble: queries and mutations through its HttpLink
// (POST, and GET for queries), subscriptions through GraphQLWsLink, split
// the way Apollo's documentation sets up an app.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { ApolloClient, InMemoryCache, HttpLink, ApolloLink, CombinedGraphQLErrors, gql } from '@apollo/client';
import { GraphQLWsLink } from '@apollo/client/link/subscriptions';
import { OperationTypeNode } from 'graphql';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { startWarble, uniqueName, Inbox, EVENT_FIELDS } from './harness.mjs';

const WAIT = 30_000; // a safety net, not an expectation

let server;
before(async () => {
  server = await startWarble();
});
after(async () => {
  await server?.stop();
});

// newApollo returns an Apollo Client whose queries and mutations go over
// HTTP (GET for queries when useGET) and subscriptions over graphql-ws,
// signed in with token if given, the methods of the HTTP requests it made,
// and a function that closes it.
function newApollo({ token, useGET = false } = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const methods = [];
  const recordingFetch = (url, init) => {
    methods.push(init?.method ?? 'GET');
    return fetch(url, init);
  };
  const http = new HttpLink({ uri: server.url, headers, useGETForQueries: useGET, fetch: recordingFetch });
  const wsClient = createClient({
    url: server.wsUrl,
    webSocketImpl: WebSocket,
    retryAttempts: 0,
    connectionParams: token ? { Authorization: `Bearer ${token}` } : undefined,
  });
  const link = ApolloLink.split(
    (op) => op.operationType === OperationTypeNode.SUBSCRIPTION,
    new GraphQLWsLink(wsClient),
    http,
  );
  const client = new ApolloClient({ link, cache: new InMemoryCache() });
  return {
    client,
    methods,
    close: async () => {
      client.stop();
      await wsClient.dispose();
    },
  };
}

const SIGNUP = gql`
  mutation Signup($input: SignupInput!) {
    signup(input: $input) { token user { id username } }
  }
`;
const CREATE_POST = gql`
  mutation CreatePost($input: CreatePostInput!) {
    createPost(input: $input) { post { id body author { username } } }
  }
`;
const GLOBAL = gql`
  query Global($first: Int) {
    globalTimeline(first: $first) {
      edges { cursor node { id body author { username } } }
      pageInfo { hasNextPage endCursor }
    }
  }
`;
const VIEWER = gql`
  query Viewer { viewer { id username postsCount } }
`;
const LIVE = gql`
  subscription Live($after: String) {
    globalTimeline(after: $after) { ${EVENT_FIELDS} }
  }
`;

// signupWithApollo creates a user through Apollo and returns it with its
// token.
async function signupWithApollo(prefix) {
  const anon = newApollo();
  try {
    const username = uniqueName(prefix);
    const { data } = await anon.client.mutate({
      mutation: SIGNUP,
      variables: { input: { username, password: 'correct horse battery' } },
    });
    assert.equal(data.signup.user.username, username);
    assert.equal(typeof data.signup.token, 'string');
    return { username, id: data.signup.user.id, token: data.signup.token };
  } finally {
    await anon.close();
  }
}

test('apollo: mutations and queries over HttpLink (POST, and GET for queries)', async (t) => {
  const erin = await signupWithApollo('erin');
  const apollo = newApollo({ token: erin.token });
  t.after(apollo.close);

  const { data } = await apollo.client.mutate({
    mutation: CREATE_POST,
    variables: { input: { body: '  hello from Apollo  ' } },
  });
  const post = data.createPost.post;
  assert.equal(post.body, 'hello from Apollo');
  assert.equal(post.author.username, erin.username);

  const global = await apollo.client.query({ query: GLOBAL, variables: { first: 5 }, fetchPolicy: 'network-only' });
  assert.equal(global.error, undefined);
  const newest = global.data.globalTimeline.edges[0];
  assert.equal(newest.node.id, post.id);
  assert.equal(newest.node.body, post.body);
  assert.equal(global.data.globalTimeline.pageInfo.endCursor, global.data.globalTimeline.edges.at(-1).cursor);
  assert.deepEqual(apollo.methods, ['POST', 'POST']);

  // The same through GET /graphql, as Apollo sends it with useGETForQueries.
  const viaGET = newApollo({ token: erin.token, useGET: true });
  t.after(viaGET.close);
  const viewer = await viaGET.client.query({ query: VIEWER, fetchPolicy: 'network-only' });
  assert.equal(viewer.data.viewer.username, erin.username);
  assert.equal(viewer.data.viewer.id, erin.id);
  assert.equal(viewer.data.viewer.postsCount, 1);
  assert.deepEqual(viaGET.methods, ['GET']);
});

test('apollo: a mutation without a session fails with UNAUTHENTICATED', async (t) => {
  const apollo = newApollo();
  t.after(apollo.close);
  await assert.rejects(
    apollo.client.mutate({ mutation: CREATE_POST, variables: { input: { body: 'who am I?' } } }),
    (err) => {
      assert.ok(CombinedGraphQLErrors.is(err), `want CombinedGraphQLErrors, got ${err}`);
      assert.equal(err.errors[0].extensions?.code, 'UNAUTHENTICATED');
      return true;
    },
  );
  const viewer = await apollo.client.query({ query: VIEWER, fetchPolicy: 'network-only' });
  assert.equal(viewer.data.viewer, null);
});

test('apollo: a subscription over GraphQLWsLink', async (t) => {
  const frank = await signupWithApollo('frank');
  const apollo = newApollo({ token: frank.token });
  t.after(apollo.close);

  // A post first, so that the global timeline has a cursor to subscribe
  // after: the subscription replays anything newer, so the post below
  // cannot be missed however late the subscription starts on the server.
  await apollo.client.mutate({ mutation: CREATE_POST, variables: { input: { body: 'warming up' } } });
  const global = await apollo.client.query({ query: GLOBAL, variables: { first: 1 }, fetchPolicy: 'network-only' });
  const cursor = global.data.globalTimeline.edges[0].cursor;

  const events = new Inbox();
  const sub = apollo.client.subscribe({ query: LIVE, variables: { after: cursor } }).subscribe(events);
  t.after(() => sub.unsubscribe());

  const { data } = await apollo.client.mutate({
    mutation: CREATE_POST,
    variables: { input: { body: 'live through Apollo' } },
  });
  const post = data.createPost.post;

  const result = await events.value('a subscription event', WAIT);
  assert.equal(result.error, undefined);
  const ev = result.data.globalTimeline;
  assert.equal(ev.kind, 'POST_ADDED');
  assert.equal(ev.postId, post.id);
  assert.equal(ev.post.id, post.id);
  assert.equal(ev.post.body, 'live through Apollo');
  assert.equal(ev.post.author.username, frank.username);

  // A second post arrives on the same subscription, after the first.
  const second = await apollo.client.mutate({
    mutation: CREATE_POST,
    variables: { input: { body: 'and another one' } },
  });
  const next = await events.value('the second subscription event', WAIT);
  assert.equal(next.data.globalTimeline.postId, second.data.createPost.post.id);
  assert.ok(next.data.globalTimeline.cursor !== ev.cursor);
});
