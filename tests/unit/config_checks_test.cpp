// Settings the loader (and `sluice validate`) refuses because the server would not honour them:
// two fleet policies joining one coordinator under one key, a coordinator named for a role its
// kind cannot hold, a table prefix PostgreSQL cannot take, bounds the fixed algorithm ignores,
// an exempt `all` in a throttler; what the server checks of its coordinators before connecting;
// and the server settings a reload cannot apply.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "server/coordinators.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/core/algorithm_spec.h"
#include "sluice/core/regional_escrow.h"
#include "support/config_of.h"

namespace sluice {
namespace {

using server::errors_of;
using server::load_yaml;

// The message of the one error at `path` ("" when there is none).
std::string error_at(const ConfigLoad& load, const std::string& path) {
  for (const ConfigError& e : load.errors)
    if (e.path == path) return e.message;
  return "";
}

// ---- two fleet policies, one key ----

// One server is one member of a fleet key (one node id): a second policy on the same key and
// coordinator would beat into the first's record, and each would admit the whole share (4 + 4
// admitted on L_global 4). Refused at the second policy, naming both, the key and the
// coordinator.
TEST(ConfigChecks, TwoFleetPoliciesOnOneKeyAndCoordinatorAreRefusedAtTheSecond) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  main: {kind: redis, address: "127.0.0.1:6379"}
policies:
  first:
    kind: fleet
    coordinator: main
    key: shared
    algorithm: fixed
    limit: 4
  second:
    kind: fleet
    coordinator: main
    key: shared
    algorithm: fixed
    limit: 4
)yaml");
  ASSERT_FALSE(load.config.has_value());
  ASSERT_EQ(load.errors.size(), 1u) << errors_of(load);
  EXPECT_EQ(load.errors[0].to_string("t.yaml"),
            "t.yaml:13:10: policies.second.key: policies first (line 4) and second both join "
            "coordinator 'main' under key 'shared': one server is one member of a key (one node "
            "id), so the two would share one member record and each admit up to the whole "
            "share; give each policy its own key");
}

TEST(ConfigChecks, AKeyDefaultedFromAPolicyNameCollidesToo) {
  const ConfigLoad load = load_yaml(R"yaml(policies:
  a: {kind: fleet, key: b}
  b: {kind: fleet}
)yaml");
  ASSERT_FALSE(load.config.has_value());
  const std::string why = error_at(load, "policies.b.key");
  EXPECT_NE(why.find("policies a (line 2) and b both join coordinator 'memory' under key 'b'"),
            std::string::npos)
      << errors_of(load);
}

// Two names for one Redis database and key prefix hold one set of records: the same clash.
TEST(ConfigChecks, TwoCoordinatorNamesForOneRedisPrefixAreOneCoordinator) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  a: {kind: redis, address: "10.0.0.1:6379"}
  b: {kind: redis, address: "10.0.0.1:6379"}
policies:
  x: {kind: fleet, coordinator: a, key: k}
  y: {kind: fleet, coordinator: b, key: k}
)yaml");
  ASSERT_FALSE(load.config.has_value());
  EXPECT_NE(error_at(load, "policies.y.key")
                .find("both join coordinator 'b' (the same redis data as coordinator 'a') "
                      "under key 'k'"),
            std::string::npos)
      << errors_of(load);
}

// Through Redis Sentinel the data is the primary the sentinels name, wherever it is: two
// coordinators on one master name are one, whichever sentinels each lists.
TEST(ConfigChecks, TwoCoordinatorsOnOneSentinelMasterNameAreOneCoordinator) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  a: {kind: redis, sentinels: ["10.0.0.1:26379", "10.0.0.2:26379"], master_name: main}
  b: {kind: redis, sentinels: ["10.0.0.2:26379"], master_name: main}
  c: {kind: redis, sentinels: ["10.0.0.2:26379"], master_name: other}
policies:
  x: {kind: fleet, coordinator: a, key: k}
  y: {kind: fleet, coordinator: b, key: k}
  z: {kind: fleet, coordinator: c, key: k}
)yaml");
  ASSERT_FALSE(load.config.has_value());
  ASSERT_EQ(load.errors.size(), 1u) << errors_of(load);
  EXPECT_NE(error_at(load, "policies.y.key")
                .find("both join coordinator 'b' (the same redis data as coordinator 'a') "
                      "under key 'k'"),
            std::string::npos)
      << errors_of(load);
}

