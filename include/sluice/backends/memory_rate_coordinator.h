// memory_rate_coordinator.h: the embedded, in-process RateCoordinator.
//
// What it is: a map from key to Ledger behind one mutex, running the escrow core with time from
// an injected Clock (a ManualClock in tests and simulations: deterministic). The reference the
// Redis and PostgreSQL coordinators must match, and the coordinator of regions that live in one
// process.
//
// State loss: its ledgers live and die with the process, and so do the regions that share it,
// so it starts with no origin window. lose_state() forgets every ledger as a crash would and
// makes the window it happens in the origin (tests and simulations of a coordinator restart).
//
// Thread-safety: every member is safe to call concurrently (one mutex; calls are short).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "sluice/core/rate_coordinator.h"

namespace sluice {

class MemoryRateCoordinator final : public RateCoordinator {
 public:
  // `clock` must outlive the coordinator.
  explicit MemoryRateCoordinator(const Clock& clock);

  [[nodiscard]] StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                                           Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                                  Nanos window_start, std::uint64_t relinquished,
                                                  Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "memory"; }

  // Forgets every ledger, as a crash of a coordinator without durable state would: the window
  // of `period` that now falls in counts as spent for every key (sluice/core/escrow.h, rule 3).
  void lose_state(Nanos period);
  // A copy of a key's ledger (tests and introspection); nullopt for an unknown key.
  [[nodiscard]] std::optional<Ledger> ledger(std::string_view key) const;

 private:
  const Clock& clock_;
  mutable std::mutex mu_;
  std::map<std::string, Ledger, std::less<>> keys_;
  std::int64_t origin_window_ = INT64_MIN;
};

}  // namespace sluice
