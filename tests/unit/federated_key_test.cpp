// The per-key rules of a federated budget (sluice/core/federated_key.h) driven directly: no
// limiter, no lock, no coordinator; each event in, the state and the effects out.
#include "sluice/core/federated_key.h"

#include <gtest/gtest.h>

#include <chrono>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

FederatedKeyRules rules() {
  FederatedKeyRules r;
  r.budget = BudgetSpec{10, seconds(1)};
  r.batch = 4;
  r.refill_below = 1;
  r.retry_backoff = milliseconds(100);
  return r;
}

// A reply as the coordinator gives it at `now` on its clock, for the window [0, 1 s).
FederatedLeaseOutcome reply(LeaseStatus status, std::uint64_t granted, std::uint64_t remaining,
                            Nanos sent_at, Nanos now) {
  LeaseReply r;
  r.status = status;
  r.granted = granted;
  r.window_start = Nanos{0};
  r.window_end = seconds(1);
  r.coordinator_now = now;
  r.remaining = remaining;
  r.spec = rules().budget;
  FederatedLeaseOutcome o;
  o.sent_at = sent_at;
  o.reply = StatusOr<LeaseReply>(r);
  return o;
}

// A key whose first check, of `hits`, is parked at 10 ms behind the lease it asked for.
FederatedKey parked(std::uint64_t hits, const FederatedKeyRules& r = rules()) {
  FederatedKey k;
  KeyEffects e;
  check_key(k, hits, milliseconds(10), true, r, e);
  EXPECT_FALSE(e.decision);
  EXPECT_GT(e.lease_want, 0u);
  return k;
}

TEST(FederatedKey, ACheckWithNoEscrowParksAndAsksForOneLeaseOfABatch) {
  FederatedKey k;
  KeyEffects first;
  check_key(k, 1, milliseconds(10), true, rules(), first);
  EXPECT_FALSE(first.decision) << "nothing here to decide it with";
  EXPECT_EQ(first.lease_want, 4u);
  EXPECT_EQ(first.lease_need, 1u);
  EXPECT_TRUE(k.leasing);
  KeyEffects second;
  check_key(k, 2, milliseconds(11), true, rules(), second);
  EXPECT_FALSE(second.decision);
  EXPECT_EQ(second.lease_want, 0u) << "one lease at a time: it joins the one in flight";
  EXPECT_EQ(k.waiting, (std::deque<std::uint64_t>{1, 2}));
  KeyEffects unparked;
  check_key(k, 1, milliseconds(12), false, rules(), unparked);
  EXPECT_FALSE(unparked.decision);
  EXPECT_EQ(k.waiting.size(), 2u) << "a check that does not park is not queued";
}

TEST(FederatedKey, AGrantDecidesTheParkedChecksInOrderAndSpendsFromEscrowAfter) {
  FederatedKey k = parked(1);
  KeyEffects e;
  check_key(k, 2, milliseconds(11), true, rules(), e);
  KeyEffects granted;
  on_lease(k, reply(LeaseStatus::kGranted, 4, 6, milliseconds(10), milliseconds(10)),
           milliseconds(12), 0, rules(), granted);
  ASSERT_EQ(granted.decided.size(), 2u);
  EXPECT_TRUE(granted.decided[0].rate.allowed);
  EXPECT_TRUE(granted.decided[1].rate.allowed);
  EXPECT_EQ(granted.granted, 4u);
  EXPECT_EQ(granted.spent, 3u);
  EXPECT_EQ(granted.lease_want, 0u);
  EXPECT_FALSE(k.leasing);
  EXPECT_EQ(k.global_left, 6u);
  KeyEffects now;
  check_key(k, 1, milliseconds(13), true, rules(), now);
  ASSERT_TRUE(now.decision);
  EXPECT_TRUE(now.decision->rate.allowed) << "the last unit of escrow, no lease";
  EXPECT_EQ(usable(k.escrow, milliseconds(13)), 0u);
}

TEST(FederatedKey, ASpentWindowRefusesUntilItEndsWithoutAskingAgain) {
  FederatedKey k = parked(3);
  KeyEffects spent;
  on_lease(k, reply(LeaseStatus::kSpent, 0, 0, milliseconds(10), milliseconds(10)),
           milliseconds(12), 0, rules(), spent);
  ASSERT_EQ(spent.decided.size(), 1u);
  EXPECT_FALSE(spent.decided[0].rate.allowed);
  EXPECT_EQ(spent.decided[0].reason, FederatedReason::kBudgetSpent);
  EXPECT_EQ(spent.lease_want, 0u);
  KeyEffects later;
  check_key(k, 1, milliseconds(500), true, rules(), later);
  ASSERT_TRUE(later.decision);
  EXPECT_EQ(later.decision->reason, FederatedReason::kBudgetSpent);
  EXPECT_EQ(later.lease_want, 0u) << "the window is over here: no lease until it ends";
  EXPECT_EQ(later.decision->rate.retry_after, milliseconds(500)) << "until the window's end";
}

