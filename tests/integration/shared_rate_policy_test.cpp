// A rate policy whose keys a coordinator keeps, through the server's engine (no transport), on a
// real Redis: two servers (engines) checking one key admit exactly what one limiter would, for
// each strategy; a refused key is refused from the cache without a call until its retry_after;
// a server on another limit (a rolling reload) carries what the key spent; a Redis killed and
// restarted from its RDB snapshot admits nothing the key had already spent (without the raise it
// would admit what the snapshot missed); while Redis is down a fail-closed policy refuses with
// 503 and says it is not ready, a fail-open one admits; the config's errors name their field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "server/registry.h"
#include "server_clients.h"
#include "sluice/backends/postgres_shared_rate.h"
#include "sluice/backends/redis_shared_rate.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string config(int port, const std::string& policies) {
  return "coordinators:\n  shared:\n    kind: redis\n    address: 127.0.0.1:" +
         std::to_string(port) + "\npolicies:\n" + policies;
}

// Tells the Redis it is new to shared rate limits (no loss known), as an operator would.
void adopt(int port) {
  RedisOptions o = RedisSharedRate::default_options();
  o.port = port;
  auto s = RedisSharedRate::connect(o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_TRUE(s.value()->adopt(seconds(5)).ok());
}

std::unique_ptr<Engine> engine(const std::string& yaml) {
  auto e = Engine::create(config_of(yaml), SteadyClock::instance());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  return e.ok() ? std::move(e.value()) : nullptr;
}

RateDecision check(Engine& e, std::string_view policy, std::string_view key,
                   std::int64_t hits = 1) {
  auto r = e.check(CheckCall{policy, key, hits});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : RateDecision{};
}

nlohmann::json state(Engine& e, std::string_view policy) {
  for (const PolicyInfo& p : e.policies())
    if (p.name == policy) return nlohmann::json::parse(p.state_json);
  ADD_FAILURE() << "no policy " << policy;
  return {};
}

class SharedRatePolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(redis_.start().ok());
    adopt(redis_.port());
  }
  testing::RedisServer redis_;
};

TEST_F(SharedRatePolicyTest, TwoServersAdmitWhatOneLimiterWouldForEveryStrategy) {
  // Periods long enough that nothing comes back during the test.
  const std::string yaml = config(redis_.port(), R"(  gcra:
    kind: rate
    strategy: gcra
    limit: 10
    period: 1000s
    coordinator: shared
  sliding:
    kind: rate
    strategy: sliding-window
    limit: 12
    period: 1000s
    coordinator: shared
  fixed:
    kind: rate
    strategy: fixed-window
    limit: 7
    period: 1000s
    coordinator: shared
)");
  auto a = engine(yaml);
  auto b = engine(yaml);
  ASSERT_TRUE(a && b);
  for (const auto& [policy, limit] :
       std::vector<std::pair<std::string, std::uint64_t>>{{"gcra", 10}, {"sliding", 12}}) {
    std::uint64_t allowed = 0;
    RateDecision last;
    for (int i = 0; i < 40; ++i) {
      last = check(i % 2 == 0 ? *a : *b, policy, "user:1");
      allowed += last.allowed;
    }
    EXPECT_EQ(allowed, limit) << policy;
    EXPECT_FALSE(last.allowed);
    EXPECT_GT(last.retry_after, seconds(10)) << policy;
    EXPECT_EQ(state(*a, policy)["scope"], "shared");
  }
  // A fixed window may straddle its boundary (1000 s windows on the real clock): its count is
  // the limit in the window it ends in, whichever that is.
  std::uint64_t allowed = 0;
  for (int i = 0; i < 20; ++i) allowed += check(i % 2 == 0 ? *a : *b, "fixed", "user:1").allowed;
  EXPECT_GE(allowed, 7u);
  EXPECT_LE(allowed, 14u);
  // The keys are under shared rate limits' prefix, one per (policy, key, strategy, period).
  EXPECT_EQ(test_clients::cli(redis_.port(), "EXISTS 'sluice:rate:{gcra:user:1}gcra/1000000000'"),
            "1");
}

