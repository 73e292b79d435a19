'use strict';
// A rate policy's hits taken from the server in blocks and spent in the middleware, so that
// most requests are admitted without a round trip (express({ ..., allowance: N })). The rules
// are the C++ and Python adapters' (sluice/adapters/rate_allowance.h):
//
// The server is asked for N hits at once (one check of hits N); the requests after it spend
// them here, each within `hold` seconds of the answer that granted them, after which what is
// left is dropped. A key the server refused is refused here until its retryAfter. A block the
// server does not grant is asked again as what it says remains when that is enough for the
// request, else as the request's own hits.
//
// What it can cost, and nothing else: no hit is spent that the server did not grant, each
// within `hold` of its grant, so in any interval of T seconds the requests admitted through
// every allowance together are at most what the policy grants in T + hold (r x hold more for a
// rate of r hits a second); and a block's hits not spent within `hold` are lost to every
// client (at most N - 1 per key, per middleware, per hold).

const { Decision } = require('./types');

class Allowances {
  /**
   * block: hits asked for at once (an integer >= 1). hold: seconds a granted hit may wait to
   * be spent (> 0). maxKeys: keys remembered at once; past it, the expired ones are
   * forgotten, and a key that finds no room is asked every time.
   */
  constructor(block, hold = 0.05, maxKeys = 10000) {
    if (!Number.isSafeInteger(block) || block < 1) {
      throw new TypeError(`allowance: must be an integer >= 1 (hits taken at once), not ${JSON.stringify(block)}`);
    }
    if (typeof hold !== 'number' || !(hold > 0) || !Number.isFinite(hold)) {
      throw new TypeError(`allowanceHold: must be > 0 seconds, not ${JSON.stringify(hold)}`);
    }
    if (!Number.isSafeInteger(maxKeys) || maxKeys < 1) {
      throw new TypeError(`maxKeys: must be an integer >= 1, not ${JSON.stringify(maxKeys)}`);
    }
    this.block = block;
    this.hold = hold;
    this.maxKeys = maxKeys;
    this.keys = new Map(); // key -> { tokens, expires, refusedUntil, decision }
    this.stats = { localAdmits: 0, localRefusals: 0, blocksGranted: 0, blocksRefused: 0, hitsDropped: 0 };
  }

  /**
   * The decision made here for `hits` on `key` at `t` (seconds, now()): allowed from the hits
   * held (debited) or refused until the server's retryAfter; null: ask the server.
   */
  local(key, hits, t) {
    const k = this.keys.get(key);
    if (k === undefined) return null;
    if (t < k.refusedUntil) {
      this.stats.localRefusals += 1;
      return new Decision({ ...k.decision, retryAfter: k.refusedUntil - t });
    }
    if (t >= k.expires) {
      this.drop(k);
      return null;
    }
    if (k.tokens < hits) return null;
    k.tokens -= hits;
    this.stats.localAdmits += 1;
    const d = k.decision;
    return new Decision({
      allowed: true, limit: d.limit, remaining: d.remaining + k.tokens, resetAfter: d.resetAfter, retryAfter: 0,
    });
  }

  /** Hits to ask for, for a request of `hits`: a block, no larger than the policy's limit when known, never fewer than `hits`. */
  ask(key, hits) {
    const k = this.keys.get(key);
    let want = Math.max(hits, this.block);
    if (k !== undefined && k.decision && k.decision.limit > 0) want = Math.min(want, k.decision.limit);
    return Math.max(want, hits);
  }

  /**
   * Records the server's answer `d` to a check of `asked` hits for a request of `hits` at `t`.
   * null: the request has its answer; else the hits to ask for next.
   */
  answered(key, asked, hits, d, t) {
    const granted = d.allowed && !d.wouldDeny;
    let k = this.keys.get(key);
    if (k === undefined) {
      if (this.keys.size >= this.maxKeys) this.forgetExpired(t);
      if (this.keys.size >= this.maxKeys) return granted || asked === hits ? null : hits;
      k = { tokens: 0, expires: 0, refusedUntil: 0, decision: null };
      this.keys.set(key, k);
    }
    k.decision = d;
    if (granted) {
      if (asked > hits) {
        this.drop(k);
        k.tokens = asked - hits;
        k.expires = t + this.hold;
        this.stats.blocksGranted += 1;
      }
      return null;
    }
    if (asked > hits) {
      this.stats.blocksRefused += 1;
      if (!d.wouldDeny && !d.reason && d.remaining >= hits && d.remaining < asked) return d.remaining;
      return hits;
    }
    if (!d.allowed && d.retryAfter !== null && d.retryAfter > 0) k.refusedUntil = t + d.retryAfter;
    return null;
  }

  /** Hits held for `key` now (expired ones until the next look). */
  held(key) {
    const k = this.keys.get(key);
    return k === undefined ? 0 : k.tokens;
  }

  drop(k) {
    this.stats.hitsDropped += k.tokens;
    k.tokens = 0;
  }

  forgetExpired(t) {
    for (const [key, k] of this.keys) {
      if (t >= k.expires && t >= k.refusedUntil) {
        this.drop(k);
        this.keys.delete(key);
      }
    }
  }
}

module.exports = { Allowances };
