// policy.h: what every policy kind is to the engine: a named policy that answers one or more
// families of calls.
//
// What it is: Policy is the interface each kind implements in its own file (policies/*.cpp) and
// registers once (registry.h); the engine, the transports and the lease table know no kind.
// A policy answers
//   - the rate family (RateFamily: check / peek / refund, and the 429 of a denied check; a
//     check may be decided later: check_or_defer, completion.h), or
//   - the admit family (AdmitFamily: admit -> a LeasePermit that Release, expiry or shutdown
//     finishes, and optionally what it chose; Heartbeat is the lease table's), or both, or (a
//     kind with routes of its own, routes.h) neither.
// An admit runs in two phases, resolve() then take(): the engine passes a policy's chained rate
// policy (`rate: R`) between them, so a kind knows nothing of chaining and never takes a permit
// for a call the rate refused.
//
// Lifecycle: the builder starts what a policy runs (start_loop(): a thread that only delivers
// tick(now), in the shape of FleetGuardRunner); retire() stops it, ends fleet membership and
// is idempotent. The engine retires every policy it built before dropping it (a reload that
// failed included); a kind that starts loops also calls retire() in its destructor. Permits
// already held stay valid and keep their policy alive (a LeasePermit holds what it needs). A
// policy a reload did not replace keeps serving as the same object; one whose spec changed may
// take the new spec in place (reconfigure()), keeping its in-flight permits and state.
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <prometheus/metric_family.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/calls.h"
#include "server/completion.h"
#include "server/permit.h"
#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/status.h"
#include "sluice/local/rejection.h"

namespace sluice {
class TickLoop;
}

namespace sluice::server {

class BuildContext;

// The rate family: spend a key's budget.
class RateFamily {
 public:
  virtual ~RateFamily() = default;
  // Spends `hits` of `key`'s budget at `now` if they fit.
  [[nodiscard]] virtual RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) = 0;
  // Check as the transports ask it: decided now (by default, check()), or deferred: a kind that
  // cannot decide now takes later.defer() and returns nullopt (completion.h's contract; `key`
  // is valid only until it returns). check() stays an inline answer (what a chained admit's
  // gate asks).
  [[nodiscard]] virtual Decided<RateDecision> check_or_defer(std::string_view key,
                                                             std::uint64_t hits, Nanos now,
                                                             Deferral<RateDecision>& later) {
    (void)later;
    return check(key, hits, now);
  }
  // The same answer, spending nothing.
  [[nodiscard]] virtual RateDecision peek(std::string_view key, std::uint64_t hits,
                                          Nanos now) const = 0;
  // Gives back the hits of a check made at `now` that was allowed (CheckMany's rollback).
  virtual void refund(std::string_view key, std::uint64_t hits, Nanos now) = 0;
  // Charges `hits` (0: none, only the allowance) to `key` after the fact, whatever it has left
  // (sluice/core/rate_strategy.h: charge); an error when nothing was recorded, naming why.
  // Default: FAILED_PRECONDITION (the kind takes no charges).
  [[nodiscard]] virtual StatusOr<RateCharge> charge(std::string_view key, std::uint64_t hits,
                                                    Nanos now);
  // The 429 for `d`, a denied check of `key` (its views point into this policy).
  [[nodiscard]] virtual Rejection refusal(std::string_view key, const RateDecision& d) const = 0;
};

struct AdmitDecision {
  std::optional<LeasePermit> permit;   // admitted
  std::string chosen;                  // admitted: what it chose (a cascade's node); may be empty
  AnswerAttributes attributes;         // admitted: what else it answers, in its own words
  std::optional<Nanos> call_deadline;  // admitted: when the call must have ended (fleet)
  Rejection refusal;                   // when not admitted
  std::shared_ptr<const void> refusal_owner;
  Nanos waited{0};  // how long it waited in a queue first
};

// Phase two of one admit: the call is resolved (its fields checked, what it names found), its
// permit not yet taken. Dropping it untaken lets go of whatever resolving held.
class ResolvedAdmit {
 public:
  virtual ~ResolvedAdmit() = default;
  // What a chained rate policy is keyed by when the call gives no key (a concurrency call: its
  // tenant); empty: nothing.
  [[nodiscard]] virtual std::string_view rate_key() const noexcept { return {}; }
  // Takes a permit or refuses; at most once. Decided now, or deferred by a kind that queues the
  // call until a permit frees up (completion.h's contract: the kind answers within the call's
  // max_wait and its own bound, and lets the call go at once when later.on_cancel's hook
  // fires). What the call's views pointed to is gone once take() returns.
  [[nodiscard]] virtual Decided<AdmitDecision> take(Nanos now, Deferral<AdmitDecision>& later) = 0;
};

// A ResolvedAdmit whose take is `f` (Decided<AdmitDecision>(Nanos now, Deferral<AdmitDecision>&)),
// keyed for a chained rate policy by `rate_key` (a view the call keeps alive until take()).
template <class F>
[[nodiscard]] std::unique_ptr<ResolvedAdmit> resolved(F f, std::string_view rate_key = {}) {
  class Fn final : public ResolvedAdmit {
   public:
    Fn(F f, std::string_view key) : f_(std::move(f)), key_(key) {}
    std::string_view rate_key() const noexcept override { return key_; }
    Decided<AdmitDecision> take(Nanos now, Deferral<AdmitDecision>& later) override {
      return f_(now, later);
    }

   private:
    F f_;
    std::string_view key_;
  };
  return std::make_unique<Fn>(std::move(f), rate_key);
}

