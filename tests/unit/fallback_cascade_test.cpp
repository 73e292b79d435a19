// The fallback cascade (sluice/local/fallback_cascade.h) on a manual clock: it prefers healthy
// nodes by their weights, skips full ones, fails fast when every node is full, records each outcome
// in the node's guard and buckets (an overload refusal as a failure), lets a node floored by
// its sticky bucket back in, keeps health across node-set changes, skips a node whose breaker
// is open without taking its permit, counts half-open probes against the node's limit, retries
// within the retry budget only, and loses no permit or count under concurrent callers.
#include "sluice/local/fallback_cascade.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sluice/core/fixed_limit.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::shared_ptr<AdaptiveGuard> guard(const Clock& clock, std::uint32_t limit) {
  FixedLimitOptions o;
  o.limit = limit;
  return std::make_shared<AdaptiveGuard>(std::make_unique<FixedLimit>(o), clock);
}

struct Fixture {
  ManualClock clock{seconds(1'000'000)};
  std::mt19937_64 rng{7};
  std::vector<CascadeNodeSpec> specs(std::vector<std::pair<std::string, std::uint32_t>> nodes) {
    std::vector<CascadeNodeSpec> out;
    for (auto& [name, limit] : nodes) out.push_back({name, guard(clock, limit)});
    return out;
  }
  UniformDraw draw() {
    return [this] { return std::uniform_real_distribution<double>(0, 1)(rng); };
  }
  // `n` calls through `c`, each finished with outcome(node); returns picks per node.
  std::map<std::string, int> run(FallbackCascade& c, int n,
                                 const std::function<CascadeOutcome(const std::string&)>& outcome) {
    std::map<std::string, int> picks;
    for (int i = 0; i < n; ++i) {
      auto lease = c.acquire();
      EXPECT_TRUE(lease.ok()) << lease.refusal().message();
      if (!lease.ok()) break;
      ++picks[lease.value().node()];
      lease.value().finish(outcome(lease.value().node()), milliseconds(2));
    }
    return picks;
  }
};

TEST(FallbackCascade, AFailingNodeStopsBeingPickedAndHealthyOnesShareTheCalls) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 100}, {"b", 100}, {"c", 100}}), f.clock, {}, f.draw());
  // c fails everything: after its first failures it weighs 0 (recent buckets, 0% success).
  f.run(c, 300, [](const std::string& n) {
    return n == "c" ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  });
  const auto picks = f.run(c, 3000, [](const std::string& n) {
    return n == "c" ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  });
  EXPECT_EQ(picks.count("c"), 0u);
  EXPECT_NEAR(picks.at("a"), 1500, 150);
  EXPECT_NEAR(picks.at("b"), 1500, 150);
}

TEST(FallbackCascade, AFastOverloadRefusalCountsAsAFailureNotACheapSuccess) {
  Fixture f;
  auto specs = f.specs({{"a", 100}, {"shedding", 100}});
  const std::shared_ptr<AdaptiveGuard> shedding = specs[1].guard;
  FallbackCascade c(std::move(specs), f.clock, {}, f.draw());
  f.run(c, 200, [](const std::string& n) {
    return n == "shedding" ? CascadeOutcome::kOverload : CascadeOutcome::kSuccess;
  });
  const std::vector<CascadeNodeState> s = c.state();
  const auto& shed = s[1].name == "shedding" ? s[1] : s[0];
  EXPECT_EQ(shed.health.weight, 0);
  EXPECT_GT(shed.buckets.historical[0].finished, 0u);
  EXPECT_EQ(shed.buckets.historical[0].succeeded, 0u);
  // ... and its guard saw every one of them as dropped (an adaptive limit comes down on those).
  EXPECT_EQ(shedding->stats().dropped, shed.buckets.historical[0].finished);
  EXPECT_EQ(shedding->stats().accepted, shed.buckets.historical[0].finished);
}

