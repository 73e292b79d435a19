// The server's engine (src/server/engine.h), without a transport: policy chaining (a rate refusal
// takes no permit), CheckMany's all-or-nothing, bad input named by field, leases (expiry,
// heartbeat, unguessable ids, kept for the next call), reload (unchanged policies keep their
// permits; a failed reload changes nothing), drain, metrics, leaving a fleet on close, and starting
// while the fleet's Redis is down (over a real Redis).
#include "server/engine.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sluice/backends/redis_coordinator.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Waits up to `limit` for the engine to be ready (a fleet guard's beats come from its runner
// thread); whether it is, with the reasons it is not in the failure message.
::testing::AssertionResult ready_within(const Engine& engine, Nanos limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!engine.readiness().ready && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  const Readiness r = engine.readiness();
  if (r.ready) return ::testing::AssertionSuccess();
  std::string why;
  for (const std::string& p : r.problems) why += "\n  " + p;
  return ::testing::AssertionFailure() << "not ready after the wait:" << why;
}

const char* kBase = R"(
server:
  lease_ttl: 10s
  max_lease_ttl: 1m
policies:
  per-key:
    kind: rate
    strategy: fixed-window
    limit: 2
    period: 1s
  other:
    kind: rate
    strategy: gcra
    limit: 5
    period: 1s
  two:
    kind: adaptive
    algorithm: fixed
    limit: 2
  chained:
    kind: adaptive
    algorithm: fixed
    limit: 1
    rate: per-key
  gw:
    kind: concurrency
    rate: per-key
    tenants:
      - id: acme
        global_concurrency_limit: 1
    upstreams:
      - id: llm
        host: llm.internal
        owner: acme
        concurrency_limit:
          max_concurrent: 5
)";

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = Engine::create(config_of(kBase), clock_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  AdmitResult admit(std::string_view policy, std::string_view key = "k") {
    auto r = engine_->admit(AdmitCall{policy, key});
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value() : AdmitResult{};
  }
  std::uint64_t in_flight(std::string_view policy) {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == policy) return p.in_flight;
    ADD_FAILURE() << "no policy " << policy;
    return 0;
  }
  nlohmann::json state(std::string_view policy) {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == policy) return nlohmann::json::parse(p.state_json);
    ADD_FAILURE() << "no policy " << policy;
    return {};
  }
  static void expect_error(const Status& s, StatusCode code, std::string_view field) {
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_EQ(s.message().find(field), 0u)
        << "the message must start with the field: " << s.message();
  }

  ManualClock clock_{seconds(100)};
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, ARateRefusalTakesNoPermit) {
  // per-key allows 2 per second; chained's concurrency limit is 1.
  const AdmitResult a = admit("chained", "alice");
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(in_flight("chained"), 1u);
  // Rate passes (2nd hit), concurrency refuses: 503.
  const AdmitResult b = admit("chained", "alice");
  ASSERT_FALSE(b.admitted);
  EXPECT_EQ(b.refusal.status, 503);
  EXPECT_EQ(b.refusal.limit_kind(), "limit");
  // Release: concurrency is free again, but the rate is spent: 429, and no permit was taken.
  ASSERT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  const AdmitResult c = admit("chained", "alice");
  ASSERT_FALSE(c.admitted);
  EXPECT_EQ(c.refusal.status, 429);
  EXPECT_EQ(c.refusal.policy, "per-key");
  EXPECT_EQ(c.refusal.limit_kind(), "rate");
  EXPECT_GT(c.refusal.retry_after, Nanos{0});
  EXPECT_NE(problem_json(c.refusal).find("\"status\":429"), std::string::npos);
  EXPECT_EQ(in_flight("chained"), 0u);
  // Another key has its own rate.
  EXPECT_TRUE(admit("chained", "bob").admitted);
  // The next second, alice passes again.
  clock_.advance(seconds(1));
  const AdmitResult d = admit("chained", "carol");
  EXPECT_FALSE(d.admitted);  // bob holds the only slot
  EXPECT_EQ(d.refusal.status, 503);
}

