// FederatedLimiter on explicit time against the in-memory RateCoordinator: checks served from
// escrow (one lease per batch), concurrent checks of a cold key sharing one lease, the global
// budget shared by regions (never over the limit in a window), window roll and forfeit,
// fail-closed outages, a coordinator that lost its state, a spec mismatch, clock skew between
// regions, and the reasons and retry times a refusal carries.
#include "sluice/federation/federation.h"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sluice/backends/memory_rate_coordinator.h"
#include "support/federation_fixtures.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing_support::check_now;
using testing_support::inline_io;
using testing_support::opts;
using testing_support::QueuedIo;
using testing_support::Switchable;

TEST(FederationOptions, ValidateNamesTheField) {
  FederationOptions o = opts("eu");
  EXPECT_EQ(o.validate(), "");
  o.region.clear();
  EXPECT_EQ(o.validate(), "region: must not be empty");
  o = opts("eu");
  o.batch = 0;
  EXPECT_EQ(o.validate(), "batch: must be at least 1");
  o = opts("eu");
  o.budget.limit = 0;
  EXPECT_EQ(o.validate(), "limit: must be at least 1");
  o = opts("eu");
  o.drift_ppm = 1'000'000;
  EXPECT_EQ(o.validate(), "drift_ppm: must be below 1000000");
}

// A busy key's refill asks for what it is expected to spend before its window ends at its rate
// so far: at most double what it was granted so far, and 16 batches; at least a batch.
TEST(Federation, ABusyKeysRefillsGrowWithItsRateAndAQuietKeysDoNot) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  Switchable sw(coord);
  FederationOptions o = opts("eu", 1'000'000);
  o.refill_below = 1;  // refill only when empty, so every lease is counted exactly
  FederatedLimiter f(sw, clock, o, inline_io());
  // 1,000 checks a second in a window of 10 s: the first check leases a batch (16); each refill
  // doubles what the key holds, 16 -> 32 -> 64 -> 128 -> 256 units in 5 leases (the check that
  // spends the last unit starts the next).
  for (int i = 0; i < 160; ++i) {
    clock.advance(milliseconds(1));
    ASSERT_TRUE(check_now(f, "busy", clock.now()).rate.allowed) << i;
  }
  EXPECT_EQ(sw.calls, 5);
  EXPECT_EQ(f.stats().spent, 160u);
  EXPECT_EQ(coord.ledger("busy")->granted, 256u);
  // Then 16 batches (256) a refill: 1,000 checks take 8 leases (7 if refills kept doubling, 11
  // at 8 batches).
  for (int i = 160; i < 1000; ++i) {
    clock.advance(milliseconds(1));
    ASSERT_TRUE(check_now(f, "busy", clock.now()).rate.allowed);
  }
  EXPECT_EQ(coord.ledger("busy")->granted, 1024u);
  EXPECT_EQ(sw.calls, 8);
  // Two checks a second in the next window: it would spend a batch at most before the window
  // ends, so its refills stay a batch.
  clock.set(seconds(110));
  for (int i = 0; i < 18; ++i) {
    clock.advance(milliseconds(500));
    ASSERT_TRUE(check_now(f, "quiet", clock.now()).rate.allowed) << i;
  }
  EXPECT_EQ(coord.ledger("quiet")->granted, 32u);
}

// A busy key whose checks outrun its leases (they park behind the one in flight) gets a
// rate-sized lease next, as its background refill would be, not just what is parked.
TEST(Federation, ABusyKeysLeaseAfterParkedChecksIsRateSized) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  Switchable sw(coord);
  QueuedIo io;
  FederationOptions o = opts("eu", 1'000'000);
  o.refill_below = 1;
  FederatedLimiter f(sw, clock, o, io.executor());
  int allowed = 0;
  const auto check = [&] {
    clock.advance(milliseconds(1));
    f.check("hot", 1, clock.now(), [&](FederatedDecision d) { allowed += d.rate.allowed; });
  };
  check();
  io.run_all();                          // 16 granted, 1 spent
  for (int i = 0; i < 15; ++i) check();  // the 16th spend starts a refill (16: doubling)
  for (int i = 0; i < 20; ++i) check();  // 20 checks park behind it
  ASSERT_EQ(io.calls.size(), 1u);
  // The refill (16 more, 16 of the 20 served), then the lease for the 4 still parked, sent by
  // the same drainer once the refill's reply is in.
  io.run_all();
  // That lease asked for the rate-sized refill (double the 32 held so far), not for the 4 parked.
  EXPECT_EQ(sw.wants, (std::vector<std::uint64_t>{16, 16, 32}));
  EXPECT_EQ(coord.ledger("hot")->granted, 64u);
  EXPECT_EQ(allowed, 36);
}

