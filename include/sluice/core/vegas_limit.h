// vegas_limit.h: delay-based limit after TCP Vegas: grow while calls do not queue, shrink when
// they do.
//
// Update rule, once per sample (f(L) = max(1, floor(log10 L)), the reference's step at every L):
//   queue = ceil(L * (1 - rtt_noload / rtt))            estimated calls waiting at the backend
//   L' = L - f(L)        if dropped                     (checked first, whatever the RTT)
//   L' = L               if 2 * in_flight < L           (app-limited: no evidence to grow on)
//   L' = L + 6 f(L)      if queue <= f(L)               (no queueing: grow fast)
//   L' = L + f(L)        if queue <  3 f(L)             (little queueing: grow)
//   L' = L - f(L)        if queue >  6 f(L)             (queueing: shrink)
//   L' = L               otherwise                      (between alpha = 3f and beta = 6f)
//   L  = (1 - smoothing) * L + smoothing * clamp(L')
// A sample that lowers rtt_noload only moves the baseline (no limit change that sample).
//
// The no-load baseline, and how it recovers (sluice's fix for a poisoned baseline):
//   rtt_noload is the minimum RTT over the last one to two probe epochs (a windowed minimum).
//   An epoch ends after jitter * probe_multiplier * L samples, jitter drawn uniformly from
//   [0.5, 1) by a generator seeded from the options (no global RNG), so a fleet's epochs do not
//   align.
//   A lower RTT lowers the baseline at once. A baseline that is too low for the backend as it
//   is now (it became slower; the low value was a fluke) is forgotten after two epochs, while
//   traffic keeps flowing: nothing is shed, the limit is not reset, no idle moment is needed.
//   A baseline is never taken from a single sample (a "probe" that adopts whatever RTT the
//   current, possibly loaded, sample shows would hand the limit a loaded baseline and let it
//   grow into the queue).
//
// Regimes: no queueing (fast growth), light queueing (slow growth), sweet spot (hold), heavy
// queueing or drops (shrink by f(L) per sample), app-limited (hold).
//
// Thread-safety: not thread-safe (see LimitAlgorithm); the guard serialises calls.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "sluice/core/limit_algorithm.h"

namespace sluice {

struct VegasOptions {
  std::uint32_t initial_limit = 20;  // default 20
  std::uint32_t min_limit = 1;       // default 1
  std::uint32_t max_limit = 1000;    // default 1000
  // Weight of the new estimate, in (0, 1]; 1 = no smoothing. Default 1.0.
  double smoothing = 1.0;
  // A baseline epoch lasts jitter * probe_multiplier * L samples, jitter in [0.5, 1); >= 1.
  // Default 30.
  std::uint32_t probe_multiplier = 30;
  // Seed of the epoch-jitter generator. Give each process its own (e.g. from its node id) so a
  // fleet's baselines do not re-measure in lockstep. Default 1.
  std::uint64_t seed = 1;

  // Empty when valid, else what is wrong. The constructor repairs what this rejects.
  [[nodiscard]] std::string_view validate() const noexcept;
};

class VegasLimit final : public LimitAlgorithm {
 public:
  explicit VegasLimit(VegasOptions options = {}) noexcept;

  std::uint32_t update(const LimitSample& sample) noexcept override;
  [[nodiscard]] std::uint32_t limit() const noexcept override;
  [[nodiscard]] std::string_view name() const noexcept override { return "vegas"; }

  // The current no-load baseline; Nanos{0} before the first RTT.
  [[nodiscard]] Nanos rtt_noload() const noexcept;
  [[nodiscard]] const VegasOptions& options() const noexcept { return options_; }

 private:
  void advance_epoch() noexcept;
  void next_jitter() noexcept;
  [[nodiscard]] double grown_or_shrunk(double rtt_ns) const noexcept;
  std::uint32_t commit(double next) noexcept;

  VegasOptions options_;
  double estimate_;
  // The baseline filter's state: the minimum RTT (ns) of the previous and of the current probe
  // epoch, +infinity before the first. Only the .cpp's windowed-minimum filter changes them.
  double baseline_prev_ = std::numeric_limits<double>::infinity();
  double baseline_cur_ = std::numeric_limits<double>::infinity();
  std::uint64_t rng_state_;
  double jitter_ = 1.0;
  std::uint64_t epoch_samples_ = 0;
};

}  // namespace sluice
