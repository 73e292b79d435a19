// The regional pool's rules (sluice/core/escrow.h, P1-P3) and the memory RegionalEscrow, with small
// numbers; the pool as part of a limiter is in tests/unit/federation_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/backends/timed_coordinator.h"
#include "sluice/core/clock.h"
#include "sluice/core/escrow.h"

namespace sluice {
namespace {

constexpr Nanos kHold{50};

// A pool holding `units` of window 100, expiring at pool time 200.
RegionalPool filled(std::uint64_t units) {
  RegionalPool p;
  EXPECT_EQ(pool_refill(p, Nanos{100}, units, Nanos{200}, Nanos{110}).granted, units);
  return p;
}

TEST(RegionalPool, ATakeGrantsWhatTheBalanceHasBeforeExpiryAndReportsTheTimeLeft) {
  RegionalPool p = filled(10);
  const PoolReply r = pool_take(p, 4, kHold, false, Nanos{150});
  EXPECT_EQ(r.granted, 4u);
  EXPECT_EQ(r.balance, 6u);
  EXPECT_EQ(r.window_start, Nanos{100});
  EXPECT_EQ(r.expires_in, Nanos{50});
  EXPECT_EQ(r.now, Nanos{150});
  EXPECT_FALSE(r.refill);  // not short
  const PoolReply rest = pool_take(p, 9, kHold, false, Nanos{160});
  EXPECT_EQ(rest.granted, 6u);
  EXPECT_EQ(rest.balance, 0u);
}

TEST(RegionalPool, NothingIsTakenAtOrAfterExpiryButTheBalanceStaysForTheOutageMode) {
  RegionalPool p = filled(10);
  const PoolReply late = pool_take(p, 4, kHold, false, Nanos{200});
  EXPECT_EQ(late.granted, 0u);
  EXPECT_EQ(late.balance, 10u);
  EXPECT_LE(late.expires_in, Nanos{0});
  // Regional-only: the balance left is served past its window, until it is spent.
  const PoolReply outage = pool_take(p, 4, kHold, true, Nanos{500});
  EXPECT_EQ(outage.granted, 4u);
  EXPECT_EQ(outage.balance, 6u);
}

TEST(RegionalPool, OneShortAskerAtATimeIsMadeTheRefiller) {
  RegionalPool p = filled(2);
  const PoolReply first = pool_take(p, 5, kHold, false, Nanos{120});
  EXPECT_EQ(first.granted, 2u);
  EXPECT_TRUE(first.refill);
  // Another short asker while the refill is in flight leases for itself, not for the pool.
  EXPECT_FALSE(pool_take(p, 5, kHold, false, Nanos{130}).refill);
  // The hold runs out (the refiller died): the next short asker becomes the refiller.
  EXPECT_TRUE(pool_take(p, 5, kHold, false, Nanos{170}).refill);
  // A refill (even an empty one: the refiller's lease failed) ends the one in flight.
  EXPECT_EQ(pool_refill(p, Nanos{100}, 0, Nanos{200}, Nanos{171}).granted, 0u);
  EXPECT_TRUE(pool_take(p, 5, kHold, false, Nanos{172}).refill);
}

TEST(RegionalPool, ARefillAddsToItsWindowAndALaterWindowReplacesTheBalance) {
  RegionalPool p = filled(3);
  // Same window: added; the later of the two expiries (each no later than the window's end).
  EXPECT_EQ(pool_refill(p, Nanos{100}, 4, Nanos{190}, Nanos{120}).granted, 4u);
  EXPECT_EQ(p.balance, 7u);
  EXPECT_EQ(p.expires_at, 200);
  // A later window: the balance of the earlier one is gone.
  const PoolReply next = pool_refill(p, Nanos{300}, 5, Nanos{390}, Nanos{305});
  EXPECT_EQ(next.granted, 5u);
  EXPECT_EQ(next.balance, 5u);
  EXPECT_EQ(p.window_start, 300);
  EXPECT_EQ(p.expires_at, 390);
}

TEST(RegionalPool, AStaleOrExpiredRefillAcceptsNothingSoTheRefillerKeepsItsUnits) {
  RegionalPool p;
  ASSERT_EQ(pool_refill(p, Nanos{300}, 5, Nanos{390}, Nanos{305}).granted, 5u);
  EXPECT_EQ(pool_refill(p, Nanos{100}, 4, Nanos{390}, Nanos{306}).granted, 0u);  // older window
  EXPECT_EQ(pool_refill(p, Nanos{300}, 4, Nanos{307}, Nanos{307}).granted, 0u);  // expiry past
  EXPECT_EQ(p.balance, 5u);
}

TEST(RegionalPool, AReleaseIsTakenBackOnlyInThePoolsWindowBeforeExpiry) {
  RegionalPool p = filled(3);
  EXPECT_EQ(pool_release(p, Nanos{100}, 2, Nanos{150}).granted, 2u);
  EXPECT_EQ(p.balance, 5u);
  EXPECT_EQ(pool_release(p, Nanos{0}, 2, Nanos{150}).granted, 0u);    // another window
  EXPECT_EQ(pool_release(p, Nanos{100}, 2, Nanos{200}).granted, 0u);  // expired
  EXPECT_EQ(p.balance, 5u);
}

TEST(RegionalPool, APoolClockThatStepsBackStandsStill) {
  RegionalPool p = filled(10);
  EXPECT_EQ(pool_take(p, 1, kHold, false, Nanos{190}).now, Nanos{190});
  const PoolReply back = pool_take(p, 1, kHold, false, Nanos{20});
  EXPECT_EQ(back.now, Nanos{190});
  EXPECT_EQ(back.expires_in, Nanos{10});
  EXPECT_EQ(pool_take(p, 1, kHold, false, Nanos{30}).granted, 1u);
  EXPECT_EQ(pool_take(p, 1, kHold, false, Nanos{200}).granted, 0u);
}

TEST(RegionalPool, DemandCountsEveryTakesAskUntilALaterWindowsRefill) {
  RegionalPool p = filled(10);
  EXPECT_EQ(p.demand, 0u);
  EXPECT_EQ(pool_take(p, 4, kHold, false, Nanos{120}).demand, 4u);
  // What was asked, granted or not (this one is short by 6).
  EXPECT_EQ(pool_take(p, 12, kHold, false, Nanos{130}).demand, 16u);
  // Neither a refill of the same window nor a release restarts it.
  EXPECT_EQ(pool_refill(p, Nanos{100}, 5, Nanos{200}, Nanos{140}).demand, 16u);
  EXPECT_EQ(pool_release(p, Nanos{100}, 1, Nanos{150}).demand, 16u);
  // Past the expiry the asks still count: the window that ended is the demand a refiller of
  // the next one reads.
  EXPECT_EQ(pool_take(p, 3, kHold, false, Nanos{250}).demand, 19u);
  // The next window's refill restarts it.
  EXPECT_EQ(pool_refill(p, Nanos{1100}, 8, Nanos{1200}, Nanos{260}).demand, 0u);
  EXPECT_EQ(pool_take(p, 2, kHold, false, Nanos{270}).demand, 2u);
  // Capped at 2^53, as the Redis pool's exact numbers are.
  pool_take(p, UINT64_MAX, kHold, false, Nanos{280});
  EXPECT_EQ(pool_take(p, UINT64_MAX, kHold, false, Nanos{290}).demand, std::uint64_t{1} << 53);
}

TEST(RegionalPool, AWindowsFirstRefillIsSizedByTheLastWindowsDemand) {
  const Nanos period{1000};
  PoolReply t;
  // No window yet: nothing known of the region's demand, a whole regional batch.
  EXPECT_EQ(regional_refill_size(t, period, 64), 64u);
  t.window_start = Nanos{5000};
  t.demand = 30;
  // Within the pool's window: a regional batch.
  t.expires_in = Nanos{250};
  EXPECT_EQ(regional_refill_size(t, period, 64), 64u);
  // The pool's window just ended: what the region asked in it.
  t.expires_in = Nanos{-10};
  EXPECT_EQ(regional_refill_size(t, period, 64), 30u);
  t.expires_in = Nanos{0};
  EXPECT_EQ(regional_refill_size(t, period, 64), 30u);
  t.expires_in = Nanos{1} - period;
  EXPECT_EQ(regional_refill_size(t, period, 64), 30u);
  // ... at most the regional batch.
  t.demand = 500;
  EXPECT_EQ(regional_refill_size(t, period, 64), 64u);
  // A window that ended a period ago or more says nothing of this one.
  t.demand = 30;
  t.expires_in = -period;
  EXPECT_EQ(regional_refill_size(t, period, 64), 64u);
}

TEST(RegionalPool, ExpiriesAreMappedWithoutOutlivingTheWindow) {
  // The refiller saw pool time 1000 at its own 50, and its escrow expires at its 850: the pool
  // gets 1000 + 800, less 1% drift (8, rounded up).
  EXPECT_EQ(pool_expiry(Nanos{1000}, Nanos{50}, Nanos{850}, 10'000), Nanos{1792});
  // An escrow already expired gives a pool expiry at the reading itself (nothing accepted).
  EXPECT_EQ(pool_expiry(Nanos{1000}, Nanos{50}, Nanos{40}, 10'000), Nanos{1000});
  // A taker that sent at its 70 and was told 200 were left: 70 + 200 - 2.
  PoolReply r;
  r.expires_in = Nanos{200};
  EXPECT_EQ(taken_expiry(r, Nanos{70}, 10'000), Nanos{268});
  r.expires_in = Nanos{-5};
  EXPECT_EQ(taken_expiry(r, Nanos{70}, 10'000), Nanos{70});
}

TEST(MemoryRegionalEscrow, RunsTheRulesOnItsClockAndRefusesBadInputNamingTheField) {
  ManualClock clock(Nanos{110});
  MemoryRegionalEscrow l2(clock);
  ASSERT_TRUE(l2.refill("k", Nanos{100}, 6, Nanos{200}, Nanos{1}).ok());
  clock.advance(Nanos{40});
  StatusOr<PoolReply> t = l2.take("k", 4, kHold, false, Nanos{1});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value().granted, 4u);
  EXPECT_EQ(t.value().now, Nanos{150});
  EXPECT_EQ(l2.release("k", Nanos{100}, 1, Nanos{1}).value().balance, 3u);
  EXPECT_EQ(l2.pool("k")->balance, 3u);
  EXPECT_FALSE(l2.pool("other").has_value());
  EXPECT_TRUE(l2.health(Nanos{1}).ok());

  const StatusOr<PoolReply> no_key = l2.take("", 1, kHold, false, Nanos{1});
  ASSERT_FALSE(no_key.ok());
  EXPECT_EQ(no_key.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_key.status().message().find("key"), std::string::npos);
  EXPECT_NE(l2.take("k", 0, kHold, false, Nanos{1}).status().message().find("want"),
            std::string::npos);
  EXPECT_NE(l2.take("k", 1, Nanos{0}, false, Nanos{1}).status().message().find("refill_hold"),
            std::string::npos);
  EXPECT_EQ(l2.pool("k")->balance, 3u);  // nothing written by a refused call
}

TEST(MemoryRegionalEscrow, ForgetsAPoolKeepAfterItsExpiryOrItsLastCall) {
  const Nanos keep{1000};
  ManualClock clock(Nanos{0});
  MemoryRegionalEscrow l2(clock, keep);
  // 1,000 keys each with units of window 100 expiring at 200; one key never refilled.
  for (int i = 0; i < 1000; ++i)
    ASSERT_TRUE(l2.refill("k" + std::to_string(i), Nanos{100}, 5, Nanos{200}, Nanos{1}).ok());
  clock.set(Nanos{200});
  ASSERT_TRUE(l2.take("empty", 1, kHold, false, Nanos{1}).ok());
  // A key that keeps being used past the others' expiry.
  ASSERT_TRUE(l2.refill("busy", Nanos{1100}, 5, Nanos{2000}, Nanos{1}).ok());
  EXPECT_EQ(l2.size(), 1002u);
  // Just inside `keep` after the expiry: nothing is forgotten yet (a regional-only outage may
  // still serve those balances).
  clock.set(Nanos{1199});
  ASSERT_TRUE(l2.take("busy", 1, kHold, false, Nanos{1}).ok());
  EXPECT_EQ(l2.size(), 1002u);
  EXPECT_EQ(l2.pool("k7")->balance, 5u);
  // Past it: the next call sweeps them, the pool with no window too (its last call was at
  // 200); the busy key stays.
  clock.set(Nanos{1500});
  ASSERT_TRUE(l2.take("busy", 1, kHold, false, Nanos{1}).ok());
  EXPECT_EQ(l2.size(), 1u);
  EXPECT_FALSE(l2.pool("k7").has_value());
  EXPECT_FALSE(l2.pool("empty").has_value());
  EXPECT_EQ(l2.pool("busy")->balance, 3u);
  // A forgotten key starts afresh, and a late release of its old window is refused.
  EXPECT_EQ(l2.release("k7", Nanos{100}, 5, Nanos{1}).value().granted, 0u);
}

TEST(TimedRegionalEscrow, RecordsEveryPoolCallAndItsFailuresChangingNoReply) {
  ManualClock clock(Nanos{110});
  auto stats = std::make_shared<CoordinatorCallStats>();
  auto inner = std::make_shared<MemoryRegionalEscrow>(clock);
  TimedRegionalEscrow timed(inner, clock, stats);
  EXPECT_EQ(timed.backend(), "memory");
  ASSERT_EQ(timed.refill("k", Nanos{100}, 6, Nanos{200}, Nanos{1}).value().granted, 6u);
  ASSERT_EQ(timed.take("k", 4, kHold, false, Nanos{1}).value().balance, 2u);
  ASSERT_EQ(timed.release("k", Nanos{100}, 1, Nanos{1}).value().balance, 3u);
  ASSERT_TRUE(timed.health(Nanos{1}).ok());
  ASSERT_FALSE(timed.take("k", 0, kHold, false, Nanos{1}).ok());  // want 0: refused
  EXPECT_EQ(inner->pool("k")->balance, 3u);
  const std::vector<prometheus::MetricFamily> m = stats->collect("memory");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].metric.at(0).histogram.sample_count, 5u);
  EXPECT_EQ(m[1].metric.at(0).counter.value, 1.0);
}

}  // namespace
}  // namespace sluice
