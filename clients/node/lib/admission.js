'use strict';
// What the Express middleware (lib/express.js) and the gRPC server interceptor
// (lib/grpc_interceptor.js) share: their options, the policy's mode (check or admit, asked of the
// server once), a rate policy's decision (with an allowance), the release of a lease, which
// errors are the caller's own, and the RFC 9457 problem documents of a refusal.

const { status: GrpcStatus } = require('@grpc/grpc-js');
const { NotFound } = require('./errors');
const { Allowances } = require('./allowance');
const { OUTCOMES, Decision, Lease, now } = require('./types');

// Calls a kept lease carries before they are reported, whatever the time (then the request that
// ends the last of them sends the keep itself; the server takes at most 1024).
const MAX_UNREPORTED = 256;

/** A reusable lease the gate keeps between requests of one key (leaseReuse). */
class Kept {
  constructor(lease, key, at) {
    this.lease = lease;
    this.key = key;
    this.ended = []; // calls carried, not reported yet: {outcome, rtt}
    this.since = at; // waiting since
    this.reported = at; // its last Release with keep (or its Admit)
    this.retired = false; // the server said it is over its limit, or a keep failed
    this.waiting = false; // in the gate's pool
  }
}

const RATE_KINDS = new Set(['rate', 'federated']);
const ADMIT_KINDS = new Set(['adaptive', 'fleet', 'concurrency', 'cascade']);

// Errors that say the adapter (or the app's key function) is wrong, not that sluice could not
// answer: they are not let through by the failure mode, so that a misconfiguration is seen.
const CALLER_ERRORS = new Set([
  GrpcStatus.INVALID_ARGUMENT, GrpcStatus.NOT_FOUND, GrpcStatus.FAILED_PRECONDITION,
  GrpcStatus.PERMISSION_DENIED, GrpcStatus.UNAUTHENTICATED, GrpcStatus.UNIMPLEMENTED,
  GrpcStatus.OUT_OF_RANGE,
]);

/** Whether `err` is the caller's (see CALLER_ERRORS; any error without a gRPC code is too). */
function isCallerError(err) {
  return !(err && typeof err.code === 'number' && !CALLER_ERRORS.has(err.code));
}

/** Retry-After's value: whole seconds, rounded up; null: none (the request can never pass). */
function retryAfterHeader(seconds) {
  return seconds === null || seconds === undefined ? null : String(Math.max(0, Math.ceil(seconds)));
}

/** The problem+json document of a denied rate check (the fields the server's own have). */
function rateProblem(policy, hits, d) {
  const never = d.retryAfter === null;
  let detail;
  if (d.reason) {
    detail = d.detail || `Rate policy ${policy} denied ${hits} hit(s) for this key: ${d.reason}`;
  } else if (never) {
    detail = `Rate policy ${policy} allows at most ${d.limit} at once; ${hits} can never pass`;
  } else {
    detail = `Rate policy ${policy} allows no more for this key now; retry after ${d.retryAfter}s`;
  }
  const problem = {
    type: 'urn:sluice:problem:rate-limit-exceeded',
    title: 'Rate Limit Exceeded',
    status: 429,
    detail,
    limit_type: 'rate',
    policy,
    limit: d.limit,
    remaining: d.remaining,
  };
  if (!never) problem.retry_after_seconds = Math.max(0, Math.ceil(d.retryAfter));
  if (d.reason) problem.reason = d.reason;
  return problem;
}

/** A refused admit's problem document: the server's own (a string), else one from its fields. */
function refusedProblem(r) {
  if (r.problemJson) return r.problemJson;
  const problem = {
    type: r.type || 'urn:sluice:problem:concurrency-limit-exceeded',
    title: r.title || 'Concurrency Limit Exceeded',
    status: r.status,
    detail: r.detail,
    limit_type: r.level,
    policy: r.policy,
    current_in_flight: r.current,
    max_concurrent: r.limit,
  };
  if (r.retryAfter !== null) problem.retry_after_seconds = Math.max(0, Math.ceil(r.retryAfter));
  return problem;
}

function unavailableProblem(policy) {
  return {
    type: 'urn:sluice:problem:admission-control-unavailable',
    title: 'Admission Control Unavailable',
    status: 503,
    detail: `The admission-control server for policy ${policy} could not be asked`,
    policy,
  };
}

function throttledWarning(intervalSeconds) {
  let last = -Infinity;
  return (err) => {
    const t = now();
    if (t - last < intervalSeconds) return;
    last = t;
    process.emitWarning(`sluice-client: ${err && err.message ? err.message : err}`, {
      code: 'SLUICE_MIDDLEWARE',
    });
  };
}

