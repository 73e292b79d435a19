'use strict';
// client.cascade() against a real `sluice serve` with cascade policies: the node it picks is
// what fn is called with; each call's outcome reaches the node's record; a failing node loses
// its traffic; failures are retried on untried nodes only, within the retry budget; every node
// full is Refused. And the outcome helpers and RetryBudget on their own.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const sluice = require('..');
const { serverForFile } = require('./helpers');

const {
  RetryBudget, outcomeOfHttp, outcomeOfGrpc, outcomeForException, CASCADE_OUTCOMES, Refused,
} = sluice;

// One policy per test (they share the server): a node's health is what a test looks at.
const CONFIG = `
server:
  lease_ttl: 20s
policies:
  # a breaker: three failures in a row open it
  shedding:
    kind: cascade
    nodes:
      a: {algorithm: fixed, limit: 4}
      b: {algorithm: fixed, limit: 4}
      c: {algorithm: fixed, limit: 4}
    breaker:
      failures: 3
      open_for: 30s
  # no breakers: failing nodes stay eligible, so retries can be counted
  plain:
    kind: cascade
    nodes:
      a: {algorithm: fixed, limit: 4}
      b: {algorithm: fixed, limit: 4}
      c: {algorithm: fixed, limit: 4}
  outage:
    kind: cascade
    nodes:
      a: {algorithm: fixed, limit: 4}
      b: {algorithm: fixed, limit: 4}
      c: {algorithm: fixed, limit: 4}
  verdicts:
    kind: cascade
    nodes:
      x: {algorithm: fixed, limit: 4}
      y: {algorithm: fixed, limit: 4}
  full:
    kind: cascade
    nodes:
      a: {algorithm: fixed, limit: 1}
      b: {algorithm: fixed, limit: 1}
`;

const shared = serverForFile(CONFIG);

async function nodes(policy) {
  const ps = await shared.client.policies();
  return Object.fromEntries(ps.get(policy).state.nodes.map((n) => [n.name, n]));
}

/** A node's calls on record, summed over its stat buckets (a call lands in its moment's). */
function record(node) {
  const sum = (k) => node.buckets.reduce((acc, b) => acc + b[k], 0);
  return { finished: sum('finished'), succeeded: sum('succeeded') };
}

async function total(policy) {
  const all = Object.values(await nodes(policy)).map(record);
  return {
    finished: all.reduce((a, r) => a + r.finished, 0),
    succeeded: all.reduce((a, r) => a + r.succeeded, 0),
  };
}

async function allReleased(policy) {
  for (const [name, n] of Object.entries(await nodes(policy))) {
    assert.equal(n.in_flight, 0, `node ${name} still holds ${n.in_flight}`);
  }
}

function httpError(status, message = `HTTP ${status}`) {
  return Object.assign(new Error(message), { status });
}

test('outcomes of replies and errors', () => {
  assert.deepEqual([200, 404, 429, 503, 504, 408, 500].map(outcomeOfHttp),
    ['success', 'success', 'overload', 'overload', 'timeout', 'timeout', 'failed']);
  assert.deepEqual([0, 3, 8, 14, 4, 1, 13].map(outcomeOfGrpc),
    ['success', 'success', 'overload', 'overload', 'timeout', 'ignored', 'failed']);
  assert.equal(outcomeOfGrpc('UNAVAILABLE'), 'overload');
  assert.equal(outcomeOfGrpc('RESOURCE_EXHAUSTED'), 'overload');
  assert.throws(() => outcomeOfHttp('503'), TypeError);
  assert.throws(() => outcomeOfGrpc('NOPE'), TypeError);

  // Timeouts, whoever raised them.
  assert.equal(outcomeForException(new sluice.DeadlineExceeded('late')), 'timeout');
  assert.equal(outcomeForException(new DOMException('late', 'TimeoutError')), 'timeout');
  assert.equal(outcomeForException(Object.assign(new Error('late'), { code: 'ETIMEDOUT' })), 'timeout');
  // The caller gave up: nothing about the node.
  assert.equal(outcomeForException(new DOMException('gave up', 'AbortError')), 'ignored');
  // An HTTP status on the error, or on its response (axios, got).
  assert.equal(outcomeForException(httpError(503)), 'overload');
  assert.equal(outcomeForException(Object.assign(new Error(), { statusCode: 429 })), 'overload');
  assert.equal(outcomeForException(Object.assign(new Error(), { response: { status: 504 } })), 'timeout');
  assert.equal(outcomeForException(Object.assign(new Error(), { response: { statusCode: 502 } })), 'failed');
  assert.equal(outcomeForException(httpError(404)), 'failed'); // thrown: never a success
  // A gRPC ServiceError's code.
  const grpcError = (code) => Object.assign(new Error('x'), { code, details: 'x' });
  assert.equal(outcomeForException(grpcError(14)), 'overload');
  assert.equal(outcomeForException(grpcError(4)), 'timeout');
  assert.equal(outcomeForException(grpcError(1)), 'ignored');
  assert.equal(outcomeForException(grpcError(3)), 'failed');
  // Anything else failed: this client's own errors (but a deadline) too.
  assert.equal(outcomeForException(new Error('boom')), 'failed');
  assert.equal(outcomeForException(new sluice.Unavailable('down')), 'failed');
  const waited = new sluice.ThrottledTimeout(new sluice.CheckResult({ ok: false, status: 429, reason: 'x' }), 1);
  assert.equal(outcomeForException(waited), 'failed');
  assert.equal(outcomeForException('a string'), 'failed');
  assert.deepEqual([...CASCADE_OUTCOMES], ['success', 'timeout', 'overload', 'failed', 'ignored']);
});

