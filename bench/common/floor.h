// floor.h: the floor every permit benchmark is measured against: one atomic fetch_add and one
// fetch_sub on a single cache line, the least any admit-then-release can cost.
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>

namespace sluice::bench {

struct alignas(64) FloorCounter {
  std::atomic<std::uint64_t> value{0};
};

inline FloorCounter& floor_counter() {
  static FloorCounter c;
  return c;
}

// One admit-then-release's worth of atomics: the floor.
inline void BM_Floor_FetchAddSub(benchmark::State& state) {
  auto& c = floor_counter().value;
  for (auto _ : state) {
    benchmark::DoNotOptimize(c.fetch_add(1, std::memory_order_acquire));
    benchmark::DoNotOptimize(c.fetch_sub(1, std::memory_order_release));
  }
}

}  // namespace sluice::bench
