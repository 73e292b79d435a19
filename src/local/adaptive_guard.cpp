#include "sluice/local/adaptive_guard.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <thread>
#include <utility>

namespace sluice {
namespace {

AdaptiveGuardOptions repaired(AdaptiveGuardOptions o) noexcept {
  if (o.min_window_time <= Nanos{0}) o.min_window_time = std::chrono::seconds(1);
  o.max_window_time = std::max(o.max_window_time, o.min_window_time);
  o.min_rtt_threshold = std::max(o.min_rtt_threshold, Nanos{0});
  o.window_size = std::max(o.window_size, 1u);
  if (!(o.percentile > 0.0 && o.percentile < 1.0)) o.percentile = 0.99;
  o.percentile_capacity = std::bit_ceil(std::clamp(o.percentile_capacity, 1u, 1u << 20));
  o.clock_check_interval = std::bit_ceil(std::clamp(o.clock_check_interval, 1u, 1u << 20));
  return o;
}

// The next window's length: twice the smallest RTT of the last one, within [min, max].
Nanos next_window_length(std::int64_t min_rtt_ns, const AdaptiveGuardOptions& o) noexcept {
  if (min_rtt_ns > o.max_window_time.count() / 2) return o.max_window_time;
  return std::clamp(Nanos{2 * min_rtt_ns}, o.min_window_time, o.max_window_time);
}

}  // namespace

std::string_view AdaptiveGuardOptions::validate() const noexcept {
  if (min_window_time <= Nanos{0}) return "adaptive guard: min_window_time must be > 0";
  if (max_window_time < min_window_time)
    return "adaptive guard: max_window_time must be >= min_window_time";
  if (min_rtt_threshold < Nanos{0}) return "adaptive guard: min_rtt_threshold must be >= 0";
  if (window_size < 1) return "adaptive guard: window_size must be >= 1";
  if (!(percentile > 0.0 && percentile < 1.0))
    return "adaptive guard: percentile must be in (0, 1)";
  if (!std::has_single_bit(percentile_capacity) || percentile_capacity > (1u << 20))
    return "adaptive guard: percentile_capacity must be a power of two <= 2^20";
  if (!std::has_single_bit(clock_check_interval) || clock_check_interval > (1u << 20))
    return "adaptive guard: clock_check_interval must be a power of two <= 2^20";
  return {};
}

AdaptiveGuard::AdaptiveGuard(std::unique_ptr<LimitAlgorithm> algorithm, const Clock& clock,
                             AdaptiveGuardOptions options)
    : sem_(algorithm->limit()),
      deadline_ns_(0),
      algorithm_limit_(algorithm->limit()),
      options_(repaired(options)),
      clock_(clock),
      check_mask_(options_.clock_check_interval - 1),
      ring_mask_(options_.percentile_capacity - 1),
      algorithm_(std::move(algorithm)) {
  if (options_.window_rtt == WindowRtt::kPercentile) {
    ring_ = std::make_unique<std::atomic<std::int64_t>[]>(options_.percentile_capacity);
    scratch_ = std::make_unique<std::int64_t[]>(options_.percentile_capacity);
  }
  deadline_ns_.store((clock_.now() + options_.min_window_time).count(), std::memory_order_relaxed);
}

AdaptiveGuard::~AdaptiveGuard() = default;

void AdaptiveGuard::observe_dropped(Nanos rtt, std::uint32_t in_flight) noexcept {
  counters_.dropped.fetch_add(1, std::memory_order_relaxed);
  if (rtt >= options_.min_rtt_threshold) {
    (void)record(rtt.count(), in_flight);
  } else {
    std::uint32_t hi = window_.max_in_flight.load(std::memory_order_relaxed);
    while (in_flight > hi &&
           !window_.max_in_flight.compare_exchange_weak(hi, in_flight, std::memory_order_relaxed)) {
    }
  }
  window_.dropped.store(true, std::memory_order_relaxed);
  // Drops are off the fast path, so each one may read the clock: a window with a drop
  // completes as soon as its time is up.
  try_close_window();
}

std::pair<std::uint32_t, bool> AdaptiveGuard::renewed() noexcept {
  counters_.accepted.fetch_add(1, std::memory_order_relaxed);
  const Semaphore::Snapshot now = sem_.snapshot();  // a consistent pair
  return {now.in_flight, now.in_flight <= now.limit};
}

void AdaptiveGuard::try_close_window() noexcept {
  const Nanos now = clock_.now();
  if (now.count() < deadline_ns_.load(std::memory_order_relaxed)) return;
  // Losing the flag is fine: the winner is closing (or the cap is being set) and this
  // release's sample is already recorded.
  if (closing_.test_and_set(std::memory_order_acquire)) return;
  close_window_locked(now);
  closing_.clear(std::memory_order_release);
}

// A guard held below its algorithm's limit by a cap (a fleet share) is capped, not idle: the
// algorithms' application-limited test ("were at least half of the limit's calls in flight?")
// must see the same fraction of the limit as the calls were of the cap. Unscaled, a fleet node
// whose share is a fraction of L_local could never raise L_local however loaded the backend.
std::uint32_t AdaptiveGuard::demand_locked(std::uint32_t max_in_flight) const noexcept {
  const std::uint32_t cap = cap_.load(std::memory_order_relaxed);
  const std::uint32_t limit = algorithm_limit_.load(std::memory_order_relaxed);
  if (cap == kNoCap || cap == 0 || cap >= limit) return max_in_flight;
  const std::uint64_t scaled = std::uint64_t{max_in_flight} * limit / cap;
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(scaled, limit));
}

