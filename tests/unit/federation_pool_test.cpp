// FederatedLimiter with a regional pool (L2) shared by the processes of a region, on explicit
// time against the in-memory coordinator and pool: one regional batch leased at a time, escrow
// given back to the pool, the fall-through to the coordinator while the pool is down, both
// outage modes (regional-only serves the pool's balance at the outage's onset and no more, and
// probes the coordinator on the clock), and the bound per window under random interleavings.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/federation/federation.h"
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
using testing_support::SwitchablePool;

// One region of three processes sharing a pool, on one clock.
struct Region {
  ManualClock clock{seconds(100)};  // the window [100 s, 110 s)
  MemoryRateCoordinator coord{clock};
  Switchable sw{coord};
  MemoryRegionalEscrow mem{clock};
  SwitchablePool pool{mem};
  std::vector<std::unique_ptr<FederatedLimiter>> procs;

  explicit Region(FederationOptions o) {
    for (int i = 0; i < 3; ++i)
      procs.push_back(std::make_unique<FederatedLimiter>(sw, &pool, clock, o, inline_io()));
  }
  FederatedDecision check(int proc, std::string_view key = "k") {
    return check_now(*procs[proc], key, clock.now());
  }
};

FederationOptions pooled(std::uint64_t limit = 1000) {
  FederationOptions o = opts("eu", limit);
  o.regional_batch = 64;
  return o;
}

TEST(FederationPool, ProcessesOfARegionLeaseOneRegionalBatchAtATime) {
  Region r(pooled());
  ASSERT_TRUE(r.check(0).rate.allowed);
  EXPECT_EQ(r.sw.calls, 1);                      // the refiller's lease
  EXPECT_EQ(r.coord.ledger("k")->granted, 64u);  // a regional batch
  EXPECT_EQ(r.mem.pool("k")->balance, 48u);      // less the refiller's own batch
  ASSERT_TRUE(r.check(1).rate.allowed);
  ASSERT_TRUE(r.check(2).rate.allowed);
  EXPECT_EQ(r.sw.calls, 1);  // the others took from the pool
  EXPECT_EQ(r.mem.pool("k")->balance, 16u);
  EXPECT_EQ(r.procs[0]->stats().pool_refilled, 48u);
  EXPECT_EQ(r.procs[1]->stats().pool_taken, 16u);
  EXPECT_EQ(r.procs[1]->stats().leases, 1u);
}

TEST(FederationPool, AQuietRegionsRefillerLeasesWhatTheRegionAskedNotARegionalBatch) {
  Region r(pooled());
  // [100 s, 110 s): a pool with no history gets a whole regional batch; the two other
  // processes ask it for a batch each (the refill of the window restarted the count after the
  // refiller's own ask).
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.check(i).rate.allowed);
  EXPECT_EQ(r.coord.ledger("k")->granted, 64u);
  EXPECT_EQ(r.mem.pool("k")->demand, 32u);
  // The next window: each process spent 1, so it asks 1 (its demand); the refiller leases what
  // the region asked in the window before (32, and its own 1 now), not 64.
  r.clock.advance(seconds(10));
  ASSERT_TRUE(r.check(0).rate.allowed);
  EXPECT_EQ(r.coord.ledger("k")->window_start, Nanos{seconds(110)}.count());
  EXPECT_EQ(r.coord.ledger("k")->granted, 33u);
  EXPECT_EQ(r.mem.pool("k")->balance, 32u);
  ASSERT_TRUE(r.check(1).rate.allowed);
  ASSERT_TRUE(r.check(2).rate.allowed);
  EXPECT_EQ(r.mem.pool("k")->demand, 2u);
  // The window after: the others asked 2 in the window before, and the refiller asks 1 now: 3.
  r.clock.advance(seconds(10));
  ASSERT_TRUE(r.check(0).rate.allowed);
  EXPECT_EQ(r.coord.ledger("k")->granted, 3u);
  EXPECT_EQ(r.sw.calls, 3);  // one lease per window, all through the refiller
}

TEST(FederationPool, TheRegionSpendsExactlyTheBudgetWithOneLeasePerRegionalBatch) {
  Region r(pooled());
  std::uint64_t admitted = 0;
  for (int i = 0; i < 1500; ++i) admitted += r.check(i % 3).rate.allowed ? 1 : 0;
  EXPECT_EQ(admitted, 1000u);
  // 1000 / 64 refills, and the smaller grants of the budget's last part (the taper).
  EXPECT_LE(r.sw.calls, 30);
  const FederatedDecision last = r.check(1);
  EXPECT_FALSE(last.rate.allowed);
  EXPECT_EQ(last.reason, FederatedReason::kBudgetSpent);
}

