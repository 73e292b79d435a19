'use strict';
// A client of the server's throttler check API over HTTP, for batch jobs that work in chunks.
//
// The throttler is collaborative (the Vitess tablet throttler / freno pattern): nothing stands
// between the job and the database it protects; the job asks before each chunk of work and
// holds back while the answer is "no":
//
//   const throttler = new ThrottlerClient('http://127.0.0.1:8080', { app: 'purge', shard: 'main' });
//   const stats = await runInChunks(throttler, async () => {
//     const deleted = await deleteSomeRows(100);   // small enough to not hurt between checks
//     return deleted === 100;                      // true: more work remains
//   }, { deadlinePerChunk: 600 });
//   throttler.close();
//
// One check is GET /throttler/check?app=APP[&scope=self|shard][&shard=S][&p=low]; the status
// code is the answer: 200 go ahead; 429 a metric is over its threshold (or its probe failed or
// is stale: the server fails closed); 417 an operator throttled the app; 404 an unknown metric
// or shard; 400 a malformed argument; 5xx the server failed. The JSON body says why (reason,
// value, threshold, MetricName, Message).
//
// node:http only. The waiting helpers take their clock and sleep as options, so tests (and
// simulations) run without sleeping.

const http = require('node:http');
const { status: GrpcStatus } = require('@grpc/grpc-js');
const { SluiceError } = require('./errors');
const { CheckResult, ThrottlerMetric, now } = require('./types');

// What a refusal means when the body does not say (an older server, or a freno-style one).
const REASON_BY_STATUS = new Map([
  [200, 'ok'], [400, 'bad_request'], [404, 'not_found'], [417, 'app_throttled'],
  [429, 'threshold_exceeded'],
]);

// The errors that mean "the server closed the kept-alive connection": worth one reconnect.
const DROPPED = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED']);

const ON_UNREACHABLE = ['hold', 'proceed'];
const SCOPES = ['self', 'shard'];

function finiteNumber(value, name) {
  if (typeof value !== 'number') {
    throw new TypeError(`${name}: must be a number of seconds, not ${JSON.stringify(value)}`);
  }
  if (!Number.isFinite(value)) throw new RangeError(`${name}: must be finite, not ${value}`);
  return value;
}

