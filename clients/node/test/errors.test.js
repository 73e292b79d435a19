'use strict';
// Bad input: each error is the right SluiceError subclass, carries the gRPC code, and its
// message is the server's, naming the field at fault. Client-side checks throw before a call.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const sluice = require('..');
const { startServer, uniqueKey } = require('./helpers');

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

/** Awaits `promise`, which must reject with `Cls` naming `field`; returns the error. */
async function rejects(promise, Cls, field) {
  let err;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected ${Cls.name}, nothing was thrown`);
  assert.ok(err instanceof Cls, `expected ${Cls.name}, got ${err && err.name}: ${err && err.message}`);
  assert.ok(err instanceof sluice.SluiceError);
  assert.equal(err.code, Cls.code);
  assert.equal(err.name, Cls.name);
  assert.equal(err.field, field, err.message);
  assert.ok(err.message.startsWith(`${field}: `), err.message);
  return err;
}

test('an unknown policy is NotFound, for every call that names one', async () => {
  const err = await rejects(client.check('no-such-policy', 'k'), sluice.NotFound, 'policy');
  assert.match(err.message, /no-such-policy/);
  assert.equal(err.code, 5);
  assert.equal(err.codeName, 'NOT_FOUND');
  await rejects(client.peek('no-such-policy', 'k'), sluice.NotFound, 'policy');
  await rejects(client.charge('no-such-policy', 'k', 1), sluice.NotFound, 'policy');
  await rejects(client.admit('no-such-policy'), sluice.NotFound, 'policy');
  await rejects(client.lease('no-such-policy', () => assert.fail('fn ran')), sluice.NotFound, 'policy');
  await rejects(client.checkMany([['no-such-policy', 'k']]), sluice.NotFound, 'checks[0].policy');
});

test('an empty or oversized key is InvalidArgument, with the server\'s message', async () => {
  const empty = await rejects(client.check('rate5', ''), sluice.InvalidArgument, 'key');
  assert.equal(empty.message, 'key: must not be empty');
  await rejects(client.peek('rate5', ''), sluice.InvalidArgument, 'key');
  const long = await rejects(client.check('rate5', 'x'.repeat(2000)), sluice.InvalidArgument, 'key');
  assert.match(long.message, /2000/);
  assert.match(long.message, /1024/);
  assert.equal((await client.check('rate5', 'y'.repeat(1024))).allowed, true); // the limit itself is fine
});

test('hits below 1 reach the server and are refused as InvalidArgument', async () => {
  for (const hits of [0, -1]) {
    const err = await rejects(client.check('rate5', uniqueKey(), { hits }), sluice.InvalidArgument, 'hits');
    assert.equal(err.message, `hits: must be >= 1, not ${hits}`);
    await rejects(client.peek('rate5', uniqueKey(), { hits }), sluice.InvalidArgument, 'hits');
  }
  await rejects(client.charge('rate5', uniqueKey(), 0), sluice.InvalidArgument, 'hits');
});

test('checkMany errors name the check at fault, and debit nothing', async () => {
  const key = uniqueKey();
  await rejects(client.checkMany([['rate10', key], ['rate10', key, 0]]), sluice.InvalidArgument, 'checks[1].hits');
  await rejects(client.checkMany([]), sluice.InvalidArgument, 'checks');
  await rejects(client.checkMany(Array(129).fill(['rate10', key])), sluice.InvalidArgument, 'checks');
  await rejects(client.checkMany([['rate10', key, 3], ['rate10', '']]), sluice.InvalidArgument, 'checks[1].key');
  assert.equal((await client.peek('rate10', key)).remaining, 9);
});

test('a call of the wrong family is FailedPrecondition', async () => {
  const err = await rejects(client.check('pool2', 'k'), sluice.FailedPrecondition, 'policy');
  assert.match(err.message, /pool2/);
  await rejects(client.peek('gateway', 'k'), sluice.FailedPrecondition, 'policy');
  await rejects(client.admit('rate5', { key: 'k' }), sluice.FailedPrecondition, 'policy');
  assert.equal((await client.policies()).get('pool2').inFlight, 0);
});

test('an unknown lease is NotFound; a malformed lease id InvalidArgument', async () => {
  const unknown = crypto.randomBytes(16).toString('hex');
  await rejects(client.release(unknown), sluice.NotFound, 'lease_id');
  await rejects(client.heartbeat(unknown), sluice.NotFound, 'lease_id');
  for (const id of ['', 'nope', 'g'.repeat(32), 'a'.repeat(31), 'A'.repeat(32)]) {
    await rejects(client.release(id), sluice.InvalidArgument, 'lease_id');
    await rejects(client.heartbeat(id), sluice.InvalidArgument, 'lease_id');
  }
});

test('a second release of the same lease is NotFound', async () => {
  const lease = await client.admit('pool2');
  await client.release(lease);
  await rejects(client.release(lease), sluice.NotFound, 'lease_id');
  await rejects(client.heartbeat(lease), sluice.NotFound, 'lease_id');
});

test('admit argument errors come from the server and take no permit', async () => {
  await rejects(client.admit('pool2', { ttl: -1 }), sluice.InvalidArgument, 'ttl');
  await rejects(client.admit('pool2', { ttl: 0 }), sluice.InvalidArgument, 'ttl');
  await rejects(client.admit('pool2', { ttl: 3600 }), sluice.InvalidArgument, 'ttl');
  await rejects(client.admit('chained'), sluice.InvalidArgument, 'key'); // chains rate5, keyed by key
  await rejects(client.admit('gateway', { upstream: 'llm' }), sluice.InvalidArgument, 'tenant');
  await rejects(client.admit('gateway', { tenant: 'acme' }), sluice.InvalidArgument, 'upstream');
  await assert.rejects(client.admit('gateway', { tenant: 'nobody', upstream: 'llm' }), sluice.NotFound);
  await rejects(client.admit('gateway', { attributes: { 'not a name': 'x', tenant: 'acme', upstream: 'llm' } }),
    sluice.InvalidArgument, 'attributes');
  const ps = await client.policies();
  assert.equal(ps.get('pool2').inFlight, 0);
  assert.equal(ps.get('gateway').inFlight, 0);
});

test('heartbeat and release argument errors leave the lease alone', async () => {
  const lease = await client.admit('pool2', { ttl: 5 });
  await rejects(client.heartbeat(lease, { ttl: 0 }), sluice.InvalidArgument, 'ttl');
  await rejects(client.release(lease, { rtt: -0.5 }), sluice.InvalidArgument, 'rtt');
  assert.equal(lease.released, false);
  await client.release(lease); // still held: the bad calls released nothing
  assert.equal((await client.policies()).get('pool2').inFlight, 0);
});

test('a cost on a lease whose policy chains no rate policy: FailedPrecondition, released all the same', async () => {
  const lease = await client.admit('pool2');
  const err = await rejects(client.release(lease, { cost: 2 }), sluice.FailedPrecondition, 'cost');
  assert.match(err.message, /released/);
  assert.equal(lease.released, true);
  assert.equal((await client.policies()).get('pool2').inFlight, 0);
});

test('client-side checks throw before any call', async () => {
  const c = new sluice.Client('127.0.0.1:1'); // never contacted
  try {
    await assert.rejects(c.release('0'.repeat(32), 'crashed'), RangeError);
    await assert.rejects(c.check('rate5', 'k', { hits: 1.5 }), TypeError);
    await assert.rejects(c.charge('rate5', 'k', '3'), TypeError);
    await assert.rejects(c.checkMany([['rate5']]), RangeError);
    await assert.rejects(c.checkMany('rate5'), TypeError);
    await assert.rejects(c.admit('pool2', { ttl: Infinity }), RangeError);
    await assert.rejects(c.admit('pool2', { ttl: '5s' }), TypeError);
    await assert.rejects(c.admit('pool2', { exclude: 'db-1' }), TypeError);
    await assert.rejects(c.admit('gateway', { attributes: { tenant: 3 } }), TypeError);
    await assert.rejects(c.lease('pool2', {}, 'not a function'), TypeError);
    assert.throws(() => new sluice.Client('127.0.0.1:1', { timeout: 0 }), RangeError);
  } finally {
    c.close();
  }
});

test('isTimeout knows the timeout errors of Node, fetch and gRPC, and nothing else', () => {
  assert.equal(sluice.isTimeout(new sluice.DeadlineExceeded('x')), true);
  assert.equal(sluice.isTimeout(Object.assign(new Error('x'), { code: 'ETIMEDOUT' })), true);
  assert.equal(sluice.isTimeout(Object.assign(new Error('x'), { code: 'UND_ERR_HEADERS_TIMEOUT' })), true);
  assert.equal(sluice.isTimeout(new DOMException('x', 'TimeoutError')), true);
  assert.equal(sluice.isTimeout(Object.assign(new Error('x'), { code: 4, details: 'Deadline exceeded' })), true);
  assert.equal(sluice.isTimeout(new DOMException('x', 'AbortError')), false);
  assert.equal(sluice.isTimeout(new sluice.Unavailable('x')), false);
  assert.equal(sluice.isTimeout(Object.assign(new Error('x'), { code: 'ECONNREFUSED' })), false);
  assert.equal(sluice.isTimeout(null), false);
});
