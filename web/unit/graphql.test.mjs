import { test, beforeEach } from 'node:test';
import assert from 'node:assert/strict';

import {
  GraphQLClient, GraphQLError, ConnectionState, SUBPROTOCOL, backoffDelay,
} from '../static/js/graphql.js';
import { FakeWebSocket, FakeTimers, fakeFetch } from './fakes.mjs';

const SUB = 'subscription($after: String) { globalTimeline(after: $after) { kind cursor postId } }';

function makeClient({ token = null, fetch = fakeFetch(), timers = new FakeTimers(), ...options } = {}) {
  let current = token;
  const client = new GraphQLClient({
    httpUrl: 'http://warble.test/graphql',
    wsUrl: 'ws://warble.test/graphql',
    getToken: () => current,
    fetch,
    WebSocket: FakeWebSocket,
    timers,
    backoff: { base: 500, max: 8000, random: () => 1 }, // no jitter: the full delay
    ...options,
  });
  const states = [];
  client.on('state', (s) => states.push(s));
  const authErrors = [];
  client.on('autherror', (e) => authErrors.push(e));
  return { client, timers, states, authErrors, setToken: (t) => { current = t; } };
}

/** A sink that records what the subscription delivers. */
function recorder() {
  const sink = { events: [], errors: [], completed: 0 };
  sink.next = (data) => sink.events.push(data);
  sink.error = (e) => sink.errors.push(e);
  sink.complete = () => sink.completed++;
  return sink;
}

beforeEach(() => FakeWebSocket.reset());

// --- queries and mutations -----------------------------------------------

test('request POSTs the operation as JSON with the bearer token and returns data', async () => {
  const fetch = fakeFetch({ json: { data: { viewer: { username: 'ada' } } } });
  const { client } = makeClient({ token: 'tok123', fetch });
  const data = await client.request('query { viewer { username } }', { a: 1 });
  assert.deepEqual(data, { viewer: { username: 'ada' } });
  const [call] = fetch.calls;
  assert.equal(call.url, 'http://warble.test/graphql');
  assert.equal(call.init.method, 'POST');
  assert.equal(call.init.headers.Authorization, 'Bearer tok123');
  assert.equal(call.init.headers['Content-Type'], 'application/json');
  assert.deepEqual(call.body, { query: 'query { viewer { username } }', variables: { a: 1 } });
});

test('request sends no Authorization header when signed out', async () => {
  const fetch = fakeFetch({ json: { data: { viewer: null } } });
  const { client } = makeClient({ fetch });
  await client.request('query { viewer { id } }');
  assert.equal('Authorization' in fetch.calls[0].init.headers, false);
});

test('request rejects with the extensions.code of the first error', async () => {
  const fetch = fakeFetch({
    json: {
      errors: [{ message: 'That username is taken.', extensions: { code: 'CONFLICT' } }],
      data: null,
    },
  });
  const { client } = makeClient({ fetch });
  await assert.rejects(client.request('mutation { x }'), (error) => {
    assert.ok(error instanceof GraphQLError);
    assert.equal(error.code, 'CONFLICT');
    assert.equal(error.message, 'That username is taken.');
    assert.equal(error.errors.length, 1);
    return true;
  });
});

test('an UNAUTHENTICATED answer to a request with a token is reported as autherror', async () => {
  const unauthenticated = { json: { errors: [{ message: 'Session expired.', extensions: { code: 'UNAUTHENTICATED' } }] } };
  const { client, authErrors, setToken } = makeClient({ token: 'old', fetch: fakeFetch(unauthenticated, unauthenticated) });
  await assert.rejects(client.request('query { homeTimeline { edges { cursor } } }'), { code: 'UNAUTHENTICATED' });
  assert.equal(authErrors.length, 1);

  // Without a token it is an ordinary failure (a wrong password, say).
  setToken(null);
  await assert.rejects(client.request('mutation { login }'), { code: 'UNAUTHENTICATED' });
  assert.equal(authErrors.length, 1);
});

test('a network failure rejects with NETWORK', async () => {
  const { client } = makeClient({ fetch: fakeFetch(new TypeError('Failed to fetch')) });
  await assert.rejects(client.request('query { viewer { id } }'), (error) => {
    assert.equal(error.code, 'NETWORK');
    assert.ok(error.cause instanceof TypeError);
    return true;
  });
});

test('an answer that is not JSON rejects with the status', async () => {
  const { client } = makeClient({ fetch: fakeFetch({ status: 502, text: '<html>Bad gateway</html>' }) });
  await assert.rejects(client.request('query { viewer { id } }'), { code: 'NETWORK', status: 502 });
});

