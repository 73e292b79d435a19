// Exactness of the rate strategies (sluice/core/rate_strategy.h): GCRA against an independent exact
// model (a token bucket in 128-bit integers) at awkward limit / period ratios, the windows at
// the ends of the 64-bit range, and carrying a key's state to a new limit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sluice/core/rate_strategy.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
__extension__ typedef unsigned __int128 u128;

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

RateRule rule(RateStrategy s, std::uint64_t limit, Nanos period, std::uint64_t burst = 0) {
  RateRule r;
  r.strategy = s;
  r.limit = limit;
  r.period = period;
  r.burst = burst;
  return r;
}

std::string str(u128 v) {
  std::string out;
  do {
    out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return out;
}

// The model: GCRA's twin formulation, a token bucket of `burst` tokens that refills `limit`
// tokens per `period`, kept exactly as tokens * period (an integer: it gains `limit` per ns).
//   admitted iff tokens >= hits; remaining = floor(tokens after);
//   retry_after = the smallest whole d with tokens + d * limit / period >= hits;
//   reset_after = the smallest whole d after which the bucket is full.
// Times are relative to the model's start (all checks come at or after it).
class TokenBucketModel {
 public:
  TokenBucketModel(const RateRule& r, std::int64_t start)
      : limit_(r.limit),
        period_(static_cast<u128>(r.period.count())),
        burst_(r.burst != 0 ? r.burst : r.limit),
        capacity_(static_cast<u128>(burst_) * period_),
        tokens_(capacity_),
        last_(start) {}

  RateDecision check(std::uint64_t hits, std::int64_t now) {
    const u128 elapsed = static_cast<u128>(now - last_);
    // Refill, capped at the capacity (no product that could overflow once full).
    const u128 room = capacity_ - tokens_;
    tokens_ =
        elapsed >= room / limit_ + 1 ? capacity_ : std::min(capacity_, tokens_ + elapsed * limit_);
    last_ = now;
    RateDecision d;
    d.limit = burst_;
    const u128 need = static_cast<u128>(hits) * period_;
    if (hits <= burst_ && tokens_ >= need) {
      tokens_ -= need;
      d.allowed = true;
    } else if (hits > burst_) {
      d.retry_after = Nanos::max();
    } else {
      d.retry_after = Nanos{static_cast<std::int64_t>(ceil_div(need - tokens_, limit_))};
    }
    d.remaining = static_cast<std::uint64_t>(tokens_ / period_);
    d.reset_after = Nanos{static_cast<std::int64_t>(ceil_div(capacity_ - tokens_, limit_))};
    return d;
  }

 private:
  static u128 ceil_div(u128 a, u128 b) { return (a + b - 1) / b; }
  const u128 limit_;
  const u128 period_;
  const std::uint64_t burst_;
  const u128 capacity_;
  u128 tokens_;
  std::int64_t last_;
};

std::string describe(const RateDecision& d) {
  return std::string(d.allowed ? "allowed" : "denied") + " remaining " +
         std::to_string(d.remaining) + " retry_after " + std::to_string(d.retry_after.count()) +
         " reset_after " + std::to_string(d.reset_after.count());
}

TEST(GcraExact, ALimitThatDoesNotDivideThePeriodStillAdmitsItsBurst) {
  GcraState s;
  const RateRule r = rule(RateStrategy::kGcra, 3, seconds(1));
  const Nanos now = seconds(50);
  for (int i = 0; i < 3; ++i) {
    const RateDecision d = decide(s, r, 1, now);
    EXPECT_TRUE(d.allowed) << "hit " << i << ": " << describe(d);
    EXPECT_EQ(d.remaining, 2u - static_cast<unsigned>(i));
  }
  const RateDecision no = decide(s, r, 1, now);
  EXPECT_FALSE(no.allowed);
  // One hit's worth is 1/3 s = 333,333,333.33 ns: the smallest whole wait is 333,333,334 ns.
  EXPECT_EQ(no.retry_after, Nanos{333'333'334});
  EXPECT_EQ(no.reset_after, seconds(1));
  EXPECT_FALSE(decide(s, r, 1, now + Nanos{333'333'333}, false).allowed);
  EXPECT_TRUE(decide(s, r, 1, now + Nanos{333'333'334}, false).allowed);
}

// A period shorter than the limit in ns (a hit is worth less than a nanosecond): the rate is
// the configured one over a long run, not a fraction of it.
TEST(GcraExact, ATinyPeriodRunsAtItsFullRate) {
  GcraState s;
  const RateRule r = rule(RateStrategy::kGcra, 7, Nanos{3});  // 7 hits per 3 ns
  std::uint64_t admitted = 0;
  const std::int64_t start = 1'000'000;
  for (std::int64_t t = start; t <= start + 3000; ++t)
    while (decide(s, r, 1, Nanos{t}).allowed) ++admitted;
  // The burst of 7 plus 7 per 3 ns over 3000 ns.
  EXPECT_EQ(admitted, 7u + 7000u);
}

struct Ratio {
  std::uint64_t limit;
  Nanos period;
};

// Random hit sizes and time steps, every decision equal to the model's: allowed, remaining,
// retry_after and reset_after, for awkward ratios and limits near 2^40 and 2^64.
TEST(GcraExact, MatchesAnExactTokenBucketAtAwkwardRatios) {
  const std::vector<Ratio> ratios = {
      {3, seconds(1)},
      {7, seconds(1)},
      {1, Nanos{1}},
      {3, Nanos{10}},
      {1'000'003, seconds(1)},
      {(std::uint64_t{1} << 40) + 7, seconds(1)},
      {(std::uint64_t{1} << 40) - 3, Nanos{999'999'937}},
      {kU64Max, seconds(1)},
      {kU64Max - 58, Nanos{7}},
      {(std::uint64_t{1} << 63) + 1, milliseconds(1)},
      {13, kMaxRatePeriod},
  };
  std::uint64_t denied = 0, allowed = 0;
  for (const Ratio& ratio : ratios) {
    for (std::uint64_t seed = 1; seed <= 12; ++seed) {
      std::mt19937_64 rng(seed * 7919 + ratio.limit);
      const std::uint64_t burst_pick = rng() % 3;
      const std::uint64_t burst = burst_pick == 0   ? 0
                                  : burst_pick == 1 ? 1 + rng() % ratio.limit
                                                    : 1 + rng() % 5;
      const RateRule r = rule(RateStrategy::kGcra, ratio.limit, ratio.period, burst);
      ASSERT_EQ(r.validate(), "");
      const std::uint64_t b = burst != 0 ? burst : ratio.limit;
      std::int64_t now =
          static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 50)) - (std::int64_t{1} << 40);
      TokenBucketModel model(r, now);
      GcraState s;
      const auto p = static_cast<std::uint64_t>(ratio.period.count());
      const std::uint64_t per_hit = p / ratio.limit + 1;  // > one hit's worth in ns
      for (int step = 0; step < 300; ++step) {
        switch (rng() % 5) {
          case 0:
            break;  // the same instant
          case 1:
            now += 1;
            break;
          case 2:
            // (bounded: 300 steps stay far below 2^62 ns)
            now +=
                static_cast<std::int64_t>(rng() % std::min<std::uint64_t>(3 * per_hit, 1ULL << 52));
            break;
          case 3:
            now += static_cast<std::int64_t>(rng() % std::min<std::uint64_t>(p, 1ULL << 40));
            break;
          default:
            now += static_cast<std::int64_t>(rng() % (std::uint64_t{1} << 20));
        }
        std::uint64_t hits = 0;
        switch (rng() % 6) {
          case 0:
            hits = 1;
            break;
          case 1:
            hits = 1 + rng() % 3;
            break;
          case 2:
            hits = rng() % (b + 1 == 0 ? kU64Max : b + 1);
            break;
          case 3:
            hits = b;
            break;
          case 4:
            hits = b == kU64Max ? b : b + 1 + rng() % 3;  // more than the burst: never
            break;
          default:
            hits = 0;
        }
        const RateDecision want = model.check(hits, now);
        const RateDecision got = decide(s, r, hits, Nanos{now});
        ASSERT_EQ(got, want) << "limit " << ratio.limit << " period " << p << " burst " << burst
                             << " seed " << seed << " step " << step << " hits " << hits
                             << "\n  got  " << describe(got) << "\n  want " << describe(want);
        (got.allowed ? allowed : denied) += 1;
      }
    }
  }
  EXPECT_GT(allowed, 1000u);
  EXPECT_GT(denied, 1000u);
}