function number(v) {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function firstNumber(body, ...keys) {
  for (const key of keys) {
    const n = number(body[key]);
    if (n !== null) return n;
  }
  return null;
}

function str(v) {
  return typeof v === 'string' ? v : '';
}

/** The body's Metrics ({name: {StatusCode, Value, Threshold, reason, Message, Scope, Host}}). */
function metricsOf(body) {
  const out = [];
  const metrics = body.Metrics;
  if (!metrics || typeof metrics !== 'object' || Array.isArray(metrics)) return out;
  for (const [name, m] of Object.entries(metrics)) {
    if (!m || typeof m !== 'object' || Array.isArray(m)) continue;
    out.push(new ThrottlerMetric({
      name,
      status: number(m.StatusCode) ?? 0,
      value: firstNumber(m, 'value', 'Value'),
      threshold: firstNumber(m, 'threshold', 'Threshold'),
      reason: str(m.reason),
      message: str(m.Message),
      scope: str(m.Scope),
      host: str(m.Host),
    }));
  }
  return out;
}

/** "http://host:port/prefix" -> {host, port, prefix (without a trailing slash)}. */
function parseUrl(url) {
  if (typeof url !== 'string') {
    throw new TypeError(`url: must be a string like 'http://127.0.0.1:8080', not ${JSON.stringify(url)}`);
  }
  let parts;
  try {
    parts = new URL(url);
  } catch {
    throw new RangeError(`url: not a URL like 'http://127.0.0.1:8080': ${JSON.stringify(url)}`);
  }
  if (parts.protocol !== 'http:') {
    throw new RangeError(`url: must start with http:// (e.g. 'http://127.0.0.1:8080'), not ${JSON.stringify(url)}`);
  }
  if (!parts.hostname) throw new RangeError(`url: has no host: ${JSON.stringify(url)}`);
  if (parts.search || parts.hash || parts.username || parts.password || /[?#]/.test(url)) {
    throw new RangeError(`url: must be the server's base, without credentials, a query or a fragment, not ${JSON.stringify(url)}`);
  }
  const host = parts.hostname.replace(/^\[(.*)\]$/, '$1'); // an IPv6 literal, without brackets
  return { host, port: parts.port ? Number(parts.port) : 80, prefix: parts.pathname.replace(/\/+$/, '') };
}

/**
 * Asks one sluice server's throttler whether an app may do its next chunk of work.
 *
 *   new ThrottlerClient(url, { app, shard, scope, lowPriority, timeout, onUnreachable })
 *
 * url: the server's HTTP base, "http://HOST:PORT" (a path prefix, as behind a proxy, is kept:
 * "http://gw/sluice" checks /sluice/throttler/check). Only http://. app (required): the app's
 * name ("purge", "gh-ost"): the server's per-app rules, exemptions and operator throttles
 * (417) key on it. shard: ask about this shard (&shard=S; 404 for one the server does not
 * know); default the server's own. scope: "self" (this host's metrics only) or "shard"; default
 * the server's. lowPriority: send p=low: the server refuses this app ("low_priority") for a
 * while after it refused any normal-priority one, so urgent work goes first. timeout: seconds
 * (default 1) for connecting and for each wait for data of one check. onUnreachable: what a
 * check answers when the throttler cannot be asked (refused connection, timeout, a 5xx, an
 * answer that is not JSON): "hold" (ok false, the default) or "proceed" (ok true).
 *
 * Why "hold" by default: a throttler you cannot ask is a throttler saying no. The throttler and
 * the database it protects often fail together (the host is overloaded, the network is
 * partitioned, the database is down and the probes with it), and a batch job that charges on
 * exactly then is the load the throttler exists to stop. Choose "proceed" only for work that
 * must not stall on the throttler's availability and is harmless when the database struggles.
 *
 * Refusals and failures are answers (CheckResult), never rejections; only bad arguments throw
 * (TypeError, RangeError). One keep-alive connection is reused across checks (checks made at
 * once take turns on it; it is reopened once when the server dropped it while idle). close()
 * it when done (an idle kept-alive connection does not keep the process alive).
 */
class ThrottlerClient {
  constructor(url, {
    app, shard = null, scope = null, lowPriority = false, timeout = 1, onUnreachable = 'hold',
  } = {}) {
    const { host, port, prefix } = parseUrl(url);
    if (typeof app !== 'string' || !app) {
      throw new TypeError(`app: must be a non-empty string, not ${JSON.stringify(app)}`);
    }
    if (shard != null && (typeof shard !== 'string' || !shard)) {
      throw new TypeError(`shard: must be a non-empty string or null, not ${JSON.stringify(shard)}`);
    }
    if (scope != null && !SCOPES.includes(scope)) {
      throw new RangeError(`scope: must be 'self', 'shard' or null, not ${JSON.stringify(scope)}`);
    }
    if (typeof lowPriority !== 'boolean') {
      throw new TypeError(`lowPriority: must be a boolean, not ${JSON.stringify(lowPriority)}`);
    }
    if (finiteNumber(timeout, 'timeout') <= 0) {
      throw new RangeError(`timeout: must be > 0 seconds, not ${timeout}`);
    }
    if (!ON_UNREACHABLE.includes(onUnreachable)) {
      throw new RangeError(`onUnreachable: must be 'hold' or 'proceed', not ${JSON.stringify(onUnreachable)}`);
    }
    this.url = url;
    this.app = app;
    this.shard = shard ?? null;
    this.scope = scope ?? null;
    this.lowPriority = lowPriority;
    this.timeout = timeout;
    this.onUnreachable = onUnreachable;
    this._host = host;
    this._port = port;
    const query = new URLSearchParams({ app });
    if (this.scope !== null) query.set('scope', this.scope);
    if (this.shard !== null) query.set('shard', this.shard);
    if (lowPriority) query.set('p', 'low');
    this._target = `${prefix}/throttler/check?${query}`;
    this._agent = null;
  }

  /** Closes the kept-alive connection. A later check opens a new one. */
  close() {
    if (this._agent !== null) {
      this._agent.destroy();
      this._agent = null;
    }
  }

  toString() {
    return `ThrottlerClient(${this.url}, app=${this.app})`;
  }

  /** Asks once; resolves to a CheckResult. Never rejects for an HTTP or network failure. */
  async check() {
    let status;
    let body;
    try {
      ({ status, body } = await this._get());
    } catch (err) {
      const name = err.code || err.name || 'Error';
      const why = err.message ? `${name}: ${err.message}` : name;
      return this._unreachable(0, why, `cannot reach the throttler at ${this.url}: ${why}`);
    }
    return this._result(status, body);
  }

  /** One GET of the check target: {status, body (a Buffer)}; rejects with a network error. */
  async _get() {
    for (let attempt = 1; ; attempt++) {
      if (this._agent === null) this._agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      try {
        return await this._request(this._agent);
      } catch (err) {
        // A kept-alive socket has served a check before: the server may have closed it since
        // (an idle timeout, a restart). Only then is a failure worth one more try.
        if (attempt === 1 && err.reusedSocket && DROPPED.has(err.code)) continue;
        throw err;
      }
    }
  }

  _request(agent) {
    return new Promise((resolve, reject) => {
      const req = http.request({
        host: this._host,
        port: this._port,
        path: this._target,
        method: 'GET',
        agent,
        headers: { Accept: 'application/json', 'User-Agent': 'sluice-client-node/throttler' },
      });
      const fail = (err) => {
        err.reusedSocket = req.reusedSocket;
        req.destroy(); // a timeout leaves the connection mid-exchange: never reuse it
        reject(err);
      };
      // The socket's idle time: connecting, then each wait for data.
      req.setTimeout(this.timeout * 1000, () => {
        const err = new Error(`timed out after ${this.timeout} s`);
        err.code = 'ETIMEDOUT';
        fail(err);
      });
      req.on('error', fail);
      req.on('response', (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
        res.on('error', fail);
        res.on('aborted', () => fail(Object.assign(new Error('the answer was cut short'), { code: 'ECONNRESET' })));
      });
      req.end();
    });
  }

  _unreachable(status, why, message) {
    return new CheckResult({
      ok: this.onUnreachable === 'proceed', status, reason: `unreachable: ${why}`, message,
    });
  }

  _result(status, raw) {
    let text = null;
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(raw);
    } catch { /* not UTF-8 */ }
    let body = null;
    if (text !== null) {
      try {
        const parsed = JSON.parse(text);
        if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) body = parsed;
      } catch { /* not JSON */ }
    }
    if (status >= 500) {
      const detail = str(body?.Message) || raw.subarray(0, 200).toString('utf8').trim();
      const why = `HTTP ${status}${detail ? `: ${detail}` : ''}`;
      return this._unreachable(status, why, `the throttler at ${this.url} failed: ${why}`);
    }
    if (body === null) {
      // Every answer of the throttler's (but HEAD's) is a JSON object: this one is from
      // something else (a proxy's error page, a URL that is not a sluice server).
      const snippet = raw.subarray(0, 80).toString('utf8');
      const why = `HTTP ${status} answer is not a JSON object: ${JSON.stringify(snippet)}`;
      return this._unreachable(status, why, `the answer from ${this.url} is not the throttler's: ${why}`);
    }
    const reason = typeof body.reason === 'string' && body.reason
      ? body.reason : REASON_BY_STATUS.get(status) || `http_${status}`;
    const metric = body.MetricName;
    return new CheckResult({
      ok: status === 200,
      status,
      reason,
      value: firstNumber(body, 'value', 'Value'),
      threshold: firstNumber(body, 'threshold', 'Threshold'),
      metric: typeof metric === 'string' && metric ? metric : null,
      message: str(body.Message),
      app: str(body.AppName),
      scope: str(body.Scope),
      recentlyChecked: body.RecentlyChecked === true,
      metrics: metricsOf(body),
    });
  }
}

