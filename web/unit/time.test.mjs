import { test } from 'node:test';
import assert from 'node:assert/strict';

import { relativeTime, exactTime } from '../static/js/time.js';

const now = new Date('2026-11-22T12:00:00.000Z');
const ago = (ms) => new Date(now.getTime() - ms);

test('relative times are short and round down past the first minute', () => {
  assert.equal(relativeTime(ago(0), now), 'now');
  assert.equal(relativeTime(ago(44_000), now), 'now');
  assert.equal(relativeTime(ago(-5_000), now), 'now', 'a clock slightly ahead is still now');
  assert.equal(relativeTime(ago(50_000), now), '1m');
  assert.equal(relativeTime(ago(5 * 60_000), now), '5m');
  assert.equal(relativeTime(ago(3 * 3600_000 + 59 * 60_000), now), '3h');
  assert.equal(relativeTime(ago(2 * 86400_000), now), '2d');
});

test('older posts show the date, with the year only when it differs', () => {
  assert.equal(relativeTime(new Date('2026-03-04T12:00:00Z'), now, 'en-US'), 'Mar 4');
  assert.equal(relativeTime(new Date('2024-03-04T12:00:00Z'), now, 'en-US'), 'Mar 4, 2024');
});

test('relativeTime takes the API\'s RFC 3339 strings', () => {
  assert.equal(relativeTime('2026-11-22T11:58:00.000Z', now), '2m');
});

test('exactTime spells out the date and time', () => {
  const text = exactTime('2026-11-22T07:03:01.123Z', 'en-US');
  assert.match(text, /November 2[12], 2026/);
  assert.match(text, /\d{1,2}:\d{2}/);
});
