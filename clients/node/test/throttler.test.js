'use strict';
// The throttler: client.throttlerCheck() (gRPC sluice.v1.Throttler/Check) and the HTTP
// ThrottlerClient against a real `sluice serve` whose throttler probes a metric from a file
// this test writes (a command probe every 50 ms); then the HTTP client against a scripted
// node:http server, for what a real one does not readily do (5xx, answers that are not JSON,
// hangs, dropped connections), and the waiting helpers on a fake clock that sleeping advances.

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');
const sluice = require('..');
const { serverForFile, freePort, httpGet, waitFor } = require('./helpers');

const {
  CheckResult, ThrottlerClient, Backoff, ChunkStats, ThrottledTimeout, waitUntilAllowed, runInChunks,
  NotFound, InvalidArgument, SluiceError, isTimeout,
} = sluice;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sluice-node-throttler-'));
const depth = path.join(dir, 'depth');

/** The metric's new value, in one step: the probe never reads a file half written. */
function writeDepth(value) {
  fs.writeFileSync(`${depth}.new`, `${value}\n`);
  fs.renameSync(`${depth}.new`, depth);
}
writeDepth(3);
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const CONFIG = `
policies:
  db:
    kind: throttler
    shard: main
    fast_interval: 50ms
    dormant_interval: 50ms
    stale_intervals: 40
    low_priority_hold: 5s
    metrics:
      depth:
        probe: command
        command: "cat ${depth}"
        threshold: 5
`;

const shared = serverForFile(CONFIG);

/** The HTTP check's status, as any tool would see it. */
async function httpStatus(app = 'x') {
  return (await httpGet(shared.server.httpPort, `/throttler/check?app=${app}`)).status;
}

/** Sets the metric and waits for the HTTP check to answer `status` with that value. */
async function setDepth(value, status) {
  writeDepth(value);
  await waitFor(async () => {
    const r = await httpGet(shared.server.httpPort, '/throttler/check?app=x');
    return r.status === status && JSON.parse(r.body).Value === value;
  }, 5000, `HTTP ${status} with depth ${value}`);
}

function throttler(options = {}) {
  const t = new ThrottlerClient(`http://127.0.0.1:${shared.server.httpPort}`, { app: 'purge', ...options });
  shared.open.push(t);
  return t;
}

// ---- gRPC: client.throttlerCheck() ----

test('throttlerCheck answers as the HTTP check does: a frozen CheckResult', async () => {
  const { client } = shared;
  await waitFor(async () => (await httpStatus()) === 200, 5000, 'the first sample');
  const r = await client.throttlerCheck({ app: 'purge' });
  assert.ok(r instanceof CheckResult);
  assert.ok(Object.isFrozen(r) && Object.isFrozen(r.metrics));
  assert.deepEqual(
    { ok: r.ok, status: r.status, reason: r.reason, value: r.value, threshold: r.threshold, metric: r.metric, app: r.app, scope: r.scope },
    { ok: true, status: 200, reason: 'ok', value: 3, threshold: 5, metric: 'depth', app: 'purge', scope: 'shard' });
  assert.equal(r.unreachable, false);
  assert.equal(r.metrics.length, 1);
  assert.deepEqual({ ...r.metrics[0] },
    { name: 'depth', status: 200, value: 3, threshold: 5, reason: 'ok', message: '', scope: 'shard', host: 'self' });
  const body = JSON.parse((await httpGet(shared.server.httpPort, '/throttler/check?app=purge')).body);
  assert.deepEqual([body.StatusCode, body.Value, body.Threshold, body.MetricName], [r.status, r.value, r.threshold, r.metric]);

  // The shard and scope asked for; the reader's own threshold (under 3, the same sample is over).
  const self = await client.throttlerCheck({ app: 'purge', shard: 'main', scope: 'self' });
  assert.equal(self.ok, true);
  assert.equal(self.scope, 'self');
  const low = await client.throttlerCheck({ app: 'purge', threshold: 2 });
  assert.deepEqual([low.ok, low.status, low.reason, low.threshold, low.value], [false, 429, 'threshold_exceeded', 2, 3]);
  assert.match(low.message, /over its threshold/);
  // No app: the throttler's default.
  assert.equal((await client.throttlerCheck()).app, 'default');

  // Checked as the app's, in the audit.
  for (let i = 0; i < 3; i++) await client.throttlerCheck({ app: 'audited' });
  const apps = JSON.parse((await httpGet(shared.server.httpPort, '/throttler/recent-apps')).body).apps;
  const audited = apps.find((a) => a.app === 'audited');
  assert.deepEqual([audited?.checks, audited?.last_client], [3, 'grpc'], JSON.stringify(apps));
});

