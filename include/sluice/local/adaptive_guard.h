// adaptive_guard.h: a concurrency guard whose ceiling a LimitAlgorithm infers from the RTTs
// and drops of the calls it admits.
//
// What it is: enforcement (a lock-free Semaphore whose limit is the ceiling) plus windowed
// sampling that feeds a LimitAlgorithm. acquire() admits a call while in_flight < ceiling and
// returns a move-only GuardPermit; the permit's release(outcome, rtt) records how the call
// ended. Completed calls accumulate into a sampling window; when a window is complete its
// sample (representative RTT, most calls in flight, whether any call was dropped) is fed to the
// algorithm once, and the new ceiling is published:
//
//   ceiling = min(cap, algorithm limit)      (cap: set_cap(), e.g. a fleet share; default none)
//
// Under a cap below the algorithm's limit, the sample's in-flight count is scaled by
// limit / cap: a capped guard is not application-limited, and the algorithm must see it using
// the same fraction of its limit as it uses of the cap (else L_local could never grow).
//
// Windows (after the reference "windowed limit"; defaults identical): a window completes when
// at least `window_size` RTT samples have arrived AND `min_window_time`..`max_window_time` has
// elapsed (the next window lasts clamp(2 * smallest RTT seen, min, max)). Its RTT is the
// average of its samples, or a percentile of the most recent `percentile_capacity`. Samples
// with an RTT below `min_rtt_threshold` are not RTT evidence and are skipped. Deliberate
// differences: a window that expires with too few samples stays open (it is not discarded), so
// a low-rate caller still adapts; a window with a drop completes as soon as its time is up,
// whatever its sample count, and a drop counts even when its RTT is below the threshold.
//
// Invariants:
//   - An admission happens only at in_flight < ceiling in force (one atomic RMW; Semaphore).
//   - Lowering the ceiling (algorithm or cap) never revokes a held permit; in_flight drains.
//   - Every admitted permit is released exactly once; a permit destroyed unreleased counts as
//     Outcome::kIgnored: it gives its unit back and feeds nothing to the algorithm.
//   - A permit renewed (GuardPermit::renew) records its call's outcome as a release would and
//     keeps its unit for the caller's next call: in_flight is unchanged, and that call is counted
//     accepted without passing the ceiling (it already held a unit).
//   - The algorithm is called by one thread at a time, never more than once per window.
//
// Thread-safety: every member is safe to call concurrently, except algorithm_name() with
// replace_algorithm() (the name is the algorithm's). acquire() and release() never
// block, allocate, take a mutex or do I/O: samples accumulate in relaxed atomics; the clock is
// read only when a window may be complete (by the release that brings the window to
// `window_size` samples, then every `clock_check_interval` samples; on a drop, and every
// `clock_check_interval` samples while a drop waits to be reported); the
// release that finds the window complete runs the algorithm under a non-blocking try-lock (an
// atomic flag) and a release that loses the flag just leaves its sample recorded. set_cap()
// takes the same flag and may wait (yielding) for a window close in progress.
//
// Memory order: window accumulators and stats counters are relaxed (they publish no other
// memory; a sample that races with a window close may land in either window). The try-lock
// flag is taken with acquire and cleared with release, so the algorithm's state and the
// closer-only fields written by one closer happen-before the next closer reads them. Published
// values (algorithm limit, cap, window deadline) are written only under the flag and read
// relaxed: a stale read can only delay a clock check or show a just-superseded limit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "sluice/core/clock.h"
#include "sluice/core/limit_algorithm.h"
#include "sluice/local/semaphore.h"

