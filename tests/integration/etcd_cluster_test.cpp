// The fleet's and federation's etcd coordinators through a 3-member etcd cluster's faults, under
// load: four servers (each its own coordinator, each starting at another member) heartbeat one
// key every 100 ms, and three regions (likewise) lease one federated key every 20 ms, while the
// test SIGKILLs the leader, then a follower, then two members at once (no quorum), restarting
// each. The global cap holds at every grant (the shares nodes hold, each until its lease_ttl
// from the heartbeat that got it, never sum past the ceiling), and no window's grants sum past
// its budget; every server and region resumes after each fault, nothing is granted without a
// quorum, and the longest gap in answers per fault is printed (docs/faults.md). One ctest test
// that holds the timing lock (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sluice/backends/etcd_coordinator.h"
#include "sluice/backends/etcd_rate_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Steady = std::chrono::steady_clock;

constexpr int kServers = 4;
constexpr std::uint32_t kLimit = 20;
constexpr Nanos kLeaseTtl = seconds(3);

// The order of `cluster`'s endpoints that starts at member `first`.
std::vector<std::string> starting_at(const testing::EtcdCluster& cluster, int first) {
  std::vector<std::string> out;
  const auto all = cluster.endpoints();
  for (std::size_t j = 0; j < all.size(); ++j)
    out.push_back(all[(j + static_cast<std::size_t>(first)) % all.size()]);
  return out;
}

struct Held {
  Grant grant;
  Steady::time_point sent{};
};

class Fleet {
 public:
  explicit Fleet(const testing::EtcdCluster& cluster) {
    for (int i = 0; i < kServers; ++i) {
      EtcdOptions o;
      o.endpoints = starting_at(cluster, i);
      o.key_prefix = "faults/";
      o.connect_timeout = milliseconds(300);
      auto c = EtcdCoordinator::connect(o, {});
      EXPECT_TRUE(c.ok()) << c.status().to_string();
      if (c.ok()) servers_.push_back(std::move(c.value()));
    }
  }
  ~Fleet() { stop(); }

  void start() {
    for (int i = 0; i < kServers; ++i) threads_.emplace_back([this, i] { run(i); });
  }
  void stop() {
    done_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  // Starts a fault's tally: the longest gap between grants of any server from now on.
  void mark() {
    std::lock_guard lock(mu_);
    longest_gap_ = Nanos{0};
    failures_ = 0;
    for (auto& t : last_ok_) t = Steady::now();
  }
  Nanos longest_gap() {
    std::lock_guard lock(mu_);
    Nanos gap = longest_gap_;
    for (const auto& t : last_ok_) gap = std::max<Nanos>(gap, Steady::now() - t);
    return gap;
  }
  int failures() {
    std::lock_guard lock(mu_);
    return failures_;
  }
  int over() const { return over_.load(); }
  int grants() const { return grants_.load(); }
  // Whether every server had a grant within the last `within`, not recovering.
  bool all_granted_within(Nanos within) {
    std::lock_guard lock(mu_);
    for (int i = 0; i < kServers; ++i)
      if (Steady::now() - last_ok_[static_cast<std::size_t>(i)] > within ||
          held_[id(i)].grant.recovering)
        return false;
    return true;
  }
  [[nodiscard]] std::size_t size() const { return servers_.size(); }

 private:
  static std::string id(int i) { return "node-" + std::to_string(i); }

  void run(int i) {
    while (!done_) {
      NodeReport r;
      r.node_id = id(i);
      r.l_local = kLimit;
      r.instance = static_cast<std::uint64_t>(i + 1);
      r.lease_ttl = kLeaseTtl;
      {
        std::lock_guard lock(mu_);
        r.in_flight = held_[r.node_id].grant.share;  // it uses all it holds
        r.acked_generation = held_[r.node_id].grant.generation;
      }
      const auto sent = Steady::now();
      auto g = servers_[static_cast<std::size_t>(i)]->heartbeat("db", r, milliseconds(800));
      {
        std::lock_guard lock(mu_);
        auto& last = last_ok_[static_cast<std::size_t>(i)];
        if (g.ok()) {
          longest_gap_ = std::max<Nanos>(longest_gap_, Steady::now() - last);
          last = Steady::now();
          held_[r.node_id] = Held{g.value(), sent};
          ++grants_;
          // What the nodes hold now: each its last share until lease_ttl after it asked for it.
          std::uint32_t sum = 0;
          for (const auto& [_, h] : held_)
            if (Steady::now() < h.sent + kLeaseTtl) sum += h.grant.share;
          if (sum > kLimit) ++over_;
        } else {
          ++failures_;
        }
      }
      std::this_thread::sleep_for(milliseconds(100));
    }
  }

  std::vector<std::unique_ptr<EtcdCoordinator>> servers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::map<std::string, Held> held_;
  std::array<Steady::time_point, kServers> last_ok_{};
  Nanos longest_gap_{0};
  int failures_ = 0;
  std::atomic<int> over_{0}, grants_{0};
};

constexpr int kRegions = 3;
constexpr std::uint64_t kBudget = 200;  // per window of 1 s

// Three regions leasing one federated key (5 units at a time, every 20 ms): what each window
// was granted in all, and the longest gap between any region's answers.
class Regions {
 public:
  explicit Regions(const testing::EtcdCluster& cluster) {
    for (int i = 0; i < kRegions; ++i) {
      EtcdOptions o = EtcdRateCoordinator::default_options();
      o.endpoints = starting_at(cluster, i);
      o.key_prefix = "faults/fed/";
      o.connect_timeout = milliseconds(300);
      o.max_clock_offset = milliseconds(10);
      auto c = EtcdRateCoordinator::connect(o);
      EXPECT_TRUE(c.ok()) << c.status().to_string();
      if (c.ok()) regions_.push_back(std::move(c.value()));
    }
  }
  ~Regions() { stop(); }

