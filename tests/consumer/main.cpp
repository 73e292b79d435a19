// Uses the installed headers and library the way a user's program would; exits non-zero if
// the semaphore, the gateway, the fleet guard or the coordinators do not behave.
#include <sluice/backends/memory_coordinator.h>
#include <sluice/backends/postgres_coordinator.h>
#include <sluice/backends/redis_coordinator.h>
#include <sluice/config/config.h>
#include <sluice/core/fixed_limit.h>
#include <sluice/fleet/fleet_guard.h>
#include <sluice/local/gateway.h>
#include <sluice/local/gateway_metrics.h>
#include <sluice/local/semaphore.h>

#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

// A policy body and the one kind the loader is given: `kind: rate` with a `limit`.
struct Limit final : sluice::PolicyBody {
  std::uint64_t limit = 0;
};

class OneKind final : public sluice::PolicyKinds {
 public:
  OneKind() {
    kind_.name = "rate";
    kind_.rate_family = true;
    kind_.parse = [](const std::string&, sluice::ConfigSection& s, sluice::PolicySpec&) {
      s.keys({"kind", "limit"});
      auto body = std::make_shared<Limit>();
      if (auto v = s.uint("limit", 1, 1000, true)) body->limit = *v;
      return std::shared_ptr<const sluice::PolicyBody>(body);
    };
  }
  const sluice::PolicyKindParser* parser(std::string_view kind) const override {
    return kind == kind_.name ? &kind_ : nullptr;
  }
  std::vector<std::string> kind_names() const override { return {kind_.name}; }
  // One coordinator backend: `kind: memory`, no settings of its own.
  const sluice::CoordinatorBackendParser* coordinator_backend(
      std::string_view kind) const override {
    return kind == memory_.name ? &memory_ : nullptr;
  }
  std::vector<std::string> coordinator_backend_names() const override { return {memory_.name}; }

 private:
  sluice::PolicyKindParser kind_;
  sluice::CoordinatorBackendParser memory_{.name = "memory",
                                           .roles = {sluice::CoordinatorRole::kConcurrency}};
};

int main() {
  sluice::Semaphore sem(1);
  auto first = sem.try_acquire();
  auto second = sem.try_acquire();
  if (!first || second || sem.in_flight() != 1) return 1;
  first->release();
  if (sem.in_flight() != 0) return 2;

  sluice::GatewayConfig config;
  config.tenants = {{"acme", std::nullopt, std::nullopt}};
  sluice::UpstreamConfig upstream;
  upstream.id = "api";
  upstream.host = "api.example.com";
  upstream.owner = "acme";
  upstream.concurrency_limit = sluice::ConcurrencyLimit{};
  upstream.concurrency_limit->max_concurrent = 1;
  config.upstreams = {upstream};
  sluice::GatewayBuild built = sluice::Gateway::create(config);
  if (!built.gateway) return 3;
  sluice::Admission a = built.gateway->try_acquire("acme", "api");
  sluice::Admission b = built.gateway->try_acquire("acme", "api");
  if (!a || b || b.rejection() == nullptr) return 4;
  if (sluice::to_http_response(*b.rejection()).status != 503) return 5;
  if (sluice::GatewayMetrics(*built.gateway).Collect().empty()) return 6;

  sluice::ManualClock clock;
  sluice::MemoryCoordinator memory(clock);
  sluice::FleetGuardOptions fleet;
  fleet.node_id = "consumer";
  fleet.key = "backend";
  auto guard = sluice::FleetGuard::create(
      memory, std::make_unique<sluice::FixedLimit>(sluice::FixedLimitOptions{.limit = 2}), clock,
      fleet);
  if (!guard.ok() || !guard.value()->heartbeat().ok() || guard.value()->stats().share != 2)
    return 7;

  // Linked and callable; nothing listens on port 1, so both report the backend unreachable.
  sluice::RedisOptions redis;
  redis.port = 1;
  if (sluice::RedisCoordinator::connect(redis, {}).status().code() !=
      sluice::StatusCode::kUnavailable)
    return 8;
  sluice::PostgresOptions postgres;
  postgres.conninfo = "host=127.0.0.1 port=1 connect_timeout=2";
  if (sluice::PostgresCoordinator::connect(postgres, {}).status().code() !=
      sluice::StatusCode::kUnavailable)
    return 9;
  // The YAML loader, with a policy kind of this program's own.
  const sluice::ConfigLoad load =
      sluice::load_config("policies:\n  api:\n    kind: rate\n    limit: 5\n", OneKind());
  if (!load.config || load.config->policies.size() != 1 ||
      load.config->policies.at("api").as<Limit>()->limit != 5)
    return 10;
  std::puts(
      "consumer: sluice::sluice, sluice::config, sluice::redis and sluice::postgres found "
      "and working");
  return 0;
}