TEST(Federation, ABusyKeyRefillsBeforeItRunsDry) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  QueuedIo io;
  FederatedLimiter f(coord, clock, opts("eu", 1000), io.executor());
  f.check("k", 1, clock.now(), [](FederatedDecision) {});
  ASSERT_EQ(io.run_all(), 1u);  // the first lease: 16 units, 15 left after the first check
  int answered_at_once = 0;
  for (int i = 0; i < 12; ++i)
    f.check("k", 1, clock.now(), [&](FederatedDecision d) { answered_at_once += d.rate.allowed; });
  EXPECT_EQ(answered_at_once, 12);
  // Below refill_below (batch / 4 = 4) a lease was started in the background.
  EXPECT_EQ(io.calls.size(), 1u);
  io.run_all();
  EXPECT_EQ(coord.ledger("k")->granted, 32u);
}

TEST(Federation, ConcurrentChecksOfAColdKeyShareOneLease) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  QueuedIo io;
  FederatedLimiter f(coord, clock, opts("eu", 1000), io.executor());
  int allowed = 0, answered = 0;
  for (int i = 0; i < 10; ++i) {
    f.check("cold", 1, clock.now(), [&](FederatedDecision d) {
      ++answered;
      allowed += d.rate.allowed;
    });
  }
  EXPECT_EQ(answered, 0);          // all wait for the one lease
  EXPECT_EQ(io.calls.size(), 1u);  // no stampede
  io.run_all();
  EXPECT_EQ(answered, 10);
  EXPECT_EQ(allowed, 10);
  EXPECT_EQ(f.stats().leases, 1u);
}

// Checks that queue while a lease is in flight are served by the next lease, which asks for
// all of them: a region admits more than one batch per round trip when its checks come faster.
TEST(Federation, TheNextLeaseAsksForEveryQueuedCheck) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  QueuedIo io;
  FederatedLimiter f(coord, clock, opts("eu", 1000), io.executor());
  int allowed = 0;
  for (int i = 0; i < 40; ++i)
    f.check("hot", 1, clock.now(), [&](FederatedDecision d) { allowed += d.rate.allowed; });
  ASSERT_EQ(io.calls.size(), 1u);
  io.run_all();  // 16 granted for the first 16; one more lease for the other 24
  EXPECT_EQ(allowed, 40);
  EXPECT_EQ(f.stats().leases, 2u);
  EXPECT_EQ(f.stats().granted, 40u);
}

// A CheckMany issues its checks before it waits for any: cold keys lease at once, so the batch
// waits for the slowest lease, not for their sum.
TEST(Federation, ColdKeysLeaseConcurrently) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  Switchable sw(coord);
  QueuedIo io;
  FederatedLimiter f(sw, clock, opts("eu", 1000), io.executor());
  int answered = 0;
  for (const char* key : {"a", "b", "c"})
    f.check(key, 1, clock.now(), [&](FederatedDecision d) { answered += d.rate.allowed; });
  // The three leases go together, in one lease_many() call (one round trip on Redis), not one
  // after another's reply.
  EXPECT_EQ(io.calls.size(), 1u);
  io.run_all();
  EXPECT_EQ(answered, 3);
  EXPECT_EQ(sw.batches, 1);
  EXPECT_EQ(sw.calls, 3);
  // A lease queued while a batch is out goes in the next one, by the same drainer.
  for (const char* key : {"d", "e"})
    f.check(key, 1, clock.now(), [&](FederatedDecision d) { answered += d.rate.allowed; });
  io.run_all();
  EXPECT_EQ(answered, 5);
  EXPECT_EQ(sw.batches, 2);
}

