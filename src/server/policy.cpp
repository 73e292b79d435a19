#include "server/policy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "sluice/gateway_metrics.h"
#include "sluice/memory_coordinator.h"
#include "sluice/postgres_coordinator.h"
#include "sluice/redis_coordinator.h"

namespace sluice::server {

using nlohmann::json;
using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily one(const std::string& name, const std::string& help, MetricType type, double value,
                 std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  return MetricFamily{name, help, type, {std::move(m)}};
}

MetricFamily by_label(const std::string& name, const std::string& help, const std::string& label,
                      std::initializer_list<std::pair<const char*, std::uint64_t>> series) {
  MetricFamily f{name, help, MetricType::Counter, {}};
  for (const auto& [value, n] : series) {
    ClientMetric m;
    m.label = {{label, value}};
    m.counter.value = static_cast<double>(n);
    f.metric.push_back(std::move(m));
  }
  return f;
}

namespace {

// Connects with `connect`; when the server cannot be reached now, opens with `open` instead (a
// coordinator that connects on its first call) and says so in `warning`.
template <typename C, typename Options>
StatusOr<std::unique_ptr<ConcurrencyCoordinator>> connect_or_open(const std::string& name,
                                                                  const Options& options,
                                                                  const CoordinatorConfig& rules,
                                                                  std::string& warning) {
  auto c = C::connect(options, rules);
  if (c.ok()) return std::unique_ptr<ConcurrencyCoordinator>(std::move(c.value()));
  const StatusCode code = c.status().code();
  if (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded)
    return Status(code, "coordinator " + name + ": " + c.status().message());
  auto opened = C::open(options, rules);
  if (!opened.ok())
    return Status(opened.status().code(), "coordinator " + name + ": " + opened.status().message());
  warning = "coordinator " + name + " is not reachable now (" + c.status().message() +
            "); its fleet policies start in their outage mode and it is tried again on every "
            "heartbeat";
  return std::unique_ptr<ConcurrencyCoordinator>(std::move(opened.value()));
}

}  // namespace

StatusOr<std::shared_ptr<NamedCoordinator>> make_coordinator(const std::string& name,
                                                             const CoordinatorSpec& spec,
                                                             const Clock& clock,
                                                             std::string& warning) {
  StatusOr<std::unique_ptr<ConcurrencyCoordinator>> inner =
      std::unique_ptr<ConcurrencyCoordinator>();
  switch (spec.kind) {
    case CoordinatorSpec::Kind::kMemory:
      inner = std::unique_ptr<ConcurrencyCoordinator>(
          std::make_unique<MemoryCoordinator>(clock, spec.rules));
      break;
    case CoordinatorSpec::Kind::kRedis:
      inner = connect_or_open<RedisCoordinator>(name, spec.redis, spec.rules, warning);
      break;
    case CoordinatorSpec::Kind::kPostgres:
      inner = connect_or_open<PostgresCoordinator>(name, spec.postgres, spec.rules, warning);
      break;
  }
  if (!inner.ok()) return inner.status();
  auto named = std::make_shared<NamedCoordinator>();
  named->fingerprint = spec.fingerprint;
  named->stats = std::make_shared<CoordinatorCallStats>();
  named->fleet =
      std::make_shared<TimedConcurrencyCoordinator>(std::move(inner.value()), clock, named->stats);
  return named;
}

// ---- Policy ----

StatusOr<std::shared_ptr<Policy>> Policy::create(
    const std::string& name, const PolicySpec& spec, std::string identity,
    std::shared_ptr<ConcurrencyCoordinator> coordinator, const std::string& node_id,
    const Clock& clock) {
  const auto fail = [&](const Status& s) {
    return Status(s.code(), "policy " + name + ": " + s.message());
  };
  PolicyKind kind = PolicyKind::kRate;
  if (std::holds_alternative<AdaptivePolicy>(spec.body)) kind = PolicyKind::kAdaptive;
  if (std::holds_alternative<FleetPolicy>(spec.body)) kind = PolicyKind::kFleet;
  if (std::holds_alternative<ConcurrencyPolicy>(spec.body)) kind = PolicyKind::kConcurrency;
  std::shared_ptr<Policy> p(new Policy(name, kind, spec, std::move(identity)));
  if (const auto* r = std::get_if<RatePolicy>(&spec.body)) {
    auto l = make_rate_limiter(RateLimiterOptions{r->rule, 64}, clock);
    if (!l.ok()) return fail(l.status());
    p->limiter_ = std::move(l.value());
  } else if (const auto* a = std::get_if<AdaptivePolicy>(&spec.body)) {
    p->adaptive_ = std::make_unique<AdaptiveGuard>(make_algorithm(a->algorithm), clock);
  } else if (const auto* f = std::get_if<FleetPolicy>(&spec.body)) {
    FleetGuardOptions o = f->guard;
    o.node_id = node_id;
    p->coordinator_ = std::move(coordinator);
    auto g = FleetGuard::create(*p->coordinator_, make_algorithm(f->algorithm), clock, o);
    if (!g.ok()) return fail(g.status());
    p->fleet_ = std::move(g.value());
    p->runner_ = std::make_unique<FleetGuardRunner>(*p->fleet_, clock);
  } else if (const auto* c = std::get_if<ConcurrencyPolicy>(&spec.body)) {
    GatewayBuild b = Gateway::create(c->gateway);
    if (!b.gateway) {
      std::string why;
      for (const auto& e : b.report.errors) why += (why.empty() ? "" : "; ") + e.message;
      return fail(Status(StatusCode::kInvalidArgument, why));
    }
    p->gateway_ = std::move(b.gateway);
  }
  return p;
}

Policy::~Policy() { retire(); }

std::string_view Policy::kind_name() const noexcept { return spec_.kind(); }

void Policy::retire() noexcept {
  if (retired_.exchange(true, std::memory_order_acq_rel)) return;
  runner_.reset();
  if (fleet_) fleet_->close();
}

RateDecision Policy::check(std::string_view key, std::uint64_t hits, Nanos now) {
  RateDecision d = limiter_->check(key, hits, now);
  (d.allowed ? allowed_ : denied_).fetch_add(1, std::memory_order_relaxed);
  return d;
}

RateDecision Policy::peek(std::string_view key, std::uint64_t hits, Nanos now) const {
  return limiter_->peek(key, hits, now);
}

void Policy::refund(std::string_view key, std::uint64_t hits, Nanos now) {
  limiter_->refund(key, hits, now);
}

Rejection Policy::rate_refusal(std::string_view key, const RateDecision& d) const {
  const RateRule& r = rule();
  Rejection out;
  out.source = "rate";
  out.limit_type = "rate";
  out.status = 429;
  out.type = "urn:sluice:problem:rate-limit-exceeded";
  out.title = "Rate Limit Exceeded";
  std::ostringstream detail;
  detail << "Rate policy " << name_ << " allows " << r.limit << " per " << seconds_of(r.period)
         << "s for key '" << key << "'";
  if (d.retry_after != Nanos::max()) detail << "; retry after " << seconds_of(d.retry_after) << "s";
  out.detail_text = detail.str();
  out.retry_after = d.retry_after;
  out.policy = name_;
  out.current_in_flight = d.limit - std::min(d.limit, d.remaining);
  out.max_concurrent = d.limit;
  out.remaining = d.remaining;
  return out;
}

namespace {

// A lease's permit: the kind's own permit plus the policy it counts on. Finishing it gives the
// permit back and ends the lease's count (and counts a client's release).
template <class P>
class PolicyLease {
 public:
  PolicyLease(P permit, std::shared_ptr<Policy> policy) noexcept
      : permit_(std::move(permit)), policy_(std::move(policy)) {
    policy_->lease_began();
  }
  PolicyLease(PolicyLease&&) noexcept = default;