// --- the graphql-transport-ws protocol -----------------------------------

test('subscribe connects lazily, sends connection_init with the token, and subscribes after the ack', () => {
  const { client, states } = makeClient({ token: 'tok' });
  assert.equal(FakeWebSocket.instances.length, 0, 'no socket before the first subscription');
  const sink = recorder();
  client.subscribe({ query: SUB, variables: { after: 'c1' } }, sink);

  const ws = FakeWebSocket.last;
  assert.equal(ws.url, 'ws://warble.test/graphql');
  assert.equal(ws.protocol, SUBPROTOCOL);
  assert.equal(client.state, ConnectionState.CONNECTING);

  ws.open();
  assert.deepEqual(ws.sent, [{ type: 'connection_init', payload: { Authorization: 'Bearer tok' } }]);
  ws.receive({ type: 'connection_ack' });
  assert.equal(client.state, ConnectionState.LIVE);
  assert.deepEqual(ws.sentOf('subscribe'), [{ type: 'subscribe', id: '1', payload: { query: SUB, variables: { after: 'c1' } } }]);
  assert.deepEqual(states, ['connecting', 'live']);
});

test('connection_init has an empty payload when signed out', () => {
  const { client } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  FakeWebSocket.last.open();
  assert.deepEqual(FakeWebSocket.last.sent[0], { type: 'connection_init', payload: {} });
});

test('next delivers data to its own subscription only', () => {
  const { client } = makeClient();
  const a = recorder();
  const b = recorder();
  client.subscribe({ query: SUB }, a);
  client.subscribe({ query: SUB }, b);
  const ws = FakeWebSocket.last;
  ws.accept();
  assert.equal(FakeWebSocket.instances.length, 1, 'one socket for all subscriptions');
  ws.receive({ type: 'next', id: '2', payload: { data: { globalTimeline: { kind: 'POST_ADDED', cursor: 'c9' } } } });
  assert.equal(a.events.length, 0);
  assert.deepEqual(b.events, [{ globalTimeline: { kind: 'POST_ADDED', cursor: 'c9' } }]);
});

test('a subscription started on a live socket is sent at once', () => {
  const { client } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.accept();
  client.subscribe({ query: SUB, variables: { after: 'x' } }, recorder());
  assert.deepEqual(ws.sentOf('subscribe').map((m) => m.id), ['1', '2']);
});

test('the client answers ping with pong', () => {
  const { client } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.accept();
  ws.receive({ type: 'ping' });
  ws.receive({ type: 'ping', payload: { n: 1 } });
  assert.deepEqual(ws.sentOf('pong'), [{ type: 'pong' }, { type: 'pong', payload: { n: 1 } }]);
});

test('unsubscribe sends complete, and the socket closes after the idle timeout', () => {
  const { client, timers } = makeClient({ idleTimeout: 5000 });
  const stop = client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.accept();
  stop();
  stop(); // twice is harmless
  assert.deepEqual(ws.sentOf('complete'), [{ type: 'complete', id: '1' }]);
  timers.advance(4999);
  assert.equal(ws.closedWith, null, 'kept for a moment, for the next screen');
  timers.advance(1);
  assert.deepEqual(ws.closedWith, { code: 1000, reason: 'Normal Closure' });
  assert.equal(client.state, ConnectionState.IDLE);
});

test('a new subscription within the idle timeout reuses the socket', () => {
  const { client, timers } = makeClient({ idleTimeout: 5000 });
  const stop = client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.accept();
  stop();
  timers.advance(1000);
  client.subscribe({ query: SUB }, recorder());
  timers.advance(10_000);
  assert.equal(ws.closedWith, null);
  assert.equal(FakeWebSocket.instances.length, 1);
  assert.deepEqual(ws.sentOf('subscribe').map((m) => m.id), ['1', '2']);
});

test('an error message ends the subscription with a GraphQLError and it is not sent again', () => {
  const { client } = makeClient();
  const sink = recorder();
  client.subscribe({ query: SUB }, sink);
  let ws = FakeWebSocket.last;
  ws.accept();
  ws.receive({ type: 'error', id: '1', payload: [{ message: 'You need to log in to do this.', extensions: { code: 'UNAUTHENTICATED' } }] });
  assert.equal(sink.errors.length, 1);
  assert.equal(sink.errors[0].code, 'UNAUTHENTICATED');
  ws.receive({ type: 'next', id: '1', payload: { data: { late: true } } });
  assert.equal(sink.events.length, 0, 'nothing after the end');
});