TEST(FallbackCascade, AFullNodeIsSkippedAndEveryNodeFullFailsFast) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 1}, {"b", 1}}), f.clock, {}, f.draw());
  auto first = c.acquire();
  auto second = c.acquire();
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first.value().node(), second.value().node());  // the first took one, the other left
  auto third = c.acquire();
  EXPECT_FALSE(third.ok());
  EXPECT_EQ(third.refusal().message(), "cascade: every node is at its concurrency limit (2 tried)");
  // Excluding the node a caller already tried.
  first.value().finish(CascadeOutcome::kSuccess);
  const std::string tried[] = {first.value().node()};
  auto retry = c.acquire(tried);
  EXPECT_EQ(retry.refusal().message(),
            "cascade: every node is at its concurrency limit (1 tried, 1 excluded)");
  auto again = c.acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().node(), first.value().node());
}

TEST(FallbackCascade, TheLeaseRecordsOnceAndAnUnfinishedLeaseCountsAsFailed) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 10}}), f.clock, {}, f.draw());
  {
    auto lease = c.acquire();
    ASSERT_TRUE(lease.ok());
    lease.value().finish(CascadeOutcome::kSuccess);
    lease.value().finish(CascadeOutcome::kFailed);  // ignored
    EXPECT_TRUE(lease.value().finished());
  }
  { auto dropped = c.acquire(); }  // destroyed unfinished
  const CascadeNodeState s = c.state().front();
  EXPECT_EQ(s.buckets.historical[0].finished, 2u);
  EXPECT_EQ(s.buckets.historical[0].succeeded, 1u);
  EXPECT_EQ(s.in_flight, 0u);
}

TEST(FallbackCascade, ANodeLastSeenFailingComesBackThroughItsFloorAndIsHealthyAgainSoon) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 1000}, {"b", 1000}, {"c", 1000}}), f.clock, {}, f.draw());
  bool c_bad = true;
  const auto outcome = [&](const std::string& n) {
    return n == "c" && c_bad ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  };
  f.run(c, 200, outcome);
  // 31 s later c's failures have aged out of the 30 s window into its sticky bucket: its weight
  // is the floor (0.0001 / 3), not 0, and not 1e-12.
  f.clock.advance(seconds(31));
  c_bad = false;  // c healed meanwhile
  EXPECT_DOUBLE_EQ(c.state()[2].health.weight, 0.0001 / 3);
  // At a high call rate it is tried again within a few tens of thousands of calls, and its
  // successes then count as recent: healthy.
  int calls = 0;
  while (c.state()[2].health.basis != CascadeHealth::Basis::kRecent && calls < 200'000) {
    f.run(c, 1000, outcome);
    calls += 1000;
  }
  EXPECT_LT(calls, 200'000);
  EXPECT_EQ(c.state()[2].health.success_rate, 1);
}

TEST(FallbackCascade, ANodeSetChangeKeepsKnownNodesAndStartsNewOnesClean) {
  Fixture f;
  auto specs = f.specs({{"a", 10}, {"b", 10}});
  const std::shared_ptr<AdaptiveGuard> b_guard = specs[1].guard;
  FallbackCascade c(std::move(specs), f.clock, {}, f.draw());
  f.run(c, 100, [](const std::string& n) {
    return n == "b" ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  });
  // b weighs 0 now: it is picked only once a is full. Fill a, take b, and remove b while its
  // lease is held; c is added.
  std::vector<CascadeLease> on_a;
  for (int i = 0; i < 10; ++i) {
    auto l = c.acquire();
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l.value().node(), "a");
    on_a.push_back(std::move(l.value()));
  }
  CascadeResult<CascadeLease> held = c.acquire();
  ASSERT_TRUE(held.ok() && held.value().node() == "b");
  c.set_nodes(f.specs({{"a", 10}, {"c", 10}}));
  const std::vector<CascadeNodeState> s = c.state();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "a");
  EXPECT_GT(s[0].buckets.historical[0].finished, 0u);  // kept
  EXPECT_EQ(s[1].health.basis, CascadeHealth::Basis::kCleanSlate);
  // The removed node is parked, its call still counted; its lease finishes into its own guard.
  EXPECT_EQ(s[2].name, "b");
  EXPECT_TRUE(s[2].removed);
  EXPECT_EQ(s[2].in_flight, 1u);
  EXPECT_EQ(c.load().in_flight, 11u);
  EXPECT_EQ(c.load().limit, 20u);  // a removed node's limit is not on offer
  EXPECT_EQ(b_guard->in_flight(), 1u);
  held.value().finish(CascadeOutcome::kSuccess);
  EXPECT_EQ(b_guard->in_flight(), 0u);
}

