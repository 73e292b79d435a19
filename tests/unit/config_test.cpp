// The configuration file: every kind of policy and coordinator read into values, and every
// problem reported with its line, column and field path, all at once.
#include "sluice/config/config.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "server/policies/adaptive.h"
#include "server/policies/concurrency.h"
#include "server/policies/fleet.h"
#include "server/policies/rate.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Loads with sluice's own policy kinds.
ConfigLoad load_yaml(std::string_view yaml) {
  return load_config(yaml, server::PolicyRegistry::builtin());
}

constexpr const char* kFull = R"yaml(
server:
  grpc: 0.0.0.0:7070
  http: 127.0.0.1:9090
  admin_token: s3cret
coordinators:
  main:
    kind: redis
    address: redis.internal:6380
    password: pw
    database: 2
    connect_timeout: 250ms
    aggregate: min
    allocation: demand-proportional
    acknowledged_handoff: true
  pg:
    kind: postgres
    conninfo: "host=db sslmode=require"
policies:
  api-rate:
    kind: rate
    strategy: sliding-window
    limit: 100
    period: 250ms
  burst:
    kind: rate
    limit: 10
    burst: 30
  llm:
    kind: adaptive
    algorithm: vegas
    max_limit: 500
  backend:
    kind: fleet
    coordinator: main
    algorithm: fixed
    limit: 40
    heartbeat: 100ms
    eager_handoff: true
  gateway:
    kind: concurrency
    tenants:
      - id: acme
        global_concurrency_limit: 100
    upstreams:
      - id: llm
        host: llm.internal
        owner: acme
        concurrency_limit:
          max_concurrent: 20
          per_tenant_max: 10
          strategy: queue
          queue: {max_depth: 5, timeout: 2s}
        routes:
          - {id: chat, max_concurrent: 5}
    problem:
      status: 429
)yaml";