TEST_F(SharedRatePolicyTest, ARefusedKeyIsRefusedFromTheCacheUntilItsRetryAfter) {
  auto e = engine(config(redis_.port(), R"(  api:
    kind: rate
    strategy: gcra
    limit: 2
    period: 1s
    coordinator: shared
)"));
  ASSERT_TRUE(e);
  EXPECT_TRUE(check(*e, "api", "k").allowed);
  EXPECT_TRUE(check(*e, "api", "k").allowed);
  const RateDecision first = check(*e, "api", "k");
  ASSERT_FALSE(first.allowed);
  EXPECT_GT(first.retry_after, milliseconds(100));
  EXPECT_LE(first.retry_after, milliseconds(500));
  const std::uint64_t calls = state(*e, "api")["coordinator_calls"];
  for (int i = 0; i < 50; ++i) {
    const RateDecision d = check(*e, "api", "k");
    ASSERT_FALSE(d.allowed);
    ASSERT_LE(d.retry_after, first.retry_after);
    ASSERT_EQ(d.limit, 2u);
  }
  nlohmann::json s = state(*e, "api");
  EXPECT_EQ(s["coordinator_calls"].get<std::uint64_t>(), calls);  // no call for any of them
  EXPECT_EQ(s["refused_from_cache"].get<std::uint64_t>(), 50u);
  EXPECT_EQ(s["cached_refusal_keys"].get<std::uint64_t>(), 1u);
  // Another key is asked at the coordinator; so is this one once its retry_after has passed.
  EXPECT_TRUE(check(*e, "api", "other").allowed);
  std::this_thread::sleep_for(first.retry_after + milliseconds(5));
  EXPECT_TRUE(check(*e, "api", "k").allowed);
  EXPECT_EQ(state(*e, "api")["coordinator_calls"].get<std::uint64_t>(), calls + 2);
}

TEST_F(SharedRatePolicyTest, AServerOnANewLimitCarriesWhatTheKeySpent) {
  const std::string policy = R"(  api:
    kind: rate
    strategy: gcra
    limit: LIMIT
    period: 1000s
    coordinator: shared
)";
  const auto with = [&](const char* limit) {
    std::string p = policy;
    p.replace(p.find("LIMIT"), 5, limit);
    return config(redis_.port(), p);
  };
  auto old_limit = engine(with("10"));
  ASSERT_TRUE(old_limit);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(check(*old_limit, "api", "k").allowed) << i;
  // A server reloaded with 8: the key owes 6 hits, so 2 more pass there.
  auto new_limit = engine(with("8"));
  ASSERT_TRUE(new_limit);
  EXPECT_TRUE(check(*new_limit, "api", "k").allowed);
  EXPECT_TRUE(check(*new_limit, "api", "k").allowed);
  EXPECT_FALSE(check(*new_limit, "api", "k").allowed);
  // And the old server sees the 8 spent of its 10.
  EXPECT_TRUE(check(*old_limit, "api", "k").allowed);
  EXPECT_TRUE(check(*old_limit, "api", "k").allowed);
  EXPECT_FALSE(check(*old_limit, "api", "k").allowed);
}

TEST(SharedRateRedisLoss, ARestartFromAnRdbSnapshotAdmitsNothingTheKeyHadSpent) {
  testing::RedisServer redis;  // RDB snapshots only when told (SAVE), as a scheduled one would be
  ASSERT_TRUE(redis.start({}, 0, {"--save", ""}).ok());
  adopt(redis.port());
  const std::string yaml = config(redis.port(), R"(  api:
    kind: rate
    strategy: fixed-window
    limit: 10
    period: 1000s
    coordinator: shared
)");
  auto e = engine(yaml);
  ASSERT_TRUE(e);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(check(*e, "api", "k").allowed);
  ASSERT_EQ(test_clients::cli(redis.port(), "SAVE"), "OK");  // the snapshot holds 3
  std::uint64_t allowed = 3;
  for (int i = 0; i < 7; ++i) allowed += check(*e, "api", "k").allowed;
  // A window boundary may fall in between (1000 s windows on the real clock): then the test
  // says nothing.
  if (allowed != 10) GTEST_SKIP() << "a window boundary fell inside the test";
  redis.kill();
  ASSERT_TRUE(redis.restart().ok());
  // Another server (no refusal cached): the snapshot says 3 of 10, but the Redis is another
  // process, so the key counts as spent.
  auto other = engine(yaml);
  ASSERT_TRUE(other);
  std::uint64_t after = 0;
  for (int i = 0; i < 10; ++i) after += check(*other, "api", "k").allowed;
  EXPECT_EQ(after, 0u);
  // A key the snapshot never held is spent for this window too: nothing says it was not used.
  EXPECT_FALSE(check(*other, "api", "never-seen").allowed);
}

