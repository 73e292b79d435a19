// Rate strategies (sluice/core/rate_strategy.h) and the sharded local limiter
// (sluice/local/rate_limiter.h): each strategy's rule, exact retry_after, no over-admission over
// random arrivals, peek, bad input, bounded memory under key churn, and a hot key shared by
// threads.
#include "sluice/local/rate_limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

RateRule rule(RateStrategy s, std::uint64_t limit, Nanos period = seconds(1),
              std::uint64_t burst = 0) {
  RateRule r;
  r.strategy = s;
  r.limit = limit;
  r.period = period;
  r.burst = burst;
  return r;
}

std::unique_ptr<RateLimiter> limiter(const RateRule& r, const Clock& clock,
                                     std::size_t shards = 64) {
  auto l = make_rate_limiter(RateLimiterOptions{r, shards}, clock);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return std::move(l.value());
}

const std::vector<RateStrategy> kStrategies = {RateStrategy::kFixedWindow,
                                               RateStrategy::kSlidingWindow, RateStrategy::kGcra};

TEST(RateStrategy, FixedWindowCountsPerAlignedWindow) {
  ManualClock clock(seconds(100) + milliseconds(250));
  auto l = limiter(rule(RateStrategy::kFixedWindow, 3), clock);
  for (int i = 0; i < 3; ++i) {
    const RateDecision d = l->check("k");
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 2u - static_cast<unsigned>(i));
    EXPECT_EQ(d.reset_after, milliseconds(750));
  }
  const RateDecision no = l->check("k");
  EXPECT_FALSE(no.allowed);
  EXPECT_EQ(no.retry_after, milliseconds(750));  // the window ends at 101 s
  clock.advance(milliseconds(750));
  EXPECT_TRUE(l->check("k").allowed);
  EXPECT_EQ(l->check("k", 2).remaining, 0u);
  EXPECT_TRUE(l->check("other").allowed);  // keys are independent
}

TEST(RateStrategy, SlidingWindowWeighsThePreviousWindow) {
  ManualClock clock(seconds(10));
  auto l = limiter(rule(RateStrategy::kSlidingWindow, 10), clock);
  EXPECT_TRUE(l->check("k", 10).allowed);
  EXPECT_FALSE(l->check("k").allowed);
  clock.advance(milliseconds(1500));  // previous = 10 at weight 0.5: estimate 5
  const RateDecision five = l->check("k", 5);
  EXPECT_TRUE(five.allowed);
  EXPECT_EQ(five.remaining, 0u);
  const RateDecision no = l->check("k");
  EXPECT_FALSE(no.allowed);
  // 10 * (1 - e) + 5 + 1 <= 10  =>  e >= 0.6: 100 ms from now.
  EXPECT_EQ(no.retry_after, milliseconds(100));
  clock.advance(milliseconds(100));
  EXPECT_TRUE(l->check("k").allowed);
}

TEST(RateStrategy, GcraAdmitsABurstThenTheRate) {
  ManualClock clock(seconds(10));
  auto l = limiter(rule(RateStrategy::kGcra, 10, seconds(1), 5), clock);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(l->check("k").allowed) << i;
  const RateDecision no = l->check("k");
  EXPECT_FALSE(no.allowed);
  EXPECT_EQ(no.limit, 5u);
  EXPECT_EQ(no.retry_after, milliseconds(100));  // one emission interval
  EXPECT_EQ(no.reset_after, milliseconds(500));
  clock.advance(milliseconds(100));
  EXPECT_TRUE(l->check("k").allowed);
  EXPECT_FALSE(l->check("k").allowed);
}

TEST(RateStrategy, MoreHitsThanTheLimitNeverPassAndZeroHitsConsumeNothing) {
  ManualClock clock(seconds(10));
  for (const RateStrategy s : kStrategies) {
    auto l = limiter(rule(s, 4), clock);
    const RateDecision big = l->check("k", 5);
    EXPECT_FALSE(big.allowed) << to_string(s);
    EXPECT_EQ(big.retry_after, Nanos::max()) << to_string(s);
    const RateDecision zero = l->check("k", 0);
    EXPECT_TRUE(zero.allowed);
    EXPECT_EQ(zero.remaining, 4u) << to_string(s);
    EXPECT_EQ(l->keys(), 0u) << to_string(s) << ": nothing to remember";
    EXPECT_TRUE(l->check("k", 4).allowed) << to_string(s);
  }
}

