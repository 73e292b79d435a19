// Exhaustive state-space search of federation's regional pool (the "BFS twin" of the pool rules in
// src/core/escrow.cpp and of FederatedLimiter's use of them; spec/federation_pool.pml is the same
// protocol for spin). Beside federation_model_test.cpp, which searches the escrow protocol
// without a pool: the coordinator, the pool, each process's key and its lease through the pool
// are the real core (sluice::lease, reconcile, pool_take, pool_refill, pool_release; a key's
// rules, check_key, on_lease and give_up of sluice/core/federated_key.h; PoolLease's steps,
// start_pool_lease, on_pool_take, on_pool_lease and on_pool_refill of sluice/core/pool_lease.h:
// the very functions FederatedLimiter calls); the clocks, the network and the failures are
// modelled here.
//
// Region "a" has two processes (p0, p1) sharing one pool; region "b" (optional) leases directly,
// as in federation_model_test.cpp. One key of `limit` units per window of `period` ticks. One
// global clock t; the coordinator reads it as it is, the pool and every process read it shifted by
// a constant offset of their own (skew, no drift: the drift allowance is 0). Fail-closed mode.
// Each process of region a holds its FederatedKey and does what FederatedLimiter does with what a
// key step asks (KeyEffects): counts the admissions, releases escrow given up to the pool, and
// starts the lease asked for through PoolLease, every call taking its time (the clock may tick
// between a request and its processing, and between a reply and its delivery):
//   check      check_key() for one hit at the process's clock: admitted from the escrow, refused,
//              or parked (while a slot is free; else tried, as try_check does) behind a lease,
//              which start_pool_lease() starts with a take;
//   pool-take  the pool runs pool_take on its own clock; the reply travels back;
//   taken      on_pool_take() at the process's clock (`seen`): done, or a lease goes out at once
//              for the rest (a regional batch, or the last window's demand, when the take made
//              it the refiller);
//   lease      the coordinator runs lease() (not during its outage);
//   leased     on_pool_lease(): done, or the refiller's refill goes out (the units it does not
//              need, expiring at pool_expiry(), or none, to end the refill in flight);
//   refill     the pool runs pool_refill; its reply travels back;
//   refilled   on_pool_refill(): what the pool accepted leaves the refiller's grant;
//   (done)     on_lease() applies the lease's outcome to the key: its parked checks decided, the
//              rest of an older window's escrow given up, the next lease started if it asks;
//   expire     give_up() of escrow past its expiry (the limiter's sweep);
//   release    the pool runs pool_release (one release in transit per process: a newer one
//              pushes the older out, a loss);
//   drop       during the pool's outage, a take or refill (request or reply) is lost, during the
//              coordinator's a lease: the PoolLease step gets the call's failure (a lost take
//              leases the whole want from the coordinator; a lost refill is given up: it may
//              have been applied); a release is lost;
//   restart    a process loses its key (escrow, parked checks) and whatever it was waiting for;
//   tick, coordinator outage / pool outage (on or off), coordinator loss (an empty ledger whose
//   origin window is the current one), pool loss (an empty pool);
//   region b   its key's checks, its leases sent, processed by the coordinator, lost in its
//              outage and delivered (on_lease()), its expired escrow given up and reconciled, as
//              federation_model_test.cpp drives a region that leases directly.
// Not modelled: leaving the pool alone for retry_backoff after a failed call (its leases go to
// the coordinator, as a lost take's does here).
// Invariant, in every reachable state:
//   Admitted  the admissions stamped with the real (global-clock) window they happen in never
//             exceed `limit` in that window (Δ = 0).
// Broken variants, small wrappers around the real core here, must be caught by the same search:
// a fail-closed pool that serves past its expiry (as the regional-only mode does, the taker
// keeping the units a while); a refill whose expiry counts the time left from the TAKE's
// send time (as if the pool had read its clock then, not at some time up to `seen`); a refill
// whose expiry is the escrow's expiry taken as pool time; a taker whose expiry counts from when it
// received the take; a pool that accepts a release into a later window than the units'. (The
// variants of a PoolLease decision change what the step decided, after it.)
//
// A refill whose reply is lost AFTER the pool applied it (a timeout on a slow reply) must not
// leave the units both in the pool and in the refiller's escrow: the refiller gives up what it
// sent whenever the call failed (searched separately below, on this search and on the real
// FederatedLimiter; with the refiller keeping its grant, a window admitted 4 against 3 here and
// 107 against 100 on the limiter).

// The refiller's lease goes out when it sees the take's reply (the limiter sends it at once):
// pool_expiry from the lease's own send time instead of `seen` would only be earlier, so it is
// no broken variant. Each search below turns on one kind of failure (all at once is too big
// for the suite); federation_model_test.cpp searches the coordinator's side without a pool.
//
// Finite space: the clock is bounded, so every counter is (checked). The state leaves out what
// cannot change what happens next, as an exact bisimulation of the real core: the ledger's and
// the pool's clock high-water marks (no clock steps back here), what a key's folds leave out
// (federated_key_state.h: an escrow expiry a period or more past, a key's time passed, ...), the
// same for the expiry of units on their way to a key, the pool's expiry once past by a period
// (no take reads its time left any more), the pool's demand beyond a regional batch or once no
// take can read it, a refill hold already over, a ledger whose window has ended (the next lease
// rolls it), the admissions of a window that has ended, and the fields of a PoolLease and of a
// reply that no later step reads, or only as a sum or a difference (normalise(), kPoolTake).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "federated_key_state.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/core/escrow.h"
#include "sluice/core/pool_lease.h"
#include "sluice/federation/federation.h"
#include "state_space.h"
#include "support/federation_fixtures.h"

