// The federated policy kind through the server's engine (no transport), on the embedded memory
// coordinator: two regions' policies splitting one budget never admit more than its limit in a
// window and say why they refuse; a check waits for its key's lease (deferred) and is then
// answered; peek, CheckMany's all-or-nothing and a rate-chained admit work as for a rate
// policy; the config's errors name their field; an unchanged reload keeps the escrow. Over a
// real Redis: two engines (two regions) split one budget; a Redis that may evict keys is refused
// to a federated policy, naming the setting, and never to a fleet policy on it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const char* kTwoRegions = R"(
policies:
  eu:
    kind: federated
    budget: api
    region: eu-west
    limit: 40
    window: 10s
    batch: 8
  us:
    kind: federated
    budget: api
    region: us-east
    limit: 40
    window: 10s
    batch: 8
  jobs:
    kind: adaptive
    algorithm: fixed
    limit: 100
    rate: eu
)";

class FederatedPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::create(config_of(kTwoRegions), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  RateDecision check(std::string_view policy, std::string_view key, std::int64_t hits = 1) {
    auto r = engine_->check(CheckCall{policy, key, hits});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : RateDecision{};
  }
  nlohmann::json state(std::string_view policy) {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return {};
  }

  ManualClock clock_{seconds(1000)};
  std::unique_ptr<Engine> engine_;
};

TEST_F(FederatedPolicyTest, TwoRegionsSplitOneBudgetAndNeverExceedIt) {
  std::uint64_t allowed = 0;
  RateDecision last;
  for (int i = 0; i < 60; ++i) {
    for (const char* region : {"eu", "us"}) {
      last = check(region, "user:7");
      allowed += last.allowed;
    }
  }
  EXPECT_EQ(allowed, 40u);
  EXPECT_FALSE(last.allowed);
  EXPECT_EQ(last.reason, "budget_spent");
  EXPECT_EQ(last.retry_after, seconds(10));  // the window [1000 s, 1010 s) ends
  // Another key has its own budget; the next window a whole one.
  EXPECT_TRUE(check("us", "user:8").allowed);
  clock_.advance(seconds(10));
  EXPECT_TRUE(check("eu", "user:7").allowed);
  const nlohmann::json eu = state("eu");
  EXPECT_EQ(eu["region"], "eu-west");
  EXPECT_EQ(eu["coordinator"], "memory");
  EXPECT_GT(eu["leases"].get<int>(), 0);
  // Each refusal counted under its reason: here all of them for the spent budget.
  for (const char* region : {"eu", "us"}) {
    const nlohmann::json s = state(region);
    EXPECT_GT(s["denied"].get<int>(), 0) << region;
    EXPECT_EQ(s["refusals"]["budget_spent"], s["denied"]) << region;
    EXPECT_EQ(s["refusals"]["coordinator_unreachable"], 0) << region;
  }
}

TEST_F(FederatedPolicyTest, PeekSpendsNothingAndHitsOverTheLimitNeverFit) {
  ASSERT_TRUE(check("eu", "k").allowed);  // leases 8, spends 1
  auto p = engine_->peek(CheckCall{"eu", "k", 7});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p.value().allowed);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(check("eu", "k").allowed) << i;
  const RateDecision big = check("eu", "k", 41);
  EXPECT_FALSE(big.allowed);
  EXPECT_EQ(big.reason, "never_fits");
  EXPECT_EQ(big.retry_after, Nanos::max());
  EXPECT_EQ(state("eu")["refusals"]["never_fits"], 1);
  const std::string metrics = engine_->metrics_text();
  EXPECT_NE(metrics.find(R"(sluice_federated_refusals_total{policy="eu",reason="never_fits"} 1)"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find(R"(sluice_federated_refusals_total{policy="eu",reason="budget_spent"} 0)"),
            std::string::npos);
}