TEST(Config, ReadsEveryKindOfPolicyAndCoordinator) {
  const ConfigLoad load = load_yaml(kFull);
  ASSERT_TRUE(load.config.has_value());
  for (const ConfigError& e : load.errors) ADD_FAILURE() << e.to_string("full");
  const SluiceConfig& c = *load.config;
  EXPECT_EQ(c.server.grpc, "0.0.0.0:7070");
  EXPECT_EQ(c.server.admin_token, "s3cret");
  ASSERT_EQ(c.coordinators.size(), 3u);  // main, pg and the embedded memory one
  const CoordinatorSpec& main = c.coordinators.at("main");
  EXPECT_EQ(main.kind, "redis");
  const RedisOptions* redis = main.options_as<RedisOptions>();
  ASSERT_NE(redis, nullptr);
  EXPECT_EQ(redis->host, "redis.internal");
  EXPECT_EQ(redis->port, 6380);
  EXPECT_EQ(redis->database, 2);
  EXPECT_EQ(redis->connect_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(main.rules.aggregate, Aggregate::kMin);
  EXPECT_EQ(main.rules.allocation, Allocation::kDemandProportional);
  EXPECT_TRUE(main.rules.acknowledged_handoff);
  ASSERT_NE(c.coordinators.at("pg").options_as<PostgresOptions>(), nullptr);
  EXPECT_EQ(c.coordinators.at("pg").options_as<PostgresOptions>()->conninfo,
            "host=db sslmode=require");
  EXPECT_EQ(c.coordinators.at("pg").options_as<RedisOptions>(), nullptr);

  const auto& rate = *c.policies.at("api-rate").as<server::RateSpec>();
  EXPECT_EQ(rate.rule.strategy, RateStrategy::kSlidingWindow);
  EXPECT_EQ(rate.rule.limit, 100u);
  EXPECT_EQ(rate.rule.period, milliseconds(250));
  const auto& gcra = *c.policies.at("burst").as<server::RateSpec>();
  EXPECT_EQ(gcra.rule.strategy, RateStrategy::kGcra);
  EXPECT_EQ(gcra.rule.burst, 30u);
  EXPECT_EQ(gcra.rule.period, seconds(1));
  const auto& llm = *c.policies.at("llm").as<server::AdaptiveSpec>();
  EXPECT_EQ(llm.algorithm.kind, AlgorithmSpec::Kind::kVegas);
  EXPECT_EQ(make_algorithm(llm.algorithm)->name(), "vegas");
  const auto& fleet = *c.policies.at("backend").as<server::FleetSpec>();
  EXPECT_EQ(fleet.coordinator, "main");
  EXPECT_EQ(fleet.guard.key, "backend");
  EXPECT_EQ(fleet.guard.heartbeat, milliseconds(100));
  EXPECT_TRUE(fleet.guard.eager_handoff);
  EXPECT_EQ(make_algorithm(fleet.algorithm)->limit(), 40u);
  const auto& gw = c.policies.at("gateway").as<server::ConcurrencySpec>()->gateway;
  ASSERT_EQ(gw.upstreams.size(), 1u);
  EXPECT_EQ(gw.upstreams[0].concurrency_limit->strategy, Strategy::kQueue);
  EXPECT_EQ(gw.upstreams[0].concurrency_limit->queue.timeout, seconds(2));
  EXPECT_EQ(gw.upstreams[0].routes[0].max_concurrent, 5u);
  EXPECT_EQ(gw.problem.status, 429);
  EXPECT_EQ(c.policies.at("gateway").kind, "concurrency");
}

// Every error of a load, one a line, for failure messages.
std::string all_errors(const ConfigLoad& load) {
  std::string all;
  for (const ConfigError& e : load.errors) all += e.to_string("t.yaml") + "\n";
  return all;
}

// The one error at `path`, or null.
const ConfigError* error_at(const ConfigLoad& load, const std::string& path) {
  const ConfigError* found = nullptr;
  for (const ConfigError& e : load.errors) {
    if (e.path != path) continue;
    EXPECT_EQ(found, nullptr) << "two errors at " << path << ":\n" << all_errors(load);
    found = &e;
  }
  return found;
}

// A config serves at least one policy: a file with none is an error, never a server that
// starts and serves nothing.
TEST(Config, AConfigWithoutPoliciesIsAnError) {
  const struct {
    const char* yaml;
    const char* path;
    const char* message;
  } cases[] = {
      {"", "", "the file is empty (a config needs at least one policy, under policies:)"},
      {"  \n\n", "", "the file is empty (a config needs at least one policy, under policies:)"},
      {"# policies:\n#   a: {kind: rate, limit: 5}\n", "",
       "the file has only comments (a config needs at least one policy, under policies:)"},
      {"---\n", "",
       "the file has no settings (a config needs at least one policy, under policies:)"},
      {"server:\n  grpc: 127.0.0.1:7070\n", "policies",
       "is required (a config needs at least one policy)"},
      {"policies:\n", "policies", "is required (a config needs at least one policy)"},
      {"policies: {}\n", "policies", "is empty (a config needs at least one policy)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    const ConfigLoad load = load_yaml(c.yaml);
    EXPECT_FALSE(load.config.has_value());
    ASSERT_EQ(load.errors.size(), 1u) << all_errors(load);
    EXPECT_EQ(load.errors[0].path, c.path);
    EXPECT_EQ(load.errors[0].message, c.message);
  }
  EXPECT_TRUE(load_yaml("policies:\n  a: {kind: rate, limit: 5}\n").config.has_value());
}

// A directory or an empty file given as the config is one error that names the file.
// A name with a control character would not survive the file being written out again (nor a
// log line or a metric label): it is an error, naming the byte and where it is.
TEST(Config, AControlCharacterInTheTextIsAnErrorAtItsPlace) {
  const ConfigLoad l =
      load_yaml(std::string_view("policies:\n  a_b\0c:\n    kind: adaptive\n", 38));
  EXPECT_FALSE(l.config.has_value());
  ASSERT_EQ(l.errors.size(), 1u);
  EXPECT_EQ(l.errors[0].line, 2);
  EXPECT_EQ(l.errors[0].column, 6);
  EXPECT_EQ(l.errors[0].message,
            "the file has a control character YAML text may not contain: byte 0x00 here");
}

TEST(Config, ANameWithAControlCharacterIsAnError) {
  const ConfigLoad nul = load_yaml(
      "policies:\n  \"a\\0b\":\n    kind: adaptive\n    algorithm: fixed\n    limit: 3\n");
  EXPECT_FALSE(nul.config.has_value());
  ASSERT_EQ(nul.errors.size(), 1u);
  EXPECT_EQ(nul.errors[0].path, "policies");
  EXPECT_EQ(nul.errors[0].message,
            "a policy name must not contain control characters (byte 0x00 at offset 1)");
  const ConfigLoad newline = load_yaml(
      "coordinators:\n  \"r\\nx\":\n    kind: memory\npolicies:\n  p:\n    kind: adaptive\n"
      "    algorithm: fixed\n    limit: 3\n");
  ASSERT_FALSE(newline.errors.empty());
  EXPECT_EQ(newline.errors[0].message,
            "a coordinator name must not contain control characters (byte 0x0A at offset 1)");
  // A tenant's id with a carriage return (it would not survive the config written back out).
  const ConfigLoad id =
      load_yaml("policies:\n  g:\n    kind: concurrency\n    tenants:\n      - {id: \"ac\\r\"}\n");
  ASSERT_FALSE(id.errors.empty());
  EXPECT_EQ(id.errors[0].path, "policies.g.tenants[0].id");
  EXPECT_EQ(id.errors[0].message, "must not contain control characters (byte 0x0D at offset 2)");
}

TEST(Config, ADirectoryOrAnEmptyFileIsAnErrorNamingIt) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice-config-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const ConfigLoad directory = load_config_file(dir.string(), server::PolicyRegistry::builtin());
  ASSERT_EQ(directory.errors.size(), 1u);
  EXPECT_EQ(directory.errors[0].to_string(dir.string()),
            dir.string() + ": is a directory, not a config file");
  const std::string empty = (dir / "empty.yaml").string();
  std::ofstream(empty).close();
  const ConfigLoad none = load_config_file(empty, server::PolicyRegistry::builtin());
  ASSERT_EQ(none.errors.size(), 1u);
  EXPECT_EQ(none.errors[0].to_string(empty),
            empty + ": the file is empty (a config needs at least one policy, under policies:)");
  std::filesystem::remove_all(dir);
}

// A key given twice in one mapping is an error at the second, naming the first's line, at
// every level: the file, server, coordinators, policies, a policy, a nested mapping, a list
// entry. (The YAML library keeps both; a lookup would quietly take one.)
TEST(Config, ADuplicateKeyIsAnErrorNamingBothLines) {
  const ConfigLoad load = load_yaml(R"yaml(server:
  grpc: 127.0.0.1:7070
  grpc: 127.0.0.1:7071
coordinators:
  main: {kind: redis, kind: postgres}
policies:
  a:
    kind: rate
    limit: 5
    limit: 6
  gw:
    kind: concurrency
    tenants: [{id: t, id: u}]
    upstreams:
      - id: llm
        host: llm.internal
        owner: t
        concurrency_limit:
          max_concurrent: 4
          max_concurrent: 8
  a:
    kind: rate
    limit: 7
policies:
  b: {kind: rate, limit: 1}
)yaml");
  EXPECT_FALSE(load.config.has_value());
  const struct {
    const char* path;
    int line, first;
  } want[] = {
      {"server.grpc", 3, 2},
      {"coordinators.main.kind", 5, 5},
      {"policies.a.limit", 10, 9},
      {"policies.gw.tenants[0].id", 13, 13},
      {"policies.gw.upstreams[0].concurrency_limit.max_concurrent", 20, 19},
      {"policies.a", 21, 7},
      {"policies", 24, 6},
  };
  for (const auto& w : want) {
    SCOPED_TRACE(w.path);
    const ConfigError* e = error_at(load, w.path);
    ASSERT_NE(e, nullptr) << all_errors(load);
    EXPECT_EQ(e->line, w.line);
    EXPECT_EQ(e->message, "duplicate key (first at line " + std::to_string(w.first) + ")");
  }
  EXPECT_EQ(load.errors.size(), std::size(want)) << all_errors(load);
  // The same keys once each load.
  EXPECT_TRUE(load_yaml("policies:\n  a: {kind: rate, limit: 5}\n  b: {kind: rate, limit: 5}\n")
                  .config.has_value());
}

// A negative whole number is out of range, not "not a whole number"; a fraction or a word is.
TEST(Config, NegativeNumbersGetTheRangeAndNonNumbersTheWholeNumberMessage) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  r: {kind: redis, database: -1}
policies:
  a: {kind: rate, limit: -5}
  b: {kind: rate, limit: 1.5}
  c: {kind: rate, limit: abc}
  d: {kind: rate, limit: 0}
  e: {kind: rate, limit: 99999999999999999999999}
  f: {kind: rate, limit: -99999999999999999999999}
  g: {kind: rate, limit: "-"}
  gw:
    kind: concurrency
    tenants: [{id: t, global_concurrency_limit: -3}]
    upstreams: [{id: u, host: h, owner: t}]
    problem: {status: 1000}
)yaml");
  const std::map<std::string, std::string> want = {
      {"coordinators.r.database", "must be in [0, 1048576], not -1"},
      {"policies.a.limit", "must be >= 1, not -5"},
      {"policies.b.limit", "must be a whole number, not '1.5'"},
      {"policies.c.limit", "must be a whole number, not 'abc'"},
      {"policies.d.limit", "must be >= 1, not 0"},
      {"policies.e.limit", "must be in [1, 4294967295], not 99999999999999999999999"},
      {"policies.f.limit", "must be >= 1, not -99999999999999999999999"},
      {"policies.g.limit", "must be a whole number, not '-'"},
      {"policies.gw.tenants[0].global_concurrency_limit", "must be >= 0, not -3"},
      {"policies.gw.problem.status", "must be in [0, 999], not 1000"},
  };
  std::map<std::string, std::string> got;
  for (const ConfigError& e : load.errors) got[e.path] = e.message;
  EXPECT_EQ(got, want) << all_errors(load);
}