TEST_F(EngineTest, AFailedCallIsNeitherLatencyEvidenceNorOverload) {
  // An adaptive limit learns nothing from a call that failed for another reason than overload:
  // it counts as ignored, never as dropped (which would lower the limit).
  const AdmitResult a = admit("two");
  ASSERT_TRUE(a.admitted);
  ASSERT_TRUE(engine_->release(a.lease_id, CallResult::kFailed, milliseconds(5)).ok());
  nlohmann::json s = state("two");
  EXPECT_EQ(s["ignored"], 1);
  EXPECT_EQ(s["dropped"], 0);
  EXPECT_EQ(s["released"], 1);
  EXPECT_EQ(s["in_flight"], 0);
  const AdmitResult b = admit("two");
  ASSERT_TRUE(b.admitted);
  ASSERT_TRUE(engine_->release(b.lease_id, CallResult::kDropped, milliseconds(5)).ok());
  s = state("two");
  EXPECT_EQ(s["ignored"], 1);
  EXPECT_EQ(s["dropped"], 1);
  EXPECT_EQ(s["released"], 2);
}

TEST_F(EngineTest, AConcurrencyPolicyIsKeyedByItsTenantAndRefusesAtItsLevel) {
  auto call = [&](std::string_view tenant) {
    const CallAttribute at[] = {{"tenant", tenant}, {"upstream", "llm"}};
    return engine_->admit(AdmitCall{.policy = "gw", .attributes = at});
  };
  auto a = call("acme");
  ASSERT_TRUE(a.ok() && a.value().admitted) << a.status().to_string();
  auto b = call("acme");  // the tenant's global limit is 1
  ASSERT_TRUE(b.ok());
  ASSERT_FALSE(b.value().admitted);
  EXPECT_EQ(b.value().refusal.status, 503);
  EXPECT_EQ(b.value().refusal.limit_kind(), "tenant");
  EXPECT_EQ(in_flight("gw"), 1u);
  // The rate (2 per second per tenant) is now spent: 429 before the gateway is asked.
  auto c = call("acme");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.value().refusal.status, 429);
  // An unknown tenant is an error that costs nothing.
  auto d = call("nobody");
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d.status().message(), "tenant: unknown tenant 'nobody'");  // the field's name first
  const CallAttribute no_tenant[] = {{"upstream", "llm"}};
  expect_error(engine_->admit(AdmitCall{.policy = "gw", .attributes = no_tenant}).status(),
               StatusCode::kInvalidArgument, "tenant");
  const CallAttribute two_tenants[] = {{"tenant", "acme"}, {"upstream", "llm"}, {"tenant", "x"}};
  expect_error(engine_->admit(AdmitCall{.policy = "gw", .attributes = two_tenants}).status(),
               StatusCode::kInvalidArgument, "tenant");
}

// Two phases: the gateway resolves the call (holding the generation it resolved on), the rate
// refuses it, and nothing is held after: a reload that replaces that generation frees it as
// soon as the last lease on it is released.
TEST_F(EngineTest, ACallTheRateRefusesBetweenThePhasesHoldsNothing) {
  const CallAttribute at[] = {{"tenant", "acme"}, {"upstream", "llm"}};
  auto a = engine_->admit(AdmitCall{.policy = "gw", .key = "k", .attributes = at});
  ASSERT_TRUE(a.ok() && a.value().admitted) << a.status().to_string();
  ASSERT_TRUE(engine_->release(a.value().lease_id, CallResult::kSuccess, std::nullopt).ok());
  auto b = engine_->admit(AdmitCall{.policy = "gw", .key = "k", .attributes = at});
  ASSERT_TRUE(b.ok() && b.value().admitted);
  {
    const auto refused = engine_->admit(AdmitCall{.policy = "gw", .key = "k", .attributes = at});
    ASSERT_TRUE(refused.ok());
    ASSERT_EQ(refused.value().refusal.status, 429) << "per-key's 2 per second are spent";
  }  // its views kept the rate policy alive, and nothing of the gateway's

  std::string next = kBase;
  next.replace(next.find("max_concurrent: 5"), 17, "max_concurrent: 4");
  auto r = engine_->reload(config_of(next));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r.value().reconfigured, std::vector<std::string>{"gw"});
  const auto draining = [&] {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == "gw") return nlohmann::json::parse(p.state_json)["draining_gateways"];
    return nlohmann::json();
  };
  EXPECT_EQ(draining(), 1) << "the held lease keeps the first gateway";
  ASSERT_TRUE(engine_->release(b.value().lease_id, CallResult::kSuccess, std::nullopt).ok());
  EXPECT_EQ(draining(), 0) << "and nothing else does";
  const nlohmann::json gw = [&] {
    for (const PolicyInfo& p : engine_->policies())
      if (p.name == "gw") return nlohmann::json::parse(p.state_json);
    return nlohmann::json();
  }();
  EXPECT_EQ(gw["refused_by_rate"], 1);
  EXPECT_EQ(gw["in_flight"], 0);
}

