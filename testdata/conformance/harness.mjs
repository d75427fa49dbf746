// The harness the conformance tests share: it builds Warble, starts a
// private redis-server on a unix socket and Warble on a free loopback port,
// waits until /healthz answers, and stops both afterwards. Also a few small
// helpers that talk to the API with plain fetch, so that the tests can set
// up data without going through the client under test.

import { spawn, execFile } from 'node:child_process';
import { mkdtemp, rm, access } from 'node:fs/promises';
import { createServer, createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';

// The repository root: this file lives in testdata/conformance/.
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

// Safety nets only: each is far above what a healthy run takes, so that a
// hung server fails the test instead of hanging CI.
const BUILD_TIMEOUT = 5 * 60_000;
const START_TIMEOUT = 60_000;
const STOP_TIMEOUT = 15_000;

// Children still running, killed if this process exits without stopping
// them (an uncaught error, a test runner timeout).
const children = new Set();
process.on('exit', () => {
  for (const child of children) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
});

// withTimeout rejects with a clear message when promise has not settled
// within ms.
export function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

function run(cmd, args, opts) {
  return new Promise((resolveRun, reject) => {
    execFile(cmd, args, { ...opts, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err) {
        err.message += `\n${stdout}${stderr}`;
        reject(err);
      } else {
        resolveRun(stdout);
      }
    });
  });
}

// startChild spawns a long-running process whose output is kept (the last
// 64 KiB) for error messages, and whose exit is a promise.
function startChild(cmd, args, env) {
  const child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  let output = '';
  const keep = (chunk) => {
    output = (output + chunk).slice(-65536);
  };
  child.stdout.setEncoding('utf8').on('data', keep);
  child.stderr.setEncoding('utf8').on('data', keep);
  const exited = new Promise((resolveExit) => {
    child.on('error', (err) => {
      keep(`\n${cmd}: ${err.message}\n`);
      children.delete(child);
      resolveExit({ code: null, signal: null, error: err });
    });
    child.on('exit', (code, signal) => {
      children.delete(child);
      resolveExit({ code, signal });
    });
  });
  return { child, exited, output: () => output };
}

