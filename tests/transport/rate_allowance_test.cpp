// A rate policy's hits held at the call site (sluice/adapters/rate_allowance.h), on a clock of
// the test's own: a granted block is spent here until its hold ends, a refused block asks for
// what remains or the call's own hits, a refusal is repeated here until its retry_after, a
// shadow answer grants nothing, keys past max_keys are asked every time, and the next block is
// asked for in the background when half of one is spent; a property holds every hit spent here
// to a grant no older than the hold.
#include "sluice/adapters/rate_allowance.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <deque>
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

TEST(RateAllowances, TheNextBlockIsAskedWhenHalfIsSpentAndTheOlderHitsGoFirst) {
  RateAllowances a(10, 500ms);
  EXPECT_FALSE(a.answered("k", 10, 1, allowed(90), t0));  // 9 held
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.local("k", 1, t0)->refill, 0u) << i;
  const auto half = a.local("k", 1, t0);  // 5 of 10 left
  ASSERT_TRUE(half && half->allowed);
  EXPECT_EQ(half->refill, 10u);
  EXPECT_EQ(a.local("k", 1, t0)->refill, 0u);  // one refill at a time
  a.refilled("k", 10, allowed(70), t0 + 100ms);
  EXPECT_EQ(a.held("k"), 14u);
  const auto d = a.local("k", 2, t0 + 200ms);
  ASSERT_TRUE(d && d->allowed);
  EXPECT_EQ(d->remaining, 70u + 12u);
  EXPECT_EQ(d->refill, 0u);  // the older block's hits went first: the new one is whole
  // The older block's last 2 expire with their own hold; the refill's 10 stay until theirs.
  const auto late = a.local("k", 1, t0 + 550ms);
  ASSERT_TRUE(late && late->allowed);
  EXPECT_EQ(a.held("k"), 9u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.local("k", 1, t0 + 550ms)->refill, 0u) << i;
  EXPECT_EQ(a.local("k", 1, t0 + 550ms)->refill, 10u);  // half of the refill's block
  EXPECT_FALSE(a.local("k", 1, t0 + 600ms));            // its hold is over
  const AllowanceStats s = a.stats();
  EXPECT_EQ(s.refills_granted, 1u);
  EXPECT_EQ(s.hits_dropped, 2u + 5u);
}

// A refill that comes back while a call waits for a block of its own (the calls outran it):
// both are kept, the refill's spent first.
TEST(RateAllowances, ARefillThatCameWhileACallWaitedIsKept) {
  RateAllowances a(10, 1s);
  EXPECT_FALSE(a.answered("k", 10, 1, allowed(90), t0));
  std::uint64_t refill = 0;
  for (int i = 0; i < 9; ++i) refill += a.local("k", 1, t0)->refill;
  EXPECT_EQ(refill, 10u);
  EXPECT_FALSE(a.local("k", 1, t0));  // spent: this call asks
  a.refilled("k", 10, allowed(5), t0 + 1ms);
  EXPECT_EQ(a.answered("k", 10, 1, refused(1s, 5), t0 + 2ms), 5u);
  EXPECT_FALSE(a.answered("k", 5, 1, allowed(0), t0 + 3ms));
  EXPECT_EQ(a.held("k"), 14u);
  EXPECT_EQ(a.stats().hits_dropped, 0u);
  // The refill's 10 first: the block granted after it outlives it by its 2 ms.
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(a.local("k", 1, t0 + 500ms)) << i;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(a.local("k", 1, t0 + 1002ms)) << i;
  EXPECT_FALSE(a.local("k", 1, t0 + 1002ms));
  // The call's own hits refused, with a refill's on the way: they are spent when they come,
  // before the refusal's retry_after (they were granted).
  RateAllowances b(4, 1s);
  EXPECT_FALSE(b.answered("k", 4, 1, allowed(1), t0));
  EXPECT_EQ(b.local("k", 1, t0)->refill, 4u);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(b.local("k", 1, t0)) << i;
  EXPECT_EQ(b.answered("k", 4, 1, refused(50ms, 0), t0), 1u);
  EXPECT_FALSE(b.answered("k", 1, 1, refused(50ms, 0), t0));
  EXPECT_FALSE(b.local("k", 1, t0)->allowed);
  b.refilled("k", 4, allowed(0), t0 + 1ms);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(b.local("k", 1, t0 + 2ms)->allowed) << i;
  EXPECT_FALSE(b.local("k", 1, t0 + 2ms)->allowed);  // refused here again until 50 ms
}

