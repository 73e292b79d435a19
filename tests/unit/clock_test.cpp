#include "sluice/core/clock.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(ManualClock, MovesOnlyWhenTold) {
  ManualClock clock(Nanos{100});
  EXPECT_EQ(clock.now(), Nanos{100});
  clock.advance(Nanos{50});
  EXPECT_EQ(clock.now(), Nanos{150});
  clock.set(Nanos{1000});
  EXPECT_EQ(clock.now(), Nanos{1000});
  clock.set(Nanos{10});  // never backwards
  EXPECT_EQ(clock.now(), Nanos{1000});
}

TEST(SteadyClock, IsMonotonic) {
  const auto& clock = SteadyClock::instance();
  const Nanos a = clock.now();
  const Nanos b = clock.now();
  EXPECT_LE(a, b);
}

// The coarse clock shares SteadyClock's epoch and lags it by less than its resolution.
TEST(CoarseSteadyClock, LagsTheSteadyClockByLessThanItsResolution) {
  const Nanos res = CoarseSteadyClock::resolution();
  ASSERT_GT(res, Nanos{0});
  ASSERT_LE(res, std::chrono::milliseconds(100));
  const auto& coarse = CoarseSteadyClock::instance();
  const auto& steady = SteadyClock::instance();
  Nanos last = coarse.now();
  for (int i = 0; i < 1000; ++i) {
    const Nanos before = steady.now();
    const Nanos c = coarse.now();
    const Nanos after = steady.now();
    EXPECT_GE(c, last);  // monotonic
    // It was last updated at a tick before `after` (never ahead), and at most a tick (plus
    // the scheduling of the tick itself) before `before`.
    EXPECT_LE(c, after);
    EXPECT_GT(c, before - 2 * res - std::chrono::milliseconds(10));
    last = c;
  }
}

}  // namespace
}  // namespace sluice
