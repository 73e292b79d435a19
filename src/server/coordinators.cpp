#include "server/coordinators.h"

#include <algorithm>
#include <map>

#include "sluice/backends/memory_coordinator.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/backends/postgres_coordinator.h"
#include "sluice/backends/postgres_rate_coordinator.h"
#include "sluice/backends/redis_coordinator.h"
#include "sluice/backends/redis_rate_coordinator.h"
#include "sluice/backends/redis_regional_escrow.h"
#include "sluice/backends/shared_rules.h"

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

// Federation's coordinator on the same server as the fleet's, apart from it: its own keys
// ("<fleet prefix>fed:", or "sluice:fed:" beside the default "sluice:fleet:") and tables
// ("<fleet prefix>_fed", or "sluice_fed").
RedisOptions rate_options(RedisOptions o) {
  const RedisOptions fleet_default;
  o.key_prefix = o.key_prefix == fleet_default.key_prefix
                     ? RedisRateCoordinator::default_options().key_prefix
                     : o.key_prefix + "fed:";
  return o;
}
PostgresOptions rate_options(PostgresOptions o) {
  const PostgresOptions fleet_default;
  o.table_prefix = o.table_prefix == fleet_default.table_prefix
                       ? PostgresRateCoordinator::default_options().table_prefix
                       : o.table_prefix + "_fed";
  return o;
}

// The rate interface of a Redis or PostgreSQL coordinator, connected when a federated policy
// first asks for it: refused outright for a configuration it cannot run on (a Redis that may
// evict), opened to connect on its first call when the server cannot be reached now.
template <typename C, typename Options>
void offer_rate(NamedCoordinator& named, Options options, const Clock& clock) {
  auto stats = named.stats;
  named.offer_lazy<RateCoordinator>([options = rate_options(std::move(options)), &clock,
                                     stats]() -> StatusOr<std::shared_ptr<void>> {
    auto c = C::connect(options);
    if (!c.ok()) {
      const StatusCode code = c.status().code();
      if (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded)
        return c.status();
      c = C::open(options);
      if (!c.ok()) return c.status();
    }
    return std::shared_ptr<void>(std::make_shared<TimedRateCoordinator>(
        std::unique_ptr<RateCoordinator>(std::move(c.value())), clock, stats));
  });
}

// The regional pool on a Redis coordinator: its own keys ("<fleet prefix>pool:", or
// "sluice:pool:" beside the default "sluice:fleet:").
RedisOptions pool_options(RedisOptions o) {
  const RedisOptions fleet_default;
  o.key_prefix = o.key_prefix == fleet_default.key_prefix
                     ? RedisRegionalEscrow::default_options().key_prefix
                     : o.key_prefix + "pool:";
  return o;
}

// The regional pool, connected when a federated policy first names the coordinator as its
// regional_escrow, opened to connect on its first call when the server cannot be reached now.
void offer_pool(NamedCoordinator& named, RedisOptions options, const Clock& clock) {
  options = pool_options(std::move(options));
  auto stats = named.stats;
  named.offer_lazy<RegionalEscrow>([options, &clock, stats]() -> StatusOr<std::shared_ptr<void>> {
    auto p = RedisRegionalEscrow::connect(options);
    if (!p.ok()) {
      const StatusCode code = p.status().code();
      if (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded)
        return p.status();
      p = RedisRegionalEscrow::open(options);
      if (!p.ok()) return p.status();
    }
    return std::shared_ptr<void>(
        std::shared_ptr<RegionalEscrow>(std::make_shared<TimedRegionalEscrow>(
            std::shared_ptr<RegionalEscrow>(std::move(p.value())), clock, stats)));
  });
}

// The shared rules' keys and table beside the fleet's: "<fleet prefix>rules:", or
// "sluice:rules:" beside the default "sluice:fleet:"; the table "<fleet prefix>_rules", or
// "sluice_rules" beside the default "sluice_fleet".
RedisOptions rules_options(RedisOptions o) {
  const RedisOptions fleet_default;
  o.key_prefix = o.key_prefix == fleet_default.key_prefix ? redis_shared_rules_options().key_prefix
                                                          : o.key_prefix + "rules:";
  return o;
}
PostgresOptions rules_options(PostgresOptions o) {
  const PostgresOptions fleet_default;
  o.table_prefix = o.table_prefix == fleet_default.table_prefix
                       ? postgres_shared_rules_options().table_prefix
                       : o.table_prefix + "_rules";
  return o;
}

