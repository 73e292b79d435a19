#include "sluice/core/rate_strategy.h"

#include <algorithm>
#include <limits>

namespace sluice {
namespace {

__extension__ typedef __int128 i128;  // GCC and Clang: exact 64x64-bit products
__extension__ typedef unsigned __int128 u128;
constexpr Nanos kNever = Nanos::max();
constexpr i128 kMax128 = ((i128{1} << 126) - 1) * 2 + 1;
constexpr i128 kMin128 = -kMax128 - 1;

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

std::int64_t clamp64(i128 v) {
  if (v > std::numeric_limits<std::int64_t>::max()) return std::numeric_limits<std::int64_t>::max();
  if (v < std::numeric_limits<std::int64_t>::min()) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v);
}

std::uint64_t clampu64(i128 v) {
  if (v <= 0) return 0;
  if (v > static_cast<i128>(std::numeric_limits<std::uint64_t>::max()))
    return std::numeric_limits<std::uint64_t>::max();
  return static_cast<std::uint64_t>(v);
}

// Saturating 128-bit arithmetic (it saturates only for times beyond 2^62 ns).
i128 sat_add(i128 a, i128 b) {
  i128 r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? kMax128 : kMin128;
  return r;
}
i128 sat_sub(i128 a, i128 b) {
  i128 r;
  if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? kMax128 : kMin128;
  return r;
}

// Ceiling of a / b for a >= 0, b > 0.
i128 ceil_div(i128 a, i128 b) { return a / b + (a % b != 0 ? 1 : 0); }

// n / d and n % d for n whose quotient fits in 64 bits (n's high half below d), in one
// 128-by-64-bit hardware division on x86-64; elsewhere the 128-bit library division (which the
// GCRA's every check would otherwise call, twice). The same numbers either way.
struct QuotientRemainder {
  std::uint64_t q, r;
};
QuotientRemainder divide_fitting(u128 n, std::uint64_t d) noexcept {
#if defined(__x86_64__)
  std::uint64_t q, r;
  __asm__("divq %[d]"
          : "=a"(q), "=d"(r)
          : "a"(static_cast<std::uint64_t>(n)),
            "d"(static_cast<std::uint64_t>(n >> 64)), [d] "rm"(d)
          : "cc");
  return {q, r};
#else
  return {static_cast<std::uint64_t>(n / d), static_cast<std::uint64_t>(n % d)};
#endif
}
bool quotient_fits(u128 n, std::uint64_t d) noexcept {
  return static_cast<std::uint64_t>(n >> 64) < d;
}

std::uint64_t burst_of(const RateRule& r) { return r.burst != 0 ? r.burst : r.limit; }

// GCRA, all in units of 1 / limit ns: a hit costs `period` of them exactly. The key's debt is
// how far its theoretical arrival time is ahead of now (>= 0); the tolerance is burst * period.
struct Gcra {
  i128 now_scaled;  // now * limit
  i128 tolerance;   // burst * period
  i128 debt;        // max(tat - now, 0), scaled

  Gcra(const GcraState& s, const RateRule& r, Nanos now)
      : now_scaled(static_cast<i128>(now.count()) * static_cast<i128>(r.limit)),
        tolerance(static_cast<i128>(burst_of(r)) * r.period.count()),
        debt(std::max<i128>(0, sat_sub(s.tat_scaled, now_scaled))) {}

  // Whole hits that still fit on top of `d` (rounded down).
  std::uint64_t remaining(i128 d, const RateRule& r) const {
    if (d >= tolerance) return 0;
    const auto room = static_cast<u128>(tolerance - d);
    const auto period = static_cast<std::uint64_t>(r.period.count());
    if (quotient_fits(room, period)) return divide_fitting(room, period).q;
    return clampu64(static_cast<i128>(room / period));
  }
  // The whole ns until a debt `d` has drained to `to` (rounded up).
  static Nanos until(i128 d, i128 to, const RateRule& r) {
    if (d <= to) return Nanos{0};
    const auto left = static_cast<u128>(d - to);
    if (quotient_fits(left, r.limit)) {
      const QuotientRemainder qr = divide_fitting(left, r.limit);
      return Nanos{clamp64(static_cast<i128>(qr.q) + (qr.r != 0 ? 1 : 0))};
    }
    return Nanos{clamp64(ceil_div(static_cast<i128>(left), static_cast<i128>(r.limit)))};
  }
};

}  // namespace

