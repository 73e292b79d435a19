// Conformance: the memory, Redis, PostgreSQL and etcd rate coordinators give identical replies,
// field by field, for one long randomized sequence of leases and reconciles over several keys and
// regions: window rolls, spec mismatches, the taper as budgets run low, windows ending, repeated,
// out-of-order and stale reconciles, and the state-loss rule.
//
// Time is controlled, not compared after the fact: every backend runs in test mode, taking the
// coordinator's clock from one ManualClock (the same seam the fleet's conformance test uses), so
// each call sees the same `now` on every backend and replies can be compared exactly. The clock
// moves in whole milliseconds (Redis's arithmetic is in microseconds). The real servers' own
// clocks are exercised by the per-backend tests.
//
// etcd's coordinator runs with max_clock_offset 0: its replies then say no clock uncertainty, and
// its time is the one clock's, as the others'. (Its callers on several clocks are
// etcd_rate_coordinator_test.cpp's.) The thread-sanitizer build leaves it out: Debian's gRPC is
// not built for it.
//
// State loss: the Redis, PostgreSQL and etcd coordinators start from empty storage, so their first
// lease finds no origin and makes the window it falls in spent; the memory coordinator is told
// the same with lose_state() at that instant, and the sequence's first lease is a kStateLost on
// all three.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sluice/backends/etcd_rate_coordinator.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/postgres_rate_coordinator.h"
#include "sluice/backends/redis_rate_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(20);  // generous: sanitizer builds on a loaded machine
constexpr int kSteps = 3000;

const std::vector<std::string> kKeys = {"checkout", "search", "login"};
const std::vector<std::string> kRegions = {"us-east", "eu-west", "ap-south", "sa-east", "EU-2"};
// Each key's usual spec; a mismatch asks another limit or another period.
const std::map<std::string, BudgetSpec> kSpecs = {{"checkout", {40, seconds(1)}},
                                                  {"search", {200, seconds(2)}},
                                                  {"login", {9, milliseconds(1500)}}};

std::string describe(const LeaseReply& r) {
  return std::string(to_string(r.status)) + " granted " + std::to_string(r.granted) + " window [" +
         std::to_string(r.window_start.count()) + ", " + std::to_string(r.window_end.count()) +
         ") now " + std::to_string(r.coordinator_now.count()) + " remaining " +
         std::to_string(r.remaining) + " spec " + std::to_string(r.spec.limit) + "/" +
         std::to_string(r.spec.period.count());
}

// What a region was granted per (key, window), and what it reported given up there.
struct Held {
  std::uint64_t granted = 0;
  std::uint64_t reported = 0;
};

struct Tally {
  std::map<LeaseStatus, int> statuses;
  int lifted = 0;
  int reconciles = 0, given_back = 0, repeats = 0, ended = 0, rolls = 0, tapered = 0;
};

class RateCoordinatorConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    redis_.start();
    postgres_.start();
#ifndef __SANITIZE_THREAD__
    etcd_started_ = etcd_.start(1);
#endif
  }
  static void TearDownTestSuite() {
    redis_.stop();
    postgres_.stop();
    etcd_.stop();
  }
  void SetUp() override {
    ASSERT_TRUE(redis_.ok()) << redis_.status().to_string();
    ASSERT_TRUE(postgres_.ok()) << postgres_.status().to_string();
  }

  static testing::SuiteServer<testing::RedisServer> redis_;
  static testing::SuiteServer<testing::PostgresServer> postgres_;
  static testing::EtcdCluster etcd_;
  static Status etcd_started_;
};
testing::EtcdCluster RateCoordinatorConformance::etcd_;
Status RateCoordinatorConformance::etcd_started_;
testing::SuiteServer<testing::RedisServer> RateCoordinatorConformance::redis_;
testing::SuiteServer<testing::PostgresServer> RateCoordinatorConformance::postgres_;

