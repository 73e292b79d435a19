// fallback_cascade.h: send each call to the healthiest node that has room.
//
// What it is: a set of named nodes (replicas of one backend), each with its own AdaptiveGuard
// (its concurrency limit) and its own stat buckets (cascade_stats.h). acquire() orders the
// nodes by a weighted random permutation of their health (cascade.h: success rate, weight,
// order), walks that order and takes a permit from the first node whose guard has room; when no
// node has room it fails fast (kResourceExhausted, saying how many nodes were tried). The
// caller makes the call to the lease's node and finishes the lease with how it went:
//   kSuccess   the guard gets the call's RTT (latency evidence); the buckets a success;
//   kTimeout   the guard: dropped (its limit comes down); the buckets a failure;
//   kOverload  a fast refusal by the node as overloaded (HTTP 429/503, gRPC RESOURCE_EXHAUSTED
//              or UNAVAILABLE): dropped, and a failure -- not a cheap success, or a shedding
//              node would attract more traffic for answering fast;
//   kFailed    an error that says nothing of load (a bad request, a bug): the guard ignores
//              it; the buckets count a failure.
// A lease finished twice counts once; a lease destroyed unfinished counts as kFailed.
//
// Node sets change at run time (set_nodes): a node kept by name keeps its guard and health, a
// new node starts clean (a clean slate counts as healthy), a removed node stops being picked and
// its leases in flight finish into it as usual.
//
// Use:
//   sluice::FallbackCascade cascade(nodes, sluice::SteadyClock::instance());
//   auto lease = cascade.acquire();
//   if (!lease.ok()) return lease.status();           // every node full: fail fast
//   auto reply = call(lease.value().node());          // the caller's own call
//   lease.value().finish(reply.ok() ? CascadeOutcome::kSuccess : CascadeOutcome::kFailed);
// or, wrapping a callable that returns the outcome: cascade.call([](std::string_view node) {...}).
//
// Thread-safety: every member is safe to call concurrently. acquire() takes no lock: it reads
// the node set through an atomic shared pointer and each node's buckets and guard atomically.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/adaptive_guard.h"
#include "sluice/cascade.h"
#include "sluice/cascade_stats.h"
#include "sluice/clock.h"
#include "sluice/status.h"

namespace sluice {

enum class CascadeOutcome { kSuccess, kTimeout, kOverload, kFailed };

struct CascadeNodeSpec {
  std::string name;
  std::shared_ptr<AdaptiveGuard> guard;  // not null
};

struct FallbackCascadeOptions {
  CascadeStatsOptions stats;
  CascadeHealthOptions health;
  bool approximate_order = false;  // the source's approximation instead of the exact order
};
// Why `o` is unusable, naming the field; empty when it is fine.
[[nodiscard]] std::string_view fallback_cascade_error(const FallbackCascadeOptions& o) noexcept;

// One node as the cascade keeps it.
class CascadeNode {
 public:
  CascadeNode(std::string name, std::shared_ptr<AdaptiveGuard> guard,
              const CascadeStatsOptions& stats)
      : name_(std::move(name)), guard_(std::move(guard)), stats_(stats) {}
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] AdaptiveGuard& guard() const noexcept { return *guard_; }
  [[nodiscard]] CascadeNodeStats& stats() noexcept { return stats_; }
  [[nodiscard]] const CascadeNodeStats& stats() const noexcept { return stats_; }

 private:
  const std::string name_;
  const std::shared_ptr<AdaptiveGuard> guard_;
  CascadeNodeStats stats_;
};

class [[nodiscard]] CascadeLease {
 public:
  CascadeLease(CascadeLease&&) noexcept = default;
  CascadeLease& operator=(CascadeLease&& other) noexcept;
  CascadeLease(const CascadeLease&) = delete;
  CascadeLease& operator=(const CascadeLease&) = delete;
  ~CascadeLease() { finish(CascadeOutcome::kFailed); }

  [[nodiscard]] const std::string& node() const noexcept { return node_->name(); }
  // Records how the call went; `rtt` defaults to the time since acquire(). Only the first
  // finish counts.
  void finish(CascadeOutcome outcome) noexcept;
  void finish(CascadeOutcome outcome, Nanos rtt) noexcept;
  [[nodiscard]] bool finished() const noexcept { return !permit_.held(); }

 private:
  friend class FallbackCascade;
  CascadeLease(std::shared_ptr<CascadeNode> node, GuardPermit permit, const Clock& clock) noexcept
      : node_(std::move(node)), permit_(std::move(permit)), clock_(&clock), start_(clock.now()) {}

  std::shared_ptr<CascadeNode> node_;
  GuardPermit permit_;
  const Clock* clock_;
  Nanos start_;
};

// A node's state, for metrics and tests.
struct CascadeNodeState {
  std::string name;
  CascadeHealth health;
  CascadeNodeStats::Snapshot buckets;
  std::uint32_t in_flight = 0;
  std::uint32_t limit = 0;
};

class FallbackCascade {
 public:
  // `nodes` named uniquely, each with a guard; `o` must pass fallback_cascade_error(); `clock`
  // must outlive the cascade; `draw` defaults to a seeded generator per cascade.
  FallbackCascade(std::vector<CascadeNodeSpec> nodes, const Clock& clock,
                  FallbackCascadeOptions o = {}, UniformDraw draw = {});

  // A permit on the first node of the order that has room, skipping the nodes named in
  // `exclude` (those a caller already tried); kResourceExhausted when none has.
  [[nodiscard]] StatusOr<CascadeLease> acquire(std::span<const std::string> exclude = {});

  // Picks, calls `f(node_name)` -> CascadeOutcome, and finishes the lease with it (kFailed if
  // `f` throws, rethrown). The refusal's Status when no node has room.
  template <typename F>
  Status call(F&& f);

  // Replaces the node set (see above). Names must be unique, guards not null.
  void set_nodes(std::vector<CascadeNodeSpec> nodes);

  [[nodiscard]] std::vector<CascadeNodeState> state() const;
  [[nodiscard]] std::size_t size() const noexcept;

 private:
  using Nodes = std::vector<std::shared_ptr<CascadeNode>>;

  const Clock& clock_;
  const FallbackCascadeOptions options_;
  UniformDraw draw_;
  std::atomic<std::shared_ptr<const Nodes>> nodes_;
};

template <typename F>
Status FallbackCascade::call(F&& f) {
  auto lease = acquire();
  if (!lease.ok()) return lease.status();
  try {
    lease.value().finish(f(std::string_view(lease.value().node())));
  } catch (...) {
    lease.value().finish(CascadeOutcome::kFailed);
    throw;
  }
  return {};
}

}  // namespace sluice
