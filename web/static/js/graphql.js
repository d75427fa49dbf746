// A small GraphQL client for Warble: queries and mutations over fetch, and
// subscriptions over one WebSocket speaking the graphql-transport-ws
// protocol, reconnecting with exponential backoff.
//
// It knows nothing about the DOM, so node's test runner can drive it with a
// fake WebSocket, fake fetch and fake timers (see web/unit/).
//
// Resuming after a reconnect is the caller's part: a subscription's
// variables may be a function, called each time the subscription is
// (re)sent, so a timeline can pass `after:` = the newest cursor it has shown
// and the server replays whatever was missed.

/** The subprotocol of the `graphql-ws` npm package, which Warble speaks. */
export const SUBPROTOCOL = 'graphql-transport-ws';

/** Close codes of graphql-transport-ws that this client treats specially. */
export const CloseCode = Object.freeze({
  BadRequest: 4400,
  Forbidden: 4403, // Warble: the token in connection_init is bad or revoked
  ConnectionAcknowledgementTimeout: 4504,
});

/** What the subscription connection is doing, for a status indicator. */
export const ConnectionState = Object.freeze({
  IDLE: 'idle', // no subscriptions, no socket
  CONNECTING: 'connecting', // first attempt, waiting for connection_ack
  LIVE: 'live', // acknowledged: events flow
  RECONNECTING: 'reconnecting', // lost it; waiting out the backoff or retrying
  UNAUTHORIZED: 'unauthorized', // the server refused our token; waits for reconnect()
});

/**
 * An error from the API, with the `extensions.code` of its first error
 * ("BAD_USER_INPUT", "UNAUTHENTICATED", …), or "NETWORK" when the server
 * could not be reached or answered something that is not GraphQL.
 */
export class GraphQLError extends Error {
  constructor(message, { code = 'UNKNOWN', errors = [], status, cause } = {}) {
    super(message, cause ? { cause } : undefined);
    this.name = 'GraphQLError';
    this.code = code;
    this.errors = errors;
    this.status = status;
  }

  /** Builds one error from a GraphQL `errors` array. */
  static from(errors, status) {
    const list = Array.isArray(errors) && errors.length ? errors : [{ message: 'Unknown error.' }];
    const first = list[0];
    const code = first.extensions?.code ?? 'UNKNOWN';
    return new GraphQLError(first.message || 'Unknown error.', { code, errors: list, status });
  }
}

/**
 * The delay before reconnect attempt number `attempt` (0 for the first
 * retry): exponential from `base`, capped at `max`, then jittered into its
 * upper half so that many tabs dropped by one server restart do not all
 * come back in the same instant.
 */
