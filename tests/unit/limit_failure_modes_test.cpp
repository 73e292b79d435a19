// The reference algorithms' known failure modes and sluice's fixes. Each test drives an
// algorithm the way a saturated caller would (in_flight at the limit, traffic never stops) and
// asserts the fixed behaviour; each fails if its fix is removed (noted per test).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>

#include "sluice/core/aimd_limit.h"
#include "sluice/core/gradient2_limit.h"
#include "sluice/core/vegas_limit.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;

LimitSample busy(LimitAlgorithm& a, Nanos rtt, bool dropped = false) {
  return {rtt, a.limit(), dropped};  // saturated: every admitted call is in flight
}

// ---- (a) a baseline poisoned by load recovers while traffic keeps flowing ----

// Gradient2: a long overload drags the reference's EMA baseline up to the loaded RTT (100 ms);
// when the backend recovers (10 ms) the reference EMA needs hundreds of samples to come back,
// so a new queue (30 ms = 3x no-load) goes unnoticed and the limit keeps growing. sluice caps
// the baseline with a windowed minimum: it is back at 10 ms on the first low sample and the
// next queue is shed at once. (Fails without the windowed minimum: the gradient stays at 1.)
TEST(Gradient2Baseline, RecoversWithinSamplesAfterALongOverload) {
  Gradient2Limit g;
  for (int i = 0; i < 20; ++i) g.update(busy(g, milliseconds(10)));
  for (int i = 0; i < 2000; ++i) g.update(busy(g, milliseconds(100)));
  ASSERT_GT(g.long_rtt(), milliseconds(95));  // the EMA is fully poisoned

  g.update(busy(g, milliseconds(10)));  // load is gone; traffic continues
  EXPECT_EQ(g.baseline_rtt(), milliseconds(10));
  for (int i = 0; i < 4; ++i) g.update(busy(g, milliseconds(10)));
  EXPECT_GT(g.long_rtt(), milliseconds(60));  // the EMA alone would still be poisoned

  const std::uint32_t before = g.limit();
  ASSERT_GT(before, g.options().min_limit);
  for (int i = 0; i < 3; ++i) {
    const std::uint32_t prev = g.limit();
    EXPECT_LT(g.update(busy(g, milliseconds(30))), prev) << "sample " << i;
  }
}

// Gradient2: a baseline first measured while the backend was already loaded (50 ms) drops to
// the real no-load RTT (10 ms) on the first such sample, so a later doubling of the RTT sheds.
// (Fails without the windowed minimum: the warm-up mean keeps the baseline near 50 ms.)
TEST(Gradient2Baseline, BaselineMeasuredUnderLoadRecoversAtOnce) {
  Gradient2Limit g(Gradient2Options{.initial_limit = 100, .min_limit = 1});
  for (int i = 0; i < 10; ++i) g.update(busy(g, milliseconds(50)));
  g.update(busy(g, milliseconds(10)));
  EXPECT_EQ(g.baseline_rtt(), milliseconds(10));
  const std::uint32_t before = g.limit();
  EXPECT_LT(g.update(busy(g, milliseconds(20))), before);  // 2x no-load > 1.5x tolerance
}

// Gradient2: the windowed minimum never pins the baseline below a backend that really became
// slower: after baseline_window samples at the new RTT the limit grows again.
// (Fails if the minimum never ages out: the gradient would stay at 0.5 forever.)
TEST(Gradient2Baseline, StaleLowMinimumAgesOut) {
  Gradient2Limit g(Gradient2Options{.min_limit = 5, .long_window = 10});
  for (int i = 0; i < 20; ++i) g.update(busy(g, milliseconds(10)));
  for (int i = 0; i < 100; ++i) g.update(busy(g, milliseconds(40)));
  ASSERT_EQ(g.limit(), 5u);  // shed hard: the backend looks 4x slower than its baseline
  int samples = 0;
  while (g.limit() <= 10 && samples < 1000) {
    g.update(busy(g, milliseconds(40)));
    ++samples;
  }
  EXPECT_LE(samples, static_cast<int>(g.options().baseline_window) + 50);
  EXPECT_EQ(g.baseline_rtt(), milliseconds(40));
}

// Vegas: the backend permanently becomes 4x slower (no-load 10 ms -> 40 ms). With a
// never-forgetting minimum the queue estimate stays at 75% of the limit and the limit sits at
// its floor (8 here: the largest L whose queue estimate ceil(0.75 L) is within beta) forever.
// sluice's baseline forgets the old minimum after two epochs and the limit recovers, with traffic
// flowing throughout, for every seed. (Fails without ageing.)
TEST(VegasBaseline, StaleLowBaselineAgesOutWhileTrafficFlows) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    VegasLimit v(VegasOptions{.max_limit = 100, .seed = seed});
    for (int i = 0; i < 50; ++i) v.update(busy(v, milliseconds(10)));
    ASSERT_EQ(v.limit(), 100u);
    int samples = 0;
    bool reached_floor = false;
    while (v.limit() < 50 || !reached_floor) {
      v.update(busy(v, milliseconds(40)));
      reached_floor = reached_floor || v.limit() <= 10;
      ASSERT_LT(++samples, 600) << "seed " << seed << " limit " << v.limit();
    }
    EXPECT_EQ(v.rtt_noload(), milliseconds(40)) << "seed " << seed;
  }
}

