// The Redis regional pool against a real redis-server the test starts on loopback: replies equal
// to the memory pool's, field by field, for one long random sequence of takes, refills and
// releases on the caller's clock; Redis TIME as the pool's clock, the hash and its TTL, NOSCRIPT
// reload, bad input, and processes of one region sharing the pool through FederatedLimiter.
#include "sluice/backends/redis_regional_escrow.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server_clients.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/federation/federation.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(20);  // generous: sanitizer builds on a loaded machine

using test_clients::cli;

std::string describe(const PoolReply& r) {
  return "granted " + std::to_string(r.granted) + " balance " + std::to_string(r.balance) +
         " window " + std::to_string(r.window_start.count()) + " expires_in " +
         std::to_string(r.expires_in.count()) + " now " + std::to_string(r.now.count()) +
         (r.refill ? " refill" : "");
}

class RedisRegionalEscrowTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { redis_.start(); }
  static void TearDownTestSuite() { redis_.stop(); }
  void SetUp() override { ASSERT_TRUE(redis_.ok()) << redis_.status().to_string(); }

  static std::unique_ptr<RedisRegionalEscrow> connect(const std::string& prefix,
                                                      const Clock* clock = nullptr) {
    RedisOptions o = RedisRegionalEscrow::default_options();
    o.port = redis_->port();
    o.key_prefix = prefix;
    auto p = RedisRegionalEscrow::connect(o, clock);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return p.ok() ? std::move(p.value()) : nullptr;
  }

  static testing::SuiteServer<testing::RedisServer> redis_;
};
testing::SuiteServer<testing::RedisServer> RedisRegionalEscrowTest::redis_;

TEST_F(RedisRegionalEscrowTest, RandomSequenceGivesTheMemoryPoolsReplies) {
  ManualClock clock(seconds(1'000'000));
  MemoryRegionalEscrow memory(clock);
  auto redis = connect("conformance:pool:", &clock);
  ASSERT_NE(redis, nullptr);
  const std::vector<std::string> keys = {"a", "b", "c"};
  std::mt19937_64 rng(20261125);
  const auto pick = [&](std::uint64_t n) { return rng() % n; };
  int takes = 0, refills = 0, releases = 0, granted = 0, refill_flags = 0;
  for (int step = 0; step < 3000; ++step) {
    const std::string& key = keys[pick(keys.size())];
    const std::uint64_t action = pick(100);
    // Windows of 1 s; expiries somewhat before their window's end (or already past).
    const Nanos now = clock.now();
    const Nanos window = window_of(now, seconds(1)) - seconds(pick(4) == 0 ? 1 : 0);
    const Nanos expires = window + milliseconds(pick(1200));
    if (action >= 80) {
      clock.advance(action >= 97 ? milliseconds(1000 + pick(3000)) : milliseconds(1 + pick(300)));
      continue;
    }
    StatusOr<PoolReply> m = Status(StatusCode::kInternal, "unset");
    StatusOr<PoolReply> r = Status(StatusCode::kInternal, "unset");
    if (action < 40) {
      const std::uint64_t want = 1 + pick(20);
      const Nanos hold = milliseconds(1 + pick(500));
      const bool past = pick(5) == 0;
      m = memory.take(key, want, hold, past, kTimeout);
      r = redis->take(key, want, hold, past, kTimeout);
      ++takes;
    } else if (action < 65) {
      const std::uint64_t units = pick(6) == 0 ? 0 : 1 + pick(40);
      m = memory.refill(key, window, units, expires, kTimeout);
      r = redis->refill(key, window, units, expires, kTimeout);
      ++refills;
    } else {
      const std::uint64_t units = 1 + pick(10);
      m = memory.release(key, window, units, kTimeout);
      r = redis->release(key, window, units, kTimeout);
      ++releases;
    }
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r.value(), m.value()) << "step " << step << " key " << key << "\n redis  "
                                    << describe(r.value()) << "\n memory " << describe(m.value());
    granted += m.value().granted > 0 ? 1 : 0;
    refill_flags += m.value().refill ? 1 : 0;
  }
  // The sequence reached every rule, not only the trivial replies.
  EXPECT_GT(takes, 500);
  EXPECT_GT(refills, 300);
  EXPECT_GT(releases, 300);
  EXPECT_GT(granted, 500);
  EXPECT_GT(refill_flags, 100);
}

