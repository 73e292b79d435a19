'use strict';
// Admission control for an Express (or connect, or plain node:http) app: one middleware.
//
//   app.use(sluice.express({ client, policy: 'api-rate', key: (req) => req.get('x-api-key') }));
//
// A rate policy (kind rate or federated): one check per request (with an allowance, one per
// block of requests, the rest admitted here); a denial is answered 429.
// A concurrency policy (adaptive, fleet, concurrency, cascade): an admit per request and a
// release when the response has finished (or the connection closed); a refusal is answered
// with the server's status, 429 when a chained rate policy refused, 503 when a limit did.
// Refusals carry Retry-After (whole seconds, rounded up; none when the request can never pass)
// and an RFC 9457 application/problem+json body. See the README for the outcome rules and the
// failure mode.

const { status: GrpcStatus } = require('@grpc/grpc-js');
const { NotFound, Refused } = require('./errors');
const { Allowances } = require('./allowance');
const { OUTCOMES, Decision, now } = require('./types');

const RATE_KINDS = new Set(['rate', 'federated']);
const ADMIT_KINDS = new Set(['adaptive', 'fleet', 'concurrency', 'cascade']);

// Errors that say the middleware (or the app's key function) is wrong, not that sluice could
// not answer: they go to next(err) whatever the failure mode, so a misconfiguration is seen.
const CALLER_ERRORS = new Set([
  GrpcStatus.INVALID_ARGUMENT, GrpcStatus.NOT_FOUND, GrpcStatus.FAILED_PRECONDITION,
  GrpcStatus.PERMISSION_DENIED, GrpcStatus.UNAUTHENTICATED, GrpcStatus.UNIMPLEMENTED,
  GrpcStatus.OUT_OF_RANGE,
]);

/**
 * The outcome a finished response reports at release, from its status: 503 (the handler or
 * its backend refused as overloaded) and 504 (its backend timed out) are "dropped", the limit
 * should come down; another 5xx is "failed" (no latency evidence: an adaptive limit ignores
 * it); anything else is "success" (its latency is evidence, a 4xx included).
 */
function outcomeOfStatus(status) {
  if (status === 503 || status === 504) return 'dropped';
  if (status >= 500) return 'failed';
  return 'success';
}

function retryAfterHeader(seconds) {
  return seconds === null || seconds === undefined ? null : String(Math.max(0, Math.ceil(seconds)));
}

