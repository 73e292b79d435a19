// allocations.h: heap allocations counted, for benchmarks that report them per operation.
//
// A benchmark executable that links common/allocations.cpp has the process's operator new
// replaced by one that counts (relaxed) and allocates with malloc; it reads the count around its
// loop and reports the difference per iteration.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

namespace sluice::bench {

// Allocations made by the process so far.
[[nodiscard]] std::uint64_t allocations_so_far() noexcept;

// Sets the counter `name` to the allocations since `before`, per iteration of `state`.
inline void per_iteration_allocations(benchmark::State& state, std::uint64_t before,
                                      const std::string& name) {
  state.counters[name] =
      static_cast<double>(allocations_so_far() - before) / static_cast<double>(state.iterations());
}

}  // namespace sluice::bench