std::string_view to_string(RateStrategy s) noexcept {
  switch (s) {
    case RateStrategy::kFixedWindow:
      return "fixed-window";
    case RateStrategy::kSlidingWindow:
      return "sliding-window";
    case RateStrategy::kGcra:
      return "gcra";
  }
  return "unknown";
}

std::string RateRule::validate() const {
  if (limit < 1) return "limit must be >= 1";
  if (period <= Nanos{0}) return "period must be > 0";
  if (period > kMaxRatePeriod) return "period must be at most 876000h (100 years)";
  if (burst != 0 && strategy != RateStrategy::kGcra)
    return "burst applies to the gcra strategy only";
  return {};
}

// Whether `hits` more fit on top of `count` under `limit`, without computing count + hits (it
// can wrap for limits above 2^63). A count can exceed the limit after the limit was lowered.
bool fits(std::uint64_t count, std::uint64_t hits, std::uint64_t limit) {
  return count <= limit && hits <= limit - count;
}

RateDecision decide(FixedWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit) noexcept {
  const std::int64_t p = rule.period.count();
  const std::int64_t start = floor_div(now.count(), p) * p;
  std::uint64_t count = s.window_start == start ? s.count : 0;
  RateDecision d;
  d.limit = rule.limit;
  const Nanos window_end{p - (now.count() - start)};  // start + p - now, without overflow
  if (!fits(count, hits, rule.limit)) {
    d.remaining = count < rule.limit ? rule.limit - count : 0;
    d.reset_after = count > 0 ? window_end : Nanos{0};
    d.retry_after = hits > rule.limit ? kNever : window_end;
    return d;
  }
  count += hits;
  d.allowed = true;
  d.remaining = rule.limit - count;
  d.reset_after = count > 0 ? window_end : Nanos{0};
  if (commit && hits > 0) {
    s.window_start = start;
    s.count = count;
  }
  return d;
}

RateDecision decide(SlidingWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit) noexcept {
  const std::int64_t p = rule.period.count();
  const std::int64_t n = now.count();
  const std::int64_t start = floor_div(n, p) * p;
  std::uint64_t cur = 0, prev = 0;
  if (s.window_start == start) {
    cur = s.current;
    prev = s.previous;
  } else if (s.window_start == start - p) {
    prev = s.current;
  }
  const std::int64_t elapsed = n - start;
  // Everything scaled by p, unsigned 128 bits (each term below 2^127):
  //   estimate * p = prev * (p - elapsed) + cur * p.
  const auto up = static_cast<u128>(p);
  const u128 weighted_prev = static_cast<u128>(prev) * static_cast<u128>(p - elapsed);
  const u128 cap = static_cast<u128>(rule.limit) * up;
  RateDecision d;
  d.limit = rule.limit;
  const bool allowed =
      hits <= rule.limit && weighted_prev + (static_cast<u128>(cur) + hits) * up <= cap;
  const u128 cur_after = allowed ? static_cast<u128>(cur) + hits : cur;
  const u128 used = weighted_prev + cur_after * up;
  d.remaining = used < cap ? static_cast<std::uint64_t>((cap - used) / up) : 0;
  if (cur_after > 0)
    d.reset_after = Nanos{2 * p - elapsed};  // start + 2p - n, which could overflow
  else if (prev > 0)
    d.reset_after = Nanos{p - elapsed};
  if (allowed) {
    d.allowed = true;
    if (commit && hits > 0) {
      s.window_start = start;
      s.current = static_cast<std::uint64_t>(cur_after);
      s.previous = prev;
    }
    return d;
  }
  if (hits > rule.limit) {
    d.retry_after = kNever;
  } else if (fits(cur, hits, rule.limit)) {
    // This window: wait until the previous window's weight has fallen far enough (prev > 0,
    // or it would have passed): the smallest elapsed e with prev * (p - e) <= room.
    const u128 room = static_cast<u128>(rule.limit - cur - hits) * up;
    const std::int64_t at = p - static_cast<std::int64_t>(std::min(room / prev, up));
    d.retry_after = Nanos{std::max<std::int64_t>(1, at - elapsed)};
  } else {
    // The next window, where this window's count is the previous one (cur > 0): the smallest
    // x into it with cur * (p - x) <= (limit - hits) * p.
    const u128 room = static_cast<u128>(rule.limit - hits) * up;
    const std::int64_t x = p - static_cast<std::int64_t>(std::min(room / cur, up));
    d.retry_after = Nanos{std::max<std::int64_t>(1, p + x - elapsed)};
  }
  return d;
}