// Leases queued while a batch is out start a second drainer, so the next batch can go while the
// first's replies are handled; never a third, and never a second while one has yet to start.
TEST(Federation, LeasesQueuedWhileABatchIsOutStartOneMoreDrainer) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  Switchable net(coord);
  QueuedIo io;
  FederatedLimiter f(net, clock, opts("eu", 1000), io.executor());
  int answered = 0;
  const auto answer = [&](FederatedDecision d) { answered += d.rate.allowed; };
  std::size_t posted_while_out = 0;
  net.during = [&] {
    f.check("c", 1, clock.now(), answer);
    f.check("d", 1, clock.now(), answer);
    posted_while_out = io.calls.size();
    // The first drainer is out, the second has yet to take a batch: no third.
    net.during = [&] { f.check("e", 1, clock.now(), answer); };
  };
  f.check("a", 1, clock.now(), answer);
  f.check("b", 1, clock.now(), answer);
  ASSERT_EQ(io.calls.size(), 1u);  // one drainer for a and b
  io.run_all();
  EXPECT_EQ(posted_while_out, 1u);  // c and d: a second drainer, d none of its own
  EXPECT_EQ(answered, 5);
  EXPECT_EQ(f.stats().leases, 5u);
}

TEST(Federation, RegionsShareOneBudgetAndNeverExceedItInAWindow) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter eu(coord, clock, opts("eu", 50), inline_io());
  FederatedLimiter us(coord, clock, opts("us", 50), inline_io());
  FederatedLimiter ap(coord, clock, opts("ap", 50), inline_io());
  std::uint64_t admitted = 0;
  FederatedDecision last;
  for (int i = 0; i < 100; ++i) {
    for (FederatedLimiter* f : {&eu, &us, &ap}) {
      last = check_now(*f, "api-key", clock.now());
      admitted += last.rate.allowed;
    }
  }
  EXPECT_EQ(admitted, 50u);  // the whole budget, and not one more
  EXPECT_FALSE(last.rate.allowed);
  EXPECT_EQ(last.reason, FederatedReason::kBudgetSpent);
  // Window [100 s, 110 s): retry when it ends here.
  EXPECT_EQ(last.rate.retry_after, seconds(10));
}

TEST(Federation, AHotRegionCanDrawTheWholeBudget) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter hot(coord, clock, opts("eu", 300), inline_io());
  FederatedLimiter cold(coord, clock, opts("us", 300), inline_io());
  ASSERT_TRUE(check_now(cold, "k", clock.now()).rate.allowed);  // holds one batch
  std::uint64_t admitted = 0;
  for (int i = 0; i < 400; ++i) admitted += check_now(hot, "k", clock.now()).rate.allowed;
  // All but what the cold region holds (one batch, 15 of it unspent).
  EXPECT_EQ(admitted, 300u - 16u);
}

TEST(Federation, EscrowExpiresAtTheWindowEndAndIsReconciled) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter f(coord, clock, opts("eu", 100), inline_io());
  ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);  // 16 leased, 15 unspent
  clock.set(seconds(110));                                   // the next window
  EXPECT_EQ(f.sweep(clock.now()), 0u);  // forfeited; kept a window longer (its demand)
  EXPECT_EQ(f.stats().forfeited, 15u);
  EXPECT_EQ(coord.ledger("k")->forfeited, 15u);  // reconciled, counted, not carried
  EXPECT_EQ(f.sweep(seconds(120)), 1u);          // then forgotten
  // The new window starts with the whole budget.
  std::uint64_t admitted = 0;
  for (int i = 0; i < 200; ++i) admitted += check_now(f, "k", clock.now()).rate.allowed;
  EXPECT_EQ(admitted, 100u);
}

// The coordinator's clock ran ahead of this region's past what drift_ppm allows: a lease for a
// check the escrow cannot cover comes back for the next window while the last window's escrow
// still looks live here. What is left of it is given up and reconciled first.
TEST(Federation, AGrantOfALaterWindowReconcilesWhatItReplaces) {
  ManualClock region(seconds(100));
  ManualClock coordinator_clock(seconds(100));
  MemoryRateCoordinator coord(coordinator_clock);
  FederatedLimiter f(coord, region, opts("eu", 100), inline_io());
  ASSERT_TRUE(check_now(f, "k", region.now()).rate.allowed);  // 16 leased, 15 unspent
  coordinator_clock.advance(seconds(10));                     // the coordinator is in [110, 120)
  ASSERT_TRUE(check_now(f, "k", region.now(), 20).rate.allowed);
  EXPECT_EQ(f.stats().forfeited, 15u);
  EXPECT_EQ(coord.ledger("k")->forfeited, 15u);
  EXPECT_EQ(coord.ledger("k")->window_start, Nanos(seconds(110)).count());
}