// Every error names the field it is about: its path comes first, then what is wrong, at the
// field's line. A sample over the loader's own checks and those it places for the kinds.
TEST(Config, EveryErrorStartsWithTheFieldsPath) {
  const ConfigLoad load = load_yaml(R"yaml(coordinators:
  "": {kind: memory}
  r: {kind: redis, address: nowhere}
policies:
  "": {kind: rate, limit: 1}
  g:
    kind: adaptive
    algorithm: aimd
    max_limit: 10
  h:
    kind: adaptive
    algorithm: vegas
    min_limit: 5
    initial_limit: 2
  f:
    kind: concurrency
    tenants: [{id: t}]
    upstreams: [{id: u, host: h, owner: t}]
    bindings: [{tenant: t, upstream: nowhere}]
  x: {kind: adaptive, rate: missing}
)yaml");
  const std::vector<std::string> want = {
      "t.yaml:2:3: coordinators: a coordinator needs a name",
      "t.yaml:3:29: coordinators.r.address: must be host:port with a port in 1..65535, not "
      "'nowhere'",
      "t.yaml:5:3: policies: a policy needs a name",
      "t.yaml:7:5: policies.g.min_limit: must be <= max_limit (min_limit is not set: aimd's "
      "default is 20)",
      "t.yaml:14:20: policies.h.initial_limit: must be within [min_limit, max_limit] (vegas's "
      "defaults fill in the limits not set)",
      "t.yaml:19:38: policies.f.bindings[0].upstream: unknown upstream 'nowhere'",
      "t.yaml:20:29: policies.x.rate: no rate policy named 'missing' (rate must name a policy of "
      "kind rate or federated)",
  };
  std::vector<std::string> got;
  for (const ConfigError& e : load.errors) got.push_back(e.to_string("t.yaml"));
  std::sort(got.begin(), got.end());
  std::vector<std::string> sorted = want;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(got, sorted);
}

