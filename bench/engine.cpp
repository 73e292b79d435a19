// The server's engine on the inline path: Engine::check as the transports call it (with a
// Deferral that a rate policy never takes) and as in-process callers do (waiting), against the
// RateLimiter::check it ends in, in the same run: the cost of the policy lookup, the request
// checks, the clock read and the seam's virtual call. A never-binding GCRA rule on one hot key,
// the clock read on every call in both. Each reports the heap allocations per check (the
// decision that may finish later must cost nothing when it does not).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#include "common/floor.h"
#include "common/ratio_main.h"
#include "server/engine.h"
#include "sluice/config/config.h"
#include "sluice/local/rate_limiter.h"

namespace {

std::atomic<std::uint64_t> allocations{0};

}  // namespace

// Every allocation of the process is counted (relaxed): the benchmarks read the difference
// across their loops. The replaced operator new allocates with malloc and the replaced delete
// frees with free; g++ 12, inlining them, pairs the delete with the library's new and warns.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t /*n*/) noexcept { std::free(p); }

namespace {

using sluice::server::CheckCall;
using sluice::server::Engine;

constexpr const char* kConfig = R"(
policies:
  hot:
    kind: rate
    strategy: gcra
    limit: 1000000000
    period: 26280h
)";

// A transport's Deferral; a rate policy answers inline, so it is never taken.
class Inline final : public sluice::server::Deferral<sluice::RateDecision> {
 public:
  sluice::server::Completion<sluice::RateDecision> defer() override { std::abort(); }
};

std::unique_ptr<Engine> make_engine() {
  sluice::ConfigLoad load = sluice::load_config(kConfig, sluice::server::PolicyRegistry::builtin());
  if (!load.config) {
    std::fprintf(stderr, "bench_engine: %s\n", load.errors.front().to_string("config").c_str());
    std::abort();
  }
  return std::move(Engine::create(*load.config, sluice::SteadyClock::instance()).value());
}

void per_check_allocations(benchmark::State& state, std::uint64_t before) {
  state.counters["allocs/check"] =
      static_cast<double>(allocations.load(std::memory_order_relaxed) - before) /
      static_cast<double>(state.iterations());
}

void BM_Limiter_Check(benchmark::State& state) {
  sluice::RateLimiterOptions o;
  o.rule.limit = 1'000'000'000;
  o.rule.period = std::chrono::hours(24 * 1095);
  auto limiter = std::move(sluice::make_rate_limiter(o, sluice::SteadyClock::instance()).value());
  const std::string key = "alice";
  const std::uint64_t before = allocations.load(std::memory_order_relaxed);
  for (auto _ : state) benchmark::DoNotOptimize(limiter->check(key, 1));
  per_check_allocations(state, before);
}

void BM_Engine_Check(benchmark::State& state) {
  auto engine = make_engine();
  Inline later;
  const CheckCall call{"hot", "alice", 1};
  const std::uint64_t before = allocations.load(std::memory_order_relaxed);
  for (auto _ : state) benchmark::DoNotOptimize(engine->check(call, later));
  per_check_allocations(state, before);
}

void BM_Engine_CheckWaiting(benchmark::State& state) {
  auto engine = make_engine();
  const CheckCall call{"hot", "alice", 1};
  const std::uint64_t before = allocations.load(std::memory_order_relaxed);
  for (auto _ : state) benchmark::DoNotOptimize(engine->check(call));
  per_check_allocations(state, before);
}

}  // namespace

using sluice::bench::BM_Floor_FetchAddSub;
BENCHMARK(BM_Floor_FetchAddSub);
BENCHMARK(BM_Limiter_Check);
BENCHMARK(BM_Engine_Check);
BENCHMARK(BM_Engine_CheckWaiting);

SLUICE_BENCH_RATIO("BM_Limiter_Check", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Engine_Check", "BM_Limiter_Check", 0);
SLUICE_BENCH_RATIO("BM_Engine_CheckWaiting", "BM_Engine_Check", 0);

SLUICE_BENCH_MAIN();
