// The escrow core, rule by rule (sluice/core/escrow.h): the coordinator's ledger (rules 1-6) and
// the region's escrow, with small numbers. The exhaustive search over interleavings is
// tests/model/federation_model_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "sluice/core/escrow.h"
#include "sluice/core/rate_strategy.h"

namespace sluice {
namespace {

constexpr BudgetSpec kSpec{10, Nanos{100}};  // 10 units per window of 100 ns

LeaseRequest ask(std::string region, std::uint64_t want, BudgetSpec spec = kSpec,
                 Nanos min_window_left = Nanos{0}) {
  LeaseRequest r;
  r.region = std::move(region);
  r.spec = spec;
  r.want = want;
  r.min_window_left = min_window_left;
  return r;
}

// ---- windows (rule 1) ----

TEST(EscrowCore, WindowOfFloorsOnThePeriodAlsoBeforeTheEpoch) {
  const Nanos p{100};
  EXPECT_EQ(window_of(Nanos{0}, p), Nanos{0});
  EXPECT_EQ(window_of(Nanos{99}, p), Nanos{0});
  EXPECT_EQ(window_of(Nanos{100}, p), Nanos{100});
  EXPECT_EQ(window_of(Nanos{250}, p), Nanos{200});
  EXPECT_EQ(window_of(Nanos{-1}, p), Nanos{-100});
  EXPECT_EQ(window_of(Nanos{-100}, p), Nanos{-100});
  EXPECT_EQ(window_of(Nanos{-101}, p), Nanos{-200});
  EXPECT_EQ(window_of(Nanos{-250}, p), Nanos{-300});
}

TEST(EscrowCore, FirstLeaseOpensTheWindowNowFallsIn) {
  Ledger l;
  const LeaseReply r = lease(l, ask("a", 4), Nanos{250});
  EXPECT_EQ(r.status, LeaseStatus::kGranted);
  EXPECT_EQ(r.granted, 4u);
  EXPECT_EQ(r.window_start, Nanos{200});
  EXPECT_EQ(r.window_end, Nanos{300});
  EXPECT_EQ(r.coordinator_now, Nanos{250});
  EXPECT_EQ(r.remaining, 6u);
  EXPECT_EQ(r.spec, kSpec);
  EXPECT_EQ(l.window_start, 200);
  EXPECT_EQ(l.granted, 4u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{260}), 6u);
  ASSERT_EQ(l.regions.size(), 1u);
  EXPECT_EQ(l.regions[0].region, "a");
  EXPECT_EQ(l.regions[0].granted, 4u);
}

TEST(EscrowCore, AWindowRollStartsWithTheWholeBudgetAndForgetsTheGrants) {
  Ledger l;
  std::uint64_t total = 0;
  for (int i = 0; i < 20; ++i) total += lease(l, ask("a", 10), Nanos{210 + i}).granted;
  EXPECT_EQ(total, 10u);
  EXPECT_EQ(lease(l, ask("b", 1), Nanos{299}).status, LeaseStatus::kSpent);
  EXPECT_EQ(remaining(l, kSpec, Nanos{299}), 0u);
  // Before any lease of the next window the ledger still reads the next window's budget whole.
  EXPECT_EQ(remaining(l, kSpec, Nanos{300}), 10u);
  const LeaseReply r = lease(l, ask("b", 3), Nanos{300});
  EXPECT_EQ(r.status, LeaseStatus::kGranted);
  EXPECT_EQ(r.window_start, Nanos{300});
  EXPECT_EQ(r.granted, 3u);
  EXPECT_EQ(r.remaining, 7u);
  EXPECT_EQ(l.granted, 3u);
  EXPECT_EQ(l.returned, 0u);
  for (const RegionLedger& g : l.regions) EXPECT_EQ(g.granted, g.region == "b" ? 3u : 0u);
  // A window skipped entirely is no different.
  EXPECT_EQ(lease(l, ask("a", 2), Nanos{720}).window_start, Nanos{700});
  EXPECT_EQ(l.granted, 2u);
}

TEST(EscrowCore, ACoordinatorClockThatStepsBackStaysInTheWindowItReached) {
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 2), Nanos{250}).granted, 2u);
  const LeaseReply r = lease(l, ask("a", 2), Nanos{150});  // the clock stepped back 100 ns
  EXPECT_EQ(r.window_start, Nanos{200});
  EXPECT_EQ(r.coordinator_now, Nanos{250});
  EXPECT_EQ(l.clock_high, 250);
  EXPECT_EQ(l.granted, 4u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{150}), 6u);
  // Stepping back across the next boundary does not reopen the window either.
  ASSERT_EQ(lease(l, ask("a", 1), Nanos{310}).window_start, Nanos{300});
  EXPECT_EQ(lease(l, ask("a", 1), Nanos{290}).window_start, Nanos{300});
  EXPECT_EQ(l.clock_high, 310);
  EXPECT_EQ(l.granted, 2u);
}

