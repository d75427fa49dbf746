// Pictures of the app with a realistic scene, for the README and for
// people to look at. They are written to testdata/screenshots/ only when
// UPDATE_SCREENSHOTS=1, so ordinary runs (and CI) leave the tree clean;
// the layout checks run either way.

import { before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';

import { e2e, startStack, launchBrowser, waitLive, screenshotDir } from './harness.mjs';

const update = process.env.UPDATE_SCREENSHOTS === '1';
const env = {};

before(async () => {
  env.stack = await startStack();
  env.browser = await launchBrowser();
  if (update) await mkdir(screenshotDir, { recursive: true });
});
after(async () => {
  await env.browser?.close();
  await env.stack?.close();
});

/** A small community with a few days' worth of chatter. */
async function buildScene(api) {
  const people = {};
  for (const [key, displayName] of [
    ['grace', 'Grace Hopper'],
    ['linus', 'Linus T.'],
    ['ada', 'Ada Lovelace'],
    ['margaret', 'Margaret Hamilton'],
    ['alan', 'Alan Turing'],
    ['katherine', 'Katherine Johnson'],
  ]) {
    // Plain names: this file has a Redis of its own.
    people[key] = await api.signup(key, { displayName });
  }
  const { grace, linus, ada, margaret, alan, katherine } = people;
  for (const [who, whom] of [
    [ada, grace], [ada, margaret], [ada, alan], [ada, katherine],
    [grace, ada], [margaret, ada], [alan, ada], [katherine, grace],
    [margaret, grace], [alan, grace], [linus, grace], [grace, margaret],
  ]) {
    await api.follow(who.token, whom.user.id);
  }
  const posts = [
    [alan, 'Can machines think? Asking for a friend.'],
    [katherine, 'Checked the trajectory by hand again. The numbers hold. 🚀'],
    [margaret, 'Priority displays saved the landing. Always plan for the alarm you hope never rings.'],
    [grace, `It's easier to ask forgiveness than it is to get permission.`],
    [linus, 'Talk is cheap. Show me the code.'],
    [ada, `Working on notes for the Analytical Engine with @${grace.user.username} in mind: it might act upon other things besides number.`],
    [grace, `Found an actual bug in the relay today. Taped it into the log book. 🐛\nDocs: https://example.com/first-bug`],
    [margaret, 'Code review at 3, bring coffee ☕'],
    [alan, 'Subscriptions resumed after the server restarted. Nothing missed, nothing twice.'],
    [ada, 'Live timelines are fun: this post showed up on three screens before I looked up.'],
  ];
  for (const [who, body] of posts) await api.post(who.token, body);
  return people;
}

e2e('screenshots of home, profile and phone width', () => env, async (t, scene) => {
  const people = await buildScene(env.stack.api);
  const { ada, grace } = people;
  const shot = async (page, name) => {
    if (update) await page.screenshot({ path: path.join(screenshotDir, name), fullPage: false });
  };

  // Home, light theme, desktop.
  const home = await scene.page({ token: ada.token, viewport: { width: 1200, height: 900 } });
  await home.getByRole('article').nth(7).waitFor();
  await waitLive(home);
  await home.getByLabel("What's happening?").fill('Drafting a reply about the Engine…');
  await home.getByLabel("What's happening?").blur();
  await shot(home, 'home.png');

  // A profile, light theme: Ada follows Grace's followers, so the social lines show.
  const profile = await scene.page({ token: ada.token, path: `/u/${grace.user.username}`, viewport: { width: 1200, height: 900 } });
  await profile.getByRole('heading', { name: 'Grace Hopper', exact: true }).waitFor();
  await profile.getByText(/you follow/).waitFor();
  await profile.getByRole('article').nth(1).waitFor();
  await waitLive(profile);
  await shot(profile, 'profile.png');

  // Explore at desktop width, dark theme.
  const explore = await scene.page({ token: ada.token, path: '/explore', viewport: { width: 1200, height: 900 }, colorScheme: 'dark' });
  await explore.getByRole('article').nth(7).waitFor();
  await explore.getByRole('complementary').getByRole('listitem').nth(5).waitFor();
  await waitLive(explore);
  await shot(explore, 'explore-dark.png');

  // Phone width, dark theme: nothing may overflow sideways.
  for (const [colorScheme, name] of [['dark', 'phone-dark.png'], ['light', null]]) {
    const phone = await scene.page({ token: ada.token, viewport: { width: 390, height: 844 }, colorScheme });
    await phone.getByRole('article').nth(5).waitFor();
    await waitLive(phone);
    const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone screen`);
    if (name) await shot(phone, name);
  }

  const phoneProfile = await scene.page({ token: ada.token, path: `/u/${grace.user.username}`, viewport: { width: 390, height: 844 } });
  await phoneProfile.getByRole('button', { name: 'Unfollow' }).waitFor();
  const overflow = await phoneProfile.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the profile is ${overflow}px wider than a phone screen`);

  // The sign-up screen, signed out.
  const signup = await scene.page({ path: '/signup', viewport: { width: 1200, height: 800 } });
  await signup.getByLabel('Username').waitFor();
  await shot(signup, 'signup.png');
});
