// timed_coordinator.h: coordinator call latency and errors, and the decorators of a
// ConcurrencyCoordinator and a RateCoordinator that record them.
//
// What it is: CoordinatorCallStats is one named coordinator's latency histogram and error count
// (every interface a coordinator serves records into the same one, so an operator sees one
// figure per coordinator). TimedConcurrencyCoordinator, TimedRateCoordinator, TimedRegionalEscrow
// and TimedSharedRate forward every call to the coordinator they wrap and record how long it took
// on the given clock, and whether it failed. They change no result: the conformance of the
// wrapped coordinator is theirs.
//
// Thread-safety: every member is safe to call concurrently; the stats are relaxed atomics (a
// scrape may see one call's bucket before its sum; each counter is exact on its own).
#pragma once

#include <prometheus/metric_family.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/coordinator.h"
#include "sluice/core/rate_coordinator.h"
#include "sluice/core/regional_escrow.h"
#include "sluice/core/shared_rate.h"

namespace sluice {

class CoordinatorCallStats {
 public:
  // Bucket bounds of the latency histogram, in seconds.
  static constexpr std::array<double, 12> kBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01,   0.025,   0.05,   0.1,   0.25,   1.0};

  void record(Nanos took, bool ok) noexcept;
  // sluice_coordinator_call_seconds (histogram) and sluice_coordinator_errors_total, labelled
  // backend=`backend`.
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect(const std::string& backend) const;

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0}, errors_{0};
};

class TimedConcurrencyCoordinator final : public ConcurrencyCoordinator {
 public:
  // `clock` must outlive this; `stats` may be shared with the coordinator's other interfaces.
  TimedConcurrencyCoordinator(std::unique_ptr<ConcurrencyCoordinator> inner, const Clock& clock,
                              std::shared_ptr<CoordinatorCallStats> stats)
      : inner_(std::move(inner)), clock_(clock), stats_(std::move(stats)) {}

  [[nodiscard]] StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                          Nanos timeout) noexcept override;
  [[nodiscard]] Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
                             Nanos timeout) noexcept override;
  [[nodiscard]] const CoordinatorConfig& config() const noexcept override {
    return inner_->config();
  }
  [[nodiscard]] std::string_view backend() const noexcept override { return inner_->backend(); }
  [[nodiscard]] const CoordinatorCallStats& stats() const noexcept { return *stats_; }

 private:
  std::unique_ptr<ConcurrencyCoordinator> inner_;
  const Clock& clock_;
  std::shared_ptr<CoordinatorCallStats> stats_;
};

class TimedRateCoordinator final : public RateCoordinator {
 public:
  // `clock` must outlive this; `stats` may be shared with the coordinator's other interfaces.
  TimedRateCoordinator(std::unique_ptr<RateCoordinator> inner, const Clock& clock,
                       std::shared_ptr<CoordinatorCallStats> stats)
      : inner_(std::move(inner)), clock_(clock), stats_(std::move(stats)) {}

  [[nodiscard]] StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                                           Nanos timeout) noexcept override;
  // One observation for the whole call (a pipelined batch is one round trip); an error counted
  // when any lease of it failed.
  [[nodiscard]] std::vector<StatusOr<LeaseReply>> lease_many(std::span<const LeaseCall> calls,
                                                             Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                                  Nanos window_start, std::uint64_t relinquished,
                                                  Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return inner_->backend(); }

 private:
  std::unique_ptr<RateCoordinator> inner_;
  const Clock& clock_;
  std::shared_ptr<CoordinatorCallStats> stats_;
};

class TimedRegionalEscrow final : public RegionalEscrow {
 public:
  // `clock` must outlive this; `stats` may be shared with the coordinator's other interfaces.
  TimedRegionalEscrow(std::shared_ptr<RegionalEscrow> inner, const Clock& clock,
                      std::shared_ptr<CoordinatorCallStats> stats)
      : inner_(std::move(inner)), clock_(clock), stats_(std::move(stats)) {}

  [[nodiscard]] StatusOr<PoolReply> take(std::string_view key, std::uint64_t want,
                                         Nanos refill_hold, bool past_expiry,
                                         Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<PoolReply> refill(std::string_view key, Nanos window_start,
                                           std::uint64_t units, Nanos expires_at,
                                           Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<PoolReply> release(std::string_view key, Nanos window_start,
                                            std::uint64_t units, Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return inner_->backend(); }

 private:
  std::shared_ptr<RegionalEscrow> inner_;
  const Clock& clock_;
  std::shared_ptr<CoordinatorCallStats> stats_;
};

class TimedSharedRate final : public SharedRateStore {
 public:
  // `clock` must outlive this; `stats` may be shared with the coordinator's other interfaces.
  TimedSharedRate(std::unique_ptr<SharedRateStore> inner, const Clock& clock,
                  std::shared_ptr<CoordinatorCallStats> stats)
      : inner_(std::move(inner)), clock_(clock), stats_(std::move(stats)) {}

  [[nodiscard]] StatusOr<SharedRateReply> apply(std::string_view key,
                                                const SharedRateRequest& request,
                                                Nanos timeout) noexcept override;
  // One observation for the whole call (a pipelined batch is one round trip); an error counted
  // when any call of it failed.
  [[nodiscard]] std::vector<StatusOr<SharedRateReply>> apply_many(
      std::span<const SharedRateCall> calls, Nanos timeout) noexcept override;
  [[nodiscard]] std::string rule_error(const RateRule& rule) const override {
    return inner_->rule_error(rule);
  }
  [[nodiscard]] Status adopt(Nanos timeout) noexcept override { return inner_->adopt(timeout); }
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return inner_->backend(); }

 private:
  std::unique_ptr<SharedRateStore> inner_;
  const Clock& clock_;
  std::shared_ptr<CoordinatorCallStats> stats_;
};

}  // namespace sluice
