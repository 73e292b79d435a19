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

const { Refused } = require('./errors');
const { Lease } = require('./types');
const {
  Gate, Decision, isCallerError, retryAfterHeader, rateProblem, refusedProblem, unavailableProblem,
} = require('./admission');

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
 *   unreachableRetry  seconds after sluice failed to answer (UNAVAILABLE, or no answer within
 *               `timeout`) during which it is not asked: the failure mode applies at once,
 *               instead of every request waiting for its own timeout (default 1; 0: always
 *               ask). With failOpen false, also the refusal's Retry-After
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
 *   leaseReuse  seconds a finished request's lease (an adaptive policy's) waits for the next
 *               request of its key, which then goes without an admit; its requests are
 *               reported at most once per leaseReuse (a release with keep), the rest at its
 *               release. Default 0: an admit per request. close() releases the waiting leases
 *
 * What the handlers see: req.sluice is the Decision (rate) or the Lease (concurrency), null
 * when sluice could not answer and the request failed open.
 */
function expressMiddleware(options = {}) {
  const gate = new Gate(options, (req) => req.ip || (req.socket && req.socket.remoteAddress) || '');
  const { policy, skip } = gate;
  const classify = options.outcome || ((req, res) => outcomeOfStatus(res.statusCode));
  const report = (err, req) => gate.report(err, req);

  // sluice could not answer (err null: it was not asked, as it failed to answer just before).
  function failed(err, req, res, next) {
    if (err !== null && isCallerError(err)) return next(err);
    gate.noteFailure(err, req);
    if (gate.failOpen) {
      req.sluice = null;
      return next();
    }
    return sendProblem(res, 503, unavailableProblem(policy), gate.unreachableRetry);
  }

  function decided(req, res, next, hits, d) {
    req.sluice = d;
    if (d.allowed) return next();
    return sendProblem(res, 429, rateProblem(policy, hits, d), d.retryAfter);
  }

  function check(req, res, next, key) {
    let hits;
    try { hits = gate.hitsOf(req); } catch (err) { return next(err); }
    const d = gate.decide(key, hits);
    if (d instanceof Decision) return decided(req, res, next, hits, d); // from an allowance
    d.then((answer) => decided(req, res, next, hits, answer), (err) => failed(err, req, res, next))
      .catch((err) => report(err, req));
  }

  function admit(req, res, next, key) {
    let extra;
    try { extra = gate.admitOf(req) || {}; } catch (err) { return next(err); }
    const leased = (lease) => {
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
        gate.release(lease, outcome, req);
      };
      if (res.closed || res.destroyed || res.writableFinished || (req.socket && req.socket.destroyed)) {
        // The client went away while the admit was pending: nobody waits for the handler.
        return end();
      }
      res.once('finish', end);
      res.once('close', end);
      return next();
    };
    const got = gate.admit(key, extra);
    if (got instanceof Lease) { // a kept lease (leaseReuse): no round trip
      try { leased(got); } catch (err) { report(err, req); }
      return;
    }
    got.then(leased, (err) => {
      if (err instanceof Refused) {
        req.sluice = null;
        return sendProblem(res, err.status, refusedProblem(err), err.retryAfter);
      }
      return failed(err, req, res, next);
    }).catch((err) => report(err, req)); // whatever next() threw: never an unhandled rejection
  }

  function run(req, res, next) {
    let key;
    try { key = gate.keyOf(req); } catch (err) { return next(err); }
    if (gate.mode === 'check') return check(req, res, next, key);
    if (gate.allowances !== null) return next(gate.allowanceMisuse());
    return admit(req, res, next, key);
  }

  function sluiceMiddleware(req, res, next) {
    if (skip) {
      let skipped;
      try { skipped = skip(req); } catch (err) { return next(err); }
      if (skipped) return next();
    }
    if (gate.down()) return failed(null, req, res, next);
    if (gate.mode !== null) return run(req, res, next);
    return gate.resolveMode().then(() => run(req, res, next), (err) => failed(err, req, res, next))
      .catch((err) => report(err, req));
  }
  /** Releases the leases kept for the next requests (leaseReuse); resolves when answered. */
  sluiceMiddleware.close = () => gate.close();
  /** The allowance's counters (null without one). */
  sluiceMiddleware.allowanceStats = () => gate.allowanceStats();
  return sluiceMiddleware;
}

module.exports = { expressMiddleware, outcomeOfStatus, rateProblem };