  void start() {
    for (int i = 0; i < kRegions; ++i) threads_.emplace_back([this, i] { run(i); });
  }
  void stop() {
    done_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  void mark() {
    std::lock_guard lock(mu_);
    longest_gap_ = Nanos{0};
    for (auto& t : last_ok_) t = Steady::now();
  }
  Nanos longest_gap() {
    std::lock_guard lock(mu_);
    Nanos gap = longest_gap_;
    for (const auto& t : last_ok_) gap = std::max<Nanos>(gap, Steady::now() - t);
    return gap;
  }
  bool all_answered_within(Nanos within) {
    std::lock_guard lock(mu_);
    for (const auto& t : last_ok_)
      if (Steady::now() - t > within) return false;
    return true;
  }
  int answers() const { return answers_.load(); }
  // Windows whose grants sum past the budget, and the windows granted in.
  std::pair<int, int> windows_over() {
    std::lock_guard lock(mu_);
    int over = 0, granted = 0;
    for (const auto& [_, units] : granted_) {
      over += units > kBudget ? 1 : 0;
      granted += units > 0 ? 1 : 0;
    }
    return {over, granted};
  }
  [[nodiscard]] std::size_t size() const { return regions_.size(); }

 private:
  void run(int i) {
    LeaseRequest r;
    r.region = "region-" + std::to_string(i);
    r.spec = {kBudget, seconds(1)};
    r.want = 5;
    while (!done_) {
      auto g = regions_[static_cast<std::size_t>(i)]->lease("api", r, milliseconds(800));
      if (g.ok()) {
        ++answers_;
        std::lock_guard lock(mu_);
        auto& last = last_ok_[static_cast<std::size_t>(i)];
        longest_gap_ = std::max<Nanos>(longest_gap_, Steady::now() - last);
        last = Steady::now();
        granted_[g.value().window_start.count()] += g.value().granted;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }

  std::vector<std::unique_ptr<EtcdRateCoordinator>> regions_;
  std::vector<std::thread> threads_;
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::map<std::int64_t, std::uint64_t> granted_;  // window start -> units granted in it
  std::array<Steady::time_point, kRegions> last_ok_{};
  Nanos longest_gap_{0};
  std::atomic<int> answers_{0};
};

// Waits up to `limit` for every server to be granted again (not recovering).
bool resumed(Fleet& fleet, Regions& regions, Nanos limit) {
  const auto until = Steady::now() + limit;
  while (Steady::now() < until) {
    if (fleet.all_granted_within(milliseconds(500)) &&
        regions.all_answered_within(milliseconds(500)))
      return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return false;
}

double ms(Nanos d) { return std::chrono::duration<double, std::milli>(d).count(); }

TEST(EtcdClusterFaults, LeaderFollowerAndQuorumLossKeepTheCapAndServiceResumes) {
  testing::EtcdCluster cluster;
  const Status started = cluster.start(3);
  ASSERT_TRUE(started.ok()) << started.to_string();
  Fleet fleet(cluster);
  ASSERT_EQ(fleet.size(), static_cast<std::size_t>(kServers));
  Regions regions(cluster);
  ASSERT_EQ(regions.size(), static_cast<std::size_t>(kRegions));
  fleet.start();
  regions.start();
  ASSERT_TRUE(resumed(fleet, regions, seconds(15))) << "the fleet never settled";
  const auto mark = [&] {
    fleet.mark();
    regions.mark();
  };

  // 1. The leader.
  const int leader = cluster.leader();
  ASSERT_GE(leader, 0);
  mark();
  cluster.kill(leader);
  std::this_thread::sleep_for(seconds(4));
  ASSERT_TRUE(resumed(fleet, regions, seconds(15))) << "no grants after the leader was killed";
  const Nanos leader_gap = fleet.longest_gap();
  const Nanos leader_gap_fed = regions.longest_gap();
  const int leader_failures = fleet.failures();
  ASSERT_TRUE(cluster.restart(leader).ok());

  // 2. A follower.
  std::this_thread::sleep_for(seconds(1));
  int follower = -1;
  for (int i = 0; i < cluster.size() && follower < 0; ++i)
    if (i != cluster.leader()) follower = i;
  ASSERT_GE(follower, 0);
  mark();
  cluster.kill(follower);
  std::this_thread::sleep_for(seconds(3));
  ASSERT_TRUE(resumed(fleet, regions, seconds(15))) << "no grants after a follower was killed";
  const Nanos follower_gap = fleet.longest_gap();
  const Nanos follower_gap_fed = regions.longest_gap();
  ASSERT_TRUE(cluster.restart(follower).ok());

  // 3. Two of three: no quorum. Every heartbeat and lease fails (the servers' policies follow
  // their outage mode), then service resumes once one comes back.
  std::this_thread::sleep_for(seconds(1));
  const int a = (cluster.leader() + 1) % cluster.size(), b = (a + 1) % cluster.size();
  cluster.kill(a);
  cluster.kill(b);
  std::this_thread::sleep_for(milliseconds(1500));  // in flight when they went: done by now
  const int granted_before = fleet.grants();
  const int answered_before = regions.answers();
  std::this_thread::sleep_for(seconds(2));
  const int granted_without_quorum = fleet.grants() - granted_before;
  const int answered_without_quorum = regions.answers() - answered_before;
  mark();
  const auto back = Steady::now();
  ASSERT_TRUE(cluster.restart(a).ok());
  ASSERT_TRUE(resumed(fleet, regions, seconds(20))) << "no grants after the quorum came back";
  const Nanos quorum_back = Steady::now() - back;
  ASSERT_TRUE(cluster.restart(b).ok());
  fleet.stop();
  regions.stop();
  const auto [windows_over, windows_granted] = regions.windows_over();

  std::printf(
      "[etcd faults] leader killed: longest gap in any server's grants %.0f ms (%d heartbeats "
      "failed), in any region's lease answers %.0f ms; follower killed: %.0f ms, %.0f ms; two of "
      "three killed: %d grants and %d lease answers in 2 s without a quorum, every server and "
      "region answered again %.0f ms after one came back (restart included); %d grants in all, "
      "%d over the ceiling; %d windows leased, %d over the budget\n",
      ms(leader_gap), leader_failures, ms(leader_gap_fed), ms(follower_gap), ms(follower_gap_fed),
      granted_without_quorum, answered_without_quorum, ms(quorum_back), fleet.grants(),
      fleet.over(), windows_granted, windows_over);
  EXPECT_EQ(fleet.over(), 0);
  EXPECT_EQ(granted_without_quorum, 0);
  EXPECT_EQ(answered_without_quorum, 0);
  EXPECT_EQ(windows_over, 0);
  EXPECT_GT(windows_granted, 10);
  EXPECT_LT(leader_gap, seconds(10));
  EXPECT_LT(leader_gap_fed, seconds(10));
  EXPECT_LT(follower_gap, seconds(5));
  EXPECT_LT(follower_gap_fed, seconds(5));
}

}  // namespace
}  // namespace sluice