TEST_F(RedisRegionalEscrowTest, RedisTimeIsThePoolsClockAndTheHashExpiresAfterThePool) {
  auto pool = connect("time:pool:");
  ASSERT_NE(pool, nullptr);
  const Nanos wall = std::chrono::system_clock::now().time_since_epoch();
  auto t = pool->take("k", 5, milliseconds(100), false, kTimeout);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_LT(std::chrono::abs(t.value().now - wall), seconds(5)) << describe(t.value());
  EXPECT_TRUE(t.value().refill);
  const Nanos expires = t.value().now + seconds(30);
  auto f = pool->refill("k", seconds(1'000), 12, expires, kTimeout);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f.value().granted, 12u);
  EXPECT_EQ(cli(redis_->port(), "HGET time:pool:{k} b"), "12");
  const long ttl_ms = std::atol(cli(redis_->port(), "PTTL time:pool:{k}").c_str());
  EXPECT_GT(ttl_ms, 3'600'000 + 25'000);  // an hour past its expiry, 30 s away
  EXPECT_LE(ttl_ms, 3'600'000 + 31'000);
  EXPECT_TRUE(pool->health(kTimeout).ok());
}

TEST_F(RedisRegionalEscrowTest, FlushedScriptIsReloadedAndTheCallRetried) {
  ManualClock clock(seconds(5'000));
  auto pool = connect("flush:pool:", &clock);
  ASSERT_NE(pool, nullptr);
  ASSERT_TRUE(pool->refill("k", seconds(5'000), 9, seconds(5'010), kTimeout).ok());
  EXPECT_EQ(cli(redis_->port(), "SCRIPT FLUSH"), "OK");
  auto t = pool->take("k", 4, milliseconds(1), false, kTimeout);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t.value().balance, 5u);  // the retried call ran once
}

TEST_F(RedisRegionalEscrowTest, BadInputIsRefusedNamingTheFieldAndWritesNothing) {
  auto pool = connect("bad:pool:");
  ASSERT_NE(pool, nullptr);
  EXPECT_NE(pool->take("", 1, milliseconds(1), false, kTimeout).status().message().find("key"),
            std::string::npos);
  EXPECT_NE(pool->take("k", 0, milliseconds(1), false, kTimeout).status().message().find("want"),
            std::string::npos);
  EXPECT_NE(pool->take("k", 1, Nanos{0}, false, kTimeout).status().message().find("refill_hold"),
            std::string::npos);
  EXPECT_NE(pool->refill("k", Nanos{1'500}, 3, seconds(1), kTimeout)
                .status()
                .message()
                .find("window_start"),
            std::string::npos);
  EXPECT_EQ(cli(redis_->port(), "EXISTS bad:pool:{k}"), "0");
  RedisOptions fleet_prefix = RedisRegionalEscrow::default_options();
  fleet_prefix.port = redis_->port();
  fleet_prefix.key_prefix = RedisOptions{}.key_prefix;
  const auto refused = RedisRegionalEscrow::connect(fleet_prefix);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("key_prefix"), std::string::npos);
}

// Three processes of one region share the Redis pool (each its own connection): the first leases
// a regional batch from the coordinator, the other two take from the pool.
TEST_F(RedisRegionalEscrowTest, ProcessesOfARegionShareOneRegionalBatch) {
  ManualClock clock(seconds(100));  // the coordinator's clock; the pool's is Redis TIME
  MemoryRateCoordinator coordinator(clock);
  FederationOptions o;
  o.region = "eu";
  o.budget = {1000, std::chrono::hours(24)};
  o.batch = 10;
  o.regional_batch = 40;
  const IoExecutor inline_io = [](std::function<void()> f) { f(); };
  std::vector<std::unique_ptr<RedisRegionalEscrow>> pools;
  std::vector<std::unique_ptr<FederatedLimiter>> procs;
  for (int i = 0; i < 3; ++i) {
    pools.push_back(connect("share:pool:"));
    ASSERT_NE(pools.back(), nullptr);
    procs.push_back(
        std::make_unique<FederatedLimiter>(coordinator, pools.back().get(), clock, o, inline_io));
  }
  for (auto& p : procs) EXPECT_TRUE(p->check_wait("k", 1).rate.allowed);
  EXPECT_EQ(coordinator.ledger("k")->granted, 40u);
  EXPECT_EQ(cli(redis_->port(), "HGET share:pool:{k} b"), "10");
  EXPECT_EQ(procs[0]->stats().pool_refilled, 30u);
  EXPECT_EQ(procs[2]->stats().pool_taken, 10u);
  // Given back to the pool on shutdown.
  procs[1]->relinquish_all(clock.now());
  EXPECT_EQ(cli(redis_->port(), "HGET share:pool:{k} b"), "19");
}

// A pool's Redis restarted from a snapshot taken before units were taken: the restored balance
// may already have been spent, so the pool drops it (forfeits it) instead of handing it out
// again; a refill after the restart serves as usual.
TEST(RedisRegionalEscrow, ABalanceRestoredFromASnapshotIsForfeitedNotHandedOutTwice) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  ManualClock clock(seconds(1'000'000));
  RedisOptions o = RedisRegionalEscrow::default_options();
  o.port = server.port();
  auto p = RedisRegionalEscrow::connect(o, &clock);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  RedisRegionalEscrow& pool = *p.value();
  const Nanos window = window_of(clock.now(), seconds(10));
  const Nanos expires = window + seconds(9);
  auto refilled = pool.refill("k", window, 10, expires, kTimeout);
  ASSERT_TRUE(refilled.ok()) << refilled.status().to_string();
  ASSERT_EQ(refilled.value().balance, 10u);
  ASSERT_EQ(cli(server.port(), "SAVE"), "OK");  // the snapshot: 10 in the pool
  auto taken = pool.take("k", 6, seconds(1), false, kTimeout);
  ASSERT_TRUE(taken.ok());
  ASSERT_EQ(taken.value().granted, 6u);
  server.kill();
  ASSERT_TRUE(server.restart().ok());  // the snapshot's 10, of which 6 were taken
  StatusOr<PoolReply> again = Status(StatusCode::kUnavailable, "not called");
  for (int i = 0; i < 3 && !again.ok(); ++i)
    again = pool.take("k", 10, seconds(1), false, kTimeout);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again.value().granted, 0u) << describe(again.value());
  EXPECT_EQ(again.value().balance, 0u);
  EXPECT_TRUE(again.value().refill);  // the asker is sent to the coordinator
  refilled = pool.refill("k", window, 4, expires, kTimeout);
  ASSERT_TRUE(refilled.ok());
  EXPECT_EQ(refilled.value().balance, 4u);
  taken = pool.take("k", 4, seconds(1), false, kTimeout);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken.value().granted, 4u);
}

}  // namespace
}  // namespace sluice