// A key charged far past its limit is kept until its debt has drained (it would decide like a
// fresh key, and over-admit, if it expired at the rule's usual idle time).
TEST_F(SharedRatePolicyTest, AKeyChargedPastItsLimitIsKeptUntilItsDebtHasDrained) {
  RedisOptions o = RedisSharedRate::default_options();
  o.port = redis_.port();
  auto store = RedisSharedRate::connect(o);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  SharedRateRequest charge;
  charge.op = SharedRateOp::kCharge;
  charge.rule.limit = 10;  // GCRA, 10 per second: 100 hits owe 10 s
  charge.hits = 100;
  auto r = store.value()->apply("heavy", charge, seconds(5));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().charge.overdraft, 90u);
  const long long ttl =
      std::stoll(test_clients::cli(redis_.port(), "PTTL 'sluice:rate:{heavy}gcra/1000000'"));
  EXPECT_GT(ttl, 9'500);  // its debt, 10 s, and a second
  EXPECT_LE(ttl, 11'000);
  SharedRateRequest check;
  check.rule = charge.rule;
  auto d = store.value()->apply("heavy", check, seconds(5));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d.value().decision.allowed);
  EXPECT_GT(d.value().decision.retry_after, seconds(8));
}

// The leased mode's bound, measured: three servers take leases of 5 hits of one GCRA key (50 per
// second, burst 10) in bursts of checks and spend them for up to 200 ms; in every interval of every
// length the admissions stay within burst + (w + lease_hold + the longest check) x limit / period
// (exact GCRA: burst + w x limit / period). Times are taken as each check starts: a leased hit is
// spent no earlier than the coordinator counted it and at most lease_hold later; a hit its own
// check took was counted at most one check's length after it started.
TEST_F(SharedRatePolicyTest, LeasedGcraStaysWithinItsStatedBound) {
  const std::string yaml = config(redis_.port(), R"(  api:
    kind: rate
    strategy: gcra
    limit: 50
    period: 1s
    burst: 10
    coordinator: shared
    lease: 5
    lease_hold: 200ms
)");
  std::vector<std::unique_ptr<Engine>> servers;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(engine(yaml));
    ASSERT_TRUE(servers.back());
  }
  std::mutex mu;
  std::vector<std::int64_t> admitted;  // ns, as each admitted check started
  std::int64_t longest = 0;            // ns, the longest check
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + seconds(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      Engine& e = *servers[t % 3];
      std::vector<std::int64_t> mine;
      std::int64_t slowest = 0;
      while (std::chrono::steady_clock::now() < end) {
        // Bursts of 200 ms every 500 ms: between them the bucket fills, so takes get whole
        // leases, and hits leased late in a burst would be spent in the next one if they were
        // kept past lease_hold.
        const auto in_cycle = (std::chrono::steady_clock::now() - start) % milliseconds(500);
        if (in_cycle >= milliseconds(200)) {
          std::this_thread::sleep_for(milliseconds(500) - in_cycle);
          continue;
        }
        const auto before = std::chrono::steady_clock::now();
        auto d = e.check(CheckCall{"api", "k", 1});
        const auto after = std::chrono::steady_clock::now();
        slowest = std::max<std::int64_t>(slowest, (after - before).count());
        if (d.ok() && d.value().allowed) mine.push_back((before - start).count());
        if (d.ok() && !d.value().allowed) std::this_thread::sleep_for(milliseconds(1));
      }
      const std::lock_guard lock(mu);
      admitted.insert(admitted.end(), mine.begin(), mine.end());
      longest = std::max(longest, slowest);
    });
  for (std::thread& t : threads) t.join();
  std::sort(admitted.begin(), admitted.end());
  const std::int64_t emission = 20'000'000;  // ns per hit: 1 s / 50
  const std::int64_t hold = 200'000'000;
  std::uint64_t from_lease = 0;
  for (auto& e : servers) from_lease += state(*e, "api")["allowed_from_lease"].get<std::uint64_t>();
  EXPECT_GT(from_lease, 10u);  // leased hits were spent here
  // Most of what the rate allows in four bursts: 10 + 2 s x 50, less what was held unspent.
  EXPECT_GT(admitted.size(), 50u);
  for (const std::int64_t w : {10'000'000LL, 50'000'000LL, 100'000'000LL, 250'000'000LL,
                               500'000'000LL, 1'000'000'000LL, 2'000'000'000LL}) {
    std::size_t most = 0;
    for (std::size_t i = 0, j = 0; i < admitted.size(); ++i) {
      while (j < admitted.size() && admitted[j] - admitted[i] <= w) ++j;
      most = std::max(most, j - i);
    }
    const std::uint64_t exact = 10 + static_cast<std::uint64_t>(w / emission);
    const std::uint64_t bound = 10 + static_cast<std::uint64_t>((w + hold + longest) / emission);
    std::printf("interval %lld ms: at most %zu admitted; exact GCRA %llu, stated bound %llu\n",
                static_cast<long long>(w / 1'000'000), most, static_cast<unsigned long long>(exact),
                static_cast<unsigned long long>(bound));
    EXPECT_LE(most, bound) << "interval " << w << " ns";
  }
}

