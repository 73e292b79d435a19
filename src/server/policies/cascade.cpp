// The cascade kind: a FallbackCascade (sluice/local/fallback_cascade.h) over named nodes, each with
// its own adaptive guard; Admit chooses the healthiest node that has room and names it.
//
//   kind: cascade
//   nodes:                          # required: each node's name and its guard
//     db-1: {algorithm: fixed, limit: 20}
//     db-2: {}                      # the adaptive kind's fields; gradient2 by default
//   buckets: 6                      # stat buckets per node (1..16)
//   bucket_width: 5s
//   decay: 3                        # how much more each newer bucket weighs
//   exponent: 3                     # weight = success rate ^ exponent
//   order: exact | approximate      # the weighted permutation, or the source's approximation
//   revive_every: 5s                # a node at the weight floor gets one call this often (0s:
//                                   #     never)
//   revive_share: 0.02              # revival calls: at most this share of the last second's
//                                   #     calls, plus one a second
//   breaker:                        # optional: a circuit breaker per node
//     failures: 5                   # failures in a row that open it
//     open_for: 5s                  # its first open spell, doubled per failed probe ...
//     max_open_for: 30s             # ... up to this (the stat window: a healed node is
//                                   #     probed within it)
//     probes: 1                     # calls let through at once while half-open
//     successes: 1                  # probe successes that close it
//     panic_below: 0.5              # fewer closed than this share of the nodes: breakers stop
//                                   #     no call (0: never)
//   rate: <rate policy>             # optional: passed first
//
// Admit: the call's `exclude` attribute names nodes not to choose (a caller's budgeted retry). A
// refusal (every node at its limit or open) is a 503 naming how many nodes were tried, open and
// excluded. Release: success; dropped, timeout or overload (all three a drop to the node's limit
// and a failure to its health); failed (a failure, no latency evidence); ignored (counted
// nowhere). A lease that expires or is ended by shutdown counts as ignored: its client never
// said how the call went.
//
// Reload: always in place. A node kept by name keeps its guard (its algorithm replaced if its
// fields changed, as the adaptive kind does), its health and its breaker; a new node starts
// clean; a removed node stops being chosen, its leases finish into it and it stays counted
// (shown with "removed": true) while they run and for its stat window after: added back
// meanwhile, it is the same node (its limit counts the calls still holding it). A change of any
// other field builds a new cascade on the same nodes and guards (health and breakers carried
// when the buckets and breaker settings are unchanged). A policy removed by a reload while its
// calls run and added back by a later one goes on with its nodes the same way.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/policies/admit_policy.h"
#include "server/registry.h"
#include "sluice/config/config_section.h"
#include "sluice/core/algorithm_spec.h"
#include "sluice/local/fallback_cascade.h"

namespace sluice::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

struct NodeSpec {
  std::string name;
  AlgorithmSpec algorithm;
};

struct CascadeSpec final : PolicyBody {
  std::vector<NodeSpec> nodes;
  FallbackCascadeOptions options;
};

std::string_view basis_name(CascadeHealth::Basis b) {
  switch (b) {
    case CascadeHealth::Basis::kRecent:
      return "recent";
    case CascadeHealth::Basis::kSticky:
      return "sticky";
    case CascadeHealth::Basis::kCleanSlate:
      return "clean_slate";
  }
  return "?";
}

// A lease's permit: the cascade's lease, finished with the call's end.
struct CascadePermit {
  CascadeLease lease;
  void finish(const CallEnd& end) noexcept {
    CascadeOutcome o = CascadeOutcome::kIgnored;
    if (end.by == CallEnd::By::kClient) switch (end.result) {
        case CallResult::kSuccess:
          o = CascadeOutcome::kSuccess;
          break;
        case CallResult::kDropped:
        case CallResult::kTimeout:
          o = CascadeOutcome::kTimeout;  // a drop that says no more: as a timeout
          break;
        case CallResult::kOverload:
          o = CascadeOutcome::kOverload;
          break;
        case CallResult::kFailed:
          o = CascadeOutcome::kFailed;
          break;
        case CallResult::kIgnored:
          break;
      }
    lease.finish(o, end.rtt);
  }
};

