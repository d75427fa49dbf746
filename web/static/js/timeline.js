// A live timeline on screen: loads the first page, subscribes for events
// from the newest cursor it showed, renders changes in place, refetches on
// RESYNC, pages with "Load more", and deletes the viewer's own posts.

import { h } from './dom.js';
import { describeError } from './errors.js';
import { TimelineModel } from './timeline-model.js';
import { postEl, confirmDialog, notify, notifyError } from './ui.js';
import { DELETE_POST } from './queries.js';

const PAGE_SIZE = 20;

/**
 * @param {object} options
 * @param {object} options.app          {client, session}
 * @param {AbortSignal} options.signal  ends the subscription when the screen goes
 * @param {string} options.label        accessible name of the list
 * @param {(vars: {first, after}) => Promise<object>} options.fetchPage  resolves to a Timeline
 * @param {(after: string|null) => {query, variables}} options.subscription
 * @param {(data) => object} options.pickEvent  the TimelineEvent inside a subscription's data
 * @param {Node|(() => Node)} options.empty  shown while there are no posts; a function
 *   is called the first time it is needed, so that what it loads is loaded only then
 * @param {(change: string) => void} [options.onChange]  "added" or "removed", for counters
 */
export function liveTimeline({ app, signal, label, fetchPage, subscription, pickEvent, empty: emptyContent, onChange }) {
  const model = new TimelineModel();
  const elements = new Map(); // postId -> <article>
  // The list becomes a feed only once it holds posts: ARIA requires a feed
  // to contain articles, and an empty one is announced as a broken widget.
  // While empty, the empty state below says what there is to say.
  const list = h('div', { class: 'timeline-list', 'aria-busy': 'true', tabindex: '-1' });
  const empty = h('div', { class: 'timeline-empty', hidden: true });
  const problem = h('div', { class: 'timeline-problem', hidden: true });
  const more = h('button', { type: 'button', class: 'button-secondary load-more', hidden: true, onclick: loadMore }, 'Load more');
  const element = h('div', { class: 'timeline' }, list, empty, problem, h('div', { class: 'load-more-row' }, more));

  let refetching = null;

  function render({ live = false } = {}) {
    const wanted = new Set(model.items.map((item) => item.postId));
    for (const [id, el] of elements) {
      if (!wanted.has(id)) {
        el.remove();
        elements.delete(id);
      }
    }
    // Walk the model in order and only move nodes that are out of place,
    // so that a focused post or button keeps its focus.
    let cursor = list.firstElementChild;
    for (const item of model.items) {
      let el = elements.get(item.postId);
      if (!el) {
        el = postEl(item.post, { onDelete: isMine(item.post) ? remove : undefined, live: live && item.live });
        elements.set(item.postId, el);
      }
      if (el !== cursor) list.insertBefore(el, cursor);
      else cursor = cursor.nextElementSibling;
    }
    list.setAttribute('aria-busy', 'false');
    if (model.items.length > 0) {
      list.setAttribute('role', 'feed');
      list.setAttribute('aria-label', label);
    } else {
      list.removeAttribute('role');
      list.removeAttribute('aria-label');
    }
    empty.hidden = model.items.length > 0;
    if (!empty.hidden && !empty.firstChild) {
      empty.append(typeof emptyContent === 'function' ? emptyContent() : emptyContent);
    }
    more.hidden = !model.hasNextPage;
  }

  function isMine(post) {
    return app.session.viewer?.id === post.author.id;
  }

  function showProblem(error, retry) {
    problem.replaceChildren(
      h('p', {}, describeError(error)),
      h('button', { type: 'button', class: 'button-secondary', onclick: () => { problem.hidden = true; retry(); } }, 'Try again'));
    problem.hidden = false;
  }

  async function loadFirstPage() {
    try {
      const timeline = await fetchPage({ first: PAGE_SIZE });
      if (signal.aborted) return false;
      model.setFirstPage(timeline);
      render();
      return true;
    } catch (error) {
      if (signal.aborted) return false;
      list.setAttribute('aria-busy', 'false');
      showProblem(error, start);
      return false;
    }
  }

  // Refetch once at a time; a RESYNC during a refetch needs one more.
  function refetch() {
    if (refetching) {
      refetching.again = true;
      return;
    }
    refetching = { again: false };
    model.beginRefetch();
    fetchPage({ first: PAGE_SIZE })
      .then((timeline) => {
        if (signal.aborted) return;
        model.setFirstPage(timeline);
        render();
      })
      .catch((error) => {
        if (!signal.aborted) notifyError(describeError(error));
      })
      .finally(() => {
        const again = refetching.again;
        refetching = null;
        if (again && !signal.aborted) refetch();
      });
  }

  async function loadMore() {
    more.disabled = true;
    more.textContent = 'Loading…';
    try {
      const timeline = await fetchPage({ first: PAGE_SIZE, after: model.endCursor });
      if (signal.aborted) return;
      const before = model.items.length;
      model.appendPage(timeline);
      render();
      // Keyboard users land on the first new post rather than back at the top.
      const first = list.children[before];
      if (first && document.activeElement === more && more.hidden) first.focus();
    } catch (error) {
      if (!signal.aborted) notifyError(describeError(error));
    } finally {
      more.disabled = false;
      more.textContent = 'Load more';
    }
  }

  async function remove(post) {
    const confirmed = await confirmDialog({
      title: 'Delete this post?',
      text: 'It will disappear from every timeline. This cannot be undone.',
      confirmLabel: 'Delete',
      danger: true,
    });
    if (!confirmed || signal.aborted) return;
    const el = elements.get(post.id);
    try {
      await app.client.request(DELETE_POST, { input: { postId: post.id } });
    } catch (error) {
      if (error.code !== 'NOT_FOUND') {
        notifyError(describeError(error));
        return;
      }
      // Already gone (deleted in another tab): remove it here too.
    }
    if (signal.aborted) return;
    const next = el?.nextElementSibling ?? el?.previousElementSibling;
    if (model.remove(post.id)) {
      render();
      onChange?.('removed');
    }
    (next ?? list).focus?.();
    notify('Post deleted.');
  }

  // A timeline never ends by itself: the server completes it when it shuts
  // down gracefully or the session is revoked, and closes the socket right
  // after. So a completed subscription is started again, resuming, after a
  // pause that lets the close arrive first: the client then reconnects (and
  // a revoked token surfaces as close code 4403).
  let stopSubscription = () => {};
  let restartTimer = null;
  let restarts = 0;
  signal.addEventListener('abort', () => {
    clearTimeout(restartTimer);
    stopSubscription();
  }, { once: true });

  function subscribe() {
    if (signal.aborted) return;
    stopSubscription = app.client.subscribe({
      ...subscription(null),
      variables: ({ resumed }) => {
        // With nothing shown there is no cursor to resume from; reload the
        // page instead, in case posts arrived while we were away.
        if ((resumed || restarts > 0) && model.newestCursor === null) refetch();
        return subscription(model.newestCursor).variables;
      },
    }, {
      next(data) {
        restarts = 0;
        const event = pickEvent(data);
        if (!event) return;
        const change = model.apply(event);
        if (change === 'resync') refetch();
        else if (change) {
          render({ live: true });
          onChange?.(change);
        }
      },
      error(error) {
        if (!signal.aborted) showProblem(error, subscribe);
      },
      complete() {
        if (signal.aborted) return;
        const delay = Math.min(30_000, 1000 * 2 ** restarts);
        restarts += 1;
        restartTimer = setTimeout(subscribe, delay);
      },
    });
  }

  async function start() {
    list.setAttribute('aria-busy', 'true');
    if (await loadFirstPage()) subscribe();
  }

  start();
  return {
    element,
    /** Shows a post the viewer just wrote, before its event arrives. */
    addLocal(post) {
      if (model.addLocal(post)) {
        render({ live: true });
        onChange?.('added');
      }
    },
  };
}