function asFunction(value, fallback) {
  if (value === undefined) return fallback;
  if (typeof value === 'function') return value;
  return () => value;
}

/**
 * One adapter's admission on one policy: its options checked, with their defaults (`defaultKey`
 * is the adapter's: the client's address for HTTP, the method for gRPC). `subject` below is
 * what the app's functions are given: the request (Express) or the call (gRPC).
 */
class Gate {
  constructor(options, defaultKey) {
    const { client, policy } = options;
    if (!client || typeof client.check !== 'function' || typeof client.admit !== 'function') {
      throw new TypeError('client: must be a sluice-client Client');
    }
    if (typeof policy !== 'string' || policy === '') throw new TypeError('policy: must be a policy name');
    if (options.mode !== undefined && options.mode !== 'check' && options.mode !== 'admit') {
      throw new TypeError(`mode: must be "check" or "admit", not ${JSON.stringify(options.mode)}`);
    }
    this.client = client;
    this.policy = policy;
    this.keyOf = asFunction(options.key, defaultKey);
    this.hitsOf = asFunction(options.hits, () => 1);
    this.admitOf = asFunction(options.admit, () => ({}));
    this.failOpen = options.failOpen !== undefined ? Boolean(options.failOpen) : true;
    this.timeout = options.timeout ?? 1;
    this.skip = options.skip || null;
    this.onError = options.onError || throttledWarning(60);
    if (options.allowance && options.mode === 'admit') {
      throw new TypeError('allowance: only a rate policy\'s hits can be taken ahead (mode is "admit")');
    }
    this.allowances = options.allowance ? new Allowances(options.allowance, options.allowanceHold ?? 0.05) : null;
    this._refilling = 0;
    const retry = options.unreachableRetry ?? 1;
    if (typeof retry !== 'number' || !Number.isFinite(retry) || retry < 0) {
      throw new TypeError(`unreachableRetry: must be a number of seconds >= 0, not ${JSON.stringify(retry)}`);
    }
    this.unreachableRetry = retry;
    const reuse = options.leaseReuse ?? 0;
    if (typeof reuse !== 'number' || !Number.isFinite(reuse) || reuse < 0) {
      throw new TypeError(`leaseReuse: must be a number of seconds >= 0, not ${JSON.stringify(reuse)}`);
    }
    if (reuse > 0 && options.mode === 'check') {
      throw new TypeError('leaseReuse: only a concurrency policy\'s leases can be kept (mode is "check")');
    }
    this.leaseReuse = reuse;
    this._kept = new Map(); // key -> [Kept] waiting for a request
    this._live = new Set(); // every kept lease
    this._keptOf = new WeakMap(); // Lease -> its Kept
    this._sweeper = null;
    this._closing = false;
    this._sends = new Set(); // releases of kept leases not answered yet
    this.stats = { reused: 0, keeps: 0 };
    this._downUntil = -Infinity;
    /** 'check' or 'admit'; null until the policy's kind is known. */
    this.mode = options.mode || null;
    this._lookup = null;
  }

  /** Resolves to the mode, from the policy's kind (asked once; again after a failure). */
  resolveMode() {
    if (!this._lookup) {
      const { client, policy } = this;
      this._lookup = client.policies({ timeout: this.timeout }).then((ps) => {
        const p = ps.get(policy);
        if (!p) throw new NotFound(`policy: no policy named "${policy}" on ${client.target}`);
        if (RATE_KINDS.has(p.kind)) this.mode = 'check';
        else if (ADMIT_KINDS.has(p.kind)) this.mode = 'admit';
        else throw new TypeError(`policy: "${policy}" is of kind ${p.kind}, neither checked nor admitted`);
        return this.mode;
      });
      this._lookup.catch(() => { this._lookup = null; }); // asked again on the next request
    }
    return this._lookup;
  }

  /** The error an admitted policy with an allowance is (only a rate policy's hits are held). */
  allowanceMisuse() {
    return new TypeError(`allowance: policy "${this.policy}" is admitted, not checked: only a rate policy's hits can be taken ahead`);
  }

  /**
   * Whether sluice failed to answer (UNAVAILABLE, DEADLINE_EXCEEDED) less than unreachableRetry
   * seconds ago: then it is not asked, and the failure mode applies at once.
   */
  down() {
    return now() < this._downUntil;
  }

