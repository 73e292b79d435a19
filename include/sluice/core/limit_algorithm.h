// limit_algorithm.h: the interface every concurrency-limit algorithm implements.
//
// What it is: a limit algorithm is a pure state machine that maps a stream of samples
// (the RTT of a window of calls, how many were in flight, whether any was dropped) to a
// concurrency limit. It reads no clock, draws no global randomness, does no I/O and takes no
// lock: time and samples arrive as arguments, so the same algorithm runs unchanged under the
// adaptive guard, the simulator and the benchmarks.
//
// Invariant (every implementation): min_limit <= limit() <= max_limit, from construction on.
//
// Thread-safety: NOT thread-safe. One caller at a time; the guard serialises update() calls
// under its window try-lock and publishes the returned limit itself.
#pragma once

#include <cstdint>
#include <string_view>

#include "sluice/core/clock.h"

namespace sluice {

// One window's worth of evidence, as the guard hands it to an algorithm.
struct LimitSample {
  // The window's representative RTT (average or percentile of its calls). Nanos{0} means "no
  // RTT was measured" (a window made only of fast drops); algorithms then use only `dropped`.
  Nanos rtt;
  // The most calls in flight seen during the window (counting the measured call itself).
  std::uint32_t in_flight;
  // True if any call in the window timed out or was refused by the backend as overloaded.
  bool dropped;
};

class LimitAlgorithm {
 public:
  virtual ~LimitAlgorithm() = default;

  // Folds one sample into the algorithm's state and returns the new limit (== limit()).
  virtual std::uint32_t update(const LimitSample& sample) noexcept = 0;
  // The current limit; min_limit <= limit() <= max_limit.
  [[nodiscard]] virtual std::uint32_t limit() const noexcept = 0;
  // A short, stable identifier ("fixed", "aimd", "vegas", "gradient2") for stats and config.
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
};

}  // namespace sluice