// Leased hits not spent within lease_hold are given back, never spent later: a server that leased
// 10 and spent 2 holds 8; once its hold has passed they are the key's again (another server gets
// them), and the first server's checks are decided at the coordinator (refused: all spent).
TEST_F(SharedRatePolicyTest, LeasedHitsUnspentPastTheHoldAreGivenBackNotSpent) {
  const std::string yaml = config(redis_.port(), R"(  api:
    kind: rate
    strategy: gcra
    limit: 10
    period: 1000s
    coordinator: shared
    lease: 10
    lease_hold: 100ms
)");
  auto a = engine(yaml);
  auto b = engine(yaml);
  ASSERT_TRUE(a && b);
  const RateDecision first = check(*a, "api", "k");
  ASSERT_TRUE(first.allowed);
  EXPECT_EQ(first.remaining, 9u);              // all of it leased here
  EXPECT_TRUE(check(*a, "api", "k").allowed);  // from the lease, no call
  EXPECT_EQ(state(*a, "api")["allowed_from_lease"].get<std::uint64_t>(), 1u);
  std::this_thread::sleep_for(milliseconds(400));  // past the hold: a gives back its 8
  EXPECT_EQ(state(*a, "api")["given_back_hits"].get<std::uint64_t>(), 8u);
  std::uint64_t to_b = 0;
  for (int i = 0; i < 12; ++i) to_b += check(*b, "api", "k").allowed;
  EXPECT_EQ(to_b, 8u);  // what a gave back
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(check(*a, "api", "k").allowed) << i;
}

TEST_F(SharedRatePolicyTest, ARedisDownIsAnOutageFailClosedOrFailOpen) {
  auto e = engine(config(redis_.port(), R"(  closed:
    kind: rate
    limit: 5
    period: 1s
    coordinator: shared
    coordinator_timeout: 200ms
    retry_backoff: 300ms
  open:
    kind: rate
    limit: 5
    period: 1s
    coordinator: shared
    coordinator_timeout: 200ms
    outage: fail-open
)"));
  ASSERT_TRUE(e);
  ASSERT_TRUE(check(*e, "closed", "k").allowed);
  ASSERT_TRUE(e->readiness().ready);
  redis_.kill();
  const RateDecision d = check(*e, "closed", "k");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "coordinator_unreachable");
  EXPECT_GT(d.retry_after, Nanos{0});
  EXPECT_NE(e->refusal_detail(CheckCall{"closed", "k", 1}, d).find("coordinator_unreachable"),
            std::string::npos);
  // Within the backoff: refused without a call.
  const std::uint64_t calls = state(*e, "closed")["coordinator_calls"];
  EXPECT_FALSE(check(*e, "closed", "k").allowed);
  EXPECT_EQ(state(*e, "closed")["coordinator_calls"].get<std::uint64_t>(), calls);
  EXPECT_FALSE(e->readiness().ready);
  EXPECT_TRUE(check(*e, "open", "k").allowed);
  EXPECT_GT(state(*e, "open")["outage_answers"].get<std::uint64_t>(), 0u);
  // Back: after the backoff and the Redis's loss (every key spent for a period), served again.
  ASSERT_TRUE(redis_.restart().ok());
  bool served = false;
  for (int i = 0; i < 60 && !served; ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    served = check(*e, "closed", "fresh").allowed;
  }
  EXPECT_TRUE(served);
  EXPECT_TRUE(e->readiness().ready);
}

