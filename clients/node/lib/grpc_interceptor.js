'use strict';
// Admission control for a @grpc/grpc-js server: one server interceptor (grpc-js 1.10 or later).
//
//   const server = new grpc.Server({
//     interceptors: [sluice.grpcServerInterceptor({ client, policy: 'search' })],
//   });
//
// Every call is admitted on the policy before its handler sees it, as the Express middleware
// admits a request: a rate policy (rate, federated) checks each call (with an allowance, one
// check per block of calls); a concurrency policy (adaptive, fleet, concurrency, cascade) admits
// it, and the lease is released when the call ends (a streamed one when its stream ends), with
// the outcome of its status code and its latency.
//
// A refused call never reaches its handler: it ends with RESOURCE_EXHAUSTED (a rate policy, or a
// concurrency policy's chained rate policy: HTTP's 429) or UNAVAILABLE (a concurrency limit, or
// sluice could not be asked with failOpen: false: HTTP's 503), the problem's title and detail as
// the status message, and trailing metadata `retry-after` (whole seconds, rounded up; absent
// when the call can never pass), `grpc-retry-pushback-ms` (gRPC's own retry pushback) and
// `sluice-problem` (the RFC 9457 document, as JSON). The key is the method's full path
// ('/pkg.Service/Method') unless `key` says otherwise. The standard health and reflection
// services are not admitted unless `skip` says otherwise. See the README.

const { Metadata, ServerInterceptingCall, status: GrpcStatus } = require('@grpc/grpc-js');
const { Refused } = require('./errors');
const { Lease } = require('./types');
const { outcomeOfGrpc } = require('./cascade');
const {
  Gate, Decision, isCallerError, retryAfterHeader, rateProblem, refusedProblem, unavailableProblem,
} = require('./admission');

const UNADMITTED_SERVICES = [
  '/grpc.health.v1.Health/',
  '/grpc.reflection.v1alpha.ServerReflection/',
  '/grpc.reflection.v1.ServerReflection/',
];

/** The default `skip`: the standard health and reflection services (a load balancer's probes
 *  must not be refused under load). */
function skipHealthAndReflection(request) {
  return UNADMITTED_SERVICES.some((prefix) => request.path.startsWith(prefix));
}

/**
 * The outcome a lease is released with, from the status code its call ended with (the cascade
 * helpers' outcomeOfGrpc, as the Python interceptor reports it): RESOURCE_EXHAUSTED and
 * UNAVAILABLE "overload" and DEADLINE_EXCEEDED "timeout" (both a drop to a limit, a failure to a
 * cascade's node); CANCELLED "ignored"; UNKNOWN, INTERNAL, UNIMPLEMENTED and DATA_LOSS "failed";
 * OK and the caller's own errors (INVALID_ARGUMENT, NOT_FOUND...) "success".
 */
function outcomeOfGrpcStatus(code) {
  return outcomeOfGrpc(code);
}

/** What `key`, `hits`, `admit`, `skip` and `onError` are given of a call. */
class GrpcRequest {
  constructor(definition, call, metadata) {
    /** The method's full path: '/pkg.Service/Method'. */
    this.path = definition.path;
    const slash = this.path.lastIndexOf('/');
    /** 'pkg.Service' and 'Method'. */
    this.service = this.path.slice(1, Math.max(1, slash));
    this.method = this.path.slice(slash + 1);
    /** The call's metadata (@grpc/grpc-js Metadata). */
    this.metadata = metadata;
    this.requestStream = Boolean(definition.requestStream);
    this.responseStream = Boolean(definition.responseStream);
    /** The interceptor's view of the call (getPeer(), getHost(), getDeadline(), getAuthContext()). */
    this.call = call;
  }

  /** The first value of metadata key `name` (case-insensitive) that is a string; undefined: none. */
  get(name) {
    return this.metadata.get(String(name).toLowerCase()).find((v) => typeof v === 'string');
  }

  /** The client's address ('127.0.0.1:51234'), or 'unknown'. */
  get peer() {
    return this.call.getPeer();
  }
}

// The metadata the handler receives -> its call's Decision, Lease or null (see grpcAdmission()).
const ADMISSIONS = new WeakMap();

/**
 * What the interceptor admitted a call with, given the handler's call object (or its metadata):
 * the Decision (rate) or the Lease (concurrency: set its `outcome` or `cost` before the call
 * ends); null when sluice could not answer and the call failed open; undefined when the call was
 * not admitted by the interceptor (skipped, or no interceptor).
 */
