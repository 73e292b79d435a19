// The concurrency kind: gateway limits (tenant, upstream, binding, per-tenant, route), each call
// naming its tenant, upstream and route.
#include "server/policies/concurrency.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/policies/admit_policy.h"
#include "sluice/gateway.h"
#include "sluice/gateway_metrics.h"
#include "sluice/gateway_validation.h"

namespace sluice::server {
namespace {

class GatewayPolicy;

// One gateway of the policy: the first, or one built by a reconfigure to take its
// predecessor's place (Gateway::create(config, previous): the two share the counters of every
// level of the same identity). It lives while it is current or something holds it: a lease's
// permit, an admit or a state read in progress, a refusal's views (`holds` counts them).
struct Generation {
  Generation(std::unique_ptr<Gateway> g, const GatewayPolicy* owner) noexcept
      : gateway(std::move(g)), policy(owner) {}
  std::unique_ptr<Gateway> gateway;
  const GatewayPolicy* policy;  // outlives it (every holder keeps the policy alive)
  // seq_cst, with the policy's `unfreed_`: of a last hold given back and a retirement, one
  // sees the other, so one of them frees the generation.
  std::atomic<std::uint64_t> holds{0};
};

// A gateway permit gives every level back (into the generation that admitted it, whose
// counters the current one shares); the outcome says nothing to a fixed limit.
struct GatewayLease {
  GatewayPermit permit;
  Generation* generation;  // held until finished
  void finish(const CallEnd& /*end*/) noexcept;
};

class GatewayPolicy final : public AdmitPolicy {
 public:
  GatewayPolicy(const BuildContext& c, std::unique_ptr<Gateway> gateway)
      : AdmitPolicy(c.name, "concurrency", c.spec.rate),
        current_(std::make_unique<Generation>(std::move(gateway), this)) {}
  // Nothing holds a generation when it is destroyed: leases and refusals keep the policy alive.

  StatusOr<AdmitDecision> admit(const AdmitCall& call, Nanos now, AdmitGate* gate) override {
    if (call.tenant.empty()) return invalid("tenant", "must not be empty for a concurrency policy");
    if (call.upstream.empty())
      return invalid("upstream", "must not be empty for a concurrency policy");
    Generation* g = hold();
    AdmitDecision out;
    const Status s = admit_on(*g, call, now, gate, out);
    if (!out.permit) let_go(g);  // a lease keeps its hold
    if (!s.ok()) return s;
    return out;
  }

  // In place: a gateway built for the new config takes the current one's place, sharing the
  // counter of every level of the same identity, so held leases stay counted against the new
  // limits (lowered: they drain, never over-admitted) and release where they were admitted.
  // A level the new config adds starts at zero. Leases of the old gateway keep it alive.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const ConcurrencySpec& spec = *c.spec.as<ConcurrencySpec>();
    Generation* was = hold();
    GatewayBuild b = Gateway::create(spec.gateway, *was->gateway);
    let_go(was);
    if (!b.gateway) return Status(StatusCode::kInvalidArgument, errors_of(b.report));
    auto next = std::make_shared<std::unique_ptr<Generation>>(
        std::make_unique<Generation>(std::move(b.gateway), this));
    return Reconfiguration([this, next]() { install(std::move(*next)); });
  }

  [[nodiscard]] static std::string errors_of(const ValidationReport& report) {
    std::string why;
    for (const auto& e : report.errors) why += (why.empty() ? "" : "; ") + e.message;
    return why;
  }

  // Gives back a hold; a retired generation no one holds any more is freed. `g` may be gone
  // once its hold is given back: nothing here reads it after that.
  void let_go(Generation* g) const noexcept {
    if (g->holds.fetch_sub(1) == 1 && unfreed_.load() != 0) prune();
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    Generation* g = hold();
    const GatewayConfig& config = g->gateway->config();
    nlohmann::json ups = nlohmann::json::array();
    for (const auto& u : config.upstreams) ups.push_back(u.id);
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& t : config.tenants) ts.push_back(t.id);
    let_go(g);
    j["upstreams"] = std::move(ups);
    j["tenants"] = std::move(ts);
    // Gateways of earlier configs that leases (or refusals) still hold.
    j["draining_gateways"] = unfreed_.load();
    describe_admissions(j);
    info.in_flight = leases();
    j["in_flight"] = info.in_flight;
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    admission_metrics(out);
    Generation* g = hold();
    for (prometheus::MetricFamily& f : GatewayMetrics(*g->gateway).Collect())
      out.push_back(std::move(f));
    let_go(g);
  }