// ---- rule 2: the first lease fixes the spec ----

TEST(EscrowCore, TheFirstLeaseFixesTheSpecAndAMismatchIsRefused) {
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 3), Nanos{250}).granted, 3u);
  for (const BudgetSpec other : {BudgetSpec{20, Nanos{100}}, BudgetSpec{10, Nanos{50}}}) {
    const LeaseReply r = lease(l, ask("b", 3, other), Nanos{260});
    EXPECT_EQ(r.status, LeaseStatus::kSpecMismatch);
    EXPECT_EQ(r.granted, 0u);
    EXPECT_EQ(r.spec, kSpec);  // the winner
    EXPECT_EQ(r.window_start, Nanos{200});
    EXPECT_EQ(r.remaining, 7u);
  }
  EXPECT_EQ(l.granted, 3u);
  EXPECT_EQ(l.spec, kSpec);
  // Once the window ends the next first lease fixes its own spec.
  const BudgetSpec bigger{20, Nanos{100}};
  const LeaseReply r = lease(l, ask("b", 3, bigger), Nanos{300});
  EXPECT_EQ(r.status, LeaseStatus::kGranted);
  EXPECT_EQ(r.spec, bigger);
  EXPECT_EQ(r.remaining, 17u);
  EXPECT_EQ(lease(l, ask("a", 3), Nanos{310}).status, LeaseStatus::kSpecMismatch);
}

// ---- rule 3: a state loss ----

TEST(EscrowCore, TheOriginWindowCountsAsSpentUntilItEnds) {
  Ledger l;  // found empty at 250 after a loss: the origin window is [200, 300)
  const std::int64_t origin = window_of(Nanos{250}, kSpec.period).count();
  for (const Nanos now : {Nanos{250}, Nanos{299}}) {
    const LeaseReply r = lease(l, ask("a", 3), now, origin);
    EXPECT_EQ(r.status, LeaseStatus::kStateLost);
    EXPECT_EQ(r.granted, 0u);
    EXPECT_EQ(r.window_start, Nanos{200});
    EXPECT_EQ(r.remaining, 0u);
    EXPECT_EQ(remaining(l, kSpec, now, origin), 0u);
  }
  EXPECT_EQ(l.granted, 0u);
  // A reconcile of the origin window gives nothing back: nothing was granted since the loss.
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 5, Nanos{299}), 0u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{300}, origin), 10u);
  const LeaseReply r = lease(l, ask("a", 3), Nanos{300}, origin);
  EXPECT_EQ(r.status, LeaseStatus::kGranted);
  EXPECT_EQ(r.granted, 3u);
  EXPECT_EQ(r.window_start, Nanos{300});
  // A window before the origin (a clock behind the one that found the loss) is spent too.
  Ledger behind;
  EXPECT_EQ(lease(behind, ask("a", 3), Nanos{150}, origin).status, LeaseStatus::kStateLost);
}

// ---- rule 5: the window's end ----

TEST(EscrowCore, AWindowWithLessThanMinWindowLeftGrantsNothing) {
  Ledger l;
  const Nanos uncertainty{30};
  const LeaseReply late = lease(l, ask("a", 3, kSpec, uncertainty), Nanos{271});  // 29 left
  EXPECT_EQ(late.status, LeaseStatus::kWindowEnding);
  EXPECT_EQ(late.granted, 0u);
  EXPECT_EQ(late.remaining, 10u);
  EXPECT_EQ(l.granted, 0u);
  Ledger m;
  const LeaseReply in_time = lease(m, ask("a", 3, kSpec, uncertainty), Nanos{270});  // 30 left
  EXPECT_EQ(in_time.status, LeaseStatus::kGranted);
  EXPECT_EQ(in_time.granted, 3u);
}