TEST(FederationPool, GivenUpEscrowGoesBackToThePoolNotTheCoordinator) {
  Region r(pooled());
  ASSERT_TRUE(r.check(0).rate.allowed);
  r.procs[0]->relinquish_all(r.clock.now());
  EXPECT_EQ(r.mem.pool("k")->balance, 48u + 15u);
  EXPECT_EQ(r.coord.ledger("k")->returned, 0u);
  EXPECT_EQ(r.procs[0]->stats().pool_refilled, 48u + 15u);
  // Escrow of a window the pool no longer holds is forfeited, not given to a later window.
  ASSERT_TRUE(r.check(1).rate.allowed);
  r.clock.advance(seconds(10));
  r.procs[1]->relinquish_all(r.clock.now());
  EXPECT_EQ(r.mem.pool("k")->balance, 48u + 15u - 16u);
}

TEST(FederationPool, WhileThePoolIsDownLeasesGoStraightToTheCoordinator) {
  Region r(pooled());
  r.pool.down = true;
  ASSERT_TRUE(r.check(0).rate.allowed);
  EXPECT_EQ(r.pool.calls, 1);
  EXPECT_EQ(r.sw.calls, 1);
  EXPECT_EQ(r.coord.ledger("k")->granted, 16u);  // its own batch: no pool to share with
  EXPECT_EQ(r.procs[0]->stats().pool_failures, 1u);
  // Within retry_backoff the pool is not asked again.
  ASSERT_TRUE(r.check(0, "other").rate.allowed);
  EXPECT_EQ(r.pool.calls, 1);
  EXPECT_EQ(r.sw.calls, 2);
  r.pool.down = false;
  r.clock.advance(seconds(1));
  ASSERT_TRUE(r.check(0, "third").rate.allowed);
  EXPECT_EQ(r.pool.calls, 3);  // a take, then the refill
}

TEST(FederationPool, ARefillerWhoseLeaseFailsLetsTheNextProcessRefillAtOnce) {
  Region r(pooled());
  r.sw.down = true;
  const FederatedDecision d = r.check(0);
  EXPECT_FALSE(d.rate.allowed);
  EXPECT_EQ(d.reason, FederatedReason::kCoordinatorUnreachable);
  EXPECT_EQ(r.mem.pool("k")->refilling_until, INT64_MIN);
  r.sw.down = false;
  ASSERT_TRUE(r.check(1).rate.allowed);
  EXPECT_EQ(r.mem.pool("k")->balance, 48u);  // process 1 refilled without waiting out a hold
}

// Both modes from the same start: the pool holds 32 units of a window that has just ended, and
// the coordinator goes down.
std::unique_ptr<Region> outage_start(FederationOutage mode) {
  FederationOptions o = pooled();
  o.outage = mode;
  auto r = std::make_unique<Region>(o);
  EXPECT_TRUE(r->check(0).rate.allowed);
  EXPECT_TRUE(r->check(1).rate.allowed);
  EXPECT_EQ(r->mem.pool("k")->balance, 32u);
  r->clock.advance(seconds(10));
  r->sw.down = true;
  return r;
}

TEST(FederationPool, FailClosedNeverServesThePoolPastItsWindow) {
  auto r = outage_start(FederationOutage::kFailClosed);
  for (int i = 0; i < 30; ++i) {
    const FederatedDecision d = r->check(i % 3);
    ASSERT_FALSE(d.rate.allowed);
    EXPECT_EQ(d.reason, FederatedReason::kCoordinatorUnreachable);
  }
  EXPECT_EQ(r->mem.pool("k")->balance, 32u);
  EXPECT_FALSE(r->procs[0]->stats().in_outage);
}

TEST(FederationPool, RegionalOnlyServesThePoolsBalanceAtTheOnsetAndNoMore) {
  auto r = outage_start(FederationOutage::kRegionalOnly);
  std::uint64_t admitted = 0;
  FederatedDecision last;
  for (int i = 0; i < 60; ++i) {
    last = r->check(i % 3);
    admitted += last.rate.allowed ? 1 : 0;
  }
  EXPECT_EQ(admitted, 32u);  // the degraded bound: the pool's balance when the outage began
  EXPECT_EQ(last.reason, FederatedReason::kRegionalBalanceSpent);
  EXPECT_GT(last.rate.retry_after, Nanos{0});
  EXPECT_TRUE(r->procs[0]->stats().in_outage);
  EXPECT_EQ(r->procs[0]->stats().outages, 1u);
  EXPECT_EQ(r->mem.pool("k")->balance, 0u);
}

TEST(FederationPool, RegionalOnlyProbesTheCoordinatorOnTheClockAndResumesWhenItAnswers) {
  auto r = outage_start(FederationOutage::kRegionalOnly);
  ASSERT_TRUE(r->check(0).rate.allowed);
  ASSERT_TRUE(r->procs[0]->stats().in_outage);
  // Checks before the health check interval has passed probe nothing.
  for (int i = 0; i < 10; ++i) (void)r->check(0);
  r->clock.advance(seconds(4));
  (void)r->check(0);
  EXPECT_EQ(r->sw.health_calls, 0);
  // Once it has, one check probes, once per interval, however many checks come.
  r->clock.advance(seconds(1));
  for (int i = 0; i < 10; ++i) (void)r->check(0);
  EXPECT_EQ(r->sw.health_calls, 1);
  EXPECT_TRUE(r->procs[0]->stats().in_outage);  // still down
  r->sw.down = false;
  r->clock.advance(seconds(5));
  (void)r->check(0);
  EXPECT_EQ(r->sw.health_calls, 2);
  EXPECT_FALSE(r->procs[0]->stats().in_outage);
  // Leasing resumes: the pool is refilled for the current window from the coordinator.
  r->clock.advance(seconds(1));
  const std::uint64_t before = r->coord.ledger("k")->granted;
  for (int i = 0; i < 40; ++i) (void)r->check(0);
  EXPECT_GT(r->coord.ledger("k")->window_start, seconds(110).count());
  EXPECT_GT(r->coord.ledger("k")->granted + before, 0u);
  EXPECT_EQ(r->check(0).reason, FederatedReason::kAdmitted);
}

