// The Redis coordinator against a real redis-server the test starts on loopback: the script's
// grants, its storage (one hash per key, one hash slot, an expiring key), NOSCRIPT reload, AUTH,
// server time, timeouts on a hanging server, and bad input. Step-by-step equality with the
// other backends over a long random sequence is in coordinator_conformance_test.cpp.
#include "sluice/backends/redis_coordinator.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "integration/server_clients.h"
#include "sluice/backends/memory_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(2);

using test_clients::cli;

NodeReport report(std::string id, std::uint32_t l_local, std::uint32_t in_flight = 0,
                  std::uint64_t acked = 0, Nanos lease = seconds(2)) {
  return NodeReport{std::move(id), l_local, in_flight, acked, lease};
}

class RedisCoordinatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.status().to_string(); }

  // Keys under `prefix`: its own origin and server markers too (each test's loss of state is
  // its own).
  static RedisOptions options(std::string prefix = "sluice:fleet:") {
    RedisOptions o;
    o.port = server_->port();
    o.key_prefix = std::move(prefix);
    return o;
  }

  static std::unique_ptr<RedisCoordinator> connect(CoordinatorConfig config = {},
                                                   const Clock* clock = nullptr,
                                                   std::string prefix = "sluice:fleet:") {
    auto c = RedisCoordinator::connect(options(std::move(prefix)), config, clock);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    return std::move(c.value());
  }

  static testing::SuiteServer<testing::RedisServer> server_;
};
testing::SuiteServer<testing::RedisServer> RedisCoordinatorTest::server_;

TEST_F(RedisCoordinatorTest, ScriptedFleetMatchesTheMemoryCoordinatorInEveryConfig) {
  int config_no = 0;
  for (const Aggregate aggregate : {Aggregate::kMedian, Aggregate::kMin})
    for (const Allocation allocation : {Allocation::kEqualSplit, Allocation::kDemandProportional})
      for (const bool handoff : {false, true}) {
        const CoordinatorConfig config{aggregate, allocation, handoff};
        ManualClock clock(seconds(1000));
        MemoryCoordinator memory(clock, config);
        auto redis = connect(config, &clock, "scripted" + std::to_string(config_no) + ":");
        ASSERT_NE(redis, nullptr);
        const std::string key = "scripted-" + std::to_string(config_no++);
        std::map<std::string, std::uint64_t> gen;  // what each node enforces
        std::string on = key + "-origin";
        auto both = [&](const std::string& id, std::uint32_t l_local, std::uint32_t in_flight) {
          const NodeReport r = report(id, l_local, in_flight, gen[id]);
          const auto m = memory.heartbeat(on, r, kTimeout);
          const auto d = redis->heartbeat(on, r, kTimeout);
          ASSERT_TRUE(m.ok() && d.ok()) << d.status().to_string();
          EXPECT_EQ(d.value(), m.value()) << "node " << id << " in " << to_string(aggregate) << "/"
                                          << to_string(allocation) << "/" << handoff;
          gen[id] = m.value().generation;
        };
        // The keys' first heartbeat finds no origin: a loss, so nothing for one lease_ttl (2 s);
        // the memory coordinator is told the same at that instant.
        memory.lose_state();
        both("z", 12, 0);
        both("y", 9, 0);
        clock.advance(seconds(2));
        on = key;
        both("b", 12, 0);
        both("a", 9, 0);
        both("c", 20, 0);
        both("b", 12, 3);
        both("a", 9, 2);
        clock.advance(milliseconds(500));
        both("c", 20, 7);
        both("b", 14, 5);
        ASSERT_TRUE(memory.leave(key, "a", 0, kTimeout).ok());
        ASSERT_TRUE(redis->leave(key, "a", 0, kTimeout).ok());
        both("c", 20, 1);
        clock.advance(seconds(3));  // every lease but the next reporter's expires
        both("b", 13, 2);
        both("a", 8, 0);
        both("c", 21, 0);
      }
}