TEST(FallbackCascade, ANodeAddedBackWhileItsCallsRunIsTheSameNodeAndItsLimitHolds) {
  Fixture f;
  auto specs = f.specs({{"a", 8}, {"b", 8}});
  const std::shared_ptr<AdaptiveGuard> a_guard = specs[0].guard;
  FallbackCascade c(std::move(specs), f.clock, {}, f.draw());
  std::vector<CascadeLease> on_a;
  const std::vector<std::string> not_b = {"b"};
  for (int i = 0; i < 8; ++i) {
    auto l = c.acquire(not_b);
    ASSERT_TRUE(l.ok());
    on_a.push_back(std::move(l.value()));
  }
  on_a.back().finish(CascadeOutcome::kTimeout);  // a failure on its record
  on_a.pop_back();
  auto seventh = c.acquire(not_b);
  ASSERT_TRUE(seventh.ok());
  on_a.push_back(std::move(seventh.value()));
  // Removed, then added back with a new guard of the same limit: the node, its guard, its 8
  // calls and its record are as they were.
  c.set_nodes(f.specs({{"b", 8}}));
  c.set_nodes(f.specs({{"a", 8}, {"b", 8}}));
  EXPECT_EQ(c.guard_of("a"), a_guard);
  EXPECT_EQ(a_guard->in_flight(), 8u);
  const auto refused = c.acquire(not_b);
  EXPECT_FALSE(refused.ok());  // 8 of 8: not 8 more
  EXPECT_FALSE(refused.ok());
  const std::vector<CascadeNodeState> s = c.state();
  ASSERT_EQ(s.size(), 2u);  // no longer parked
  EXPECT_EQ(s[0].in_flight, 8u);
  EXPECT_EQ(s[0].buckets.historical[0].finished, 1u);  // the failure it had
  on_a.clear();                                        // each counts as failed
  EXPECT_EQ(a_guard->in_flight(), 0u);
}

TEST(FallbackCascade, AParkedNodeIsForgottenAStatWindowAfterItsLastCall) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 8}, {"b", 8}}), f.clock, {}, f.draw());
  auto held = c.acquire(std::vector<std::string>{"b"});
  ASSERT_TRUE(held.ok());
  c.set_nodes(f.specs({{"b", 8}}));
  f.clock.advance(seconds(60));  // longer than its window, but its call still runs
  EXPECT_EQ(c.state().size(), 2u);
  held.value().finish(CascadeOutcome::kFailed);
  c.set_nodes(f.specs({{"b", 8}}));  // its last call seen ending: the window starts now
  f.clock.advance(seconds(29));
  EXPECT_EQ(c.state().size(), 2u);
  f.clock.advance(seconds(1));  // 6 buckets of 5 s after
  EXPECT_EQ(c.state().size(), 1u);
  auto fresh = f.specs({{"a", 8}, {"b", 8}});
  const std::shared_ptr<AdaptiveGuard> new_a = fresh[0].guard;
  c.set_nodes(std::move(fresh));
  EXPECT_EQ(c.guard_of("a"), new_a);  // a new node: clean
  EXPECT_EQ(c.state()[0].health.basis, CascadeHealth::Basis::kCleanSlate);
}

