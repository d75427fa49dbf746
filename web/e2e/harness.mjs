// The end-to-end harness: builds the warble binary, runs it on a private
// redis-server, drives headless Chromium (the Debian package, never a
// downloaded browser) with playwright-core, and cleans every process up,
// also when a test fails or the run is interrupted.

import { spawn, execFile } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { test, before, after } from 'node:test';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

export const webDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const repoRoot = path.resolve(webDir, '..');
export const screenshotDir = path.join(repoRoot, 'testdata', 'screenshots');
const failureDir = path.join(screenshotDir, 'failures');

/**
 * How long to wait for anything to show up. Generous: CI is a shared
 * 2-core machine, and these tests pass there with a load average far above
 * the core count; a timeout means something is wrong, not slow.
 */
export const WAIT = 60_000;
const NAVIGATION_WAIT = 90_000;

// --- processes ---------------------------------------------------------------

const children = new Set();
const tempDirs = new Set();

function killAll() {
  for (const child of children) {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
}
// 'exit' handlers must be synchronous: kill, do not wait.
process.on('exit', killAll);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(signal, () => {
    killAll();
    process.exit(128 + os.constants.signals[signal]);
  });
}

function track(child, name) {
  children.add(child);
  const log = [];
  const keep = (chunk) => {
    log.push(chunk.toString());
    if (log.length > 200) log.shift();
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  child.exited = new Promise((resolve) => child.once('exit', (code, signal) => {
    children.delete(child);
    resolve({ code, signal });
  }));
  child.name = name;
  child.logText = () => log.join('');
  return child;
}

/** Stops a child: SIGTERM, then SIGKILL if it lingers. */
async function stop(child, { signal = 'SIGTERM', grace = 5_000 } = {}) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  child.kill(signal);
  const timer = setTimeout(() => child.kill('SIGKILL'), grace);
  await child.exited;
  clearTimeout(timer);
}

/** Polls `fn` until it returns a truthy value or stops throwing. */
export async function eventually(fn, { timeout = WAIT, interval = 100, message = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let lastError;
  for (;;) {
    try {
      const value = await fn();
      if (value !== false && value !== undefined && value !== null) return value;
      lastError = null;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      const error = new Error(`timed out after ${timeout} ms waiting for ${message}`);
      if (lastError) error.cause = lastError;
      throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}

/** A TCP port that was free a moment ago. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.unref();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

let built = null;
/**
 * The warble binary: $WARBLE_BIN when set (a prebuilt one), else built
 * once per test file from the repository root with `go build`.
 */
export function warbleBinary(dir) {
  if (process.env.WARBLE_BIN) return Promise.resolve(process.env.WARBLE_BIN);
  built ??= (async () => {
    const out = path.join(dir, 'warble');
    try {
      await promisify(execFile)('go', ['build', '-o', out, '.'], { cwd: repoRoot, maxBuffer: 16 << 20 });
    } catch (error) {
      throw new Error(`go build failed:\n${error.stderr || error.message}`);
    }
    return out;
  })();
  return built;
}

/** Sends one RESP command to Redis on a unix socket and returns the reply line. */
function redisCommand(socketPath, ...args) {
  return new Promise((resolve, reject) => {
    const conn = net.createConnection(socketPath);
    let reply = '';
    conn.setTimeout(2_000, () => conn.destroy(new Error('redis timeout')));
    conn.on('connect', () => {
      conn.write(`*${args.length}\r\n${args.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`);
    });
    conn.on('data', (chunk) => {
      reply += chunk;
      if (reply.includes('\r\n')) {
        conn.end();
        resolve(reply.split('\r\n')[0]);
      }
    });
    conn.on('error', reject);
  });
}

/**
 * Starts the stack for one test file: a real redis-server on a unix socket
 * in a fresh temporary directory, and warble on a free port. Returns
 * {baseURL, api, restart, stopServer, startServer, close}.
 */
export async function startStack() {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'warble-e2e-'));
  tempDirs.add(dir);
  const binary = await warbleBinary(dir);
  const socket = path.join(dir, 'redis.sock');

  const redis = track(spawn('redis-server', [
    '--port', '0',
    '--unixsocket', socket,
    '--unixsocketperm', '700',
    '--save', '',
    '--appendonly', 'no',
    '--dir', dir,
  ], { stdio: ['ignore', 'pipe', 'pipe'] }), 'redis-server');
  await eventually(async () => existsSync(socket) && (await redisCommand(socket, 'PING')) === '+PONG', {
    message: `redis-server to answer on ${socket}`,
  });

  const port = await freePort();
  const baseURL = `http://127.0.0.1:${port}`;
  let server = null;

  /** Starts warble on `onPort` against this stack's Redis and waits for /healthz. */
  async function launchServer(onPort) {
    const child = track(spawn(binary, [], {
      cwd: dir,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        REDIS_URL: `unix://${socket}`,
        PORT: String(onPort),
        HOST: '127.0.0.1',
        RATE_LIMITS: 'off',
        LOG_LEVEL: 'warn',
      },
    }), 'warble');
    const url = `http://127.0.0.1:${onPort}`;
    await eventually(async () => {
      if (child.exitCode !== null) {
        throw new Error(`warble exited with ${child.exitCode}:\n${child.logText()}`);
      }
      const res = await fetch(`${url}/healthz`);
      return res.status === 200;
    }, { timeout: 60_000, message: `warble to answer ${url}/healthz` });
    return child;
  }

  server = await launchServer(port);

  return {
    baseURL,
    port,
    api: apiClient(baseURL),
    /** The server's recent log, for failure messages. */
    serverLog: () => server?.logText() ?? '',
    /**
     * Stops the server process: SIGTERM for a graceful stop (the server
     * completes subscriptions and closes websockets), SIGKILL for a crash.
     */
    async killServer(signal = 'SIGKILL') {
      await stop(server, { signal });
      server = null;
    },
    /** Starts the server again on the same port and the same Redis. */
    async startServer() {
      server = await launchServer(port);
    },
    /**
     * Runs a second server on another port against the same Redis, hands
     * its API to `fn`, then stops it: for writing while the main one is down.
     */
    async withOtherServer(fn) {
      const otherPort = await freePort();
      const other = await launchServer(otherPort);
      try {
        return await fn(apiClient(`http://127.0.0.1:${otherPort}`));
      } finally {
        await stop(other);
      }
    },
    async close() {
      await stop(server);
      await stop(redis);
      await rm(dir, { recursive: true, force: true });
      tempDirs.delete(dir);
    },
  };
}

