'use strict';
// A rate policy's hits taken from the server in blocks and spent in the middleware, so that
// most requests are admitted without a round trip (express({ ..., allowance: N })). The rules
// are the C++ and Python adapters' (sluice/adapters/rate_allowance.h):
//
// The server is asked for N hits at once (one check of hits N); the requests after it spend
// them here, each within `hold` seconds of the answer that granted them, after which what is
// left is dropped. When a request leaves half of a block or less, the next block is asked for
// in the background (a refill: takeRefill() says how many hits, the answer goes to
// refilled()), so that a key's steady requests do not wait for a check when a block runs out;
// the older block's hits are spent first, each within `hold` of its own grant, and a refill
// the server does not grant is not asked again for that block. A key the server refused is
// refused here until its retryAfter, but for hits held (they were granted, and are spent
// first). A block that a request waits for and the server does not grant is asked again as
// what the server says remains when that is enough for the request, else as its own hits.
//
// What it can cost, and nothing else: no hit is spent that the server did not grant, each
// within `hold` of its grant, so in any interval of T seconds the requests admitted through
// every allowance together are at most what the policy grants in T + hold (r x hold more for a
// rate of r hits a second); and hits not spent within `hold` are lost to every client: at most
// two blocks are held per key, one refill is in flight at a time and hits are spent oldest
// first, so at most two blocks per key, per middleware, per hold.

const { Decision } = require('./types');

// A key's state: the newest block (`tokens` of `granted`, until `expires`), what is left of the
// one before it (spent first), its refill, and the server's last answer and cached refusal.
function newKey() {
  return {
    tokens: 0,
    expires: 0,
    granted: 0,
    refillAsked: false, // for the newest block
    refilling: false, // a refill is in flight (one at a time)
    refillDue: 0, // hits a refill is to ask for (takeRefill())
    olderTokens: 0,
    olderExpires: 0,
    refusedUntil: 0,
    refusal: null, // the server's refusal of a request's own hits
    decision: null, // the server's last answer
  };
}

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
    this.keys = new Map(); // key -> newKey()
    this.stats = {
      localAdmits: 0, localRefusals: 0, blocksGranted: 0, blocksRefused: 0, hitsDropped: 0, callsAsked: 0,
      refillsGranted: 0, refillsRefused: 0,
    };
  }

  /**
   * The decision made here for `hits` on `key` at `t` (seconds, now()): allowed from the hits
   * held (debited, the older block's first; a refill may then be due: takeRefill()) or
   * refused until the server's retryAfter; null: ask the server.
   */
  local(key, hits, t) {
    const k = this.keys.get(key);
    if (k === undefined) return null;
    if (t >= k.expires) { // the older block expired first
      this.drop(k);
    } else if (t >= k.olderExpires) {
      this.stats.hitsDropped += k.olderTokens;
      k.olderTokens = 0;
    }
    if (k.olderTokens + k.tokens < hits) {
      if (t >= k.refusedUntil || k.refusal === null) return null;
      this.stats.localRefusals += 1; // hits held are spent first: they were granted
      return new Decision({ ...k.refusal, retryAfter: k.refusedUntil - t });
    }
    const older = Math.min(k.olderTokens, hits);
    k.olderTokens -= older;
    k.tokens -= hits - older;
    this.stats.localAdmits += 1;
    const d = k.decision;
    if (!k.refillAsked && !k.refilling && k.granted > 1 && k.tokens * 2 <= k.granted) {
      k.refillAsked = true;
      k.refilling = true;
      k.refillDue = d.limit > 0 ? Math.min(this.block, d.limit) : this.block;
    }
    return new Decision({
      allowed: true, limit: d.limit, remaining: d.remaining + k.olderTokens + k.tokens, resetAfter: d.resetAfter, retryAfter: 0,
    });
  }

  /** Hits to ask the server for on `key` now, in the background (0: none), after local() allowed a request; the answer goes to refilled(). */
  takeRefill(key) {
    const k = this.keys.get(key);
    if (k === undefined || k.refillDue === 0) return 0;
    const due = k.refillDue;
    k.refillDue = 0;
    return due;
  }

  /**
   * Records the answer `d` to a refill of `asked` hits (null: none came). Granted, it is the
   * key's block from now; the hits left of the one before are spent first, until their own
   * hold ends.
   */
  refilled(key, asked, d, t) {
    const granted = d !== null && d.allowed && !d.wouldDeny;
    const k = this.keys.get(key);
    if (k !== undefined) k.refilling = false;
    if (!granted) {
      this.stats.refillsRefused += 1;
      return;
    }
    this.stats.refillsGranted += 1;
    if (k === undefined) { // forgotten meanwhile (maxKeys): nowhere to hold them
      this.stats.hitsDropped += asked;
      return;
    }
    k.decision = d;
    this.push(k, asked, asked, t);
  }

  /** Hits to ask for, for a request of `hits`: a block, no larger than the policy's limit when known, never fewer than `hits`. */
  ask(key, hits) {
    this.stats.callsAsked += 1;
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
      k = newKey();
      this.keys.set(key, k);
    }
    k.decision = d;
    if (granted) {
      if (asked > hits) {
        this.push(k, asked - hits, asked, t);
        this.stats.blocksGranted += 1;
      }
      return null;
    }
    if (asked > hits) {
      this.stats.blocksRefused += 1;
      if (!d.wouldDeny && !d.reason && d.remaining >= hits && d.remaining < asked) return d.remaining;
      return hits;
    }
    if (!d.allowed && d.retryAfter !== null && d.retryAfter > 0) {
      k.refusedUntil = t + d.retryAfter;
      k.refusal = d;
    }
    return null;
  }

  /** Hits held for `key` now (expired ones until the next look). */
  held(key) {
    const k = this.keys.get(key);
    return k === undefined ? 0 : k.olderTokens + k.tokens;
  }

  /**
   * A block of `tokens` left of `granted`, granted at `t`, is the key's newest; what is left of
   * the one before it (a refill that came while a request waited for this one) is spent first.
   */
  push(k, tokens, granted, t) {
    this.stats.hitsDropped += k.olderTokens; // fewer than a request's hits, or expired
    k.olderTokens = 0;
    if (t < k.expires) {
      k.olderTokens = k.tokens;
      k.olderExpires = k.expires;
      k.tokens = 0;
    }
    this.stats.hitsDropped += k.tokens;
    k.tokens = tokens;
    k.granted = granted;
    k.refillAsked = false;
    k.expires = t + this.hold;
  }

  drop(k) {
    this.stats.hitsDropped += k.olderTokens + k.tokens;
    k.olderTokens = 0;
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
