// The concurrency kind: gateway limits (tenant, upstream, binding, per-tenant, route), each call
// naming its tenant, upstream and route.
#include "server/policies/concurrency.h"

#include "server/policies/admit_policy.h"
#include "sluice/gateway.h"
#include "sluice/gateway_metrics.h"
#include "sluice/gateway_validation.h"

namespace sluice::server {
namespace {

// A gateway permit gives every level back; the outcome says nothing to a fixed limit.
struct GatewayLease {
  GatewayPermit permit;
  void finish(const CallEnd& /*end*/) noexcept { permit.release(); }
};

class GatewayPolicy final : public AdmitPolicy {
 public:
  GatewayPolicy(const BuildContext& c, std::unique_ptr<Gateway> gateway)
      : AdmitPolicy(c.name, "concurrency", c.spec.rate), gateway_(std::move(gateway)) {}

  StatusOr<AdmitDecision> admit(const AdmitCall& call, Nanos now, AdmitGate* gate) override {
    if (call.tenant.empty()) return invalid("tenant", "must not be empty for a concurrency policy");
    if (call.upstream.empty())
      return invalid("upstream", "must not be empty for a concurrency policy");
    // Resolved before the gate: an unknown name is an error, and an error must cost nothing.
    Resolution r = gateway_->resolve(call.tenant, call.upstream, call.route);
    if (!r.ok()) return Status(StatusCode::kNotFound, r.error()->message());
    AdmitDecision out;
    auto go_on = pass(gate, call, now, out);
    if (!go_on.ok()) return go_on.status();
    if (!go_on.value()) return out;
    Admission a = gateway_->try_acquire(r.target());
    if (a.admitted()) {
      out.permit = lease(GatewayLease{std::move(a.permit())});
      return out;
    }
    count_limit_refusal();
    out.refusal = std::move(*a.rejection());
    out.refusal.policy = name();
    out.refusal_owner = shared_from_this();
    return out;
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    nlohmann::json ups = nlohmann::json::array();
    for (const auto& u : gateway_->config().upstreams) ups.push_back(u.id);
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& t : gateway_->config().tenants) ts.push_back(t.id);
    j["upstreams"] = std::move(ups);
    j["tenants"] = std::move(ts);
    describe_admissions(j);
    info.in_flight = leases();
    j["in_flight"] = info.in_flight;
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    admission_metrics(out);
    for (prometheus::MetricFamily& f : GatewayMetrics(*gateway_).Collect())
      out.push_back(std::move(f));
  }

 private:
  std::unique_ptr<Gateway> gateway_;
};

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
  if (!b.gateway) {
    std::string why;
    for (const auto& e : b.report.errors) why += (why.empty() ? "" : "; ") + e.message;
    return Status(StatusCode::kInvalidArgument, why);
  }
  return std::shared_ptr<Policy>(std::make_shared<GatewayPolicy>(c, std::move(b.gateway)));
}

}  // namespace

PolicyKind concurrency_kind() {
  return PolicyKind("concurrency", PolicyKind::kAdmit, parse, build);
}

}  // namespace sluice::server
