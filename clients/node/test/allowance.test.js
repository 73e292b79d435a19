'use strict';
// A rate policy's hits taken in blocks and spent in the middleware (lib/allowance.js,
// express({ allowance })): the rules on a clock of the test's own (and a seeded random run
// holding every hit spent to a live grant), then the middleware in front of a real `sluice
// serve`: most requests admitted without a check (the next block asked in the background),
// none past the limit.

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
  assert.deepEqual(a.stats, {
    localAdmits: 10, localRefusals: 0, blocksGranted: 2, blocksRefused: 0, hitsDropped: 8, callsAsked: 1,
    refillsGranted: 0, refillsRefused: 0,
  });
});

test('the next block is asked when half is spent, and the older hits go first', () => {
  const a = new Allowances(10, 0.5);
  assert.equal(a.answered('k', 10, 1, allowed(90), 0), null); // 9 held
  for (let i = 0; i < 3; i += 1) {
    assert.ok(a.local('k', 1, 0).allowed);
    assert.equal(a.takeRefill('k'), 0);
  }
  assert.ok(a.local('k', 1, 0).allowed); // 5 of 10 left
  assert.equal(a.takeRefill('k'), 10);
  assert.equal(a.takeRefill('k'), 0); // taken once
  assert.ok(a.local('k', 1, 0).allowed);
  assert.equal(a.takeRefill('k'), 0); // one refill at a time
  a.refilled('k', 10, allowed(70), 0.1);
  assert.equal(a.held('k'), 14);
  const d = a.local('k', 2, 0.2);
  assert.equal(d.remaining, 70 + 12);
  assert.equal(a.takeRefill('k'), 0); // the older block's hits went first: the new one is whole
  // The older block's last 2 expire with their own hold; the refill's 10 stay until theirs.
  assert.ok(a.local('k', 1, 0.55).allowed);
  assert.equal(a.held('k'), 9);
  for (let i = 0; i < 3; i += 1) a.local('k', 1, 0.55);
  assert.equal(a.takeRefill('k'), 0);
  assert.ok(a.local('k', 1, 0.55).allowed);
  assert.equal(a.takeRefill('k'), 10); // half the refill's block
  assert.equal(a.local('k', 1, 0.6), null); // its hold is over
  assert.equal(a.stats.refillsGranted, 1);
  assert.equal(a.stats.hitsDropped, 2 + 5);
});

test('a refill that came while a request waited is kept, and spent before a cached refusal', () => {
  const a = new Allowances(10, 1);
  a.answered('k', 10, 1, allowed(90), 0);
  for (let i = 0; i < 9; i += 1) assert.ok(a.local('k', 1, 0).allowed);
  assert.equal(a.takeRefill('k'), 10);
  assert.equal(a.local('k', 1, 0), null); // spent: this request asks
  a.refilled('k', 10, allowed(5), 0.001);
  assert.equal(a.answered('k', 10, 1, refused(1, 5), 0.002), 5);
  assert.equal(a.answered('k', 5, 1, allowed(0), 0.003), null);
  assert.equal(a.held('k'), 14);
  assert.equal(a.stats.hitsDropped, 0);
  // The refill's 10 first: the block granted after it outlives it by its 2 ms.
  for (let i = 0; i < 10; i += 1) assert.ok(a.local('k', 1, 0.5).allowed);
  for (let i = 0; i < 4; i += 1) assert.ok(a.local('k', 1, 1.002).allowed);
  assert.equal(a.local('k', 1, 1.002), null);
  // The request's own hits refused, a refill on the way: spent when it comes (it was granted).
  const b = new Allowances(4, 1);
  b.answered('k', 4, 1, allowed(1), 0);
  assert.ok(b.local('k', 1, 0).allowed);
  assert.equal(b.takeRefill('k'), 4);
  for (let i = 0; i < 2; i += 1) assert.ok(b.local('k', 1, 0).allowed);
  assert.equal(b.answered('k', 4, 1, refused(0.05), 0), 1);
  assert.equal(b.answered('k', 1, 1, refused(0.05), 0), null);
  assert.equal(b.local('k', 1, 0).allowed, false);
  b.refilled('k', 4, allowed(0), 0.001);
  for (let i = 0; i < 4; i += 1) assert.ok(b.local('k', 1, 0.002).allowed);
  assert.equal(b.local('k', 1, 0.002).allowed, false); // refused here again until 0.05
});

test('a refill not granted is not asked again for that block, nor cached as a refusal', () => {
  const a = new Allowances(4, 1);
  a.answered('k', 4, 1, new sluice.Decision({ ...allowed(2), limit: 6 }), 0); // 3 held
  assert.ok(a.local('k', 1, 0).allowed);
  assert.equal(a.takeRefill('k'), 4);
  a.refilled('k', 4, refused(0.3, 2), 0);
  for (let i = 0; i < 2; i += 1) {
    assert.ok(a.local('k', 1, 0).allowed);
    assert.equal(a.takeRefill('k'), 0);
  }
  assert.equal(a.local('k', 1, 0), null); // spent: the request asks (no refusal was cached)
  assert.equal(a.ask('k', 1), 4);
  a.answered('k', 4, 1, new sluice.Decision({ ...allowed(0), limit: 6 }), 0);
  assert.ok(a.local('k', 1, 0).allowed);
  assert.equal(a.takeRefill('k'), 4);
  a.refilled('k', 4, null, 0); // no answer came
  assert.ok(a.local('k', 1, 0).allowed);
  assert.equal(a.takeRefill('k'), 0);
  assert.equal(a.stats.refillsRefused, 2);
  assert.equal(a.stats.callsAsked, 1);
  const small = new Allowances(10, 1); // a refill is no larger than the policy's limit
  small.answered('k', 6, 1, new sluice.Decision({ ...allowed(0), limit: 6 }), 0);
  small.local('k', 1, 0);
  assert.equal(small.takeRefill('k'), 0);
  small.local('k', 1, 0);
  assert.equal(small.takeRefill('k'), 6); // 3 of 6 left
});

