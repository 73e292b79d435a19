// The /ui page of `sluice serve` in headless Chromium (Debian's chromium, driven by
// puppeteer-core): served by a real server on the default config (with an admin token added),
// the page loads with no console error, shows every policy of that config with its kind, its
// charts move when load is applied (leases held on `small`, refusals past its limit), and the
// admin actions work only with the token. SLUICE_BIN names the server binary;
// SLUICE_UI_SCREENSHOT, if set, is where a screenshot of the loaded page is written.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync, rmSync, openSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
const binary = process.env.SLUICE_BIN || join(root, 'build', 'test-default', 'apps', 'sluice', 'sluice');
const chromium = process.env.SLUICE_CHROMIUM || '/usr/bin/chromium';
const TOKEN = 'ui-test-token';

let dir, server, browser, page, base;
const problems = []; // console errors, page errors, failed requests

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function waitFor(what, predicate, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await predicate();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${last})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function api(method, path, body, headers = {}) {
  const r = await fetch(base + path, {
    method, headers: { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

// The policy names config/default.yaml declares (two-space keys under `policies:`).
function defaultPolicyNames() {
  const names = [];
  let inPolicies = false;
  for (const line of readFileSync(join(root, 'config', 'default.yaml'), 'utf8').split('\n')) {
    if (/^\S/.test(line)) inPolicies = line.startsWith('policies:');
    const m = inPolicies && /^ {2}([A-Za-z0-9_.-]+):\s*$/.exec(line);
    if (m) names.push(m[1]);
  }
  return names;
}

// What the chart series named `series` in the card of `policy` (or the overview) shows last.
function lastOf(policy, series) {
  return page.evaluate((policy, series) => {
    const scope = policy ? document.querySelector(`[data-policy="${policy}"]`)
                         : document.getElementById('overview');
    const line = scope && scope.querySelector(`polyline[data-series="${series}"]`);
    return line ? Number(line.getAttribute('data-last')) : null;
  }, policy, series);
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sluice-ui-'));
  const config = readFileSync(join(root, 'config', 'default.yaml'), 'utf8')
    .replace(/^server:\n/m, `server:\n  admin_token: ${TOKEN}\n`);
  assert.match(config, /admin_token/, 'config/default.yaml has no server: section to extend');
  writeFileSync(join(dir, 'sluice.yaml'), config);
  const [grpc, http] = [await freePort(), await freePort()];
  base = `http://127.0.0.1:${http}`;
  const log = openSync(join(dir, 'server.log'), 'w');
  server = spawn(binary, ['serve', '--config', join(dir, 'sluice.yaml'), '--grpc',
                          `127.0.0.1:${grpc}`, '--http', `127.0.0.1:${http}`],
                 { stdio: ['ignore', log, log] });
  await waitFor('the server to answer /healthz', async () => (await fetch(base + '/healthz')).ok);
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    userDataDir: join(dir, 'chromium'),
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync',
           '--disable-dev-shm-usage'],
  });
  page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 1000 });
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  page.on('dialog', (d) => d.dismiss());
});