// Fixed window at the top of the 64-bit range: count + hits must not wrap and admit.
// What a coarse clock (sluice/core/clock.h, CoarseSteadyClock) costs GCRA: decisions taken on
// times that lag the true ones by less than a tick admit, in any interval of true time T, at
// most burst + r x T + ceil(r x tick) hits (r = limit / period): ceil(r x tick) more than the
// rule. Random arrivals at awkward rates and ticks; every window between two admitted hits is
// checked, and the bound is reached (it is not loose by a whole tick's worth).
TEST(GcraCoarseTime, ALaggingClockAdmitsAtMostATicksWorthMore) {
  struct Case {
    std::uint64_t limit;
    Nanos period;
    std::uint64_t burst;
    Nanos tick;
  };
  const std::vector<Case> cases = {
      {100, seconds(1), 0, milliseconds(4)}, {1000, seconds(1), 1, milliseconds(4)},
      {7, seconds(1), 3, milliseconds(4)},   {1000, seconds(1), 0, milliseconds(1)},
      {60, seconds(60), 5, milliseconds(4)}, {250, seconds(1), 1, milliseconds(4)},
  };
  std::uint64_t at_bound = 0;
  for (const Case& c : cases) {
    const RateRule r = rule(RateStrategy::kGcra, c.limit, c.period, c.burst);
    ASSERT_EQ(r.validate(), "");
    const std::uint64_t b = c.burst != 0 ? c.burst : c.limit;
    const auto p = static_cast<u128>(c.period.count());
    const u128 tick_hits = static_cast<u128>(c.limit) * static_cast<u128>(c.tick.count());
    const auto extra = static_cast<std::uint64_t>((tick_hits + p - 1) / p);  // ceil(r x tick)
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      std::mt19937_64 rng(seed * 131 + c.limit);
      GcraState s;
      std::vector<std::int64_t> admitted;  // true times
      std::int64_t t = 1'000'000'000;
      const auto gap =
          static_cast<std::uint64_t>(c.period.count() / static_cast<std::int64_t>(c.limit));
      for (int i = 0; i < 1500; ++i) {
        t += static_cast<std::int64_t>(rng() % (2 * gap / 3 + 1));  // faster than the rule
        const std::int64_t read = t - t % c.tick.count();  // the last tick: < a tick behind
        if (decide(s, r, 1, Nanos{read}).allowed) admitted.push_back(t);
      }
      ASSERT_GT(admitted.size(), 100u);
      for (std::size_t i = 0; i < admitted.size(); ++i) {
        for (std::size_t j = i; j < admitted.size(); ++j) {
          const auto span = static_cast<u128>(admitted[j] - admitted[i]);
          const std::uint64_t n = j - i + 1;
          const auto allowed = b + static_cast<std::uint64_t>(c.limit * span / p);  // floor
          ASSERT_LE(n, allowed + extra) << "limit " << c.limit << " tick " << c.tick.count()
                                        << " seed " << seed << " window " << i << ".." << j;
          if (n == allowed + extra && extra > 0) ++at_bound;
          if (span > 3 * p) break;
        }
      }
    }
  }
  EXPECT_GT(at_bound, 0u);  // some window takes every extra hit: the bound is reached
}

