// rate_coordinator.h: federation's global coordinator interface (memory, Redis, PostgreSQL).
//
// What it is: the one place a key's global budget lives. lease() runs the escrow core's lease
// (sluice/core/escrow.h) on the key's Ledger atomically with the coordinator's own clock,
// reconcile() its reconcile, health() a cheap reachability probe. Every backend gives identical
// replies for an identical sequence of calls at identical times (the conformance test). Named apart
// from the fleet's ConcurrencyCoordinator: the two share no keys, tables or scripts.
//
// Errors are values (sluice/core/status.h): kInvalidArgument for a bad request, kUnavailable when
// the backend cannot be reached, kDeadlineExceeded when the call did not finish within `timeout`.
// Never throws.
//
// Thread-safety: every implementation is safe to call from any number of threads; calls on one
// key are serialised by the backend.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/escrow.h"
#include "sluice/core/status.h"

namespace sluice {

// One lease of a lease_many() call.
struct LeaseCall {
  std::string_view key;
  const LeaseRequest* request = nullptr;  // non-null
};

class RateCoordinator {
 public:
  virtual ~RateCoordinator() = default;

  [[nodiscard]] virtual StatusOr<LeaseReply> lease(std::string_view key,
                                                   const LeaseRequest& request,
                                                   Nanos timeout) noexcept = 0;
  // Several leases (of different keys, or the same) in one call: exactly what lease() would
  // reply to each, one reply per call in order, each as if made in that order. A backend that
  // pipelines sends them all in one round trip (Redis); the default makes one lease() after
  // another, each within `timeout`. An empty vector when it could not allocate (every call
  // failed).
  [[nodiscard]] virtual std::vector<StatusOr<LeaseReply>> lease_many(
      std::span<const LeaseCall> calls, Nanos timeout) noexcept {
    std::vector<StatusOr<LeaseReply>> out;
    try {
      out.reserve(calls.size());
      for (const LeaseCall& c : calls) out.push_back(lease(c.key, *c.request, timeout));
    } catch (...) {
      out.clear();
    }
    return out;
  }
  // `region` gave up `relinquished` units in total in the window starting at `window_start`;
  // returns the units given back to that window's budget (0 once it has ended).
  [[nodiscard]] virtual StatusOr<std::uint64_t> reconcile(std::string_view key,
                                                          std::string_view region,
                                                          Nanos window_start,
                                                          std::uint64_t relinquished,
                                                          Nanos timeout) noexcept = 0;
  // Ok when the coordinator answers.
  [[nodiscard]] virtual Status health(Nanos timeout) noexcept = 0;
  // "memory", "redis", "postgres": for stats and logs.
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
};

}  // namespace sluice