TEST(FallbackCascade, ACascadeBuiltToReplaceAnotherTakesOverItsNodes) {
  Fixture f;
  auto specs = f.specs({{"a", 2}, {"b", 2}});
  FallbackCascade old(std::move(specs), f.clock, {}, f.draw());
  std::vector<CascadeLease> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::move(old.acquire().value()));
  FallbackCascadeOptions same_make;
  same_make.revive_every = seconds(1);
  FallbackCascade next(f.specs({{"a", 2}, {"b", 2}}), f.clock, same_make, f.draw(), &old);
  EXPECT_EQ(next.guard_of("a"), old.guard_of("a"));
  EXPECT_EQ(next.load().in_flight, 4u);
  EXPECT_FALSE(next.acquire().ok());  // every call still counted
  // Other buckets: the guards go on, the record starts clean.
  FallbackCascadeOptions other;
  other.stats.buckets = 3;
  held.front().finish(CascadeOutcome::kFailed);
  FallbackCascade rebuilt(f.specs({{"a", 2}, {"b", 2}}), f.clock, other, f.draw(), &old);
  EXPECT_EQ(rebuilt.load().in_flight, 3u);
  for (const CascadeNodeState& s : rebuilt.state())
    EXPECT_EQ(s.health.basis, CascadeHealth::Basis::kCleanSlate) << s.name;
  held.clear();
  EXPECT_EQ(rebuilt.load().in_flight, 0u);
}

TEST(FallbackCascade, ACallThatExcludesEveryNodeIsToldSo) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 8}, {"b", 8}}), f.clock, {}, f.draw());
  const auto r = c.acquire(std::vector<std::string>{"a", "b"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.refusal().message(), "cascade: every node is excluded (0 tried, 2 excluded)");
  auto held = c.acquire(std::vector<std::string>{"b"});
  for (int i = 1; i < 8; ++i) ASSERT_TRUE(c.acquire(std::vector<std::string>{"b"}).ok());
}

// Many dead nodes: revival calls stay within their cap (2% of the calls of the last second, plus
// one a second) and come spread out, not in a burst when the dead nodes' turns come round.
TEST(FallbackCascade, RevivalCallsToManyDeadNodesAreCappedAndSpread) {
  Fixture f;
  std::vector<std::pair<std::string, std::uint32_t>> nodes;
  for (int i = 0; i < 200; ++i) nodes.emplace_back("n" + std::to_string(i), 1000);
  FallbackCascade c(f.specs(nodes), f.clock, {}, f.draw());
  const auto dead = [](const std::string& n) { return std::stoi(n.substr(1)) % 2 == 0; };
  const auto outcome = [&](const std::string& n) {
    return dead(n) ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  };
  // 1,000 calls a second for 40 s; the first 20 s let every dead node's window fill with
  // failures, the last 20 s are measured, per 100 ms.
  int calls = 0, to_dead = 0, worst_slice = 0;
  for (int slice = 0; slice < 400; ++slice) {
    int slice_dead = 0;
    for (const auto& [node, n] : f.run(c, 100, outcome))
      if (dead(node)) slice_dead += n;
    if (slice >= 200) {
      calls += 100;
      to_dead += slice_dead;
      worst_slice = std::max(worst_slice, slice_dead);
    }
    f.clock.advance(milliseconds(100));
  }
  const double share = static_cast<double>(to_dead) / calls;
  EXPECT_LE(share, 0.02 + 0.001 + 0.002) << to_dead << " of " << calls;
  EXPECT_GT(to_dead, 0);  // they are still tried
  // At most the cap's second's worth in 100 ms (21), where 100 dead nodes whose turns came round
  // together would take 100.
  EXPECT_LE(worst_slice, 21);
}

TEST(FallbackCascade, ConcurrentCallersLeakNoPermitAndLoseNoCount) {
  ManualClock clock{seconds(1'000'000)};
  std::vector<CascadeNodeSpec> specs;
  for (const char* n : {"a", "b", "c"}) specs.push_back({n, guard(clock, 4)});
  FallbackCascade c(std::move(specs), clock);
  constexpr int kThreads = 4, kCalls = 20'000;
  std::atomic<int> admitted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        auto lease = c.acquire();
        if (!lease.ok()) {
          ++refused;
          continue;
        }
        ++admitted;
        lease.value().finish((i + t) % 4 == 0 ? CascadeOutcome::kTimeout
                                              : CascadeOutcome::kSuccess);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(admitted + refused, kThreads * kCalls);
  std::uint32_t finished = 0;
  for (const CascadeNodeState& s : c.state()) {
    EXPECT_EQ(s.in_flight, 0u) << s.name;
    finished += s.buckets.historical[0].finished;
  }
  EXPECT_EQ(finished, static_cast<std::uint32_t>(admitted.load()));
}

