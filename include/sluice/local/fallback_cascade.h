// fallback_cascade.h: send each call to the healthiest node that has room.
//
// What it is: a set of named nodes (replicas of one backend), each with its own AdaptiveGuard
// (its concurrency limit), its own stat buckets (cascade_stats.h) and, optionally, its own
// circuit breaker (circuit_breaker.h). acquire() orders the nodes by a weighted random
// permutation of their health (cascade.h: success rate, weight, order), walks that order and
// takes a permit from the first node whose breaker lets the call through and whose guard has
// room; when no node has, it fails fast with a refusal (CascadeRefusal, a value: how many
// nodes were tried, open and excluded). An open breaker refuses without a permit being taken; a
// half-open one's probe takes a permit like any call, so probes count against the node's limit. The
// caller makes the call to the lease's node and finishes the lease with how it went:
//   kSuccess   the guard gets the call's RTT (latency evidence); the buckets a success;
//   kTimeout   the guard: dropped (its limit comes down); the buckets a failure;
//   kOverload  a fast refusal by the node as overloaded (HTTP 429/503, gRPC RESOURCE_EXHAUSTED
//              or UNAVAILABLE): dropped, and a failure -- not a cheap success, or a shedding
//              node would attract more traffic for answering fast;
//   kFailed    an error that says nothing of load (a 500, a crash): the guard ignores it; the
//              buckets count a failure;
//   kIgnored   nothing about the node (the caller gave up, was cancelled): counted nowhere.
// The breaker counts every failure (timeout, overload, failed). A lease finished twice counts
// once; a lease destroyed unfinished counts as kFailed. outcome_of_http() and outcome_of_grpc()
// map a reply's status to an outcome.
//
// Revival: a node whose weight is at the floor or below (every call in its window failed, or it
// was last seen failing) is given one call -- before the weighted draw -- at most once every
// `revive_every` (5 s, the bucket width, by default; 0: no revival calls), so that a node which
// healed is found within that time at any call rate. Its weight alone would give it no call while
// its window shows only failures, and then one in ~60,000 picks (the floor, with three nodes;
// ~200,000 with five): at 1,000 calls a second, a call every minute or more. While the node is
// still bad a revival costs one failed call per `revive_every`; with a breaker, the revival is its
// probe and waits for its open spell (a revival that finds the node open or full is not spent).
// Revival calls are capped over the whole cascade: at most `revive_share` (2%) of the calls of
// the last second plus one a second (a retry budget's rule, retry_budget.h, over 1 s), so many
// dead nodes cost a bounded share of the traffic, spread over time rather than in a burst when
// their turns come round together; a node whose turn it is waits for room.
//
// Panic: while fewer than `panic_below` (half, by default) of the nodes have their breaker
// closed, a breaker that refuses a call no longer stops it (as a load balancer's panic mode
// does): the call goes to the node by weight and room as if it had no breaker, and its outcome
// reaches the node's buckets but not its breaker (half-open probes still go through it, so
// breakers close again as nodes recover). Without that, a backend whose nodes are all degraded
// -- failing some calls, not down -- would have most breakers open and its calls refused, or
// crowded onto the one node left, which the cascade's weights spread better. 0 never panics.
//
// Retries: by default the cascade picks once and never retries. With retry.max_attempts > 1,
// call() retries a failed call on another node (excluding every node tried), as long as the
// retry budget (retry_budget.h: a share of the calls plus a small allowance a second) has room,
// so retries cannot multiply the load during an outage. Callers that retry by themselves use
// acquire(exclude) with try_retry().
//
// Node sets change at run time (set_nodes): a node kept by name keeps its guard, health and
// breaker, a new node starts clean (a clean slate counts as healthy), a removed node stops being
// picked and its leases in flight finish into it as usual. A removed node is kept (parked, shown
// by state() as removed) while calls hold its permits and for its stat window (buckets x width)
// after the last one ends: a node added back by name within that time is the same node again,
// its guard (and so every call still holding its permits), health and breaker as they were. A
// cascade built to replace another (the `previous` constructor argument: its options changed)
// takes over previous's nodes by name, current and parked: their guards always; their health
// and breakers too when the stats and breaker options are the same (else those start clean).
//
// Use, pick -> permit -> report:
//   sluice::FallbackCascade cascade(nodes, sluice::SteadyClock::instance());
//   auto lease = cascade.acquire();
//   if (!lease.ok()) return shed(lease.refusal());    // every node full: fail fast
//   auto reply = call(lease.value().node());          // the caller's own call
//   lease.value().finish(sluice::outcome_of_http(reply.status));
// or, wrapping a callable and how to read its reply:
//   sluice::CascadeResult<Reply> reply = cascade.call(
//       [&](std::string_view node) { return get(node, path); },
//       [](const Reply& r) { return sluice::outcome_of_http(r.status); });
//
// Thread-safety: every member is safe to call concurrently. acquire() takes one lock, for a copy
// of the node set's pointer, and reads each node's buckets, breaker and guard atomically.
#pragma once

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/core/cascade.h"
#include "sluice/core/clock.h"
#include "sluice/local/adaptive_guard.h"
#include "sluice/local/cascade_stats.h"
#include "sluice/local/circuit_breaker.h"
#include "sluice/local/retry_budget.h"

