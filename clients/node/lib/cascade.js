'use strict';
// The fallback cascade on the client side: how a reply or an error maps to the outcome a
// cascade policy is told, the retry budget that keeps a caller's retries to a share of its
// calls, and client.cascade()'s loop (admit on a `cascade` policy, call the chosen node,
// release with how the call went, retry a failure on another node while the budget allows).

const { status: GrpcStatus } = require('@grpc/grpc-js');
const { Refused, SluiceError, isTimeout } = require('./errors');
const { now } = require('./types');

// What a cascade policy is told of a call (a release's outcome): "success"; "timeout" and
// "overload" (a fast refusal as overloaded: HTTP 429/503, gRPC RESOURCE_EXHAUSTED or
// UNAVAILABLE), both a drop to the node's limit and a failure to its health -- never a cheap
// success, or a shedding node would attract more calls; "failed" (an error that says nothing
// of load); "ignored" (nothing about the node: the caller gave up).
const CASCADE_OUTCOMES = Object.freeze(['success', 'timeout', 'overload', 'failed', 'ignored']);

/**
 * The outcome of an HTTP reply: 429 and 503 overload; 408 and 504 timeout; any other 5xx
 * failed; anything else success (a 4xx is the caller's error: the node answered).
 */
function outcomeOfHttp(status) {
  if (typeof status !== 'number' || !Number.isInteger(status)) {
    throw new TypeError(`status: must be an HTTP status code, not ${JSON.stringify(status)}`);
  }
  if (status === 429 || status === 503) return 'overload';
  if (status === 408 || status === 504) return 'timeout';
  if (status >= 500) return 'failed';
  return 'success';
}

const GRPC_OUTCOMES = new Map([
  [GrpcStatus.RESOURCE_EXHAUSTED, 'overload'],
  [GrpcStatus.UNAVAILABLE, 'overload'],
  [GrpcStatus.DEADLINE_EXCEEDED, 'timeout'],
  [GrpcStatus.CANCELLED, 'ignored'],
  [GrpcStatus.UNKNOWN, 'failed'],
  [GrpcStatus.UNIMPLEMENTED, 'failed'],
  [GrpcStatus.INTERNAL, 'failed'],
  [GrpcStatus.DATA_LOSS, 'failed'],
]);

/**
 * The outcome of a gRPC status code (a number, as @grpc/grpc-js has it, or its name:
 * "UNAVAILABLE"): RESOURCE_EXHAUSTED and UNAVAILABLE overload; DEADLINE_EXCEEDED timeout;
 * CANCELLED ignored; UNKNOWN, UNIMPLEMENTED, INTERNAL and DATA_LOSS failed; OK and the
 * caller's own errors success.
 */
function outcomeOfGrpc(code) {
  let value = code;
  if (typeof code === 'string' && Object.prototype.hasOwnProperty.call(GrpcStatus, code)) {
    value = GrpcStatus[code];
  }
  if (typeof value !== 'number' || !Number.isInteger(value)) {
    throw new TypeError(`code: must be a gRPC status code (a number or its name), not ${JSON.stringify(code)}`);
  }
  return GRPC_OUTCOMES.get(value) || 'success';
}

function httpStatusOf(err) {
  const candidates = [err.status, err.statusCode];
  // HTTP clients that keep the reply on the error: axios (response.status), got
  // (response.statusCode).
  if (err.response && typeof err.response === 'object') {
    candidates.push(err.response.status, err.response.statusCode);
  }
  return candidates.find((s) => Number.isInteger(s) && s >= 100 && s <= 599);
}

function isGrpcError(err) {
  // A @grpc/grpc-js ServiceError: a numeric code with the status details. This client's own
  // SluiceErrors are not read so (as in the Python client): a DeadlineExceeded is a timeout,
  // the others (a ThrottledTimeout included) say nothing of the node's load: failed.
  return typeof err.code === 'number' && typeof err.details === 'string' && !(err instanceof SluiceError);
}

/**
 * The outcome of a call that threw `err`: a timeout (isTimeout(): a DeadlineExceeded, an
 * AbortSignal.timeout() or fetch TimeoutError, ETIMEDOUT...) is "timeout"; a cancellation
 * (an AbortError: the caller gave up) is "ignored"; an error that carries an HTTP status
 * (`status`, `statusCode`, or its `response`'s: axios, got) or a gRPC status code (a
 * @grpc/grpc-js ServiceError) is read as such, what would be a success being "failed";
 * anything else (another SluiceError too) "failed".
 */
function outcomeForException(err) {
  if (err == null || typeof err !== 'object') return 'failed';
  if (isTimeout(err)) return 'timeout';
  if (err.name === 'AbortError') return 'ignored';
  const status = httpStatusOf(err);
  if (status !== undefined) {
    const outcome = outcomeOfHttp(status);
    return outcome === 'success' ? 'failed' : outcome;
  }
  if (isGrpcError(err)) {
    const outcome = outcomeOfGrpc(err.code);
    return outcome === 'success' ? 'failed' : outcome;
  }
  return 'failed';
}