// A key that spent less than a batch in a window leases only that much at the start of the
// next: a batch leased and left unspent in every quiet region would be out of the busy
// regions' reach until the window ends. When it needs more, it leases a batch again.
TEST(Federation, AQuietKeyLeasesWhatItSpentInTheWindowBefore) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter f(coord, clock, opts("eu", 1000), inline_io());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  EXPECT_EQ(coord.ledger("k")->granted, 16u);  // a key not seen before: a batch
  clock.set(seconds(110));
  f.sweep(clock.now());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  EXPECT_EQ(coord.ledger("k")->granted, 3u);                 // its demand, not a batch
  EXPECT_EQ(f.stats().leases, 2u);                           // and no refill started for it
  ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);  // more than last time: a batch
  EXPECT_EQ(coord.ledger("k")->granted, 19u);
  // A key idle for longer than a window starts again from a batch.
  clock.set(seconds(140));
  f.sweep(clock.now());
  ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  EXPECT_EQ(coord.ledger("k")->granted, 16u);
}

TEST(Federation, FailClosedServesHeldEscrowThenRefusesWhileTheCoordinatorIsDown) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  Switchable sw(coord);
  FederationOptions o = opts("eu", 1000);
  o.refill_below = 1;
  FederatedLimiter f(sw, clock, o, inline_io());
  ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  sw.down = true;
  for (int i = 0; i < 15; ++i) EXPECT_TRUE(check_now(f, "k", clock.now()).rate.allowed) << i;
  const FederatedDecision d = check_now(f, "k", clock.now());
  EXPECT_FALSE(d.rate.allowed);
  EXPECT_EQ(d.reason, FederatedReason::kCoordinatorUnreachable);
  EXPECT_EQ(d.rate.retry_after, seconds(1));  // retry_backoff
  // Within the backoff no call is made.
  const int calls = sw.calls;
  EXPECT_FALSE(check_now(f, "k", clock.now()).rate.allowed);
  EXPECT_EQ(sw.calls, calls);
  // After it, the coordinator is tried again (clock-driven): back, and serving.
  sw.down = false;
  clock.advance(seconds(1));
  EXPECT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  EXPECT_EQ(f.stats().lease_failures, 1u);
}

TEST(Federation, ACoordinatorThatLostItsStateCountsTheWindowAsSpent) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederationOptions o = opts("eu", 1000);
  o.refill_below = 1;
  FederatedLimiter f(coord, clock, o, inline_io());
  ASSERT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  coord.lose_state(seconds(10));  // a restart without durable state, mid-window
  for (int i = 0; i < 15; ++i) EXPECT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  const FederatedDecision d = check_now(f, "k", clock.now());
  EXPECT_FALSE(d.rate.allowed);
  EXPECT_EQ(d.reason, FederatedReason::kCoordinatorRestarted);
  EXPECT_EQ(d.rate.retry_after, seconds(10));
  clock.set(seconds(110));
  EXPECT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
}

// Three regions each checking 40 at once on a limit of 100: two checks fit, and the third is
// told the budget is short of it (not spent: 20 are left, and a smaller check still passes).
// Before leases carried a need, the taper granted the second region 15 of its 40, it leased
// again for the rest, and regions held parts of checks none could make.
TEST(Federation, ChecksOfManyUnitsGetWhatTheyNeedOrAreToldTheBudgetIsShort) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  std::vector<std::unique_ptr<FederatedLimiter>> regions;
  for (const char* r : {"eu", "us", "ap"})
    regions.push_back(std::make_unique<FederatedLimiter>(coord, clock, opts(r, 100), inline_io()));
  std::vector<FederatedDecision> d;
  for (auto& f : regions) d.push_back(check_now(*f, "k", clock.now(), 40));
  EXPECT_TRUE(d[0].rate.allowed);
  EXPECT_TRUE(d[1].rate.allowed);
  ASSERT_FALSE(d[2].rate.allowed);
  EXPECT_EQ(d[2].reason, FederatedReason::kBudgetShort);
  EXPECT_EQ(to_string(d[2].reason), "budget_short");
  EXPECT_EQ(d[2].rate.remaining, 20u);
  EXPECT_GT(d[2].rate.retry_after, Nanos{0});
  EXPECT_EQ(coord.ledger("k")->granted, 80u);  // nothing granted that no check spent
  // Told once: the same check again is refused here, without a lease.
  const std::uint64_t leases = regions[2]->stats().leases;
  EXPECT_EQ(check_now(*regions[2], "k", clock.now(), 40).reason, FederatedReason::kBudgetShort);
  EXPECT_EQ(regions[2]->stats().leases, leases);
  // A check that fits what is left passes; then the budget is spent.
  EXPECT_TRUE(check_now(*regions[2], "k", clock.now(), 20).rate.allowed);
  const FederatedDecision spent = check_now(*regions[0], "k", clock.now(), 1);
  EXPECT_FALSE(spent.rate.allowed);
  EXPECT_EQ(spent.reason, FederatedReason::kBudgetSpent);
  for (auto& f : regions) EXPECT_EQ(f->stats().spent, f == regions[2] ? 20u : 40u);
}

