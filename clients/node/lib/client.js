'use strict';
// The promise-based gRPC client of `sluice serve` (service sluice.v1.Sluice).

const grpc = require('@grpc/grpc-js');
const { loadSluice } = require('./proto');
const { FailedPrecondition, Refused, Unavailable, fromGrpcError, isTimeout } = require('./errors');
const {
  OUTCOMES, Decision, Charge, Lease, PolicyState, Policies, CheckResult, ThrottlerMetric, now,
} = require('./types');
const cascade = require('./cascade');

// The server encodes "never" (a request that can never pass) as the largest Duration.
const NEVER_SECONDS = 315576000000;

const OUTCOME_ENUM = {
  success: 'OUTCOME_SUCCESS',
  dropped: 'OUTCOME_DROPPED',
  ignored: 'OUTCOME_IGNORED',
  failed: 'OUTCOME_FAILED',
  timeout: 'OUTCOME_TIMEOUT',
  overload: 'OUTCOME_OVERLOAD',
};

function seconds(d) {
  return d ? d.seconds + d.nanos / 1e9 : 0;
}

function secondsOrNever(d) {
  return d && d.seconds >= NEVER_SECONDS ? null : seconds(d);
}

/** A Duration message for `value` seconds. The server checks the range. */
function duration(value, name) {
  if (typeof value !== 'number') {
    throw new TypeError(`${name}: must be a number of seconds, not ${JSON.stringify(value)}`);
  }
  if (!Number.isFinite(value)) {
    throw new RangeError(`${name}: must be a finite number of seconds, not ${value}`);
  }
  // Seconds and nanos of the same sign, as a Duration must have them.
  const total = Math.round(value * 1e9);
  const secs = Math.trunc(total / 1e9);
  return { seconds: secs, nanos: Math.round(total - secs * 1e9) };
}

function integer(value, name) {
  if (typeof value !== 'number' || !Number.isSafeInteger(value)) {
    throw new TypeError(`${name}: must be an integer, not ${JSON.stringify(value)}`);
  }
  return value;
}

function checkRequest(policy, key, hits, name = '') {
  // hits is always sent (the field is optional on the wire): 0 must reach the server as 0.
  return { policy, key, hits: integer(hits, `${name}hits`) };
}

function refused(r, waited) {
  return new Refused(r.status, {
    title: r.title,
    type: r.type,
    detail: r.detail,
    retryAfter: secondsOrNever(r.retry_after),
    policy: r.policy,
    level: r.level,
    current: r.current,
    limit: r.limit,
    problemJson: r.problem_json,
    waited,
  });
}

function decision(d) {
  return new Decision({
    allowed: d.allowed,
    limit: d.limit,
    remaining: d.remaining,
    resetAfter: seconds(d.reset_after),
    retryAfter: !d.allowed || d.would_deny ? secondsOrNever(d.retry_after) : 0,
    reason: d.reason,
    detail: d.detail,
    wouldDeny: d.would_deny,
  });
}

function charge(c) {
  return new Charge({
    limit: c.limit,
    remaining: c.remaining,
    overdraft: c.overdraft,
    pending: c.pending,
    resetAfter: seconds(c.reset_after),
    retryAfter: seconds(c.retry_after),
  });
}

function leaseIdOf(lease) {
  return lease instanceof Lease ? lease.leaseId : lease;
}

function checkedOutcome(outcome, field) {
  if (!Object.prototype.hasOwnProperty.call(OUTCOME_ENUM, outcome)) {
    throw new RangeError(`${field}: must be one of ${OUTCOMES.join(', ')}, not ${JSON.stringify(outcome)}`);
  }
  return OUTCOME_ENUM[outcome];
}

/** A ReleaseRequest: the call's outcome and rtt, and the calls the lease carried before it. */
function releaseRequest(lease, outcome, rtt, earlier) {
  const req = { lease_id: leaseIdOf(lease), outcome: checkedOutcome(outcome, 'outcome') };
  if (rtt != null) req.rtt = duration(rtt, 'rtt');
  if (earlier != null) {
    if (!Array.isArray(earlier)) throw new TypeError('earlier: must be an array of {outcome, rtt}');
    req.earlier = earlier.map((e, i) => ({
      outcome: checkedOutcome(e.outcome ?? 'success', `earlier[${i}].outcome`),
      rtt: duration(e.rtt, `earlier[${i}].rtt`),
    }));
  }
  return req;
}

/** The outcome lease() reports: success, or dropped after a timeout, else ignored. */
function outcomeFor(err) {
  if (err === undefined) return 'success';
  return isTimeout(err) ? 'dropped' : 'ignored';
}

