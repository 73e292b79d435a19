#include "sluice/backends/memory_regional_escrow.h"

#include <algorithm>
#include <string>

namespace sluice {

MemoryRegionalEscrow::MemoryRegionalEscrow(const Clock& clock, Nanos keep)
    : clock_(clock), keep_(std::max(Nanos{1}, keep)), next_sweep_(clock.now() + keep_ / 4) {}

void MemoryRegionalEscrow::sweep(Nanos now) {
  next_sweep_ = now + std::max(Nanos{1}, keep_ / 4);
  std::erase_if(keys_, [&](const auto& entry) {
    const RegionalPool& p = entry.second;
    // Its expiry, or its last call (clock_high) when it never had a window.
    const std::int64_t last = p.window_start == INT64_MIN ? p.clock_high : p.expires_at;
    return last <= now.count() - keep_.count() && p.refilling_until <= now.count();
  });
}

template <typename F>
StatusOr<PoolReply> MemoryRegionalEscrow::run(std::string_view key, const char* what,
                                              F&& f) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  try {
    const std::lock_guard lock(mu_);
    const Nanos now = clock_.now();
    if (now >= next_sweep_) sweep(now);
    auto it = keys_.find(key);
    if (it == keys_.end()) it = keys_.emplace(std::string(key), RegionalPool{}).first;
    return f(it->second, now);
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

std::size_t MemoryRegionalEscrow::size() const {
  const std::lock_guard lock(mu_);
  return keys_.size();
}

std::optional<RegionalPool> MemoryRegionalEscrow::pool(std::string_view key) const {
  const std::lock_guard lock(mu_);
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

}  // namespace sluice
