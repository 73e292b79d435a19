// FleetGuard on explicit time: phases, outage modes, self-fencing, bounded calls, eager
// handoff, close, and the effective ceiling min(share, L_local).
#include "sluice/fleet_guard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "sluice/fixed_limit.h"
#include "sluice/memory_coordinator.h"
#include "sluice/testing/faulty_coordinator.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FaultyCoordinator;

FleetGuardOptions options(std::string node, OutageMode outage = OutageMode::kFailClosed) {
  FleetGuardOptions o;
  o.node_id = std::move(node);
  o.key = "backend";
  o.heartbeat = seconds(1);
  o.outage = outage;
  return o;
}

std::unique_ptr<LimitAlgorithm> fixed(std::uint32_t limit) {
  return std::make_unique<FixedLimit>(FixedLimitOptions{.limit = limit});
}

// Admits as many as the guard allows; returns the permits.
std::vector<GuardPermit> fill(FleetGuard& g) {
  std::vector<GuardPermit> out;
  while (auto p = g.acquire()) out.push_back(std::move(*p));
  return out;
}

struct World {
  ManualClock clock{Nanos{seconds(1000)}};
  MemoryCoordinator memory{clock};
  FaultyCoordinator coordinator{memory, &clock};
};

TEST(FleetGuard, FailClosedAdmitsNothingUntilTheFirstGrantAtTheFirstTick) {
  World w;
  FleetGuard g(w.coordinator, fixed(8), w.clock, options("a"));
  EXPECT_FALSE(g.acquire());
  EXPECT_EQ(g.stats().phase, FleetPhase::kStarting);
  const Nanos next = g.tick(w.clock.now());
  EXPECT_EQ(next, w.clock.now() + seconds(1));
  EXPECT_EQ(g.stats().phase, FleetPhase::kActive);
  EXPECT_EQ(g.stats().share, 8u);  // a solo node's first grant is all of L_global
  EXPECT_EQ(fill(g).size(), 8u);
}

TEST(FleetGuard, LocalOnlyAdmitsUpToLocalLimitBeforeTheFirstGrant) {
  World w;
  FleetGuard g(w.coordinator, fixed(5), w.clock, options("a", OutageMode::kLocalOnly));
  EXPECT_EQ(fill(g).size(), 5u);
}

TEST(FleetGuard, EffectiveCeilingIsTheSmallerOfShareAndLocalLimit) {
  World w;
  FleetGuard big(w.coordinator, fixed(10), w.clock, options("a"));
  FleetGuard small(w.coordinator, fixed(3), w.clock, options("b"));
  FleetGuard third(w.coordinator, fixed(10), w.clock, options("c"));
  for (int i = 0; i < 4; ++i) {
    big.tick(w.clock.now());
    small.tick(w.clock.now());
    third.tick(w.clock.now());
    w.clock.advance(seconds(1));
  }
  EXPECT_EQ(big.stats().l_global, 10u);  // median of {10, 3, 10}
  EXPECT_EQ(small.stats().share, 3u);
  EXPECT_EQ(small.stats().local.limit, 3u);  // min(share 3, L_local 3)
  EXPECT_EQ(big.stats().share, 4u);          // 10 = 4 + 3 + 3, the extra unit to the lowest id
  EXPECT_EQ(fill(big).size(), 4u);
}

TEST(FleetGuard, FleetConvergesToEqualSplitNeverOverCommitting) {
  World w;
  std::vector<std::unique_ptr<FleetGuard>> fleet;
  for (const char* id : {"a", "b", "c", "d"})
    fleet.push_back(std::make_unique<FleetGuard>(w.coordinator, fixed(12), w.clock, options(id)));
  for (int beat = 0; beat < 6; ++beat) {
    for (auto& g : fleet) {
      g->tick(w.clock.now());
      std::uint32_t sum = 0;
      for (auto& h : fleet) sum += h->stats().share;
      ASSERT_LE(sum, 12u) << "beat " << beat;
      w.clock.advance(milliseconds(10));
    }
    w.clock.advance(seconds(1));
  }
  for (auto& g : fleet) EXPECT_EQ(g->stats().share, 3u);
}

TEST(FleetGuard, ReportEchoesTheGenerationItEnforces) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  g.tick(w.clock.now());
  const std::uint64_t first = g.stats().generation;
  w.clock.advance(seconds(1));
  g.tick(w.clock.now());
  EXPECT_EQ(w.memory.state("backend")->nodes[0].acked_generation, first);
  EXPECT_GT(g.stats().generation, first);
}

