// Conformance of shared rate limits: the Redis and PostgreSQL stores give the memory store's
// replies, field by field, for one long randomized sequence of checks, peeks, refunds, charges
// and takes (hits of 0, 1, several, the limit and past it) over keys of every strategy, with
// limits that change part-way (the carry), losses of state (the raise) and keys charged far past
// their limit (kept until they are idle, not only idle_within(rule)); and until its first loss
// each key's replies are the local strategies' own (sluice/core/rate_strategy.h, carried as a
// reload carries a local limiter).
//
// Time is controlled: every store takes the coordinator's clock from one ManualClock in whole
// microseconds (Redis's resolution), so each call sees the same `now`. Rules have periods and
// limits that do not divide each other, so the durations carry nanosecond remainders.
//
// Losses: FLUSHALL on the Redis (no markers: its next call, made at once, makes now the origin),
// the PostgreSQL tables emptied (no origin row: the same), and lose_state() on the memory store at
// that same instant.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server_clients.h"
#include "sluice/backends/memory_shared_rate.h"
#include "sluice/backends/postgres_shared_rate.h"
#include "sluice/backends/redis_shared_rate.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(20);
constexpr int kSteps = 6000;

struct Key {
  std::string name;
  RateRule rule;
  std::uint64_t other_limit;  // the limit a reload part-way gives it
};

RateRule rule(RateStrategy s, std::uint64_t limit, Nanos period, std::uint64_t burst = 0) {
  RateRule r;
  r.strategy = s;
  r.limit = limit;
  r.period = period;
  r.burst = burst;
  return r;
}