// Vegas: the baseline is never one loaded sample. The backend is loaded (50 ms) except for a
// 10 ms call every 40 samples; the reference re-probe adopts whatever RTT the probing sample
// has, so right after a probe its baseline is 50 ms and its limit jumps (queue estimate 0).
// sluice's epochs are longer than the gap between fast calls, so the baseline stays 10 ms and
// a loaded call never raises the limit. (Fails if an epoch boundary adopts the current sample
// as the baseline.)
TEST(VegasBaseline, NeverAdoptsASingleLoadedSample) {
  VegasLimit v(VegasOptions{.initial_limit = 40, .min_limit = 10, .max_limit = 200, .seed = 7});
  v.update(busy(v, milliseconds(10)));
  for (int i = 1; i < 5000; ++i) {
    const std::uint32_t before = v.limit();
    const bool loaded = i % 40 != 0;
    v.update(busy(v, loaded ? milliseconds(50) : milliseconds(10)));
    ASSERT_EQ(v.rtt_noload(), milliseconds(10)) << "sample " << i;
    if (loaded) {
      ASSERT_LE(v.limit(), before) << "sample " << i;  // a loaded call never grows it
    }
  }
}

// The epoch length is jitter * probe_multiplier * L with jitter in [0.5, 1) from the seed:
// the same seed replays exactly; different seeds end epochs at different samples.
TEST(VegasBaseline, EpochsAreSeededAndJittered) {
  auto forgotten_at = [](std::uint64_t seed) {
    VegasLimit v(VegasOptions{.seed = seed});
    v.update({milliseconds(10), 1, false});
    for (int i = 1; i < 5000; ++i) {
      v.update({milliseconds(20), 1, false});  // app-limited: L stays 20, epochs 300..600
      if (v.rtt_noload() == milliseconds(20)) return i;
    }
    return -1;
  };
  std::set<int> distinct;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    const int at = forgotten_at(seed);
    EXPECT_EQ(at, forgotten_at(seed));  // replayable
    EXPECT_GE(at, 300);                 // at least one full epoch of 0.5 * 30 * 20
    EXPECT_LT(at, 1200);                // at most two epochs of 30 * 20
    distinct.insert(at);
  }
  EXPECT_GT(distinct.size(), 4u);
}

// ---- (b) steady drops lower the limit, in every adaptive algorithm ----

// A backend that answers every call with a fast failure (healthy-looking RTT, dropped = true).
// The reference Gradient2 ignores `dropped`, sees gradient 1 and grows. Every sluice algorithm
// must come down, sample after sample, to min_limit. (Gradient2 fails without the drop rule.)
template <typename Algorithm, typename Options>
void expect_steady_drops_reach_min(Options options) {
  Algorithm a(options);
  a.update({milliseconds(10), a.limit(), false});  // baseline at the drop's RTT
  std::uint32_t prev = a.limit();
  ASSERT_GT(prev, options.min_limit);
  for (int i = 0; i < 200 && a.limit() > options.min_limit; ++i) {
    const std::uint32_t now = a.update({milliseconds(10), a.limit(), true});
    EXPECT_LT(now, prev) << a.name() << " sample " << i;
    prev = now;
  }
  EXPECT_EQ(a.limit(), options.min_limit) << a.name();
}

TEST(LimitDrops, AimdBacksOffToMin) {
  expect_steady_drops_reach_min<AimdLimit>(AimdOptions{.initial_limit = 100, .min_limit = 2});
}
TEST(LimitDrops, VegasBacksOffToMin) {
  expect_steady_drops_reach_min<VegasLimit>(VegasOptions{.initial_limit = 100, .min_limit = 2});
}
TEST(LimitDrops, Gradient2BacksOffToMin) {
  expect_steady_drops_reach_min<Gradient2Limit>(
      Gradient2Options{.initial_limit = 100, .min_limit = 2});
}

// Vegas: a drop whose RTT would be a new minimum still backs off (the reference updates the
// baseline and returns before looking at the drop), and never enters the baseline.
TEST(LimitDrops, VegasDropWithLowRttStillBacksOff) {
  VegasLimit v;
  v.update({milliseconds(10), 20, false});
  EXPECT_EQ(v.update({milliseconds(1), 20, true}), 19u);
  EXPECT_EQ(v.rtt_noload(), milliseconds(10));
}

// ---- (c) no creep while the gradient is below 1 ----

// Gradient2 at a steady gradient of 0.9 (RTT 1.67x the baseline, beyond the 1.5x tolerance):
// the reference computes L * 0.9 + 4, which exceeds L for L < 40, so its limit creeps up from
// 20 towards 40 while the backend queues. sluice adds queue_size only at gradient 1: the limit
// never grows and in fact sheds. (Fails without the rule: the first sample grows 20 -> 20.8,
// and by 100 samples the limit is ~38.)
TEST(Gradient2Creep, LimitDoesNotGrowWhileGradientBelowOne) {
  Gradient2Limit g(
      Gradient2Options{.initial_limit = 20, .min_limit = 1, .baseline_window = 100'000});
  g.update({milliseconds(10), 1, false});  // baseline 10 ms, app-limited: L stays 20
  ASSERT_EQ(g.limit(), 20u);
  const Nanos rtt{16'666'667};  // 1.5 * 10 / 16.67 = 0.9
  std::uint32_t prev = g.limit();
  for (int i = 0; i < 100; ++i) {
    const std::uint32_t now = g.update({rtt, g.limit(), false});
    ASSERT_LE(now, prev) << "sample " << i;
    prev = now;
  }
  EXPECT_LT(g.limit(), 20u);
}

}  // namespace
}  // namespace sluice
