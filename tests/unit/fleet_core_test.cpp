// The heartbeat core, rule by rule (sluice/core/fleet.h), and the memory coordinator around it.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sluice/backends/memory_coordinator.h"
#include "sluice/core/fleet.h"

namespace sluice {
namespace {

using std::chrono::seconds;

NodeReport report(std::string id, std::uint32_t l_local, std::uint32_t in_flight = 0,
                  std::uint64_t acked = 0) {
  return NodeReport{std::move(id), l_local, in_flight, acked, seconds(2)};
}

struct Fleet {
  FleetState state;
  CoordinatorConfig config;
  Nanos now{seconds(100)};
  Grant beat(const NodeReport& r) { return heartbeat(state, r, now, config); }
  std::uint32_t sum_shares() const {
    std::uint32_t s = 0;
    for (const auto& n : state.nodes) s += n.share;
    return s;
  }
};

TEST(FleetCore, SoloNodeGetsTheWholeCeiling) {
  Fleet f;
  const Grant g = f.beat(report("a", 10));
  EXPECT_EQ(g.share, 10u);
  EXPECT_EQ(g.l_global, 10u);
  EXPECT_EQ(g.nodes, 1u);
  EXPECT_EQ(g.generation, 1u);
}

TEST(FleetCore, JoinerGetsZeroUntilIncumbentsSplitDown) {
  Fleet f;
  ASSERT_EQ(f.beat(report("a", 10)).share, 10u);
  EXPECT_EQ(f.beat(report("b", 10)).share, 0u);  // a still holds all 10
  EXPECT_LE(f.sum_shares(), 10u);
  EXPECT_EQ(f.beat(report("a", 10)).share, 5u);  // a re-beats down to its fair share
  EXPECT_EQ(f.beat(report("b", 10)).share, 5u);
  EXPECT_EQ(f.sum_shares(), 10u);
}

TEST(FleetCore, RemainderGoesToTheLowestIdsInLexicographicOrder) {
  Fleet f;
  for (int round = 0; round < 3; ++round)
    for (const char* id : {"c", "a", "b"}) f.beat(report(id, 11));
  EXPECT_EQ(f.beat(report("a", 11)).share, 4u);
  EXPECT_EQ(f.beat(report("b", 11)).share, 4u);
  EXPECT_EQ(f.beat(report("c", 11)).share, 3u);
}

TEST(FleetCore, AggregateIsMedianLowerForEvenCountsOrMinNeverSum) {
  Fleet f;
  f.beat(report("a", 10));
  f.beat(report("b", 30));
  EXPECT_EQ(aggregate_limit(f.state, Aggregate::kMedian), 10u);  // lower of {10, 30}
  f.beat(report("c", 20));
  EXPECT_EQ(aggregate_limit(f.state, Aggregate::kMedian), 20u);
  EXPECT_EQ(aggregate_limit(f.state, Aggregate::kMin), 10u);
  EXPECT_EQ(f.beat(report("c", 20)).l_global, 20u);
  f.config.aggregate = Aggregate::kMin;
  const Grant g = f.beat(report("c", 20));
  EXPECT_EQ(g.l_aggregate, 10u);
  // a holds 10 (its solo grant) and c 6: L_global comes down only as they give it back.
  EXPECT_EQ(g.l_global, 16u);
  EXPECT_EQ(g.share, 3u);
  EXPECT_EQ(f.beat(report("a", 10)).l_global, 13u);  // c holds 3 now
  EXPECT_EQ(f.beat(report("c", 20)).l_global, 10u);  // a holds 4: at the aggregate
  EXPECT_EQ(aggregate_limit(FleetState{}, Aggregate::kMedian), 0u);
}

// A node whose L_local is still its algorithm's initial guess does not count toward the
// aggregate while another node has an estimate; with none, every guess counts.
TEST(FleetCore, InitialGuessesCountOnlyWhileNoNodeHasAnEstimate) {
  Fleet f;
  NodeReport a = report("a", 20), b = report("b", 20), c = report("c", 40);
  a.estimated = b.estimated = false;
  EXPECT_EQ(f.beat(a).l_aggregate, 20u);  // guesses only: they count
  f.beat(b);
  EXPECT_EQ(f.beat(c).l_aggregate, 40u);  // c's estimate alone, not the lower median 20
  EXPECT_EQ(aggregate_limit(f.state, Aggregate::kMin), 40u);
  b.estimated = true;
  b.l_local = 30;
  EXPECT_EQ(f.beat(b).l_aggregate, 30u);  // {30, 40}: the lower median
}

// L_global in force never falls below what the nodes hold (their reserves): a falling
// aggregate takes effect as calls drain, and every grant fits under it.
TEST(FleetCore, LGlobalFallsNoFasterThanWhatIsHeldDrains) {
  Fleet f;
  f.config.acknowledged_handoff = true;
  for (int i = 0; i < 3; ++i) {
    f.beat(report("a", 40, 20, f.state.generation));
    f.beat(report("b", 40, 20, f.state.generation));
  }
  ASSERT_EQ(f.sum_shares(), 40u);
  // Both now estimate 20, still holding 20 calls each.
  Grant g = f.beat(report("a", 20, 20, f.state.generation));
  EXPECT_EQ(g.l_aggregate, 20u);
  EXPECT_EQ(g.l_global, 40u);
  EXPECT_EQ(g.share, 10u);  // its target under the new aggregate
  EXPECT_LE(f.sum_shares(), g.l_global);
  g = f.beat(report("a", 20, 8, g.generation));  // a drained to 8 and confirmed its share
  EXPECT_EQ(g.l_global, 30u);                    // b's 20 + a's 10
  g = f.beat(report("b", 20, 10, f.state.generation));
  EXPECT_EQ(g.l_global, 30u);  // b's unconfirmed 20 still counts
  g = f.beat(report("b", 20, 10, g.generation));
  EXPECT_EQ(g.l_global, 20u);
  EXPECT_EQ(g.l_aggregate, 20u);
}

TEST(FleetCore, ExpiredLeasesAreEvictedAndLeaveReclaimsAtOnce) {
  Fleet f;
  f.beat(report("a", 8));
  f.beat(report("b", 8));
  f.beat(report("a", 8));
  f.beat(report("b", 8));
  ASSERT_EQ(f.state.nodes.size(), 2u);
  f.now += seconds(1);
  f.beat(report("a", 8));  // b expires at +2 s
  EXPECT_EQ(f.state.nodes.size(), 2u);
  f.now += seconds(1);
  const Grant g = f.beat(report("a", 8));  // b's lease expired (expires_at <= now)
  EXPECT_EQ(g.nodes, 1u);
  EXPECT_EQ(g.share, 8u);
  f.beat(report("b", 8));
  EXPECT_TRUE(leave(f.state, "a"));
  EXPECT_FALSE(leave(f.state, "a"));
  EXPECT_EQ(f.beat(report("b", 8)).share, 8u);  // a's share is back at once
}

NodeReport member(std::string id, std::uint64_t instance, std::uint32_t l_local = 8) {
  NodeReport r = report(std::move(id), l_local);
  r.instance = instance;
  return r;
}

TEST(FleetCore, ALiveRecordOfAnotherMemberHoldsItsIdUntilItExpiresOrLeaves) {
  Fleet f;
  ASSERT_EQ(f.beat(member("a", 0x1111)).share, 8u);
  // The same member, again: no clash.
  EXPECT_EQ(clash(f.state, member("a", 0x1111), f.now), "");
  // Another member under a's id, while a's record lives (it expires at +2 s).
  f.now += seconds(1);
  const std::string why = clash(f.state, member("a", 0x2222), f.now);
  EXPECT_EQ(why,
            "node id 'a' is held by another live member (instance 0000000000001111, its record "
            "expires in 1000 ms unless it reports again): each member needs a node id of its own");
  // A report that does not say which member it is matches any (and so does a record without).
  EXPECT_EQ(clash(f.state, member("a", 0), f.now), "");
  // Another member's leave leaves the record; its own member's takes it.
  EXPECT_FALSE(leave(f.state, "a", 0x2222));
  ASSERT_EQ(f.state.nodes.size(), 1u);
  EXPECT_TRUE(leave(f.state, "a", 0x1111));
  EXPECT_EQ(clash(f.state, member("a", 0x2222), f.now), "");
}

TEST(FleetCore, AnExpiredRecordOfAnotherMemberIsTakenOverAfresh) {
  Fleet f;
  f.config.acknowledged_handoff = true;
  f.beat(member("a", 0x1111));
  f.beat(member("b", 0x3333));
  const Grant before = f.beat(member("a", 0x1111));
  ASSERT_EQ(f.state.nodes[0].unacked.size(), 2u);  // a's grants are not yet acknowledged
  f.now += seconds(2);                             // a's record expires (expires_at <= now)
  EXPECT_EQ(clash(f.state, member("a", 0x2222), f.now), "");
  f.beat(member("a", 0x2222));
  const FleetNode& a = f.state.nodes[0];
  ASSERT_EQ(a.id, "a");
  EXPECT_EQ(a.instance, 0x2222u);
  // The new member joins as a node never seen: none of the old member's unacknowledged grants
  // or acknowledgements carry over.
  ASSERT_EQ(a.unacked.size(), 1u);
  EXPECT_GT(a.unacked[0].generation, before.generation);
  EXPECT_EQ(a.acked_generation, 0u);
}

TEST(MemoryCoordinator, AHeartbeatUnderAnotherLiveMembersIdIsRefusedAndChangesNothing) {
  ManualClock clock(Nanos{seconds(10)});
  MemoryCoordinator c(clock);
  ASSERT_TRUE(c.heartbeat("db", member("a", 1), seconds(1)).ok());
  const FleetState before = *c.state("db");
  const auto twin = c.heartbeat("db", member("a", 2, 50), seconds(1));
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(twin.status().message().find("node id 'a' is held by another live member"),
            std::string::npos)
      << twin.status().message();
  EXPECT_EQ(*c.state("db"), before);
  EXPECT_TRUE(c.leave("db", "a", 2, seconds(1)).ok());  // not its record: it stays
  EXPECT_EQ(*c.state("db"), before);
  clock.advance(seconds(2));  // a's record expires: the id is free
  const auto joined = c.heartbeat("db", member("a", 2, 50), seconds(1));
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined.value().share, 50u);
}

TEST(FleetCore, OccupancyCapReservesAPeersInFlight) {
  Fleet f;
  f.beat(report("a", 10));
  f.beat(report("b", 10));
  f.beat(report("a", 10, /*in_flight=*/9));      // a's target is 5 but it holds 9 in flight
  EXPECT_EQ(f.beat(report("b", 10)).share, 1u);  // 10 - max(5, 9)
  f.beat(report("a", 10, 4));
  EXPECT_EQ(f.beat(report("b", 10)).share, 5u);
}

TEST(FleetCore, AcknowledgedHandoffReservesUnconfirmedGrants) {
  Fleet f;
  f.config.acknowledged_handoff = true;
  const Grant a1 = f.beat(report("a", 10));
  ASSERT_EQ(a1.share, 10u);
  EXPECT_EQ(f.beat(report("b", 10)).share, 0u);
  // a re-beats still acking its first grant: it is granted 5, but grant 1 (10) is unconfirmed.
  const Grant a2 = f.beat(report("a", 10, 0, a1.generation));
  ASSERT_EQ(a2.share, 5u);
  EXPECT_EQ(f.beat(report("b", 10)).share, 0u);  // a may still be admitting against 10
  // a confirms it enforces grant 2: grant 1 is superseded.
  f.beat(report("a", 10, 0, a2.generation));
  EXPECT_EQ(f.beat(report("b", 10)).share, 5u);
  for (const auto& n : f.state.nodes)
    for (const auto& g : n.unacked) EXPECT_GE(g.generation, n.acked_generation);
}

TEST(FleetCore, HandoffOffKeepsNoGrantHistory) {
  Fleet f;
  f.beat(report("a", 10));
  f.beat(report("a", 10, 0, 1));
  EXPECT_TRUE(f.state.nodes[0].unacked.empty());
}

// a is idle; b and c are saturated (each reports as many in flight as its share allows).
TEST(FleetCore, DemandProportionalGivesSatisfiedNodesAProbe) {
  Fleet f;
  f.config.allocation = Allocation::kDemandProportional;
  auto share_of = [&](const char* id) {
    for (const auto& n : f.state.nodes)
      if (n.id == id) return n.share;
    return 0u;
  };
  Grant a, b, c;
  for (int round = 0; round < 4; ++round) {
    a = f.beat(report("a", 12, 0));
    b = f.beat(report("b", 12, share_of("b")));
    c = f.beat(report("c", 12, share_of("c")));
    EXPECT_LE(f.sum_shares(), 12u) << "round " << round;
  }
  // a keeps a 1-slot probe; b and c split the other 11 (b, the lower id, takes the odd one).
  EXPECT_EQ(a.share, 1u);
  EXPECT_EQ(b.share, 6u);
  EXPECT_EQ(c.share, 5u);
  // The equal split would have left a holding 4 it does not use.
  Fleet eq;
  for (int round = 0; round < 4; ++round)
    for (const char* id : {"a", "b", "c"}) a = eq.beat(report(id, 12));
  EXPECT_EQ(eq.beat(report("a", 12)).share, 4u);
}

TEST(FleetCore, EqualSplitWithMoreNodesThanCeilingLeavesSomeAtZero) {
  Fleet f;
  for (int round = 0; round < 3; ++round)
    for (const char* id : {"a", "b", "c"}) f.beat(report(id, 2));
  EXPECT_EQ(f.beat(report("a", 2)).share, 1u);
  EXPECT_EQ(f.beat(report("b", 2)).share, 1u);
  EXPECT_EQ(f.beat(report("c", 2)).share, 0u);
}

TEST(FleetCore, GenerationsAreMonotonicEvenAfterAnAckFromTheFuture) {
  Fleet f;
  EXPECT_EQ(f.beat(report("a", 4)).generation, 1u);
  EXPECT_EQ(f.beat(report("a", 4)).generation, 2u);
  // A node that enforced generation 50 of a coordinator whose state was lost.
  EXPECT_EQ(f.beat(report("b", 4, 0, 50)).generation, 51u);
  EXPECT_EQ(f.beat(report("a", 4)).generation, 52u);
}

TEST(FleetCore, ValidateNamesTheField) {
  EXPECT_EQ(validate(report("a", 4)), "");
  EXPECT_EQ(validate(report("", 4)), "node_id must not be empty");
  NodeReport r = report("a", 4);
  r.lease_ttl = Nanos{0};
  EXPECT_EQ(validate(r), "lease_ttl must be > 0");
}

TEST(MemoryCoordinator, RunsTheCoreOnItsClockPerKey) {
  ManualClock clock(Nanos{seconds(10)});
  MemoryCoordinator c(clock);
  auto g = c.heartbeat("db", report("a", 6), seconds(1));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g.value().share, 6u);
  ASSERT_TRUE(c.heartbeat("other", report("a", 3), seconds(1)).ok());
  ASSERT_TRUE(c.heartbeat("db", report("b", 6), seconds(1)).ok());
  clock.advance(seconds(3));  // both leases of "db" ran out; b's beat evicts a
  g = c.heartbeat("db", report("b", 6), seconds(1));
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g.value().nodes, 1u);
  EXPECT_EQ(g.value().share, 6u);
  EXPECT_EQ(c.state("other")->nodes.size(), 1u);
  EXPECT_FALSE(c.state("missing").has_value());
  EXPECT_TRUE(c.leave("db", "b", 0, seconds(1)).ok());
  EXPECT_TRUE(c.leave("db", "nobody", 0, seconds(1)).ok());
  EXPECT_TRUE(c.state("db")->nodes.empty());
  EXPECT_EQ(c.backend(), "memory");
}

TEST(MemoryCoordinator, BadInputIsAnInvalidArgumentNamingTheField) {
  ManualClock clock;
  MemoryCoordinator c(clock);
  auto empty_key = c.heartbeat("", report("a", 6), seconds(1));
  ASSERT_FALSE(empty_key.ok());
  EXPECT_EQ(empty_key.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty_key.status().to_string(), "invalid argument: key must not be empty");
  auto no_id = c.heartbeat("db", report("", 6), seconds(1));
  ASSERT_FALSE(no_id.ok());
  EXPECT_EQ(no_id.status().message(), "node_id must not be empty");
  EXPECT_FALSE(no_id.status().retryable());
  EXPECT_FALSE(c.state("db").has_value());  // nothing was written
}

}  // namespace
}  // namespace sluice
