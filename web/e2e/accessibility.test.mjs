// axe-core on every screen of the app, empty and full, at desktop and phone
// width, each in the light and the dark theme. A serious or critical finding
// fails the test with the rule, its impact and the elements that break it.

import { e2e, useStack, uniqueName, waitLive, expectAccessible } from './harness.mjs';

const env = useStack();

const phone = { width: 390, height: 844 };

/** Three people who follow each other and have written a little. */
async function community(api) {
  const rosa = await api.signup(uniqueName('rosa'), { displayName: 'Rosalind Franklin' });
  const carl = await api.signup(uniqueName('carl'), { displayName: 'Carl Sagan' });
  const mae = await api.signup(uniqueName('mae'), { displayName: 'Mae Jemison' });
  for (const [who, whom] of [[rosa, carl], [rosa, mae], [carl, rosa], [mae, rosa], [mae, carl]]) {
    await api.follow(who.token, whom.user.id);
  }
  await api.post(carl.token, 'The cosmos is within us. We are made of star-stuff.');
  await api.post(mae.token, `Back from orbit; @${rosa.user.username}, the view is worth it. https://example.com/orbit`);
  await api.post(rosa.token, 'Photo 51 is developed. Look at that cross.');
  return { rosa, carl, mae };
}

e2e('signed-out screens are accessible', () => env, async (t, scene) => {
  const { carl } = await community(env.stack.api);
  const page = await scene.page({ path: '/login' });
  await page.getByLabel('Username').waitFor();
  await expectAccessible(page, 'the login screen');

  await page.goto('/signup');
  await page.getByLabel('Display name').waitFor();
  await expectAccessible(page, 'the sign-up screen');

  // A refused login shows its error in the form.
  await page.goto('/login');
  await page.getByLabel('Username').fill(carl.user.username);
  await page.getByLabel('Password').fill('not the password');
  await page.getByRole('button', { name: 'Log in' }).click();
  await page.getByRole('alert').filter({ hasText: 'do not match' }).waitFor();
  await expectAccessible(page, 'the login screen with an error');

  await page.goto('/explore');
  await page.getByRole('article').first().waitFor();
  await waitLive(page);
  await expectAccessible(page, 'explore, signed out');

  await page.goto(`/u/${carl.user.username}`);
  await page.getByRole('article').first().waitFor();
  await expectAccessible(page, 'a profile, signed out');

  await page.goto('/no/such/page');
  await page.getByRole('heading', { name: 'Nothing here' }).waitFor();
  await expectAccessible(page, 'the not-found screen');

  const small = await scene.page({ path: '/signup', viewport: phone });
  await small.getByLabel('Display name').waitFor();
  await expectAccessible(small, 'the sign-up screen at phone width');
});

e2e('a newcomer’s empty screens are accessible', () => env, async (t, scene) => {
  await community(env.stack.api);
  const zoe = await env.stack.api.signup(uniqueName('zoe'), { displayName: 'Zoe Newcomer' });
  const page = await scene.page({ token: zoe.token });
  await page.getByLabel("What's happening?").waitFor();
  await page.getByText('Your timeline is empty').waitFor();
  await waitLive(page);
  await expectAccessible(page, 'a newcomer’s empty home');

  const profile = `/u/${zoe.user.username}`;
  await page.goto(profile);
  await page.getByText('You have not posted yet').waitFor();
  await expectAccessible(page, 'a newcomer’s own empty profile');

  for (const [tab, says] of [['followers', 'Nobody follows you yet'], ['following', 'You do not follow anyone yet']]) {
    await page.goto(`${profile}/${tab}`);
    await page.getByRole('heading', { name: says }).waitFor();
    await expectAccessible(page, `a newcomer’s empty ${tab} list`);
  }

  const small = await scene.page({ token: zoe.token, viewport: phone });
  await small.getByText('Your timeline is empty').waitFor();
  await waitLive(small);
  await expectAccessible(small, 'a newcomer’s empty home at phone width');
});

e2e('full screens are accessible', () => env, async (t, scene) => {
  const { rosa, carl } = await community(env.stack.api);
  const nobody = await env.stack.api.signup(uniqueName('quiet'));
  const page = await scene.page({ token: rosa.token });
  await page.getByRole('article').nth(2).waitFor();
  await waitLive(page);
  await expectAccessible(page, 'a full home');

  // The composer with text in it, and with too much.
  await page.getByLabel("What's happening?").fill('x'.repeat(290));
  await page.getByText('290 / 280').waitFor();
  await expectAccessible(page, 'home with an over-long draft');
  await page.getByLabel("What's happening?").fill('');

  // The delete dialog.
  await page.getByRole('article').filter({ hasText: 'Photo 51' }).getByRole('button', { name: 'Delete' }).click();
  const dialog = page.getByRole('dialog', { name: 'Delete this post?' });
  await dialog.waitFor();
  await expectAccessible(page, 'the delete dialog');
  await dialog.getByRole('button', { name: 'Cancel' }).click();
  await dialog.waitFor({ state: 'detached' });

  await page.goto('/explore');
  await page.getByRole('article').nth(2).waitFor();
  await page.getByRole('region', { name: 'New on Warble' }).getByRole('listitem').nth(2).waitFor();
  await waitLive(page);
  await expectAccessible(page, 'explore');

  await page.goto(`/u/${carl.user.username}`);
  await page.getByRole('article').first().waitFor();
  await page.getByRole('button', { name: 'Unfollow' }).waitFor();
  await expectAccessible(page, 'a full profile');

  for (const tab of ['followers', 'following']) {
    await page.goto(`/u/${carl.user.username}/${tab}`);
    await page.locator('.user-list[aria-busy="false"] li').first().waitFor();
    await expectAccessible(page, `a ${tab} list`);
  }

  await page.goto(`/u/${nobody.user.username}`);
  await page.getByText('has not posted yet').waitFor();
  await expectAccessible(page, 'someone else’s empty profile');

  const small = await scene.page({ token: rosa.token, viewport: phone });
  await small.getByRole('article').nth(2).waitFor();
  await waitLive(small);
  await expectAccessible(small, 'a full home at phone width');
  await small.goto(`/u/${carl.user.username}`);
  await small.getByRole('button', { name: 'Unfollow' }).waitFor();
  await expectAccessible(small, 'a profile at phone width');
  await small.goto('/explore');
  await small.getByRole('article').nth(2).waitFor();
  await expectAccessible(small, 'explore at phone width');
});
