import { test } from 'node:test';
import assert from 'node:assert/strict';

import { describeError } from '../static/js/errors.js';
import { GraphQLError } from '../static/js/graphql.js';

const err = (code, message = 'server says') => new GraphQLError(message, { code });

test('each Warble error code has its own clear sentence', () => {
  const codes = ['UNAUTHENTICATED', 'FORBIDDEN', 'NOT_FOUND', 'RATE_LIMITED', 'INTERNAL', 'NETWORK'];
  const sentences = codes.map((code) => describeError(err(code)));
  assert.equal(new Set(sentences).size, codes.length, 'no two codes share a sentence');
  for (const s of sentences) {
    assert.match(s, /^[A-Z].*\.$/, `"${s}" is a sentence`);
    assert.doesNotMatch(s, /server says/);
  }
  assert.match(describeError(err('RATE_LIMITED')), /wait/i);
  assert.match(describeError(err('UNAUTHENTICATED')), /log in/i);
  assert.match(describeError(err('NETWORK')), /cannot be reached/i);
});

test('BAD_USER_INPUT and CONFLICT show the server\'s sentence, which names the problem', () => {
  assert.equal(describeError(err('BAD_USER_INPUT', 'Username must be 3 to 20 characters.')), 'Username must be 3 to 20 characters.');
  assert.equal(describeError(err('CONFLICT', 'That username is taken.')), 'That username is taken.');
  assert.equal(describeError(err('CONFLICT', '')), 'That already exists.');
  assert.equal(describeError(err('BAD_USER_INPUT', '  ')), 'Please check what you entered.');
});

test('a screen can say what a code means for it', () => {
  const login = { UNAUTHENTICATED: 'Wrong username or password.' };
  assert.equal(describeError(err('UNAUTHENTICATED'), login), 'Wrong username or password.');
  assert.equal(describeError(err('INTERNAL'), login), describeError(err('INTERNAL')));
});

test('unknown codes and plain errors get a generic sentence, never internals', () => {
  assert.equal(describeError(err('GRAPHQL_VALIDATION_FAILED', 'Cannot query field "x"')), 'Something went wrong. Please try again.');
  assert.equal(describeError(new TypeError('x is undefined')), 'Something went wrong. Please try again.');
  assert.equal(describeError(undefined), 'Something went wrong. Please try again.');
});
