// Reloads of the local concurrency kinds in the engine: a changed adaptive (fixed or learned)
// or concurrency (gateway) policy takes its new spec in place, so leases held across the
// reload stay counted against the new limits (a lowered limit drains, it never over-admits),
// release into the reconfigured policy exactly once, and an adaptive policy keeps what it
// learned when only its bounds change. A gateway upstream the reload removes still counts
// against its tenant's global limit until its leases are released; one it adds starts at zero.
// Then threads admit and release while reloads keep changing the limits (TSan runs this
// file): holders never exceed the largest limit in force and every permit comes back.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "sluice/config/config.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string fixed(int limit) {
  return "policies:\n  a:\n    kind: adaptive\n    algorithm: fixed\n    limit: " +
         std::to_string(limit) + "\n";
}

std::string adaptive(const std::string& fields) {
  return "policies:\n  a:\n    kind: adaptive\n" + fields;
}

// acme (global limit `global`) owns llm (max `llm`) and, when `db` is set, db (unlimited).
std::string gateway(int global, int llm, bool db) {
  std::string y =
      "policies:\n  g:\n    kind: concurrency\n    tenants:\n      - id: acme\n"
      "        global_concurrency_limit: " +
      std::to_string(global) +
      "\n    upstreams:\n      - id: llm\n        host: llm.internal\n        owner: acme\n"
      "        concurrency_limit:\n          max_concurrent: " +
      std::to_string(llm) + "\n";
  if (db) y += "      - id: db\n        host: db.internal\n        owner: acme\n";
  return y;
}

class ReloadTest : public ::testing::Test {
 protected:
  void start(const std::string& yaml) {
    auto e = Engine::create(config_of(yaml), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  void reload(const std::string& yaml, const std::string& in_place) {
    auto r = engine_->reload(config_of(yaml));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{in_place});
    EXPECT_TRUE(r.value().changed.empty());
  }
  std::string admit(std::string_view policy, std::string_view upstream = {}) {
    const CallAttribute at[] = {{"tenant", "acme"}, {"upstream", upstream}};
    auto r = engine_->admit(AdmitCall{
        .policy = policy, .key = "k", .attributes = std::span(at, upstream.empty() ? 0 : 2)});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() && r.value().admitted ? r.value().lease_id : std::string();
  }
  void release(const std::string& lease) {
    ASSERT_FALSE(lease.empty());
    auto r = engine_->release(lease, CallResult::kSuccess, milliseconds(1));
    EXPECT_TRUE(r.ok()) << r.status().to_string();
  }
  nlohmann::json state(std::string_view policy) {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return {};
  }

  ManualClock clock_{seconds(100)};
  std::unique_ptr<Engine> engine_;
};

TEST_F(ReloadTest, ALoweredFixedLimitStillCountsTheHeldLease) {
  start(fixed(3));
  const std::string held = admit("a");
  ASSERT_FALSE(held.empty());
  reload(fixed(1), "a");
  EXPECT_EQ(state("a")["limit"], 1);
  EXPECT_EQ(state("a")["in_flight"], 1);
  EXPECT_TRUE(admit("a").empty()) << "2 in flight against a limit of 1";
  release(held);
  const std::string next = admit("a");
  EXPECT_FALSE(next.empty());
  EXPECT_TRUE(admit("a").empty());
  release(next);
  EXPECT_EQ(state("a")["in_flight"], 0);
  EXPECT_EQ(state("a")["leases"], 0);
  EXPECT_EQ(state("a")["released"], 2);
}

// A policy removed by one reload while its calls run and added back by the next goes on with
// the counts they hold: no second limit's worth is admitted beside them (each kind that
// counts calls in flight: adaptive, concurrency, cascade).
TEST_F(ReloadTest, APolicyRemovedAndAddedBackWhileItsCallsRunKeepsTheirCount) {
  const std::string other = "  other:\n    kind: adaptive\n    algorithm: fixed\n    limit: 1\n";
  const std::string cascade =
      "policies:\n  c:\n    kind: cascade\n    nodes:\n      n1: {algorithm: fixed, limit: 1}\n";
  struct Case {
    std::string yaml, policy, upstream;
  };
  for (const Case& k :
       {Case{fixed(1), "a", ""}, Case{gateway(5, 1, false), "g", "llm"}, Case{cascade, "c", ""}}) {
    SCOPED_TRACE(k.policy);
    start(k.yaml);
    const std::string held = admit(k.policy, k.upstream);
    ASSERT_FALSE(held.empty());
    auto r = engine_->reload(config_of("policies:\n" + other));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    r = engine_->reload(config_of(k.yaml));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().added, std::vector<std::string>{k.policy});
    EXPECT_EQ(state(k.policy)["in_flight"], 1);
    EXPECT_TRUE(admit(k.policy, k.upstream).empty()) << "2 in flight against a limit of 1";
    release(held);  // into the policy it was admitted by, counted off the one serving now
    EXPECT_EQ(state(k.policy)["in_flight"], 0);
    const std::string next = admit(k.policy, k.upstream);
    EXPECT_FALSE(next.empty());
    release(next);
  }
  // Once its calls have ended, a removed policy is forgotten: added back, it starts afresh.
  start(fixed(1));
  release(admit("a"));
  ASSERT_TRUE(engine_->reload(config_of("policies:\n" + other)).ok());
  ASSERT_TRUE(engine_->reload(config_of(fixed(1))).ok());
  EXPECT_EQ(state("a")["admitted"], 0);
}

