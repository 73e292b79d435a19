// A fleet policy across a config reload: a changed spec that keeps the same coordinator, key,
// algorithm and call deadline is taken in place (the guard keeps its membership, share and
// in-flight calls); anything else is rebuilt. The engine on the steady clock with the
// embedded memory coordinator (its runner beats every 20 ms): a few hundred milliseconds.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/engine.h"
#include "sluice/config/config.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The fleet policy f: a fixed limit of `limit`, heartbeat `heartbeat`, call deadline
// `deadline` (set: its default follows the lease and the heartbeat), plus `extra` fields.
std::string fleet_yaml(int limit = 4, const std::string& heartbeat = "20ms",
                       const std::string& deadline = "5ms", const std::string& extra = "") {
  return "policies:\n  f:\n    kind: fleet\n    algorithm: fixed\n    limit: " +
         std::to_string(limit) + "\n    heartbeat: " + heartbeat +
         "\n    call_deadline: " + deadline + "\n" + extra;
}

class FleetReload : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::create(config_of(fleet_yaml()), SteadyClock::instance());
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
    const auto until = std::chrono::steady_clock::now() + seconds(10);
    while (!engine_->readiness().ready && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(milliseconds(5));
    ASSERT_TRUE(engine_->readiness().ready);
  }

  AdmitResult admit() {
    auto r = engine_->admit(AdmitCall{"f", "k"});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r.value()) : AdmitResult{};
  }
  nlohmann::json state() {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == "f") return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy f";
    return {};
  }

  std::unique_ptr<Engine> engine_;
};

TEST_F(FleetReload, AChangedHeartbeatIsTakenInPlaceKeepingInFlightAndMembership) {
  const AdmitResult a = admit(), b = admit();
  ASSERT_TRUE(a.admitted && b.admitted);
  ASSERT_TRUE(a.call_deadline.has_value());  // the Admit result carries the call's deadline
  EXPECT_LE(*a.call_deadline, SteadyClock::instance().now() + milliseconds(5));
  const std::uint64_t generation = state()["generation"].get<std::uint64_t>();
  auto r = engine_->reload(config_of(fleet_yaml(4, "30ms", "5ms", "    outage: local-only\n")));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"f"});
  EXPECT_TRUE(r.value().changed.empty());
  // The same guard: its two calls still count against its limit of 4, and it beats on.
  const nlohmann::json s = state();
  EXPECT_EQ(s["in_flight"], 2);
  EXPECT_EQ(s["nodes"], 1);
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while (state()["generation"].get<std::uint64_t>() <= generation + 2 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_GT(state()["generation"].get<std::uint64_t>(), generation + 2);
  EXPECT_EQ(state()["phase"], "active");
  EXPECT_TRUE(admit().admitted);
  EXPECT_TRUE(admit().admitted);
  EXPECT_FALSE(admit().admitted);  // 4 of 4: the two from before the reload count
  EXPECT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  EXPECT_TRUE(admit().admitted);
}

TEST_F(FleetReload, AChangedAlgorithmOrDeadlineIsRebuilt) {
  auto r = engine_->reload(config_of(fleet_yaml(5)));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().changed, std::vector<std::string>{"f"});
  // The permits' deadlines were given under the old deadline: a new one is a new guard.
  r = engine_->reload(config_of(fleet_yaml(5, "20ms", "6ms")));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().changed, std::vector<std::string>{"f"});
}

}  // namespace
}  // namespace sluice::server
