#include "sluice/core/shared_rate.h"

#include <algorithm>

namespace sluice {
namespace {

__extension__ typedef __int128 i128;

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

std::uint64_t burst_of(const RateRule& r) { return r.burst != 0 ? r.burst : r.limit; }

// Raises `s` (written before `origin`) to at least what a key spent to its limit at `origin`
// holds (the header's table). A window later than the origin's (a clock that stepped back) is
// kept as it is.
void raise(SharedRateState& s, const RateRule& rule, Nanos origin) {
  const std::int64_t p = rule.period.count();
  const std::int64_t ws = floor_div(origin.count(), p) * p;
  switch (rule.strategy) {
    case RateStrategy::kFixedWindow: {
      FixedWindowState& f = s.fixed;
      if (f.window_start == ws)
        f.count = std::max(f.count, rule.limit);
      else if (f.window_start < ws)
        f = {ws, rule.limit};
      return;
    }
    case RateStrategy::kSlidingWindow: {
      SlidingWindowState& w = s.sliding;
      if (w.window_start == ws) {
        w.current = std::max(w.current, rule.limit);
        w.previous = std::max(w.previous, rule.limit);
      } else if (w.window_start == ws - p) {
        w = {ws, rule.limit, std::max(w.current, rule.limit)};
      } else if (w.window_start < ws) {
        w = {ws, rule.limit, rule.limit};
      }
      return;
    }
    case RateStrategy::kGcra: {
      const i128 spent = static_cast<i128>(origin.count()) * static_cast<i128>(rule.limit) +
                         static_cast<i128>(burst_of(rule)) * rule.period.count();
      s.gcra.tat_scaled = std::max(s.gcra.tat_scaled, spent);
      return;
    }
  }
}

template <class State>
SharedRateReply run(State& st, const SharedRateRequest& r, Nanos now, bool& changed) {
  SharedRateReply out;
  out.coordinator_now = now;
  switch (r.op) {
    case SharedRateOp::kCheck:
      out.decision = decide(st, r.rule, r.hits, now);
      changed = changed || (out.decision.allowed && r.hits > 0);
      break;
    case SharedRateOp::kPeek:
      out.decision = decide(st, r.rule, r.hits, now, /*commit=*/false);
      break;
    case SharedRateOp::kRefund:
      refund(st, r.rule, r.hits, now);
      changed = changed || r.hits > 0;
      out.decision = decide(st, r.rule, 0, now, /*commit=*/false);
      break;
    case SharedRateOp::kCharge:
      out.charge = charge(st, r.rule, r.hits, now);
      changed = changed || r.hits > 0;
      out.decision = decide(st, r.rule, 0, now, /*commit=*/false);
      break;
    case SharedRateOp::kTake: {
      const RateDecision none = decide(st, r.rule, 0, now, /*commit=*/false);
      out.granted = none.allowed ? std::min(r.hits, none.remaining) : 0;
      if (out.granted > 0) {
        out.decision = decide(st, r.rule, out.granted, now);
        changed = true;
      } else {
        out.decision = decide(st, r.rule, r.hits == 0 ? 0 : 1, now, /*commit=*/false);
      }
      break;
    }
  }
  return out;
}

}  // namespace

std::string_view to_string(SharedRateOp op) noexcept {
  switch (op) {
    case SharedRateOp::kCheck:
      return "check";
    case SharedRateOp::kPeek:
      return "peek";
    case SharedRateOp::kRefund:
      return "refund";
    case SharedRateOp::kCharge:
      return "charge";
    case SharedRateOp::kTake:
      return "take";
  }
  return "unknown";
}

Nanos idle_at(const SharedRateState& s, const RateRule& rule) noexcept {
  const std::int64_t p = rule.period.count();
  const auto after = [](std::int64_t start, std::int64_t span) {
    return Nanos{start > INT64_MAX - span ? INT64_MAX : start + span};
  };
  switch (rule.strategy) {
    case RateStrategy::kFixedWindow:
      if (s.fixed.count == 0 || s.fixed.window_start == INT64_MIN) return Nanos::min();
      return after(s.fixed.window_start, p);
    case RateStrategy::kSlidingWindow:
      if ((s.sliding.current == 0 && s.sliding.previous == 0) ||
          s.sliding.window_start == INT64_MIN)
        return Nanos::min();
      return after(s.sliding.window_start, p > INT64_MAX / 2 ? INT64_MAX : 2 * p);
    case RateStrategy::kGcra: {
      if (s.gcra.tat_scaled == GcraState::kUnused) return Nanos::min();
      // Idle once now * limit >= tat * limit: from ceil(tat * limit / limit).
      const i128 l = static_cast<i128>(s.limit != 0 ? s.limit : rule.limit);
      const i128 t = s.gcra.tat_scaled;
      const i128 q = t / l + (t % l > 0 ? 1 : 0);
      if (q > INT64_MAX) return Nanos::max();
      if (q < INT64_MIN) return Nanos::min();
      return Nanos{static_cast<std::int64_t>(q)};
    }
  }
  return Nanos::max();
}

SharedRateState spent_at(const RateRule& rule, Nanos origin) noexcept {
  SharedRateState s;
  raise(s, rule, origin);
  return s;
}

SharedRateReply apply(SharedRateState& s, const SharedRateRequest& request, Nanos now, Nanos origin,
                      bool* changed) noexcept {
  const RateRule& rule = request.rule;
  bool write = false;
  // Carried first (the debt it holds is in hits, whichever limit made it), then raised under the
  // rule that decides.
  if (s.limit != 0 && s.limit != rule.limit) {
    RateRule from = rule;
    from.limit = s.limit;
    from.burst = 0;  // a GCRA debt does not depend on the burst
    carry(s.fixed, from, rule, now);
    carry(s.sliding, from, rule, now);
    carry(s.gcra, from, rule, now);
    write = true;
  }
  if (origin != kNoLoss && s.written <= origin.count()) raise(s, rule, origin);
  SharedRateReply out;
  switch (rule.strategy) {
    case RateStrategy::kFixedWindow:
      out = run(s.fixed, request, now, write);
      break;
    case RateStrategy::kSlidingWindow:
      out = run(s.sliding, request, now, write);
      break;
    case RateStrategy::kGcra:
      out = run(s.gcra, request, now, write);
      break;
  }
  if (write) {
    s.limit = rule.limit;
    s.written = now.count();
  }
  if (changed != nullptr) *changed = write;
  return out;
}

}  // namespace sluice
