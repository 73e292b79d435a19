#include "sluice/fleet/fleet_guard.h"

#include <algorithm>
#include <bit>
#include <random>

#include <unistd.h>

#include "local/tick_loop.h"
#include "sluice/core/clock.h"

namespace sluice {
namespace {

Nanos margin_of(const FleetGuardOptions& o) {
  return o.fence_safety_margin.value_or(o.heartbeat / 4);
}
Nanos lease_of(const FleetGuardOptions& o) {
  if (o.lease_ttl) return *o.lease_ttl;
  if (o.call_deadline)
    return std::max(2 * o.heartbeat, *o.call_deadline + o.heartbeat + 2 * margin_of(o));
  return 2 * o.heartbeat;
}
Nanos deadline_of(const FleetGuardOptions& o) {
  return o.call_deadline.value_or((lease_of(o) - o.heartbeat - margin_of(o)) / 2);
}
std::string ms(Nanos d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  std::string s = std::to_string(us / 1000);
  if (us % 1000 != 0) {
    std::string frac = std::to_string(1000 + std::abs(us % 1000)).substr(1);
    while (frac.back() == '0') frac.pop_back();
    s += "." + frac;
  }
  return s + " ms";
}
Nanos min_heartbeat_of(const FleetGuardOptions& o) {
  return o.min_heartbeat.value_or(o.heartbeat / 10);
}
Nanos call_timeout_of(const FleetGuardOptions& o) { return o.call_timeout.value_or(o.heartbeat); }

// A member's instance: random, never 0 (0 means "not said").
std::uint64_t random_instance() {
  std::uint64_t v = 0;
  try {
    std::random_device rd;
    v = (std::uint64_t{rd()} << 32) ^ rd();
  } catch (...) {
    // No entropy source: the clock and the pid below still tell members apart.
  }
  v ^= static_cast<std::uint64_t>(SteadyClock::instance().now().count());
  v ^= static_cast<std::uint64_t>(getpid()) << 40;
  return v != 0 ? v : 1;
}

}  // namespace

std::string_view to_string(FleetPhase phase) noexcept {
  switch (phase) {
    case FleetPhase::kStarting:
      return "starting";
    case FleetPhase::kActive:
      return "active";
    case FleetPhase::kOutage:
      return "outage";
    case FleetPhase::kFenced:
      return "fenced";
    case FleetPhase::kClosed:
      return "closed";
    case FleetPhase::kDuplicateId:
      return "duplicate_id";
  }
  return "unknown";
}

std::string FleetGuardOptions::validate() const {
  if (node_id.empty()) return "node_id must not be empty";
  if (key.empty()) return "key must not be empty";
  if (heartbeat <= Nanos{0}) return "heartbeat must be > 0";
  if (lease_of(*this) <= heartbeat) return "lease_ttl must be > heartbeat";
  if (margin_of(*this) < Nanos{0} || margin_of(*this) >= lease_of(*this))
    return "fence_safety_margin must be >= 0 and < lease_ttl";
  if (min_heartbeat_of(*this) <= Nanos{0} || min_heartbeat_of(*this) > heartbeat)
    return "min_heartbeat must be > 0 and <= heartbeat";
  if (call_timeout_of(*this) <= Nanos{0}) return "call_timeout must be > 0";
  const Nanos deadline = deadline_of(*this);
  if (call_deadline && deadline <= Nanos{0}) return "call_deadline must be > 0";
  if (deadline <= Nanos{0} || deadline + heartbeat + margin_of(*this) >= lease_of(*this))
    return "call_deadline (" + ms(deadline) + (call_deadline ? "" : ", the default") +
           ") + heartbeat (" + ms(heartbeat) + ") + fence_safety_margin (" + ms(margin_of(*this)) +
           ") must be shorter than lease_ttl (" + ms(lease_of(*this)) +
           "): a node that stalls (a long pause, SIGSTOP) right after admitting a call loses its "
           "lease one lease_ttl after its last heartbeat, and the other nodes take its share; "
           "only a call that has ended by then keeps the fleet under L_global";
  if (const std::string_view why = local.validate(); !why.empty())
    return "local: " + std::string(why);
  return {};
}

Nanos FleetGuardOptions::lease_in_force() const noexcept { return lease_of(*this); }
Nanos FleetGuardOptions::fence_margin_in_force() const noexcept { return margin_of(*this); }
Nanos FleetGuardOptions::call_deadline_in_force() const noexcept { return deadline_of(*this); }

FleetGuard::FleetGuard(ConcurrencyCoordinator& coordinator,
                       std::unique_ptr<LimitAlgorithm> algorithm, const Clock& clock,
                       FleetGuardOptions options)
    : coordinator_(coordinator),
      clock_(clock),
      options_(std::move(options)),
      local_(std::move(algorithm), clock, options_.local),
      deadline_(std::max(deadline_of(options_), Nanos{1})),
      width_shift_(std::bit_width(
          static_cast<std::uint64_t>(std::max(deadline_ / 8, Nanos{1}).count()) - 1)) {
  if (options_.instance == 0) options_.instance = random_instance();
  // Before the first grant: fail-closed admits nothing, local-only admits up to L_local.
  apply_cap(options_.outage == OutageMode::kFailClosed ? 0 : AdaptiveGuard::kNoCap);
}

StatusOr<std::unique_ptr<FleetGuard>> FleetGuard::create(ConcurrencyCoordinator& coordinator,
                                                         std::unique_ptr<LimitAlgorithm> algorithm,
                                                         const Clock& clock,
                                                         FleetGuardOptions options) {
  if (std::string why = options.validate(); !why.empty())
    return Status(StatusCode::kInvalidArgument, "fleet guard: " + why);
  if (algorithm == nullptr)
    return Status(StatusCode::kInvalidArgument, "fleet guard: algorithm must not be null");
  return std::make_unique<FleetGuard>(coordinator, std::move(algorithm), clock, std::move(options));
}

FleetGuard::~FleetGuard() { close(); }

std::optional<FleetPermit> FleetGuard::acquire(Nanos now) noexcept {
  if (now.count() >= admit_until_.load(std::memory_order_relaxed)) [[unlikely]] {
    stale_refusals_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  std::optional<GuardPermit> p = local_.acquire();
  if (!p) return std::nullopt;
  track(now);
  return FleetPermit(std::move(*p), this, now + deadline_);
}

void FleetGuard::finish_permit(FleetPermit& p, Outcome outcome, Nanos rtt) noexcept {
  const Nanos admitted_at = p.deadline_ - deadline_;
  untrack(admitted_at);
  const bool late =
      rtt >= deadline_ || (outcome == Outcome::kIgnored && clock_.now() >= p.deadline_);
  if (late) {
    late_releases_.fetch_add(1, std::memory_order_relaxed);
    outcome = Outcome::kDropped;
    rtt = std::max(rtt, deadline_);
  }
  p.permit_.release(outcome, rtt);
}

std::uint64_t FleetGuard::epoch_of(Nanos t) const noexcept {
  return static_cast<std::uint64_t>(t.count() >> width_shift_) % kSwept;
}

void FleetGuard::track(Nanos admitted_at) noexcept {
  const std::uint64_t epoch = epoch_of(admitted_at);
  std::atomic<std::uint64_t>& b = buckets_[epoch % kBuckets];
  std::uint64_t w = b.load(std::memory_order_relaxed);
  while (true) {
    if (w >> kCountBits == epoch) {
      if (b.compare_exchange_weak(w, w + 1, std::memory_order_relaxed)) return;
      continue;
    }
    // The bucket holds an older epoch: 16 buckets span 2 x call_deadline, so its permits are
    // past their deadline. They become overdue; this admission takes the bucket.
    if (b.compare_exchange_weak(w, (epoch << kCountBits) | 1, std::memory_order_relaxed)) {
      overdue_.fetch_add(static_cast<std::int64_t>(w & kCountMask), std::memory_order_relaxed);
      return;
    }
  }
}

void FleetGuard::untrack(Nanos admitted_at) noexcept {
  const std::uint64_t epoch = epoch_of(admitted_at);
  std::atomic<std::uint64_t>& b = buckets_[epoch % kBuckets];
  std::uint64_t w = b.load(std::memory_order_relaxed);
  while (w >> kCountBits == epoch && (w & kCountMask) > 0) {
    if (b.compare_exchange_weak(w, w - 1, std::memory_order_relaxed)) return;
  }
  overdue_.fetch_sub(1, std::memory_order_relaxed);  // its bucket was swept: it was overdue
}

void FleetGuard::sweep(Nanos now) noexcept {
  for (std::atomic<std::uint64_t>& b : buckets_) {
    std::uint64_t w = b.load(std::memory_order_relaxed);
    while ((w & kCountMask) > 0 && w >> kCountBits != kSwept) {
      // Every permit of epoch e was admitted before (e + 1) x width_.
      const auto end = static_cast<std::int64_t>(((w >> kCountBits) + 1) << width_shift_);
      if (end + deadline_.count() > now.count()) break;
      if (b.compare_exchange_weak(w, kSwept << kCountBits, std::memory_order_relaxed)) {
        overdue_.fetch_add(static_cast<std::int64_t>(w & kCountMask), std::memory_order_relaxed);
        break;
      }
    }
  }
}

std::uint32_t FleetGuard::overdue() const noexcept {
  const std::int64_t o = overdue_.load(std::memory_order_relaxed);
  return o <= 0 ? 0 : static_cast<std::uint32_t>(std::min<std::int64_t>(o, local_.in_flight()));
}

void FleetGuard::set_admit_until(Nanos t) noexcept {
  admit_until_.store(t.count(), std::memory_order_relaxed);
}

void FleetGuard::apply_cap(std::uint32_t cap) noexcept { local_.set_cap(cap); }

std::uint32_t FleetGuard::fair_share() const noexcept {
  const std::uint32_t n = nodes_.load(std::memory_order_relaxed);
  return n == 0 ? 0 : l_global_.load(std::memory_order_relaxed) / n;
}

void FleetGuard::apply_grant(const Grant& grant, Nanos sent_at) noexcept {
  const std::uint32_t before = share_.load(std::memory_order_relaxed);
  const bool was_active = phase_.load(std::memory_order_relaxed) == FleetPhase::kActive;
  apply_cap(grant.share);
  share_.store(grant.share, std::memory_order_relaxed);
  l_global_.store(grant.l_global, std::memory_order_relaxed);
  l_aggregate_.store(grant.l_aggregate, std::memory_order_relaxed);
  nodes_.store(grant.nodes, std::memory_order_relaxed);
  recovering_.store(grant.recovering, std::memory_order_relaxed);
  if (grant.recovering) recovering_grants_.fetch_add(1, std::memory_order_relaxed);
  // Published after the cap it stands for: the next report reads it, then in_flight.
  generation_.store(grant.generation, std::memory_order_release);
  phase_.store(FleetPhase::kActive, std::memory_order_relaxed);
  fence_at_ = sent_at + lease_of(options_) - margin_of(options_);
  // A call admitted from here on must end before this beat's lease could run out. When the
  // next grant comes later than this (a round trip longer than the slack the call deadline
  // leaves), the node refuses calls meanwhile; it fences only at fence_at_.
  const bool fresh_only = options_.outage == OutageMode::kLocalOnly || options_.self_fence;
  set_admit_until(fresh_only ? *fence_at_ - deadline_ : Nanos::max());
  if (!options_.eager_handoff) return;
  const std::uint32_t in_flight = local_.in_flight();
  if (was_active && grant.share < before) {
    eager_pending_ = true;                // confirm the lowered grant promptly
    draining_ = in_flight > grant.share;  // and report again once drained to it
  } else if (grant.share < fair_share() && in_flight >= grant.share) {
    eager_pending_ = true;  // capped below fair share: budget is coming
  }
}

void FleetGuard::enter_outage() noexcept {
  if (phase_.load(std::memory_order_relaxed) == FleetPhase::kClosed) return;
  if (phase_.load(std::memory_order_relaxed) != FleetPhase::kFenced)
    phase_.store(FleetPhase::kOutage, std::memory_order_relaxed);
  set_admit_until(Nanos::max());  // the outage mode's cap decides
  if (options_.outage == OutageMode::kFailClosed) {
    share_.store(0, std::memory_order_relaxed);
    apply_cap(0);
  } else {
    apply_cap(AdaptiveGuard::kNoCap);
  }
}

void FleetGuard::enter_duplicate() noexcept {
  const FleetPhase phase = phase_.load(std::memory_order_relaxed);
  if (phase == FleetPhase::kClosed) return;
  if (phase != FleetPhase::kFenced)
    phase_.store(FleetPhase::kDuplicateId, std::memory_order_relaxed);
  set_admit_until(Nanos::max());  // the cap decides: 0, whatever the outage mode
  share_.store(0, std::memory_order_relaxed);
  apply_cap(0);
}

std::string FleetGuard::last_error() const {
  const std::lock_guard lock(error_mu_);
  return last_error_;
}

void FleetGuard::fence() noexcept {
  phase_.store(FleetPhase::kFenced, std::memory_order_relaxed);
  share_.store(0, std::memory_order_relaxed);
  apply_cap(0);
  fences_.fetch_add(1, std::memory_order_relaxed);
  if (options_.on_fenced) {
    try {
      options_.on_fenced();
    } catch (...) {
      // A hook must not throw; the node is fenced either way.
    }
  }
}

bool FleetGuard::fencing() const noexcept {
  return options_.outage == OutageMode::kFailClosed && options_.self_fence &&
         fence_at_.has_value() && phase_.load(std::memory_order_relaxed) != FleetPhase::kFenced &&
         phase_.load(std::memory_order_relaxed) != FleetPhase::kClosed;
}

void FleetGuard::fence_if_due(Nanos now) noexcept {
  if (fencing() && now >= *fence_at_) fence();
}

std::optional<FleetGuard::Beat> FleetGuard::make_beat(Nanos now, bool off_cycle) noexcept {
  Beat b;
  try {
    b.report.node_id = options_.node_id;
    b.report.instance = options_.instance;
  } catch (...) {
    return std::nullopt;  // out of memory: the beat is skipped, the fence still runs
  }
  b.report.l_local = local_.algorithm_limit();
  // An initial guess is no evidence (it would pull a warm fleet's median down); a fixed limit
  // is configured, not inferred.
  b.report.estimated = local_.stats().windows > 0 || local_.algorithm_name() == "fixed";
  b.report.acked_generation = generation_.load(std::memory_order_acquire);
  // Read after the generation it is enforced under; calls past their deadline are left out
  // (the backend stopped them; their permits hold this node's own units until released).
  sweep(now);
  const std::uint32_t in_flight = local_.in_flight();
  b.report.in_flight = in_flight - std::min(overdue(), in_flight);
  // A node that turned calls away since its last beat is using all of its share: it says so
  // (its demand-proportional target stays "hungry" even if a call just finished). Reporting
  // more than it holds only makes the coordinator's reserve for it more conservative.
  const std::uint64_t rejected = local_.stats().rejected;
  if (rejected != rejected_at_last_beat_)
    b.report.in_flight = std::max(b.report.in_flight, share_.load(std::memory_order_relaxed));
  rejected_at_last_beat_ = rejected;
  b.report.lease_ttl = lease_of(options_);
  b.sent_at = now;
  b.off_cycle = off_cycle;
  b.timeout = call_timeout_of(options_);
  // A call must not keep the node admitting past its fence.
  if (fencing()) b.timeout = std::clamp(*fence_at_ - now, Nanos{1}, b.timeout);
  last_beat_ = now;
  outstanding_ = true;
  return b;
}

void FleetGuard::complete(const Beat& beat, const StatusOr<Grant>& reply) noexcept {
  outstanding_ = false;
  if (phase_.load(std::memory_order_relaxed) == FleetPhase::kClosed) return;
  if (!reply.ok()) {
    heartbeat_errors_.fetch_add(1, std::memory_order_relaxed);
    try {
      const std::lock_guard lock(error_mu_);
      last_error_ = reply.status().to_string();
    } catch (...) {
      // Out of memory: the words are lost, the phase below is not.
    }
    if (reply.status().code() == StatusCode::kAlreadyExists)
      enter_duplicate();  // not ours to admit on, in either outage mode
    else
      enter_outage();
    return;
  }
  const bool self_fencing = options_.outage == OutageMode::kFailClosed && options_.self_fence;
  if (self_fencing && clock_.now() >= beat.sent_at + lease_of(options_) - margin_of(options_)) {
    // The reply came after the fence deadline of its own beat: its lease may be gone.
    heartbeat_errors_.fetch_add(1, std::memory_order_relaxed);
    enter_outage();
    return;
  }
  heartbeats_.fetch_add(1, std::memory_order_relaxed);
  if (beat.off_cycle) off_cycle_beats_.fetch_add(1, std::memory_order_relaxed);
  apply_grant(reply.value(), beat.sent_at);
}

Status FleetGuard::call(const Beat& beat) noexcept {
  StatusOr<Grant> reply = coordinator_.heartbeat(options_.key, beat.report, beat.timeout);
  complete(beat, reply);
  return reply.ok() ? Status{} : reply.status();
}

Status FleetGuard::heartbeat() noexcept {
  if (phase_.load(std::memory_order_relaxed) == FleetPhase::kClosed)
    return Status(StatusCode::kInvalidArgument, "fleet guard is closed");
  beat_due_now_ = false;
  eager_pending_ = false;
  const std::optional<Beat> b = make_beat(clock_.now(), false);
  if (!b) return Status(StatusCode::kInternal, "out of memory");
  return call(*b);
}

Nanos FleetGuard::next_due() const noexcept {
  Nanos next = Nanos::max();
  if (!outstanding_) {
    next = last_beat_ + options_.heartbeat;
    if (beat_due_now_) next = last_beat_;
    if (eager_pending_) next = std::min(next, last_beat_ + min_heartbeat_of(options_));
    if (draining_) next = std::min(next, clock_.now() + min_heartbeat_of(options_));
  }
  if (fencing()) next = std::min(next, *fence_at_);
  if (next == Nanos::max()) next = clock_.now() + options_.heartbeat;
  return next;
}

std::optional<FleetGuard::Beat> FleetGuard::poll(Nanos now) noexcept {
  if (phase_.load(std::memory_order_relaxed) == FleetPhase::kClosed) return std::nullopt;
  fence_if_due(now);
  if (outstanding_) return std::nullopt;
  if (draining_ && local_.in_flight() <= share_.load(std::memory_order_relaxed)) {
    draining_ = false;
    eager_pending_ = true;  // budget is freed: tell the coordinator
  }
  const bool periodic = beat_due_now_ || now >= last_beat_ + options_.heartbeat;
  const bool eager =
      options_.eager_handoff && eager_pending_ && now >= last_beat_ + min_heartbeat_of(options_);
  if (!periodic && !eager) return std::nullopt;
  beat_due_now_ = false;
  eager_pending_ = false;
  return make_beat(now, !periodic);
}

Nanos FleetGuard::tick(Nanos now) noexcept {
  if (phase_.load(std::memory_order_relaxed) == FleetPhase::kClosed)
    return now + options_.heartbeat;
  if (const std::optional<Beat> b = poll(now)) {
    (void)call(*b);
    fence_if_due(clock_.now());  // the call may have taken until the fence deadline
  }
  return next_due();
}

void FleetGuard::close() noexcept {
  if (phase_.exchange(FleetPhase::kClosed, std::memory_order_relaxed) == FleetPhase::kClosed)
    return;
  share_.store(0, std::memory_order_relaxed);
  apply_cap(0);
  (void)coordinator_.leave(options_.key, options_.node_id, options_.instance,
                           call_timeout_of(options_));
}

bool FleetGuard::reconfigure(FleetGuardOptions options) {
  if (options.node_id != options_.node_id || options.key != options_.key ||
      (options.instance != 0 && options.instance != options_.instance) ||
      !options.validate().empty() || deadline_of(options) != deadline_)
    return false;
  options.instance = options_.instance;  // the same member
  options_ = std::move(options);
  // A changed outage mode takes effect now where it decides the cap.
  const FleetPhase phase = phase_.load(std::memory_order_relaxed);
  if (phase == FleetPhase::kStarting)
    apply_cap(options_.outage == OutageMode::kFailClosed ? 0 : AdaptiveGuard::kNoCap);
  if (phase == FleetPhase::kOutage) enter_outage();
  return true;
}

FleetGuardStats FleetGuard::stats() const noexcept {
  FleetGuardStats s;
  s.local = local_.stats();
  s.phase = phase_.load(std::memory_order_relaxed);
  s.share = share_.load(std::memory_order_relaxed);
  s.l_global = l_global_.load(std::memory_order_relaxed);
  s.l_aggregate = l_aggregate_.load(std::memory_order_relaxed);
  s.nodes = nodes_.load(std::memory_order_relaxed);
  s.generation = generation_.load(std::memory_order_relaxed);
  s.fenced = s.phase == FleetPhase::kFenced;
  s.heartbeats = heartbeats_.load(std::memory_order_relaxed);
  s.heartbeat_errors = heartbeat_errors_.load(std::memory_order_relaxed);
  s.off_cycle_beats = off_cycle_beats_.load(std::memory_order_relaxed);
  s.fences = fences_.load(std::memory_order_relaxed);
  s.overdue = overdue();
  s.late_releases = late_releases_.load(std::memory_order_relaxed);
  s.stale_refusals = stale_refusals_.load(std::memory_order_relaxed);
  s.recovering = recovering_.load(std::memory_order_relaxed);
  s.recovering_grants = recovering_grants_.load(std::memory_order_relaxed);
  return s;
}

// ---- runner ----

struct FleetGuardRunner::Impl {
  TickLoop loop;
};

FleetGuardRunner::FleetGuardRunner(FleetGuard& guard, const Clock& clock)
    : impl_(new Impl{TickLoop(clock, [&guard](Nanos now) { return guard.tick(now); })}) {}

FleetGuardRunner::~FleetGuardRunner() = default;

}  // namespace sluice