  void finish(const CallEnd& end) noexcept {
    if constexpr (std::is_same_v<P, GuardPermit>)
      permit_.release(to_outcome(end.result), end.rtt);
    else
      permit_.release();
    if (end.by == CallEnd::By::kClient) policy_->count_release();
    policy_->lease_ended();
  }

 private:
  P permit_;
  std::shared_ptr<Policy> policy_;
};

}  // namespace

std::optional<LeasePermit> Policy::acquire(const Target& target, Rejection& refusal) {
  if (kind_ == PolicyKind::kConcurrency) {
    Admission a = gateway_->try_acquire(target);
    if (a.admitted()) {
      admitted_.fetch_add(1, std::memory_order_relaxed);
      return LeasePermit(PolicyLease<GatewayPermit>(std::move(a.permit()), shared_from_this()));
    }
    limit_refused_.fetch_add(1, std::memory_order_relaxed);
    refusal = std::move(*a.rejection());
    refusal.policy = name_;
    return std::nullopt;
  }
  std::optional<GuardPermit> permit = adaptive_ ? adaptive_->acquire() : fleet_->acquire();
  if (permit) {
    admitted_.fetch_add(1, std::memory_order_relaxed);
    return LeasePermit(PolicyLease<GuardPermit>(std::move(*permit), shared_from_this()));
  }
  limit_refused_.fetch_add(1, std::memory_order_relaxed);
  // One snapshot: a fleet guard's local stats and its share must come from the same moment.
  const FleetGuardStats fs = fleet_ ? fleet_->stats() : FleetGuardStats{};
  const AdaptiveGuardStats s = fleet_ ? fs.local : adaptive_->stats();
  refusal = Rejection{};
  refusal.source = "concurrency";
  refusal.limit_type = "limit";
  refusal.status = 503;
  refusal.type = "urn:sluice:problem:concurrency-limit-exceeded";
  refusal.title = "Concurrency Limit Exceeded";
  refusal.policy = name_;
  refusal.current_in_flight = s.in_flight;
  refusal.max_concurrent = s.limit;
  refusal.retry_after = std::chrono::seconds(1);
  refusal.detail_text = "Policy " + name_ + " has reached its concurrency limit (" +
                        std::to_string(s.in_flight) + "/" + std::to_string(s.limit) + ")";
  if (fleet_)
    refusal.detail_text += "; fleet share " + std::to_string(fs.share) + " of L_global " +
                           std::to_string(fs.l_global) + " (" + std::string(to_string(fs.phase)) +
                           ")";
  return std::nullopt;
}

PolicyInfo Policy::info() const {
  PolicyInfo i;
  i.state_json = state(&i).dump();
  return i;
}

json Policy::state(PolicyInfo* info) const {
  PolicyInfo scratch;
  PolicyInfo& i = info != nullptr ? *info : scratch;
  i.name = name_;
  i.kind = std::string(kind_name());
  i.rate = spec_.rate;
  json j = {{"name", name_}, {"kind", i.kind}};
  if (!spec_.rate.empty()) j["rate"] = spec_.rate;
  const auto guard_json = [&](const AdaptiveGuardStats& s) {
    i.in_flight = s.in_flight;
    i.limit = s.limit;
    j["in_flight"] = s.in_flight;
    j["limit"] = s.limit;
    j["algorithm_limit"] = s.algorithm_limit;
    j["accepted"] = s.accepted;
    j["rejected"] = s.rejected;
    j["dropped"] = s.dropped;
    j["ignored"] = s.ignored;
  };
  switch (kind_) {
    case PolicyKind::kRate: {
      const RateRule& r = limiter_->rule();
      i.limit = r.limit;
      j["strategy"] = std::string(to_string(r.strategy));
      j["limit"] = r.limit;
      j["period_seconds"] = seconds_of(r.period);
      if (r.burst != 0) j["burst"] = r.burst;
      j["keys"] = limiter_->keys();
      j["allowed"] = allowed_.load(std::memory_order_relaxed);
      j["denied"] = denied_.load(std::memory_order_relaxed);
      break;
    }
    case PolicyKind::kAdaptive:
      j["algorithm"] = std::string(adaptive_->algorithm_name());
      guard_json(adaptive_->stats());
      break;
    case PolicyKind::kFleet: {
      const FleetGuardStats s = fleet_->stats();
      guard_json(s.local);
      j["phase"] = std::string(to_string(s.phase));
      j["share"] = s.share;
      j["l_global"] = s.l_global;
      j["nodes"] = s.nodes;
      j["generation"] = s.generation;
      j["fenced"] = s.fenced;
      j["heartbeats"] = s.heartbeats;
      j["heartbeat_errors"] = s.heartbeat_errors;
      j["coordinator"] = std::string(coordinator_->backend());
      j["key"] = fleet_->options().key;
      break;
    }
    case PolicyKind::kConcurrency: {
      json ups = json::array();
      for (const auto& u : gateway_->config().upstreams) ups.push_back(u.id);
      json ts = json::array();
      for (const auto& t : gateway_->config().tenants) ts.push_back(t.id);
      j["upstreams"] = std::move(ups);
      j["tenants"] = std::move(ts);
      break;
    }
  }
  if (kind_ != PolicyKind::kRate) {
    j["admitted"] = admitted_.load(std::memory_order_relaxed);
    j["refused_by_limit"] = limit_refused_.load(std::memory_order_relaxed);
    j["refused_by_rate"] = rate_refused_.load(std::memory_order_relaxed);
    j["released"] = released_.load(std::memory_order_relaxed);
    j["leases"] = leases_.load(std::memory_order_relaxed);
    if (kind_ == PolicyKind::kConcurrency) {
      i.in_flight = leases_.load(std::memory_order_relaxed);
      j["in_flight"] = i.in_flight;
    }
  }
  j["retired"] = retired_.load(std::memory_order_relaxed);
  return j;
}

std::vector<MetricFamily> Policy::collect() const {
  std::vector<MetricFamily> out;
  const std::string kind(kind_name());
  out.push_back(one("sluice_policy_info", "Policies in force (value 1), by kind", MetricType::Gauge,
                    1, {{"kind", kind}}));
  if (kind_ == PolicyKind::kRate) {
    out.push_back(by_label("sluice_rate_decisions_total", "Rate checks by decision", "decision",
                           {{"allowed", allowed_.load()}, {"denied", denied_.load()}}));
    out.push_back(one("sluice_rate_keys", "Keys the rate policy holds state for", MetricType::Gauge,
                      static_cast<double>(limiter_->keys())));
    out.push_back(one("sluice_rate_limit", "Hits per period", MetricType::Gauge,
                      static_cast<double>(limiter_->rule().limit)));
    return out;
  }
  out.push_back(by_label("sluice_admissions_total", "Admit calls by decision", "decision",
                         {{"admitted", admitted_.load()},
                          {"refused_by_rate", rate_refused_.load()},
                          {"refused_by_limit", limit_refused_.load()}}));
  out.push_back(one("sluice_releases_total", "Leases released by their client", MetricType::Counter,
                    static_cast<double>(released_.load())));
  out.push_back(one("sluice_policy_leases", "Leases held on the policy", MetricType::Gauge,
                    static_cast<double>(leases_.load())));
  if (kind_ == PolicyKind::kConcurrency) {
    for (MetricFamily& f : GatewayMetrics(*gateway_).Collect()) out.push_back(std::move(f));
    return out;
  }
  const FleetGuardStats fs = fleet_ ? fleet_->stats() : FleetGuardStats{};  // one snapshot
  const AdaptiveGuardStats s = fleet_ ? fs.local : adaptive_->stats();
  out.push_back(
      one("sluice_policy_in_flight", "Calls holding a permit", MetricType::Gauge, s.in_flight));
  out.push_back(
      one("sluice_policy_limit", "Concurrency ceiling in force", MetricType::Gauge, s.limit));
  out.push_back(one("sluice_policy_algorithm_limit", "The limit algorithm's own limit (L_local)",
                    MetricType::Gauge, s.algorithm_limit));
  if (fleet_) {
    const FleetGuardStats& f = fs;  // the same snapshot as `s`
    out.push_back(
        one("sluice_fleet_share", "This node's share of L_global", MetricType::Gauge, f.share));
    out.push_back(one("sluice_fleet_l_global", "The fleet's global limit (L_global)",
                      MetricType::Gauge, f.l_global));
    out.push_back(one("sluice_fleet_nodes", "Live nodes in the fleet", MetricType::Gauge, f.nodes));
    out.push_back(one("sluice_fleet_fenced", "1 while this node is fenced", MetricType::Gauge,
                      f.fenced ? 1 : 0));
    out.push_back(by_label("sluice_fleet_heartbeats_total", "Heartbeats by result", "result",
                           {{"ok", f.heartbeats}, {"error", f.heartbeat_errors}}));
    out.push_back(one("sluice_fleet_phase", "The fleet guard's phase (value 1)", MetricType::Gauge,
                      1, {{"phase", std::string(to_string(f.phase))}}));
  }
  return out;
}

std::string Policy::not_ready() const {
  if (kind_ != PolicyKind::kFleet) return {};
  const FleetGuardStats s = fleet_->stats();
  if (s.phase == FleetPhase::kActive) return {};
  return "fleet guard is " + std::string(to_string(s.phase)) + " (coordinator " +
         std::string(coordinator_->backend()) + " not reached)";
}

}  // namespace sluice::server