// ---- rule 4: the taper ----

TEST(EscrowCore, ANearlySpentBudgetGoesOutInSmallerPieces) {
  const BudgetSpec big{1000, Nanos{100}};
  Ledger l;
  for (const char* region : {"a", "b", "c"})
    ASSERT_EQ(lease(l, ask(region, 1, big), Nanos{0}).granted, 1u);
  l.granted = 940;  // the three regions have drawn all but 60 between them
  // 3 regions (the asker among them): ceil(60 / 6) = 10, whatever the batch.
  LeaseReply r = lease(l, ask("c", 100, big), Nanos{1});
  EXPECT_EQ(r.granted, 10u);
  EXPECT_EQ(r.remaining, 50u);
  // A fourth region counts itself: ceil(50 / 8) = 7.
  r = lease(l, ask("d", 100, big), Nanos{2});
  EXPECT_EQ(r.granted, 7u);
  EXPECT_EQ(r.remaining, 43u);
  // A smaller batch than the taper is granted whole.
  EXPECT_EQ(lease(l, ask("a", 2, big), Nanos{3}).granted, 2u);
  // With a large budget the taper is the whole budget's half for a lone region.
  Ledger fresh;
  EXPECT_EQ(lease(fresh, ask("a", 800, big), Nanos{0}).granted, 500u);
  // The last unit still goes out (the taper is at least 1).
  Ledger last;
  ASSERT_EQ(lease(last, ask("a", 1, big), Nanos{0}).granted, 1u);
  last.granted = 999;
  EXPECT_EQ(lease(last, ask("b", 5, big), Nanos{1}).granted, 1u);
  EXPECT_EQ(lease(last, ask("b", 5, big), Nanos{2}).status, LeaseStatus::kSpent);
}

// A check larger than its region's escrow leases with a need: the taper never grants less than
// it, and a window with less than it left grants nothing (so no region holds part of a check it
// cannot make while the units could serve a check elsewhere).
TEST(EscrowCore, AGrantIsNeverBelowTheRequestsNeedAndLessThanItLeftGrantsNothing) {
  const BudgetSpec spec{100, Nanos{100}};
  Ledger l;
  const auto needing = [&](const char* region, std::uint64_t want, std::uint64_t need) {
    LeaseRequest r = ask(region, want, spec);
    r.need = need;
    return r;
  };
  // Three regions each checking 40 at once (the first lease of each).
  EXPECT_EQ(lease(l, needing("a", 40, 40), Nanos{0}).granted, 40u);  // taper 50
  LeaseReply b = lease(l, needing("b", 40, 40), Nanos{1});           // taper ceil(60 / 4) = 15
  EXPECT_EQ(b.status, LeaseStatus::kGranted);
  EXPECT_EQ(b.granted, 40u);
  EXPECT_EQ(b.remaining, 20u);
  const LeaseReply c = lease(l, needing("c", 40, 40), Nanos{2});
  EXPECT_EQ(c.status, LeaseStatus::kShort);
  EXPECT_EQ(c.granted, 0u);
  EXPECT_EQ(c.remaining, 20u);  // what is left, for the region to say
  EXPECT_EQ(l.granted, 80u);    // nothing held that no check can spend
  // A smaller check still gets what it needs; without a need, the taper as before.
  EXPECT_EQ(lease(l, needing("c", 16, 12), Nanos{3}).granted, 12u);  // taper ceil(20 / 6) = 4
  EXPECT_EQ(lease(l, needing("c", 16, 0), Nanos{4}).granted, 2u);    // taper ceil(8 / 6) = 2
  EXPECT_EQ(to_string(LeaseStatus::kShort), "short");
  LeaseRequest bad = needing("a", 4, 5);
  EXPECT_EQ(validate(bad), "need: must be at most want");
}

