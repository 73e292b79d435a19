#include "server/coordinators.h"

#include "sluice/memory_coordinator.h"
#include "sluice/memory_rate_coordinator.h"
#include "sluice/postgres_coordinator.h"
#include "sluice/redis_coordinator.h"

namespace sluice::server {

namespace {

// Connects with `connect`; when the server cannot be reached now, opens with `open` instead (a
// coordinator that connects on its first call) and says so in `warning`.
template <typename C, typename Options>
StatusOr<std::unique_ptr<ConcurrencyCoordinator>> connect_or_open(const std::string& name,
                                                                  const Options& options,
                                                                  const CoordinatorConfig& rules,
                                                                  std::string& warning) {
  auto c = C::connect(options, rules);
  if (c.ok()) return std::unique_ptr<ConcurrencyCoordinator>(std::move(c.value()));
  const StatusCode code = c.status().code();
  if (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded)
    return Status(code, "coordinator " + name + ": " + c.status().message());
  auto opened = C::open(options, rules);
  if (!opened.ok())
    return Status(opened.status().code(), "coordinator " + name + ": " + opened.status().message());
  warning = "coordinator " + name + " is not reachable now (" + c.status().message() +
            "); its fleet policies start in their outage mode and it is tried again on every "
            "heartbeat";
  return std::unique_ptr<ConcurrencyCoordinator>(std::move(opened.value()));
}

}  // namespace

StatusOr<std::shared_ptr<NamedCoordinator>> make_coordinator(const std::string& name,
                                                             const CoordinatorSpec& spec,
                                                             const Clock& clock,
                                                             std::string& warning) {
  StatusOr<std::unique_ptr<ConcurrencyCoordinator>> inner =
      std::unique_ptr<ConcurrencyCoordinator>();
  switch (spec.kind) {
    case CoordinatorSpec::Kind::kMemory:
      inner = std::unique_ptr<ConcurrencyCoordinator>(
          std::make_unique<MemoryCoordinator>(clock, spec.rules));
      break;
    case CoordinatorSpec::Kind::kRedis:
      inner = connect_or_open<RedisCoordinator>(name, spec.redis, spec.rules, warning);
      break;
    case CoordinatorSpec::Kind::kPostgres:
      inner = connect_or_open<PostgresCoordinator>(name, spec.postgres, spec.rules, warning);
      break;
  }
  if (!inner.ok()) return inner.status();
  auto named = std::make_shared<NamedCoordinator>();
  named->fingerprint = spec.fingerprint;
  named->stats = std::make_shared<CoordinatorCallStats>();
  named->backend = std::string(inner.value()->backend());
  named->offer<ConcurrencyCoordinator>(
      std::make_shared<TimedConcurrencyCoordinator>(std::move(inner.value()), clock, named->stats));
  if (spec.kind == CoordinatorSpec::Kind::kMemory)
    named->offer<RateCoordinator>(std::make_shared<MemoryRateCoordinator>(clock));
  return named;
}

}  // namespace sluice::server
