// AdaptiveGuard: admission, windowed sampling on a manual clock, outcomes, the external cap,
// an 8-thread stress test and a random-operation property.
#include "sluice/local/adaptive_guard.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "sluice/core/aimd_limit.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/core/gradient2_limit.h"

namespace sluice {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Records every sample the guard feeds it; its limit never changes.
class RecordingLimit final : public LimitAlgorithm {
 public:
  RecordingLimit(std::uint32_t limit, std::vector<LimitSample>* log) : limit_(limit), log_(log) {}
  std::uint32_t update(const LimitSample& s) noexcept override {
    log_->push_back(s);
    return limit_;
  }
  [[nodiscard]] std::uint32_t limit() const noexcept override { return limit_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "recording"; }

 private:
  std::uint32_t limit_;
  std::vector<LimitSample>* log_;
};

// A manual clock that counts how often it is read.
class CountingClock final : public Clock {
 public:
  [[nodiscard]] Nanos now() const noexcept override {
    reads.fetch_add(1, std::memory_order_relaxed);
    return manual.now();
  }
  ManualClock manual;
  mutable std::atomic<int> reads{0};
};

void finish(AdaptiveGuard& g, Outcome outcome, Nanos rtt) {
  auto p = g.acquire();
  ASSERT_TRUE(p.has_value());
  p->release(outcome, rtt);
}
void succeed(AdaptiveGuard& g, Nanos rtt, int times = 1) {
  for (int i = 0; i < times; ++i) finish(g, Outcome::kSuccess, rtt);
}

class AdaptiveGuardTest : public ::testing::Test {
 protected:
  AdaptiveGuard recording_guard(AdaptiveGuardOptions o = {}, std::uint32_t limit = 100) {
    return AdaptiveGuard(std::make_unique<RecordingLimit>(limit, &log_), clock_, o);
  }
  ManualClock clock_;
  std::vector<LimitSample> log_;
};

TEST(AdaptiveGuardOptions, DefaultsMatchTheReferenceWindow) {
  const AdaptiveGuardOptions o;
  EXPECT_EQ(o.min_window_time, seconds(1));
  EXPECT_EQ(o.max_window_time, seconds(1));
  EXPECT_EQ(o.min_rtt_threshold, microseconds(100));
  EXPECT_EQ(o.window_size, 10u);
  EXPECT_EQ(o.window_rtt, WindowRtt::kAverage);
  EXPECT_TRUE(o.validate().empty());
  EXPECT_FALSE(AdaptiveGuardOptions{.min_window_time = Nanos{0}}.validate().empty());
  EXPECT_FALSE(AdaptiveGuardOptions{.max_window_time = milliseconds(1)}.validate().empty());
  EXPECT_FALSE(AdaptiveGuardOptions{.window_size = 0}.validate().empty());
  EXPECT_FALSE(AdaptiveGuardOptions{.percentile = 1.0}.validate().empty());
  EXPECT_FALSE(AdaptiveGuardOptions{.percentile_capacity = 100}.validate().empty());
  EXPECT_FALSE(AdaptiveGuardOptions{.clock_check_interval = 3}.validate().empty());
}

TEST_F(AdaptiveGuardTest, AdmitsWhileBelowTheAlgorithmLimit) {
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 3}), clock_);
  EXPECT_EQ(g.limit(), 3u);
  EXPECT_EQ(g.algorithm_limit(), 3u);
  EXPECT_EQ(g.algorithm_name(), "fixed");
  auto a = g.acquire();
  auto b = g.acquire();
  auto c = g.acquire();
  EXPECT_FALSE(g.acquire().has_value());
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(c->in_flight_at_admission(), 3u);
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.in_flight, 3u);
  EXPECT_EQ(s.accepted, 3u);
  EXPECT_EQ(s.rejected, 1u);
  EXPECT_EQ(s.cap, AdaptiveGuard::kNoCap);
}