std::vector<Key> keys() {
  return {
      {"fixed-7", rule(RateStrategy::kFixedWindow, 7, microseconds(1'300'001)), 4},
      {"fixed-100", rule(RateStrategy::kFixedWindow, 100, seconds(2)), 160},
      {"sliding-9", rule(RateStrategy::kSlidingWindow, 9, microseconds(999'983)), 13},
      {"sliding-40", rule(RateStrategy::kSlidingWindow, 40, milliseconds(2'500)), 25},
      {"gcra-13", rule(RateStrategy::kGcra, 13, microseconds(997'003), 5), 17},
      {"gcra-3", rule(RateStrategy::kGcra, 3, seconds(1)), 7},
      {"gcra-1000", rule(RateStrategy::kGcra, 1000, milliseconds(1'700), 40), 999},
  };
}

std::string describe(const SharedRateReply& r) {
  const RateDecision& d = r.decision;
  const RateCharge& c = r.charge;
  return std::string(d.allowed ? "allowed" : "denied") + " limit " + std::to_string(d.limit) +
         " remaining " + std::to_string(d.remaining) + " reset " +
         std::to_string(d.reset_after.count()) + " retry " + std::to_string(d.retry_after.count()) +
         " now " + std::to_string(r.coordinator_now.count()) + " | charge limit " +
         std::to_string(c.limit) + " remaining " + std::to_string(c.remaining) + " overdraft " +
         std::to_string(c.overdraft) + " reset " + std::to_string(c.reset_after.count()) +
         " retry " + std::to_string(c.retry_after.count()) + " | granted " +
         std::to_string(r.granted);
}

// A key's state in the local strategies, for the replies up to its first loss.
struct Local {
  RateRule rule;
  FixedWindowState fixed;
  SlidingWindowState sliding;
  GcraState gcra;
  bool valid = true;

  template <class State>
  SharedRateReply run(State& s, SharedRateOp op, std::uint64_t hits, Nanos now) {
    SharedRateReply out;
    out.coordinator_now = now;
    switch (op) {
      case SharedRateOp::kCheck:
        out.decision = decide(s, rule, hits, now);
        break;
      case SharedRateOp::kPeek:
        out.decision = decide(s, rule, hits, now, false);
        break;
      case SharedRateOp::kRefund:
        refund(s, rule, hits, now);
        out.decision = decide(s, rule, 0, now, false);
        break;
      case SharedRateOp::kCharge:
        out.charge = charge(s, rule, hits, now);
        out.decision = decide(s, rule, 0, now, false);
        break;
      case SharedRateOp::kTake: {  // what fits of `hits`, checked as one
        const RateDecision none = decide(s, rule, 0, now, false);
        out.granted = none.allowed ? std::min(hits, none.remaining) : 0;
        out.decision = out.granted > 0 ? decide(s, rule, out.granted, now)
                                       : decide(s, rule, hits == 0 ? 0 : 1, now, false);
        break;
      }
    }
    return out;
  }
  SharedRateReply apply(const SharedRateRequest& r, Nanos now) {
    if (r.rule.limit != rule.limit) {
      carry(fixed, rule, r.rule, now);
      carry(sliding, rule, r.rule, now);
      carry(gcra, rule, r.rule, now);
    }
    rule = r.rule;
    switch (rule.strategy) {
      case RateStrategy::kFixedWindow:
        return run(fixed, r.op, r.hits, now);
      case RateStrategy::kSlidingWindow:
        return run(sliding, r.op, r.hits, now);
      case RateStrategy::kGcra:
        return run(gcra, r.op, r.hits, now);
    }
    return {};
  }
};

class SharedRateConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    redis_.start();
    postgres_.start();
  }
  static void TearDownTestSuite() {
    redis_.stop();
    postgres_.stop();
  }
  void SetUp() override {
    ASSERT_TRUE(redis_.ok()) << redis_.status().to_string();
    ASSERT_TRUE(postgres_.ok()) << postgres_.status().to_string();
  }
  static testing::SuiteServer<testing::RedisServer> redis_;
  static testing::SuiteServer<testing::PostgresServer> postgres_;
};
testing::SuiteServer<testing::RedisServer> SharedRateConformance::redis_;
testing::SuiteServer<testing::PostgresServer> SharedRateConformance::postgres_;

TEST_F(SharedRateConformance, RandomSequenceGivesTheMemoryStoresAndTheLocalStrategiesReplies) {
  ManualClock clock(seconds(1'700'000'000));
  MemorySharedRate memory(clock);
  RedisOptions ro = RedisSharedRate::default_options();
  ro.port = redis_->port();
  ro.key_prefix = "conformance:rate:";
  auto redis = RedisSharedRate::connect(ro, &clock);
  ASSERT_TRUE(redis.ok()) << redis.status().to_string();
  ASSERT_TRUE(redis.value()->adopt(kTimeout).ok());  // a new Redis: no loss known
  PostgresOptions po = PostgresSharedRate::default_options();
  po.conninfo = postgres_->conninfo();
  po.table_prefix = "conformance_rate";
  auto postgres = PostgresSharedRate::connect(po, &clock);
  ASSERT_TRUE(postgres.ok()) << postgres.status().to_string();
  ASSERT_TRUE(postgres.value()->adopt(kTimeout).ok());
  test_clients::RawConn sql(postgres_->conninfo());
  ASSERT_TRUE(sql.ok()) << sql.error();

  std::vector<Key> ks = keys();
  std::map<std::string, Local> local;
  for (const Key& k : ks) {
    ASSERT_EQ(redis.value()->rule_error(k.rule), "") << k.name;
    local[k.name].rule = k.rule;
  }
  std::mt19937_64 rng(20261202);
  auto pick = [&](std::uint64_t n) { return rng() % n; };
  std::map<SharedRateOp, int> ops;
  int allowed = 0, denied = 0, losses = 0, carried = 0, compared_local = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::uint64_t action = pick(1000);
    if (action < 150) {  // time passes: mostly a little, sometimes past a window or a refill
      clock.advance(action < 10 ? microseconds(500'000 + pick(3'000'000))
                                : microseconds(1 + pick(action < 100 ? 50'000 : 400'000)));
      continue;
    }
    if (action < 153 && step > kSteps / 3) {  // a loss of state, from a third of the way on
      ASSERT_EQ(test_clients::cli(redis_->port(), "FLUSHALL"), "OK");
      memory.lose_state();
      // A call at the same instant: the Redis finds it has no markers, and makes now its origin.
      SharedRateRequest peek;
      peek.op = SharedRateOp::kPeek;
      ASSERT_TRUE(redis.value()->apply("after-loss", peek, kTimeout).ok());
      sql.rows("DELETE FROM conformance_rate_state; DELETE FROM conformance_rate_origin;");
      ASSERT_TRUE(postgres.value()->apply("after-loss", peek, kTimeout).ok());
      for (auto& [name, l] : local) l.valid = false;
      ++losses;
      continue;
    }
    Key& k = ks[pick(ks.size())];
    if (action < 160) {  // a reload that changes the key's limit (and back, later)
      std::swap(k.rule.limit, k.other_limit);
      ++carried;
    }
    SharedRateRequest req;
    req.rule = k.rule;
    const std::uint64_t o = pick(100);
    req.op = o < 50   ? SharedRateOp::kCheck
             : o < 62 ? SharedRateOp::kPeek
             : o < 74 ? SharedRateOp::kRefund
             : o < 86 ? SharedRateOp::kCharge
                      : SharedRateOp::kTake;
    const std::uint64_t limit =
        k.rule.strategy == RateStrategy::kGcra && k.rule.burst != 0 ? k.rule.burst : k.rule.limit;
    const std::uint64_t h = pick(20);
    req.hits = h < 2 ? 0 : h < 13 ? 1 : h < 16 ? 2 + pick(3) : h < 18 ? limit : limit + 1 + pick(5);
    ++ops[req.op];

    const auto want = memory.apply(k.name, req, kTimeout);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    const auto got = redis.value()->apply(k.name, req, kTimeout);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got.value(), want.value())
        << "step " << step << " key " << k.name << " " << to_string(req.op) << " " << req.hits
        << " limit " << req.rule.limit << "\n  redis:  " << describe(got.value())
        << "\n  memory: " << describe(want.value());
    const auto pg = postgres.value()->apply(k.name, req, kTimeout);
    ASSERT_TRUE(pg.ok()) << pg.status().to_string();
    ASSERT_EQ(pg.value(), want.value())
        << "step " << step << " key " << k.name << " " << to_string(req.op) << " " << req.hits
        << " limit " << req.rule.limit << "\n  postgres: " << describe(pg.value())
        << "\n  memory:   " << describe(want.value());
    Local& l = local[k.name];
    if (l.valid) {
      const SharedRateReply lw = l.apply(req, clock.now());
      ASSERT_EQ(want.value(), lw) << "step " << step << " key " << k.name << " "
                                  << to_string(req.op) << "\n  memory: " << describe(want.value())
                                  << "\n  local:  " << describe(lw);
      ++compared_local;
    }
    if (req.op == SharedRateOp::kCheck) (want.value().decision.allowed ? allowed : denied) += 1;
  }
  // The sequence reached every case it is meant to.
  EXPECT_GT(allowed, 500);
  EXPECT_GT(denied, 300);
  EXPECT_GE(losses, 3);
  EXPECT_GE(carried, 10);
  EXPECT_GT(compared_local, 1000);
  for (SharedRateOp op : {SharedRateOp::kCheck, SharedRateOp::kPeek, SharedRateOp::kRefund,
                          SharedRateOp::kCharge, SharedRateOp::kTake})
    EXPECT_GT(ops[op], 300) << to_string(op);
}

// A batch (apply_many: one script call on Redis, one transaction on PostgreSQL) answers each of
// its calls as if made alone, in order, the same key several times included.
TEST_F(SharedRateConformance, ABatchAnswersEachCallAsIfMadeAloneInOrder) {
  ManualClock clock(seconds(1'800'000'000));
  MemorySharedRate memory(clock);
  RedisOptions ro = RedisSharedRate::default_options();
  ro.port = redis_->port();
  ro.key_prefix = "batches:rate:";
  auto redis = RedisSharedRate::connect(ro, &clock);
  ASSERT_TRUE(redis.ok()) << redis.status().to_string();
  ASSERT_TRUE(redis.value()->adopt(kTimeout).ok());
  PostgresOptions po = PostgresSharedRate::default_options();
  po.conninfo = postgres_->conninfo();
  po.table_prefix = "batches_rate";
  auto postgres = PostgresSharedRate::connect(po, &clock);
  ASSERT_TRUE(postgres.ok()) << postgres.status().to_string();
  ASSERT_TRUE(postgres.value()->adopt(kTimeout).ok());
  const std::vector<Key> ks = keys();
  std::mt19937_64 rng(20261203);
  int calls = 0, repeated = 0;
  for (int batch = 0; batch < 150; ++batch) {
    clock.advance(microseconds(1 + rng() % 200'000));
    const std::size_t n = 1 + rng() % 80;  // past one Redis script call's 64 at times
    std::vector<SharedRateRequest> requests(n);
    std::vector<std::string> names(n);
    std::vector<SharedRateCall> batch_calls(n);
    std::map<std::string, int> seen;
    for (std::size_t i = 0; i < n; ++i) {
      const Key& k = ks[rng() % 3];  // three keys: many repeats in a batch
      names[i] = k.name;
      requests[i].rule = k.rule;
      const std::uint64_t o = rng() % 10;
      requests[i].op = o < 6   ? SharedRateOp::kCheck
                       : o < 7 ? SharedRateOp::kPeek
                       : o < 8 ? SharedRateOp::kRefund
                       : o < 9 ? SharedRateOp::kCharge
                               : SharedRateOp::kTake;
      requests[i].hits = 1 + rng() % 3;
      batch_calls[i] = {names[i], &requests[i]};
      repeated += seen[names[i]]++ > 0;
    }
    const auto from_redis = redis.value()->apply_many(batch_calls, kTimeout);
    const auto from_postgres = postgres.value()->apply_many(batch_calls, kTimeout);
    ASSERT_EQ(from_redis.size(), n);
    ASSERT_EQ(from_postgres.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto want = memory.apply(names[i], requests[i], kTimeout);
      ASSERT_TRUE(want.ok() && from_redis[i].ok() && from_postgres[i].ok())
          << from_redis[i].status().to_string() << " " << from_postgres[i].status().to_string();
      ASSERT_EQ(from_redis[i].value(), want.value())
          << "batch " << batch << " call " << i << "\n  redis:  " << describe(from_redis[i].value())
          << "\n  memory: " << describe(want.value());
      ASSERT_EQ(from_postgres[i].value(), want.value())
          << "batch " << batch << " call " << i
          << "\n  postgres: " << describe(from_postgres[i].value())
          << "\n  memory:   " << describe(want.value());
      ++calls;
    }
  }
  EXPECT_GT(calls, 3000);
  EXPECT_GT(repeated, 2000);
}

}  // namespace
}  // namespace sluice
