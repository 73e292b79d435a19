'use strict';
// index.d.ts: test/types-check.ts, written against the API as the README shows it, compiles
// under `tsc --strict`; its @ts-expect-error lines prove that wrong calls do not.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const { promisify } = require('node:util');
const path = require('node:path');

const run = promisify(execFile);
const PACKAGE = path.resolve(__dirname, '..');

test('the type declarations compile against their uses (tsc --strict)', async () => {
  const tsc = require.resolve('typescript/bin/tsc');
  const args = [tsc, '--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext',
    '--target', 'es2022', '--types', 'node', path.join('test', 'types-check.ts')];
  const result = await run(process.execPath, args, { cwd: PACKAGE }).catch((err) => err);
  assert.equal(result.code ?? 0, 0, `tsc failed:\n${result.stdout}${result.stderr}`);
});
