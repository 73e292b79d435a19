// memory_coordinator.h: the embedded, in-process ConcurrencyCoordinator.
//
// What it is: a map from key to FleetState behind one mutex, running the heartbeat core with
// time from an injected Clock (a ManualClock in tests: deterministic, no timers, no I/O). The
// default coordinator of a single process, the reference every other backend must match, and
// what tests use as a fleet's shared coordinator.
//
// Thread-safety: every member is safe to call concurrently (one mutex; calls are short).
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "sluice/core/coordinator.h"

namespace sluice {

class MemoryCoordinator final : public ConcurrencyCoordinator {
 public:
  // `clock` must outlive the coordinator.
  explicit MemoryCoordinator(const Clock& clock, CoordinatorConfig config = {});

  [[nodiscard]] StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                          Nanos timeout) noexcept override;
  [[nodiscard]] Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
                             Nanos timeout) noexcept override;
  [[nodiscard]] const CoordinatorConfig& config() const noexcept override { return config_; }
  [[nodiscard]] std::string_view backend() const noexcept override { return "memory"; }

  // A copy of a key's state (tests and introspection); nullopt for an unknown key.
  [[nodiscard]] std::optional<FleetState> state(std::string_view key) const;

 private:
  const Clock& clock_;
  const CoordinatorConfig config_;
  mutable std::mutex mu_;
  std::map<std::string, FleetState, std::less<>> keys_;
};

}  // namespace sluice
