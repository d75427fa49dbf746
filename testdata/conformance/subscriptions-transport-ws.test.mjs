// The legacy subscriptions-transport-ws client (the graphql-ws
// subprotocol) against Warble's websocket: subscribe, receive, complete
// (the client's stop), and a rejected token.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { SubscriptionClient } from 'subscriptions-transport-ws';
import WebSocket from 'ws';
import {
  startWarble, signup, createPost, globalCursor, gql, mustGql, withTimeout, Inbox, EVENT_FIELDS,
} from './harness.mjs';

const WAIT = 30_000; // a safety net, not an expectation

let server;
before(async () => {
  server = await startWarble();
});
after(async () => {
  await server?.stop();
});

// newClient returns a legacy client that never reconnects, the messages
// its socket receives, a promise of the socket's close event, and an inbox
// of what connectionCallback is called with (an error payload, or nothing
// on connection_ack).
function newClient(token) {
  const connection = new Inbox();
  const client = new SubscriptionClient(
    server.wsUrl,
    {
      reconnect: false,
      // The client gives up on a handshake after minTimeout (1 s by
      // default), too short on a loaded machine; timeout bounds the wait
      // between the server's keep-alives (every 15 s).
      minTimeout: WAIT,
      timeout: 2 * WAIT,
      connectionParams: token ? { Authorization: `Bearer ${token}` } : {},
      connectionCallback: (error) => (error ? connection.error(error) : connection.next('ack')),
    },
    WebSocket,
  );
  // The constructor opens the socket at once (lazy is false), so its
  // events can be watched beside the client's own handlers.
  const socket = client.client;
  const messages = [];
  socket.addEventListener('message', (e) => messages.push(JSON.parse(e.data)));
  const closed = new Promise((resolve) => socket.addEventListener('close', resolve));
  return { client, socket, messages, closed, connection };
}

const subscription = (field, args = '') => `subscription ($after: String) { ${field}(after: $after${args}) { ${EVENT_FIELDS} } }`;

test('subscriptions-transport-ws: subscribe, receive, complete', async (t) => {
  const carol = await signup(server, 'carol');
  await createPost(server, carol.token, 'before the subscription');
  const cursor = await globalCursor(server);

  const { client, socket, messages, connection } = newClient();
  t.after(() => client.close());

  // after: replays whatever is newer than cursor, so the post below is
  // delivered however late the subscription starts on the server.
  const first = new Inbox();
  const firstSub = client
    .request({ query: subscription('globalTimeline'), variables: { after: cursor } })
    .subscribe(first);
  assert.equal(await connection.value('connection_ack', WAIT), 'ack');
  assert.equal(socket.protocol, 'graphql-ws');

  const post = await createPost(server, carol.token, 'hello over the legacy protocol');
  const result = await first.value('the first event', WAIT);
  assert.equal(result.errors, undefined);
  const ev = result.data.globalTimeline;
  assert.equal(ev.kind, 'POST_ADDED');
  assert.equal(ev.postId, post.id);
  assert.deepEqual(ev.post, { id: post.id, body: post.body, author: { username: carol.username } });

  // Complete: unsubscribe sends stop.
  const firstId = messages.find((m) => m.type === 'data').id;
  firstSub.unsubscribe();
  const dataBefore = messages.filter((m) => m.type === 'data' && m.id === firstId).length;

  // The server reads a connection's messages in order, so once a second
  // subscription has replayed the post above, the stop was handled; a post
  // written after that must reach only the second one.
  const second = new Inbox();
  const secondSub = client
    .request({ query: subscription('globalTimeline'), variables: { after: cursor } })
    .subscribe(second);
  assert.equal((await second.value('the replay', WAIT)).data.globalTimeline.postId, post.id);
  const later = await createPost(server, carol.token, 'after the stop');
  assert.equal((await second.value('the live event', WAIT)).data.globalTimeline.postId, later.id);
  secondSub.unsubscribe();

  const dataAfter = messages.filter((m) => m.type === 'data' && m.id === firstId).length;
  assert.equal(dataAfter, dataBefore, 'the server sent data for a stopped subscription');
  // Nothing reached the first observer after unsubscribe, and both
  // subscriptions used the one socket, still open.
  await assert.rejects(first.take('nothing', 1), /timed out/);
  assert.equal(client.client, socket);
  assert.equal(socket.readyState, WebSocket.OPEN);
});

