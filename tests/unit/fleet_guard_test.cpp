// FleetGuard on explicit time: phases, outage modes, self-fencing, bounded calls, eager
// handoff, close, and the effective ceiling min(share, L_local).
#include "sluice/fleet/fleet_guard.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "sluice/backends/memory_coordinator.h"
#include "sluice/core/fixed_limit.h"
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
std::vector<FleetPermit> fill(FleetGuard& g) {
  std::vector<FleetPermit> out;
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

// Two guards under one node id (two servers given one server.node_id): the coordinator refuses
// the second while the first's record lives, and the second admits nothing, in either outage
// mode, until the first leaves; then it joins. Its last error says why.
TEST(FleetGuard, ASecondMemberUnderALiveNodeIdAdmitsNothingUntilTheIdIsFree) {
  for (const OutageMode mode : {OutageMode::kFailClosed, OutageMode::kLocalOnly}) {
    World w;
    auto first = std::make_unique<FleetGuard>(w.coordinator, fixed(6), w.clock, options("a"));
    FleetGuard twin(w.coordinator, fixed(6), w.clock, options("a", mode));
    EXPECT_NE(first->instance(), twin.instance());
    first->tick(w.clock.now());
    ASSERT_EQ(first->stats().share, 6u);
    const Status refused = twin.heartbeat();
    EXPECT_EQ(refused.code(), StatusCode::kAlreadyExists);
    EXPECT_EQ(twin.stats().phase, FleetPhase::kDuplicateId);
    EXPECT_EQ(to_string(twin.stats().phase), "duplicate_id");
    EXPECT_EQ(twin.stats().share, 0u);
    EXPECT_FALSE(twin.acquire()) << "a refused member admits nothing (local-only included)";
    EXPECT_NE(twin.last_error().find("node id 'a' is held by another live member"),
              std::string::npos)
        << twin.last_error();
    EXPECT_EQ(fill(*first).size(), 6u);  // the first keeps its whole share
    // The twin's close (a leave) leaves the first's record alone.
    w.clock.advance(milliseconds(100));
    twin.close();
    EXPECT_EQ(w.memory.state("backend")->nodes.size(), 1u);
    // The first leaves: a new member under the id joins at its next beat.
    first.reset();
    FleetGuard next(w.coordinator, fixed(6), w.clock, options("a", mode));
    EXPECT_TRUE(next.heartbeat().ok());
    EXPECT_EQ(next.stats().phase, FleetPhase::kActive);
    EXPECT_EQ(next.stats().share, 6u);
  }
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
  w.clock.advance(milliseconds(1200));  // past the next periodic beat, before the fence
  EXPECT_FALSE(g.poll(w.clock.now()).has_value()) << "a second beat while one is outstanding";
  EXPECT_FALSE(g.acquire());  // nothing granted yet
  g.complete(*b, w.memory.heartbeat("backend", b->report, seconds(1)));
  EXPECT_EQ(g.stats().share, 6u);
  const std::vector<FleetPermit> held = fill(g);
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

namespace sluice {
namespace {

// ---- the call deadline: a call must not outlive the node's lease ----

TEST(FleetGuardCallDeadline, MustEndBeforeTheLeaseMinusAHeartbeatAndTheMargin) {
  FleetGuardOptions o = options("a");  // heartbeat 1 s, margin 250 ms
  o.lease_ttl = seconds(2);
  EXPECT_EQ(o.validate(), "");
  EXPECT_EQ(o.call_deadline_in_force(), milliseconds(375));  // (2 s - 1 s - 250 ms) / 2
  o.call_deadline = milliseconds(749);
  EXPECT_EQ(o.validate(), "");
  o.call_deadline = milliseconds(750);  // 750 + 1000 + 250 = lease: not shorter
  const std::string why = o.validate();
  EXPECT_NE(why.find("call_deadline (750 ms)"), std::string::npos) << why;
  EXPECT_NE(why.find("lease_ttl (2000 ms)"), std::string::npos) << why;
  EXPECT_NE(why.find("loses its lease"), std::string::npos) << why;  // it says why
  o.call_deadline = Nanos{0};
  EXPECT_EQ(o.validate(), "call_deadline must be > 0");
  // A lease too short for any deadline says so even when call_deadline is left to default.
  o = options("a");
  o.lease_ttl = milliseconds(1200);
  o.fence_safety_margin = milliseconds(200);
  EXPECT_NE(o.validate().find("the default"), std::string::npos) << o.validate();
}

TEST(FleetGuardCallDeadline, ALongDeadlineWithNoLeaseSetGetsALeaseLongEnough) {
  FleetGuardOptions o = options("a");
  o.call_deadline = seconds(10);
  EXPECT_EQ(o.validate(), "");
  EXPECT_EQ(o.lease_in_force(), seconds(10) + seconds(1) + milliseconds(500));
  o.lease_ttl = seconds(5);  // set explicitly: checked, not stretched
  EXPECT_NE(o.validate().find("call_deadline"), std::string::npos);
}

TEST(FleetGuardCallDeadline, EveryPermitCarriesItsDeadlineAndALateOneIsDropped) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  g.tick(w.clock.now());
  std::optional<FleetPermit> p = g.acquire();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->deadline(), w.clock.now() + milliseconds(375));
  std::optional<FleetPermit> q = g.acquire();
  ASSERT_TRUE(q);
  p->release(Outcome::kSuccess, milliseconds(374));  // in time: a success
  q->release(Outcome::kSuccess, milliseconds(375));  // at the deadline: dropped
  EXPECT_EQ(g.stats().local.dropped, 1u);
  EXPECT_EQ(g.stats().late_releases, 1u);
  // A permit dropped unreleased after its deadline (a lease that expired) is dropped too.
  std::optional<FleetPermit> r = g.acquire();
  ASSERT_TRUE(r);
  w.clock.advance(milliseconds(400));
  r.reset();
  EXPECT_EQ(g.stats().local.dropped, 2u);
  EXPECT_EQ(g.stats().local.in_flight, 0u);
}

TEST(FleetGuardCallDeadline, CallsPastTheirDeadlineAreLeftOutOfTheReportedInFlight) {
  World w;
  FleetGuard g(w.coordinator, fixed(8), w.clock, options("a"));
  const Nanos t0 = w.clock.now();
  g.tick(t0);
  w.clock.set(t0 + milliseconds(500));
  std::vector<FleetPermit> early;
  for (int i = 0; i < 3; ++i) early.push_back(*g.acquire());
  w.clock.set(t0 + milliseconds(900));
  std::vector<FleetPermit> late;
  for (int i = 0; i < 2; ++i) late.push_back(*g.acquire());
  // The next beat: the early three are 500 ms old, past their 375 ms deadline by more than
  // the sweep's granularity (a bucket, at most call_deadline / 4).
  w.clock.set(t0 + seconds(1));
  std::optional<FleetGuard::Beat> b = g.poll(w.clock.now());
  ASSERT_TRUE(b);
  EXPECT_EQ(b->report.in_flight, 2u);  // the backend stopped the early ones
  EXPECT_EQ(g.stats().overdue, 3u);
  EXPECT_EQ(g.stats().local.in_flight, 5u);  // their units come back only when released
  g.complete(*b, w.memory.heartbeat("backend", b->report, seconds(1)));
  early.front().release(Outcome::kSuccess, milliseconds(500));
  EXPECT_EQ(g.stats().overdue, 2u);
  EXPECT_EQ(g.stats().local.dropped, 1u);
  early.clear();
  late.clear();
  EXPECT_EQ(g.stats().overdue, 0u);
  EXPECT_EQ(g.stats().local.in_flight, 0u);
}

// Admissions over a long stretch reuse the buckets (what a reused one held is overdue by
// then); the beat's sweep finds the rest. Either way the count matches the permits.
TEST(FleetGuardCallDeadline, OverdueCountsSurviveBucketReuseAndReleasesBalanceThem) {
  World w;
  FleetGuard g(w.coordinator, fixed(64), w.clock, options("a"));
  Nanos next = g.tick(w.clock.now());
  std::vector<FleetPermit> held;
  for (int step = 0; step < 72; ++step) {  // 72 x 31 ms: the 16 buckets of 67 ms wrap twice
    if (w.clock.now() >= next) next = g.tick(w.clock.now());
    std::optional<FleetPermit> p = g.acquire();
    ASSERT_TRUE(p) << step;
    held.push_back(std::move(*p));
    w.clock.advance(milliseconds(31));
    if (step % 3 == 0) held.erase(held.begin());
  }
  w.clock.set(next);
  std::optional<FleetGuard::Beat> b = g.poll(w.clock.now());
  ASSERT_TRUE(b);
  std::uint32_t past = 0;
  for (const FleetPermit& p : held) {
    // Swept by bucket: a permit counts once its whole bucket is past (within 68 ms of its own:
    // a bucket is 2^26 ns, the power of two at or above call_deadline / 8 = 46.9 ms).
    past += p.deadline() + milliseconds(68) <= w.clock.now() ? 1 : 0;
  }
  EXPECT_GE(g.stats().overdue, past);
  std::uint32_t due = 0;
  for (const FleetPermit& p : held) due += p.deadline() <= w.clock.now() ? 1 : 0;
  EXPECT_LE(g.stats().overdue, due);
  EXPECT_EQ(b->report.in_flight, held.size() - g.stats().overdue);
  held.clear();
  EXPECT_EQ(g.stats().overdue, 0u);
  EXPECT_EQ(g.stats().local.in_flight, 0u);
}

// A node stalled past its lease (SIGSTOP, a long pause) must not admit on the grant it held:
// the coordinator may have given that share away. Its callers may run before its ticking
// thread does, so acquire() itself refuses, until the next beat answers.
TEST(FleetGuardCallDeadline, AThawedNodeDoesNotAdmitOnTheGrantItHeldBeforeTheStall) {
  for (const OutageMode mode : {OutageMode::kFailClosed, OutageMode::kLocalOnly}) {
    World w;
    FleetGuard g(w.coordinator, fixed(4), w.clock, options("a", mode));
    g.tick(w.clock.now());
    EXPECT_TRUE(g.acquire()) << static_cast<int>(mode);
    w.clock.advance(milliseconds(1374));  // the last moment a call admitted ends in the lease
    EXPECT_TRUE(g.acquire()) << static_cast<int>(mode);
    // From lease - margin - call deadline (1.375 s) on, a call could outlive the lease: refused,
    // before any fence (which comes at 1.75 s, from the ticking thread).
    w.clock.advance(milliseconds(1));
    EXPECT_FALSE(g.acquire()) << static_cast<int>(mode);
    EXPECT_EQ(g.stats().phase, FleetPhase::kActive);
    w.clock.advance(seconds(8));  // frozen: no tick ran
    EXPECT_FALSE(g.acquire()) << static_cast<int>(mode);
    EXPECT_EQ(g.stats().stale_refusals, 2u);
    g.tick(w.clock.now());  // the next beat: a fresh grant
    EXPECT_TRUE(g.acquire()) << static_cast<int>(mode);
  }
}

// A reload's changed options, in place: the permits and the share stay; an outage mode change
// takes effect in an outage; another key or call deadline is refused (a new guard's job).
TEST(FleetGuardReconfigure, KeepsPermitsAndShareAndRefusesAnotherKeyOrDeadline) {
  World w;
  FleetGuard g(w.coordinator, fixed(4), w.clock, options("a"));
  g.tick(w.clock.now());
  std::vector<FleetPermit> held = fill(g);
  ASSERT_EQ(held.size(), 4u);
  FleetGuardOptions other = options("a");
  other.key = "elsewhere";
  EXPECT_FALSE(g.reconfigure(other));
  other = options("a");
  other.call_deadline = milliseconds(100);
  EXPECT_FALSE(g.reconfigure(other));
  other = options("a", OutageMode::kLocalOnly);
  other.call_deadline = milliseconds(375);  // the deadline in force before
  other.lease_ttl = seconds(2);
  ASSERT_TRUE(g.reconfigure(other));
  EXPECT_EQ(g.options().outage, OutageMode::kLocalOnly);
  EXPECT_EQ(g.stats().local.in_flight, 4u);
  EXPECT_EQ(g.stats().share, 4u);
  held.clear();
  w.coordinator.set_fault(FaultyCoordinator::Fault::kUnavailable);
  g.tick(w.clock.now() + seconds(1));
  EXPECT_EQ(g.stats().phase, FleetPhase::kOutage);
  EXPECT_EQ(fill(g).size(), 4u);  // local-only: its own limit in the outage
}

// Without self-fencing, fail-closed keeps its documented behaviour: it admits on its last share.
TEST(FleetGuardCallDeadline, FailClosedWithoutSelfFencingAdmitsOnItsLastShare) {
  World w;
  FleetGuardOptions o = options("a");
  o.self_fence = false;
  FleetGuard g(w.coordinator, fixed(4), w.clock, o);
  g.tick(w.clock.now());
  w.clock.advance(seconds(8));
  EXPECT_TRUE(g.acquire());
}

}  // namespace
}  // namespace sluice
