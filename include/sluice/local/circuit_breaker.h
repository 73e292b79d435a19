// circuit_breaker.h: a circuit breaker for one node of a fallback cascade (closed, open,
// half-open).
//
// What it is: the guard a node's concurrency limit cannot be. A node that fails fast (a crashed
// process answering "connection refused", a 500 on every call) never fills its limit, so the
// limit never stops calls to it; the cascade's weights send it almost nothing, but not nothing.
// The breaker stops them:
//   closed     calls pass. `failures` failures in a row open it.
//   open       calls are refused without being made (the cascade goes to the next node, and no
//              permit of the node is taken). After `open_for` it lets probes through:
//   half-open  at most `probes` calls at once are let through as probes. `successes` probe
//              successes close it; a probe failure opens it again, for twice the last spell (up
//              to `max_open_for`), so a node that stays down is probed ever more rarely. Other
//              calls are refused as when open.
// A probe is an ordinary call on the node: the cascade takes it a permit of the node's guard, so
// probes count against the node's concurrency limit and cannot swamp a recovering node.
//
// Outcomes: kSuccess and kFailure as the cascade reports them (a timeout, an overload refusal
// and an error are all failures); kNeutral says nothing of the node (the caller gave up). A
// call let through while closed that finishes after the breaker opened counts for nothing; so
// does a probe of an earlier half-open spell.
//
// Cost: while closed, enter() is one relaxed load and a success one load (and a store after a
// failure); a failure is one fetch_add. While open, enter() refuses with two loads until the
// spell is over. The mutex is taken only to change state and while half-open.
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "sluice/core/clock.h"

namespace sluice {

struct CircuitBreakerOptions {
  std::uint32_t failures = 5;                     // failures in a row that open it (>= 1)
  Nanos open_for = std::chrono::seconds(5);       // the first open spell (> 0)
  Nanos max_open_for = std::chrono::seconds(30);  // the longest (>= open_for); the stat window
  std::uint32_t probes = 1;                       // probes at once while half-open (>= 1)
  std::uint32_t successes = 1;                    // probe successes that close it (>= 1)
  friend bool operator==(const CircuitBreakerOptions&, const CircuitBreakerOptions&) = default;
};
// Why `o` is unusable, naming the field; empty when it is fine.
[[nodiscard]] std::string_view circuit_breaker_error(const CircuitBreakerOptions& o) noexcept;

enum class BreakerState : std::uint8_t { kClosed, kOpen, kHalfOpen };
// "closed", "open", "half_open".
[[nodiscard]] std::string_view to_string(BreakerState s) noexcept;

class CircuitBreaker {
 public:
  // What enter() let through, to be handed back to finish() or cancel().
  struct Ticket {
    enum class Kind : std::uint8_t { kRefused, kNormal, kProbe };
    Kind kind = Kind::kRefused;
    std::uint32_t spell = 0;  // which closed or half-open spell let it through
    [[nodiscard]] bool admitted() const noexcept { return kind != Kind::kRefused; }
  };
  enum class Result : std::uint8_t { kSuccess, kFailure, kNeutral };

  // `o` must pass circuit_breaker_error().
  explicit CircuitBreaker(CircuitBreakerOptions o = {}) noexcept : options_(o) {}

  // Whether a call may be made at `now` (a refused ticket: it may not).
  [[nodiscard]] Ticket enter(Nanos now) noexcept;
  // The call `t` let through was not made after all (the node had no room): a probe's place
  // is given back.
  void cancel(const Ticket& t) noexcept;
  // How the call `t` let through went, at `now`.
  void finish(const Ticket& t, Result r, Nanos now) noexcept;

  struct Snapshot {
    BreakerState state = BreakerState::kClosed;  // open past its spell reads as half-open
    std::uint32_t failures_in_a_row = 0;
    Nanos open_for{0};         // the current (or next) open spell
    Nanos reopens_in{0};       // open: time left until probes are let through
    std::uint64_t opened = 0;  // times it has opened
  };
  [[nodiscard]] Snapshot snapshot(Nanos now) const noexcept;
  // Whether it is closed now (one relaxed load).
  [[nodiscard]] bool closed() const noexcept {
    return state_.load(std::memory_order_relaxed) == BreakerState::kClosed;
  }
  [[nodiscard]] const CircuitBreakerOptions& options() const noexcept { return options_; }

 private:
  void open_locked(Nanos now, Nanos spell) noexcept;

  const CircuitBreakerOptions options_;
  std::atomic<BreakerState> state_{BreakerState::kClosed};
  std::atomic<std::uint32_t> failures_{0};  // in a row, while closed
  std::atomic<std::uint32_t> spell_{0};     // bumped at every state change
  mutable std::mutex mu_;                   // guards the fields below and every state change
  Nanos open_until_{0};
  std::atomic<std::int64_t> open_until_ns_{0};  // open_until_, for enter()'s lock-free refusal
  Nanos open_for_{options_.open_for};
  std::uint32_t probes_in_flight_ = 0;
  std::uint32_t probe_successes_ = 0;
  std::uint64_t opened_ = 0;
};

}  // namespace sluice