function grpcAdmission(call) {
  const metadata = call instanceof Metadata ? call : call && call.metadata;
  return metadata instanceof Metadata ? ADMISSIONS.get(metadata) : undefined;
}

// Metadata values must be printable ASCII: what is not is escaped as JSON's \uXXXX.
function asciiJson(value) {
  return JSON.stringify(value)
    .replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/** The ending of a refused call: status, message and trailing metadata. */
function refusalStatus(httpStatus, problem, retryAfter) {
  const title = problem.title || (httpStatus === 429 ? 'Rate Limit Exceeded' : 'Service Unavailable');
  const trailers = new Metadata();
  const ra = retryAfterHeader(retryAfter);
  if (ra !== null) {
    trailers.set('retry-after', ra);
    trailers.set('grpc-retry-pushback-ms', String(Math.max(0, Math.ceil(retryAfter * 1000))));
  }
  trailers.set('sluice-problem', asciiJson(problem));
  return {
    code: httpStatus === 429 ? GrpcStatus.RESOURCE_EXHAUSTED : GrpcStatus.UNAVAILABLE,
    details: problem.detail ? `${title}: ${problem.detail}` : String(title),
    metadata: trailers,
  };
}

/** A refused admit's problem, as an object (the server's own document when it sent one). */
function refusedProblemObject(err) {
  const problem = refusedProblem(err);
  if (typeof problem !== 'string') return problem;
  if (Object.keys(err.problem).length > 0) return err.problem;
  return refusedProblem({ ...err, problemJson: '' }); // the server's document did not parse
}

/** The server rejected what the call gave (its key, tenant...), not the policy. */
function requestAtFault(err) {
  return (err.code === GrpcStatus.INVALID_ARGUMENT || err.code === GrpcStatus.NOT_FOUND)
    && Boolean(err.field) && err.field !== 'policy';
}

/** Whether the call's deadline (Date, or milliseconds; Infinity: none) has passed. */
function deadlinePassed(call) {
  const deadline = call.getDeadline();
  const ms = deadline instanceof Date ? deadline.getTime() : Number(deadline);
  return Number.isFinite(ms) && Date.now() >= ms - 10; // the timer's clock and Date.now() differ a little
}

/**
 * The interceptor. Options (those of the Express middleware that apply to a call):
 *
 *   client      a Client (required)
 *   policy      the policy's name (required)
 *   key         (request) => string, or a string: the key checked (rate) or passed to admit
 *               (a chained rate policy's key). Default: the method's path. request is a
 *               GrpcRequest: request.get('x-tenant') reads the metadata
 *   hits        (request) => integer, or an integer: hits a check takes (rate; default 1)
 *   admit       (request) => {tenant, upstream, route, attributes, ttl, maxWait}, or such an
 *               object: what else an admit sends (concurrency)
 *   mode        'check' or 'admit'; default: from the policy's kind (asked once, policies())
 *   failOpen    true (default): when sluice cannot answer, let the call through; false: end it
 *               UNAVAILABLE. Errors that say the interceptor is misconfigured (an unknown policy,
 *               a check on a concurrency policy, a key function that throws: see the Express
 *               middleware) end the call in either case, INVALID_ARGUMENT when the server
 *               rejected what the call gave (an empty key, an unknown tenant), else INTERNAL,
 *               and are told to onError
 *   timeout     seconds each call to sluice may take (default 1)
 *   unreachableRetry  as the Express middleware's: seconds sluice is not asked after it failed
 *               to answer (default 1); with failOpen false, also the refusal's retry-after
 *   skip        (request) => boolean: true lets the call through unasked. Default: the gRPC
 *               health and reflection services; null admits every call
 *   onError     (err, request) => void: told of every error the interceptor absorbs or ends a
 *               call with; default: a process warning, at most one a minute
 *   allowance, allowanceHold   as the Express middleware's (rate policies)
 *   leaseReuse  as the Express middleware's (adaptive policies); the interceptor's close()
 *               releases the waiting leases
 */
function grpcServerInterceptor(options = {}) {
  const gate = new Gate(options, (request) => request.path);
  const { policy } = gate;
  const skip = options.skip === undefined ? skipHealthAndReflection : options.skip;
  if (skip !== null && skip !== false && typeof skip !== 'function') {
    throw new TypeError('skip: must be a function of the request, or null');
  }

  function sluiceServerInterceptor(definition, call) {
    let request = null;
    let lease = null;
    let over = false; // the call has ended (its status sent, or it was cancelled)
    let released = false;

    function release(outcome) {
      if (lease === null || released) return;
      released = true;
      gate.release(lease, lease.outcome || outcome, request);
    }

    function refuse(httpStatus, problem, retryAfter) {
      call.sendStatus(refusalStatus(httpStatus, problem, retryAfter));
    }

    function misconfigured(err) {
      gate.report(err, request);
      const fault = requestAtFault(err);
      call.sendStatus({
        code: fault ? GrpcStatus.INVALID_ARGUMENT : GrpcStatus.INTERNAL,
        details: fault ? err.message : `Admission control is misconfigured on this server (policy ${policy})`,
        metadata: new Metadata(),
      });
    }

    // sluice could not answer (err null: it was not asked, as it failed to answer just before).
    function failed(err, pass) {
      if (err !== null && isCallerError(err)) return misconfigured(err);
      gate.noteFailure(err, request);
      if (gate.failOpen) return pass(null);
      return refuse(503, unavailableProblem(policy), gate.unreachableRetry);
    }

    function decided(hits, d, pass) {
      if (d.allowed) return pass(d);
      return refuse(429, rateProblem(policy, hits, d), d.retryAfter);
    }

    function leased(l, pass) {
      lease = l;
      // The client went away while the admit was pending: nobody waits for the handler.
      if (over) return release('ignored');
      return pass(l);
    }

    function run(pass) {
      let key;
      try { key = gate.keyOf(request); } catch (err) { return misconfigured(err); }
      if (gate.mode === 'check') {
        let hits;
        try { hits = gate.hitsOf(request); } catch (err) { return misconfigured(err); }
        const d = gate.decide(key, hits);
        if (d instanceof Decision) return decided(hits, d, pass); // from an allowance
        return d.then((answer) => decided(hits, answer, pass), (err) => failed(err, pass))
          .catch((err) => gate.report(err, request));
      }
      if (gate.allowances !== null) return misconfigured(gate.allowanceMisuse());
      let extra;
      try { extra = gate.admitOf(request) || {}; } catch (err) { return misconfigured(err); }
      const got = gate.admit(key, extra);
      if (got instanceof Lease) return leased(got, pass); // a kept lease (leaseReuse)
      return got.then((l) => leased(l, pass), (err) => {
        if (err instanceof Refused) return refuse(err.status, refusedProblemObject(err), err.retryAfter);
        return failed(err, pass);
      }).catch((err) => gate.report(err, request));
    }

    function onReceiveMetadata(metadata, next) {
      request = new GrpcRequest(definition, call, metadata);
      // The handler sees the call once its metadata is passed on: only when admitted.
      const pass = (admission) => {
        ADMISSIONS.set(metadata, admission);
        next(metadata);
      };
      if (skip) {
        let skipped;
        try { skipped = skip(request); } catch (err) { return misconfigured(err); }
        if (skipped) return next(metadata);
      }
      if (gate.down()) return failed(null, pass);
      if (gate.mode !== null) return run(pass);
      return gate.resolveMode().then(() => run(pass), (err) => failed(err, pass))
        .catch((err) => gate.report(err, request));
    }

    return new ServerInterceptingCall(call, {
      start(next) {
        next({
          onReceiveMetadata,
          onCancel() {
            // After the status is sent, or when the client went away first (cancelled, or its
            // deadline passed: the server ends such a call without its handler's status).
            over = true;
            release(deadlinePassed(call) ? 'timeout' : 'ignored');
          },
        });
      },
      sendStatus(status, next) {
        // The handler's status (an error it threw is UNKNOWN): the call ends with it.
        over = true;
        next(status);
        release(outcomeOfGrpcStatus(status.code));
      },
    });
  }
  /** Releases the leases kept for the next calls (leaseReuse); resolves when answered. */
  sluiceServerInterceptor.close = () => gate.close();
  sluiceServerInterceptor.allowanceStats = () => gate.allowanceStats();
  return sluiceServerInterceptor;
}

module.exports = {
  grpcServerInterceptor, grpcAdmission, skipHealthAndReflection, outcomeOfGrpcStatus, GrpcRequest,
};
