// The graphql-ws client (the graphql-transport-ws subprotocol) against
// Warble's websocket: subscribe, receive, complete, and a rejected token.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import {
  startWarble, signup, createPost, globalCursor, mustGql, withTimeout, EVENT_FIELDS,
} from './harness.mjs';

const WAIT = 30_000; // a safety net, not an expectation

let server;
before(async () => {
  server = await startWarble();
});
after(async () => {
  await server?.stop();
});

// newClient returns a graphql-ws client that never retries, with every
// message it receives recorded in messages, a count of its connections,
// and a promise of its first close event. With lazy false it connects at
// once and keeps the socket open without subscriptions.
function newClient(token, { lazy = true } = {}) {
  const messages = [];
  const connections = { count: 0 };
  let onClosed;
  const closed = new Promise((resolve) => {
    onClosed = resolve;
  });
  const client = createClient({
    url: server.wsUrl,
    webSocketImpl: WebSocket,
    lazy,
    retryAttempts: 0,
    connectionParams: token ? { Authorization: `Bearer ${token}` } : undefined,
    on: {
      connected: () => connections.count++,
      message: (m) => messages.push(m),
      closed: (event) => onClosed(event),
    },
  });
  return { client, messages, connections, closed };
}

const next = (it, what) => withTimeout(it.next(), WAIT, what);

test('graphql-ws: subscribe, receive, complete', async (t) => {
  const alice = await signup(server, 'alice');
  await createPost(server, alice.token, 'before the subscription');
  const cursor = await globalCursor(server);

  // Not lazy: a lazy client closes its socket when its last subscription
  // completes, and the check below needs one connection throughout.
  const { client, messages, connections } = newClient('', { lazy: false });
  t.after(() => client.dispose());

  // after: replays whatever is newer than cursor, so the post below is
  // delivered however late the subscription starts on the server.
  const query = `subscription ($after: String) { globalTimeline(after: $after) { ${EVENT_FIELDS} } }`;
  const first = client.iterate({ query, variables: { after: cursor } });
  const post = await createPost(server, alice.token, 'hello over graphql-transport-ws');

  const got = await next(first, 'the first event');
  assert.equal(got.done, false);
  assert.equal(got.value.errors, undefined);
  const ev = got.value.data.globalTimeline;
  assert.equal(ev.kind, 'POST_ADDED');
  assert.equal(ev.postId, post.id);
  assert.deepEqual(ev.post, { id: post.id, body: post.body, author: { username: alice.username } });
  assert.equal(typeof ev.cursor, 'string');

  // Complete: return() sends complete and ends the iterator on the client.
  const firstId = messages.find((m) => m.type === 'next').id;
  assert.deepEqual(await withTimeout(first.return(), WAIT, 'complete'), { done: true, value: undefined });
  const nextsBefore = messages.filter((m) => m.type === 'next' && m.id === firstId).length;

  // The server reads a connection's messages in order, so once this
  // second subscription has replayed the post above, the complete was
  // handled; a post written after that must reach only the second one.
  const second = client.iterate({ query, variables: { after: cursor } });
  const replayed = await next(second, 'the replay on the second subscription');
  assert.equal(replayed.value.data.globalTimeline.postId, post.id);
  const later = await createPost(server, alice.token, 'after the complete');
  const live = await next(second, 'the live event on the second subscription');
  assert.equal(live.value.data.globalTimeline.postId, later.id);
  await withTimeout(second.return(), WAIT, 'the second complete');

  const nextsAfter = messages.filter((m) => m.type === 'next' && m.id === firstId).length;
  assert.equal(nextsAfter, nextsBefore, 'the server sent events for a completed subscription');
  assert.equal(connections.count, 1, 'both subscriptions should share one connection');
});

test('graphql-ws: homeTimeline with the token in connection_init', async (t) => {
  const bob = await signup(server, 'bob');
  await createPost(server, bob.token, 'my first post');
  const home = await mustGql(server, '{ homeTimeline(first: 1) { edges { cursor } } }', {}, bob.token);
  const cursor = home.homeTimeline.edges[0].cursor;

  const { client } = newClient(bob.token);
  t.after(() => client.dispose());
  const it = client.iterate({
    query: `subscription ($after: String) { homeTimeline(after: $after) { ${EVENT_FIELDS} } }`,
    variables: { after: cursor },
  });
  const post = await createPost(server, bob.token, 'my second post');
  const got = await next(it, 'a home timeline event');
  assert.equal(got.value.errors, undefined);
  assert.equal(got.value.data.homeTimeline.kind, 'POST_ADDED');
  assert.equal(got.value.data.homeTimeline.post.id, post.id);
  assert.equal(got.value.data.homeTimeline.post.author.username, bob.username);
  await withTimeout(it.return(), WAIT, 'complete');
});

test('graphql-ws: a bad token is rejected with close code 4403', async (t) => {
  const { client, closed } = newClient('not-a-real-token');
  t.after(() => client.dispose());
  const it = client.iterate({ query: `subscription { globalTimeline { ${EVENT_FIELDS} } }` });
  await assert.rejects(next(it, 'the rejection'), (err) => {
    assert.equal(err.code, 4403, `closed with ${err.code} ${err.reason}`);
    return true;
  });
  const event = await withTimeout(closed, WAIT, 'the close event');
  assert.equal(event.code, 4403);
});

test('graphql-ws: homeTimeline without a token is UNAUTHENTICATED', async (t) => {
  const { client } = newClient();
  t.after(() => client.dispose());
  const it = client.iterate({ query: `subscription { homeTimeline { ${EVENT_FIELDS} } }` });
  // graphql-ws hands an error message to the iterator as a thrown array of
  // GraphQL errors; a result with errors would come as a value instead.
  let errors;
  try {
    const got = await next(it, 'the refusal');
    errors = got.value?.errors;
  } catch (err) {
    errors = err;
  }
  assert.ok(Array.isArray(errors) && errors.length > 0, `want GraphQL errors, got ${JSON.stringify(errors)}`);
  assert.equal(errors[0].extensions?.code, 'UNAUTHENTICATED');
});