TEST(Federation, ARegionWithAnotherLimitIsRefusedForTheWindowAndToldOncePerWindow) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter a(coord, clock, opts("eu", 100), inline_io());
  FederationOptions ob = opts("us", 200);
  std::vector<std::pair<std::string, BudgetSpec>> told;
  ob.on_spec_mismatch = [&](std::string_view key, const BudgetSpec& in_force) {
    told.emplace_back(std::string(key), in_force);
  };
  ob.retry_backoff = milliseconds(100);
  FederatedLimiter b(coord, clock, ob, inline_io());
  EXPECT_EQ(b.spec_in_force("k"), std::nullopt);
  ASSERT_TRUE(check_now(a, "k", clock.now()).rate.allowed);
  const FederatedDecision d = check_now(b, "k", clock.now());
  EXPECT_FALSE(d.rate.allowed);
  EXPECT_EQ(d.reason, FederatedReason::kSpecMismatch);
  EXPECT_EQ(coord.ledger("k")->granted, 16u);
  EXPECT_EQ(b.stats().spec_mismatches, 1u);  // counted, for the operator's alert
  // The spec that won is named, and told once for the key and window.
  const BudgetSpec eu{100, seconds(10)};
  EXPECT_EQ(b.spec_in_force("k"), eu);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].first, "k");
  EXPECT_EQ(told[0].second, eu);
  // Leased again within the window (after the backoff): refused, counted, not told again.
  clock.advance(milliseconds(150));
  EXPECT_FALSE(check_now(b, "k", clock.now()).rate.allowed);
  EXPECT_EQ(b.stats().spec_mismatches, 2u);
  EXPECT_EQ(told.size(), 1u);
  // The next window, fixed by `a` again: told again.
  clock.advance(seconds(10));
  ASSERT_TRUE(check_now(a, "k", clock.now()).rate.allowed);
  EXPECT_FALSE(check_now(b, "k", clock.now()).rate.allowed);
  EXPECT_EQ(told.size(), 2u);
  // A window `b` leases first under its own spec: served, nothing held against it.
  clock.advance(seconds(10));
  EXPECT_TRUE(check_now(b, "k", clock.now()).rate.allowed);
  EXPECT_EQ(b.spec_in_force("k"), std::nullopt);
  EXPECT_EQ(told.size(), 2u);
}

// A region whose clock runs 2% slow (outside drift_ppm's 0.1%): it would think a window ends
// up to 2% of its length later than it does, and spend escrow of a window the others have
// already moved on from. The lease replies carry the coordinator's clock: the region measures
// the drift and shortens its escrow by it.
TEST(Federation, ARegionWhoseClockRunsSlowMeasuresItAndShortensItsEscrow) {
  ManualClock coordinator_clock(seconds(100));  // the window is [100 s, 110 s)
  ManualClock slow(seconds(7));                 // the region's: 0.98 s per coordinator second
  const auto advance = [&](Nanos d) {
    coordinator_clock.advance(d);
    slow.advance(d * 98 / 100);
  };
  MemoryRateCoordinator coord(coordinator_clock);
  FederationOptions oa = opts("slow", 100);  // 100 per 10 s
  oa.drift_ppm = 1000;
  std::vector<std::uint32_t> told;
  oa.on_drift = [&](std::uint32_t ppm) { told.push_back(ppm); };
  FederatedLimiter a(coord, slow, oa, inline_io());
  FederatedLimiter b(coord, coordinator_clock, opts("steady", 100), inline_io());
  advance(milliseconds(500));
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(check_now(a, "k", slow.now()).rate.allowed);
  EXPECT_EQ(a.stats().drift_ppm_in_force, 1000u);  // one reading: nothing measured yet
  advance(milliseconds(4500));  // 105 s: a leases again, and holds what it does not spend
  const std::uint64_t leases = a.stats().leases;
  for (int i = 0; i < 64 && a.stats().leases == leases; ++i)
    ASSERT_TRUE(check_now(a, "k", slow.now()).rate.allowed);
  ASSERT_GT(a.stats().leases, leases);
  const FederationStats st = a.stats();
  EXPECT_GE(st.clock_drift_ppm, 20'000);  // 1 / 0.98 - 1 = 20,408 ppm
  EXPECT_LE(st.clock_drift_ppm, 20'500);
  EXPECT_EQ(st.drift_ppm_in_force, static_cast<std::uint32_t>(st.clock_drift_ppm));
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0], st.drift_ppm_in_force);
  // 110.05 s: the next window. The steady region takes its whole budget...
  advance(milliseconds(5050));
  int steady = 0;
  for (int i = 0; i < 120; ++i) steady += check_now(b, "k", coordinator_clock.now()).rate.allowed;
  EXPECT_EQ(steady, 100);
  // ...and the slow one, by its own clock still 0.1 s inside the window before (4.95 s of its
  // 5.05 s), must not spend what it holds of that window: its escrow expired at the window's
  // true end. (With drift_ppm alone it would admit here: 101 in this window.)
  const FederatedDecision late = check_now(a, "k", slow.now());
  EXPECT_FALSE(late.rate.allowed);
  EXPECT_EQ(late.reason, FederatedReason::kBudgetSpent);
  EXPECT_GT(a.stats().forfeited, 0u);  // what it held of the window before
}

