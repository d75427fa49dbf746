// Sign up and log in. Both end with a token kept for this tab and the
// subscription socket reconnected with it.

import { h, uniqueId } from '../dom.js';
import { describeError } from '../errors.js';
import { pageHeading } from '../ui.js';
import { LOGIN, SIGNUP } from '../queries.js';

function field({ label, name, type = 'text', autocomplete, hint, required = true }) {
  const id = uniqueId(name);
  const hintId = hint ? `${id}-hint` : undefined;
  return h('div', { class: 'field' },
    h('label', { for: id }, label),
    h('input', {
      id, name, type, autocomplete, required,
      autocapitalize: type === 'text' ? 'none' : undefined,
      spellcheck: 'false',
      'aria-describedby': hintId,
    }),
    hint && h('p', { class: 'hint', id: hintId }, hint));
}

/**
 * Builds a form that runs `submit(values)` and shows its error. The error
 * paragraph is an alert, so screen readers say it as soon as it appears.
 */
function authForm({ fields, button, submit, errorOverrides }) {
  const error = h('p', { class: 'form-error', role: 'alert' });
  const submitButton = h('button', { type: 'submit', class: 'button-primary button-wide' }, button);
  const form = h('form', { class: 'stack' }, fields, error, submitButton);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.textContent = '';
    submitButton.disabled = true;
    form.setAttribute('aria-busy', 'true');
    try {
      await submit(Object.fromEntries(new FormData(form)));
    } catch (err) {
      error.textContent = describeError(err, errorOverrides);
      // Put the cursor where the fix is likely needed.
      form.querySelector('input')?.focus();
    } finally {
      submitButton.disabled = false;
      form.removeAttribute('aria-busy');
    }
  });
  return form;
}

async function signIn(app, payload) {
  app.session.signIn(payload.token, payload.user);
  app.client.reconnect();
  app.navigate('/', { replace: true });
}

export function loginView(app, _params, signal) {
  if (app.session.signedIn) return app.navigate('/', { replace: true });
  app.setTitle('Log in');
  const form = authForm({
    button: 'Log in',
    fields: [
      field({ label: 'Username', name: 'username', autocomplete: 'username' }),
      field({ label: 'Password', name: 'password', type: 'password', autocomplete: 'current-password' }),
    ],
    errorOverrides: { UNAUTHENTICATED: 'That username and password do not match an account.' },
    async submit({ username, password }) {
      const data = await app.client.request(LOGIN, { input: { username: username.trim(), password } });
      if (!signal.aborted) await signIn(app, data.login);
    },
  });
  app.main.append(h('section', { class: 'card auth' },
    pageHeading('Log in to Warble'),
    form,
    h('p', { class: 'auth-switch' }, 'New here? ', h('a', { href: '/signup' }, 'Create an account'))));
}

export function signupView(app, _params, signal) {
  if (app.session.signedIn) return app.navigate('/', { replace: true });
  app.setTitle('Sign up');
  const form = authForm({
    button: 'Sign up',
    fields: [
      field({ label: 'Username', name: 'username', autocomplete: 'username', hint: '3 to 20 letters, digits or underscores.' }),
      field({ label: 'Display name', name: 'displayName', autocomplete: 'name', required: false, hint: 'Optional: shown beside your username, up to 50 characters.' }),
      field({ label: 'Password', name: 'password', type: 'password', autocomplete: 'new-password', hint: 'At least 8 characters.' }),
    ],
    async submit({ username, displayName, password }) {
      const input = { username: username.trim(), password };
      if (displayName.trim()) input.displayName = displayName.trim();
      const data = await app.client.request(SIGNUP, { input });
      if (!signal.aborted) await signIn(app, data.signup);
    },
  });
  app.main.append(h('section', { class: 'card auth' },
    pageHeading('Join Warble'),
    h('p', { class: 'lede' }, 'Post short messages and follow people. Timelines update live.'),
    form,
    h('p', { class: 'auth-switch' }, 'Have an account? ', h('a', { href: '/login' }, 'Log in'))));
}