// Every problem at once, each at its line and column.
TEST(Config, ReportsEveryErrorWithItsLineColumnAndPath) {
  const ConfigLoad load = load_yaml(R"yaml(policies:
  a:
    kind: rate
    limt: 5
  b:
    kind: rate
    limit: -3
    period: soon
  c:
    kind: fleet
    coordinator: nowhere
    heartbeat: 1s
    lease_ttl: 500ms
  d:
    kind: cascade
    decay: 0.5
  e:
    kind: teleport
  f:
    kind: concurrency
    upstreams:
      - id: llm
        owner: ghost
        concurrency_limit: {max_concurrent: 4, per_tenant_max: 9}
)yaml");
  EXPECT_FALSE(load.config.has_value());
  auto find = [&](const std::string& path) -> const ConfigError* {
    for (const ConfigError& e : load.errors)
      if (e.path == path) return &e;
    return nullptr;
  };
  const ConfigError* typo = find("policies.a.limt");
  ASSERT_NE(typo, nullptr);
  EXPECT_EQ(typo->line, 4);
  EXPECT_EQ(typo->column, 5);
  EXPECT_NE(typo->message.find("unknown key"), std::string::npos);
  ASSERT_NE(find("policies.a.limit"), nullptr);  // required
  const ConfigError* negative = find("policies.b.limit");
  ASSERT_NE(negative, nullptr);
  EXPECT_EQ(negative->line, 7);
  EXPECT_NE(negative->message.find("-3"), std::string::npos);
  ASSERT_NE(find("policies.b.period"), nullptr);
  EXPECT_EQ(find("policies.b.period")->line, 8);
  const ConfigError* coordinator = find("policies.c.coordinator");
  ASSERT_NE(coordinator, nullptr);
  EXPECT_EQ(coordinator->line, 11);
  EXPECT_NE(coordinator->message.find("nowhere"), std::string::npos);
  const ConfigError* lease = find("policies.c.lease_ttl");  // the field's path first
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->message, "must be > heartbeat");
  const ConfigError* decay = find("policies.d.decay");
  ASSERT_NE(decay, nullptr);
  EXPECT_EQ(decay->line, 16);
  EXPECT_EQ(decay->message, "must be a number >= 1");
  const ConfigError* nodes = find("policies.d.nodes");
  ASSERT_NE(nodes, nullptr);
  EXPECT_NE(nodes->message.find("is required"), std::string::npos);
  ASSERT_NE(find("policies.e.kind"), nullptr);
  // The gateway's own validation, placed at the fields it names.
  const ConfigError* owner = find("policies.f.upstreams[0].owner");
  ASSERT_NE(owner, nullptr) << [&] {
    std::string all;
    for (const ConfigError& e : load.errors) all += e.to_string("t") + "\n";
    return all;
  }();
  EXPECT_EQ(owner->line, 23);
  const ConfigError* per_tenant = find("policies.f.upstreams[0].concurrency_limit.per_tenant_max");
  ASSERT_NE(per_tenant, nullptr);
  EXPECT_EQ(per_tenant->line, 24);
  EXPECT_EQ(per_tenant->to_string("x.yaml").rfind("x.yaml:24:", 0), 0u);
}

