// fleet_guard.h: a concurrency guard whose ceiling is one share of a fleet-wide L_global.
//
// What it is: an AdaptiveGuard (the fast loop: synchronous acquire(), RTT samples infer this
// node's L_local) whose cap is the share a ConcurrencyCoordinator grants (the slow loop: every
// `heartbeat` the node reports L_local, its in-flight count and the generation it enforces, and
// applies the grant). The effective ceiling is min(share, L_local): a local RTT spike lowers it
// at once, without waiting for a heartbeat.
//
//   phase      cap applied to the local guard
//   starting   fail-closed: 0; local-only: none (L_local) - until the first grant
//   active     the granted share
//   outage     fail-closed: 0; local-only: none (L_local) - after a heartbeat error
//   duplicate_id  0 in either mode - the coordinator refused the beat: another live member
//              holds this node id (kAlreadyExists, sluice::clash). The node keeps beating and
//              joins once that member leaves or its record expires
//   fenced     0 - fail-closed with self_fence, when the last successful beat's lease is about
//              to run out (sent_at + lease_ttl - fence_safety_margin); on_fenced runs once
//   closed     0 - after close() (the node left the fleet)
//
// Timers only deliver tick(now): the guard is an explicit state machine, and FleetGuardRunner
// (or a test with a ManualClock) calls tick at the times it asks for. The first beat is due at
// the first tick. With eager_handoff, off-cycle beats (debounced by min_heartbeat) fire when
// this node is capped below its fair share (budget is coming), when it applied a lowered grant
// (to confirm it), and when its in-flight has drained to a lowered share (budget is freed).
// Every coordinator call is bounded by call_timeout and, when fencing, by the fence deadline,
// so a hanging coordinator (a partition) never keeps a node admitting past its lease.
//
// Call deadline: every admitted call gets one (admission + call_deadline, FleetPermit::deadline)
// for the caller to pass on to the backend, and call_deadline + heartbeat + fence_safety_margin
// must be shorter than the lease (validate()). That is what keeps sum(in_flight) <= L_global
// when a node stalls (SIGSTOP, a long pause, a VM freeze) past its lease: the coordinator then
// gives its share to the others, and only calls that end by their deadline are sure to be gone
// by then. A node admits only while a call admitted now would end before the lease of its last
// successful beat runs out (sent_at + lease_ttl - fence_safety_margin - call_deadline), in
// fail-closed with self-fencing and in local-only (a node thawed after its lease ran out must
// not admit on the grant it held before; its next beat answers first). That leaves
// lease_ttl - fence_safety_margin - call_deadline - heartbeat for the next grant's round trip:
// when it takes longer, the node refuses calls for the difference. A permit still held past
// its deadline is no longer reported to the coordinator as in flight (the backend has stopped
// the call), and is released as dropped whatever its caller says.
//
// Thread-safety: acquire(), stats() and the permits are safe from any thread and never block.
// tick(), heartbeat() and close() must be called by one thread at a time (the runner's).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "sluice/core/coordinator.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice {

enum class OutageMode : std::uint8_t {
  kFailClosed,  // share -> 0 while the coordinator is unreachable: never overshoots
  kLocalOnly,   // share -> L_local: stays up; the fleet may overshoot (fan-out regime)
};

enum class FleetPhase : std::uint8_t {
  kStarting,
  kActive,
  kOutage,
  kFenced,
  kClosed,
  kDuplicateId
};

[[nodiscard]] std::string_view to_string(FleetPhase phase) noexcept;

