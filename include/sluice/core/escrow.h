// escrow.h: federation's escrow core: one global rate budget per key, shared by regions, with
// no overshoot.
//
// What it is: the pure rules of federation, beside the fleet's heartbeat core. A key has a
// budget of `limit` units per global window [start, start + period), windows aligned on
// multiples of `period` on the COORDINATOR's clock. A region does not ask the coordinator per
// request: it leases escrow, a batch of units of one window's budget, and spends it locally.
//
// The coordinator's side (a Ledger per key; every coordinator backend runs lease() and
// reconcile() on it atomically):
//   1. the window is the one `now` falls in; windows never go back (a coordinator clock that
//      steps back stays in the window it had reached). A new window starts with the whole
//      budget and forgets the last one's grants;
//   2. the first lease of a window fixes (limit, period) for the key until the window ends; a
//      lease asking other values is refused (kSpecMismatch), never granted on either;
//   3. a window at or before the coordinator's origin window (the one it was in when it found
//      its state empty: a coordinator that lost its state cannot know what it had already
//      leased) is treated as spent (kStateLost) until it ends;
//   4. a grant is min(want, remaining, taper), taper = max(1, ceil(remaining / (2 x regions)))
//      with `regions` the regions that leased this key in this window, the asker included: a
//      nearly spent budget goes out in smaller pieces, so what regions hold unspent when the
//      window ends shrinks without more round trips while the budget is large;
//   5. a window with less than `min_window_left` (the asker's clock uncertainty) to run grants
//      nothing (kWindowEnding): the region could not spend it before its own early expiry;
//   6. reconcile(region, window, relinquished) records what the region gives up in a window as
//      a running total per (region, window): applying it twice, or out of order, changes
//      nothing. While that window is current the units go back into its budget; once it has
//      ended they are only counted (forfeited), never carried into another window.
// Guarantee (Δ = 0): for every key and window, the units granted minus the units given back
// never exceed `limit`, so the admissions spent from them do not either, for any number of
// regions, any order of calls, and any outage (tests/model/federation_model_test.cpp).
//
// The region's side (an Escrow per key; sluice/federation/federation.h spends it): a grant
// arrives with the coordinator's window end and its clock reading when it decided; the region maps
// the end onto its own monotonic clock from the moment it SENT the request (the reply cannot have
// been decided before then), less a drift allowance, so escrow always expires on the region's clock
// no later than its window ends on the coordinator's. Unspent escrow is forfeited at expiry.
//
// The regional pool (L2; sluice/core/regional_escrow.h shares it): processes of one region may
// share one pool per key between them and the coordinator. A process that finds the pool short
// leases a regional batch from the coordinator, keeps what it needs and refills the pool with the
// rest; the others take from the pool. The pool keeps the units of one coordinator window and an
// expiry on the POOL's clock, which the refiller derived from its own escrow expiry and a pool
// clock reading it saw before (so no unit outlives its window on the coordinator's clock); a
// taker maps the time left onto its own clock from the moment it sent the take, as a region
// does with a lease reply. Rules:
//   P1. take(want) grants min(want, balance) while the pool's expiry has not passed (with
//       `past_expiry`, the regional-only outage mode, whatever balance is left, of any window);
//       a take that leaves the asker short makes it the refiller (`refill`) unless another
//       process is refilling, for `refill_hold` (one refill in flight per pool and key);
//   P2. refill(window, units, expires_at) adds units of `window` (a later window replaces the
//       balance of an earlier one; an earlier window, or an expiry already past, accepts
//       nothing: the refiller keeps its units) and ends the refill in flight;
//   P3. release(window, units) takes back units of the pool's own window before its expiry,
//       and accepts nothing otherwise (the process forfeits them).
// Every take adds its `want` to the pool's `demand` (what the region's processes asked of it),
// which a refill of a later window restarts from 0: a window's first refill is sized by the
// region's demand in the window before (regional_refill_size), so a quiet region's pool is not
// left holding units it will not spend before the window ends. Demand decides no grant: the
// guarantee below does not depend on it. Guarantee: units go into the pool only from coordinator
// grants of the pool's window (refills) or back from processes (releases of units taken from it or
// granted in that window), and out of it only once; outside the regional-only mode none is taken
// after its window's end.
//
// Thread-safety: pure functions on caller-owned values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice {

