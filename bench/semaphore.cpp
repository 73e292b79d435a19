// Semaphore acquire+release against the floor (an atomic fetch_add/fetch_sub pair), on one
// thread and with 2 threads contending on one semaphore (and on one floor counter).
#include "sluice/local/semaphore.h"
#include "common/floor.h"
#include "common/ratio_main.h"

namespace {

sluice::Semaphore& shared_semaphore() {
  static sluice::Semaphore sem(1'000'000);  // never the binding constraint: measures the cost
  return sem;
}

void BM_Semaphore_AcquireRelease(benchmark::State& state) {
  auto& sem = shared_semaphore();
  for (auto _ : state) {
    auto permit = sem.try_acquire();
    benchmark::DoNotOptimize(permit);
  }
}

// A full semaphore: the reject path (one load, no write).
void BM_Semaphore_Reject(benchmark::State& state) {
  static sluice::Semaphore full(0);
  for (auto _ : state) {
    auto permit = full.try_acquire();
    benchmark::DoNotOptimize(permit);
  }
}

}  // namespace

using sluice::bench::BM_Floor_FetchAddSub;
BENCHMARK(BM_Floor_FetchAddSub);
BENCHMARK(BM_Semaphore_AcquireRelease);
BENCHMARK(BM_Semaphore_Reject);
BENCHMARK(BM_Floor_FetchAddSub)->Threads(2)->UseRealTime();
BENCHMARK(BM_Semaphore_AcquireRelease)->Threads(2)->UseRealTime();

SLUICE_BENCH_RATIO("BM_Semaphore_AcquireRelease", "BM_Floor_FetchAddSub", 1.5);
SLUICE_BENCH_RATIO("BM_Semaphore_Reject", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Semaphore_AcquireRelease/real_time/threads:2",
                   "BM_Floor_FetchAddSub/real_time/threads:2", 0);

SLUICE_BENCH_MAIN()