// An adaptive algorithm's limits are checked with its own defaults filling in the rest: a
// max_limit below aimd's default min_limit (20) is an error, not a guard that quietly swaps them.
TEST(Config, AlgorithmLimitsAreCheckedAgainstTheAlgorithmsDefaults) {
  const ConfigLoad bad = load_yaml(R"yaml(policies:
  g:
    kind: adaptive
    algorithm: aimd
    max_limit: 10
  h:
    kind: adaptive
    algorithm: vegas
    min_limit: 5
    initial_limit: 2
)yaml");
  EXPECT_FALSE(bad.config.has_value());
  std::map<std::string, std::string> by_path;
  for (const ConfigError& e : bad.errors) by_path[e.path] = e.message;
  ASSERT_TRUE(by_path.contains("policies.g.min_limit"));
  EXPECT_EQ(by_path["policies.g.min_limit"].rfind("must be <= max_limit", 0), 0u)
      << by_path["policies.g.min_limit"];
  ASSERT_TRUE(by_path.contains("policies.h.initial_limit"));
  EXPECT_EQ(by_path["policies.h.initial_limit"].rfind("must be within", 0), 0u)
      << by_path["policies.h.initial_limit"];
  EXPECT_TRUE(load_yaml("policies:\n  ok:\n    kind: adaptive\n    algorithm: aimd\n"
                        "    min_limit: 2\n    max_limit: 10\n    initial_limit: 5\n")
                  .config.has_value());
}

