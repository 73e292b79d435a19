// engine.h: what `sluice serve` decides with, apart from any transport.
//
// What it is: the live policies of one config, each built by its kind from the registry the
// engine was given (registry.h; the engine knows no kind), the lease table, and the calls both
// wire APIs (gRPC and HTTP) map onto: check / check_many / peek on policies of the rate family;
// admit / release / heartbeat on policies of the admit family; state, metrics, readiness;
// reload. A check may be decided later (completion.h): the transports park it without holding
// a thread. Every common input is checked here and every kind-specific one in its kind, so both
// transports refuse the same things with the same messages (each names its field).
//
// Policy chaining (the gateway document's order): a policy with `rate: R` passes R between the
// two phases of its admit (its kind resolves the call; the engine checks R for the call's key,
// or what the kind keys it by, a concurrency call's tenant, when it gives none: over the rate, a
// 429 and no permit is taken; then the kind takes the permit or refuses at its own limit: a
// 503).
//
// Reload: the new config's policies are built next to the old ones; a policy whose spec (and
// every coordinator's spec it uses) is unchanged is carried over as the same object,
// so its in-flight permits, rate state and fleet membership survive. If anything fails to
// build, nothing changes. A policy that is gone or changed is no longer served (a fleet policy
// leaves its fleet); leases on it keep their permit until released or expired.
//
// Thread-safety: every member is safe to call concurrently. Calls copy the current policy set's
// shared pointer under a mutex held for that copy alone; reload() swaps it (one reload at a
// time). (libstdc++ 12's std::atomic<std::shared_ptr> is the same lock in the pointer's low
// bit, which ThreadSanitizer cannot see.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <prometheus/metric_family.h>

#include "server/calls.h"
#include "server/completion.h"
#include "server/leases.h"
#include "server/rate_headers.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/status.h"
#include "sluice/local/adaptive_guard.h"

namespace sluice::server {

struct ReloadSummary {
  // changed: rebuilt (a new policy; the old one retired); reconfigured: the same policy took
  // its changed spec in place (Policy::reconfigure), keeping its in-flight permits and state.
  std::vector<std::string> added, changed, reconfigured, removed, kept;
  std::uint64_t generation = 0;
  std::vector<std::string> warnings;  // what to log: a coordinator not reached (not an error)
};

struct Readiness {
  bool ready = false;                 // every policy serves as configured, and not draining
  std::vector<std::string> problems;  // why not
  std::vector<std::string> degraded;  // serving, but degraded (a local-only fleet in an outage)
};

class PolicySet;
// Policies reloads removed, by name, while something (a lease) keeps them alive.
using RetiredPolicies = std::map<std::string, std::weak_ptr<Policy>>;

// A part of the server outside the engine (a listener) whose health /healthz and /readyz
// report and whose metrics /metrics shows, each series labelled with the part's name.
class ServerPart {
 public:
  // Why it cannot serve now; empty: it serves.
  [[nodiscard]] virtual std::string problem() const = 0;
  [[nodiscard]] virtual std::vector<prometheus::MetricFamily> collect() const = 0;

 protected:
  ~ServerPart() = default;
};

class Engine {
 public:
  // Builds every policy of `config` (connecting to the coordinators its fleet policies use).
  // `clock` must outlive the engine. An error names the policy or coordinator that failed; a
  // coordinator that cannot be reached now is not one (see make_coordinator): warnings() says.
  // `kinds`: the policy kinds it builds with (it must outlive the engine).
  [[nodiscard]] static StatusOr<std::unique_ptr<Engine>> create(
      const SluiceConfig& config, const Clock& clock,
      const PolicyRegistry& kinds = PolicyRegistry::builtin());
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Check as the transports call it: decided now (the common case), or deferred by the policy
  // (nullopt; `later`'s Completion answers, completion.h). An error costs nothing.
  [[nodiscard]] Decided<RateDecision> check(const CheckCall& call, Deferral<RateDecision>& later);
  // All or nothing: a denial (or an error) refunds every check allowed before or beside it.
  // Checks are issued in order and stop at the first inline denial; deferred ones run
  // concurrently, and the answer comes when the last of them does.
  [[nodiscard]] Decided<CheckManyResult> check_many(std::span<const CheckCall> calls,
                                                    Deferral<CheckManyResult>& later);
  // The same, waiting on this thread for a deferred decision (in-process callers and tests).
  [[nodiscard]] StatusOr<RateDecision> check(const CheckCall& call);
  [[nodiscard]] StatusOr<CheckManyResult> check_many(std::span<const CheckCall> calls);
  [[nodiscard]] StatusOr<RateDecision> peek(const CheckCall& call) const;
  // What the policy says of a refusal with a reason (empty for an admission, or a refusal
  // without one): the words the wire APIs add to the decision.
  [[nodiscard]] std::string refusal_detail(const CheckCall& call, const RateDecision& d) const;