namespace sluice {
namespace {

using sluice::model::kExpired;  // an expiry already passed
using sluice::model::kNone;
using sluice::model::PackedKey;
using sluice::model::Packing;
using sluice::model::StateSpace;

constexpr int kProcs = 2;                       // processes of region "a"
constexpr std::size_t kMaxStates = 30'000'000;  // a configuration too big for the suite fails

enum class Variant {
  kCorrect,
  kPoolServesPastExpiry,    // fail-closed serving as regional-only does, past the pool's expiry
  kRefillFromTakeSent,      // pool_expiry counts the time left from the take's send time
  kRefillEscrowAsPoolTime,  // the escrow's expiry (process clock) stamped as the pool's expiry
  kTakerFromReceipt,        // taken_expiry from when the take's reply arrived
  kReleaseIntoLaterWindow,  // pool_release accepts units of any window into the pool's
};
constexpr std::array<const char*, 6> kVariantNames = {"correct",
                                                      "pool-serves-past-expiry",
                                                      "refill-from-take-sent",
                                                      "refill-escrow-as-pool-time",
                                                      "taker-from-receipt",
                                                      "release-into-later-window"};

struct Config {
  std::uint64_t limit = 3;
  std::uint64_t batch = 1;                          // what a process leases
  std::uint64_t regional_batch = 2;                 // what a refiller leases for the pool
  std::int64_t period = 2;                          // ticks per window
  std::int64_t ticks = 4;                           // t runs 0 .. ticks - 1
  std::int64_t refill_hold = 2;                     // pool ticks
  std::array<std::int8_t, kProcs> offset = {0, 1};  // each process's clock is t + offset
  std::int8_t pool_offset = -1;                     // the pool's clock is t + pool_offset
  std::int8_t b_offset = 1;                         // region b's
  bool region_b = false;                            // a second region leasing directly
  bool coordinator_outages = true;
  bool pool_outages = true;
  bool coordinator_losses = true;  // the coordinator may lose its state
  bool pool_losses = true;         // the pool may lose its state
  bool restarts = true;            // a process may restart
  // A refill's reply may be lost after the pool applied it (the refiller keeps its units).
  bool lost_refill_replies = false;
  int parked = 1;  // checks parked behind a process's lease, at most (1 .. kMaxParked)
  Variant variant = Variant::kCorrect;
};

enum Phase : std::uint8_t {
  kIdle,
  kTakeSent,     // the take in transit
  kTakeReply,    // its reply in transit (m_*)
  kLeaseSent,    // the coordinator's lease in transit (ask, lease_need; sent_at)
  kLeaseReply,   // its reply in transit (r_*)
  kRefillSent,   // the refill in transit (refill_window, extra, refill_expires)
  kRefillReply,  // its reply in transit (m_granted: what the pool accepted)
};

// A process of region "a": its key, and its lease through the pool as PoolLease holds it
// (packed; the fields a later step reads, the rest folded away by normalise()), with the call in
// transit and its reply.
// The coordinator's reply to a lease (r_ok: a reply, not a failure; r_left: its window_end -
// coordinator_now, plus the lease's send time once the reply is back: all the core reads of them).
struct PackedReply {
  std::uint8_t r_ok;
  std::uint8_t r_status;
  std::uint8_t r_granted;
  std::uint8_t r_remaining;
  std::int8_t r_window;
  std::int8_t r_left;
};

struct Proc : PackedKey, PackedReply {  // its FederatedKey
  std::uint8_t phase;
  // PoolLease
  std::uint8_t want;
  std::uint8_t need;
  std::int8_t take_sent;
  std::int8_t seen;
  std::int8_t pool_now;
  std::uint8_t refiller;
  std::uint8_t ask;
  std::uint8_t lease_need;
  std::int8_t refill_window;
  std::uint8_t extra;
  std::int8_t refill_expires;
  std::uint8_t pool_units;  // its outcome: units from the pool, of pool_window, until pool_expires
  std::int8_t pool_window;
  std::int8_t pool_expires;
  std::int8_t sent_at;  // the coordinator's lease: its send time
  // A pool reply in transit (take: all of it; refill: m_granted, what the pool accepted).
  std::uint8_t m_granted;
  std::int8_t m_window;
  std::int8_t m_expires_in;
  std::int8_t m_now;
  std::uint8_t m_refill;
  std::uint8_t m_demand;
  std::int8_t rel_window;  // a release in transit (kNone: none)
  std::uint8_t rel_units;
};

// Region b: its FederatedKey, its lease in flight (a request, or the coordinator's reply coming
// back), and a reconcile in transit.
struct RegionB : PackedKey, PackedReply {
  std::uint8_t request;
  std::uint8_t want;
  std::uint8_t need;
  std::int8_t sent_at;
  std::int8_t rec_window;  // kNone: none
  std::uint8_t rec_total;
};

struct Rec {  // the coordinator's RegionLedger of "a" and "b"
  std::uint8_t present;
  std::uint8_t granted;
  std::uint8_t relinquished;
  std::int8_t relinquished_window;
};

struct State {
  std::uint8_t t;
  std::uint8_t coord_down;
  std::uint8_t pool_down;
  std::uint8_t admitted;  // admissions in the window t is in
  std::int8_t origin;     // the ledger's origin window; kNone: no loss
  std::int8_t l_window;
  std::uint8_t l_granted;
  std::uint8_t l_returned;
  std::array<Rec, 2> rec;
  // The pool (times on its clock).
  std::int8_t p_window;
  std::int8_t p_expires;
  std::uint8_t p_balance;
  std::uint8_t p_demand;  // at most regional_batch: all the core reads of it (regional_refill_size)
  std::int8_t p_refilling;  // refilling_until; kExpired: none in flight
  std::array<Proc, kProcs> proc;
  RegionB b;
};
static_assert(std::is_trivially_copyable_v<State>);
static_assert(std::has_unique_object_representations_v<State>);  // compared and hashed as bytes

enum Action : std::uint8_t {
  // per process
  kCheck,
  kPoolTake,
  kTaken,
  kLease,
  kLeased,
  kRefill,
  kRefilled,
  kExpire,
  kRelease,
  kDrop,
  kDropRelease,
  kLoseRefillReply,
  kRestart,
  // global (owner 0)
  kTick,
  kCoordOutage,
  kPoolOutage,
  kCoordLoss,
  kPoolLoss,
  kBCheck,
  kBProcess,
  kBDrop,
  kBDeliver,
  kBExpire,
  kBReconcile,
  kActions,
};
constexpr std::array<const char*, kActions> kActionNames = {
    "check",    "pool-take", "taken",        "lease",       "leased",       "refill",
    "refilled", "expire",    "release",      "drop",        "drop-release", "lose-refill-reply",
    "restart",  "tick",      "coord-outage", "pool-outage", "coord-loss",   "pool-loss",
    "b.check",  "b.process", "b.drop",       "b.deliver",   "b.expire",     "b.reconcile"};
constexpr Action kFirstGlobal = kTick;

struct Result {
  std::size_t states = 0;
  std::string violation;  // empty: the invariant held in every state
  std::string trace;
  std::uint64_t max_admitted = 0;
  bool refill_accepted = false;   // some refill put units in the pool
  bool taken = false;             // some take granted units
  bool release_accepted = false;  // some release went back into the pool
  bool b_spent = false;           // region b admitted
  bool loss_refused = false;      // some lease was refused for a coordinator's state loss
};

class Explorer : Packing {
 public:
  explicit Explorer(Config c) : Packing(c.period), c_(c), space_(kMaxStates) {
    rules_ = sluice::model::key_rules(spec(), c_.batch);
  }