// A rate policy is checked by its rule (sluice/core/rate_strategy.h), each error at its field.
TEST(Config, RateRulesAreCheckedByTheRuleAtTheirField) {
  const ConfigLoad bad = load_yaml(R"yaml(policies:
  x:
    kind: rate
    strategy: fixed-window
    limit: 5
    burst: 9
  y:
    kind: rate
    limit: 5
    period: 900000h
)yaml");
  EXPECT_FALSE(bad.config.has_value());
  std::map<std::string, const ConfigError*> by_path;
  for (const ConfigError& e : bad.errors) by_path[e.path] = &e;
  ASSERT_TRUE(by_path.contains("policies.x.burst"));
  EXPECT_EQ(by_path["policies.x.burst"]->message, "applies to the gcra strategy only");
  EXPECT_EQ(by_path["policies.x.burst"]->line, 6);
  ASSERT_TRUE(by_path.contains("policies.y.period"));
  EXPECT_NE(by_path["policies.y.period"]->message.find("at most"), std::string::npos);
  EXPECT_EQ(by_path["policies.y.period"]->line, 10);
}

// `rate:` chains a rate policy in front of a concurrency kind: it must name one, and a rate
// policy cannot chain another. Server lease settings are read and checked against each other.
TEST(Config, RateChainingAndServerLeaseSettings) {
  const ConfigLoad ok = load_yaml(R"yaml(server:
  lease_ttl: 5s
  max_lease_ttl: 1m
  shutdown_grace: 2s
  node_id: gw-1
policies:
  r: {kind: rate, limit: 5}
  a: {kind: adaptive, rate: r}
)yaml");
  ASSERT_TRUE(ok.config.has_value()) << ok.errors[0].to_string("x");
  EXPECT_EQ(ok.config->policies.at("a").rate, "r");
  EXPECT_EQ(ok.config->server.lease_ttl, std::chrono::seconds(5));
  EXPECT_EQ(ok.config->server.max_lease_ttl, std::chrono::minutes(1));
  EXPECT_EQ(ok.config->server.shutdown_grace, std::chrono::seconds(2));
  EXPECT_EQ(ok.config->server.node_id, "gw-1");
  EXPECT_FALSE(ok.config->policies.at("a").fingerprint.empty());
  EXPECT_NE(ok.config->policies.at("a").fingerprint, ok.config->policies.at("r").fingerprint);

  const ConfigLoad bad = load_yaml(R"yaml(server:
  lease_ttl: 5m
  max_lease_ttl: 1m
policies:
  r: {kind: rate, limit: 5, rate: r}
  a: {kind: adaptive, rate: missing}
  b: {kind: adaptive, rate: a}
)yaml");
  ASSERT_FALSE(bad.config.has_value());
  std::map<std::string, int> lines;
  for (const ConfigError& e : bad.errors) lines[e.path] = e.line;
  EXPECT_EQ(lines["server.lease_ttl"], 2);
  EXPECT_EQ(lines["policies.r.rate"], 5);
  EXPECT_EQ(lines["policies.a.rate"], 6);
  EXPECT_EQ(lines["policies.b.rate"], 7);
  EXPECT_EQ(bad.errors.size(), 4u);
}

TEST(Config, SyntaxErrorsAndMissingFilesAreOneClearError) {
  const ConfigLoad bad = load_yaml("policies:\n  a: [unclosed\n");
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].message.find("YAML syntax"), std::string::npos);
  EXPECT_GT(bad.errors[0].line, 0);
  const ConfigLoad missing =
      load_config_file("/nonexistent/sluice.yaml", server::PolicyRegistry::builtin());
  ASSERT_EQ(missing.errors.size(), 1u);
  EXPECT_EQ(
      missing.errors[0].to_string("/nonexistent/sluice.yaml"),
      "/nonexistent/sluice.yaml: cannot read the file: " + std::generic_category().message(ENOENT));
  const ConfigLoad list = load_yaml("- a\n- b\n");
  ASSERT_EQ(list.errors.size(), 1u);
  EXPECT_NE(list.errors[0].message.find("mapping"), std::string::npos);
}

