// federation_sim.h: a deterministic discrete-event simulation of one global rate budget shared
// by regions (federation), against per-region limits.
//
// What it is: K regions take Poisson arrivals for one key and admit each (1 hit, or `hits` all
// or nothing) through one of
// three schemes, on one simulated clock:
//   independent  each region its own fixed-window limiter of the whole limit L (no
//                coordination: up to K x L per window);
//   static       each region a fixed-window limiter of its share of L (L / K, the remainder
//                to the lowest regions): never over L, but a busy region binds at its share;
//   federated    the production FederatedLimiter per region against one MemoryRateCoordinator,
//                reached over a simulated network: every coordinator call arrives `one_way`
//                after the region makes it, and its reply `one_way` later.
// All three windows are aligned on multiples of `window` on the one clock. The same seed gives
// the same arrivals to each scheme, and the same run, bit for bit.
//
// Load and skew: the regions together are offered `load` x L per window on average. Region 0
// (the hot one) gets the share s + (1 - s) / K of it, every other region (1 - s) / K: s = 0 is
// uniform, s = 1 puts all load on region 0, linear in between. A refused request is lost (no
// retry).
//
// The network: the FederatedLimiter's coordinator calls run on its IoExecutor, which here hands
// each to a worker thread used as a coroutine: the call starts at once (the limiter reads its
// send time), waits on the simulated clock until it reaches the coordinator (which decides
// then, on the same clock), and again until its reply is back. Exactly one thread runs at any
// moment (the event loop or one call), handed over under one mutex, so the run is as
// deterministic as a single thread.
//
// Measures, per window k = [k W, (k + 1) W): offered_k (arrivals in it), admitted_k (admissions
// decided in it), and for the federated scheme what the coordinator handed out for it (units
// granted less units given back while it ran). U_capacity = the mean over windows of
// admitted_k / min(offered_k, L). Every admission from a window's escrow is decided before the
// window ends, so handed_out_k - admitted_k is exactly the escrow that expired unspent
// (stranded) and L - handed_out_k the budget never leased.
//
// Processes and the regional pool: each region may run `processes` (M) processes, each its own
// FederatedLimiter; a region's arrivals go to one of them at random (a seeded stream of its
// own, so the runs with and without a pool see the same arrivals at the same processes). With
// `regional_pool`, a region's processes share one MemoryRegionalEscrow behind the same simulated
// network (every pool call arrives `one_way` after it is made, its reply `one_way` later);
// without, each process leases for itself. A window's `leases` counts coordinator lease calls
// only, never pool calls.
//
// A coordinator outage: every coordinator call (lease, reconcile, health probe) that would
// reach the coordinator during [outage_start, outage_end) fails: with kRefused its error is back
// one round trip after the call was made (a refused connection), with kTimeout the call hangs
// until its timeout (FederationOptions::lease_timeout) and fails then. The pools stay
// reachable. At outage_start the run records what the pools held (onset_pool_balance) and what
// escrow the processes held (onset_escrow_held); during the outage, what the pools accepted
// (a refill whose lease reached the coordinator before the outage arrives after its onset). A
// regional-only outage (`outage`) may admit, in a window, units granted for an earlier one:
// admitted_k - handed_out_k when positive (never in fail-closed, where every admission is spent
// from its own window's grants).
//
// Thread-safety: none (one simulation at a time per object; see above for its own threads).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/federation/federation.h"
#include "sluice/sim/scenarios.h"