/**
 * A client of one sluice server's gRPC API.
 *
 *   const client = new Client('127.0.0.1:7070', { timeout: 2 });
 *
 * Every method returns a promise. Every call has a deadline of `timeout` seconds (per call:
 * the `timeout` option). A failed call rejects with a SluiceError subclass (InvalidArgument,
 * NotFound, ...); a refused admission with Refused; a denied check resolves to a Decision with
 * allowed === false. close() when done (an open channel keeps the process alive only while a
 * call is in flight).
 */
class Client {
  /**
   * @param {string} [target] host:port of the server's gRPC listener
   * @param {object} [options]
   * @param {number} [options.timeout=5] seconds each call may take
   * @param {grpc.ChannelCredentials} [options.credentials] default: insecure
   * @param {object} [options.channelOptions] @grpc/grpc-js channel options
   * @param {string} [options.protoPath] the sluice.proto to load (see defaultProtoPath())
   */
  constructor(target = '127.0.0.1:7070', { timeout = 5, credentials, channelOptions = {}, protoPath } = {}) {
    if (typeof timeout !== 'number' || !(timeout > 0)) {
      throw new RangeError(`timeout: must be a number of seconds > 0, not ${timeout}`);
    }
    this.target = target;
    this.timeout = timeout;
    const pkg = loadSluice(protoPath);
    this._pkg = pkg;
    this._channelOptions = channelOptions;
    this._stub = new pkg.Sluice(target, credentials || grpc.credentials.createInsecure(), channelOptions);
    this._throttler = null; // the sluice.v1.Throttler stub, on the same channel, made at first use
    this._retryBudget = null; // cascade()'s default RetryBudget, made at first use
  }

  /** Closes the channel. Calls after this fail. */
  close() {
    this._stub.close();
  }

  /** Resolves once the channel is connected; rejects with Unavailable after `timeout` seconds. */
  waitReady(timeout = this.timeout) {
    return new Promise((resolve, reject) => {
      this._stub.waitForReady(Date.now() + timeout * 1000, (err) => {
        if (!err) return resolve();
        reject(new Unavailable(`${this.target}: not reachable (${err.message})`));
      });
    });
  }

  _call(method, request, timeout, stub = this._stub) {
    const t = timeout ?? this.timeout;
    return new Promise((resolve, reject) => {
      stub[method](request, { deadline: Date.now() + t * 1000 }, (err, response) => {
        if (err) reject(fromGrpcError(err));
        else resolve(response);
      });
    });
  }

  // ---- rate policies ----

  /**
   * Spends `hits` (default 1) for `key` on rate policy `policy` if all of them are allowed now.
   * A denial spends nothing and resolves to a Decision with allowed === false.
   */
  async check(policy, key, { hits = 1, timeout } = {}) {
    const req = checkRequest(policy, key, hits);
    return decision((await this._call('Check', req, timeout)).decision);
  }

  /** The Decision check() would give now, spending nothing. */
  async peek(policy, key, { hits = 1, timeout } = {}) {
    const req = checkRequest(policy, key, hits);
    return decision((await this._call('Peek', req, timeout)).decision);
  }

  /**
   * Charges `hits` to `key` after the fact (a cost known once the call is over), on a rate or
   * federated policy: counted whatever the key has left, so it may overdraw; negative hits
   * give back what a check took beyond the call's cost. Resolves to the key's Charge.
   */
  async charge(policy, key, hits, { timeout } = {}) {
    const req = { policy, key, hits: integer(hits, 'hits') };
    return charge(await this._call('Charge', req, timeout));
  }

  /**
   * Several checks, all or nothing: `[[policy, key], [policy, key, hits], {policy, key, hits}]`.
   * If any is denied, none is debited. Resolves to {allowed, decisions, deniedIndex}
   * (deniedIndex: null when allowed; decisions: up to and including the first denial).
   */
  async checkMany(checks, { timeout } = {}) {
    if (checks == null || typeof checks[Symbol.iterator] !== 'function') {
      throw new TypeError('checks: must be an array of [policy, key, hits?] or {policy, key, hits?}');
    }
    const list = [];
    for (const c of checks) {
      const i = list.length;
      if (Array.isArray(c)) {
        if (c.length !== 2 && c.length !== 3) {
          throw new RangeError(`checks[${i}]: must be [policy, key] or [policy, key, hits], not ${JSON.stringify(c)}`);
        }
        list.push(checkRequest(c[0], c[1], c.length === 3 ? c[2] : 1, `checks[${i}].`));
      } else if (c && typeof c === 'object') {
        list.push(checkRequest(c.policy, c.key, c.hits ?? 1, `checks[${i}].`));
      } else {
        throw new TypeError(`checks[${i}]: must be [policy, key, hits?] or {policy, key, hits?}`);
      }
    }
    const resp = await this._call('CheckMany', { checks: list }, timeout);
    return {
      allowed: resp.allowed,
      decisions: resp.decisions.map(decision),
      deniedIndex: resp.allowed ? null : resp.denied_index,
    };
  }