TEST(WindowExtremes, FixedWindowDoesNotWrapNearTwoToTheSixtyFour) {
  const RateRule r = rule(RateStrategy::kFixedWindow, kU64Max - 1, seconds(1));
  const Nanos now = seconds(10);
  FixedWindowState s;
  const std::uint64_t half = (std::uint64_t{1} << 63) + 1;
  ASSERT_TRUE(decide(s, r, half, now).allowed);
  const RateDecision d = decide(s, r, half, now);  // half + half = 2^64 + 2 > limit
  EXPECT_FALSE(d.allowed) << describe(d);
  EXPECT_EQ(d.remaining, kU64Max - 1 - half);
  EXPECT_EQ(d.retry_after, seconds(1));
  EXPECT_TRUE(decide(s, r, kU64Max - 1 - half, now).allowed);  // exactly to the limit
  EXPECT_FALSE(decide(s, r, 1, now).allowed);
  // Hits above the limit: never, even on an empty key.
  FixedWindowState fresh;
  EXPECT_EQ(decide(fresh, r, kU64Max, now).retry_after, Nanos::max());
  // The largest limit: a single request of all of it passes once.
  const RateRule top = rule(RateStrategy::kFixedWindow, kU64Max, seconds(1));
  FixedWindowState t;
  EXPECT_TRUE(decide(t, top, kU64Max, now).allowed);
  EXPECT_FALSE(decide(t, top, 1, now).allowed);
  EXPECT_FALSE(decide(t, top, kU64Max, now).allowed);
}

