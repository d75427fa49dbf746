// npm test: builds Warble once, runs every *.test.mjs with node's test
// runner against that binary (WARBLE_BIN), and removes the build. Plain
// `node --test` works too, but then each test file builds Warble itself.
// Extra arguments go to node, e.g. `npm test -- --test-name-pattern=apollo`.

import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from './harness.mjs';

const dir = mkdtempSync(join(tmpdir(), 'warble-conformance-bin-'));
const cleanup = () => rmSync(dir, { recursive: true, force: true });
let code = 1;
try {
  const bin = join(dir, 'warble');
  console.log(`# building warble: go build -o ${bin} . (in ${repoRoot})`);
  execFileSync('go', ['build', '-o', bin, '.'], { cwd: repoRoot, stdio: 'inherit' });
  code = await new Promise((resolve) => {
    const child = spawn(process.execPath, ['--test', ...process.argv.slice(2)], {
      cwd: import.meta.dirname,
      env: { ...process.env, WARBLE_BIN: bin },
      stdio: 'inherit',
    });
    const forward = (sig) => child.kill(sig);
    process.on('SIGINT', forward);
    process.on('SIGTERM', forward);
    child.on('exit', (status, signal) => resolve(status ?? (signal ? 1 : 0)));
  });
} finally {
  cleanup();
}
process.exit(code);
