#include "sluice/local/semaphore.h"

namespace sluice {

void Semaphore::set_limit(std::uint32_t limit) noexcept {
  std::uint64_t w = word_.load(std::memory_order_relaxed);
  // Replace the high half only; a concurrent acquire or release changes the low half, in which
  // case the compare-exchange fails and the loop retries with the fresh word.
  while (!word_.compare_exchange_weak(w, pack(clamp(limit), in_flight_of(w)),
                                      std::memory_order_relaxed, std::memory_order_relaxed)) {
  }
}

}  // namespace sluice
