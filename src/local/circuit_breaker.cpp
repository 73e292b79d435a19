// circuit_breaker.h: closed, open, half-open.
#include "sluice/local/circuit_breaker.h"

#include <algorithm>

namespace sluice {

std::string_view circuit_breaker_error(const CircuitBreakerOptions& o) noexcept {
  if (o.failures < 1) return "failures: must be at least 1";
  if (o.open_for <= Nanos{0}) return "open_for: must be more than 0";
  if (o.max_open_for < o.open_for) return "max_open_for: must be at least open_for";
  if (o.probes < 1) return "probes: must be at least 1";
  if (o.successes < 1) return "successes: must be at least 1";
  return {};
}

std::string_view to_string(BreakerState s) noexcept {
  switch (s) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half_open";
  }
  return "?";
}

CircuitBreaker::Ticket CircuitBreaker::enter(Nanos now) noexcept {
  const BreakerState seen = state_.load(std::memory_order_acquire);
  if (seen == BreakerState::kClosed)
    return {Ticket::Kind::kNormal, spell_.load(std::memory_order_relaxed)};
  if (seen == BreakerState::kOpen && now.count() < open_until_ns_.load(std::memory_order_acquire))
    return {};  // open, its spell not over (a stale read only sends this call to the lock)
  std::lock_guard lock(mu_);
  BreakerState s = state_.load(std::memory_order_relaxed);
  if (s == BreakerState::kClosed)
    return {Ticket::Kind::kNormal, spell_.load(std::memory_order_relaxed)};
  if (s == BreakerState::kOpen) {
    if (now < open_until_) return {};
    s = BreakerState::kHalfOpen;
    state_.store(s, std::memory_order_release);
    spell_.fetch_add(1, std::memory_order_relaxed);
    probes_in_flight_ = 0;
    probe_successes_ = 0;
  }
  if (probes_in_flight_ >= options_.probes) return {};
  ++probes_in_flight_;
  return {Ticket::Kind::kProbe, spell_.load(std::memory_order_relaxed)};
}

void CircuitBreaker::cancel(const Ticket& t) noexcept {
  if (t.kind != Ticket::Kind::kProbe) return;
  std::lock_guard lock(mu_);
  if (spell_.load(std::memory_order_relaxed) == t.spell && probes_in_flight_ > 0)
    --probes_in_flight_;
}

void CircuitBreaker::finish(const Ticket& t, Result r, Nanos now) noexcept {
  switch (t.kind) {
    case Ticket::Kind::kRefused:
      return;
    case Ticket::Kind::kNormal: {
      if (r == Result::kNeutral || spell_.load(std::memory_order_relaxed) != t.spell) return;
      if (r == Result::kSuccess) {
        if (failures_.load(std::memory_order_relaxed) != 0)
          failures_.store(0, std::memory_order_relaxed);
        return;
      }
      if (failures_.fetch_add(1, std::memory_order_relaxed) + 1 < options_.failures) return;
      std::lock_guard lock(mu_);
      if (state_.load(std::memory_order_relaxed) == BreakerState::kClosed &&
          spell_.load(std::memory_order_relaxed) == t.spell &&
          failures_.load(std::memory_order_relaxed) >= options_.failures)
        open_locked(now, options_.open_for);
      return;
    }
    case Ticket::Kind::kProbe: {
      std::lock_guard lock(mu_);
      if (spell_.load(std::memory_order_relaxed) != t.spell) return;  // an earlier spell's
      if (probes_in_flight_ > 0) --probes_in_flight_;
      if (r == Result::kNeutral) return;
      if (r == Result::kFailure) {
        open_locked(now, std::min(open_for_ * 2, options_.max_open_for));
        return;
      }
      if (++probe_successes_ < options_.successes) return;
      failures_.store(0, std::memory_order_relaxed);
      open_for_ = options_.open_for;
      spell_.fetch_add(1, std::memory_order_relaxed);
      state_.store(BreakerState::kClosed, std::memory_order_release);
      return;
    }
  }
}

void CircuitBreaker::open_locked(Nanos now, Nanos spell) noexcept {
  open_for_ = spell;
  open_until_ = now + spell;
  open_until_ns_.store(open_until_.count(), std::memory_order_release);
  ++opened_;
  failures_.store(0, std::memory_order_relaxed);
  spell_.fetch_add(1, std::memory_order_relaxed);
  state_.store(BreakerState::kOpen, std::memory_order_release);
}

CircuitBreaker::Snapshot CircuitBreaker::snapshot(Nanos now) const noexcept {
  std::lock_guard lock(mu_);
  Snapshot s;
  s.state = state_.load(std::memory_order_relaxed);
  s.failures_in_a_row = failures_.load(std::memory_order_relaxed);
  s.open_for = open_for_;
  s.opened = opened_;
  if (s.state == BreakerState::kOpen) {
    if (now >= open_until_)
      s.state = BreakerState::kHalfOpen;
    else
      s.reopens_in = open_until_ - now;
  }
  return s;
}

}  // namespace sluice