struct FleetGuardOptions {
  std::string node_id;  // required: unique per process
  // Which member reports under node_id (sluice::clash); 0: drawn at random by the guard.
  std::uint64_t instance = 0;
  std::string key;  // required: every node fronting the same backend uses the same key
  // Heartbeat period; > 0. Default 1 s.
  Nanos heartbeat = std::chrono::seconds(1);
  // Lease of this node's record at the coordinator; > heartbeat. Default 2 x heartbeat.
  std::optional<Nanos> lease_ttl;
  // Default kFailClosed.
  OutageMode outage = OutageMode::kFailClosed;
  // Stop admitting before the coordinator could reclaim our share (fail-closed only).
  // Default on.
  bool self_fence = true;
  // How long before its lease's end the node fences, the lease counted on this node's clock
  // from the beat's send time; >= 0 and < lease_ttl. Default heartbeat / 4. The coordinator
  // starts the lease when the beat arrives (after it was sent), so it covers a node clock that
  // runs slower than the coordinator's (lease_ttl x the difference in rate). 0 fences exactly
  // when the lease runs out on this node's clock: safe while that clock runs no slower than
  // the coordinator's, with nothing to spare.
  std::optional<Nanos> fence_safety_margin;
  // Off-cycle beats when the allocation is stale. Default off.
  bool eager_handoff = false;
  // Least time between two beats (debounce of off-cycle beats); > 0. Default heartbeat / 10.
  std::optional<Nanos> min_heartbeat;
  // Longest a coordinator call may take; > 0. Default = heartbeat.
  std::optional<Nanos> call_timeout;
  // Longest an admitted call may run (its deadline: admission + call_deadline); > 0 and
  // call_deadline + heartbeat + fence_safety_margin < lease_ttl. Default
  // (lease_ttl - heartbeat - fence_safety_margin) / 2. When it is set and lease_ttl is not,
  // lease_ttl defaults to max(2 x heartbeat, call_deadline + heartbeat + 2 x margin).
  std::optional<Nanos> call_deadline;
  // Runs once each time the node fences (e.g. to abort in-flight calls). Must not block.
  std::function<void()> on_fenced;
  // The private adaptive guard's windows.
  AdaptiveGuardOptions local;

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;

  // The values in force, defaults applied.
  [[nodiscard]] Nanos lease_in_force() const noexcept;
  [[nodiscard]] Nanos fence_margin_in_force() const noexcept;
  [[nodiscard]] Nanos call_deadline_in_force() const noexcept;
};

struct FleetGuardStats {
  AdaptiveGuardStats local;  // in_flight, limit (the effective ceiling), algorithm_limit, ...
  FleetPhase phase = FleetPhase::kStarting;
  std::uint32_t share = 0;        // last granted
  std::uint32_t l_global = 0;     // last granted
  std::uint32_t l_aggregate = 0;  // last granted: the aggregate; < l_global while draining
  std::uint32_t nodes = 0;        // last granted
  std::uint64_t generation = 0;
  bool fenced = false;
  std::uint64_t heartbeats = 0;        // successful
  std::uint64_t heartbeat_errors = 0;  // failed (outage)
  std::uint64_t off_cycle_beats = 0;   // eager handoff
  std::uint64_t fences = 0;            // times the node fenced
  std::uint32_t overdue = 0;           // permits held past their call deadline (not reported)
  std::uint64_t late_releases = 0;     // permits released past their deadline (as dropped)
  std::uint64_t stale_refusals = 0;    // acquire() refused: the last grant's lease ran out
  // The last grant said the coordinator found a loss of its state within a lease_ttl (share 0
  // while the fleet reports what it holds: sluice/core/fleet.h); how many grants said so.
  bool recovering = false;
  std::uint64_t recovering_grants = 0;
};

class FleetGuard;

// A move-only token for one call admitted by a FleetGuard: a GuardPermit with the call's
// deadline. release(outcome, rtt) gives the unit back; a call released at or past its deadline
// (rtt >= call_deadline, or released ignored after it) is recorded as kDropped whatever the
// outcome says. Destroying it unreleased releases it as kIgnored (dropped if late). Not
// thread-safe itself: one owner at a time. The guard must outlive it.
class [[nodiscard]] FleetPermit {
 public:
  FleetPermit() noexcept = default;
  FleetPermit(FleetPermit&& other) noexcept
      : permit_(std::move(other.permit_)),
        guard_(std::exchange(other.guard_, nullptr)),
        deadline_(other.deadline_) {}
  FleetPermit& operator=(FleetPermit&& other) noexcept {
    if (this != &other) {
      release(Outcome::kIgnored, Nanos{0});
      permit_ = std::move(other.permit_);
      guard_ = std::exchange(other.guard_, nullptr);
      deadline_ = other.deadline_;
    }
    return *this;
  }
  FleetPermit(const FleetPermit&) = delete;
  FleetPermit& operator=(const FleetPermit&) = delete;
  ~FleetPermit() { release(Outcome::kIgnored, Nanos{0}); }

  // Records the outcome and gives the unit back. Idempotent: only the first call counts.
  void release(Outcome outcome, Nanos rtt) noexcept;
  // When the call must have ended, on the guard's clock: pass it on to the backend.
  [[nodiscard]] Nanos deadline() const noexcept { return deadline_; }
  [[nodiscard]] bool held() const noexcept { return guard_ != nullptr; }
  explicit operator bool() const noexcept { return held(); }

