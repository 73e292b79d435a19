// Exhaustive state-space search of federation: a key's rules in each region, the coordinator's
// ledger and the escrow arithmetic are all the production core (sluice::check_key, on_lease and
// give_up of core/federated_key.h; lease, reconcile, escrow_expiry, add_grant, spend and relinquish
// of core/escrow.h); the clock, the network and the failures are modelled here. It is the "BFS
// twin" of spec/federation_escrow.pml, which is the same protocol for spin.
//
// K regions ("a", "b", "c") share one key of `limit` units per window of `period` ticks. There
// is one global clock t (0 .. ticks - 1, one tick = 1 ns); the coordinator reads it as it is, a
// region reads it shifted by its own constant offset (clock skew: offsets, not drift, so the
// drift allowance is 0). Actions, in every interleaving:
//   check      a check of one hit (or, with big_checks, of a batch's hits) arrives at a region:
//              check_key() at the region's clock decides it, or parks it behind the key's
//              lease (one check at a time, or two; one more is asked without parking, as
//              try_check asks); a lease it asks for goes out, escrow it gives up is reconciled;
//   process    the coordinator runs lease() on a request in transit (not during an outage); its
//              reply, a grant or a refusal, travels back;
//   deliver    the reply arrives, at any later time: on_lease() applies it and decides the parked
//              checks, which may ask for the next lease;
//   fail       during an outage, a request or a reply in transit is lost and the region's call
//              fails: on_lease() with the error;
//   expire     the sweep: give_up() of escrow past its expiry on the region's clock, and a
//              reconcile (window, running total) is sent;
//   charge     (with charges) a charge of one hit after the fact, at most two a window:
//              charge_key() spends it from escrow or owes it, and leases what is owed;
//   retry      (with charges) the sweep's lease_owed(): what a key still owes after a failed
//              lease is leased again (or forgiven once its window is over);
//   reconcile  a reconcile in transit reaches the coordinator (not during an outage), either
//              for the last time or as a duplicate that stays in transit; either of the two the
//              network holds may go first (reordering); a third one sent pushes the first in
//              order out (a loss);
//   tick       the global clock moves on (window rolls);
//   outage     the coordinator becomes unreachable, or reachable again;
//   loss       the coordinator loses its state: an empty ledger whose origin window is the one
//              the clock is in.
// Invariants, in every reachable state:
//   Admitted  the admissions stamped with the real (global-clock) window they happen in never
//             exceed `limit` in that window; with charges, the units spent in it (admitted
//             checks and charges paid: Δ = 0 for what is admitted, whatever is charged);
//   Ledger    at the coordinator, granted - returned <= limit in its window;
//   Parked    a region with a parked check has a lease in flight (else nothing would answer it).
// Five deliberately broken variants, small wrappers around the real core here, must be caught
// by the same search: escrow that survives its window (a grant's expiry moved past it), a
// reconcile that is not idempotent (it applies the total as a delta every time), a reconcile
// that carries an ended window's units into the current window's budget, a restarted
// coordinator that does not count its current window as spent, and a charge whose debt is
// counted as spent at once instead of being leased.
//
// Finite space: the clock is bounded, so every counter is (checked). The state leaves out what
// cannot change what happens next, and folds values that behave alike into one (each an exact
// bisimulation for the real core; the broken variants run with the first three only):
//   - the ledger's clock high-water mark (the coordinator's clock never steps back here, so
//     max(now, clock_high) is now; the unit test covers a clock that steps back), its
//     `forfeited` count (never read), and the admissions of a window that has ended;
//   - the ledger's granted and returned: only their difference is ever read;
//   - a key's times that have passed on its region's clock (closed, unreachable and short
//     until, its window's end): the rules only compare them with later times or bound a later
//     time by them, as they do a time never set; an escrow expiry a window or more past (the
//     rules also ask whether the escrow expired less than a window ago); the budget left a
//     reply told, once no short refusal lasts (it is then read only as zero or not);
//   - (real core only) a ledger whose window has ended (the next lease rolls it, and a reconcile
//     of that window only counts what it forfeits), and a region's running total for a window
//     before the ledger's (a reconcile of such a window changes nothing the state keeps).
// A reconcile of an ended window still reaches the real reconcile(): a core that carried it
// into the current window would change `returned`, which the state keeps.
//
// On callers' clocks (the etcd coordinator: sluice/backends/etcd_rate_coordinator.h): the
// coordinator decides a call at the asking region's clock, or at the ledger's clock_high (kept in
// the state while it is ahead of every region's clock) when that is later; the regions' clocks
// are at most the stated uncertainty U apart; a lease asks U more of the window to be left; the
// reply says U (clock_uncertainty), and the production escrow_expiry() ends escrow U earlier; a
// loss's origin is the finder's clock plus U. Admitted then counts admissions in the window of
// the latest any region's clock may read (t + min offset + U). Two more broken variants must be
// caught: replies that say no uncertainty, and a loss's origin at the finder's clock.
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
#include "sluice/core/escrow.h"
#include "sluice/core/federated_key.h"
#include "state_space.h"

