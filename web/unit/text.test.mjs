import { test } from 'node:test';
import assert from 'node:assert/strict';

import { checkPost, postLength, trimLikeServer, tokenize, MAX_POST_LENGTH } from '../static/js/text.js';

test('length counts code points, not UTF-16 units', () => {
  assert.equal(postLength('hello'), 5);
  assert.equal(postLength('🐦'), 1); // two UTF-16 units
  assert.equal(postLength('👩‍💻'), 3); // woman, zero-width joiner, laptop: three code points
  assert.equal(postLength('é'), 1); // precomposed
  assert.equal(postLength('e\u0301'), 2); // e and a combining accent
});

test('surrounding whitespace is trimmed as Go strings.TrimSpace does', () => {
  assert.equal(trimLikeServer('  \t\nhi there \r\n'), 'hi there');
  assert.equal(trimLikeServer('\u00a0\u3000x\u2003'), 'x'); // no-break, ideographic and em spaces
  assert.equal(trimLikeServer('\u0085x\u0085'), 'x'); // Go trims NEL, JS trim() does not
  assert.equal(trimLikeServer('\ufeffx'), '\ufeffx'); // JS trim() trims the BOM, Go does not
  assert.equal(trimLikeServer('   '), '');
  assert.equal(trimLikeServer('a  b'), 'a  b');
});

test('checkPost: empty and whitespace-only drafts cannot be posted', () => {
  assert.equal(checkPost('').ok, false);
  assert.equal(checkPost(' \n\t ').ok, false);
  assert.equal(checkPost(' \n\t ').length, 0);
  assert.equal(checkPost('x').ok, true);
});

test('checkPost: 280 code points is fine, 281 is too long', () => {
  const at = '🐦'.repeat(MAX_POST_LENGTH);
  assert.deepEqual(checkPost(at), { ok: true, length: 280, remaining: 0, problem: null });
  const over = checkPost(`${at}!`);
  assert.equal(over.ok, false);
  assert.equal(over.remaining, -1);
  assert.equal(checkPost(`   ${at}   `).ok, true, 'trimmed spaces do not count');
});

test('checkPost: control characters other than newline and tab are refused', () => {
  assert.equal(checkPost('line\nnext\tcol').ok, true);
  const bell = checkPost('ding\u0007');
  assert.equal(bell.ok, false);
  assert.match(bell.problem, /cannot be posted/);
  assert.equal(checkPost('a\u2028b').ok, false);
});

test('tokenize finds links and mentions and leaves the rest as text', () => {
  assert.deepEqual(tokenize('hi @ada, see https://example.com/x?y=1. ok'), [
    { type: 'text', text: 'hi ' },
    { type: 'mention', text: '@ada', username: 'ada' },
    { type: 'text', text: ', see ' },
    { type: 'link', text: 'https://example.com/x?y=1', href: 'https://example.com/x?y=1' },
    { type: 'text', text: '. ok' },
  ]);
  assert.deepEqual(tokenize('@bob_1'), [{ type: 'mention', text: '@bob_1', username: 'bob_1' }]);
  assert.deepEqual(tokenize('mail me@example.com'), [{ type: 'text', text: 'mail me@example.com' }]);
  assert.deepEqual(tokenize('javascript:alert(1) <b>'), [{ type: 'text', text: 'javascript:alert(1) <b>' }]);
  assert.deepEqual(tokenize('@ab is too short'), [{ type: 'text', text: '@ab is too short' }]);
  assert.deepEqual(tokenize(''), []);
});