TEST(RateStrategy, PeekDecidesWithoutConsuming) {
  ManualClock clock(seconds(10));
  for (const RateStrategy s : kStrategies) {
    auto l = limiter(rule(s, 2), clock);
    EXPECT_TRUE(l->check("k").allowed);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(l->peek("k", 1, clock.now()).allowed);
    EXPECT_FALSE(l->peek("k", 2, clock.now()).allowed);
    EXPECT_TRUE(l->check("k").allowed) << to_string(s);
    EXPECT_FALSE(l->peek("k", 1, clock.now()).allowed) << to_string(s);
    EXPECT_FALSE(l->peek("absent", 3, clock.now()).allowed);
    EXPECT_TRUE(l->peek("absent", 2, clock.now()).allowed);
  }
}

// A refunded check leaves the key deciding exactly like a twin that never saw it, whether the
// refund comes at once or after time passed (a window may have rolled in between); the refund
// names the time the check was given.
TEST(RateStrategy, RefundUndoesAnAdmittedCheck) {
  for (const RateStrategy s : kStrategies) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::mt19937_64 rng(seed);
      const std::uint64_t limit = 2 + rng() % 10;
      const Nanos period = milliseconds(1 + rng() % 100);
      const RateRule r = rule(s, limit, period);
      ManualClock clock(seconds(100));
      auto with = limiter(r, clock);
      auto twin = limiter(r, clock);
      int refunded = 0;
      for (int step = 0; step < 300; ++step) {
        clock.advance(Nanos{static_cast<std::int64_t>(rng() % (period.count() / 2 + 1))});
        const std::uint64_t hits = 1 + rng() % 2;
        if (rng() % 3 == 0) {  // a batch member admitted, then rolled back
          const Nanos admitted_at = clock.now();
          if (with->check("k", hits, admitted_at).allowed) {
            clock.advance(
                Nanos{static_cast<std::int64_t>(rng() % 3 == 0 ? rng() % period.count() : 0)});
            with->refund("k", hits, admitted_at);
            ++refunded;
          }
          continue;
        }
        const RateDecision a = with->check("k", hits, clock.now());
        const RateDecision b = twin->check("k", hits, clock.now());
        ASSERT_EQ(a.allowed, b.allowed) << to_string(s) << " seed " << seed << " step " << step;
        ASSERT_EQ(a.remaining, b.remaining) << to_string(s) << " seed " << seed;
        ASSERT_EQ(a.retry_after, b.retry_after) << to_string(s) << " seed " << seed;
      }
      EXPECT_GT(refunded, 0);
    }
  }
}

