// memory_regional_escrow.h: the embedded, in-process RegionalEscrow.
//
// What it is: a map from key to RegionalPool behind one mutex, running the pool rules of
// sluice/core/escrow.h with time from an injected Clock (a ManualClock in tests and simulations:
// deterministic). The reference the Redis pool must match, and the pool of limiters that
// share one address space (tests, simulations, several policies of one server).
//
// Memory: a key's pool is forgotten `keep` (default an hour, as the Redis pool's hash expires)
// after its expiry, or after its last call for a pool that never had a window; the map is swept
// on time, at most every keep / 4, by the call that finds the sweep due. A forgotten pool has
// no units that could still be taken within their window (its expiry passed long before), so
// forgetting it admits nothing more; a regional-only outage longer than `keep` loses the
// balance it had left, as it does on Redis.
//
// Thread-safety: every member is safe to call concurrently (one mutex; calls are short).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "sluice/core/regional_escrow.h"

namespace sluice {

class MemoryRegionalEscrow final : public RegionalEscrow {
 public:
  // `clock` must outlive the pool. `keep` > 0.
  explicit MemoryRegionalEscrow(const Clock& clock, Nanos keep = std::chrono::hours(1));

  [[nodiscard]] StatusOr<PoolReply> take(std::string_view key, std::uint64_t want,
                                         Nanos refill_hold, bool past_expiry,
                                         Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<PoolReply> refill(std::string_view key, Nanos window_start,
                                           std::uint64_t units, Nanos expires_at,
                                           Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<PoolReply> release(std::string_view key, Nanos window_start,
                                            std::uint64_t units, Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "memory"; }

  // A copy of a key's pool (tests and introspection); nullopt for an unknown key.
  [[nodiscard]] std::optional<RegionalPool> pool(std::string_view key) const;
  // Keys held now.
  [[nodiscard]] std::size_t size() const;

 private:
  template <typename F>
  StatusOr<PoolReply> run(std::string_view key, const char* what, F&& f) noexcept;

  void sweep(Nanos now);  // with mu_ held

  const Clock& clock_;
  const Nanos keep_;
  mutable std::mutex mu_;
  std::map<std::string, RegionalPool, std::less<>> keys_;
  Nanos next_sweep_{0};
};

}  // namespace sluice
