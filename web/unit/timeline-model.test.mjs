import { test } from 'node:test';
import assert from 'node:assert/strict';

import { TimelineModel } from '../static/js/timeline-model.js';

// Posts p1..pN written one second apart; higher is newer.
const post = (n) => ({ id: `p${n}`, body: `post ${n}`, createdAt: new Date(Date.UTC(2026, 10, 22, 12, 0, n)).toISOString() });
const edge = (n) => ({ cursor: `c${n}`, node: post(n) });
const page = (ns, hasNextPage = false) => ({
  edges: ns.map(edge),
  pageInfo: { hasNextPage, endCursor: ns.length ? `c${ns.at(-1)}` : null },
});
const added = (n) => ({ kind: 'POST_ADDED', cursor: `c${n}`, postId: `p${n}`, post: post(n) });
const removed = (n) => ({ kind: 'POST_REMOVED', cursor: `c${n}`, postId: `p${n}`, post: null });
const ids = (m) => m.items.map((i) => i.postId);

test('the first page sets the items, the resume cursor and the paging cursor', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([5, 4, 3], true));
  assert.deepEqual(ids(m), ['p5', 'p4', 'p3']);
  assert.equal(m.newestCursor, 'c5');
  assert.equal(m.endCursor, 'c3');
  assert.equal(m.hasNextPage, true);
});

test('an empty first page leaves no resume cursor', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([]));
  assert.equal(m.newestCursor, null);
  assert.equal(m.endCursor, null);
  assert.equal(m.hasNextPage, false);
});

test('POST_ADDED puts the post on top and moves the resume cursor', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([2, 1]));
  assert.equal(m.apply(added(3)), 'added');
  assert.deepEqual(ids(m), ['p3', 'p2', 'p1']);
  assert.equal(m.newestCursor, 'c3');
  assert.equal(m.items[0].live, true);
});

test('a replayed event for a post already shown changes nothing but the cursor', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([3, 2]));
  assert.equal(m.apply(added(3)), null);
  assert.deepEqual(ids(m), ['p3', 'p2']);
});

test('POST_REMOVED removes the post, and keeps it from coming back', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([3, 2, 1]));
  assert.equal(m.apply(removed(2)), 'removed');
  assert.deepEqual(ids(m), ['p3', 'p1']);
  assert.equal(m.apply(removed(2)), null, 'twice is nothing');
  assert.equal(m.newestCursor, 'c3', 'a removal does not move the resume cursor');
  m.setFirstPage(page([3, 2, 1])); // a page read before the delete
  assert.deepEqual(ids(m), ['p3', 'p1']);
  assert.equal(m.apply(added(2)), null);
});

test('RESYNC asks for a refetch and resumes from its cursor', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([2, 1]));
  assert.equal(m.apply({ kind: 'RESYNC', cursor: 'c9', postId: null, post: null }), 'resync');
  assert.equal(m.newestCursor, 'c9');
  m.beginRefetch();
  m.setFirstPage(page([9, 8, 2], true));
  assert.deepEqual(ids(m), ['p9', 'p8', 'p2']);
  assert.equal(m.newestCursor, 'c9', 'the page does not override the event cursor');
  assert.equal(m.endCursor, 'c2');
});

test('posts that arrive live during a refetch survive a page read before them', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([2, 1]));
  m.beginRefetch();
  m.apply(added(3));
  m.apply(added(4));
  m.setFirstPage(page([2, 1])); // the server answered before p3 and p4 existed
  assert.deepEqual(ids(m), ['p4', 'p3', 'p2', 'p1']);
  assert.equal(m.newestCursor, 'c4');
  // A later refetch drops them from the pending list: they are in its page.
  m.beginRefetch();
  m.setFirstPage(page([4, 3, 2]));
  assert.deepEqual(ids(m), ['p4', 'p3', 'p2']);
});

test('load more appends older posts without duplicates', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([6, 5, 4], true));
  m.apply(added(7));
  m.appendPage(page([4, 3, 2], true)); // overlaps by one
  assert.deepEqual(ids(m), ['p7', 'p6', 'p5', 'p4', 'p3', 'p2']);
  assert.equal(m.endCursor, 'c2');
  m.appendPage(page([1], false));
  assert.equal(m.hasNextPage, false);
  assert.equal(m.newestCursor, 'c7');
});

test('our own post shows at once and takes its cursor from its event', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([1]));
  assert.equal(m.addLocal(post(2)), true);
  assert.deepEqual(ids(m), ['p2', 'p1']);
  assert.equal(m.items[0].cursor, null);
  assert.equal(m.apply(added(2)), null);
  assert.equal(m.items[0].cursor, 'c2');
  assert.equal(m.newestCursor, 'c2');
});

test('a late event for an older post goes below newer posts', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([1]));
  m.addLocal(post(3));
  m.apply(added(2));
  assert.deepEqual(ids(m), ['p3', 'p2', 'p1']);
});

test('unknown event kinds are ignored', () => {
  const m = new TimelineModel();
  m.setFirstPage(page([1]));
  assert.equal(m.apply({ kind: 'POST_EDITED', cursor: 'c1', postId: 'p1' }), null);
  assert.deepEqual(ids(m), ['p1']);
});
