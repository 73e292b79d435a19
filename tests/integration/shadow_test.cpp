// Shadow mode through the engine (server/shadow.h): a policy of every kind that runs in shadow
// decides and counts as configured but never refuses; what it would have refused is allowed
// with would_deny, debits nothing and is counted (sluice_shadow_denied_total, its state); the
// server's switch puts every policy in shadow; a reload turns it on and off.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const char* kPolicies = R"(
  r:
    kind: rate
    limit: 2
    period: 1m
  r2:
    kind: rate
    limit: 1
    period: 1m
  fed:
    kind: federated
    coordinator: memory
    limit: 1
    window: 1m
    batch: 1
  a:
    kind: adaptive
    algorithm: fixed
    limit: 1
  chained:
    kind: adaptive
    algorithm: fixed
    limit: 5
    rate: r2
  gw:
    kind: concurrency
    tenants:
      - id: acme
        global_concurrency_limit: 1
    upstreams:
      - id: llm
        host: llm.internal
        owner: acme
        concurrency_limit:
          max_concurrent: 5
  cascade:
    kind: cascade
    nodes:
      db-1: {algorithm: fixed, limit: 1}
  fleet:
    kind: fleet
    coordinator: memory
    algorithm: fixed
    limit: 1
    heartbeat: 20ms
)";

// Every policy in shadow, by its own field (`shadow: true` after each `kind:`) or by the
// server's switch.
std::string config(bool each, bool server_switch) {
  std::string policies = kPolicies;
  if (each) {
    const std::string field = "    shadow: true\n";
    for (std::size_t at = policies.find("    kind: "); at != std::string::npos;
         at = policies.find("    kind: ", at + field.size() + 1))
      policies.insert(at, field);
  }
  return std::string(server_switch ? "server:\n  shadow_mode: true\n" : "") +
         "policies:" + policies;
}