TEST(WindowExtremes, SlidingWindowDoesNotWrapAndWeighsExactly) {
  const RateRule r = rule(RateStrategy::kSlidingWindow, kU64Max, seconds(1));
  const std::uint64_t big = (std::uint64_t{1} << 63) + 5;
  {
    SlidingWindowState s;
    const Nanos now = seconds(10);
    ASSERT_TRUE(decide(s, r, big, now).allowed);
    const RateDecision d = decide(s, r, big, now);  // big + big wraps to 10 in 64 bits
    EXPECT_FALSE(d.allowed) << describe(d);
    EXPECT_EQ(d.remaining, kU64Max - big);
    // In the next window, after a quarter of it: big * 3/4 + hits <= limit.
    const Nanos later = seconds(11) + milliseconds(250);
    const u128 weighted =
        static_cast<u128>(big) * 3 / 4 + 1;  // rounded up: not exact in whole hits
    const std::uint64_t fits = kU64Max - static_cast<std::uint64_t>(weighted);
    const RateDecision no = decide(s, r, fits + 1, later, false);
    EXPECT_FALSE(no.allowed) << describe(no);
    const RateDecision yes = decide(s, r, fits, later, false);
    EXPECT_TRUE(yes.allowed) << describe(yes);
    EXPECT_EQ(yes.remaining, 0u);
    // retry_after of the refused one is exact.
    EXPECT_FALSE(decide(s, r, fits + 1, later + no.retry_after - Nanos{1}, false).allowed);
    EXPECT_TRUE(decide(s, r, fits + 1, later + no.retry_after, false).allowed);
  }
  {
    // hits near 2^64 - 1 on a key with a little spent: cur + hits wraps in 64 bits.
    SlidingWindowState s;
    const Nanos now = seconds(20);
    ASSERT_TRUE(decide(s, r, 2, now).allowed);
    const RateDecision d = decide(s, r, kU64Max - 1, now);
    EXPECT_FALSE(d.allowed) << describe(d);
    EXPECT_EQ(d.remaining, kU64Max - 2);
    EXPECT_TRUE(decide(s, r, kU64Max - 2, now).allowed);
  }
}