TEST_F(EngineTest, CheckManyIsAllOrNothing) {
  // per-key: 2 per window. A batch whose second check cannot pass debits nothing.
  const std::vector<CheckCall> batch = {{"other", "x", 3}, {"per-key", "y", 3}};
  auto r = engine_->check_many(batch);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value().allowed);
  EXPECT_EQ(r.value().denied_index, 1);
  auto peek = engine_->peek(CheckCall{"other", "x", 5});
  ASSERT_TRUE(peek.ok());
  EXPECT_TRUE(peek.value().allowed) << "the first check's 3 hits were not given back";
  // A batch that passes debits every check.
  auto ok = engine_->check_many(std::vector<CheckCall>{{"other", "x", 3}, {"per-key", "y", 2}});
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok.value().allowed);
  EXPECT_EQ(ok.value().decisions.size(), 2u);
  EXPECT_FALSE(engine_->check(CheckCall{"per-key", "y", 1}).value().allowed);
  EXPECT_EQ(engine_->check(CheckCall{"other", "x", 3}).value().allowed, false);
  // A bad entry is an error naming its index, before anything is debited.
  auto bad = engine_->check_many(std::vector<CheckCall>{{"other", "z", 1}, {"per-key", "", 1}});
  expect_error(bad.status(), StatusCode::kInvalidArgument, "checks[1].key");
  EXPECT_EQ(engine_->peek(CheckCall{"other", "z", 5}).value().allowed, true);
  expect_error(engine_->check_many({}).status(), StatusCode::kInvalidArgument, "checks");
}

TEST_F(EngineTest, BadInputIsNamedAndCostsNothing) {
  expect_error(engine_->check(CheckCall{"", "k", 1}).status(), StatusCode::kInvalidArgument,
               "policy");
  expect_error(engine_->check(CheckCall{"nope", "k", 1}).status(), StatusCode::kNotFound, "policy");
  expect_error(engine_->check(CheckCall{"per-key", "", 1}).status(), StatusCode::kInvalidArgument,
               "key");
  expect_error(engine_->check(CheckCall{"per-key", std::string(kMaxKeyBytes + 1, 'k'), 1}).status(),
               StatusCode::kInvalidArgument, "key");
  for (const std::int64_t hits : {std::int64_t{0}, std::int64_t{-1}, kMaxHits + 1})
    expect_error(engine_->check(CheckCall{"per-key", "k", hits}).status(),
                 StatusCode::kInvalidArgument, "hits");
  expect_error(engine_->check(CheckCall{"two", "k", 1}).status(), StatusCode::kFailedPrecondition,
               "policy");
  expect_error(engine_->admit(AdmitCall{"per-key", "k"}).status(), StatusCode::kFailedPrecondition,
               "policy");
  expect_error(engine_->admit(AdmitCall{"two", "k", Nanos{0}}).status(),
               StatusCode::kInvalidArgument, "ttl");
  expect_error(engine_->admit(AdmitCall{"two", "k", std::chrono::minutes(2)}).status(),
               StatusCode::kInvalidArgument, "ttl");
  expect_error(engine_->admit(AdmitCall{"chained", ""}).status(), StatusCode::kInvalidArgument,
               "key");
  expect_error(engine_->release("", CallResult::kSuccess, std::nullopt).status(),
               StatusCode::kInvalidArgument, "lease_id");
  expect_error(engine_->release("not-a-lease", CallResult::kSuccess, std::nullopt).status(),
               StatusCode::kInvalidArgument, "lease_id");
  expect_error(engine_->release(std::string(32, 'a'), CallResult::kSuccess, std::nullopt).status(),
               StatusCode::kNotFound, "lease_id");
  expect_error(engine_->heartbeat(std::string(32, 'b'), std::nullopt).status(),
               StatusCode::kNotFound, "lease_id");
  // None of that took a permit or a hit.
  EXPECT_EQ(in_flight("two"), 0u);
  EXPECT_EQ(in_flight("chained"), 0u);
  EXPECT_EQ(engine_->peek(CheckCall{"per-key", "k", 2}).value().allowed, true);
  EXPECT_EQ(engine_->leases(), 0u);
}