test('throttlerCheck: an unknown shard is NotFound, a bad scope or threshold InvalidArgument', async () => {
  const { client } = shared;
  await assert.rejects(client.throttlerCheck({ app: 'purge', shard: 'nope' }),
    (err) => err instanceof NotFound && /no throttler serves shard 'nope'/.test(err.message));
  await assert.rejects(client.throttlerCheck({ app: 'purge', scope: 'galaxy' }),
    (err) => err instanceof InvalidArgument && err.field === 'scope');
  await assert.rejects(client.throttlerCheck({ app: 'purge', threshold: -1 }),
    (err) => err instanceof InvalidArgument && err.field === 'threshold');
  // Wrong types never reach the server.
  await assert.rejects(client.throttlerCheck({ app: 7 }), { name: 'TypeError', message: /^app/ });
  await assert.rejects(client.throttlerCheck({ lowPriority: 'yes' }), { name: 'TypeError', message: /^lowPriority/ });
  await assert.rejects(client.throttlerCheck({ threshold: NaN }), { name: 'RangeError', message: /^threshold/ });
});

test('throttlerCheck follows the metric; low priority yields while a normal check was refused', async () => {
  const { client } = shared;
  await setDepth(7, 429);
  const over = await client.throttlerCheck({ app: 'ddl' });
  assert.deepEqual([over.ok, over.status, over.reason, over.value, over.threshold], [false, 429, 'threshold_exceeded', 7, 5]);
  assert.equal(over.metrics[0].reason, 'threshold_exceeded');
  await setDepth(3, 200);
  // ddl was refused moments ago (and x, by setDepth): a low-priority app holds back for 5 s.
  const yielded = await client.throttlerCheck({ app: 'purge', lowPriority: true });
  assert.deepEqual([yielded.ok, yielded.status, yielded.reason], [false, 429, 'low_priority']);
  assert.equal((await client.throttlerCheck({ app: 'purge' })).ok, true);
  // The HTTP client's p=low, the same.
  const r = await throttler({ lowPriority: true }).check();
  assert.deepEqual([r.ok, r.status, r.reason], [false, 429, 'low_priority']);
});

// ---- HTTP: ThrottlerClient against the server ----

test('ThrottlerClient: the server\'s answers, refusals, and 404 for an unknown shard', async () => {
  await setDepth(3, 200);
  const t = throttler({ shard: 'main' });
  const r = await t.check();
  assert.ok(r instanceof CheckResult && Object.isFrozen(r));
  assert.deepEqual(
    { ok: r.ok, status: r.status, reason: r.reason, value: r.value, threshold: r.threshold, metric: r.metric, app: r.app, scope: r.scope, message: r.message },
    { ok: true, status: 200, reason: 'ok', value: 3, threshold: 5, metric: 'depth', app: 'purge', scope: 'shard', message: '' });
  assert.equal(r.unreachable, false);
  assert.deepEqual([r.metrics[0].name, r.metrics[0].host, r.metrics[0].status], ['depth', 'self', 200]);
  assert.equal((await throttler({ scope: 'self' }).check()).scope, 'self');

  // An unknown shard: a refusal, whatever onUnreachable says; its reason the status's.
  const nope = await throttler({ shard: 'nope', onUnreachable: 'proceed' }).check();
  assert.deepEqual([nope.ok, nope.status, nope.reason, nope.unreachable], [false, 404, 'not_found', false]);
  assert.equal(nope.message, "no throttler serves shard 'nope'");

  await setDepth(8, 429);
  const over = await t.check();
  assert.deepEqual([over.ok, over.status, over.reason, over.value, over.threshold], [false, 429, 'threshold_exceeded', 8, 5]);
  assert.match(over.message, /over its threshold/);
  await setDepth(3, 200);
});