  Result run() {
    State init;
    std::memset(static_cast<void*>(&init), 0, sizeof(init));
    init.origin = kNone;
    init.l_window = kNone;
    for (Rec& r : init.rec) r.relinquished_window = kNone;
    init.p_window = kNone;
    init.p_expires = kExpired;
    init.p_refilling = kExpired;
    for (Proc& p : init.proc) {
      p.rel_window = kNone;
      clear_lease(p);
      from_key(FederatedKey{}, p);
    }
    init.b.rec_window = kNone;
    init.b.r_window = kNone;
    from_key(FederatedKey{}, init.b);
    Result r;
    space_.add(init);
    for (std::size_t at = 0; at < space_.size(); ++at) {
      if (space_.full()) {
        r.violation = "Harness: more than " + std::to_string(kMaxStates) + " states";
        return r;
      }
      const State s = space_[at].state;
      ++r.states;
      r.max_admitted = std::max<std::uint64_t>(r.max_admitted, s.admitted);
      if (s.admitted > c_.limit) {
        r.violation = "Admitted: " + std::to_string(s.admitted) + " admissions in window " +
                      std::to_string(s.t / c_.period) + " > limit " + std::to_string(c_.limit);
        r.trace = trace_to(at);
        return r;
      }
      for (std::uint8_t a = 0; a < kActions; ++a) {
        const int owners = a >= kFirstGlobal ? 1 : kProcs;
        for (int i = 0; i < owners; ++i) {
          State n = s;
          if (!step(n, i, static_cast<Action>(a), r)) continue;
          if (!harness_error_.empty()) {
            r.violation = "Harness: " + harness_error_;
            r.trace = trace_to(at);
            return r;
          }
          space_.add(n, at, a, static_cast<std::uint8_t>(i));
        }
      }
    }
    return r;
  }

 private:
  BudgetSpec spec() const { return BudgetSpec{c_.limit, Nanos{c_.period}}; }
  Nanos proc_now(const State& s, int i) const { return Nanos{s.t + c_.offset[i]}; }
  Nanos pool_now(const State& s) const { return Nanos{s.t + c_.pool_offset}; }
  Nanos b_now(const State& s) const { return Nanos{s.t + c_.b_offset}; }

  // Clears process p's lease (nothing in transit but a release); its key stays.
  static void clear_lease(Proc& p) {
    const Proc keep = p;
    std::memset(static_cast<void*>(&p), 0, sizeof(p));
    static_cast<PackedKey&>(p) = keep;
    p.refill_window = kNone;
    p.pool_window = kNone;
    p.r_window = kNone;
    p.m_window = kNone;
    p.rel_window = keep.rel_window;
    p.rel_units = keep.rel_units;
  }

  // ---- the coordinator ----

  Ledger& to_ledger(const State& s) {
    Ledger& l = scratch_;
    l.regions.clear();
    l.clock_high = INT64_MIN;
    l.forfeited = 0;
    l.spec = BudgetSpec{};
    l.window_start = start_of(s.l_window);
    if (s.l_window != kNone) l.spec = spec();
    l.granted = s.l_granted;
    l.returned = s.l_returned;
    for (int i = 0; i < 2; ++i) {
      const Rec& r = s.rec[i];
      if (!r.present) continue;
      RegionLedger g;
      g.region = i == 0 ? "a" : "b";
      g.granted = r.granted;
      g.relinquished = r.relinquished;
      g.relinquished_window = start_of(r.relinquished_window);
      l.regions.push_back(std::move(g));
    }
    return l;
  }

  void from_ledger(const Ledger& l, State& s) {
    if (l.window_start != INT64_MIN && !(l.spec == spec())) harness_error_ = "ledger spec";
    s.l_window = index_of(l.window_start);
    const std::uint64_t both = std::min(l.granted, l.returned);
    s.l_granted = small(l.granted - both, "granted");
    s.l_returned = small(l.returned - both, "returned");
    for (Rec& r : s.rec) r = Rec{0, 0, 0, kNone};
    for (const RegionLedger& g : l.regions) {
      if (g.region != "a" && g.region != "b") {
        harness_error_ = "unexpected region '" + g.region + "'";
        return;
      }
      s.rec[g.region == "a" ? 0 : 1] =
          Rec{1, small(g.granted, "granted"), small(g.relinquished, "relinquished"),
              index_of(g.relinquished_window)};
    }
  }

  // lease() for `region` at the coordinator's clock; the reply, or nothing granted.
  LeaseReply coordinate_lease(State& s, const char* region, std::uint64_t want, std::uint64_t need,
                              Result& out) {
    Ledger& l = to_ledger(s);
    LeaseRequest req;
    req.region = region;
    req.spec = spec();
    req.want = want;
    req.need = need;
    const LeaseReply reply = lease(l, req, Nanos{s.t}, start_of(s.origin));
    from_ledger(l, s);
    if (reply.status == LeaseStatus::kStateLost) out.loss_refused = true;
    if (reply.granted > 0 &&
        (reply.window_end - reply.window_start != Nanos{c_.period} || !(reply.spec == spec())))
      harness_error_ = "reply";
    return reply;
  }

  // ---- the pool ----

  RegionalPool to_pool(const State& s) const {
    RegionalPool p;
    p.window_start = start_of(s.p_window);
    p.expires_at = s.p_expires;  // kExpired: a time already passed
    p.balance = s.p_balance;
    p.demand = s.p_demand;
    p.refilling_until = s.p_refilling == kExpired ? INT64_MIN : s.p_refilling;
    return p;
  }
  void from_pool(const RegionalPool& p, State& s) {
    s.p_window = index_of(p.window_start);
    s.p_expires = p.expires_at <= kExpired ? kExpired : tiny(p.expires_at, "pool expiry");
    s.p_balance = small(p.balance, "balance");
    s.p_demand = small(std::min(p.demand, c_.regional_batch), "demand");
    s.p_refilling =
        p.refilling_until == INT64_MIN ? kExpired : tiny(p.refilling_until, "refilling_until");
  }

  // ---- a process's key: FederatedKey (sluice/core/federated_key.h) ----

  FederatedKey& to_key(const PackedKey& g) { return sluice::model::unpack(*this, g, key_); }
  void from_key(const FederatedKey& k, PackedKey& g) {
    sluice::model::pack(*this, k, c_.parked, g, harness_error_);
  }

  // What a step of process i's key asks for, as FederatedLimiter does it: its admissions
  // counted, escrow given up released to the pool (one release in transit per process: a newer
  // one pushes the older out, a loss), its next lease started through the pool.
  void effects(State& s, int i, const KeyEffects& e) {
    Proc& g = s.proc[i];
    admit(s, e);
    for (const GivenUp& u : e.given_up) {
      if (u.units == 0) continue;
      g.rel_window = index_of(u.window_start.count());
      g.rel_units = small(u.units, "release");
    }
    if (e.lease_want > 0) {
      if (g.phase != kIdle) harness_error_ = "a second lease in flight";
      PoolLease l;
      start_pool_lease(l, e.lease_want, e.lease_need, false, true, proc_now(s, i));
      advance(s, i, l);
    }
  }

