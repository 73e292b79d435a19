// Unit tests for every update rule, clamp and default of the limit algorithms, plus a property
// over random sample streams. The three failure-mode fixes have their own file
// (limit_failure_modes_test.cpp).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "core/epoch_min.h"
#include "sluice/core/aimd_limit.h"
#include "sluice/core/algorithm_spec.h"
#include "sluice/core/fixed_limit.h"
#include "sluice/core/gradient2_limit.h"
#include "sluice/core/vegas_limit.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;

LimitSample ok(Nanos rtt, std::uint32_t in_flight) { return {rtt, in_flight, false}; }
LimitSample drop(Nanos rtt, std::uint32_t in_flight) { return {rtt, in_flight, true}; }

// ---- EpochMin ----

TEST(LimitEpochMin, RemembersOneToTwoEpochs) {
  double prev = kEpochMinEmpty;
  double cur = kEpochMinEmpty;
  EpochMin m(prev, cur);
  EXPECT_TRUE(m.empty());
  EXPECT_TRUE(m.add(5.0));  // first sample lowers
  EXPECT_FALSE(m.add(7.0));
  EXPECT_EQ(m.get(), 5.0);
  m.rotate();
  EXPECT_EQ(m.get(), 5.0);  // previous epoch still counts
  EXPECT_FALSE(m.add(9.0));
  m.rotate();
  EXPECT_EQ(m.get(), 9.0);  // 5 aged out after two rotations
  EXPECT_TRUE(m.add(3.0));
  EXPECT_EQ(m.get(), 3.0);
}

TEST(LimitEpochMin, ViewsShareTheOwnersState) {
  double prev = kEpochMinEmpty;
  double cur = kEpochMinEmpty;
  EpochMin(prev, cur).add(4.0);
  EpochMin(prev, cur).rotate();
  EXPECT_EQ(prev, 4.0);
  EXPECT_EQ(cur, kEpochMinEmpty);
  const double& const_prev = prev;
  const double& const_cur = cur;
  const EpochMin reader(const_prev, const_cur);  // EpochMin<const double>: reads only
  EXPECT_EQ(reader.get(), 4.0);
  EXPECT_FALSE(reader.empty());
}

// ---- FixedLimit ----

TEST(FixedLimit, NeverChanges) {
  FixedLimit f(FixedLimitOptions{.limit = 7});
  EXPECT_EQ(f.limit(), 7u);
  EXPECT_EQ(f.update(drop(milliseconds(1), 7)), 7u);
  EXPECT_EQ(f.update(ok(milliseconds(1), 7)), 7u);
  EXPECT_EQ(f.name(), "fixed");
  EXPECT_EQ(FixedLimit().limit(), 20u);
}

// ---- AimdLimit ----

TEST(AimdLimit, DefaultsMatchTheReference) {
  const AimdOptions o;
  EXPECT_EQ(o.initial_limit, 20u);
  EXPECT_EQ(o.min_limit, 20u);
  EXPECT_EQ(o.max_limit, 200u);
  EXPECT_DOUBLE_EQ(o.backoff_ratio, 0.9);
  EXPECT_EQ(o.timeout, std::chrono::seconds(5));
  EXPECT_TRUE(o.validate().empty());
  AimdLimit a;
  EXPECT_EQ(a.limit(), 20u);
  EXPECT_EQ(a.name(), "aimd");
}

TEST(AimdLimit, GrowsByOneWhileHalfTheLimitIsInUse) {
  AimdLimit a;
  EXPECT_EQ(a.update(ok(milliseconds(5), 10)), 21u);  // 2 * 10 >= 20
  EXPECT_EQ(a.update(ok(milliseconds(5), 21)), 22u);
}

TEST(AimdLimit, HoldsWhenAppLimited) {
  AimdLimit a;
  EXPECT_EQ(a.update(ok(milliseconds(5), 9)), 20u);  // 2 * 9 < 20
}

TEST(AimdLimit, DropBacksOffMultiplicatively) {
  AimdLimit a(AimdOptions{.initial_limit = 100, .min_limit = 1});
  EXPECT_EQ(a.update(drop(milliseconds(5), 100)), 90u);
  EXPECT_EQ(a.update(drop(milliseconds(5), 100)), 81u);
}

TEST(AimdLimit, RttAboveTimeoutCountsAsADrop) {
  AimdLimit a(AimdOptions{.initial_limit = 100, .min_limit = 1, .timeout = milliseconds(50)});
  EXPECT_EQ(a.update(ok(milliseconds(50), 100)), 101u);  // at the timeout: not a drop
  EXPECT_EQ(a.update(ok(milliseconds(51), 100)), 90u);
}