TEST(RateAllowances, ARefillNotGrantedIsNotAskedAgainForThatBlockNorCachedAsARefusal) {
  RateAllowances a(4, 1s);
  EXPECT_FALSE(a.answered("k", 4, 1, allowed(2, 6), t0));  // 3 held, a limit of 6
  const auto half = a.local("k", 1, t0);
  ASSERT_TRUE(half);
  EXPECT_EQ(half->refill, 4u);
  a.refilled("k", 4, refused(300ms, 2), t0);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(a.local("k", 1, t0)->refill, 0u) << i;
  EXPECT_FALSE(a.local("k", 1, t0));  // spent: the call asks (a refill's refusal is no answer)
  EXPECT_EQ(a.ask("k", 1), 4u);
  EXPECT_FALSE(a.answered("k", 4, 1, allowed(0, 6), t0));
  EXPECT_EQ(a.local("k", 1, t0)->refill, 4u);
  a.refilled("k", 4, std::nullopt, t0);  // no answer came
  EXPECT_EQ(a.local("k", 1, t0)->refill, 0u);
  EXPECT_EQ(a.stats().refills_refused, 2u);
  EXPECT_EQ(a.stats().calls_asked, 1u);
  RateAllowances small(10, 1s);  // a refill is no larger than the policy's limit
  EXPECT_FALSE(small.answered("k", 6, 1, allowed(0, 6), t0));
  EXPECT_EQ(small.local("k", 1, t0)->refill, 0u);
  EXPECT_EQ(small.local("k", 1, t0)->refill, 6u);  // 3 of 6 left
}

// Whatever the order of calls, blocks, refills and their answers: every hit spent here was
// granted by the server and is spent before its grant's hold ends (matched to the grants
// oldest first, the most any spending could be), and no more than two blocks are held.
RC_GTEST_PROP(RateAllowances, EveryHitSpentHereWasGrantedWithinTheHold, ()) {
  const auto block = *rc::gen::inRange<std::uint64_t>(1, 12);
  const auto hold = std::chrono::milliseconds(*rc::gen::inRange(1, 40));
  RateAllowances a(block, hold);
  struct Grant {
    TimePoint at;
    std::uint64_t hits;
  };
  std::deque<Grant> grants;
  auto spend = [&](std::uint64_t hits, TimePoint now) {
    while (!grants.empty() && now - grants.front().at >= hold) grants.pop_front();
    while (hits > 0) {
      RC_ASSERT(!grants.empty());  // a hit spent that no live grant covers
      const std::uint64_t n = std::min(hits, grants.front().hits);
      grants.front().hits -= n;
      hits -= n;
      if (grants.front().hits == 0) grants.pop_front();
    }
  };
  std::uint64_t in_flight = 0;  // a refill asked and not answered (0: none)
  TimePoint now = t0;
  const int steps = *rc::gen::inRange(1, 200);
  for (int i = 0; i < steps; ++i) {
    now += std::chrono::milliseconds(*rc::gen::inRange(0, 8));
    const auto hits = *rc::gen::inRange<std::uint64_t>(1, 4);
    const auto limit = *rc::gen::inRange<std::uint64_t>(1, 30);
    if (in_flight > 0 && *rc::gen::arbitrary<bool>()) {
      const int kind = *rc::gen::inRange(0, 3);  // granted, refused, no answer
      const std::optional<RateAnswer> answer =
          kind == 2 ? std::nullopt
                    : std::optional(kind == 0 ? allowed(limit, limit) : refused(5ms));
      if (kind == 0) grants.push_back({now, in_flight});
      a.refilled("k", in_flight, answer, now);
      in_flight = 0;
    }
    if (const auto d = a.local("k", hits, now)) {
      if (d->allowed) spend(hits, now);
      if (d->refill > 0) {
        RC_ASSERT(d->allowed);
        RC_ASSERT(in_flight == 0u);
        in_flight = d->refill;
      }
    } else {
      for (std::uint64_t asked = a.ask("k", hits);;) {
        RC_ASSERT(asked >= hits);
        const bool grant = *rc::gen::arbitrary<bool>();
        const RateAnswer answer =
            grant ? allowed(limit, std::max(limit, asked)) : refused(3ms, limit);
        if (grant) grants.push_back({now, asked});
        const auto next = a.answered("k", asked, hits, answer, now);
        if (!next) {
          if (grant) spend(hits, now);
          break;
        }
        RC_ASSERT(*next < asked);
        asked = *next;
      }
    }
    RC_ASSERT(a.held("k") <= 2 * block);
  }
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
