'use strict';
// The Express middleware, served for real over HTTP in front of a real `sluice serve`.

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const sluice = require('..');
const { startServer, uniqueKey, waitFor, freePort, sleep } = require('./helpers');
const helpers = require('./helpers');

let server;
let client; // the tests' own view of the server
const open = []; // HTTP servers and clients to close at the end

before(async () => {
  server = await startServer();
  client = new sluice.Client(server.grpcTarget, { timeout: 5 });
});

after(async () => {
  for (const o of open) o.close();
  client?.close();
  await server?.stop();
});

const recordingClient = (target = server.grpcTarget) => helpers.recordingClient(target, open);

/** An Express app: `mw` in front of `routes(app)`, errors answered 500 as JSON and recorded. */
async function serve(mw, routes) {
  const app = express();
  app.errors = [];
  app.use(mw);
  routes(app);
  app.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
    app.errors.push(err);
    res.status(500).json({ error: err.name, message: err.message });
  });
  const srv = http.createServer(app);
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  open.push({ close: () => { srv.closeAllConnections(); srv.close(); } });
  app.port = srv.address().port;
  return app;
}

function get(port, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path, headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
  });
}

async function policy(name) {
  return (await client.policies()).get(name);
}

/** A promise with its resolve, for handlers that wait until the test lets them answer. */
function gate() {
  let open;
  const p = new Promise((r) => { open = r; });
  p.open = open;
  return p;
}

function assertProblem(r, status, type) {
  assert.equal(r.status, status, r.body);
  assert.equal(r.headers['content-type'], 'application/problem+json');
  const problem = JSON.parse(r.body);
  assert.equal(problem.status, status);
  assert.equal(problem.type, type);
  assert.equal(typeof problem.title, 'string');
  assert.ok(problem.detail.length > 0);
  return problem;
}