  // The admissions a key step made (the check in hand's, its parked checks'), counted in the
  // window; returns how many.
  std::uint64_t admit(State& s, const KeyEffects& e) {
    std::uint64_t admitted = 0;
    if (e.decision && e.decision->rate.allowed) admitted += last_hits_;
    for (std::size_t j = 0; j < e.decided.size(); ++j)
      if (e.decided[j].rate.allowed) admitted += decided_hits_[j];
    if (admitted != e.spent) harness_error_ = "admissions and spent units differ";
    s.admitted = small(s.admitted + admitted, "admitted");
    return admitted;
  }

  // A key `g` through one core step `f(key, effects)`; the effects, for the caller to act on.
  template <class F>
  KeyEffects core_step(PackedKey& g, F f) {
    FederatedKey& k = to_key(g);
    decided_hits_.assign(k.waiting.begin(), k.waiting.end());
    KeyEffects e;
    f(k, e);
    from_key(k, g);
    return e;
  }

  // Process i's key through one core step `f(key, effects)`, and what it asks for.
  template <class F>
  void key_step(State& s, int i, F f) {
    effects(s, i, core_step(s.proc[i], f));
    if ((s.proc[i].leasing != 0) != (s.proc[i].phase != kIdle))
      harness_error_ = "the key's leasing flag and the lease in flight differ";
  }

  // ---- a process's lease through the pool: PoolLease (sluice/core/pool_lease.h) ----

  PoolLeaseRules pool_rules() const {
    PoolLeaseRules r;
    r.period = Nanos{c_.period};
    r.regional_batch = c_.regional_batch;
    r.drift_ppm = 0;
    r.coordinator_health_check = Nanos{c_.period};  // read in the regional-only mode only
    return r;
  }

  // The coordinator's reply p's lease got (or is getting back), as the coordinator gave it.
  // (The core reads the reply's window end and clock only as window_end - coordinator_now.)
  LeaseReply reply_of(const PackedReply& g) const {
    LeaseReply r;
    r.status = static_cast<LeaseStatus>(g.r_status);
    r.granted = g.r_granted;
    r.remaining = g.r_remaining;
    r.spec = spec();
    r.window_start = Nanos{start_of(g.r_window)};
    r.coordinator_now = Nanos{0};
    r.window_end = Nanos{g.r_left};
    return r;
  }
  void store_reply(const LeaseReply& r, PackedReply& g) {
    g.r_ok = 1;
    g.r_status = static_cast<std::uint8_t>(r.status);
    g.r_granted = small(r.granted, "granted");
    g.r_remaining = small(std::min<std::uint64_t>(r.remaining, 250), "remaining");
    g.r_window = index_of(r.window_start.count());
    g.r_left = tiny((r.window_end - r.coordinator_now).count(), "left");
  }

  // p's PoolLease, unpacked.
  PoolLease to_lease(const Proc& g) const {
    PoolLease l;
    l.want = g.want;
    l.need = g.need;
    l.take_sent = Nanos{g.take_sent};
    l.seen = Nanos{g.seen};
    l.pool_now = Nanos{g.pool_now};
    l.refiller = g.refiller != 0;
    l.ask = g.ask;
    l.lease_need = g.lease_need;
    l.refill_window = Nanos{start_of(g.refill_window)};
    l.extra = g.extra;
    l.refill_expires = Nanos{g.refill_expires};
    FederatedLeaseOutcome& o = l.outcome;
    o.pool_units = g.pool_units;
    o.pool_window = Nanos{start_of(g.pool_window)};
    o.pool_expires = g.pool_units > 0 ? Nanos{g.pool_expires} : Nanos{kFederatedNever};
    if (g.phase >= kRefillSent) {
      o.sent_at = Nanos{g.sent_at};
      if (g.r_ok)
        o.reply = StatusOr<LeaseReply>(reply_of(g));
      else
        o.reply = StatusOr<LeaseReply>(lost());
    }
    return l;
  }

  static Status lost() { return Status(StatusCode::kDeadlineExceeded, "lost"); }

  // The next call `l` asks for goes out from process i (at its clock), or the lease is over and
  // the key applies its outcome (on_lease()).
  void advance(State& s, int i, const PoolLease& l) {
    Proc& g = s.proc[i];
    const std::int8_t sent_at = g.sent_at;
    clear_lease(g);
    if (l.next == PoolCall::kDone) {
      const Nanos now = proc_now(s, i);
      key_step(s, i,
               [&](FederatedKey& k, KeyEffects& e) { on_lease(k, l.outcome, now, 0, rules_, e); });
      return;
    }
    g.want = small(l.want, "want");
    g.need = small(l.need, "need");
    g.take_sent = tiny(l.take_sent.count(), "take sent");
    g.seen = tiny(l.seen.count(), "seen");
    g.pool_now = tiny(l.pool_now.count(), "pool now");
    g.refiller = l.refiller ? 1 : 0;
    g.ask = small(l.ask, "ask");
    g.lease_need = small(l.lease_need, "lease need");
    g.refill_window = index_of(l.refill_window.count());
    g.extra = small(l.extra, "extra");
    g.refill_expires = tiny(l.refill_expires.count(), "refill expiry");
    const FederatedLeaseOutcome& o = l.outcome;
    g.pool_units = small(o.pool_units, "pool units");
    g.pool_window = o.pool_units > 0 ? index_of(o.pool_window.count()) : kNone;
    g.pool_expires = o.pool_units > 0 ? tiny(o.pool_expires.count(), "pool expiry") : 0;
    switch (l.next) {
      case PoolCall::kTake:
        g.phase = kTakeSent;
        break;
      case PoolCall::kLease:  // sent now: the limiter sends it as soon as the take is over
        g.phase = kLeaseSent;
        g.sent_at = tiny(proc_now(s, i).count(), "sent");
        break;
      case PoolCall::kRefill:
        g.phase = kRefillSent;
        g.sent_at = sent_at;
        if (o.reply->ok()) {
          store_reply(o.reply->value(), g);
        } else {
          g.r_ok = 0;
        }
        break;
      case PoolCall::kDone:
        break;
    }
  }

  // The take's reply p received (its message in transit).
  PoolReply take_reply_of(const Proc& g) const {
    PoolReply p;
    p.granted = g.m_granted;
    p.window_start = Nanos{start_of(g.m_window)};
    p.expires_in = Nanos{g.m_expires_in};
    p.now = Nanos{g.m_now};
    p.refill = g.m_refill != 0;
    p.demand = g.m_demand;
    return p;
  }