test('next with errors and no data ends the subscription like error', () => {
  const { client } = makeClient();
  const sink = recorder();
  client.subscribe({ query: SUB }, sink);
  const ws = FakeWebSocket.last;
  ws.accept();
  ws.receive({ type: 'next', id: '1', payload: { data: null, errors: [{ message: 'No such user.', extensions: { code: 'NOT_FOUND' } }] } });
  assert.equal(sink.errors[0].code, 'NOT_FOUND');
});

test('complete from the server ends the subscription', () => {
  const { client } = makeClient();
  const sink = recorder();
  client.subscribe({ query: SUB }, sink);
  FakeWebSocket.last.accept();
  FakeWebSocket.last.receive({ type: 'complete', id: '1' });
  assert.equal(sink.completed, 1);
});

test('a message that is not JSON or of an unknown type drops the connection and retries', () => {
  const { client, timers } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.accept();
  ws.receive('not json');
  assert.equal(ws.closedWith.code, 4400);
  assert.equal(client.state, ConnectionState.RECONNECTING);
  timers.advance(500);
  const ws2 = FakeWebSocket.last;
  assert.notEqual(ws2, ws);
  ws2.accept();
  ws2.receive({ type: 'surprise' });
  assert.equal(ws2.closedWith.code, 4400);
});

// --- reconnecting and resuming -------------------------------------------

test('backoffDelay grows exponentially, is capped, and jitters in the upper half', () => {
  const full = (n) => backoffDelay(n, { base: 500, max: 8000, random: () => 1 });
  assert.deepEqual([0, 1, 2, 3, 4, 5, 6].map(full), [500, 1000, 2000, 4000, 8000, 8000, 8000]);
  const half = (n) => backoffDelay(n, { base: 500, max: 8000, random: () => 0 });
  assert.deepEqual([0, 1, 4].map(half), [250, 500, 4000]);
  for (let i = 0; i < 100; i++) {
    const d = backoffDelay(3, { base: 500, max: 8000 });
    assert.ok(d >= 2000 && d <= 4000, `${d} within [2000, 4000]`);
  }
});

test('a lost connection is retried with growing delays until one is acknowledged', () => {
  const { client, timers, states } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  FakeWebSocket.last.accept();

  FakeWebSocket.last.serverClose(1006);
  assert.equal(client.state, ConnectionState.RECONNECTING);
  const seen = [];
  for (let attempt = 0; attempt < 6; attempt++) {
    const before = FakeWebSocket.instances.length;
    const [delay] = timers.delays.filter((d) => d > 0);
    seen.push(delay);
    timers.advance(delay - 1);
    assert.equal(FakeWebSocket.instances.length, before, 'not before the delay');
    timers.advance(1);
    assert.equal(FakeWebSocket.instances.length, before + 1, 'a new socket after it');
    FakeWebSocket.last.serverClose(1006); // the server is still down
  }
  assert.deepEqual(seen, [500, 1000, 2000, 4000, 8000, 8000]);

  // Once a connection is acknowledged, the next loss starts from the base again.
  timers.advance(8000);
  FakeWebSocket.last.accept();
  assert.equal(client.state, ConnectionState.LIVE);
  FakeWebSocket.last.serverClose(1001);
  assert.deepEqual(timers.delays.filter((d) => d > 0), [500]);
  assert.equal(states[0], 'connecting');
  assert.ok(states.includes('reconnecting'));
  assert.equal(states.filter((s) => s === 'live').length, 2);
});

test('retryAt tells when the next attempt is due, and retryNow skips the wait', () => {
  const { client, timers } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  FakeWebSocket.last.accept();
  FakeWebSocket.last.serverClose(1006);
  assert.equal(client.retryAt, timers.now() + 500);
  const before = FakeWebSocket.instances.length;
  client.retryNow();
  assert.equal(FakeWebSocket.instances.length, before + 1);
  assert.equal(client.retryAt, null);
});

test('a connection that is never acknowledged times out and is retried', () => {
  const { client, timers } = makeClient({ ackTimeout: 3000 });
  client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.open(); // but the server never acks
  timers.advance(3000);
  assert.equal(ws.closedWith.code, 4504);
  assert.equal(client.state, ConnectionState.RECONNECTING);
  timers.advance(500);
  assert.equal(FakeWebSocket.instances.length, 2);
});