TEST(Federation, MoreHitsThanTheLimitNeverFitAndZeroHitsSpendNothing) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter f(coord, clock, opts("eu", 10), inline_io());
  const FederatedDecision big = check_now(f, "k", clock.now(), 11);
  EXPECT_FALSE(big.rate.allowed);
  EXPECT_EQ(big.reason, FederatedReason::kNeverFits);
  EXPECT_EQ(big.rate.retry_after, Nanos::max());
  EXPECT_TRUE(check_now(f, "k", clock.now(), 0).rate.allowed);
  EXPECT_EQ(f.stats().leases, 0u);
  // A check larger than the batch leases what it needs (here the whole limit).
  EXPECT_TRUE(check_now(f, "k", clock.now(), 10).rate.allowed);
}

// The coordinator's clock runs 3 s ahead of one region's and 2 s behind another's: escrow is
// timed from each region's own send time, so each expires by its window's end, and a window
// never admits more than its limit.
TEST(Federation, SkewedRegionClocksStillAdmitAtMostTheLimitPerWindow) {
  ManualClock coord_clock(seconds(1000));
  ManualClock behind(seconds(997));
  ManualClock ahead(seconds(1002));
  MemoryRateCoordinator coord(coord_clock);
  FederationOptions o = opts("eu", 40);
  o.drift_ppm = 1000;
  FederatedLimiter a(coord, behind, o, inline_io());
  o.region = "us";
  FederatedLimiter b(coord, ahead, o, inline_io());
  std::vector<std::uint64_t> per_window(8, 0);
  for (int step = 0; step < 4000; ++step) {  // 40 s in 10 ms steps
    for (auto* c : {&coord_clock, &behind, &ahead}) c->advance(milliseconds(10));
    const auto w = static_cast<std::size_t>((coord_clock.now() - seconds(1000)) / seconds(10));
    for (int i = 0; i < 3; ++i) {
      per_window[w] += check_now(a, "k", behind.now()).rate.allowed;
      per_window[w] += check_now(b, "k", ahead.now()).rate.allowed;
    }
  }
  for (std::size_t w = 0; w < 4; ++w) {
    EXPECT_LE(per_window[w], 40u) << "window " << w;
    EXPECT_GE(per_window[w], 30u) << "window " << w;  // and the budget is used
  }
}

// A flood of new keys cannot grow the limiter (or its lease calls) without bound: past max_keys
// a new key is refused until idle ones are forgotten; keys already held are served as ever.
TEST(Federation, NewKeysPastMaxKeysAreRefusedUntilIdleOnesAreForgotten) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederationOptions o = opts("eu", 100);
  o.max_keys = 2;
  FederatedLimiter f(coord, clock, o, inline_io());
  ASSERT_TRUE(check_now(f, "a", clock.now()).rate.allowed);
  ASSERT_TRUE(check_now(f, "b", clock.now()).rate.allowed);
  const FederatedDecision full = check_now(f, "c", clock.now());
  EXPECT_FALSE(full.rate.allowed);
  EXPECT_TRUE(full.rate.key_capacity);
  EXPECT_EQ(full.reason, FederatedReason::kKeyCapacity);
  EXPECT_EQ(full.rate.retry_after, seconds(10));
  EXPECT_EQ(f.stats().keys, 2u);
  EXPECT_FALSE(coord.ledger("c").has_value());  // and no lease was made for it
  EXPECT_TRUE(check_now(f, "a", clock.now()).rate.allowed);
  EXPECT_TRUE(check_now(f, "c", clock.now(), 0).rate.allowed);  // 0 hits need no state
  clock.set(seconds(125));  // a and b's escrow expired more than a window ago
  EXPECT_EQ(f.sweep(clock.now()), 2u);
  EXPECT_TRUE(check_now(f, "c", clock.now()).rate.allowed);
}