TEST_F(EngineTest, LeaseIdsAreUnguessableAndReleasedOnce) {
  std::set<std::string> ids;
  for (int i = 0; i < 200; ++i) {
    const AdmitResult a = admit("two");
    ASSERT_TRUE(a.admitted);
    EXPECT_EQ(a.lease_id.size(), 32u);
    EXPECT_TRUE(ids.insert(a.lease_id).second) << "lease id repeated: " << a.lease_id;
    auto held = engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt);
    ASSERT_TRUE(held.ok());
    EXPECT_EQ(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).status().code(),
              StatusCode::kNotFound);
  }
  // Ids share no fixed prefix: 200 random ids use every hex digit in their first position.
  std::set<char> first;
  for (const std::string& id : ids) first.insert(id[0]);
  EXPECT_EQ(first.size(), 16u);
}

TEST_F(EngineTest, ALeaseExpiresAfterItsTtlUnlessHeartbeated) {
  const AdmitResult a = admit("two");
  const AdmitResult b = admit("two");
  ASSERT_TRUE(a.admitted && b.admitted);
  EXPECT_FALSE(admit("two").admitted);
  clock_.advance(seconds(6));
  auto ttl = engine_->heartbeat(b.lease_id, seconds(20));
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_EQ(ttl.value(), seconds(20));
  clock_.advance(seconds(4));  // a: 10 s old, its TTL; b: extended
  EXPECT_EQ(engine_->expire_leases(), 1u);
  EXPECT_EQ(in_flight("two"), 1u);
  EXPECT_EQ(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).status().code(),
            StatusCode::kNotFound);
  const AdmitResult c = admit("two");
  EXPECT_TRUE(c.admitted) << "the expired lease's slot was not freed";
  // A lease past its deadline cannot be heartbeated back to life, even before the sweep.
  clock_.advance(seconds(16));
  EXPECT_EQ(engine_->heartbeat(b.lease_id, std::nullopt).status().code(), StatusCode::kNotFound);
  // ... nor released (it is expired on the spot, and its slot freed).
  EXPECT_EQ(engine_->release(c.lease_id, CallResult::kSuccess, std::nullopt).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(in_flight("two"), 1u);  // b, until the sweep
  EXPECT_EQ(engine_->expire_leases(), 1u);
  EXPECT_EQ(in_flight("two"), 0u);
  EXPECT_EQ(engine_->leases(), 0u);
  EXPECT_NE(engine_->metrics_text().find("sluice_leases_expired_total 3"), std::string::npos);
}

// A Release with keep records the call (a sample, as a release does) and leaves the lease its
// permit for the client's next call, its TTL and its `held` restarted; a plain Release ends it.
TEST_F(EngineTest, AKeptLeaseCarriesTheNextCallOnItsPermit) {
  const AdmitResult a = admit("two");
  ASSERT_TRUE(a.admitted);
  EXPECT_TRUE(a.reusable);
  clock_.advance(seconds(3));
  auto kept = engine_->release(a.lease_id, CallResult::kSuccess, milliseconds(2), std::nullopt,
                               /*keep=*/true);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_TRUE(kept.value().kept);
  EXPECT_EQ(kept.value().held, seconds(3));
  EXPECT_EQ(in_flight("two"), 1u);
  nlohmann::json s = state("two");
  EXPECT_EQ(s["renewed"], 1);
  EXPECT_EQ(s["released"], 0);
  EXPECT_EQ(s["accepted"], 2);  // the Admit's call and the one the kept lease carries
  EXPECT_EQ(s["leases"], 1);
  // The TTL (10 s) restarted at the keep: alive 8 s after it, though 11 s after its Admit.
  clock_.advance(seconds(8));
  EXPECT_EQ(engine_->expire_leases(), 0u);
  kept = engine_->release(a.lease_id, CallResult::kDropped, milliseconds(2), std::nullopt, true);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(kept.value().held, seconds(8));
  EXPECT_EQ(state("two")["dropped"], 1);  // each carried call's outcome is recorded
  clock_.advance(seconds(1));
  auto held = engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  EXPECT_EQ(held.value(), seconds(1));
  EXPECT_EQ(in_flight("two"), 0u);
  s = state("two");
  EXPECT_EQ(s["renewed"], 2);
  EXPECT_EQ(s["released"], 1);
  EXPECT_EQ(s["leases"], 0);
  EXPECT_NE(engine_->metrics_text().find("sluice_lease_renewals_total{policy=\"two\"} 2"),
            std::string::npos);
  // Released: a keep finds no lease.
  EXPECT_EQ(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true)
                .status()
                .code(),
            StatusCode::kNotFound);
  // Kept leases expire as any other does, one TTL after the last keep.
  const AdmitResult b = admit("two");
  ASSERT_TRUE(
      engine_->release(b.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true).ok());
  clock_.advance(seconds(10));
  EXPECT_EQ(engine_->expire_leases(), 1u);
  EXPECT_EQ(in_flight("two"), 0u);
}