namespace sluice {

// How a call ended, as recorded by a permit.
enum class Outcome : std::uint8_t {
  kSuccess,  // completed; its RTT is latency evidence
  kDropped,  // timed out or refused by the backend as overloaded: the limit must come down
  kIgnored,  // says nothing about the backend (cancelled, client error): no sample
};

// Which statistic of a window's RTTs is fed to the algorithm.
enum class WindowRtt : std::uint8_t { kAverage, kPercentile };

struct AdaptiveGuardOptions {
  // Shortest window; > 0. Default 1 s.
  Nanos min_window_time = std::chrono::seconds(1);
  // Longest window; >= min_window_time. Default 1 s.
  Nanos max_window_time = std::chrono::seconds(1);
  // RTTs below this are not samples; >= 0. Default 100 us.
  Nanos min_rtt_threshold = std::chrono::microseconds(100);
  // RTT samples a window needs before it can complete; >= 1. Default 10.
  std::uint32_t window_size = 10;
  // Window statistic. Default kAverage.
  WindowRtt window_rtt = WindowRtt::kAverage;
  // For kPercentile: which percentile, in (0, 1). Default 0.99.
  double percentile = 0.99;
  // For kPercentile: the most recent RTTs kept per window; a power of two. Default 256.
  std::uint32_t percentile_capacity = 256;
  // Once a window has window_size samples, every this many samples one release reads the
  // clock to see whether the window's time is up; a power of two. Default 8.
  std::uint32_t clock_check_interval = 8;

  // Empty when valid, else what is wrong. The guard repairs what this rejects.
  [[nodiscard]] std::string_view validate() const noexcept;
};

// A consistent-enough snapshot for metrics and tests (each field is read atomically; the
// fields are not one atomic snapshot, except in_flight and limit, which are).
struct AdaptiveGuardStats {
  std::uint32_t in_flight;        // calls holding a permit
  std::uint32_t limit;            // ceiling in force: min(cap, algorithm_limit)
  std::uint32_t algorithm_limit;  // the algorithm's limit (L_local)
  std::uint32_t cap;              // AdaptiveGuard::kNoCap when none
  std::uint64_t accepted;         // permits granted
  std::uint64_t rejected;         // acquire() calls refused
  std::uint64_t dropped;          // permits released as kDropped
  std::uint64_t ignored;          // permits released as kIgnored (or destroyed unreleased)
  std::uint64_t windows;          // samples fed to the algorithm
};

class GuardPermit;

class AdaptiveGuard {
 public:
  static constexpr std::uint32_t kNoCap = std::numeric_limits<std::uint32_t>::max();

  // `algorithm` must not be null; `clock` must outlive the guard.
  AdaptiveGuard(std::unique_ptr<LimitAlgorithm> algorithm, const Clock& clock,
                AdaptiveGuardOptions options = {});
  AdaptiveGuard(const AdaptiveGuard&) = delete;
  AdaptiveGuard& operator=(const AdaptiveGuard&) = delete;
  ~AdaptiveGuard();

  // Admits one call if in_flight < limit(). Never blocks. The guard must outlive the permit.
  [[nodiscard]] std::optional<GuardPermit> acquire() noexcept;

  // Sets the external cap (kNoCap removes it); the ceiling becomes min(cap, algorithm limit).
  // Lowering it never revokes held permits. May wait for a window close in progress.
  void set_cap(std::uint32_t cap) noexcept;

  // Replaces the limit algorithm (a reconfigured policy): the ceiling becomes min(cap, the new
  // algorithm's limit). In-flight permits stay counted (the semaphore is the same) and release
  // into this guard as before; lowering the ceiling never revokes them. The open window's
  // samples are fed to the new algorithm when it closes. `algorithm` must not be null. May
  // wait for a window close in progress.
  void replace_algorithm(std::unique_ptr<LimitAlgorithm> algorithm) noexcept;