TEST_F(AdaptiveGuardTest, WindowNeedsWindowSizeSamples) {
  AdaptiveGuard g = recording_guard();
  succeed(g, milliseconds(1), 9);
  clock_.advance(seconds(2));
  EXPECT_TRUE(log_.empty());
  succeed(g, milliseconds(1));  // the 10th sample completes the (long expired) window
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rtt, milliseconds(1));
  EXPECT_EQ(log_[0].in_flight, 1u);
  EXPECT_FALSE(log_[0].dropped);
  EXPECT_EQ(g.stats().windows, 1u);
}

// Before the window's time is up nothing is fed however many samples arrive; after it, the
// next clock check (window_size, then every clock_check_interval = 8 samples) completes it.
TEST_F(AdaptiveGuardTest, WindowNeedsItsTime) {
  AdaptiveGuard g = recording_guard();
  succeed(g, milliseconds(1), 30);  // checks at 10, 18, 26: too early
  EXPECT_TRUE(log_.empty());
  clock_.advance(seconds(1));
  succeed(g, milliseconds(1), 3);  // 31..33: no check
  EXPECT_TRUE(log_.empty());
  succeed(g, milliseconds(3));  // 34: check, complete
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rtt, Nanos{(33 * 1'000'000 + 3'000'000) / 34});
}

TEST(AdaptiveGuardClock, ReadOnlyWhenAWindowMayBeComplete) {
  CountingClock clock;
  std::vector<LimitSample> log;
  AdaptiveGuard g(std::make_unique<RecordingLimit>(100, &log), clock);
  const int at_start = clock.reads.load();
  succeed(g, milliseconds(1), 9);
  EXPECT_EQ(clock.reads.load(), at_start);  // no release read the clock
  succeed(g, milliseconds(1));
  EXPECT_EQ(clock.reads.load(), at_start + 1);  // the 10th: the window may be complete
  succeed(g, milliseconds(1), 7);
  EXPECT_EQ(clock.reads.load(), at_start + 1);
  succeed(g, milliseconds(1));
  EXPECT_EQ(clock.reads.load(), at_start + 2);  // the 18th
  auto p = g.acquire();
  p->release(Outcome::kIgnored, milliseconds(1));
  EXPECT_EQ(clock.reads.load(), at_start + 2);  // ignored: never
}

TEST_F(AdaptiveGuardTest, SampleIsTheAverageTheMostInFlightAndAnyDrop) {
  AdaptiveGuard g = recording_guard();
  auto a = g.acquire();
  auto b = g.acquire();
  auto c = g.acquire();
  a->release(Outcome::kSuccess, milliseconds(1));
  b->release(Outcome::kSuccess, milliseconds(2));
  c->release(Outcome::kSuccess, milliseconds(3));
  clock_.advance(seconds(1));
  succeed(g, milliseconds(4), 7);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rtt, Nanos{3'400'000});  // (1 + 2 + 3 + 7 * 4) / 10 ms
  EXPECT_EQ(log_[0].in_flight, 3u);
  EXPECT_FALSE(log_[0].dropped);
}

TEST_F(AdaptiveGuardTest, PercentileWindowFeedsThePercentile) {
  AdaptiveGuard g = recording_guard(
      AdaptiveGuardOptions{.window_rtt = WindowRtt::kPercentile, .percentile = 0.9});
  clock_.advance(seconds(1));
  for (int ms = 10; ms >= 1; --ms) succeed(g, milliseconds(ms));
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rtt, milliseconds(9));  // rank round(10 * 0.9) = 9 of 1..10 ms
}