TEST_F(ReloadTest, ALoweredLimitDrainsAndNeverOverAdmits) {
  start(fixed(3));
  const std::string x = admit("a");
  const std::string y = admit("a");
  ASSERT_FALSE(x.empty() || y.empty());
  reload(fixed(1), "a");
  EXPECT_TRUE(admit("a").empty());
  release(x);
  EXPECT_TRUE(admit("a").empty()) << "1 still held against a limit of 1";
  release(y);
  const std::string z = admit("a");
  EXPECT_FALSE(z.empty());
  EXPECT_TRUE(admit("a").empty());
  // A lease already released cannot be released again, before or after a reload.
  reload(fixed(2), "a");
  EXPECT_EQ(engine_->release(x, CallResult::kSuccess, std::nullopt).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(state("a")["in_flight"], 1);
  release(z);
  EXPECT_EQ(state("a")["in_flight"], 0);
}

TEST_F(ReloadTest, AnAdaptiveLimitKeepsWhatItLearnedClampedToNewBoundsAndRestartsOnANewAlgorithm) {
  start(adaptive(
      "    algorithm: aimd\n    initial_limit: 50\n    min_limit: 1\n    max_limit: 100\n"));
  const std::string held = admit("a");
  reload(
      adaptive("    algorithm: aimd\n    initial_limit: 20\n    min_limit: 1\n    max_limit: 30\n"),
      "a");
  EXPECT_EQ(state("a")["limit"], 30) << "the learned 50, clamped to the new max";
  reload(
      adaptive("    algorithm: aimd\n    initial_limit: 5\n    min_limit: 1\n    max_limit: 200\n"),
      "a");
  EXPECT_EQ(state("a")["limit"], 30) << "kept: only bounds (and the unused initial) changed";
  reload(adaptive(
             "    algorithm: aimd\n    initial_limit: 50\n    min_limit: 40\n    max_limit: 200\n"),
         "a");
  EXPECT_EQ(state("a")["limit"], 40) << "raised to the new min";
  reload(adaptive("    algorithm: vegas\n    initial_limit: 7\n    max_limit: 200\n"), "a");
  EXPECT_EQ(state("a")["limit"], 7) << "another algorithm starts at its initial limit";
  EXPECT_EQ(state("a")["algorithm"], "vegas");
  EXPECT_EQ(state("a")["in_flight"], 1) << "the lease held across every reload";
  release(held);
  EXPECT_EQ(state("a")["in_flight"], 0);
  EXPECT_EQ(state("a")["leases"], 0);
}

TEST_F(ReloadTest, ALoweredGatewayLimitStillCountsTheHeldLease) {
  start(gateway(10, 3, false));
  const std::string held = admit("g", "llm");
  ASSERT_FALSE(held.empty());
  reload(gateway(10, 1, false), "g");
  EXPECT_TRUE(admit("g", "llm").empty()) << "2 in flight against a max of 1";
  release(held);
  const std::string next = admit("g", "llm");
  EXPECT_FALSE(next.empty());
  EXPECT_TRUE(admit("g", "llm").empty());
  release(next);
  EXPECT_EQ(state("g")["in_flight"], 0);
}

TEST_F(ReloadTest, ALoweredTenantLimitDrainsAcrossUpstreams) {
  start(gateway(3, 5, true));
  const std::string x = admit("g", "llm");
  const std::string y = admit("g", "db");
  ASSERT_FALSE(x.empty() || y.empty());
  reload(gateway(1, 5, true), "g");
  EXPECT_TRUE(admit("g", "llm").empty());
  release(x);
  EXPECT_TRUE(admit("g", "db").empty());
  release(y);
  const std::string z = admit("g", "db");
  EXPECT_FALSE(z.empty());
  EXPECT_TRUE(admit("g", "llm").empty());
  release(z);
}

TEST_F(ReloadTest, ARemovedUpstreamCountsAgainstItsTenantUntilReleasedAndAnAddedOneStartsAtZero) {
  start(gateway(2, 5, true));
  const std::string on_db = admit("g", "db");
  ASSERT_FALSE(on_db.empty());
  reload(gateway(2, 5, false), "g");  // db removed
  const CallAttribute db[] = {{"tenant", "acme"}, {"upstream", "db"}};
  auto gone = engine_->admit(AdmitCall{.policy = "g", .attributes = db});
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  const std::string on_llm = admit("g", "llm");
  EXPECT_FALSE(on_llm.empty());
  EXPECT_TRUE(admit("g", "llm").empty()) << "the lease on the removed db still counts";
  EXPECT_EQ(state("g")["draining_gateways"], 1) << "the lease on db holds the old gateway";
  release(on_db);  // releases into the old gateway, and the tenant's shared count
  EXPECT_EQ(state("g")["draining_gateways"], 0);
  const std::string again = admit("g", "llm");
  EXPECT_FALSE(again.empty());
  release(on_llm);
  release(again);
  reload(gateway(2, 1, true), "g");  // db back, as a new upstream: nothing counted on it
  const std::string fresh = admit("g", "db");
  EXPECT_FALSE(fresh.empty());
  release(fresh);
  EXPECT_EQ(state("g")["in_flight"], 0);
  EXPECT_EQ(state("g")["leases"], 0);
}

// Threads admit and release (holding each lease across a yield) while the main thread reloads
// with limits that alternate between 1 and `most` (six threads, so a reload that forgot the
// leases in flight would let more in): the holders the test counts never exceed `most`, and when
// all is done every permit has come back (nothing in flight, no lease, as many released as
// admitted).
void churn(Engine& engine, AdmitCall call, const std::vector<std::string>& configs, int most) {
  std::atomic<bool> done{false};
  std::atomic<int> holders{0}, peak{0};
  std::atomic<long> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      while (!done.load()) {
        auto r = engine.admit(call);
        if (!r.ok() || !r.value().admitted) continue;
        const int now = holders.fetch_add(1) + 1;
        int seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
        admitted.fetch_add(1);
        std::this_thread::yield();
        holders.fetch_sub(1);
        (void)engine.release(r.value().lease_id, CallResult::kSuccess, milliseconds(1));
      }
    });
  for (int i = 0; i < 200; ++i) {
    auto r = engine.reload(config_of(configs[static_cast<std::size_t>(i) % configs.size()]));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(r.value().changed.empty());
  }
  done.store(true);
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), most);
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(engine.leases(), 0u);
  for (const PolicyInfo& p : engine.policies()) {
    const nlohmann::json s = nlohmann::json::parse(p.state_json);
    EXPECT_EQ(s["in_flight"], 0) << p.name;
    EXPECT_EQ(s["released"], admitted.load()) << p.name;
    if (s.contains("draining_gateways")) {
      EXPECT_EQ(s["draining_gateways"], 0) << "every earlier gateway freed";
    }
  }
}

