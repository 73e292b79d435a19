// federated_key.h: one key of a federated rate budget as a region holds it, and the rules that
// move it: a check, a lease's outcome, escrow given up. Pure: no lock, no I/O, time passed in.
//
// What it is: FederatedKey is a key's state in one region (its escrow, what the last lease reply
// said of the budget left and of the window, until when it refuses without asking and why, and
// the hits of the checks parked behind its lease in flight). check_key() decides a check from it
// or parks it and asks for a lease; on_lease() applies a lease's outcome (the coordinator's
// reply, units from the regional pool, a failure), decides the parked checks it now can and asks
// for the next lease; give_up() forfeits unspent escrow. Each says what the caller must do in a
// KeyEffects: answer the checks decided, send the lease asked for, reconcile (or release to the
// pool) what was given up, count. sluice::FederatedLimiter (sluice/federation/federation.h) holds
// one per key behind its shard's lock and does the I/O; the escrow arithmetic is escrow.h's.
//
// Thread-safety: none; plain values and pure functions.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/escrow.h"
#include "sluice/core/rate_coordinator.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/status.h"

namespace sluice {

enum class FederatedReason : std::uint8_t {
  kAdmitted,
  kBudgetSpent,             // the key's global budget for this window is spent
  kCoordinatorUnreachable,  // escrow empty and the coordinator cannot be reached
  kCoordinatorRestarted,    // the coordinator lost its state in this window: it counts as spent
  kSpecMismatch,            // another region fixed this window with a different limit or period
  kNeverFits,               // more hits than the limit: no window admits them
  kKeyCapacity,             // a new key while max_keys keys are held
  kRegionalBalanceSpent,    // regional-only outage: the coordinator is down, the pool is empty
  kBudgetShort,  // the window's budget left (>= 1) is less than the check needs beyond the escrow
};
[[nodiscard]] std::string_view to_string(FederatedReason r) noexcept;

struct FederatedDecision {
  RateDecision rate;  // allowed, limit, remaining (escrow here + budget left globally), times
  FederatedReason reason = FederatedReason::kAdmitted;
};

// "Not set" for the times below (a time long past).
inline constexpr std::int64_t kFederatedNever = INT64_MIN;

// What the rules read of the limiter's options.
struct FederatedKeyRules {
  BudgetSpec budget;                              // limit per window, window length
  std::uint64_t batch = 16;                       // units per lease
  std::uint64_t refill_below = 4;                 // a busy key refills below this much escrow
  Nanos retry_backoff = std::chrono::seconds(1);  // after a failed call, before the next
  // A failed lease starts a regional-only outage (the pool serves, the caller probes) instead
  // of refusing the key for retry_backoff.
  bool regional_only = false;
};

struct FederatedKey {
  Escrow escrow;
  bool leasing = false;                    // a lease is in flight
  std::uint64_t global_left = UINT64_MAX;  // budget left at the last reply (max: not known)
  Nanos window_end{kFederatedNever};       // the last window's end on this clock
  Nanos closed_until{kFederatedNever};     // no lease before this: the window is spent
  FederatedReason closed_reason = FederatedReason::kBudgetSpent;
  Nanos unreachable_until{kFederatedNever};  // no lease before this: the coordinator failed
  // Until this, a check needing more than the escrow and global_left hold is refused here
  // (kBudgetShort) without a lease: the coordinator said so, and only give-backs add to it.
  Nanos short_until{kFederatedNever};
  std::deque<std::uint64_t> waiting;  // the hits of the parked checks, FIFO
  // The last lease refused for a spec mismatch: the spec in force, and the window told of it.
  std::optional<BudgetSpec> spec_in_force;
  Nanos mismatch_told{kFederatedNever};
  // Hits charged here after the fact (charge_key) that the escrow did not cover: the next
  // grants pay them before any check, until `owed_until` (the end of the window they were
  // charged in, as far as this region knows); what is still owed then, or once the window's
  // budget is known to be spent, is forgiven (a fixed window forgives what went over it).
  std::uint64_t owed = 0;
  Nanos owed_until{kFederatedNever};
  // The drift allowance the escrow's expiry was computed with: a larger one in force since (a
  // measured drift) makes that expiry unsafe, so the next grant's replaces it.
  std::uint32_t expiry_ppm = 0;
};

// A lease's outcome, as the limiter got it.
struct FederatedLeaseOutcome {
  bool outage = false;  // leased in a regional-only outage
  // Units taken from the pool, of `pool_window`, usable until `pool_expires` on this clock.
  std::uint64_t pool_units = 0;
  Nanos pool_window{kFederatedNever};
  Nanos pool_expires{kFederatedNever};
  bool pool_spent = false;                    // in an outage: the pool had nothing
  bool pool_unreachable = false;              // in an outage: nor could the pool be reached
  Nanos sent_at{0};                           // when the coordinator's lease was sent
  std::optional<StatusOr<LeaseReply>> reply;  // the coordinator's, when it was asked
};

// Escrow given up: reconciled with the coordinator as the window's running total, or (with a
// regional pool) released to the pool as units.
struct GivenUp {
  Nanos window_start;
  std::uint64_t units = 0;
  std::uint64_t total = 0;
};

// What one step asks of the caller.
struct KeyEffects {
  std::optional<FederatedDecision> decision;  // check_key(): decided now (else: a lease is due)
  std::vector<FederatedDecision> decided;     // on_lease(): the first parked checks', in order
  std::uint64_t lease_want = 0;               // a lease to send (0: none), asking for this much
  std::uint64_t lease_need = 0;               // and of use only with at least this much
  std::vector<GivenUp> given_up;
  // Counts: units granted (of them, taken from the pool), forfeited and spent.
  std::uint64_t granted = 0, pool_taken = 0, forfeited = 0, spent = 0;
  std::uint64_t forgiven = 0;               // charged hits no budget covered (an overdraft)
  bool lease_failed = false;                // the coordinator's lease failed
  bool spec_mismatch = false;               // it was refused for a spec mismatch
  std::optional<BudgetSpec> tell_mismatch;  // to tell (once per key and window): the spec
};

// The decision for `hits` of `k` with the times and allowance `k` holds at `now`.
[[nodiscard]] FederatedDecision decide_from(const FederatedKey& k, std::uint64_t hits, bool allowed,
                                            FederatedReason reason, Nanos now,
                                            const FederatedKeyRules& rules);
// What check_key() would answer at `now`, changing nothing.
[[nodiscard]] FederatedDecision peek_key(const FederatedKey& k, std::uint64_t hits, Nanos now,
                                         const FederatedKeyRules& rules);
// A check of `hits` at `now`: decided (effects.decision), or it needs a lease (none set): the
// check is parked when `park` (its hits joining k.waiting), and a lease is asked for unless one
// is in flight. Expired escrow is given up first. More hits than the limit: kNeverFits. No hits:
// allowed, spending nothing, unless the window is known to be spent here (then refused).
void check_key(FederatedKey& k, std::uint64_t hits, Nanos now, bool park,
               const FederatedKeyRules& rules, KeyEffects& out);
// A lease's outcome at `now` (`ppm`: the drift allowance in force): the grant added, the window
// and the budget left noted, the refusals it implies set, then the parked checks decided in
// order until one needs another lease (asked for in `out`); k.leasing is cleared first.
void on_lease(FederatedKey& k, const FederatedLeaseOutcome& o, Nanos now, std::uint32_t ppm,
              const FederatedKeyRules& rules, KeyEffects& out);
// A charge of `hits` at `now`, after the fact: spent from the escrow as far as it goes, the rest
// owed (k.owed) and leased for at once unless a lease is in flight (its reply pays it first) or
// the coordinator is known to be unreachable (the next check, charge or sweep asks again); when
// the window's budget is known to be spent, forgiven. Returns the key's allowance after it
// (RateCharge::pending: what it owes, RateCharge::overdraft: what this charge had forgiven).
RateCharge charge_key(FederatedKey& k, std::uint64_t hits, Nanos now,
                      const FederatedKeyRules& rules, KeyEffects& out);
// Gives back `hits` a check or charge took at `now`: what is owed first, then the escrow's spent
// units while it is usable (afterwards they stay spent). Returns the units given back to escrow.
std::uint64_t give_back_key(FederatedKey& k, std::uint64_t hits, Nanos now) noexcept;
// Asks for a lease of what `k` owes when none is in flight and one may go now (a sweep's retry
// after a failed one); forgives it once its window is over.
void lease_owed(FederatedKey& k, Nanos now, KeyEffects& out);
// Gives up `k`'s unspent escrow, if any (when `expired_only`, only once it has expired).
void give_up(FederatedKey& k, Nanos now, bool expired_only, KeyEffects& out);
// Whether `k` holds nothing worth keeping at `now` (no lease, nothing parked or held, its last
// window a window past, no refusal pending): a sweep may forget it.
[[nodiscard]] bool forgettable(const FederatedKey& k, Nanos now,
                               const FederatedKeyRules& rules) noexcept;

}  // namespace sluice