TEST_F(AdaptiveGuardTest, NextWindowLastsTwiceTheSmallestRttWithinBounds) {
  AdaptiveGuard g = recording_guard(AdaptiveGuardOptions{.min_window_time = milliseconds(100),
                                                         .max_window_time = seconds(1),
                                                         .window_size = 1,
                                                         .clock_check_interval = 1});
  clock_.advance(milliseconds(100));
  succeed(g, milliseconds(300));
  ASSERT_EQ(log_.size(), 1u);  // next window: 2 * 300 ms
  clock_.advance(milliseconds(599));
  succeed(g, milliseconds(300));
  EXPECT_EQ(log_.size(), 1u);
  clock_.advance(milliseconds(1));
  succeed(g, milliseconds(300));
  EXPECT_EQ(log_.size(), 2u);  // next window: 2 * 300 ms again
  clock_.advance(milliseconds(600));
  succeed(g, milliseconds(10));
  EXPECT_EQ(log_.size(), 3u);  // next window: 2 * 10 ms, raised to min_window_time
  clock_.advance(milliseconds(99));
  succeed(g, milliseconds(10));
  EXPECT_EQ(log_.size(), 3u);
  clock_.advance(milliseconds(1));
  succeed(g, seconds(5));
  EXPECT_EQ(log_.size(), 4u);  // next window: 10 s, capped at max_window_time
  clock_.advance(seconds(1));
  succeed(g, seconds(5));
  EXPECT_EQ(log_.size(), 5u);
}

TEST_F(AdaptiveGuardTest, RttBelowTheThresholdIsNotASample) {
  AdaptiveGuard g = recording_guard();
  succeed(g, microseconds(99), 20);
  clock_.advance(seconds(2));
  succeed(g, microseconds(99), 20);
  EXPECT_TRUE(log_.empty());
  succeed(g, microseconds(100), 10);  // the threshold itself counts
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rtt, microseconds(100));
}

TEST_F(AdaptiveGuardTest, DropLowersTheLimit) {
  AdaptiveGuard g(std::make_unique<AimdLimit>(AimdOptions{.initial_limit = 20, .min_limit = 1}),
                  clock_);
  clock_.advance(seconds(1));
  finish(g, Outcome::kDropped, Nanos{0});  // a fast failure: no RTT, still a drop
  EXPECT_EQ(g.algorithm_limit(), 18u);
  EXPECT_EQ(g.limit(), 18u);
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.windows, 1u);
}

// A drop before the window's time is reported on time: the window completes at the next
// clock check although it has fewer than window_size samples.
TEST_F(AdaptiveGuardTest, EarlyDropIsReportedWhenTheWindowEnds) {
  AdaptiveGuard g = recording_guard();
  finish(g, Outcome::kDropped, milliseconds(5));
  EXPECT_TRUE(log_.empty());
  clock_.advance(seconds(1));
  succeed(g, milliseconds(1), 6);  // samples 2..7
  EXPECT_TRUE(log_.empty());
  succeed(g, milliseconds(1));  // sample 8: a check, since a drop is waiting
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_TRUE(log_[0].dropped);
  EXPECT_EQ(log_[0].rtt, Nanos{(5'000'000 + 7'000'000) / 8});
}

TEST_F(AdaptiveGuardTest, IgnoredOutcomeDoesNotFeedTheAlgorithm) {
  AdaptiveGuard g = recording_guard();
  for (int i = 0; i < 30; ++i) finish(g, Outcome::kIgnored, milliseconds(1));
  clock_.advance(seconds(2));
  for (int i = 0; i < 30; ++i) finish(g, Outcome::kIgnored, milliseconds(1));
  EXPECT_TRUE(log_.empty());
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.ignored, 60u);
  EXPECT_EQ(s.windows, 0u);
  EXPECT_EQ(s.in_flight, 0u);
  // The ignored calls did not count towards the window either.
  succeed(g, milliseconds(2), 9);
  EXPECT_TRUE(log_.empty());
  succeed(g, milliseconds(2));
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rtt, milliseconds(2));
}

TEST_F(AdaptiveGuardTest, DestroyedPermitIsIgnoredNeverASuccess) {
  AdaptiveGuard g = recording_guard(AdaptiveGuardOptions{.window_size = 1});
  clock_.advance(seconds(1));
  { auto p = g.acquire(); }
  EXPECT_EQ(g.in_flight(), 0u);
  EXPECT_EQ(g.stats().ignored, 1u);
  // Move-assigning over a held permit releases the old one as ignored.
  auto a = g.acquire();
  auto b = g.acquire();
  *a = std::move(*b);
  EXPECT_FALSE(b->held());
  EXPECT_EQ(g.in_flight(), 1u);
  EXPECT_EQ(g.stats().ignored, 2u);
  a.reset();
  EXPECT_EQ(g.in_flight(), 0u);
  EXPECT_EQ(g.stats().ignored, 3u);
  EXPECT_TRUE(log_.empty());
}

