#include "sluice/timed_coordinator.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace sluice {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

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
  const Nanos t0 = clock_.now();
  StatusOr<Grant> g = inner_->heartbeat(key, report, timeout);
  stats_->record(clock_.now() - t0, g.ok());
  return g;
}

Status TimedConcurrencyCoordinator::leave(std::string_view key, std::string_view node_id,
                                          Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  Status s = inner_->leave(key, node_id, timeout);
  stats_->record(clock_.now() - t0, s.ok());
  return s;
}

StatusOr<LeaseReply> TimedRateCoordinator::lease(std::string_view key, const LeaseRequest& request,
                                                 Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  StatusOr<LeaseReply> r = inner_->lease(key, request, timeout);
  stats_->record(clock_.now() - t0, r.ok());
  return r;
}

std::vector<StatusOr<LeaseReply>> TimedRateCoordinator::lease_many(std::span<const LeaseCall> calls,
                                                                   Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  std::vector<StatusOr<LeaseReply>> r = inner_->lease_many(calls, timeout);
  const bool ok = r.size() == calls.size() &&
                  std::all_of(r.begin(), r.end(), [](const auto& x) { return x.ok(); });
  stats_->record(clock_.now() - t0, ok);
  return r;
}

StatusOr<std::uint64_t> TimedRateCoordinator::reconcile(std::string_view key,
                                                        std::string_view region, Nanos window_start,
                                                        std::uint64_t relinquished,
                                                        Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  StatusOr<std::uint64_t> r = inner_->reconcile(key, region, window_start, relinquished, timeout);
  stats_->record(clock_.now() - t0, r.ok());
  return r;
}

Status TimedRateCoordinator::health(Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  Status s = inner_->health(timeout);
  stats_->record(clock_.now() - t0, s.ok());
  return s;
}

StatusOr<PoolReply> TimedRegionalEscrow::take(std::string_view key, std::uint64_t want,
                                              Nanos refill_hold, bool past_expiry,
                                              Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  StatusOr<PoolReply> r = inner_->take(key, want, refill_hold, past_expiry, timeout);
  stats_->record(clock_.now() - t0, r.ok());
  return r;
}

StatusOr<PoolReply> TimedRegionalEscrow::refill(std::string_view key, Nanos window_start,
                                                std::uint64_t units, Nanos expires_at,
                                                Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  StatusOr<PoolReply> r = inner_->refill(key, window_start, units, expires_at, timeout);
  stats_->record(clock_.now() - t0, r.ok());
  return r;
}

StatusOr<PoolReply> TimedRegionalEscrow::release(std::string_view key, Nanos window_start,
                                                 std::uint64_t units, Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  StatusOr<PoolReply> r = inner_->release(key, window_start, units, timeout);
  stats_->record(clock_.now() - t0, r.ok());
  return r;
}

Status TimedRegionalEscrow::health(Nanos timeout) noexcept {
  const Nanos t0 = clock_.now();
  Status s = inner_->health(timeout);
  stats_->record(clock_.now() - t0, s.ok());
  return s;
}

}  // namespace sluice