export function backoffDelay(attempt, { base = 500, max = 10_000, random = Math.random } = {}) {
  const ceiling = Math.min(max, base * 2 ** Math.max(0, attempt));
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

export class GraphQLClient {
  #httpUrl;
  #wsUrl;
  #getToken;
  #fetch;
  #WebSocket;
  #timers;
  #backoff;
  #ackTimeout;
  #idleTimeout;

  #listeners = { state: new Set(), autherror: new Set() };
  #state = ConnectionState.IDLE;
  #subs = new Map(); // id -> { payload, sink, sentOn }
  #nextId = 1;
  #socket = null;
  #acked = false;
  #generation = 0; // counts sockets, to tell a first subscribe from a resume
  #attempt = 0; // failed attempts since the last connection_ack
  #retryTimer = null;
  #ackTimer = null;
  #idleTimer = null;
  #retryAt = null;

  /**
   * @param {object} options
   * @param {string} options.httpUrl  where queries and mutations are POSTed
   * @param {string} options.wsUrl    ws:// or wss:// URL for subscriptions
   * @param {() => string|null} [options.getToken]  the session token, read at each request and each connection
   * @param {typeof fetch} [options.fetch]
   * @param {typeof WebSocket} [options.WebSocket]
   * @param {{setTimeout: Function, clearTimeout: Function, now?: Function}} [options.timers]
   * @param {{base?: number, max?: number, random?: () => number}} [options.backoff]
   * @param {number} [options.ackTimeout]  how long to wait for connection_ack
   * @param {number} [options.idleTimeout] how long to keep an unused socket open
   */
  constructor({
    httpUrl,
    wsUrl,
    getToken = () => null,
    fetch = globalThis.fetch?.bind(globalThis),
    WebSocket = globalThis.WebSocket,
    timers = globalThis,
    backoff = {},
    ackTimeout = 10_000,
    idleTimeout = 5_000,
  }) {
    this.#httpUrl = httpUrl;
    this.#wsUrl = wsUrl;
    this.#getToken = getToken;
    this.#fetch = fetch;
    this.#WebSocket = WebSocket;
    this.#timers = {
      setTimeout: timers.setTimeout.bind(timers),
      clearTimeout: timers.clearTimeout.bind(timers),
      now: timers.now?.bind(timers) ?? Date.now,
    };
    this.#backoff = backoff;
    this.#ackTimeout = ackTimeout;
    this.#idleTimeout = idleTimeout;
  }

  /**
   * Listens to "state" (a ConnectionState, and the time of the next retry
   * when reconnecting) or "autherror" (the server refused the token).
   * Returns a function that stops listening.
   */
  on(type, listener) {
    this.#listeners[type].add(listener);
    return () => this.#listeners[type].delete(listener);
  }

  /** The connection's state: one of ConnectionState. */
  get state() {
    return this.#state;
  }

  /** When the next reconnect attempt is due (ms since the epoch), or null. */
  get retryAt() {
    return this.#retryAt;
  }

  /**
   * Runs a query or mutation and resolves to its `data`. Rejects with a
   * GraphQLError when the response has errors or the server cannot be
   * reached. An UNAUTHENTICATED answer to a request that carried a token
   * means the token is no longer valid, and is also reported as "autherror".
   */
  async request(query, variables = {}) {
    const token = this.#getToken();
    const headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;

    let response;
    try {
      response = await this.#fetch(this.#httpUrl, {
        method: 'POST',
        headers,
        body: JSON.stringify({ query, variables }),
      });
    } catch (cause) {
      throw new GraphQLError('Could not reach the server.', { code: 'NETWORK', cause });
    }

    let body;
    try {
      body = await response.json();
    } catch (cause) {
      // A proxy's error page or a half-started server: not a GraphQL answer.
      const code = response.status >= 500 ? 'NETWORK' : 'UNKNOWN';
      throw new GraphQLError(`The server answered ${response.status}.`, { code, status: response.status, cause });
    }
    if (body?.errors?.length) {
      const error = GraphQLError.from(body.errors, response.status);
      if (error.code === 'UNAUTHENTICATED' && token) this.#emit('autherror', error);
      throw error;
    }
    if (!response.ok || !body?.data) {
      throw new GraphQLError(`The server answered ${response.status}.`, { status: response.status });
    }
    return body.data;
  }

  /**
   * Starts a subscription and returns a function that ends it.
   *
   * `variables` may be an object or a function `({resumed}) => object`,
   * called each time the subscription is sent: `resumed` is false the first
   * time and true when it is sent again on a new connection after one was
   * lost. The sink's `next(data)` gets each event, `error(GraphQLError)` the
   * end of a subscription the server refused, and `complete()` the end of
   * one the server finished. Lost connections are not errors: the
   * subscription is sent again when the client reconnects.
   */
  subscribe({ query, variables = {} }, sink) {
    const id = String(this.#nextId++);
    this.#subs.set(id, { query, variables, sink, sentOn: null });
    this.#cancelIdle();
    if (this.#socket && this.#acked) this.#send({ type: 'subscribe', id, payload: this.#payload(id) });
    else if (!this.#socket && this.#retryTimer === null && this.#state !== ConnectionState.UNAUTHORIZED) this.#connect();

    return () => {
      const sub = this.#subs.get(id);
      if (!sub) return;
      this.#subs.delete(id);
      if (this.#socket && this.#acked && sub.sentOn === this.#generation) this.#send({ type: 'complete', id });
      if (this.#subs.size > 0) return;
      if (this.#socket) {
        this.#scheduleIdle();
      } else {
        // Nothing to reconnect for: stop waiting out a backoff.
        this.#clearRetry();
        this.#setState(ConnectionState.IDLE);
      }
    };
  }

  /**
   * Drops the current connection, if any, and connects again at once with
   * a fresh backoff: after the token changed (log in, log out) or when the
   * page learns the network is back. Subscriptions are sent again, resumed.
   */
  reconnect() {
    this.#attempt = 0;
    this.#clearRetry();
    this.#dropSocket(1000, 'Reconnecting');
    if (this.#subs.size > 0) this.#connect();
    else this.#setState(ConnectionState.IDLE);
  }

  /** If waiting out a backoff, tries now instead (e.g. when back online). */
  retryNow() {
    if (this.#retryTimer === null) return;
    this.#clearRetry();
    this.#connect();
  }

  /** Ends every subscription and closes the socket. */
  dispose() {
    this.#subs.clear();
    this.#clearRetry();
    this.#cancelIdle();
    this.#dropSocket(1000, 'Normal Closure');
    this.#setState(ConnectionState.IDLE);
  }

  // --- the socket -------------------------------------------------------

  #connect() {
    this.#cancelIdle();
    const token = this.#getToken();
    let socket;
    try {
      socket = new this.#WebSocket(this.#wsUrl, SUBPROTOCOL);
    } catch {
      // A malformed URL or a browser refusing: treat like a lost connection.
      this.#scheduleRetry();
      return;
    }
    this.#socket = socket;
    this.#acked = false;
    this.#generation++;
    this.#setState(this.#attempt === 0 && this.#state !== ConnectionState.RECONNECTING
      ? ConnectionState.CONNECTING
      : ConnectionState.RECONNECTING);

    socket.onopen = () => {
      if (socket !== this.#socket) return;
      const payload = token ? { Authorization: `Bearer ${token}` } : {};
      this.#send({ type: 'connection_init', payload });
    };
    socket.onmessage = (event) => this.#onMessage(socket, event.data);
    socket.onclose = (event) => this.#onClose(socket, event);
    socket.onerror = () => {}; // a close event always follows, with the details

    // The server must acknowledge within a while; a half-open TCP
    // connection would otherwise leave us waiting forever.
    this.#ackTimer = this.#timers.setTimeout(() => {
      this.#ackTimer = null;
      if (socket === this.#socket && !this.#acked) {
        this.#lose(CloseCode.ConnectionAcknowledgementTimeout, 'Connection acknowledgement timeout');
      }
    }, this.#ackTimeout);
  }

  #onMessage(socket, data) {
    if (socket !== this.#socket) return;
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      this.#lose(CloseCode.BadRequest, 'Invalid message received');
      return;
    }
    switch (message?.type) {
      case 'connection_ack':
        this.#acked = true;
        this.#attempt = 0;
        this.#clearAckTimer();
        this.#setState(ConnectionState.LIVE);
        for (const id of this.#subs.keys()) this.#send({ type: 'subscribe', id, payload: this.#payload(id) });
        if (this.#subs.size === 0) this.#scheduleIdle();
        return;
      case 'ping':
        // The server drops clients that do not answer its pings.
        this.#send(message.payload === undefined ? { type: 'pong' } : { type: 'pong', payload: message.payload });
        return;
      case 'pong':
        return;
      case 'next': {
        const sub = this.#subs.get(message.id);
        if (!sub) return; // ended on our side while the event was in flight
        const { data, errors } = message.payload ?? {};
        if (data == null && errors?.length) {
          this.#subs.delete(message.id);
          sub.sink.error?.(GraphQLError.from(errors));
        } else {
          sub.sink.next?.(data);
        }
        return;
      }
      case 'error': {
        const sub = this.#subs.get(message.id);
        if (!sub) return;
        this.#subs.delete(message.id);
        sub.sink.error?.(GraphQLError.from(message.payload));
        return;
      }
      case 'complete': {
        const sub = this.#subs.get(message.id);
        if (!sub) return;
        this.#subs.delete(message.id);
        sub.sink.complete?.();
        return;
      }
      default:
        this.#lose(CloseCode.BadRequest, 'Invalid message received');
    }
  }

  #onClose(socket, event) {
    if (socket !== this.#socket) return; // one we dropped on purpose
    this.#socket = null;
    this.#acked = false;
    this.#clearAckTimer();
    this.#afterClose(event.code);
  }

  /** Decides what follows the loss of the socket: wait, retry or rest. */
  #afterClose(code) {
    if (code === CloseCode.Forbidden) {
      // Retrying with the same token cannot help: wait for reconnect().
      this.#setState(ConnectionState.UNAUTHORIZED);
      this.#emit('autherror', new GraphQLError('Your session has ended.', { code: 'UNAUTHENTICATED' }));
      return;
    }
    if (this.#subs.size === 0) {
      this.#setState(ConnectionState.IDLE);
      return;
    }
    this.#scheduleRetry();
  }

  /** Gives up on the current socket as if the network had dropped it. */
  #lose(code, reason) {
    this.#dropSocket(code, reason);
    this.#afterClose(code);
  }

  /** Closes the socket without reacting to its close event. */
  #dropSocket(code, reason) {
    const socket = this.#socket;
    this.#socket = null;
    this.#acked = false;
    this.#clearAckTimer();
    if (!socket) return;
    try {
      socket.close(code, reason);
    } catch {
      // Closing an already closed socket is harmless.
    }
  }

  #scheduleRetry() {
    const delay = backoffDelay(this.#attempt++, this.#backoff);
    this.#retryAt = this.#timers.now() + delay;
    this.#setState(ConnectionState.RECONNECTING, true);
    this.#retryTimer = this.#timers.setTimeout(() => {
      this.#retryTimer = null;
      this.#retryAt = null;
      this.#connect();
    }, delay);
  }

  #clearRetry() {
    if (this.#retryTimer !== null) this.#timers.clearTimeout(this.#retryTimer);
    this.#retryTimer = null;
    this.#retryAt = null;
  }

  #clearAckTimer() {
    if (this.#ackTimer !== null) this.#timers.clearTimeout(this.#ackTimer);
    this.#ackTimer = null;
  }

  // A page that moves between screens ends one screen's subscriptions just
  // before the next screen starts its own, so an unused socket is kept for
  // a moment instead of being closed and opened again.
  #scheduleIdle() {
    this.#cancelIdle();
    this.#idleTimer = this.#timers.setTimeout(() => {
      this.#idleTimer = null;
      if (this.#subs.size > 0) return;
      this.#clearRetry();
      this.#dropSocket(1000, 'Normal Closure');
      this.#setState(ConnectionState.IDLE);
    }, this.#idleTimeout);
  }

  #cancelIdle() {
    if (this.#idleTimer !== null) this.#timers.clearTimeout(this.#idleTimer);
    this.#idleTimer = null;
  }

  #payload(id) {
    const sub = this.#subs.get(id);
    const resumed = sub.sentOn !== null;
    sub.sentOn = this.#generation;
    const variables = typeof sub.variables === 'function' ? sub.variables({ resumed }) : sub.variables;
    return { query: sub.query, variables };
  }

  #send(message) {
    this.#socket?.send(JSON.stringify(message));
  }

  #setState(state, force = false) {
    if (state === this.#state && !force) return;
    this.#state = state;
    this.#emit('state', state);
  }

  #emit(type, value) {
    for (const listener of [...this.#listeners[type]]) {
      try {
        listener(value);
      } catch (error) {
        // One broken listener must not stop the others or the client.
        queueMicrotask(() => {
          throw error;
        });
      }
    }
  }
}
