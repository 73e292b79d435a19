// Conformance: the memory, Redis, PostgreSQL and etcd coordinators give identical grants, step by
// step, for one long randomized sequence of joins, heartbeats, leaves and lease expiries, in
// each of the eight fleet configurations (median/min x equal/demand-proportional x acknowledged
// handoff off/on). Redis, PostgreSQL and etcd are real servers the test starts on loopback; every
// backend takes its time from one ManualClock (test mode), moved in whole milliseconds so that
// Redis's microsecond arithmetic is exact.
//
// State loss: Redis, PostgreSQL and etcd start from empty storage, so their first heartbeat finds
// no origin and grants nothing for one lease_ttl from then (fleet.h); the memory coordinator is
// told the same with lose_state() at that instant.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sluice/backends/etcd_coordinator.h"
#include "sluice/backends/memory_coordinator.h"
#include "sluice/backends/postgres_coordinator.h"
#include "sluice/backends/redis_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(20);  // generous: sanitizer builds on a loaded machine
constexpr int kSteps = 600;              // per configuration

// Ids whose byte order differs from a naive numeric or case-folded order, short ones and long
// ones sharing a prefix longer than 8 bytes (one a prefix of another), and long ones that
// differ early but compare the other way late.
const std::vector<std::string> kIds = {"n-10",
                                       "n-9",
                                       "N1",
                                       "a.b",
                                       "z",
                                       "node:7",
                                       "0",
                                       "fleet-node-000000000010",
                                       "fleet-node-000000000009",
                                       "fleet-node-00000000001",
                                       "fleet-a-node-000000001",
                                       "fleet-b-node-000000000"};
const std::vector<std::string> kKeys = {"checkout", "search"};

struct Backends {
  ManualClock clock{seconds(1'000'000)};
  std::vector<std::unique_ptr<ConcurrencyCoordinator>> all;
};

class CoordinatorConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    redis_.start();
    postgres_.start();
    etcd_ = std::make_unique<testing::EtcdCluster>();
    etcd_status_ = etcd_->start(1);
  }
  static void TearDownTestSuite() {
    redis_.stop();
    postgres_.stop();
    etcd_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(redis_.ok()) << redis_.status().to_string();
    ASSERT_TRUE(postgres_.ok()) << postgres_.status().to_string();
    ASSERT_TRUE(etcd_status_.ok()) << etcd_status_.to_string();
  }

  // The three backends for one configuration; Redis keys and Postgres tables of their own.
  static void make(Backends& b, const CoordinatorConfig& config, int config_no) {
    b.all.push_back(std::make_unique<MemoryCoordinator>(b.clock, config));
    RedisOptions ro;
    ro.port = redis_->port();
    ro.key_prefix = "conformance" + std::to_string(config_no) + ":";
    auto redis = RedisCoordinator::connect(ro, config, &b.clock);
    ASSERT_TRUE(redis.ok()) << redis.status().to_string();
    b.all.push_back(std::move(redis.value()));
    PostgresOptions po;
    po.conninfo = postgres_->conninfo();
    po.table_prefix = "conformance" + std::to_string(config_no);
    auto postgres = PostgresCoordinator::connect(po, config, &b.clock);
    ASSERT_TRUE(postgres.ok()) << postgres.status().to_string();
    b.all.push_back(std::move(postgres.value()));
#if !defined(__SANITIZE_THREAD__)  // gRPC is not built with ThreadSanitizer (scripts/test.sh)
    EtcdOptions eo;
    eo.endpoints = etcd_->endpoints();
    eo.key_prefix = "conformance" + std::to_string(config_no) + "/";
    auto etcd = EtcdCoordinator::connect(eo, config, &b.clock);
    ASSERT_TRUE(etcd.ok()) << etcd.status().to_string();
    b.all.push_back(std::move(etcd.value()));
#endif
  }

  static testing::SuiteServer<testing::RedisServer> redis_;
  static testing::SuiteServer<testing::PostgresServer> postgres_;
  static std::unique_ptr<testing::EtcdCluster> etcd_;
  static Status etcd_status_;
};
testing::SuiteServer<testing::RedisServer> CoordinatorConformance::redis_;
testing::SuiteServer<testing::PostgresServer> CoordinatorConformance::postgres_;
std::unique_ptr<testing::EtcdCluster> CoordinatorConformance::etcd_;
Status CoordinatorConformance::etcd_status_;

struct Tally {
  int heartbeats = 0, leaves = 0, expiries = 0, capped = 0, zero_shares = 0, max_nodes = 0;
  int clashes = 0, recovering = 0;
};

