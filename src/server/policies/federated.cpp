// The federated kind: a FederatedLimiter per policy, its coordinator calls on a small pool.
#include "server/policies/federated.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <mutex>
#include <sstream>

#include "federation/io_pool.h"
#include "server/calls.h"
#include "server/policies/rate.h"
#include "sluice/core/rate_coordinator.h"
#include "sluice/core/regional_escrow.h"

namespace sluice::server {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// The reasons a federated check is refused, each counted (/v1/policies "refusals",
// sluice_federated_refusals_total{reason}).
constexpr FederatedReason kRefusalReasons[] = {FederatedReason::kBudgetSpent,
                                               FederatedReason::kBudgetShort,
                                               FederatedReason::kCoordinatorUnreachable,
                                               FederatedReason::kCoordinatorRestarted,
                                               FederatedReason::kSpecMismatch,
                                               FederatedReason::kNeverFits,
                                               FederatedReason::kKeyCapacity,
                                               FederatedReason::kRegionalBalanceSpent};
constexpr std::size_t kRefusalCount = std::size(kRefusalReasons);

// How often expired escrow is forfeited and idle keys forgotten: once a window, within
// [1 s, 60 s] (a check of a key forfeits its own expired escrow at once anyway).
Nanos sweep_interval(const FederationOptions& o) {
  return std::clamp<Nanos>(o.budget.period, std::chrono::seconds(1), std::chrono::seconds(60));
}

std::string spec_text(const BudgetSpec& s) {
  std::ostringstream out;
  out << s.limit << " per " << seconds_of(s.period) << "s";
  return out.str();
}

// The options with the policy's telling, to the server's log (BuildContext::notices): a spec
// mismatch once per key and window, a clock drift past drift_ppm when it starts and ends.
FederationOptions told(FederationOptions o, const BuildContext& c) {
  if (c.notices == nullptr) return o;
  o.on_spec_mismatch = [notices = c.notices, name = c.name, own = o.budget, region = o.region](
                           std::string_view key, const BudgetSpec& in_force) {
    constexpr std::size_t kShown = 128;  // a key is the caller's: its first bytes say enough
    notices->tell("policy " + name + ": key '" + std::string(key.substr(0, kShown)) +
                  (key.size() > kShown ? "...'" : "'") +
                  ": the coordinator holds this window's budget as " + spec_text(in_force) +
                  " (the spec of the region that leased first); region " + region + " asks " +
                  spec_text(own) +
                  " and is refused every check of the key until the regions "
                  "agree: give every region one limit and period for a budget");
  };
  o.on_drift = [notices = c.notices, name = c.name, allowed = o.drift_ppm](std::uint32_t ppm) {
    if (ppm == 0) {
      notices->tell("policy " + name + ": the coordinator's clock is back within " +
                    std::to_string(allowed) + " ppm of this server's");
      return;
    }
    notices->tell("policy " + name + ": the coordinator's clock runs faster than this server's " +
                  "by more than the " + std::to_string(allowed) + " ppm escrow allows for: up to " +
                  std::to_string(ppm) +
                  " ppm by the lease replies, so escrow now expires that much earlier to keep "
                  "the budget's bound; check this host's clock (NTP, the VM's clock source)");
  };
  return o;
}

class FederatedPolicy final : public Policy, public RateFamily {
 public:
  FederatedPolicy(const BuildContext& c, const FederationOptions& options, std::size_t io_threads,
                  std::shared_ptr<RateCoordinator> coordinator,
                  std::shared_ptr<RegionalEscrow> regional)
      : Policy(c.name, "federated", c.spec.rate),
        coordinator_(std::move(coordinator)),
        regional_(std::move(regional)),
        clock_(c.clock),
        pool_(io_threads),
        limiter_(*coordinator_, regional_.get(), c.clock, told(options, c), pool_.executor()) {
    start_loop(c.clock, [this](Nanos now) {
      limiter_.sweep(now);
      return now + sweep_interval(limiter_.options());
    });
  }
  // The loop uses the limiter: stopped first; then unspent escrow goes back to its window.
  ~FederatedPolicy() override {
    retire();
    limiter_.relinquish_all(clock_.now());
  }
  FederatedPolicy(const FederatedPolicy&) = delete;
  FederatedPolicy& operator=(const FederatedPolicy&) = delete;