namespace sluice {

enum class CascadeOutcome { kSuccess, kTimeout, kOverload, kFailed, kIgnored };

// "success", "timeout", "overload", "failed", "ignored".
[[nodiscard]] std::string_view to_string(CascadeOutcome o) noexcept;
// An HTTP reply's status: 429 and 503 overload; 408 and 504 timeout; any other 5xx failed;
// everything else (2xx, 3xx, a 4xx: the node answered) success.
[[nodiscard]] CascadeOutcome outcome_of_http(int status) noexcept;
// A gRPC status code: RESOURCE_EXHAUSTED (8) and UNAVAILABLE (14) overload; DEADLINE_EXCEEDED
// (4) timeout; CANCELLED (1) ignored; UNKNOWN (2), INTERNAL (13), DATA_LOSS (15) and
// UNIMPLEMENTED (12) failed; OK and the caller's own errors (INVALID_ARGUMENT, NOT_FOUND, ...)
// success.
[[nodiscard]] CascadeOutcome outcome_of_grpc(int code) noexcept;

struct CascadeNodeSpec {
  std::string name;
  std::shared_ptr<AdaptiveGuard> guard;  // not null
};

struct CascadeRetryOptions {
  std::uint32_t max_attempts = 1;  // call()'s attempts per call, first included (1: no retry)
  RetryBudgetOptions budget;
  friend bool operator==(const CascadeRetryOptions&, const CascadeRetryOptions&) = default;
};

struct FallbackCascadeOptions {
  CascadeStatsOptions stats;
  CascadeHealthOptions health;
  bool approximate_order = false;  // the source's approximation instead of the exact order
  std::optional<CircuitBreakerOptions> breaker;  // per node; none by default
  CascadeRetryOptions retry;
  Nanos revive_every = std::chrono::seconds(5);  // >= 0; 0: no revival calls
  double revive_share = 0.02;                    // 0..1: revival calls per call (over 1 s)
  double panic_below = 0.5;                      // 0..1; see "Panic" above
  friend bool operator==(const FallbackCascadeOptions&, const FallbackCascadeOptions&) = default;
};
// Why `o` is unusable, naming the field; empty when it is fine.
[[nodiscard]] std::string_view fallback_cascade_error(const FallbackCascadeOptions& o) noexcept;

// One node as the cascade keeps it.
class CascadeNode {
 public:
  CascadeNode(std::string name, std::shared_ptr<AdaptiveGuard> guard,
              const CascadeStatsOptions& stats, const std::optional<CircuitBreakerOptions>& breaker)
      : name_(std::move(name)), guard_(std::move(guard)), stats_(stats) {
    if (breaker) breaker_.emplace(*breaker);
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] AdaptiveGuard& guard() const noexcept { return *guard_; }
  [[nodiscard]] const std::shared_ptr<AdaptiveGuard>& shared_guard() const noexcept {
    return guard_;
  }
  [[nodiscard]] CascadeNodeStats& stats() noexcept { return stats_; }
  [[nodiscard]] const CascadeNodeStats& stats() const noexcept { return stats_; }
  // Null when the cascade has no breakers.
  [[nodiscard]] CircuitBreaker* breaker() noexcept { return breaker_ ? &*breaker_ : nullptr; }
  [[nodiscard]] const CircuitBreaker* breaker() const noexcept {
    return breaker_ ? &*breaker_ : nullptr;
  }
  // Its health at `now` among `nodes` nodes: cascade_health() of its buckets, computed again
  // only when what it depends on changed (its buckets' version, `nodes`); `o` must be the
  // same on every call.
  [[nodiscard]] CascadeHealth health(Nanos now, std::size_t nodes,
                                     const CascadeHealthOptions& o) const noexcept;
  // Claims the node's revival call at `now` if none was claimed within `every`: the time of
  // the claim before, to give it back with unclaim_revival() if the call is not made.
  [[nodiscard]] std::optional<std::int64_t> claim_revival(Nanos now, Nanos every) noexcept {
    std::int64_t last = last_revival_.load(std::memory_order_relaxed);
    if (now.count() - last < every.count() ||
        !last_revival_.compare_exchange_strong(last, now.count(), std::memory_order_relaxed))
      return std::nullopt;
    return last;
  }
  void unclaim_revival(Nanos now, std::int64_t before) noexcept {
    std::int64_t mine = now.count();
    last_revival_.compare_exchange_strong(mine, before, std::memory_order_relaxed);
  }

