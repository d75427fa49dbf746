// The server goes away under an open page and comes back: the page
// reconnects by itself and shows what was posted while it was away,
// resuming from the last cursor it had shown.

import { before, after } from 'node:test';
import assert from 'node:assert/strict';

import { e2e, startStack, launchBrowser, uniqueName, waitLive } from './harness.mjs';

const env = {};
before(async () => {
  env.stack = await startStack();
  env.browser = await launchBrowser();
});
after(async () => {
  await env.browser?.close();
  await env.stack?.close();
});

e2e('a page recovers from a server restart and shows the posts it missed', () => env, async (t, scene) => {
  const { stack } = env;
  const lea = await stack.api.signup(uniqueName('lea'), { displayName: 'Lea Rabin' });
  const max = await stack.api.signup(uniqueName('max'), { displayName: 'Max Born' });
  await stack.api.follow(lea.token, max.user.id);
  await stack.api.post(max.token, 'Before the restart');

  const home = await scene.page({ token: lea.token });
  const explore = await scene.page({ path: '/explore' });
  for (const page of [home, explore]) {
    await page.getByRole('article').filter({ hasText: 'Before the restart' }).waitFor();
    await waitLive(page);
    await page.evaluate(() => { window.notReloaded = true; });
  }

  await stack.killServer();
  for (const page of [home, explore]) {
    await page.getByRole('status').filter({ hasText: 'Reconnecting' }).waitFor();
  }

  // Posts are written while the pages cannot hear about them, through a
  // second server on the same Redis.
  await stack.withOtherServer(async (api) => {
    await api.post(max.token, 'Written while you were away, first');
    await api.post(max.token, 'Written while you were away, second');
  });

  await stack.startServer();
  for (const page of [home, explore]) {
    await waitLive(page); // by itself: nothing here asks it to
    await page.getByRole('article').filter({ hasText: 'Written while you were away, second' }).waitFor();
    const texts = await page.getByRole('article').allInnerTexts();
    const order = ['second', 'first', 'Before the restart'].map((s) => texts.findIndex((text) => text.includes(s)));
    assert.deepEqual(order, [0, 1, 2], 'the missed posts, newest first, above the old one, each once');
    assert.equal(texts.length, 3);
    assert.equal(await page.evaluate(() => window.notReloaded), true, 'recovered without a reload');
  }

  // And live again.
  await stack.api.post(max.token, 'After the restart');
  for (const page of [home, explore]) {
    await page.getByRole('article').filter({ hasText: 'After the restart' }).waitFor();
  }
});
