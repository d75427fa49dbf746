// Pieces of UI shared by the screens: avatars, posts, times, user rows and
// the confirmation dialog.

import { h } from './dom.js';
import { tokenize } from './text.js';
import { relativeTime, exactTime } from './time.js';

/** A colored circle with initials; the hue comes from the username. */
export function avatar(user, size = 'md') {
  const initials = [...(user.displayName || user.username).trim()]
    .filter((ch) => /\p{L}|\p{N}/u.test(ch))
    .slice(0, 1)
    .join('')
    .toUpperCase() || '?';
  const el = h('span', { class: `avatar avatar-${size}`, 'aria-hidden': 'true' }, initials);
  el.style.setProperty('--hue', String(hue(user.username)));
  return el;
}

function hue(text) {
  let n = 0;
  for (const ch of text.toLowerCase()) n = (n * 31 + ch.codePointAt(0)) % 360;
  return n;
}

/** <time> showing a relative time, the exact one on hover; kept fresh by refreshTimes. */
export function timeEl(iso) {
  return h('time', { datetime: iso, title: exactTime(iso), 'data-relative': '' }, relativeTime(iso));
}

/** Updates every relative time on the page ("now" becomes "1m"…). */
export function refreshTimes(root = document) {
  const now = new Date();
  for (const el of root.querySelectorAll('time[data-relative]')) {
    const text = relativeTime(el.dateTime, now);
    if (el.textContent !== text) el.textContent = text;
  }
}

export function profileHref(username) {
  return `/u/${encodeURIComponent(username)}`;
}

/** The body of a post, with links and @mentions as real links. */
function postBody(body) {
  return h('p', { class: 'post-body' }, tokenize(body).map((part) => {
    switch (part.type) {
      case 'link':
        return h('a', { href: part.href, rel: 'noopener noreferrer nofollow ugc', target: '_blank' }, part.text);
      case 'mention':
        return h('a', { href: profileHref(part.username) }, part.text);
      default:
        return part.text;
    }
  }));
}

/**
 * One post as an <article>. `onDelete` is given only for the viewer's own
 * posts and adds a Delete button.
 */
export function postEl(post, { onDelete, live = false } = {}) {
  const { author } = post;
  const nameId = `post-${post.id}-author`.replace(/[^\w-]/g, '_');
  return h('article', { class: live ? 'post post-new' : 'post', 'data-post-id': post.id, 'aria-labelledby': nameId, tabindex: '-1' },
    h('a', { class: 'post-avatar', href: profileHref(author.username), tabindex: '-1', 'aria-hidden': 'true' }, avatar(author)),
    h('div', { class: 'post-main' },
      h('header', { class: 'post-head' },
        h('span', { class: 'post-meta' },
          h('a', { class: 'post-author', href: profileHref(author.username), id: nameId }, author.displayName),
          h('span', { class: 'post-handle' }, `@${author.username}`),
          h('span', { class: 'post-dot', 'aria-hidden': 'true' }, '·'),
          timeEl(post.createdAt)),
        onDelete && h('button', { type: 'button', class: 'button-quiet button-danger post-delete', onclick: () => onDelete(post) }, 'Delete')),
      postBody(post.body)));
}

/** A row in a list of users, with an optional control (a Follow button) at its end. */
export function userRow(user, { note, action } = {}) {
  return h('li', { class: 'user-row' },
    h('a', { class: 'user-link', href: profileHref(user.username) },
      avatar(user),
      h('span', { class: 'user-names' },
        h('span', { class: 'user-name' }, user.displayName),
        h('span', { class: 'user-handle' }, `@${user.username}`),
        note)),
    user.followsViewer && h('span', { class: 'badge' }, 'Follows you'),
    action);
}

const SVG = 'http://www.w3.org/2000/svg';

/** Warble's bird, as in the top bar, for decoration. */
function birdMark() {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', '0 0 32 32');
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('focusable', 'false');
  svg.setAttribute('class', 'empty-mark');
  const path = document.createElementNS(SVG, 'path');
  path.setAttribute('d', 'M6 19c0-7 5-12 12-12 3 0 5 1 6.5 2.5L29 8l-2.5 4.2C27 18 22 24 14 24l-8 2 2.5-4.5C7 21 6 20 6 19Z');
  svg.append(path);
  return svg;
}

/**
 * What a screen shows when it has nothing to list: a heading that says so,
 * then whatever helps (a sentence on what would appear here, a link to the
 * place where one can change that). `children` are nodes or strings; a
 * string becomes a paragraph.
 */
export function emptyState(title, ...children) {
  return h('div', { class: 'empty-state' },
    birdMark(),
    h('h3', { class: 'empty-title' }, title),
    children.map((child) => (typeof child === 'string' ? h('p', { class: 'empty-text' }, child) : child)));
}

/**
 * Asks a yes/no question in a modal <dialog> (focus is trapped in it and
 * Escape cancels, natively). Resolves to true when confirmed.
 */
export function confirmDialog({ title, text, confirmLabel, danger = false }) {
  return new Promise((resolve) => {
    const titleId = 'confirm-title';
    const dialog = h('dialog', { class: 'dialog', 'aria-labelledby': titleId },
      h('form', { method: 'dialog' },
        h('h2', { id: titleId }, title),
        text && h('p', {}, text),
        h('div', { class: 'dialog-actions' },
          h('button', { value: 'cancel', class: 'button-secondary' }, 'Cancel'),
          h('button', { value: 'confirm', class: danger ? 'button-danger-solid' : 'button-primary' }, confirmLabel))));
    dialog.addEventListener('close', () => {
      dialog.remove();
      resolve(dialog.returnValue === 'confirm');
    });
    document.body.append(dialog);
    dialog.showModal();
    // Start on Cancel: a stray Enter should not delete anything.
    dialog.querySelector('button[value="cancel"]').focus();
  });
}

/**
 * Says that something the person did has happened ("Post deleted."). It
 * goes to a polite status region: screen readers say it when they are done
 * with what they are saying, without interrupting.
 */
export function notify(message) {
  showNotice('status-notices', message);
}

/**
 * Says that something went wrong. It goes to an alert region, which screen
 * readers say at once: keep it for errors, or it loses its urgency.
 */
export function notifyError(message) {
  showNotice('error-notices', message, 'notice notice-error');
}

// One notice shows at a time: a new one replaces the last, of either kind,
// and each is cleared after a while.
let noticeTimer = null;
function showNotice(regionId, message, className = 'notice') {
  for (const region of document.querySelectorAll('#status-notices, #error-notices')) {
    region.replaceChildren(...(region.id === regionId ? [h('p', { class: className }, message)] : []));
  }
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => document.getElementById(regionId).replaceChildren(), 8000);
}

/** A heading that screens focus after navigation. */
export function pageHeading(text, { hidden = false } = {}) {
  return h('h1', { tabindex: '-1', class: hidden ? 'visually-hidden' : 'page-title' }, text);
}