// The shared rules, made when a throttler first names the coordinator (they connect on their
// first call, so a server that cannot be reached now is no error).
template <typename Options>
void offer_rules(NamedCoordinator& named, Options options,
                 StatusOr<std::unique_ptr<SharedRules>> (*make)(Options)) {
  named.offer_lazy<SharedRules>(
      [options = rules_options(std::move(options)), make]() -> StatusOr<std::shared_ptr<void>> {
        auto r = make(options);
        if (!r.ok()) return r.status();
        return std::shared_ptr<void>(std::shared_ptr<SharedRules>(std::move(r.value())));
      });
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
  switch (spec.kind) {
    case CoordinatorSpec::Kind::kMemory:
      named->offer<RateCoordinator>(std::make_shared<TimedRateCoordinator>(
          std::make_unique<MemoryRateCoordinator>(clock), clock, named->stats));
      named->offer<RegionalEscrow>(std::make_shared<TimedRegionalEscrow>(
          std::make_shared<MemoryRegionalEscrow>(clock), clock, named->stats));
      named->offer<SharedRules>(std::shared_ptr<SharedRules>(memory_shared_rules(clock)));
      break;
    case CoordinatorSpec::Kind::kRedis:
      offer_rate<RedisRateCoordinator>(*named, spec.redis, clock);
      offer_pool(*named, spec.redis, clock);
      offer_rules<RedisOptions>(*named, spec.redis, &redis_shared_rules);
      break;
    case CoordinatorSpec::Kind::kPostgres:
      offer_rate<PostgresRateCoordinator>(*named, spec.postgres, clock);
      offer_rules<PostgresOptions>(*named, spec.postgres, &postgres_shared_rules);
      break;
  }
  return named;
}

std::vector<std::string> coordinator_problems(const CoordinatorSpec& spec,
                                              const std::vector<CoordinatorRole>& roles) {
  std::vector<std::string> out;
  const auto check = [&](const Status& s, const std::string& what) {
    if (!s.ok()) out.push_back(what + s.message());
  };
  const auto has = [&](CoordinatorRole r) {
    return std::find(roles.begin(), roles.end(), r) != roles.end();
  };
  // open() checks the options and connects to nothing; the interface it returns is dropped.
  switch (spec.kind) {
    case CoordinatorSpec::Kind::kMemory:
      break;
    case CoordinatorSpec::Kind::kRedis:
      check(RedisCoordinator::open(spec.redis, spec.rules).status(), "");
      if (has(CoordinatorRole::kRateBudget))
        check(RedisRateCoordinator::open(rate_options(spec.redis)).status(), "federation's keys: ");
      if (has(CoordinatorRole::kRegionalEscrow))
        check(RedisRegionalEscrow::open(pool_options(spec.redis)).status(),
              "the regional pool's keys: ");
      if (has(CoordinatorRole::kSharedRules))
        check(redis_shared_rules(rules_options(spec.redis)).status(), "the shared rules' keys: ");
      break;
    case CoordinatorSpec::Kind::kPostgres:
      check(PostgresCoordinator::open(spec.postgres, spec.rules).status(), "");
      if (has(CoordinatorRole::kRateBudget))
        check(PostgresRateCoordinator::open(rate_options(spec.postgres)).status(),
              "federation's tables (prefix " + rate_options(spec.postgres).table_prefix +
                  ", from table_prefix): ");
      if (has(CoordinatorRole::kSharedRules))
        check(postgres_shared_rules(rules_options(spec.postgres)).status(),
              "the shared rules' table (" + rules_options(spec.postgres).table_prefix +
                  ", from table_prefix): ");
      break;
  }
  return out;
}

std::vector<ConfigError> check_before_connecting(const SluiceConfig& config) {
  std::map<std::string, std::vector<CoordinatorRole>> used;  // as the engine builds them
  for (const auto& [name, policy] : config.policies) {
    for (const std::string& c : policy.coordinators)
      used[c].push_back(CoordinatorRole::kConcurrency);
    for (const CoordinatorUse& u : policy.uses) used[u.coordinator].push_back(u.role);
  }
  std::vector<ConfigError> out;
  for (const auto& [name, roles] : used) {
    const auto spec = config.coordinators.find(name);
    if (spec == config.coordinators.end()) continue;  // the loader's error
    for (std::string& problem : coordinator_problems(spec->second, roles))
      out.push_back(ConfigError{.path = "coordinators." + name, .message = std::move(problem)});
  }
  return out;
}

}  // namespace sluice::server