TEST(ReloadUnderLoad, AdaptiveNeverExceedsTheLargestLimitInForce) {
  const SteadyClock& clock = SteadyClock::instance();
  auto e = Engine::create(config_of(fixed(2)), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  churn(*e.value(), AdmitCall{"a", "k"}, {fixed(1), fixed(2)}, 2);
}

TEST(ReloadUnderLoad, GatewayNeverExceedsTheLargestLimitInForce) {
  const SteadyClock& clock = SteadyClock::instance();
  auto e = Engine::create(config_of(gateway(2, 2, true)), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const CallAttribute at[] = {{"tenant", "acme"}, {"upstream", "llm"}};
  churn(*e.value(), AdmitCall{.policy = "g", .attributes = at},
        {gateway(2, 1, false), gateway(1, 2, true), gateway(2, 2, true)}, 2);
}

// A cascade of one node: reloads alternate its limit and its other settings (each builds a new
// cascade on the same node), so calls held across a swap must stay counted.
TEST(ReloadUnderLoad, CascadeNeverExceedsTheLargestLimitInForce) {
  const auto cascade = [](int limit, const char* revive) {
    return "policies:\n  c:\n    kind: cascade\n    revive_every: " + std::string(revive) +
           "\n    nodes:\n      n1: {algorithm: fixed, limit: " + std::to_string(limit) + "}\n";
  };
  auto e = Engine::create(config_of(cascade(2, "5s")), SteadyClock::instance());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  churn(*e.value(), AdmitCall{.policy = "c"},
        {cascade(1, "5s"), cascade(2, "4s"), cascade(2, "5s"), cascade(1, "4s")}, 2);
}

}  // namespace
}  // namespace sluice::server