TEST_F(CoordinatorConformance, RandomSequenceGivesIdenticalGrantsOnEveryBackend) {
  int config_no = 0;
  Tally tally;
  for (const Aggregate aggregate : {Aggregate::kMedian, Aggregate::kMin})
    for (const Allocation allocation : {Allocation::kEqualSplit, Allocation::kDemandProportional})
      for (const bool handoff : {false, true}) {
        const CoordinatorConfig config{aggregate, allocation, handoff};
        const std::string name = std::string(to_string(aggregate)) + "/" +
                                 std::string(to_string(allocation)) +
                                 (handoff ? "/handoff" : "/no-handoff");
        Backends b;
        make(b, config, config_no);
#if defined(__SANITIZE_THREAD__)
        ASSERT_EQ(b.all.size(), 3u);
#else
        ASSERT_EQ(b.all.size(), 4u);
#endif
        std::mt19937_64 rng(20261123 + static_cast<unsigned>(config_no));
        ++config_no;
        auto pick = [&](std::uint64_t n) { return rng() % n; };
        // Which member reports under each id: drawn from a stream of its own (the sequence
        // above stays the one it was). Now and then a twin (another process given the same
        // id), a restart (a new member takes the id over) or a report that does not say.
        std::mt19937_64 members(7 + static_cast<unsigned>(config_no));
        std::map<std::string, std::uint64_t> member_of;
        auto member = [&](const std::string& id) -> std::uint64_t {
          std::uint64_t& held = member_of[id];
          if (held == 0) held = members() | 1;
          switch (members() % 25) {
            case 0:
              return members() | 1;  // a twin
            case 1:
              return held = members() | 1;  // a restart
            case 2:
              return 0;
            default:
              return held;
          }
        };
        // What each node enforces (its last grant) per key: the source of its next report.
        std::map<std::string, Grant> enforced;
        bool origin = false;  // the first heartbeat has been made (the backends' origin)
        for (int step = 0; step < kSteps; ++step) {
          const std::string& key = kKeys[pick(kKeys.size())];
          const std::string& id = kIds[pick(kIds.size())];
          const std::string slot = key + "/" + id;
          const std::uint64_t action = pick(100);
          if (action < 8) {  // a graceful leave (the node may not be there, or be another's)
            const std::uint64_t instance = member(id);
            for (auto& c : b.all)
              ASSERT_TRUE(c->leave(key, id, instance, kTimeout).ok())
                  << c->backend() << " step " << step;
            enforced.erase(slot);
            ++tally.leaves;
            continue;
          }
          if (action < 16) {  // time passes; leases of 0.5..3 s start expiring
            b.clock.advance(milliseconds(1 + pick(2500)));
            ++tally.expiries;
            continue;
          }
          const Grant last = enforced[slot];
          NodeReport r;
          r.node_id = id;
          r.instance = member(id);
          r.l_local = static_cast<std::uint32_t>(pick(5) == 0 ? pick(3) : 4 + pick(40));
          // In flight: mostly within the enforced share, sometimes above it (a lowered grant not
          // yet drained), sometimes a stale acknowledgement (a delayed report).
          r.in_flight = static_cast<std::uint32_t>(pick(last.share + 4));
          r.acked_generation =
              pick(6) == 0 && last.generation > 3 ? last.generation - 3 : last.generation;
          r.lease_ttl = milliseconds(500 + 100 * pick(26));
          std::vector<Grant> grants;
          std::vector<Status> refusals;
          if (!origin) static_cast<MemoryCoordinator&>(*b.all[0]).lose_state();
          origin = true;
          for (auto& c : b.all) {
            const auto g = c->heartbeat(key, r, kTimeout);
            if (!g.ok()) {  // another live member holds the id: refused the same way everywhere
              ASSERT_EQ(g.status().code(), StatusCode::kAlreadyExists)
                  << c->backend() << " step " << step << ": " << g.status().to_string();
              refusals.push_back(g.status());
              continue;
            }
            grants.push_back(g.value());
          }
          if (!refusals.empty()) {
            ASSERT_EQ(refusals.size(), b.all.size()) << "step " << step << ": only some refused";
            for (const Status& s : refusals)
              ASSERT_EQ(s.message(), refusals[0].message()) << "step " << step;
            ++tally.clashes;
            continue;
          }
          for (std::size_t i = 1; i < grants.size(); ++i)
            ASSERT_EQ(grants[i], grants[0])
                << b.all[i]->backend() << " differs from memory at step " << step << " (" << name
                << ", key " << key << ", node " << id << "): share " << grants[i].share << " vs "
                << grants[0].share << ", l_global " << grants[i].l_global << " vs "
                << grants[0].l_global << ", nodes " << grants[i].nodes << " vs " << grants[0].nodes
                << ", generation " << grants[i].generation << " vs " << grants[0].generation
                << ", recovering " << grants[i].recovering << " vs " << grants[0].recovering;
          enforced[slot] = grants[0];
          ++tally.heartbeats;
          if (grants[0].share == 0) ++tally.zero_shares;
          if (grants[0].recovering) {
            ++tally.recovering;
            ASSERT_EQ(grants[0].share, 0u) << "step " << step;
          }
          if (grants[0].nodes > 1 && grants[0].share * grants[0].nodes < grants[0].l_global)
            ++tally.capped;
          tally.max_nodes = std::max(tally.max_nodes, static_cast<int>(grants[0].nodes));
        }
      }
  std::printf(
      "[conformance] 8 configs x %d steps: %d heartbeats, %d leaves, %d clock moves; "
      "%d grants below an equal share, %d zero shares (%d within lease_ttl of the origin), up "
      "to %d nodes live, %d heartbeats refused (another member's id)\n",
      kSteps, tally.heartbeats, tally.leaves, tally.expiries, tally.capped, tally.zero_shares,
      tally.recovering, tally.max_nodes, tally.clashes);
  // The sequence reached the interesting regions (joins, caps, evictions), not a quiet corner.
  EXPECT_GT(tally.capped, 100);
  EXPECT_GT(tally.zero_shares, 20);
  EXPECT_GE(tally.max_nodes, 5);
  EXPECT_GT(tally.clashes, 50);
  EXPECT_GT(tally.recovering, 8);  // at least one per configuration
}

}  // namespace
}  // namespace sluice
