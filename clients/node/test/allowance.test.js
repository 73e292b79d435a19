'use strict';
// A rate policy's hits taken in blocks and spent in the middleware (lib/allowance.js,
// express({ allowance })): the rules on a clock of the test's own, then the middleware in front
// of a real `sluice serve`: most requests admitted without a check, none past the limit.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const sluice = require('..');
const { Allowances } = require('../lib/allowance');
const { serverForFile, uniqueKey } = require('./helpers');

const allowed = (remaining, limit = 100) => new sluice.Decision({
  allowed: true, limit, remaining, resetAfter: 1, retryAfter: 0,
});
const refused = (retryAfter, remaining = 0) => new sluice.Decision({
  allowed: false, limit: 100, remaining, resetAfter: 1, retryAfter,
});

test('a granted block is spent here until its hold ends', () => {
  const a = new Allowances(10, 0.5);
  assert.equal(a.local('k', 1, 0), null);
  assert.equal(a.ask('k', 1), 10);
  assert.equal(a.answered('k', 10, 1, allowed(90), 0), null);
  assert.equal(a.held('k'), 9);
  for (let i = 0; i < 9; i += 1) {
    const d = a.local('k', 1, 0.1);
    assert.ok(d && d.allowed);
    assert.equal(d.remaining, 90 + 8 - i);
  }
  assert.equal(a.local('k', 1, 0.1), null);
  assert.equal(a.answered('k', 10, 1, allowed(80), 0.2), null);
  assert.ok(a.local('k', 1, 0.69));
  assert.equal(a.local('k', 1, 0.7), null); // 0.5 s after the grant: the rest is dropped
  assert.deepEqual(a.stats, { localAdmits: 10, localRefusals: 0, blocksGranted: 2, blocksRefused: 0, hitsDropped: 8 });
});

test('a refused block asks for what remains or the request\'s own hits', () => {
  const a = new Allowances(10, 1);
  assert.equal(a.answered('k', 10, 1, refused(0.5, 4), 0), 4);
  assert.equal(a.answered('k', 4, 1, allowed(0), 0), null);
  assert.equal(a.held('k'), 3);
  assert.equal(a.answered('k', 10, 3, refused(0.5, 2), 0), 3);
  const reason = new sluice.Decision({ ...refused(0.5, 4), reason: 'budget_spent' });
  assert.equal(a.answered('k', 10, 1, reason, 0), 1);
  const shadow = new sluice.Decision({ ...allowed(50), wouldDeny: true });
  assert.equal(a.answered('s', 10, 1, shadow, 0), 1); // nothing debited: nothing held
  assert.equal(a.held('s'), 0);
});

test('a refusal is repeated here until its retryAfter; one that never passes is not', () => {
  const a = new Allowances(10, 1);
  assert.equal(a.answered('k', 1, 1, refused(0.5), 0), null);
  const d = a.local('k', 1, 0.2);
  assert.equal(d.allowed, false);
  assert.ok(Math.abs(d.retryAfter - 0.3) < 1e-9);
  assert.equal(a.local('k', 1, 0.5), null);
  assert.equal(a.answered('n', 1, 1, refused(null), 0), null);
  assert.equal(a.local('n', 1, 0), null);
});

test('keys past maxKeys are asked every time until the expired are forgotten', () => {
  const a = new Allowances(10, 1, 2);
  a.answered('a', 10, 1, allowed(90), 0);
  a.answered('b', 10, 1, allowed(90), 0);
  assert.equal(a.answered('c', 10, 1, allowed(90), 0.5), null);
  assert.equal(a.held('c'), 0);
  assert.equal(a.answered('c', 10, 1, allowed(90), 2), null);
  assert.equal(a.keys.size, 1);
  assert.equal(a.held('c'), 9);
});

test('settings that cannot work are refused naming the option', () => {
  for (const bad of [0, -1, 1.5, '10']) assert.throws(() => new Allowances(bad), /allowance: must be/);
  for (const bad of [0, -0.1, '1', Infinity]) assert.throws(() => new Allowances(10, bad), /allowanceHold: must be/);
  const client = new sluice.Client('127.0.0.1:1');
  assert.throws(() => sluice.express({ client, policy: 'p', mode: 'admit', allowance: 5 }), /allowance: only a rate policy/);
  client.close();
});

// ---- the middleware on a real server ----

const shared = serverForFile();
const { open } = shared;

async function serve(mw) {
  const app = express();
  app.calls = 0;
  app.use(mw);
  app.get('/ok', (req, res) => { app.calls += 1; res.send('ok'); });
  app.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
    res.status(500).json({ error: err.name, message: err.message });
  });
  const srv = http.createServer(app);
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  open.push({ close: () => { srv.closeAllConnections(); srv.close(); } });
  app.port = srv.address().port;
  return app;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
open.push({ close: () => agent.destroy() });

function get(port) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: '/ok', agent }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers }));
    }).on('error', reject);
  });
}

test('the middleware admits most requests here and never past the limit', async () => {
  const key = uniqueKey('allowance');
  const mwClient = new sluice.Client(shared.server.grpcTarget, { timeout: 5 });
  open.push(mwClient);
  let checks = 0;
  const check = mwClient.check.bind(mwClient);
  mwClient.check = (...args) => { checks += 1; return check(...args); };
  // rate10: a fixed window of 10 a minute; blocks of 4, spent within a minute.
  const app = await serve(sluice.express({ client: mwClient, policy: 'rate10', key: () => key, allowance: 4, allowanceHold: 60 }));
  const statuses = [];
  for (let i = 0; i < 14; i += 1) statuses.push((await get(app.port)).status);
  assert.deepEqual(statuses, [...Array(10).fill(200), ...Array(4).fill(429)]);
  assert.equal(app.calls, 10);
  // Blocks of 4 and 4, a refused one, the 2 that remained; then refused once by the server, and
  // here until its retryAfter: 6 checks for 14 requests.
  assert.equal(checks, 6);
  const d = await shared.client.peek('rate10', key);
  assert.equal(d.allowed, false);
  const refusedHere = await get(app.port);
  assert.equal(refusedHere.status, 429);
  assert.ok(Number(refusedHere.headers['retry-after']) >= 1);
  assert.equal(checks, 6);
});