 private:
  // Admits on `g`: `out` gets a permit (whose lease takes over the caller's hold of `g`) or a
  // refusal.
  Status admit_on(Generation& g, const AdmitCall& call, Nanos now, AdmitGate* gate,
                  AdmitDecision& out) {
    // Resolved before the gate: an unknown name is an error, and an error must cost nothing.
    Resolution r = g.gateway->resolve(call.tenant, call.upstream, call.route);
    if (!r.ok()) return Status(StatusCode::kNotFound, r.error()->message());
    auto go_on = pass(gate, call, now, out);
    if (!go_on.ok()) return go_on.status();
    if (!go_on.value()) return {};
    Admission a = g.gateway->try_acquire(r.target());
    if (a.admitted()) {
      out.permit = lease(GatewayLease{std::move(a.permit()), &g});
      return {};
    }
    count_limit_refusal();
    out.refusal = std::move(*a.rejection());
    out.refusal.policy = name();
    // The refusal's views point into this generation and this policy: its owner holds both.
    g.holds.fetch_add(1);
    auto self = std::static_pointer_cast<const GatewayPolicy>(shared_from_this());
    out.refusal_owner = std::shared_ptr<const void>(
        &g, [self = std::move(self)](Generation* held) { self->let_go(held); });
    return {};
  }

  // The current generation, held (let_go() gives it back).
  Generation* hold() const noexcept {
    const std::lock_guard lock(mu_);
    current_->holds.fetch_add(1);
    return current_.get();
  }

  // The reload commits: `next` serves from here on; the old generation is freed once nothing
  // holds it.
  void install(std::unique_ptr<Generation> next) noexcept {
    next->gateway->take_over();
    {
      const std::lock_guard lock(mu_);
      retired_.push_back(std::exchange(current_, std::move(next)));
      unfreed_.fetch_add(1);
    }
    prune();
  }

  void prune() const noexcept {
    std::vector<std::unique_ptr<Generation>> dead;  // freed outside the lock
    const std::lock_guard lock(mu_);
    // Only the current generation gains holds (under mu_): a retired one held by nothing stays
    // so.
    std::erase_if(retired_, [&](std::unique_ptr<Generation>& g) {
      if (g->holds.load() != 0) return false;
      dead.push_back(std::move(g));
      return true;
    });
    unfreed_.fetch_sub(dead.size());
  }

  mutable std::mutex mu_;
  std::unique_ptr<Generation> current_;                       // guarded by mu_
  mutable std::vector<std::unique_ptr<Generation>> retired_;  // guarded by mu_; freed unheld
  mutable std::atomic<std::size_t> unfreed_{0};               // retired_.size(), seq_cst
};

void GatewayLease::finish(const CallEnd& /*end*/) noexcept {
  permit.release();
  generation->policy->let_go(generation);
}

std::optional<ConcurrencyLimit> read_limit(ConfigSection& parent, std::string_view key) {
  std::optional<ConfigSection> s = parent.map(key);
  if (!s) return std::nullopt;
  s->keys({"sharing", "max_concurrent", "per_tenant_max", "strategy", "queue"});
  ConcurrencyLimit l;
  l.sharing = s->choice<Sharing>("sharing", {{"private", Sharing::kPrivate},
                                             {"inherit", Sharing::kInherit},
                                             {"enforce", Sharing::kEnforce}});
  l.max_concurrent = s->u32("max_concurrent");
  l.per_tenant_max = s->u32("per_tenant_max");
  if (auto v = s->choice<Strategy>("strategy",
                                   {{"reject", Strategy::kReject}, {"queue", Strategy::kQueue}}))
    l.strategy = *v;
  if (std::optional<ConfigSection> q = s->map("queue")) {
    q->keys({"max_depth", "timeout"});
    if (auto d = q->u32("max_depth")) l.queue.max_depth = *d;
    if (auto t = q->duration("timeout")) l.queue.timeout = *t;
  }
  return l;
}

