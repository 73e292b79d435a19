// The local limiter's keys (sluice/local/rate_limiter.h): idle keys are swept on time with no
// further traffic, the key cap refuses new keys and never evicts one that has spent budget, and an
// in-place reconfigure keeps every key's state.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "sluice/local/rate_limiter.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const RateStrategy kStrategies[] = {RateStrategy::kFixedWindow, RateStrategy::kSlidingWindow,
                                    RateStrategy::kGcra};

std::unique_ptr<RateLimiter> limiter(RateStrategy s, std::uint64_t limit, Nanos period,
                                     const Clock& clock, std::size_t max_keys = kDefaultMaxKeys) {
  RateLimiterOptions o;
  o.rule.strategy = s;
  o.rule.limit = limit;
  o.rule.period = period;
  o.max_keys = max_keys;
  auto l = make_rate_limiter(o, clock);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return std::move(l.value());
}

// 60,000 keys, all still counting (time stands still), so the growth sweeps keep them; then no
// traffic at all: a sweep two periods later (what the policy's loop runs) forgets every one.
TEST(RateKeys, IdleKeysAreSweptOnTimeWithoutTraffic) {
  for (const RateStrategy s : kStrategies) {
    ManualClock clock(seconds(100));
    auto l = limiter(s, 10, seconds(1), clock);
    for (int i = 0; i < 60'000; ++i) ASSERT_TRUE(l->check("k" + std::to_string(i), 10).allowed);
    EXPECT_EQ(l->keys(), 60'000u) << to_string(s);
    EXPECT_EQ(l->sweep(clock.now()), 0u) << to_string(s) << ": nothing is idle yet";
    clock.advance(milliseconds(500));
    EXPECT_EQ(l->sweep(clock.now()), 0u) << to_string(s) << ": still counting";
    clock.advance(seconds(2));  // past every window, every bucket full again
    EXPECT_EQ(l->sweep(clock.now()), 60'000u) << to_string(s);
    EXPECT_EQ(l->keys(), 0u) << to_string(s);
    // A swept key decides like a fresh one.
    EXPECT_EQ(l->check("k7", 0).remaining, 10u) << to_string(s);
  }
}

// idle_within: how long the loop may wait between sweeps without keeping a key past its time.
// The worst case of each strategy is reached exactly: idle at that time, not a ns before.
TEST(RateKeys, IdleWithinIsTheLongestAKeyStaysNonIdle) {
  const Nanos start = seconds(100);  // a window boundary for every period below
  for (const RateStrategy s : kStrategies) {
    for (const auto& [limit, burst] :
         {std::pair<std::uint64_t, std::uint64_t>{3, 0}, {7, 0}, {3, 5}}) {
      if (burst != 0 && s != RateStrategy::kGcra) continue;
      RateRule r;
      r.strategy = s;
      r.limit = limit;
      r.burst = burst;
      r.period = seconds(1);
      const Nanos w = idle_within(r);
      const std::uint64_t all = burst != 0 ? burst : limit;
      auto idle_at = [&](Nanos t) {
        switch (s) {
          case RateStrategy::kFixedWindow: {
            FixedWindowState st;
            EXPECT_TRUE(decide(st, r, all, start).allowed);
            return is_idle(st, r, t);
          }
          case RateStrategy::kSlidingWindow: {
            SlidingWindowState st;
            EXPECT_TRUE(decide(st, r, all, start).allowed);
            return is_idle(st, r, t);
          }
          case RateStrategy::kGcra: {
            GcraState st;
            EXPECT_TRUE(decide(st, r, all, start).allowed);
            return is_idle(st, r, t);
          }
        }
        return false;
      };
      EXPECT_FALSE(idle_at(start + w - Nanos{1})) << to_string(s) << " limit " << limit;
      EXPECT_TRUE(idle_at(start + w)) << to_string(s) << " limit " << limit;
    }
  }
}

// A sweep must not forget a key a late check (a time read before the sweep) still counts.
TEST(RateKeys, ASweepAdvancesTheShardsTime) {
  ManualClock clock(seconds(100));
  auto l = limiter(RateStrategy::kFixedWindow, 1, seconds(1), clock, 10);
  ASSERT_TRUE(l->check("k", 1, seconds(100)).allowed);
  EXPECT_EQ(l->sweep(seconds(101)), 1u);
  // A check that read the clock before the sweep decides at the sweep's time (in the window of
  // 101 s), not in the ended window, where the forgotten key would pass a second hit and then,
  // moving into the window of 101 s, a third.
  EXPECT_TRUE(l->check("k", 1, seconds(100) + milliseconds(500)).allowed);
  EXPECT_FALSE(l->check("k", 1, seconds(101) + milliseconds(1)).allowed);
}

// At the cap, a new key is refused (never an old one evicted); keys held keep being served;
// room comes back when keys fall idle and a sweep forgets them.
TEST(RateKeys, TheCapRefusesNewKeysAndEvictsNothing) {
  for (const RateStrategy s : kStrategies) {
    ManualClock clock(seconds(100));
    auto l = limiter(s, 2, seconds(10), clock, 100);
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(l->check("k" + std::to_string(i)).allowed);
    const RateDecision no = l->check("new");
    EXPECT_FALSE(no.allowed) << to_string(s);
    EXPECT_TRUE(no.key_capacity) << to_string(s);
    EXPECT_EQ(no.reason, "key_capacity") << to_string(s);
    EXPECT_GT(no.retry_after, Nanos{0});
    EXPECT_LE(no.retry_after, kCapSweepGap);
    EXPECT_EQ(l->keys(), 100u);
    EXPECT_TRUE(l->peek("new", 1, clock.now()).key_capacity) << "peek answers as check does";
    EXPECT_TRUE(l->peek("k3", 1, clock.now()).allowed);
    EXPECT_TRUE(l->check("new", 0).allowed) << "0 hits store nothing: answered as usual";
    // Old keys still count what they spent: one more each, then refused for their rate.
    EXPECT_TRUE(l->check("k3").allowed) << to_string(s);
    const RateDecision spent = l->check("k3");
    EXPECT_FALSE(spent.allowed) << to_string(s);
    EXPECT_FALSE(spent.key_capacity) << to_string(s);
    // After the shard may sweep again, with every key still counting: still refused, and no
    // key was evicted (k3 is still refused for its rate).
    clock.advance(kCapSweepGap);
    EXPECT_TRUE(l->check("new").key_capacity) << to_string(s);
    EXPECT_FALSE(l->check("k3").allowed) << to_string(s);
    EXPECT_EQ(l->keys(), 100u);
    // Once they are idle, room without the loop: the new key's shard sweeps on the spot.
    clock.advance(seconds(30));
    const RateDecision yes = l->check("new");
    EXPECT_TRUE(yes.allowed) << to_string(s);
    EXPECT_FALSE(yes.key_capacity);
    EXPECT_LE(l->keys(), 100u);
  }
}

TEST(RateKeys, ReconfigureKeepsEachKeysStateAndTakesTheNewLimit) {
  for (const RateStrategy s : kStrategies) {
    ManualClock clock(seconds(100));
    auto l = limiter(s, 100, seconds(10), clock, 1000);
    ASSERT_TRUE(l->check("a", 40).allowed);
    ASSERT_TRUE(l->check("b", 100).allowed);
    RateRule to = l->rule();
    to.limit = 50;
    l->reconfigure(to, 2);
    EXPECT_EQ(l->rule().limit, 50u);
    EXPECT_EQ(l->max_keys(), 2u);
    EXPECT_EQ(l->check("a", 0).remaining, 10u) << to_string(s);
    EXPECT_FALSE(l->check("b", 1).allowed) << to_string(s);
    EXPECT_TRUE(l->check("c", 1).key_capacity) << to_string(s) << ": the lower cap holds";
    // A rule that cannot be carried (another period) is not taken.
    RateRule other = to;
    other.period = seconds(20);
    l->reconfigure(other, 5);
    EXPECT_EQ(l->rule().period, seconds(10));
    EXPECT_EQ(l->max_keys(), 2u);
  }
}

}  // namespace
}  // namespace sluice
