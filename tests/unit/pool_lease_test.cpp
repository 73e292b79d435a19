// A lease through a regional pool (sluice/core/pool_lease.h) driven step by step: no limiter, no
// pool, no coordinator; each call's result in, the next call and its arguments out. Times in
// milliseconds, the drift allowance 0, so each expiry is plain arithmetic.
#include "sluice/core/pool_lease.h"

#include <gtest/gtest.h>

#include <chrono>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

PoolLeaseRules rules() {
  PoolLeaseRules r;
  r.period = seconds(1);
  r.regional_batch = 40;
  r.drift_ppm = 0;
  r.coordinator_health_check = milliseconds(500);
  return r;
}

// The pool's reply to a take: `granted` units of the window [0, 1 s), 600 ms left of it, read at
// the pool's 300 ms.
StatusOr<PoolReply> take_reply(std::uint64_t granted, bool refill) {
  PoolReply p;
  p.granted = granted;
  p.window_start = Nanos{0};
  p.expires_in = milliseconds(600);
  p.now = milliseconds(300);
  p.refill = refill;
  p.demand = 12;
  return StatusOr<PoolReply>(p);
}

// The coordinator's grant of `granted` for the window [0, 1 s), read at its 350 ms.
StatusOr<LeaseReply> lease_reply(std::uint64_t granted) {
  LeaseReply r;
  r.status = LeaseStatus::kGranted;
  r.granted = granted;
  r.window_start = Nanos{0};
  r.window_end = seconds(1);
  r.coordinator_now = milliseconds(350);
  r.spec = BudgetSpec{100, seconds(1)};
  return StatusOr<LeaseReply>(r);
}

StatusOr<PoolReply> accepted(std::uint64_t units) {
  PoolReply p;
  p.granted = units;
  return StatusOr<PoolReply>(p);
}

Status timeout() { return Status(StatusCode::kDeadlineExceeded, "pool: timed out"); }

TEST(PoolLease, ATakeThatCoversTheWantEndsTheLeaseWithThePoolsUnits) {
  PoolLease l;
  start_pool_lease(l, 8, 3, false, true, milliseconds(100));
  ASSERT_EQ(l.next, PoolCall::kTake);
  EXPECT_EQ(l.take_sent, milliseconds(100));
  on_pool_take(l, take_reply(8, false), milliseconds(120), rules());
  EXPECT_EQ(l.next, PoolCall::kDone);
  EXPECT_EQ(l.outcome.pool_units, 8u);
  EXPECT_EQ(l.outcome.pool_window, Nanos{0});
  // 600 ms left when the pool decided, counted from the take's send (not its receipt).
  EXPECT_EQ(l.outcome.pool_expires, milliseconds(700));
  EXPECT_FALSE(l.outcome.reply) << "the coordinator was not asked";
  EXPECT_FALSE(l.pool_failed_at);
}

TEST(PoolLease, AShortTakeLeasesTheRestAndWhatThePoolGaveCountsTowardTheNeed) {
  PoolLease l;
  start_pool_lease(l, 8, 5, false, true, milliseconds(100));
  on_pool_take(l, take_reply(3, false), milliseconds(120), rules());
  ASSERT_EQ(l.next, PoolCall::kLease);
  EXPECT_EQ(l.ask, 5u);
  EXPECT_EQ(l.lease_need, 2u);
  on_pool_lease(l, lease_reply(5), milliseconds(121), 0, rules());
  EXPECT_EQ(l.next, PoolCall::kDone) << "not the refiller: nothing to put in the pool";
  EXPECT_EQ(l.outcome.pool_units, 3u);
  ASSERT_TRUE(l.outcome.reply && l.outcome.reply->ok());
  EXPECT_EQ(l.outcome.reply->value().granted, 5u);
  EXPECT_EQ(l.outcome.sent_at, milliseconds(121));
}

TEST(PoolLease, TheRefillerLeasesARegionalBatchAndPutsTheRestInThePool) {
  PoolLease l;
  start_pool_lease(l, 8, 1, false, true, milliseconds(100));
  on_pool_take(l, take_reply(2, true), milliseconds(130), rules());
  ASSERT_EQ(l.next, PoolCall::kLease);
  EXPECT_TRUE(l.refiller);
  EXPECT_EQ(l.ask, 40u) << "a regional batch, more than the 6 it lacks";
  EXPECT_EQ(l.lease_need, 0u) << "the pool gave what the check needs";
  on_pool_lease(l, lease_reply(40), milliseconds(131), 0, rules());
  ASSERT_EQ(l.next, PoolCall::kRefill);
  EXPECT_EQ(l.extra, 34u) << "it keeps the 6 it lacked";
  EXPECT_EQ(l.refill_window, Nanos{0});
  // The escrow's expiry (131 + 1000 - 350 = 781 ms) is 651 ms after the take's reply was seen
  // (130 ms): the pool's reading in that reply (300 ms) plus the same span.
  EXPECT_EQ(l.refill_expires, milliseconds(951));
  on_pool_refill(l, accepted(34), milliseconds(140));
  EXPECT_EQ(l.next, PoolCall::kDone);
  EXPECT_EQ(l.refilled, 34u);
  EXPECT_EQ(l.forfeited, 0u);
  EXPECT_EQ(l.outcome.reply->value().granted, 6u);
  EXPECT_EQ(l.outcome.pool_units, 2u);
}

TEST(PoolLease, AWindowsFirstRefillIsSizedByTheLastWindowsDemand) {
  StatusOr<PoolReply> t = take_reply(0, true);
  t.value().window_start = Nanos{0};
  t.value().expires_in = milliseconds(-200);  // the pool's window ended 200 ms ago
  PoolLease l;
  start_pool_lease(l, 4, 1, false, true, milliseconds(100));
  on_pool_take(l, t, milliseconds(110), rules());
  EXPECT_EQ(l.ask, 12u) << "the region asked for 12 in the last window, less than a batch";
}

