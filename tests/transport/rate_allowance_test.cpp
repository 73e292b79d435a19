// A rate policy's hits held at the call site (sluice/adapters/rate_allowance.h), on a clock of
// the test's own: a granted block is spent here until its hold ends, a refused block asks for
// what remains or the call's own hits, a refusal is repeated here until its retry_after, a
// shadow answer grants nothing, and keys past max_keys are asked every time.
#include "sluice/adapters/rate_allowance.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace sluice::adapters {
namespace {

using namespace std::chrono_literals;
using TimePoint = RateAllowances::TimePoint;

const TimePoint t0{};

RateAnswer allowed(std::uint64_t remaining, std::uint64_t limit = 100) {
  RateAnswer a;
  a.allowed = true;
  a.limit = limit;
  a.remaining = remaining;
  return a;
}

RateAnswer refused(std::optional<std::chrono::nanoseconds> retry_after,
                   std::uint64_t remaining = 0) {
  RateAnswer a;
  a.limit = 100;
  a.remaining = remaining;
  a.retry_after = retry_after;
  return a;
}

TEST(RateAllowances, AGrantedBlockIsSpentHereUntilItsHoldEnds) {
  RateAllowances a(10, 500ms);
  EXPECT_FALSE(a.local("k", 1, t0));  // nothing held: ask the server
  EXPECT_EQ(a.ask("k", 1), 10u);
  EXPECT_FALSE(a.answered("k", 10, 1, allowed(90), t0));
  EXPECT_EQ(a.held("k"), 9u);
  for (std::uint64_t i = 0; i < 9; ++i) {
    const auto d = a.local("k", 1, t0 + 100ms);
    ASSERT_TRUE(d && d->allowed) << i;
    EXPECT_EQ(d->remaining, 90 + 8 - i);  // the server's figure at the grant, plus what is held
  }
  EXPECT_FALSE(a.local("k", 1, t0 + 100ms));  // spent
  EXPECT_FALSE(a.answered("k", 10, 1, allowed(80), t0 + 200ms));
  EXPECT_TRUE(a.local("k", 1, t0 + 699ms));
  EXPECT_FALSE(a.local("k", 1, t0 + 700ms));  // 0.5 s after the grant: the rest is dropped
  EXPECT_EQ(a.held("k"), 0u);
  const AllowanceStats s = a.stats();
  EXPECT_EQ(s.hits_dropped, 8u);
  EXPECT_EQ(s.local_admits, 10u);
  EXPECT_EQ(s.blocks_granted, 2u);
}

TEST(RateAllowances, ABlockIsNoLargerThanThePolicysLimitNorSmallerThanTheCall) {
  RateAllowances a(50, 1s);
  EXPECT_EQ(a.ask("k", 1), 50u);
  EXPECT_FALSE(a.answered("k", 50, 1, allowed(0, 20), t0));
  EXPECT_EQ(a.ask("k", 1), 20u);
  EXPECT_EQ(a.ask("k", 30), 30u);
  EXPECT_FALSE(a.local("k", 60, t0));  // 49 held, 60 wanted
}

TEST(RateAllowances, ARefusedBlockAsksForWhatRemainsOrTheCallsOwnHits) {
  RateAllowances a(10, 1s);
  EXPECT_EQ(a.answered("k", 10, 1, refused(500ms, 4), t0), 4u);
  EXPECT_FALSE(a.answered("k", 4, 1, allowed(0), t0));
  EXPECT_EQ(a.held("k"), 3u);
  EXPECT_EQ(a.answered("k", 10, 3, refused(500ms, 2), t0), 3u);  // too few remain
  RateAnswer reason = refused(500ms, 4);
  reason.has_reason = true;  // federation's budget, not the key's own limit
  EXPECT_EQ(a.answered("k", 10, 1, reason, t0), 1u);
  EXPECT_TRUE(a.local("k", 1, t0 + 100ms));  // no refusal cached for a block
  EXPECT_EQ(a.stats().blocks_refused, 3u);
}

TEST(RateAllowances, ARefusalIsRepeatedHereUntilItsRetryAfter) {
  RateAllowances a(10, 1s);
  EXPECT_FALSE(a.answered("k", 1, 1, refused(500ms), t0));
  const auto d = a.local("k", 1, t0 + 200ms);
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->allowed);
  EXPECT_EQ(d->retry_after, 300ms);
  EXPECT_FALSE(a.local("k", 1, t0 + 500ms));                       // passed: ask
  EXPECT_FALSE(a.answered("n", 1, 1, refused(std::nullopt), t0));  // never passes: not cached
  EXPECT_FALSE(a.local("n", 1, t0));
  EXPECT_EQ(a.stats().local_refusals, 1u);
}

TEST(RateAllowances, AShadowAnswerGrantsNoBlock) {
  RateAllowances a(10, 1s);
  RateAnswer shadow = allowed(50);
  shadow.would_deny = true;  // nothing was debited
  EXPECT_EQ(a.answered("k", 10, 1, shadow, t0), 1u);
  EXPECT_EQ(a.held("k"), 0u);
  EXPECT_FALSE(a.answered("k", 1, 1, shadow, t0));
  EXPECT_FALSE(a.local("k", 1, t0));
}

TEST(RateAllowances, KeysPastMaxKeysAreAskedEveryTimeUntilTheExpiredAreForgotten) {
  RateAllowances a(10, 1s, 2);
  EXPECT_FALSE(a.answered("a", 10, 1, allowed(90), t0));
  EXPECT_FALSE(a.answered("b", 10, 1, allowed(90), t0));
  EXPECT_FALSE(a.answered("c", 10, 1, allowed(90), t0 + 500ms));  // granted, no room to hold
  EXPECT_EQ(a.held("c"), 0u);
  EXPECT_EQ(a.keys(), 2u);
  EXPECT_EQ(a.answered("c", 10, 1, refused(5s), t0 + 500ms), 1u);
  EXPECT_FALSE(a.answered("c", 10, 1, allowed(90), t0 + 2s));  // a and b expired
  EXPECT_EQ(a.keys(), 1u);
  EXPECT_EQ(a.held("c"), 9u);
  EXPECT_EQ(a.stats().hits_dropped, 18u);
}

TEST(RateAllowances, SettingsThatCannotWorkAreRefusedNamingTheField) {
  EXPECT_THROW(RateAllowances(0, 1s), std::invalid_argument);
  try {
    RateAllowances(10, 0s);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("allowance_hold"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RateAllowances(10, 1s, 0), std::invalid_argument);
}

}  // namespace
}  // namespace sluice::adapters
