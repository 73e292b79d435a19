#include "sluice/core/gradient2_limit.h"

#include <algorithm>
#include <cmath>

#include "core/epoch_min.h"

namespace sluice {
namespace {

// The long-term RTT is the plain mean of its first samples, so one early outlier cannot set it.
constexpr std::uint32_t kWarmupSamples = 10;
// When the long-term RTT exceeds twice the current RTT it decays by this factor per sample.
constexpr double kLongRttDecay = 0.95;
constexpr double kMinGradient = 0.5;

Gradient2Options repaired(Gradient2Options o) noexcept {
  o.min_limit = std::max(o.min_limit, 1u);
  if (o.max_limit < o.min_limit) o.max_limit = o.min_limit;
  o.initial_limit = std::clamp(o.initial_limit, o.min_limit, o.max_limit);
  if (!(o.smoothing > 0.0 && o.smoothing <= 1.0)) o.smoothing = 0.2;
  o.long_window = std::max(o.long_window, 1u);
  if (!(o.rtt_tolerance >= 1.0)) o.rtt_tolerance = 1.5;
  if (!(o.drop_backoff_ratio >= 0.5 && o.drop_backoff_ratio < 1.0)) o.drop_backoff_ratio = 0.9;
  o.baseline_window = std::max(o.baseline_window, 2u);
  return o;
}

}  // namespace

std::string_view Gradient2Options::validate() const noexcept {
  if (min_limit < 1) return "gradient2: min_limit must be >= 1";
  if (min_limit > max_limit) return "gradient2: min_limit must be <= max_limit";
  if (initial_limit < min_limit || initial_limit > max_limit)
    return "gradient2: initial_limit must be within [min_limit, max_limit]";
  if (!(smoothing > 0.0 && smoothing <= 1.0)) return "gradient2: smoothing must be in (0, 1]";
  if (long_window < 1) return "gradient2: long_window must be >= 1";
  if (!(rtt_tolerance >= 1.0)) return "gradient2: rtt_tolerance must be >= 1";
  if (!(drop_backoff_ratio >= 0.5 && drop_backoff_ratio < 1.0))
    return "gradient2: drop_backoff_ratio must be in [0.5, 1)";
  if (baseline_window < 2) return "gradient2: baseline_window must be >= 2";
  return {};
}

Gradient2Limit::Gradient2Limit(Gradient2Options options) noexcept
    : options_(repaired(options)), estimate_(options_.initial_limit) {}

std::uint32_t Gradient2Limit::limit() const noexcept {
  return static_cast<std::uint32_t>(estimate_);
}

Nanos Gradient2Limit::long_rtt() const noexcept { return Nanos{std::llround(long_rtt_)}; }

Nanos Gradient2Limit::baseline_rtt() const noexcept {
  return warmup_count_ == 0 ? Nanos{0} : Nanos{std::llround(baseline())};
}

double Gradient2Limit::baseline() const noexcept {
  return std::min(long_rtt_, EpochMin(recent_prev_, recent_cur_).get());
}

void Gradient2Limit::observe(double rtt_ns) noexcept {
  if (warmup_count_ < kWarmupSamples) {
    // The mean of the raw samples: a decay below applies to this sample's value only.
    ++warmup_count_;
    warmup_sum_ += rtt_ns;
    long_rtt_ = warmup_sum_ / warmup_count_;
  } else {
    const double factor = 2.0 / (options_.long_window + 1.0);
    long_rtt_ = long_rtt_ * (1.0 - factor) + rtt_ns * factor;
  }
  if (long_rtt_ > 2.0 * rtt_ns) long_rtt_ *= kLongRttDecay;

  EpochMin recent(recent_prev_, recent_cur_);
  recent.add(rtt_ns);
  if (++recent_samples_ >= options_.baseline_window / 2) {
    recent.rotate();
    recent_samples_ = 0;
  }
}

std::uint32_t Gradient2Limit::update(const LimitSample& sample) noexcept {
  if (sample.dropped) {
    // At least one whole unit, so the published (floored) limit always comes down.
    return commit(std::min(estimate_ * options_.drop_backoff_ratio, std::floor(estimate_) - 1.0));
  }
  if (sample.rtt <= Nanos{0}) return limit();
  const auto rtt = static_cast<double>(sample.rtt.count());
  observe(rtt);
  if (sample.in_flight < estimate_ / 2.0) return limit();

  const double gradient = std::clamp(options_.rtt_tolerance * baseline() / rtt, kMinGradient, 1.0);
  const double target = gradient >= 1.0 ? estimate_ + options_.queue_size : estimate_ * gradient;
  return commit((1.0 - options_.smoothing) * estimate_ + options_.smoothing * target);
}

std::uint32_t Gradient2Limit::commit(double next) noexcept {
  estimate_ = std::clamp(next, static_cast<double>(options_.min_limit),
                         static_cast<double>(options_.max_limit));
  return limit();
}

}  // namespace sluice