namespace sluice::sim {

enum class FederationScheme : std::uint8_t { kIndependent, kStatic, kFederated };

[[nodiscard]] std::string_view to_string(FederationScheme s) noexcept;

// How a coordinator call fails during an outage (see above).
enum class OutageFailure : std::uint8_t { kRefused, kTimeout };

[[nodiscard]] std::string_view to_string(OutageFailure f) noexcept;

struct FederationSimConfig {
  FederationScheme scheme = FederationScheme::kFederated;
  int regions = 3;                         // K
  std::uint64_t limit = 1000;              // L per window
  Nanos window = std::chrono::seconds(1);  // W
  std::uint64_t batch = 16;                // FederationOptions::batch
  double load = 1.2;                       // offered per window / L, all regions together
  double skew = 0;                         // s in [0, 1]
  // Units per check (a weighted check, all or nothing): offered, admitted, handed out and the
  // load count units, so checks arrive load x L / hits per window.
  std::uint64_t hits = 1;
  Nanos one_way = std::chrono::milliseconds(1);  // region <-> coordinator, each way
  int windows = 20;
  std::uint64_t seed = 1;
  // Federated only: processes per region (M), each its own FederatedLimiter, and whether they
  // share a regional pool (`regional_batch`: FederationOptions::regional_batch, 0: 4 x batch).
  int processes = 1;
  bool regional_pool = false;
  std::uint64_t regional_batch = 0;
  // Federated only: the coordinator is unreachable during [outage_start, outage_end) (none when
  // equal); `outage` needs a pool for kRegionalOnly.
  Nanos outage_start{0};
  Nanos outage_end{0};
  OutageFailure outage_failure = OutageFailure::kRefused;
  FederationOutage outage = FederationOutage::kFailClosed;
  Nanos coordinator_health_check = std::chrono::seconds(5);  // FederationOptions' default
  // Federated only: charges after the response. Each admitted check is followed,
  // `charge_after` later, by a charge of a uniform number of further hits in 0 .. charge_max
  // (FederatedLimiter::charge on the process that admitted it: the rest of a cost known only
  // once the call is done). The load counts those hits too: checks arrive load x L / (hits +
  // charge_max / 2) per window.
  std::uint64_t charge_max = 0;
  Nanos charge_after = std::chrono::milliseconds(20);
  // Federated only, one process per region, no pool, no outage, no charges: a coordinator with
  // no clock of its own (etcd's). Region r's clock reads the simulated clock plus
  // clock_offsets[r] (one per region; empty: one clock for all, as above); the coordinator
  // decides each call at its caller's clock, or at the latest time it decided the key at when
  // that is later, asks for clock_uncertainty more of the window to be left, and says
  // clock_uncertainty in its replies (which end each region's escrow that much earlier: 0 shows
  // what happens without). Windows are then counted on the fastest region's clock: admissions,
  // offers and refusals in window k happened while the simulated clock plus the largest offset
  // was in [k W, (k + 1) W).
  std::vector<Nanos> clock_offsets;
  Nanos clock_uncertainty{0};

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

struct FederationWindow {
  std::uint64_t offered = 0;
  std::uint64_t admitted = 0;
  std::uint64_t handed_out = 0;  // federated: granted less given back while the window ran
  std::uint64_t leases = 0;      // federated: lease calls the coordinator decided in it
  // Refusals decided in it because the coordinator could not be reached (fail-closed) or the
  // pool's balance was spent in a regional-only outage.
  std::uint64_t refused_unreachable = 0;
  std::uint64_t refused_balance_spent = 0;
  // Federated: units spent in it (its admissions and the charges paid in it, from the
  // limiters' counters at its start and end), hits charged in it after the fact, and hits
  // forgiven in it (charged where no budget was left to pay them).
  std::uint64_t spent = 0;
  std::uint64_t charged = 0;
  std::uint64_t forgiven = 0;
};

struct FederationSimResult {
  std::vector<FederationWindow> windows;
  double u_capacity = 0;                // mean of admitted_k / min(offered_k, L)
  double max_admitted_over_limit = 0;   // max of admitted_k / L
  double mean_admitted_over_limit = 0;  // mean of admitted_k / L
  double mean_stranded = 0;             // federated: mean handed_out_k - admitted_k
  double mean_unleased = 0;             // federated: mean L - handed_out_k
  double leases_per_admission = 0;      // federated: coordinator lease calls per admission
  std::uint64_t reconciles = 0;         // federated: reconcile calls
  // Per region, over the run: arrivals, admissions and (federated) escrow forfeited unspent.
  std::vector<std::uint64_t> region_offered, region_admitted, region_forfeited;
  // With an outage: the pools' balance (whatever window it belongs to) and the escrow the
  // processes held (granted less spent less forfeited) at outage_start; regional-only outages
  // entered (over all processes); admitted beyond the window's own grants, summed over the
  // windows (sum of max(0, admitted_k - handed_out_k)).
  std::uint64_t onset_pool_balance = 0;
  std::uint64_t onset_escrow_held = 0;
  // Units the pools accepted during the outage: refills (of grants the coordinator decided
  // before it: in flight at its onset) and releases (escrow the processes gave back).
  std::uint64_t refilled_in_outage = 0;
  std::uint64_t released_in_outage = 0;
  std::uint64_t outages = 0;
  std::uint64_t beyond_grants = 0;
  std::uint64_t pool_taken = 0;  // units the processes took from their pools, over the run
  // Federated: max and mean over windows of spent_k / L.
  double max_spent_over_limit = 0;
  double mean_spent_over_limit = 0;
};

// Runs one scheme. Precondition: config.validate() is empty.
[[nodiscard]] FederationSimResult run_federation_sim(const FederationSimConfig& config);

// The skews of the table: 0, 0.25, 0.5, 0.75, 1.
[[nodiscard]] const std::vector<double>& federation_skews();

// `sluice sim federation`: the three schemes at each skew, at the stated load (and at exactly
// the limit, the load at which the static partition's U_capacity is 1 - s (K - 1) / K).
// Claims: federated max admitted per window / limit <= 1 at every skew and load; federated
// U_capacity >= 0.98 at every skew at `load`; static U_capacity at s = 1 within 0.01 of 1 / K;
// independent limiters overshoot (max admitted / limit > 1) at s = 0.
struct FederationScenarioOptions {
  int windows = 20;
  std::uint64_t seed = 1;
  double load = 1.2;
  Nanos one_way = std::chrono::milliseconds(1);
  std::uint64_t batch = 16;
};
[[nodiscard]] ScenarioOutput run_federation_scenario(const FederationScenarioOptions& options);

}  // namespace sluice::sim
