// The fallback cascade's hot path (sluice/local/fallback_cascade.h): pick + permit + report for one
// call (acquire(): snapshot each node's buckets, compute its health and weight, order the nodes
// by the weighted random permutation, take the first permit; then finish the lease, which
// releases the permit into the node's guard and records the outcome in its buckets), for 3, 10
// and 100 nodes, against the floor (an atomic pair) and against one AdaptiveGuard's own
// acquire + release (what a call costs without a cascade). The nodes are healthy, with fixed
// limits far above what one thread holds, so every call takes the first node of the order; one
// node in ten fails its calls, so the weights are not all equal. A breaker per node is on, as
// production configs would have it (closed: its cost is a load and a store).
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/floor.h"
#include "common/ratio_main.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/local/fallback_cascade.h"

namespace {

using sluice::AdaptiveGuard;
using sluice::CascadeOutcome;

std::shared_ptr<AdaptiveGuard> guard(const sluice::Clock& clock) {
  sluice::FixedLimitOptions o;
  o.limit = 1000;
  return std::make_shared<AdaptiveGuard>(std::make_unique<sluice::FixedLimit>(o), clock);
}

void run(benchmark::State& state, int nodes, bool approximate) {
  const sluice::Clock& clock = sluice::SteadyClock::instance();
  std::vector<sluice::CascadeNodeSpec> specs;
  for (int i = 0; i < nodes; ++i) specs.push_back({"node-" + std::to_string(i), guard(clock)});
  sluice::FallbackCascadeOptions o;
  o.breaker = sluice::CircuitBreakerOptions{};
  o.approximate_order = approximate;
  std::mt19937_64 rng(42);
  sluice::FallbackCascade cascade(std::move(specs), clock, o, [&rng] {
    return std::uniform_real_distribution<double>(0, 1)(rng);
  });
  std::uint64_t n = 0;
  for (auto _ : state) {
    auto lease = cascade.acquire();
    const bool bad = lease.value().node().back() == '7';  // node-7, node-17, ...: 1 in 10 fail
    lease.value().finish(bad && (++n % 2 == 0) ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess,
                         std::chrono::microseconds(200));
  }
}

void BM_Cascade_3Nodes(benchmark::State& state) { run(state, 3, false); }
void BM_Cascade_10Nodes(benchmark::State& state) { run(state, 10, false); }
void BM_Cascade_100Nodes(benchmark::State& state) { run(state, 100, false); }
void BM_Cascade_100Nodes_Approximate(benchmark::State& state) { run(state, 100, true); }

// One guard's acquire + release: a call without a cascade.
void BM_Guard_AcquireRelease(benchmark::State& state) {
  const std::shared_ptr<AdaptiveGuard> g = guard(sluice::SteadyClock::instance());
  for (auto _ : state) {
    auto p = g->acquire();
    p->release(sluice::Outcome::kSuccess, std::chrono::microseconds(200));
  }
}

}  // namespace

using sluice::bench::BM_Floor_FetchAddSub;
BENCHMARK(BM_Floor_FetchAddSub);
BENCHMARK(BM_Guard_AcquireRelease);
BENCHMARK(BM_Cascade_3Nodes);
BENCHMARK(BM_Cascade_10Nodes);
BENCHMARK(BM_Cascade_100Nodes);
BENCHMARK(BM_Cascade_100Nodes_Approximate);

SLUICE_BENCH_RATIO("BM_Guard_AcquireRelease", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Cascade_3Nodes", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Cascade_10Nodes", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Cascade_100Nodes", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Cascade_100Nodes_Approximate", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Cascade_3Nodes", "BM_Guard_AcquireRelease", 0);

SLUICE_BENCH_MAIN();