  // ---- concurrency policies ----

  /**
   * Admits one call on an adaptive, fleet, concurrency or cascade policy; resolves to its
   * Lease, rejects with Refused (status 429 or 503) when not admitted.
   *
   * Options: key (keys a chained rate policy; a concurrency policy falls back to tenant),
   * tenant, upstream, route (a concurrency policy's levels), ttl (seconds; default the
   * server's lease_ttl), exclude (a cascade's nodes not to choose), maxWait (seconds to wait
   * in an upstream's queue; 0: do not wait; the call's deadline is then timeout + maxWait),
   * attributes ({name: value or [values]}: what else the policy's kind reads), timeout.
   */
  async admit(policy, {
    key = '', tenant = '', upstream = '', route = '', ttl, exclude = [], maxWait, attributes,
    timeout,
  } = {}) {
    if (typeof exclude === 'string' || !Array.isArray(exclude)) {
      throw new TypeError('exclude: must be an array of node names');
    }
    const req = { policy, key, tenant, upstream, route, exclude, attributes: [] };
    for (const [name, value] of Object.entries(attributes || {})) {
      for (const v of Array.isArray(value) ? value : [value]) {
        if (typeof v !== 'string') {
          throw new TypeError(`attributes: ${JSON.stringify(name)} must be a string or an array of strings, not ${JSON.stringify(value)}`);
        }
        req.attributes.push({ name, value: v });
      }
    }
    if (ttl != null) req.ttl = duration(ttl, 'ttl');
    let t = timeout ?? this.timeout;
    if (maxWait != null) {
      req.max_wait = duration(maxWait, 'maxWait');
      t += maxWait;
    }
    const resp = await this._call('Admit', req, t);
    const waited = resp.waited ? seconds(resp.waited) : 0;
    if (!resp.admitted) throw refused(resp.rejection, waited);
    const answered = now();
    const answer = {};
    for (const { name, value } of resp.attributes) {
      if (!(name in answer)) answer[name] = value;
      else if (Array.isArray(answer[name])) answer[name].push(value);
      else answer[name] = [answer[name], value];
    }
    return new Lease({
      leaseId: resp.lease_id,
      ttl: seconds(resp.ttl),
      policy,
      admittedAt: answered,
      chosen: resp.chosen,
      deadline: resp.call_deadline ? answered + seconds(resp.call_deadline) : null,
      waited,
      attributes: answer,
      wouldDeny: resp.would_deny,
      rejection: resp.would_deny && resp.rejection ? refused(resp.rejection, waited) : null,
      reusable: resp.reusable,
    });
  }

  /**
   * Ends a lease and frees its slot; resolves to how long it was held (seconds).
   *
   * `options` (or just the outcome, as a string): outcome ("success" by default; "dropped":
   * timed out or overloaded, the limit should come down; "ignored": says nothing about the
   * backend; "failed": failed, not from overload; "timeout", "overload": a drop, said more
   * precisely), rtt (seconds; default: the time the lease was held), cost (what the call cost
   * the chained rate policy, in hits; the lease's `charged` is then the key's Charge), timeout.
   * earlier ([{outcome, rtt}], oldest first): on a reusable lease, the calls it carried before
   * this one since it was last kept (see keep()), each recorded first.
   * Rejects with NotFound when the lease is unknown, already released or expired; with
   * FailedPrecondition (field "cost") for a cost on a policy that chains no rate policy, the
   * lease then being released all the same (lease.released is set).
   */
  async release(lease, options = {}) {
    const { outcome = 'success', rtt, cost, timeout, earlier } = typeof options === 'string' ? { outcome: options } : options;
    const req = releaseRequest(lease, outcome, rtt, earlier);
    if (cost != null) req.cost = integer(cost, 'cost');
    let resp;
    try {
      resp = await this._call('Release', req, timeout);
    } catch (err) {
      // A cost on a policy that chains no rate policy: the server released the lease all the
      // same (and says so); only the charge failed.
      if (lease instanceof Lease && err instanceof FailedPrecondition && err.field === 'cost') {
        lease.released = true;
      }
      throw err;
    }
    if (lease instanceof Lease) {
      lease.released = true;
      if (resp.charged) lease.charged = charge(resp.charged);
    }
    return seconds(resp.held);
  }

