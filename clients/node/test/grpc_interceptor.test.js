'use strict';
// The gRPC server interceptor, in front of a real @grpc/grpc-js server (a generic service of
// raw bytes) called over loopback, with a real `sluice serve` behind it.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const sluice = require('..');
const { serverForFile, uniqueKey, waitFor, freePort, sleep } = require('./helpers');
const helpers = require('./helpers');

const shared = serverForFile();
const { open } = shared;

// ---- a generic service: bytes in, bytes out ----

const bytes = (b) => b;
function method(path, requestStream, responseStream) {
  return {
    path, requestStream, responseStream,
    requestSerialize: bytes, requestDeserialize: bytes, responseSerialize: bytes, responseDeserialize: bytes,
  };
}
const SERVICE = {
  // Echoes its request; a request {"code": n} ends the call with status n instead, {"throw": 1}
  // throws in the handler.
  Echo: method('/test.Echo/Echo', false, false),
  // Holds the call until the test opens the handler's gate.
  Slow: method('/test.Echo/Slow', false, false),
  // A server stream: one message, then another once the gate opens, then the end.
  Watch: method('/test.Echo/Watch', false, true),
};
const HEALTH = { Check: method('/grpc.health.v1.Health/Check', false, false) };
const EchoClient = grpc.makeGenericClientConstructor(SERVICE, 'Echo');
const HealthClient = grpc.makeGenericClientConstructor(HEALTH, 'Health');

/** A promise with its resolve, for handlers that wait until the test lets them answer. */
function gate() {
  let release;
  const p = new Promise((r) => { release = r; });
  p.open = release;
  return p;
}

/**
 * A grpc-js server with the interceptor (`options`) in front of SERVICE and HEALTH, on a free
 * loopback port, and a client of it. srv.calls: the handlers' calls, as [method, admission];
 * srv.gate: what Slow and Watch wait for.
 */
async function serve(options) {
  const srv = { calls: [], gate: gate(), cancelled: [] };
  const seen = (name, call) => srv.calls.push([name, sluice.grpcAdmission(call)]);
  srv.interceptor = sluice.grpcServerInterceptor(options);
  const server = new grpc.Server({ interceptors: [srv.interceptor] });
  server.addService(SERVICE, {
    Echo(call, callback) {
      seen('Echo', call);
      const text = call.request.toString();
      const ask = text.startsWith('{') ? JSON.parse(text) : {};
      if (ask.throw) throw new Error('handler failed');
      if (ask.outcome) sluice.grpcAdmission(call).outcome = ask.outcome;
      if (ask.code) return callback({ code: ask.code, details: `asked for ${ask.code}` });
      return callback(null, call.request);
    },
    Slow(call, callback) {
      seen('Slow', call);
      call.on('cancelled', () => srv.cancelled.push('Slow'));
      srv.gate.then(() => callback(null, Buffer.from('slow')));
    },
    Watch(call) {
      seen('Watch', call);
      call.on('cancelled', () => srv.cancelled.push('Watch'));
      call.write(Buffer.from('first'));
      srv.gate.then(() => {
        if (call.cancelled) return;
        call.write(Buffer.from('second'));
        call.end();
      });
    },
  });
  server.addService(HEALTH, {
    Check(call, callback) {
      seen('Health', call);
      callback(null, Buffer.from('SERVING'));
    },
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
  });
  const target = `127.0.0.1:${port}`;
  srv.client = new EchoClient(target, grpc.credentials.createInsecure());
  srv.health = new HealthClient(target, grpc.credentials.createInsecure());
  open.push({ close: () => { srv.client.close(); srv.health.close(); server.forceShutdown(); } });
  srv.handled = (name) => srv.calls.filter(([n]) => n === name).length;
  return srv;
}

/** A unary call: {err, value} (err: a grpc-js ServiceError, its trailers in err.metadata). */
function call(client, name, body = '', headers = {}, options = {}) {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(headers)) md.set(k, v);
  return new Promise((resolve) => {
    client[name](Buffer.from(body), md, options, (err, value) => resolve({ err, value: value && value.toString() }));
  });
}