TEST_F(AdaptiveGuardTest, ReleaseIsIdempotent) {
  AdaptiveGuard g =
      recording_guard(AdaptiveGuardOptions{.window_size = 1, .clock_check_interval = 1});
  clock_.advance(seconds(1));
  auto keep = g.acquire();
  auto p = g.acquire();
  p->release(Outcome::kDropped, milliseconds(1));
  p->release(Outcome::kSuccess, milliseconds(1));
  p.reset();
  EXPECT_EQ(g.in_flight(), 1u);
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.ignored, 0u);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_TRUE(log_[0].dropped);
}

TEST_F(AdaptiveGuardTest, CapBoundsTheCeiling) {
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 10}), clock_);
  g.set_cap(3);
  EXPECT_EQ(g.limit(), 3u);
  EXPECT_EQ(g.algorithm_limit(), 10u);
  EXPECT_EQ(g.cap(), 3u);
  std::vector<GuardPermit> held;
  for (int i = 0; i < 3; ++i) held.push_back(*g.acquire());
  EXPECT_FALSE(g.acquire().has_value());
  g.set_cap(50);  // above the algorithm: the algorithm binds
  EXPECT_EQ(g.limit(), 10u);
  g.set_cap(AdaptiveGuard::kNoCap);
  EXPECT_EQ(g.limit(), 10u);
  g.set_cap(0);  // a zero share admits nothing
  EXPECT_FALSE(g.acquire().has_value());
}

// A guard held at its cap (a fleet share) is not application-limited: the algorithm sees the
// calls in flight scaled by limit / cap, so "half the limit in flight" means half the cap used.
TEST_F(AdaptiveGuardTest, CappedGuardReportsItsUseOfTheCapScaledToTheLimit) {
  AdaptiveGuard g = recording_guard({}, 100);
  g.set_cap(10);
  std::vector<GuardPermit> held;
  for (int i = 0; i < 8; ++i) held.push_back(*g.acquire());  // 8 of the cap's 10
  for (auto& p : held) p.release(Outcome::kSuccess, milliseconds(2));
  held.clear();
  clock_.advance(seconds(1));
  succeed(g, milliseconds(2), 2);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].in_flight, 80u);  // 8 / 10 of the cap -> 80 / 100 of the limit
  g.set_cap(AdaptiveGuard::kNoCap);   // uncapped: as counted
  for (int i = 0; i < 8; ++i) held.push_back(*g.acquire());
  for (auto& p : held) p.release(Outcome::kSuccess, milliseconds(2));
  clock_.advance(seconds(1));
  succeed(g, milliseconds(2), 2);
  ASSERT_EQ(log_.size(), 2u);
  EXPECT_EQ(log_[1].in_flight, 8u);
}

TEST_F(AdaptiveGuardTest, CapStillBindsAfterTheAlgorithmMoves) {
  AdaptiveGuard g(std::make_unique<AimdLimit>(AimdOptions{.initial_limit = 20, .min_limit = 1}),
                  clock_);
  g.set_cap(5);
  clock_.advance(seconds(1));
  finish(g, Outcome::kDropped, milliseconds(1));
  EXPECT_EQ(g.algorithm_limit(), 18u);
  EXPECT_EQ(g.limit(), 5u);
  g.set_cap(AdaptiveGuard::kNoCap);
  EXPECT_EQ(g.limit(), 18u);
}