  [[nodiscard]] RateFamily* rate_family() noexcept override { return this; }

  // Answered from escrow when it can be; otherwise parked until the key's lease returns (at
  // most lease_timeout).
  Decided<RateDecision> check_or_defer(std::string_view key, std::uint64_t hits, Nanos now,
                                       Deferral<RateDecision>& later) override {
    if (auto d = limiter_.try_check(key, hits, now)) return count(d->rate);
    if (retired()) return Status(StatusCode::kUnavailable, "policy " + name() + " was retired");
    auto h = std::make_shared<Handoff<RateDecision>>();
    limiter_.check(key, hits, now, [this, h](FederatedDecision d) {
      std::unique_lock lock(h->mu);
      if (!h->returned) {
        h->early = d.rate;
        return;
      }
      Completion<RateDecision> done = std::move(h->later);
      lock.unlock();
      done(count(d.rate));
    });
    const std::lock_guard lock(h->mu);
    h->returned = true;
    if (h->early) return count(*h->early);
    h->later = later.defer();
    return std::nullopt;
  }
  // The inline answer (a chained admit's gate): waits for the key's lease when it needs one, at
  // most lease_timeout (every coordinator call is bounded by it).
  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    if (auto d = limiter_.try_check(key, hits, now)) return count(d->rate);
    auto done = std::make_shared<OneShot<RateDecision>>();
    auto set = std::make_shared<Once<void(RateDecision)>>(done->setter());
    limiter_.check(key, hits, now, [set](FederatedDecision d) { (*set)(d.rate); });
    return count(done->get());
  }
  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    return limiter_.peek(key, hits, now).rate;
  }
  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    limiter_.refund(key, hits, now);
  }
  // Spent from escrow, the rest leased in the background (federation.h: charge): never waits.
  StatusOr<RateCharge> charge(std::string_view key, std::uint64_t hits, Nanos now) override {
    RateCharge c = limiter_.charge(key, hits, now);
    if (!c.recorded) {
      std::string why = "key: federated policy " + name() + " holds state for its max_keys (";
      why += std::to_string(limiter_.options().max_keys);
      why += ") keys; the charge of new key '";
      why += key;
      why += "' was not recorded";
      return Status(StatusCode::kResourceExhausted, std::move(why));
    }
    return c;
  }
  Rejection refusal(std::string_view key, const RateDecision& d) const override {
    const FederationOptions& o = limiter_.options();
    std::ostringstream detail;
    detail << "Federated policy " << name() << " allows " << o.budget.limit << " per "
           << seconds_of(o.budget.period) << "s for key '" << key << "' across every region";
    if (!d.reason.empty()) detail << " (" << d.reason << ")";
    if (d.reason == to_string(FederatedReason::kSpecMismatch))
      if (const std::optional<BudgetSpec> s = limiter_.spec_in_force(key))
        detail << ": the coordinator holds this window's budget as " << spec_text(*s)
               << ", the spec of the region that leased first; this region asks "
               << spec_text(o.budget) << " (give every region one limit and period)";
    Rejection out = rate_refusal(name(), detail.str(), d);
    // No escrow here and no coordinator to lease from: the service, not the caller, is short.
    if (d.reason == to_string(FederatedReason::kCoordinatorUnreachable)) out.status = 503;
    return out;
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    const FederationOptions& o = limiter_.options();
    const FederationStats st = limiter_.stats();
    info.limit = o.budget.limit;
    j["strategy"] = "fixed-window";
    j["limit"] = o.budget.limit;
    j["window_seconds"] = seconds_of(o.budget.period);
    j["region"] = o.region;
    j["batch"] = o.batch;
    j["coordinator"] = std::string(coordinator_->backend());
    // Whose the budget is: this process's alone (the embedded memory coordinator), or every
    // server's that shares the coordinator.
    j["scope"] = coordinator_->backend() == "memory" ? "process" : "shared";
    j["outage"] = std::string(to_string(o.outage));
    if (regional_ != nullptr) {
      j["regional_escrow"] = std::string(regional_->backend());
      j["regional_batch"] = o.regional_batch != 0 ? o.regional_batch : 4 * o.batch;
      j["pool_taken"] = st.pool_taken;
      j["pool_refilled"] = st.pool_refilled;
      j["pool_failures"] = st.pool_failures;
      j["outages"] = st.outages;
      j["in_outage"] = st.in_outage;
    }
    j["keys"] = st.keys;
    j["max_keys"] = o.max_keys;
    j["leases"] = st.leases;
    j["lease_failures"] = st.lease_failures;
    j["granted"] = st.granted;
    j["spent"] = st.spent;
    j["forfeited"] = st.forfeited;
    j["charged"] = st.charged;
    j["forgiven"] = st.forgiven;
    j["spec_mismatches"] = st.spec_mismatches;
    j["clock_drift_ppm"] = st.clock_drift_ppm;
    j["drift_ppm_in_force"] = st.drift_ppm_in_force;
    j["allowed"] = allowed_.load(std::memory_order_relaxed);
    j["denied"] = denied_.load(std::memory_order_relaxed);
    nlohmann::json& refusals = j["refusals"] = nlohmann::json::object();
    for (std::size_t i = 0; i < kRefusalCount; ++i)
      refusals[std::string(to_string(kRefusalReasons[i]))] =
          refused_[i].load(std::memory_order_relaxed);
  }
  void metrics(std::vector<MetricFamily>& out) const override {
    const FederationStats st = limiter_.stats();
    out.push_back(by_label("sluice_federated_decisions_total", "Federated checks by decision",
                           "decision", {{"allowed", allowed_.load()}, {"denied", denied_.load()}}));
    MetricFamily& refusals = out.emplace_back(MetricFamily{"sluice_federated_refusals_total",
                                                           "Federated checks refused, by reason",
                                                           MetricType::Counter,
                                                           {}});
    for (std::size_t i = 0; i < kRefusalCount; ++i) {
      prometheus::ClientMetric m;
      m.label = {{"reason", std::string(to_string(kRefusalReasons[i]))}};
      m.counter.value = static_cast<double>(refused_[i].load(std::memory_order_relaxed));
      refusals.metric.push_back(std::move(m));
    }
    out.push_back(one("sluice_federated_leases_total", "Escrow lease calls to the coordinator",
                      MetricType::Counter, static_cast<double>(st.leases)));
    out.push_back(one("sluice_federated_lease_failures_total",
                      "Lease calls that failed or timed out", MetricType::Counter,
                      static_cast<double>(st.lease_failures)));
    out.push_back(one("sluice_federated_granted_units_total", "Budget units leased as escrow",
                      MetricType::Counter, static_cast<double>(st.granted)));
    out.push_back(one("sluice_federated_spent_units_total", "Escrow units spent on admissions",
                      MetricType::Counter, static_cast<double>(st.spent)));
    out.push_back(one("sluice_federated_forfeited_units_total",
                      "Escrow units that expired unspent or were given back", MetricType::Counter,
                      static_cast<double>(st.forfeited)));
    out.push_back(one("sluice_federated_charged_hits_total",
                      "Hits charged after the fact (Charge, Release with a cost)",
                      MetricType::Counter, static_cast<double>(st.charged)));
    out.push_back(one("sluice_federated_forgiven_hits_total",
                      "Charged hits the window's budget could not cover (overdrafts)",
                      MetricType::Counter, static_cast<double>(st.forgiven)));
    out.push_back(
        one("sluice_federated_spec_mismatches_total",
            "Leases refused: another region fixed the window with another limit or window",
            MetricType::Counter, static_cast<double>(st.spec_mismatches)));
    out.push_back(one("sluice_federated_clock_drift_ppm",
                      "How much faster the coordinator's clock runs than this server's, at most "
                      "(ppm, from lease replies; 0 until measured)",
                      MetricType::Gauge, static_cast<double>(st.clock_drift_ppm)));
    out.push_back(one("sluice_federated_drift_ppm_in_force",
                      "The clock drift allowance escrow expires with: drift_ppm, or the measured "
                      "drift when that is more",
                      MetricType::Gauge, static_cast<double>(st.drift_ppm_in_force)));
    out.push_back(one("sluice_federated_keys", "Keys the federated policy holds escrow state for",
                      MetricType::Gauge, static_cast<double>(st.keys)));
    if (regional_ == nullptr) return;
    out.push_back(one("sluice_federated_pool_taken_units_total",
                      "Escrow units taken from the regional pool", MetricType::Counter,
                      static_cast<double>(st.pool_taken)));
    out.push_back(one("sluice_federated_pool_refilled_units_total",
                      "Escrow units this process put in the regional pool (refills and releases)",
                      MetricType::Counter, static_cast<double>(st.pool_refilled)));
    out.push_back(one("sluice_federated_pool_failures_total",
                      "Regional pool calls that failed or timed out", MetricType::Counter,
                      static_cast<double>(st.pool_failures)));
    out.push_back(one("sluice_federated_outages_total",
                      "Regional-only outages entered (the coordinator unreachable)",
                      MetricType::Counter, static_cast<double>(st.outages)));
    out.push_back(one("sluice_federated_in_outage",
                      "1 while serving the regional pool's balance in a coordinator outage",
                      MetricType::Gauge, st.in_outage ? 1.0 : 0.0));
  }

 private:
  const RateDecision& count(const RateDecision& d) {
    (d.allowed ? allowed_ : denied_).fetch_add(1, std::memory_order_relaxed);
    if (!d.allowed)
      for (std::size_t i = 0; i < kRefusalCount; ++i)
        if (d.reason == to_string(kRefusalReasons[i])) {
          refused_[i].fetch_add(1, std::memory_order_relaxed);
          break;
        }
    return d;
  }

  // Declared before their users: the limiter's destructor waits for the coordinator calls it
  // posted to the pool, whose callbacks count into allowed_ and denied_.
  std::shared_ptr<RateCoordinator> coordinator_;
  std::shared_ptr<RegionalEscrow> regional_;  // null: none
  const Clock& clock_;
  std::atomic<std::uint64_t> allowed_{0}, denied_{0};
  std::array<std::atomic<std::uint64_t>, kRefusalCount> refused_{};  // by kRefusalReasons
  IoPool pool_;
  FederatedLimiter limiter_;
};

