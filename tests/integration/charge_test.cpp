// Charging after the response through the engine (Engine::charge, and a Release's cost): a
// charge is counted whatever the key has left, its overdraft waited out by the key's later
// checks; negative hits give back; a lease's cost goes to the key its chained rate policy was
// checked with; every malformed call is an error naming its field, and changes nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "server/engine.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const char* kConfig = R"(policies:
  tokens:
    kind: rate
    strategy: fixed-window
    limit: 100
    period: 1m
  bucket:
    kind: rate
    strategy: gcra
    limit: 10
    period: 1s
  shared:
    kind: federated
    coordinator: memory
    limit: 50
    window: 1m
    batch: 10
  few:
    kind: rate
    limit: 5
    period: 1m
    max_keys: 1
  llm:
    kind: adaptive
    algorithm: fixed
    limit: 5
    rate: tokens
  plain:
    kind: adaptive
    algorithm: fixed
    limit: 5
)";

class ChargeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::create(config_of(kConfig), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  RateCharge charge(std::string_view policy, std::string_view key, std::int64_t hits) {
    auto c = engine_->charge(CheckCall{policy, key, hits});
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? c.value() : RateCharge{};
  }
  bool allowed(std::string_view policy, std::string_view key, std::int64_t hits = 1) {
    auto d = engine_->check(CheckCall{policy, key, hits});
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() && d.value().allowed;
  }
  Status error(std::string_view policy, std::string_view key, std::int64_t hits) {
    return engine_->charge(CheckCall{policy, key, hits}).status();
  }
  nlohmann::json state(std::string_view policy) {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return {};
  }

  ManualClock clock_{std::chrono::hours(24)};  // a window's start for every period here
  std::unique_ptr<Engine> engine_;
};

TEST_F(ChargeTest, AChargeIsCountedWhateverIsLeftAndItsOverdraftIsWaitedOut) {
  ASSERT_TRUE(allowed("tokens", "u", 30));
  const RateCharge c = charge("tokens", "u", 90);  // the call used 90 more than it asked
  EXPECT_EQ(c.remaining, 0u);
  EXPECT_EQ(c.overdraft, 20u);
  EXPECT_EQ(c.retry_after, seconds(60));
  EXPECT_FALSE(allowed("tokens", "u"));
  clock_.advance(seconds(59));
  EXPECT_FALSE(allowed("tokens", "u")) << "the window that was overdrawn";
  clock_.advance(seconds(1));
  EXPECT_TRUE(allowed("tokens", "u", 100)) << "the next window";
  EXPECT_EQ(state("tokens")["charged"], 90);
  EXPECT_EQ(state("tokens")["overdrawn"], 1);
  EXPECT_NE(engine_->metrics_text().find("sluice_rate_charged_hits_total{policy=\"tokens\"} 90"),
            std::string::npos);
  // GCRA: the debt drains at the rule's rate, 100 ms a hit.
  const RateCharge g = charge("bucket", "u", 25);
  EXPECT_EQ(g.overdraft, 15u);
  EXPECT_EQ(g.retry_after, milliseconds(1600));
}

TEST_F(ChargeTest, NegativeHitsGiveBackWhatACheckTookBeyondTheCost) {
  ASSERT_TRUE(allowed("tokens", "u", 100));  // reserved the most the call could cost
  EXPECT_FALSE(allowed("tokens", "u"));
  const RateCharge c = charge("tokens", "u", -60);  // it cost 40
  EXPECT_EQ(c.remaining, 60u);
  EXPECT_TRUE(allowed("tokens", "u", 60));
  EXPECT_FALSE(allowed("tokens", "u"));
  // Never more than the key spent: a give-back of 500 leaves a whole window, not more.
  EXPECT_EQ(charge("tokens", "u", -500).remaining, 100u);
  EXPECT_FALSE(allowed("tokens", "u", 101));
}

