// memory_coordinator.h: the embedded, in-process ConcurrencyCoordinator.
//
// What it is: a map from key to FleetState behind one mutex, running the heartbeat core with
// time from an injected Clock (a ManualClock in tests: deterministic, no timers, no I/O). The
// default coordinator of a single process, the reference every other backend must match, and
// what tests use as a fleet's shared coordinator. Its state lives and dies with the process, as
// do the in-process nodes it serves, so it never finds a loss of state (fleet.h) unless told:
// lose_state() forgets every key as a restart of an external coordinator would, and grants
// nothing for one lease_ttl from then (tests and simulations of a coordinator restart).
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

  // Forgets every key's state, and counts now as the time of a loss (fleet.h: lost_at).
  void lose_state();

 private:
  const Clock& clock_;
  const CoordinatorConfig config_;
  mutable std::mutex mu_;
  std::map<std::string, FleetState, std::less<>> keys_;
  Nanos lost_at_ = kNeverLost;  // guarded by mu_
};

}  // namespace sluice