TEST_F(RedisCoordinatorTest, KeyIsOneHashInOneSlotThatExpiresWhenAbandoned) {
  auto redis = connect();
  ASSERT_NE(redis, nullptr);
  ASSERT_TRUE(redis->heartbeat("orders", report("n1", 10), kTimeout).ok());
  ASSERT_TRUE(redis->heartbeat("orders", report("n2", 10), kTimeout).ok());
  const std::string key = "'sluice:fleet:{orders}'";
  EXPECT_EQ(cli(server_->port(), "TYPE " + key), "hash");
  EXPECT_EQ(cli(server_->port(), "HLEN " + key), "4");  // g, c, n:n1, n:n2
  const int ttl_ms = std::stoi(cli(server_->port(), "PTTL " + key));
  EXPECT_GT(ttl_ms, 0);       // abandoned keys disappear
  EXPECT_LE(ttl_ms, 60'000);  // at least a minute, 100 leases here
  EXPECT_EQ(cli(server_->port(), "KEYS 'sluice:fleet:*'").find("{orders}") != std::string::npos,
            true);
  ASSERT_TRUE(redis->leave("orders", "n1", 0, kTimeout).ok());
  EXPECT_EQ(cli(server_->port(), "HLEN " + key), "3");
  EXPECT_TRUE(redis->leave("orders", "never-joined", 0, kTimeout).ok());
}

TEST_F(RedisCoordinatorTest, FlushedScriptIsReloadedAndTheCallRetried) {
  auto redis = connect();
  ASSERT_NE(redis, nullptr);
  ASSERT_TRUE(redis->heartbeat("flush", report("n1", 10), kTimeout).ok());
  const std::string sha = redis->script_sha();
  EXPECT_EQ(cli(server_->port(), "SCRIPT EXISTS " + sha), "1");
  EXPECT_EQ(cli(server_->port(), "SCRIPT FLUSH"), "OK");
  EXPECT_EQ(cli(server_->port(), "SCRIPT EXISTS " + sha), "0");
  const auto g = redis->heartbeat("flush", report("n1", 10), kTimeout);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g.value().generation, 2u);  // the retried call ran once, on the same state
  EXPECT_EQ(cli(server_->port(), "SCRIPT EXISTS " + sha), "1");
}

TEST_F(RedisCoordinatorTest, ServerTimeEvictsExpiredLeases) {
  auto redis = connect({}, nullptr, "server-time:");  // no caller clock: Redis TIME
  ASSERT_NE(redis, nullptr);
  const auto first = redis->heartbeat("time", report("old", 10, 0, 0, milliseconds(1)), kTimeout);
  ASSERT_TRUE(first.ok());
  // A Redis these keys have never seen: nothing for a lease_ttl, on Redis's clock too.
  EXPECT_TRUE(first.value().recovering);
  EXPECT_EQ(first.value().share, 0u);
  const auto two = redis->heartbeat("time", report("new", 10, 0, 0, milliseconds(50)), kTimeout);
  ASSERT_TRUE(two.ok());
  EXPECT_LE(two.value().nodes, 2u);
  std::this_thread::sleep_for(milliseconds(60));
  const auto alone = redis->heartbeat("time", report("new", 10, 0, 0, milliseconds(50)), kTimeout);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone.value().nodes, 1u);
  EXPECT_FALSE(alone.value().recovering);
  EXPECT_EQ(alone.value().share, 10u);
}

TEST_F(RedisCoordinatorTest, ConcurrentCoordinatorsKeepGlobalCap) {
  constexpr int kThreads = 4, kBeats = 200;
  constexpr std::uint32_t kLimit = 16;
  std::vector<std::unique_ptr<RedisCoordinator>> coordinators;
  coordinators.push_back(connect({Aggregate::kMedian, Allocation::kEqualSplit, true}));
  coordinators.push_back(connect({Aggregate::kMedian, Allocation::kEqualSplit, true}));
  ASSERT_NE(coordinators[0], nullptr);
  ASSERT_NE(coordinators[1], nullptr);
  std::vector<std::vector<Grant>> grants(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      RedisCoordinator& c = *coordinators[static_cast<std::size_t>(t % 2)];
      std::uint32_t share = 0;
      std::uint64_t gen = 0;
      for (int i = 0; i < kBeats; ++i) {
        const std::uint32_t in_flight = share == 0 ? 0 : rng() % (share + 1);
        const auto g = c.heartbeat(
            "race", report("node-" + std::to_string(t), kLimit, in_flight, gen, seconds(30)),
            kTimeout);
        if (!g.ok()) continue;
        share = g.value().share;
        gen = g.value().generation;
        grants[static_cast<std::size_t>(t)].push_back(g.value());
      }
    });
  for (auto& th : threads) th.join();
  std::vector<std::uint64_t> gens;
  std::uint32_t last_shares = 0;
  for (const auto& list : grants) {
    ASSERT_EQ(list.size(), static_cast<std::size_t>(kBeats));  // every call succeeded
    for (const Grant& g : list) gens.push_back(g.generation);
    last_shares += list.back().share;
  }
  std::sort(gens.begin(), gens.end());
  EXPECT_EQ(std::adjacent_find(gens.begin(), gens.end()), gens.end()) << "a generation repeated";
  EXPECT_EQ(gens.back(), static_cast<std::uint64_t>(kThreads * kBeats));  // serialised
  EXPECT_LE(last_shares, kLimit);
}