TEST(Federation, RelinquishAllGivesUnspentEscrowBackToTheWindow) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter a(coord, clock, opts("eu", 32), inline_io());
  FederatedLimiter b(coord, clock, opts("us", 32), inline_io());
  ASSERT_TRUE(check_now(a, "k", clock.now()).rate.allowed);  // a holds 15 more
  a.relinquish_all(clock.now());
  EXPECT_EQ(coord.ledger("k")->returned, 15u);
  std::uint64_t admitted = 0;
  for (int i = 0; i < 40; ++i) admitted += check_now(b, "k", clock.now()).rate.allowed;
  EXPECT_EQ(admitted, 31u);
}

TEST(Federation, RefundGivesHitsBackWhileTheEscrowIsUsable) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter f(coord, clock, opts("eu", 16), inline_io());
  ASSERT_TRUE(check_now(f, "k", clock.now(), 16).rate.allowed);
  EXPECT_FALSE(check_now(f, "k", clock.now()).rate.allowed);
  f.refund("k", 4, clock.now());
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(check_now(f, "k", clock.now()).rate.allowed);
  EXPECT_FALSE(check_now(f, "k", clock.now()).rate.allowed);
}

// Three regions share 100 a window. A charge takes what its region's escrow lacks from the
// coordinator, up to all that is left, and what nothing covers is forgiven; the other regions
// spend only the escrow they hold, and the window refuses every check from then on; the next
// window admits again.
TEST(Federation, AChargeTakesTheBudgetOtherRegionsWouldHaveAdmitted) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter a(coord, clock, opts("a", 100), inline_io());
  FederatedLimiter b(coord, clock, opts("b", 100), inline_io());
  FederatedLimiter c(coord, clock, opts("c", 100), inline_io());
  for (FederatedLimiter* f : {&a, &b, &c})
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(check_now(*f, "k", clock.now()).rate.allowed);
  // a and b leased 16 each, c 12 (the taper, with three regions): they hold 6, 6 and 2, and the
  // coordinator has 56 left.
  ASSERT_EQ(coord.ledger("k")->granted, 44u);
  const RateCharge charged = a.charge("k", 60, clock.now());
  EXPECT_EQ(charged.pending, 54u) << "owed beyond a's 6 when it answered";
  EXPECT_EQ(coord.ledger("k")->granted, 98u) << "then leased in one call";
  EXPECT_EQ(a.stats().forgiven, 0u);
  EXPECT_EQ(a.stats().charged, 60u);
  (void)b.charge("k", 10, clock.now());
  EXPECT_EQ(coord.ledger("k")->granted, 100u);
  EXPECT_EQ(b.stats().forgiven, 2u) << "6 from escrow, the 2 left, 2 past the limit";
  std::uint64_t admitted = 0;
  for (FederatedLimiter* f : {&a, &b, &c})
    for (int i = 0; i < 10; ++i) admitted += check_now(*f, "k", clock.now()).rate.allowed;
  EXPECT_EQ(admitted, 2u) << "c's escrow, nothing more";
  const FederatedDecision refused = check_now(b, "k", clock.now());
  EXPECT_FALSE(refused.rate.allowed);
  EXPECT_EQ(refused.reason, FederatedReason::kBudgetSpent);
  clock.advance(seconds(10));
  EXPECT_TRUE(check_now(b, "k", clock.now()).rate.allowed) << "the next window admits again";
}