 private:
  // The last health computed and its key, behind a sequence number (odd while a thread
  // writes it): any thread may fill it; a reader that sees it change computes for itself.
  struct HealthCache {
    std::atomic<std::uint32_t> seq{0};
    std::atomic<std::uint64_t> epoch{~std::uint64_t{0}}, current{0}, previous{0}, nodes{0};
    std::atomic<double> rate{1}, weight{1};
    std::atomic<std::uint8_t> basis{0};
  };

  const std::string name_;
  const std::shared_ptr<AdaptiveGuard> guard_;
  CascadeNodeStats stats_;
  std::optional<CircuitBreaker> breaker_;
  mutable HealthCache cache_;
  std::atomic<std::int64_t> last_revival_{std::numeric_limits<std::int64_t>::min() / 2};
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
  // Whether it is a half-open breaker's probe.
  [[nodiscard]] bool probe() const noexcept {
    return ticket_.kind == CircuitBreaker::Ticket::Kind::kProbe;
  }

 private:
  friend class FallbackCascade;
  CascadeLease(std::shared_ptr<CascadeNode> node, GuardPermit permit, const Clock& clock,
               CircuitBreaker::Ticket ticket, Nanos start) noexcept
      : node_(std::move(node)),
        permit_(std::move(permit)),
        clock_(&clock),
        start_(start),
        ticket_(ticket) {}

  std::shared_ptr<CascadeNode> node_;
  GuardPermit permit_;
  const Clock* clock_;
  Nanos start_;
  CircuitBreaker::Ticket ticket_;
};

// Why the cascade made no call: no node had room. A decision, not an error (status.h): it is
// the caller's to answer (a 503, a shed call), never a failure to decide.
struct CascadeRefusal {
  std::size_t tried = 0;     // nodes whose guard had no room
  std::size_t open = 0;      // nodes an open circuit breaker refused
  std::size_t excluded = 0;  // nodes the caller excluded
  // "cascade: every node is at its concurrency limit or open (2 tried, 1 with an open circuit
  // breaker, 1 excluded)"; "cascade: every node is excluded (0 tried, 2 excluded)".
  [[nodiscard]] std::string message() const;
};

// What the cascade gives: a T (a lease from acquire(), a reply from call()), or its refusal.
template <typename T>
class [[nodiscard]] CascadeResult {
 public:
  // Implicit, as a value: `return lease;` or `return refusal;`.
  CascadeResult(T value) : value_(std::move(value)) {}
  CascadeResult(CascadeRefusal refusal) : refusal_(refusal) {}

  // Whether it holds a T; else refusal() says why not.
  [[nodiscard]] bool ok() const noexcept { return value_.has_value(); }
  // The T; ok() must be true.
  [[nodiscard]] T& value() & { return *value_; }
  [[nodiscard]] const T& value() const& { return *value_; }
  [[nodiscard]] T&& value() && { return std::move(*value_); }
  // The refusal; meaningful when !ok().
  [[nodiscard]] const CascadeRefusal& refusal() const noexcept { return refusal_; }

 private:
  std::optional<T> value_;
  CascadeRefusal refusal_;
};

// A node's state, for metrics and tests.
struct CascadeNodeState {
  std::string name;
  CascadeHealth health;
  CascadeNodeStats::Snapshot buckets;
  std::uint32_t in_flight = 0;
  std::uint32_t limit = 0;
  std::optional<CircuitBreaker::Snapshot> breaker;  // none without breakers
  bool removed = false;  // parked: no longer picked, kept for its calls in flight (see above)
};

class FallbackCascade {
 public:
  // `nodes` named uniquely, each with a guard; `o` must pass fallback_cascade_error(); `clock`
  // must outlive the cascade; `draw` defaults to a generator per thread, seeded once; a `draw`
  // given here is called by every thread that picks, so it must be safe to call concurrently
  // (a seeded one makes a single-threaded run repeatable: tests, simulations).
  // `previous`: the cascade this one replaces (see "Node sets" above); it must outlive the
  // constructor only.
  FallbackCascade(std::vector<CascadeNodeSpec> nodes, const Clock& clock,
                  FallbackCascadeOptions o = {}, UniformDraw draw = {},
                  const FallbackCascade* previous = nullptr);

  // A permit on the first node of the order whose breaker lets a call through and whose guard
  // has room, skipping the nodes named in `exclude` (those a caller already tried); the
  // refusal when none has.
  [[nodiscard]] CascadeResult<CascadeLease> acquire(std::span<const std::string> exclude = {});

