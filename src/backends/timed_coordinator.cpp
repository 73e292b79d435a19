#include "sluice/backends/timed_coordinator.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

namespace sluice {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

namespace {

// Runs `call` (a forwarded coordinator call), recording into `stats` how long it took on
// `clock` and whether `ok` says it succeeded (by default: its result's ok()).
template <class Call, class Ok>
auto timed(const Clock& clock, CoordinatorCallStats& stats, Call call, Ok ok) {
  const Nanos t0 = clock.now();
  auto result = call();
  stats.record(clock.now() - t0, ok(result));
  return result;
}
template <class Call>
auto timed(const Clock& clock, CoordinatorCallStats& stats, Call call) {
  return timed(clock, stats, std::move(call), [](const auto& r) { return r.ok(); });
}

}  // namespace

void CoordinatorCallStats::record(Nanos took, bool ok) noexcept {
  const double s = std::chrono::duration<double>(took).count();
  std::size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(std::max<std::int64_t>(0, took.count())),
                    std::memory_order_relaxed);
  if (!ok) errors_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<MetricFamily> CoordinatorCallStats::collect(const std::string& backend) const {
  MetricFamily h{
      "sluice_coordinator_call_seconds",
      "Latency of coordinator calls (heartbeats, leaves, leases, reconciles, regional pool calls)",
      MetricType::Histogram,
      {}};
  ClientMetric m;
  m.label = {{"backend", backend}};
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    m.histogram.bucket.push_back(ClientMetric::Bucket{cumulative, kBounds[i]});
  }
  cumulative += buckets_[kBounds.size()].load(std::memory_order_relaxed);
  m.histogram.bucket.push_back(
      ClientMetric::Bucket{cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
  h.metric.push_back(std::move(m));
  ClientMetric e;
  e.label = {{"backend", backend}};
  e.counter.value = static_cast<double>(errors_.load(std::memory_order_relaxed));
  std::vector<MetricFamily> out;
  out.push_back(std::move(h));
  out.push_back(MetricFamily{"sluice_coordinator_errors_total",
                             "Coordinator calls that failed",
                             MetricType::Counter,
                             {std::move(e)}});
  return out;
}

StatusOr<Grant> TimedConcurrencyCoordinator::heartbeat(std::string_view key,
                                                       const NodeReport& report,
                                                       Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->heartbeat(key, report, timeout); });
}

Status TimedConcurrencyCoordinator::leave(std::string_view key, std::string_view node_id,
                                          std::uint64_t instance, Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->leave(key, node_id, instance, timeout); });
}

StatusOr<LeaseReply> TimedRateCoordinator::lease(std::string_view key, const LeaseRequest& request,
                                                 Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->lease(key, request, timeout); });
}

std::vector<StatusOr<LeaseReply>> TimedRateCoordinator::lease_many(std::span<const LeaseCall> calls,
                                                                   Nanos timeout) noexcept {
  return timed(
      clock_, *stats_, [&] { return inner_->lease_many(calls, timeout); },
      [&](const std::vector<StatusOr<LeaseReply>>& r) {
        return r.size() == calls.size() &&
               std::all_of(r.begin(), r.end(), [](const auto& x) { return x.ok(); });
      });
}

StatusOr<SharedRateReply> TimedSharedRate::apply(std::string_view key,
                                                 const SharedRateRequest& request,
                                                 Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->apply(key, request, timeout); });
}

std::vector<StatusOr<SharedRateReply>> TimedSharedRate::apply_many(
    std::span<const SharedRateCall> calls, Nanos timeout) noexcept {
  return timed(
      clock_, *stats_, [&] { return inner_->apply_many(calls, timeout); },
      [&](const std::vector<StatusOr<SharedRateReply>>& r) {
        return r.size() == calls.size() &&
               std::all_of(r.begin(), r.end(), [](const auto& x) { return x.ok(); });
      });
}

Status TimedSharedRate::health(Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->health(timeout); });
}

StatusOr<std::uint64_t> TimedRateCoordinator::reconcile(std::string_view key,
                                                        std::string_view region, Nanos window_start,
                                                        std::uint64_t relinquished,
                                                        Nanos timeout) noexcept {
  return timed(clock_, *stats_,
               [&] { return inner_->reconcile(key, region, window_start, relinquished, timeout); });
}

Status TimedRateCoordinator::health(Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->health(timeout); });
}

StatusOr<PoolReply> TimedRegionalEscrow::take(std::string_view key, std::uint64_t want,
                                              Nanos refill_hold, bool past_expiry,
                                              Nanos timeout) noexcept {
  return timed(clock_, *stats_,
               [&] { return inner_->take(key, want, refill_hold, past_expiry, timeout); });
}

StatusOr<PoolReply> TimedRegionalEscrow::refill(std::string_view key, Nanos window_start,
                                                std::uint64_t units, Nanos expires_at,
                                                Nanos timeout) noexcept {
  return timed(clock_, *stats_,
               [&] { return inner_->refill(key, window_start, units, expires_at, timeout); });
}

StatusOr<PoolReply> TimedRegionalEscrow::release(std::string_view key, Nanos window_start,
                                                 std::uint64_t units, Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->release(key, window_start, units, timeout); });
}

Status TimedRegionalEscrow::health(Nanos timeout) noexcept {
  return timed(clock_, *stats_, [&] { return inner_->health(timeout); });
}

}  // namespace sluice