TEST(FallbackCascade, ANodeAtTheFloorGetsOneRevivalCallPerIntervalAndIsBackSoonAfterItHeals) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 1000}, {"b", 1000}, {"down", 1000}}), f.clock, {}, f.draw());
  bool healed = false;
  const auto outcome = [&](const std::string& n) {
    return n == "down" && !healed ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  };
  // 60 s of an outage at 100 calls a second: once its window shows only failures, `down` gets
  // one call per 5 s (its revival), not one in 60,000 (its floor) and not none.
  int to_down = 0;
  for (int second = 0; second < 60; ++second) {
    to_down += f.run(c, 100, outcome)["down"];
    f.clock.advance(seconds(1));
  }
  EXPECT_LE(to_down, 2 + 60 / 5);
  EXPECT_GE(to_down, 60 / 5);
  EXPECT_EQ(c.state()[2].health.weight, 0);
  // It heals: within one revival interval it has a success on record, and then it is back.
  healed = true;
  int seconds_to_back = 0;
  while (c.state()[2].health.success_rate < 0.5 && seconds_to_back < 30) {
    f.run(c, 100, outcome);
    f.clock.advance(seconds(1));
    ++seconds_to_back;
  }
  EXPECT_LE(seconds_to_back, 5);
  const auto picks = f.run(c, 3000, outcome);
  EXPECT_GT(picks.at("down"), 3000 / 3 / 2);  // at least half a fair share
}

TEST(FallbackCascade, WithoutRevivalAFloorWeightNodeGetsAlmostNothing) {
  Fixture f;
  FallbackCascadeOptions o;
  o.revive_every = Nanos{0};
  FallbackCascade c(f.specs({{"a", 1000}, {"down", 1000}}), f.clock, o, f.draw());
  f.run(c, 100, [](const std::string& n) {
    return n == "down" ? CascadeOutcome::kFailed : CascadeOutcome::kSuccess;
  });
  f.clock.advance(seconds(10));
  EXPECT_EQ(
      f.run(c, 2000, [](const std::string&) { return CascadeOutcome::kSuccess; }).count("down"),
      0u);
}

TEST(FallbackCascade, RepliesMapToOutcomes) {
  EXPECT_EQ(outcome_of_http(200), CascadeOutcome::kSuccess);
  EXPECT_EQ(outcome_of_http(404), CascadeOutcome::kSuccess);  // the node answered
  EXPECT_EQ(outcome_of_http(429), CascadeOutcome::kOverload);
  EXPECT_EQ(outcome_of_http(503), CascadeOutcome::kOverload);
  EXPECT_EQ(outcome_of_http(504), CascadeOutcome::kTimeout);
  EXPECT_EQ(outcome_of_http(408), CascadeOutcome::kTimeout);
  EXPECT_EQ(outcome_of_http(500), CascadeOutcome::kFailed);
  EXPECT_EQ(outcome_of_grpc(0), CascadeOutcome::kSuccess);
  EXPECT_EQ(outcome_of_grpc(3), CascadeOutcome::kSuccess);  // INVALID_ARGUMENT: the caller's
  EXPECT_EQ(outcome_of_grpc(8), CascadeOutcome::kOverload);
  EXPECT_EQ(outcome_of_grpc(14), CascadeOutcome::kOverload);
  EXPECT_EQ(outcome_of_grpc(4), CascadeOutcome::kTimeout);
  EXPECT_EQ(outcome_of_grpc(1), CascadeOutcome::kIgnored);
  EXPECT_EQ(outcome_of_grpc(13), CascadeOutcome::kFailed);
}

