// regional_escrow.h: federation's regional pool (L2) interface (memory, Redis).
//
// What it is: one pool per key shared by the processes of one region, between their in-process
// escrow and the global RateCoordinator (sluice/core/rate_coordinator.h). take(), refill() and
// release() run the pool rules of sluice/core/escrow.h (P1-P3) atomically on the backend's clock;
// health() is a cheap reachability probe. With a pool, a region leases from the coordinator one
// regional batch at a time whatever its number of processes, and in the regional-only outage
// mode keeps serving the pool's balance while the coordinator is down. Named apart from the
// fleet's coordinators and the RateCoordinator: its own keys.
//
// Errors are values (sluice/core/status.h): kInvalidArgument for a bad request, kUnavailable when
// the backend cannot be reached, kDeadlineExceeded when the call did not finish within `timeout`.
// Never throws.
//
// Thread-safety: every implementation is safe to call from any number of threads; calls on one
// key are serialised by the backend.
#pragma once

#include <cstdint>
#include <string_view>

#include "sluice/core/clock.h"
#include "sluice/core/escrow.h"
#include "sluice/core/status.h"

namespace sluice {

class RegionalEscrow {
 public:
  virtual ~RegionalEscrow() = default;

  // P1: takes up to `want` (>= 1) units of `key`'s pool; `refill_hold` (> 0) is how long a
  // refiller has before another process may become one.
  [[nodiscard]] virtual StatusOr<PoolReply> take(std::string_view key, std::uint64_t want,
                                                 Nanos refill_hold, bool past_expiry,
                                                 Nanos timeout) noexcept = 0;
  // P2: `expires_at` on the pool's clock (pool_expiry()).
  [[nodiscard]] virtual StatusOr<PoolReply> refill(std::string_view key, Nanos window_start,
                                                   std::uint64_t units, Nanos expires_at,
                                                   Nanos timeout) noexcept = 0;
  // P3.
  [[nodiscard]] virtual StatusOr<PoolReply> release(std::string_view key, Nanos window_start,
                                                    std::uint64_t units,
                                                    Nanos timeout) noexcept = 0;
  // Ok when the backend answers.
  [[nodiscard]] virtual Status health(Nanos timeout) noexcept = 0;
  // "memory", "redis": for stats and logs.
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
};

}  // namespace sluice
