// federation.h: a region's side of one global rate budget per key (federation).
//
// What it is: FederatedLimiter holds, per key, the escrow its region leased from a global
// RateCoordinator (sluice/core/rate_coordinator.h) and decides checks from it (sluice/core/escrow.h
// has the rules). The budget is a fixed window: `limit` units per window of `period` on the
// coordinator's clock, for every region together, and the admissions spent from it never exceed
// the limit in any window, whatever the number of regions (Δ = 0).
//
// A check:
//   - is decided from escrow when the key's escrow covers it (no coordinator call), and then
//     answered before check() returns; when what is left falls below `refill_below`, a lease is
//     started in the background so that busy keys rarely wait (for what the key is expected to
//     spend before the window ends at its rate so far, at least a batch, at most double what
//     it was granted so far and 16 batches: a key that spends thousands a window costs a few
//     leases, not one per batch);
//   - otherwise joins the key's one lease call (concurrent checks of a key share it: no
//     stampede) and is answered when it completes, at most `lease_timeout` later; checks still
//     queued after it are what the next lease asks for (at least a batch), so a region admits
//     more than a batch per round trip when its checks come faster. Leases of different keys
//     that wait at the same moment go to the coordinator together, in one lease_many() call
//     (one round trip on Redis, up to 64 at a time), and a second such call may go while the
//     first is out (two at most). A key's first lease in a window is a batch, or what the key spent
//     here in the window before when that was less: a quiet key does not strand a batch of the
//     budget in every region it is checked in. Coordinator calls run on the IoExecutor, never on
//     the caller's thread;
//   - is refused without a call when the key's budget for this window is known to be spent
//     (until the window ends on this region's clock), or while the coordinator is known to be
//     unreachable (`retry_backoff` after a failure: fail closed, the escrow held keeps serving).
// Every refusal says why (FederatedReason) and when to retry. Escrow that expires unspent is
// forfeited and reconciled back (by sweep(), or the next check of its key).
//
// With a regional pool (sluice/core/regional_escrow.h, shared by the region's processes), a lease
// takes from the pool first; a process the pool leaves short leases from the coordinator, one
// refiller per key at a time, keeps what it needs and puts the rest in the pool (the others
// lease for themselves meanwhile). Such a lease is up to three calls in turn (take, lease,
// refill: sluice/core/pool_lease.h), each bounded by `lease_timeout`, so a check waiting for it
// is answered at most 3 x `lease_timeout` after it started. The refiller asks for
// `regional_batch` units, or, for a
// window's first refill, for what the region asked of the pool in the window before when that
// was less (the pool's demand): a quiet region's pool then holds about what it will spend, not
// a regional batch that would expire there unspent, out of every other region's reach. Escrow a
// process gives up goes back to the pool, not to the coordinator. While the pool cannot be reached,
// leases go straight to the coordinator as without one (`retry_backoff` after each failure); what
// is given up then is forfeited rather than given back, and the region's processes no longer share
// a batch. Outage modes, when the coordinator cannot be reached:
//   fail-closed    (default) the escrow held and the pool's balance for the current window keep
//                  serving; then checks are refused (kCoordinatorUnreachable). Δ = 0 holds.
//   regional-only  (needs a pool) the pool's whole balance keeps serving, whatever window it
//                  was leased for, until spent (kRegionalBalanceSpent); the coordinator's health
//                  is probed at most every `coordinator_health_check`, driven by checks (no
//                  timer), and leasing resumes when it answers. During the outage a window may
//                  admit more than the limit, by at most what the pools held at its onset
//                  (with refills granted before it still in flight); a process's own escrow
//                  still expires with its window (given up when it would share the later
//                  expiry of units served past theirs).
//
// Thread-safety: every member is safe to call concurrently. Callbacks run on the caller's thread
// (decided at once) or on the IoExecutor's (after a lease), never under the limiter's locks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/escrow.h"
#include "sluice/core/federated_key.h"
#include "sluice/core/rate_coordinator.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/regional_escrow.h"