class CascadePolicy final : public AdmitPolicy {
 public:
  CascadePolicy(const BuildContext& c, const CascadeSpec& spec)
      : AdmitPolicy(c.name, "cascade", c.spec.rate), clock_(c.clock) {
    // After a predecessor (BuildContext::predecessor: this policy was removed by a reload while
    // calls held its nodes, and is added back): its nodes, guards and health go on.
    auto* was = dynamic_cast<const CascadePolicy*>(c.predecessor.get());
    const std::shared_ptr<FallbackCascade> previous = was != nullptr ? was->cascade() : nullptr;
    if (was != nullptr) known_ = was->known_;
    Plan plan = plan_nodes(spec.nodes, previous.get());
    for (auto& [guard, algorithm] : plan.replaced) guard->replace_algorithm(std::move(algorithm));
    install(std::make_shared<FallbackCascade>(std::move(plan.specs), c.clock, spec.options,
                                              UniformDraw{}, previous.get()));
    for (const NodeSpec& n : spec.nodes) known_[n.name] = n.algorithm;
    spec_ = spec;
    if (was != nullptr) count_leases_of(*was);
  }

  StatusOr<std::unique_ptr<ResolvedAdmit>> resolve(const AdmitCall& call, Nanos /*now*/) override {
    // Its attribute: `exclude`, the nodes not to choose (those a caller's retry already tried).
    if (const std::size_t n = call.count("exclude"); n > kMaxBatch)
      return invalid("exclude",
                     "at most " + std::to_string(kMaxBatch) + " nodes, not " + std::to_string(n));
    std::vector<std::string> exclude;
    for (const std::string_view node : call.all("exclude")) {
      if (Status s = check_field("exclude", node, kMaxNameBytes, true); !s.ok()) return s;
      exclude.emplace_back(node);
    }
    return resolved(
        [this, exclude = std::move(exclude)](Nanos /*now*/, Deferral<AdmitDecision>& /*later*/) {
          return Decided<AdmitDecision>(take(exclude));
        });
  }

  AdmitDecision take(std::span<const std::string> exclude) {
    AdmitDecision out;
    const std::shared_ptr<FallbackCascade> cascade = this->cascade();
    CascadeResult<CascadeLease> lease = cascade->acquire(exclude);
    if (lease.ok()) {
      out.chosen = lease.value().node();
      out.permit = this->lease(CascadePermit{std::move(lease.value())});
      return out;
    }
    count_limit_refusal();
    Rejection r;
    r.source = "concurrency";
    r.limit_type = "nodes";
    r.status = 503;
    r.type = "urn:sluice:problem:cascade-exhausted";
    r.title = "No Node Has Room";
    r.policy = name();
    const FallbackCascade::Load load = cascade->load();
    r.current_in_flight = load.in_flight;
    r.max_concurrent = load.limit;
    r.retry_after = std::chrono::seconds(1);
    r.detail_text = "Policy " + name() + ": " + lease.refusal().message();
    out.refusal = std::move(r);
    out.refusal_owner = shared_from_this();
    return out;
  }

