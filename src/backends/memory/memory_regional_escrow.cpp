#include "sluice/memory_regional_escrow.h"

#include <string>

namespace sluice {

MemoryRegionalEscrow::MemoryRegionalEscrow(const Clock& clock) : clock_(clock) {}

template <typename F>
StatusOr<PoolReply> MemoryRegionalEscrow::run(std::string_view key, const char* what,
                                              F&& f) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  try {
    const std::lock_guard lock(mu_);
    auto it = keys_.find(key);
    if (it == keys_.end()) it = keys_.emplace(std::string(key), RegionalPool{}).first;
    return f(it->second, clock_.now());
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string(what) + ": " + e.what());
  }
}

StatusOr<PoolReply> MemoryRegionalEscrow::take(std::string_view key, std::uint64_t want,
                                               Nanos refill_hold, bool past_expiry,
                                               Nanos /*timeout*/) noexcept {
  if (want == 0) return Status(StatusCode::kInvalidArgument, "want: must be at least 1");
  if (refill_hold <= Nanos{0})
    return Status(StatusCode::kInvalidArgument, "refill_hold: must be positive");
  return run(key, "take", [&](RegionalPool& p, Nanos now) {
    return pool_take(p, want, refill_hold, past_expiry, now);
  });
}

StatusOr<PoolReply> MemoryRegionalEscrow::refill(std::string_view key, Nanos window_start,
                                                 std::uint64_t units, Nanos expires_at,
                                                 Nanos /*timeout*/) noexcept {
  return run(key, "refill", [&](RegionalPool& p, Nanos now) {
    return pool_refill(p, window_start, units, expires_at, now);
  });
}

StatusOr<PoolReply> MemoryRegionalEscrow::release(std::string_view key, Nanos window_start,
                                                  std::uint64_t units, Nanos /*timeout*/) noexcept {
  return run(key, "release",
             [&](RegionalPool& p, Nanos now) { return pool_release(p, window_start, units, now); });
}

Status MemoryRegionalEscrow::health(Nanos /*timeout*/) noexcept { return {}; }

std::optional<RegionalPool> MemoryRegionalEscrow::pool(std::string_view key) const {
  const std::lock_guard lock(mu_);
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

}  // namespace sluice
