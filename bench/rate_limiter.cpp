// RateLimiter::check on one hot key and across 100,000 keys, with 1 and 2 threads, for each
// strategy, against the floor (an atomic pair). "now" variants take the time from the caller
// (read once per batch of 64 checks, as a server reads it once per request or batch); the
// others read the steady clock (or the coarse one) on every call. BM_Churn reports the resident
// memory after a million distinct keys have each been used once (the limiter forgets idle keys).
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/floor.h"
#include "common/ratio_main.h"
#include "sluice/local/rate_limiter.h"

namespace {

using sluice::RateStrategy;

constexpr int kKeys = 100'000;

std::unique_ptr<sluice::RateLimiter> make(RateStrategy s, const sluice::Clock& clock) {
  sluice::RateLimiterOptions o;
  o.rule.strategy = s;
  // Never binds, and every key stays remembered (a GCRA hit costs ~0.1 s of its three-year
  // period, so no key falls idle and is swept between its checks): the figure is the lookup and
  // the decision.
  o.rule.limit = 1'000'000'000;
  o.rule.period = std::chrono::hours(24 * 365 * 3);
  return std::move(sluice::make_rate_limiter(o, clock).value());
}

const std::vector<std::string>& keys() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (int i = 0; i < kKeys; ++i) v.push_back("tenant-" + std::to_string(i * 7919 % kKeys));
    return v;
  }();
  return k;
}

sluice::RateLimiter* shared = nullptr;

void run(benchmark::State& state, RateStrategy s, bool hot, bool caller_time,
         const sluice::Clock& clock = sluice::SteadyClock::instance()) {
  if (state.thread_index() == 0) shared = make(s, clock).release();
  const auto& k = keys();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 7;
  sluice::Nanos now = clock.now();
  std::uint64_t n = 0;
  for (auto _ : state) {
    const std::string& key = hot ? k[0] : k[i++ % k.size()];
    if (caller_time) {
      if ((++n & 63) == 0) now = clock.now();
      benchmark::DoNotOptimize(shared->check(key, 1, now));
    } else {
      benchmark::DoNotOptimize(shared->check(key, 1));
    }
  }
  if (state.thread_index() == 0) {
    state.counters["keys"] = static_cast<double>(shared->keys());
  }
}

void BM_Hot_Gcra(benchmark::State& s) { run(s, RateStrategy::kGcra, true, true); }
void BM_Hot_Gcra_ClockPerCall(benchmark::State& s) { run(s, RateStrategy::kGcra, true, false); }
// The same on CLOCK_MONOTONIC_COARSE (what it costs in precision: sluice/core/clock.h).
void BM_Hot_Gcra_CoarseClockPerCall(benchmark::State& s) {
  run(s, RateStrategy::kGcra, true, false, sluice::CoarseSteadyClock::instance());
}
void BM_Hot_FixedWindow(benchmark::State& s) { run(s, RateStrategy::kFixedWindow, true, true); }
void BM_Hot_SlidingWindow(benchmark::State& s) { run(s, RateStrategy::kSlidingWindow, true, true); }
void BM_Keys100k_Gcra(benchmark::State& s) { run(s, RateStrategy::kGcra, false, true); }
void BM_Keys100k_FixedWindow(benchmark::State& s) {
  run(s, RateStrategy::kFixedWindow, false, true);
}
void BM_Keys100k_SlidingWindow(benchmark::State& s) {
  run(s, RateStrategy::kSlidingWindow, false, true);
}

long rss_kib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// A million distinct keys, 1,000 per simulated millisecond, 100 hits per second per key:
// resident memory before and after, and the keys still held.
void BM_Churn_Gcra_1M(benchmark::State& state) {
  for (auto _ : state) {
    sluice::ManualClock clock(std::chrono::seconds(1));
    sluice::RateLimiterOptions o;
    o.rule.limit = 100;
    auto l = std::move(sluice::make_rate_limiter(o, clock).value());
    const long before = rss_kib();
    for (int i = 0; i < 1'000'000; ++i) {
      if (i % 1000 == 0) clock.advance(std::chrono::milliseconds(1));
      benchmark::DoNotOptimize(l->check("user-" + std::to_string(i), 1));
    }
    state.counters["rss_growth_kib"] = static_cast<double>(rss_kib() - before);
    state.counters["keys_held"] = static_cast<double>(l->keys());
  }
}

}  // namespace

using sluice::bench::BM_Floor_FetchAddSub;
BENCHMARK(BM_Floor_FetchAddSub)->Threads(1)->Threads(2);
BENCHMARK(BM_Hot_Gcra)->Threads(1)->Threads(2);
BENCHMARK(BM_Hot_Gcra_ClockPerCall)->Threads(1);
BENCHMARK(BM_Hot_Gcra_CoarseClockPerCall)->Threads(1);
BENCHMARK(BM_Hot_FixedWindow)->Threads(1);
BENCHMARK(BM_Hot_SlidingWindow)->Threads(1);
BENCHMARK(BM_Keys100k_Gcra)->Threads(1)->Threads(2);
BENCHMARK(BM_Keys100k_FixedWindow)->Threads(1);
BENCHMARK(BM_Keys100k_SlidingWindow)->Threads(1);
BENCHMARK(BM_Churn_Gcra_1M)->Iterations(1)->Repetitions(1)->Unit(benchmark::kMillisecond);

SLUICE_BENCH_RATIO("BM_Hot_Gcra/threads:1", "BM_Floor_FetchAddSub/threads:1", 0);
SLUICE_BENCH_RATIO("BM_Hot_Gcra_ClockPerCall/threads:1", "BM_Hot_Gcra/threads:1", 0);
SLUICE_BENCH_RATIO("BM_Hot_Gcra_CoarseClockPerCall/threads:1", "BM_Hot_Gcra/threads:1", 0);
SLUICE_BENCH_RATIO("BM_Keys100k_Gcra/threads:1", "BM_Floor_FetchAddSub/threads:1", 0);
SLUICE_BENCH_RATIO("BM_Hot_Gcra/threads:2", "BM_Floor_FetchAddSub/threads:2", 0);
SLUICE_BENCH_RATIO("BM_Keys100k_Gcra/threads:2", "BM_Floor_FetchAddSub/threads:2", 0);

SLUICE_BENCH_MAIN()
