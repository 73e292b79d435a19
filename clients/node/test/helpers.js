'use strict';
// A real `sluice serve` for a test file: free loopback ports, a config written to a temporary
// directory, ready once GET /healthz answers 200, stopped (SIGTERM, then SIGKILL) at the end.
// The binary is $SLUICE_BIN, else the test-default build of this checkout.

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const crypto = require('node:crypto');

const REPO = path.resolve(__dirname, '..', '..', '..');
const DEFAULT_BIN = path.join(REPO, 'build', 'test-default', 'apps', 'sluice', 'sluice');

function sluiceBin() {
  return process.env.SLUICE_BIN || DEFAULT_BIN;
}

// The policies the tests use. lease_ttl is long enough that no lease expires during a test:
// a lease back at in_flight 0 was released, not expired.
const CONFIG = `
server:
  lease_ttl: 20s
policies:
  # rate: 5 hits per key per minute, a fixed window (deterministic remaining counts)
  rate5:
    kind: rate
    strategy: fixed-window
    limit: 5
    period: 60s
  # rate: another fixed window, for all-or-nothing batches over two policies
  rate10:
    kind: rate
    strategy: fixed-window
    limit: 10
    period: 60s
  # rate: generous, for tests that must not be refused
  wide:
    kind: rate
    strategy: gcra
    limit: 100000
    period: 1s
    burst: 100000
  # concurrency: two calls at once
  pool2:
    kind: adaptive
    algorithm: fixed
    limit: 2
  # concurrency chained to a rate policy: its admits are refused 429 once rate5 is spent
  chained:
    kind: adaptive
    algorithm: fixed
    limit: 50
    rate: rate5
  # concurrency that never refuses in these tests
  big:
    kind: adaptive
    algorithm: fixed
    limit: 1000
  # tenant / upstream limits
  gateway:
    kind: concurrency
    tenants:
      - id: acme
        global_concurrency_limit: 3
    upstreams:
      - id: llm
        host: llm.internal
        owner: acme
        concurrency_limit:
          max_concurrent: 3
  # shadow: decides and counts, never refuses
  shadowpool:
    kind: adaptive
    algorithm: fixed
    limit: 1
    shadow: true
  shadow1:
    kind: rate
    strategy: fixed-window
    limit: 1
    period: 60s
    shadow: true
`;

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function httpGet(port, pathname, timeoutMs = 1000) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: pathname, timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// util-linux's setpriv makes the kernel kill the server if this process dies first.
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));

class SluiceServer {
  constructor(config = CONFIG) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-'));
    this.configPath = path.join(this.dir, 'sluice.yaml');
    fs.writeFileSync(this.configPath, config);
    this.logPath = path.join(this.dir, 'sluice.stderr.log');
    this.proc = null;
    this.exited = null;
    this.keepDir = false;
  }

  get grpcTarget() { return `127.0.0.1:${this.grpcPort}`; }

  log() {
    try { return fs.readFileSync(this.logPath, 'utf8'); } catch { return ''; }
  }

  async start(timeoutMs = 15000) {
    const bin = sluiceBin();
    try {
      fs.accessSync(bin, fs.constants.X_OK);
    } catch {
      throw new Error(`sluice binary not found or not executable: ${bin} (set SLUICE_BIN)`);
    }
    for (let attempt = 0; attempt < 3; attempt++) {
      this.grpcPort = await freePort();
      this.httpPort = await freePort();
      const args = ['serve', '--config', this.configPath, '--grpc', this.grpcTarget,
        '--http', `127.0.0.1:${this.httpPort}`];
      const [cmd, argv] = SETPRIV ? [SETPRIV, ['--pdeathsig', 'KILL', '--', bin, ...args]] : [bin, args];
      const log = fs.openSync(this.logPath, 'a');
      this.proc = spawn(cmd, argv, { stdio: ['ignore', 'ignore', log] });
      fs.closeSync(log);
      this.exited = new Promise((resolve) => this.proc.once('exit', (code, sig) => resolve(code ?? sig)));
      const killOnExit = () => { try { this.proc.kill('SIGKILL'); } catch { /* gone */ } };
      process.once('exit', killOnExit);
      if (await this._waitReady(timeoutMs)) return this;
      this.keepDir = true; // its log is read below
      await this.stop();
      this.keepDir = false;
      if (!this.log().includes('cannot listen')) break; // a port taken meanwhile: try again
    }
    const log = this.log();
    fs.rmSync(this.dir, { recursive: true, force: true });
    throw new Error(`sluice serve did not become ready; its log:\n${log}`);
  }

  async _waitReady(timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    let exited = false;
    this.exited.then(() => { exited = true; });
    while (Date.now() < deadline && !exited) {
      try {
        if ((await httpGet(this.httpPort, '/healthz', 500)).status === 200) return true;
      } catch { /* not listening yet */ }
      await sleep(20);
    }
    return false;
  }

  /** SIGTERM, then SIGKILL after `timeoutMs`; the temporary directory goes with it. */
  async stop(timeoutMs = 5000) {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGTERM');
      const t = setTimeout(() => this.proc.kill('SIGKILL'), timeoutMs);
      await this.exited;
      clearTimeout(t);
    }
    if (!this.keepDir) fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

async function startServer(config) {
  return new SluiceServer(config).start();
}

/**
 * One `sluice serve` for a test file: started before its tests, stopped after them, with the
 * tests' own client and whatever they push on `open` (anything with close()) closed first.
 */
function serverForFile(config) {
  const { before, after } = require('node:test');
  const { Client } = require('..');
  const shared = { server: null, client: null, open: [] };
  before(async () => {
    shared.server = await startServer(config);
    shared.client = new Client(shared.server.grpcTarget, { timeout: 5 });
  });
  after(async () => {
    for (const o of shared.open) o.close();
    shared.client?.close();
    await shared.server?.stop();
  });
  return shared;
}

/**
 * A Client of `target` whose releases are recorded in its `releases` (lease id, outcome, rtt...),
 * for an adapter to use; pushed on `open` to be closed with the test file.
 */
function recordingClient(target, open) {
  const { Client } = require('..');
  const c = new Client(target, { timeout: 5 });
  c.releases = [];
  const release = c.release.bind(c);
  c.release = (lease, options) => {
    c.releases.push({ leaseId: String(lease), ...options });
    return release(lease, options);
  };
  open.push(c);
  return c;
}

/** A key no other test uses. */
function uniqueKey(prefix = 'k') {
  return `${prefix}-${crypto.randomBytes(6).toString('hex')}`;
}

/** Polls `fn` until it returns something truthy (returned), or fails after `timeoutMs`. */
async function waitFor(fn, timeoutMs = 3000, what = 'condition') {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(10);
  }
}

module.exports = {
  CONFIG, REPO, SluiceServer, startServer, serverForFile, recordingClient, freePort, httpGet, sleep, uniqueKey, waitFor, sluiceBin,
};