TEST(EscrowCore, GrantsNeverExceedWhatRemains) {
  Ledger l;
  std::uint64_t total = 0;
  std::uint64_t left = kSpec.limit;
  const char* regions[] = {"a", "b", "c"};
  for (int i = 0; i < 30; ++i) {
    const LeaseReply r = lease(l, ask(regions[i % 3], 1 + (i * 7) % 5), Nanos{200 + i});
    EXPECT_LE(r.granted, left);
    EXPECT_EQ(r.granted + r.remaining, left);
    EXPECT_EQ(r.status == LeaseStatus::kGranted, r.granted > 0);
    left -= r.granted;
    total += r.granted;
    if (i % 4 == 3 && r.granted > 0) {
      // Give one unit back now and then: the budget it frees is granted again, never more.
      const std::string region = regions[i % 3];
      std::uint64_t given = 0;
      for (const RegionLedger& g : l.regions)
        if (g.region == region) given = g.relinquished_window == 200 ? g.relinquished : 0;
      const std::uint64_t back = reconcile(l, region, Nanos{200}, given + 1, Nanos{200 + i});
      EXPECT_EQ(back, 1u);
      left += back;
      total -= back;
    }
    EXPECT_LE(total, kSpec.limit);
    EXPECT_EQ(remaining(l, kSpec, Nanos{200 + i}), left);
  }
  EXPECT_EQ(total, kSpec.limit);  // the budget went out whole
  EXPECT_EQ(l.granted - l.returned, kSpec.limit);
}

// ---- rule 6: reconcile ----

TEST(EscrowCore, ReconcileIsARunningTotalSoARepeatChangesNothing) {
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 5), Nanos{250}).granted, 5u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 3, Nanos{260}), 3u);
  EXPECT_EQ(l.returned, 3u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{260}), 8u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 3, Nanos{261}), 0u);  // the same message twice
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 2, Nanos{262}), 0u);  // an older one, late
  EXPECT_EQ(l.returned, 3u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 4, Nanos{263}), 1u);  // one more given up since
  EXPECT_EQ(l.returned, 4u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{263}), 9u);
  EXPECT_EQ(l.forfeited, 0u);
}

TEST(EscrowCore, ReconcileOfAnOlderWindowAfterANewerOneIsIgnored) {
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 4), Nanos{250}).granted, 4u);
  ASSERT_EQ(lease(l, ask("a", 4), Nanos{350}).granted, 4u);
  EXPECT_EQ(reconcile(l, "a", Nanos{300}, 2, Nanos{360}), 2u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 3, Nanos{370}), 0u);  // overtaken by the one above
  EXPECT_EQ(l.returned, 2u);
  EXPECT_EQ(l.forfeited, 0u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{370}), 8u);
  EXPECT_EQ(reconcile(l, "a", Nanos{300}, 2, Nanos{371}), 0u);
  // A window the ledger never reached gives nothing back.
  EXPECT_EQ(reconcile(l, "a", Nanos{400}, 4, Nanos{380}), 0u);
  EXPECT_EQ(l.returned, 2u);
}

TEST(EscrowCore, ACurrentWindowReturnIsCappedByWhatTheRegionWasGranted) {
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 3), Nanos{250}).granted, 3u);
  ASSERT_EQ(lease(l, ask("b", 2), Nanos{251}).granted, 2u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 10, Nanos{260}), 3u);
  EXPECT_EQ(l.returned, 3u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 12, Nanos{261}), 0u);  // nothing held any more
  EXPECT_EQ(reconcile(l, "c", Nanos{200}, 2, Nanos{262}), 0u);   // never granted
  EXPECT_EQ(l.returned, 3u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{262}), 8u);
  // The cap counts what the region gave back before: b gives up 1 of 2, is granted 2 more and
  // then claims 9 in all: 3 more come back, b's grants less what it returned already.
  EXPECT_EQ(reconcile(l, "b", Nanos{200}, 1, Nanos{263}), 1u);
  ASSERT_EQ(lease(l, ask("b", 2), Nanos{264}).granted, 2u);
  EXPECT_EQ(reconcile(l, "b", Nanos{200}, 9, Nanos{265}), 3u);
  EXPECT_EQ(l.granted, 7u);
  EXPECT_EQ(l.returned, 7u);
}