/** A unary call that must succeed: its answer. */
async function ok(client, name, body = '', headers = {}) {
  const r = await call(client, name, body, headers);
  assert.equal(r.err, null, r.err && `${r.err.code} ${r.err.details}`);
  return r.value;
}

const recordingClient = (target = shared.server.grpcTarget) => helpers.recordingClient(target, open);

async function policy(name) {
  return (await shared.client.policies()).get(name);
}

/** The trailers of a refusal, checked for their form: {retryAfter, pushbackMs, problem}. */
function refusal(err, code, type) {
  assert.ok(err, 'the call was refused');
  assert.equal(err.code, code, `${err.code} ${err.details}`);
  const problem = JSON.parse(err.metadata.get('sluice-problem')[0]);
  assert.equal(problem.type, type);
  assert.equal(err.details, `${problem.title}: ${problem.detail}`);
  const [ra] = err.metadata.get('retry-after');
  const [pushback] = err.metadata.get('grpc-retry-pushback-ms');
  return { retryAfter: ra === undefined ? undefined : Number(ra), pushbackMs: pushback === undefined ? undefined : Number(pushback), raw: ra, problem };
}

test('rate policy: one check per call; over the limit, RESOURCE_EXHAUSTED with its trailers, the handler not called', async () => {
  const srv = await serve({ client: recordingClient(), policy: 'rate5', key: (r) => r.get('x-user') });
  const user = uniqueKey('user');
  for (let i = 0; i < 5; i++) assert.equal(await ok(srv.client, 'Echo', `hello ${i}`, { 'x-user': user }), `hello ${i}`);
  assert.deepEqual(srv.calls.map(([, d]) => d.remaining), [4, 3, 2, 1, 0]);
  for (const [, d] of srv.calls) assert.ok(d instanceof sluice.Decision && d.allowed);

  const { err } = await call(srv.client, 'Echo', 'one too many', { 'x-user': user });
  const r = refusal(err, grpc.status.RESOURCE_EXHAUSTED, 'urn:sluice:problem:rate-limit-exceeded');
  assert.match(r.raw, /^\d+$/);
  assert.ok(r.retryAfter >= 1 && r.retryAfter <= 60, `retry-after ${r.retryAfter}`);
  assert.ok(r.pushbackMs > (r.retryAfter - 1) * 1000 && r.pushbackMs <= r.retryAfter * 1000, `pushback ${r.pushbackMs} ms`);
  assert.equal(r.problem.retry_after_seconds, r.retryAfter);
  assert.equal(r.problem.policy, 'rate5');
  assert.equal(r.problem.limit, 5);
  assert.equal(r.problem.remaining, 0);
  assert.match(err.details, /^Rate Limit Exceeded: Rate policy rate5 /);
  assert.equal(srv.handled('Echo'), 5); // the refused call never reached the handler

  // Another key is not affected; a call that can never pass has no retry-after.
  await ok(srv.client, 'Echo', 'x', { 'x-user': uniqueKey('user') });
  const never = await serve({ client: shared.client, policy: 'rate5', key: () => uniqueKey(), hits: 6 });
  const n = refusal((await call(never.client, 'Echo')).err, grpc.status.RESOURCE_EXHAUSTED, 'urn:sluice:problem:rate-limit-exceeded');
  assert.equal(n.retryAfter, undefined);
  assert.equal(n.pushbackMs, undefined);
  assert.equal(n.problem.retry_after_seconds, undefined);
  assert.equal(never.handled('Echo'), 0);
});

