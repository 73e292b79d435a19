'use strict';
// The values the client returns. Every duration is a number of seconds; every time (a lease's
// admittedAt and deadline) is seconds on the monotonic clock of performance.now() (see now()).

const { performance } = require('node:perf_hooks');

/** Seconds on the monotonic clock that Lease.admittedAt and Lease.deadline use. */
function now() {
  return performance.now() / 1000;
}

// How a leased call ended (the server's Outcome enum):
//   "success"   it completed; its RTT is latency evidence for adaptive limits
//   "dropped"   it timed out or the backend refused it as overloaded: the limit should come down
//   "ignored"   it says nothing about the backend (cancelled, a client-side error)
//   "failed"    it failed, not from overload (a 500): no latency evidence (adaptive limits treat
//               it as ignored), but a health signal for policies that track one
//   "timeout", "overload"  what a cascade's caller says of a drop: the same as "dropped" to a
//               limit, a failure to a cascade's node
const OUTCOMES = Object.freeze(['success', 'dropped', 'ignored', 'failed', 'timeout', 'overload']);

/**
 * A rate policy's answer for one key.
 *
 * allowed: whether the hits were allowed (and, for check(), debited). limit: the most hits the
 * key may spend at once (GCRA: the burst). remaining: hits still allowed now, after this
 * request. resetAfter: seconds until the key's allowance is whole again. retryAfter: 0 when
 * allowed; when denied, seconds until the same request would pass, or null when it never can
 * (more hits than the policy allows at once). reason: when denied for more than the key's own
 * limit, why (a federated policy: "budget_spent", ...); "" otherwise. detail: with a reason,
 * from check(), what the policy says of it. wouldDeny: allowed only because the policy runs in
 * shadow: it would have refused, as reason and retryAfter say; nothing was debited.
 */
class Decision {
  constructor({ allowed, limit, remaining, resetAfter, retryAfter, reason = '', detail = '', wouldDeny = false }) {
    this.allowed = allowed;
    this.limit = limit;
    this.remaining = remaining;
    this.resetAfter = resetAfter;
    this.retryAfter = retryAfter;
    this.reason = reason;
    this.detail = detail;
    this.wouldDeny = wouldDeny;
    Object.freeze(this);
  }
}

/**
 * A key's allowance after charge() (or a release with a cost).
 *
 * limit, remaining: as in a Decision. overdraft: hits charged past the limit that the key's
 * later checks are waiting out (0: none). pending: a federated policy's hits charged beyond
 * this region's escrow, being taken from the global budget now; 0 otherwise. resetAfter:
 * seconds until the key's allowance is whole again. retryAfter: seconds until a check of one
 * hit could pass (0: now).
 */
class Charge {
  constructor({ limit, remaining, overdraft, pending, resetAfter, retryAfter }) {
    this.limit = limit;
    this.remaining = remaining;
    this.overdraft = overdraft;
    this.pending = pending;
    this.resetAfter = resetAfter;
    this.retryAfter = retryAfter;
    Object.freeze(this);
  }
}

/**
 * An admitted call. Release it (or let client.lease() do it).
 *
 * leaseId: 32 hex digits; whoever knows it can release or extend the lease. ttl: seconds the
 * lease lives without a heartbeat. policy: the policy that admitted it. admittedAt: now() when
 * the admission returned. outcome: inside client.lease() (or the Express middleware), set it to
 * choose the outcome reported at release; null: decided at the end. released: set once
 * released through the client. chosen: what the policy chose (a cascade's node); "" when it
 * names nothing. deadline: now() by which the call must have ended (a fleet policy's call
 * deadline), or null. waited: seconds the call waited in a queue (0: none). attributes: what
 * the policy's kind answered beyond the above, by name (a string, or an array of strings for a
 * name answered more than once). wouldDeny: admitted only because the policy runs in shadow;
 * rejection is then the Refused it would have thrown (null otherwise). cost: set it inside
 * client.lease() to what the call cost the chained rate policy, in hits (null: nothing more).
 * charged: after a release with a cost, the chained rate key's Charge.
 */
class Lease {
  constructor({
    leaseId, ttl, policy = '', admittedAt = now(), chosen = '', deadline = null, waited = 0,
    attributes = {}, wouldDeny = false, rejection = null, reusable = false,
  }) {
    this.leaseId = leaseId;
    this.ttl = ttl;
    this.policy = policy;
    this.admittedAt = admittedAt;
    this.outcome = null;
    this.released = false;
    this.chosen = chosen;
    this.deadline = deadline;
    this.waited = waited;
    this.attributes = attributes;
    this.wouldDeny = wouldDeny;
    this.rejection = rejection;
    this.cost = null;
    this.charged = null;
    /** Whether the lease may carry its holder's next call (an adaptive policy's, chaining no rate policy). */
    this.reusable = reusable;
  }