test('subscriptions-transport-ws: userPosts and homeTimeline with the token in connection_init', async (t) => {
  const dave = await signup(server, 'dave');
  await createPost(server, dave.token, 'my first post');
  const home = await mustGql(server, '{ homeTimeline(first: 1) { edges { cursor } } }', {}, dave.token);
  const homeCursor = home.homeTimeline.edges[0].cursor;
  const mine = await mustGql(
    server,
    'query ($u: String!) { user(username: $u) { posts(first: 1) { edges { cursor } } } }',
    { u: dave.username },
  );
  const userCursor = mine.user.posts.edges[0].cursor;

  const { client, connection } = newClient(dave.token);
  t.after(() => client.close());
  const homeEvents = new Inbox();
  const userEvents = new Inbox();
  client.request({ query: subscription('homeTimeline'), variables: { after: homeCursor } }).subscribe(homeEvents);
  client
    .request({
      query: `subscription ($u: String!, $after: String) { userPosts(username: $u, after: $after) { ${EVENT_FIELDS} } }`,
      variables: { u: dave.username, after: userCursor },
    })
    .subscribe(userEvents);
  assert.equal(await connection.value('connection_ack', WAIT), 'ack');

  const post = await createPost(server, dave.token, 'my second post');
  for (const [inbox, field] of [[homeEvents, 'homeTimeline'], [userEvents, 'userPosts']]) {
    const result = await inbox.value(`a ${field} event`, WAIT);
    assert.equal(result.errors, undefined);
    assert.equal(result.data[field].kind, 'POST_ADDED');
    assert.equal(result.data[field].post.id, post.id);
    assert.equal(result.data[field].post.author.username, dave.username);
  }
});

test('subscriptions-transport-ws: a bad token gets connection_error and close code 4403', async (t) => {
  const { client, closed, connection } = newClient('not-a-real-token');
  t.after(() => client.close());
  const events = new Inbox();
  client.request({ query: `subscription { globalTimeline { ${EVENT_FIELDS} } }` }).subscribe(events);

  // The legacy protocol has connection_error: the client hands its payload
  // to connectionCallback. Then the server closes the socket with 4403.
  const item = await connection.take('connection_error', WAIT);
  assert.ok(item.error, `want a connection error, got ${JSON.stringify(item)}`);
  // The message is for people, the same sentence as over HTTP.
  const overHTTP = await gql(server, '{ viewer { id } }', {}, 'not-a-real-token');
  assert.equal(overHTTP.errors?.[0]?.extensions?.code, 'UNAUTHENTICATED');
  assert.equal(item.error.message, overHTTP.errors[0].message);
  const event = await withTimeout(closed, WAIT, 'the close event');
  assert.equal(event.code, 4403, `closed with ${event.code} ${event.reason}`);
  // The subscription never ran.
  await assert.rejects(events.take('nothing', 1), /timed out/);
});

test('subscriptions-transport-ws: homeTimeline without a token is UNAUTHENTICATED', async (t) => {
  const { client } = newClient();
  t.after(() => client.close());
  const events = new Inbox();
  client.request({ query: subscription('homeTimeline') }).subscribe(events);
  // Depending on where the server refuses it, the refusal is an error
  // message (observer.error) or a data message with errors (observer.next).
  const item = await events.take('the refusal', WAIT);
  const errors = item.error ? [item.error] : item.value?.errors;
  assert.ok(Array.isArray(errors) && errors.length > 0, `want errors, got ${JSON.stringify(item)}`);
  assert.equal(errors[0].extensions?.code, 'UNAUTHENTICATED', JSON.stringify(errors));
});