  /**
   * A failure to ask sluice, `err` (null: not asked, as it is down): reported, and one that says
   * it could not be reached keeps it from being asked for unreachableRetry seconds.
   */
  noteFailure(err, subject) {
    if (err === null) return;
    if (err.code === GrpcStatus.UNAVAILABLE || err.code === GrpcStatus.DEADLINE_EXCEEDED) {
      this._downUntil = now() + this.unreachableRetry;
    }
    this.report(err, subject);
  }

  /** Tells onError of `err`; whatever onError throws is swallowed. */
  report(err, subject) {
    try { this.onError(err, subject); } catch { /* the app's handler must not break the response */ }
  }

  /**
   * A rate policy's Decision for `hits` on `key`: a Decision when the hits held here answer it
   * (an allowance), else a promise of the server's.
   */
  decide(key, hits) {
    const { allowances, client, policy, timeout } = this;
    // Hits the server would reject are asked as they are, so that its error is the answer.
    const held = allowances !== null && Number.isSafeInteger(hits) && hits >= 1;
    if (!held) return client.check(policy, key, { hits, timeout });
    const local = allowances.local(key, hits, now());
    if (local !== null) {
      const due = local.allowed ? allowances.takeRefill(key) : 0;
      if (due > 0) this._refill(key, due);
      return local;
    }
    // A block from the server (each ask smaller than the last, down to the request's own hits).
    const askFor = (asked) => client.check(policy, key, { hits: asked, timeout }).then((d) => {
      const following = allowances.answered(key, asked, hits, d, now());
      if (following !== null) return askFor(following);
      return d.allowed ? new Decision({ ...d, remaining: d.remaining + allowances.held(key) }) : d;
    });
    return askFor(allowances.ask(key, hits));
  }

  /**
   * Asks for `hits` more on `key` without waiting (the allowance's refill); its answer, or
   * none, goes to the allowance.
   */
  _refill(key, hits) {
    const { allowances } = this;
    if (this.down()) {
      allowances.refilled(key, hits, null, now());
      return;
    }
    this._refilling += 1;
    this.client.check(this.policy, key, { hits, timeout: this.timeout }).then(
      (d) => allowances.refilled(key, hits, d, now()),
      (err) => {
        allowances.refilled(key, hits, null, now());
        this.noteFailure(err, null);
      },
    ).finally(() => { this._refilling -= 1; });
  }

  /**
   * The allowance's counters, its hits held now and refills not answered yet (each within
   * `timeout`); null without an allowance.
   */
  allowanceStats() {
    const a = this.allowances;
    if (a === null) return null;
    let held = 0;
    for (const key of a.keys.keys()) held += a.held(key);
    return { ...a.stats, hitsHeld: held, refillsInFlight: this._refilling };
  }

  /**
   * A lease for a request of `key`: with leaseReuse, the one a finished request of that key
   * left, if one waits (a Lease, at once); else a promise of the server's Admit (`extra` sent
   * too).
   */
  admit(key, extra) {
    if (this.leaseReuse > 0) {
      const reused = this._reuse(key);
      if (reused !== null) return reused;
    }
    const { client, policy, timeout } = this;
    return client.admit(policy, { ...extra, key, timeout }).then((lease) => {
      if (this.leaseReuse > 0 && lease.reusable) this._keepNew(lease, key);
      return lease;
    });
  }

  /** A lease of `key` waiting for a request, taken for one (null: none). */
  _reuse(key) {
    const waiting = this._kept.get(key);
    if (!waiting) return null;
    const k = waiting.pop();
    if (waiting.length === 0) this._kept.delete(key);
    k.waiting = false;
    const t = now();
    if (t - k.since >= this.leaseReuse) { // waited too long to carry a request
      this._live.delete(k);
      this._send(k, k.ended.splice(0), false);
      return null;
    }
    this.stats.reused += 1;
    const lease = new Lease({ leaseId: k.lease.leaseId, ttl: k.lease.ttl, policy: k.lease.policy, admittedAt: t, reusable: true });
    this._keptOf.set(lease, k);
    return lease;
  }

  /** A new kept lease, carrying its first request. */
  _keepNew(lease, key) {
    const k = new Kept(lease, key, now());
    this._live.add(k);
    this._keptOf.set(lease, k);
    if (this._sweeper === null) {
      this._sweeper = setInterval(() => this._sweep(), this.leaseReuse * 1000);
      this._sweeper.unref();
    }
  }

