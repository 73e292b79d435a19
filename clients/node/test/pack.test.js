'use strict';
// `npm pack` bundles the proto (prepack), and the tarball, installed outside the checkout, loads
// that copy and talks to a server. The pack runs in a copy of the package laid out as in the
// checkout (clients/node beside ../../proto), so the working tree is never touched.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const { promisify } = require('node:util');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { startServer, REPO } = require('./helpers');

const run = promisify(execFile);
const PACKAGE = path.resolve(__dirname, '..');
const NPM = process.platform === 'win32' ? 'npm.cmd' : 'npm';

let server;
let tmp;

before(async () => {
  server = await startServer();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-pack-'));
});

after(async () => {
  await server?.stop();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

test('a packed tarball carries the proto and works outside the checkout', async () => {
  // The package's files, as `files` in package.json names them, plus package.json.
  const pkgDir = path.join(tmp, 'repo', 'clients', 'node');
  const manifest = JSON.parse(fs.readFileSync(path.join(PACKAGE, 'package.json'), 'utf8'));
  fs.mkdirSync(pkgDir, { recursive: true });
  for (const f of ['package.json', ...manifest.files.filter((f) => f !== 'proto/')]) {
    fs.cpSync(path.join(PACKAGE, f), path.join(pkgDir, f), { recursive: true });
  }
  const protoSrc = path.join(REPO, 'proto', 'sluice', 'v1', 'sluice.proto');
  fs.mkdirSync(path.join(tmp, 'repo', 'proto', 'sluice', 'v1'), { recursive: true });
  fs.copyFileSync(protoSrc, path.join(tmp, 'repo', 'proto', 'sluice', 'v1', 'sluice.proto'));

  const out = path.join(tmp, 'out');
  fs.mkdirSync(out);
  const env = { ...process.env, SLUICE_PROTO: '' }; // the checkout's layout, not an override
  const packed = await run(NPM, ['pack', '--json', '--pack-destination', out], { cwd: pkgDir, env });
  const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('[')));
  const tarball = path.join(out, info.filename);
  const files = info.files.map((f) => f.path).sort();
  assert.ok(files.includes('proto/sluice/v1/sluice.proto'), files.join(' '));
  for (const f of ['index.js', 'index.d.ts', 'lib/client.js', 'lib/express.js', 'package.json']) {
    assert.ok(files.includes(f), `${f} not in ${files.join(' ')}`);
  }
  assert.ok(!files.some((f) => f.startsWith('test/') || f.startsWith('node_modules/') || f.startsWith('bench/')),
    files.join(' '));
  assert.equal(fs.existsSync(path.join(pkgDir, 'proto')), false, 'postpack left the copy behind');

  // Installed in a directory with no sluice checkout around it.
  const app = path.join(tmp, 'app');
  fs.mkdirSync(app);
  fs.writeFileSync(path.join(app, 'package.json'), '{"name": "app", "private": true}\n');
  await run(NPM, ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error', tarball],
    { cwd: app, env });
  const script = `
    const sluice = require('sluice-client');
    (async () => {
      const client = new sluice.Client(process.argv[1], { timeout: 5 });
      const d = await client.check('rate10', 'packed');
      client.close();
      console.log(JSON.stringify({ proto: sluice.defaultProtoPath(), allowed: d.allowed, remaining: d.remaining }));
    })().catch((e) => { console.error(e); process.exit(1); });`;
  const result = await run(process.execPath, ['-e', script, server.grpcTarget], { cwd: app, env });
  const answer = JSON.parse(result.stdout);
  assert.equal(answer.proto, path.join(app, 'node_modules', 'sluice-client', 'proto', 'sluice', 'v1', 'sluice.proto'));
  assert.deepEqual({ allowed: answer.allowed, remaining: answer.remaining }, { allowed: true, remaining: 9 });
});

test('the proto path can be overridden, and a missing one is a clear error', () => {
  const sluice = require('..');
  const { defaultProtoPath } = sluice;
  const before = process.env.SLUICE_PROTO;
  try {
    process.env.SLUICE_PROTO = path.join(tmp, 'elsewhere.proto');
    assert.equal(defaultProtoPath(), path.join(tmp, 'elsewhere.proto'));
    assert.throws(() => new sluice.Client('127.0.0.1:1'), /elsewhere\.proto does not exist/);
    delete process.env.SLUICE_PROTO;
    assert.equal(defaultProtoPath(), path.join(REPO, 'proto', 'sluice', 'v1', 'sluice.proto'));
    const copy = path.join(tmp, 'copy.proto');
    fs.copyFileSync(defaultProtoPath(), copy);
    const c = new sluice.Client('127.0.0.1:1', { protoPath: copy });
    c.close();
    assert.throws(() => new sluice.Client('127.0.0.1:1', { protoPath: path.join(tmp, 'none.proto') }), /none\.proto/);
  } finally {
    if (before === undefined) delete process.env.SLUICE_PROTO;
    else process.env.SLUICE_PROTO = before;
  }
});