TEST(EscrowCore, AnEndedWindowsUnitsAreForfeitedNeverCarriedIntoTheNext) {
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 5), Nanos{250}).granted, 5u);
  // Ended, the ledger not yet rolled.
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 3, Nanos{300}), 0u);
  EXPECT_EQ(l.forfeited, 3u);
  EXPECT_EQ(l.returned, 0u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{300}), 10u);
  ASSERT_EQ(lease(l, ask("b", 4), Nanos{310}).granted, 4u);
  // Ended, the ledger in the next window: nothing of it lands in this window's budget.
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 5, Nanos{320}), 0u);
  EXPECT_EQ(l.forfeited, 5u);
  EXPECT_EQ(l.returned, 0u);
  EXPECT_EQ(remaining(l, kSpec, Nanos{320}), 6u);
  EXPECT_EQ(reconcile(l, "a", Nanos{200}, 5, Nanos{321}), 0u);  // and a repeat is not counted
  EXPECT_EQ(l.forfeited, 5u);
}

// ---- the region's side ----

LeaseReply grant(std::int64_t start, std::uint64_t granted, std::int64_t coordinator_now) {
  LeaseReply r;
  r.status = LeaseStatus::kGranted;
  r.granted = granted;
  r.window_start = Nanos{start};
  r.window_end = Nanos{start + kSpec.period.count()};
  r.coordinator_now = Nanos{coordinator_now};
  r.spec = kSpec;
  return r;
}

TEST(EscrowRegion, ExpiryIsTheSendTimePlusWhatWasLeftLessTheDriftAllowance) {
  LeaseReply r = grant(0, 1, 0);
  r.window_end = Nanos{1000};
  r.coordinator_now = Nanos{400};  // 600 left on the coordinator's clock
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 0), Nanos{650});
  EXPECT_EQ(escrow_expiry(r, Nanos{-5000}, 0), Nanos{-4400});    // the region's clock is its own
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 1000), Nanos{649});      // 600 x 1000 ppm = 0.6, rounded up
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 500'000), Nanos{350});   // 300
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 3'000'000), Nanos{50});  // never before the send time
  r.window_end = Nanos{1'000'001};
  r.coordinator_now = Nanos{0};
  EXPECT_EQ(escrow_expiry(r, Nanos{0}, 1), Nanos{999'999});  // 1.000001 rounded up to 2
  r.window_end = std::chrono::seconds(60);
  EXPECT_EQ(escrow_expiry(r, Nanos{7}, 100),
            Nanos{7 + 60'000'000'000 - 6'000'000});  // 100 ppm of a minute is 6 ms
  r.coordinator_now = r.window_end + Nanos{1};       // a reply decided after its window's end
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 1000), Nanos{50});
}

// A coordinator whose clock is its callers' (etcd) says how far it may be off: the escrow ends
// that much earlier, after the drift allowance, never before the send time.
TEST(EscrowRegion, ExpiryEndsTheCoordinatorsClockUncertaintyEarlier) {
  LeaseReply r = grant(0, 1, 0);
  r.window_end = Nanos{1000};
  r.coordinator_now = Nanos{400};  // 600 left
  r.clock_uncertainty = Nanos{200};
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 0), Nanos{450});
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 500'000), Nanos{150});  // 600 - 300 - 200
  r.clock_uncertainty = Nanos{600};
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 0), Nanos{50});  // nothing left to spend
  r.clock_uncertainty = Nanos{5000};
  EXPECT_EQ(escrow_expiry(r, Nanos{50}, 0), Nanos{50});  // never before the send time
}

TEST(EscrowRegion, AGrantOfANewerWindowReplacesTheEscrowAndReportsTheLostUnits) {
  Escrow e;
  EXPECT_EQ(add_grant(e, grant(200, 5, 210), Nanos{280}), 0u);
  ASSERT_TRUE(spend(e, 2, Nanos{250}));
  EXPECT_EQ(add_grant(e, grant(300, 4, 310), Nanos{390}), 3u);
  EXPECT_EQ(e.window_start, 300);
  EXPECT_EQ(e.expires_at, Nanos{390});
  EXPECT_EQ(e.units, 4u);
  EXPECT_EQ(e.granted, 4u);
  EXPECT_EQ(e.spent, 0u);
  EXPECT_EQ(e.relinquished, 0u);
}

