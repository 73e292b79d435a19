// The fleet kind: a FleetGuard (one global concurrency ceiling shared by every server through a
// coordinator), beaten by its own runner thread.
#include "server/policies/fleet.h"

#include "server/policies/admit_policy.h"

namespace sluice::server {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// A fleet permit as a lease holds it: a call that ends past its deadline is released dropped.
struct FleetLease {
  FleetPermit permit;
  void finish(const CallEnd& end) noexcept { permit.release(to_outcome(end.result), end.rtt); }
};

class FleetLimitPolicy final : public AdmitPolicy {
 public:
  FleetLimitPolicy(const BuildContext& c, std::shared_ptr<ConcurrencyCoordinator> coordinator)
      : AdmitPolicy(c.name, "fleet", c.spec.rate), coordinator_(std::move(coordinator)) {}
  ~FleetLimitPolicy() override { retire(); }

  // Builds the guard and starts its runner.
  Status start(const FleetSpec& spec, const BuildContext& c) {
    algorithm_ = spec.algorithm;
    FleetGuardOptions o = spec.guard;
    o.node_id = c.node_id;
    auto g = FleetGuard::create(*coordinator_, make_algorithm(spec.algorithm), c.clock, o);
    if (!g.ok()) return g.status();
    guard_ = std::move(g.value());
    key_ = o.key;
    call_deadline_ = o.call_deadline_in_force();
    outage_.store(o.outage, std::memory_order_relaxed);
    runner_ = std::make_unique<FleetGuardRunner>(*guard_, c.clock);
    return {};
  }

  // In place when the fleet stays the same (the same coordinator object, key and algorithm,
  // and the same call deadline in force): the guard keeps its membership, share and in-flight
  // permits instead of leaving (which would hand its share to the others while its calls run)
  // and joining again. Anything else is rebuilt.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const FleetSpec& spec = *c.spec.as<FleetSpec>();
    auto coordinator = c.coordinator<ConcurrencyCoordinator>(spec.coordinator,
                                                             "the fleet's concurrency interface");
    if (!coordinator.ok() || coordinator.value() != coordinator_) return Reconfiguration{};
    if (!same(spec.algorithm, algorithm_)) return Reconfiguration{};
    FleetGuardOptions o = spec.guard;
    o.node_id = guard_->options().node_id;  // its membership goes on under its own id
    if (o.key != guard_->options().key ||
        o.call_deadline_in_force() != guard_->options().call_deadline_in_force() ||
        !o.validate().empty())
      return Reconfiguration{};
    const Clock* clock = &c.clock;
    return Reconfiguration([this, o = std::move(o), clock]() mutable {
      outage_.store(o.outage, std::memory_order_relaxed);
      runner_.reset();  // nothing ticks the guard while it changes
      const bool taken = guard_->reconfigure(std::move(o));
      (void)taken;  // checked above: the same node, key and deadline, valid options
      runner_ = std::make_unique<FleetGuardRunner>(*guard_, *clock);
    });
  }

  // It reads no attribute: nothing to resolve.
  StatusOr<std::unique_ptr<ResolvedAdmit>> resolve(const AdmitCall& /*call*/,
                                                   Nanos /*now*/) override {
    return resolved([this](Nanos now, Deferral<AdmitDecision>& /*later*/) {
      return Decided<AdmitDecision>(take(now));
    });
  }

  AdmitDecision take(Nanos now) {
    AdmitDecision out;
    if (std::optional<FleetPermit> p = guard_->acquire(now)) {
      out.call_deadline = p->deadline();
      out.permit = lease(FleetLease{std::move(*p)});
      return out;
    }
    count_limit_refusal();
    // One snapshot: the guard's local stats and its share must come from the same moment.
    const FleetGuardStats fs = guard_->stats();
    out.refusal = guard_refusal(
        name(), fs.local,
        "; fleet share " + std::to_string(fs.share) + " of L_global " +
            std::to_string(fs.l_global) + " (" + std::string(to_string(fs.phase)) +
            (fs.recovering ? "; the coordinator lost its state and grants nothing for a "
                             "lease_ttl while the fleet reports what it holds"
                           : "") +
            ")");
    out.refusal_owner = shared_from_this();
    return out;
  }