/**
 * The delays between refused checks: bounded exponential, jittered, floored.
 *
 * The n-th delay since the last reset() is min(cap, initial * factor^n) times a uniform factor
 * in [1 - jitter, 1 + jitter], and never below minInterval. With the defaults: about 1 s, 2 s,
 * 4 s, 4 s, ... (each +-20 %).
 *
 * Options: initial (the first delay, seconds, > 0), factor (each delay's multiple of the one
 * before, >= 1), cap (the longest delay before jitter, >= initial), jitter (the spread, in
 * [0, 1): jobs refused at the same moment spread out instead of all asking again at once when
 * the throttler opens), minInterval (the shortest delay, >= 0: the throttled metric's sampling
 * interval; asking faster learns nothing new and only loads the throttler), random (a function
 * returning a number in [0, 1), for reproducible delays; default Math.random).
 */
class Backoff {
  constructor({
    initial = 1, factor = 2, cap = 4, jitter = 0.2, minInterval = 0.1, random = Math.random,
  } = {}) {
    finiteNumber(initial, 'initial');
    finiteNumber(factor, 'factor');
    finiteNumber(cap, 'cap');
    finiteNumber(jitter, 'jitter');
    finiteNumber(minInterval, 'minInterval');
    if (initial <= 0) throw new RangeError(`initial: must be > 0 seconds, not ${initial}`);
    if (factor < 1) throw new RangeError(`factor: must be >= 1, not ${factor}`);
    if (cap < initial) throw new RangeError(`cap: must be >= initial (${initial}), not ${cap}`);
    if (!(jitter >= 0 && jitter < 1)) throw new RangeError(`jitter: must be in [0, 1), not ${jitter}`);
    if (minInterval < 0) throw new RangeError(`minInterval: must be >= 0 seconds, not ${minInterval}`);
    if (typeof random !== 'function') throw new TypeError('random: must be a function returning [0, 1)');
    this.initial = initial;
    this.factor = factor;
    this.cap = cap;
    this.jitter = jitter;
    this.minInterval = minInterval;
    this._random = random;
    this._base = initial;
  }