TEST(FleetGuard, FailClosedShedsEverythingDuringAnOutageAndRecovers) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  g.tick(w.clock.now());
  ASSERT_TRUE(g.acquire());
  w.coordinator.set_fault(FaultyCoordinator::Fault::kUnavailable);
  w.clock.advance(seconds(1));
  g.tick(w.clock.now());
  EXPECT_EQ(g.stats().phase, FleetPhase::kOutage);
  EXPECT_EQ(g.stats().heartbeat_errors, 1u);
  EXPECT_FALSE(g.acquire());
  const Status s = g.heartbeat();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  w.coordinator.set_fault(FaultyCoordinator::Fault::kNone);
  w.clock.advance(seconds(1));
  g.tick(w.clock.now());
  EXPECT_EQ(g.stats().phase, FleetPhase::kActive);
  EXPECT_TRUE(g.acquire());
}

TEST(FleetGuard, LocalOnlyFallsBackToTheLocalLimitDuringAnOutage) {
  World w;
  FleetGuard a(w.coordinator, fixed(6), w.clock, options("a", OutageMode::kLocalOnly));
  FleetGuard b(w.coordinator, fixed(6), w.clock, options("b", OutageMode::kLocalOnly));
  for (int i = 0; i < 3; ++i) {
    a.tick(w.clock.now());
    b.tick(w.clock.now());
    w.clock.advance(seconds(1));
  }
  ASSERT_EQ(a.stats().share, 3u);
  w.coordinator.set_fault(FaultyCoordinator::Fault::kUnavailable);
  a.tick(w.clock.now());
  EXPECT_EQ(a.stats().phase, FleetPhase::kOutage);
  EXPECT_EQ(fill(a).size(), 6u);    // L_local, not the share
  EXPECT_EQ(a.stats().fences, 0u);  // local-only never fences
}

TEST(FleetGuard, SelfFencesBeforeTheLeaseEndsAndRunsTheHookOnce) {
  World w;
  int hook_calls = 0;
  FleetGuardOptions o = options("a");
  o.on_fenced = [&] { ++hook_calls; };
  FleetGuard g(w.coordinator, fixed(4), w.clock, o);
  const Nanos sent = w.clock.now();
  g.tick(sent);
  w.coordinator.set_fault(FaultyCoordinator::Fault::kUnavailable);
  // Lease 2 s, margin 250 ms: the fence is at sent + 1.75 s, before the coordinator's reclaim.
  Nanos next = g.tick(sent + seconds(1));
  EXPECT_EQ(next, sent + milliseconds(1750));
  EXPECT_EQ(g.stats().fences, 0u);
  g.tick(sent + milliseconds(1749));
  EXPECT_FALSE(g.stats().fenced);
  g.tick(sent + milliseconds(1750));
  EXPECT_TRUE(g.stats().fenced);
  EXPECT_EQ(hook_calls, 1);
  g.tick(sent + seconds(3));
  EXPECT_EQ(hook_calls, 1);
  EXPECT_FALSE(g.acquire());
  w.coordinator.set_fault(FaultyCoordinator::Fault::kNone);
  g.tick(sent + seconds(4));
  EXPECT_FALSE(g.stats().fenced);
  EXPECT_TRUE(g.acquire());
}

TEST(FleetGuard, AHealthyNodeNeverFences) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  for (int i = 0; i < 100; ++i) {
    const Nanos next = g.tick(w.clock.now());
    w.clock.set(next);
  }
  EXPECT_EQ(g.stats().fences, 0u);
  EXPECT_EQ(g.stats().heartbeats, 100u);
}

// A partition makes the call hang: the guard bounds it by the fence deadline, so it fences on
// time instead of admitting against a share the coordinator is about to give away.
TEST(FleetGuard, AHangingCallIsBoundedByTheFenceDeadline) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  const Nanos sent = w.clock.now();
  g.tick(sent);
  w.coordinator.set_fault(FaultyCoordinator::Fault::kHang);
  w.clock.set(sent + milliseconds(1500));
  g.tick(w.clock.now());  // the call hangs until the fence deadline (the fake clock moves)
  EXPECT_EQ(w.coordinator.last_timeout(), milliseconds(250));  // fence at 1.75 s
  EXPECT_EQ(w.clock.now(), sent + milliseconds(1750));
  EXPECT_TRUE(g.stats().fenced);
  EXPECT_FALSE(g.acquire());
}