test('runInChunks against the server: held back while over, resumed once under', async () => {
  await setDepth(9, 429);
  const t = throttler({ app: 'purge-job' });
  const waits = [];
  let chunks = 0;
  const stats = await runInChunks(t, async () => {
    chunks += 1;
    return chunks < 3;
  }, {
    deadlinePerChunk: 10,
    backoff: new Backoff({ initial: 0.05, cap: 0.1, jitter: 0, minInterval: 0.05 }),
    onWait: (result, delay) => {
      waits.push([result.status, result.value, delay]);
      if (waits.length === 2) writeDepth(1); // the database recovers
    },
  });
  assert.equal(chunks, 3);
  assert.ok(stats instanceof ChunkStats);
  assert.equal(stats.chunks, 3);
  assert.ok(stats.refusals >= 2, JSON.stringify(stats));
  assert.equal(stats.checks, stats.refusals + 3);
  assert.equal(stats.maxValueSeen, 9);
  assert.deepEqual(waits.slice(0, 2), [[429, 9, 0.05], [429, 9, 0.1]]);
  assert.ok(Math.abs(stats.waitedSeconds - waits.reduce((a, w) => a + w[2], 0)) < 1e-9);
});

test('waitUntilAllowed against the server: past its deadline, ThrottledTimeout with the last answer', async () => {
  await setDepth(9, 429);
  const started = Date.now();
  await assert.rejects(waitUntilAllowed(throttler(), {
    deadline: 0.3, backoff: new Backoff({ initial: 0.05, cap: 0.1, jitter: 0, minInterval: 0.05 }),
  }), (err) => {
    assert.ok(err instanceof ThrottledTimeout && err instanceof SluiceError);
    assert.equal(isTimeout(err), false); // waiting on the throttler says nothing of a backend
    assert.equal(err.codeName, 'DEADLINE_EXCEEDED');
    assert.deepEqual([err.result.status, err.result.value, err.deadline, err.stats], [429, 9, 0.3, null]);
    assert.match(err.message, /^still throttled after 0.3 s \(last check: HTTP 429, threshold_exceeded, depth=9 \(threshold 5\)\)$/);
    return true;
  });
  const took = (Date.now() - started) / 1000;
  assert.ok(took >= 0.3 && took < 3, `took ${took} s`);
  await setDepth(3, 200);
});

// ---- HTTP: ThrottlerClient against a scripted server ----

/**
 * A node:http server on 127.0.0.1 that gives `answers` in order (the last repeats). An answer:
 * {status, body (an object is sent as JSON)}, or {hang: true} (never answers), or
 * {drop: true} (closes the connection without answering).
 */