TEST_F(AdaptiveGuardTest, LoweringTheCapNeverRevokes) {
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 10}), clock_);
  std::vector<GuardPermit> held;
  for (int i = 0; i < 10; ++i) held.push_back(*g.acquire());
  g.set_cap(4);
  EXPECT_EQ(g.in_flight(), 10u);  // nothing revoked
  EXPECT_FALSE(g.acquire().has_value());
  held.resize(4);
  EXPECT_EQ(g.in_flight(), 4u);
  EXPECT_FALSE(g.acquire().has_value());  // at the cap
  held.pop_back();
  EXPECT_TRUE(g.acquire().has_value());
}

TEST_F(AdaptiveGuardTest, AlgorithmLoweringNeverRevokes) {
  AdaptiveGuard g(std::make_unique<AimdLimit>(AimdOptions{.initial_limit = 20, .min_limit = 1}),
                  clock_);
  std::vector<GuardPermit> held;
  for (int i = 0; i < 20; ++i) held.push_back(*g.acquire());
  clock_.advance(seconds(1));
  held.back().release(Outcome::kDropped, milliseconds(1));
  held.pop_back();
  EXPECT_EQ(g.limit(), 18u);
  EXPECT_EQ(g.in_flight(), 19u);  // above the new ceiling: drains, not revoked
  EXPECT_FALSE(g.acquire().has_value());
  held.resize(17);
  EXPECT_TRUE(g.acquire().has_value());
}

// A renewed permit records its call as a release does (a sample, a drop) and keeps its unit for
// the holder's next call, which is counted accepted; it says whether that call is within the
// ceiling, which a drop can bring below the calls in flight.
TEST_F(AdaptiveGuardTest, RenewRecordsTheCallAndKeepsTheUnit) {
  AdaptiveGuard g = recording_guard(AdaptiveGuardOptions{.window_size = 2});
  auto a = g.acquire();
  auto b = g.acquire();
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->renew(Outcome::kSuccess, milliseconds(3)));
  EXPECT_EQ(g.in_flight(), 2u);
  EXPECT_EQ(a->in_flight_at_admission(), 2u);
  clock_.advance(seconds(1));
  EXPECT_TRUE(b->renew(Outcome::kSuccess, milliseconds(5)));
  ASSERT_EQ(log_.size(), 1u);  // two samples, the window's time up: fed
  EXPECT_EQ(log_[0].rtt, milliseconds(4));
  EXPECT_EQ(log_[0].in_flight, 2u);
  EXPECT_EQ(g.stats().accepted, 4u);  // two admissions and the two calls the renewals carry
  a->release(Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(g.in_flight(), 1u);
  EXPECT_FALSE(a->renew(Outcome::kSuccess, milliseconds(1)));  // released: nothing to renew
  EXPECT_EQ(g.stats().accepted, 4u);
}

TEST_F(AdaptiveGuardTest, RenewSaysWhenTheCeilingCameDownBelowTheCallsInFlight) {
  AdaptiveGuard g(std::make_unique<AimdLimit>(AimdOptions{.initial_limit = 3, .min_limit = 1}),
                  clock_);
  std::vector<GuardPermit> held;
  for (int i = 0; i < 3; ++i) held.push_back(*g.acquire());
  EXPECT_TRUE(held[0].renew(Outcome::kSuccess, milliseconds(1)));  // 3 <= 3
  clock_.advance(seconds(1));
  EXPECT_FALSE(held[1].renew(Outcome::kDropped, milliseconds(1)));  // the limit is now 2
  EXPECT_EQ(g.limit(), 2u);
  EXPECT_EQ(g.in_flight(), 3u);  // kept all the same: never revoked
  EXPECT_EQ(g.stats().dropped, 1u);
  held[2].release(Outcome::kSuccess, milliseconds(1));
  EXPECT_TRUE(held[0].renew(Outcome::kSuccess, milliseconds(1)));  // 2 <= 2 again
}