function finite(value, name) {
  if (typeof value !== 'number') {
    throw new TypeError(`${name}: must be a number, not ${JSON.stringify(value)}`);
  }
  if (!Number.isFinite(value)) throw new RangeError(`${name}: must be finite, not ${value}`);
  return value;
}

/**
 * Retries allowed while, over the last `window` seconds,
 * `retries <= ratio * calls + perSecond * window` (calls are first attempts), so retrying
 * cannot multiply the load on a failing backend.
 *
 *   new RetryBudget()                                  // 10% of calls plus 10 a second, over 10 s
 *   new RetryBudget({ ratio: 0.2, perSecond: 0, window: 30, clock: () => seconds })
 */
class RetryBudget {
  constructor({ ratio = 0.1, perSecond = 10, window = 10, clock = now } = {}) {
    if (!(finite(ratio, 'ratio') >= 0 && ratio <= 1)) {
      throw new RangeError(`ratio: must be 0..1, not ${ratio}`);
    }
    if (finite(perSecond, 'perSecond') < 0) {
      throw new RangeError(`perSecond: must be >= 0, not ${perSecond}`);
    }
    if (finite(window, 'window') <= 0) throw new RangeError(`window: must be > 0, not ${window}`);
    if (typeof clock !== 'function') throw new TypeError('clock: must be a function returning seconds');
    this.ratio = ratio;
    this.perSecond = perSecond;
    this.window = window;
    this._clock = clock;
    this._times = []; // when each first attempt or retry was made, oldest first
    this._isRetry = [];
    this._head = 0; // events before it have aged out
    this._calls = 0;
    this._retries = 0;
  }

  _age(t) {
    while (this._head < this._times.length && this._times[this._head] <= t - this.window) {
      if (this._isRetry[this._head]) this._retries -= 1;
      else this._calls -= 1;
      this._head += 1;
    }
    if (this._head > 1024 && this._head * 2 > this._times.length) {
      this._times = this._times.slice(this._head);
      this._isRetry = this._isRetry.slice(this._head);
      this._head = 0;
    }
  }

  /** A first attempt was made. */
  recordCall() {
    const t = this._clock();
    this._age(t);
    this._times.push(t);
    this._isRetry.push(false);
    this._calls += 1;
  }

  /** Spends one retry if it fits; false: make no retry. */
  tryRetry() {
    const t = this._clock();
    this._age(t);
    if (this._retries + 1 > this.ratio * this._calls + this.perSecond * this.window) return false;
    this._times.push(t);
    this._isRetry.push(true);
    this._retries += 1;
    return true;
  }
}

/** client.cascade()'s body (see there). */
async function run(client, policy, fn, { classify, retries, budget, ttl, key, timeout }) {
  if (typeof fn !== 'function') throw new TypeError('fn: must be a function');
  if (classify != null && typeof classify !== 'function') {
    throw new TypeError('classify: must be a function returning an outcome');
  }
  if (typeof retries !== 'number' || !Number.isSafeInteger(retries) || retries < 0) {
    throw new RangeError(`retries: must be a whole number >= 0, not ${JSON.stringify(retries)}`);
  }
  if (!budget || typeof budget.recordCall !== 'function' || typeof budget.tryRetry !== 'function') {
    throw new TypeError('budget: must be a RetryBudget');
  }
  budget.recordCall();
  const tried = [];
  let failure = null; // {result, threw, error} of the last failed attempt
  for (;;) {
    let lease;
    try {
      lease = await client.admit(policy, { key, ttl, exclude: [...tried], timeout });
    } catch (err) {
      if (!(err instanceof Refused) || failure === null) throw err;
      break; // no node left for the retry: the caller gets the failure it has
    }
    const started = now();
    let result;
    let threw = false;
    let error;
    let outcome;
    try {
      result = await fn(lease.chosen);
    } catch (err) {
      threw = true;
      error = err;
      outcome = outcomeForException(err);
    }
    if (!threw) {
      try {
        outcome = classify != null ? await classify(result) : 'success';
      } catch (err) {
        // The call's verdict is unknown: free the node's slot without a word about it.
        await client.release(lease, { outcome: 'ignored', rtt: Math.max(0, now() - started), timeout });
        throw err;
      }
      if (!CASCADE_OUTCOMES.includes(outcome)) {
        await client.release(lease, { outcome: 'ignored', rtt: Math.max(0, now() - started), timeout });
        throw new RangeError(`classify: must return one of ${CASCADE_OUTCOMES.join(', ')}, not ${JSON.stringify(outcome)} (the lease was released as "ignored")`);
      }
    }
    await client.release(lease, { outcome, rtt: Math.max(0, now() - started), timeout });
    if (outcome === 'success' || outcome === 'ignored') {
      if (threw) throw error;
      return result;
    }
    failure = { result, threw, error };
    if (tried.length >= retries || !budget.tryRetry()) break;
    tried.push(lease.chosen);
  }
  if (failure.threw) throw failure.error;
  return failure.result;
}

module.exports = {
  CASCADE_OUTCOMES, outcomeOfHttp, outcomeOfGrpc, outcomeForException, RetryBudget, run,
};
