// Profiles: deep links, following from a profile page, the social lines,
// and paging with "Load more".

import assert from 'node:assert/strict';

import { e2e, useStack, uniqueName, waitLive, eventually } from './harness.mjs';

const env = useStack();

e2e('following from a profile page fills the home timeline', () => env, async (t, scene) => {
  const { api } = env.stack;
  const gus = await api.signup(uniqueName('gus'), { displayName: 'Gus Grissom' });
  const hal = await api.signup(uniqueName('hal'), { displayName: 'Hal Abelson' });
  const ida = await api.signup(uniqueName('ida'), { displayName: 'Ida Noddack' });
  const jo = await api.signup(uniqueName('jo'), { displayName: 'Jo Ann' });
  for (const n of [1, 2, 3]) await api.post(gus.token, `Gus post number ${n}`);
  await api.follow(ida.token, gus.user.id); // Hal follows Ida, who follows Gus
  await api.follow(hal.token, ida.user.id);
  await api.follow(jo.token, hal.user.id); // Jo follows Hal and Gus: in common
  await api.follow(jo.token, gus.user.id);

  const page = await scene.page({ token: hal.token });
  await page.getByText('Your timeline is empty').waitFor();

  // A deep link to the profile, with a reload to prove it is refresh-safe.
  await page.goto(`/u/${gus.user.username}`);
  await page.reload();
  const header = page.locator('.profile');
  await page.getByRole('heading', { level: 1, name: 'Gus Grissom' }).waitFor();
  await header.getByText(`@${gus.user.username}`).waitFor();
  await header.getByText('3 posts').waitFor();
  await header.getByText('2 followers').waitFor();
  await header.getByText('Followed by 1 person you follow: Ida Noddack').waitFor();
  await header.getByText('1 follower in common with you: Jo Ann').waitFor();
  assert.doesNotMatch(await page.locator('main').innerText(), /\b(null|undefined|false|NaN)\b/, 'no stray values on screen');
  // The header and the posts come from separate queries: wait for the
  // posts before counting them (a count does not wait).
  await page.getByRole('article').filter({ hasText: 'Gus post number 1' }).waitFor();
  assert.equal(await page.getByRole('article').count(), 3);
  await waitLive(page);

  await page.getByRole('button', { name: 'Follow', exact: true }).click();
  await page.getByRole('button', { name: 'Unfollow' }).waitFor();
  await page.getByRole('status').filter({ hasText: `You follow @${gus.user.username}.` }).waitFor();
  assert.equal(await page.getByRole('alert').filter({ hasText: 'You follow' }).count(), 0, 'a follow is not an alert');
  await header.getByText('3 followers').waitFor();

  // The followers tab lists Hal now; it is a deep link too.
  await page.getByRole('link', { name: 'Followers', exact: true }).click();
  await page.waitForURL(`**/u/${gus.user.username}/followers`);
  const followers = page.getByRole('region', { name: 'People following Gus Grissom' });
  await followers.getByRole('link', { name: /Hal Abelson/ }).waitFor();
  await page.reload();
  await followers.getByRole('link', { name: /Ida Noddack/ }).waitFor();
  await followers.getByRole('link', { name: /Jo Ann/ }).waitFor();

  await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Home' }).click();
  for (const n of [1, 2, 3]) await page.getByRole('article').filter({ hasText: `Gus post number ${n}` }).waitFor();

  // While Hal's home is open, Gus posts: it arrives live.
  await waitLive(page);
  await api.post(gus.token, 'Gus live after the follow');
  await page.getByRole('article').filter({ hasText: 'Gus live after the follow' }).waitFor();

  // Unfollowing empties it again.
  await page.goto(`/u/${gus.user.username}`);
  await page.getByRole('button', { name: 'Unfollow' }).click();
  await page.getByRole('button', { name: 'Follow', exact: true }).waitFor();
  await page.goto('/');
  await page.getByText('Your timeline is empty').waitFor();
});

e2e('a follow made in another tab refreshes an open home timeline (RESYNC)', () => env, async (t, scene) => {
  const { api } = env.stack;
  const oli = await api.signup(uniqueName('oli'));
  const pat = await api.signup(uniqueName('pat'));
  await api.post(oli.token, 'Oli wrote this before Pat followed');
  await api.post(pat.token, 'Pat is here');
  const page = await scene.page({ token: pat.token });
  await page.getByRole('article').filter({ hasText: 'Pat is here' }).waitFor();
  await waitLive(page);
  await page.evaluate(() => { window.notReloaded = true; });
  // "Live" means the socket is acknowledged, not that the server has set
  // up the subscription yet. A post that arrives through it proves that
  // (the subscription resumes after the first post, so it cannot miss it).
  await api.post(pat.token, 'Pat again');
  await page.getByRole('article').filter({ hasText: 'Pat again' }).waitFor();

  await api.follow(pat.token, oli.user.id); // the timeline is rewritten: RESYNC
  await page.getByRole('article').filter({ hasText: 'Oli wrote this before Pat followed' }).waitFor();
  assert.equal(await page.evaluate(() => window.notReloaded), true);
});

e2e('load more pages through older posts', () => env, async (t, scene) => {
  const { api } = env.stack;
  const kim = await api.signup(uniqueName('kim'));
  for (let n = 1; n <= 45; n++) await api.post(kim.token, `Kim's post #${n}`);

  const page = await scene.page({ path: `/u/${kim.user.username}` });
  const posts = page.getByRole('article');
  await posts.nth(19).waitFor();
  assert.equal(await posts.count(), 20);
  assert.match(await posts.first().innerText(), /#45\b/, 'newest first');
  assert.doesNotMatch(await page.locator('main').innerText(), /\b(null|undefined|false|NaN)\b/, 'no stray values on screen');

  const more = page.getByRole('button', { name: 'Load more' });
  await more.click();
  await posts.nth(39).waitFor();
  await more.click();
  await posts.nth(44).waitFor();
  await more.waitFor({ state: 'hidden' });
  await eventually(async () => (await posts.count()) === 45, { message: '45 posts' });
  assert.match(await posts.last().innerText(), /#1\b/, 'oldest last');
  const texts = await posts.allInnerTexts();
  assert.equal(new Set(texts.map((text) => text.match(/#(\d+)/)[1])).size, 45, 'no post twice');
});

e2e('an unknown profile says so, and unknown pages are not blank', () => env, async (t, scene) => {
  const page = await scene.page({ path: '/u/nobody_here_at_all' });
  await page.getByRole('heading', { name: 'This account doesn’t exist' }).waitFor();
  await page.goto('/no/such/page');
  await page.getByRole('heading', { name: 'Nothing here' }).waitFor();
  const res = await page.request.get('/no-such-file.js');
  assert.equal(res.status(), 404, 'missing files are real 404s');
});