// The admit family: take a permit for one call, in two phases.
class AdmitFamily {
 public:
  virtual ~AdmitFamily() = default;
  // Phase one: checks the call's fields this kind reads (its attributes: an error names the
  // field and costs nothing) and resolves what they name. The call's views stay valid until
  // the result's take() returns.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<ResolvedAdmit>> resolve(const AdmitCall& call,
                                                                         Nanos now) = 0;
  // A call it resolved was refused by its chained rate policy between the phases (no permit
  // was taken). Default: nothing.
  virtual void refused_by_rate() noexcept {}
};

struct PolicyReadiness {
  // False: it cannot serve as configured (a fail-closed fleet guard that never reached its
  // coordinator refuses every call): a load balancer should send its traffic elsewhere.
  bool serving = true;
  // Not serving: why. Serving: what is degraded, if anything (a local-only fleet guard admitting
  // on its own limit during a coordinator outage); empty when nothing is.
  std::string why;
};

class Policy : public std::enable_shared_from_this<Policy> {
 public:
  virtual ~Policy();  // stops any loop still running (a kind with loops retires in its own)
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  // The kind's registered name ("rate", "adaptive", ...).
  [[nodiscard]] const std::string& kind() const noexcept { return kind_; }
  // The rate policy its admits pass first; empty: none.
  [[nodiscard]] const std::string& rate_name() const noexcept { return rate_; }

  // The families it answers (null: not that one).
  [[nodiscard]] virtual RateFamily* rate_family() noexcept { return nullptr; }
  [[nodiscard]] virtual AdmitFamily* admit_family() noexcept { return nullptr; }

  // No longer served: stops what it runs (a fleet policy leaves its fleet and refuses from
  // then on). Idempotent.
  void retire() noexcept;
  [[nodiscard]] bool retired() const noexcept { return retired_.load(std::memory_order_relaxed); }

  // A change prepared by reconfigure(), applied when the reload commits (it cannot fail then);
  // dropped unapplied when the reload fails.
  using Reconfiguration = Once<void()>;
  // Prepares taking `c.spec` (this policy's name and kind, a changed spec, the same `rate:`) in
  // place, so that what it holds survives the reload: in-flight permits stay counted against
  // the new limits, rate state, escrow, node health and runtime rules stay. Empty: it cannot
  // (the engine builds a new policy and retires this one). An error: the reload fails, naming
  // this policy. Must not change anything the policy serves with until applied. Default: empty.
  [[nodiscard]] virtual StatusOr<Reconfiguration> reconfigure(const BuildContext& c);

  // The policy's state: {"name", "kind", "rate"?, <the kind's fields>, "retired"}; fills
  // `info` (name, kind, rate, in_flight, limit, state_json) when non-null.
  [[nodiscard]] nlohmann::json state(PolicyInfo* info = nullptr) const;
  [[nodiscard]] PolicyInfo info() const;
  // Metric families (each series gets a policy label from the engine).
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect() const;
  // Whether it serves as configured (a configured outage mode counts: it is the
  // configuration), and what is degraded meanwhile.
  [[nodiscard]] virtual PolicyReadiness readiness() const { return {}; }
  // The server is stopping (it refuses new calls from now on): a kind holding calls that wait
  // for a permit (a queue) answers them now, UNAVAILABLE, and holds no more. Default: nothing.
  virtual void on_drain() noexcept {}

  // Shadow mode (PolicySpec::shadow, server.shadow_mode): set by the config generation that
  // serves the policy; the engine turns its refusals into would_deny answers and counts them
  // here (sluice_shadow_denied_total, and "shadow" and "shadow_denied" in its state).
  void set_shadow(bool on) noexcept { shadow_.store(on, std::memory_order_relaxed); }
  [[nodiscard]] bool shadow() const noexcept { return shadow_.load(std::memory_order_relaxed); }
  void count_shadow_denied(std::uint64_t n = 1) noexcept {
    shadow_denied_.fetch_add(n, std::memory_order_relaxed);
  }

 protected:
  Policy(std::string name, std::string kind, std::string rate);

  // Starts a loop for this policy's lifetime: a thread that calls tick(now) at once and then at
  // the time it returns (or sooner: wake_loops()); retire() stops it before on_retire() runs.
  // For the builder, before the policy is served.
  void start_loop(const Clock& clock, std::function<Nanos(Nanos now)> tick);
  // Makes every loop tick now (a deferred call asks for its coordinator round trip at once).
  void wake_loops() noexcept;

  // The kind's own part of state() (it sets info.in_flight and info.limit).
  virtual void describe(nlohmann::json& j, PolicyInfo& info) const = 0;
  // The kind's own metric families.
  virtual void metrics(std::vector<prometheus::MetricFamily>& out) const = 0;
  // The kind's part of retire(), run once: on_retiring() before the loops stop (a kind ends
  // what would keep a tick from returning soon, a probe's command), on_retire() after.
  virtual void on_retiring() noexcept {}
  virtual void on_retire() noexcept {}

 private:
  const std::string name_;
  const std::string kind_;
  const std::string rate_;
  std::atomic<bool> retired_{false};
  std::atomic<bool> shadow_{false};
  std::atomic<std::uint64_t> shadow_denied_{0};
  std::vector<std::unique_ptr<TickLoop>> loops_;  // started before serving, stopped by retire()
};

// Prometheus families built at scrape time. A family of one series:
[[nodiscard]] prometheus::MetricFamily one(
    const std::string& name, const std::string& help, prometheus::MetricType type, double value,
    std::vector<prometheus::ClientMetric::Label> labels = {});
// A counter family with one series per value of `label`.
[[nodiscard]] prometheus::MetricFamily by_label(
    const std::string& name, const std::string& help, const std::string& label,
    std::initializer_list<std::pair<const char*, std::uint64_t>> series);

}  // namespace sluice::server