 private:
  friend class FleetGuard;
  FleetPermit(GuardPermit permit, FleetGuard* guard, Nanos deadline) noexcept
      : permit_(std::move(permit)), guard_(guard), deadline_(deadline) {}

  GuardPermit permit_;
  FleetGuard* guard_ = nullptr;
  Nanos deadline_{0};
};

class FleetGuard {
 public:
  // `coordinator` and `clock` must outlive the guard. Precondition: options.validate() is empty
  // (use create() to get the error instead).
  FleetGuard(ConcurrencyCoordinator& coordinator, std::unique_ptr<LimitAlgorithm> algorithm,
             const Clock& clock, FleetGuardOptions options);
  // Validates the options first.
  [[nodiscard]] static StatusOr<std::unique_ptr<FleetGuard>> create(
      ConcurrencyCoordinator& coordinator, std::unique_ptr<LimitAlgorithm> algorithm,
      const Clock& clock, FleetGuardOptions options);
  FleetGuard(const FleetGuard&) = delete;
  FleetGuard& operator=(const FleetGuard&) = delete;
  // Leaves the fleet if close() was not called.
  ~FleetGuard();

  // Admits while in_flight < min(share, L_local) and the last grant's lease still covers a call
  // admitted now (see the call deadline above). Never blocks. acquire() reads the guard's clock
  // (the permit's deadline needs the admission time: on a VM's clock that read costs more than
  // the rest of the admission); a caller that has read it already passes it.
  [[nodiscard]] std::optional<FleetPermit> acquire() noexcept { return acquire(clock_.now()); }
  [[nodiscard]] std::optional<FleetPermit> acquire(Nanos now) noexcept;

  // One heartbeat now: report, then apply the grant (or the outage mode). Never throws.
  Status heartbeat() noexcept;
  // Runs what is due at `now` (a beat, an off-cycle beat, the fence) and returns when tick
  // should run next. tick = poll, then the coordinator call, then complete.
  Nanos tick(Nanos now) noexcept;

  // A heartbeat in two halves, for a transport that does not block (and for the simulator,
  // which delays reports and grant replies): poll(now) fences if due and, when a beat is due
  // and none is outstanding, returns the report to send (read now: the generation this node
  // enforces, then its in-flight) and the longest the call may take; complete() applies the
  // reply. At most one beat is outstanding; a reply that comes after close() is dropped.
  struct Beat {
    NodeReport report;
    Nanos sent_at{0};
    Nanos timeout{0};
    bool off_cycle = false;
  };
  [[nodiscard]] std::optional<Beat> poll(Nanos now) noexcept;
  void complete(const Beat& beat, const StatusOr<Grant>& reply) noexcept;
  // When poll should run next (a periodic or off-cycle beat, the fence).
  [[nodiscard]] Nanos next_due() const noexcept;
  // Stops admitting and leaves the fleet. Idempotent.
  void close() noexcept;

  // Takes `options` in place of the guard's own, keeping its membership, share and every
  // permit it holds (a config reload). Only with the same node_id, key and call deadline in
  // force, and valid options: else false and nothing changes. The fence and the admission
  // window of the last grant stand until the next beat (the coordinator holds the record under
  // the lease it was sent with). Call only while nothing ticks the guard (stop its runner).
  [[nodiscard]] bool reconfigure(FleetGuardOptions options);

  [[nodiscard]] FleetGuardStats stats() const noexcept;
  // What the last failed beat was told (empty before any): the coordinator's words.
  [[nodiscard]] std::string last_error() const;
  // The instance this guard reports under.
  [[nodiscard]] std::uint64_t instance() const noexcept { return options_.instance; }
  [[nodiscard]] const FleetGuardOptions& options() const noexcept { return options_; }

 private:
  friend class FleetPermit;

