// coordinator.h: the fleet guard's coordinator interface (memory, Redis, PostgreSQL).
//
// What it is: one round trip per heartbeat: the coordinator runs the heartbeat core
// (sluice/core/fleet.h) on the key's FleetState atomically and returns the reporter's Grant;
// leave() drops a node's record at once. A heartbeat under a node id another live process holds
// (sluice::clash) is refused with kAlreadyExists, naming the id, and changes nothing. Every backend
// gives identical grants for an identical sequence of calls (the conformance test). The
// coordinator's rules (aggregate, allocation, acknowledged handoff) are fixed at construction: a
// fleet cannot mix them.
//
// Errors are values (sluice/core/status.h): kInvalidArgument for a bad report, kUnavailable when
// the backend cannot be reached, kDeadlineExceeded when the call did not finish within
// `timeout` (a hanging backend must never hold a guard past its fence). Never throws.
//
// Thread-safety: every implementation is safe to call from any number of threads; calls on one
// key are serialised (by the backend: a Lua script, an advisory lock, a mutex).
#pragma once

#include <cstdint>
#include <string_view>

#include "sluice/core/clock.h"
#include "sluice/core/fleet.h"
#include "sluice/core/status.h"

namespace sluice {

class ConcurrencyCoordinator {
 public:
  virtual ~ConcurrencyCoordinator() = default;

  // Upsert, evict, aggregate, split: the reporter's grant. At most `timeout` of waiting.
  [[nodiscard]] virtual StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                                  Nanos timeout) noexcept = 0;
  // Reclaims the node's share at once. Ok also when the node was not there, or when another
  // instance wrote its record (which stays; `instance` 0 matches any).
  [[nodiscard]] virtual Status leave(std::string_view key, std::string_view node_id,
                                     std::uint64_t instance, Nanos timeout) noexcept = 0;
  [[nodiscard]] virtual const CoordinatorConfig& config() const noexcept = 0;
  // "memory", "redis", "postgres": for stats and logs.
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
};

}  // namespace sluice