  // Admit as the transports call it: decided now, or deferred by a policy that queues the call
  // (nullopt; `later`'s Completion answers, and `later` is told when the caller goes away). The
  // lease of a deferred admission is made, and its TTL counted, when its permit comes.
  [[nodiscard]] Decided<AdmitResult> admit(const AdmitCall& call, Deferral<AdmitResult>& later);
  // The same, waiting on this thread for a deferred decision (in-process callers and tests).
  [[nodiscard]] StatusOr<AdmitResult> admit(const AdmitCall& call);
  // Returns how long the lease was held. `rtt` unset: that time.
  [[nodiscard]] StatusOr<Nanos> release(std::string_view lease_id, CallResult result,
                                        std::optional<Nanos> rtt);
  // The same, and with `cost` (0 to kMaxHits) what the call cost its policy's chained rate
  // policy in hits: the admit's check took one hit for its key, the rest is charged now (a
  // cost of 0 gives that one back), as charge() does. A policy that chains no rate policy:
  // FAILED_PRECONDITION, the lease released all the same. With `keep` (a lease admitted
  // reusable, AdmitResult::reusable; not with a cost): the call is recorded but the lease keeps
  // its permit for its client's next call, its TTL restarted, and Released::kept says whether
  // that call is within the policy's limit, the policy still served and the server not
  // draining (false: release the lease after it; the permit is held until then, so the calls
  // at the backend never outnumber the permits). `earlier`: the
  // calls a reusable lease carried before this one since its last keep, each followed by
  // another on its permit, oldest first (at most kMaxEarlier, each with its RTT), recorded
  // before it. A lease that is not reusable, with `keep` or `earlier`: FAILED_PRECONDITION,
  // the lease released all the same.
  [[nodiscard]] StatusOr<Released> release(std::string_view lease_id, CallResult result,
                                           std::optional<Nanos> rtt,
                                           std::optional<std::int64_t> cost, bool keep = false,
                                           std::span<const CallEnd> earlier = {});
  // Charges call.hits (> 0) to call.key after the fact, whatever it has left, or gives -hits
  // back (< 0), on a policy of the rate family that takes charges (rate, federated:
  // sluice/core/rate_strategy.h, charge); returns the key's allowance after it. Never refused,
  // and served while draining (the call it charges for has happened, as a Release has); an
  // error means nothing was recorded.
  [[nodiscard]] StatusOr<RateCharge> charge(const CheckCall& call);
  // Returns the lease's TTL from now.
  [[nodiscard]] StatusOr<Nanos> heartbeat(std::string_view lease_id, std::optional<Nanos> ttl);
  // Expires leases past their deadline (the server's sweeper calls it); returns how many.
  std::size_t expire_leases();
  [[nodiscard]] std::size_t leases() const { return leases_.size(); }

  // The policies of kind `kind` in the set now serving, in the order of their names (what a
  // kind's route is given); it keeps that set alive. No copy: one reference count per call.
  [[nodiscard]] std::shared_ptr<const KindPolicies> policies_of(std::string_view kind) const;
  // The kinds it builds with (their routes and gRPC methods included).
  [[nodiscard]] const PolicyRegistry& kinds() const noexcept { return kinds_; }

  [[nodiscard]] std::vector<PolicyInfo> policies() const;
  [[nodiscard]] std::string policies_json() const;
  [[nodiscard]] std::string metrics_text() const;
  // Not ready also while a part attached below cannot serve.
  [[nodiscard]] Readiness readiness() const;
  // Whether the process still serves: the problems of its attached parts (empty: it does).
  [[nodiscard]] std::vector<std::string> liveness() const;
  // Reports `part` (named `name` in messages and metrics) until detached; it must outlive that.
  void attach(std::string name, const ServerPart* part);
  void detach(const ServerPart* part);
  [[nodiscard]] ServerSettings settings() const;
  // server.rate_limit_headers of the config now serving (no copy of the settings).
  [[nodiscard]] RateLimitHeaders rate_limit_headers() const;
  [[nodiscard]] std::uint64_t generation() const;
  // What building the config now serving left to log (a coordinator not reached).
  [[nodiscard]] std::vector<std::string> warnings() const;

  // Swaps in `config`'s policies (see above). On error nothing changed.
  [[nodiscard]] StatusOr<ReloadSummary> reload(const SluiceConfig& config);
  // Counts a reload that failed before reaching the engine (a config with errors).
  void note_reload_failure() noexcept { reload_failures_.fetch_add(1, std::memory_order_relaxed); }

  // Shutdown, first half: Check and Admit answer UNAVAILABLE; Release and Heartbeat still work.
  // Calls waiting in a policy's queue are answered UNAVAILABLE at once (Policy::on_drain).
  void drain() noexcept;
  [[nodiscard]] bool draining() const noexcept { return draining_.load(std::memory_order_relaxed); }
  // Shutdown, second half: releases every lease and closes every policy (fleets are left).
  void close();
  // What the policies told the operator since the last call (Notices), for the server's log.
  [[nodiscard]] std::vector<std::string> take_notices() { return notices_->take(); }

 private:
  Engine(const Clock& clock, const PolicyRegistry& kinds, std::shared_ptr<RuntimeStateStore> state,
         std::shared_ptr<PolicyDirectory> directory, std::shared_ptr<Notices> notices,
         std::shared_ptr<const PolicySet> set);
  [[nodiscard]] std::shared_ptr<const PolicySet> current() const;
  [[nodiscard]] Status usable() const;

  const Clock& clock_;
  const PolicyRegistry& kinds_;
  // Rules set at run time (server.state_file), opened at start: every generation shares it.
  const std::shared_ptr<RuntimeStateStore> state_;
  // The policies serving now, for policies that look others up (published at each commit).
  const std::shared_ptr<PolicyDirectory> directory_;
  // What policies tell the operator while serving (BuildContext::notices), for the log.
  const std::shared_ptr<Notices> notices_;
  mutable std::mutex parts_mu_;
  std::vector<std::pair<std::string, const ServerPart*>> parts_;
  mutable std::mutex set_mu_;  // guards set_ (a pointer copy or swap, nothing else)
  std::shared_ptr<const PolicySet> set_;
  std::mutex reload_mu_;
  RetiredPolicies retired_;  // guarded by reload_mu_
  LeaseTable leases_;
  std::atomic<bool> draining_{false};
  std::atomic<std::uint64_t> reloads_{0};
  std::atomic<std::uint64_t> reload_failures_{0};
};

}  // namespace sluice::server