test('after a reconnect each subscription is sent again with variables for resuming', () => {
  const { client, timers } = makeClient();
  let newest = null;
  const calls = [];
  const sink = recorder();
  sink.next = (data) => {
    sink.events.push(data);
    newest = data.globalTimeline.cursor; // what a timeline does with each event
  };
  client.subscribe({
    query: SUB,
    variables: ({ resumed }) => {
      calls.push(resumed);
      return newest ? { after: newest } : {};
    },
  }, sink);

  let ws = FakeWebSocket.last;
  ws.accept();
  assert.deepEqual(ws.sentOf('subscribe')[0].payload.variables, {});
  ws.receive({ type: 'next', id: '1', payload: { data: { globalTimeline: { kind: 'POST_ADDED', cursor: 'c5' } } } });
  ws.receive({ type: 'next', id: '1', payload: { data: { globalTimeline: { kind: 'POST_ADDED', cursor: 'c6' } } } });

  ws.serverClose(1006); // the server restarts
  timers.advance(500);
  ws = FakeWebSocket.last;
  ws.accept();
  const [again] = ws.sentOf('subscribe');
  assert.equal(again.id, '1');
  assert.deepEqual(again.payload.variables, { after: 'c6' }, 'resumes after the newest cursor seen');
  assert.deepEqual(calls, [false, true]);
});

test('subscriptions ended while disconnected are not sent again', () => {
  const { client, timers } = makeClient();
  const stopA = client.subscribe({ query: SUB }, recorder());
  client.subscribe({ query: SUB }, recorder());
  FakeWebSocket.last.accept();
  FakeWebSocket.last.serverClose(1006);
  stopA();
  timers.advance(500);
  FakeWebSocket.last.accept();
  assert.deepEqual(FakeWebSocket.last.sentOf('subscribe').map((m) => m.id), ['2']);
  assert.deepEqual(FakeWebSocket.last.sentOf('complete'), [], 'nothing to complete on the new socket');
});

test('when every subscription ends during the backoff, no reconnect happens', () => {
  const { client, timers } = makeClient();
  const stop = client.subscribe({ query: SUB }, recorder());
  FakeWebSocket.last.accept();
  FakeWebSocket.last.serverClose(1006);
  stop();
  timers.advance(60_000);
  assert.equal(FakeWebSocket.instances.length, 1);
  assert.equal(client.state, ConnectionState.IDLE);
});

test('close code 4403 reports autherror and waits for reconnect() instead of retrying', () => {
  const { client, timers, authErrors, setToken } = makeClient({ token: 'revoked' });
  client.subscribe({ query: SUB }, recorder());
  const ws = FakeWebSocket.last;
  ws.open();
  ws.serverClose(4403, 'Forbidden');
  assert.equal(client.state, ConnectionState.UNAUTHORIZED);
  assert.equal(authErrors.length, 1);
  assert.equal(authErrors[0].code, 'UNAUTHENTICATED');
  timers.advance(60_000);
  assert.equal(FakeWebSocket.instances.length, 1, 'no retry with a token that cannot work');

  // The app drops the token and reconnects, signed out.
  setToken(null);
  client.reconnect();
  assert.equal(FakeWebSocket.instances.length, 2);
  assert.deepEqual(FakeWebSocket.last.accept(), { type: 'connection_init', payload: {} });
  assert.equal(client.state, ConnectionState.LIVE);
  assert.equal(FakeWebSocket.last.sentOf('subscribe').length, 1);
});

test('reconnect() replaces a live socket, sending the new token', () => {
  const { client, setToken } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  const first = FakeWebSocket.last;
  first.accept();
  setToken('fresh');
  client.reconnect();
  assert.equal(first.closedWith.code, 1000);
  first.serverClose(1000); // the old socket's close event arrives late: ignored
  const second = FakeWebSocket.last;
  assert.notEqual(second, first);
  assert.deepEqual(second.accept().payload, { Authorization: 'Bearer fresh' });
  assert.equal(client.state, ConnectionState.LIVE);
  assert.equal(FakeWebSocket.instances.length, 2, 'the late close started no retry');
});

test('dispose ends everything', () => {
  const { client, timers } = makeClient();
  client.subscribe({ query: SUB }, recorder());
  FakeWebSocket.last.accept();
  client.dispose();
  assert.equal(FakeWebSocket.last.closedWith.code, 1000);
  timers.advance(60_000);
  assert.equal(FakeWebSocket.instances.length, 1);
  assert.equal(client.state, ConnectionState.IDLE);
});