std::shared_ptr<const PolicyBody> parse(const std::string& name, ConfigSection& s,
                                        PolicySpec& spec) {
  s.keys({"kind", "strategy", "limit", "window", "region", "budget", "batch", "coordinator",
          "outage", "regional_escrow", "regional_batch", "coordinator_health_check",
          "lease_timeout", "retry_backoff", "drift_ppm", "min_window_left", "io_threads",
          "max_keys", "shadow"});
  auto body = std::make_shared<FederatedSpec>();
  FederationOptions& o = body->options;
  o.budget.period = std::chrono::seconds(1);
  if (auto v = s.str("strategy"); v && *v != "fixed-window") {
    if (*v == "sliding-window" || *v == "gcra")
      s.error("strategy", "'" + *v +
                              "' cannot be federated without overshoot: only fixed-window (a "
                              "budget that starts whole at each window boundary) can be split "
                              "into escrow that expires with its window");
    else
      s.error("strategy", "'" + *v + "' is not a strategy; federation runs fixed-window");
  }
  if (auto v = s.uint("limit", 1, std::numeric_limits<std::uint32_t>::max(), true))
    o.budget.limit = *v;
  if (auto d = s.duration("window")) o.budget.period = *d;
  if (auto v = s.str("region")) {
    if (v->empty()) s.error("region", "must not be empty (leave it out for the server's node id)");
    o.region = *v;
  }
  o.budget_id = name;
  if (auto v = s.str("budget")) o.budget_id = *v;
  if (auto v = s.uint("batch", 1, 1'000'000)) o.batch = *v;
  if (auto v = s.str("coordinator")) body->coordinator = *v;
  // Left out, the budget is the embedded memory coordinator's: this process's alone. Said
  // when the config loads (serve and validate print it), unless it is asked for by name.
  if (!s.has("coordinator"))
    s.warning_at(
        "coordinator",
        "not set: this budget is held by the embedded memory coordinator, so it is this "
        "process's alone (several servers would each admit the whole limit); name a "
        "redis, postgres or etcd coordinator to share it, or write `coordinator: memory` if "
        "one process is meant");
  spec.use("coordinator", body->coordinator, CoordinatorRole::kRateBudget);
  if (auto v = s.str("regional_escrow")) {
    if (v->empty())
      s.error("regional_escrow", "must name a coordinator (memory or redis) to hold the pool");
    else
      spec.use("regional_escrow", *v, CoordinatorRole::kRegionalEscrow);
    body->regional_escrow = *v;
  }
  if (auto v = s.uint("regional_batch", 1, 100'000'000)) {
    if (body->regional_escrow.empty())
      s.error("regional_batch",
              "is what a process leases for the regional pool: it needs "
              "regional_escrow");
    o.regional_batch = *v;
  }
  if (auto v = s.str("outage"); v && *v != "fail-closed") {
    if (*v != "regional-only")
      s.error("outage", "'" + *v + "' is not an outage mode; one of fail-closed, regional-only");
    else if (body->regional_escrow.empty())
      s.error("outage",
              "regional-only serves the regional pool's balance during a coordinator outage: it "
              "needs regional_escrow");
    else
      o.outage = FederationOutage::kRegionalOnly;
  }
  if (auto d = s.duration("coordinator_health_check")) o.coordinator_health_check = *d;
  if (auto d = s.duration("lease_timeout")) o.lease_timeout = *d;
  if (auto d = s.duration("retry_backoff")) o.retry_backoff = *d;
  if (auto v = s.uint("drift_ppm", 0, 999'999)) o.drift_ppm = static_cast<std::uint32_t>(*v);
  if (auto d = s.duration("min_window_left")) o.min_window_left = *d;
  if (auto v = s.uint("io_threads", 1, 64)) body->io_threads = *v;
  if (auto v = s.uint("max_keys", 1, 100'000'000)) o.max_keys = *v;
  if (o.min_window_left >= o.budget.period)
    s.error("min_window_left", "must be shorter than the window");
  FederationOptions probe = o;  // the region, when not set, is the server's node id (build)
  if (probe.region.empty()) probe.region = "node";
  if (std::string why = probe.validate(); !why.empty()) {
    const std::string field = why.substr(0, why.find(':'));
    s.error(field == "period" ? "window" : field, why.substr(why.find(':') + 2));
  } else if (o.budget_id.empty()) {
    s.error("budget", "must not be empty");
  }
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const FederatedSpec& spec = *c.spec.as<FederatedSpec>();
  auto coordinator =
      c.coordinator<RateCoordinator>(spec.coordinator, "federation's rate-budget interface");
  if (!coordinator.ok()) return coordinator.status();
  FederationOptions options = spec.options;
  if (options.region.empty()) options.region = c.node_id;
  if (std::string why = options.validate(); !why.empty())
    return Status(StatusCode::kInvalidArgument, why);
  std::shared_ptr<RegionalEscrow> regional;
  if (!spec.regional_escrow.empty()) {
    auto r = c.coordinator<RegionalEscrow>(spec.regional_escrow, "a regional escrow (pool)");
    if (!r.ok()) return r.status();
    regional = std::move(r.value());
  }
  return std::shared_ptr<Policy>(std::make_shared<FederatedPolicy>(
      c, options, spec.io_threads, std::move(coordinator.value()), std::move(regional)));
}

}  // namespace

PolicyKind federated_kind() { return PolicyKind("federated", PolicyKind::kRate, parse, build); }

}  // namespace sluice::server
