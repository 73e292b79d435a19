// The cascade kind through the engine (src/server/policies/cascade.cpp): Admit names the node it
// chose and honours `exclude`; every node full (or open) is a 503 naming why; Release outcomes
// reach the node's health and guard (timeout and overload as drops, failed as a failure with no
// latency evidence, ignored nowhere); a reload that adds or removes a node keeps the others'
// health, guards and leases; the state and metrics show each node; bad fields are named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "server/engine.h"
#include "sluice/config/config.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const char* kConfig = R"(
policies:
  replicas:
    kind: cascade
    nodes:
      db-1: {algorithm: fixed, limit: 2}
      db-2: {algorithm: fixed, limit: 2}
    breaker:
      failures: 3
      open_for: 5s
)";

class CascadePolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::create(config_of(kConfig), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  AdmitResult admit(std::vector<std::string> exclude = {}) {
    std::vector<CallAttribute> at;
    for (const std::string& node : exclude) at.push_back({"exclude", node});
    auto r = engine_->admit(AdmitCall{.policy = "replicas", .attributes = at});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : AdmitResult{};
  }
  void release(const AdmitResult& a, CallResult result) {
    ASSERT_TRUE(a.admitted);
    auto r = engine_->release(a.lease_id, result, milliseconds(3));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  // The policy's state, its nodes by name.
  std::map<std::string, nlohmann::json> nodes() {
    std::map<std::string, nlohmann::json> out;
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == "replicas") {
        const nlohmann::json state = nlohmann::json::parse(p.state_json);
        for (const nlohmann::json& n : state["nodes"]) out[n["name"].get<std::string>()] = n;
      }
    return out;
  }

  ManualClock clock_{seconds(1'000)};
  std::unique_ptr<Engine> engine_;
};

TEST_F(CascadePolicyTest, AdmitNamesTheChosenNodeAndHonoursExclude) {
  const AdmitResult a = admit();
  ASSERT_TRUE(a.admitted);
  EXPECT_TRUE(a.chosen == "db-1" || a.chosen == "db-2") << a.chosen;
  const std::string other = a.chosen == "db-1" ? "db-2" : "db-1";
  for (int i = 0; i < 20; ++i) {
    const AdmitResult b = admit({a.chosen});
    EXPECT_EQ(b.chosen, other);
    release(b, CallResult::kSuccess);
  }
  release(a, CallResult::kSuccess);
  EXPECT_EQ(nodes()[other]["in_flight"], 0);
}

TEST_F(CascadePolicyTest, EveryNodeFullIsA503NamingWhy) {
  std::vector<AdmitResult> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(admit());
    ASSERT_TRUE(held.back().admitted);
  }
  const AdmitResult refused = admit();
  ASSERT_FALSE(refused.admitted);
  EXPECT_EQ(refused.refusal.status, 503);
  EXPECT_EQ(refused.refusal.policy, "replicas");
  EXPECT_EQ(refused.refusal.current_in_flight, 4u);
  EXPECT_EQ(refused.refusal.max_concurrent, 4u);
  EXPECT_EQ(refused.refusal.detail(),
            "Policy replicas: cascade: every node is at its concurrency limit (2 tried)");
  const AdmitResult excluded = admit({"db-1"});
  EXPECT_EQ(excluded.refusal.detail(),
            "Policy replicas: cascade: every node is at its concurrency limit (1 tried, 1 "
            "excluded)");
  for (const AdmitResult& a : held) release(a, CallResult::kSuccess);
  EXPECT_TRUE(admit().admitted);
}

TEST_F(CascadePolicyTest, ReleaseOutcomesReachTheNodesHealthGuardAndBreaker) {
  // db-1 succeeds; db-2 fails three calls in a row (sent there by excluding db-1): a timeout
  // (Release's dropped: a drop to its limit), a failed call (no latency evidence), a drop.
  for (int i = 0; i < 5; ++i) release(admit({"db-2"}), CallResult::kSuccess);
  for (const CallResult r : {CallResult::kDropped, CallResult::kFailed, CallResult::kDropped}) {
    const AdmitResult a = admit({"db-1"});
    ASSERT_EQ(a.chosen, "db-2");
    release(a, r);
  }
  std::map<std::string, nlohmann::json> n = nodes();
  EXPECT_EQ(n["db-1"]["success_rate"], 1.0);
  EXPECT_EQ(n["db-2"]["success_rate"], 0.0);
  EXPECT_EQ(n["db-2"]["weight"], 0.0);
  EXPECT_EQ(n["db-2"]["basis"], "recent");
  EXPECT_EQ(n["db-2"]["buckets"][0]["finished"], 3);
  EXPECT_EQ(n["db-2"]["buckets"][0]["succeeded"], 0);
  for (const PolicyInfo& p : engine_->policies())
    if (p.name == "replicas") {
      EXPECT_EQ(p.in_flight, 0u);
    }
  // Three failures in a row opened its breaker: it is skipped without a permit being taken.
  EXPECT_EQ(n["db-2"]["breaker"]["state"], "open");
  EXPECT_EQ(n["db-2"]["breaker"]["opened"], 1);
  EXPECT_EQ(n["db-1"]["breaker"]["state"], "closed");
  const AdmitResult refused = admit({"db-1"});
  ASSERT_FALSE(refused.admitted);
  EXPECT_EQ(refused.refusal.detail(),
            "Policy replicas: cascade: every node is at its concurrency limit or open (0 tried, 1 "
            "with an open circuit breaker, 1 excluded)");
  // After its spell a probe goes through; its success closes the breaker.
  clock_.advance(seconds(5));
  const AdmitResult probe = admit({"db-1"});
  ASSERT_EQ(probe.chosen, "db-2");
  EXPECT_EQ(nodes()["db-2"]["breaker"]["state"], "half_open");
  release(probe, CallResult::kSuccess);
  n = nodes();
  EXPECT_EQ(n["db-2"]["breaker"]["state"], "closed");
  // An ignored call is counted nowhere.
  const AdmitResult i = admit();
  release(i, CallResult::kIgnored);
  EXPECT_EQ(nodes()[i.chosen]["buckets"][0]["finished"], n[i.chosen]["buckets"][0]["finished"]);
  // The metrics show each node (db-2: its three failures, then the probe's success in a newer
  // bucket that weighs three times as much: 3 / 6).
  const std::string m = engine_->metrics_text();
  for (const char* series : {
           "sluice_cascade_node_success_rate{policy=\"replicas\",node=\"db-2\"} 0.5\n",
           "sluice_cascade_node_weight{policy=\"replicas\",node=\"db-2\"} 0.125\n",
           "sluice_cascade_node_breaker_state{policy=\"replicas\",node=\"db-2\",state=\"closed\"} "
           "1\n",
           "sluice_cascade_node_breaker_state{policy=\"replicas\",node=\"db-2\",state=\"open\"} "
           "0\n",
           "sluice_cascade_node_calls{policy=\"replicas\",node=\"db-2\",result=\"failure\"} 3\n",
           "sluice_cascade_node_in_flight{policy=\"replicas\",node=\"db-1\"} 0\n",
           "sluice_cascade_node_limit{policy=\"replicas\",node=\"db-1\"} 2\n",
       })
    EXPECT_NE(m.find(series), std::string::npos) << series << " not in\n" << m;
}

TEST_F(CascadePolicyTest, AReloadThatAddsAndRemovesNodesKeepsTheOthersHealthAndLeases) {
  // db-1 learns it is healthy; db-2 holds a lease across the reload that removes it.
  for (int i = 0; i < 10; ++i) {
    const AdmitResult a = admit({"db-2"});
    release(a, CallResult::kSuccess);
  }
  const AdmitResult on_2 = admit({"db-1"});
  ASSERT_EQ(on_2.chosen, "db-2");
  std::string next = kConfig;
  next.replace(next.find("      db-2: {algorithm: fixed, limit: 2}"),
               std::string("      db-2: {algorithm: fixed, limit: 2}").size(),
               "      db-1b: {algorithm: fixed, limit: 1}");
  // db-1's limit changes too: taken in place.
  next.replace(next.find("db-1: {algorithm: fixed, limit: 2}"),
               std::string("db-1: {algorithm: fixed, limit: 2}").size(),
               "db-1: {algorithm: fixed, limit: 3}");
  auto r = engine_->reload(config_of(next));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"replicas"});
  std::map<std::string, nlohmann::json> n = nodes();
  ASSERT_EQ(n.size(), 3u);
  EXPECT_EQ(n["db-1"]["buckets"][0]["finished"], 10);  // its health survived
  EXPECT_EQ(n["db-1"]["limit"], 3);
  EXPECT_EQ(n["db-1b"]["basis"], "clean_slate");
  // The removed node is shown while its lease runs, and counted.
  EXPECT_EQ(n["db-2"]["removed"], true);
  EXPECT_EQ(n["db-2"]["in_flight"], 1);
  // The removed node's lease releases into it, and it is never chosen again.
  release(on_2, CallResult::kSuccess);
  for (int i = 0; i < 20; ++i) {
    const AdmitResult a = admit();
    EXPECT_NE(a.chosen, "db-2");
    release(a, CallResult::kSuccess);
  }
  // Another field changed (the buckets): a new cascade on the same nodes and guards, taken in
  // place; its buckets are of another make, so health starts clean.
  const AdmitResult across = admit({"db-1b"});
  ASSERT_EQ(across.chosen, "db-1");
  next.replace(next.find("    breaker:"), 0, "    buckets: 4\n");
  r = engine_->reload(config_of(next));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"replicas"});
  EXPECT_EQ(nodes()["db-1"]["basis"], "clean_slate");
  EXPECT_EQ(nodes()["db-1"]["in_flight"], 1);  // the call held across it still counts
  release(across, CallResult::kSuccess);
  EXPECT_EQ(nodes()["db-1"]["in_flight"], 0);
}

