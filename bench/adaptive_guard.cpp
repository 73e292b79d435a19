// AdaptiveGuard acquire + release(success, rtt) against the floor, with each algorithm behind
// it, on the real steady clock and the guard's default windows (1 s, 10 samples). Most
// releases only add their RTT to the window (relaxed atomics); one in clock_check_interval
// reads the clock, and about once a second one closes the window and runs the algorithm: all
// of it is in the measured figure. The budget: <= 50 ns.
#include <chrono>
#include <memory>

#include "common/floor.h"
#include "common/ratio_main.h"
#include "sluice/core/aimd_limit.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/core/gradient2_limit.h"
#include "sluice/core/vegas_limit.h"
#include "sluice/local/adaptive_guard.h"

namespace {

using sluice::AdaptiveGuard;
using sluice::Outcome;

// A large max so the limit never binds: the figure is the admission and sampling cost.
std::unique_ptr<sluice::LimitAlgorithm> make(int kind) {
  switch (kind) {
    case 0:
      return std::make_unique<sluice::FixedLimit>(sluice::FixedLimitOptions{.limit = 1000});
    case 1:
      return std::make_unique<sluice::AimdLimit>(
          sluice::AimdOptions{.initial_limit = 1000, .max_limit = 1000});
    case 2:
      return std::make_unique<sluice::VegasLimit>(
          sluice::VegasOptions{.initial_limit = 1000, .max_limit = 1000});
    default:
      return std::make_unique<sluice::Gradient2Limit>(
          sluice::Gradient2Options{.initial_limit = 1000, .max_limit = 1000});
  }
}

void run(benchmark::State& state, int kind) {
  AdaptiveGuard guard(make(kind), sluice::SteadyClock::instance());
  const sluice::Nanos rtt = std::chrono::milliseconds(2);
  for (auto _ : state) {
    auto permit = guard.acquire();
    benchmark::DoNotOptimize(permit);
    if (permit) permit->release(Outcome::kSuccess, rtt);
  }
  state.counters["limit"] = guard.limit();
}

void BM_AdaptiveGuard_Fixed(benchmark::State& state) { run(state, 0); }
void BM_AdaptiveGuard_Aimd(benchmark::State& state) { run(state, 1); }
void BM_AdaptiveGuard_Vegas(benchmark::State& state) { run(state, 2); }
void BM_AdaptiveGuard_Gradient2(benchmark::State& state) { run(state, 3); }

}  // namespace

using sluice::bench::BM_Floor_FetchAddSub;
BENCHMARK(BM_Floor_FetchAddSub);
BENCHMARK(BM_AdaptiveGuard_Fixed);
BENCHMARK(BM_AdaptiveGuard_Aimd);
BENCHMARK(BM_AdaptiveGuard_Vegas);
BENCHMARK(BM_AdaptiveGuard_Gradient2);

SLUICE_BENCH_RATIO("BM_AdaptiveGuard_Fixed", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_AdaptiveGuard_Aimd", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_AdaptiveGuard_Vegas", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_AdaptiveGuard_Gradient2", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_BUDGET("BM_AdaptiveGuard_Aimd", 50);
SLUICE_BENCH_BUDGET("BM_AdaptiveGuard_Vegas", 50);
SLUICE_BENCH_BUDGET("BM_AdaptiveGuard_Gradient2", 50);

SLUICE_BENCH_MAIN()
