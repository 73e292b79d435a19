'use strict';
// The errors the client throws. Two kinds of trouble, kept apart on purpose:
//
// - SluiceError (and its subclasses): the call failed. The server answered with a gRPC error
//   status (a malformed field, an unknown policy or lease, a call of the wrong family, the
//   server shutting down) or the channel did (unreachable, deadline). `err.code` is the gRPC
//   status code (a number, as @grpc/grpc-js has it: grpc.status.NOT_FOUND is 5), `err.codeName`
//   its name ("NOT_FOUND"), `err.message` the server's message, which names the field at fault
//   first ("key: must not be empty"), and `err.field` that name ("key").
// - Refused: the call worked and the answer is "not now": an admit was not admitted, because a
//   chained rate policy is over its rate (status 429) or a concurrency limit is reached (503).
//   That is flow control, not a failure, so it is not a SluiceError.
//
// A denied check throws nothing: it returns a Decision with allowed === false.

const { status: GrpcStatus } = require('@grpc/grpc-js');

const CODE_NAMES = Object.fromEntries(Object.entries(GrpcStatus).map(([name, n]) => [n, name]));

// "checks[1].hits: must be >= 1" -> "checks[1].hits"
const FIELD = /^([A-Za-z_][A-Za-z0-9_.[\]]*): /;

class SluiceError extends Error {
  /**
   * @param {string} message the status message (the server's starts with the field at fault)
   * @param {number} [code] the gRPC status code; a subclass has its own
   */
  constructor(message, code) {
    super(message);
    this.name = new.target.name;
    this.code = code ?? new.target.code ?? GrpcStatus.UNKNOWN;
    this.codeName = CODE_NAMES[this.code] || String(this.code);
    const m = FIELD.exec(message || '');
    this.field = m ? m[1] : null;
  }
}
SluiceError.code = GrpcStatus.UNKNOWN;

/** A request field is malformed (empty key, hits < 1, a bad lease id...). */
class InvalidArgument extends SluiceError {}
InvalidArgument.code = GrpcStatus.INVALID_ARGUMENT;

/** No such policy, tenant/upstream, or lease (never issued, released, or expired). */
class NotFound extends SluiceError {}
NotFound.code = GrpcStatus.NOT_FOUND;

/** A call of the wrong family: check on a concurrency policy, admit on a rate policy. */
class FailedPrecondition extends SluiceError {}
FailedPrecondition.code = GrpcStatus.FAILED_PRECONDITION;

/** The server refused the caller. */
class PermissionDenied extends SluiceError {}
PermissionDenied.code = GrpcStatus.PERMISSION_DENIED;

/** The server cannot be reached, or is draining (shutting down). */
class Unavailable extends SluiceError {}
Unavailable.code = GrpcStatus.UNAVAILABLE;

/** No answer within the client's timeout. isTimeout() says true of it. */
class DeadlineExceeded extends SluiceError {}
DeadlineExceeded.code = GrpcStatus.DEADLINE_EXCEEDED;

const BY_CODE = new Map(
  [InvalidArgument, NotFound, FailedPrecondition, PermissionDenied, Unavailable, DeadlineExceeded]
    .map((cls) => [cls.code, cls]));

/** The SluiceError for a failed @grpc/grpc-js call (a subclass when the code has one). */
function fromGrpcError(err) {
  const code = typeof err.code === 'number' ? err.code : GrpcStatus.UNKNOWN;
  const message = err.details || err.message || String(err);
  const Cls = BY_CODE.get(code) || SluiceError;
  const out = new Cls(message, code);
  // The trailers, for who wants them; not enumerable, so that logging the error stays short.
  if (err.metadata) Object.defineProperty(out, 'metadata', { value: err.metadata, enumerable: false });
  return out;
}

/** Error codes Node and common HTTP clients give a timed-out call. */
const TIMEOUT_CODES = new Set([
  'ETIMEDOUT', 'ESOCKETTIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
]);

/**
 * Whether `err` says a call timed out (what lease() reports as "dropped"): a DeadlineExceeded
 * from this client, a gRPC error with code DEADLINE_EXCEEDED, an error named "TimeoutError"
 * (AbortSignal.timeout(), fetch), or one whose `code` is ETIMEDOUT, ESOCKETTIMEDOUT or one of
 * undici's UND_ERR_*_TIMEOUT.
 */
function isTimeout(err) {
  if (err == null || typeof err !== 'object') return false;
  if (err instanceof DeadlineExceeded) return true;
  if (err.name === 'TimeoutError') return true;
  if (typeof err.code === 'string' && TIMEOUT_CODES.has(err.code)) return true;
  if (err.code === GrpcStatus.DEADLINE_EXCEEDED && typeof err.details === 'string') return true;
  return false;
}

function parseProblem(text) {
  if (!text) return {};
  try {
    const v = JSON.parse(text);
    return v && typeof v === 'object' && !Array.isArray(v) ? v : {};
  } catch {
    return {};
  }
}

/**
 * An admit answered "not admitted".
 *
 * status: 429 (a chained rate policy is over its rate; no permit was taken) or 503 (a
 * concurrency limit is reached). title, type, detail: the RFC 9457 problem's fields.
 * retryAfter: seconds until trying again makes sense, or null when the same call can never
 * pass. policy: the policy that refused. level: "rate", "limit" or a gateway level ("tenant",
 * "upstream", "binding", "per_tenant", "route"). current, limit: at the refusing level.
 * problemJson: the server's problem+json document; problem: it parsed ({} if none).
 * waited: seconds the call waited in a queue before this refusal (0: none).
 */
class Refused extends Error {
  constructor(status, {
    title = '', type = '', detail = '', retryAfter = null, policy = '', level = '',
    current = 0, limit = 0, problemJson = '', waited = 0,
  } = {}) {
    super(title ? `${status} ${title}: ${detail}` : `${status}: ${detail}`);
    this.name = 'Refused';
    this.status = status;
    this.title = title;
    this.type = type;
    this.detail = detail;
    this.retryAfter = retryAfter;
    this.policy = policy;
    this.level = level;
    this.current = current;
    this.limit = limit;
    this.problemJson = problemJson;
    this.problem = parseProblem(problemJson);
    this.waited = waited;
  }
}

module.exports = {
  SluiceError,
  InvalidArgument,
  NotFound,
  FailedPrecondition,
  PermissionDenied,
  Unavailable,
  DeadlineExceeded,
  Refused,
  fromGrpcError,
  isTimeout,
};