RateDecision decide(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit) noexcept {
  const Gcra g(s, rule, now);
  RateDecision d;
  d.limit = burst_of(rule);
  if (hits > d.limit) {
    d.remaining = g.remaining(g.debt, rule);
    d.reset_after = Gcra::until(g.debt, 0, rule);
    d.retry_after = kNever;
    return d;
  }
  const i128 after = sat_add(g.debt, static_cast<i128>(hits) * rule.period.count());
  if (after > g.tolerance) {
    d.remaining = g.remaining(g.debt, rule);
    d.reset_after = Gcra::until(g.debt, 0, rule);
    d.retry_after = Gcra::until(after, g.tolerance, rule);  // >= 1 ns: after > tolerance
    return d;
  }
  d.allowed = true;
  d.remaining = g.remaining(after, rule);
  d.reset_after = Gcra::until(after, 0, rule);
  if (commit && hits > 0) s.tat_scaled = sat_add(g.now_scaled, after);
  return d;
}

void refund(FixedWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept {
  const std::int64_t p = rule.period.count();
  if (s.window_start == floor_div(now.count(), p) * p) s.count -= std::min(hits, s.count);
}

void refund(SlidingWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept {
  const std::int64_t p = rule.period.count();
  // Only while the key is still in the window the hits were admitted in: once a later check
  // has moved it on, the hits sit in `previous` beside that check's, and which of them are
  // ours is not known, so they stay spent.
  if (s.window_start == floor_div(now.count(), p) * p) s.current -= std::min(hits, s.current);
}

void refund(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos /*now*/) noexcept {
  // The admission moved tat from max(tat0, then) by cost(hits); moving it back lands on or
  // after tat0, and a tat in the past decides like any other. Not exact when, between the
  // check and the refund, the key drained completely and a later check restarted it from its
  // own time (tat then no longer holds the refunded cost): one timestamp cannot tell.
  if (s.tat_scaled == GcraState::kUnused) return;
  s.tat_scaled = sat_sub(s.tat_scaled, static_cast<i128>(hits) * rule.period.count());
}

namespace {

// The allowance a state leaves at `now`, with its overdraft: what a check of no hit reports,
// and when a check of one would pass.
template <class State>
RateCharge allowance(const State& s, const RateRule& rule, Nanos now, std::uint64_t overdraft) {
  State copy = s;
  const RateDecision none = decide(copy, rule, 0, now, /*commit=*/false);
  const RateDecision one = decide(copy, rule, 1, now, /*commit=*/false);
  RateCharge c;
  c.limit = none.limit;
  c.remaining = none.allowed ? none.remaining : 0;
  c.overdraft = overdraft;
  c.reset_after = none.reset_after;
  c.retry_after = one.allowed ? Nanos{0} : one.retry_after;
  return c;
}

std::uint64_t sat_add64(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}

}  // namespace

RateCharge charge(FixedWindowState& s, const RateRule& rule, std::uint64_t hits,
                  Nanos now) noexcept {
  const std::int64_t p = rule.period.count();
  const std::int64_t start = floor_div(now.count(), p) * p;
  const std::uint64_t count = sat_add64(s.window_start == start ? s.count : 0, hits);
  if (hits > 0) {
    s.window_start = start;
    s.count = count;
  }
  return allowance(s, rule, now, count > rule.limit ? count - rule.limit : 0);
}

RateCharge charge(SlidingWindowState& s, const RateRule& rule, std::uint64_t hits,
                  Nanos now) noexcept {
  const std::int64_t p = rule.period.count();
  const std::int64_t start = floor_div(now.count(), p) * p;
  std::uint64_t cur = 0, prev = 0;
  if (s.window_start == start) {
    cur = s.current;
    prev = s.previous;
  } else if (s.window_start == start - p) {
    prev = s.current;
  }
  cur = sat_add64(cur, hits);
  if (hits > 0) {
    s.window_start = start;
    s.current = cur;
    s.previous = prev;
  }
  // The estimate over the limit, scaled by p as in decide() (each term below 2^127), in whole
  // hits rounded up.
  const auto up = static_cast<u128>(p);
  const u128 used = static_cast<u128>(prev) * static_cast<u128>(p - (now.count() - start)) +
                    static_cast<u128>(cur) * up;
  const u128 cap = static_cast<u128>(rule.limit) * up;
  const u128 over = used > cap ? (used - cap + up - 1) / up : 0;
  return allowance(s, rule, now, static_cast<std::uint64_t>(std::min<u128>(over, UINT64_MAX)));
}

RateCharge charge(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos now) noexcept {
  const Gcra g(s, rule, now);
  const i128 after = sat_add(g.debt, static_cast<i128>(hits) * rule.period.count());
  if (hits > 0) s.tat_scaled = sat_add(g.now_scaled, after);
  // The debt past the tolerance, in whole hits rounded up.
  const i128 over = after > g.tolerance ? ceil_div(after - g.tolerance, rule.period.count()) : 0;
  return allowance(s, rule, now, clampu64(over));
}

bool can_carry(const RateRule& from, const RateRule& to) noexcept {
  return from.strategy == to.strategy && from.period == to.period;
}

void carry(FixedWindowState& /*s*/, const RateRule& /*from*/, const RateRule& /*to*/,
           Nanos /*now*/) noexcept {}

void carry(SlidingWindowState& /*s*/, const RateRule& /*from*/, const RateRule& /*to*/,
           Nanos /*now*/) noexcept {}

void carry(GcraState& s, const RateRule& from, const RateRule& to, Nanos now) noexcept {
  // The debt, scaled, is (hits owed) * period whatever the limit: it carries over as it is,
  // against the new limit's scale of now.
  if (s.tat_scaled == GcraState::kUnused) return;
  const i128 debt = Gcra(s, from, now).debt;
  s.tat_scaled = sat_add(static_cast<i128>(now.count()) * static_cast<i128>(to.limit), debt);
}

Nanos idle_within(const RateRule& rule) noexcept {
  switch (rule.strategy) {
    case RateStrategy::kFixedWindow:
      return rule.period;
    case RateStrategy::kSlidingWindow:
      return 2 * rule.period;
    case RateStrategy::kGcra:
      return Gcra::until(static_cast<i128>(burst_of(rule)) * rule.period.count(), 0, rule);
  }
  return rule.period;
}

bool is_idle(const FixedWindowState& s, const RateRule& rule, Nanos now) noexcept {
  const std::int64_t p = rule.period.count();
  return s.count == 0 || s.window_start != floor_div(now.count(), p) * p;
}

bool is_idle(const SlidingWindowState& s, const RateRule& rule, Nanos now) noexcept {
  const std::int64_t p = rule.period.count();
  const std::int64_t start = floor_div(now.count(), p) * p;
  // Its current window has become older than the previous one: nothing of it counts any more.
  return (s.current == 0 && s.previous == 0) || s.window_start < start - p ||
         (s.window_start == start - p && s.current == 0);
}

bool is_idle(const GcraState& s, const RateRule& rule, Nanos now) noexcept {
  return s.tat_scaled <= static_cast<i128>(now.count()) * static_cast<i128>(rule.limit);
}

}  // namespace sluice