// A refused check's retry_after is exact for every limit the API accepts (those above 2^62
// included): the same check is refused 1 ns before it and allowed at it. Random states, limits
// small and from 2^62 to 2^64 - 1, periods from 1 ns to 100 years.
TEST(WindowExtremes, SlidingWindowRetryAfterIsExactForEveryLimit) {
  std::mt19937_64 rng(20261127);
  int checked = 0;
  for (int i = 0; i < 200'000; ++i) {
    const std::uint64_t limit =
        i % 3 == 0 ? 1 + rng() % 1000 : (rng() >> (rng() % 2)) | (std::uint64_t{1} << 62);
    const std::int64_t periods[] = {1, 7, 1'000'000'007,
                                    std::chrono::nanoseconds(kMaxRatePeriod).count()};
    const std::int64_t p =
        i % 5 == 0 ? 1 + static_cast<std::int64_t>(rng() % 5'000'000'000) : periods[rng() % 4];
    const RateRule r = rule(RateStrategy::kSlidingWindow, limit, Nanos{p});
    // A time the clock can reach with two more periods after it (the steady clock counts from
    // boot: far below 2^63 ns).
    const std::int64_t room = std::numeric_limits<std::int64_t>::max() / p - 3;
    const std::int64_t start = p * (room > 0 ? static_cast<std::int64_t>(rng() % 3) % room : 0);
    const Nanos now{start + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(p))};
    SlidingWindowState s;
    s.window_start = start;
    s.previous = rng() % (limit / (1 + rng() % 4) + 1);
    s.current = rng() % (limit - std::min(limit, s.previous / 2) + 1);
    const std::uint64_t hits = 1 + rng() % limit;
    const RateDecision d = decide(s, r, hits, now, false);
    if (d.allowed || d.retry_after == Nanos::max()) continue;
    ++checked;
    ASSERT_GT(d.retry_after, Nanos{0});
    ASSERT_TRUE(decide(s, r, hits, now + d.retry_after, false).allowed)
        << "limit " << limit << " period " << p << " prev " << s.previous << " cur " << s.current
        << " hits " << hits << " retry_after " << d.retry_after.count();
    if (d.retry_after > Nanos{1}) {
      ASSERT_FALSE(decide(s, r, hits, now + d.retry_after - Nanos{1}, false).allowed)
          << "limit " << limit << " period " << p << " prev " << s.previous << " cur " << s.current
          << " hits " << hits << " retry_after " << d.retry_after.count();
    }
  }
  EXPECT_GT(checked, 50'000);
}

// Random requests against a 128-bit count, for windows with limits above 2^63.
TEST(WindowExtremes, FixedWindowMatchesAWideCounter) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 50; ++round) {
    const std::uint64_t limit = kU64Max - rng() % 1000;
    const RateRule r = rule(RateStrategy::kFixedWindow, limit, milliseconds(10));
    FixedWindowState s;
    u128 count = 0;
    std::int64_t window = -1;
    std::int64_t now = 1'000'000'000;
    for (int step = 0; step < 200; ++step) {
      now += static_cast<std::int64_t>(rng() % 3'000'000);
      if (now / 10'000'000 != window) {
        window = now / 10'000'000;
        count = 0;
      }
      const std::uint64_t hits = rng() % 2 == 0 ? rng() : rng() % 100;
      const bool want = hits <= limit && count + hits <= limit;
      const RateDecision d = decide(s, r, hits, Nanos{now});
      ASSERT_EQ(d.allowed, want) << "round " << round << " step " << step << " count " << str(count)
                                 << " hits " << hits;
      if (want) count += hits;
      ASSERT_EQ(d.remaining, static_cast<std::uint64_t>(limit - count));
    }
  }
}

