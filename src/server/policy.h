// policy.h: one live policy of the server (its kind's engine and its counters), and the
// coordinators fleet policies share.
//
// What it is: Policy wraps what a PolicySpec builds: a RateLimiter (rate), an AdaptiveGuard
// (adaptive), a FleetGuard driven by its own runner thread (fleet) or a Gateway (concurrency),
// with the counters the metrics show. NamedCoordinator is one coordinator of the config, its
// calls timed (the coordinator latency metric).
//
// Invariants: retire() ends a fleet policy's membership (its guard closes: it leaves the fleet
// and refuses from then on); a local policy a reload replaced keeps serving the calls that
// raced the swap, as if they had come just before it. Permits already held stay valid until
// released. A Policy outlives every lease on it (leases hold it).
//
// Thread-safety: every member is safe to call concurrently, except create().
#pragma once

#include <prometheus/metric_family.h>

#include <nlohmann/json.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/calls.h"
#include "server/permit.h"
#include "sluice/adaptive_guard.h"
#include "sluice/config.h"
#include "sluice/coordinator.h"
#include "sluice/fleet_guard.h"
#include "sluice/gateway.h"
#include "sluice/rate_limiter.h"
#include "sluice/timed_coordinator.h"

namespace sluice::server {

// Prometheus families built at scrape time. A family of one series:
[[nodiscard]] prometheus::MetricFamily one(
    const std::string& name, const std::string& help, prometheus::MetricType type, double value,
    std::vector<prometheus::ClientMetric::Label> labels = {});
// A counter family with one series per value of `label`.
[[nodiscard]] prometheus::MetricFamily by_label(
    const std::string& name, const std::string& help, const std::string& label,
    std::initializer_list<std::pair<const char*, std::uint64_t>> series);

// One coordinator of the config, by name: every interface it serves is timed into one stats.
struct NamedCoordinator {
  std::string fingerprint;  // the spec's: equal means unchanged
  std::shared_ptr<CoordinatorCallStats> stats;
  std::shared_ptr<ConcurrencyCoordinator> fleet;  // a TimedConcurrencyCoordinator

  // sluice_coordinator_call_seconds and sluice_coordinator_errors_total.
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect() const {
    return stats->collect(std::string(fleet->backend()));
  }
};

// Connects the coordinator `spec` describes. An error names it. A server that cannot be reached
// now (unavailable, or no answer in time) is not an error: the coordinator connects on its first
// call, the fleet policies on it start in their outage mode (and /readyz says not ready), and
// `warning` says so. Anything else (bad options, a password Redis refuses) is; libpq reports a
// login PostgreSQL refuses as unavailable, so that one is a warning.
[[nodiscard]] StatusOr<std::shared_ptr<NamedCoordinator>> make_coordinator(
    const std::string& name, const CoordinatorSpec& spec, const Clock& clock, std::string& warning);

enum class PolicyKind : std::uint8_t { kRate, kAdaptive, kFleet, kConcurrency };

class Policy : public std::enable_shared_from_this<Policy> {
 public:
  // `coordinator`: the fleet policy's (null for other kinds).
  [[nodiscard]] static StatusOr<std::shared_ptr<Policy>> create(
      const std::string& name, const PolicySpec& spec, std::string identity,
      std::shared_ptr<ConcurrencyCoordinator> coordinator, const std::string& node_id,
      const Clock& clock);
  ~Policy();
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] PolicyKind kind() const noexcept { return kind_; }
  [[nodiscard]] std::string_view kind_name() const noexcept;
  // The spec's fingerprint (plus its coordinator's): equal means the policy is unchanged.
  [[nodiscard]] const std::string& identity() const noexcept { return identity_; }
  [[nodiscard]] const std::string& rate_name() const noexcept { return spec_.rate; }

  // Rate kind.
  [[nodiscard]] RateDecision check(std::string_view key, std::uint64_t hits, Nanos now);
  [[nodiscard]] RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const;
  void refund(std::string_view key, std::uint64_t hits, Nanos now);
  [[nodiscard]] const RateRule& rule() const noexcept { return limiter_->rule(); }
  // The 429 for `d`, a denied check of `key` (its views point into this policy).
  [[nodiscard]] Rejection rate_refusal(std::string_view key, const RateDecision& d) const;

  // Concurrency kinds: a permit for a lease (it counts the lease on this policy until it is
  // finished, and keeps the policy alive), or nullopt with `refusal` filled in. `target`:
  // concurrency kind only (resolved by gateway()).
  [[nodiscard]] std::optional<LeasePermit> acquire(const Target& target, Rejection& refusal);
  [[nodiscard]] Gateway& gateway() noexcept { return *gateway_; }
  void count_rate_refusal() noexcept { rate_refused_.fetch_add(1, std::memory_order_relaxed); }
  void count_release() noexcept { released_.fetch_add(1, std::memory_order_relaxed); }
  // A lease on this policy began / ended (released, expired or cleared).
  void lease_began() noexcept { leases_.fetch_add(1, std::memory_order_relaxed); }
  void lease_ended() noexcept { leases_.fetch_sub(1, std::memory_order_relaxed); }

  // The policy is no longer served: a fleet policy closes its guard (it leaves its fleet and
  // refuses from then on). Idempotent.
  void retire() noexcept;

  [[nodiscard]] PolicyInfo info() const;
  // The JSON state (what info().state_json holds); fills `info`'s other fields when non-null.
  [[nodiscard]] nlohmann::json state(PolicyInfo* info = nullptr) const;
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect() const;
  // Empty when ready; else why not (a fleet policy that has not reached its coordinator).
  [[nodiscard]] std::string not_ready() const;

 private:
  Policy(std::string name, PolicyKind kind, PolicySpec spec, std::string identity)
      : name_(std::move(name)),
        kind_(kind),
        spec_(std::move(spec)),
        identity_(std::move(identity)) {}

  const std::string name_;
  const PolicyKind kind_;
  const PolicySpec spec_;
  const std::string identity_;

  std::unique_ptr<RateLimiter> limiter_;                 // rate
  std::unique_ptr<AdaptiveGuard> adaptive_;              // adaptive
  std::shared_ptr<ConcurrencyCoordinator> coordinator_;  // fleet (declared before its users)
  std::unique_ptr<FleetGuard> fleet_;                    // fleet
  std::unique_ptr<FleetGuardRunner> runner_;             // fleet
  std::unique_ptr<Gateway> gateway_;                     // concurrency

  std::atomic<bool> retired_{false};
  std::atomic<std::uint64_t> allowed_{0}, denied_{0};  // rate checks
  std::atomic<std::uint64_t> admitted_{0}, limit_refused_{0}, rate_refused_{0}, released_{0};
  std::atomic<std::uint64_t> leases_{0};
};

}  // namespace sluice::server