  // The take's outcome at process i: its reply (or a failure), then the broken variants' changes
  // to what the core decided.
  void taken(State& s, int i, const StatusOr<PoolReply>& reply) {
    PoolLease l = to_lease(s.proc[i]);
    const Nanos seen = proc_now(s, i);
    on_pool_take(l, reply, seen, pool_rules());
    if (reply.ok() && l.outcome.pool_units > 0) {
      if (c_.variant == Variant::kTakerFromReceipt)
        l.outcome.pool_expires = taken_expiry(reply.value(), seen, 0);
      // Served past its expiry, as regional-only does: usable a while (the limiter's rule).
      if (c_.variant == Variant::kPoolServesPastExpiry)
        l.outcome.pool_expires = std::max(l.outcome.pool_expires, seen + Nanos{c_.period});
    }
    advance(s, i, l);
  }

  // The coordinator's answer to process i's lease (or a failure), then the broken variants'
  // changes to the refill the core asks for.
  void leased(State& s, int i, StatusOr<LeaseReply> reply) {
    const Proc& g = s.proc[i];
    PoolLease l = to_lease(g);
    const Nanos sent_at{g.sent_at};
    on_pool_lease(l, std::move(reply), sent_at, 0, pool_rules());
    if (l.next == PoolCall::kRefill && l.extra > 0) {
      const Nanos escrow_expires = escrow_expiry(l.outcome.reply->value(), sent_at, 0);
      if (c_.variant == Variant::kRefillFromTakeSent)
        l.refill_expires = pool_expiry(l.pool_now, l.take_sent, escrow_expires, 0);
      if (c_.variant == Variant::kRefillEscrowAsPoolTime) l.refill_expires = escrow_expires;
    }
    advance(s, i, l);
  }

  // The refill's outcome at process i: what the pool accepted, or a failure.
  void refilled(State& s, int i, const StatusOr<PoolReply>& reply) {
    PoolLease l = to_lease(s.proc[i]);
    on_pool_refill(l, reply, proc_now(s, i));
    advance(s, i, l);
  }

  // One atomic step of process i (or of the world, for the global actions); false if the
  // action is not enabled.
  bool step(State& s, int i, Action a, Result& r) {
    Proc& g = s.proc[i];
    switch (a) {
      case kCheck: {  // a check of one hit: parked while a slot is free, else tried
        last_hits_ = 1;
        const bool park = g.parked[c_.parked - 1] == 0;
        const Nanos now = proc_now(s, i);
        key_step(s, i, [&](FederatedKey& k, KeyEffects& e) {
          check_key(k, last_hits_, now, park, rules_, e);
        });
        break;
      }
      case kPoolTake: {
        if (g.phase != kTakeSent || s.pool_down) return false;
        RegionalPool p = to_pool(s);
        const bool past = c_.variant == Variant::kPoolServesPastExpiry;
        const PoolReply reply = pool_take(p, g.want, Nanos{c_.refill_hold}, past, pool_now(s));
        from_pool(p, s);
        g.phase = kTakeReply;
        // The reply, as far as on_pool_take reads it (the rest zero): the units, their window
        // and taken_expiry() when it granted any; for a take that makes the asker the refiller
        // (short, refill set), the window, the pool's clock and what regional_refill_size()
        // reads: the demand, and whether the pool's window ended less than a period ago (every
        // expires_in at or below -period reads the same).
        const bool refiller = reply.refill && reply.granted < g.want;
        g.m_granted = small(reply.granted, "taken");
        g.m_refill = refiller ? 1 : 0;
        if (reply.granted > 0 || refiller) {
          g.m_window = index_of(reply.window_start.count());
          g.m_expires_in =
              tiny(std::max<std::int64_t>(reply.expires_in.count(), -c_.period), "expires_in");
        }
        // Units granted: a live pool, so expires_in > 0 and regional_refill_size() does not
        // read it; taken_expiry() reads the take's send time plus it (the drift allowance 0),
        // so the sum is kept (but for the variants that read either alone).
        if (reply.granted > 0 && c_.variant != Variant::kTakerFromReceipt &&
            c_.variant != Variant::kRefillFromTakeSent) {
          g.m_expires_in = tiny(g.take_sent + g.m_expires_in, "taken expiry");
          g.take_sent = 0;
        }
        if (reply.granted == 0 && !(c_.variant == Variant::kRefillFromTakeSent && refiller))
          g.take_sent = 0;  // not read
        if (refiller) {
          g.m_now = tiny(reply.now.count(), "pool now");
          g.m_demand = small(reply.demand, "demand");
        }
        if (reply.granted > 0) r.taken = true;
        break;
      }
      case kTaken: {
        if (g.phase != kTakeReply) return false;
        taken(s, i, StatusOr<PoolReply>(take_reply_of(g)));
        break;
      }
      case kLease: {
        if (g.phase != kLeaseSent || s.coord_down) return false;
        const LeaseReply reply = coordinate_lease(s, "a", g.ask, g.lease_need, r);
        g.phase = kLeaseReply;
        store_reply(reply, g);
        break;
      }
      case kLeased:
        if (g.phase != kLeaseReply) return false;
        leased(s, i, StatusOr<LeaseReply>(reply_of(g)));
        break;
      case kRefill: {
        if (g.phase != kRefillSent || s.pool_down) return false;
        RegionalPool p = to_pool(s);
        const PoolReply reply = pool_refill(p, Nanos{start_of(g.refill_window)}, g.extra,
                                            Nanos{g.refill_expires}, pool_now(s));
        from_pool(p, s);
        g.phase = kRefillReply;
        g.m_granted = small(reply.granted, "accepted");
        if (g.extra > 0 && reply.granted == g.extra) r.refill_accepted = true;
        break;
      }
      case kRefilled: {
        if (g.phase != kRefillReply) return false;
        PoolReply accepted;
        accepted.granted = g.m_granted;
        refilled(s, i, StatusOr<PoolReply>(accepted));
        break;
      }
      case kExpire: {  // the limiter's sweep gives up expired escrow
        const Nanos now = proc_now(s, i);
        if (g.e_units == 0 || now.count() < g.e_expires) return false;
        key_step(s, i, [&](FederatedKey& k, KeyEffects& e) { give_up(k, now, true, e); });
        break;
      }
      case kRelease: {
        if (g.rel_window == kNone || s.pool_down) return false;
        RegionalPool p = to_pool(s);
        Nanos window{start_of(g.rel_window)};
        if (c_.variant == Variant::kReleaseIntoLaterWindow && p.window_start > window.count())
          window = Nanos{p.window_start};
        const PoolReply reply = pool_release(p, window, g.rel_units, pool_now(s));
        from_pool(p, s);
        if (reply.granted > 0) r.release_accepted = true;
        g.rel_window = kNone;
        g.rel_units = 0;
        break;
      }
      case kDrop:  // a call (request or reply) lost in its server's outage: it failed
        switch (g.phase) {
          case kTakeSent:
          case kTakeReply:
            if (!s.pool_down) return false;
            taken(s, i, StatusOr<PoolReply>(lost()));
            break;
          case kLeaseSent:
          case kLeaseReply:
            if (!s.coord_down) return false;
            leased(s, i, StatusOr<LeaseReply>(lost()));
            break;
          case kRefillSent:
            if (!s.pool_down) return false;
            refilled(s, i, StatusOr<PoolReply>(lost()));
            break;
          default:
            return false;
        }
        break;
      case kDropRelease:
        if (g.rel_window == kNone || !s.pool_down) return false;
        g.rel_window = kNone;
        g.rel_units = 0;
        break;
      case kLoseRefillReply:  // a reply later than the call's timeout: the call failed
        if (!c_.lost_refill_replies || g.phase != kRefillReply) return false;
        refilled(s, i, StatusOr<PoolReply>(lost()));
        break;
      case kRestart:
        if (!c_.restarts || (g.phase == kIdle && g.e_window == kNone)) return false;
        clear_lease(g);
        from_key(FederatedKey{}, g);  // its parked checks are gone with it
        break;
      case kTick: {
        if (s.t + 1 >= c_.ticks) return false;
        const auto before = s.t / c_.period;
        ++s.t;
        if (s.t / c_.period != before) s.admitted = 0;
        break;
      }
      case kCoordOutage:
        if (!c_.coordinator_outages) return false;
        s.coord_down ^= 1;
        break;
      case kPoolOutage:
        if (!c_.pool_outages) return false;
        s.pool_down ^= 1;
        break;
      case kCoordLoss:
        if (!c_.coordinator_losses) return false;
        from_ledger(Ledger{}, s);
        s.origin = index_of(window_of(Nanos{s.t}, Nanos{c_.period}).count());
        break;
      case kPoolLoss:
        if (!c_.pool_losses || (s.p_window == kNone && s.p_refilling == kExpired)) return false;
        from_pool(RegionalPool{}, s);
        break;
      default:
        return step_b(s, a, r);
    }
    normalise(s);
    return true;
  }