  // Permits by admission time, in buckets of 2^width_shift_ ns (epoch = admitted_at >>
  // width_shift_): what lets the beat leave out the permits past their deadline without a
  // record per permit. A word is (epoch << kCountBits) | count; a bucket's permits that passed
  // their deadline move to
  // overdue_ (by the sweep before a beat, or by the admission that reuses the bucket), and a
  // permit released after that takes itself off overdue_ instead.
  static constexpr int kBuckets = 16;
  static constexpr int kCountBits = 24;
  static constexpr std::uint64_t kCountMask = (std::uint64_t{1} << kCountBits) - 1;
  static constexpr std::uint64_t kSwept = ~std::uint64_t{0} >> kCountBits;  // no epoch
  void track(Nanos admitted_at) noexcept;
  void untrack(Nanos admitted_at) noexcept;
  void sweep(Nanos now) noexcept;
  [[nodiscard]] std::uint64_t epoch_of(Nanos t) const noexcept;
  [[nodiscard]] std::uint32_t overdue() const noexcept;
  void finish_permit(FleetPermit& p, Outcome outcome, Nanos rtt) noexcept;
  void set_admit_until(Nanos t) noexcept;

  void apply_cap(std::uint32_t cap) noexcept;
  void apply_grant(const Grant& grant, Nanos sent_at) noexcept;
  void enter_outage() noexcept;
  void enter_duplicate() noexcept;
  void fence() noexcept;
  [[nodiscard]] std::uint32_t fair_share() const noexcept;
  [[nodiscard]] bool fencing() const noexcept;
  void fence_if_due(Nanos now) noexcept;
  std::optional<Beat> make_beat(Nanos now, bool off_cycle) noexcept;
  Status call(const Beat& beat) noexcept;

  ConcurrencyCoordinator& coordinator_;
  const Clock& clock_;
  FleetGuardOptions options_;  // changed only by reconfigure(), while nothing ticks
  AdaptiveGuard local_;

  // Written by the ticking thread; read by stats() from any thread (relaxed: each is one
  // self-contained value, and stats are a snapshot of independently observable counters).
  std::atomic<FleetPhase> phase_{FleetPhase::kStarting};
  std::atomic<std::uint32_t> share_{0};
  std::atomic<std::uint32_t> l_global_{0};
  std::atomic<std::uint32_t> l_aggregate_{0};
  std::atomic<std::uint32_t> nodes_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> heartbeats_{0};
  std::atomic<std::uint64_t> heartbeat_errors_{0};
  std::atomic<std::uint64_t> off_cycle_beats_{0};
  std::atomic<std::uint64_t> fences_{0};
  std::atomic<std::uint64_t> late_releases_{0};
  std::atomic<std::uint64_t> stale_refusals_{0};
  std::atomic<bool> recovering_{false};
  std::atomic<std::uint64_t> recovering_grants_{0};
  // acquire() admits only before this (ns on clock_; max: no limit). Relaxed: a stale read
  // admits or refuses one call around the moment it changes, as a read a moment earlier would.
  std::atomic<std::int64_t> admit_until_{std::numeric_limits<std::int64_t>::max()};
  const Nanos deadline_;  // call_deadline in force
  // Bucket width, 2^width_shift_ ns: the power of two at or above deadline_ / 8 (so 16
  // buckets span at least 2 x deadline_, and an epoch is a shift, not a division).
  const int width_shift_;
  std::array<std::atomic<std::uint64_t>, kBuckets> buckets_{};
  std::atomic<std::int64_t> overdue_{0};  // may dip below 0 for a moment (a race of the sweep)

  mutable std::mutex error_mu_;
  std::string last_error_;  // guarded by error_mu_; written by the ticking thread

  // Ticking thread only.
  bool beat_due_now_ = true;                 // the first beat: at the first tick
  Nanos last_beat_{0};                       // when the last beat was sent
  std::optional<Nanos> fence_at_;            // from the last successful beat
  bool eager_pending_ = false;               // an off-cycle beat is wanted
  bool draining_ = false;                    // in_flight > a lowered share: beat once drained
  bool outstanding_ = false;                 // a beat was polled and not yet completed
  std::uint64_t rejected_at_last_beat_ = 0;  // the local guard's rejections at the last beat
};

// Drives a FleetGuard's tick() on the guard's clock from a thread of its own. Stops (and joins)
// on destruction; does not close the guard.
class FleetGuardRunner {
 public:
  explicit FleetGuardRunner(FleetGuard& guard, const Clock& clock);
  ~FleetGuardRunner();
  FleetGuardRunner(const FleetGuardRunner&) = delete;
  FleetGuardRunner& operator=(const FleetGuardRunner&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

inline void FleetPermit::release(Outcome outcome, Nanos rtt) noexcept {
  if (FleetGuard* g = std::exchange(guard_, nullptr)) g->finish_permit(*this, outcome, rtt);
}

}  // namespace sluice