// A key's budget: `limit` units per window of `period`.
struct BudgetSpec {
  std::uint64_t limit = 0;  // >= 1
  Nanos period{0};          // > 0, at most kMaxRatePeriod
  friend bool operator==(const BudgetSpec&, const BudgetSpec&) = default;
};

struct LeaseRequest {
  std::string region;  // non-empty
  BudgetSpec spec;
  std::uint64_t want = 0;  // >= 1: the batch
  // The least grant of any use (<= want): what a check larger than the region's escrow lacks.
  // A grant is never below it (the taper included), and with less than it left in the window
  // nothing is granted (kShort), so no region holds units it cannot spend while a check waits.
  // 0: any grant.
  std::uint64_t need = 0;
  // Grant nothing when the window has less than this left (the region's clock uncertainty).
  Nanos min_window_left{0};
};

enum class LeaseStatus : std::uint8_t {
  kGranted,       // granted >= 1
  kSpent,         // the window's budget is spent: nothing until it ends
  kWindowEnding,  // less than min_window_left left in the window
  kStateLost,     // the coordinator lost its state in this window: it counts as spent
  kSpecMismatch,  // this window's budget was fixed with another (limit, period)
  kShort,         // the window's budget left (`remaining`, >= 1) is less than the request's need
};
[[nodiscard]] std::string_view to_string(LeaseStatus s) noexcept;

struct LeaseReply {
  LeaseStatus status = LeaseStatus::kSpent;
  std::uint64_t granted = 0;
  Nanos window_start{0};  // on the coordinator's clock
  Nanos window_end{0};
  Nanos coordinator_now{0};  // the coordinator's clock when it decided
  // How far coordinator_now may be from the clock the window's end is reached on, both ways
  // together: 0 for a coordinator with a clock of its own (memory, Redis, PostgreSQL); for one
  // whose time is its callers' wall clocks (etcd), twice the offset they are stated to keep from
  // true time. escrow_expiry() ends escrow this much earlier.
  Nanos clock_uncertainty{0};
  // The window's budget left after this grant (what other regions can still lease).
  std::uint64_t remaining = 0;
  BudgetSpec spec;  // the window's spec in force (for kSpecMismatch: the one that won)
  friend bool operator==(const LeaseReply&, const LeaseReply&) = default;
};

// What one region did with one window of a key.
struct RegionLedger {
  std::string region;
  std::uint64_t granted = 0;       // in the ledger's current window
  std::uint64_t relinquished = 0;  // running total given back in `relinquished_window`
  std::int64_t relinquished_window = INT64_MIN;
  friend bool operator==(const RegionLedger&, const RegionLedger&) = default;
};

// The coordinator's record of one key.
struct Ledger {
  std::int64_t window_start = INT64_MIN;  // ns on the coordinator's clock; INT64_MIN: none yet
  // The latest coordinator time seen: a clock that steps back stands still here instead.
  std::int64_t clock_high = INT64_MIN;
  BudgetSpec spec;                    // fixed by the window's first lease
  std::uint64_t granted = 0;          // units granted in the window
  std::uint64_t returned = 0;         // units given back in the window
  std::uint64_t forfeited = 0;        // units given back after their window ended (all time)
  std::vector<RegionLedger> regions;  // sorted by region
  friend bool operator==(const Ledger&, const Ledger&) = default;
};

// Empty when the request is usable, else what is wrong with which field.
[[nodiscard]] std::string validate(const LeaseRequest& request);

// The start of the window `now` falls in (windows aligned on multiples of `period`).
[[nodiscard]] Nanos window_of(Nanos now, Nanos period) noexcept;