TEST(FleetGuard, CallsAreBoundedByCallTimeoutWhenNoFenceIsNear) {
  World w;
  FleetGuardOptions o = options("a");
  o.call_timeout = milliseconds(100);
  FleetGuard g(w.coordinator, fixed(4), w.clock, o);
  g.tick(w.clock.now());
  EXPECT_EQ(w.coordinator.last_timeout(), milliseconds(100));
}

// Join ramp: b joins a saturated fleet under acknowledged handoff. a learns of b only at its
// next periodic beat (1 s after b joined, here); lazily, b then waits for a's next beat (the
// ack) and its own: ~2 heartbeats. With eager handoff a confirms the lowered grant as soon as it
// has drained and b, capped below its fair share, re-beats every min_heartbeat (100 ms): the
// ramp is a's beat plus drain plus a debounce interval or two.
Nanos time_to_fair_share(bool eager) {
  ManualClock clock{Nanos{seconds(1000)}};
  MemoryCoordinator coordinator(clock, CoordinatorConfig{.acknowledged_handoff = true});
  FleetGuardOptions oa = options("a"), ob = options("b");
  oa.eager_handoff = ob.eager_handoff = eager;
  FleetGuard a(coordinator, fixed(8), clock, oa);
  FleetGuard b(coordinator, fixed(8), clock, ob);
  Nanos next_a = a.tick(clock.now());
  auto held = fill(a);  // a saturates its share of 8
  const Nanos joined = clock.now();
  Nanos next_b = b.tick(clock.now());
  EXPECT_EQ(b.stats().share, 0u);
  while (b.stats().share < 4) {
    const Nanos next = std::min(next_a, next_b);
    clock.set(next);
    // a's calls finish as soon as its share is lowered (drain takes no time here).
    if (a.stats().share < held.size()) held.resize(a.stats().share);
    if (next_a <= clock.now()) next_a = a.tick(clock.now());
    if (next_b <= clock.now()) next_b = b.tick(clock.now());
    if (clock.now() - joined > seconds(30)) break;
  }
  return clock.now() - joined;
}

TEST(FleetGuard, EagerHandoffShortensTheJoinRamp) {
  const Nanos lazy = time_to_fair_share(false);
  const Nanos eager = time_to_fair_share(true);
  EXPECT_GE(lazy, seconds(2));
  EXPECT_LE(lazy, seconds(3));
  EXPECT_LE(eager, milliseconds(1300));
}

TEST(FleetGuard, EagerHandoffAddsNoBeatsInSteadyState) {
  World w;
  FleetGuardOptions o = options("a");
  o.eager_handoff = true;
  FleetGuard g(w.coordinator, fixed(4), w.clock, o);
  for (int i = 0; i < 20; ++i) w.clock.set(g.tick(w.clock.now()));
  EXPECT_EQ(g.stats().off_cycle_beats, 0u);
  EXPECT_EQ(g.stats().heartbeats, 20u);
}

TEST(FleetGuard, CloseLeavesTheFleetAndStopsAdmitting) {
  World w;
  FleetGuard a(w.coordinator, fixed(6), w.clock, options("a"));
  FleetGuard b(w.coordinator, fixed(6), w.clock, options("b"));
  for (int i = 0; i < 3; ++i) {
    a.tick(w.clock.now());
    b.tick(w.clock.now());
    w.clock.advance(seconds(1));
  }
  ASSERT_EQ(b.stats().share, 3u);
  a.close();
  a.close();
  EXPECT_EQ(a.stats().phase, FleetPhase::kClosed);
  EXPECT_FALSE(a.acquire());
  EXPECT_EQ(w.memory.state("backend")->nodes.size(), 1u);  // reclaimed at once
  b.tick(w.clock.now());
  EXPECT_EQ(b.stats().share, 6u);
  EXPECT_EQ(a.heartbeat().code(), StatusCode::kInvalidArgument);
}