void read_gateway(ConfigSection& s, GatewayConfig& g) {
  s.each("tenants", [&](ConfigSection& t) {
    t.keys({"id", "parent", "global_concurrency_limit"});
    TenantConfig c;
    if (auto v = t.str("id", true)) c.id = *v;
    c.parent = t.str("parent");
    c.global_concurrency_limit = t.u32("global_concurrency_limit");
    g.tenants.push_back(std::move(c));
  });
  s.each("upstreams", [&](ConfigSection& u) {
    u.keys({"id", "host", "owner", "concurrency_limit", "routes"});
    UpstreamConfig c;
    if (auto v = u.str("id", true)) c.id = *v;
    if (auto v = u.str("host")) c.host = *v;
    if (auto v = u.str("owner", true)) c.owner = *v;
    c.concurrency_limit = read_limit(u, "concurrency_limit");
    u.each("routes", [&](ConfigSection& rt) {
      rt.keys({"id", "max_concurrent"});
      RouteConfig route;
      if (auto v = rt.str("id", true)) route.id = *v;
      route.max_concurrent = rt.u32("max_concurrent");
      c.routes.push_back(std::move(route));
    });
    g.upstreams.push_back(std::move(c));
  });
  s.each("bindings", [&](ConfigSection& b) {
    b.keys({"tenant", "upstream", "concurrency_limit"});
    BindingConfig c;
    if (auto v = b.str("tenant", true)) c.tenant = *v;
    if (auto v = b.str("upstream", true)) c.upstream = *v;
    c.concurrency_limit = read_limit(b, "concurrency_limit");
    g.bindings.push_back(std::move(c));
  });
  if (std::optional<ConfigSection> pr = s.map("problem")) {
    pr->keys({"status", "retry_after_seconds", "type", "title"});
    if (auto v = pr->uint("status", 0, 999)) g.problem.status = static_cast<std::uint16_t>(*v);
    if (auto v = pr->u32("retry_after_seconds")) g.problem.retry_after_seconds = *v;
    if (auto v = pr->str("type")) g.problem.type = *v;
    if (auto v = pr->str("title")) g.problem.title = *v;
  }
  if (std::optional<ConfigSection> m = s.map("metrics")) {
    m->keys({"per_tenant"});
    if (auto b = m->boolean("per_tenant")) g.metrics.per_tenant = *b;
  }
  // The gateway's own validation, its issues placed at the fields they name.
  const ValidationReport report = validate(g);
  for (const ConfigIssue& i : report.errors) s.error_at(i.path, i.message);
  for (const ConfigIssue& i : report.warnings) s.warning_at(i.path, i.message);
}

std::shared_ptr<const PolicyBody> parse(const std::string& /*name*/, ConfigSection& s,
                                        PolicySpec& /*spec*/) {
  s.keys({"kind", "tenants", "upstreams", "bindings", "problem", "metrics", "rate"});
  auto body = std::make_shared<ConcurrencySpec>();
  read_gateway(s, body->gateway);
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const ConcurrencySpec& spec = *c.spec.as<ConcurrencySpec>();
  GatewayBuild b = Gateway::create(spec.gateway);
  if (!b.gateway) return Status(StatusCode::kInvalidArgument, GatewayPolicy::errors_of(b.report));
  return std::shared_ptr<Policy>(std::make_shared<GatewayPolicy>(c, std::move(b.gateway)));
}

}  // namespace

PolicyKind concurrency_kind() {
  return PolicyKind("concurrency", PolicyKind::kAdmit, parse, build);
}

}  // namespace sluice::server