// A limit brought below the calls in flight: the keep still keeps the permit (the client's next
// call may have started on it) and says the lease is over the limit, for the client to release
// after that call.
TEST_F(EngineTest, AKeepOverALoweredLimitKeepsThePermitAndSaysSo) {
  const AdmitResult a = admit("two");
  const AdmitResult b = admit("two");
  ASSERT_TRUE(a.admitted && b.admitted);
  std::string next = kBase;
  next.replace(next.find("limit: 2\n  chained"), 8, "limit: 1");
  auto r = engine_->reload(config_of(next));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto kept = engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_FALSE(kept.value().kept);
  EXPECT_EQ(in_flight("two"), 2u);
  ASSERT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  kept = engine_->release(b.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_TRUE(kept.value().kept);  // 1 in flight, the limit 1
}

// A lease whose policy a reload retired (removed here) is not kept for more calls, nor one kept
// while the server drains: the client releases each after the call it carries.
TEST_F(EngineTest, AKeepOnARetiredPolicyOrWhileDrainingSaysNoMore) {
  const AdmitResult a = admit("two");
  const AdmitResult b = admit("two");
  std::string next = kBase;
  next.erase(next.find("  two:"), next.find("  chained:") - next.find("  two:"));
  auto r = engine_->reload(config_of(next));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r.value().removed, std::vector<std::string>{"two"});
  auto kept = engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_FALSE(kept.value().kept);
  ASSERT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  auto s = engine_->reload(config_of(kBase));  // "two" again, counting b
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const AdmitResult c = admit("two");
  kept = engine_->release(c.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(kept.ok() && kept.value().kept) << kept.status().to_string();
  engine_->drain();
  kept = engine_->release(c.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_FALSE(kept.value().kept);
  ASSERT_TRUE(engine_->release(b.lease_id, CallResult::kSuccess, std::nullopt).ok());
  ASSERT_TRUE(engine_->release(c.lease_id, CallResult::kSuccess, std::nullopt).ok());
}

// Only an adaptive policy's lease, chaining no rate policy, is reusable: a keep on another is
// FAILED_PRECONDITION and releases it; keep with a cost is refused before anything happens.
TEST_F(EngineTest, AKeepOnALeaseThatIsNotReusableReleasesIt) {
  const AdmitResult a = admit("chained", "alice");
  ASSERT_TRUE(a.admitted);
  EXPECT_FALSE(a.reusable);  // each call must pass its rate policy
  auto r = engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true);
  expect_error(r.status(), StatusCode::kFailedPrecondition, "keep");
  EXPECT_NE(r.status().message().find("released"), std::string::npos);
  EXPECT_EQ(in_flight("chained"), 0u);
  const CallAttribute at[] = {{"tenant", "acme"}, {"upstream", "llm"}};
  auto g = engine_->admit(AdmitCall{.policy = "gw", .key = "bob", .attributes = at});
  ASSERT_TRUE(g.ok() && g.value().admitted) << g.status().to_string();
  EXPECT_FALSE(g.value().reusable);
  expect_error(
      engine_->release(g.value().lease_id, CallResult::kSuccess, std::nullopt, std::nullopt, true)
          .status(),
      StatusCode::kFailedPrecondition, "keep");
  EXPECT_EQ(engine_->leases(), 0u);
  const AdmitResult b = admit("two");
  expect_error(engine_->release(b.lease_id, CallResult::kSuccess, std::nullopt, 1, true).status(),
               StatusCode::kInvalidArgument, "keep");
  EXPECT_EQ(in_flight("two"), 1u);  // nothing done
}

// A heartbeat that shortens a lease's TTL moves its deadline earlier: it expires then, not at
// the deadline it had (the table's heap keeps an entry at or before every deadline).
TEST_F(EngineTest, AHeartbeatThatShortensTheTtlExpiresTheLeaseEarlier) {
  const AdmitResult a = admit("two");
  ASSERT_TRUE(engine_->heartbeat(a.lease_id, seconds(30)).ok());
  ASSERT_TRUE(engine_->heartbeat(a.lease_id, seconds(2)).ok());
  clock_.advance(seconds(2));
  EXPECT_EQ(engine_->expire_leases(), 1u);
  EXPECT_EQ(in_flight("two"), 0u);
}

TEST_F(EngineTest, ReloadKeepsUnchangedPoliciesAndTheirPermits) {
  const AdmitResult a = admit("two");
  const AdmitResult b = admit("chained", "alice");
  ASSERT_TRUE(a.admitted && b.admitted);
  ASSERT_TRUE(engine_->check(CheckCall{"other", "x", 5}).value().allowed);
  // Same file, `chained` changed (limit 1 -> 3), `gw` removed, one policy added.
  std::string next = kBase;
  next = next.substr(0, next.find("  gw:"));
  next.replace(next.find("limit: 1\n    rate"), 8, "limit: 3");
  next += "  added:\n    kind: rate\n    limit: 1\n";
  auto r = engine_->reload(config_of(next));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().generation, 2u);
  EXPECT_EQ(r.value().added, std::vector<std::string>{"added"});
  EXPECT_TRUE(r.value().changed.empty());
  EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"chained"});
  EXPECT_EQ(r.value().removed, std::vector<std::string>{"gw"});
  // The unchanged policy kept its permit and its count; the rate state survived too.
  EXPECT_EQ(in_flight("two"), 1u);
  EXPECT_TRUE(admit("two").admitted);
  EXPECT_FALSE(admit("two").admitted);
  EXPECT_FALSE(engine_->check(CheckCall{"other", "x", 1}).value().allowed);
  // The changed policy took its new limit in place: its lease still counts, and releases.
  EXPECT_EQ(in_flight("chained"), 1u);
  ASSERT_TRUE(engine_->release(b.lease_id, CallResult::kSuccess, std::nullopt).ok());
  ASSERT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  EXPECT_EQ(in_flight("two"), 1u);
  const CallAttribute at[] = {{"tenant", "acme"}, {"upstream", "llm"}};
  EXPECT_EQ(engine_->admit(AdmitCall{.policy = "gw", .attributes = at}).status().code(),
            StatusCode::kNotFound);
}