test('the retry budget is a share of calls plus an allowance, over a sliding window', () => {
  let t = 100;
  const b = new RetryBudget({ ratio: 0.1, perSecond: 1, window: 10, clock: () => t });
  const tries = (n) => Array.from({ length: n }, () => b.tryRetry()).filter(Boolean).length;
  assert.equal(tries(50), 10); // the allowance alone
  for (let i = 0; i < 100; i++) b.recordCall();
  assert.equal(tries(50), 10); // + 10% of 100 calls
  t += 9.9;
  assert.equal(tries(50), 0); // nothing has aged out yet
  t += 0.1;
  assert.equal(tries(50), 10); // all of it aged out: the allowance again
  const d = new RetryBudget();
  assert.deepEqual([d.ratio, d.perSecond, d.window], [0.1, 10, 10]);
  assert.throws(() => new RetryBudget({ ratio: 2 }), { name: 'RangeError', message: /^ratio/ });
  assert.throws(() => new RetryBudget({ ratio: NaN }), { name: 'RangeError', message: /^ratio/ });
  assert.throws(() => new RetryBudget({ perSecond: -1 }), { name: 'RangeError', message: /^perSecond/ });
  assert.throws(() => new RetryBudget({ window: 0 }), { name: 'RangeError', message: /^window/ });
  assert.throws(() => new RetryBudget({ ratio: '0.1' }), { name: 'TypeError', message: /^ratio/ });
});

test('cascade() reports each outcome to the node it called: classify, thrown errors, ignored', async () => {
  const { client } = shared;
  for (const [outcome, delta] of [
    ['success', { finished: 1, succeeded: 1 }],
    ['timeout', { finished: 1, succeeded: 0 }],
    ['overload', { finished: 1, succeeded: 0 }],
    ['failed', { finished: 1, succeeded: 0 }],
    ['ignored', { finished: 0, succeeded: 0 }],
  ]) {
    const before = await total('verdicts');
    let called = null;
    const got = await client.cascade('verdicts', (node) => { called = node; return `reply from ${node}`; },
      { classify: (reply) => (reply.startsWith('reply from') ? outcome : 'success') });
    assert.ok(['x', 'y'].includes(called), `fn got the chosen node, not ${called}`);
    // A failure with retries 0: the reply is what the caller gets.
    assert.equal(got, `reply from ${called}`);
    const after = await total('verdicts');
    assert.deepEqual({ finished: after.finished - before.finished, succeeded: after.succeeded - before.succeeded },
      delta, `outcome ${outcome}`);
  }
  // No classify: a success. An async classify is awaited.
  let before = await total('verdicts');
  assert.equal(await client.cascade('verdicts', async () => 7), 7);
  assert.equal(await client.cascade('verdicts', () => 8, { classify: async () => 'overload' }), 8);
  let after = await total('verdicts');
  assert.deepEqual([after.finished - before.finished, after.succeeded - before.succeeded], [2, 1]);

  // A thrown error is reported by outcomeForException and rethrown; an abort is not retried.
  before = await total('verdicts');
  await assert.rejects(client.cascade('verdicts', () => { throw httpError(503, 'shedding'); }), /shedding/);
  let calls = 0;
  await assert.rejects(client.cascade('verdicts', async () => {
    calls += 1;
    throw new DOMException('gave up', 'AbortError');
  }, { retries: 2, budget: new RetryBudget({ ratio: 1, perSecond: 10 }) }), { name: 'AbortError' });
  assert.equal(calls, 1);
  after = await total('verdicts');
  assert.deepEqual([after.finished - before.finished, after.succeeded - before.succeeded], [1, 0]);
  await allReleased('verdicts');
});

test('a node that sheds everything loses its traffic (breaker open); the others serve', async () => {
  const { client } = shared;
  const served = { a: 0, c: 0 };
  let shed = 0;
  for (let i = 0; i < 60; i++) {
    try {
      const reply = await client.cascade('shedding', (node) => {
        if (node === 'b') throw httpError(503, 'b is overloaded'); // fast, as a shedding node
        return `reply from ${node}`;
      });
      served[reply.slice(-1)] += 1;
    } catch (err) {
      assert.equal(err.message, 'b is overloaded');
      shed += 1;
    }
  }
  const n = await nodes('shedding');
  const bCalls = record(n.b).finished;
  // b's clean slate drew some calls; each failure is on record and its weight is now 0; three in
  // a row opened its breaker, so it got no more than three.
  assert.ok(bCalls >= 1 && bCalls <= 3, `b was called ${bCalls} times`);
  assert.equal(shed, bCalls);
  assert.equal(record(n.b).succeeded, 0);
  assert.equal(n.b.weight, 0);
  if (bCalls === 3) assert.equal(n.b.breaker.state, 'open');
  assert.equal(served.a + served.c, 60 - bCalls);
  assert.equal(record(n.a).succeeded + record(n.c).succeeded, 60 - bCalls);
  await allReleased('shedding');
});