  /** The next delay, seconds; each call moves one step up towards the cap. */
  nextDelay() {
    const base = this._base;
    this._base = Math.min(this.cap, base * this.factor);
    const spread = this.jitter ? 1 - this.jitter + 2 * this.jitter * this._random() : 1;
    return Math.max(this.minInterval, base * spread);
  }

  /** Back to the first delay: call after an allowed check. */
  reset() {
    this._base = this.initial;
  }
}

/**
 * What runInChunks() did. chunks: calls of the chunk function (all that ran, the last
 * included). checks: throttler checks made. refusals: checks that were not ok.
 * waitedSeconds: the sum of the delays slept between refused checks. maxValueSeen: the
 * largest metric value any check reported, null if none did.
 */
class ChunkStats {
  constructor({ chunks = 0, checks = 0, refusals = 0, waitedSeconds = 0, maxValueSeen = null } = {}) {
    this.chunks = chunks;
    this.checks = checks;
    this.refusals = refusals;
    this.waitedSeconds = waitedSeconds;
    this.maxValueSeen = maxValueSeen;
  }

  _saw(result) {
    this.checks += 1;
    if (!result.ok) this.refusals += 1;
    if (result.value !== null && (this.maxValueSeen === null || result.value > this.maxValueSeen)) {
      this.maxValueSeen = result.value;
    }
  }
}

/**
 * The throttler did not allow the work before the deadline.
 *
 * result: the last CheckResult (its reason, value and threshold say what held the work back;
 * result.unreachable: the throttler could not be asked). deadline: the deadline that passed,
 * seconds. stats: from runInChunks(), the ChunkStats up to the timeout (the chunk that was
 * waiting did not run); null from waitUntilAllowed().
 *
 * A SluiceError with code DEADLINE_EXCEEDED, but on purpose not a DeadlineExceeded, and
 * isTimeout() is false of it: client.lease() reports a timeout as a call the backend dropped
 * (lowering an adaptive limit), and waiting on the throttler says nothing about that backend.
 */
class ThrottledTimeout extends SluiceError {
  constructor(result, deadline, stats = null) {
    let what = result.reason;
    if (result.metric !== null && result.value !== null) {
      what += `, ${result.metric}=${result.value}`;
      if (result.threshold !== null) what += ` (threshold ${result.threshold})`;
    }
    super(`still throttled after ${deadline} s (last check: HTTP ${result.status}, ${what})`,
      GrpcStatus.DEADLINE_EXCEEDED);
    this.field = null;
    this.result = result;
    this.deadline = deadline;
    this.stats = stats;
  }
}
ThrottledTimeout.code = GrpcStatus.DEADLINE_EXCEEDED;