// A process in a regional-only outage that still holds units of its own lease when it takes
// from the pool (a background refill) gives them up rather than let them share the later expiry
// of units served past their window: after the window, no more is admitted than the pool held
// at the onset.
TEST(FederationPool, RegionalOnlyServesNoOwnEscrowPastItsWindow) {
  FederationOptions o = pooled();
  o.outage = FederationOutage::kRegionalOnly;
  Region r(o);
  ASSERT_TRUE(r.check(0).rate.allowed);  // the refiller keeps 16; the pool holds 48
  r.sw.down = true;                      // the onset: 48 in the pool
  (void)r.check(0, "a");                 // another key's lease fails: process 0 is in the outage
  ASSERT_TRUE(r.procs[0]->stats().in_outage);
  r.clock.set(milliseconds(109'000));
  // 15 left; spending 12 leaves 3, below refill_below (4): a background take from the pool.
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(r.check(0).rate.allowed);
  r.clock.set(milliseconds(110'500));  // the next window
  std::uint64_t admitted = 0;
  for (int i = 0; i < 200; ++i) admitted += r.check(i % 3).rate.allowed ? 1 : 0;
  EXPECT_LE(admitted, 48u);
  EXPECT_GT(admitted, 0u);  // the mode does serve the pool past its window
}

// Two regions of three processes, each with its own pool, one coordinator: random checks,
// clock steps, call deliveries and outages of the coordinator and of each pool, in fail-closed.
// Every admission is counted in the coordinator's window it happened in (one clock, no drift):
// never more than the limit.
TEST(FederationPool, RandomInterleavingsNeverAdmitMoreThanTheLimitInAWindow) {
  constexpr std::uint64_t kLimit = 40;
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    ManualClock clock(seconds(100));
    MemoryRateCoordinator coord(clock);
    Switchable sw(coord);
    FederationOptions o = opts("a", kLimit);
    o.batch = 4;
    o.regional_batch = 8;
    o.lease_timeout = milliseconds(100);
    o.retry_backoff = milliseconds(300);
    std::vector<std::unique_ptr<MemoryRegionalEscrow>> mems;
    std::vector<std::unique_ptr<SwitchablePool>> pools;
    std::vector<std::unique_ptr<QueuedIo>> ios;
    std::vector<std::unique_ptr<FederatedLimiter>> procs;
    for (int region = 0; region < 2; ++region) {
      mems.push_back(std::make_unique<MemoryRegionalEscrow>(clock));
      pools.push_back(std::make_unique<SwitchablePool>(*mems.back()));
      o.region = region == 0 ? "a" : "b";
      for (int p = 0; p < 3; ++p) {
        ios.push_back(std::make_unique<QueuedIo>());
        procs.push_back(std::make_unique<FederatedLimiter>(sw, pools.back().get(), clock, o,
                                                           ios.back()->executor()));
      }
    }
    std::map<std::int64_t, std::uint64_t> per_window;
    for (int step = 0; step < 3000; ++step) {
      const int what = static_cast<int>(rng() % 20);
      if (what < 12) {
        const std::size_t p = rng() % procs.size();
        const std::uint64_t hits = 1 + rng() % 2;
        procs[p]->check("k", hits, clock.now(), [&, hits](FederatedDecision d) {
          if (d.rate.allowed) per_window[window_of(clock.now(), seconds(10)).count()] += hits;
        });
      } else if (what < 16) {
        // Deliver one queued call of one process (calls arrive late and out of step).
        QueuedIo& io = *ios[rng() % ios.size()];
        if (!io.calls.empty()) {
          auto f = std::move(io.calls.front());
          io.calls.pop_front();
          f();
        }
      } else if (what < 18) {
        clock.advance(milliseconds(rng() % 700));
      } else if (what == 18) {
        sw.down = !sw.down;
      } else {
        SwitchablePool& pool = *pools[rng() % pools.size()];
        pool.down = !pool.down;
      }
    }
    sw.down = false;
    for (auto& io : ios) io->run_all();
    for (const auto& [w, n] : per_window)
      ASSERT_LE(n, kLimit) << "seed " << seed << " window " << w;
    ASSERT_FALSE(per_window.empty());
  }
}

}  // namespace
}  // namespace sluice