namespace sluice {

enum class FederationOutage : std::uint8_t { kFailClosed, kRegionalOnly };
[[nodiscard]] std::string_view to_string(FederationOutage o) noexcept;

struct FederationOptions {
  std::string region;  // non-empty: this region's id at the coordinator
  // The budget's name at the coordinator: a key is "<budget_id>:<key>" there (empty: the key
  // as it is), so budgets that share a coordinator never share a key. No ':'.
  std::string budget_id;
  BudgetSpec budget;                                     // limit per window, window length
  std::uint64_t batch = 16;                              // units per lease, >= 1
  std::uint64_t refill_below = 0;                        // 0: batch / 4 (at least 1)
  Nanos lease_timeout = std::chrono::milliseconds(250);  // each coordinator call's bound
  Nanos retry_backoff = std::chrono::seconds(1);         // after a failed call, before the next
  // How much faster than this region's clock the coordinator's may run, in parts per million:
  // escrow expires early by that share of the time its window had left.
  std::uint32_t drift_ppm = 1000;
  // A window with less than this left grants nothing (the region would expire it at once).
  Nanos min_window_left = std::chrono::milliseconds(5);
  // Keys held at once. A check of a new key beyond it is refused (kKeyCapacity) until sweep()
  // forgets some: this bounds the memory and the lease calls a flood of new keys can cause.
  std::size_t max_keys = 1'000'000;
  // With a regional pool: what a refiller leases from the coordinator for the pool (0: 4 x
  // batch; a window's first refill asks less when the region asked less in the window before),
  // the outage mode, and how often a coordinator outage is probed.
  std::uint64_t regional_batch = 0;
  FederationOutage outage = FederationOutage::kFailClosed;
  Nanos coordinator_health_check = std::chrono::seconds(5);
  // Told once per key and window when the coordinator refuses a lease because the window was
  // fixed under another spec (another region's limit or period: a config rolled out to some
  // regions only): the key and the spec in force. Runs on the thread that took the reply, with
  // no lock held; must not block. Empty: not told (the count is in stats() all the same).
  std::function<void(std::string_view key, const BudgetSpec& in_force)> on_spec_mismatch;
  // Told when the lease replies show the coordinator's clock running faster than drift_ppm
  // allows, for certain (DriftGauge): the measured bound now in force instead (escrow expires
  // that much earlier), and again with 0 when it is back within drift_ppm. Same rules as above.
  std::function<void(std::uint32_t measured_ppm)> on_drift;
  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

struct FederationStats {
  std::uint64_t leases = 0;          // lease calls made
  std::uint64_t lease_failures = 0;  // calls that failed or timed out
  std::uint64_t granted = 0;         // units granted to this region
  std::uint64_t spent = 0;           // units spent (admitted hits)
  std::uint64_t forfeited = 0;       // units that expired unspent (or were given back)
  std::uint64_t charged = 0;         // hits charged after the fact (charge())
  std::uint64_t forgiven = 0;        // of them, hits no budget covered (overdrafts)
  std::uint64_t reconcile_failures = 0;
  // Leases refused because another region fixed the window with another limit or window (a
  // config rolled out to some regions only).
  std::uint64_t spec_mismatches = 0;
  // The coordinator's clock against this region's, from lease replies (DriftGauge): the upper
  // bound of how much faster it runs, in ppm (0 until measured), and the allowance escrow
  // expires with now (drift_ppm, or the measured bound when that is over drift_ppm).
  std::int64_t clock_drift_ppm = 0;
  std::uint32_t drift_ppm_in_force = 0;
  std::uint64_t keys = 0;  // keys held
  // With a regional pool:
  std::uint64_t pool_taken = 0;     // units taken from it
  std::uint64_t pool_refilled = 0;  // units this process put in it (refills and releases)
  std::uint64_t pool_failures = 0;  // calls to it that failed or timed out
  std::uint64_t outages = 0;        // regional-only outages entered
  bool in_outage = false;           // in one now
};

// Runs one coordinator call off the caller's thread (a thread pool in a server; inline or a
// simulated network in tests).
using IoExecutor = std::function<void(std::function<void()>)>;

class FederatedLimiter {
 public:
  using Callback = std::function<void(FederatedDecision)>;