test('rate policy: the default key is the method\'s full path; hits per call', async () => {
  const srv = await serve({ client: shared.client, policy: 'rate10', hits: (r) => (r.get('x-hits') ? Number(r.get('x-hits')) : 1) });
  await ok(srv.client, 'Echo', '', { 'x-hits': '9' });
  assert.equal((await shared.client.peek('rate10', '/test.Echo/Echo')).remaining, 0); // 10 - 9 - the peeked 1
  await ok(srv.client, 'Echo');
  assert.equal((await call(srv.client, 'Echo')).err.code, grpc.status.RESOURCE_EXHAUSTED);
  srv.gate.open();
  assert.equal(await ok(srv.client, 'Slow'), 'slow'); // another method, another key
  assert.equal((await shared.client.peek('rate10', '/test.Echo/Slow')).remaining, 8);
});

test('concurrency policy: UNAVAILABLE while the calls admitted hold the slots; the leases released after', async () => {
  const c = recordingClient();
  const srv = await serve({ client: c, policy: 'pool2' });
  const p0 = await policy('pool2');
  const slow = [call(srv.client, 'Slow'), call(srv.client, 'Slow')];
  await waitFor(async () => (await policy('pool2')).inFlight === 2, 3000, 'two leases');
  // (A deadline, so that a call let through fails here rather than waiting with the others.)
  const { err } = await call(srv.client, 'Slow', '', {}, { deadline: Date.now() + 3000 });
  const r = refusal(err, grpc.status.UNAVAILABLE, 'urn:sluice:problem:concurrency-limit-exceeded');
  assert.equal(r.raw, '1');
  assert.equal(r.pushbackMs, 1000);
  assert.equal(r.problem.policy, 'pool2');
  assert.equal(r.problem.current_in_flight, 2);
  assert.equal(srv.handled('Slow'), 2); // the refused call never reached the handler
  for (const [, lease] of srv.calls) assert.ok(lease instanceof sluice.Lease);
  srv.gate.open();
  for (const s of await Promise.all(slow)) assert.equal(s.value, 'slow');
  await waitFor(async () => (await policy('pool2')).inFlight === 0, 3000, 'leases released');
  const p1 = await policy('pool2');
  assert.equal(p1.state.released, p0.state.released + 2);
  assert.equal(p1.state.accepted, p0.state.accepted + 2);
  assert.equal(p1.state.rejected, p0.state.rejected + 1);
  assert.deepEqual(c.releases.map((x) => x.outcome), ['success', 'success']);
  for (const x of c.releases) assert.ok(x.rtt > 0 && x.rtt < 5, `rtt ${x.rtt}`);
  // The slots are free again.
  assert.equal(await ok(srv.client, 'Slow'), 'slow');
});

test('leaseReuse: the calls of a key ride the lease the call before them left; close() releases it', async () => {
  const c = recordingClient();
  const srv = await serve({ client: c, policy: 'big', key: 'reuse', leaseReuse: 30 });
  const p0 = await policy('big');
  for (let i = 0; i < 3; i += 1) assert.equal(await ok(srv.client, 'Echo', 'x'), 'x');
  const p1 = await policy('big');
  assert.equal(p1.state.admitted, p0.state.admitted + 1);
  assert.equal(p1.inFlight, p0.inFlight + 1); // the lease waits for the next call
  for (const [, lease] of srv.calls) assert.ok(lease instanceof sluice.Lease && lease.reusable);
  await srv.interceptor.close();
  const p2 = await policy('big');
  assert.equal(p2.inFlight, p0.inFlight);
  assert.equal(p2.state.renewed, p0.state.renewed + 2);
  assert.equal(p2.state.accepted, p0.state.accepted + 3);
  assert.equal(c.releases.length, 1);
  assert.equal(c.releases[0].earlier.length, 2);
});