TEST(FallbackCascade, AnIgnoredCallCountsNowhere) {
  Fixture f;
  auto specs = f.specs({{"a", 10}});
  const std::shared_ptr<AdaptiveGuard> a = specs[0].guard;
  FallbackCascade c(std::move(specs), f.clock, {}, f.draw());
  auto lease = c.acquire();
  ASSERT_TRUE(lease.ok());
  lease.value().finish(CascadeOutcome::kIgnored);
  EXPECT_EQ(c.state()[0].buckets.historical[0].finished, 0u);
  EXPECT_EQ(a->stats().ignored, 1u);
  EXPECT_EQ(a->in_flight(), 0u);
}

FallbackCascadeOptions with_breaker(std::uint32_t failures) {
  FallbackCascadeOptions o;
  CircuitBreakerOptions b;
  b.failures = failures;
  b.open_for = seconds(5);
  o.breaker = b;
  return o;
}

TEST(FallbackCascade, AnOpenBreakerSkipsItsNodeWithoutTakingAPermit) {
  Fixture f;
  auto specs = f.specs({{"a", 1}, {"down", 5}});
  const std::shared_ptr<AdaptiveGuard> down = specs[1].guard;
  FallbackCascade c(std::move(specs), f.clock, with_breaker(3), f.draw());
  // Hold a's only permit, so every call goes to `down`, which fails fast: 3 in a row open it.
  const std::string not_down[] = {"down"};
  auto on_a = c.acquire(not_down);
  ASSERT_TRUE(on_a.ok());
  ASSERT_EQ(on_a.value().node(), "a");
  while (c.state()[1].breaker->state == BreakerState::kClosed) {
    auto l = c.acquire();
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l.value().node(), "down");
    l.value().finish(CascadeOutcome::kFailed);
  }
  const std::uint64_t accepted = down->stats().accepted;
  EXPECT_EQ(accepted, 3u);
  auto refused = c.acquire();
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(refused.refusal().message(),
            "cascade: every node is at its concurrency limit or open (1 tried, 1 with an open "
            "circuit breaker)");
  EXPECT_EQ(down->stats().accepted, accepted);  // no permit taken, not even tried
  EXPECT_EQ(down->stats().rejected, 0u);
  // After its spell, one probe goes through; it succeeds and the node is back.
  f.clock.advance(seconds(5));
  auto probe = c.acquire();
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ(probe.value().node(), "down");
  EXPECT_TRUE(probe.value().probe());
  EXPECT_FALSE(c.acquire().ok());  // one probe at once
  probe.value().finish(CascadeOutcome::kSuccess);
  EXPECT_EQ(c.state()[1].breaker->state, BreakerState::kClosed);
}

TEST(FallbackCascade, HalfOpenProbesCountAgainstTheNodesLimit) {
  Fixture f;
  FallbackCascadeOptions o = with_breaker(1);
  o.breaker->probes = 5;  // more probes allowed than the node has room for
  auto specs = f.specs({{"n", 2}});
  const std::shared_ptr<AdaptiveGuard> n = specs[0].guard;
  FallbackCascade c(std::move(specs), f.clock, o, f.draw());
  c.acquire().value().finish(CascadeOutcome::kTimeout);  // open
  f.clock.advance(seconds(5));
  auto p1 = c.acquire(), p2 = c.acquire();
  ASSERT_TRUE(p1.ok() && p2.ok());
  EXPECT_TRUE(p1.value().probe() && p2.value().probe());
  EXPECT_EQ(n->in_flight(), 2u);
  // The node's limit, not the breaker's five probes, stops the third.
  EXPECT_EQ(c.acquire().refusal().message(),
            "cascade: every node is at its concurrency limit (1 tried)");
  p1.value().finish(CascadeOutcome::kSuccess);  // closes it
  EXPECT_EQ(c.state()[0].breaker->state, BreakerState::kClosed);
  p2.value().finish(CascadeOutcome::kFailed);
  EXPECT_EQ(c.state()[0].breaker->state, BreakerState::kClosed);  // a stale probe: no vote
  EXPECT_EQ(n->in_flight(), 0u);
}