// A new limit applies to what each key has already spent.
TEST(RateCarry, ANewLimitKeepsWhatEachKeySpent) {
  for (const RateStrategy st :
       {RateStrategy::kFixedWindow, RateStrategy::kSlidingWindow, RateStrategy::kGcra}) {
    const RateRule from = rule(st, 100, seconds(10));
    const RateRule to = rule(st, 50, seconds(10));
    ASSERT_TRUE(can_carry(from, to));
    const Nanos now = seconds(100) + milliseconds(1);
    FixedWindowState f;
    SlidingWindowState sl;
    GcraState g;
    auto run = [&](const RateRule& r, std::uint64_t hits, Nanos at, bool commit = true) {
      switch (st) {
        case RateStrategy::kFixedWindow:
          return decide(f, r, hits, at, commit);
        case RateStrategy::kSlidingWindow:
          return decide(sl, r, hits, at, commit);
        case RateStrategy::kGcra:
          return decide(g, r, hits, at, commit);
      }
      return RateDecision{};
    };
    ASSERT_TRUE(run(from, 40, now).allowed);
    carry(f, from, to, now);
    carry(sl, from, to, now);
    carry(g, from, to, now);
    const RateDecision d = run(to, 0, now);
    EXPECT_EQ(d.remaining, 10u) << to_string(st);
    EXPECT_TRUE(run(to, 10, now, false).allowed) << to_string(st);
    EXPECT_FALSE(run(to, 11, now, false).allowed) << to_string(st);
    // Down to below what was spent: nothing left, no wrap.
    const RateRule tiny = rule(st, 30, seconds(10));
    carry(f, to, tiny, now);
    carry(sl, to, tiny, now);
    carry(g, to, tiny, now);
    const RateDecision none = run(tiny, 1, now);
    EXPECT_FALSE(none.allowed) << to_string(st);
    EXPECT_EQ(none.remaining, 0u) << to_string(st);
    EXPECT_GT(none.retry_after, Nanos{0}) << to_string(st);
    EXPECT_NE(none.retry_after, Nanos::max()) << to_string(st);
  }
  EXPECT_FALSE(can_carry(rule(RateStrategy::kGcra, 5, seconds(1)),
                         rule(RateStrategy::kGcra, 5, seconds(2))));
  EXPECT_FALSE(can_carry(rule(RateStrategy::kGcra, 5, seconds(1)),
                         rule(RateStrategy::kFixedWindow, 5, seconds(1))));
}

// GCRA carried at awkward ratios: the key owes the same hits (exactly) and drains at the new
// rate from the carry on, as a model bucket rebuilt with the owed tokens would.
TEST(RateCarry, GcraCarriesItsDebtExactly) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    const Nanos p = Nanos{1 + static_cast<std::int64_t>(rng() % 2'000'000'000)};
    const std::uint64_t l1 = 1 + rng() % 1000, l2 = 1 + rng() % 1000;
    const RateRule from = rule(RateStrategy::kGcra, l1, p), to = rule(RateStrategy::kGcra, l2, p);
    GcraState s;
    const std::int64_t t0 = 1'000'000'000'000;
    const std::uint64_t spent = rng() % (l1 + 1);
    if (spent > 0) {
      ASSERT_TRUE(decide(s, from, spent, Nanos{t0}).allowed);
    }
    const std::int64_t t1 = t0 + static_cast<std::int64_t>(rng() % p.count());
    carry(s, from, to, Nanos{t1});
    // What is owed at t1, in hits * period (the model's units): spent * p - (t1 - t0) * l1.
    const u128 drained = static_cast<u128>(t1 - t0) * l1;
    const u128 owed = static_cast<u128>(spent) * static_cast<u128>(p.count());
    const u128 debt = owed > drained ? owed - drained : 0;
    const u128 cap = static_cast<u128>(l2) * static_cast<u128>(p.count());
    const RateDecision d = decide(s, to, 0, Nanos{t1});
    const u128 tokens = debt >= cap ? 0 : cap - debt;
    ASSERT_EQ(d.remaining, static_cast<std::uint64_t>(tokens / static_cast<u128>(p.count())))
        << "round " << round;
    ASSERT_EQ(static_cast<u128>(d.reset_after.count()), debt == 0 ? 0 : (debt + l2 - 1) / l2)
        << "round " << round;
  }
}

}  // namespace
}  // namespace sluice
