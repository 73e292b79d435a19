'use strict';
// Every client method against a real `sluice serve` (test/helpers.js starts it).

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const sluice = require('..');
const { startServer, uniqueKey, freePort } = require('./helpers');

let server;
let client;

before(async () => {
  server = await startServer();
  client = new sluice.Client(server.grpcTarget, { timeout: 5 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

async function inFlight(policy) {
  return (await client.policies()).get(policy).inFlight;
}

test('check spends hits and answers a Decision; a denial is a value, not an error', async () => {
  const key = uniqueKey();
  const d = await client.check('rate5', key);
  assert.ok(d instanceof sluice.Decision);
  assert.deepEqual({ allowed: d.allowed, limit: d.limit, remaining: d.remaining, retryAfter: d.retryAfter },
    { allowed: true, limit: 5, remaining: 4, retryAfter: 0 });
  assert.ok(d.resetAfter > 0 && d.resetAfter <= 60, `resetAfter ${d.resetAfter}`);
  assert.equal(d.wouldDeny, false);
  assert.equal(d.reason, '');

  const d4 = await client.check('rate5', key, { hits: 4 });
  assert.equal(d4.allowed, true);
  assert.equal(d4.remaining, 0);
  const denied = await client.check('rate5', key);
  assert.equal(denied.allowed, false);
  assert.equal(denied.remaining, 0);
  assert.ok(denied.retryAfter > 0 && denied.retryAfter <= 60, `retryAfter ${denied.retryAfter}`);
});

test('more hits than the limit can never pass: retryAfter is null', async () => {
  const d = await client.check('rate5', uniqueKey(), { hits: 6 });
  assert.equal(d.allowed, false);
  assert.equal(d.retryAfter, null);
  assert.equal(d.remaining, 5); // nothing was spent
});

test('peek gives the decision check would, spending nothing', async () => {
  const key = uniqueKey();
  await client.check('rate5', key, { hits: 2 });
  const p1 = await client.peek('rate5', key, { hits: 3 });
  const p2 = await client.peek('rate5', key, { hits: 3 });
  assert.equal(p1.allowed, true);
  assert.equal(p1.remaining, 0); // what would be left after the 3
  assert.deepEqual({ ...p2, resetAfter: 0 }, { ...p1, resetAfter: 0 });
  assert.equal((await client.peek('rate5', key, { hits: 4 })).allowed, false);
  assert.equal((await client.check('rate5', key, { hits: 3 })).allowed, true); // peek spent none
});

test('checkMany is all or nothing, with the first denial named', async () => {
  const key = uniqueKey();
  const ok = await client.checkMany([['rate5', key], { policy: 'rate5', key, hits: 2 }, ['rate10', key, 3]]);
  assert.equal(ok.allowed, true);
  assert.equal(ok.deniedIndex, null);
  assert.deepEqual(ok.decisions.map((d) => d.remaining), [4, 2, 7]);

  const no = await client.checkMany([['rate10', key], ['rate5', key, 3], ['rate5', key]]);
  assert.equal(no.allowed, false);
  assert.equal(no.deniedIndex, 1);
  assert.equal(no.decisions[1].allowed, false);
  // Nothing was debited: rate10 still has 7 (not 6), and rate5 still has 2.
  assert.equal((await client.peek('rate10', key)).remaining, 6); // 7 left, minus the peeked 1
  assert.equal((await client.peek('rate5', key, { hits: 2 })).allowed, true);
});

test('charge overdraws the key and negative hits give back', async () => {
  const key = uniqueKey();
  const c = await client.charge('rate5', key, 7);
  assert.ok(c instanceof sluice.Charge);
  assert.deepEqual({ limit: c.limit, remaining: c.remaining, overdraft: c.overdraft, pending: c.pending },
    { limit: 5, remaining: 0, overdraft: 2, pending: 0 });
  assert.ok(c.retryAfter > 0);
  assert.equal((await client.check('rate5', key)).allowed, false); // the overdraft refuses
  const back = await client.charge('rate5', key, -4);
  assert.equal(back.overdraft, 0);
  assert.equal(back.remaining, 2);
  assert.equal(back.retryAfter, 0);
});

test('a policy in shadow allows what it would deny, and says so', async () => {
  const key = uniqueKey();
  assert.equal((await client.check('shadow1', key)).wouldDeny, false);
  const d = await client.check('shadow1', key);
  assert.equal(d.allowed, true);
  assert.equal(d.wouldDeny, true);
  assert.ok(d.retryAfter > 0);
});

test('a concurrency policy in shadow admits what it would refuse, with the refusal it would give', async () => {
  const a = await client.admit('shadowpool');
  assert.equal(a.wouldDeny, false);
  assert.equal(a.rejection, null);
  const b = await client.admit('shadowpool');
  assert.equal(b.wouldDeny, true);
  assert.ok(b.rejection instanceof sluice.Refused);
  assert.equal(b.rejection.status, 503);
  assert.equal(b.rejection.policy, 'shadowpool');
  await client.release(a);
  await client.release(b);
  assert.equal(await inFlight('shadowpool'), 0);
});

test('admit, heartbeat and release one lease', async () => {
  const lease = await client.admit('pool2', { ttl: 5 });
  assert.ok(lease instanceof sluice.Lease);
  assert.match(lease.leaseId, /^[0-9a-f]{32}$/);
  assert.equal(String(lease), lease.leaseId);
  assert.equal(lease.ttl, 5);
  assert.equal(lease.policy, 'pool2');
  assert.equal(lease.deadline, null);
  assert.equal(lease.timeLeft(), null);
  assert.equal(lease.waited, 0);
  assert.equal(await inFlight('pool2'), 1);
  assert.equal(await client.heartbeat(lease, { ttl: 9.5 }), 9.5);
  assert.equal(lease.ttl, 9.5);
  assert.equal(await client.heartbeat(lease), 9.5);
  const held = await client.release(lease, { outcome: 'success', rtt: 0.01 });
  assert.ok(held >= 0 && held < 5, `held ${held}`);
  assert.equal(lease.released, true);
  assert.equal(await inFlight('pool2'), 0);
});

test('a full pool refuses 503 with the problem document and a retryAfter', async () => {
  const a = await client.admit('pool2');
  const b = await client.admit('pool2');
  await assert.rejects(client.admit('pool2'), (err) => {
    assert.ok(err instanceof sluice.Refused);
    assert.ok(!(err instanceof sluice.SluiceError));
    assert.equal(err.status, 503);
    assert.equal(err.policy, 'pool2');
    assert.equal(err.level, 'limit');
    assert.equal(err.current, 2);
    assert.equal(err.limit, 2);
    assert.equal(err.type, 'urn:sluice:problem:concurrency-limit-exceeded');
    assert.ok(err.retryAfter > 0);
    assert.equal(err.problem.status, 503);
    assert.equal(err.problem.detail, err.detail);
    assert.equal(JSON.parse(err.problemJson).max_concurrent, 2);
    return true;
  });
  await client.release(a);
  await client.release(b.leaseId, 'ignored'); // by id, outcome as a string
  assert.equal(await inFlight('pool2'), 0);
});

test('a chained rate policy refuses 429 and takes no permit', async () => {
  const key = uniqueKey();
  await client.check('rate5', key, { hits: 5 });
  await assert.rejects(client.admit('chained', { key }), (err) => {
    assert.ok(err instanceof sluice.Refused);
    assert.equal(err.status, 429);
    assert.equal(err.policy, 'rate5');
    assert.equal(err.level, 'rate');
    assert.ok(err.retryAfter > 0 && err.retryAfter <= 60);
    assert.equal(err.problem.type, 'urn:sluice:problem:rate-limit-exceeded');
    return true;
  });
  assert.equal(await inFlight('chained'), 0);
});

test('release with a cost charges the chained rate key', async () => {
  const key = uniqueKey();
  const lease = await client.admit('chained', { key });
  await client.release(lease, { cost: 3 });
  assert.ok(lease.charged instanceof sluice.Charge);
  assert.equal(lease.charged.remaining, 2); // the admit took 1, the release 2 more
  assert.equal((await client.peek('rate5', key)).remaining, 1);
});

test('lease(): lease.cost is charged at the release; a cost the policy cannot take still releases', async () => {
  const key = uniqueKey();
  let held;
  await client.lease('chained', { key }, (lease) => { held = lease; lease.cost = 4; });
  assert.equal(held.released, true);
  assert.equal(held.charged.remaining, 1);
  assert.equal((await client.peek('rate5', key)).remaining, 0);

  await assert.rejects(client.lease('pool2', (lease) => { held = lease; lease.cost = 2; }), (err) => {
    assert.ok(err instanceof sluice.FailedPrecondition);
    assert.equal(err.field, 'cost');
    return true;
  });
  assert.equal(held.released, true);
  assert.equal(await inFlight('pool2'), 0);
});

test('admit on a concurrency policy with tenant and upstream, and with attributes', async () => {
  const a = await client.admit('gateway', { tenant: 'acme', upstream: 'llm' });
  const b = await client.admit('gateway', { attributes: { tenant: 'acme', upstream: 'llm' } });
  assert.equal(await inFlight('gateway'), 2);
  await client.release(a);
  await client.release(b);
  assert.equal(await inFlight('gateway'), 0);
});

test('lease(): fn resolved: released as a success, with the time fn took as the RTT', async () => {
  const before = (await client.policies()).get('big').state;
  const releases = [];
  const release = client.release;
  client.release = function spy(lease, options) {
    releases.push(options);
    return release.call(this, lease, options);
  };
  let out;
  try {
    out = await client.lease('big', {}, async (lease) => {
      assert.equal(await inFlight('big'), 1);
      assert.equal(lease.released, false);
      await new Promise((r) => setTimeout(r, 60));
      return 'result';
    });
  } finally {
    client.release = release;
  }
  assert.equal(out, 'result');
  assert.equal(releases.length, 1);
  assert.equal(releases[0].outcome, 'success');
  assert.ok(releases[0].rtt >= 0.055 && releases[0].rtt < 1, `rtt ${releases[0].rtt}`);
  const after = (await client.policies()).get('big');
  assert.equal(after.inFlight, 0);
  assert.equal(after.state.released, before.released + 1);
  assert.equal(after.state.dropped, before.dropped);
  assert.equal(after.state.ignored, before.ignored);
});

test('lease(): a timeout error reports dropped, another error ignored; the error is rethrown', async () => {
  const s0 = (await client.policies()).get('big').state;
  const timeoutErr = Object.assign(new Error('slow backend'), { code: 'ETIMEDOUT' });
  await assert.rejects(client.lease('big', () => { throw timeoutErr; }), (e) => e === timeoutErr);
  await assert.rejects(client.lease('big', {}, async () => {
    await new Promise((r) => setTimeout(r, 5));
    throw new sluice.DeadlineExceeded('no answer');
  }), sluice.DeadlineExceeded);
  const s1 = (await client.policies()).get('big').state;
  assert.equal(s1.dropped, s0.dropped + 2);
  assert.equal(s1.ignored, s0.ignored);

  const other = new TypeError('a bug');
  await assert.rejects(client.lease('big', () => { throw other; }), (e) => e === other);
  const s2 = (await client.policies()).get('big');
  assert.equal(s2.state.ignored, s1.ignored + 1);
  assert.equal(s2.state.dropped, s1.dropped);
  assert.equal(s2.inFlight, 0);
});

test('lease(): the outcome fn sets wins; a lease fn released is not released again', async () => {
  const s0 = (await client.policies()).get('big').state;
  await client.lease('big', (lease) => { lease.outcome = 'dropped'; });
  await client.lease('big', async (lease) => { await client.release(lease, 'ignored'); });
  const s1 = (await client.policies()).get('big');
  assert.equal(s1.state.dropped, s0.dropped + 1);
  assert.equal(s1.state.ignored, s0.ignored + 1);
  assert.equal(s1.state.released, s0.released + 2);
  assert.equal(s1.inFlight, 0);
});

test('lease(): an invalid outcome still frees the slot, then rejects', async () => {
  await assert.rejects(client.lease('big', (lease) => { lease.outcome = 'crashed'; }), RangeError);
  assert.equal(await inFlight('big'), 0);
});

test('lease(): refused, fn never runs', async () => {
  const a = await client.admit('pool2');
  const b = await client.admit('pool2');
  let ran = false;
  await assert.rejects(client.lease('pool2', () => { ran = true; }), sluice.Refused);
  assert.equal(ran, false);
  await client.release(a);
  await client.release(b);
});

test('policies() lists every policy with its kind, limits and state', async () => {
  const ps = await client.policies();
  assert.ok(ps instanceof sluice.Policies);
  assert.deepEqual(ps.names(), ['big', 'chained', 'gateway', 'pool2', 'rate10', 'rate5', 'shadow1', 'shadowpool', 'wide']);
  assert.equal(ps.size, 9);
  assert.ok(ps.has('rate5'));
  assert.equal(ps.get('rate5').kind, 'rate');
  assert.equal(ps.get('rate5').limit, 5);
  assert.equal(ps.get('pool2').kind, 'adaptive');
  assert.equal(ps.get('pool2').limit, 2);
  assert.equal(ps.get('chained').rate, 'rate5');
  assert.equal(ps.get('gateway').kind, 'concurrency');
  assert.equal(ps.get('pool2').state.algorithm, 'fixed');
  assert.equal(ps.configGeneration, 1);
  assert.equal(typeof ps.leases, 'number');
});

test('waitReady resolves on a live server', async () => {
  await client.waitReady(2);
});

test('an unreachable server is Unavailable', async () => {
  const port = await freePort(); // nobody listens there
  const c = new sluice.Client(`127.0.0.1:${port}`, { timeout: 2 });
  try {
    await assert.rejects(c.check('rate5', 'k'), (err) => {
      assert.ok(err instanceof sluice.Unavailable);
      assert.equal(err.code, 14);
      assert.equal(err.codeName, 'UNAVAILABLE');
      return true;
    });
    await assert.rejects(c.waitReady(0.2), sluice.Unavailable);
  } finally {
    c.close();
  }
});

test('a server that never answers is DeadlineExceeded, which isTimeout() knows', async () => {
  const sockets = [];
  const silent = net.createServer((s) => sockets.push(s)); // accepts, never speaks HTTP/2
  await new Promise((r) => silent.listen(0, '127.0.0.1', r));
  const c = new sluice.Client(`127.0.0.1:${silent.address().port}`, { timeout: 0.3 });
  try {
    const t0 = Date.now();
    await assert.rejects(c.check('rate5', 'k'), (err) => {
      assert.ok(err instanceof sluice.DeadlineExceeded, `${err.name}: ${err.message}`);
      assert.ok(sluice.isTimeout(err));
      return true;
    });
    assert.ok(Date.now() - t0 < 2000);
  } finally {
    c.close();
    sockets.forEach((s) => s.destroy());
    silent.close();
  }
});