TEST(PoolLease, ARefillWhoseCallFailsIsGivenUpAndThePoolIsLeftAlone) {
  PoolLease l;
  start_pool_lease(l, 8, 1, false, true, milliseconds(100));
  on_pool_take(l, take_reply(0, true), milliseconds(130), rules());
  on_pool_lease(l, lease_reply(40), milliseconds(131), 0, rules());
  ASSERT_EQ(l.next, PoolCall::kRefill);
  on_pool_refill(l, StatusOr<PoolReply>(timeout()), milliseconds(160));
  EXPECT_EQ(l.next, PoolCall::kDone);
  EXPECT_EQ(l.forfeited, 32u) << "the pool may have applied it: not spent here too";
  EXPECT_EQ(l.refilled, 0u);
  EXPECT_EQ(l.outcome.reply->value().granted, 8u);
  ASSERT_TRUE(l.pool_failed_at);
  EXPECT_EQ(*l.pool_failed_at, milliseconds(160));
}

TEST(PoolLease, ARefillThePoolRefusesLeavesTheUnitsWithTheRefiller) {
  PoolLease l;
  start_pool_lease(l, 8, 1, false, true, milliseconds(100));
  on_pool_take(l, take_reply(0, true), milliseconds(130), rules());
  on_pool_lease(l, lease_reply(40), milliseconds(131), 0, rules());
  on_pool_refill(l, accepted(0), milliseconds(140));
  EXPECT_EQ(l.outcome.reply->value().granted, 40u);
  EXPECT_EQ(l.refilled + l.forfeited, 0u);
  EXPECT_FALSE(l.pool_failed_at);
}

TEST(PoolLease, ARefillerWithNothingLeftOverEndsTheRefillInFlight) {
  for (const bool lease_fails : {false, true}) {
    PoolLease l;
    start_pool_lease(l, 8, 1, false, true, milliseconds(100));
    on_pool_take(l, take_reply(0, true), milliseconds(130), rules());
    on_pool_lease(l, lease_fails ? StatusOr<LeaseReply>(timeout()) : lease_reply(8),
                  milliseconds(131), 0, rules());
    ASSERT_EQ(l.next, PoolCall::kRefill) << lease_fails;
    EXPECT_EQ(l.extra, 0u);
    EXPECT_EQ(l.refill_window, Nanos{kFederatedNever});
    on_pool_refill(l, accepted(0), milliseconds(140));
    EXPECT_EQ(l.next, PoolCall::kDone);
    EXPECT_EQ(l.refilled + l.forfeited, 0u);
  }
}

TEST(PoolLease, ATakeThatFailsLeavesThePoolAloneAndLeasesTheWholeWant) {
  PoolLease l;
  start_pool_lease(l, 8, 3, false, true, milliseconds(100));
  on_pool_take(l, StatusOr<PoolReply>(timeout()), milliseconds(150), rules());
  ASSERT_TRUE(l.pool_failed_at);
  EXPECT_EQ(*l.pool_failed_at, milliseconds(150));
  ASSERT_EQ(l.next, PoolCall::kLease);
  EXPECT_EQ(l.ask, 8u);
  EXPECT_EQ(l.lease_need, 3u);
  on_pool_lease(l, lease_reply(8), milliseconds(151), 0, rules());
  EXPECT_FALSE(l.pool_failed_at) << "told once, by the step that failed";
  EXPECT_EQ(l.next, PoolCall::kDone);
}

TEST(PoolLease, APoolLeftAloneGoesStraightToTheCoordinator) {
  PoolLease l;
  start_pool_lease(l, 8, 12, false, false, milliseconds(100));
  ASSERT_EQ(l.next, PoolCall::kLease);
  EXPECT_EQ(l.ask, 8u);
  EXPECT_EQ(l.lease_need, 8u) << "the need is at most the want";
}

TEST(PoolLease, InAnOutageThePoolIsAllThereIs) {
  PoolLease down;
  start_pool_lease(down, 8, 1, true, false, milliseconds(100));
  EXPECT_EQ(down.next, PoolCall::kDone);
  EXPECT_TRUE(down.outcome.pool_unreachable);
  EXPECT_TRUE(down.outcome.outage);

  PoolLease failed;
  start_pool_lease(failed, 8, 1, true, true, milliseconds(100));
  on_pool_take(failed, StatusOr<PoolReply>(timeout()), milliseconds(150), rules());
  EXPECT_EQ(failed.next, PoolCall::kDone);
  EXPECT_TRUE(failed.outcome.pool_unreachable);
  EXPECT_TRUE(failed.pool_failed_at);

  PoolLease empty;
  start_pool_lease(empty, 8, 1, true, true, milliseconds(100));
  on_pool_take(empty, take_reply(0, true), milliseconds(150), rules());
  EXPECT_EQ(empty.next, PoolCall::kDone) << "no refill without the coordinator";
  EXPECT_TRUE(empty.outcome.pool_spent);

  PoolLease some;
  start_pool_lease(some, 8, 1, true, true, milliseconds(100));
  StatusOr<PoolReply> past = take_reply(3, false);
  past.value().expires_in = milliseconds(-50);  // served past the pool's window
  on_pool_take(some, past, milliseconds(150), rules());
  EXPECT_EQ(some.next, PoolCall::kDone);
  EXPECT_EQ(some.outcome.pool_units, 3u);
  EXPECT_FALSE(some.outcome.pool_spent);
  // Usable until the next coordinator probe is due at least: 150 + 500 ms.
  EXPECT_EQ(some.outcome.pool_expires, milliseconds(650));
}

}  // namespace
}  // namespace sluice