TEST_F(FederatedPolicyTest, CheckManyIsAllOrNothingOverFederatedKeys) {
  // 40 per window for the budget: 30 + 15 cannot both pass. Both wait for leases, which race
  // for the budget, so either may be the one refused; the other is given back.
  auto r = engine_->check_many(std::vector<CheckCall>{{"eu", "a", 30}, {"us", "a", 15}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r.value().allowed);
  EXPECT_TRUE(r.value().denied_index == 0 || r.value().denied_index == 1);
  // Nothing stays spent: 40 still pass in this window between the two regions (each holds the
  // escrow it leased, unspent or refunded).
  std::uint64_t allowed = 0;
  for (int i = 0; i < 100; ++i) allowed += check(i % 2 == 0 ? "eu" : "us", "a").allowed;
  EXPECT_EQ(allowed, 40u);
}

TEST_F(FederatedPolicyTest, AnAdmitChainedToAFederatedPolicyPassesItFirst) {
  std::uint64_t admitted = 0;
  for (int i = 0; i < 45; ++i) {
    auto r = engine_->admit(AdmitCall{"jobs", "tenant-1"});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (r.value().admitted) {
      ++admitted;
      ASSERT_TRUE(engine_->release(r.value().lease_id, CallResult::kSuccess, std::nullopt).ok());
    } else {
      EXPECT_EQ(r.value().refusal.status, 429);
      EXPECT_EQ(r.value().refusal.policy, "eu");
    }
  }
  EXPECT_EQ(admitted, 40u);
}

// Without a region, a server is a region of its own (its node id): how the processes of one
// region share one coordinator.
TEST(FederatedPolicy, ARegionDefaultsToTheServersNodeId) {
  ManualClock clock{seconds(1000)};
  auto e = Engine::create(config_of("server:\n  node_id: gw-7\npolicies:\n  api:\n"
                                    "    kind: federated\n    limit: 10\n"),
                          clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  for (const PolicyInfo& p : e.value()->policies()) {
    if (p.name == "api") {
      EXPECT_EQ(nlohmann::json::parse(p.state_json)["region"], "gw-7");
    }
  }
  EXPECT_TRUE(e.value()->check(CheckCall{"api", "k", 1}).value().allowed);
}

TEST_F(FederatedPolicyTest, AnUnchangedReloadKeepsTheEscrow) {
  ASSERT_TRUE(check("eu", "k").allowed);
  const int leases = state("eu")["leases"].get<int>();
  ASSERT_TRUE(engine_->reload(config_of(kTwoRegions)).ok());
  // 7 units left of the batch of 8; 5 more spend them down to 2 (refill_below is batch / 4).
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(check("eu", "k").allowed);
  EXPECT_EQ(state("eu")["leases"].get<int>(), leases) << "the escrow was not kept";
}

// Two processes of one region, as two policies of one engine sharing the memory coordinator's
// regional pool: the first leases a regional batch, the second takes from the pool.
TEST(FederatedPolicy, ProcessesOfARegionShareTheRegionalPool) {
  const char* two_processes = R"(
policies:
  p1:
    kind: federated
    budget: api
    region: eu
    limit: 1000
    window: 10s
    batch: 8
    regional_escrow: memory
    regional_batch: 32
  p2:
    kind: federated
    budget: api
    region: eu
    limit: 1000
    window: 10s
    batch: 8
    regional_escrow: memory
    regional_batch: 32
    outage: regional-only
)";
  ManualClock clock(seconds(1000));
  auto e = Engine::create(config_of(two_processes), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  const auto state = [&](std::string_view policy) {
    for (const PolicyInfo& p : engine.policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return nlohmann::json{};
  };
  for (const char* p : {"p1", "p2"}) {
    auto r = engine.check(CheckCall{p, "k", 1});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(r.value().allowed);
  }
  EXPECT_EQ(state("p1")["pool_refilled"].get<int>(), 24);
  EXPECT_EQ(state("p2")["pool_taken"].get<int>(), 8);
  EXPECT_EQ(state("p2")["regional_escrow"], "memory");
  EXPECT_EQ(state("p2")["outage"], "regional-only");
  EXPECT_EQ(state("p1")["outage"], "fail-closed");
  EXPECT_EQ(state("p1")["granted"].get<int>() + state("p2")["granted"].get<int>(), 16);
}

ConfigLoad load(const std::string& policy_body) {
  return load_config("policies:\n  f:\n    kind: federated\n" + policy_body,
                     PolicyRegistry::builtin());
}

const ConfigError* error_at(const ConfigLoad& l, const std::string& path) {
  for (const ConfigError& e : l.errors)
    if (e.path == path) return &e;
  return nullptr;
}

// A federated policy with no coordinator is this process's alone: the config says so when it
// loads (a warning naming the field), unless `coordinator: memory` asks for it, and the state
// shows the scope.
TEST(FederatedConfig, AProcessLocalBudgetIsNamedAsSuch) {
  const ConfigLoad implicit = load("    limit: 10\n");
  ASSERT_TRUE(implicit.config.has_value());
  ASSERT_EQ(implicit.warnings.size(), 1u);
  EXPECT_EQ(implicit.warnings[0].path, "policies.f.coordinator");
  EXPECT_NE(implicit.warnings[0].message.find("this process's alone"), std::string::npos);
  const ConfigLoad named = load("    limit: 10\n    coordinator: memory\n");
  ASSERT_TRUE(named.config.has_value());
  EXPECT_TRUE(named.warnings.empty());
  ManualClock clock{seconds(1000)};
  auto e = Engine::create(*named.config, clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  for (const PolicyInfo& p : e.value()->policies())
    EXPECT_EQ(nlohmann::json::parse(p.state_json)["scope"], "process");
}

TEST(FederatedConfig, ErrorsNameTheirField) {
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    strategy: gcra\n");
    const ConfigError* e = error_at(l, "policies.f.strategy");
    ASSERT_NE(e, nullptr);
    EXPECT_NE(e->message.find("cannot be federated"), std::string::npos) << e->message;
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    strategy: sliding-window\n");
    ASSERT_NE(error_at(l, "policies.f.strategy"), nullptr);
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    outage: regional-only\n");
    const ConfigError* e = error_at(l, "policies.f.outage");
    ASSERT_NE(e, nullptr);
    EXPECT_NE(e->message.find("regional_escrow"), std::string::npos) << e->message;
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    regional_batch: 64\n");
    const ConfigError* e = error_at(l, "policies.f.regional_batch");
    ASSERT_NE(e, nullptr);
    EXPECT_NE(e->message.find("needs regional_escrow"), std::string::npos) << e->message;
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    regional_escrow: nowhere\n");
    const ConfigError* e = error_at(l, "policies.f.regional_escrow");
    ASSERT_NE(e, nullptr);
    EXPECT_NE(e->message.find("no coordinator named 'nowhere'"), std::string::npos) << e->message;
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    regional_escrow: ''\n");
    ASSERT_NE(error_at(l, "policies.f.regional_escrow"), nullptr);
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    outage: open\n");
    const ConfigError* e = error_at(l, "policies.f.outage");
    ASSERT_NE(e, nullptr);
    EXPECT_NE(e->message.find("one of fail-closed, regional-only"), std::string::npos);
  }
  {
    const ConfigLoad l = load(
        "    limit: 10\n    region: eu\n    regional_escrow: memory\n"
        "    coordinator_health_check: 0s\n");
    ASSERT_NE(error_at(l, "policies.f.coordinator_health_check"), nullptr);
  }
  {
    const ConfigLoad l = load(
        "    limit: 10\n    region: eu\n    regional_escrow: memory\n"
        "    outage: regional-only\n    regional_batch: 64\n    coordinator_health_check: 2s\n");
    EXPECT_TRUE(l.config.has_value());
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: ''\n");
    ASSERT_NE(error_at(l, "policies.f.region"), nullptr);
  }
  {
    const ConfigLoad l = load("    region: eu\n");
    ASSERT_NE(error_at(l, "policies.f.limit"), nullptr);
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    batch: 0\n");
    ASSERT_NE(error_at(l, "policies.f.batch"), nullptr);
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    coordinator: nowhere\n");
    ASSERT_NE(error_at(l, "policies.f.coordinator"), nullptr);
  }
  {
    const ConfigLoad l =
        load("    limit: 10\n    region: eu\n    window: 1s\n    min_window_left: 2s\n");
    ASSERT_NE(error_at(l, "policies.f.min_window_left"), nullptr);
  }
  {
    const ConfigLoad l = load("    limit: 10\n    region: eu\n    budget: a:b\n");
    ASSERT_NE(error_at(l, "policies.f.budget"), nullptr);
  }
  const ConfigLoad ok = load("    limit: 10\n    region: eu\n    window: 1m\n");
  EXPECT_TRUE(ok.config.has_value());
}

std::string redis_cli(int port, const std::string& args) {
  const std::string cmd = "redis-cli -h 127.0.0.1 -p " + std::to_string(port) + " " + args;
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 256> buf{};
    while (std::fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
    ::pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::string region_yaml(int port, const std::string& region) {
  return "coordinators:\n  global:\n    kind: redis\n    address: 127.0.0.1:" +
         std::to_string(port) +
         "\npolicies:\n  api:\n    kind: federated\n    coordinator: global\n"
         "    region: " +
         region + "\n    limit: 50\n    window: 2s\n    batch: 4\n";
}

TEST(FederatedRedis, TwoRegionEnginesSplitOneBudgetOnRedis) {
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start().ok());
  const SteadyClock& clock = SteadyClock::instance();
  auto eu = Engine::create(config_of(region_yaml(redis.port(), "eu")), clock);
  auto us = Engine::create(config_of(region_yaml(redis.port(), "us")), clock);
  ASSERT_TRUE(eu.ok()) << eu.status().to_string();
  ASSERT_TRUE(us.ok()) << us.status().to_string();
  for (const PolicyInfo& p : eu.value()->policies())
    EXPECT_EQ(nlohmann::json::parse(p.state_json)["scope"], "shared");
  // A Redis that has never held a budget counts the window it is first asked in as spent: it
  // cannot tell a fresh start from a restart that lost what it had leased.
  auto first = eu.value()->check(CheckCall{"api", "k", 1});
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_FALSE(first.value().allowed);
  EXPECT_EQ(first.value().reason, "coordinator_restarted");
  ASSERT_LE(first.value().retry_after, seconds(2));
  std::this_thread::sleep_for(first.value().retry_after + milliseconds(20));
  // The next window, in a burst well inside it: 50 in all between the two regions.
  std::uint64_t allowed = 0;
  RateDecision last;
  for (int i = 0; i < 120; ++i) {
    Engine& e = i % 2 == 0 ? *eu.value() : *us.value();
    auto d = e.check(CheckCall{"api", "k", 1});
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    last = d.value();
    allowed += last.allowed;
  }
  EXPECT_EQ(allowed, 50u);
  EXPECT_EQ(last.reason, "budget_spent");
  // Federation's keys are its own: none under the fleet's prefix.
  EXPECT_EQ(redis_cli(redis.port(), "--scan --pattern 'sluice:fleet:*'"), "");
  EXPECT_NE(redis_cli(redis.port(), "--scan --pattern 'sluice:fed:*'"), "");
}

// Two processes of one region share a regional pool on a second Redis (the region's own): one
// leases a regional batch from the global coordinator and fills the pool, the other takes from
// it; together they admit exactly the limit in a window.
TEST(FederatedRedis, TwoProcessesOfARegionShareAPoolOnTheirRegionalRedis) {
  testing::RedisServer global, regional;
  ASSERT_TRUE(global.start().ok());
  ASSERT_TRUE(regional.start().ok());
  const std::string yaml =
      "coordinators:\n  global:\n    kind: redis\n    address: 127.0.0.1:" +
      std::to_string(global.port()) +
      "\n  eu:\n    kind: redis\n    address: 127.0.0.1:" + std::to_string(regional.port()) +
      "\npolicies:\n  api:\n    kind: federated\n    coordinator: global\n"
      "    regional_escrow: eu\n    regional_batch: 12\n    region: eu\n"
      "    limit: 50\n    window: 2s\n    batch: 4\n";
  const SteadyClock& clock = SteadyClock::instance();
  auto p1 = Engine::create(config_of(yaml), clock);
  auto p2 = Engine::create(config_of(yaml), clock);
  ASSERT_TRUE(p1.ok()) << p1.status().to_string();
  ASSERT_TRUE(p2.ok()) << p2.status().to_string();
  auto first = p1.value()->check(CheckCall{"api", "k", 1});
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_EQ(first.value().reason, "coordinator_restarted");  // a fresh global Redis
  std::this_thread::sleep_for(first.value().retry_after + milliseconds(20));
  ASSERT_TRUE(p1.value()->check(CheckCall{"api", "k", 1}).value().allowed);
  EXPECT_EQ(redis_cli(regional.port(), "HGET sluice:pool:{api:k} b"), "8");
  // A batch from the pool; three of it spent leave one, above the background refill's mark.
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(p2.value()->check(CheckCall{"api", "k", 1}).value().allowed);
  EXPECT_EQ(redis_cli(regional.port(), "HGET sluice:pool:{api:k} b"), "4");
  std::uint64_t allowed = 4;
  for (int i = 0; i < 100; ++i) {
    Engine& e = i % 2 == 0 ? *p1.value() : *p2.value();
    allowed += e.check(CheckCall{"api", "k", 1}).value().allowed;
  }
  EXPECT_EQ(allowed, 50u);
  // The pool lives on the regional Redis only, apart from the budget's ledger.
  EXPECT_EQ(redis_cli(global.port(), "--scan --pattern 'sluice:pool:*'"), "");
  EXPECT_EQ(redis_cli(regional.port(), "--scan --pattern 'sluice:fed:*'"), "");
}

TEST(FederatedRedis, ARedisThatMayEvictIsRefusedToFederationButNotToAFleet) {
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start().ok());
  ASSERT_EQ(redis_cli(redis.port(), "CONFIG SET maxmemory-policy allkeys-lru"), "OK");
  const std::string fleet_only =
      "coordinators:\n  global:\n    kind: redis\n    address: 127.0.0.1:" +
      std::to_string(redis.port()) +
      "\npolicies:\n  f:\n    kind: fleet\n    coordinator: global\n    algorithm: fixed\n"
      "    limit: 4\n";
  auto fleet = Engine::create(config_of(fleet_only), SteadyClock::instance());
  EXPECT_TRUE(fleet.ok()) << fleet.status().to_string();
  auto fed = Engine::create(config_of(region_yaml(redis.port(), "eu")), SteadyClock::instance());
  ASSERT_FALSE(fed.ok());
  const std::string why = fed.status().message();
  EXPECT_NE(why.find("coordinator global"), std::string::npos) << why;
  EXPECT_NE(why.find("maxmemory-policy"), std::string::npos) << why;
}

}  // namespace
}  // namespace sluice::server