namespace sluice {
namespace {

using sluice::model::kExpired;
using sluice::model::kMaxParked;
using sluice::model::kNone;
using sluice::model::kNoTime;
using sluice::model::kUnknown;
using sluice::model::PackedKey;
using sluice::model::Packing;
using sluice::model::StateSpace;

constexpr int kMaxRegions = 3;
constexpr int kNet = 2;  // reconciles in transit, all regions together
constexpr std::array<std::string_view, kMaxRegions> kIds = {"a", "b", "c"};
constexpr std::size_t kMaxStates = 20'000'000;  // a configuration too big for the suite fails

enum class Variant {
  kCorrect,
  kEscrowOutlivesWindow,  // a grant's escrow expires long after its window
  kReconcileAsDelta,      // every reconcile gives its total back again
  kCarryIntoNextWindow,   // an ended window's units go back into the current window
  kRestartForgetsWindow,  // after a loss the current window is not counted as spent
  kChargeOwedAsPaid,      // what a charge owes is counted as spent at once, without a lease
  kUncertaintyIgnored,    // (caller clocks) replies say no clock uncertainty
  kOriginAtFinder,        // (caller clocks) a loss's origin is the finder's clock, not past it
};
constexpr std::array<const char*, 8> kVariantNames = {"correct",
                                                      "escrow-outlives-window",
                                                      "reconcile-as-delta",
                                                      "carry-into-next-window",
                                                      "restart-forgets-window",
                                                      "charge-owed-as-paid",
                                                      "uncertainty-ignored",
                                                      "origin-at-finder"};
constexpr std::uint8_t kMaxCharges = 2;  // charges per real window, at most

struct Config {
  int regions = 2;
  std::uint64_t limit = 3;
  std::uint64_t batch = 2;
  std::int64_t period = 2;                                   // ticks per window
  std::int64_t ticks = 4;                                    // t runs 0 .. ticks - 1
  std::array<std::int8_t, kMaxRegions> offset = {0, 1, -1};  // each region's clock is t + offset
  Variant variant = Variant::kCorrect;
  bool outages = true;      // the coordinator may become unreachable (outage, fail)
  bool losses = true;       // the coordinator may lose its state (loss)
  bool big_checks = false;  // checks of a batch's hits too (their leases carry a need)
  int parked = 1;           // checks parked behind a key's lease, at most (1 .. kMaxParked)
  bool charges = false;     // charges after the fact too (charge, retry)
  // A coordinator with no clock of its own (etcd): it decides at the asking region's clock, or at
  // the latest time it decided at when that is later, and says its clock uncertainty, which
  // bounds how far apart the regions' clocks are (max offset - min offset).
  bool caller_clocks = false;
  std::int64_t uncertainty = 0;  // ticks (with caller_clocks)
};

struct Msg {
  std::int8_t window;  // window index; kNone: an empty slot
  std::uint8_t region;
  std::uint8_t total;  // running total given up in it
};

// The coordinator's RegionLedger of one region.
struct Rec {
  std::uint8_t present;
  std::uint8_t granted;
  std::uint8_t relinquished;
  std::int8_t relinquished_window;
};

// One region: its FederatedKey, packed (times on its clock, windows as indices), and the key's
// lease in flight.
struct Region : PackedKey {
  // The lease: a request in transit (want, need), or the coordinator's reply coming back.
  std::uint8_t request;
  std::uint8_t want;
  std::uint8_t need;
  std::int8_t sent_at;  // the region's clock when it was sent
  std::uint8_t reply;
  std::uint8_t r_status;
  std::uint8_t r_granted;
  std::uint8_t r_remaining;
  std::int8_t r_window;  // the reply's window, as an index
  std::int8_t r_now;     // the coordinator's clock when it decided
};

struct State {
  std::uint8_t t;
  std::uint8_t outage;
  std::int8_t origin;     // the ledger's origin window; kNone: no loss
  std::uint8_t admitted;  // admissions (with charges: units spent) in the window t is in
  std::uint8_t charges;   // charges made in the window t is in
  std::int8_t l_window;   // the ledger's window; kNone: none yet
  std::int8_t l_clock;    // (caller clocks) the ledger's clock_high, while ahead; else kNoTime
  std::uint8_t l_granted;
  std::uint8_t l_returned;
  std::array<Rec, kMaxRegions> rec;
  std::array<Region, kMaxRegions> region;
  std::uint8_t msgs;  // reconciles in transit, sorted
  std::array<Msg, kNet> msg;
};
static_assert(std::is_trivially_copyable_v<State>);
static_assert(std::has_unique_object_representations_v<State>);  // compared and hashed as bytes

enum Action : std::uint8_t {
  kCheck,
  kCheckBatch,
  kProcess,
  kFail,
  kDeliver,
  kExpire,
  kCharge,
  kRetry,
  kReconcile0,  // global actions (region index 0): the first reconcile in transit arrives
  kReconcile1,
  kDuplicate0,  // it arrives, and a copy stays in transit
  kDuplicate1,
  kTick,
  kOutage,
  kLoss,
  kActions,
};
constexpr std::array<const char*, kActions> kActionNames = {
    "check",     "check-batch", "process",   "fail",       "deliver", "expire", "charge", "retry",
    "reconcile", "reconcile'",  "duplicate", "duplicate'", "tick",    "outage", "loss"};
constexpr Action kFirstGlobal = kReconcile0;

struct Result {
  std::size_t states = 0;
  std::string violation;             // empty: every invariant held in every state
  std::string trace;                 // the actions leading to the violation
  std::uint64_t max_admitted = 0;    // the most admissions seen in one window
  std::uint64_t max_given_back = 0;  // the most units one reconcile gave back to its window
  bool loss_refused = false;         // some lease was refused for a state loss
  bool short_refused = false;        // some lease was refused for a need the window lacked
  bool spent_across_skew = false;    // some region with a non-zero offset admitted
  bool parked_admitted = false;      // some parked check was admitted by a lease's outcome
  bool refilled = false;             // some admission sent a busy key's refill lease
  bool unreachable = false;          // some check was refused coordinator_unreachable
  bool two_decided = false;          // some lease's outcome decided two parked checks
  bool owed_paid = false;            // some grant paid what a charge owed
  bool forgiven = false;             // some charge was forgiven (its window's budget spent)
};

class Explorer : Packing {
 public:
  explicit Explorer(Config c) : Packing(c.period), c_(c), space_(kMaxStates) {
    rules_ = sluice::model::key_rules(spec(), c_.batch);
    if (c_.caller_clocks && min_offset() < 0)
      harness_error_ = "on callers' clocks the offsets are >= 0 (t is the earliest clock)";
  }