async function scripted(...answers) {
  const seen = [];
  let sockets = 0;
  const server = http.createServer((req, res) => {
    if (req.socket.sluiceId === undefined) req.socket.sluiceId = ++sockets;
    const url = new URL(req.url, 'http://x');
    seen.push({ method: req.method, path: url.pathname, query: Object.fromEntries(url.searchParams), socket: req.socket.sluiceId });
    const a = answers.length > 1 ? answers.shift() : answers[0];
    if (a.hang) return;
    if (a.drop) {
      req.socket.destroy();
      return;
    }
    const body = Buffer.isBuffer(a.body) ? a.body : Buffer.from(typeof a.body === 'string' ? a.body : JSON.stringify(a.body ?? {}));
    res.writeHead(a.status ?? 200, { 'Content-Type': 'application/json', 'Content-Length': body.length });
    res.end(body);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const clients = [];
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    answers,
    get connections() { return new Set(seen.map((s) => s.socket)).size; },
    client(options = {}) {
      const c = new ThrottlerClient(this.url, { app: 'purge', ...options });
      clients.push(c);
      return c;
    },
    async close() {
      for (const c of clients) c.close();
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** An answer shaped like the server's: the Vitess fields and sluice's lower-case ones. */
function answer(status = 200, { reason, value = null, threshold = 1, metric = 'lag', message = '' } = {}) {
  reason = reason || { 200: 'ok', 429: 'threshold_exceeded', 417: 'app_throttled' }[status];
  return {
    status,
    body: {
      StatusCode: status, Value: value ?? 0, Threshold: threshold, Message: message, RecentlyChecked: true,
      AppName: 'purge', MetricName: metric, Scope: 'shard',
      Metrics: { [metric]: { StatusCode: status, Value: value, Threshold: threshold, Message: message } },
      reason, value, threshold,
    },
  };
}

/** A clock and a sleep: sleeping advances the clock, and is recorded. */
function fakeClock() {
  const c = { now: 1000, sleeps: [] };
  c.clock = () => c.now;
  c.sleep = async (s) => {
    assert.ok(s >= 0);
    c.sleeps.push(s);
    c.now += s;
  };
  return c;
}

async function closedPortUrl() {
  return `http://127.0.0.1:${await freePort()}`;
}

test('ThrottlerClient sends the app, and the shard, scope and p=low it is given, under a kept path prefix', async () => {
  const s = await scripted(answer(200, { value: 0.4, message: 'fine' }));
  try {
    const r = await s.client().check();
    assert.deepEqual({ ok: r.ok, status: r.status, reason: r.reason, value: r.value, threshold: r.threshold, metric: r.metric, message: r.message },
      { ok: true, status: 200, reason: 'ok', value: 0.4, threshold: 1, metric: 'lag', message: 'fine' });
    assert.deepEqual(s.seen[0], { method: 'GET', path: '/throttler/check', query: { app: 'purge' }, socket: 1 });
    const prefixed = new ThrottlerClient(`${s.url}/sluice/`, { app: 'purge job', shard: 'main', scope: 'self', lowPriority: true });
    await prefixed.check();
    prefixed.close();
    assert.equal(s.seen[1].path, '/sluice/throttler/check');
    assert.deepEqual(s.seen[1].query, { app: 'purge job', shard: 'main', scope: 'self', p: 'low' });
  } finally {
    await s.close();
  }
});

test('ThrottlerClient: 417, 404 and 400 are refusals whatever onUnreachable says', async () => {
  const s = await scripted(answer(417),
    { status: 404, body: { StatusCode: 404, Message: "no metric 'x'", reason: 'unknown_metric' } },
    { status: 400, body: { StatusCode: 400, Message: 'scope: must be self or shard' } });
  try {
    const c = s.client({ onUnreachable: 'proceed' });
    let r = await c.check();
    assert.deepEqual([r.ok, r.status, r.reason], [false, 417, 'app_throttled']);
    r = await c.check();
    assert.deepEqual([r.ok, r.status, r.reason, r.message], [false, 404, 'unknown_metric', "no metric 'x'"]);
    r = await c.check();
    assert.deepEqual([r.ok, r.status, r.reason, r.value, r.metric], [false, 400, 'bad_request', null, null]);
  } finally {
    await s.close();
  }
});

test('ThrottlerClient: a 5xx, an answer that is not a JSON object, a closed port are unreachable: hold, or proceed', async () => {
  for (const [status, body, why] of [
    [500, { StatusCode: 500, Message: 'boom' }, 'unreachable: HTTP 500: boom'],
    [503, 'draining', 'unreachable: HTTP 503: draining'],
    [502, '', 'unreachable: HTTP 502'],
  ]) {
    const s = await scripted({ status, body });
    try {
      const r = await s.client().check();
      assert.deepEqual([r.ok, r.status, r.reason, r.unreachable], [false, status, why, true]);
      assert.equal((await s.client({ onUnreachable: 'proceed' }).check()).ok, true);
    } finally {
      await s.close();
    }
  }
  for (const body of ['<html>hello</html>', '{"StatusCode": 200, "reason"', '[1, 2]', '', Buffer.from([0xff, 0xfe])]) {
    const s = await scripted({ status: 200, body });
    try {
      const r = await s.client().check();
      assert.deepEqual([r.ok, r.status, r.unreachable], [false, 200, true]);
      assert.match(r.reason, /not a JSON object/);
      assert.equal((await s.client({ onUnreachable: 'proceed' }).check()).ok, true);
    } finally {
      await s.close();
    }
  }
  const url = await closedPortUrl();
  const held = new ThrottlerClient(url, { app: 'purge' });
  const r = await held.check();
  assert.deepEqual([r.ok, r.status, r.unreachable], [false, 0, true]);
  assert.match(r.reason, /^unreachable: ECONNREFUSED/);
  assert.ok(r.message.includes(url), r.message);
  const goes = new ThrottlerClient(url, { app: 'purge', onUnreachable: 'proceed' });
  assert.deepEqual([(await goes.check()).ok, (await goes.check()).unreachable], [true, true]);
  held.close();
  goes.close();
});

test('ThrottlerClient: a timeout is unreachable, and the next check reconnects', async () => {
  const s = await scripted({ hang: true }, answer(200));
  try {
    const c = s.client({ timeout: 0.3 });
    const r = await c.check();
    assert.deepEqual([r.ok, r.status, r.unreachable], [false, 0, true]);
    assert.match(r.reason, /timed out/);
    assert.equal((await c.check()).ok, true);
    assert.equal(s.connections, 2);
  } finally {
    await s.close();
  }
});

test('ThrottlerClient: one kept-alive connection; a reused one the server dropped is retried once, a new one never', async () => {
  const s = await scripted(answer(429, { value: 2 }), answer(429, { value: 1.5 }), answer(200));
  try {
    const c = s.client();
    const statuses = [];
    for (let i = 0; i < 6; i++) statuses.push((await c.check()).status);
    assert.deepEqual(statuses, [429, 429, 200, 200, 200, 200]);
    assert.equal(s.seen.length, 6);
    assert.equal(s.connections, 1);
  } finally {
    await s.close();
  }
  const dropped = await scripted(answer(200), { drop: true }, answer(429, { value: 3 }), answer(200));
  try {
    const c = dropped.client();
    assert.equal((await c.check()).ok, true);
    const r = await c.check(); // the kept socket dies under the request: one more try, unseen
    assert.deepEqual([r.status, r.value], [429, 3]);
    assert.equal((await c.check()).ok, true);
    assert.equal(dropped.seen.length, 4);
    assert.equal(dropped.connections, 2);
  } finally {
    await dropped.close();
  }
  const fresh = await scripted({ drop: true }, answer(200));
  try {
    const r = await fresh.client().check();
    assert.deepEqual([r.ok, r.status, r.unreachable], [false, 0, true]);
    assert.equal(fresh.seen.length, 1);
  } finally {
    await fresh.close();
  }
});

test('Backoff doubles up to the cap, jitters within bounds, floors at minInterval, resets', () => {
  const b = new Backoff({ jitter: 0 });
  assert.deepEqual(Array.from({ length: 6 }, () => b.nextDelay()), [1, 2, 4, 4, 4, 4]);
  b.reset();
  assert.deepEqual([b.nextDelay(), b.nextDelay()], [1, 2]);
  const floored = new Backoff({ initial: 0.01, factor: 2, cap: 1, jitter: 0, minInterval: 0.1 });
  const delays = Array.from({ length: 6 }, () => floored.nextDelay());
  assert.deepEqual(delays.slice(0, 4), [0.1, 0.1, 0.1, 0.1]);
  assert.ok(Math.abs(delays[4] - 0.16) < 1e-12 && Math.abs(delays[5] - 0.32) < 1e-12, String(delays));
  // random() at its ends: the spread's ends.
  const ends = [0, 0.999999];
  const spread = new Backoff({ jitter: 0.2, random: () => ends.shift() });
  const [lo, hi] = [spread.nextDelay(), spread.nextDelay()];
  assert.ok(Math.abs(lo - 0.8) < 1e-9 && Math.abs(hi - 2.4) < 1e-5, `${lo} ${hi}`);
  for (const [options, word] of [
    [{ initial: 0 }, 'initial'], [{ factor: 0.5 }, 'factor'], [{ cap: 0.5 }, 'cap'], [{ jitter: 1 }, 'jitter'],
    [{ jitter: -0.1 }, 'jitter'], [{ minInterval: -1 }, 'minInterval'], [{ initial: NaN }, 'initial'],
  ]) {
    assert.throws(() => new Backoff(options), { name: 'RangeError', message: new RegExp(`^${word}:`) });
  }
});

test('waitUntilAllowed backs off between refusals and never sleeps past its deadline', async () => {
  const s = await scripted(answer(417), answer(417), answer(200));
  try {
    const clock = fakeClock();
    const waits = [];
    const r = await waitUntilAllowed(s.client({ onUnreachable: 'proceed' }), {
      deadline: 10, backoff: new Backoff({ jitter: 0 }), clock: clock.clock, sleep: clock.sleep,
      onWait: (res, delay) => waits.push([res.status, delay]),
    });
    assert.equal(r.ok, true);
    assert.deepEqual(clock.sleeps, [1, 2]);
    assert.deepEqual(waits, [[417, 1], [417, 2]]);
  } finally {
    await s.close();
  }
  const over = await scripted(...[1.1, 1.2, 1.3, 1.4].map((value) => answer(429, { value })));
  try {
    const clock = fakeClock();
    await assert.rejects(waitUntilAllowed(over.client(), {
      deadline: 5, backoff: new Backoff({ jitter: 0 }), clock: clock.clock, sleep: clock.sleep,
    }), (err) => {
      assert.ok(err instanceof ThrottledTimeout);
      assert.deepEqual([err.result.value, err.result.status, err.deadline, err.stats], [1.4, 429, 5, null]);
      assert.match(err.message, /threshold_exceeded, lag=1.4/);
      return true;
    });
    // 1 s, 2 s, then the 4 s step cut to the 2 s left; a last check at the deadline.
    assert.deepEqual(clock.sleeps, [1, 2, 2]);
    assert.equal(clock.now, 1005);
    assert.equal(over.seen.length, 4);
    // deadline 0: one check.
    const once = fakeClock();
    await assert.rejects(waitUntilAllowed(over.client(), { deadline: 0, clock: once.clock, sleep: once.sleep }), ThrottledTimeout);
    assert.deepEqual([once.sleeps.length, over.seen.length], [0, 5]);
  } finally {
    await over.close();
  }
  // An unreachable throttler is waited out the same way.
  const clock = fakeClock();
  const gone = new ThrottlerClient(await closedPortUrl(), { app: 'purge' });
  await assert.rejects(waitUntilAllowed(gone, { deadline: 3, backoff: new Backoff({ jitter: 0 }), clock: clock.clock, sleep: clock.sleep }),
    (err) => err instanceof ThrottledTimeout && err.result.unreachable && err.result.status === 0);
  assert.deepEqual(clock.sleeps, [1, 2]);
  gone.close();
  await assert.rejects(waitUntilAllowed(gone, { deadline: -1 }), { name: 'RangeError', message: /^deadline:/ });
  await assert.rejects(waitUntilAllowed(gone, { deadline: '5' }), { name: 'TypeError', message: /^deadline:/ });
  await assert.rejects(waitUntilAllowed(gone, {}), { name: 'TypeError', message: /^deadline:/ });
});

test('runInChunks asks before every chunk, counts, and its timeout carries the stats', async () => {
  const s = await scripted(
    answer(200, { value: 0.5 }), // chunk 1
    answer(429, { value: 1.7 }), answer(429, { value: 2.5 }), answer(200, { value: 0.9 }), // chunk 2
    answer(429, { value: 1.2 }), answer(200, { value: 0.3 }), // chunk 3: the backoff was reset
    answer(200, { value: 0.1 })); // chunk 4, the last
  try {
    const clock = fakeClock();
    const calls = [];
    const waits = [];
    const stats = await runInChunks(s.client(), () => {
      calls.push(s.seen.length); // how many checks came before this chunk
      return calls.length < 4;
    }, {
      deadlinePerChunk: 30, backoff: new Backoff({ jitter: 0 }), clock: clock.clock, sleep: clock.sleep,
      onWait: (r, d) => waits.push([r.status, r.value, d]),
    });
    assert.deepEqual(calls, [1, 4, 6, 7]);
    assert.deepEqual({ ...stats }, { chunks: 4, checks: 7, refusals: 3, waitedSeconds: 4, maxValueSeen: 2.5 });
    assert.deepEqual(clock.sleeps, [1, 2, 1]);
    assert.deepEqual(waits, [[429, 1.7, 1], [429, 2.5, 2], [429, 1.2, 1]]);
  } finally {
    await s.close();
  }
  const t = await scripted(answer(200, { value: 0.5 }), answer(429, { value: 3 }));
  try {
    const clock = fakeClock();
    let ran = 0;
    await assert.rejects(runInChunks(t.client(), () => { ran += 1; return true; }, {
      deadlinePerChunk: 3, backoff: new Backoff({ jitter: 0 }), clock: clock.clock, sleep: clock.sleep,
    }), (err) => {
      assert.ok(err instanceof ThrottledTimeout);
      assert.deepEqual({ ...err.stats }, { chunks: 1, checks: 4, refusals: 3, waitedSeconds: 3, maxValueSeen: 3 });
      assert.equal(err.result.value, 3);
      return true;
    });
    assert.equal(ran, 1); // the second chunk never ran
  } finally {
    await t.close();
  }
  // A chunk must say whether more work remains.
  const one = await scripted(answer(200));
  try {
    await assert.rejects(runInChunks(one.client(), () => undefined, { deadlinePerChunk: 1 }),
      { name: 'TypeError', message: /^chunk: must return true/ });
    assert.equal(one.seen.length, 1);
  } finally {
    await one.close();
  }
});

test('ThrottlerClient checks its arguments', () => {
  const base = 'http://127.0.0.1:8080';
  for (const [url, options, name, word] of [
    [base, { app: '' }, 'TypeError', 'app'],
    [base, {}, 'TypeError', 'app'],
    ['https://127.0.0.1:8080', { app: 'a' }, 'RangeError', 'url'],
    ['127.0.0.1:8080', { app: 'a' }, 'RangeError', 'url'],
    ['http://', { app: 'a' }, 'RangeError', 'url'],
    ['http://h:8080/?app=x', { app: 'a' }, 'RangeError', 'url'],
    ['http://h:port', { app: 'a' }, 'RangeError', 'url'],
    ['http://u:p@h:8080', { app: 'a' }, 'RangeError', 'url'],
    [8080, { app: 'a' }, 'TypeError', 'url'],
    [base, { app: 'a', timeout: 0 }, 'RangeError', 'timeout'],
    [base, { app: 'a', timeout: Infinity }, 'RangeError', 'timeout'],
    [base, { app: 'a', onUnreachable: 'maybe' }, 'RangeError', 'onUnreachable'],
    [base, { app: 'a', scope: 'cluster' }, 'RangeError', 'scope'],
    [base, { app: 'a', shard: '' }, 'TypeError', 'shard'],
    [base, { app: 'a', lowPriority: 1 }, 'TypeError', 'lowPriority'],
  ]) {
    assert.throws(() => new ThrottlerClient(url, options), { name, message: new RegExp(`^${word}:`) }, `${url} ${JSON.stringify(options)}`);
  }
});