TEST(EscrowRegion, AGrantOfTheSameWindowAddsAndKeepsTheLaterExpiry) {
  Escrow e;
  ASSERT_EQ(add_grant(e, grant(200, 2, 210), Nanos{280}), 0u);
  EXPECT_EQ(add_grant(e, grant(200, 3, 220), Nanos{270}), 0u);
  EXPECT_EQ(e.expires_at, Nanos{280});
  EXPECT_EQ(add_grant(e, grant(200, 1, 230), Nanos{290}), 0u);
  EXPECT_EQ(e.expires_at, Nanos{290});
  EXPECT_EQ(e.units, 6u);
  EXPECT_EQ(e.granted, 6u);
  EXPECT_EQ(e.window_start, 200);
}

TEST(EscrowRegion, AStaleReplyOrANullGrantLeavesTheEscrowAlone) {
  Escrow e;
  ASSERT_EQ(add_grant(e, grant(300, 2, 310), Nanos{380}), 0u);
  const Escrow before = e;
  EXPECT_EQ(add_grant(e, grant(200, 4, 290), Nanos{295}), 4u);  // lost: its window is over here
  EXPECT_EQ(e, before);
  LeaseReply none = grant(400, 0, 410);
  none.status = LeaseStatus::kSpent;
  EXPECT_EQ(add_grant(e, none, Nanos{480}), 0u);
  EXPECT_EQ(e, before);
}

TEST(EscrowRegion, SpendIsAllOrNothingAndOnlyBeforeExpiry) {
  Escrow e;
  ASSERT_EQ(add_grant(e, grant(0, 5, 0), Nanos{100}), 0u);
  EXPECT_EQ(usable(e, Nanos{99}), 5u);
  EXPECT_EQ(usable(e, Nanos{100}), 0u);
  EXPECT_TRUE(spend(e, 3, Nanos{50}));
  EXPECT_EQ(e.units, 2u);
  EXPECT_EQ(e.spent, 3u);
  EXPECT_FALSE(spend(e, 3, Nanos{51}));
  EXPECT_EQ(e.units, 2u);
  EXPECT_FALSE(spend(e, 1, Nanos{100}));  // expired
  EXPECT_EQ(e.units, 2u);
  unspend(e, 2, Nanos{60});
  EXPECT_EQ(e.units, 4u);
  EXPECT_EQ(e.spent, 1u);
  unspend(e, 5, Nanos{61});  // never more than was spent
  EXPECT_EQ(e.units, 5u);
  EXPECT_EQ(e.spent, 0u);
  ASSERT_TRUE(spend(e, 1, Nanos{62}));
  unspend(e, 1, Nanos{100});  // too late: the unit is not usable any more
  EXPECT_EQ(e.units, 4u);
  EXPECT_EQ(e.spent, 1u);
}

TEST(EscrowRegion, RelinquishReturnsTheWindowsRunningTotal) {
  Escrow e;
  ASSERT_EQ(add_grant(e, grant(0, 5, 0), Nanos{60}), 0u);
  ASSERT_TRUE(spend(e, 2, Nanos{10}));
  EXPECT_EQ(relinquish(e), 3u);
  EXPECT_EQ(e.units, 0u);
  EXPECT_EQ(usable(e, Nanos{10}), 0u);
  EXPECT_EQ(relinquish(e), 3u);  // nothing more given up: the same total, a repeat
  ASSERT_EQ(add_grant(e, grant(0, 4, 70), Nanos{90}), 0u);
  ASSERT_TRUE(spend(e, 1, Nanos{80}));
  EXPECT_EQ(relinquish(e), 6u);
  EXPECT_EQ(e.granted, 9u);
  EXPECT_EQ(e.spent, 3u);
  // The coordinator side agrees: both totals for the window give back 6 of the 9.
  const BudgetSpec big{100, Nanos{100}};
  Ledger l;
  ASSERT_EQ(lease(l, ask("a", 5, big), Nanos{0}).granted, 5u);
  ASSERT_EQ(lease(l, ask("a", 4, big), Nanos{70}).granted, 4u);
  EXPECT_EQ(reconcile(l, "a", Nanos{0}, 3, Nanos{75}), 3u);
  EXPECT_EQ(reconcile(l, "a", Nanos{0}, 6, Nanos{95}), 3u);
  EXPECT_EQ(reconcile(l, "a", Nanos{0}, 3, Nanos{96}), 0u);
  EXPECT_EQ(l.granted - l.returned, 3u);
}