// --- the API, for setting scenes up quickly -----------------------------------

export function apiClient(baseURL) {
  async function gql(query, variables = {}, token) {
    const headers = { 'Content-Type': 'application/json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    const res = await fetch(`${baseURL}/graphql`, { method: 'POST', headers, body: JSON.stringify({ query, variables }) });
    const body = await res.json();
    if (body.errors?.length) {
      const error = new Error(`${body.errors[0].message} (${body.errors[0].extensions?.code})`);
      error.code = body.errors[0].extensions?.code;
      throw error;
    }
    return body.data;
  }
  return {
    gql,
    /** Creates an account; returns {token, user: {id, username, displayName}}. */
    async signup(username, { displayName, password = 'correct horse battery' } = {}) {
      const input = { username, password };
      if (displayName) input.displayName = displayName;
      const data = await gql('mutation($input: SignupInput!) { signup(input: $input) { token user { id username displayName } } }', { input });
      return data.signup;
    },
    async post(token, body) {
      const data = await gql('mutation($input: CreatePostInput!) { createPost(input: $input) { post { id body } } }', { input: { body } }, token);
      return data.createPost.post;
    },
    async follow(token, userId) {
      await gql('mutation($input: FollowInput!) { follow(input: $input) { user { id } } }', { input: { userId } }, token);
    },
    async deletePost(token, postId) {
      await gql('mutation($input: DeletePostInput!) { deletePost(input: $input) { postId } }', { input: { postId } }, token);
    },
    async logout(token) {
      await gql('mutation { logout }', {}, token);
    },
  };
}

/** A username that no other test in this run has used. */
let counter = 0;
export function uniqueName(prefix) {
  counter += 1;
  return `${prefix}_${process.pid.toString(36)}${counter}`.slice(0, 20);
}

// --- the browser -----------------------------------------------------------------

/** Chromium from Debian; playwright-core must never download one. */
export function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH || '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
}

// useStack starts a stack and a browser before the file's tests and stops
// them after, and returns the object that holds them (env.stack, env.browser).
export function useStack() {
  const env = {};
  before(async () => {
    env.stack = await startStack();
    env.browser = await launchBrowser();
  });
  after(async () => {
    await env.browser?.close();
    await env.stack?.close();
  });
  return env;
}

/**
 * Declares an end-to-end test. `fn(t, scene)` gets `scene.page(options)`,
 * which opens a page in a new browser context (its own sessionStorage, as a
 * separate person would have); pass `token` to start signed in. Every page
 * is screenshotted into testdata/screenshots/failures/ if the test fails.
 */