// yaml-cpp keeps bytes that are not UTF-8 in names and strings, which no JSON rendering of them
// (problem+json, /v1/policies) could show: the loader refuses them at their line and column.
TEST(Config, TextThatIsNotUtf8IsOneErrorAtItsPlace) {
  const auto first_error = [](std::string_view yaml) {
    const ConfigLoad l = load_yaml(yaml);
    EXPECT_FALSE(l.config.has_value());
    return l.errors.empty() ? std::string("no error") : l.errors[0].to_string("t.yaml");
  };
  // A stray byte in a policy's name (found by fuzz/fuzz_config.cpp: the name did not survive
  // a round trip through YAML).
  EXPECT_EQ(first_error("policies:\n  a\xff:\n    kind: rate\n    limit: 5\n"),
            "t.yaml:2:4: the file is not UTF-8 text: byte 0xFF does not begin a UTF-8 character "
            "here");
  // A character cut short, an overlong form, a surrogate, past U+10FFFF.
  for (const char* bad : {"\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"}) {
    SCOPED_TRACE(bad);
    const std::string yaml = std::string("policies:\n  a: {kind: rate, limit: 5}\n# ") + bad;
    EXPECT_EQ(first_error(yaml).substr(0, 44), "t.yaml:3:3: the file is not UTF-8 text: byte");
  }
  // UTF-8 of every length is text.
  const ConfigLoad ok = load_yaml(
      "policies:\n  caf\xc3\xa9-\xe2\x98\x83-\xf0\x9f\x98\x80:\n"
      "    kind: rate\n    limit: 5\n");
  ASSERT_TRUE(ok.config.has_value()) << (ok.errors.empty() ? "" : ok.errors[0].to_string("t"));
  EXPECT_EQ(ok.config->policies.count("caf\xc3\xa9-\xe2\x98\x83-\xf0\x9f\x98\x80"), 1u);
}

TEST(Config, DurationsNeedAUnit) {
  EXPECT_EQ(parse_duration("250ms"), milliseconds(250));
  EXPECT_EQ(parse_duration("2s"), seconds(2));
  EXPECT_EQ(parse_duration("3m"), seconds(180));
  EXPECT_EQ(parse_duration("7us"), std::chrono::microseconds(7));
  EXPECT_FALSE(parse_duration("250").has_value());
  EXPECT_FALSE(parse_duration("ms").has_value());
  EXPECT_FALSE(parse_duration("-1s").has_value());
  EXPECT_FALSE(parse_duration("99999999999999h").has_value());
}

TEST(Config, DurationsPrintInTheLargestUnitTheyReach) {
  using std::chrono::microseconds;
  using std::chrono::minutes;
  using std::chrono::nanoseconds;
  EXPECT_EQ(format_duration(Nanos{0}), "0s");
  EXPECT_EQ(format_duration(seconds(600)), "10m");
  EXPECT_EQ(format_duration(seconds(90)), "90s");
  EXPECT_EQ(format_duration(minutes(120)), "2h");
  EXPECT_EQ(format_duration(minutes(2)), "2m");
  EXPECT_EQ(format_duration(milliseconds(1500)), "1.5s");
  EXPECT_EQ(format_duration(milliseconds(250)), "250ms");
  EXPECT_EQ(format_duration(microseconds(1250)), "1.25ms");
  EXPECT_EQ(format_duration(nanoseconds(1'234'567'891)), "1.235s");
  EXPECT_EQ(format_duration(nanoseconds(7'001)), "7.001us");
  EXPECT_EQ(format_duration(nanoseconds(999)), "999ns");
  EXPECT_EQ(format_duration(-milliseconds(20)), "-20ms");
  // A value that rounds up to the next unit is printed in it.
  EXPECT_EQ(format_duration(nanoseconds(59'999'600'000)), "1m");
  EXPECT_EQ(format_duration(nanoseconds(999'999'600)), "1s");
  EXPECT_EQ(format_duration(nanoseconds(1'999'999'600)), "2s");
  // Whole values read back.
  for (const Nanos d : {Nanos{seconds(30)}, Nanos{milliseconds(20)}, Nanos{minutes(10)},
                        Nanos{seconds(3600 * 5)}, Nanos{microseconds(7)}, Nanos{nanoseconds(3)}})
    EXPECT_EQ(parse_duration(format_duration(d)), d) << format_duration(d);
}

}  // namespace
}  // namespace sluice
