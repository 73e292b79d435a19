// The circuit breaker (sluice/local/circuit_breaker.h) on a manual clock: failures in a row open
// it, an open breaker refuses until its spell is over, half-open lets `probes` calls through at
// once, a probe success closes it and a probe failure reopens it for twice as long (capped),
// stale tickets count for nothing, and concurrent callers never take more probes than allowed.
#include "sluice/local/circuit_breaker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace sluice {
namespace {

using std::chrono::seconds;
using Kind = CircuitBreaker::Ticket::Kind;
using Result = CircuitBreaker::Result;

CircuitBreakerOptions options(std::uint32_t failures = 3, std::uint32_t probes = 1,
                              std::uint32_t successes = 1) {
  CircuitBreakerOptions o;
  o.failures = failures;
  o.open_for = seconds(5);
  o.max_open_for = seconds(12);
  o.probes = probes;
  o.successes = successes;
  return o;
}

void fail(CircuitBreaker& b, Nanos now, int n = 1) {
  for (int i = 0; i < n; ++i) b.finish(b.enter(now), Result::kFailure, now);
}

TEST(CircuitBreaker, OptionsAreCheckedByName) {
  EXPECT_EQ(circuit_breaker_error(options()), "");
  CircuitBreakerOptions o = options();
  o.failures = 0;
  EXPECT_EQ(circuit_breaker_error(o), "failures: must be at least 1");
  o = options();
  o.max_open_for = seconds(1);
  EXPECT_EQ(circuit_breaker_error(o), "max_open_for: must be at least open_for");
  o = options();
  o.probes = 0;
  EXPECT_EQ(circuit_breaker_error(o), "probes: must be at least 1");
  o = options();
  o.open_for = Nanos{0};
  EXPECT_EQ(circuit_breaker_error(o), "open_for: must be more than 0");
}

TEST(CircuitBreaker, FailuresInARowOpenItAndASuccessBetweenResetsTheCount) {
  CircuitBreaker b(options(3));
  const Nanos t = seconds(100);
  fail(b, t, 2);
  b.finish(b.enter(t), Result::kSuccess, t);  // the run is broken
  fail(b, t, 2);
  EXPECT_EQ(b.snapshot(t).state, BreakerState::kClosed);
  EXPECT_EQ(b.snapshot(t).failures_in_a_row, 2u);
  b.finish(b.enter(t), Result::kNeutral, t);  // says nothing: the run goes on
  fail(b, t);
  EXPECT_EQ(b.snapshot(t).state, BreakerState::kOpen);
  EXPECT_EQ(b.snapshot(t).opened, 1u);
  EXPECT_EQ(b.snapshot(t).reopens_in, seconds(5));
}

TEST(CircuitBreaker, OpenRefusesUntilItsSpellIsOverThenLetsOneProbeThrough) {
  CircuitBreaker b(options(1));
  fail(b, seconds(100));
  EXPECT_FALSE(b.enter(seconds(104)).admitted());
  const CircuitBreaker::Ticket probe = b.enter(seconds(105));
  EXPECT_EQ(probe.kind, Kind::kProbe);
  EXPECT_EQ(b.snapshot(seconds(105)).state, BreakerState::kHalfOpen);
  EXPECT_FALSE(b.enter(seconds(105)).admitted());  // one probe at a time
  b.finish(probe, Result::kSuccess, seconds(106));
  EXPECT_EQ(b.snapshot(seconds(106)).state, BreakerState::kClosed);
  EXPECT_EQ(b.enter(seconds(106)).kind, Kind::kNormal);
}

TEST(CircuitBreaker, AFailedProbeReopensForTwiceAsLongUpToTheCap) {
  CircuitBreaker b(options(1));
  fail(b, seconds(100));  // open 5 s
  b.finish(b.enter(seconds(105)), Result::kFailure, seconds(105));
  EXPECT_EQ(b.snapshot(seconds(105)).reopens_in, seconds(10));
  EXPECT_FALSE(b.enter(seconds(114)).admitted());
  b.finish(b.enter(seconds(115)), Result::kFailure, seconds(115));
  EXPECT_EQ(b.snapshot(seconds(115)).reopens_in, seconds(12));  // 20 s, capped at 12
  // Once closed, the next trip starts from open_for again.
  b.finish(b.enter(seconds(127)), Result::kSuccess, seconds(127));
  fail(b, seconds(200));
  EXPECT_EQ(b.snapshot(seconds(200)).reopens_in, seconds(5));
  EXPECT_EQ(b.snapshot(seconds(200)).opened, 4u);
}

TEST(CircuitBreaker, ProbesAreLimitedCancelledProbesGiveTheirPlaceBackAndSuccessesClose) {
  CircuitBreaker b(options(1, /*probes=*/2, /*successes=*/2));
  fail(b, seconds(100));
  const Nanos t = seconds(105);
  const auto p1 = b.enter(t), p2 = b.enter(t);
  EXPECT_TRUE(p1.admitted() && p2.admitted());
  EXPECT_FALSE(b.enter(t).admitted());
  b.cancel(p2);  // not made (the node had no room)
  const auto p3 = b.enter(t);
  EXPECT_EQ(p3.kind, Kind::kProbe);
  b.finish(p1, Result::kSuccess, t);
  EXPECT_EQ(b.snapshot(t).state, BreakerState::kHalfOpen);  // 1 of 2
  b.finish(p3, Result::kNeutral, t);                        // gives its place back, no vote
  const auto p4 = b.enter(t);
  ASSERT_EQ(p4.kind, Kind::kProbe);
  b.finish(p4, Result::kSuccess, t);
  EXPECT_EQ(b.snapshot(t).state, BreakerState::kClosed);
}

TEST(CircuitBreaker, StaleTicketsCountForNothing) {
  CircuitBreaker b(options(2));
  const Nanos t = seconds(100);
  const auto early = b.enter(t);  // let through while closed, finishes late
  fail(b, t, 2);                  // open
  b.finish(early, Result::kFailure, t);
  EXPECT_EQ(b.snapshot(t).opened, 1u);
  const auto probe = b.enter(seconds(105));
  b.finish(early, Result::kSuccess, seconds(105));  // no vote while half-open
  EXPECT_EQ(b.snapshot(seconds(105)).state, BreakerState::kHalfOpen);
  b.finish(probe, Result::kSuccess, seconds(105));
  // A probe of a spell that is over (closed since) is no vote either.
  b.finish(probe, Result::kFailure, seconds(106));
  EXPECT_EQ(b.snapshot(seconds(106)).state, BreakerState::kClosed);
}

TEST(CircuitBreaker, ConcurrentCallersNeverHoldMoreProbesThanAllowed) {
  CircuitBreaker b(options(1, /*probes=*/3));
  fail(b, seconds(100));
  std::atomic<int> holding{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20'000; ++i) {
        const auto ticket = b.enter(seconds(200));
        if (!ticket.admitted()) continue;
        const int h = ++holding;
        int m = most.load();
        while (h > m && !most.compare_exchange_weak(m, h)) {
        }
        --holding;
        b.finish(ticket, Result::kNeutral, seconds(200));
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_GE(most.load(), 1);
  EXPECT_LE(most.load(), 3);
  EXPECT_EQ(b.snapshot(seconds(200)).state, BreakerState::kHalfOpen);
}

}  // namespace
}  // namespace sluice
