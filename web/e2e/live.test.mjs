// Live timelines: what one person posts or deletes shows up for another
// without a reload.

import assert from 'node:assert/strict';

import { e2e, useStack, uniqueName, waitLive, eventually } from './harness.mjs';

const env = useStack();

e2e('a post appears in another browser without reload', () => env, async (t, scene) => {
  const { api } = env.stack;
  const ada = await api.signup(uniqueName('ada'), { displayName: 'Ada Lovelace' });
  const bob = await api.signup(uniqueName('bob'), { displayName: 'Bob Marley' });
  await api.follow(bob.token, ada.user.id);
  await api.post(ada.token, 'An older post, so both timelines have a cursor to resume from');

  const adaPage = await scene.page({ token: ada.token });
  const bobPage = await scene.page({ token: bob.token });
  for (const page of [adaPage, bobPage]) {
    await page.getByRole('article').filter({ hasText: 'An older post' }).waitFor();
    await waitLive(page);
  }
  await bobPage.evaluate(() => { window.notReloaded = true; });

  // The composer counts what the server will count and guards Post.
  const composer = adaPage.getByLabel("What's happening?");
  const post = adaPage.getByRole('button', { name: 'Post', exact: true });
  assert.equal(await post.isDisabled(), true, 'Post is disabled when empty');
  await composer.fill('   ');
  assert.equal(await post.isDisabled(), true, 'whitespace alone is empty');
  await composer.fill('🐦'.repeat(281));
  await adaPage.getByText('281 / 280').waitFor();
  assert.equal(await post.isDisabled(), true, 'Post is disabled when too long');
  await composer.fill(`  ${'🐦'.repeat(280)}  `);
  await adaPage.getByText('280 / 280').waitFor();
  assert.equal(await post.isEnabled(), true);

  const body = `Hello from Ada ${Date.now()}`;
  await composer.fill(body);
  await post.click();
  await adaPage.getByRole('article').filter({ hasText: body }).waitFor();
  assert.equal(await composer.inputValue(), '', 'the composer is cleared');

  const arrived = bobPage.getByRole('article').filter({ hasText: body });
  await arrived.waitFor();
  const first = bobPage.getByRole('article').first();
  assert.match(await first.innerText(), new RegExp(body), 'the new post is at the top');
  assert.equal(await bobPage.evaluate(() => window.notReloaded), true, 'no reload happened');

  // Relative time, with the exact time on hover.
  const time = arrived.locator('time');
  assert.match(await time.getAttribute('datetime'), /^\d{4}-\d\d-\d\dT/);
  assert.ok((await time.getAttribute('title')).length > 8);
  assert.equal((await time.innerText()).trim(), 'now');

  // Also posted by keyboard alone: Ctrl+Enter in the composer.
  await composer.focus();
  await adaPage.keyboard.type('Typed and sent with the keyboard');
  await adaPage.keyboard.press('Control+Enter');
  await bobPage.getByRole('article').filter({ hasText: 'Typed and sent with the keyboard' }).waitFor();
});