test('concurrency policy with a chained rate policy: RESOURCE_EXHAUSTED once the key is over its rate', async () => {
  const srv = await serve({ client: shared.client, policy: 'chained', key: (r) => r.get('x-user') });
  const user = uniqueKey('user');
  await ok(srv.client, 'Echo', '', { 'x-user': user });
  await shared.client.check('rate5', user, { hits: 4 });
  const r = refusal((await call(srv.client, 'Echo', '', { 'x-user': user })).err,
    grpc.status.RESOURCE_EXHAUSTED, 'urn:sluice:problem:rate-limit-exceeded');
  assert.equal(r.problem.policy, 'rate5');
  assert.equal(r.retryAfter, r.problem.retry_after_seconds);
  assert.ok(r.retryAfter >= 1);
  assert.equal(srv.handled('Echo'), 1);
  await waitFor(async () => (await policy('chained')).inFlight === 0, 3000, 'no lease held');
});

test('concurrency policy: the outcome released follows the status code the call ended with', async () => {
  const c = recordingClient();
  const srv = await serve({ client: c, policy: 'big' });
  const s0 = (await policy('big')).state;
  const S = grpc.status;
  const cases = [
    ['', S.OK, 'success'],
    [{ code: S.NOT_FOUND }, S.NOT_FOUND, 'success'], // the caller's error: the backend answered
    [{ code: S.INVALID_ARGUMENT }, S.INVALID_ARGUMENT, 'success'],
    [{ code: S.RESOURCE_EXHAUSTED }, S.RESOURCE_EXHAUSTED, 'overload'],
    [{ code: S.UNAVAILABLE }, S.UNAVAILABLE, 'overload'],
    [{ code: S.DEADLINE_EXCEEDED }, S.DEADLINE_EXCEEDED, 'timeout'],
    [{ code: S.INTERNAL }, S.INTERNAL, 'failed'],
    [{ code: S.CANCELLED }, S.CANCELLED, 'ignored'],
    [{ throw: 1 }, S.UNKNOWN, 'failed'], // a handler that throws ends UNKNOWN
    [{ outcome: 'dropped' }, S.OK, 'dropped'], // the handler's own choice wins
  ];
  for (const [body, code] of cases) {
    const r = await call(srv.client, 'Echo', typeof body === 'string' ? body : JSON.stringify(body));
    assert.equal(r.err ? r.err.code : S.OK, code, JSON.stringify(body));
  }
  await waitFor(async () => (await policy('big')).state.released === s0.released + cases.length, 3000, 'releases');
  assert.deepEqual(c.releases.map((x) => x.outcome), cases.map(([, , outcome]) => outcome));
  const s1 = await policy('big');
  assert.equal(s1.inFlight, 0);
  assert.equal(s1.state.dropped, s0.dropped + 4);
  assert.equal(s1.state.ignored, s0.ignored + 3); // an adaptive limit takes "failed" as ignored
});

test('concurrency policy: a call whose client goes away is ignored; one past its deadline a timeout', async () => {
  const c = recordingClient();
  const srv = await serve({ client: c, policy: 'big' });
  // The client cancels while the handler holds the call.
  const md = new grpc.Metadata();
  const done = new Promise((resolve) => {
    const cl = srv.client.Slow(Buffer.from(''), md, (err) => resolve(err));
    waitFor(() => srv.handled('Slow') === 1, 3000, 'the handler').then(() => cl.cancel());
  });
  assert.equal((await done).code, grpc.status.CANCELLED);
  await waitFor(() => c.releases.length === 1, 3000, 'the release');
  assert.equal(c.releases[0].outcome, 'ignored');
  // The client's deadline passes while the handler holds the call: the server ends it.
  const late = await call(srv.client, 'Slow', '', {}, { deadline: Date.now() + 300 });
  assert.equal(late.err.code, grpc.status.DEADLINE_EXCEEDED);
  await waitFor(() => c.releases.length === 2, 3000, 'the release');
  assert.equal(c.releases[1].outcome, 'timeout');
  assert.ok(c.releases[1].rtt >= 0.15, `rtt ${c.releases[1].rtt}`);
  assert.deepEqual(srv.cancelled, ['Slow', 'Slow']);
  srv.gate.open();
  await waitFor(async () => (await policy('big')).inFlight === 0, 3000, 'leases released');
  await sleep(50);
  assert.equal(c.releases.length, 2); // the handler's late answer releases nothing more
});