// Random arrivals on one key: never more than the strategy's bound, and every finite
// retry_after is exact: the same request passes at now + retry_after and not a nanosecond
// earlier.
TEST(RateStrategy, RandomArrivalsNeverOverAdmitAndRetryAfterIsExact) {
  for (const RateStrategy s : kStrategies) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::mt19937_64 rng(seed);
      const std::uint64_t limit = 1 + rng() % 20;
      const Nanos period = milliseconds(1 + rng() % 1000);
      const RateRule r = rule(s, limit, period);
      ManualClock clock(seconds(1000) + Nanos{static_cast<std::int64_t>(rng() % 1'000'000'000)});
      auto l = limiter(r, clock);
      std::vector<std::pair<std::int64_t, std::uint64_t>> admitted;  // (time, hits)
      for (int step = 0; step < 400; ++step) {
        clock.advance(Nanos{static_cast<std::int64_t>(rng() % (2 * period.count() / limit + 1))});
        const std::uint64_t hits = 1 + rng() % std::min<std::uint64_t>(limit, 3);
        const RateDecision d = l->check("k", hits, clock.now());
        if (d.allowed) {
          admitted.emplace_back(clock.now().count(), hits);
          continue;
        }
        ASSERT_NE(d.retry_after, Nanos::max());
        ASSERT_GT(d.retry_after, Nanos{0});
        EXPECT_FALSE(l->peek("k", hits, clock.now() + d.retry_after - Nanos{1}).allowed)
            << to_string(s) << " seed " << seed << ": retry_after is not the earliest time";
        EXPECT_TRUE(l->peek("k", hits, clock.now() + d.retry_after).allowed)
            << to_string(s) << " seed " << seed << ": retry_after is too early";
      }
      // The bound: per aligned window (windows), or within any span t (GCRA, burst = limit).
      const std::int64_t p = period.count();
      for (std::size_t i = 0; i < admitted.size(); ++i) {
        std::uint64_t sum = 0;
        for (std::size_t j = i; j < admitted.size(); ++j) {
          const std::int64_t span = admitted[j].first - admitted[i].first;
          sum += admitted[j].second;
          if (s == RateStrategy::kGcra) {
            const auto bound = static_cast<std::uint64_t>(
                static_cast<long double>(limit) + static_cast<long double>(span) * limit / p);
            ASSERT_LE(sum, bound) << "gcra seed " << seed;
          } else if (admitted[j].first / p == admitted[i].first / p) {
            ASSERT_LE(sum, limit) << to_string(s) << " seed " << seed;
          }
        }
      }
      EXPECT_FALSE(admitted.empty());
    }
  }
}

// A charge of hits that would have passed leaves the key exactly where a check of them would
// have: a twin that checks what the other charges decides the same from then on.
TEST(RateCharge, AChargeWithinTheAllowanceIsAnAdmittedCheck) {
  for (const RateStrategy s : kStrategies) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::mt19937_64 rng(seed);
      const std::uint64_t limit = 2 + rng() % 10;
      const Nanos period = milliseconds(1 + rng() % 100);
      ManualClock clock(seconds(100));
      auto charged = limiter(rule(s, limit, period), clock);
      auto checked = limiter(rule(s, limit, period), clock);
      int charges = 0;
      for (int step = 0; step < 300; ++step) {
        clock.advance(Nanos{static_cast<std::int64_t>(rng() % (period.count() / 2 + 1))});
        const std::uint64_t hits = 1 + rng() % 3;
        if (rng() % 2 == 0 && checked->peek("k", hits, clock.now()).allowed) {
          const RateCharge c = charged->charge("k", hits, clock.now());
          const RateDecision d = checked->check("k", hits, clock.now());
          ASSERT_TRUE(c.recorded);
          ASSERT_EQ(c.remaining, d.remaining) << to_string(s) << " seed " << seed;
          ASSERT_EQ(c.reset_after, d.reset_after) << to_string(s) << " seed " << seed;
          ASSERT_EQ(c.overdraft, 0u);
          ++charges;
          continue;
        }
        const RateDecision a = charged->check("k", hits, clock.now());
        const RateDecision b = checked->check("k", hits, clock.now());
        ASSERT_EQ(a, b) << to_string(s) << " seed " << seed << " step " << step;
      }
      EXPECT_GT(charges, 0);
    }
  }
}

// A charge beyond what is left is counted all the same (an overdraft), and the checks after it
// wait it out: a fixed window until it ends, a sliding window until the charged window's weight
// has fallen below the limit, GCRA until its debt has drained at the rule's rate.
TEST(RateCharge, AnOverdraftIsWaitedOutByLaterChecks) {
  const Nanos t0 = seconds(100);  // a window's start for every period below
  {
    ManualClock clock(t0);
    auto l = limiter(rule(RateStrategy::kFixedWindow, 10, seconds(1)), clock);
    ASSERT_TRUE(l->check("k", 4, t0).allowed);
    const RateCharge c = l->charge("k", 21, t0 + milliseconds(200));
    EXPECT_EQ(c.overdraft, 15u);
    EXPECT_EQ(c.remaining, 0u);
    EXPECT_EQ(c.retry_after, milliseconds(800));
    EXPECT_FALSE(l->check("k", 1, t0 + milliseconds(999)).allowed);
    EXPECT_TRUE(l->check("k", 10, t0 + seconds(1)).allowed) << "the next window starts whole";
  }
  {
    ManualClock clock(t0);
    auto l = limiter(rule(RateStrategy::kGcra, 10, seconds(1)), clock);
    // 25 hits of 100 ms each from idle: 2.5 s of debt against a tolerance of 1 s; one more hit
    // fits once it is down to 0.9 s, 1.6 s later.
    const RateCharge c = l->charge("k", 25, t0);
    EXPECT_EQ(c.overdraft, 15u);
    EXPECT_EQ(c.retry_after, milliseconds(1600));
    EXPECT_EQ(c.reset_after, milliseconds(2500));
    EXPECT_FALSE(l->check("k", 1, t0 + milliseconds(1600) - Nanos{1}).allowed);
    EXPECT_TRUE(l->check("k", 1, t0 + milliseconds(1600)).allowed);
  }
  {
    ManualClock clock(t0);
    auto l = limiter(rule(RateStrategy::kSlidingWindow, 10, seconds(1)), clock);
    // 25 in the window at t0; in the next, they weigh 25 * (1 - e); one hit fits once that is
    // at most 9: e >= 0.64.
    const RateCharge c = l->charge("k", 25, t0);
    EXPECT_EQ(c.overdraft, 15u);
    EXPECT_EQ(c.retry_after, milliseconds(1640));
    EXPECT_FALSE(l->check("k", 1, t0 + milliseconds(1640) - Nanos{1}).allowed);
    EXPECT_TRUE(l->check("k", 1, t0 + milliseconds(1640)).allowed);
  }
}

