// Home: the composer and the signed-in user's live home timeline. A
// newcomer's timeline is empty, so instead it says how to post and whom
// one might follow.

import { h, uniqueId } from '../dom.js';
import { describeError } from '../errors.js';
import { followButton } from '../follow.js';
import { checkPost, MAX_POST_LENGTH } from '../text.js';
import { liveTimeline } from '../timeline.js';
import { avatar, emptyState, pageHeading, userRow } from '../ui.js';
import { CREATE_POST, HOME_EVENTS, HOME_TIMELINE, NEWEST_USERS } from '../queries.js';

export function homeView(app, _params, signal) {
  if (!app.session.signedIn) return app.navigate('/login', { replace: true });
  app.setTitle('Home');

  const timeline = liveTimeline({
    app,
    signal,
    label: 'Home timeline',
    fetchPage: async (vars) => (await app.client.request(HOME_TIMELINE, vars)).homeTimeline,
    subscription: (after) => ({ query: HOME_EVENTS, variables: after ? { after } : {} }),
    pickEvent: (data) => data?.homeTimeline,
    empty: () => welcome(app, signal),
  });

  app.main.append(
    pageHeading('Home', { hidden: true }),
    composer(app, signal, (post) => timeline.addLocal(post)),
    h('section', { class: 'card timeline-card', 'aria-labelledby': 'home-heading' },
      h('h2', { id: 'home-heading', class: 'section-title' }, 'Home timeline'),
      timeline.element));
}

/**
 * The empty home timeline: what it will show, how to post, and the newest
 * accounts with Follow buttons. Following someone rewrites the timeline on
 * the server, which sends a RESYNC, so their posts then appear by
 * themselves and this goes away.
 */
function welcome(app, signal) {
  const headingId = uniqueId('suggestions');
  const list = h('ul', { class: 'user-list suggestions-list', 'aria-busy': 'true' });
  const note = h('p', { class: 'empty-text', hidden: true });
  app.client.request(NEWEST_USERS, { first: 10 })
    .then(({ newestUsers }) => {
      if (signal.aborted) return;
      const others = newestUsers
        .filter((user) => user.id !== app.session.viewer?.id && !user.viewerIsFollowing)
        .slice(0, 5);
      list.replaceChildren(...others.map((user) => userRow(user, { action: followButton(app, user, { inList: true }) })));
      if (!others.length) {
        note.textContent = 'Nobody else has joined yet. Newcomers will be listed in Explore.';
        note.hidden = false;
      }
    })
    .catch((error) => {
      if (signal.aborted) return;
      note.textContent = describeError(error);
      note.hidden = false;
    })
    .finally(() => list.setAttribute('aria-busy', 'false'));

  return emptyState('Your timeline is empty',
    'Your home timeline shows your own posts and the posts of the people you follow, live, as they are written.',
    h('ol', { class: 'empty-steps' },
      h('li', {}, h('strong', {}, 'Write a post'), ' in the box above and press Post (or Ctrl+Enter). ',
        'It shows here, on your profile and in the home timeline of everyone who follows you.'),
      h('li', {}, h('strong', {}, 'Follow a few people'), ' and their posts fill this timeline.')),
    h('section', { class: 'suggestions', 'aria-labelledby': headingId },
      h('h4', { id: headingId, class: 'suggestions-title' }, 'New on Warble'),
      list,
      note,
      h('p', { class: 'empty-text' }, 'More people and everyone’s posts are in ', h('a', { href: '/explore' }, 'Explore'), '.')));
}

/** The post form, with a live count of what the server will count. */
function composer(app, signal, onPosted) {
  const id = uniqueId('composer');
  const countId = `${id}-count`;
  const textarea = h('textarea', {
    id, name: 'body', rows: '3', placeholder: "What's happening?", 'aria-describedby': countId,
  });
  const count = h('span', { class: 'count', id: countId });
  const meter = h('span', { class: 'meter', 'aria-hidden': 'true' });
  const error = h('p', { class: 'form-error', role: 'alert' });
  const button = h('button', { type: 'submit', class: 'button-primary', disabled: true }, 'Post');
  const form = h('form', { class: 'card composer' },
    h('div', { class: 'composer-row' },
      h('span', { class: 'composer-avatar' }, avatar(app.session.viewer)),
      h('div', { class: 'composer-field' },
        h('label', { for: id, class: 'visually-hidden' }, "What's happening?"),
        textarea)),
    h('div', { class: 'composer-foot' }, meter, count, error, button));

  let busy = false;
  function update() {
    const check = checkPost(textarea.value);
    count.textContent = `${check.length} / ${MAX_POST_LENGTH}`;
    count.setAttribute('aria-label', check.remaining >= 0
      ? `${check.length} of ${MAX_POST_LENGTH} characters`
      : `${-check.remaining} characters too many`);
    form.dataset.level = check.remaining < 0 ? 'over' : check.remaining <= 20 ? 'near' : 'ok';
    meter.style.setProperty('--used', String(Math.min(1, check.length / MAX_POST_LENGTH)));
    button.disabled = busy || !check.ok;
    if (check.problem) error.textContent = check.problem;
    else if (error.dataset.from === 'check') error.textContent = '';
    error.dataset.from = check.problem ? 'check' : '';
  }

  async function submit(event) {
    event.preventDefault();
    if (busy || !checkPost(textarea.value).ok) return;
    busy = true;
    error.textContent = '';
    update();
    try {
      const data = await app.client.request(CREATE_POST, { input: { body: textarea.value } });
      if (signal.aborted) return;
      textarea.value = '';
      onPosted(data.createPost.post);
    } catch (err) {
      error.textContent = describeError(err);
    } finally {
      busy = false;
      update();
      textarea.focus();
    }
  }

  textarea.addEventListener('input', update);
  // Ctrl+Enter (or Cmd+Enter) posts without leaving the keyboard.
  textarea.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  form.addEventListener('submit', submit);
  update();
  return form;
}