TEST(AimdLimit, DropLowersEvenTinyLimitsByAtLeastOne) {
  AimdLimit a(AimdOptions{.initial_limit = 5, .min_limit = 1});
  for (std::uint32_t expected : {4u, 3u, 2u, 1u, 1u})
    EXPECT_EQ(a.update(drop(milliseconds(1), 5)), expected);
}

TEST(AimdLimit, ClampsToMinAndMax) {
  AimdLimit a(AimdOptions{.initial_limit = 21, .min_limit = 20, .max_limit = 22});
  EXPECT_EQ(a.update(ok(milliseconds(1), 30)), 22u);
  EXPECT_EQ(a.update(ok(milliseconds(1), 30)), 22u);
  EXPECT_EQ(a.update(drop(milliseconds(1), 30)), 20u);  // floor(22 * 0.9) = 19 -> 20
  EXPECT_EQ(a.update(drop(milliseconds(1), 30)), 20u);
}

TEST(AimdLimit, ValidateRejectsAndConstructorRepairs) {
  EXPECT_FALSE((AimdOptions{.backoff_ratio = 1.0}.validate().empty()));
  EXPECT_FALSE((AimdOptions{.backoff_ratio = 0.4}.validate().empty()));
  EXPECT_FALSE((AimdOptions{.min_limit = 30, .max_limit = 10}.validate().empty()));
  EXPECT_FALSE((AimdOptions{.initial_limit = 5}.validate().empty()));
  EXPECT_FALSE(AimdOptions{.timeout = Nanos{0}}.validate().empty());
  AimdLimit a(AimdOptions{.initial_limit = 500, .backoff_ratio = 2.0});
  EXPECT_EQ(a.limit(), 200u);                           // initial clamped into [20, 200]
  EXPECT_EQ(a.update(drop(milliseconds(1), 1)), 180u);  // ratio repaired to 0.9
}

// ---- VegasLimit ----

TEST(VegasLimit, DefaultsMatchTheReference) {
  const VegasOptions o;
  EXPECT_EQ(o.initial_limit, 20u);
  EXPECT_EQ(o.min_limit, 1u);
  EXPECT_EQ(o.max_limit, 1000u);
  EXPECT_DOUBLE_EQ(o.smoothing, 1.0);
  EXPECT_EQ(o.probe_multiplier, 30u);
  EXPECT_TRUE(o.validate().empty());
  VegasLimit v;
  EXPECT_EQ(v.limit(), 20u);
  EXPECT_EQ(v.rtt_noload(), Nanos{0});
  EXPECT_EQ(v.name(), "vegas");
}

// A VegasLimit whose baseline is 10 ms (set by a first sample, which changes nothing else).
VegasLimit vegas_with_baseline(VegasOptions o = {}) {
  VegasLimit v(o);
  EXPECT_EQ(v.update(ok(milliseconds(10), o.initial_limit)), o.initial_limit);
  EXPECT_EQ(v.rtt_noload(), milliseconds(10));
  return v;
}

TEST(VegasLimit, FirstRttSetsTheBaselineOnly) {
  VegasLimit v;
  EXPECT_EQ(v.update(ok(milliseconds(10), 20)), 20u);
  EXPECT_EQ(v.rtt_noload(), milliseconds(10));
  EXPECT_EQ(v.update(ok(milliseconds(8), 20)), 20u);  // a new minimum: baseline only
  EXPECT_EQ(v.rtt_noload(), milliseconds(8));
}

TEST(VegasLimit, NoQueueingGrowsByBeta) {
  VegasLimit v = vegas_with_baseline();
  // queue = ceil(20 * (1 - 10/10)) = 0 <= f(20) = 1: L + 6 f
  EXPECT_EQ(v.update(ok(milliseconds(10), 20)), 26u);
}

TEST(VegasLimit, LightQueueingGrowsByStep) {
  VegasLimit v = vegas_with_baseline();
  // rtt = 10.8 ms: queue = ceil(20 * 0.0741) = 2, between f = 1 and alpha = 3: L + f
  EXPECT_EQ(v.update(ok(Nanos{10'800'000}, 20)), 21u);
}

TEST(VegasLimit, SweetSpotHolds) {
  VegasLimit v = vegas_with_baseline();
  // rtt = 12.5 ms: queue = ceil(20 * 0.2) = 4, within [alpha = 3, beta = 6]
  EXPECT_EQ(v.update(ok(Nanos{12'500'000}, 20)), 20u);
}