  // `coordinator`, `pool` (null: none) and `clock` must outlive the limiter. Precondition:
  // options.validate() empty, and a pool when options.outage is kRegionalOnly.
  FederatedLimiter(RateCoordinator& coordinator, RegionalEscrow* pool, const Clock& clock,
                   FederationOptions options, IoExecutor io);
  FederatedLimiter(RateCoordinator& coordinator, const Clock& clock, FederationOptions options,
                   IoExecutor io)
      : FederatedLimiter(coordinator, nullptr, clock, std::move(options), std::move(io)) {}
  // Waits for the coordinator calls it started (each is bounded by lease_timeout).
  ~FederatedLimiter();
  FederatedLimiter(const FederatedLimiter&) = delete;
  FederatedLimiter& operator=(const FederatedLimiter&) = delete;

  // Admits `hits` for `key` (all or nothing); `done` gets the decision (see above). hits == 0
  // spends nothing and reports the key's allowance here (refused while its window is known to
  // be spent here, as after a charge that overdrew it).
  void check(std::string_view key, std::uint64_t hits, Nanos now, Callback done);
  // check() when it can be decided now (from escrow, or a refusal already known); nullopt when
  // it needs a lease, which is then started (a check() after it joins that lease).
  [[nodiscard]] std::optional<FederatedDecision> try_check(std::string_view key, std::uint64_t hits,
                                                           Nanos now);
  // What check() would answer now, spending nothing and calling no one: from this region's
  // escrow and what the last lease reply said of the budget left.
  [[nodiscard]] FederatedDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const;
  // The spec the coordinator holds `key`'s window under, when the last lease was refused for a
  // spec of its own that differs (FederatedReason::kSpecMismatch); else nullopt.
  [[nodiscard]] std::optional<BudgetSpec> spec_in_force(std::string_view key) const;
  // check() that waits for its answer (a library caller's convenience).
  [[nodiscard]] FederatedDecision check_wait(std::string_view key, std::uint64_t hits);
  // Charges `hits` to `key` after the fact (a cost known once the call is over), whatever is
  // left: spent from this region's escrow as far as it goes; the rest is owed and leased from
  // the coordinator in the background, paid before any check waiting here, and forgiven when the
  // window's budget cannot cover it (the window ends overdrawn: no check passes in it, anywhere,
  // and the next starts whole). Checks admitted never exceed the limit (Δ = 0 holds for what is
  // admitted); charges can take a window past it. Returns the key's allowance after the charge
  // (sluice/core/federated_key.h: charge_key); a new key past max_keys is not recorded.
  [[nodiscard]] RateCharge charge(std::string_view key, std::uint64_t hits, Nanos now);
  // Gives back `hits` a check or charge of `key` took: what the key still owes first, then its
  // escrow's spent units while the escrow is usable; afterwards they stay spent (never more
  // permissive).
  void refund(std::string_view key, std::uint64_t hits, Nanos now);
  // Forfeits expired escrow (reconciling it) and forgets keys with nothing left to remember.
  std::size_t sweep(Nanos now);
  // Gives every key's unspent escrow back to the coordinator (shutdown, handover).
  void relinquish_all(Nanos now);

  [[nodiscard]] FederationStats stats() const;
  [[nodiscard]] const FederationOptions& options() const noexcept { return options_; }

 private:
  struct Key;
  struct Shard;
  using Outcome = FederatedLeaseOutcome;
  using Tasks = std::vector<std::function<void()>>;