  // In place, always. A node kept by name (or added back while it is parked: removed by an
  // earlier reload, its calls still running or its stat window not over) keeps its guard (its
  // algorithm replaced if its fields changed, as the adaptive kind does), its health and its
  // breaker; a new node starts clean; a removed node is parked. A change of the cascade's
  // other fields builds a new cascade on the same nodes (their guards, and so every call in
  // flight, always; their health and breakers when the buckets and breakers are of the same
  // make), swapped in when the reload commits.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const CascadeSpec& next = *c.spec.as<CascadeSpec>();
    const std::shared_ptr<FallbackCascade> current = cascade();
    // Prepared now, so that applying cannot fail.
    Plan plan = plan_nodes(next.nodes, nullptr);
    std::shared_ptr<FallbackCascade> rebuilt;
    if (next.options != spec_.options)
      rebuilt = std::make_shared<FallbackCascade>(plan.specs, clock_, next.options, UniformDraw{},
                                                  current.get());
    return Reconfiguration(
        [this, next, plan = std::move(plan), rebuilt = std::move(rebuilt)]() mutable {
          for (auto& [guard, algorithm] : plan.replaced)
            guard->replace_algorithm(std::move(algorithm));
          if (rebuilt != nullptr)
            install(std::move(rebuilt));
          else
            cascade()->set_nodes(std::move(plan.specs));
          for (const NodeSpec& n : next.nodes) known_[n.name] = n.algorithm;
          spec_ = next;
        });
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    nlohmann::json nodes = nlohmann::json::array();
    for (const CascadeNodeState& n : cascade()->state()) {
      nlohmann::json buckets = nlohmann::json::array();
      for (const CascadeBucket& b : n.buckets.window())
        buckets.push_back({{"finished", b.finished}, {"succeeded", b.succeeded}});
      nlohmann::json node = {
          {"name", n.name},
          {"success_rate", n.health.success_rate},
          {"weight", n.health.weight},
          {"basis", basis_name(n.health.basis)},
          {"buckets", std::move(buckets)},
          {"sticky",
           {{"finished", n.buckets.sticky.finished}, {"succeeded", n.buckets.sticky.succeeded}}},
          {"in_flight", n.in_flight},
          {"limit", n.limit},
      };
      if (n.removed) node["removed"] = true;
      if (n.breaker) {
        node["breaker"] = {
            {"state", to_string(n.breaker->state)},
            {"failures_in_a_row", n.breaker->failures_in_a_row},
            {"reopens_in_ms",
             std::chrono::duration<double, std::milli>(n.breaker->reopens_in).count()},
            {"opened", n.breaker->opened}};
      }
      info.in_flight += n.in_flight;  // every call held, on a removed node too
      if (!n.removed) info.limit += n.limit;
      nodes.push_back(std::move(node));
    }
    j["in_flight"] = info.in_flight;
    j["limit"] = info.limit;
    j["order"] = cascade()->options().approximate_order ? "approximate" : "exact";
    j["nodes"] = std::move(nodes);
    describe_admissions(j);
  }

  void metrics(std::vector<MetricFamily>& out) const override {
    admission_metrics(out);
    MetricFamily rate{"sluice_cascade_node_success_rate",
                      "A cascade node's success rate (the weighted ratio over its buckets)",
                      MetricType::Gauge,
                      {}};
    MetricFamily weight{"sluice_cascade_node_weight",
                        "A cascade node's weight in the order (success rate ^ exponent, floored)",
                        MetricType::Gauge,
                        {}};
    MetricFamily calls{"sluice_cascade_node_calls",
                       "Calls a cascade node finished in its window, by result",
                       MetricType::Gauge,
                       {}};
    MetricFamily in_flight{
        "sluice_cascade_node_in_flight", "Calls holding a permit of a node", MetricType::Gauge, {}};
    MetricFamily limit{
        "sluice_cascade_node_limit", "A cascade node's concurrency limit", MetricType::Gauge, {}};
    MetricFamily breaker{"sluice_cascade_node_breaker_state",
                         "1 for a cascade node's circuit breaker state (with breakers only)",
                         MetricType::Gauge,
                         {}};
    std::uint64_t total_in_flight = 0, total_limit = 0;
    const auto gauge = [](MetricFamily& f, std::vector<ClientMetric::Label> labels, double v) {
      ClientMetric m;
      m.label = std::move(labels);
      m.gauge.value = v;
      f.metric.push_back(std::move(m));
    };
    for (const CascadeNodeState& n : cascade()->state()) {
      gauge(rate, {{"node", n.name}}, n.health.success_rate);
      gauge(weight, {{"node", n.name}}, n.health.weight);
      std::uint64_t finished = 0, succeeded = 0;
      for (const CascadeBucket& b : n.buckets.window()) {
        finished += b.finished;
        succeeded += b.succeeded;
      }
      gauge(calls, {{"node", n.name}, {"result", "success"}}, static_cast<double>(succeeded));
      gauge(calls, {{"node", n.name}, {"result", "failure"}},
            static_cast<double>(finished - succeeded));
      gauge(in_flight, {{"node", n.name}}, n.in_flight);
      gauge(limit, {{"node", n.name}}, n.limit);
      if (n.breaker)
        for (BreakerState s : {BreakerState::kClosed, BreakerState::kOpen, BreakerState::kHalfOpen})
          gauge(breaker, {{"node", n.name}, {"state", std::string(to_string(s))}},
                n.breaker->state == s ? 1 : 0);
      total_in_flight += n.in_flight;
      if (!n.removed) total_limit += n.limit;
    }
    out.push_back(one("sluice_policy_in_flight", "Calls holding a permit", MetricType::Gauge,
                      static_cast<double>(total_in_flight)));
    out.push_back(one("sluice_policy_limit", "Concurrency ceiling in force", MetricType::Gauge,
                      static_cast<double>(total_limit)));
    for (MetricFamily* f : {&rate, &weight, &calls, &in_flight, &limit, &breaker})
      if (!f->metric.empty()) out.push_back(std::move(*f));
  }

 private:
  // The nodes a spec names, with their guards, and the algorithm changes to apply to guards
  // that carry on.
  struct Plan {
    std::vector<CascadeNodeSpec> specs;
    std::vector<std::pair<std::shared_ptr<AdaptiveGuard>, std::unique_ptr<LimitAlgorithm>>>
        replaced;
  };
  // A node's guard: the one its name has in this policy's cascade (current or parked), or else
  // in `previous`'s, with its algorithm to replace when the node's fields changed (the limit it
  // learned carried over when the algorithm is the same and not fixed); a new one otherwise.
  [[nodiscard]] Plan plan_nodes(const std::vector<NodeSpec>& nodes,
                                const FallbackCascade* previous) const {
    Plan plan;
    const std::shared_ptr<FallbackCascade> here = cascade();
    for (const NodeSpec& n : nodes) {
      std::shared_ptr<AdaptiveGuard> g = here != nullptr ? here->guard_of(n.name) : nullptr;
      if (g == nullptr && previous != nullptr) g = previous->guard_of(n.name);
      if (g == nullptr) {
        plan.specs.push_back(
            {n.name, std::make_shared<AdaptiveGuard>(make_algorithm(n.algorithm), clock_)});
        continue;
      }
      const auto old = known_.find(n.name);
      if (old == known_.end() || old->second != n.algorithm) {
        const bool keep = old != known_.end() && n.algorithm.kind == old->second.kind &&
                          n.algorithm.kind != AlgorithmSpec::Kind::kFixed;
        plan.replaced.emplace_back(g, keep ? make_algorithm(n.algorithm, g->algorithm_limit())
                                           : make_algorithm(n.algorithm));
      }
      plan.specs.push_back({n.name, std::move(g)});
    }
    return plan;
  }
  [[nodiscard]] std::shared_ptr<FallbackCascade> cascade() const {
    const std::lock_guard lock(cascade_mu_);
    return cascade_;
  }
  void install(std::shared_ptr<FallbackCascade> c) {
    const std::lock_guard lock(cascade_mu_);
    cascade_.swap(c);
  }  // the one replaced is released outside the lock

  const Clock& clock_;
  // The spec in force and the last algorithm of every node named so far: read and written only
  // by the constructor, reconfigure() and the change it returns (one reload at a time).
  CascadeSpec spec_;
  std::map<std::string, AlgorithmSpec> known_;
  // Swapped by a reload's commit. A mutex held for the pointer's copy alone, not an atomic
  // shared_ptr (libstdc++ 12's is a lock in the pointer's low bit, which ThreadSanitizer
  // cannot see).
  mutable std::mutex cascade_mu_;
  std::shared_ptr<FallbackCascade> cascade_;
};