test('a call that ends while its admit is pending: the handler not called, the lease released', async () => {
  const c = recordingClient();
  const admit = c.admit.bind(c);
  c.admit = async (...args) => { await sleep(300); return admit(...args); };
  const srv = await serve({ client: c, policy: 'big' });
  const released0 = (await policy('big')).state.released;
  const r = await call(srv.client, 'Echo', '', {}, { deadline: Date.now() + 100 });
  assert.equal(r.err.code, grpc.status.DEADLINE_EXCEEDED);
  await waitFor(() => c.releases.length === 1, 3000, 'the release');
  assert.equal(c.releases[0].outcome, 'ignored');
  await waitFor(async () => (await policy('big')).state.released === released0 + 1, 3000, 'the lease released');
  assert.equal((await policy('big')).inFlight, 0);
  assert.equal(srv.handled('Echo'), 0);
});

test('a server-streaming call holds its lease until the stream ends', async () => {
  const c = recordingClient();
  const srv = await serve({ client: c, policy: 'pool2' });
  const messages = [];
  const stream = srv.client.Watch(Buffer.from(''));
  const ended = new Promise((resolve, reject) => {
    stream.on('data', (m) => messages.push(m.toString()));
    stream.on('status', resolve);
    stream.on('error', reject);
  });
  await waitFor(() => messages.length === 1, 3000, 'the first message');
  await sleep(200);
  assert.equal((await policy('pool2')).inFlight, 1); // the handler has returned; the stream goes on
  assert.equal(c.releases.length, 0);
  srv.gate.open();
  assert.equal((await ended).code, grpc.status.OK);
  assert.deepEqual(messages, ['first', 'second']);
  await waitFor(async () => (await policy('pool2')).inFlight === 0, 3000, 'the lease released');
  assert.deepEqual(c.releases.map((x) => x.outcome), ['success']);
  assert.ok(c.releases[0].rtt >= 0.2, `rtt ${c.releases[0].rtt}: from the admission to the stream's end`);

  // A stream the client cancels: released as ignored.
  const srv2 = await serve({ client: c, policy: 'pool2' });
  const s2 = srv2.client.Watch(Buffer.from(''));
  s2.on('error', () => {}); // CANCELLED
  await new Promise((resolve) => s2.once('data', resolve));
  assert.equal((await policy('pool2')).inFlight, 1);
  s2.cancel();
  await waitFor(() => c.releases.length === 2, 3000, 'the release');
  assert.equal(c.releases[1].outcome, 'ignored');
  await waitFor(async () => (await policy('pool2')).inFlight === 0, 3000, 'the lease released');
  srv2.gate.open();
});

test('the health service is not admitted by default; skip: null admits it', async () => {
  const key = uniqueKey('shared');
  const srv = await serve({ client: shared.client, policy: 'rate5', key, hits: 5 });
  await ok(srv.client, 'Echo');
  assert.equal((await call(srv.client, 'Echo')).err.code, grpc.status.RESOURCE_EXHAUSTED);
  for (let i = 0; i < 3; i++) assert.equal(await ok(srv.health, 'Check'), 'SERVING');
  assert.equal(srv.handled('Health'), 3);
  assert.equal(srv.calls.find(([n]) => n === 'Health')[1], undefined); // not admitted at all

  const all = await serve({ client: shared.client, policy: 'rate5', key, skip: null });
  assert.equal((await call(all.health, 'Check')).err.code, grpc.status.RESOURCE_EXHAUSTED);
  assert.equal(all.handled('Health'), 0);
  const custom = await serve({ client: shared.client, policy: 'rate5', key, skip: (r) => r.method === 'Echo' });
  await ok(custom.client, 'Echo');
  assert.equal((await call(custom.health, 'Check')).err.code, grpc.status.RESOURCE_EXHAUSTED);
});