function sendProblem(res, status, problem, retryAfter) {
  const body = typeof problem === 'string' ? problem : JSON.stringify(problem);
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/problem+json');
  res.setHeader('Content-Length', Buffer.byteLength(body));
  res.setHeader('Cache-Control', 'no-store');
  const ra = retryAfterHeader(retryAfter);
  if (ra !== null) res.setHeader('Retry-After', ra);
  res.end(body);
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
 * The middleware. Options:
 *
 *   client      a Client (required)
 *   policy      the policy's name (required)
 *   key         (req) => string, or a string: the key checked (rate) or passed to admit (a
 *               chained rate policy's key). Default: req.ip.
 *   hits        (req) => integer, or an integer: hits a check takes (rate; default 1)
 *   admit       (req) => {tenant, upstream, route, attributes, ttl, maxWait}, or such an
 *               object: what else an admit sends (concurrency)
 *   mode        'check' or 'admit'; default: from the policy's kind (asked once, policies())
 *   failOpen    true (default): when sluice cannot answer (unreachable, no answer within
 *               `timeout`, any gRPC error but those below), let the request through; false:
 *               answer 503. Errors that say the middleware is misconfigured (INVALID_ARGUMENT,
 *               NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED,
 *               UNIMPLEMENTED, OUT_OF_RANGE, and any error that is not a gRPC one, such as a key
 *               function that throws) go to next(err) in either case
 *   timeout     seconds each call to sluice may take (default 1)
 *   outcome     (req, res) => outcome reported at release for a finished response
 *               (default: outcomeOfStatus(res.statusCode)); req.sluice.outcome, set by a
 *               handler, wins over it
 *   skip        (req) => boolean: true lets the request through unasked
 *   onError     (err, req) => void: told of every error the middleware absorbs (failing open
 *               or closed, a failed release); default: a process warning, at most one a minute
 *   allowance   an integer: on a rate policy, hits taken from the server at once and spent
 *               here by the requests after it, so that most are admitted without a round trip
 *               (default 0: every request is asked). What it can cost is bounded: at most
 *               r x allowanceHold more hits in any interval for a rate of r, and unspent hits
 *               lost (lib/allowance.js)
 *   allowanceHold  seconds a hit taken so may wait to be spent (default 0.05); then dropped
 *
 * What the handlers see: req.sluice is the Decision (rate) or the Lease (concurrency), null
 * when sluice could not answer and the request failed open.
 */
function expressMiddleware(options = {}) {
  const { client, policy } = options;
  if (!client || typeof client.check !== 'function' || typeof client.admit !== 'function') {
    throw new TypeError('client: must be a sluice-client Client');
  }
  if (typeof policy !== 'string' || policy === '') throw new TypeError('policy: must be a policy name');
  if (options.mode !== undefined && options.mode !== 'check' && options.mode !== 'admit') {
    throw new TypeError(`mode: must be "check" or "admit", not ${JSON.stringify(options.mode)}`);
  }
  const keyOf = asFunction(options.key, (req) => req.ip || (req.socket && req.socket.remoteAddress) || '');
  const hitsOf = asFunction(options.hits, () => 1);
  const admitOf = asFunction(options.admit, () => ({}));
  const failOpen = options.failOpen !== undefined ? Boolean(options.failOpen) : true;
  const timeout = options.timeout ?? 1;
  const classify = options.outcome || ((req, res) => outcomeOfStatus(res.statusCode));
  const skip = options.skip || null;
  const onError = options.onError || throttledWarning(60);
  if (options.allowance && options.mode === 'admit') {
    throw new TypeError('allowance: only a rate policy\'s hits can be taken ahead (mode is "admit")');
  }
  const allowances = options.allowance ? new Allowances(options.allowance, options.allowanceHold ?? 0.05) : null;

  let mode = options.mode || null;
  let lookup = null;
  function resolveMode() {
    if (!lookup) {
      lookup = client.policies({ timeout }).then((ps) => {
        const p = ps.get(policy);
        if (!p) throw new NotFound(`policy: no policy named "${policy}" on ${client.target}`);
        if (RATE_KINDS.has(p.kind)) mode = 'check';
        else if (ADMIT_KINDS.has(p.kind)) mode = 'admit';
        else throw new TypeError(`policy: "${policy}" is of kind ${p.kind}, neither checked nor admitted`);
        return mode;
      });
      lookup.catch(() => { lookup = null; }); // asked again on the next request
    }
    return lookup;
  }

  function report(err, req) {
    try { onError(err, req); } catch { /* the app's handler must not break the response */ }
  }

  function failed(err, req, res, next) {
    if (!(err && typeof err.code === 'number' && !CALLER_ERRORS.has(err.code))) return next(err);
    report(err, req);
    if (failOpen) {
      req.sluice = null;
      return next();
    }
    return sendProblem(res, 503, unavailableProblem(policy), 1);
  }

  function decided(req, res, next, hits, d) {
    req.sluice = d;
    if (d.allowed) return next();
    return sendProblem(res, 429, rateProblem(policy, hits, d), d.retryAfter);
  }

  // With an allowance: from the hits held here when it can, else a block from the server
  // (each ask smaller than the last, down to the request's own hits).
  function allowanceDecision(key, hits) {
    const askFor = (asked) => client.check(policy, key, { hits: asked, timeout }).then((d) => {
      const following = allowances.answered(key, asked, hits, d, now());
      if (following !== null) return askFor(following);
      return d.allowed ? new Decision({ ...d, remaining: d.remaining + allowances.held(key) }) : d;
    });
    return askFor(allowances.ask(key, hits));
  }

  function check(req, res, next, key) {
    let hits;
    try { hits = hitsOf(req); } catch (err) { return next(err); }
    // Hits the server would reject are asked as they are, so that its error is the answer.
    const held = allowances !== null && Number.isSafeInteger(hits) && hits >= 1;
    if (held) {
      const local = allowances.local(key, hits, now());
      if (local !== null) return decided(req, res, next, hits, local);
    }
    const asked = held ? allowanceDecision(key, hits) : client.check(policy, key, { hits, timeout });
    asked.then((d) => decided(req, res, next, hits, d), (err) => failed(err, req, res, next))
      .catch((err) => report(err, req));
  }

  function admit(req, res, next, key) {
    let extra;
    try { extra = admitOf(req) || {}; } catch (err) { return next(err); }
    client.admit(policy, { ...extra, key, timeout }).then((lease) => {
      req.sluice = lease;
      let done = false;
      const end = () => {
        if (done) return;
        done = true;
        res.removeListener('finish', end);
        res.removeListener('close', end);
        if (lease.released) return;
        const aborted = !res.writableFinished;
        let outcome = lease.outcome;
        if (!outcome) {
          try {
            outcome = aborted ? 'ignored' : classify(req, res);
          } catch (err) {
            report(err, req);
            outcome = 'ignored';
          }
        }
        if (!OUTCOMES.includes(outcome)) {
          report(new RangeError(`outcome: must be one of ${OUTCOMES.join(', ')}, not ${JSON.stringify(outcome)} (released as "ignored")`), req);
          outcome = 'ignored';
        }
        client.release(lease, {
          outcome,
          rtt: Math.max(0, now() - lease.admittedAt),
          cost: lease.cost ?? undefined,
          timeout,
        }).catch((err) => report(err, req));
      };
      if (res.closed || res.destroyed || res.writableFinished || (req.socket && req.socket.destroyed)) {
        // The client went away while the admit was pending: nobody waits for the handler.
        return end();
      }
      res.once('finish', end);
      res.once('close', end);
      return next();
    }, (err) => {
      if (err instanceof Refused) {
        req.sluice = null;
        return sendProblem(res, err.status, refusedProblem(err), err.retryAfter);
      }
      return failed(err, req, res, next);
    }).catch((err) => report(err, req)); // whatever next() threw: never an unhandled rejection
  }

  function run(req, res, next) {
    let key;
    try { key = keyOf(req); } catch (err) { return next(err); }
    if (mode === 'check') return check(req, res, next, key);
    if (allowances !== null) {
      return next(new TypeError(`allowance: policy "${policy}" is admitted, not checked: only a rate policy's hits can be taken ahead`));
    }
    return admit(req, res, next, key);
  }

  return function sluiceMiddleware(req, res, next) {
    if (skip) {
      let skipped;
      try { skipped = skip(req); } catch (err) { return next(err); }
      if (skipped) return next();
    }
    if (mode !== null) return run(req, res, next);
    return resolveMode().then(() => run(req, res, next), (err) => failed(err, req, res, next))
      .catch((err) => report(err, req));
  };
}

module.exports = { expressMiddleware, outcomeOfStatus, rateProblem };
