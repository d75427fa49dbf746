// Signing up, logging in and out, and what the app says when the API
// refuses.

import assert from 'node:assert/strict';

import { e2e, useStack, uniqueName, waitLive, eventually } from './harness.mjs';

const env = useStack();

const token = (page) => page.evaluate(() => sessionStorage.getItem('warble.token'));

e2e('sign up, log out and log in again', () => env, async (t, scene) => {
  const username = uniqueName('eve');
  const page = await scene.page({ path: '/' });

  // Signed out, home sends you to log in; from there, to sign up.
  await page.waitForURL('**/login');
  await page.getByRole('link', { name: 'Create an account' }).click();
  await page.waitForURL('**/signup');

  await page.getByLabel('Username').fill(username);
  await page.getByLabel('Display name').fill('Eve Example');
  await page.getByLabel('Password').fill('a good long password');
  await page.getByRole('button', { name: 'Sign up' }).click();

  await page.getByLabel("What's happening?").waitFor();
  assert.equal(new URL(page.url()).pathname, '/');
  await page.getByRole('link', { name: `@${username}` }).waitFor();
  assert.ok(await token(page), 'the token is kept in sessionStorage');
  await waitLive(page);

  // The token survives a reload of the tab.
  await page.reload();
  await page.getByRole('button', { name: 'Log out' }).waitFor();
  await page.getByLabel("What's happening?").waitFor();

  await page.getByRole('button', { name: 'Log out' }).click();
  await page.getByRole('button', { name: 'Log in' }).waitFor();
  // A notice that what you asked for happened is a polite status, not an alert.
  await page.getByRole('status').filter({ hasText: 'You are logged out.' }).waitFor();
  assert.equal(await page.getByRole('alert').filter({ hasText: 'logged out' }).count(), 0, 'logging out is not an alert');
  assert.equal(await token(page), null, 'logging out forgets the token');
  assert.equal(new URL(page.url()).pathname, '/login');

  // A wrong password is UNAUTHENTICATED, said plainly.
  await page.getByLabel('Username').fill(username);
  await page.getByLabel('Password').fill('not the password');
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('alert').filter({ hasText: 'That username and password do not match an account.' }).waitFor();

  // Keyboard only: Enter in the password field submits.
  await page.getByLabel('Password').fill('a good long password');
  await page.getByLabel('Password').press('Enter');
  await page.getByLabel("What's happening?").waitFor();
  await page.getByRole('link', { name: `@${username}` }).waitFor();

  // Another tab (here another context) does not share the session.
  const other = await scene.page({ path: '/' });
  await other.waitForURL('**/login');
});

e2e('sign-up errors are explained in words', () => env, async (t, scene) => {
  const { api } = env.stack;
  const taken = uniqueName('taken');
  await api.signup(taken);
  const page = await scene.page({ path: '/signup' });
  const alert = page.getByRole('alert').filter({ hasText: /\S/ });

  // CONFLICT: the name is taken.
  await page.getByLabel('Username').fill(taken.toUpperCase());
  await page.getByLabel('Password').fill('a good long password');
  await page.getByRole('button', { name: 'Sign up' }).click();
  await alert.filter({ hasText: /taken/i }).waitFor();

  // BAD_USER_INPUT: the server's sentence names the problem.
  await page.getByLabel('Username').fill(uniqueName('ok'));
  await page.getByLabel('Password').fill('short');
  await page.getByRole('button', { name: 'Sign up' }).click();
  await alert.filter({ hasText: /Password must be/ }).waitFor();

  await page.getByLabel('Username').fill('no spaces allowed');
  await page.getByLabel('Password').fill('a good long password');
  await page.getByRole('button', { name: 'Sign up' }).click();
  await alert.filter({ hasText: /Username/ }).waitFor();
  assert.equal(new URL(page.url()).pathname, '/signup', 'still on the form');
});

e2e('a revoked session sends the tab back to the login screen', () => env, async (t, scene) => {
  const { api } = env.stack;
  const fay = await api.signup(uniqueName('fay'));
  await api.post(fay.token, 'Fay was here');
  const page = await scene.page({ token: fay.token });
  await page.getByRole('article').filter({ hasText: 'Fay was here' }).waitFor();
  await waitLive(page);

  // Logging out elsewhere with the same token revokes it: the server ends
  // the websocket, the reconnect is refused with 4403, and the app lets go.
  await api.logout(fay.token);
  await page.waitForURL('**/login');
  await page.getByRole('alert').filter({ hasText: 'Your session has ended' }).waitFor();
  await eventually(async () => (await token(page)) === null, { message: 'the token to be dropped' });
});