class ShadowTest : public ::testing::TestWithParam<bool> {
 protected:
  void serve(const std::string& text) {
    engine_.reset();
    auto e = Engine::create(config_of(text), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  RateDecision check(std::string_view policy, std::string_view key = "k") {
    auto d = engine_->check(CheckCall{policy, key, 1});
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() ? d.value() : RateDecision{};
  }
  AdmitResult admit(std::string_view policy, std::span<const CallAttribute> attributes = {}) {
    AdmitCall call{policy, "k"};
    call.attributes = attributes;
    auto r = engine_->admit(call);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : AdmitResult{};
  }
  nlohmann::json state(std::string_view policy) {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return {};
  }
  std::string denied_metric(std::string_view policy) {
    const std::string m = engine_->metrics_text();
    const std::string series =
        "sluice_shadow_denied_total{policy=\"" + std::string(policy) + "\"} ";
    const std::size_t at = m.find(series);
    if (at == std::string::npos) return "";
    return m.substr(at + series.size(), m.find('\n', at) - at - series.size());
  }
  void release(const AdmitResult& a) {
    ASSERT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  }
  // The policy's refusal of `second` after `first` holds its one permit: admitted in shadow,
  // would_deny with the refusal it would have been; its release gives nothing back, and the
  // policy held one permit, never two.
  void expect_shadow_admit(std::string_view policy, const AdmitResult& first,
                           const AdmitResult& second) {
    ASSERT_TRUE(first.admitted) << policy;
    EXPECT_FALSE(first.would_deny) << policy;
    ASSERT_TRUE(second.admitted) << policy << ": " << second.refusal.detail();
    EXPECT_TRUE(second.would_deny) << policy;
    EXPECT_NE(second.refusal.status, 0) << policy << ": the refusal it would have been";
    EXPECT_FALSE(second.lease_id.empty()) << policy;
    EXPECT_EQ(state(policy)["shadow_denied"], 1) << policy;
    EXPECT_EQ(denied_metric(policy), "1") << policy;
    release(second);
    release(first);
  }

  ManualClock clock_{seconds(600)};
  std::unique_ptr<Engine> engine_;
};

TEST_P(ShadowTest, EveryKindDecidesAndCountsButNeverRefuses) {
  serve(config(/*each=*/GetParam(), /*server_switch=*/!GetParam()));
  // rate: 2 a minute; the third would be refused.
  EXPECT_TRUE(check("r").allowed);
  const RateDecision second = check("r");
  EXPECT_TRUE(second.allowed);
  EXPECT_FALSE(second.would_deny);
  const RateDecision third = check("r");
  EXPECT_TRUE(third.allowed);
  EXPECT_TRUE(third.would_deny);
  EXPECT_GT(third.retry_after, Nanos{0}) << "what it would have answered";
  EXPECT_EQ(state("r")["shadow"], true);
  EXPECT_EQ(state("r")["shadow_denied"], 1);
  EXPECT_EQ(denied_metric("r"), "1");
  // Peek says the same, counting nothing.
  auto peek = engine_->peek(CheckCall{"r", "k", 1});
  ASSERT_TRUE(peek.ok());
  EXPECT_TRUE(peek.value().would_deny);
  EXPECT_EQ(denied_metric("r"), "1");

  // federated (memory coordinator, 1 a minute, batch 1): the second check waits for a lease
  // (deferred) that the spent budget refuses; that later answer is converted too.
  EXPECT_TRUE(check("fed").allowed);
  const RateDecision fed = check("fed");
  EXPECT_TRUE(fed.allowed);
  EXPECT_TRUE(fed.would_deny);
  EXPECT_EQ(fed.reason, "budget_spent");
  EXPECT_EQ(denied_metric("fed"), "1");

  // Admit kinds, each with one permit held: the next is admitted in shadow.
  const AdmitResult a1 = admit("a");
  expect_shadow_admit("a", a1, admit("a"));
  EXPECT_EQ(state("a")["in_flight"], 0) << "the shadow lease held no permit";
  const AdmitResult c1 = admit("cascade");
  expect_shadow_admit("cascade", c1, admit("cascade"));
  const CallAttribute llm[] = {{"tenant", "acme"}, {"upstream", "llm"}};
  const AdmitResult g1 = admit("gw", llm);
  expect_shadow_admit("gw", g1, admit("gw", llm));
  // fleet: its share comes from the coordinator's first grant.
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while (!engine_->readiness().ready && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  const AdmitResult f1 = admit("fleet");
  expect_shadow_admit("fleet", f1, admit("fleet"));

  // A chained rate policy in shadow passes the call on; the admit says what it would have been.
  EXPECT_TRUE(admit("chained").admitted);
  const AdmitResult chained = admit("chained");
  ASSERT_TRUE(chained.admitted);
  EXPECT_TRUE(chained.would_deny);
  EXPECT_EQ(chained.refusal.status, 429);
  EXPECT_EQ(chained.refusal.policy, "r2");
}

INSTANTIATE_TEST_SUITE_P(ByPolicyOrServer, ShadowTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Each" : "ServerSwitch"; });

// CheckMany: a would_deny check debited nothing, so when another check of the batch refuses,
// nothing is given back for it (a refund there would hand its key hits it never spent).
TEST(ShadowCheckMany, AWouldDenyCheckIsNeverRefunded) {
  ManualClock clock{seconds(600)};
  auto e = Engine::create(config_of(R"(
policies:
  r:
    kind: rate
    shadow: true
    limit: 1
    period: 1m
  strict:
    kind: rate
    limit: 1
    period: 1m
)"),
                          clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  ASSERT_TRUE(engine.check(CheckCall{"r", "k", 1}).value().allowed);  // r's one hit
  ASSERT_TRUE(engine.check(CheckCall{"strict", "k", 1}).value().allowed);
  const std::vector<CheckCall> both = {{"r", "k", 1}, {"strict", "k", 1}};
  auto many = engine.check_many(both);
  ASSERT_TRUE(many.ok()) << many.status().to_string();
  EXPECT_FALSE(many.value().allowed);
  EXPECT_EQ(many.value().denied_index, 1);
  EXPECT_TRUE(many.value().decisions[0].would_deny);
  // r is still spent: its next check would be refused, as before the batch.
  EXPECT_TRUE(engine.check(CheckCall{"r", "k", 1}).value().would_deny);
}

// An admitting policy in shadow covers the rate policy it chains: a call both would refuse is
// one call it would have refused, counted once on the admitting policy.
TEST(ShadowChained, ACallRefusedTwiceIsCountedOnce) {
  ManualClock clock{seconds(600)};
  auto e = Engine::create(config_of(R"(
policies:
  r:
    kind: rate
    limit: 1
    period: 1m
  a:
    kind: adaptive
    shadow: true
    algorithm: fixed
    limit: 1
    rate: r
)"),
                          clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  const AdmitResult first = engine.admit(AdmitCall{"a", "k"}).value();
  ASSERT_TRUE(first.admitted);
  EXPECT_FALSE(first.would_deny);
  const AdmitResult second = engine.admit(AdmitCall{"a", "k"}).value();  // r and a both refuse
  ASSERT_TRUE(second.admitted);
  EXPECT_TRUE(second.would_deny);
  EXPECT_NE(engine.metrics_text().find("sluice_shadow_denied_total{policy=\"a\"} 1"),
            std::string::npos)
      << engine.metrics_text();
}

// A reload turns shadow mode on and off; the count stays with the policy.
TEST(ShadowReload, TurnsOnAndOff) {
  ManualClock clock{seconds(600)};
  const std::string off = "policies:\n  r:\n    kind: rate\n    limit: 1\n    period: 1m\n";
  auto e = Engine::create(config_of(off), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  ASSERT_TRUE(engine.check(CheckCall{"r", "k", 1}).value().allowed);
  EXPECT_FALSE(engine.check(CheckCall{"r", "k", 1}).value().allowed);
  ASSERT_TRUE(engine.reload(config_of("server:\n  shadow_mode: true\n" + off)).ok());
  const RateDecision shadowed = engine.check(CheckCall{"r", "k", 1}).value();
  EXPECT_TRUE(shadowed.allowed);
  EXPECT_TRUE(shadowed.would_deny);
  ASSERT_TRUE(engine.reload(config_of(off)).ok());
  EXPECT_FALSE(engine.check(CheckCall{"r", "k", 1}).value().allowed);
  EXPECT_NE(engine.metrics_text().find("sluice_shadow_denied_total{policy=\"r\"} 1"),
            std::string::npos)
      << engine.metrics_text();
}

// Turning a policy's own `shadow` on and off keeps the policy (escrow, fleet membership, counts):
// it is how the policy is served, not what it is.
TEST(ShadowReload, APolicysOwnFieldKeepsThePolicy) {
  ManualClock clock{seconds(600)};
  const std::string on =
      "policies:\n  fed:\n    kind: federated\n    coordinator: memory\n    shadow: true\n"
      "    limit: 1\n    window: 1m\n";
  std::string off = on;
  off.erase(off.find("    shadow: true\n"), 17);
  auto e = Engine::create(config_of(off), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  ASSERT_TRUE(engine.check(CheckCall{"fed", "k", 1}).value().allowed);
  auto r = engine.reload(config_of(on));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().kept, std::vector<std::string>{"fed"});
  EXPECT_TRUE(engine.check(CheckCall{"fed", "k", 1}).value().would_deny);
  r = engine.reload(config_of(off));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().kept, std::vector<std::string>{"fed"});
  EXPECT_FALSE(engine.check(CheckCall{"fed", "k", 1}).value().allowed);
}

// A throttler has no shadow mode: `shadow` is refused there, not ignored.
TEST(ShadowConfig, IsRefusedWhereItHasNoMeaning) {
  const ConfigLoad load = load_yaml(R"(policies:
  t:
    kind: throttler
    shadow: true
)");
  bool found = false;
  for (const ConfigError& err : load.errors)
    found = found || err.to_string("c").find("policies.t.shadow") != std::string::npos;
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace sluice::server