TEST(ConfigChecks, SentinelSettingsThatCannotWorkAreRefusedNamingTheField) {
  const auto one = [](const std::string& coordinator, const std::string& path) {
    const ConfigLoad load = load_yaml("coordinators:\n  r: {kind: redis, " + coordinator +
                                      "}\npolicies:\n  x: "
                                      "{kind: fleet, coordinator: r, key: k}\n");
    EXPECT_FALSE(load.config.has_value()) << coordinator;
    return error_at(load, path);
  };
  EXPECT_EQ(one(R"(sentinels: ["127.0.0.1:26379"], address: "127.0.0.1:6379", master_name: m)",
                "coordinators.r.address"),
            "names one server; with sentinels the primary is theirs to name");
  EXPECT_EQ(one(R"(sentinels: ["127.0.0.1:26379"])", "coordinators.r.master_name"),
            "is needed with sentinels: the name they monitor the primary under");
  EXPECT_EQ(one("master_name: m", "coordinators.r.master_name"),
            "needs sentinels (the servers to ask for the primary)");
  EXPECT_EQ(one(R"(sentinels: ["127.0.0.1:0"], master_name: m)", "coordinators.r.sentinels"),
            "each must be host:port with a port in 1..65535, not '127.0.0.1:0'");
  EXPECT_EQ(one("sentinels: [], master_name: m", "coordinators.r.sentinels"),
            "must name at least one sentinel (host:port)");
  const ConfigLoad fine = load_yaml(R"yaml(coordinators:
  r: {kind: redis, sentinels: ["127.0.0.1:26379", "[::1]:26380"], master_name: m, sentinel_password: s}
policies:
  x: {kind: fleet, coordinator: r, key: k}
)yaml");
  EXPECT_TRUE(fine.config.has_value()) << errors_of(fine);
}

TEST(ConfigChecks, FleetPoliciesOnOtherKeysOrOtherDataAreFine) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  a: {kind: redis, address: "10.0.0.1:6379"}
  b: {kind: redis, address: "10.0.0.1:6379", key_prefix: "other:"}
  c: {kind: redis, address: "10.0.0.1:6379", database: 1}
  m2: {kind: memory}
policies:
  x: {kind: fleet, coordinator: a, key: k}
  y: {kind: fleet, coordinator: b, key: k}
  z: {kind: fleet, coordinator: c, key: k}
  w: {kind: fleet, coordinator: a, key: other}
  m: {kind: fleet, key: k}
  n: {kind: fleet, coordinator: m2, key: k}
)yaml");
  EXPECT_TRUE(load.config.has_value()) << errors_of(load);
}

// ---- a coordinator named for a role its kind cannot hold ----

TEST(ConfigChecks, APostgresRegionalEscrowIsRefusedNamingTheKindsThatHoldOne) {
  for (const std::string coordinator : {"memory", "pg"}) {
    const ConfigLoad load = load_yaml(R"yaml(coordinators:
  pg: {kind: postgres, conninfo: "host=db"}
policies:
  f:
    kind: federated
    coordinator: )yaml" + coordinator +
                                      R"yaml(
    limit: 100
    regional_escrow: pg
)yaml");
    ASSERT_FALSE(load.config.has_value()) << coordinator;
    ASSERT_EQ(load.errors.size(), 1u) << errors_of(load);
    EXPECT_EQ(load.errors[0].to_string("t.yaml"),
              "t.yaml:8:22: policies.f.regional_escrow: coordinator 'pg' is a postgres "
              "coordinator, which cannot hold a regional escrow (the regional pool) (name a "
              "memory or redis coordinator)");
  }
  const server::PolicyRegistry& builtin = server::PolicyRegistry::builtin();
  EXPECT_TRUE(builtin.find_backend("redis")->serves(CoordinatorRole::kRegionalEscrow));
  EXPECT_TRUE(builtin.find_backend("postgres")->serves(CoordinatorRole::kRateBudget));
}

// The table says what the server offers: a PostgreSQL coordinator has no regional pool, the
// others have one (make_coordinator opens a server it cannot reach, so none is needed here).
TEST(ConfigChecks, TheServerOffersTheRegionalPoolWhereTheTableSaysSo) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  r: {kind: redis, address: "127.0.0.1:1", connect_timeout: 200ms}
  pg: {kind: postgres, conninfo: "host=127.0.0.1 port=1 connect_timeout=2"}
