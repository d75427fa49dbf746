// Home: the composer and the signed-in user's live home timeline.

import { h, uniqueId } from '../dom.js';
import { describeError } from '../errors.js';
import { checkPost, MAX_POST_LENGTH } from '../text.js';
import { liveTimeline } from '../timeline.js';
import { avatar, pageHeading } from '../ui.js';
import { CREATE_POST, HOME_EVENTS, HOME_TIMELINE } from '../queries.js';

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
    emptyText: 'Your timeline is empty. Write your first post, or find people to follow in Explore.',
  });

  app.main.append(
    pageHeading('Home', { hidden: true }),
    composer(app, signal, (post) => timeline.addLocal(post)),
    h('section', { class: 'card timeline-card', 'aria-labelledby': 'home-heading' },
      h('h2', { id: 'home-heading', class: 'section-title' }, 'Home timeline'),
      timeline.element));
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