void AdaptiveGuard::close_window_locked(Nanos now) noexcept {
  // Re-check under the flag: another closer may have just started a new window.
  if (now.count() < deadline_ns_.load(std::memory_order_relaxed)) return;
  const std::uint64_t first = window_first_.load(std::memory_order_relaxed);
  const std::uint64_t end = window_.samples.load(std::memory_order_relaxed);
  const std::uint64_t n = end - first;
  if (n < options_.window_size && !window_.dropped.load(std::memory_order_relaxed)) return;

  const bool dropped = window_.dropped.exchange(false, std::memory_order_relaxed);
  const std::uint64_t sum = window_.rtt_sum_ns.exchange(0, std::memory_order_relaxed);
  const std::int64_t min_rtt = window_.min_rtt_ns.exchange(std::numeric_limits<std::int64_t>::max(),
                                                           std::memory_order_relaxed);
  const std::uint32_t max_in_flight = window_.max_in_flight.exchange(0, std::memory_order_relaxed);
  window_first_.store(end, std::memory_order_relaxed);

  const std::int64_t rtt = n == 0 ? 0 : window_rtt_locked(first, end, sum);
  algorithm_limit_.store(
      algorithm_->update(LimitSample{Nanos{rtt}, demand_locked(max_in_flight), dropped}),
      std::memory_order_relaxed);
  publish_ceiling_locked();
  counters_.windows.fetch_add(1, std::memory_order_relaxed);
  deadline_ns_.store((now + next_window_length(min_rtt, options_)).count(),
                     std::memory_order_relaxed);
}

std::int64_t AdaptiveGuard::window_rtt_locked(std::uint64_t first, std::uint64_t end,
                                              std::uint64_t sum) noexcept {
  const std::uint64_t n = end - first;
  if (!ring_) return static_cast<std::int64_t>(sum / n);
  // The most recent min(n, capacity) RTTs of the window, then the percentile by selection
  // (rank round(k * p), 1-based).
  const std::uint64_t from = std::max(first, end - std::min<std::uint64_t>(n, ring_mask_ + 1));
  std::size_t k = 0;
  for (std::uint64_t i = from; i < end; ++i)
    scratch_[k++] = ring_[i & ring_mask_].load(std::memory_order_relaxed);
  const auto rank =
      static_cast<std::int64_t>(std::llround(static_cast<double>(k) * options_.percentile));
  const auto index = static_cast<std::size_t>(
      std::clamp<std::int64_t>(rank - 1, 0, static_cast<std::int64_t>(k) - 1));
  std::nth_element(scratch_.get(), scratch_.get() + index, scratch_.get() + k);
  return scratch_[index];
}

void AdaptiveGuard::publish_ceiling_locked() noexcept {
  sem_.set_limit(std::min(cap_.load(std::memory_order_relaxed),
                          algorithm_limit_.load(std::memory_order_relaxed)));
}

void AdaptiveGuard::lock_spin() noexcept {
  while (closing_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
}

void AdaptiveGuard::set_cap(std::uint32_t cap) noexcept {
  lock_spin();
  cap_.store(cap, std::memory_order_relaxed);
  publish_ceiling_locked();
  closing_.clear(std::memory_order_release);
}

void AdaptiveGuard::replace_algorithm(std::unique_ptr<LimitAlgorithm> algorithm) noexcept {
  lock_spin();
  std::unique_ptr<LimitAlgorithm> old = std::exchange(algorithm_, std::move(algorithm));
  algorithm_limit_.store(algorithm_->limit(), std::memory_order_relaxed);
  publish_ceiling_locked();
  closing_.clear(std::memory_order_release);
}  // `old` is destroyed outside the flag

AdaptiveGuardStats AdaptiveGuard::stats() const noexcept {
  const Semaphore::Snapshot s = sem_.snapshot();
  return AdaptiveGuardStats{
      .in_flight = s.in_flight,
      .limit = s.limit,
      .algorithm_limit = algorithm_limit(),
      .cap = cap(),
      .accepted = counters_.accepted.load(std::memory_order_relaxed),
      .rejected = counters_.rejected.load(std::memory_order_relaxed),
      .dropped = counters_.dropped.load(std::memory_order_relaxed),
      .ignored = counters_.ignored.load(std::memory_order_relaxed),
      .windows = counters_.windows.load(std::memory_order_relaxed),
  };
}

}  // namespace sluice