policies:
  a: {kind: adaptive}
)yaml");
  ASSERT_TRUE(load.config.has_value()) << errors_of(load);
  for (const auto& [name, spec] : load.config->coordinators) {
    std::string warning;
    const server::CoordinatorBackend* backend =
        server::PolicyRegistry::builtin().find_backend(spec.kind);
    ASSERT_NE(backend, nullptr) << name;
    auto c = server::make_coordinator(*backend, name, spec, SteadyClock::instance(), warning);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    auto pool = c.value()->get<RegionalEscrow>();
    ASSERT_TRUE(pool.ok()) << name << ": " << pool.status().message();
    EXPECT_EQ(pool.value() != nullptr, backend->serves(CoordinatorRole::kRegionalEscrow)) << name;
  }
}

// ---- PostgreSQL table prefixes ----

TEST(ConfigChecks, ATablePrefixPostgresCannotTakeIsRefusedAtItsField) {
  const std::string ok57(57, 'a');
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  bad: {kind: postgres, conninfo: "host=db", table_prefix: "Bad-Prefix"}
  long: {kind: postgres, conninfo: "host=db", table_prefix: ")yaml" +
                                    std::string(58, 'a') + R"yaml("}
  fine: {kind: postgres, conninfo: "host=db", table_prefix: ")yaml" +
                                    ok57 + R"yaml("}
policies:
  a: {kind: adaptive}
)yaml");
  ASSERT_FALSE(load.config.has_value());
  EXPECT_EQ(error_at(load, "coordinators.bad.table_prefix"),
            "must match [a-z_][a-z0-9_]* (at most 57 characters), not 'Bad-Prefix'");
  EXPECT_NE(error_at(load, "coordinators.long.table_prefix").find("at most 57 characters"),
            std::string::npos);
  EXPECT_EQ(error_at(load, "coordinators.fine.table_prefix"), "");
  EXPECT_EQ(load.errors.size(), 2u) << errors_of(load);
}

// What `sluice serve` refuses of a coordinator before it connects and the loader cannot see
// (libpq parses the conninfo; federation's tables add "_fed" to the prefix), `sluice validate`
// refuses too: the same backend checks, run without connecting.
TEST(ConfigChecks, WhatTheServerChecksBeforeConnectingIsCheckedWithoutConnecting) {
  const std::string prefix52(52, 'p');
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  conn: {kind: postgres, conninfo: "host=db nonsense"}
  long: {kind: postgres, conninfo: "host=db", table_prefix: ")yaml" +
                                    prefix52 + R"yaml("}
  fleet_only: {kind: postgres, conninfo: "host=db", table_prefix: ")yaml" +
                                    prefix52 + R"yaml("}
  unused: {kind: postgres, conninfo: "host=db nonsense"}
policies:
  a: {kind: fleet, coordinator: conn}
  b: {kind: federated, coordinator: long, limit: 10}
  c: {kind: fleet, coordinator: fleet_only}
)yaml");
  ASSERT_TRUE(load.config.has_value()) << errors_of(load);
  std::map<std::string, std::string> by_path;
  for (const ConfigError& e :
       server::check_before_connecting(*load.config, server::PolicyRegistry::builtin()))
    by_path[e.path] += e.message;
  ASSERT_EQ(by_path.size(), 2u);
  EXPECT_NE(by_path["coordinators.conn"].find("postgres: bad conninfo"), std::string::npos)
      << by_path["coordinators.conn"];
  EXPECT_EQ(by_path["coordinators.long"],
            "federation's tables (prefix " + prefix52 +
                "_fed, from table_prefix): postgres: table_prefix must match [a-z_][a-z0-9_]* "
                "(at most 55 characters)");
}

// ---- algorithm bounds ----