// A seeded generator (mulberry32): the same runs every time.
function random(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6D2B79F5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test('every hit spent here was granted, within the hold (300 seeded runs)', () => {
  for (let seed = 0; seed < 300; seed += 1) {
    const rnd = random(seed);
    const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
    const block = int(1, 11);
    const hold = int(1, 40) / 1000;
    const a = new Allowances(block, hold);
    const grants = []; // [granted at, hits left], oldest first
    const spend = (hits, t) => {
      while (grants.length > 0 && t - grants[0][0] >= hold) grants.shift();
      while (hits > 0) {
        assert.ok(grants.length > 0, `seed ${seed}: a hit spent that no live grant covers`);
        const n = Math.min(hits, grants[0][1]);
        grants[0][1] -= n;
        hits -= n;
        if (grants[0][1] === 0) grants.shift();
      }
    };
    let inFlight = 0;
    let t = 0;
    for (let step = int(1, 200); step > 0; step -= 1) {
      t += int(0, 7) / 1000;
      const hits = int(1, 3);
      const limit = int(1, 29);
      if (inFlight > 0 && rnd() < 0.5) {
        const kind = int(0, 2); // granted, refused, no answer
        if (kind === 0) grants.push([t, inFlight]);
        a.refilled('k', inFlight, [allowed(limit, limit), refused(0.005), null][kind], t);
        inFlight = 0;
      }
      const d = a.local('k', hits, t);
      if (d !== null) {
        if (d.allowed) spend(hits, t);
        const due = a.takeRefill('k');
        if (due > 0) {
          assert.ok(d.allowed && inFlight === 0, `seed ${seed}`);
          inFlight = due;
        }
      } else {
        for (let asked = a.ask('k', hits); ;) {
          assert.ok(asked >= hits);
          const grant = rnd() < 0.5;
          if (grant) grants.push([t, asked]);
          const answer = grant ? allowed(limit, Math.max(limit, asked))
            : new sluice.Decision({ allowed: false, limit, remaining: limit, resetAfter: 1, retryAfter: 0.003 });
          const following = a.answered('k', asked, hits, answer, t);
          if (following === null) {
            if (grant) spend(hits, t);
            break;
          }
          assert.ok(following < asked);
          asked = following;
        }
      }
      assert.ok(a.held('k') <= 2 * block, `seed ${seed}`);
    }
  }
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

async function refillsAnswered(mw) {
  for (let i = 0; i < 500 && mw.allowanceStats().refillsInFlight > 0; i += 1) {
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.equal(mw.allowanceStats().refillsInFlight, 0);
}

test('the middleware admits most requests here and never past the limit', async () => {
  const key = uniqueKey('allowance');
  const mwClient = new sluice.Client(shared.server.grpcTarget, { timeout: 5 });
  open.push(mwClient);
  let checks = 0;
  const check = mwClient.check.bind(mwClient);
  mwClient.check = (...args) => { checks += 1; return check(...args); };
  // rate10: a fixed window of 10 a minute; blocks of 4, spent within a minute.
  const mw = sluice.express({ client: mwClient, policy: 'rate10', key: () => key, allowance: 4, allowanceHold: 60 });
  const app = await serve(mw);
  const statuses = [];
  for (let i = 0; i < 14; i += 1) statuses.push((await get(app.port)).status);
  assert.deepEqual(statuses, [...Array(10).fill(200), ...Array(4).fill(429)]);
  assert.equal(app.calls, 10);
  // Blocks of 4 (asked by a request, or in the background when half of one was spent), a
  // refused one, the 2 that remained; then refused once by the server, and here until its
  // retryAfter. Each check was a request's or a refill.
  await refillsAnswered(mw);
  const st = mw.allowanceStats();
  assert.equal(checks, st.callsAsked + st.blocksRefused + st.refillsGranted + st.refillsRefused);
  assert.equal(st.localAdmits + st.localRefusals + st.callsAsked, 14);
  assert.ok(st.localRefusals >= 3, JSON.stringify(st));
  const d = await shared.client.peek('rate10', key);
  assert.equal(d.allowed, false);
  const asked = checks;
  const refusedHere = await get(app.port);
  assert.equal(refusedHere.status, 429);
  assert.ok(Number(refusedHere.headers['retry-after']) >= 1);
  assert.equal(checks, asked);
});

test('a key\'s steady requests wait for no check after the first', async () => {
  const key = uniqueKey('steady');
  // Blocks of 20: each after the first asked for in the background when half of the one
  // before is spent. Without that, every 20th request would wait for a check.
  const mw = sluice.express({ client: shared.client, policy: 'wide', key: () => key, allowance: 20, allowanceHold: 60 });
  const app = await serve(mw);
  for (let i = 0; i < 200; i += 1) assert.equal((await get(app.port)).status, 200);
  await refillsAnswered(mw);
  const st = mw.allowanceStats();
  assert.ok(st.callsAsked <= 3, JSON.stringify(st)); // 1, unless a refill came back late
  assert.ok(st.refillsGranted >= 7, JSON.stringify(st));
  assert.equal(st.localAdmits + st.callsAsked, 200);
  assert.equal(st.hitsHeld + 200, 20 * (st.blocksGranted + st.refillsGranted));
});
