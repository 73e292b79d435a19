#include "sluice/core/vegas_limit.h"

#include <algorithm>
#include <cmath>

#include "core/epoch_min.h"

namespace sluice {
namespace {

// The step function, as the reference's: max(1, floor(log10 L)) at every limit.
double step(double limit) noexcept {
  const auto l = static_cast<std::uint32_t>(limit);
  if (l < 10) return 1.0;
  return std::floor(std::log10(static_cast<double>(l)));
}

// splitmix64: a small, seedable, portable generator (the same stream on every platform).
std::uint64_t next_random(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E37'79B9'7F4A'7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBull;
  return z ^ (z >> 31);
}

VegasOptions repaired(VegasOptions o) noexcept {
  o.min_limit = std::max(o.min_limit, 1u);
  if (o.max_limit < o.min_limit) o.max_limit = o.min_limit;
  o.initial_limit = std::clamp(o.initial_limit, o.min_limit, o.max_limit);
  if (!(o.smoothing > 0.0 && o.smoothing <= 1.0)) o.smoothing = 1.0;
  o.probe_multiplier = std::max(o.probe_multiplier, 1u);
  return o;
}

}  // namespace

std::string_view VegasOptions::validate() const noexcept {
  if (min_limit < 1) return "vegas: min_limit must be >= 1";
  if (min_limit > max_limit) return "vegas: min_limit must be <= max_limit";
  if (initial_limit < min_limit || initial_limit > max_limit)
    return "vegas: initial_limit must be within [min_limit, max_limit]";
  if (!(smoothing > 0.0 && smoothing <= 1.0)) return "vegas: smoothing must be in (0, 1]";
  if (probe_multiplier < 1) return "vegas: probe_multiplier must be >= 1";
  return {};
}

VegasLimit::VegasLimit(VegasOptions options) noexcept
    : options_(repaired(options)), estimate_(options_.initial_limit), rng_state_(options_.seed) {
  next_jitter();
}

std::uint32_t VegasLimit::limit() const noexcept { return static_cast<std::uint32_t>(estimate_); }

Nanos VegasLimit::rtt_noload() const noexcept {
  const EpochMin baseline(baseline_prev_, baseline_cur_);
  return baseline.empty() ? Nanos{0} : Nanos{std::llround(baseline.get())};
}

void VegasLimit::next_jitter() noexcept {
  // 53 random bits -> [0, 1) -> [0.5, 1).
  const double unit = static_cast<double>(next_random(rng_state_) >> 11) * 0x1.0p-53;
  jitter_ = 0.5 + 0.5 * unit;
}

void VegasLimit::advance_epoch() noexcept {
  ++epoch_samples_;
  const double epoch_length = jitter_ * options_.probe_multiplier * estimate_;
  if (static_cast<double>(epoch_samples_) < epoch_length) return;
  EpochMin(baseline_prev_, baseline_cur_).rotate();
  epoch_samples_ = 0;
  next_jitter();
}

std::uint32_t VegasLimit::update(const LimitSample& sample) noexcept {
  // Drops come first: a dropped window backs off even if its RTT would be a new minimum (its
  // RTT is not a latency measurement and never enters the baseline).
  if (sample.dropped) return commit(estimate_ - step(estimate_));
  if (sample.rtt <= Nanos{0}) return limit();
  const auto rtt = static_cast<double>(sample.rtt.count());
  advance_epoch();
  if (EpochMin(baseline_prev_, baseline_cur_).add(rtt)) return limit();
  if (2.0 * sample.in_flight < estimate_) return limit();
  return commit(grown_or_shrunk(rtt));
}

double VegasLimit::grown_or_shrunk(double rtt_ns) const noexcept {
  const double f = step(estimate_);
  const double rtt_noload = EpochMin(baseline_prev_, baseline_cur_).get();
  const double queue = std::ceil(estimate_ * (1.0 - rtt_noload / rtt_ns));
  if (queue <= f) return estimate_ + 6.0 * f;
  if (queue < 3.0 * f) return estimate_ + f;
  if (queue > 6.0 * f) return estimate_ - f;
  return estimate_;
}

std::uint32_t VegasLimit::commit(double next) noexcept {
  next = std::clamp(next, static_cast<double>(options_.min_limit),
                    static_cast<double>(options_.max_limit));
  estimate_ = (1.0 - options_.smoothing) * estimate_ + options_.smoothing * next;
  return limit();
}

}  // namespace sluice