  /**
   * Reports a call a reusable lease (lease.reusable) carried, and keeps the lease's permit for
   * its holder's next call, started now (a Release with keep; its TTL restarts). `options`:
   * outcome, rtt as release()'s, earlier (the calls it carried before this one since it was
   * last kept, oldest first: [{outcome, rtt}]), timeout. Resolves to whether that next call is
   * within the policy's limit: false when the limit came down below the calls in flight (then
   * release the lease once the call ends, and start none on it). Rejects with
   * FailedPrecondition (field "keep") for a lease that is not reusable, released all the same.
   */
  async keep(lease, options = {}) {
    const { outcome = 'success', rtt, timeout, earlier } = options;
    const req = releaseRequest(lease, outcome, rtt, earlier);
    req.keep = true;
    return Boolean((await this._call('Release', req, timeout)).kept);
  }

  /**
   * Extends a live lease to `ttl` seconds from now (default: its current TTL); resolves to the
   * TTL applied. Rejects with NotFound when the lease already expired.
   */
  async heartbeat(lease, { ttl, timeout } = {}) {
    const req = { lease_id: leaseIdOf(lease) };
    if (ttl != null) req.ttl = duration(ttl, 'ttl');
    const applied = seconds((await this._call('Heartbeat', req, timeout)).ttl);
    if (lease instanceof Lease) lease.ttl = applied;
    return applied;
  }

  /**
   * Admits (rejecting with Refused if not admitted; fn does not run), awaits fn(lease), and
   * releases with the time since admission as the RTT; resolves to what fn resolved to.
   *
   *   const body = await client.lease('search', { key: user }, (lease) => callTheBackend());
   *
   * The outcome reported: fn resolved: "success"; fn threw a timeout (isTimeout(): a
   * DeadlineExceeded, an AbortSignal.timeout() or fetch TimeoutError, ETIMEDOUT...):
   * "dropped"; anything else: "ignored". Set lease.outcome inside fn to choose yourself (e.g.
   * "dropped" on an HTTP 503 from the backend), lease.cost to charge the chained rate policy.
   * A lease fn released itself is not released again. When fn threw, a failure to release is
   * swallowed and fn's error is what rejects (the server expires the lease after its TTL); when
   * fn resolved, a failed release rejects (e.g. NotFound when fn outlived the lease's TTL).
   * `options` are admit()'s, and may be left out: lease(policy, fn).
   */
  async lease(policy, options, fn) {
    if (typeof options === 'function' && fn === undefined) {
      fn = options;
      options = {};
    }
    if (typeof fn !== 'function') throw new TypeError('fn: must be a function');
    const lease = await this.admit(policy, options || {});
    let result;
    try {
      result = await fn(lease);
    } catch (err) {
      if (!lease.released) {
        try {
          await this._releaseAtEnd(lease, outcomeFor(err));
        } catch { /* fn's error is the one to see; the server expires the lease */ }
      }
      throw err;
    }
    if (!lease.released) await this._releaseAtEnd(lease, 'success');
    return result;
  }

  /** Releases a lease() lease with its outcome. An outcome set on the lease that is not one of
   *  OUTCOMES still frees the slot (as "ignored"); then a RangeError names it. */
  async _releaseAtEnd(lease, fallback) {
    const chosen = lease.outcome || fallback;
    const valid = Object.prototype.hasOwnProperty.call(OUTCOME_ENUM, chosen);
    await this.release(lease, {
      outcome: valid ? chosen : 'ignored',
      rtt: Math.max(0, now() - lease.admittedAt),
      cost: lease.cost ?? undefined,
    });
    if (!valid) {
      throw new RangeError(`lease.outcome: must be one of ${OUTCOMES.join(', ')}, not ${JSON.stringify(chosen)} (the lease was released as "ignored")`);
    }
  }

  // ---- cascade policies ----