test('retries go to untried nodes, within the retry budget; the last failure is what you get', async () => {
  const { client } = shared;
  const seen = [];
  const fails = (node) => { seen.push(node); return 500; };

  // One call retried twice: three different nodes; the last reply is returned.
  assert.equal(await client.cascade('plain', fails,
    { classify: outcomeOfHttp, retries: 2, budget: new RetryBudget({ ratio: 0, perSecond: 1 }) }), 500);
  assert.equal(seen.length, 3);
  assert.equal(new Set(seen).size, 3);

  // More retries than nodes: once every node was tried, no retry; the last failure, not Refused.
  seen.length = 0;
  assert.equal(await client.cascade('plain', fails,
    { classify: outcomeOfHttp, retries: 5, budget: new RetryBudget({ ratio: 0, perSecond: 1 }) }), 500);
  assert.deepEqual([...seen].sort(), ['a', 'b', 'c']);

  // A thrown failure is retried the same way, and the last error is rethrown.
  seen.length = 0;
  await assert.rejects(client.cascade('plain', (node) => { seen.push(node); throw httpError(503, `shed by ${node}`); },
    { retries: 2, budget: new RetryBudget({ ratio: 0, perSecond: 1 }) }),
  (err) => err.message === `shed by ${seen[2]}`);
  assert.equal(new Set(seen).size, 3);

  // A success is never retried.
  seen.length = 0;
  assert.equal(await client.cascade('plain', (node) => { seen.push(node); return 200; },
    { classify: outcomeOfHttp, retries: 2 }), 200);
  assert.equal(seen.length, 1);

  // Without a budget allowance: none at all.
  seen.length = 0;
  await client.cascade('plain', fails,
    { classify: outcomeOfHttp, retries: 2, budget: new RetryBudget({ ratio: 0, perSecond: 0 }) });
  assert.equal(seen.length, 1);
  await allReleased('plain');
});

test('an outage: with no allowance and 10% of calls, 50 failing calls make at most 5 retries', async () => {
  const { client } = shared;
  let attempts = 0;
  const budget = new RetryBudget({ ratio: 0.1, perSecond: 0 });
  for (let i = 0; i < 50; i++) {
    await client.cascade('outage', () => { attempts += 1; return 503; },
      { classify: outcomeOfHttp, retries: 2, budget });
  }
  assert.equal(attempts, 55);
  await allReleased('outage');
});

test('a classify that returns no outcome, or throws, releases the lease as ignored and rejects', async () => {
  const { client } = shared;
  const before = await total('verdicts');
  await assert.rejects(client.cascade('verdicts', () => 200, { classify: () => 'great' }),
    { name: 'RangeError', message: /^classify: must return one of success, timeout, overload, failed, ignored, not "great"/ });
  await assert.rejects(client.cascade('verdicts', () => 200, { classify: () => { throw new Error('cannot tell'); } }),
    /cannot tell/);
  assert.deepEqual(await total('verdicts'), before); // ignored: nothing on record
  await allReleased('verdicts');
  // Arguments are checked before any admit.
  await assert.rejects(client.cascade('verdicts', () => 1, { retries: -1 }), { name: 'RangeError', message: /^retries/ });
  await assert.rejects(client.cascade('verdicts', () => 1, { retries: 1.5 }), { name: 'RangeError', message: /^retries/ });
  await assert.rejects(client.cascade('verdicts', 'fn'), { name: 'TypeError', message: /^fn/ });
  await assert.rejects(client.cascade('verdicts', () => 1, { classify: 'success' }), { name: 'TypeError', message: /^classify/ });
  await allReleased('verdicts');
});

test('every node full: Refused 503, and fn never runs', async () => {
  const { client } = shared;
  const held = [await client.admit('full'), await client.admit('full')];
  assert.deepEqual(held.map((l) => l.chosen).sort(), ['a', 'b']);
  let ran = false;
  await assert.rejects(client.cascade('full', () => { ran = true; }, { retries: 2 }), (err) => {
    assert.ok(err instanceof Refused);
    assert.equal(err.status, 503);
    assert.match(err.detail, /every node is at its concurrency limit/);
    return true;
  });
  assert.equal(ran, false);
  for (const lease of held) await client.release(lease);
  // Room again: the same call goes through.
  assert.equal(await client.cascade('full', (node) => node.toUpperCase()).then((r) => ['A', 'B'].includes(r)), true);
  await allReleased('full');
});