  Shard& shard_of(std::string_view key) noexcept;
  // check()'s decision, or nullopt when it needs a lease: then `park` (null: try_check) waits
  // for it.
  std::optional<FederatedDecision> decide(std::string_view key, std::uint64_t hits, Nanos now,
                                          Callback* park);
  // Starts a lease of `want` units for `key` on the IoExecutor (call without a shard lock).
  // `need`: the least grant of use (LeaseRequest::need): what the key's first waiter lacks.
  void lease_async(std::string key, std::uint64_t want, std::uint64_t need);
  // Sends every queued lease, up to kPipeline at a time, until the queue is empty (one of at
  // most kDrainers running at once).
  void drain_leases();
  // One lease: from the coordinator, or through the pool.
  Outcome lease_direct(const std::string& key, std::uint64_t want, std::uint64_t need);
  Outcome lease_through_pool(const std::string& key, std::uint64_t want, std::uint64_t need);
  void on_lease(const std::string& key, Outcome outcome);
  // Regional-only outage: probes the coordinator when a probe is due (at most one in flight).
  void maybe_probe(Nanos now);
  // Adds a lease reply's clock reading to the drift gauge and updates the allowance in force;
  // what to tell (on_drift) when it went over drift_ppm or back.
  std::optional<std::uint32_t> measure_drift(Nanos sent, Nanos received, Nanos coordinator_now);
  // Counts what a key's step did, and adds the I/O it asks for to `io`: a reconcile (or, with a
  // pool, a release) of each escrow given up. The lease it asks for is the caller's to send.
  void apply(const std::string& key, const KeyEffects& e, Tasks& io);
  void send_reconcile(const std::string& key, Nanos window_start, std::uint64_t total);
  void send_release(const std::string& key, Nanos window_start, std::uint64_t units);
  [[nodiscard]] std::string global_key(const std::string& key) const;
  void post(std::function<void()> task);

  RateCoordinator& coordinator_;
  RegionalEscrow* const pool_;
  const Clock& clock_;
  const FederationOptions options_;
  const FederatedKeyRules rules_;  // what a key's rules read of options_
  const std::uint64_t regional_batch_;
  IoExecutor io_;
  std::unique_ptr<Shard[]> shards_;
  std::mutex io_mu_;
  std::condition_variable io_cv_;
  std::uint64_t io_pending_ = 0;  // guarded by io_mu_
  std::atomic<std::uint64_t> leases_{0}, lease_failures_{0}, granted_{0}, spent_{0};
  std::atomic<std::uint64_t> forfeited_{0}, reconcile_failures_{0}, spec_mismatches_{0};
  std::atomic<std::uint64_t> charged_{0}, forgiven_{0};
  // The coordinator's clock rate against this one's, from every lease reply; the allowance in
  // force, read lock-free by each grant.
  std::mutex drift_mu_;
  DriftGauge drift_;  // guarded by drift_mu_
  std::atomic<std::int64_t> drift_high_{0};
  std::atomic<std::uint32_t> drift_in_force_{0};
  std::atomic<std::size_t> keys_{0};
  std::atomic<std::uint64_t> pool_taken_{0}, pool_refilled_{0}, pool_failures_{0}, outages_{0};
  std::atomic<std::int64_t> pool_down_until_{INT64_MIN};  // ns: lease direct until then
  std::atomic<bool> in_outage_{false};                    // regional-only outage
  std::atomic<std::int64_t> next_probe_{INT64_MIN};       // ns: the outage's next health probe
  // Leases waiting to be sent (no pool): up to two drainers send them in batches, so one batch
  // can be on its way while the other's replies are handled (a key has one lease at a time). A
  // second starts only while every running one is out with its batch.
  std::mutex lease_mu_;
  struct QueuedLease {
    std::string key;
    std::uint64_t want = 0, need = 0;
  };
  std::vector<QueuedLease> lease_queue_;  // guarded by lease_mu_
  int drainers_ = 0;                      // guarded by lease_mu_: drain_leases() running
  int starting_ = 0;  // guarded by lease_mu_: of them, posted and yet to take a batch
};

}  // namespace sluice