// Failure mode (b) end to end: a backend that fails every call fast, window after window,
// brings the Gradient2 guard's ceiling down (the reference Gradient2 would keep growing).
TEST_F(AdaptiveGuardTest, SteadyDropsLowerTheGradient2Ceiling) {
  AdaptiveGuard g(
      std::make_unique<Gradient2Limit>(Gradient2Options{.initial_limit = 100, .min_limit = 2}),
      clock_);
  std::uint32_t prev = g.limit();
  for (int window = 0; window < 10; ++window) {
    clock_.advance(seconds(1));
    std::vector<GuardPermit> batch;
    for (int i = 0; i < 10; ++i) batch.push_back(*g.acquire());
    for (auto& p : batch) p.release(Outcome::kDropped, milliseconds(10));
    EXPECT_LT(g.limit(), prev) << "window " << window;
    prev = g.limit();
  }
}

// 8 threads acquire and release against a ceiling that a ninth thread keeps moving with
// set_cap: the number of holders (counted right after admission) never exceeds the largest
// ceiling ever in force, and nothing leaks.
// ---- replace_algorithm (a reconfigured policy) ----

TEST(AdaptiveGuardReplace, LoweringDrainsHeldPermitsAndNeverRevokesThem) {
  ManualClock clock;
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 3}), clock);
  auto a = g.acquire();
  auto b = g.acquire();
  ASSERT_TRUE(a && b);
  g.replace_algorithm(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 1}));
  EXPECT_EQ(g.limit(), 1u);
  EXPECT_EQ(g.algorithm_limit(), 1u);
  EXPECT_EQ(g.in_flight(), 2u);  // still counted
  EXPECT_FALSE(g.acquire());
  a->release(Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(g.in_flight(), 1u);
  EXPECT_FALSE(g.acquire());  // 1 held against 1
  b->release(Outcome::kIgnored, Nanos{0});
  EXPECT_EQ(g.in_flight(), 0u);
  auto c = g.acquire();
  EXPECT_TRUE(c);
  EXPECT_FALSE(g.acquire());
  c->release(Outcome::kSuccess, milliseconds(1));
  EXPECT_EQ(g.in_flight(), 0u);
}

TEST(AdaptiveGuardReplace, RaisingAdmitsAtOnceAndTheCapStillBinds) {
  ManualClock clock;
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 1}), clock);
  auto a = g.acquire();
  ASSERT_TRUE(a);
  EXPECT_FALSE(g.acquire());
  g.replace_algorithm(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 2}));
  auto b = g.acquire();
  EXPECT_TRUE(b);
  g.set_cap(1);
  g.replace_algorithm(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 10}));
  EXPECT_EQ(g.limit(), 1u);  // min(cap, algorithm)
  EXPECT_EQ(g.algorithm_limit(), 10u);
}

TEST_F(AdaptiveGuardTest, ReplacedAlgorithmGetsTheOpenWindowAndTheOldOneNothingMore) {
  AdaptiveGuard g = recording_guard(AdaptiveGuardOptions{.window_size = 2});
  std::vector<LimitSample> next_log;
  succeed(g, milliseconds(5));  // in the open window
  g.replace_algorithm(std::make_unique<RecordingLimit>(7, &next_log));
  EXPECT_EQ(g.limit(), 7u);
  clock_.advance(seconds(1));
  succeed(g, milliseconds(7));  // completes the window
  EXPECT_TRUE(log_.empty());
  ASSERT_EQ(next_log.size(), 1u);
  EXPECT_EQ(next_log[0].rtt, milliseconds(6));  // both samples, averaged
}

// Threads admit and release while another replaces the algorithm over and over (limits 1 and
// 4): holders never exceed 4, the largest limit in force, and every unit comes back.
TEST(AdaptiveGuardReplace, ConcurrentReplacementsNeverOverAdmit) {
  ManualClock clock;
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 4}), clock);
  constexpr int kThreads = 4;
  constexpr int kIterations = 20'000;
  std::atomic<int> holders{0};
  std::atomic<int> most{0};
  std::atomic<bool> stop{false};
  std::thread replacer([&] {
    for (int i = 0; !stop.load(std::memory_order_relaxed); ++i)
      g.replace_algorithm(
          std::make_unique<FixedLimit>(FixedLimitOptions{.limit = i % 2 == 0 ? 1u : 4u}));
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIterations; ++i) {
        auto p = g.acquire();
        if (!p) continue;
        const int now = holders.fetch_add(1) + 1;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        holders.fetch_sub(1);
        p->release(Outcome::kSuccess, milliseconds(1));
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  replacer.join();
  EXPECT_LE(most.load(), 4);
  EXPECT_GE(most.load(), 1);
  EXPECT_EQ(g.in_flight(), 0u);
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.accepted + s.rejected, static_cast<std::uint64_t>(kThreads) * kIterations);
}

