// Warble's browser app: wires the client, the session, the router and the
// chrome around the screens (navigation, account, connection status).

import { h } from './dom.js';
import { ConnectionState, GraphQLClient } from './graphql.js';
import { LOGOUT, VIEWER } from './queries.js';
import { Router } from './router.js';
import { Session } from './session.js';
import { avatar, notify, notifyError, profileHref, refreshTimes } from './ui.js';
import { loginView, signupView } from './views/auth.js';
import { exploreView } from './views/explore.js';
import { homeView } from './views/home.js';
import { notFoundView } from './views/notfound.js';
import { profileView } from './views/profile.js';

const session = new Session(sessionStorage);
const client = new GraphQLClient({
  httpUrl: '/graphql',
  wsUrl: `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/graphql`,
  getToken: () => session.token,
});

const main = document.getElementById('main');

const app = {
  client,
  session,
  main,
  navigate: (path, options) => router.navigate(path, options),
  refresh: () => router.refresh(),
  setTitle: (title) => {
    document.title = title ? `${title} · Warble` : 'Warble';
  },
};

const router = new Router([
  { pattern: /^\/$/, view: homeView },
  { pattern: /^\/login\/?$/, view: loginView },
  { pattern: /^\/signup\/?$/, view: signupView },
  { pattern: /^\/explore\/?$/, view: exploreView },
  { pattern: /^\/u\/(\w{1,40})(?:\/(followers|following))?\/?$/, view: profileView },
  { pattern: /.*/, view: notFoundView },
], (view, params, signal, { focus, path }) => {
  main.replaceChildren();
  renderNav(path);
  const done = view(app, params, signal);
  // Move focus to the new screen's heading, as a page load would, so that
  // keyboard and screen reader users start at the top of what changed.
  if (focus) Promise.resolve(done).then(() => {
    if (!signal.aborted && !main.contains(document.activeElement)) (main.querySelector('h1') ?? main).focus();
  });
});

// --- chrome --------------------------------------------------------------

function renderNav(path = location.pathname) {
  const me = session.viewer;
  const links = [
    me && ['/', 'Home'],
    ['/explore', 'Explore'],
    me && [profileHref(me.username), 'Profile'],
  ].filter(Boolean);
  document.getElementById('nav-links').replaceChildren(...links.map(([href, label]) => h('li', {},
    h('a', { href, 'aria-current': isCurrent(href, path) ? 'page' : undefined }, label))));

  const account = document.getElementById('account');
  if (me) {
    // The avatar rather than the name: a username of twenty characters
    // would not fit beside the navigation in the content column.
    account.replaceChildren(
      h('a', { class: 'account-avatar', href: profileHref(me.username), title: `Signed in as @${me.username}`, 'aria-label': `@${me.username}, your profile` },
        avatar(me, 'sm')),
      h('button', { type: 'button', class: 'button-secondary button-small', onclick: logOut }, 'Log out'));
  } else {
    account.replaceChildren(
      h('a', { class: 'button button-secondary button-small', href: '/login' }, 'Log in'),
      h('a', { class: 'button button-primary button-small', href: '/signup' }, 'Sign up'));
  }
}

function isCurrent(href, path) {
  if (href === '/') return path === '/';
  return path === href || path.startsWith(`${href}/`);
}

// The indicator speaks only while something on screen is live or trying to
// be. With no subscription open (a visitor on the login page, a list of
// followers) it is empty: "Not live" there would report a problem that
// does not exist. The labels are short, to fit beside the navigation in the
// content column; each state has a longer explanation on hover.
const stateLabels = {
  [ConnectionState.IDLE]: '',
  [ConnectionState.CONNECTING]: 'Connecting…',
  [ConnectionState.LIVE]: 'Live',
  [ConnectionState.RECONNECTING]: 'Offline',
  [ConnectionState.UNAUTHORIZED]: 'Signed out',
};
const stateTitles = {
  [ConnectionState.IDLE]: '',
  [ConnectionState.CONNECTING]: 'Opening the live connection.',
  [ConnectionState.LIVE]: 'Live: timelines update as posts are written.',
  [ConnectionState.RECONNECTING]: 'The live connection dropped. Reconnecting; posts written meanwhile will appear.',
  [ConnectionState.UNAUTHORIZED]: 'The server ended this session.',
};

function renderConnection(state) {
  const el = document.getElementById('connection');
  el.dataset.state = state;
  el.querySelector('.connection-label').textContent = stateLabels[state];
  el.title = stateTitles[state];
}

async function logOut() {
  try {
    await client.request(LOGOUT);
  } catch {
    // The session may already be gone; signing out here is what matters.
  }
  session.signOut();
  client.reconnect();
  router.navigate('/login');
  notify('You are logged out.');
}

// --- start ---------------------------------------------------------------

client.on('state', renderConnection);

// The server refused our token (revoked, expired, or logged out in
// another tab): forget it and show the login screen.
let started = false;
client.on('autherror', () => {
  if (!session.token) return;
  session.signOut();
  client.reconnect();
  if (!started) return; // start() goes on signed out
  notifyError('Your session has ended. Please log in again.');
  router.navigate('/login', { replace: true });
});

session.onChange(() => renderNav());

// Come back at once rather than after the backoff when the network or the
// tab comes back.
window.addEventListener('online', () => client.retryNow());
document.addEventListener('visibilitychange', () => {
  if (document.visibilityState === 'visible') client.retryNow();
});

setInterval(refreshTimes, 30_000);

async function start() {
  renderConnection(client.state);
  if (session.token) {
    try {
      const { viewer } = await client.request(VIEWER);
      if (viewer) session.restore(viewer);
      else session.signOut();
    } catch (error) {
      // UNAUTHENTICATED already signed us out through "autherror"; other
      // errors leave the token for the next try but show the app signed out.
      if (error.code !== 'UNAUTHENTICATED') notifyError('Warble could not check your session. Some things may not work.');
    }
  }
  started = true;
  renderNav();
  router.start();
}

start();