test('rate policy: a check per request; over the limit, 429 with Retry-After and a problem body', async () => {
  const mw = sluice.express({ client: recordingClient(), policy: 'rate5', key: (req) => req.get('x-user') });
  const app = await serve(mw, (a) => a.get('/', (req, res) => res.json({ remaining: req.sluice.remaining })));
  const user = uniqueKey('user');
  for (let i = 0; i < 5; i++) {
    const r = await get(app.port, '/', { 'x-user': user });
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(r.body), { remaining: 4 - i });
  }
  const r = await get(app.port, '/', { 'x-user': user });
  const problem = assertProblem(r, 429, 'urn:sluice:problem:rate-limit-exceeded');
  assert.match(r.headers['retry-after'], /^\d+$/);
  const retryAfter = Number(r.headers['retry-after']);
  assert.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After ${retryAfter}`);
  assert.equal(problem.retry_after_seconds, retryAfter);
  assert.equal(problem.policy, 'rate5');
  assert.equal(problem.limit, 5);
  assert.equal(problem.remaining, 0);
  // Another key is not affected.
  assert.equal((await get(app.port, '/', { 'x-user': uniqueKey('user') })).status, 200);
  assert.deepEqual(app.errors, []);
});

test('rate policy: the default key is the client address; hits per request', async () => {
  const mw = sluice.express({ client, policy: 'rate10', hits: (req) => Number(req.query.hits || 1) });
  const app = await serve(mw, (a) => a.get('/', (req, res) => res.send('ok')));
  assert.equal((await get(app.port, '/?hits=9')).status, 200);
  assert.equal((await client.peek('rate10', '127.0.0.1')).remaining, 0); // 10 - 9 - the peeked 1
  assert.equal((await get(app.port, '/')).status, 200);
  assert.equal((await get(app.port, '/')).status, 429);
});

test('rate policy: a request that can never pass is 429 without Retry-After', async () => {
  const mw = sluice.express({ client, policy: 'rate5', key: () => uniqueKey(), hits: 6 });
  const app = await serve(mw, (a) => a.get('/', (req, res) => res.send('ok')));
  const r = await get(app.port, '/');
  const problem = assertProblem(r, 429, 'urn:sluice:problem:rate-limit-exceeded');
  assert.equal(r.headers['retry-after'], undefined);
  assert.equal(problem.retry_after_seconds, undefined);
});

test('concurrency policy: admitted while there is room, 503 beyond; the leases are released', async () => {
  const c = recordingClient();
  const mw = sluice.express({ client: c, policy: 'pool2' });
  const wait = gate();
  const app = await serve(mw, (a) => a.get('/slow', async (req, res) => {
    assert.ok(req.sluice instanceof sluice.Lease);
    await wait;
    res.send('done');
  }));
  const released0 = (await policy('pool2')).state.released;
  const slow = [get(app.port, '/slow'), get(app.port, '/slow')];
  await waitFor(async () => (await policy('pool2')).inFlight === 2, 3000, 'two leases');
  const r = await get(app.port, '/slow');
  const problem = assertProblem(r, 503, 'urn:sluice:problem:concurrency-limit-exceeded');
  assert.equal(r.headers['retry-after'], '1');
  assert.equal(problem.retry_after_seconds, 1);
  assert.equal(problem.policy, 'pool2');
  assert.equal(problem.current_in_flight, 2);
  wait.open();
  for (const s of await Promise.all(slow)) assert.equal(s.status, 200);
  await waitFor(async () => (await policy('pool2')).inFlight === 0, 3000, 'leases released');
  assert.equal((await policy('pool2')).state.released, released0 + 2);
  assert.deepEqual(c.releases.map((x) => x.outcome), ['success', 'success']);
  for (const x of c.releases) assert.ok(x.rtt > 0 && x.rtt < 5, `rtt ${x.rtt}`);
});

test('leaseReuse: one admit carries a key\'s requests; close() releases the lease with them all', async () => {
  const c = recordingClient();
  const mw = sluice.express({ client: c, policy: 'big', key: 'reuse', leaseReuse: 30 });
  const app = await serve(mw, (a) => {
    a.get('/ok', (req, res) => res.send('ok'));
    a.get('/busy', (req, res) => res.status(503).send('busy'));
  });
  const p0 = await policy('big');
  for (let i = 0; i < 5; i += 1) assert.equal((await get(app.port, '/ok')).status, 200);
  assert.equal((await get(app.port, '/busy')).status, 503); // an overload: a drop
  const p1 = await policy('big');
  assert.equal(p1.state.admitted, p0.state.admitted + 1);
  assert.equal(p1.inFlight, p0.inFlight + 1); // the lease waits for the next request
  assert.equal(p1.state.renewed, p0.state.renewed); // nothing reported within the hold
  assert.equal(c.releases.length, 0);
  await mw.close();
  const p2 = await policy('big');
  assert.equal(p2.inFlight, p0.inFlight);
  assert.equal(p2.state.renewed, p0.state.renewed + 5);
  assert.equal(p2.state.accepted, p0.state.accepted + 6);
  assert.equal(p2.state.dropped, p0.state.dropped + 1);
  assert.equal(c.releases.length, 1);
  assert.equal(c.releases[0].earlier.length, 5);
  assert.equal(c.releases[0].outcome, 'dropped');
});

test('leaseReuse: a lease carrying a request reports with keep once per hold; a failed keep retires it', async () => {
  const c = recordingClient();
  const keeps = [];
  const keep = c.keep.bind(c);
  let failKeep = false;
  c.keep = (lease, options) => {
    keeps.push(options);
    return failKeep ? Promise.reject(new Error('keep failed')) : keep(lease, options);
  };
  const errors = [];
  const mw = sluice.express({
    client: c, policy: 'big', key: uniqueKey('reuse'), leaseReuse: 0.5, onError: (e) => errors.push(e),
  });
  const app = await serve(mw, (a) => {
    a.get('/ok', (req, res) => res.send('ok'));
    a.get('/slow', async (req, res) => { await sleep(1200); res.send('slow'); });
  });
  const p0 = await policy('big');
  assert.equal((await get(app.port, '/ok')).status, 200); // admitted
  assert.equal((await get(app.port, '/slow')).status, 200); // reused; busy past a hold
  assert.equal(keeps.length, 1); // the request before it, reported while it ran
  assert.equal(keeps[0].earlier.length, 0);
  await waitFor(async () => (await policy('big')).state.renewed === p0.state.renewed + 1, 3000, 'the keep');
  failKeep = true;
  assert.equal((await get(app.port, '/slow')).status, 200); // its keep fails: retired after it
  await waitFor(() => c.releases.length === 1, 3000, 'the retired lease released');
  assert.equal(errors.length, 1);
  assert.equal(c.releases[0].earlier.length, 0);
  assert.equal((await get(app.port, '/ok')).status, 200); // admitted afresh
  const p1 = await policy('big');
  assert.equal(p1.state.admitted, p0.state.admitted + 2);
  await mw.close();
  assert.equal((await policy('big')).inFlight, p0.inFlight);
});

test('concurrency policy with a chained rate policy: 429 once the key is over its rate', async () => {
  const mw = sluice.express({ client, policy: 'chained', key: (req) => req.get('x-user') });
  const app = await serve(mw, (a) => a.get('/', (req, res) => res.send('ok')));
  const user = uniqueKey('user');
  assert.equal((await get(app.port, '/', { 'x-user': user })).status, 200);
  await client.check('rate5', user, { hits: 4 });
  const r = await get(app.port, '/', { 'x-user': user });
  const problem = assertProblem(r, 429, 'urn:sluice:problem:rate-limit-exceeded');
  assert.equal(problem.policy, 'rate5');
  assert.equal(Number(r.headers['retry-after']), problem.retry_after_seconds);
  assert.ok(problem.retry_after_seconds >= 1);
  await waitFor(async () => (await policy('chained')).inFlight === 0, 3000, 'no lease held');
});

test('concurrency policy: the outcome follows the response status, errors included', async () => {
  const c = recordingClient();
  const mw = sluice.express({ client: c, policy: 'big' });
  const app = await serve(mw, (a) => {
    a.get('/ok', (req, res) => res.send('ok'));
    a.get('/missing', (req, res) => res.status(404).send('no'));
    a.get('/overloaded', (req, res) => res.status(503).send('busy'));
    a.get('/gateway-timeout', (req, res) => res.status(504).send('slow'));
    a.get('/broken', (req, res) => res.status(500).send('bug'));
    a.get('/throws', () => { throw new Error('handler failed'); });
    a.get('/rejects', async () => { await sleep(1); throw new Error('async handler failed'); });
    a.get('/chooses', (req, res) => { req.sluice.outcome = 'dropped'; res.send('ok'); });
  });
  const s0 = (await policy('big')).state;
  const paths = ['/ok', '/missing', '/overloaded', '/gateway-timeout', '/broken', '/throws', '/rejects', '/chooses'];
  const statuses = [];
  for (const p of paths) statuses.push((await get(app.port, p)).status);
  assert.deepEqual(statuses, [200, 404, 503, 504, 500, 500, 500, 200]);
  assert.deepEqual(app.errors.map((e) => e.message), ['handler failed', 'async handler failed']);
  await waitFor(async () => (await policy('big')).state.released === s0.released + paths.length, 3000, 'releases');
  assert.deepEqual(c.releases.map((x) => x.outcome),
    ['success', 'success', 'dropped', 'dropped', 'failed', 'failed', 'failed', 'dropped']);
  const s1 = await policy('big');
  assert.equal(s1.inFlight, 0);
  assert.equal(s1.state.dropped, s0.dropped + 3);
  assert.equal(s1.state.ignored, s0.ignored + 3); // an adaptive limit takes "failed" as ignored
});

test('concurrency policy: an aborted request is released as ignored', async () => {
  const c = recordingClient();
  const mw = sluice.express({ client: c, policy: 'big' });
  let handlerSawClose;
  const closed = new Promise((r) => { handlerSawClose = r; });
  const app = await serve(mw, (a) => a.get('/hang', (req, res) => {
    res.write('partial'); // starts answering, never finishes
    res.on('close', handlerSawClose);
  }));
  const s0 = (await policy('big')).state;
  const req = http.get({ host: '127.0.0.1', port: app.port, path: '/hang', agent: false });
  req.on('error', () => {}); // the socket we destroy
  req.on('response', (res) => res.once('data', () => req.destroy()));
  await closed;
  await waitFor(async () => (await policy('big')).inFlight === 0, 3000, 'the lease released');
  assert.deepEqual(c.releases.map((x) => x.outcome), ['ignored']);
  const s1 = (await policy('big')).state;
  assert.equal(s1.ignored, s0.ignored + 1);
  assert.equal(s1.released, s0.released + 1);
});

test('sluice unreachable: fail open by default, the error told to onError', async () => {
  const dead = `127.0.0.1:${await freePort()}`;
  const c = new sluice.Client(dead, { timeout: 1 });
  open.push(c);
  const errors = [];
  for (const mode of [undefined, 'check', 'admit']) {
    const mw = sluice.express({ client: c, policy: 'rate5', mode, onError: (err) => errors.push(err) });
    const app = await serve(mw, (a) => a.get('/', (req, res) => res.json({ sluice: req.sluice })));
    const r = await get(app.port, '/');
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(r.body), { sluice: null });
  }
  assert.equal(errors.length, 3);
  for (const e of errors) assert.ok(e instanceof sluice.Unavailable, `${e.name}: ${e.message}`);
});

test('sluice unreachable with failOpen: false: 503, Retry-After and a problem body', async () => {
  const c = new sluice.Client(`127.0.0.1:${await freePort()}`, { timeout: 1 });
  open.push(c);
  const errors = [];
  const mw = sluice.express({ client: c, policy: 'pool2', failOpen: false, onError: (err) => errors.push(err) });
  let ran = false;
  const app = await serve(mw, (a) => a.get('/', (req, res) => { ran = true; res.send('ok'); }));
  const r = await get(app.port, '/');
  const problem = assertProblem(r, 503, 'urn:sluice:problem:admission-control-unavailable');
  assert.equal(r.headers['retry-after'], '1');
  assert.equal(problem.policy, 'pool2');
  assert.equal(ran, false);
  assert.equal(errors.length, 1);
});

/** A client of a port nobody listens on, counting the checks it is asked for. */
async function deadClient() {
  const c = new sluice.Client(`127.0.0.1:${await freePort()}`, { timeout: 1 });
  open.push(c);
  c.asked = 0;
  const check = c.check.bind(c);
  c.check = (...args) => { c.asked += 1; return check(...args); };
  return c;
}

test('after sluice failed to answer it is not asked for unreachableRetry seconds', async () => {
  const c = await deadClient();
  const errors = [];
  const mw = sluice.express({ client: c, policy: 'rate5', mode: 'check', unreachableRetry: 0.4, onError: (err) => errors.push(err) });
  const app = await serve(mw, (a) => a.get('/', (req, res) => res.json({ sluice: req.sluice })));
  for (let i = 0; i < 3; i++) {
    const r = await get(app.port, '/');
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(r.body), { sluice: null });
  }
  assert.equal(c.asked, 1); // the two after the failure went through unasked
  assert.equal(errors.length, 1); // and unreported: nothing new was learned
  await sleep(450);
  assert.equal((await get(app.port, '/')).status, 200);
  assert.equal(c.asked, 2); // asked again once the time has passed
  assert.equal(errors.length, 2);

  // Failing closed, unreachableRetry is the refusal's Retry-After, asked or not.
  const closed = await deadClient();
  const shut = await serve(sluice.express({ client: closed, policy: 'rate5', mode: 'check', failOpen: false, unreachableRetry: 2.5, onError: () => {} }),
    (a) => a.get('/', (req, res) => res.send('ok')));
  for (let i = 0; i < 2; i++) {
    const r = await get(shut.port, '/');
    assertProblem(r, 503, 'urn:sluice:problem:admission-control-unavailable');
    assert.equal(r.headers['retry-after'], '3');
  }
  assert.equal(closed.asked, 1);

  // 0: every request asks.
  const always = await deadClient();
  const each = await serve(sluice.express({ client: always, policy: 'rate5', mode: 'check', unreachableRetry: 0, onError: () => {} }),
    (a) => a.get('/', (req, res) => res.send('ok')));
  for (let i = 0; i < 2; i++) assert.equal((await get(each.port, '/')).status, 200);
  assert.equal(always.asked, 2);

  for (const bad of [-1, 'x', Number.NaN, Infinity]) {
    assert.throws(() => sluice.express({ client: c, policy: 'rate5', unreachableRetry: bad }),
      /^TypeError: unreachableRetry: must be a number of seconds >= 0/);
  }
});

test('a misconfiguration goes to the error handler whatever the failure mode', async () => {
  const cases = [
    [{ policy: 'no-such-policy' }, sluice.NotFound, /no-such-policy/],
    [{ policy: 'no-such-policy', mode: 'check' }, sluice.NotFound, /^policy: /],
    [{ policy: 'rate5', key: '' }, sluice.InvalidArgument, /^key: must not be empty$/],
    [{ policy: 'pool2', mode: 'check' }, sluice.FailedPrecondition, /^policy: /],
    [{ policy: 'rate5', key: () => { throw new TypeError('no key here'); } }, TypeError, /no key here/],
  ];
  for (const [opts, Cls, message] of cases) {
    const mw = sluice.express({ client, ...opts });
    let ran = false;
    const app = await serve(mw, (a) => a.get('/', (req, res) => { ran = true; res.send('ok'); }));
    const r = await get(app.port, '/');
    assert.equal(r.status, 500, `${JSON.stringify(opts)}: ${r.body}`);
    assert.equal(app.errors.length, 1);
    assert.ok(app.errors[0] instanceof Cls, `${app.errors[0].name}: ${app.errors[0].message}`);
    assert.match(app.errors[0].message, message);
    assert.equal(JSON.parse(r.body).message, app.errors[0].message);
    assert.equal(ran, false);
  }
});

test('skip lets a request through unasked; a refused request never reaches the handler', async () => {
  const c = recordingClient();
  const mw = sluice.express({ client: c, policy: 'rate5', key: 'shared-skip-key', hits: 5, skip: (req) => req.path === '/healthz' });
  const seen = [];
  const app = await serve(mw, (a) => a.get('*splat', (req, res) => { seen.push(req.path); res.send('ok'); }));
  assert.equal((await get(app.port, '/a')).status, 200);
  assert.equal((await get(app.port, '/b')).status, 429);
  assert.equal((await get(app.port, '/healthz')).status, 200);
  assert.deepEqual(seen, ['/a', '/healthz']);
});

test('without Express: a bare node:http handler; the default key is the socket\'s address', async () => {
  const c = recordingClient();
  const limit = sluice.express({ client: c, policy: 'rate5' }); // no req.ip here
  const pool = sluice.express({ client: c, policy: 'big' });
  const srv = http.createServer((req, res) => limit(req, res, (err) => {
    if (err) { res.statusCode = 500; return res.end(err.message); }
    return pool(req, res, (err2) => {
      if (err2) { res.statusCode = 500; return res.end(err2.message); }
      return res.end(req.sluice instanceof sluice.Lease ? 'leased' : 'no lease');
    });
  }));
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  open.push({ close: () => { srv.closeAllConnections(); srv.close(); } });
  for (let i = 0; i < 5; i++) {
    const r = await get(srv.address().port, '/');
    assert.equal(r.status, 200, r.body);
    assert.equal(r.body, 'leased');
  }
  assertProblem(await get(srv.address().port, '/'), 429, 'urn:sluice:problem:rate-limit-exceeded');
  assert.equal((await client.peek('rate5', '127.0.0.1')).allowed, false);
  await waitFor(() => c.releases.length === 5, 3000, 'five releases');
  assert.deepEqual(c.releases.map((x) => x.outcome), Array(5).fill('success'));
  await waitFor(async () => (await policy('big')).inFlight === 0, 3000, 'leases released');
});

test('the middleware checks its options', () => {
  assert.throws(() => sluice.express({ policy: 'rate5' }), TypeError);
  assert.throws(() => sluice.express({ client }), TypeError);
  assert.throws(() => sluice.express({ client, policy: 'rate5', mode: 'lease' }), TypeError);
  assert.throws(() => sluice.express({ client, policy: 'big', leaseReuse: -1 }), /^TypeError: leaseReuse: must be/);
  assert.throws(() => sluice.express({ client, policy: 'rate5', mode: 'check', leaseReuse: 1 }), /^TypeError: leaseReuse: only/);
  assert.equal(sluice.outcomeOfStatus(200), 'success');
  assert.equal(sluice.outcomeOfStatus(429), 'success');
  assert.equal(sluice.outcomeOfStatus(503), 'dropped');
  assert.equal(sluice.outcomeOfStatus(504), 'dropped');
  assert.equal(sluice.outcomeOfStatus(502), 'failed');
});