function defaultSleep(seconds) {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

function waitOptions({ backoff, clock = now, sleep = defaultSleep, onWait = null }) {
  if (backoff != null && !(backoff instanceof Backoff)) throw new TypeError('backoff: must be a Backoff');
  if (typeof clock !== 'function') throw new TypeError('clock: must be a function returning seconds');
  if (typeof sleep !== 'function') throw new TypeError('sleep: must be a function of seconds');
  if (onWait != null && typeof onWait !== 'function') throw new TypeError('onWait: must be a function');
  return { backoff: backoff ?? new Backoff(), clock, sleep, onWait };
}

/** waitUntilAllowed()'s loop, counting into `stats`; `name` is the deadline's option name. */
async function wait(client, deadline, { backoff, clock, sleep, onWait }, stats, name) {
  if (finiteNumber(deadline, name) < 0) throw new RangeError(`${name}: must be >= 0 seconds, not ${deadline}`);
  const end = clock() + deadline;
  for (;;) {
    const result = await client.check();
    stats._saw(result);
    if (result.ok) {
      backoff.reset();
      return result;
    }
    const remaining = end - clock();
    if (remaining <= 0) throw new ThrottledTimeout(result, deadline);
    // Never past the deadline: a last check right at it, rather than a sleep beyond it.
    const delay = Math.min(backoff.nextDelay(), remaining);
    if (onWait) onWait(result, delay);
    stats.waitedSeconds += delay;
    await sleep(delay);
  }
}

/**
 * Checks until the throttler allows the work; resolves to that ok CheckResult.
 *
 *   await waitUntilAllowed(throttler, { deadline: 60 });
 *
 * Each refusal sleeps backoff.nextDelay() seconds (a new Backoff by default), cut short so as
 * never to sleep past the deadline, and checks again; an ok check resets the backoff. A check
 * refused once `deadline` seconds (from now, by `clock`) have passed rejects with
 * ThrottledTimeout and that last result. deadline 0: check once. onWait(result, delay) is
 * called before each sleep (to log why the job waits). clock (seconds) and sleep (seconds; may
 * return a promise) can be replaced, e.g. by a fake clock that sleep advances.
 *
 * Every non-ok answer is waited out, 400 and 404 too: they mean a bad argument or an unknown
 * shard or metric, which waiting will not fix, so keep the deadline finite.
 */
async function waitUntilAllowed(client, { deadline, backoff, clock, sleep, onWait } = {}) {
  const options = waitOptions({ backoff, clock, sleep, onWait });
  return wait(client, deadline, options, new ChunkStats(), 'deadline');
}

/**
 * Runs a job in chunks, asking the throttler before each: the collaborative loop.
 *
 *   const stats = await runInChunks(throttler, async () => (await deleteRows(100)) === 100,
 *     { deadlinePerChunk: 600 });
 *
 * Before each call of chunk(), waitUntilAllowed() with deadlinePerChunk seconds and the shared
 * backoff (reset after each allowed check), clock, sleep and onWait. chunk() (it may be async)
 * does one unit of work and returns true when more work remains, false when the job is done
 * (anything but a boolean rejects with a TypeError: a forgotten return would otherwise end the
 * job silently). Resolves to the ChunkStats; rejects with ThrottledTimeout (its stats filled
 * in) when one chunk's wait passes its deadline; whatever chunk() throws propagates.
 */
async function runInChunks(client, chunk, { deadlinePerChunk, backoff, clock, sleep, onWait } = {}) {
  if (typeof chunk !== 'function') throw new TypeError('chunk: must be a function');
  const options = waitOptions({ backoff, clock, sleep, onWait });
  const stats = new ChunkStats();
  for (;;) {
    try {
      await wait(client, deadlinePerChunk, options, stats, 'deadlinePerChunk');
    } catch (err) {
      if (err instanceof ThrottledTimeout) err.stats = stats;
      throw err;
    }
    const more = await chunk();
    stats.chunks += 1;
    if (typeof more !== 'boolean') {
      throw new TypeError(`chunk: must return true (more work remains) or false (done), not ${JSON.stringify(more)}`);
    }
    if (!more) return stats;
  }
}

module.exports = {
  ThrottlerClient, Backoff, ChunkStats, ThrottledTimeout, waitUntilAllowed, runInChunks,
};
