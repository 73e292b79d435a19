#include "sluice/core/clock.h"

#include <time.h>

namespace sluice {

Nanos SteadyClock::now() const noexcept {
  return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
}

std::int64_t unix_ms_now() noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Nanos unix_ns_now() noexcept {
  return std::chrono::duration_cast<Nanos>(std::chrono::system_clock::now().time_since_epoch());
}

Nanos CoarseSteadyClock::now() const noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::seconds(ts.tv_sec) + Nanos(ts.tv_nsec);
}

Nanos CoarseSteadyClock::resolution() noexcept {
  timespec ts{};
  ::clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::seconds(ts.tv_sec) + Nanos(ts.tv_nsec);
}

const CoarseSteadyClock& CoarseSteadyClock::instance() noexcept {
  static const CoarseSteadyClock clock;
  return clock;
}

const SteadyClock& SteadyClock::instance() noexcept {
  static const SteadyClock clock;
  return clock;
}

void ManualClock::set(Nanos t) noexcept {
  std::int64_t cur = now_ns_.load(std::memory_order_relaxed);
  while (cur < t.count() &&
         !now_ns_.compare_exchange_weak(cur, t.count(), std::memory_order_relaxed)) {
  }
}

}  // namespace sluice