  // Region b, leasing directly (federation_model_test.cpp's region).
  bool step_b(State& s, Action a, Result& r) {
    if (!c_.region_b) return false;
    RegionB& b = s.b;
    const Nanos now = b_now(s);
    // Region b's key through one core step, and what it asks for: a reconcile of escrow given up
    // (a newer one pushes the older out, a loss), its next lease.
    const auto key_step_b = [&](auto f) {
      const KeyEffects e = core_step(b, f);
      if (admit(s, e) > 0) r.b_spent = true;
      for (const GivenUp& u : e.given_up) {
        b.rec_window = index_of(u.window_start.count());
        b.rec_total = small(u.total, "total");
      }
      if (e.lease_want > 0) {
        if (b.request || b.r_ok) harness_error_ = "a second lease in flight";
        b.request = 1;
        b.want = small(e.lease_want, "want");
        b.need = small(std::min(e.lease_need, e.lease_want), "need");
        b.sent_at = tiny(now.count(), "sent_at");
      }
      if ((b.leasing != 0) != (b.request || b.r_ok))
        harness_error_ = "b: the key's leasing flag and the lease in flight differ";
    };
    // The lease's outcome: the coordinator's reply, or the call's failure.
    const auto outcome = [&](bool failed) {
      FederatedLeaseOutcome o;
      o.sent_at = Nanos{b.sent_at};
      o.reply = failed ? StatusOr<LeaseReply>(lost()) : StatusOr<LeaseReply>(reply_of(b));
      b.request = b.want = b.need = 0;
      b.sent_at = 0;
      static_cast<PackedReply&>(b) = PackedReply{0, 0, 0, 0, kNone, 0};
      return o;
    };
    switch (a) {
      case kBCheck: {
        last_hits_ = 1;
        const bool park = b.parked[c_.parked - 1] == 0;
        key_step_b([&](FederatedKey& k, KeyEffects& e) {
          check_key(k, last_hits_, now, park, rules_, e);
        });
        break;
      }
      case kBProcess: {
        if (!b.request || s.coord_down) return false;
        store_reply(coordinate_lease(s, "b", b.want, b.need, r), b);
        b.request = b.want = b.need = 0;
        break;
      }
      case kBDrop:
      case kBDeliver: {
        if (a == kBDrop ? !(b.request || b.r_ok) || !s.coord_down : !b.r_ok) return false;
        const FederatedLeaseOutcome o = outcome(a == kBDrop);
        key_step_b([&](FederatedKey& k, KeyEffects& e) { on_lease(k, o, now, 0, rules_, e); });
        break;
      }
      case kBExpire:
        if (b.e_units == 0 || now.count() < b.e_expires) return false;
        key_step_b([&](FederatedKey& k, KeyEffects& e) { give_up(k, now, true, e); });
        break;
      case kBReconcile: {
        if (b.rec_window == kNone || s.coord_down) return false;
        Ledger& l = to_ledger(s);
        reconcile(l, "b", Nanos{start_of(b.rec_window)}, b.rec_total, Nanos{s.t});
        from_ledger(l, s);
        b.rec_window = kNone;
        b.rec_total = 0;
        break;
      }
      default:
        return false;
    }
    normalise(s);
    return true;
  }