// Random checks and charges from three regions whose leases the network delivers late: the
// checks admitted in any window never exceed the limit, and every hit charged is either paid from
// the budget or counted as forgiven.
TEST(Federation, ChargesNeverLetChecksPastTheLimit) {
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    std::mt19937_64 rng(seed);
    ManualClock clock(seconds(100));
    MemoryRateCoordinator coord(clock);
    QueuedIo io;
    std::vector<std::unique_ptr<FederatedLimiter>> regions;
    for (const char* r : {"a", "b", "c"})
      regions.push_back(
          std::make_unique<FederatedLimiter>(coord, clock, opts(r, 50), io.executor()));
    std::map<std::int64_t, std::uint64_t> admitted;  // per window
    std::uint64_t charged = 0;
    for (int step = 0; step < 600; ++step) {
      clock.advance(milliseconds(rng() % 100));
      FederatedLimiter& f = *regions[rng() % 3];
      switch (rng() % 4) {
        case 0: {
          const std::uint64_t hits = 1 + rng() % 20;
          charged += hits;
          (void)f.charge("k", hits, clock.now());
          break;
        }
        case 1:
          if (!io.calls.empty()) io.calls.front()(), io.calls.pop_front();
          break;
        default: {
          const std::uint64_t hits = 1 + rng() % 3;
          // Stamped with the window it is decided in (a parked check's comes later).
          f.check("k", hits, clock.now(), [&admitted, &clock, hits](FederatedDecision d) {
            if (d.rate.allowed) admitted[clock.now().count() / seconds(10).count()] += hits;
          });
        }
      }
    }
    io.run_all();
    for (auto& f : regions) f->sweep(clock.now() + seconds(20));
    io.run_all();
    std::uint64_t checks = 0;
    for (const auto& [window, n] : admitted) {
      ASSERT_LE(n, 50u) << "seed " << seed;
      checks += n;
    }
    std::uint64_t spent = 0, forgiven = 0;
    for (auto& f : regions) {
      spent += f->stats().spent;
      forgiven += f->stats().forgiven;
    }
    EXPECT_EQ(spent + forgiven, checks + charged) << "seed " << seed;
    EXPECT_GT(forgiven, 0u) << "seed " << seed << ": no window was overdrawn";
  }
}

TEST(Federation, TryCheckDecidesFromEscrowOrStartsTheLeaseAndSaysSo) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  QueuedIo io;
  FederatedLimiter f(coord, clock, opts("eu", 100), io.executor());
  EXPECT_FALSE(f.try_check("k", 1, clock.now()).has_value());  // no escrow: needs a lease
  EXPECT_EQ(io.calls.size(), 1u);                              // which it started
  EXPECT_FALSE(f.try_check("k", 1, clock.now()).has_value());  // and does not start twice
  EXPECT_EQ(io.calls.size(), 1u);
  io.run_all();
  const auto d = f.try_check("k", 1, clock.now());
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->rate.allowed);
  EXPECT_EQ(f.stats().spent, 1u);
}

TEST(Federation, PeekSpendsNothingAndCallsNoOne) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  QueuedIo io;
  FederatedLimiter f(coord, clock, opts("eu", 100), io.executor());
  EXPECT_TRUE(f.peek("k", 5, clock.now()).rate.allowed);  // nothing known: the budget is whole
  EXPECT_TRUE(io.calls.empty());
  f.check("k", 1, clock.now(), [](FederatedDecision) {});
  io.run_all();
  const FederatedDecision p = f.peek("k", 15, clock.now());
  EXPECT_TRUE(p.rate.allowed);
  EXPECT_EQ(p.rate.remaining, 99u);  // 15 here + 84 at the coordinator
  EXPECT_EQ(f.stats().spent, 1u);
  EXPECT_FALSE(f.peek("k", 101, clock.now()).rate.allowed);
}

// A key whose escrow is all spent is kept until its window ends: a CheckMany's refund of what it
// spent may still come, and must find it.
TEST(Federation, ASweepKeepsAKeyWhoseSpentEscrowMayStillBeRefunded) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  FederatedLimiter f(coord, clock, opts("eu", 16), inline_io());
  ASSERT_TRUE(check_now(f, "k", clock.now(), 16).rate.allowed);
  EXPECT_EQ(f.sweep(clock.now()), 0u);
  f.refund("k", 16, clock.now());
  EXPECT_TRUE(check_now(f, "k", clock.now(), 16).rate.allowed);
}

TEST(Federation, CheckWaitAnswersFromAnotherThread) {
  ManualClock clock(seconds(100));
  MemoryRateCoordinator coord(clock);
  std::vector<std::thread> threads;
  IoExecutor io = [&](std::function<void()> f) { threads.emplace_back(std::move(f)); };
  {
    FederatedLimiter f(coord, clock, opts("eu", 100), io);
    EXPECT_TRUE(f.check_wait("k", 1).rate.allowed);
    for (auto& t : threads) t.join();
  }
}

}  // namespace
}  // namespace sluice
