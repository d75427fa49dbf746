// Test doubles for the client module: a WebSocket whose server side the
// test plays, timers the test advances by hand, and a scripted fetch.

export class FakeWebSocket {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSING = 2;
  static CLOSED = 3;

  /** Every socket made, newest last. */
  static instances = [];

  static reset() {
    FakeWebSocket.instances = [];
  }

  static get last() {
    return FakeWebSocket.instances.at(-1);
  }

  constructor(url, protocol) {
    this.url = url;
    this.protocol = protocol;
    this.readyState = FakeWebSocket.CONNECTING;
    this.sent = []; // parsed messages the client sent
    this.closedWith = null; // {code, reason} when the client closed it
    this.onopen = this.onmessage = this.onclose = this.onerror = null;
    FakeWebSocket.instances.push(this);
  }

  send(text) {
    if (this.readyState !== FakeWebSocket.OPEN) throw new Error(`send on a socket in state ${this.readyState}`);
    this.sent.push(JSON.parse(text));
  }

  close(code = 1000, reason = '') {
    if (this.readyState === FakeWebSocket.CLOSED) return;
    this.closedWith = { code, reason };
    this.readyState = FakeWebSocket.CLOSED;
    // A browser fires close asynchronously; tests that care call serverClose.
  }

  // --- the server's side ---

  open() {
    this.readyState = FakeWebSocket.OPEN;
    this.onopen?.({});
  }

  receive(message) {
    this.onmessage?.({ data: typeof message === 'string' ? message : JSON.stringify(message) });
  }

  /** Opens, expects connection_init, and acknowledges it. */
  accept() {
    this.open();
    const init = this.sent.find((m) => m.type === 'connection_init');
    if (!init) throw new Error('no connection_init was sent');
    this.receive({ type: 'connection_ack' });
    return init;
  }

  serverClose(code = 1006, reason = '') {
    this.readyState = FakeWebSocket.CLOSED;
    this.onclose?.({ code, reason, wasClean: code !== 1006 });
  }

  /** The messages of one type the client sent. */
  sentOf(type) {
    return this.sent.filter((m) => m.type === type);
  }
}

/** Timers that run only when the test advances the clock. */
export class FakeTimers {
  #now = 1_000_000;
  #nextId = 1;
  #pending = new Map(); // id -> {at, fn}

  now() {
    return this.#now;
  }

  setTimeout(fn, ms = 0) {
    const id = this.#nextId++;
    this.#pending.set(id, { at: this.#now + ms, fn });
    return id;
  }

  clearTimeout(id) {
    this.#pending.delete(id);
  }

  /** The delays of the timers still pending, soonest first. */
  get delays() {
    return [...this.#pending.values()].map((t) => t.at - this.#now).sort((a, b) => a - b);
  }

  /** Moves the clock forward, running what falls due in order. */
  advance(ms) {
    const until = this.#now + ms;
    for (;;) {
      let next = null;
      for (const [id, t] of this.#pending) {
        if (t.at <= until && (next === null || t.at < next[1].at)) next = [id, t];
      }
      if (!next) break;
      this.#pending.delete(next[0]);
      this.#now = next[1].at;
      next[1].fn();
    }
    this.#now = until;
  }
}

/** A fetch that answers from a queue and records the requests. */
export function fakeFetch(...answers) {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push({ url, init, body: JSON.parse(init.body) });
    const answer = answers.shift();
    if (answer instanceof Error) throw answer;
    const { status = 200, json, text } = answer;
    return {
      status,
      ok: status >= 200 && status < 300,
      json: async () => (text !== undefined ? JSON.parse(text) : json),
    };
  };
  fetch.calls = calls;
  return fetch;
}