// After random checks and charges, every charge's answer is exact: `remaining` is the most a
// check could take then, `retry_after` the earliest time a check of one hit passes.
TEST(RateCharge, WhatAChargeAnswersIsExact) {
  for (const RateStrategy s : kStrategies) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      std::mt19937_64 rng(seed);
      const std::uint64_t limit = 1 + rng() % 12;
      const Nanos period = milliseconds(1 + rng() % 500);
      ManualClock clock(seconds(1000));
      auto l = limiter(rule(s, limit, period), clock);
      for (int step = 0; step < 200; ++step) {
        clock.advance(Nanos{static_cast<std::int64_t>(rng() % (period.count() / limit + 1))});
        if (rng() % 3 != 0) {
          (void)l->check("k", 1 + rng() % limit, clock.now());
          continue;
        }
        const std::uint64_t hits = 1 + rng() % (2 * limit);
        const RateCharge c = l->charge("k", hits, clock.now());
        const Nanos now = clock.now();
        const std::string at = std::string(to_string(s)) + " seed " + std::to_string(seed) +
                               " step " + std::to_string(step);
        ASSERT_TRUE(c.recorded);
        ASSERT_EQ(c.limit, limit);
        if (c.remaining > 0) {
          ASSERT_TRUE(l->peek("k", c.remaining, now).allowed) << at;
        }
        if (c.remaining < limit) {
          ASSERT_FALSE(l->peek("k", c.remaining + 1, now).allowed) << at;
        }
        if (c.retry_after == Nanos{0}) {
          ASSERT_TRUE(l->peek("k", 1, now).allowed) << at;
        } else {
          ASSERT_FALSE(l->peek("k", 1, now + c.retry_after - Nanos{1}).allowed) << at;
          ASSERT_TRUE(l->peek("k", 1, now + c.retry_after).allowed) << at;
        }
        if (c.overdraft > 0) {
          ASSERT_EQ(c.remaining, 0u) << at;
          ASSERT_GT(c.retry_after, Nanos{0}) << at;
        }
      }
    }
  }
}

// A charge never wraps a count, and a new key past the key cap is not recorded (it says so).
TEST(RateCharge, SaturatesAndSaysWhenNothingWasRecorded) {
  for (const RateStrategy s : kStrategies) {
    ManualClock clock(seconds(100));
    auto l = std::move(make_rate_limiter(RateLimiterOptions{rule(s, 5), 1, 1}, clock).value());
    ASSERT_TRUE(l->charge("a", UINT64_MAX, clock.now()).recorded);
    const RateCharge again = l->charge("a", UINT64_MAX, clock.now());
    EXPECT_GT(again.overdraft, 0u) << to_string(s);
    EXPECT_FALSE(l->check("a", 1, clock.now()).allowed) << to_string(s) << ": wrapped";
    const RateCharge other = l->charge("b", 3, clock.now());
    EXPECT_FALSE(other.recorded) << to_string(s);
    EXPECT_EQ(other.reason, "key_capacity");
    EXPECT_EQ(l->keys(), 1u);
  }
}

TEST(RateLimiter, BadOptionsNameTheField) {
  ManualClock clock;
  RateLimiterOptions o;
  o.rule.limit = 0;
  EXPECT_NE(make_rate_limiter(o, clock).status().message().find("limit"), std::string::npos);
  o = {};
  o.rule.period = Nanos{0};
  EXPECT_NE(make_rate_limiter(o, clock).status().message().find("period"), std::string::npos);
  o.rule.period = kMaxRatePeriod + Nanos{1};  // window arithmetic would overflow far beyond
  EXPECT_NE(make_rate_limiter(o, clock).status().message().find("period must be at most"),
            std::string::npos);
  o.rule.period = kMaxRatePeriod;
  EXPECT_TRUE(make_rate_limiter(o, clock).ok());
  o = {};
  o.shards = 3;
  EXPECT_NE(make_rate_limiter(o, clock).status().message().find("shards"), std::string::npos);
  o = {};
  o.rule.strategy = RateStrategy::kFixedWindow;
  o.rule.burst = 5;
  EXPECT_NE(make_rate_limiter(o, clock).status().message().find("burst"), std::string::npos);
  o = {};
  o.max_keys = 0;
  EXPECT_NE(make_rate_limiter(o, clock).status().message().find("max_keys"), std::string::npos);
  EXPECT_EQ(state_bytes(RateStrategy::kGcra), 16u);
  EXPECT_EQ(state_bytes(RateStrategy::kFixedWindow), 16u);
  EXPECT_EQ(state_bytes(RateStrategy::kSlidingWindow), 24u);
}