TEST_F(RateCoordinatorConformance, RandomSequenceGivesIdenticalRepliesOnEveryBackend) {
  ManualClock clock(seconds(1'000'000));  // a multiple of every period: one origin window
  MemoryRateCoordinator memory(clock);
  RedisOptions ro = RedisRateCoordinator::default_options();
  ro.port = redis_->port();
  ro.key_prefix = "conformance:fed:";
  auto redis = RedisRateCoordinator::connect(ro, &clock);
  ASSERT_TRUE(redis.ok()) << redis.status().to_string();
  PostgresOptions po = PostgresRateCoordinator::default_options();
  po.conninfo = postgres_->conninfo();
  po.table_prefix = "conformance_fed";
  auto postgres = PostgresRateCoordinator::connect(po, &clock);
  ASSERT_TRUE(postgres.ok()) << postgres.status().to_string();
  std::vector<RateCoordinator*> all = {&memory, redis.value().get(), postgres.value().get()};
#ifndef __SANITIZE_THREAD__
  ASSERT_TRUE(etcd_started_.ok()) << etcd_started_.to_string();
  EtcdOptions eo = EtcdRateCoordinator::default_options();
  eo.endpoints = etcd_.endpoints();
  eo.key_prefix = "conformance/fed/";
  eo.max_clock_offset = Nanos{0};
  auto etcd = EtcdRateCoordinator::connect(eo, &clock);
  ASSERT_TRUE(etcd.ok()) << etcd.status().to_string();
  all.push_back(etcd.value().get());
#endif

  memory.lose_state(seconds(1));  // as the empty servers find themselves at their first lease
  std::mt19937_64 rng(20261125);
  auto pick = [&](std::uint64_t n) { return rng() % n; };
  // A lease's need (a check larger than the region's escrow) from a stream of its own: the
  // sequence above stays the one it was.
  std::mt19937_64 needs(20261127);
  std::map<std::string, std::map<std::int64_t, Held>> held;  // "key/region" -> window -> Held
  std::map<std::string, std::int64_t> last_window;           // key -> window of the last reply
  Tally tally;
  for (int step = 0; step < kSteps; ++step) {
    const std::string& key = kKeys[step == 0 ? 0 : pick(kKeys.size())];
    const std::string& region = kRegions[pick(kRegions.size())];
    const std::string slot = key + "/" + region;
    const std::uint64_t action = step == 0 ? 0 : pick(100);
    if (action >= 82) {  // time passes: mostly within a window, sometimes across several
      clock.advance(action >= 97 ? milliseconds(1000 + pick(4000)) : milliseconds(1 + pick(400)));
      continue;
    }
    if (action >= 58 && !held[slot].empty()) {  // a reconcile, possibly repeated or stale
      auto& windows = held[slot];
      // Mostly the latest window the region was granted in, else any earlier one.
      auto it = std::prev(windows.end());
      if (pick(4) == 0) {
        it = windows.begin();
        std::advance(it, static_cast<long>(pick(windows.size())));
      }
      Held& h = it->second;
      // The running total: more than before, the same again, or (a delayed message) less; now
      // and then more than was ever granted.
      std::uint64_t total = h.reported;
      const std::uint64_t kind = pick(10);
      if (kind < 6 && h.granted > h.reported) total += 1 + pick(h.granted - h.reported);
      if (kind == 6 && total > 0) total -= 1 + pick(total);
      if (kind == 7) total = h.granted + 1 + pick(5);
      std::vector<std::uint64_t> given;
      for (RateCoordinator* c : all) {
        const auto g = c->reconcile(key, region, Nanos{it->first}, total, kTimeout);
        ASSERT_TRUE(g.ok()) << c->backend() << " step " << step << ": " << g.status().to_string();
        given.push_back(g.value());
      }
      for (std::size_t i = 1; i < given.size(); ++i)
        ASSERT_EQ(given[i], given[0])
            << all[i]->backend() << " differs from memory at step " << step << " (reconcile "
            << slot << ", window " << it->first << ", total " << total << ")";
      h.reported = std::max(h.reported, total);
      ++tally.reconciles;
      if (given[0] > 0) ++tally.given_back;
      if (given[0] == 0 && it->first == last_window[key]) ++tally.repeats;
      if (it->first < last_window[key]) ++tally.ended;
      continue;
    }
    LeaseRequest req;
    req.region = region;
    req.spec = kSpecs.at(key);
    const std::uint64_t odd = pick(25);
    if (odd == 0) req.spec.limit += 1 + pick(5);        // another limit
    if (odd == 1) req.spec.period = milliseconds(750);  // another period
    req.want = 1 + pick(pick(4) == 0 ? 30 : 8);
    req.need = needs() % 3 == 0 ? 1 + needs() % req.want : 0;
    req.min_window_left = pick(3) == 0 ? milliseconds(pick(300)) : Nanos{0};
    std::vector<LeaseReply> replies;
    for (RateCoordinator* c : all) {
      const auto r = c->lease(key, req, kTimeout);
      ASSERT_TRUE(r.ok()) << c->backend() << " step " << step << ": " << r.status().to_string();
      replies.push_back(r.value());
    }
    for (std::size_t i = 1; i < replies.size(); ++i)
      ASSERT_EQ(replies[i], replies[0])
          << all[i]->backend() << " differs from memory at step " << step << " (lease " << slot
          << ", want " << req.want << ", need " << req.need << "):\n  " << describe(replies[i])
          << "\n  vs " << describe(replies[0]);
    const LeaseReply& r = replies[0];
    if (step == 0) {
      ASSERT_EQ(r.status, LeaseStatus::kStateLost);  // the origin window
    }
    if (r.window_start.count() != last_window[key]) ++tally.rolls;
    last_window[key] = r.window_start.count();
    ++tally.statuses[r.status];
    if (r.granted > 0) held[slot][r.window_start.count()].granted += r.granted;
    if (r.granted > 0 && r.granted < req.want && r.remaining > 0) ++tally.tapered;
    if (r.status == LeaseStatus::kGranted && req.need > 1 && r.granted == req.need &&
        r.granted < req.want)
      ++tally.lifted;  // the taper gave less than the need: the need was granted
  }
  std::printf(
      "[conformance] %d steps: granted %d, spent %d, window_ending %d, state_lost %d, "
      "spec_mismatch %d, short %d; %d tapered grants, %d lifted to their need; %d window "
      "rolls; %d reconciles (%d gave back, %d repeats or excess in the current window, %d for "
      "ended windows)\n",
      kSteps, tally.statuses[LeaseStatus::kGranted], tally.statuses[LeaseStatus::kSpent],
      tally.statuses[LeaseStatus::kWindowEnding], tally.statuses[LeaseStatus::kStateLost],
      tally.statuses[LeaseStatus::kSpecMismatch], tally.statuses[LeaseStatus::kShort],
      tally.tapered, tally.lifted, tally.rolls, tally.reconciles, tally.given_back, tally.repeats,
      tally.ended);
  // The sequence reached every rule, not a quiet corner.
  EXPECT_GT(tally.statuses[LeaseStatus::kGranted], 200);
  EXPECT_GT(tally.statuses[LeaseStatus::kSpent], 20);
  EXPECT_GT(tally.statuses[LeaseStatus::kWindowEnding], 5);
  EXPECT_GE(tally.statuses[LeaseStatus::kStateLost], 1);
  EXPECT_GT(tally.statuses[LeaseStatus::kSpecMismatch], 10);
  EXPECT_GT(tally.statuses[LeaseStatus::kShort], 5);
  EXPECT_GT(tally.lifted, 5);
  EXPECT_GT(tally.tapered, 20);
  EXPECT_GT(tally.rolls, 50);
  EXPECT_GT(tally.given_back, 20);
  EXPECT_GT(tally.repeats, 10);
  EXPECT_GT(tally.ended, 20);
}

}  // namespace
}  // namespace sluice
