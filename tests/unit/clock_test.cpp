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

}  // namespace
}  // namespace sluice