// "decay: must be ..." placed at `prefix` + its field.
void place(ConfigSection& s, const std::string& prefix, std::string_view why) {
  const std::size_t colon = why.find(": ");
  if (colon == std::string_view::npos) return s.error(std::string(why));
  s.error_at(prefix + std::string(why.substr(0, colon)), std::string(why.substr(colon + 2)));
}

std::shared_ptr<const PolicyBody> parse(const std::string& /*name*/, ConfigSection& s,
                                        PolicySpec& /*spec*/) {
  s.keys({"kind", "nodes", "buckets", "bucket_width", "decay", "exponent", "order", "breaker",
          "revive_every", "revive_share", "rate", "shadow"});
  auto body = std::make_shared<CascadeSpec>();
  FallbackCascadeOptions& o = body->options;
  if (auto b = s.uint("buckets", 1, CascadeNodeStats::kMaxBuckets)) o.stats.buckets = *b;
  if (auto w = s.duration("bucket_width")) o.stats.width = *w;
  if (auto d = s.number("decay")) o.health.decay = *d;
  if (auto e = s.number("exponent")) o.health.exponent = *e;
  if (auto a = s.choice<bool>("order", {{"exact", false}, {"approximate", true}}))
    o.approximate_order = *a;
  if (auto r = s.duration_or_zero("revive_every")) o.revive_every = *r;
  if (auto r = s.number("revive_share")) {
    if (*r < 0 || *r > 1)
      s.error("revive_share", "must be 0..1 (revival calls per call)");
    else
      o.revive_share = *r;
  }
  if (std::string_view why = cascade_health_error(o.health); !why.empty()) place(s, "", why);
  if (auto b = s.map("breaker")) {
    b->keys({"failures", "open_for", "max_open_for", "probes", "successes", "panic_below"});
    CircuitBreakerOptions br;
    if (auto v = b->u32("failures", 1)) br.failures = *v;
    if (auto v = b->duration("open_for")) br.open_for = *v;
    br.max_open_for = std::max(br.max_open_for, br.open_for);
    if (auto v = b->duration("max_open_for")) br.max_open_for = *v;
    if (auto v = b->u32("probes", 1)) br.probes = *v;
    if (auto v = b->u32("successes", 1)) br.successes = *v;
    if (auto v = b->number("panic_below")) {
      if (*v < 0 || *v > 1)
        b->error("panic_below", "must be 0..1");
      else
        o.panic_below = *v;
    }
    if (std::string_view why = circuit_breaker_error(br); !why.empty()) place(*b, "", why);
    o.breaker = br;
  }
  if (!s.has("nodes")) {
    s.error("nodes", "is required: the cascade's nodes, each with its guard");
    return body;
  }
  s.named("nodes", [&](const std::string& name, ConfigSection& n) {
    n.keys({"algorithm", "limit", "initial_limit", "min_limit", "max_limit"});
    if (name.empty())
      n.error(
          "a node's name must not be empty (Admit names the node it chose, exclude names "
          "nodes not to choose)");
    if (name.size() > kMaxNameBytes)
      n.error("a node's name must be at most " + std::to_string(kMaxNameBytes) + " bytes");
    NodeSpec node{name, {}};
    read_algorithm(n, node.algorithm);
    body->nodes.push_back(std::move(node));
  });
  if (body->nodes.empty()) s.error("nodes", "must name at least one node");
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  return std::shared_ptr<Policy>(std::make_shared<CascadePolicy>(c, *c.spec.as<CascadeSpec>()));
}

}  // namespace

PolicyKind cascade_kind() { return PolicyKind("cascade", PolicyKind::kAdmit, parse, build); }

}  // namespace sluice::server