  // Active: serving. Starting or in an outage: a local-only guard serves as configured (on
  // its own limit, degraded); a fail-closed one refuses every call. Refused its node id,
  // fenced or closed: not serving.
  [[nodiscard]] PolicyReadiness readiness() const override {
    const FleetGuardStats s = guard_->stats();
    if (s.phase == FleetPhase::kActive) return {};
    const std::string error = guard_->last_error();
    if (s.phase == FleetPhase::kDuplicateId)
      return {false, "fleet guard is refused by coordinator " +
                         std::string(coordinator_->backend()) + ", admitting nothing: " + error +
                         " (server.node_id: each server needs its own)"};
    const std::string phase = s.phase == FleetPhase::kOutage ? std::string("in an outage")
                                                             : std::string(to_string(s.phase));
    const std::string why = "fleet guard is " + phase + " (coordinator " +
                            std::string(coordinator_->backend()) + " not reached" +
                            (error.empty() ? "" : ": " + error) + ")";
    const bool waiting = s.phase == FleetPhase::kStarting || s.phase == FleetPhase::kOutage;
    if (waiting && outage_.load(std::memory_order_relaxed) == OutageMode::kLocalOnly)
      return {true, why + "; admitting local-only, up to this node's own limit"};
    return {false, why};
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    const FleetGuardStats s = guard_->stats();
    describe_guard(s.local, j, info);
    j["phase"] = std::string(to_string(s.phase));
    j["share"] = s.share;
    j["l_global"] = s.l_global;
    j["l_aggregate"] = s.l_aggregate;
    j["nodes"] = s.nodes;
    j["generation"] = s.generation;
    j["fenced"] = s.fenced;
    j["heartbeats"] = s.heartbeats;
    j["heartbeat_errors"] = s.heartbeat_errors;
    j["call_deadline_ms"] = std::chrono::duration<double, std::milli>(call_deadline_).count();
    j["overdue"] = s.overdue;
    j["late_releases"] = s.late_releases;
    j["stale_refusals"] = s.stale_refusals;
    j["recovering"] = s.recovering;
    j["recovering_grants"] = s.recovering_grants;
    j["coordinator"] = std::string(coordinator_->backend());
    j["key"] = key_;
    describe_admissions(j);
  }
  void metrics(std::vector<MetricFamily>& out) const override {
    admission_metrics(out);
    const FleetGuardStats f = guard_->stats();  // one snapshot
    guard_metrics(f.local, out);
    out.push_back(
        one("sluice_fleet_share", "This node's share of L_global", MetricType::Gauge, f.share));
    out.push_back(one("sluice_fleet_l_global", "The fleet's global limit (L_global)",
                      MetricType::Gauge, f.l_global));
    out.push_back(one("sluice_fleet_l_aggregate",
                      "The aggregate of the nodes' estimates L_global is moving to (below "
                      "L_global while admitted calls drain)",
                      MetricType::Gauge, f.l_aggregate));
    out.push_back(one("sluice_fleet_nodes", "Live nodes in the fleet", MetricType::Gauge, f.nodes));
    out.push_back(one("sluice_fleet_fenced", "1 while this node is fenced", MetricType::Gauge,
                      f.fenced ? 1 : 0));
    out.push_back(one("sluice_fleet_recovering",
                      "1 while the coordinator grants nothing after finding a loss of its state",
                      MetricType::Gauge, f.recovering ? 1 : 0));
    out.push_back(one("sluice_fleet_recovering_grants_total",
                      "Grants of share 0 given while the coordinator recovered from a loss of "
                      "its state",
                      MetricType::Counter, static_cast<double>(f.recovering_grants)));
    out.push_back(by_label("sluice_fleet_heartbeats_total", "Heartbeats by result", "result",
                           {{"ok", f.heartbeats}, {"error", f.heartbeat_errors}}));
    out.push_back(one("sluice_fleet_overdue_calls",
                      "Calls held past their call deadline (not reported as in flight)",
                      MetricType::Gauge, f.overdue));
    out.push_back(one("sluice_fleet_late_releases_total",
                      "Calls released past their call deadline (recorded as dropped)",
                      MetricType::Counter, static_cast<double>(f.late_releases)));
    out.push_back(one("sluice_fleet_phase", "The fleet guard's phase (value 1)", MetricType::Gauge,
                      1, {{"phase", std::string(to_string(f.phase))}}));
  }
  void on_retire() noexcept override {
    runner_.reset();
    if (guard_) guard_->close();
  }

