// gradient2_limit.h: delay-gradient limit: compare the current RTT with a long-term baseline
// and scale the limit by their ratio.
//
// Update rule, once per sample:
//   long_rtt = the plain mean of the first 10 RTTs, then an EMA over long_window samples
//              (factor 2 / (long_window + 1)) starting from the value the 10th left;
//              multiplied by 0.95 whenever long_rtt > 2 * rtt (fast decay after an overload).
//              During the first 10 a decay lasts until the next sample, which sets the mean
//              of the raw RTTs again (as the reference's ExpAvgMeasurement does).
//   baseline = min(long_rtt, minimum rtt of the last baseline_window/2..baseline_window samples)
//   gradient = clamp(rtt_tolerance * baseline / rtt, 0.5, 1)
//   target   = L + queue_size     if gradient == 1   (no queueing beyond tolerance: grow)
//            = L * gradient       if gradient <  1   (queueing: shrink in proportion)
//   L'       = clamp((1 - smoothing) * L + smoothing * target)
//   dropped:      L' = clamp(min(L * drop_backoff_ratio, floor(L) - 1)), RTT stats untouched
//   app-limited:  L' = L when in_flight < L / 2
//
// sluice's fixes to the reference formulation, each pinned by a test:
//   - Drops back off. The reference ignores `dropped`, so a backend that answers every call
//     with a fast timeout or overload error keeps (or grows) its limit.
//   - No growth while gradient < 1. The reference adds queue_size at every gradient, so
//     L * g + queue_size > L whenever g > 1 - queue_size / L (e.g. g = 0.85 at L = 20): the
//     limit creeps up while the backend is queueing. Here queue_size is added only at g == 1.
//   - The baseline recovers. The reference baseline is only the EMA, which sustained load drags
//     up to the loaded RTT and which then takes hundreds of samples to come back down, so a
//     later queue goes unnoticed. Here the baseline is also capped by a windowed minimum of
//     recent RTTs: a return to the no-load RTT lowers the baseline on that very sample, and the
//     minimum ages out within baseline_window samples so it never pins the baseline below a
//     backend that really became slower. The baseline is never above the reference's, so it is
//     never less protective.
//
// Regimes: steady (RTT within tolerance: grows by smoothing * queue_size per sample to
// max_limit), queueing (RTT above tolerance * baseline: shrinks, at most halving per sample
// before smoothing), overloaded (drops: multiplicative backoff), app-limited (hold).
//
// Thread-safety: not thread-safe (see LimitAlgorithm); the guard serialises calls.
#pragma once

#include <cstdint>
#include <limits>
#include <string_view>

#include "sluice/core/limit_algorithm.h"

namespace sluice {

struct Gradient2Options {
  std::uint32_t initial_limit = 20;  // default 20
  std::uint32_t min_limit = 20;      // default 20
  std::uint32_t max_limit = 200;     // default 200
  // Weight of the new estimate, in (0, 1]. Default 0.2.
  double smoothing = 0.2;
  // How much the limit may grow per sample (before smoothing) while RTT is in tolerance.
  // Default 4.
  std::uint32_t queue_size = 4;
  // EMA horizon of the long-term RTT, in samples; >= 1. Default 600.
  std::uint32_t long_window = 600;
  // RTT growth over the baseline accepted before shrinking; >= 1. Default 1.5.
  double rtt_tolerance = 1.5;
  // sluice: multiplier applied on a drop, in [0.5, 1). Default 0.9.
  double drop_backoff_ratio = 0.9;
  // sluice: samples a low RTT keeps holding the baseline down (it is forgotten after between
  // half of this and all of it); >= 2. Default 200.
  std::uint32_t baseline_window = 200;

  // Empty when valid, else what is wrong. The constructor repairs what this rejects.
  [[nodiscard]] std::string_view validate() const noexcept;
};

class Gradient2Limit final : public LimitAlgorithm {
 public:
  explicit Gradient2Limit(Gradient2Options options = {}) noexcept;

  std::uint32_t update(const LimitSample& sample) noexcept override;
  [[nodiscard]] std::uint32_t limit() const noexcept override;
  [[nodiscard]] std::string_view name() const noexcept override { return "gradient2"; }

  // The long-term (EMA) RTT; Nanos{0} before the first RTT.
  [[nodiscard]] Nanos long_rtt() const noexcept;
  // The baseline the gradient is taken against: min(long_rtt, recent minimum).
  [[nodiscard]] Nanos baseline_rtt() const noexcept;
  [[nodiscard]] const Gradient2Options& options() const noexcept { return options_; }

 private:
  void observe(double rtt_ns) noexcept;
  [[nodiscard]] double baseline() const noexcept;
  std::uint32_t commit(double next) noexcept;

  Gradient2Options options_;
  double estimate_;
  double long_rtt_ = 0.0;
  std::uint32_t warmup_count_ = 0;
  double warmup_sum_ = 0.0;  // sum of the first warmup_count_ RTTs (ns)
  // The recent-minimum filter's state: the minimum RTT (ns) of the previous and of the current
  // epoch of baseline_window / 2 samples, +infinity before the first. Only the .cpp's
  // windowed-minimum filter changes them.
  double recent_prev_ = std::numeric_limits<double>::infinity();
  double recent_cur_ = std::numeric_limits<double>::infinity();
  std::uint32_t recent_samples_ = 0;
};

}  // namespace sluice