  /** A request on kept lease `k` ended: it waits for the next one, or is released. */
  _ended(k, outcome, rtt) {
    k.ended.push({ outcome, rtt });
    if (k.retired || this._closing) {
      this._live.delete(k);
      this._send(k, k.ended.splice(0), false);
      return;
    }
    k.since = now();
    k.waiting = true;
    const waiting = this._kept.get(k.key);
    if (waiting) waiting.push(k);
    else this._kept.set(k.key, [k]);
    if (k.ended.length >= MAX_UNREPORTED) {
      // All but this one, each followed by another request on the lease; this one waits for
      // the next request, or goes with the release.
      k.reported = k.since;
      this._send(k, k.ended.splice(0, k.ended.length - 1), true);
    }
  }

  /** No more requests on `k`: released now if it waits, else when its request ends. */
  _retire(k) {
    k.retired = true;
    if (!k.waiting) return;
    this._unpool(k);
    this._live.delete(k);
    this._send(k, k.ended.splice(0), false);
  }

  _unpool(k) {
    const waiting = this._kept.get(k.key) || [];
    const i = waiting.indexOf(k);
    if (i >= 0) waiting.splice(i, 1);
    if (waiting.length === 0) this._kept.delete(k.key);
    k.waiting = false;
  }

  /** A Release of `k` reporting `calls` (the last its own), with keep or not; not waited for. */
  _send(k, calls, keep) {
    if (calls.length === 0) return;
    const last = calls[calls.length - 1];
    const options = { outcome: last.outcome, rtt: last.rtt, earlier: calls.slice(0, -1), timeout: this.timeout };
    let sent;
    if (keep) {
      this.stats.keeps += 1;
      sent = this.client.keep(k.lease, options).then((kept) => { if (!kept) this._retire(k); }, (err) => {
        this.report(err, null);
        this._retire(k);
      });
    } else {
      sent = this.client.release(k.lease.leaseId, options).catch((err) => this.report(err, null));
    }
    this._sends.add(sent);
    sent.finally(() => this._sends.delete(sent));
  }

  /**
   * Each leaseReuse: reports the requests of every kept lease carrying one, not reported for
   * leaseReuse (with keep), and releases the leases that waited leaseReuse without a request.
   */
  _sweep() {
    const t = now();
    for (const k of [...this._live]) {
      if (k.waiting && t - k.since >= this.leaseReuse) {
        this._unpool(k);
        this._live.delete(k);
        this._send(k, k.ended.splice(0), false);
      } else if (!k.waiting && !k.retired && k.ended.length > 0 && t - k.reported >= this.leaseReuse) {
        k.reported = t;
        this._send(k, k.ended.splice(0), true);
      }
    }
    if (this._live.size === 0 && this._sweeper !== null) {
      clearInterval(this._sweeper);
      this._sweeper = null;
    }
  }

  /** Kept leases waiting for a request now (leaseReuse). */
  leasesWaiting() {
    let n = 0;
    for (const waiting of this._kept.values()) n += waiting.length;
    return n;
  }

  /**
   * Releases every kept lease (leaseReuse); resolves once the releases are answered. Requests
   * after it are admitted one by one.
   */
  async close() {
    this._closing = true;
    if (this._sweeper !== null) {
      clearInterval(this._sweeper);
      this._sweeper = null;
    }
    for (const waiting of [...this._kept.values()]) {
      for (const k of [...waiting]) {
        this._unpool(k);
        this._live.delete(k);
        this._send(k, k.ended.splice(0), false);
      }
    }
    while (this._sends.size > 0) await Promise.all([...this._sends]);
  }

  /**
   * Releases `lease` with `outcome` (one that is not one of OUTCOMES is reported and released as
   * "ignored"), its latency since the admission and its cost; a failure is reported. A kept
   * lease (leaseReuse) waits for the next request of its key instead.
   */
  release(lease, outcome, subject) {
    let chosen = outcome;
    if (!OUTCOMES.includes(chosen)) {
      this.report(new RangeError(`outcome: must be one of ${OUTCOMES.join(', ')}, not ${JSON.stringify(chosen)} (released as "ignored")`), subject);
      chosen = 'ignored';
    }
    const k = this._keptOf.get(lease);
    if (k !== undefined) {
      lease.released = true;
      this._ended(k, chosen, Math.max(0, now() - lease.admittedAt));
      return;
    }
    this.client.release(lease, {
      outcome: chosen,
      rtt: Math.max(0, now() - lease.admittedAt),
      cost: lease.cost ?? undefined,
      timeout: this.timeout,
    }).catch((err) => this.report(err, subject));
  }
}

module.exports = {
  Gate,
  Decision,
  isCallerError,
  retryAfterHeader,
  rateProblem,
  refusedProblem,
  unavailableProblem,
};