TEST(SharedRatePostgres, TwoServersShareOneKeyOnPostgres) {
  testing::PostgresServer pg;
  ASSERT_TRUE(pg.start().ok());
  {
    PostgresOptions o = PostgresSharedRate::default_options();
    o.conninfo = pg.conninfo();
    auto s = PostgresSharedRate::connect(o);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ASSERT_TRUE(s.value()->adopt(seconds(5)).ok());
  }
  const std::string yaml = "coordinators:\n  shared:\n    kind: postgres\n    conninfo: '" +
                           pg.conninfo() +
                           "'\npolicies:\n  api:\n    kind: rate\n    strategy: sliding-window\n"
                           "    limit: 9\n    period: 1000s\n    coordinator: shared\n";
  auto a = engine(yaml);
  auto b = engine(yaml);
  ASSERT_TRUE(a && b);
  std::uint64_t allowed = 0;
  for (int i = 0; i < 30; ++i) allowed += check(i % 2 == 0 ? *a : *b, "api", "k").allowed;
  EXPECT_EQ(allowed, 9u);
  EXPECT_EQ(state(*a, "api")["coordinator"], "postgres");
  test_clients::RawConn sql(pg.conninfo());
  ASSERT_TRUE(sql.ok()) << sql.error();
  EXPECT_EQ(sql.value("SELECT count(*) FROM sluice_rate_state"), "1");
}

TEST(SharedRateConfig, ErrorsNameTheirField) {
  const auto error_at = [](const std::string& yaml, const std::string& path) {
    const ConfigLoad l = load_yaml(yaml);
    for (const ConfigError& e : l.errors)
      if (e.path == path) return e.message;
    return std::string("no error at " + path + ":\n" + errors_of(l));
  };
  const std::string head =
      "coordinators:\n  r:\n    kind: redis\npolicies:\n  p:\n    kind: rate\n"
      "    limit: 10\n";
  EXPECT_NE(error_at(head + "    refusal_cache: false\n", "policies.p.refusal_cache")
                .find("set coordinator"),
            std::string::npos);
  EXPECT_NE(error_at(head + "    coordinator: r\n    budget: a:b\n", "policies.p.budget")
                .find("without ':'"),
            std::string::npos);
  EXPECT_NE(error_at(head + "    coordinator: r\n    outage: maybe\n", "policies.p.outage")
                .find("fail-open"),
            std::string::npos);
  EXPECT_NE(error_at(head + "    coordinator: nowhere\n", "policies.p.coordinator"), "");
  EXPECT_NE(error_at(head + "    strategy: fixed-window\n    coordinator: r\n    lease: 5\n",
                     "policies.p.lease")
                .find("strategy gcra"),
            std::string::npos);
  EXPECT_NE(error_at(head + "    coordinator: r\n    lease: 11\n", "policies.p.lease")
                .find("at most the burst (10)"),
            std::string::npos);
  EXPECT_NE(error_at(head + "    coordinator: r\n    lease_hold: 1s\n", "policies.p.lease_hold")
                .find("needs lease"),
            std::string::npos);
  const ConfigLoad ok = load_yaml(head + "    coordinator: r\n    outage: fail-open\n");
  EXPECT_TRUE(ok.config.has_value()) << errors_of(ok);
}

TEST_F(SharedRatePolicyTest, ARuleTheRedisScriptCannotComputeExactlyIsRefusedNamingTheField) {
  auto e = Engine::create(config_of(config(redis_.port(), R"(  daily:
    kind: rate
    strategy: sliding-window
    limit: 1000000
    period: 24h
    coordinator: shared
)")),
                          SteadyClock::instance());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("limit x period"), std::string::npos)
      << e.status().to_string();
  EXPECT_NE(e.status().message().find("daily"), std::string::npos) << e.status().to_string();
}

}  // namespace
}  // namespace sluice::server
