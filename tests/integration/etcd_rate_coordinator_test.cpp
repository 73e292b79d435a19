// Federation's coordinator on etcd (sluice/backends/etcd_rate_coordinator.h) against real etcd
// clusters the test starts on loopback: callers on different clocks (the ledger keeps the latest,
// a caller too far behind it is refused, replies carry the clock uncertainty and escrow ends that
// much earlier), a first use and a restore from a snapshot each taken as a loss with the origin
// pushed past every reading, servers racing on one key through compare-and-swap without granting
// more than the window's budget, and the options checked. Identical replies to the other backends
// are the conformance test's (rate_coordinator_conformance_test.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "sluice/backends/etcd_rate_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(5);
constexpr Nanos kOffset = milliseconds(100);  // max_clock_offset: uncertainty 200 ms

LeaseRequest request(const std::string& region, std::uint64_t want, std::uint64_t limit = 100) {
  LeaseRequest r;
  r.region = region;
  r.spec = {limit, seconds(1)};
  r.want = want;
  return r;
}

EtcdOptions options(const testing::EtcdCluster& cluster, const std::string& prefix) {
  EtcdOptions o = EtcdRateCoordinator::default_options();
  o.endpoints = cluster.endpoints();
  o.key_prefix = prefix;
  o.max_clock_offset = kOffset;
  return o;
}

class EtcdRate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { started_ = new Status(cluster_.start(1)); }
  static void TearDownTestSuite() {
    cluster_.stop();
    delete started_;
  }
  void SetUp() override { ASSERT_TRUE(started_->ok()) << started_->to_string(); }

  static testing::EtcdCluster cluster_;
  static Status* started_;
};
testing::EtcdCluster EtcdRate::cluster_;
Status* EtcdRate::started_ = nullptr;

// Two servers, each on its own clock (test mode): the first use is a loss whose origin is the
// finder's time plus the uncertainty; then time is the latest either decided at, a caller within
// the uncertainty behind it is served at that time, one further behind is refused.
TEST_F(EtcdRate, CallersOnTwoClocksShareOneTimeAndTooFarBehindIsRefused) {
  ManualClock fast(seconds(1000) + milliseconds(850));
  ManualClock slow(seconds(1000) + milliseconds(700));
  auto a = EtcdRateCoordinator::connect(options(cluster_, "clocks/"), &fast);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = EtcdRateCoordinator::connect(options(cluster_, "clocks/"), &slow);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  // First use at 1000.85 s: the origin is 1001.05 s, so window [1001, 1002) is spent too.
  auto first = a.value()->lease("k", request("eu", 10), kTimeout);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first.value().status, LeaseStatus::kStateLost);
  EXPECT_EQ(first.value().clock_uncertainty, 2 * kOffset);
  fast.set(seconds(1001) + milliseconds(100));
  auto second = a.value()->lease("k", request("eu", 10), kTimeout);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second.value().status, LeaseStatus::kStateLost);
  EXPECT_EQ(second.value().window_start, seconds(1001));
  fast.set(seconds(1002) + milliseconds(100));
  auto granted = a.value()->lease("k", request("eu", 10), kTimeout);
  ASSERT_TRUE(granted.ok());
  EXPECT_EQ(granted.value().status, LeaseStatus::kGranted);
  EXPECT_EQ(granted.value().granted, 10u);
  // The slow server, 150 ms behind (within 200 ms): served at the fast one's time.
  slow.set(seconds(1001) + milliseconds(950));
  auto behind = b.value()->lease("k", request("us", 10), kTimeout);
  ASSERT_TRUE(behind.ok()) << behind.status().to_string();
  EXPECT_EQ(behind.value().status, LeaseStatus::kGranted);
  EXPECT_EQ(behind.value().window_start, seconds(1002));
  EXPECT_EQ(behind.value().coordinator_now, seconds(1002) + milliseconds(100));
  EXPECT_EQ(behind.value().remaining, 80u);
  // Escrow on the slow server's clock ends 200 ms before the window's end would.
  EXPECT_EQ(escrow_expiry(behind.value(), slow.now(), 0),
            slow.now() + milliseconds(900) - milliseconds(200));
  // Less than the uncertainty left in the window: nothing granted.
  fast.set(seconds(1002) + milliseconds(850));
  auto ending = a.value()->lease("k", request("eu", 10), kTimeout);
  ASSERT_TRUE(ending.ok());
  EXPECT_EQ(ending.value().status, LeaseStatus::kWindowEnding);
  // 250 ms behind the latest time decided at: refused, naming the clocks; a reconcile too.
  auto refused = b.value()->lease("k", request("us", 10), kTimeout);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("900 ms behind"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("max_clock_offset (100 ms)"), std::string::npos);
  slow.set(seconds(1002) + milliseconds(600));
  auto late = b.value()->reconcile("k", "us", seconds(1002), 5, kTimeout);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  slow.set(seconds(1002) + milliseconds(700));  // 150 ms behind: the units go back
  auto back = b.value()->reconcile("k", "us", seconds(1002), 5, kTimeout);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value(), 5u);
}