  /**
   * Picks a node of a `cascade` policy (an admit), calls fn(node), reports how it went (a
   * release) and resolves to what fn resolved to:
   *
   *   const res = await client.cascade('replicas', (node) => fetch(`http://${node}/item/7`),
   *     { classify: (r) => outcomeOfHttp(r.status), retries: 1 });
   *
   * The outcome reported: await classify(result) (one of CASCADE_OUTCOMES; without classify,
   * "success"), or, when fn throws, outcomeForException(err) (a timeout is "timeout"; an error
   * carrying HTTP 429/503 or gRPC RESOURCE_EXHAUSTED/UNAVAILABLE "overload"; an AbortError
   * "ignored"), the error then being rethrown. A classify that returns anything else (or
   * throws) releases the lease as "ignored" and rejects (RangeError: the value it returned).
   *
   * Options: retries (how many times a failure is retried on another node, never one already
   * tried; default 0), budget (a RetryBudget: a retry is made only while it allows; default
   * the client's own, 10% of calls plus 10 a second over 10 s, so retries cannot multiply the
   * load during an outage), ttl, key (admit()'s), timeout (each admit's and release's). When
   * no retry is made (none left, the budget spent, no untried node with room), the last
   * failure is what you get: the value it resolved to, or the error it threw. Rejects with
   * Refused when no node has room for the first attempt (fn does not run); a failed admit or
   * release rejects with its error.
   */
  async cascade(policy, fn, { classify, retries = 0, budget, ttl, key = '', timeout } = {}) {
    if (budget == null) {
      if (this._retryBudget === null) this._retryBudget = new cascade.RetryBudget();
      budget = this._retryBudget;
    }
    return cascade.run(this, policy, fn, { classify, retries, budget, ttl, key, timeout });
  }

  // ---- the throttler ----

  /**
   * One throttler check over gRPC (sluice.v1.Throttler/Check), answered as GET
   * /throttler/check answers it: a CheckResult (ok for status 200; 429 over a threshold or
   * failing closed; 417 the app is throttled).
   *
   * Options: app (default "": the throttler's default app), shard ("": the first throttler of
   * the config), scope ("self", "shard", or "": the throttler's default), lowPriority (yields
   * while a normal-priority check was refused recently), threshold (> 0: this check's own
   * threshold for every metric; 0: the metrics' own), timeout. Rejects with NotFound when no
   * throttler serves the shard, InvalidArgument for a bad scope or threshold.
   */
  async throttlerCheck({
    app = '', shard = '', scope = '', lowPriority = false, threshold = 0, timeout,
  } = {}) {
    for (const [name, v] of [['app', app], ['shard', shard], ['scope', scope]]) {
      if (typeof v !== 'string') throw new TypeError(`${name}: must be a string, not ${JSON.stringify(v)}`);
    }
    if (typeof lowPriority !== 'boolean') {
      throw new TypeError(`lowPriority: must be a boolean, not ${JSON.stringify(lowPriority)}`);
    }
    if (typeof threshold !== 'number') {
      throw new TypeError(`threshold: must be a number, not ${JSON.stringify(threshold)}`);
    }
    if (!Number.isFinite(threshold)) throw new RangeError(`threshold: must be finite, not ${threshold}`);
    if (this._throttler === null) {
      if (typeof this._pkg.Throttler !== 'function') {
        throw new Error('throttlerCheck: the loaded proto has no sluice.v1.Throttler service (an older sluice.proto?)');
      }
      // On the Sluice stub's channel (its credentials; those given here are not used): one
      // connection for both services, which close() closes.
      this._throttler = new this._pkg.Throttler(this.target, grpc.credentials.createInsecure(), {
        ...this._channelOptions,
        channelOverride: this._stub.getChannel(),
      });
    }
    const req = { app, shard, scope, low_priority: lowPriority, threshold };
    const resp = await this._call('Check', req, timeout, this._throttler);
    return new CheckResult({
      ok: resp.status_code === 200,
      status: resp.status_code,
      reason: resp.reason,
      value: resp.value,
      threshold: resp.threshold,
      metric: resp.metric || null,
      message: resp.message,
      app: resp.app,
      scope: resp.scope,
      recentlyChecked: resp.recently_checked,
      metrics: resp.metrics.map((m) => new ThrottlerMetric({
        name: m.name,
        status: m.status_code,
        value: m.value,
        threshold: m.threshold,
        reason: m.reason,
        message: m.message,
        scope: m.scope,
        host: m.host,
      })),
    });
  }

  // ---- state ----

  /** Every policy's state (a Policies map), the number of leases held, the config generation. */
  async policies({ timeout } = {}) {
    const resp = await this._call('ListPolicies', {}, timeout);
    const entries = resp.policies.map((p) => {
      let state = {};
      try {
        const parsed = p.state_json ? JSON.parse(p.state_json) : {};
        if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) state = parsed;
      } catch { /* not JSON: no state */ }
      return [p.name, new PolicyState({
        name: p.name, kind: p.kind, rate: p.rate, inFlight: p.in_flight, limit: p.limit, state,
      })];
    });
    return new Policies(entries, resp.leases, resp.config_generation);
  }
}

module.exports = { Client, OUTCOME_ENUM, NEVER_SECONDS };
