// The server's engine on the inline path: Engine::check as the transports call it (with a
// Deferral that a rate policy never takes) and as in-process callers do (waiting), against the
// RateLimiter::check it ends in, in the same run: the cost of the policy lookup, the request
// checks, the clock read and the seam's virtual call. A never-binding GCRA rule on one hot key,
// the clock read on every call in both. Each reports the heap allocations per check (the
// decision that may finish later must cost nothing when it does not).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/allocations.h"
#include "common/floor.h"
#include "common/ratio_main.h"
#include "server/engine.h"
#include "sluice/config/config.h"
#include "sluice/local/rate_limiter.h"

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
  sluice::bench::per_iteration_allocations(state, before, "allocs/check");
}

void BM_Limiter_Check(benchmark::State& state) {
  sluice::RateLimiterOptions o;
  o.rule.limit = 1'000'000'000;
  o.rule.period = std::chrono::hours(24 * 1095);
  auto limiter = std::move(sluice::make_rate_limiter(o, sluice::SteadyClock::instance()).value());
  const std::string key = "alice";
  const std::uint64_t before = sluice::bench::allocations_so_far();
  for (auto _ : state) benchmark::DoNotOptimize(limiter->check(key, 1));
  per_check_allocations(state, before);
}

void BM_Engine_Check(benchmark::State& state) {
  auto engine = make_engine();
  Inline later;
  const CheckCall call{"hot", "alice", 1};
  const std::uint64_t before = sluice::bench::allocations_so_far();
  for (auto _ : state) benchmark::DoNotOptimize(engine->check(call, later));
  per_check_allocations(state, before);
}

void BM_Engine_CheckWaiting(benchmark::State& state) {
  auto engine = make_engine();
  const CheckCall call{"hot", "alice", 1};
  const std::uint64_t before = sluice::bench::allocations_so_far();
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