TEST_F(CascadePolicyTest, ANodeRemovedAndAddedBackWhileItsCallsRunKeepsItsLimitAndRecord) {
  // db-2 fails a call, then holds its 2 slots across a reload that removes it and one that adds
  // it back (with the same fields).
  release(admit({"db-1"}), CallResult::kFailed);
  const AdmitResult first = admit({"db-1"}), second = admit({"db-1"});
  ASSERT_EQ(first.chosen, "db-2");
  ASSERT_EQ(second.chosen, "db-2");
  std::string without = kConfig;
  without.erase(without.find("      db-2: {algorithm: fixed, limit: 2}\n"),
                std::string("      db-2: {algorithm: fixed, limit: 2}\n").size());
  ASSERT_TRUE(engine_->reload(config_of(without)).ok());
  EXPECT_EQ(nodes()["db-2"]["removed"], true);
  ASSERT_TRUE(engine_->reload(config_of(kConfig)).ok());
  std::map<std::string, nlohmann::json> n = nodes();
  EXPECT_FALSE(n["db-2"].contains("removed"));
  EXPECT_EQ(n["db-2"]["in_flight"], 2);
  EXPECT_EQ(n["db-2"]["success_rate"], 0);  // its record too
  // 2 of 2 still: db-2 is not chosen, and with db-1 excluded the call is refused.
  const AdmitResult refused = admit({"db-1"});
  EXPECT_FALSE(refused.admitted);
  release(first, CallResult::kSuccess);
  release(second, CallResult::kSuccess);
  EXPECT_EQ(nodes()["db-2"]["in_flight"], 0);
}