// Federated: the escrow first, the rest leased from the coordinator in the background; the
// window's checks never pass its limit, and what no budget covers is forgiven with the window.
TEST_F(ChargeTest, AFederatedChargeSpendsEscrowThenTheGlobalBudget) {
  ASSERT_TRUE(allowed("shared", "k", 5));
  const RateCharge c = charge("shared", "k", 40);
  EXPECT_EQ(c.limit, 50u);
  EXPECT_GT(c.pending, 0u) << "more than the escrow held";
  // The lease runs on the policy's I/O threads: wait for it to settle.
  for (int i = 0; i < 200 && state("shared")["spent"] != 45; ++i)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(state("shared")["spent"], 45);
  int admitted = 0;
  for (int i = 0; i < 10; ++i) admitted += allowed("shared", "k") ? 1 : 0;
  EXPECT_EQ(admitted, 5) << "45 of 50 spent";
  const RateCharge over = charge("shared", "k", 7);
  EXPECT_EQ(over.overdraft, 7u) << "the window is spent: forgiven at its end";
  EXPECT_EQ(state("shared")["forgiven"], 7);
  clock_.advance(seconds(60));
  EXPECT_TRUE(allowed("shared", "k", 10)) << "the next window starts whole";
}

TEST_F(ChargeTest, AReleasesCostGoesToTheChainedRateKey) {
  auto a = engine_->admit(AdmitCall{"llm", "team-a"});
  ASSERT_TRUE(a.ok() && a.value().admitted);
  auto r = engine_->release(a.value().lease_id, CallResult::kSuccess, std::nullopt, 70);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(r.value().charged);
  EXPECT_EQ(r.value().charged->remaining, 30u) << "1 at the admit, 69 at the release";
  // A cost of 0 gives the admit's hit back.
  auto b = engine_->admit(AdmitCall{"llm", "team-a"});
  ASSERT_TRUE(b.ok() && b.value().admitted);
  auto zero = engine_->release(b.value().lease_id, CallResult::kSuccess, std::nullopt, 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero.value().charged->remaining, 30u);
  // Without a cost, nothing is charged and nothing said of it.
  auto c = engine_->admit(AdmitCall{"llm", "team-a"});
  auto none =
      engine_->release(c.value().lease_id, CallResult::kSuccess, std::nullopt, std::nullopt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none.value().charged);
  // A policy that chains no rate policy: the lease is released, the cost refused by name.
  auto d = engine_->admit(AdmitCall{"plain", "k"});
  ASSERT_TRUE(d.ok() && d.value().admitted);
  const auto plain = engine_->release(d.value().lease_id, CallResult::kSuccess, std::nullopt, 3);
  EXPECT_EQ(plain.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(plain.status().message().find("cost:"), std::string::npos);
  EXPECT_EQ(engine_->leases(), 0u) << "released all the same";
  // A bad cost is refused before anything is done.
  auto e = engine_->admit(AdmitCall{"llm", "team-a"});
  const auto bad = engine_->release(e.value().lease_id, CallResult::kSuccess, std::nullopt, -1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cost: must be between 0 and"), std::string::npos);
  EXPECT_EQ(engine_->leases(), 1u) << "still held";
}

TEST_F(ChargeTest, BadChargesNameWhatWasWrongAndRecordNothing) {
  EXPECT_EQ(error("tokens", "u", 0).message(), "hits: must not be 0 (> 0 charges, < 0 gives back)");
  EXPECT_EQ(error("tokens", "u", 1'000'000'001).message(),
            "hits: must be between -1000000000 and 1000000000, not 1000000001");
  EXPECT_EQ(error("tokens", "", 1).message(), "key: must not be empty");
  EXPECT_EQ(error("nope", "u", 1).code(), StatusCode::kNotFound);
  const Status admit_kind = error("llm", "u", 1);
  EXPECT_EQ(admit_kind.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(admit_kind.message().find("Charge takes"), std::string::npos) << admit_kind.message();
  EXPECT_NE(admit_kind.message().find("use Release with a cost"), std::string::npos);
  // A new key past max_keys is not recorded, and says so.
  charge("few", "a", 1);
  const Status full = error("few", "b", 1);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("the charge of new key 'b' was not recorded"), std::string::npos)
      << full.message();
  EXPECT_TRUE(allowed("tokens", "u", 100)) << "nothing was charged by the bad calls";
}

// The call a charge is for has happened: a draining server still records it, as it does a
// Release.
TEST_F(ChargeTest, ADrainingServerStillRecordsCharges) {
  engine_->drain();
  EXPECT_TRUE(engine_->charge(CheckCall{"tokens", "u", 100}).ok());
  EXPECT_EQ(engine_->check(CheckCall{"tokens", "u", 1}).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sluice::server
