// The server goes away under an open page and comes back: the page
// reconnects by itself and shows what was posted while it was away,
// resuming from the last cursor it had shown. Once for a graceful stop
// (SIGTERM: the server completes the subscriptions and closes the sockets
// politely) and once for a crash (SIGKILL: the sockets just drop).

import assert from 'node:assert/strict';

import { e2e, useStack, uniqueName, waitLive } from './harness.mjs';

const env = useStack();

for (const [how, signal] of [['a graceful restart', 'SIGTERM'], ['a crash and restart', 'SIGKILL']]) {
  e2e(`a page recovers from ${how} and shows the posts it missed`, () => env, async (t, scene) => {
    const { stack } = env;
    const lea = await stack.api.signup(uniqueName('lea'), { displayName: 'Lea Rabin' });
    const max = await stack.api.signup(uniqueName('max'), { displayName: 'Max Born' });
    const nia = await stack.api.signup(uniqueName('nia'));
    await stack.api.follow(lea.token, max.user.id);
    await stack.api.post(max.token, `Before the restart ${signal}`);

    const home = await scene.page({ token: lea.token });
    // Nia has not posted: this page has no cursor to resume from.
    const empty = await scene.page({ path: `/u/${nia.user.username}` });
    await home.getByRole('article').filter({ hasText: 'Before the restart' }).waitFor();
    await empty.getByText('has not posted yet').waitFor();
    for (const page of [home, empty]) {
      await waitLive(page);
      await page.evaluate(() => { window.notReloaded = true; });
    }

    await stack.killServer(signal);
    for (const page of [home, empty]) {
      await page.getByRole('status', { name: 'Connection' }).filter({ hasText: 'Offline' }).waitFor();
    }

    // Posts are written while the pages cannot hear about them, through a
    // second server on the same Redis.
    await stack.withOtherServer(async (api) => {
      await api.post(max.token, 'Written while you were away, first');
      await api.post(max.token, 'Written while you were away, second');
      await api.post(nia.token, 'Nia, first post, while you were away');
    });

    await stack.startServer();
    // By itself: nothing here asks the pages to reconnect or reload.
    for (const page of [home, empty]) await waitLive(page);
    await empty.getByRole('article').filter({ hasText: 'Nia, first post' }).waitFor();
    await home.getByRole('article').filter({ hasText: 'Written while you were away, second' }).waitFor();
    await home.getByRole('article').filter({ hasText: 'Written while you were away, first' }).waitFor();
    const texts = await home.getByRole('article').allInnerTexts();
    const order = ['second', 'first', 'Before the restart'].map((s) => texts.findIndex((text) => text.includes(s)));
    assert.deepEqual(order, [0, 1, 2], 'the missed posts, newest first, above the old one');
    assert.equal(texts.length, 3, 'each post once');
    for (const page of [home, empty]) {
      assert.equal(await page.evaluate(() => window.notReloaded), true, 'recovered without a reload');
    }

    // And live again.
    await stack.api.post(max.token, 'After the restart');
    await home.getByRole('article').filter({ hasText: 'After the restart' }).waitFor();
  });
}