TEST_F(CascadePolicyTest, ACallExcludingEveryNodeIsToldSo) {
  const AdmitResult r = admit({"db-1", "db-2"});
  ASSERT_FALSE(r.admitted);
  EXPECT_NE(r.refusal.detail().find("every node is excluded"), std::string::npos)
      << r.refusal.detail();
}

TEST_F(CascadePolicyTest, BadExcludeListsAreNamed) {
  const CallAttribute empty_name[] = {{"exclude", ""}};
  auto r = engine_->admit(AdmitCall{.policy = "replicas", .attributes = empty_name});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().find("exclude: "), 0u) << r.status().message();
  const std::vector<CallAttribute> many(129, CallAttribute{"exclude", "db-1"});
  r = engine_->admit(AdmitCall{.policy = "replicas", .attributes = many});
  EXPECT_EQ(r.status().message(), "exclude: at most 128 nodes, not 129");
  EXPECT_EQ(engine_->leases(), 0u);
}

TEST(CascadePolicyConfig, FieldsAreCheckedByName) {
  const ConfigLoad l = load_config(R"(
policies:
  a:
    kind: cascade
    nodes: {}
    order: sideways
    breaker: {failures: 0, open_for: 10s, max_open_for: 5s}
  b:
    kind: cascade
    nodes:
      n1: {algorithm: fixed}
      "": {algorithm: fixed, limit: 1}
    revive_share: 2
  c:
    kind: cascade
    nodes:
      n1: {algorithm: fixed, limit: 1}
    revive_every: 0s
)",
                                   PolicyRegistry::builtin());
  ASSERT_FALSE(l.config.has_value());
  std::map<std::string, std::string> errors;
  for (const ConfigError& e : l.errors) errors[e.path] = e.message;
  EXPECT_EQ(errors["policies.a.nodes"], "must name at least one node");
  EXPECT_NE(errors["policies.a.order"].find("sideways"), std::string::npos);
  EXPECT_NE(errors.count("policies.a.breaker.failures"), 0u);
  EXPECT_EQ(errors["policies.b.nodes.n1.limit"], "is required for the fixed algorithm");
  EXPECT_NE(errors["policies.b.nodes."].find("must not be empty"), std::string::npos);
  EXPECT_NE(errors["policies.b.revive_share"].find("0..1"), std::string::npos);
  EXPECT_EQ(errors.count("policies.c.revive_every"), 0u);  // 0s: no revival calls
  for (const auto& [path, message] : errors) EXPECT_NE(path.rfind("policies.c", 0), 0u) << path;
}

}  // namespace
}  // namespace sluice::server