  Result run() {
    if (!harness_error_.empty()) {
      Result bad;
      bad.violation = "Harness: " + harness_error_;
      return bad;
    }
    State init;
    std::memset(static_cast<void*>(&init), 0, sizeof(init));
    init.origin = kNone;
    init.l_window = kNone;
    init.l_clock = kNoTime;
    for (Rec& r : init.rec) r.relinquished_window = kNone;
    for (int i = 0; i < kMaxRegions; ++i) from_key(FederatedKey{}, init.region[i]);
    for (Msg& m : init.msg) m.window = kNone;
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
      const auto outstanding = static_cast<std::int64_t>(s.l_granted) - s.l_returned;
      if (s.admitted > c_.limit)
        r.violation = "Admitted: " + std::to_string(s.admitted) + " admissions in window " +
                      std::to_string(real_window(s)) + " > limit " + std::to_string(c_.limit);
      else if (outstanding > static_cast<std::int64_t>(c_.limit))
        r.violation = "Ledger: granted - returned = " + std::to_string(outstanding) + " > limit " +
                      std::to_string(c_.limit);
      for (int i = 0; i < c_.regions && r.violation.empty(); ++i)
        if (s.region[i].parked[0] != 0 && !s.region[i].leasing)
          r.violation = "Parked: " + std::string(kIds[i]) + " has a parked check, no lease";
      if (!r.violation.empty()) {
        r.trace = trace_to(at);
        return r;
      }
      for (std::uint8_t a = 0; a < kActions; ++a) {
        const int owners = a >= kFirstGlobal ? 1 : c_.regions;
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

  std::int64_t origin_of(const State& s) const { return start_of(s.origin); }
  Nanos region_now(const State& s, int i) const { return Nanos{s.t + c_.offset[i]}; }
  std::int64_t min_offset() const {
    return *std::min_element(c_.offset.begin(), c_.offset.begin() + c_.regions);
  }
  // The coordinator's clock when it decides a call of region i: its own (the global clock), or
  // on callers' clocks the region's, or the ledger's clock_high when that is later.
  Nanos coordinator_reading(const State& s, int i) const {
    if (!c_.caller_clocks) return Nanos{s.t};
    return std::max(region_now(s, i), Nanos{s.l_clock == kNoTime ? INT64_MIN : s.l_clock});
  }
  // The window admissions are counted in: the global clock's; on callers' clocks, that of the
  // latest any region's clock may read (t + min offset + uncertainty), which every grant of a
  // window is made at or after and, with its escrow ended the uncertainty early, spent before
  // the window's end.
  std::int64_t real_window(const State& s) const {
    const std::int64_t shift = c_.caller_clocks ? min_offset() + c_.uncertainty : 0;
    return (s.t + shift) / c_.period;
  }

  // The state's ledger, in a scratch Ledger whose vector and strings are reused.
  Ledger& to_ledger(const State& s) {
    Ledger& l = scratch_;
    l.regions.clear();
    l.clock_high = s.l_clock == kNoTime ? INT64_MIN : s.l_clock;
    l.forfeited = 0;
    l.spec = BudgetSpec{};
    l.window_start = start_of(s.l_window);
    if (s.l_window != kNone) l.spec = spec();
    l.granted = s.l_granted;
    l.returned = s.l_returned;
    for (int i = 0; i < kMaxRegions; ++i) {
      const Rec& r = s.rec[i];
      if (!r.present) continue;
      RegionLedger g;
      g.region = std::string(kIds[i]);
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
    s.l_clock =
        c_.caller_clocks && l.clock_high != INT64_MIN ? tiny(l.clock_high, "clock_high") : kNoTime;
    // Only granted - returned is ever read (the budget left, clamped at 0 used): kept as that
    // difference, so that units granted and given back leave no trace.
    const std::uint64_t both = std::min(l.granted, l.returned);
    s.l_granted = small(l.granted - both, "granted");
    s.l_returned = small(l.returned - both, "returned");
    for (Rec& r : s.rec) r = Rec{0, 0, 0, kNone};
    for (const RegionLedger& g : l.regions) {
      const auto i = std::find(kIds.begin(), kIds.end(), g.region) - kIds.begin();
      if (i >= c_.regions) {
        harness_error_ = "unexpected region '" + g.region + "'";
        return;
      }
      s.rec[i] = Rec{1, small(g.granted, "granted"), small(g.relinquished, "relinquished"),
                     index_of(g.relinquished_window)};
    }
  }

  // The region's key as the core holds it (its parked checks' hits in the key's queue), and
  // back (federated_key_state.h).
  FederatedKey& to_key(const Region& g) { return sluice::model::unpack(*this, g, key_); }
  void from_key(const FederatedKey& k, Region& g) {
    sluice::model::pack(*this, k, c_.parked, g, harness_error_);
  }

  // A reconcile goes out; with the region's slots full the oldest one is lost (the network may
  // lose any of them anyway). Kept sorted: which slot a message sits in means nothing.
  void post(State& s, int i, std::int8_t window, std::uint64_t total) {
    const Msg m{window, static_cast<std::uint8_t>(i), small(total, "total")};
    if (s.msgs == kNet) {
      s.msg[0] = s.msg[1];
      s.msgs = 1;
    }
    s.msg[s.msgs++] = m;
    auto key = [](const Msg& x) { return (x.window + 128) << 16 | x.region << 8 | x.total; };
    if (s.msgs == 2 && key(s.msg[1]) < key(s.msg[0])) std::swap(s.msg[0], s.msg[1]);
  }
  static void remove(State& s, int k) {
    if (k == 0) s.msg[0] = s.msg[1];
    s.msg[1] = Msg{kNone, 0, 0};
    --s.msgs;
  }

  // The coordinator receives region i's reconcile; returns the units it gave back.
  std::uint64_t coordinate_reconcile(State& s, int i, const Msg& m) {
    Ledger& l = to_ledger(s);
    const Nanos now = coordinator_reading(s, i);
    const Nanos window{start_of(m.window)};
    std::uint64_t back = 0;
    switch (c_.variant) {
      case Variant::kReconcileAsDelta:
        // Forgets what the region gave up before: the total counts as new every time.
        for (RegionLedger& g : l.regions)
          if (g.region == kIds[i]) g.relinquished = 0;
        back = reconcile(l, kIds[i], window, m.total, now);
        break;
      case Variant::kCarryIntoNextWindow: {
        const std::uint64_t forfeited = l.forfeited;
        back = reconcile(l, kIds[i], window, m.total, now);
        const std::uint64_t carried = l.forfeited - forfeited;
        const std::int64_t current = window_of(now, Nanos{c_.period}).count();
        if (carried > 0 && window.count() < current) {
          if (l.window_start != current) {  // the roll the next lease would do
            l.window_start = current;
            l.spec = spec();
            l.granted = 0;
            l.returned = 0;
            for (RegionLedger& g : l.regions) g.granted = 0;
          }
          l.returned += carried;
          back = carried;
        }
        break;
      }
      default:
        back = reconcile(l, kIds[i], window, m.total, now);
    }
    from_ledger(l, s);
    return back;
  }

  // What a step of region i's key asks for: its admissions counted, its escrow given up
  // reconciled, its next lease sent.
  void effects(State& s, int i, const KeyEffects& e, Result& r) {
    Region& g = s.region[i];
    std::uint64_t admitted = 0;
    const auto count = [&](const FederatedDecision& d, std::uint64_t hits) {
      if (d.rate.allowed) admitted += hits;
      if (d.reason == FederatedReason::kCoordinatorUnreachable) r.unreachable = true;
    };
    if (e.decision) count(*e.decision, last_hits_);
    if (e.decided.size() >= 2) r.two_decided = true;
    for (std::size_t j = 0; j < e.decided.size(); ++j) {
      count(e.decided[j], decided_hits_[j]);
      if (e.decided[j].rate.allowed) r.parked_admitted = true;
    }
    if (c_.charges ? admitted > e.spent : admitted != e.spent)
      harness_error_ = "admissions and spent units differ";
    if (e.forgiven > 0) r.forgiven = true;
    s.admitted = small(s.admitted + (c_.charges ? e.spent : admitted), "admitted");
    if (admitted > 0 && c_.offset[i] != 0) r.spent_across_skew = true;
    for (const GivenUp& u : e.given_up) post(s, i, index_of(u.window_start.count()), u.total);
    if (e.lease_want > 0) {
      if (g.request || g.reply) harness_error_ = "a second lease in flight";
      if (e.decision && e.decision->rate.allowed) r.refilled = true;
      g.request = 1;
      g.want = small(e.lease_want, "want");
      g.need = small(std::min(e.lease_need, e.lease_want), "need");  // as lease_async sends it
      g.sent_at = tiny(region_now(s, i).count(), "sent_at");
    }
  }

  // The region's key through one core step `f(key, effects)`, and what it asks for.
  template <class F>
  void key_step(State& s, int i, Result& r, F f) {
    FederatedKey& k = to_key(s.region[i]);
    decided_hits_.assign(k.waiting.begin(), k.waiting.end());
    const std::uint64_t owed = k.owed;
    KeyEffects e;
    f(k, e);
    if (k.owed < owed && e.forgiven == 0) r.owed_paid = true;
    if (c_.variant == Variant::kEscrowOutlivesWindow && e.granted > 0 && k.escrow.units > 0)
      k.escrow.expires_at = Nanos{100};
    from_key(k, s.region[i]);
    effects(s, i, e, r);
    if ((s.region[i].leasing != 0) != (s.region[i].request || s.region[i].reply))
      harness_error_ = "the key's leasing flag and the lease in flight differ";
  }

  // One atomic step of region i (or of the world, for the global actions); false if the action
  // is not enabled.
  bool step(State& s, int i, Action a, Result& r) {
    Region& g = s.region[i];
    const Nanos now = region_now(s, i);
    switch (a) {
      case kCheck:
      case kCheckBatch: {
        if (a == kCheckBatch && (!c_.big_checks || c_.batch == 1)) return false;
        last_hits_ = a == kCheck ? 1 : c_.batch;
        // Parked while a slot is free; else asked as try_check asks (decided now or not at all).
        const bool park = g.parked[c_.parked - 1] == 0;
        key_step(s, i, r, [&](FederatedKey& k, KeyEffects& e) {
          check_key(k, last_hits_, now, park, rules_, e);
        });
        break;
      }
      case kProcess: {
        if (!g.request || s.outage) return false;
        Ledger& l = to_ledger(s);
        LeaseRequest req;
        req.region = std::string(kIds[i]);
        req.spec = spec();
        req.want = g.want;
        req.need = g.need;
        if (c_.caller_clocks) req.min_window_left = Nanos{c_.uncertainty};  // as etcd's asks
        const LeaseReply reply = lease(l, req, coordinator_reading(s, i), origin_of(s));
        from_ledger(l, s);
        if (reply.status == LeaseStatus::kStateLost) r.loss_refused = true;
        if (reply.status == LeaseStatus::kShort) r.short_refused = true;
        if (reply.window_end - reply.window_start != Nanos{c_.period} || !(reply.spec == spec()))
          harness_error_ = "reply";
        g.request = g.want = g.need = 0;
        g.reply = 1;
        g.r_status = static_cast<std::uint8_t>(reply.status);
        g.r_granted = small(reply.granted, "reply granted");
        g.r_remaining = small(reply.remaining, "reply remaining");
        g.r_window = index_of(reply.window_start.count());
        g.r_now = tiny(reply.coordinator_now.count(), "coordinator_now");
        break;
      }
      case kDeliver:
      case kFail: {
        if (!g.reply && !(a == kFail && g.request)) return false;
        if (a == kFail && !s.outage) return false;
        FederatedLeaseOutcome o;
        o.sent_at = Nanos{g.sent_at};
        if (a == kFail) {
          o.reply = StatusOr<LeaseReply>(Status(StatusCode::kUnavailable, "lease timed out"));
        } else {
          LeaseReply reply;
          reply.status = static_cast<LeaseStatus>(g.r_status);
          reply.granted = g.r_granted;
          reply.remaining = g.r_remaining;
          reply.window_start = Nanos{start_of(g.r_window)};
          reply.window_end = reply.window_start + Nanos{c_.period};
          reply.coordinator_now = Nanos{g.r_now};
          if (c_.caller_clocks && c_.variant != Variant::kUncertaintyIgnored)
            reply.clock_uncertainty = Nanos{c_.uncertainty};
          reply.spec = spec();
          o.reply = StatusOr<LeaseReply>(reply);
        }
        g.request = g.want = g.need = 0;
        g.reply = g.r_status = g.r_granted = g.r_remaining = 0;
        g.sent_at = g.r_window = g.r_now = 0;
        key_step(s, i, r,
                 [&](FederatedKey& k, KeyEffects& e) { on_lease(k, o, now, 0, rules_, e); });
        break;
      }
      case kExpire:
        if (g.e_units == 0 || now.count() < g.e_expires) return false;
        key_step(s, i, r, [&](FederatedKey& k, KeyEffects& e) { give_up(k, now, true, e); });
        break;
      case kCharge:
        if (!c_.charges || s.charges >= kMaxCharges) return false;
        ++s.charges;
        last_hits_ = 0;  // a charge answers no check
        key_step(s, i, r, [&](FederatedKey& k, KeyEffects& e) {
          (void)charge_key(k, 1, now, rules_, e);
          if (c_.variant == Variant::kChargeOwedAsPaid && k.owed > 0) {
            k.escrow.spent += k.owed;
            e.spent += k.owed;
            k.owed = 0;
          }
        });
        break;
      case kRetry:
        if (!c_.charges || g.owed == 0 || g.leasing) return false;
        key_step(s, i, r, [&](FederatedKey& k, KeyEffects& e) { lease_owed(k, now, e); });
        break;
      case kReconcile0:
      case kReconcile1:
      case kDuplicate0:
      case kDuplicate1: {
        const int k = (a == kReconcile0 || a == kDuplicate0) ? 0 : 1;
        if (s.outage || k >= s.msgs) return false;
        const Msg m = s.msg[k];
        if (a == kReconcile0 || a == kReconcile1) remove(s, k);
        r.max_given_back = std::max(r.max_given_back, coordinate_reconcile(s, m.region, m));
        break;
      }
      case kTick: {
        if (s.t + 1 >= c_.ticks) return false;
        const auto before = real_window(s);
        ++s.t;
        if (real_window(s) != before) s.admitted = s.charges = 0;  // a new real window
        break;
      }
      case kOutage:
        if (!c_.outages) return false;
        s.outage = s.outage ? 0 : 1;
        break;
      case kLoss: {
        if (!c_.losses) return false;
        from_ledger(Ledger{}, s);
        // On callers' clocks, the finder's clock plus the uncertainty: past every reading yet.
        std::int64_t found_at = s.t;
        if (c_.caller_clocks)
          found_at += min_offset() + (c_.variant == Variant::kOriginAtFinder ? 0 : c_.uncertainty);
        s.origin = c_.variant == Variant::kRestartForgetsWindow
                       ? kNone
                       : index_of(window_of(Nanos{found_at}, Nanos{c_.period}).count());
        break;
      }
      default:
        return false;
    }
    normalise(s);
    return true;
  }

  // Values that behave alike from now on become one (see the top of the file).
  void normalise(State& s) const {
    // A clock_high no later than every region's clock decides nothing again.
    if (s.l_clock != kNoTime && s.l_clock <= s.t + min_offset()) s.l_clock = kNoTime;
    if (c_.variant == Variant::kCorrect) {
      // No coordinator reading is earlier than this window's (offsets >= 0 on callers' clocks).
      const auto current = static_cast<std::int8_t>(s.t / c_.period);
      if (s.l_window != kNone && s.l_window < current) {
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
    }
    for (int i = 0; i < c_.regions; ++i) {
      Region& g = s.region[i];
      sluice::model::fold(g, region_now(s, i).count(), c_.period);
    }
  }

  std::string describe(const State& s) const {
    std::string out = "t=" + std::to_string(s.t) + " (w" + std::to_string(real_window(s)) +
                      " admitted=" + std::to_string(s.admitted) + ")";
    if (s.outage) out += " OUTAGE";
    for (int i = 0; i < c_.regions; ++i) {
      const Region& g = s.region[i];
      out += " " + std::string(kIds[i]) + "[";
      out += sluice::model::describe(g);
      if (g.request)
        out += " req@" + std::to_string(g.sent_at) + "(want " + std::to_string(g.want) + " need " +
               std::to_string(g.need) + ")";
      if (g.reply)
        out += " reply@" + std::to_string(g.sent_at) + "(" +
               std::string(to_string(static_cast<LeaseStatus>(g.r_status))) + " w" +
               std::to_string(g.r_window) + " +" + std::to_string(g.r_granted) + " left " +
               std::to_string(g.r_remaining) + ")";
      out += "]";
    }
    for (int k = 0; k < s.msgs; ++k)
      out += " reconcile(" + std::string(kIds[s.msg[k].region]) + " w" +
             std::to_string(s.msg[k].window) + " " + std::to_string(s.msg[k].total) + ")";
    out += " | coord";
    if (s.l_window != kNone)
      out += " w" + std::to_string(s.l_window) +
             " granted-returned=" + std::to_string(static_cast<int>(s.l_granted) - s.l_returned);
    if (s.origin != kNone) out += " origin=w" + std::to_string(s.origin);
    return out;
  }

  // The actions from the initial state to the state at `at`, each with the state it leads to.
  std::string trace_to(std::size_t at) const {
    return space_.trace(at, [&](const auto& e) {
      const std::string who =
          e.action >= kFirstGlobal ? std::string() : std::string(kIds[e.actor]) + ".";
      return who + kActionNames[e.action] + "  ->  " + describe(e.state);
    });
  }

  Config c_;
  FederatedKeyRules rules_;
  Ledger scratch_;
  StateSpace<State> space_;
  FederatedKey key_;                         // the key of the region in hand
  std::uint64_t last_hits_ = 0;              // the hits of the check in hand
  std::vector<std::uint64_t> decided_hits_;  // the parked checks' hits, as a step began
};

Result explore(const Config& c) {
  const auto start = std::chrono::steady_clock::now();
  Result r = Explorer(c).run();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::string offsets;
  for (int i = 0; i < c.regions; ++i) offsets += (i ? "," : "") + std::to_string(c.offset[i]);
  std::printf(
      "[model] regions=%d limit=%llu batch=%llu period=%lld ticks=%lld offsets={%s}%s %s: %zu "
      "states, max admitted per window=%llu, max given back=%llu, %.0f ms%s\n",
      c.regions, static_cast<unsigned long long>(c.limit), static_cast<unsigned long long>(c.batch),
      static_cast<long long>(c.period), static_cast<long long>(c.ticks), offsets.c_str(),
      c.caller_clocks ? (" callers' clocks, uncertainty " + std::to_string(c.uncertainty)).c_str()
                      : "",
      kVariantNames[static_cast<int>(c.variant)], r.states,
      static_cast<unsigned long long>(r.max_admitted),
      static_cast<unsigned long long>(r.max_given_back), ms,
      r.violation.empty() ? "" : (" -> " + r.violation).c_str());
  return r;
}

Config make(int regions, std::uint64_t limit, std::uint64_t batch, std::int64_t ticks,
            Variant variant = Variant::kCorrect) {
  Config c;
  c.regions = regions;
  c.limit = limit;
  c.batch = batch;
  c.ticks = ticks;
  c.variant = variant;
  return c;
}

Result expect_holds(const Config& c) {
  Result r = explore(c);
  EXPECT_EQ(r.violation, "") << r.trace;
  EXPECT_GT(r.states, 100'000u);
  // Not vacuous: a window's whole budget is admitted, units come back into the window they were
  // granted in, a lease is refused for a state loss, a region with a skewed clock admits, a
  // parked check is admitted by the grant it waited for, a busy key refills before it runs dry,
  // and a failed lease refuses checks for a while.
  EXPECT_EQ(r.max_admitted, c.limit);
  EXPECT_GT(r.max_given_back, 0u);
  EXPECT_EQ(r.loss_refused, c.losses);
  EXPECT_TRUE(r.spent_across_skew);
  EXPECT_TRUE(r.parked_admitted);
  EXPECT_EQ(r.refilled, c.batch > 1);  // a refill leases below refill_below, before zero
  EXPECT_EQ(r.unreachable, c.outages);
  return r;
}

// Two regions with outages and state losses: three windows at batch 1, two at batch 2; one
// configuration per test, so that ctest runs them side by side.
TEST(FederationModel, TwoRegionsNeverAdmitMoreThanTheLimitPerWindowThreeWindows) {
  expect_holds(make(2, 3, 1, 5));
}
TEST(FederationModel, TwoRegionsNeverAdmitMoreThanTheLimitPerWindow) {
  expect_holds(make(2, 4, 1, 4));
  expect_holds(make(2, 3, 2, 4));
}
TEST(FederationModel, TwoRegionsNeverAdmitMoreThanTheLimitPerWindowLargerBatch) {
  expect_holds(make(2, 4, 2, 4));
}

// Checks of a batch's hits as well: their leases ask for what the check lacks or nothing (a
// grant lifted above the taper to its need, a need left short, refused here for a while),
// through the same faults.
TEST(FederationModel, TwoRegionsWithAllOrNothingLeasesNeverAdmitMoreThanTheLimitPerWindow) {
  Config c = make(2, 3, 2, 3);
  c.big_checks = true;
  EXPECT_TRUE(expect_holds(c).short_refused);
}

// Two checks parked behind one lease, of one hit or a batch's: the grant decides them in order,
// and one it cannot serve asks for the next lease (or is refused for a need left short).
TEST(FederationModel, TwoParkedChecksAtATimeNeverAdmitMoreThanTheLimitPerWindow) {
  Config c = make(2, 3, 2, 3);
  c.big_checks = true;
  c.parked = 2;
  c.outages = false;
  const Result r = expect_holds(c);
  EXPECT_TRUE(r.short_refused);
  EXPECT_TRUE(r.two_decided);
}

// Three regions, each clock skewed its own way, across a window boundary; without outages and
// state losses (the two-region searches cover them), which would make the space too big here.
TEST(FederationModel, ThreeRegionsNeverAdmitMoreThanTheLimitPerWindow) {
  Config c = make(3, 3, 2, 3);
  c.outages = false;
  c.losses = false;
  expect_holds(c);
}

// A coordinator with no clock of its own (etcd): each call decided at the asking region's clock
// or the ledger's clock_high, the regions' clocks up to the stated uncertainty apart, the replies
// saying it (the region's escrow ends that much earlier), a loss's origin that much past the
// finder's clock. Admissions are counted in the windows of the latest clock (t + 1 here).
Config on_caller_clocks(Variant variant = Variant::kCorrect) {
  Config c = make(2, 3, 2, 4, variant);
  c.caller_clocks = true;
  c.uncertainty = 1;
  c.offset = {0, 1, 0};
  c.outages = false;  // orthogonal to the clocks, and 14M states with them (33 s)
  return c;
}

TEST(FederationModel, RegionsOnTheirOwnClocksNeverAdmitMoreThanTheLimitPerWindow) {
  expect_holds(on_caller_clocks());
}

void expect_caught(const Config& c, const char* invariant) {
  const Result r = explore(c);
  EXPECT_EQ(r.violation.rfind(invariant, 0), 0u) << r.violation;
  std::printf("[model]   counterexample:\n%s", r.trace.c_str());
}

TEST(FederationModel, OnCallersClocksEscrowNotShortenedByTheUncertaintyIsCaught) {
  expect_caught(on_caller_clocks(Variant::kUncertaintyIgnored), "Admitted");
}

TEST(FederationModel, OnCallersClocksALossOriginAtTheFindersClockIsCaught) {
  expect_caught(on_caller_clocks(Variant::kOriginAtFinder), "Admitted");
}

TEST(FederationModel, EscrowThatSurvivesTheWindowIsCaught) {
  expect_caught(make(2, 3, 2, 4, Variant::kEscrowOutlivesWindow), "Admitted");
}

TEST(FederationModel, AReconcileThatIsNotIdempotentIsCaught) {
  expect_caught(make(2, 3, 2, 4, Variant::kReconcileAsDelta), "Admitted");
}

TEST(FederationModel, AReconcileThatCarriesIntoTheNextWindowIsCaught) {
  expect_caught(make(2, 3, 2, 4, Variant::kCarryIntoNextWindow), "Admitted");
}

TEST(FederationModel, ARestartThatForgetsItsWindowIsCaught) {
  expect_caught(make(2, 3, 2, 4, Variant::kRestartForgetsWindow), "Admitted");
}

// Charges after the fact beside the checks, through outages (state losses, which charges do
// not touch, would make the space too big here): what a window spends (the checks it admits and
// the charges it pays) never exceeds its limit; what a charge owes is paid by a later grant or
// forgiven with its window.
TEST(FederationModel, ChargesNeverLetAWindowSpendMoreThanItsLimit) {
  Config c = make(2, 3, 2, 3);
  c.charges = true;
  c.losses = false;
  const Result r = expect_holds(c);
  EXPECT_TRUE(r.owed_paid);
  EXPECT_TRUE(r.forgiven);
}

TEST(FederationModel, AChargeOwedCountedAsPaidWithoutALeaseIsCaught) {
  Config c = make(2, 3, 2, 3, Variant::kChargeOwedAsPaid);
  c.charges = true;
  expect_caught(c, "Admitted");
}

}  // namespace
}  // namespace sluice
