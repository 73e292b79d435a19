#include "sluice/core/escrow.h"

#include <algorithm>
#include <cmath>

#include "sluice/core/rate_strategy.h"

namespace sluice {

std::string_view to_string(LeaseStatus s) noexcept {
  switch (s) {
    case LeaseStatus::kGranted:
      return "granted";
    case LeaseStatus::kSpent:
      return "spent";
    case LeaseStatus::kWindowEnding:
      return "window_ending";
    case LeaseStatus::kStateLost:
      return "state_lost";
    case LeaseStatus::kSpecMismatch:
      return "spec_mismatch";
    case LeaseStatus::kShort:
      return "short";
  }
  return "unknown";
}

std::string validate(const LeaseRequest& r) {
  if (r.region.empty()) return "region: must not be empty";
  if (r.spec.limit == 0) return "limit: must be at least 1";
  if (r.spec.period <= Nanos{0}) return "period: must be positive";
  if (r.spec.period > kMaxRatePeriod) return "period: must be at most 100 years";
  if (r.want == 0) return "want: must be at least 1";
  if (r.need > r.want) return "need: must be at most want";
  if (r.min_window_left < Nanos{0}) return "min_window_left: must not be negative";
  return {};
}

Nanos window_of(Nanos now, Nanos period) noexcept {
  const std::int64_t p = period.count();
  std::int64_t q = now.count() / p;
  if (now.count() % p < 0) --q;  // floor, also before the epoch
  return Nanos{q * p};
}

namespace {

RegionLedger& region_of(Ledger& l, std::string_view region) {
  auto it =
      std::lower_bound(l.regions.begin(), l.regions.end(), region,
                       [](const RegionLedger& r, std::string_view id) { return r.region < id; });
  if (it == l.regions.end() || it->region != region) {
    it = l.regions.insert(it, RegionLedger{});
    it->region = std::string(region);
  }
  return *it;
}

// Moves the ledger to the window starting at `start` with `spec`: the whole budget, no grants.
// Regions that did nothing in the window that ends are forgotten; the others keep their running
// totals of what they gave up, so a late reconcile of that window is recognised as a repeat.
void roll(Ledger& l, std::int64_t start, const BudgetSpec& spec) {
  std::erase_if(l.regions, [&](const RegionLedger& r) {
    return r.granted == 0 && r.relinquished_window < l.window_start;
  });
  for (RegionLedger& r : l.regions) r.granted = 0;
  l.window_start = start;
  l.spec = spec;
  l.granted = 0;
  l.returned = 0;
}

std::uint64_t left_in(const Ledger& l) noexcept {
  const std::uint64_t used = l.granted - std::min(l.returned, l.granted);
  return l.spec.limit - std::min(used, l.spec.limit);
}

bool window_open(const Ledger& l, std::int64_t now) noexcept {
  return l.window_start != INT64_MIN && now < l.window_start + l.spec.period.count();
}

}  // namespace

LeaseReply lease(Ledger& l, const LeaseRequest& req, Nanos now_in, std::int64_t origin_window) {
  const std::int64_t now = std::max(now_in.count(), l.clock_high);
  l.clock_high = now;
  LeaseReply out;
  out.coordinator_now = Nanos{now};
  if (!window_open(l, now)) {
    // A new window, aligned on the asker's period. With another period than the last window's
    // it may start before that one ended, but nothing is admitted in it before `now`, which is
    // past that end.
    roll(l, window_of(Nanos{now}, req.spec.period).count(), req.spec);
  }
  out.window_start = Nanos{l.window_start};
  out.window_end = Nanos{l.window_start + l.spec.period.count()};
  out.spec = l.spec;
  if (l.spec != req.spec) {
    out.status = LeaseStatus::kSpecMismatch;
    out.remaining = left_in(l);
    return out;
  }
  if (l.window_start <= origin_window) {
    out.status = LeaseStatus::kStateLost;
    return out;
  }
  const std::uint64_t left = left_in(l);
  out.remaining = left;
  if (out.window_end.count() - now < req.min_window_left.count()) {
    out.status = LeaseStatus::kWindowEnding;
    return out;
  }
  if (left == 0) {
    out.status = LeaseStatus::kSpent;
    return out;
  }
  if (left < req.need) {
    out.status = LeaseStatus::kShort;
    return out;
  }
  RegionLedger& me = region_of(l, req.region);
  std::uint64_t regions = me.granted == 0 ? 1 : 0;
  for (const RegionLedger& r : l.regions) regions += r.granted > 0 ? 1 : 0;
  const std::uint64_t taper = std::max<std::uint64_t>(1, (left + 2 * regions - 1) / (2 * regions));
  // The taper shares what is left among the regions leasing, but never below what the asking
  // check needs (a part of it would only sit here unspent).
  const std::uint64_t g = std::min(left, std::max(req.need, std::min(req.want, taper)));
  l.granted += g;
  me.granted += g;
  out.status = LeaseStatus::kGranted;
  out.granted = g;
  out.remaining = left - g;
  return out;
}

std::uint64_t reconcile(Ledger& l, std::string_view region, Nanos window_start,
                        std::uint64_t relinquished, Nanos now_in) {
  const std::int64_t now = std::max(now_in.count(), l.clock_high);
  const std::int64_t w = window_start.count();
  if (l.window_start == INT64_MIN || w > l.window_start) return 0;  // a window never leased
  RegionLedger& r = region_of(l, region);
  if (r.relinquished_window > w) return 0;  // an older window than it already reported: stale
  const std::uint64_t before = r.relinquished_window == w ? r.relinquished : 0;
  if (relinquished <= before) return 0;  // a repeat
  std::uint64_t delta = relinquished - before;
  r.relinquished_window = w;
  r.relinquished = relinquished;
  if (w == l.window_start && window_open(l, now)) {
    // Still the current window: the units go back into its budget, never more than the region
    // was granted in it (what it gave up before included).
    const std::uint64_t held = r.granted - std::min(before, r.granted);
    delta = std::min(delta, held);
    l.returned += delta;
    return delta;
  }
  l.forfeited += delta;
  return 0;
}

std::uint64_t remaining(const Ledger& l, const BudgetSpec& spec, Nanos now_in,
                        std::int64_t origin_window) noexcept {
  const std::int64_t now = std::max(now_in.count(), l.clock_high);
  if (!window_open(l, now)) {
    const std::int64_t start = window_of(Nanos{now}, spec.period).count();
    return start <= origin_window ? 0 : spec.limit;
  }
  if (l.window_start <= origin_window) return 0;
  return left_in(l);
}

namespace {
// `left`, less its drift allowance (rounded up), never negative.
std::int64_t less_drift(std::int64_t left, std::uint32_t drift_ppm) noexcept {
  left = std::max<std::int64_t>(0, left);
  __extension__ typedef __int128 Wide;
  const auto allowance =
      static_cast<std::int64_t>((static_cast<Wide>(left) * drift_ppm + 999'999) / 1'000'000);
  return left - std::min(allowance, left);
}
}  // namespace

Nanos escrow_expiry(const LeaseReply& reply, Nanos sent_at, std::uint32_t drift_ppm) noexcept {
  const std::int64_t left =
      less_drift(reply.window_end.count() - reply.coordinator_now.count(), drift_ppm);
  return sent_at +
         Nanos{left - std::min(left, std::max<std::int64_t>(0, reply.clock_uncertainty.count()))};
}

void DriftGauge::sample(Nanos sent, Nanos received, Nanos coordinator_now) noexcept {
  const Reading x{sent, std::max(sent, received), coordinator_now};
  if (!anchor_) {
    anchor_ = x;
    return;
  }
  if (!next_) {
    next_ = x;
  } else if (x.sent - next_->sent >= kRenew) {
    anchor_ = next_;
    next_ = x;
  }
  // The coordinator's elapsed time against the region's, which lies within
  // [x.sent - anchor.received, x.received - anchor.sent].
  const std::int64_t shortest = (x.sent - anchor_->received).count();
  const std::int64_t longest = (x.received - anchor_->sent).count();
  if (shortest < kMinSpan.count()) return;
  const auto theirs = static_cast<double>((x.coordinator - anchor_->coordinator).count());
  // A coordinator clock that steps (Redis TIME is the wall clock) can read as any rate: the
  // bounds are clamped to +-10^9 ppm before they become integers.
  const auto ppm = [](double ratio) { return std::clamp((ratio - 1) * 1e6, -1e9, 1e9); };
  high_ppm_ = static_cast<std::int64_t>(std::ceil(ppm(theirs / static_cast<double>(shortest))));
  low_ppm_ = static_cast<std::int64_t>(std::floor(ppm(theirs / static_cast<double>(longest))));
  measured_ = true;
}

std::uint32_t drift_in_force(const DriftGauge& gauge, std::uint32_t configured) noexcept {
  if (!gauge.measured() || gauge.low_ppm() <= static_cast<std::int64_t>(configured))
    return configured;
  return static_cast<std::uint32_t>(std::min<std::int64_t>(gauge.high_ppm(), 500'000));
}

std::uint64_t add_grant(Escrow& e, const LeaseReply& reply, Nanos expires_at) noexcept {
  if (reply.granted == 0) return 0;
  const std::int64_t w = reply.window_start.count();
  if (w < e.window_start) return reply.granted;  // a reply for a window already over here
  std::uint64_t lost = 0;
  if (w > e.window_start) {
    lost = e.units;
    e = Escrow{};
    e.window_start = w;
    e.expires_at = expires_at;
  } else {
    // Each bound is no later than the window's true end: the later one is as safe and tighter.
    e.expires_at = std::max(e.expires_at, expires_at);
  }
  e.units += reply.granted;
  e.granted += reply.granted;
  return lost;
}

std::uint64_t usable(const Escrow& e, Nanos now) noexcept {
  return now < e.expires_at ? e.units : 0;
}

bool spend(Escrow& e, std::uint64_t hits, Nanos now) noexcept {
  if (usable(e, now) < hits) return false;
  e.units -= hits;
  e.spent += hits;
  return true;
}

void unspend(Escrow& e, std::uint64_t hits, Nanos now) noexcept {
  if (now >= e.expires_at) return;
  const std::uint64_t back = std::min(hits, e.spent);
  e.units += back;
  e.spent -= back;
}

std::uint64_t relinquish(Escrow& e) noexcept {
  e.relinquished += e.units;
  e.units = 0;
  return e.relinquished;
}

// ---- the regional pool ----

namespace {
std::int64_t pool_clock(RegionalPool& p, Nanos now) noexcept {
  p.clock_high = std::max(now.count(), p.clock_high);
  return p.clock_high;
}

PoolReply pool_state(const RegionalPool& p, std::int64_t now) noexcept {
  PoolReply out;
  out.balance = p.balance;
  out.demand = p.demand;
  out.window_start = Nanos{p.window_start};
  out.expires_in = p.window_start == INT64_MIN ? Nanos{0} : Nanos{p.expires_at - now};
  out.now = Nanos{now};
  return out;
}
}  // namespace

PoolReply pool_take(RegionalPool& p, std::uint64_t want, Nanos refill_hold, bool past_expiry,
                    Nanos now_in) noexcept {
  const std::int64_t now = pool_clock(p, now_in);
  const bool live = now < p.expires_at || past_expiry;
  const std::uint64_t g = live ? std::min(want, p.balance) : 0;
  p.balance -= g;
  // Capped at 2^53, as the Redis pool's numbers are (exact Lua doubles).
  constexpr std::uint64_t kDemandCap = std::uint64_t{1} << 53;
  p.demand = std::min(kDemandCap, p.demand + std::min(want, kDemandCap));
  PoolReply out = pool_state(p, now);
  out.granted = g;
  if (g < want && now >= p.refilling_until) {
    out.refill = true;
    p.refilling_until = now + std::max<std::int64_t>(1, refill_hold.count());
  }
  return out;
}

PoolReply pool_refill(RegionalPool& p, Nanos window_start, std::uint64_t units, Nanos expires_at,
                      Nanos now_in) noexcept {
  const std::int64_t now = pool_clock(p, now_in);
  p.refilling_until = INT64_MIN;
  const std::int64_t w = window_start.count();
  std::uint64_t accepted = 0;
  if (units > 0 && now < expires_at.count() && w >= p.window_start) {
    if (w > p.window_start) {
      p.window_start = w;
      p.expires_at = expires_at.count();
      p.balance = 0;
      p.demand = 0;
    } else {
      // Each expiry is no later than the window's end: the later one is as safe and tighter.
      p.expires_at = std::max(p.expires_at, expires_at.count());
    }
    p.balance += units;
    accepted = units;
  }
  PoolReply out = pool_state(p, now);
  out.granted = accepted;
  return out;
}

PoolReply pool_release(RegionalPool& p, Nanos window_start, std::uint64_t units,
                       Nanos now_in) noexcept {
  const std::int64_t now = pool_clock(p, now_in);
  std::uint64_t accepted = 0;
  if (window_start.count() == p.window_start && now < p.expires_at) {
    p.balance += units;
    accepted = units;
  }
  PoolReply out = pool_state(p, now);
  out.granted = accepted;
  return out;
}

std::uint64_t regional_refill_size(const PoolReply& take, Nanos period,
                                   std::uint64_t regional_batch) noexcept {
  const bool last_window = take.window_start.count() != INT64_MIN && take.expires_in <= Nanos{0} &&
                           take.expires_in > -period;
  return last_window ? std::min(regional_batch, take.demand) : regional_batch;
}

Nanos pool_expiry(Nanos pool_now, Nanos seen_at, Nanos escrow_expires,
                  std::uint32_t drift_ppm) noexcept {
  return pool_now + Nanos{less_drift((escrow_expires - seen_at).count(), drift_ppm)};
}

Nanos taken_expiry(const PoolReply& reply, Nanos sent_at, std::uint32_t drift_ppm) noexcept {
  return sent_at + Nanos{less_drift(reply.expires_in.count(), drift_ppm)};
}

}  // namespace sluice