  void normalise(State& s) {
    const auto current = static_cast<std::int8_t>(s.t / c_.period);
    if (s.l_window != kNone && s.l_window < current) {  // the next lease rolls it
      s.l_window = kNone;
      s.l_granted = s.l_returned = 0;
      for (Rec& r : s.rec) r.granted = 0;
    }
    for (Rec& r : s.rec) {
      if (r.relinquished_window != kNone &&
          (s.l_window == kNone || r.relinquished_window < s.l_window)) {
        r.relinquished_window = kNone;
        r.relinquished = 0;
      }
      if (r.granted == 0 && r.relinquished_window == kNone) r = Rec{0, 0, 0, kNone};
    }
    const std::int64_t pool_t = pool_now(s).count();
    // Past by a period or more: every later take reads the same (expires_in <= -period).
    if (s.p_expires != kExpired && s.p_expires <= pool_t - c_.period) s.p_expires = kExpired;
    // The demand is read only within a period after the pool's window ended; past that, no
    // refill of that window is accepted (its expiry is no later than the window's end), and a
    // later window's clears it.
    if (s.p_window == kNone || s.p_expires == kExpired) s.p_demand = 0;
    if (s.p_refilling != kExpired && s.p_refilling <= pool_t) s.p_refilling = kExpired;
    for (int i = 0; i < kProcs; ++i) {
      Proc& g = s.proc[i];
      sluice::model::fold(g, proc_now(s, i).count(), c_.period);
      // The lease's fields that no later step reads (PoolLease's steps, the model's sends):
      // the take's send time once the take is over (but for the variant that reads it), the
      // refiller's take reading outside its lease, the lease's ask outside its send, the
      // refill's call outside its send.
      const bool leasing = g.phase == kLeaseSent || g.phase == kLeaseReply;
      if (g.phase > kTakeReply &&
          !(c_.variant == Variant::kRefillFromTakeSent && g.refiller && leasing))
        g.take_sent = 0;
      if (!(g.refiller && leasing)) g.seen = g.pool_now = 0;
      // pool_expiry() reads the pool's reading less `seen` (or, in a variant, less the take's
      // send time): kept relative to `seen`.
      if (g.refiller && leasing && g.seen != 0) {
        g.pool_now = tiny(g.pool_now - g.seen, "pool now");
        if (c_.variant == Variant::kRefillFromTakeSent)
          g.take_sent = tiny(g.take_sent - g.seen, "take sent");
        g.seen = 0;
      }
      if (g.phase != kLeaseSent) g.ask = g.lease_need = 0;
      if (g.phase != kRefillSent) {
        g.refill_window = kNone;
        g.refill_expires = 0;
      }
      // The coordinator's reply once it is back: its send time and the window's time left at the
      // coordinator are read only as their sum (escrow_expiry() with the drift allowance 0, the
      // key's window end), so the sum is kept. That sum, and the expiry of the pool's units
      // waiting to join the escrow, once a period or more past, read as any such time does (as
      // the key's escrow expiry is folded) -- but not while a refiller reads its grant's expiry
      // to refill the pool.
      if (g.phase >= kLeaseReply) {
        if (g.r_ok) g.r_left = tiny(g.sent_at + g.r_left, "expiry");
        g.sent_at = 0;
      }
      const std::int64_t now = proc_now(s, i).count();
      if (g.phase >= kRefillSent && g.r_ok && now - g.r_left >= c_.period) g.r_left = kExpired;
      if (g.pool_units > 0 && now - g.pool_expires >= c_.period) g.pool_expires = kExpired;
    }
    // Region b: its key, and its reply once back, as region a's.
    RegionB& b = s.b;
    sluice::model::fold(b, b_now(s).count(), c_.period);
    if (b.r_ok) {
      b.r_left = tiny(b.sent_at + b.r_left, "expiry");
      b.sent_at = 0;
    }
  }

  std::string describe(const State& s) const {
    std::string out = "t=" + std::to_string(s.t) + " (w" + std::to_string(s.t / c_.period) +
                      " admitted=" + std::to_string(s.admitted) + ")";
    if (s.coord_down) out += " COORD-DOWN";
    if (s.pool_down) out += " POOL-DOWN";
    out += " pool[";
    if (s.p_window != kNone)
      out += "w" + std::to_string(s.p_window) + " bal=" + std::to_string(s.p_balance) +
             " exp=" + std::to_string(s.p_expires);
    if (s.p_refilling != kExpired) out += " refilling<" + std::to_string(s.p_refilling);
    out += "]";
    static constexpr std::array<const char*, 7> kPhases = {
        "", "take-sent", "take-reply", "lease-sent", "lease-reply", "refill-sent", "refill-reply"};
    for (int i = 0; i < kProcs; ++i) {
      const Proc& g = s.proc[i];
      out += " p" + std::to_string(i) + "[";
      out += sluice::model::describe(g);
      if (g.phase != kIdle) {
        out += std::string(" ") + kPhases[g.phase] + "(want=" + std::to_string(g.want) + " ";
        if (g.phase <= kTakeReply) out += "take_sent=" + std::to_string(g.take_sent);
        if (g.phase == kTakeReply)
          out += " +" + std::to_string(g.m_granted) + " w" + std::to_string(g.m_window) +
                 " in=" + std::to_string(g.m_expires_in) + " pool_now=" + std::to_string(g.m_now) +
                 (g.m_refill ? " refill" : "");
        if (g.pool_units > 0)
          out += " pool+" + std::to_string(g.pool_units) + " w" + std::to_string(g.pool_window) +
                 " exp=" + std::to_string(g.pool_expires);
        if (g.phase >= kLeaseSent)
          out += " lease(ask=" + std::to_string(g.ask) + " sent=" + std::to_string(g.sent_at) + ")";
        if (g.phase >= kLeaseReply)
          out += g.r_ok ? " +" + std::to_string(g.r_granted) + " w" + std::to_string(g.r_window) +
                              " left=" + std::to_string(g.r_left)
                        : std::string(" failed");
        if (g.refiller)
          out += " refiller pool_now=" + std::to_string(g.pool_now) +
                 " seen=" + std::to_string(g.seen);
        if (g.phase >= kRefillSent)
          out +=
              " extra=" + std::to_string(g.extra) + " pool_exp=" + std::to_string(g.refill_expires);
        if (g.phase == kRefillReply) out += " accepted=" + std::to_string(g.m_granted);
        out += ")";
      }
      if (g.rel_window != kNone)
        out +=
            " release(w" + std::to_string(g.rel_window) + " " + std::to_string(g.rel_units) + ")";
      out += "]";
    }
    if (c_.region_b) {
      out += " b[";
      out += sluice::model::describe(s.b);
      if (s.b.request) out += " lease(want=" + std::to_string(s.b.want) + ")";
      if (s.b.r_ok)
        out += " reply(+" + std::to_string(s.b.r_granted) + " w" + std::to_string(s.b.r_window) +
               " left=" + std::to_string(s.b.r_remaining) + ")";
      if (s.b.rec_window != kNone)
        out += " reconcile(w" + std::to_string(s.b.rec_window) + " " +
               std::to_string(s.b.rec_total) + ")";
      out += "]";
    }
    out += " | coord";
    if (s.l_window != kNone)
      out += " w" + std::to_string(s.l_window) +
             " granted-returned=" + std::to_string(static_cast<int>(s.l_granted) - s.l_returned);
    if (s.origin != kNone) out += " origin=w" + std::to_string(s.origin);
    return out;
  }

  std::string trace_to(std::size_t at) const {
    return space_.trace(at, [&](const auto& e) {
      const std::string who =
          e.action >= kFirstGlobal ? std::string() : "p" + std::to_string(e.actor) + ".";
      return who + kActionNames[e.action] + "  ->  " + describe(e.state);
    });
  }