// ---- requests ----

TEST(EscrowCore, ValidateNamesTheField) {
  EXPECT_EQ(validate(ask("a", 1)), "");
  auto starts = [](const std::string& message, const std::string& field) {
    return message.rfind(field + ":", 0) == 0;
  };
  EXPECT_TRUE(starts(validate(ask("", 1)), "region"));
  EXPECT_TRUE(starts(validate(ask("a", 1, BudgetSpec{0, Nanos{100}})), "limit"));
  EXPECT_TRUE(starts(validate(ask("a", 1, BudgetSpec{10, Nanos{0}})), "period"));
  EXPECT_TRUE(starts(validate(ask("a", 1, BudgetSpec{10, Nanos{-1}})), "period"));
  EXPECT_TRUE(starts(validate(ask("a", 1, BudgetSpec{10, kMaxRatePeriod + Nanos{1}})), "period"));
  EXPECT_EQ(validate(ask("a", 1, BudgetSpec{10, kMaxRatePeriod})), "");
  EXPECT_TRUE(starts(validate(ask("a", 0)), "want"));
  EXPECT_TRUE(starts(validate(ask("a", 1, kSpec, Nanos{-1})), "min_window_left"));
}

TEST(EscrowCore, StatusNames) {
  EXPECT_EQ(to_string(LeaseStatus::kGranted), "granted");
  EXPECT_EQ(to_string(LeaseStatus::kSpent), "spent");
  EXPECT_EQ(to_string(LeaseStatus::kWindowEnding), "window_ending");
  EXPECT_EQ(to_string(LeaseStatus::kStateLost), "state_lost");
  EXPECT_EQ(to_string(LeaseStatus::kSpecMismatch), "spec_mismatch");
}

TEST(DriftGauge, BoundsTheRateOfTheCoordinatorsClockFromReplies) {
  using std::chrono::milliseconds;
  DriftGauge g;
  // The coordinator's clock runs 1% fast; each reply takes 2 ms, read half way.
  const auto reply = [&](std::int64_t local_ms) {
    const Nanos sent = milliseconds(local_ms);
    g.sample(sent, sent + milliseconds(2), Nanos{(sent + milliseconds(1)).count() * 101 / 100});
  };
  reply(0);
  reply(500);
  EXPECT_FALSE(g.measured());  // under a second apart
  EXPECT_EQ(drift_in_force(g, 1000), 1000u);
  reply(5'000);
  ASSERT_TRUE(g.measured());
  EXPECT_LE(g.low_ppm(), 10'000);
  EXPECT_GE(g.high_ppm(), 10'000);
  EXPECT_LT(g.high_ppm() - g.low_ppm(), 1'000);  // 4 ms of round trips over 5 s: 800 ppm
  EXPECT_EQ(drift_in_force(g, 1000), static_cast<std::uint32_t>(g.high_ppm()));
  EXPECT_EQ(drift_in_force(g, 20'000), 20'000u);  // within the allowance: as configured
  // The anchor moves on (every 10 s): a clock that slows back to the region's rate shows.
  Nanos coordinator = Nanos{milliseconds(5'001).count() * 101 / 100};
  for (std::int64_t t = 6'000; t <= 60'000; t += 1'000) {
    coordinator += milliseconds(1'000);
    g.sample(milliseconds(t), milliseconds(t) + milliseconds(2), coordinator);
  }
  EXPECT_LE(g.low_ppm(), 0);
  EXPECT_GE(g.high_ppm(), 0);
  EXPECT_EQ(drift_in_force(g, 1000), 1000u);
}

}  // namespace
}  // namespace sluice