e2e('deleting a post asks first and removes it live for everyone', () => env, async (t, scene) => {
  const { api } = env.stack;
  const cy = await api.signup(uniqueName('cy'), { displayName: 'Cy Twombly' });
  const dee = await api.signup(uniqueName('dee'));
  await api.post(cy.token, 'Keep this one');
  await api.post(cy.token, 'Delete this one');

  const cyPage = await scene.page({ token: cy.token, path: `/u/${cy.user.username}` });
  const deePage = await scene.page({ token: dee.token, path: '/explore' });
  const onCy = cyPage.getByRole('article').filter({ hasText: 'Delete this one' });
  const onDee = deePage.getByRole('article').filter({ hasText: 'Delete this one' });
  await onCy.waitFor();
  await onDee.waitFor();
  await waitLive(cyPage);
  await waitLive(deePage);
  // Deletions are not replayed on resume, so make sure both subscriptions
  // are set up on the server: a post through them proves it.
  await api.post(cy.token, 'Subscriptions are up');
  await cyPage.getByRole('article').filter({ hasText: 'Subscriptions are up' }).waitFor();
  await deePage.getByRole('article').filter({ hasText: 'Subscriptions are up' }).waitFor();

  // Only the author gets a Delete button.
  assert.equal(await onDee.getByRole('button', { name: 'Delete' }).count(), 0);

  // Cancel keeps the post.
  await onCy.getByRole('button', { name: 'Delete' }).click();
  const dialog = cyPage.getByRole('dialog', { name: 'Delete this post?' });
  await dialog.waitFor();
  await dialog.getByRole('button', { name: 'Cancel' }).click();
  await dialog.waitFor({ state: 'detached' });
  assert.equal(await onCy.count(), 1);

  // Confirming deletes it, here and in the other browser.
  await onCy.getByRole('button', { name: 'Delete' }).click();
  await dialog.getByRole('button', { name: 'Delete' }).click();
  await onCy.waitFor({ state: 'detached' });
  await cyPage.getByRole('status').filter({ hasText: 'Post deleted.' }).waitFor();
  assert.equal(await cyPage.getByRole('alert').filter({ hasText: 'Post deleted.' }).count(), 0, 'a deletion is not an alert');
  await onDee.waitFor({ state: 'detached' });
  await cyPage.getByText('2 posts', { exact: true }).waitFor();
  assert.equal(await deePage.getByRole('article').filter({ hasText: 'Keep this one' }).count(), 1);
});

e2e('the connection indicator is a status element that says Live', () => env, async (t, scene) => {
  const page = await scene.page({ path: '/explore' });
  await waitLive(page);
  const status = page.getByRole('status', { name: 'Connection' });
  assert.equal(await status.count(), 1);
  await eventually(async () => (await status.getAttribute('data-state')) === 'live');
});

/** Presses Tab until `matches(activeElement)` holds, at most `max` times. */
async function tabTo(page, matches, max = 40) {
  for (let i = 0; i < max; i++) {
    await page.keyboard.press('Tab');
    if (await page.evaluate(matches)) return;
  }
  throw new Error(`no focusable element matched ${matches} within ${max} Tabs`);
}

e2e('keyboard only: skip to content, post, and delete with confirmation', () => env, async (t, scene) => {
  const { api } = env.stack;
  const kay = await api.signup(uniqueName('kay'));
  await api.post(kay.token, 'An earlier post by Kay');
  const page = await scene.page({ token: kay.token });
  await page.getByRole('article').first().waitFor();
  await waitLive(page);

  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
  await page.keyboard.press('Enter');
  await tabTo(page, () => document.activeElement.matches('textarea'));
  await page.keyboard.type('Written without a mouse');
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Post');
  await page.keyboard.press('Enter');
  const post = page.getByRole('article').filter({ hasText: 'Written without a mouse' });
  await post.waitFor();

  await tabTo(page, () => document.activeElement.textContent === 'Delete'
    && document.activeElement.closest('article').textContent.includes('Written without a mouse'));
  await page.keyboard.press('Enter');
  const dialog = page.getByRole('dialog', { name: 'Delete this post?' });
  await dialog.waitFor();
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Cancel', 'a stray Enter cancels');
  await page.keyboard.press('Escape');
  await dialog.waitFor({ state: 'detached' });
  assert.equal(await post.count(), 1, 'Escape keeps the post');

  await tabTo(page, () => document.activeElement.textContent === 'Delete'
    && document.activeElement.closest('article').textContent.includes('Written without a mouse'));
  await page.keyboard.press('Enter');
  await dialog.waitFor();
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Delete');
  await page.keyboard.press('Enter');
  await post.waitFor({ state: 'detached' });
  await page.getByRole('article').filter({ hasText: 'An earlier post by Kay' }).waitFor();
});
