'use strict';
// What the Express middleware (lib/express.js) and the gRPC server interceptor
// (lib/grpc_interceptor.js) share: their options, the policy's mode (check or admit, asked of the
// server once), a rate policy's decision (with an allowance), the release of a lease, which
// errors are the caller's own, and the RFC 9457 problem documents of a refusal.

const { status: GrpcStatus } = require('@grpc/grpc-js');
const { NotFound } = require('./errors');
const { Allowances } = require('./allowance');
const { OUTCOMES, Decision, now } = require('./types');

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
    const retry = options.unreachableRetry ?? 1;
    if (typeof retry !== 'number' || !Number.isFinite(retry) || retry < 0) {
      throw new TypeError(`unreachableRetry: must be a number of seconds >= 0, not ${JSON.stringify(retry)}`);
    }
    this.unreachableRetry = retry;
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
    if (local !== null) return local;
    // A block from the server (each ask smaller than the last, down to the request's own hits).
    const askFor = (asked) => client.check(policy, key, { hits: asked, timeout }).then((d) => {
      const following = allowances.answered(key, asked, hits, d, now());
      if (following !== null) return askFor(following);
      return d.allowed ? new Decision({ ...d, remaining: d.remaining + allowances.held(key) }) : d;
    });
    return askFor(allowances.ask(key, hits));
  }

  /**
   * Releases `lease` with `outcome` (one that is not one of OUTCOMES is reported and released as
   * "ignored"), its latency since the admission and its cost; a failure is reported.
   */
  release(lease, outcome, subject) {
    let chosen = outcome;
    if (!OUTCOMES.includes(chosen)) {
      this.report(new RangeError(`outcome: must be one of ${OUTCOMES.join(', ')}, not ${JSON.stringify(chosen)} (released as "ignored")`), subject);
      chosen = 'ignored';
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