TEST(AdaptiveGuardStress, EightThreadsNeverExceedTheCeiling) {
  ManualClock clock;
  AdaptiveGuard g(std::make_unique<FixedLimit>(FixedLimitOptions{.limit = 6}), clock);
  constexpr int kThreads = 8;
  constexpr int kIterations = 20'000;
  std::atomic<int> holders{0};
  std::atomic<bool> violation{false};
  std::atomic<bool> stop{false};
  std::atomic<long> admitted{0};
  std::thread capper([&] {
    const std::uint32_t caps[] = {2, 4, 6, AdaptiveGuard::kNoCap};
    for (int i = 0; !stop.load(std::memory_order_relaxed); ++i) g.set_cap(caps[i % 4]);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        auto p = g.acquire();
        if (!p) continue;
        if (holders.fetch_add(1) + 1 > 6) violation = true;
        admitted.fetch_add(1, std::memory_order_relaxed);
        holders.fetch_sub(1);
        p->release((i + t) % 5 == 0 ? Outcome::kIgnored : Outcome::kSuccess, milliseconds(1));
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  capper.join();
  EXPECT_FALSE(violation.load());
  EXPECT_GT(admitted.load(), 0);
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.accepted, static_cast<std::uint64_t>(admitted.load()));
  EXPECT_EQ(s.accepted + s.rejected, static_cast<std::uint64_t>(kThreads) * kIterations);
}

// 8 threads whose outcomes make an adaptive algorithm move while windows close concurrently
// (the threads themselves advance the clock): the algorithm is only ever updated under the
// try-lock (TSan checks), the ceiling stays within the algorithm's bounds, holders never
// exceed its max_limit, and every unit comes back.
TEST(AdaptiveGuardStress, EightThreadsWithConcurrentWindowCloses) {
  ManualClock clock;
  AdaptiveGuard g(
      std::make_unique<AimdLimit>(AimdOptions{.initial_limit = 8, .min_limit = 2, .max_limit = 8}),
      clock,
      AdaptiveGuardOptions{.min_window_time = milliseconds(1),
                           .max_window_time = milliseconds(1),
                           .window_size = 4,
                           .clock_check_interval = 1});
  constexpr int kThreads = 8;
  constexpr int kIterations = 20'000;
  std::atomic<int> holders{0};
  std::atomic<bool> violation{false};
  std::atomic<long> drops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        if (i % 16 == 0) clock.advance(microseconds(250));
        auto p = g.acquire();
        if (!p) continue;
        if (holders.fetch_add(1) + 1 > 8) violation = true;
        if (p->in_flight_at_admission() > 8) violation = true;
        holders.fetch_sub(1);
        if ((i * 7 + t) % 97 == 0) {
          drops.fetch_add(1, std::memory_order_relaxed);
          p->release(Outcome::kDropped, milliseconds(2));
        } else {
          p->release(Outcome::kSuccess, milliseconds(2));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(violation.load());
  const AdaptiveGuardStats s = g.stats();
  EXPECT_EQ(s.in_flight, 0u);
  EXPECT_EQ(s.dropped, static_cast<std::uint64_t>(drops.load()));
  EXPECT_GT(s.windows, 0u);
  EXPECT_GE(s.algorithm_limit, 2u);
  EXPECT_LE(s.algorithm_limit, 8u);
  EXPECT_EQ(s.limit, s.algorithm_limit);
}

// Random acquire / release(outcome) / renew(outcome) / advance / set_cap sequences: an acquire
// succeeds exactly when in_flight < min(cap, algorithm limit), a renewal keeps the unit and says
// whether in_flight <= that min; the ceiling always equals that min; the algorithm limit stays
// in its bounds; counters match; nothing leaks.
RC_GTEST_PROP(AdaptiveGuardProperty, AdmitsExactlyBelowTheCeilingAndNeverLeaks, ()) {
  ManualClock clock;
  const auto initial = *rc::gen::inRange<std::uint32_t>(1, 31);
  AdaptiveGuard g(std::make_unique<AimdLimit>(
                      AimdOptions{.initial_limit = initial, .min_limit = 1, .max_limit = 30}),
                  clock,
                  AdaptiveGuardOptions{.min_window_time = milliseconds(1),
                                       .max_window_time = milliseconds(10),
                                       .window_size = *rc::gen::inRange<std::uint32_t>(1, 6),
                                       .clock_check_interval = 1});
  std::vector<GuardPermit> held;
  std::uint32_t cap = AdaptiveGuard::kNoCap;
  std::uint64_t accepted = 0, rejected = 0, dropped = 0, ignored = 0;
  const auto ops = *rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 8));
  for (int op : ops) {
    if (op == 0 || op == 1) {
      const std::uint32_t before = g.in_flight();
      const std::uint32_t ceiling = std::min(cap, g.algorithm_limit());
      auto p = g.acquire();
      RC_ASSERT(p.has_value() == (before < ceiling));
      if (p) {
        ++accepted;
        held.push_back(std::move(*p));
      } else {
        ++rejected;
      }
    } else if (op >= 2 && op <= 4 && !held.empty()) {
      const auto idx = *rc::gen::inRange<std::size_t>(0, held.size());
      const Outcome outcome = op == 2   ? Outcome::kSuccess
                              : op == 3 ? Outcome::kDropped
                                        : Outcome::kIgnored;
      if (outcome == Outcome::kDropped) ++dropped;
      if (outcome == Outcome::kIgnored) ++ignored;
      held[idx].release(outcome, Nanos{*rc::gen::inRange<std::int64_t>(0, 5'000'000)});
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(idx));
    } else if (op == 5) {
      clock.advance(Nanos{*rc::gen::inRange<std::int64_t>(0, 20'000'000)});
    } else if (op == 6) {
      cap = *rc::gen::element<std::uint32_t>(0u, 3u, 10u, 40u, AdaptiveGuard::kNoCap);
      g.set_cap(cap);
    } else if (op == 7 && !held.empty()) {
      const auto idx = *rc::gen::inRange<std::size_t>(0, held.size());
      const Outcome outcome =
          *rc::gen::element(Outcome::kSuccess, Outcome::kDropped, Outcome::kIgnored);
      if (outcome == Outcome::kDropped) ++dropped;
      if (outcome == Outcome::kIgnored) ++ignored;
      ++accepted;
      const bool within =
          held[idx].renew(outcome, Nanos{*rc::gen::inRange<std::int64_t>(0, 5'000'000)});
      RC_ASSERT(within == (g.in_flight() <= std::min(cap, g.algorithm_limit())));
      RC_ASSERT(held[idx].held());
    }
    RC_ASSERT(g.limit() == std::min(cap, g.algorithm_limit()));
    RC_ASSERT(g.algorithm_limit() >= 1u);
    RC_ASSERT(g.algorithm_limit() <= 30u);
    RC_ASSERT(g.in_flight() == held.size());
  }
  ignored += held.size();
  held.clear();
  const AdaptiveGuardStats s = g.stats();
  RC_ASSERT(s.in_flight == 0u);
  RC_ASSERT(s.accepted == accepted);
  RC_ASSERT(s.rejected == rejected);
  RC_ASSERT(s.dropped == dropped);
  RC_ASSERT(s.ignored == ignored);
}

}  // namespace
}  // namespace sluice