  [[nodiscard]] std::uint32_t limit() const noexcept { return sem_.limit(); }
  [[nodiscard]] std::uint32_t algorithm_limit() const noexcept {
    return algorithm_limit_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint32_t cap() const noexcept { return cap_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint32_t in_flight() const noexcept { return sem_.in_flight(); }
  [[nodiscard]] AdaptiveGuardStats stats() const noexcept;
  // The algorithm's name. Not to be called concurrently with replace_algorithm().
  [[nodiscard]] std::string_view algorithm_name() const noexcept { return algorithm_->name(); }

 private:
  friend class GuardPermit;

  // Called exactly once per admitted permit. `in_flight` is the count seen at admission.
  void complete(Outcome outcome, Nanos rtt, std::uint32_t in_flight) noexcept;
  // What complete() records of a call, without giving its unit back.
  void observe(Outcome outcome, Nanos rtt, std::uint32_t in_flight) noexcept;
  // A renewed permit's next call: counted accepted; returns in_flight and whether it is within
  // the ceiling.
  std::pair<std::uint32_t, bool> renewed() noexcept;
  // Adds one RTT sample; returns the number of RTT samples in the current window.
  std::uint64_t record(std::int64_t rtt_ns, std::uint32_t in_flight) noexcept;
  void observe_dropped(Nanos rtt, std::uint32_t in_flight) noexcept;
  // Reads the clock; closes the window if its time is up and the try-lock is free.
  void try_close_window() noexcept;
  void close_window_locked(Nanos now) noexcept;
  [[nodiscard]] std::uint32_t demand_locked(std::uint32_t max_in_flight) const noexcept;
  [[nodiscard]] std::int64_t window_rtt_locked(std::uint64_t first, std::uint64_t end,
                                               std::uint64_t sum) noexcept;
  void publish_ceiling_locked() noexcept;
  void lock_spin() noexcept;

  static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
  static_assert(std::atomic<std::int64_t>::is_always_lock_free);
  static_assert(std::atomic<std::uint32_t>::is_always_lock_free);

  // Enforcement: the ceiling and the in-flight count, in one word (own cache line).
  Semaphore sem_;

  // Window accumulators, written by every sampled release (relaxed; one cache line).
  struct alignas(64) Window {
    std::atomic<std::uint64_t> samples{0};  // RTT samples ever recorded (monotonic)
    std::atomic<std::uint64_t> rtt_sum_ns{0};
    std::atomic<std::int64_t> min_rtt_ns{std::numeric_limits<std::int64_t>::max()};
    std::atomic<std::uint32_t> max_in_flight{0};
    std::atomic<bool> dropped{false};
  } window_;

  // Counters (relaxed; their own line so admissions do not contend with sampling).
  struct alignas(64) Counters {
    std::atomic<std::uint64_t> accepted{0};
    std::atomic<std::uint64_t> rejected{0};
    std::atomic<std::uint64_t> dropped{0};
    std::atomic<std::uint64_t> ignored{0};
    std::atomic<std::uint64_t> windows{0};
  } counters_;

  // Control: written only while holding closing_ (except the flag itself), read relaxed.
  alignas(64) std::atomic_flag closing_;
  std::atomic<std::int64_t> deadline_ns_;       // the current window may close at/after this
  std::atomic<std::uint64_t> window_first_{0};  // `samples` value at which this window began
  std::atomic<std::uint32_t> algorithm_limit_;
  std::atomic<std::uint32_t> cap_{kNoCap};

  // Immutable after construction.
  const AdaptiveGuardOptions options_;
  const Clock& clock_;
  std::uint64_t check_mask_;  // clock_check_interval - 1
  std::uint64_t ring_mask_;   // percentile_capacity - 1

  // Closer-only state (guarded by closing_).
  std::unique_ptr<LimitAlgorithm> algorithm_;
  std::unique_ptr<std::atomic<std::int64_t>[]> ring_;  // kPercentile: recent RTTs, by sample no.
  std::unique_ptr<std::int64_t[]> scratch_;            // kPercentile: sort buffer
};

// A move-only token for one call admitted by an AdaptiveGuard. release(outcome, rtt) records
// how the call ended and gives the unit back; later calls do nothing. Destroying a permit that
// was not released releases it as Outcome::kIgnored (never as a success). Not thread-safe
// itself: one owner at a time (the guard it points to is).
class [[nodiscard]] GuardPermit {
 public:
  GuardPermit() noexcept = default;
  GuardPermit(GuardPermit&& other) noexcept
      : guard_(std::exchange(other.guard_, nullptr)), in_flight_(other.in_flight_) {}
  GuardPermit& operator=(GuardPermit&& other) noexcept {
    if (this != &other) {
      release(Outcome::kIgnored, Nanos{0});
      guard_ = std::exchange(other.guard_, nullptr);
      in_flight_ = other.in_flight_;
    }
    return *this;
  }
  GuardPermit(const GuardPermit&) = delete;
  GuardPermit& operator=(const GuardPermit&) = delete;
  ~GuardPermit() { release(Outcome::kIgnored, Nanos{0}); }

  // Records the outcome (with the call's RTT; ignored for kIgnored) and gives the unit back.
  // Idempotent: only the first call counts.
  void release(Outcome outcome, Nanos rtt) noexcept {
    if (AdaptiveGuard* g = std::exchange(guard_, nullptr)) g->complete(outcome, rtt, in_flight_);
  }
  // Records the call's outcome as release() does, but keeps the unit: the permit now carries
  // the holder's next call (counted accepted, its in-flight count taken now). Returns whether
  // that call is within the ceiling (in_flight <= limit); false when the ceiling came down
  // below the calls in flight, and the holder should release the permit after it. Not held:
  // does nothing, returns false.
  bool renew(Outcome outcome, Nanos rtt) noexcept {
    if (guard_ == nullptr) return false;
    guard_->observe(outcome, rtt, in_flight_);
    const auto [in_flight, within] = guard_->renewed();
    in_flight_ = in_flight;
    return within;
  }
  [[nodiscard]] bool held() const noexcept { return guard_ != nullptr; }
  explicit operator bool() const noexcept { return held(); }
  // Calls in flight when this one was admitted (itself included).
  [[nodiscard]] std::uint32_t in_flight_at_admission() const noexcept { return in_flight_; }

 private:
  friend class AdaptiveGuard;
  GuardPermit(AdaptiveGuard* guard, std::uint32_t in_flight) noexcept
      : guard_(guard), in_flight_(in_flight) {}

  AdaptiveGuard* guard_ = nullptr;
  std::uint32_t in_flight_ = 0;
};

// ---- hot path, inline ----

inline std::optional<GuardPermit> AdaptiveGuard::acquire() noexcept {
  if (!sem_.try_acquire_unit()) [[unlikely]] {
    counters_.rejected.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  counters_.accepted.fetch_add(1, std::memory_order_relaxed);
  return GuardPermit(this, sem_.in_flight());
}

inline std::uint64_t AdaptiveGuard::record(std::int64_t rtt_ns, std::uint32_t in_flight) noexcept {
  const std::uint64_t number = window_.samples.fetch_add(1, std::memory_order_relaxed);
  window_.rtt_sum_ns.fetch_add(static_cast<std::uint64_t>(rtt_ns), std::memory_order_relaxed);
  if (ring_) ring_[number & ring_mask_].store(rtt_ns, std::memory_order_relaxed);
  // Min and max: a load, and a CAS only when this sample sets a new extreme (rare in steady
  // state, so the common case writes nothing).
  std::int64_t lo = window_.min_rtt_ns.load(std::memory_order_relaxed);
  while (rtt_ns < lo &&
         !window_.min_rtt_ns.compare_exchange_weak(lo, rtt_ns, std::memory_order_relaxed)) {
  }
  std::uint32_t hi = window_.max_in_flight.load(std::memory_order_relaxed);
  while (in_flight > hi &&
         !window_.max_in_flight.compare_exchange_weak(hi, in_flight, std::memory_order_relaxed)) {
  }
  const std::uint64_t first = window_first_.load(std::memory_order_relaxed);
  return number + 1 > first ? number + 1 - first : 0;
}

inline void AdaptiveGuard::complete(Outcome outcome, Nanos rtt, std::uint32_t in_flight) noexcept {
  sem_.release_unit();
  observe(outcome, rtt, in_flight);
}

inline void AdaptiveGuard::observe(Outcome outcome, Nanos rtt, std::uint32_t in_flight) noexcept {
  if (outcome != Outcome::kSuccess) [[unlikely]] {
    if (outcome == Outcome::kDropped) {
      observe_dropped(rtt, in_flight);
    } else {
      counters_.ignored.fetch_add(1, std::memory_order_relaxed);
    }
    return;
  }
  if (rtt < options_.min_rtt_threshold) return;
  const std::uint64_t n = record(rtt.count(), in_flight);
  // Clock checks: at window_size samples, then every clock_check_interval samples; before
  // window_size only if a drop is waiting to be reported (a drop-carrying window completes on
  // time whatever its size), also every clock_check_interval samples.
  const bool due = n >= options_.window_size
                       ? ((n - options_.window_size) & check_mask_) == 0
                       : (n & check_mask_) == 0 && window_.dropped.load(std::memory_order_relaxed);
  if (due) [[unlikely]]
    try_close_window();
}

}  // namespace sluice