// A key holding 4 units of escrow (granted at 10 ms, 6 left in the window).
FederatedKey holding_four() {
  FederatedKey k = parked(0 + 1);
  KeyEffects e;
  on_lease(k, reply(LeaseStatus::kGranted, 5, 5, milliseconds(10), milliseconds(10)),
           milliseconds(12), 0, rules(), e);
  EXPECT_EQ(usable(k.escrow, milliseconds(12)), 4u);
  return k;
}

TEST(FederatedKey, AChargeBeyondTheEscrowIsOwedAndLeasedBeforeAnyCheck) {
  FederatedKey k = holding_four();
  KeyEffects charged;
  const RateCharge c = charge_key(k, 7, milliseconds(20), rules(), charged);
  EXPECT_EQ(charged.spent, 4u) << "the escrow first";
  EXPECT_EQ(k.owed, 3u);
  EXPECT_EQ(c.pending, 3u);
  EXPECT_EQ(c.overdraft, 0u);
  EXPECT_EQ(c.remaining, 2u) << "5 left in the window, 3 of them owed";
  EXPECT_EQ(charged.lease_want, 3u);
  EXPECT_EQ(charged.lease_need, 3u) << "of use only if it pays what is owed";
  EXPECT_TRUE(k.leasing);
  KeyEffects check;
  check_key(k, 1, milliseconds(21), true, rules(), check);
  EXPECT_FALSE(check.decision) << "a check waits behind the charge's lease";
  KeyEffects granted;
  on_lease(k, reply(LeaseStatus::kGranted, 3, 2, milliseconds(20), milliseconds(20)),
           milliseconds(22), 0, rules(), granted);
  EXPECT_EQ(k.owed, 0u);
  EXPECT_EQ(granted.spent, 3u) << "the grant paid the charge";
  ASSERT_EQ(granted.decided.size(), 0u) << "and the check needs the next lease";
  EXPECT_GT(granted.lease_want, 0u);
  EXPECT_EQ(granted.lease_need, 1u);
}

TEST(FederatedKey, WhatNoBudgetCoversIsForgivenAndTheWindowRefusesUntilItEnds) {
  FederatedKey k = holding_four();
  KeyEffects charged;
  (void)charge_key(k, 12, milliseconds(20), rules(), charged);
  EXPECT_EQ(k.owed, 8u);
  EXPECT_EQ(charged.lease_need, 5u) << "all the budget the last reply said is left";
  KeyEffects granted;
  on_lease(k, reply(LeaseStatus::kGranted, 5, 0, milliseconds(20), milliseconds(20)),
           milliseconds(22), 0, rules(), granted);
  EXPECT_EQ(granted.spent, 5u);
  EXPECT_EQ(granted.forgiven, 3u) << "past the limit: an overdraft";
  EXPECT_EQ(k.owed, 0u);
  EXPECT_EQ(granted.lease_want, 0u);
  KeyEffects check;
  check_key(k, 1, milliseconds(500), true, rules(), check);
  ASSERT_TRUE(check.decision);
  EXPECT_EQ(check.decision->reason, FederatedReason::kBudgetSpent);
  EXPECT_EQ(check.decision->rate.retry_after, milliseconds(500));
  KeyEffects none;
  check_key(k, 0, milliseconds(500), true, rules(), none);
  ASSERT_TRUE(none.decision);
  EXPECT_FALSE(none.decision->rate.allowed) << "nothing is left: a check of no hits says so";
  EXPECT_FALSE(peek_key(k, 0, milliseconds(500), rules()).rate.allowed);
  KeyEffects more;
  const RateCharge c = charge_key(k, 2, milliseconds(600), rules(), more);
  EXPECT_EQ(c.overdraft, 2u) << "charged in a spent window: forgiven at once";
  EXPECT_EQ(more.lease_want, 0u);
}

TEST(FederatedKey, WhatIsOwedAfterAFailedLeaseIsAskedAgainThenForgivenWithItsWindow) {
  FederatedKey k = holding_four();
  KeyEffects charged;
  (void)charge_key(k, 6, milliseconds(20), rules(), charged);
  FederatedLeaseOutcome failed;
  failed.sent_at = milliseconds(20);
  failed.reply = StatusOr<LeaseReply>(Status(StatusCode::kUnavailable, "down"));
  KeyEffects e;
  on_lease(k, failed, milliseconds(30), 0, rules(), e);
  EXPECT_EQ(k.owed, 2u);
  EXPECT_EQ(e.lease_want, 0u) << "not during the backoff";
  KeyEffects soon;
  lease_owed(k, milliseconds(50), soon);
  EXPECT_EQ(soon.lease_want, 0u);
  KeyEffects after;
  lease_owed(k, milliseconds(200), after);
  EXPECT_EQ(after.lease_want, 2u) << "the backoff is over";
  k.leasing = false;
  KeyEffects ended;
  lease_owed(k, seconds(1), ended);
  EXPECT_EQ(ended.lease_want, 0u);
  EXPECT_EQ(ended.forgiven, 2u) << "its window is over";
  EXPECT_EQ(k.owed, 0u);
}

