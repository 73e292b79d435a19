#include "sluice/rate_strategy.h"

#include <algorithm>
#include <limits>

namespace sluice {
namespace {

__extension__ typedef __int128 i128;  // GCC and Clang: exact 64x64-bit products
constexpr Nanos kNever = Nanos::max();

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

std::int64_t clamp64(i128 v) {
  if (v > std::numeric_limits<std::int64_t>::max()) return std::numeric_limits<std::int64_t>::max();
  if (v < std::numeric_limits<std::int64_t>::min()) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v);
}

std::uint64_t burst_of(const RateRule& r) { return r.burst != 0 ? r.burst : r.limit; }

// GCRA: the time `hits` hits cost, rounded up (so rounding never admits more than the rate).
std::int64_t cost(const RateRule& r, std::uint64_t hits) {
  const i128 num = static_cast<i128>(r.period.count()) * hits;
  return clamp64((num + r.limit - 1) / r.limit);
}

// GCRA: how many more hits fit in `slack` ns of tolerance.
std::uint64_t hits_within(const RateRule& r, std::int64_t slack) {
  if (slack <= 0) return 0;
  auto h = static_cast<std::uint64_t>(static_cast<i128>(slack) * r.limit / r.period.count());
  while (h > 0 && cost(r, h) > slack) --h;
  return h;
}

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

RateDecision decide(FixedWindowState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit) noexcept {
  const std::int64_t p = rule.period.count();
  const std::int64_t start = floor_div(now.count(), p) * p;
  std::uint64_t count = s.window_start == start ? s.count : 0;
  RateDecision d;
  d.limit = rule.limit;
  const Nanos window_end{start + p - now.count()};
  if (hits > rule.limit || count + hits > rule.limit) {
    d.remaining = rule.limit - count;
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
  // Everything scaled by p: estimate * p = prev * (p - elapsed) + cur * p.
  const i128 weighted_prev = static_cast<i128>(prev) * (p - elapsed);
  const i128 cap = static_cast<i128>(rule.limit) * p;
  RateDecision d;
  d.limit = rule.limit;
  const bool allowed =
      hits <= rule.limit && weighted_prev + static_cast<i128>(cur + hits) * p <= cap;
  const std::uint64_t cur_after = allowed ? cur + hits : cur;
  const i128 left = cap - weighted_prev - static_cast<i128>(cur_after) * p;
  d.remaining = left > 0 ? static_cast<std::uint64_t>(left / p) : 0;
  if (cur_after > 0)
    d.reset_after = Nanos{start + 2 * p - n};
  else if (prev > 0)
    d.reset_after = Nanos{start + p - n};
  if (allowed) {
    d.allowed = true;
    if (commit && hits > 0) {
      s.window_start = start;
      s.current = cur_after;
      s.previous = prev;
    }
    return d;
  }
  if (hits > rule.limit) {
    d.retry_after = kNever;
  } else if (cur + hits <= rule.limit) {
    // This window: wait until the previous window's weight has fallen far enough.
    const i128 room = static_cast<i128>(rule.limit - cur - hits) * p;
    const std::int64_t at = p - clamp64(room / prev);  // elapsed needed
    d.retry_after = Nanos{std::max<std::int64_t>(1, start + at - n)};
  } else {
    // The next window, where this window's count is the previous one.
    const i128 room = static_cast<i128>(rule.limit - hits) * p;
    const std::int64_t x = p - clamp64(room / cur);
    d.retry_after = Nanos{std::max<std::int64_t>(1, start + p + x - n)};
  }
  return d;
}

RateDecision decide(GcraState& s, const RateRule& rule, std::uint64_t hits, Nanos now,
                    bool commit) noexcept {
  const std::int64_t n = now.count();
  const std::uint64_t burst = burst_of(rule);
  const std::int64_t tolerance = cost(rule, burst);
  const std::int64_t tat = std::max(s.tat, n);
  RateDecision d;
  d.limit = burst;
  if (hits > burst) {
    d.remaining = hits_within(rule, clamp64(static_cast<i128>(n) + tolerance - tat));
    d.reset_after = Nanos{tat - n};
    d.retry_after = kNever;
    return d;
  }
  const std::int64_t new_tat = clamp64(static_cast<i128>(tat) + cost(rule, hits));
  const std::int64_t allow_at = new_tat - tolerance;
  if (n < allow_at) {
    d.remaining = hits_within(rule, clamp64(static_cast<i128>(n) + tolerance - tat));
    d.reset_after = Nanos{tat - n};
    d.retry_after = Nanos{allow_at - n};
    return d;
  }
  d.allowed = true;
  d.remaining = hits_within(rule, clamp64(static_cast<i128>(n) + tolerance - new_tat));
  d.reset_after = Nanos{new_tat - n};
  if (commit && hits > 0) s.tat = new_tat;
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
  // own time (tat then no longer holds the refunded cost): 8 bytes of state cannot tell.
  if (s.tat == INT64_MIN) return;
  s.tat = clamp64(static_cast<i128>(s.tat) - cost(rule, hits));
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

bool is_idle(const GcraState& s, const RateRule& /*rule*/, Nanos now) noexcept {
  return s.tat <= now.count();
}

}  // namespace sluice