after(async () => {
  if (browser) await browser.close();
  if (server) {
    server.kill('SIGTERM');
    await new Promise((r) => (server.exitCode !== null ? r() : server.once('exit', r)));
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test('the page loads and shows every policy of the default config', async () => {
  const r = await page.goto(base + '/ui/', { waitUntil: 'load' });
  assert.equal(r.status(), 200);
  assert.match(r.headers()['content-security-policy'], /default-src 'self'/);
  const served = (await api('GET', '/v1/policies')).body.policies;
  const names = defaultPolicyNames();
  assert.ok(names.length >= 5, `config/default.yaml's policies: ${names}`);
  assert.deepEqual(served.map((p) => p.name).sort(), [...names].sort());
  await waitFor('a card per policy', () => page.evaluate(
    (n) => document.querySelectorAll('[data-policy]').length === n, names.length));
  for (const p of served) {
    const kind = await page.$eval(`[data-policy="${p.name}"]`, (e) => e.getAttribute('data-kind'));
    assert.equal(kind, p.kind, p.name);
  }
  await waitFor('the live status', () => page.$eval('#status', (e) => e.textContent === 'live'));
  // Kind-specific parts: the cascade's nodes, the throttler's metrics against their thresholds.
  const cascade = served.find((p) => p.kind === 'cascade');
  if (cascade)
    assert.equal(await page.$$eval(`[data-policy="${cascade.name}"] tr[data-node]`, (r) => r.length),
                 cascade.nodes.length);
  const throttler = served.find((p) => p.kind === 'throttler');
  if (throttler)
    for (const m of throttler.metrics)
      assert.notEqual(await lastOf(throttler.name, `${m.name} / threshold`), null, m.name);
  assert.equal(await lastOf('inventory', 'L_global'), served.find((p) => p.name === 'inventory').l_global);
  assert.deepEqual(problems, []);
});

test('charts move when load is applied', async () => {
  assert.equal(await lastOf('small', 'in flight'), 0);
  assert.equal(await lastOf('small', 'limit'), 10);
  const leases = [];
  for (let i = 0; i < 4; i++) {
    const r = await api('POST', '/v1/admit', { policy: 'small', key: 'ui' });
    assert.equal(r.body.admitted, true, JSON.stringify(r.body));
    leases.push(r.body.lease_id);
  }
  await waitFor('in flight 4 on the chart', async () => (await lastOf('small', 'in flight')) === 4);
  // Past the limit: 10 in flight, then refusals, which the overview counts per second.
  for (let i = 0; i < 6; i++) leases.push((await api('POST', '/v1/admit', { policy: 'small', key: 'ui' })).body.lease_id);
  for (let i = 0; i < 20; i++) assert.equal((await api('POST', '/v1/admit', { policy: 'small', key: 'ui' })).status, 503);
  await waitFor('refusals on the overview', async () => (await lastOf(null, 'refused_by_limit')) > 0);
  for (const id of leases) assert.equal((await api('POST', '/v1/release', { lease_id: id })).body.released, true);
  await waitFor('in flight back to 0', async () => (await lastOf('small', 'in flight')) === 0);
  if (process.env.SLUICE_UI_SCREENSHOT) {
    // Some traffic on the rate policies, so the picture shows the charts at work.
    for (let i = 0; i < 40; i++) await api('POST', '/v1/check', { policy: 'api-rate', key: 'ui' });
    await new Promise((r) => setTimeout(r, 1500));
    await page.screenshot({ path: process.env.SLUICE_UI_SCREENSHOT, fullPage: true });
  }
  assert.deepEqual(problems, []);
});

test('admin actions need the admin token', async () => {
  const message = () => page.$eval('#admin-message', (e) => e.textContent);
  await page.click('#reload');
  await waitFor('the refusal', async () => /reload: HTTP 401/.test(await message()));
  await page.type('#token', TOKEN);
  await page.click('#reload');
  await waitFor('the reload', async () => /reload: done/.test(await message()));
  // Throttle an app on the throttler, see its rule listed, then lift it from the page.
  const db = 'db';
  await page.type(`[data-policy="${db}"] form[data-action="throttle"] input[name="app"]`, 'purge');
  await page.click(`[data-policy="${db}"] form[data-action="throttle"] button[type="submit"]`);
  await waitFor('the rule on the page', () => page.$(`[data-policy="${db}"] tr[data-rule="purge"]`));
  const rules = (await api('GET', '/throttler/throttled-apps?shard=db')).body;
  assert.ok(rules.apps.purge, JSON.stringify(rules));
  await page.click(`[data-policy="${db}"] tr[data-rule="purge"] button`);
  await waitFor('the rule gone', async () => !(await page.$(`[data-policy="${db}"] tr[data-rule="purge"]`)));
  assert.equal((await api('GET', '/throttler/throttled-apps?shard=db')).body.apps.purge, undefined);
  // The refusal above is the one expected console message Chromium logs for a 401 response.
  const unexpected = problems.filter((p) => !/status of 401/.test(p));
  assert.deepEqual(unexpected, []);
});