// A million distinct keys, each used once, 1,000 per millisecond with a 10 ms period: the keys
// held stay near the ones that still count, never the million.
TEST(RateLimiter, MemoryFollowsActiveKeysUnderChurn) {
  for (const RateStrategy s : kStrategies) {
    ManualClock clock(seconds(1));
    auto l = limiter(rule(s, 5, milliseconds(10)), clock, 16);
    std::size_t most = 0;
    for (int i = 0; i < 1'000'000; ++i) {
      if (i % 1000 == 0) clock.advance(milliseconds(1));
      ASSERT_TRUE(l->check("user-" + std::to_string(i)).allowed);
      if (i % 10'000 == 0) most = std::max(most, l->keys());
    }
    EXPECT_LE(most, 60'000u) << to_string(s);  // <= 2x (3 periods of keys) + sweep slack
    // A key is remembered while it still counts: a window's keys for a period (10,000), a GCRA
    // key for the one hit's cost, period / limit = 2 ms (2,000).
    EXPECT_GE(most, s == RateStrategy::kGcra ? 2'000u : 10'000u) << to_string(s);
  }
}

// Once a later check has moved a key into a new window, refunding hits of the old window gives
// nothing back: they sit in what the new window weighs beside other hits, and the key must not
// end up more permissive than a twin that kept them spent.
TEST(RateStrategy, ARefundAfterTheKeyMovedOnGivesNothingBack) {
  for (const RateStrategy s : {RateStrategy::kFixedWindow, RateStrategy::kSlidingWindow}) {
    ManualClock clock(seconds(100));
    const RateRule r = rule(s, 4, seconds(1));
    auto with = limiter(r, clock);
    auto twin = limiter(r, clock);
    const Nanos a = seconds(100) + milliseconds(900), b = seconds(101) + milliseconds(100);
    for (RateLimiter* l : {with.get(), twin.get()}) {
      ASSERT_TRUE(l->check("k", 3, a).allowed);
      ASSERT_TRUE(l->check("k", 1, b).allowed);  // the key is in the next window now
    }
    with->refund("k", 3, a);
    for (int i = 0; i < 6; ++i) {
      const Nanos at = b + milliseconds(100 * i);
      const RateDecision x = with->check("k", 1, at);
      const RateDecision y = twin->check("k", 1, at);
      ASSERT_EQ(x.allowed, y.allowed) << to_string(s) << " at step " << i;
      ASSERT_EQ(x.remaining, y.remaining) << to_string(s) << " at step " << i;
    }
  }
}

// Callers read the clock before the limiter's lock, so a check can arrive with a time older than
// one already decided. It must not move the key back into the ended window: that would lose the
// new window's count and admit more than the limit in it.
TEST(RateLimiter, ALateCheckDoesNotReopenAnEndedWindow) {
  for (const RateStrategy s : kStrategies) {
    ManualClock clock(seconds(100));
    auto l = limiter(rule(s, 2, seconds(1)), clock);
    const Nanos late = seconds(100) + milliseconds(999), now = seconds(101);
    ASSERT_TRUE(l->check("k", 2, now).allowed) << to_string(s);
    EXPECT_FALSE(l->check("k", 1, late).allowed) << to_string(s) << ": the late check";
    EXPECT_FALSE(l->check("k", 1, now + milliseconds(1)).allowed)
        << to_string(s) << ": the window that began at 101 s is full";
  }
}

TEST(RateLimiter, HotKeyFromFourThreadsAdmitsExactlyTheLimit) {
  ManualClock clock(seconds(5));  // time stands still: one window, a bucket that never refills
  for (const RateStrategy s : kStrategies) {
    auto l = limiter(rule(s, 1000, seconds(10)), clock);
    std::atomic<std::uint64_t> admitted{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&] {
        for (int i = 0; i < 2000; ++i)
          if (l->check("hot").allowed) admitted.fetch_add(1, std::memory_order_relaxed);
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(admitted.load(), 1000u) << to_string(s);
  }
}

}  // namespace
}  // namespace sluice