 private:
  static bool same(const AlgorithmSpec& a, const AlgorithmSpec& b) {
    return a.kind == b.kind && a.limit == b.limit && a.initial_limit == b.initial_limit &&
           a.min_limit == b.min_limit && a.max_limit == b.max_limit;
  }

  std::shared_ptr<ConcurrencyCoordinator> coordinator_;  // declared before its users
  AlgorithmSpec algorithm_;                              // the guard's algorithm was made from it
  // What other threads read of the guard's options (which a reconfiguration replaces): the key
  // and the call deadline never change in place; the outage mode may.
  std::string key_;
  Nanos call_deadline_{0};
  std::atomic<OutageMode> outage_{OutageMode::kFailClosed};
  std::unique_ptr<FleetGuard> guard_;
  std::unique_ptr<FleetGuardRunner> runner_;
};

std::shared_ptr<const PolicyBody> parse(const std::string& name, ConfigSection& s,
                                        PolicySpec& spec) {
  s.keys({"kind", "algorithm", "limit", "initial_limit", "min_limit", "max_limit", "coordinator",
          "key", "heartbeat", "lease_ttl", "outage", "self_fence", "fence_safety_margin",
          "eager_handoff", "min_heartbeat", "call_timeout", "call_deadline", "rate", "shadow"});
  auto body = std::make_shared<FleetSpec>();
  read_algorithm(s, body->algorithm);
  if (auto v = s.str("coordinator")) body->coordinator = *v;
  FleetGuardOptions& g = body->guard;
  g.key = name;
  if (auto v = s.str("key")) g.key = *v;
  // A member of the fleet at its key, under the server's node id: one policy per key and
  // coordinator (the loader refuses a second).
  spec.use({.field = "coordinator",
            .coordinator = body->coordinator,
            .role = CoordinatorRole::kConcurrency,
            .member_key = g.key,
            .member_key_field = "key"});
  if (auto d = s.duration("heartbeat")) g.heartbeat = *d;
  g.lease_ttl = s.duration("lease_ttl");
  if (auto o = s.choice<OutageMode>("outage", {{"fail-closed", OutageMode::kFailClosed},
                                               {"local-only", OutageMode::kLocalOnly}}))
    g.outage = *o;
  if (auto b = s.boolean("self_fence")) g.self_fence = *b;
  g.fence_safety_margin = s.duration_or_zero("fence_safety_margin");
  if (auto b = s.boolean("eager_handoff")) g.eager_handoff = *b;
  g.min_heartbeat = s.duration("min_heartbeat");
  g.call_timeout = s.duration("call_timeout");
  g.call_deadline = s.duration("call_deadline");
  // The guard's own rules between fields (lease > heartbeat, ...), node_id aside.
  FleetGuardOptions probe = g;
  probe.node_id = "check";
  // Its message starts with the field it names ("lease_ttl must be > heartbeat"): the error is
  // placed there, its path first, as every other config error.
  if (std::string why = probe.validate(); !why.empty()) {
    const std::string field = why.substr(0, why.find_first_of(" :"));
    if (field == "local" || field.empty() || why.size() <= field.size() + 1)
      s.error(why);
    else if (why[field.size() + 1] == '(')  // a sum of fields: the whole of it reads best
      s.error(field, why);
    else
      s.error(field, why.substr(field.size() + 1));
  }
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const FleetSpec& spec = *c.spec.as<FleetSpec>();
  auto coordinator =
      c.coordinator<ConcurrencyCoordinator>(spec.coordinator, "the fleet's concurrency interface");
  if (!coordinator.ok()) return coordinator.status();
  auto p = std::make_shared<FleetLimitPolicy>(c, std::move(coordinator.value()));
  if (Status s = p->start(spec, c); !s.ok()) return s;
  return std::shared_ptr<Policy>(std::move(p));
}

}  // namespace

PolicyKind fleet_kind() { return PolicyKind("fleet", PolicyKind::kAdmit, parse, build); }

}  // namespace sluice::server