// A fixed limit never moves: min_limit, max_limit and initial_limit would be ignored (even
// min_limit 100 over max_limit 5), so each is refused at its field.
TEST(ConfigChecks, TheFixedAlgorithmRefusesTheAdaptiveBoundsNamingEach) {
  for (const std::string kind : {"adaptive", "fleet"}) {
    const ConfigLoad load = load_yaml(R"yaml(policies:
  p:
    kind: )yaml" + kind + R"yaml(
    algorithm: fixed
    limit: 4
    min_limit: 100
    max_limit: 5
    initial_limit: 3
)yaml");
    ASSERT_FALSE(load.config.has_value()) << kind;
    for (const std::string field : {"min_limit", "max_limit", "initial_limit"})
      EXPECT_EQ(error_at(load, "policies.p." + field),
                "applies to the adaptive algorithms only (aimd, vegas, gradient2): the fixed "
                "algorithm admits up to its limit, which never moves")
          << kind << " " << field << "\n"
          << errors_of(load);
    EXPECT_EQ(load.errors.size(), 3u) << errors_of(load);
  }
  AlgorithmSpec fixed;
  fixed.kind = AlgorithmSpec::Kind::kFixed;
  fixed.limit = 4;
  fixed.min_limit = 100;
  EXPECT_EQ(fixed.validate(), "fixed: min_limit applies to the adaptive algorithms only");
  fixed.min_limit.reset();
  EXPECT_EQ(fixed.validate(), "");
}

TEST(ConfigChecks, TheAdaptiveAlgorithmsRefuseAMinLimitOverTheMaxLimit) {
  for (const std::string algorithm : {"aimd", "vegas", "gradient2"}) {
    const ConfigLoad load = load_yaml(R"yaml(policies:
  p:
    kind: adaptive
    algorithm: )yaml" + algorithm + R"yaml(
    min_limit: 100
    max_limit: 5
    initial_limit: 5
)yaml");
    ASSERT_FALSE(load.config.has_value()) << algorithm;
    EXPECT_EQ(error_at(load, "policies.p.min_limit"),
              "must be <= max_limit (" + algorithm + "'s defaults fill in the limits not set)")
        << errors_of(load);
  }
}

// ---- the throttler's `all` ----

// `all` holds the rule of the apps without their own; the admin verb refuses to exempt it, and
// so does the config (it was accepted and ignored).
TEST(ConfigChecks, AThrottlerCannotExemptAll) {
  const auto load = [](const std::string& value) {
    return load_yaml(R"yaml(policies:
  t:
    kind: throttler
    metrics:
      load: {probe: loadavg, threshold: 4}
    apps:
      all: {exempt: )yaml" +
                     value + R"yaml(}
      rescue: {exempt: true}
)yaml");
  };
  for (const std::string value : {"true", "false"}) {
    const ConfigLoad l = load(value);
    ASSERT_FALSE(l.config.has_value()) << value;
    ASSERT_EQ(l.errors.size(), 1u) << errors_of(l);
    EXPECT_EQ(l.errors[0].to_string("t.yaml"),
              "t.yaml:7:21: policies.t.apps.all.exempt: does not apply to 'all', which cannot be "
              "exempt (exempt the apps by name)");
  }
}

// ---- a reload's server settings ----

// The listeners, their connection settings and the node id are set when the server starts: a
// reload that changes any of them is refused naming each; the rest are not listed.
TEST(ConfigChecks, TheSettingsAReloadCannotApplyAreNamedWithBothValues) {
  const ServerSettings running;
  ServerSettings next = running;
  next.lease_ttl = std::chrono::seconds(5);  // a reload applies these
  next.max_lease_ttl = std::chrono::minutes(5);
  next.shutdown_grace = std::chrono::seconds(3);
  next.admin_token = "t";
  next.state_file = "/tmp/x";
  EXPECT_TRUE(restart_only_changes(running, next).empty());
  next.grpc = "127.0.0.1:7071";
  next.http = "127.0.0.1:8081";
  next.node_id = "gw-1";
  next.max_connections = 5;
  next.idle_timeout = std::chrono::seconds(2);
  next.request_timeout = std::chrono::milliseconds(500);
  next.keepalive = std::chrono::seconds(45);
  std::vector<std::string> got;
  for (const RestartOnlyChange& c : restart_only_changes(running, next))
    got.push_back(c.setting + " " + c.running + " -> " + c.next);
  EXPECT_EQ(got, (std::vector<std::string>{
                     "server.grpc '127.0.0.1:7070' -> '127.0.0.1:7071'",
                     "server.http '127.0.0.1:8080' -> '127.0.0.1:8081'",
                     "server.node_id unset -> 'gw-1'",
                     "server.max_connections 10000 -> 5",
                     "server.idle_timeout 1m -> 2s",
                     "server.request_timeout 10s -> 500ms",
                     "server.keepalive 30s -> 45s",
                 }));
}

}  // namespace
}  // namespace sluice