// A reload that changes a policy serves the new one before it retires the old: callers admitting
// all through the reloads are never refused (the limit is far above what they hold). (A changed
// fleet policy is a new fleet member, which admits once it has its first grant: not this case.)
TEST(EngineReload, ChangingAPolicyNeverRefusesCallsDuringTheSwap) {
  const SteadyClock& clock = SteadyClock::instance();
  const auto yaml = [](int limit) {
    return "policies:\n  a:\n    kind: adaptive\n    algorithm: fixed\n    limit: " +
           std::to_string(limit) + "\n";
  };
  auto e = Engine::create(config_of(yaml(1000)), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  std::atomic<bool> done{false};
  std::atomic<int> refused{0}, admitted{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t)
    callers.emplace_back([&] {
      while (!done.load()) {
        auto r = engine.admit(AdmitCall{"a", "k"});
        if (!r.ok() || !r.value().admitted) {
          refused.fetch_add(1);
          continue;
        }
        admitted.fetch_add(1);
        (void)engine.release(r.value().lease_id, CallResult::kSuccess, std::nullopt);
      }
    });
  for (int i = 1; i <= 300; ++i) {
    auto r = engine.reload(config_of(yaml(1000 + i)));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
  }
  done.store(true);
  for (auto& t : callers) t.join();
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(refused.load(), 0);
}

TEST_F(EngineTest, AReloadThatFailsChangesNothing) {
  const AdmitResult a = admit("two");
  ASSERT_TRUE(a.admitted);
  // A fleet policy on a Redis that refuses the configured password.
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start("right-password").ok());
  std::string next = kBase;
  next.replace(next.find("policies:"), 9,
               "coordinators:\n  r:\n    kind: redis\n    address: 127.0.0.1:" +
                   std::to_string(redis.port()) +
                   "\n    password: wrong-password\npolicies:\n  f:\n    kind: fleet\n"
                   "    coordinator: r\n");
  auto r = engine_->reload(config_of(next));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().to_string();
  EXPECT_NE(r.status().message().find("coordinator r"), std::string::npos) << r.status().message();
  EXPECT_EQ(engine_->generation(), 1u);
  EXPECT_EQ(in_flight("two"), 1u);
  EXPECT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  EXPECT_NE(engine_->metrics_text().find("sluice_config_reloads_total{result=\"error\"} 1"),
            std::string::npos);
}