TEST(FederatedKey, AGiveBackTakesFromWhatIsOwedFirst) {
  FederatedKey k = holding_four();
  KeyEffects charged;
  (void)charge_key(k, 6, milliseconds(20), rules(), charged);
  EXPECT_EQ(give_back_key(k, 3, milliseconds(21)), 1u) << "2 owed, then 1 back to escrow";
  EXPECT_EQ(k.owed, 0u);
  EXPECT_EQ(usable(k.escrow, milliseconds(21)), 1u);
}

TEST(FederatedKey, AFailedLeaseRefusesForTheBackoffUnlessThePoolServesAnOutage) {
  FederatedLeaseOutcome failed;
  failed.sent_at = milliseconds(10);
  failed.reply = StatusOr<LeaseReply>(Status(StatusCode::kUnavailable, "down"));

  FederatedKey k = parked(1);
  KeyEffects out;
  on_lease(k, failed, milliseconds(20), 0, rules(), out);
  EXPECT_TRUE(out.lease_failed);
  ASSERT_EQ(out.decided.size(), 1u);
  EXPECT_EQ(out.decided[0].reason, FederatedReason::kCoordinatorUnreachable);
  EXPECT_EQ(out.decided[0].rate.retry_after, milliseconds(100));

  FederatedKeyRules pooled = rules();
  pooled.regional_only = true;
  FederatedKey p = parked(1, pooled);
  KeyEffects again;
  on_lease(p, failed, milliseconds(20), 0, pooled, again);
  EXPECT_TRUE(again.lease_failed);
  EXPECT_TRUE(again.decided.empty()) << "the pool serves it: it leases again at once";
  EXPECT_GT(again.lease_want, 0u);
}

TEST(FederatedKey, ASpecMismatchIsToldOncePerWindow) {
  FederatedKey k = parked(1);
  KeyEffects first;
  on_lease(k, reply(LeaseStatus::kSpecMismatch, 0, 0, milliseconds(10), milliseconds(10)),
           milliseconds(12), 0, rules(), first);
  EXPECT_TRUE(first.spec_mismatch);
  EXPECT_TRUE(first.tell_mismatch);
  ASSERT_TRUE(k.spec_in_force);
  KeyEffects e;
  check_key(k, 1, milliseconds(200), true, rules(), e);  // past the backoff: it asks again
  KeyEffects second;
  on_lease(k, reply(LeaseStatus::kSpecMismatch, 0, 0, milliseconds(200), milliseconds(200)),
           milliseconds(202), 0, rules(), second);
  EXPECT_TRUE(second.spec_mismatch) << "counted every time";
  EXPECT_FALSE(second.tell_mismatch) << "told once in the window";
}

TEST(FederatedKey, ExpiredEscrowIsGivenUpWithItsWindowsRunningTotal) {
  FederatedKey k = parked(1);
  KeyEffects granted;
  on_lease(k, reply(LeaseStatus::kGranted, 4, 6, milliseconds(10), milliseconds(10)),
           milliseconds(12), 0, rules(), granted);
  ASSERT_EQ(k.escrow.units, 3u);
  KeyEffects early;
  give_up(k, milliseconds(500), true, early);
  EXPECT_TRUE(early.given_up.empty()) << "not expired yet";
  KeyEffects late;
  check_key(k, 1, seconds(2), true, rules(), late);
  ASSERT_EQ(late.given_up.size(), 1u) << "a check gives expired escrow up first";
  EXPECT_EQ(late.given_up[0].window_start, Nanos{0});
  EXPECT_EQ(late.given_up[0].units, 3u);
  EXPECT_EQ(late.given_up[0].total, 3u);
  EXPECT_EQ(late.forfeited, 3u);
  EXPECT_FALSE(forgettable(k, seconds(2), rules())) << "it leases for the check";
}

TEST(FederatedKey, PeekSpendsNothingAndAsksForNothing) {
  FederatedKey k = parked(2);
  KeyEffects granted;
  on_lease(k, reply(LeaseStatus::kGranted, 4, 6, milliseconds(10), milliseconds(10)),
           milliseconds(12), 0, rules(), granted);
  const FederatedKey before = k;
  EXPECT_TRUE(peek_key(k, 2, milliseconds(13), rules()).rate.allowed);
  EXPECT_FALSE(peek_key(k, 11, milliseconds(13), rules()).rate.allowed);
  EXPECT_EQ(peek_key(k, 11, milliseconds(13), rules()).reason, FederatedReason::kNeverFits);
  EXPECT_EQ(k.escrow, before.escrow);
  EXPECT_EQ(k.leasing, before.leasing);
}

}  // namespace
}  // namespace sluice
