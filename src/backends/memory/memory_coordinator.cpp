#include "sluice/backends/memory_coordinator.h"

#include <new>

namespace sluice {

MemoryCoordinator::MemoryCoordinator(const Clock& clock, CoordinatorConfig config)
    : clock_(clock), config_(config) {}

StatusOr<Grant> MemoryCoordinator::heartbeat(std::string_view key, const NodeReport& report,
                                             Nanos /*timeout: never waits on I/O*/) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (std::string why = validate(report); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  try {
    const std::lock_guard lock(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) it = keys_.emplace(std::string(key), FleetState{}).first;
    const Nanos now = clock_.now();
    if (std::string why = clash(it->second, report, now); !why.empty())
      return Status(StatusCode::kAlreadyExists, std::move(why));
    return sluice::heartbeat(it->second, report, now, config_, lost_at_);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInternal, "out of memory");
  }
}

Status MemoryCoordinator::leave(std::string_view key, std::string_view node_id,
                                std::uint64_t instance, Nanos /*timeout*/) noexcept {
  const std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  if (it != keys_.end()) sluice::leave(it->second, node_id, instance);
  return {};
}

void MemoryCoordinator::lose_state() {
  const std::lock_guard lock(mu_);
  keys_.clear();
  lost_at_ = clock_.now();
}

std::optional<FleetState> MemoryCoordinator::state(std::string_view key) const {
  const std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

}  // namespace sluice