// stopChild sends SIGTERM, then SIGKILL if the process has not exited in
// time, and resolves once it has.
async function stopChild(proc) {
  if (proc.child.exitCode !== null || proc.child.signalCode !== null) return;
  proc.child.kill('SIGTERM');
  const timer = setTimeout(() => proc.child.kill('SIGKILL'), STOP_TIMEOUT);
  await proc.exited;
  clearTimeout(timer);
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before Warble listens; startWarble retries when that happens.
function freePort() {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolvePort(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// poll calls check every 50 ms until it returns true, failing when dead()
// returns a message or after ms.
async function poll(check, ms, what, dead) {
  const deadline = Date.now() + ms;
  for (;;) {
    const why = dead();
    if (why) throw new Error(`${what}: ${why}`);
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(50);
  }
}

function redisAnswers(socket) {
  return new Promise((resolvePing) => {
    const conn = createConnection({ path: socket });
    let reply = '';
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write('PING\r\n'));
    conn.on('data', (d) => {
      reply += d;
      if (reply.includes('\r\n')) {
        conn.destroy();
        resolvePing(reply.startsWith('+PONG'));
      }
    });
    conn.on('error', () => resolvePing(false));
  });
}

async function healthy(url) {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
    await res.arrayBuffer();
    return res.status === 200;
  } catch {
    return false;
  }
}

function exitedWhy(proc, name) {
  const { exitCode, signalCode } = proc.child;
  if (exitCode === null && signalCode === null) return '';
  return `${name} exited (code ${exitCode}, signal ${signalCode}):\n${proc.output()}`;
}

// startWarble builds Warble (or uses the binary in WARBLE_BIN), starts a
// Redis for it (with WARBLE_REDIS_CLUSTER=1 a 3-master Redis Cluster, else
// a private redis-server) and Warble, and waits until Warble is healthy. Call
// stop() on what it returns, also when a test fails; it is safe to call
// more than once.
export async function startWarble() {
  const dir = await mkdtemp(join(tmpdir(), 'warble-conformance-'));
  const procs = [];
  const stop = async () => {
    while (procs.length > 0) await stopChild(procs.pop());
    await rm(dir, { recursive: true, force: true });
  };
  try {
    let bin = process.env.WARBLE_BIN;
    if (!bin) {
      bin = join(dir, 'warble');
      await run('go', ['build', '-o', bin, '.'], { cwd: repoRoot, timeout: BUILD_TIMEOUT });
    }

    let redisURL;
    if (process.env.WARBLE_REDIS_CLUSTER === '1') {
      // A 3-master Redis Cluster of its own (internal/redistest's helper),
      // which prints its URL once every node agrees it is up.
      const clusterBin = join(dir, 'redis-cluster');
      await run('go', ['build', '-o', clusterBin, './internal/redistest/cmd/redis-cluster'], { cwd: repoRoot, timeout: BUILD_TIMEOUT });
      const cluster = startChild(clusterBin, [], process.env);
      procs.push(cluster);
      await poll(
        async () => /^redis:\/\/\S+$/m.test(cluster.output()),
        START_TIMEOUT,
        'the Redis Cluster to start',
        () => exitedWhy(cluster, 'redis-cluster'),
      );
      redisURL = cluster.output().match(/^(redis:\/\/\S+)$/m)[1];
    } else {
      const socket = join(dir, 'redis.sock');
      const redis = startChild(
        'redis-server',
        ['--port', '0', '--unixsocket', socket, '--save', '', '--appendonly', 'no', '--dir', dir],
        process.env,
      );
      procs.push(redis);
      await poll(
        async () => (await access(socket).then(() => true, () => false)) && redisAnswers(socket),
        START_TIMEOUT,
        'redis-server to answer',
        () => exitedWhy(redis, 'redis-server'),
      );
      redisURL = `unix://${socket}`;
    }

    // The port may be taken between freePort and Warble's listen: then
    // Warble exits at once saying so, and another port is tried.
    for (let attempt = 1; ; attempt++) {
      const port = await freePort();
      const warble = startChild(bin, [], {
        ...process.env,
        REDIS_URL: redisURL,
        PORT: String(port),
        HOST: '127.0.0.1',
        RATE_LIMITS: 'off',
        LOG_LEVEL: process.env.WARBLE_LOG_LEVEL || 'warn',
      });
      procs.push(warble);
      const base = `http://127.0.0.1:${port}`;
      try {
        await poll(() => healthy(`${base}/healthz`), START_TIMEOUT, 'warble /healthz', () => exitedWhy(warble, 'warble'));
      } catch (err) {
        await stopChild(procs.pop());
        if (attempt < 3 && /listen on|address already in use/.test(warble.output())) continue;
        throw err;
      }
      return {
        base,
        url: `${base}/graphql`,
        wsUrl: `ws://127.0.0.1:${port}/graphql`,
        logs: () => warble.output(),
        stop,
      };
    }
  } catch (err) {
    await stop();
    throw err;
  }
}

// gql POSTs a GraphQL request with plain fetch and returns the parsed body;
// it throws on a non-JSON answer.
export async function gql(server, query, variables = {}, token = '') {
  const headers = { 'content-type': 'application/json', accept: 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;
  const res = await fetch(server.url, {
    method: 'POST',
    headers,
    body: JSON.stringify({ query, variables }),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`POST /graphql: status ${res.status}, body is not JSON: ${text}`);
  }
}

// mustGql is gql that throws on any GraphQL error and returns data.
export async function mustGql(server, query, variables = {}, token = '') {
  const body = await gql(server, query, variables, token);
  if (body.errors?.length) throw new Error(`GraphQL errors: ${JSON.stringify(body.errors)}`);
  return body.data;
}

// uniqueName is a valid, unused-looking username: prefix (at most 8
// characters) and random letters, 20 characters at most.
export function uniqueName(prefix) {
  return `${prefix.slice(0, 8)}_${randomBytes(5).toString('hex')}`;
}

// signup creates a user and returns { token, id, username }.
export async function signup(server, prefix) {
  const username = uniqueName(prefix);
  const data = await mustGql(
    server,
    'mutation ($input: SignupInput!) { signup(input: $input) { token user { id } } }',
    { input: { username, password: 'correct horse battery' } },
  );
  return { token: data.signup.token, id: data.signup.user.id, username };
}

// createPost writes a post as token's user and returns { id, body }.
export async function createPost(server, token, body) {
  const data = await mustGql(
    server,
    'mutation ($input: CreatePostInput!) { createPost(input: $input) { post { id body } } }',
    { input: { body } },
    token,
  );
  return data.createPost.post;
}

// globalCursor is the cursor of the newest post in the global timeline.
// Subscribing with after: set to it replays everything newer before going
// live, so a post written after reading it cannot be missed however late
// the subscription starts. The timeline must not be empty: write a post
// first.
export async function globalCursor(server) {
  const data = await mustGql(server, '{ globalTimeline(first: 1) { edges { cursor } } }');
  const cursor = data.globalTimeline.edges[0]?.cursor;
  if (!cursor) throw new Error('the global timeline is empty: write a post before reading its cursor');
  return cursor;
}

// The selection every subscription test asks for.
export const EVENT_FIELDS = 'kind cursor postId post { id body author { username } }';

// Inbox turns callbacks (an observer's next, error and complete) into
// awaitable items: take() resolves with the next item in arrival order.
export class Inbox {
  #items = [];
  #waiters = [];

  #put(item) {
    const waiter = this.#waiters.shift();
    if (waiter) waiter(item);
    else this.#items.push(item);
  }

  next = (value) => this.#put({ value });
  error = (error) => this.#put({ error });
  complete = () => this.#put({ done: true });

  // take waits for the next item: { value }, { error } or { done: true }.
  take(what, ms = 30_000) {
    const item = this.#items.shift();
    if (item) return Promise.resolve(item);
    let waiter;
    const p = new Promise((resolve) => {
      waiter = resolve;
      this.#waiters.push(resolve);
    });
    return withTimeout(p, ms, what).catch((err) => {
      this.#waiters.splice(this.#waiters.indexOf(waiter), 1);
      throw err;
    });
  }

  // value is take that expects a value and returns it.
  async value(what, ms) {
    const item = await this.take(what, ms);
    if (!('value' in item)) throw new Error(`${what}: got ${JSON.stringify(item, errorJSON)} instead of a value`);
    return item.value;
  }
}

function errorJSON(key, value) {
  return value instanceof Error ? { name: value.name, message: value.message } : value;
}