  Config c_;
  Ledger scratch_;
  StateSpace<State> space_;
  FederatedKeyRules rules_;
  FederatedKey key_;                         // the key of the process in hand
  std::uint64_t last_hits_ = 0;              // the hits of the check in hand
  std::vector<std::uint64_t> decided_hits_;  // the parked checks' hits, as a step began
};

Result explore(const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  Result r = Explorer(c).run();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "[pool model] limit=%llu batch=%llu regional_batch=%llu period=%lld ticks=%lld "
      "offsets={p0 %d, p1 %d, pool %d, b %d}%s %s: %zu states, max admitted per window=%llu, "
      "%.0f ms%s\n",
      static_cast<unsigned long long>(c.limit), static_cast<unsigned long long>(c.batch),
      static_cast<unsigned long long>(c.regional_batch), static_cast<long long>(c.period),
      static_cast<long long>(c.ticks), c.offset[0], c.offset[1], c.pool_offset, c.b_offset,
      c.region_b ? " +region b" : "", kVariantNames[static_cast<int>(c.variant)], r.states,
      static_cast<unsigned long long>(r.max_admitted), ms,
      r.violation.empty() ? "" : (" -> " + r.violation).c_str());
  return r;
}

void expect_holds(const Config& c) {
  const Result r = explore(c);
  EXPECT_EQ(r.violation, "") << r.trace;
  EXPECT_GT(r.states, 100'000u);
  // Not vacuous: a window's whole budget is admitted, refills reach the pool, takes are served
  // from it, escrow goes back into it, region b admits beside it, and a coordinator that lost
  // its state refuses a lease.
  EXPECT_EQ(r.max_admitted, c.limit);
  EXPECT_TRUE(r.refill_accepted);
  EXPECT_TRUE(r.taken);
  EXPECT_TRUE(r.release_accepted);
  EXPECT_EQ(r.b_spent, c.region_b);
  EXPECT_EQ(r.loss_refused, c.coordinator_losses);
}

void expect_caught(const Config& c) {
  const Result r = explore(c);
  EXPECT_EQ(r.violation.rfind("Admitted", 0), 0u) << r.violation << "\n" << r.trace;
  std::printf("[pool model]   counterexample:\n%s", r.trace.c_str());
}

// The processes of region "a" alone, every message slow, the pool down and up, and no failure
// of the coordinator: the space the broken variants are searched in.
Config pool_only() {
  Config c;
  c.limit = 3;
  c.coordinator_outages = false;
  c.coordinator_losses = false;
  c.pool_outages = false;
  c.pool_losses = false;
  c.restarts = false;
  return c;
}

Config broken(Variant v) {
  Config c = pool_only();
  c.variant = v;
  return c;
}

// Named FederationModel.* with the other federation searches (the sanitizer suites skip them);
// ctest runs them side by side, each a few seconds to a quarter of a minute.
TEST(FederationModel, PoolNeverAdmitsMoreThanTheLimitPerWindowThroughPoolLossesAndRestarts) {
  Config c = pool_only();
  c.pool_losses = true;
  c.restarts = true;
  c.ticks = 3;
  expect_holds(c);
}

TEST(FederationModel, PoolNeverAdmitsMoreThanTheLimitPerWindowThroughBothOutages) {
  Config c = pool_only();
  c.pool_outages = true;
  c.coordinator_outages = true;
  c.ticks = 3;
  expect_holds(c);
}

TEST(FederationModel, PoolNeverAdmitsMoreThanTheLimitPerWindowThroughCoordinatorLosses) {
  Config c = pool_only();
  c.coordinator_losses = true;
  c.ticks = 3;
  expect_holds(c);
}

TEST(FederationModel, PoolNeverAdmitsMoreThanTheLimitPerWindowBesideARegionLeasingDirectly) {
  Config c = pool_only();
  c.region_b = true;
  c.ticks = 2;  // one window: across a boundary the space is too big for the suite
  expect_holds(c);
}

TEST(FederationModel, APoolThatServesPastItsExpiryIsCaught) {
  expect_caught(broken(Variant::kPoolServesPastExpiry));
}

TEST(FederationModel, ARefillExpiryCountedFromTheTakesSendTimeIsCaught) {
  expect_caught(broken(Variant::kRefillFromTakeSent));
}

TEST(FederationModel, ARefillExpiryThatTakesEscrowTimeForPoolTimeIsCaught) {
  expect_caught(broken(Variant::kRefillEscrowAsPoolTime));
}

TEST(FederationModel, ATakerExpiryCountedFromTheReplysArrivalIsCaught) {
  expect_caught(broken(Variant::kTakerFromReceipt));
}

TEST(FederationModel, AReleaseAcceptedIntoALaterWindowIsCaught) {
  expect_caught(broken(Variant::kReleaseIntoLaterWindow));
}

// A refill the pool applied but whose reply came too late (the call timed out) is a failed call
// to the refiller, which then gives up the units it sent: they are in the pool, and the region
// must not spend them twice.
TEST(FederationModel, PoolNeverAdmitsMoreThanTheLimitWhenARefillTimesOut) {
  Config c = pool_only();
  c.pool_outages = true;
  c.lost_refill_replies = true;
  expect_holds(c);
}

// The same on the real FederatedLimiter: a pool whose first refill is applied but answers too
// late (kDeadlineExceeded, as a slow Redis reply does). Were the refiller to keep the regional
// batch it put in the pool, the other process would take it from the pool too and the window
// would admit more than the limit.
class LateFirstRefill final : public RegionalEscrow {
 public:
  explicit LateFirstRefill(RegionalEscrow& inner) : inner_(inner) {}
  StatusOr<PoolReply> take(std::string_view key, std::uint64_t want, Nanos hold, bool past,
                           Nanos timeout) noexcept override {
    return inner_.take(key, want, hold, past, timeout);
  }
  StatusOr<PoolReply> refill(std::string_view key, Nanos w, std::uint64_t units, Nanos expires_at,
                             Nanos timeout) noexcept override {
    StatusOr<PoolReply> r = inner_.refill(key, w, units, expires_at, timeout);
    if (units == 0 || late_ == 0) return r;
    --late_;
    return Status(StatusCode::kDeadlineExceeded, "refill reply too late");  // but applied
  }
  StatusOr<PoolReply> release(std::string_view key, Nanos w, std::uint64_t units,
                              Nanos timeout) noexcept override {
    return inner_.release(key, w, units, timeout);
  }
  Status health(Nanos timeout) noexcept override { return inner_.health(timeout); }
  std::string_view backend() const noexcept override { return "late-first-refill"; }

 private:
  RegionalEscrow& inner_;
  int late_ = 1;
};

TEST(FederationModel, ALimiterWhoseRefillTimesOutAdmitsNoMoreThanTheLimit) {
  ManualClock clock{std::chrono::seconds(100)};  // the window [100 s, 110 s)
  MemoryRateCoordinator coord{clock};
  MemoryRegionalEscrow mem{clock};
  LateFirstRefill pool{mem};
  FederationOptions o = testing_support::opts("eu", 100);
  o.batch = 1;
  o.regional_batch = 8;
  FederatedLimiter p0(coord, &pool, clock, o, testing_support::inline_io());
  FederatedLimiter p1(coord, &pool, clock, o, testing_support::inline_io());
  std::uint64_t admitted = 0;
  for (int i = 0; i < 300; ++i) {
    FederatedLimiter& p = i % 2 == 0 ? p0 : p1;
    admitted += testing_support::check_now(p, "k", clock.now()).rate.allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 100u) << "the refill's units were spent by the refiller and from the pool";
}

}  // namespace
}  // namespace sluice