  // Picks, calls `f(node_name)` -> R, reads the outcome with `classify(const R&)` and finishes
  // the lease with it (kFailed if `f` throws, rethrown). A failed call is retried on another
  // node while retry.max_attempts and the retry budget allow. Returns the last reply, or the
  // refusal when no node had room for the first attempt.
  template <typename F, typename C>
  auto call(F&& f, C&& classify) -> CascadeResult<std::invoke_result_t<F&, std::string_view>>;
  // The same with `f` returning the CascadeOutcome itself: the last outcome, or the refusal.
  template <typename F>
  CascadeResult<CascadeOutcome> call(F&& f);

  // For callers that retry by themselves: counts a first attempt / spends a retry from the
  // budget (false: make no retry). call() does both itself.
  void record_call() noexcept { budget_.record_call(clock_.now()); }
  [[nodiscard]] bool try_retry() noexcept { return budget_.try_retry(clock_.now()); }

  // Replaces the node set (see above). Names must be unique, guards not null; a node that is
  // current or parked keeps its own guard (the spec's is not used: guard_of() gives it).
  void set_nodes(std::vector<CascadeNodeSpec> nodes);
  // The guard of the node named `name`, current or parked; null when there is none.
  [[nodiscard]] std::shared_ptr<AdaptiveGuard> guard_of(std::string_view name) const;

  // Every node, current ones first, then parked ones (removed = true).
  [[nodiscard]] std::vector<CascadeNodeState> state() const;
  [[nodiscard]] std::size_t size() const noexcept;
  [[nodiscard]] const FallbackCascadeOptions& options() const noexcept { return options_; }
  // Calls holding a permit (on every node, parked ones too) and the current nodes' limits (what a
  // refusal reports; cheap, unlike state()).
  struct Load {
    std::uint64_t in_flight = 0, limit = 0;
  };
  [[nodiscard]] Load load() const noexcept;

 private:
  using Nodes = std::vector<std::shared_ptr<CascadeNode>>;
  struct Parked {
    std::shared_ptr<CascadeNode> node;
    Nanos since{0};  // removed, or its last call seen ending, at
  };

  void set_nodes(std::vector<CascadeNodeSpec> nodes, const FallbackCascade* previous);
  // Forgets parked nodes with no call in flight for their stat window (parked_mu_ held).
  void prune_parked(Nanos now) const;
  // The node named `name` among `previous`'s current and parked ones, or null.
  static std::shared_ptr<CascadeNode> node_of(const FallbackCascade& c, std::string_view name);

  const Clock& clock_;
  const FallbackCascadeOptions options_;
  UniformDraw draw_;
  RetryBudget budget_;
  RetryBudget revivals_;  // the revival cap: revive_share of the calls of the last second
  // The node set, replaced whole by set_nodes(): read under a mutex held for the pointer's copy
  // alone (an atomic shared_ptr is no cheaper in libstdc++ 12, where it is a lock in the
  // pointer's low bit, and ThreadSanitizer cannot see that lock).
  [[nodiscard]] std::shared_ptr<const Nodes> nodes() const {
    const std::lock_guard lock(nodes_mu_);
    return nodes_;
  }
  mutable std::mutex nodes_mu_;
  std::shared_ptr<const Nodes> nodes_;  // guarded by nodes_mu_
  mutable std::mutex parked_mu_;
  mutable std::vector<Parked> parked_;  // guarded by parked_mu_
};

template <typename F, typename C>
auto FallbackCascade::call(F&& f, C&& classify)
    -> CascadeResult<std::invoke_result_t<F&, std::string_view>> {
  using R = std::invoke_result_t<F&, std::string_view>;
  std::optional<R> last;
  std::vector<std::string> tried;
  for (std::uint32_t attempt = 0; attempt < options_.retry.max_attempts; ++attempt) {
    if (attempt == 0)
      record_call();
    else if (!try_retry())
      break;
    auto lease = acquire(tried);
    if (!lease.ok()) {
      if (last) break;
      return lease.refusal();
    }
    CascadeOutcome outcome;
    try {
      last.emplace(f(std::string_view(lease.value().node())));
      outcome = classify(*last);
    } catch (...) {
      lease.value().finish(CascadeOutcome::kFailed);
      throw;
    }
    lease.value().finish(outcome);
    if (outcome == CascadeOutcome::kSuccess || outcome == CascadeOutcome::kIgnored) break;
    if (attempt + 1 < options_.retry.max_attempts) tried.push_back(lease.value().node());
  }
  return std::move(*last);
}

template <typename F>
CascadeResult<CascadeOutcome> FallbackCascade::call(F&& f) {
  return call(f, [](CascadeOutcome o) { return o; });
}

}  // namespace sluice
