// graphql-http's audit of the GraphQL over HTTP specification, run against
// Warble's POST and GET /graphql. Every MUST has to pass; SHOULD and MAY
// results are printed for the record.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { auditServer } from 'graphql-http';
import { startWarble } from './harness.mjs';

let server;
before(async () => {
  server = await startWarble();
});
after(async () => {
  await server?.stop();
});

test('graphql-http audit: no MUST fails', async (t) => {
  const results = await auditServer({ url: server.url });
  assert.ok(results.length > 0, 'the audit ran no check');

  const line = (r) => `${r.status.toUpperCase()} ${r.id} ${r.name}${r.status === 'ok' ? '' : `: ${r.reason}`}`;
  const count = (level, status) => results.filter((r) => r.name.startsWith(level) && r.status === status).length;
  for (const level of ['MUST', 'SHOULD', 'MAY']) {
    const counts = ['ok', 'notice', 'warn', 'error'].map((status) => `${count(level, status)} ${status}`);
    t.diagnostic(`${level}: ${counts.join(', ')}`);
  }
  for (const r of results.filter((r) => r.status !== 'ok')) t.diagnostic(line(r));

  const failed = results.filter((r) => r.name.startsWith('MUST') && r.status === 'error');
  assert.deepEqual(failed.map(line), [], 'MUST checks of the GraphQL over HTTP spec failed');
});