TEST(FleetGuard, CreateRejectsBadOptionsNamingTheField) {
  World w;
  FleetGuardOptions o = options("a");
  o.node_id.clear();
  auto r = FleetGuard::create(w.coordinator, fixed(4), w.clock, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "fleet guard: node_id must not be empty");
  o = options("a");
  o.lease_ttl = milliseconds(500);
  EXPECT_EQ(o.validate(), "lease_ttl must be > heartbeat");
  o = options("a");
  o.fence_safety_margin = seconds(2);
  EXPECT_EQ(o.validate(), "fence_safety_margin must be >= 0 and < lease_ttl");
  o = options("a");
  o.min_heartbeat = seconds(2);
  EXPECT_EQ(o.validate(), "min_heartbeat must be > 0 and <= heartbeat");
  o = options("a");
  o.key.clear();
  EXPECT_EQ(o.validate(), "key must not be empty");
  EXPECT_TRUE(FleetGuard::create(w.coordinator, fixed(4), w.clock, options("a")).ok());
}

TEST(FleetGuardRunner, BeatsOnItsOwnThread) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), SteadyClock::instance(), options("a"));
  {
    FleetGuardRunner runner(g, SteadyClock::instance());
    for (int i = 0; i < 2000 && g.stats().heartbeats == 0; ++i)
      std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_GE(g.stats().heartbeats, 1u);
  EXPECT_TRUE(g.acquire());
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// The split beat (poll, then complete) that a non-blocking transport and the simulator use.
TEST(FleetGuardSplitBeat, AtMostOneBeatIsOutstandingAndTheReplyIsAppliedOnCompletion) {
  World w;
  FleetGuard g(w.coordinator, fixed(6), w.clock, options("a"));
  std::optional<FleetGuard::Beat> b = g.poll(w.clock.now());
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->report.node_id, "a");
  EXPECT_EQ(b->report.l_local, 6u);
  EXPECT_EQ(b->report.acked_generation, 0u);
  EXPECT_EQ(b->timeout, seconds(1));    // call_timeout defaults to the heartbeat
  w.clock.advance(milliseconds(1500));  // past the next periodic beat, before the fence
  EXPECT_FALSE(g.poll(w.clock.now()).has_value()) << "a second beat while one is outstanding";
  EXPECT_FALSE(g.acquire());  // nothing granted yet
  g.complete(*b, w.memory.heartbeat("backend", b->report, seconds(1)));
  EXPECT_EQ(g.stats().share, 6u);
  const std::vector<GuardPermit> held = fill(g);
  EXPECT_EQ(held.size(), 6u);
  EXPECT_EQ(g.next_due(), b->sent_at + seconds(1));  // overdue: poll beats at once
  const std::optional<FleetGuard::Beat> next = g.poll(w.clock.now());
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->report.in_flight, 6u);
  EXPECT_EQ(next->report.acked_generation, 1u);
}

TEST(FleetGuardSplitBeat, ReplyArrivingAfterItsFenceDeadlineDoesNotReactivate) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  (void)g.tick(w.clock.now());  // active, lease 2 s, margin 250 ms
  ASSERT_EQ(g.stats().phase, FleetPhase::kActive);
  w.clock.advance(seconds(1));
  const std::optional<FleetGuard::Beat> b = g.poll(w.clock.now());
  ASSERT_TRUE(b.has_value());
  EXPECT_LE(b->timeout, seconds(1));
  const StatusOr<Grant> reply = w.memory.heartbeat("backend", b->report, seconds(1));
  w.clock.advance(seconds(2));  // the reply is late: past sent_at + 2 s - 250 ms
  (void)g.poll(w.clock.now());  // the previous lease's fence falls due meanwhile
  EXPECT_EQ(g.stats().phase, FleetPhase::kFenced);
  g.complete(*b, reply);
  EXPECT_NE(g.stats().phase, FleetPhase::kActive);
  EXPECT_FALSE(g.acquire());
  EXPECT_EQ(g.stats().heartbeat_errors, 1u);
}

TEST(FleetGuardSplitBeat, ReplyAfterCloseIsDropped) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  const std::optional<FleetGuard::Beat> b = g.poll(w.clock.now());
  ASSERT_TRUE(b.has_value());
  const StatusOr<Grant> reply = w.memory.heartbeat("backend", b->report, seconds(1));
  g.close();
  g.complete(*b, reply);
  EXPECT_EQ(g.stats().phase, FleetPhase::kClosed);
  EXPECT_FALSE(g.acquire());
  EXPECT_FALSE(g.poll(w.clock.now()).has_value());
}

}  // namespace
}  // namespace sluice