TEST_F(EngineTest, DrainRefusesNewWorkButReleasesHeldLeases) {
  const AdmitResult a = admit("two");
  ASSERT_TRUE(a.admitted);
  engine_->drain();
  EXPECT_EQ(engine_->check(CheckCall{"per-key", "k", 1}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine_->admit(AdmitCall{"two", "k"}).status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(engine_->readiness().ready);
  EXPECT_TRUE(engine_->heartbeat(a.lease_id, std::nullopt).ok());
  EXPECT_TRUE(engine_->release(a.lease_id, CallResult::kSuccess, std::nullopt).ok());
  EXPECT_EQ(in_flight("two"), 0u);
}

TEST(EngineMetrics, ShowEveryKindIncludingTheFleetShare) {
  const SteadyClock& clock = SteadyClock::instance();
  auto e = Engine::create(config_of(R"(
policies:
  r:
    kind: rate
    limit: 1
  f:
    kind: fleet
    algorithm: fixed
    limit: 4
    heartbeat: 20ms
)"),
                          clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  ASSERT_TRUE(engine.check(CheckCall{"r", "k", 1}).value().allowed);
  ASSERT_FALSE(engine.check(CheckCall{"r", "k", 1}).value().allowed);
  ASSERT_TRUE(ready_within(engine, seconds(10)));
  const std::string m = engine.metrics_text();
  for (const char* series :
       {"sluice_rate_decisions_total{policy=\"r\",decision=\"allowed\"} 1",
        "sluice_rate_decisions_total{policy=\"r\",decision=\"denied\"} 1",
        "sluice_fleet_l_global{policy=\"f\"} 4", "sluice_fleet_share{policy=\"f\"} 4",
        "sluice_fleet_nodes{policy=\"f\"} 1", "sluice_policy_limit{policy=\"f\"} 4",
        "sluice_coordinator_call_seconds_count{coordinator=\"memory\",backend=\"memory\"}"})
    EXPECT_NE(m.find(series), std::string::npos) << series << "\n" << m;
}

// Closing the engine leaves every fleet: another node on the same Redis key sees the fleet shrink
// at once, not a lease TTL later.
TEST(EngineFleet, CloseLeavesTheFleet) {
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start().ok());
  const std::string yaml =
      "server:\n  node_id: engine-node\ncoordinators:\n  r:\n    kind: redis\n"
      "    address: 127.0.0.1:" +
      std::to_string(redis.port()) +
      "\npolicies:\n  f:\n    kind: fleet\n    coordinator: r\n"
      "    algorithm: fixed\n    limit: 6\n    heartbeat: 20ms\n"
      "    lease_ttl: 60s\n";
  const SteadyClock& clock = SteadyClock::instance();
  auto e = Engine::create(config_of(yaml), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_TRUE(ready_within(*e.value(), seconds(10)));
  RedisOptions o;
  o.port = redis.port();
  auto other = RedisCoordinator::connect(o, {});
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  NodeReport report{"observer", 6, 0, 0, seconds(60)};
  auto before = other.value()->heartbeat("f", report, seconds(2));
  ASSERT_TRUE(before.ok()) << before.status().to_string();
  EXPECT_EQ(before.value().nodes, 2u);
  // A reload that changes the fleet policy: the old guard leaves, the new one joins under an id
  // of its own, so the fleet stays at two members (never a window where this server holds a
  // share the coordinator has reclaimed).
  std::string changed = yaml;
  changed.replace(changed.find("limit: 6"), 8, "limit: 8");
  auto r = e.value()->reload(config_of(changed));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().changed, std::vector<std::string>{"f"});
  EXPECT_TRUE(ready_within(*e.value(), seconds(10)));
  auto during = other.value()->heartbeat("f", report, seconds(2));
  ASSERT_TRUE(during.ok());
  EXPECT_EQ(during.value().nodes, 2u);
  e.value()->close();
  auto after = other.value()->heartbeat("f", report, seconds(2));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after.value().nodes, 1u) << "the closed engine is still a member of the fleet";
}

// A coordinator that is down when the server starts is not a reason to refuse to start: the
// engine comes up (rate and local policies serve), the fleet policy is in its outage mode and
// not ready, a warning names the coordinator, and once Redis comes up on that address the fleet
// policy joins and the engine is ready, with no restart.
TEST(EngineFleet, ALocalOnlyFleetInAnOutageIsReadyAndSaysItIsDegraded) {
  // Ready means "serves its policies as configured": a local-only guard that cannot reach its
  // coordinator admits on its own limit, as configured, so a load balancer must not drain the
  // node; the outage shows as degraded. A fail-closed guard in the same outage refuses every
  // call: not ready.
  const std::string yaml =
      "server:\n  node_id: lonely\ncoordinators:\n  r:\n    kind: redis\n"
      "    address: 127.0.0.1:" +
      std::to_string(testing::free_port()) +
      "\n    connect_timeout: 200ms\npolicies:\n"
      "  f:\n    kind: fleet\n    coordinator: r\n    algorithm: fixed\n    limit: 3\n"
      "    heartbeat: 20ms\n    lease_ttl: 60s\n    outage: OUTAGE\n";
  const auto with = [&](const std::string& outage) {
    std::string y = yaml;
    y.replace(y.find("OUTAGE"), 6, outage);
    return config_of(y);
  };
  auto local = Engine::create(with("local-only"), SteadyClock::instance());
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  const Readiness r = local.value()->readiness();
  EXPECT_TRUE(r.ready);
  EXPECT_TRUE(r.problems.empty());
  ASSERT_EQ(r.degraded.size(), 1u);
  EXPECT_EQ(r.degraded[0].find("policy f: fleet guard is "), 0u) << r.degraded[0];
  EXPECT_NE(r.degraded[0].find("local-only"), std::string::npos) << r.degraded[0];
  EXPECT_TRUE(local.value()->admit(AdmitCall{"f", "k"}).value().admitted);
  local.value()->close();

  auto closed = Engine::create(with("fail-closed"), SteadyClock::instance());
  ASSERT_TRUE(closed.ok()) << closed.status().to_string();
  const Readiness c = closed.value()->readiness();
  EXPECT_FALSE(c.ready);
  ASSERT_EQ(c.problems.size(), 1u);
  EXPECT_TRUE(c.degraded.empty());
  EXPECT_FALSE(closed.value()->admit(AdmitCall{"f", "k"}).value().admitted);
  closed.value()->close();
}

TEST(EngineFleet, StartsWhileItsCoordinatorIsDownAndJoinsWhenItComesUp) {
  const int port = testing::free_port();
  const std::string yaml =
      "server:\n  node_id: late-node\ncoordinators:\n  r:\n    kind: redis\n"
      "    address: 127.0.0.1:" +
      std::to_string(port) +
      "\n    connect_timeout: 200ms\npolicies:\n  per-key:\n    kind: rate\n    limit: 5\n"
      "  f:\n    kind: fleet\n    coordinator: r\n    algorithm: fixed\n    limit: 6\n"
      "    heartbeat: 20ms\n    lease_ttl: 60s\n";
  const SteadyClock& clock = SteadyClock::instance();
  auto e = Engine::create(config_of(yaml), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  ASSERT_EQ(engine.warnings().size(), 1u);
  EXPECT_NE(engine.warnings()[0].find("coordinator r is not reachable now"), std::string::npos)
      << engine.warnings()[0];
  EXPECT_TRUE(engine.check(CheckCall{"per-key", "k", 1}).value().allowed);
  const Readiness down = engine.readiness();
  EXPECT_FALSE(down.ready);
  ASSERT_EQ(down.problems.size(), 1u);
  EXPECT_EQ(down.problems[0].find("policy f:"), 0u) << down.problems[0];

  testing::RedisServer redis;
  ASSERT_TRUE(redis.start({}, port).ok());
  ASSERT_TRUE(ready_within(engine, seconds(15)));
  RedisOptions o;
  o.port = port;
  auto other = RedisCoordinator::connect(o, {});
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  auto g = other.value()->heartbeat("f", NodeReport{"observer", 6, 0, 0, seconds(60)}, seconds(2));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g.value().nodes, 2u) << "the engine's fleet guard did not join once Redis came up";
  engine.close();
}

}  // namespace
}  // namespace sluice::server
