#include "sluice/backends/memory_rate_coordinator.h"

#include <string>

namespace sluice {

MemoryRateCoordinator::MemoryRateCoordinator(const Clock& clock) : clock_(clock) {}

StatusOr<LeaseReply> MemoryRateCoordinator::lease(std::string_view key, const LeaseRequest& request,
                                                  Nanos /*timeout*/) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (std::string why = validate(request); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  try {
    const std::lock_guard lock(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) it = keys_.emplace(std::string(key), Ledger{}).first;
    return sluice::lease(it->second, request, clock_.now(), origin_window_);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("lease: ") + e.what());
  }
}

StatusOr<std::uint64_t> MemoryRateCoordinator::reconcile(std::string_view key,
                                                         std::string_view region,
                                                         Nanos window_start,
                                                         std::uint64_t relinquished,
                                                         Nanos /*timeout*/) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (region.empty()) return Status(StatusCode::kInvalidArgument, "region: must not be empty");
  try {
    const std::lock_guard lock(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) return std::uint64_t{0};  // nothing leased here (or state lost)
    return sluice::reconcile(it->second, region, window_start, relinquished, clock_.now());
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("reconcile: ") + e.what());
  }
}

Status MemoryRateCoordinator::health(Nanos /*timeout*/) noexcept { return {}; }

void MemoryRateCoordinator::lose_state(Nanos period) {
  const std::lock_guard lock(mu_);
  keys_.clear();
  origin_window_ = window_of(clock_.now(), period).count();
}

std::optional<Ledger> MemoryRateCoordinator::ledger(std::string_view key) const {
  const std::lock_guard lock(mu_);
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

}  // namespace sluice
