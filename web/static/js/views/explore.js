// Explore: the newest accounts, then everyone's posts, live. It keeps the
// same single column as Home, so that moving between the two does not
// shift the page.

import { h } from '../dom.js';
import { describeError } from '../errors.js';
import { followButton } from '../follow.js';
import { liveTimeline } from '../timeline.js';
import { emptyState, pageHeading, userRow } from '../ui.js';
import { GLOBAL_EVENTS, GLOBAL_TIMELINE, NEWEST_USERS } from '../queries.js';

export function exploreView(app, _params, signal) {
  app.setTitle('Explore');
  const timeline = liveTimeline({
    app,
    signal,
    label: 'Everyone’s posts',
    fetchPage: async (vars) => (await app.client.request(GLOBAL_TIMELINE, vars)).globalTimeline,
    subscription: (after) => ({ query: GLOBAL_EVENTS, variables: after ? { after } : {} }),
    pickEvent: (data) => data?.globalTimeline,
    empty: () => emptyState('Nobody has posted yet',
      app.session.signedIn
        ? h('p', { class: 'empty-text' }, 'Be the first: ', h('a', { href: '/' }, 'write a post on Home'), '.')
        : h('p', { class: 'empty-text' }, h('a', { href: '/signup' }, 'Sign up'), ' and be the first to post.')),
  });

  const users = h('ul', { class: 'user-list user-grid', 'aria-busy': 'true' });
  app.main.append(
    pageHeading('Explore', { hidden: true }),
    h('section', { class: 'card newest', 'aria-labelledby': 'newest-heading' },
      h('h2', { id: 'newest-heading', class: 'section-title' }, 'New on Warble'),
      users),
    h('section', { class: 'card timeline-card', 'aria-labelledby': 'explore-heading' },
      h('h2', { id: 'explore-heading', class: 'section-title' }, 'Everyone’s posts'),
      timeline.element));

  const viewerId = app.session.viewer?.id;
  app.client.request(NEWEST_USERS, { first: 6 })
    .then(({ newestUsers }) => {
      if (signal.aborted) return;
      users.replaceChildren(...newestUsers.map((user) => userRow(user, {
        action: !viewerId ? null
          : user.id === viewerId ? h('span', { class: 'badge' }, 'You')
            : followButton(app, user, { inList: true }),
      })));
      if (!newestUsers.length) users.append(h('li', { class: 'empty-text' }, 'No accounts yet.'));
    })
    .catch((error) => {
      if (!signal.aborted) users.replaceChildren(h('li', { class: 'form-error' }, describeError(error)));
    })
    .finally(() => users.setAttribute('aria-busy', 'false'));
}