// Servers racing on one key never grant more than its budget between them, and all of it.
TEST_F(EtcdRate, ServersRacingOnOneKeyGrantTheBudgetExactly) {
  constexpr int kServers = 4;
  constexpr std::uint64_t kLimit = 400;
  ManualClock clock(seconds(5000) + milliseconds(100));
  std::vector<std::unique_ptr<EtcdRateCoordinator>> servers;
  for (int i = 0; i < kServers; ++i) {
    auto c = EtcdRateCoordinator::connect(options(cluster_, "race/"), &clock);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    servers.push_back(std::move(c.value()));
  }
  // The first use's window is spent; the race is in the next one, well clear of its end.
  auto lost = servers[0]->lease("hot", request("r0", 7, kLimit), kTimeout);
  ASSERT_TRUE(lost.ok());
  ASSERT_EQ(lost.value().status, LeaseStatus::kStateLost);
  clock.set(seconds(5001) + milliseconds(300));
  std::atomic<std::uint64_t> granted{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kServers; ++i) {
    threads.emplace_back([&, i] {
      const std::string region = "r" + std::to_string(i);
      for (;;) {
        auto r = servers[static_cast<std::size_t>(i)]->lease("hot", request(region, 7, kLimit),
                                                             seconds(20));
        if (!r.ok()) {
          errors.fetch_add(1);
          return;
        }
        granted.fetch_add(r.value().granted);
        if (r.value().status != LeaseStatus::kGranted) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::uint64_t conflicts = 0;
  for (const auto& s : servers) conflicts += s->conflicts();
  std::printf("[etcd rate race] %d servers granted %llu of %llu; %llu lost compare-and-swaps\n",
              kServers, static_cast<unsigned long long>(granted.load()),
              static_cast<unsigned long long>(kLimit), static_cast<unsigned long long>(conflicts));
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(granted.load(), kLimit);
  EXPECT_GT(conflicts, 0u);  // they did race
}

// A restore from a snapshot keeps the cluster id: a server that saw later revisions finds it,
// counts the window as spent, and the next window is granted again.
TEST(EtcdRateRestore, ARestoreFromASnapshotIsALoss) {
  testing::EtcdCluster cluster;
  ASSERT_TRUE(cluster.start(1).ok());
  ManualClock clock(seconds(7000) + milliseconds(100));
  auto c = EtcdRateCoordinator::connect(options(cluster, "restore/"), &clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c.value()->lease("k", request("eu", 10), kTimeout).value().status,
            LeaseStatus::kStateLost);
  clock.set(seconds(7001) + milliseconds(100));
  ASSERT_EQ(c.value()->lease("k", request("eu", 10), kTimeout).value().status,
            LeaseStatus::kGranted);
  const std::string snap = ::testing::TempDir() + "sluice-etcd-rate-restore.db";
  ASSERT_TRUE(cluster.snapshot(snap).ok());
  for (int i = 0; i < 5; ++i) {  // grants the snapshot does not hold
    auto g = c.value()->lease("k", request("eu", 10), kTimeout);
    ASSERT_TRUE(g.ok());
    ASSERT_EQ(g.value().status, LeaseStatus::kGranted);
  }
  ASSERT_TRUE(cluster.restore(snap).ok());
  std::remove(snap.c_str());
  clock.set(seconds(7001) + milliseconds(200));
  auto after = c.value()->lease("k", request("eu", 10), kTimeout);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  EXPECT_EQ(after.value().status, LeaseStatus::kStateLost);  // the restored ledger says 80 left
  // Found once: the next window is granted.
  clock.set(seconds(7002) + milliseconds(400));
  auto next = c.value()->lease("k", request("eu", 10), kTimeout);
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  EXPECT_EQ(next.value().status, LeaseStatus::kGranted);
}

TEST(EtcdRateOptions, BadOptionsAreNamed) {
  EtcdOptions o = EtcdRateCoordinator::default_options();
  EXPECT_EQ(o.key_prefix, "sluice/fed/");
  o.max_clock_offset = milliseconds(-1);
  auto neg = EtcdRateCoordinator::open(o);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("max_clock_offset"), std::string::npos);
  o.max_clock_offset = std::chrono::hours(2);
  EXPECT_NE(EtcdRateCoordinator::open(o).status().message().find("max_clock_offset"),
            std::string::npos);
  o = EtcdRateCoordinator::default_options();
  o.key_prefix.clear();
  EXPECT_NE(EtcdRateCoordinator::open(o).status().message().find("key_prefix"), std::string::npos);
}

}  // namespace
}  // namespace sluice