// Rules 1-5. `origin_window`: the start of the window in which this coordinator's state began
// empty after a loss (INT64_MIN: it has not lost any). Precondition: validate(request) is empty.
LeaseReply lease(Ledger& ledger, const LeaseRequest& request, Nanos now,
                 std::int64_t origin_window = INT64_MIN);

// Rule 6: `region` has given up `relinquished` units in total in the window starting at
// `window_start`. Returns the units this call gave back (0 for a repeat, or for a window that has
// ended: those are counted in `forfeited`).
std::uint64_t reconcile(Ledger& ledger, std::string_view region, Nanos window_start,
                        std::uint64_t relinquished, Nanos now);

// Budget left in the ledger's window as of `now` (the whole limit in a window not yet leased).
[[nodiscard]] std::uint64_t remaining(const Ledger& ledger, const BudgetSpec& spec, Nanos now,
                                      std::int64_t origin_window = INT64_MIN) noexcept;

// ---- the region's side ----

// One key's escrow in a region, for one window.
struct Escrow {
  std::int64_t window_start = INT64_MIN;  // the coordinator's window it was granted in
  Nanos expires_at{0};                    // on the region's clock: spend only before this
  std::uint64_t units = 0;                // unspent
  std::uint64_t granted = 0;              // granted in this window, in total
  std::uint64_t spent = 0;                // spent in this window, in total
  std::uint64_t relinquished = 0;         // given up in this window, in total (reconcile's)
  friend bool operator==(const Escrow&, const Escrow&) = default;
};

// When a grant's window ends on the region's clock, at the latest: `sent_at` is the region's
// clock when it sent the request; `drift_ppm` bounds how much faster the coordinator's clock may
// run than the region's (parts per million); the reply's clock_uncertainty comes off the end.
[[nodiscard]] Nanos escrow_expiry(const LeaseReply& reply, Nanos sent_at,
                                  std::uint32_t drift_ppm) noexcept;

// How much faster the coordinator's clock runs than the region's, measured from lease replies:
// each reply's coordinator_now was read between the call's send and its receipt on the region's
// clock, so two replies bound the ratio of the clocks' rates over the time between them. The
// bounds come from the newest reply against an anchor 10-20 s older (renewed every 10 s, so a
// change of rate shows within 20 s), once the two are at least 1 s apart.
class DriftGauge {
 public:
  static constexpr Nanos kMinSpan = std::chrono::seconds(1);
  static constexpr Nanos kRenew = std::chrono::seconds(10);

  // One reply: the region's clock at the send and at the receipt, the coordinator's reading.
  void sample(Nanos sent, Nanos received, Nanos coordinator_now) noexcept;
  // Whether the bounds below are measured (else both 0).
  [[nodiscard]] bool measured() const noexcept { return measured_; }
  // (coordinator rate / region rate - 1) in ppm lies within [low_ppm, high_ppm].
  [[nodiscard]] std::int64_t low_ppm() const noexcept { return low_ppm_; }
  [[nodiscard]] std::int64_t high_ppm() const noexcept { return high_ppm_; }

 private:
  struct Reading {
    Nanos sent{0}, received{0}, coordinator{0};
  };
  std::optional<Reading> anchor_, next_;
  bool measured_ = false;
  std::int64_t low_ppm_ = 0, high_ppm_ = 0;
};

// The drift allowance escrow_expiry() should use: `configured` (drift_ppm), or when the gauge
// measured the coordinator's clock running faster than that for certain (its low bound above
// it), the gauge's high bound (at most 500,000: half again as fast).
[[nodiscard]] std::uint32_t drift_in_force(const DriftGauge& gauge,
                                           std::uint32_t configured) noexcept;

// Adds a grant to `e` (a grant of a later window replaces what is left of an earlier one, which
// is forfeited: returned as the units lost). `expires_at` from escrow_expiry().
std::uint64_t add_grant(Escrow& e, const LeaseReply& reply, Nanos expires_at) noexcept;