TEST(VegasLimit, HeavyQueueingShrinksByStep) {
  VegasLimit v = vegas_with_baseline();
  // rtt = 20 ms: queue = 10 > beta = 6: L - f
  EXPECT_EQ(v.update(ok(milliseconds(20), 20)), 19u);
}

TEST(VegasLimit, AppLimitedHolds) {
  VegasLimit v = vegas_with_baseline();
  EXPECT_EQ(v.update(ok(milliseconds(10), 9)), 20u);  // 2 * 9 < 20
}

TEST(VegasLimit, DropShrinksByStep) {
  VegasLimit v = vegas_with_baseline();
  EXPECT_EQ(v.update(drop(milliseconds(10), 20)), 19u);
  EXPECT_EQ(v.update(drop(Nanos{0}, 0)), 18u);  // no RTT, app-limited: still backs off
}

TEST(VegasLimit, StepIsLog10AtEveryLimit) {
  VegasLimit hundred = vegas_with_baseline(VegasOptions{.initial_limit = 100});
  EXPECT_EQ(hundred.update(ok(milliseconds(10), 100)), 112u);  // f = 2: + 6 * 2
  // From a thousand on the step stays floor(log10 L), as the reference's: f(1000) = 3,
  // f(12000) = 4 (not floor(sqrt L), which would be 31 and 109).
  VegasLimit thousand = vegas_with_baseline(VegasOptions{.initial_limit = 1000, .max_limit = 5000});
  EXPECT_EQ(thousand.update(ok(milliseconds(10), 1000)), 1018u);    // + 6 * 3
  EXPECT_EQ(thousand.update(drop(milliseconds(10), 1018)), 1015u);  // - 3
  VegasLimit big = vegas_with_baseline(VegasOptions{.initial_limit = 12000, .max_limit = 20000});
  EXPECT_EQ(big.update(ok(milliseconds(20), 12000)), 11996u);  // queue 6000 > beta 24: - 4
  EXPECT_EQ(big.update(ok(milliseconds(10), 11996)), 12020u);  // no queue: + 6 * 4
}

TEST(VegasLimit, SmoothingBlendsTheNewEstimate) {
  VegasLimit v = vegas_with_baseline(VegasOptions{.smoothing = 0.5});
  EXPECT_EQ(v.update(ok(milliseconds(10), 20)), 23u);  // 0.5 * 20 + 0.5 * 26
}

TEST(VegasLimit, ClampsToMinAndMax) {
  VegasLimit v = vegas_with_baseline(VegasOptions{.initial_limit = 20, .max_limit = 24});
  EXPECT_EQ(v.update(ok(milliseconds(10), 20)), 24u);
  VegasLimit low = vegas_with_baseline(VegasOptions{.initial_limit = 2, .min_limit = 2});
  EXPECT_EQ(low.update(drop(milliseconds(10), 2)), 2u);
}

TEST(VegasLimit, ValidateRejectsAndConstructorRepairs) {
  EXPECT_FALSE(VegasOptions{.min_limit = 0}.validate().empty());
  EXPECT_FALSE(VegasOptions{.smoothing = 0.0}.validate().empty());
  EXPECT_FALSE(VegasOptions{.probe_multiplier = 0}.validate().empty());
  EXPECT_FALSE(VegasOptions{.initial_limit = 2000}.validate().empty());
  VegasLimit v(VegasOptions{.initial_limit = 0, .min_limit = 0});
  EXPECT_EQ(v.limit(), 1u);
}

// ---- Gradient2Limit ----

TEST(Gradient2Limit, DefaultsMatchTheReference) {
  const Gradient2Options o;
  EXPECT_EQ(o.initial_limit, 20u);
  EXPECT_EQ(o.min_limit, 20u);
  EXPECT_EQ(o.max_limit, 200u);
  EXPECT_DOUBLE_EQ(o.smoothing, 0.2);
  EXPECT_EQ(o.queue_size, 4u);
  EXPECT_EQ(o.long_window, 600u);
  EXPECT_DOUBLE_EQ(o.rtt_tolerance, 1.5);
  // sluice additions
  EXPECT_DOUBLE_EQ(o.drop_backoff_ratio, 0.9);
  EXPECT_EQ(o.baseline_window, 200u);
  EXPECT_TRUE(o.validate().empty());
  Gradient2Limit g;
  EXPECT_EQ(g.limit(), 20u);
  EXPECT_EQ(g.name(), "gradient2");
}

TEST(Gradient2Limit, SteadyRttGrowsBySmoothedQueueSize) {
  Gradient2Limit g;
  // Each sample: L' = 0.8 L + 0.2 (L + 4) = L + 0.8.
  for (int i = 0; i < 10; ++i) g.update(ok(milliseconds(10), 200));
  EXPECT_EQ(g.limit(), 28u);
}