TEST_F(RedisCoordinatorTest, BadReportIsRejectedAndWritesNothing) {
  auto redis = connect();
  ASSERT_NE(redis, nullptr);
  const auto empty_key = redis->heartbeat("", report("n1", 10), kTimeout);
  EXPECT_EQ(empty_key.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty_key.status().message().find("key"), std::string::npos);
  const auto empty_id = redis->heartbeat("bad", report("", 10), kTimeout);
  EXPECT_EQ(empty_id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty_id.status().message().find("node_id"), std::string::npos);
  const auto no_lease = redis->heartbeat("bad", report("n1", 10, 0, 0, Nanos{0}), kTimeout);
  EXPECT_EQ(no_lease.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_lease.status().message().find("lease_ttl"), std::string::npos);
  EXPECT_EQ(cli(server_->port(), "EXISTS 'sluice:fleet:{bad}'"), "0");
  EXPECT_EQ(redis->leave("", "n1", 0, kTimeout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(redis->leave("bad", "", 0, kTimeout).code(), StatusCode::kInvalidArgument);
}

TEST_F(RedisCoordinatorTest, BadOptionsNameTheField) {
  RedisOptions o = options();
  o.port = 0;
  auto c = RedisCoordinator::connect(o, {});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("port"), std::string::npos);
  o = options();
  o.host.clear();
  EXPECT_NE(RedisCoordinator::connect(o, {}).status().message().find("host"), std::string::npos);
  o = options();
  o.key_prefix.clear();
  EXPECT_NE(RedisCoordinator::connect(o, {}).status().message().find("key_prefix"),
            std::string::npos);
}

TEST(RedisCoordinator, UnreachableServerIsUnavailable) {
  RedisOptions o;
  o.port = testing::free_port();  // nothing listens there
  const auto c = RedisCoordinator::connect(o, {});
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find(std::to_string(o.port)), std::string::npos);
}

TEST(RedisCoordinator, AuthIsSentAndAWrongPasswordIsRefused) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start("s3cret-pass").ok());
  RedisOptions o;
  o.port = server.port();
  const auto none = RedisCoordinator::connect(o, {});
  EXPECT_FALSE(none.ok());  // the script cannot be loaded without AUTH
  o.password = "wrong";
  const auto wrong = RedisCoordinator::connect(o, {});
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied);
  o.password = "s3cret-pass";
  auto right = RedisCoordinator::connect(o, {});
  ASSERT_TRUE(right.ok()) << right.status().to_string();
  EXPECT_TRUE(right.value()->heartbeat("auth", report("n1", 4), kTimeout).ok());
  EXPECT_EQ(cli(server.port(), "HLEN 'sluice:fleet:{auth}'", "s3cret-pass"), "3");  // g, c, n:n1
}

// A stopped (SIGSTOP) server accepts nothing and answers nothing: a partition, not an error.
// Every call returns within its timeout, and the coordinator reconnects once the server is back.
TEST(RedisCoordinator, HangingServerYieldsDeadlineExceededWithinTheTimeout) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  RedisOptions o;
  o.port = server.port();
  auto c = RedisCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok());
  RedisCoordinator& redis = *c.value();
  // Leases of 100 ms: the first lease_ttl, in which this fresh Redis grants nothing, is over by
  // the last heartbeat.
  const NodeReport n1 = report("n1", 4, 0, 0, milliseconds(100));
  ASSERT_TRUE(redis.heartbeat("hang", n1, kTimeout).ok());
  ASSERT_EQ(::kill(server.pid(), SIGSTOP), 0);
  const auto start = std::chrono::steady_clock::now();
  const auto g = redis.heartbeat("hang", n1, milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(g.status().code(), StatusCode::kDeadlineExceeded) << g.status().to_string();
  EXPECT_LT(waited, milliseconds(1500));
  // Reconnecting to a hung server is bounded too (the connect timeout).
  const auto again = redis.heartbeat("hang", n1, milliseconds(200));
  EXPECT_FALSE(again.ok());
  ASSERT_EQ(::kill(server.pid(), SIGCONT), 0);
  const auto back = redis.heartbeat("hang", n1, kTimeout);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value().share, 4u);
}

}  // namespace
}  // namespace sluice
