// connect.h (private): what the Redis and PostgreSQL coordinator backends share when they
// connect: the fleet's interface connected or, with its server away, opened to connect on its
// first call; federation's rate interface and the shared rules offered to connect when a policy
// first asks for them.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "server/coordinators.h"
#include "sluice/backends/shared_rules.h"
#include "sluice/backends/timed_coordinator.h"
#include "sluice/core/coordinator.h"
#include "sluice/core/rate_coordinator.h"
#include "sluice/core/shared_rate.h"
#include "sluice/core/status.h"

namespace sluice::server::coordinator_detail {

// Whether a failure to connect is the server being away now (then the interface is opened to
// connect on its first call) rather than a refusal.
inline bool away(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

// C::connect(options); when the server cannot be reached now, C::open(options) instead (an
// interface that connects on its first call).
template <typename C, typename Options>
auto connect_or_open(const Options& options) -> decltype(C::connect(options)) {
  auto c = C::connect(options);
  if (c.ok() || !away(c.status())) return c;
  return C::open(options);
}

// Connects with C::connect; when the server cannot be reached now, opens with C::open instead (a
// coordinator that connects on its first call) and says so in `warning`.
template <typename C, typename Options>
StatusOr<std::unique_ptr<ConcurrencyCoordinator>> connect_or_open(const std::string& name,
                                                                  const Options& options,
                                                                  const CoordinatorConfig& rules,
                                                                  std::string& warning) {
  auto c = C::connect(options, rules);
  if (c.ok()) return std::unique_ptr<ConcurrencyCoordinator>(std::move(c.value()));
  if (!away(c.status()))
    return Status(c.status().code(), "coordinator " + name + ": " + c.status().message());
  auto opened = C::open(options, rules);
  if (!opened.ok())
    return Status(opened.status().code(), "coordinator " + name + ": " + opened.status().message());
  warning = "coordinator " + name + " is not reachable now (" + c.status().message() +
            "); its fleet policies start in their outage mode and it is tried again on every "
            "heartbeat";
  return std::unique_ptr<ConcurrencyCoordinator>(std::move(opened.value()));
}

// The rate interface (C: RedisRateCoordinator, PostgresRateCoordinator) with `options`,
// connected when a federated policy first asks for it: refused outright for a configuration it
// cannot run on (a Redis that may evict), opened to connect on its first call when the server
// cannot be reached now.
template <typename C, typename Options>
void offer_rate(NamedCoordinator& named, Options options, const Clock& clock) {
  auto stats = named.stats;
  named.offer_lazy<RateCoordinator>(
      [options = std::move(options), &clock, stats]() -> StatusOr<std::shared_ptr<void>> {
        auto c = connect_or_open<C>(options);
        if (!c.ok()) return c.status();
        return std::shared_ptr<void>(std::make_shared<TimedRateCoordinator>(
            std::unique_ptr<RateCoordinator>(std::move(c.value())), clock, stats));
      });
}

// Shared rate limits' store (C: RedisSharedRate, PostgresSharedRate) with `options`, connected
// when a rate policy first names the coordinator, opened to connect on its first call when the
// server cannot be reached now.
template <typename C, typename Options>
void offer_shared_rate(NamedCoordinator& named, Options options, const Clock& clock) {
  auto stats = named.stats;
  named.offer_lazy<SharedRateStore>(
      [options = std::move(options), &clock, stats]() -> StatusOr<std::shared_ptr<void>> {
        auto s = connect_or_open<C>(options);
        if (!s.ok()) return s.status();
        return std::shared_ptr<void>(std::shared_ptr<SharedRateStore>(
            std::make_shared<TimedSharedRate>(std::move(s.value()), clock, stats)));
      });
}

// The shared rules with `options`, made when a throttler first names the coordinator (they
// connect on their first call, so a server that cannot be reached now is no error).
template <typename Options>
void offer_rules(NamedCoordinator& named, Options options,
                 StatusOr<std::unique_ptr<SharedRules>> (*make)(Options)) {
  named.offer_lazy<SharedRules>(
      [options = std::move(options), make]() -> StatusOr<std::shared_ptr<void>> {
        auto r = make(options);
        if (!r.ok()) return r.status();
        return std::shared_ptr<void>(std::shared_ptr<SharedRules>(std::move(r.value())));
      });
}

// Whether `roles` holds `role`.
inline bool has(const std::vector<CoordinatorRole>& roles, CoordinatorRole role) {
  for (CoordinatorRole r : roles)
    if (r == role) return true;
  return false;
}

}  // namespace sluice::server::coordinator_detail