  /** Seconds until `deadline` (never negative); null: no deadline. */
  timeLeft() {
    return this.deadline === null ? null : Math.max(0, this.deadline - now());
  }

  toString() {
    return this.leaseId;
  }
}

/**
 * One policy as policies() reports it. name, kind (rate, federated, adaptive, fleet,
 * concurrency, cascade, throttler); rate: the chained rate policy's name, or "". inFlight:
 * concurrency kinds: calls holding a permit (leases included). limit: rate: hits per period;
 * adaptive/fleet: the concurrency ceiling in force. state: every other detail, parsed from the
 * server's JSON (as GET /v1/policies shows it).
 */
class PolicyState {
  constructor({ name, kind, rate, inFlight, limit, state }) {
    this.name = name;
    this.kind = kind;
    this.rate = rate;
    this.inFlight = inFlight;
    this.limit = limit;
    this.state = state;
    Object.freeze(this);
  }
}

/**
 * Every policy of the server, by name (a Map: ps.get("pool").inFlight, ps.has(name), ps.size),
 * plus leases (held now) and configGeneration.
 */
class Policies extends Map {
  constructor(entries, leases, configGeneration) {
    super(entries);
    this.leases = leases;
    this.configGeneration = configGeneration;
  }

  /** The policies' names, sorted. */
  names() {
    return [...this.keys()].sort();
  }
}

/**
 * One metric of a throttler's answer (gRPC: ThrottlerMetric; HTTP: an entry of the body's
 * Metrics): name; status (200 or 429; 0 when the body did not say); value, threshold (HTTP:
 * null when the body has none); reason ("ok", "threshold_exceeded", "probe_failed",
 * "stale_sample", "no_sample"); message (a failed probe's error, or how stale); scope; host
 * (the host that decided).
 */
class ThrottlerMetric {
  constructor({ name, status, value, threshold, reason = '', message = '', scope = '', host = '' }) {
    this.name = name;
    this.status = status;
    this.value = value;
    this.threshold = threshold;
    this.reason = reason;
    this.message = message;
    this.scope = scope;
    this.host = host;
    Object.freeze(this);
  }
}

/**
 * The throttler's answer to one check: client.throttlerCheck() (gRPC) and
 * ThrottlerClient.check() (HTTP) answer one.
 *
 * ok: go ahead with one chunk of work; false: hold back and ask again later. status: the
 * status code (200, 429 over a threshold or failing closed, 417 the app is throttled, 404,
 * 400, 5xx), or 0 when the HTTP throttler could not be reached at all. reason: "ok", "exempt",
 * "threshold_exceeded", "probe_failed", "stale_sample", "no_sample", "low_priority",
 * "app_throttled", ...; when the HTTP throttler could not be asked, "unreachable: <why>" (ok is
 * then the ThrottlerClient's onUnreachable policy). value, threshold: the deciding metric's
 * (gRPC: 0 when the answer has none; HTTP: null when the body has none). metric: the deciding
 * metric's name, or null. message: the server's message, or what went wrong when it could not
 * be asked. app (the app answered for: "default" for none), scope, recentlyChecked, metrics
 * (each metric's ThrottlerMetric): the rest of the answer (gRPC: ThrottlerCheckResponse; HTTP:
 * the body's AppName, Scope, RecentlyChecked and Metrics; "", "", false and [] when absent).
 */
class CheckResult {
  constructor({
    ok, status, reason, value = null, threshold = null, metric = null, message = '', app = '',
    scope = '', recentlyChecked = false, metrics = [],
  }) {
    this.ok = ok;
    this.status = status;
    this.reason = reason;
    this.value = value;
    this.threshold = threshold;
    this.metric = metric;
    this.message = message;
    this.app = app;
    this.scope = scope;
    this.recentlyChecked = recentlyChecked;
    this.metrics = Object.freeze([...metrics]);
    Object.freeze(this);
  }

  /** True when this is not the throttler's answer but the onUnreachable policy's. */
  get unreachable() {
    return this.reason.startsWith('unreachable:');
  }
}

module.exports = {
  OUTCOMES, Decision, Charge, Lease, PolicyState, Policies, CheckResult, ThrottlerMetric, now,
};
