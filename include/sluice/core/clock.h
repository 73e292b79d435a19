// clock.h: the one time seam of sluice.
//
// Every decision that needs the time takes a `const Clock&` (or is handed a `now` argument), so
// tests and simulations drive it with ManualClock, which only moves when told to. The OS clocks
// are read directly only for what no decision depends on: an I/O call's deadline (a socket, a
// child process, a gRPC call, the coordinators' call gate), a background reader's sleep, and
// wall-clock stamps (unix_ms_now() below). The files that do are listed, each with its reason, in
// tests/style/check_clock_reads.py, which fails on a read anywhere else.
//
// Thread-safety: SteadyClock is stateless. ManualClock is safe to read from any thread while
// one thread advances it (the time is one relaxed atomic: readers need no ordering with other
// memory, only a value that never goes backwards).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace sluice {

// A duration or a point on a monotonic clock, in nanoseconds since the clock's epoch.
using Nanos = std::chrono::nanoseconds;

// The wall clock, in milliseconds since the Unix epoch: for stamps that leave the process (a
// deadline written to a table other servers read, a field of a JSON answer), never for timing.
[[nodiscard]] std::int64_t unix_ms_now() noexcept;
// The same in nanoseconds: the time a coordinator without a clock of its own (etcd) decides at,
// agreed between servers only as well as their clocks are synchronised.
[[nodiscard]] Nanos unix_ns_now() noexcept;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic: never returns a value smaller than an earlier call on the same clock.
  [[nodiscard]] virtual Nanos now() const noexcept = 0;
};

// The process's monotonic clock (CLOCK_MONOTONIC through std::chrono::steady_clock).
class SteadyClock final : public Clock {
 public:
  [[nodiscard]] Nanos now() const noexcept override;
  // A shared instance for code that has no clock injected (the CLI, benchmarks).
  static const SteadyClock& instance() noexcept;
};

// CLOCK_MONOTONIC_COARSE: the same epoch as SteadyClock, read without the hardware counter (on a
// VM measured at 6.6 ns against 26.6), at the kernel tick's resolution (resolution(): 4 ms at
// HZ=250, 1 ms at HZ=1000). It lags the true time by less than a tick, so a decision taken on it
// is one taken up to a tick early. What that costs a rate limit (RateLimiter's clock): in any
// interval of T, at most ceil(r x tick) hits more than the rule allows at the true time
// (r = limit / period), and a retry_after up to a tick too long: one hit at most for a rule of
// one hit per tick or slower. Nothing else changes: the decisions are the exact strategy's on
// the times read.
class CoarseSteadyClock final : public Clock {
 public:
  [[nodiscard]] Nanos now() const noexcept override;
  // The clock's resolution (clock_getres).
  [[nodiscard]] static Nanos resolution() noexcept;
  static const CoarseSteadyClock& instance() noexcept;
};

// A clock that stands still until advance() or set() moves it.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = Nanos{0}) noexcept : now_ns_(start.count()) {}

  [[nodiscard]] Nanos now() const noexcept override {
    return Nanos{now_ns_.load(std::memory_order_relaxed)};
  }
  void advance(Nanos d) noexcept { now_ns_.fetch_add(d.count(), std::memory_order_relaxed); }
  // Moves the clock to `t`; a `t` earlier than now() is ignored (the clock stays monotonic).
  void set(Nanos t) noexcept;

 private:
  std::atomic<std::int64_t> now_ns_;
};

}  // namespace sluice