TEST(FallbackCascade, WithMostBreakersOpenItPanicsAndTheBreakersStopNoCall) {
  Fixture f;
  FallbackCascadeOptions o = with_breaker(1);
  o.revive_every = Nanos{0};
  FallbackCascade c(f.specs({{"a", 10}, {"b", 10}, {"c", 10}}), f.clock, o, f.draw());
  const auto open = [&](const char* node) {
    const std::string others[] = {"a", "b", "c"};
    std::vector<std::string> exclude;
    for (const std::string& n : others)
      if (n != node) exclude.push_back(n);
    c.acquire(exclude).value().finish(CascadeOutcome::kFailed);
  };
  // One of three open: no panic, it is skipped.
  open("a");
  for (int i = 0; i < 50; ++i) {
    auto l = c.acquire();
    EXPECT_NE(l.value().node(), "a");
    l.value().finish(CascadeOutcome::kSuccess);
  }
  // Two of three open (fewer than half closed): a panic. Calls reach open nodes again, and
  // their outcomes reach the buckets but not the breakers.
  open("b");
  const std::vector<CascadeNodeState> before = c.state();
  const std::string only_open[] = {"c"};
  auto l = c.acquire(only_open);
  ASSERT_TRUE(l.ok()) << l.refusal().message();
  const std::string node = l.value().node();
  EXPECT_TRUE(node == "a" || node == "b");
  l.value().finish(CascadeOutcome::kSuccess);
  const std::vector<CascadeNodeState> s = c.state();
  const std::size_t k = node == "a" ? 0 : 1;
  EXPECT_EQ(s[k].breaker->state, BreakerState::kOpen);  // the breaker did not count it
  EXPECT_EQ(s[k].buckets.historical[0].succeeded,
            before[k].buckets.historical[0].succeeded + 1);  // the buckets did
  // panic_below 0: never; every open node is skipped.
  o.panic_below = 0;
  FallbackCascade strict(f.specs({{"a", 10}}), f.clock, o, f.draw());
  strict.acquire().value().finish(CascadeOutcome::kFailed);
  EXPECT_FALSE(strict.acquire().ok());
}

TEST(FallbackCascade, CallWrapsACallableAndByDefaultNeverRetries) {
  Fixture f;
  FallbackCascade c(f.specs({{"a", 10}, {"b", 10}}), f.clock, {}, f.draw());
  int calls = 0;
  CascadeResult<int> reply = c.call(
      [&](std::string_view) {
        ++calls;
        return 503;
      },
      outcome_of_http);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply.value(), 503);  // the reply, as the node gave it
  EXPECT_EQ(calls, 1);
  std::uint32_t dropped = 0;
  for (const CascadeNodeState& s : c.state()) dropped += s.buckets.historical[0].finished;
  EXPECT_EQ(dropped, 1u);
}

TEST(FallbackCascade, RetriesGoToOtherNodesAndStopAtTheRetryBudget) {
  Fixture f;
  FallbackCascadeOptions o;
  o.retry.max_attempts = 3;
  o.retry.budget.ratio = 0.1;
  o.retry.budget.per_second = 0.5;  // 5 retries in the 10 s window on top of 10% of calls
  FallbackCascade c(f.specs({{"a", 10}, {"b", 10}, {"c", 10}}), f.clock, o, f.draw());
  // One call: every node fails: three attempts, on three different nodes.
  std::vector<std::string> nodes;
  CascadeResult<int> r = c.call(
      [&](std::string_view n) {
        nodes.emplace_back(n);
        return 500;
      },
      outcome_of_http);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_NE(nodes[0], nodes[1]);
  EXPECT_NE(nodes[1], nodes[2]);
  EXPECT_NE(nodes[0], nodes[2]);
  // An outage: 100 calls that all fail make at most 10% + 5 retries in all.
  int attempts = 0;
  for (int i = 0; i < 99; ++i)
    (void)c.call(
        [&](std::string_view) {
          ++attempts;
          return 503;
        },
        outcome_of_http);
  EXPECT_EQ(attempts + 3, 100 + 10 + 5);
  // A success is never retried.
  attempts = 0;
  (void)c.call(
      [&](std::string_view) {
        ++attempts;
        return 200;
      },
      outcome_of_http);
  EXPECT_EQ(attempts, 1);
}

}  // namespace
}  // namespace sluice
