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

/**
 * Where the top bar's ends and the content column are, in pixels: the
 * logo's left edge, the account controls' right edge, and the left and
 * right edges of the cards in <main>.
 */
function columnEdges(page) {
  return page.evaluate(() => {
    const box = (el) => el.getBoundingClientRect();
    const cards = [...document.querySelectorAll('main > .card, main > section, main > form')].map(box);
    return {
      brandLeft: box(document.querySelector('.brand')).left,
      accountRight: box(document.querySelector('.account')).right,
      contentLeft: Math.min(...cards.map((b) => b.left)),
      contentRight: Math.max(...cards.map((b) => b.right)),
    };
  });
}

/** Asserts that the top bar's logo and account controls line up with the content column. */
async function assertHeaderAligned(page, screen) {
  const edges = await columnEdges(page);
  assert.ok(Math.abs(edges.brandLeft - edges.contentLeft) <= 1, `${screen}: the logo starts at ${edges.brandLeft}px, the content at ${edges.contentLeft}px`);
  assert.ok(Math.abs(edges.accountRight - edges.contentRight) <= 1, `${screen}: the account controls end at ${edges.accountRight}px, the content at ${edges.contentRight}px`);
  return edges;
}

e2e('screenshots of home, profile and phone width', () => env, async (t, scene) => {
  const people = await buildScene(env.stack.api);
  const { ada, grace, katherine } = people;
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
  const homeEdges = await assertHeaderAligned(home, 'home');

  // Explore keeps Home's column: going from one to the other moves nothing.
  await home.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Explore' }).click();
  await home.getByRole('region', { name: 'New on Warble' }).getByRole('listitem').nth(5).waitFor();
  await home.getByRole('article').nth(7).waitFor();
  assert.deepEqual(await assertHeaderAligned(home, 'explore'), homeEdges, 'Explore and Home share one column');

  // A profile, light theme: Ada follows Grace's followers, so the social lines show.
  const profile = await scene.page({ token: ada.token, path: `/u/${grace.user.username}`, viewport: { width: 1200, height: 900 } });
  await profile.getByRole('heading', { name: 'Grace Hopper', exact: true }).waitFor();
  await profile.getByText(/you follow/).waitFor();
  await profile.getByRole('article').nth(1).waitFor();
  await waitLive(profile);
  await shot(profile, 'profile.png');
  assert.deepEqual(await assertHeaderAligned(profile, 'a profile'), homeEdges, 'profiles share the column too');

  // Explore at desktop width, dark theme.
  const explore = await scene.page({ token: ada.token, path: '/explore', viewport: { width: 1200, height: 900 }, colorScheme: 'dark' });
  await explore.getByRole('article').nth(7).waitFor();
  await explore.getByRole('region', { name: 'New on Warble' }).getByRole('listitem').nth(5).waitFor();
  await waitLive(explore);
  await shot(explore, 'explore-dark.png');

  // Phone width, dark theme: nothing may overflow sideways, and the
  // connection dot says in words what it means.
  for (const [colorScheme, name] of [['dark', 'phone-dark.png'], ['light', null]]) {
    const phone = await scene.page({ token: ada.token, viewport: { width: 390, height: 844 }, colorScheme });
    await phone.getByRole('article').nth(5).waitFor();
    await waitLive(phone);
    const overflow = await phone.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone screen`);
    const connection = phone.getByRole('status', { name: 'Connection' });
    assert.equal(await connection.getByText('Live', { exact: true }).isVisible(), true, 'the connection label shows at phone width');
    assert.match(await connection.getAttribute('title'), /\w/, 'the connection has a tooltip');
    await assertHeaderAligned(phone, 'home at phone width');
    if (name) await shot(phone, name);
  }

  const phoneProfile = await scene.page({ token: ada.token, path: `/u/${grace.user.username}`, viewport: { width: 390, height: 844 } });
  await phoneProfile.getByRole('button', { name: 'Unfollow' }).waitFor();
  const overflow = await phoneProfile.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the profile is ${overflow}px wider than a phone screen`);

  // The sign-up screen, signed out: nothing on it is live, so there is no
  // live indicator to say "Not live".
  const signup = await scene.page({ path: '/signup', viewport: { width: 1200, height: 800 } });
  await signup.getByLabel('Username').waitFor();
  await shot(signup, 'signup.png');
  const indicator = signup.getByRole('status', { name: 'Connection' });
  assert.equal((await indicator.innerText()).trim(), '', 'a visitor who is not signed in sees no live indicator');
  assert.equal(await indicator.locator('.connection-dot').isVisible(), false);

  // A newcomer's first screen: how to post, and whom to follow.
  const newcomer = await env.stack.api.signup('hedy', { displayName: 'Hedy Lamarr' });
  const first = await scene.page({ token: newcomer.token, viewport: { width: 1200, height: 900 } });
  const suggestions = first.getByRole('region', { name: 'New on Warble' });
  await suggestions.getByRole('listitem').nth(4).waitFor();
  await waitLive(first);
  await shot(first, 'newcomer.png');
  assert.deepEqual(await assertHeaderAligned(first, 'a newcomer’s home'), homeEdges);
  assert.equal(await suggestions.getByText('@hedy').count(), 0, 'a newcomer is not suggested to themself');

  // Following a suggestion fills the timeline, live (the follow's RESYNC).
  await suggestions.getByRole('button', { name: `Follow @${katherine.user.username}` }).click();
  await first.getByRole('status').filter({ hasText: `You follow @${katherine.user.username}.` }).waitFor();
  await first.getByRole('article').filter({ hasText: 'Checked the trajectory by hand again' }).waitFor();
  await first.getByText('Your timeline is empty').waitFor({ state: 'hidden' });
});