test('sluice unreachable: fail open by default, the error told to onError', async () => {
  const c = new sluice.Client(`127.0.0.1:${await freePort()}`, { timeout: 1 });
  open.push(c);
  const errors = [];
  for (const mode of [undefined, 'check', 'admit']) {
    const srv = await serve({ client: c, policy: 'pool2', mode, onError: (err, r) => errors.push([err, r.path]) });
    assert.equal(await ok(srv.client, 'Echo', 'through'), 'through');
    assert.deepEqual(srv.calls, [['Echo', null]]);
  }
  assert.equal(errors.length, 3);
  for (const [e, path] of errors) {
    assert.ok(e instanceof sluice.Unavailable, `${e.name}: ${e.message}`);
    assert.equal(path, '/test.Echo/Echo');
  }
});

test('sluice unreachable with failOpen: false: UNAVAILABLE with its trailers; health still answers', async () => {
  const c = new sluice.Client(`127.0.0.1:${await freePort()}`, { timeout: 1 });
  open.push(c);
  const errors = [];
  const srv = await serve({ client: c, policy: 'pool2', failOpen: false, onError: (err) => errors.push(err) });
  const r = refusal((await call(srv.client, 'Echo')).err, grpc.status.UNAVAILABLE,
    'urn:sluice:problem:admission-control-unavailable');
  assert.equal(r.raw, '1');
  assert.equal(r.pushbackMs, 1000);
  assert.equal(r.problem.policy, 'pool2');
  assert.match(r.problem.detail, /could not be asked/);
  assert.equal(srv.handled('Echo'), 0);
  assert.equal(errors.length, 1);
  assert.ok(errors[0] instanceof sluice.Unavailable);
  assert.equal(await ok(srv.health, 'Check'), 'SERVING');
});

test('after sluice failed to answer it is not asked for unreachableRetry seconds', async () => {
  const c = new sluice.Client(`127.0.0.1:${await freePort()}`, { timeout: 1 });
  open.push(c);
  let asked = 0;
  const admit = c.admit.bind(c);
  c.admit = (...args) => { asked += 1; return admit(...args); };
  const errors = [];
  const srv = await serve({ client: c, policy: 'pool2', mode: 'admit', failOpen: false, unreachableRetry: 0.4, onError: (err) => errors.push(err) });
  for (let i = 0; i < 3; i++) {
    const r = refusal((await call(srv.client, 'Echo')).err, grpc.status.UNAVAILABLE,
      'urn:sluice:problem:admission-control-unavailable');
    assert.equal(r.raw, '1'); // 0.4 s, in whole seconds rounded up
  }
  assert.equal(asked, 1);
  assert.equal(errors.length, 1);
  assert.equal(srv.handled('Echo'), 0);
  await sleep(450);
  await call(srv.client, 'Echo');
  assert.equal(asked, 2);
  assert.throws(() => sluice.grpcServerInterceptor({ client: c, policy: 'pool2', unreachableRetry: -0.5 }),
    /^TypeError: unreachableRetry: must be a number of seconds >= 0/);
});