TEST(Gradient2Limit, QueueingShrinksInProportionToTheGradient) {
  Gradient2Limit g(Gradient2Options{.initial_limit = 100, .min_limit = 1});
  g.update(ok(milliseconds(10), 1));  // baseline 10 ms (app-limited: no change)
  ASSERT_EQ(g.limit(), 100u);
  // rtt 20 ms: gradient = 1.5 * 10 / 20 = 0.75; L' = 0.8 * 100 + 0.2 * 75 = 95
  EXPECT_EQ(g.update(ok(milliseconds(20), 100)), 95u);
}

TEST(Gradient2Limit, GradientIsFlooredAtOneHalf) {
  Gradient2Limit g(Gradient2Options{.initial_limit = 100, .min_limit = 1});
  g.update(ok(milliseconds(10), 1));
  // rtt 1 s: gradient would be 0.015; floored at 0.5: L' = 0.8 * 100 + 0.2 * 50 = 90
  EXPECT_EQ(g.update(ok(std::chrono::seconds(1), 100)), 90u);
}

TEST(Gradient2Limit, AppLimitedHolds) {
  Gradient2Limit g(Gradient2Options{.initial_limit = 100, .min_limit = 1});
  g.update(ok(milliseconds(10), 1));
  EXPECT_EQ(g.update(ok(milliseconds(100), 49)), 100u);  // 49 < 100 / 2
}

TEST(Gradient2Limit, DropBacksOffWithoutSmoothingDownToMin) {
  Gradient2Limit g(Gradient2Options{.initial_limit = 100, .min_limit = 80});
  EXPECT_EQ(g.update(drop(milliseconds(10), 100)), 90u);
  EXPECT_EQ(g.update(drop(milliseconds(10), 100)), 81u);
  EXPECT_EQ(g.update(drop(milliseconds(10), 100)), 80u);
}

TEST(Gradient2Limit, LongRttIsAMeanDuringWarmupThenAnEma) {
  Gradient2Limit g;
  g.update(ok(milliseconds(10), 1));
  g.update(ok(milliseconds(20), 1));
  EXPECT_EQ(g.long_rtt(), milliseconds(15));
  for (int i = 0; i < 8; ++i) g.update(ok(milliseconds(15), 1));
  EXPECT_EQ(g.long_rtt(), milliseconds(15));
  g.update(ok(milliseconds(16), 1));  // EMA factor 2 / 601
  EXPECT_NEAR(static_cast<double>(g.long_rtt().count()), 15e6 + 1e6 * 2.0 / 601.0, 2.0);
}