// Units usable at `now` (0 once expired).
[[nodiscard]] std::uint64_t usable(const Escrow& e, Nanos now) noexcept;

// Spends `hits` if usable(e, now) >= hits (all or nothing).
bool spend(Escrow& e, std::uint64_t hits, Nanos now) noexcept;

// Gives back `hits` spent at `now` (an all-or-nothing batch rolled back), while still usable.
void unspend(Escrow& e, std::uint64_t hits, Nanos now) noexcept;

// Gives up every unspent unit (at expiry, or on shutdown) and returns the window's running total
// given up: what to pass to reconcile() for e.window_start.
std::uint64_t relinquish(Escrow& e) noexcept;

// ---- the regional pool (L2) ----

// One key's pool in a region. Times on the pool's clock.
struct RegionalPool {
  std::int64_t window_start = INT64_MIN;  // the coordinator window the balance belongs to
  std::int64_t expires_at = INT64_MIN;    // take nothing at or after this (P1)
  std::uint64_t balance = 0;
  std::uint64_t demand = 0;  // units asked by takes since window_start's first refill (<= 2^53)
  std::int64_t refilling_until = INT64_MIN;  // a refill is in flight until then
  // The latest pool time seen: a clock that steps back stands still here instead.
  std::int64_t clock_high = INT64_MIN;
  friend bool operator==(const RegionalPool&, const RegionalPool&) = default;
};

struct PoolReply {
  std::uint64_t granted = 0;  // units taken (take) or accepted (refill, release)
  std::uint64_t balance = 0;  // left in the pool afterwards
  std::uint64_t demand = 0;   // the pool's demand afterwards (this take's want included)
  Nanos window_start{INT64_MIN};
  Nanos expires_in{0};  // the pool's time left before its expiry (<= 0: expired)
  Nanos now{0};         // the pool's clock when it decided
  bool refill = false;  // take: the asker is to lease for the pool (P1)
  friend bool operator==(const PoolReply&, const PoolReply&) = default;
};

// P1. Precondition: want >= 1, refill_hold > 0.
PoolReply pool_take(RegionalPool& pool, std::uint64_t want, Nanos refill_hold, bool past_expiry,
                    Nanos now) noexcept;
// P2. units == 0 only ends the refill in flight (a refiller whose lease failed).
PoolReply pool_refill(RegionalPool& pool, Nanos window_start, std::uint64_t units, Nanos expires_at,
                      Nanos now) noexcept;
// P3.
PoolReply pool_release(RegionalPool& pool, Nanos window_start, std::uint64_t units,
                       Nanos now) noexcept;

// What a refiller leases from the coordinator for the pool, from the take that made it the
// refiller (`take`, on a pool of windows of `period`): for a window's first refill, when the
// pool's last window ended less than a period ago, what the region asked of it in that window
// (its demand) if less than `regional_batch`; otherwise `regional_batch`. (Sizing a refill
// within a window by the demand's rate so far was measured in `sluice sim federation` and
// bought nothing, while slowing the recovery after a regional-only outage.)
[[nodiscard]] std::uint64_t regional_refill_size(const PoolReply& take, Nanos period,
                                                 std::uint64_t regional_batch) noexcept;

// The expiry to refill a pool with, on the pool's clock: `pool_now` is a pool reading the
// refiller received at `seen_at` on its own clock (the take that made it the refiller), and
// `escrow_expires` its own escrow's expiry for the units. The pool reading was taken before
// `seen_at`, so the same span after it ends no later than the escrow does; `drift_ppm` allows
// for the pool's clock running slower than the refiller's.
[[nodiscard]] Nanos pool_expiry(Nanos pool_now, Nanos seen_at, Nanos escrow_expires,
                                std::uint32_t drift_ppm) noexcept;

// A take's expiry on the taker's clock, from the moment it sent the take (`sent_at`).
[[nodiscard]] Nanos taken_expiry(const PoolReply& reply, Nanos sent_at,
                                 std::uint32_t drift_ppm) noexcept;

}  // namespace sluice