test('an allowance admits most calls without a round trip, and never past the limit', async () => {
  const key = uniqueKey('allowance');
  const c = new sluice.Client(shared.server.grpcTarget, { timeout: 5 });
  open.push(c);
  let checks = 0;
  const check = c.check.bind(c);
  c.check = (...args) => { checks += 1; return check(...args); };
  const srv = await serve({ client: c, policy: 'rate10', key, allowance: 4, allowanceHold: 60 });
  for (let i = 0; i < 8; i++) await ok(srv.client, 'Echo');
  // Two blocks of 4: the second asked for in the background when the first was half spent (a
  // third, asked when the second was, is refused: 2 remain).
  for (let i = 0; i < 500 && srv.interceptor.allowanceStats().refillsInFlight > 0; i += 1) await sleep(10);
  const st = srv.interceptor.allowanceStats();
  assert.equal(st.refillsInFlight, 0);
  assert.equal(checks, st.callsAsked + st.blocksRefused + st.refillsGranted + st.refillsRefused);
  assert.ok(st.callsAsked <= 2, JSON.stringify(st)); // 1, unless the refill came back late
  assert.equal(st.hitsHeld, 0);
  assert.equal((await shared.client.peek('rate10', key)).remaining, 1); // 10 - 8 - the peeked 1
  // What the server said remained at each grant, plus the hits still held here.
  assert.deepEqual(srv.calls.map(([, d]) => d.remaining), [9, 8, 7, 6, 5, 4, 3, 2]);
  await ok(srv.client, 'Echo'); // the last two hits: a smaller block
  await ok(srv.client, 'Echo');
  const refused = (await call(srv.client, 'Echo')).err;
  refusal(refused, grpc.status.RESOURCE_EXHAUSTED, 'urn:sluice:problem:rate-limit-exceeded');
  const before = checks;
  assert.equal((await call(srv.client, 'Echo')).err.code, grpc.status.RESOURCE_EXHAUSTED);
  assert.equal(checks, before); // refused here until its retryAfter: no round trip
  assert.equal(srv.handled('Echo'), 10);
});

test('a misconfiguration ends the call whatever the failure mode, the handler not called', async () => {
  const S = grpc.status;
  const cases = [
    [{ policy: 'no-such-policy' }, S.INTERNAL, sluice.NotFound, /no-such-policy/],
    [{ policy: 'no-such-policy', mode: 'check' }, S.INTERNAL, sluice.NotFound, /^policy: /],
    [{ policy: 'pool2', mode: 'check' }, S.INTERNAL, sluice.FailedPrecondition, /^policy: /],
    [{ policy: 'rate5', key: () => { throw new TypeError('no key here'); } }, S.INTERNAL, TypeError, /no key here/],
    [{ policy: 'rate5', key: (r) => r.get('x-api-key') }, S.INVALID_ARGUMENT, sluice.InvalidArgument, /^key: must not be empty$/],
  ];
  for (const [opts, code, Cls, message] of cases) {
    for (const failOpen of [true, false]) {
      const errors = [];
      const srv = await serve({ client: shared.client, ...opts, failOpen, onError: (err) => errors.push(err) });
      const { err } = await call(srv.client, 'Echo');
      assert.ok(err, JSON.stringify(opts));
      assert.equal(err.code, code, `${JSON.stringify(opts)}: ${err.details}`);
      if (code === S.INVALID_ARGUMENT) assert.match(err.details, message);
      assert.equal(errors.length, 1);
      assert.ok(errors[0] instanceof Cls, `${errors[0].name}: ${errors[0].message}`);
      assert.match(errors[0].message, message);
      assert.equal(srv.handled('Echo'), 0);
    }
  }
});

test('the interceptor checks its options', () => {
  const client = shared.client;
  assert.throws(() => sluice.grpcServerInterceptor({ policy: 'rate5' }), /client: /);
  assert.throws(() => sluice.grpcServerInterceptor({ client }), /policy: /);
  assert.throws(() => sluice.grpcServerInterceptor({ client, policy: 'rate5', mode: 'lease' }), /mode: /);
  assert.throws(() => sluice.grpcServerInterceptor({ client, policy: 'rate5', mode: 'admit', allowance: 5 }), /allowance: only a rate policy/);
  assert.throws(() => sluice.grpcServerInterceptor({ client, policy: 'rate5', skip: 'health' }), /skip: /);
  assert.equal(sluice.skipHealthAndReflection({ path: '/grpc.health.v1.Health/Watch' }), true);
  assert.equal(sluice.skipHealthAndReflection({ path: '/grpc.reflection.v1.ServerReflection/ServerReflectionInfo' }), true);
  assert.equal(sluice.skipHealthAndReflection({ path: '/test.Echo/Echo' }), false);
  assert.equal(sluice.grpcAdmission({ metadata: new grpc.Metadata() }), undefined);
});