TEST(Gradient2Limit, WarmupIsThePlainMeanOfTheRawRttsEvenAfterADecay) {
  using std::chrono::microseconds;
  Gradient2Limit g(Gradient2Options{.long_window = 9});  // EMA factor 2 / 10 = 0.2
  g.update(ok(microseconds(100), 1));
  g.update(ok(microseconds(1000), 1));
  EXPECT_EQ(g.long_rtt(), microseconds(550));
  g.update(ok(microseconds(100), 1));  // mean 400 > 2 * 100: decays to 380
  EXPECT_EQ(g.long_rtt(), microseconds(380));
  g.update(ok(microseconds(100), 1));  // mean of the four: 325, > 200: decays to 308.75
  EXPECT_EQ(g.long_rtt(), Nanos{308'750});
  for (int i = 0; i < 6; ++i) g.update(ok(microseconds(400), 1));
  EXPECT_EQ(g.long_rtt(), microseconds(370));  // (100 + 1000 + 100 + 100 + 6 * 400) / 10
  g.update(ok(microseconds(400), 1));          // then the EMA: 0.8 * 370 + 0.2 * 400
  EXPECT_EQ(g.long_rtt(), microseconds(376));
}

TEST(Gradient2Limit, LongRttDecaysFastWhenTwiceTheCurrentRtt) {
  Gradient2Limit g;
  for (int i = 0; i < 10; ++i) g.update(ok(milliseconds(100), 1));
  g.update(ok(milliseconds(10), 1));
  const double ema = 100e6 * (1 - 2.0 / 601.0) + 10e6 * 2.0 / 601.0;
  EXPECT_NEAR(static_cast<double>(g.long_rtt().count()), ema * 0.95, 2.0);
}

TEST(Gradient2Limit, ClampsToMax) {
  Gradient2Limit g(Gradient2Options{.initial_limit = 20, .max_limit = 21});
  for (int i = 0; i < 5; ++i) g.update(ok(milliseconds(10), 100));
  EXPECT_EQ(g.limit(), 21u);
}

TEST(Gradient2Limit, ValidateRejectsAndConstructorRepairs) {
  EXPECT_FALSE(Gradient2Options{.smoothing = 1.5}.validate().empty());
  EXPECT_FALSE(Gradient2Options{.rtt_tolerance = 0.9}.validate().empty());
  EXPECT_FALSE(Gradient2Options{.drop_backoff_ratio = 1.0}.validate().empty());
  EXPECT_FALSE(Gradient2Options{.baseline_window = 1}.validate().empty());
  EXPECT_FALSE(Gradient2Options{.min_limit = 300}.validate().empty());
  Gradient2Limit g(Gradient2Options{.initial_limit = 1000});
  EXPECT_EQ(g.limit(), 200u);
}

// ---- the factory, starting from a limit learned elsewhere ----

TEST(MakeAlgorithm, StartsAtAGivenLimitClampedToTheSpecsBounds) {
  using Kind = AlgorithmSpec::Kind;
  const auto spec = [](Kind kind, std::optional<std::uint32_t> min,
                       std::optional<std::uint32_t> max) {
    AlgorithmSpec s;
    s.kind = kind;
    s.min_limit = min;
    s.max_limit = max;
    return s;
  };
  for (Kind kind : {Kind::kAimd, Kind::kVegas, Kind::kGradient2}) {
    const AlgorithmSpec s = spec(kind, 10, 100);
    EXPECT_EQ(make_algorithm(s, 42)->limit(), 42u) << algorithm_name(kind);
    EXPECT_EQ(make_algorithm(s, 500)->limit(), 100u) << algorithm_name(kind);
    EXPECT_EQ(make_algorithm(s, 3)->limit(), 10u) << algorithm_name(kind);
    EXPECT_EQ(make_algorithm(s, 42)->name(), algorithm_name(kind));
  }
  // Unset bounds are the algorithm's defaults (Gradient2: [20, 200]).
  EXPECT_EQ(make_algorithm(spec(Kind::kGradient2, std::nullopt, std::nullopt), 5)->limit(), 20u);
  // A fixed limit is the spec's, whatever was learned.
  AlgorithmSpec fixed = spec(Kind::kFixed, std::nullopt, std::nullopt);
  fixed.limit = 7;
  EXPECT_EQ(make_algorithm(fixed, 42)->limit(), 7u);
}

// ---- every algorithm ----

// Any stream of samples keeps every algorithm within [min_limit, max_limit], and a drop never
// raises the limit.
RC_GTEST_PROP(LimitAlgorithmProperty, StaysClampedAndDropsNeverRaise, ()) {
  const auto min_limit = *rc::gen::inRange<std::uint32_t>(1, 50);
  const auto max_limit = min_limit + *rc::gen::inRange<std::uint32_t>(0, 300);
  const auto initial = *rc::gen::inRange<std::uint32_t>(min_limit, max_limit + 1);
  std::vector<std::unique_ptr<LimitAlgorithm>> algorithms;
  algorithms.push_back(std::make_unique<AimdLimit>(
      AimdOptions{.initial_limit = initial, .min_limit = min_limit, .max_limit = max_limit}));
  algorithms.push_back(std::make_unique<VegasLimit>(
      VegasOptions{.initial_limit = initial,
                   .min_limit = min_limit,
                   .max_limit = max_limit,
                   .probe_multiplier = *rc::gen::inRange<std::uint32_t>(1, 40),
                   .seed = *rc::gen::arbitrary<std::uint64_t>()}));
  algorithms.push_back(std::make_unique<Gradient2Limit>(
      Gradient2Options{.initial_limit = initial,
                       .min_limit = min_limit,
                       .max_limit = max_limit,
                       .baseline_window = *rc::gen::inRange<std::uint32_t>(2, 50)}));
  const auto steps = *rc::gen::inRange(1, 400);
  for (int i = 0; i < steps; ++i) {
    const LimitSample s{Nanos{*rc::gen::inRange<std::int64_t>(0, 2'000'000'000)},
                        *rc::gen::inRange<std::uint32_t>(0, 2 * max_limit + 2),
                        *rc::gen::weightedElement<bool>({{1, true}, {4, false}})};
    for (auto& a : algorithms) {
      const std::uint32_t before = a->limit();
      const std::uint32_t after = a->update(s);
      RC_ASSERT(after == a->limit());
      RC_ASSERT(after >= min_limit);
      RC_ASSERT(after <= max_limit);
      if (s.dropped) RC_ASSERT(after <= before);
    }
  }
}

}  // namespace
}  // namespace sluice