export function e2e(name, getEnv, fn, { timeout = 600_000 } = {}) {
  return test(name, { timeout }, async (t) => {
    const { browser, stack } = getEnv();
    const contexts = [];
    const pages = [];
    const scene = {
      async page({ token, path: at = '/', viewport = { width: 1100, height: 900 }, colorScheme = 'light' } = {}) {
        const context = await browser.newContext({ baseURL: stack.baseURL, viewport, colorScheme, reducedMotion: 'reduce' });
        context.setDefaultTimeout(WAIT);
        context.setDefaultNavigationTimeout(NAVIGATION_WAIT);
        contexts.push(context);
        if (token) {
          // Only on the tab's first load, so logging out in the test sticks.
          await context.addInitScript((value) => {
            if (!sessionStorage.getItem('e2e.seeded')) {
              sessionStorage.setItem('e2e.seeded', '1');
              sessionStorage.setItem('warble.token', value);
            }
          }, token);
        }
        const page = await context.newPage();
        const errors = [];
        page.on('pageerror', (error) => errors.push(error));
        page.pageErrors = errors;
        pages.push(page);
        if (at) await page.goto(at);
        return page;
      },
    };
    try {
      await fn(t, scene);
      for (const page of pages) {
        if (page.pageErrors.length) throw new Error(`uncaught error in the page: ${page.pageErrors[0].stack}`);
      }
    } catch (error) {
      await mkdir(failureDir, { recursive: true });
      const slug = name.replace(/[^\w]+/g, '-').slice(0, 60);
      for (const [i, page] of pages.entries()) {
        const file = path.join(failureDir, `${slug}-${i + 1}.png`);
        await page.screenshot({ path: file, fullPage: true }).catch(() => {});
        t.diagnostic(`screenshot: ${file}`);
      }
      t.diagnostic(`server log:\n${stack.serverLog().slice(-4000)}`);
      throw error;
    } finally {
      await Promise.all(contexts.map((c) => c.close().catch(() => {})));
    }
  });
}

/** Waits until the page's live connection says Live. */
export async function waitLive(page) {
  await page.getByRole('status').filter({ hasText: /^\s*Live\s*$/ }).waitFor();
}

// --- accessibility -----------------------------------------------------------------

// axe-core runs inside the page. It is evaluated through the DevTools
// protocol rather than added as a <script>, because the app's
// Content-Security-Policy (script-src 'self') rightly refuses inline scripts.
const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/**
 * The impacts that fail a test. Minor and moderate findings do not: they
 * are mostly best practices, some of them debatable, and a gate that fails
 * on taste would soon be switched off.
 */
const blockingImpacts = new Set(['serious', 'critical']);

/**
 * Runs axe-core on the page as it is now, in the light and the dark theme,
 * and throws if it finds a serious or critical problem in either. The error
 * lists each rule with its impact and the selectors of the elements that
 * break it. `name` says which screen this is, for the report. Options:
 * `themes` (default both) and `exclude`, CSS selectors of parts to leave out.
 */
export async function expectAccessible(page, name, options = {}) {
  const report = await accessibilityReport(page, name, options);
  if (report) throw new Error(report);
}

/**
 * The report expectAccessible would fail with, or '' when axe-core finds no
 * serious or critical problem: for pages whose markup is not ours to fix.
 */
export async function accessibilityReport(page, name, { themes = ['light', 'dark'], exclude = [] } = {}) {
  const wasDark = await page.evaluate(() => matchMedia('(prefers-color-scheme: dark)').matches);
  const problems = [];
  try {
    for (const colorScheme of themes) {
      await page.emulateMedia({ colorScheme });
      // Styles follow the media query at once, but a frame lets any
      // transition on colors settle before contrast is measured.
      await page.evaluate(() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve))));
      for (const violation of await axeViolations(page, exclude)) {
        if (blockingImpacts.has(violation.impact)) problems.push({ ...violation, colorScheme });
      }
    }
  } finally {
    await page.emulateMedia({ colorScheme: wasDark ? 'dark' : 'light' });
  }
  if (!problems.length) return '';
  const lines = problems.map((v) => [
    `  ${v.id} (${v.impact}, ${v.colorScheme} theme): ${v.help}`,
    ...v.nodes.map((node) => `    ${node.target.join(' ')}\n      ${node.summary.replace(/\n\s*/g, '\n      ')}`),
    `    ${v.helpUrl}`,
  ].join('\n'));
  return `axe-core found ${problems.length} serious or critical problem(s) on ${name} (${page.url()}):\n${lines.join('\n')}`;
}

/** axe-core's violations on the page, trimmed to what a report needs. */
async function axeViolations(page, exclude) {
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) await page.evaluate(axeSource);
  return page.evaluate(async (exclude) => {
    const context = exclude.length ? { exclude: exclude.map((selector) => [selector]) } : document;
    const results = await window.axe.run(context, { resultTypes: ['violations'] });
    return results.violations.map((v) => ({
      id: v.id,
      impact: v.impact,
      help: v.help,
      helpUrl: v.helpUrl,
      nodes: v.nodes.map((node) => ({ target: node.target.map(String), summary: node.failureSummary ?? '' })),
    }));
  }, exclude);
}
