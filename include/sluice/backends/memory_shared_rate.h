// memory_shared_rate.h: the embedded, in-process SharedRateStore.
//
// What it is: a map from (key, strategy, period) to SharedRateState behind one mutex, running
// sluice/core/shared_rate.h's apply() with time from an injected Clock (a ManualClock in tests:
// deterministic). The reference the Redis store must match, and the store of servers that share
// one process (a `rate` policy with `coordinator: memory` decides exactly as one without).
//
// Memory: a key whose state decides like a fresh one (rate_strategy.h: is_idle) is forgotten by
// the sweep that runs whenever the map has doubled since the last one (amortised O(1) per call).
//
// State loss: its states live and die with the process, so it starts with no origin.
// lose_state() forgets every state as a crash would and makes now the origin (tests and
// simulations of a coordinator restart).
//
// Thread-safety: every member is safe to call concurrently (one mutex; calls are short).
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>

#include "sluice/core/shared_rate.h"

namespace sluice {

class MemorySharedRate final : public SharedRateStore {
 public:
  // `clock` must outlive the store.
  explicit MemorySharedRate(const Clock& clock) : clock_(clock) {}

  [[nodiscard]] StatusOr<SharedRateReply> apply(std::string_view key,
                                                const SharedRateRequest& request,
                                                Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos /*timeout*/) noexcept override { return {}; }
  // Forgets the origin of lose_state(): no loss known.
  [[nodiscard]] Status adopt(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "memory"; }

  // Forgets every key's state, as a crash would; now becomes the origin.
  void lose_state();
  // Keys held now.
  [[nodiscard]] std::size_t keys() const;

 private:
  struct Entry {
    RateRule rule;  // its strategy and period (the sweep's)
    SharedRateState state;
  };
  void sweep(Nanos now);  // requires mu_

  const Clock& clock_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> keys_;
  std::size_t sweep_at_ = 1024;  // the map's size that triggers the next sweep
  Nanos origin_ = kNoLoss;
};

}  // namespace sluice
