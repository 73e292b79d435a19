// faulty_coordinator.h: a ConcurrencyCoordinator wrapper that injects failures, for tests of
// every backend and of the guards' outage paths.
//
// What it is: forwards to an inner coordinator unless a fault is set: kUnavailable fails at
// once; kHang simulates a partition: the call "takes" its whole timeout (it advances the given
// ManualClock by it, when there is one) and fails with kDeadlineExceeded. Records the timeout
// of the last call so tests can check that callers bound their calls.
//
// Thread-safety: as the inner coordinator; the fault settings are atomics.
#pragma once

#include <atomic>

#include "sluice/core/coordinator.h"

namespace sluice::testing {

class FaultyCoordinator final : public ConcurrencyCoordinator {
 public:
  enum class Fault : std::uint8_t { kNone, kUnavailable, kHang };

  explicit FaultyCoordinator(ConcurrencyCoordinator& inner, ManualClock* clock = nullptr)
      : inner_(inner), clock_(clock) {}

  void set_fault(Fault f) noexcept { fault_.store(f); }
  [[nodiscard]] Nanos last_timeout() const noexcept { return Nanos{last_timeout_ns_.load()}; }
  [[nodiscard]] int calls() const noexcept { return calls_.load(); }

  [[nodiscard]] StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                          Nanos timeout) noexcept override {
    if (Status s = inject(timeout); !s.ok()) return s;
    return inner_.heartbeat(key, report, timeout);
  }
  [[nodiscard]] Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
                             Nanos timeout) noexcept override {
    if (Status s = inject(timeout); !s.ok()) return s;
    return inner_.leave(key, node_id, instance, timeout);
  }
  [[nodiscard]] const CoordinatorConfig& config() const noexcept override {
    return inner_.config();
  }
  [[nodiscard]] std::string_view backend() const noexcept override { return inner_.backend(); }

 private:
  Status inject(Nanos timeout) noexcept {
    calls_.fetch_add(1);
    last_timeout_ns_.store(timeout.count());
    switch (fault_.load()) {
      case Fault::kNone:
        return {};
      case Fault::kUnavailable:
        return Status(StatusCode::kUnavailable, "injected: coordinator unreachable");
      case Fault::kHang:
        if (clock_ != nullptr) clock_->advance(timeout);
        return Status(StatusCode::kDeadlineExceeded, "injected: no answer within the timeout");
    }
    return {};
  }

  ConcurrencyCoordinator& inner_;
  ManualClock* clock_;
  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<Nanos::rep> last_timeout_ns_{0};
  std::atomic<int> calls_{0};
};

}  // namespace sluice::testing
