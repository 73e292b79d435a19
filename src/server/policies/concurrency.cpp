// The concurrency kind: gateway limits (tenant, upstream, binding, per-tenant, route), each call
// naming its tenant, upstream and route.
#include "server/policies/admit_policy.h"
#include "server/registry.h"
#include "sluice/gateway.h"
#include "sluice/gateway_metrics.h"

namespace sluice::server {
namespace {

// A gateway permit gives every level back; the outcome says nothing to a fixed limit.
struct GatewayLease {
  GatewayPermit permit;
  void finish(const CallEnd& /*end*/) noexcept { permit.release(); }
};

Status invalid(const char* field, const char* why) {
  return Status(StatusCode::kInvalidArgument, std::string(field) + ": " + why);
}

class GatewayPolicy final : public AdmitPolicy {
 public:
  GatewayPolicy(const BuildContext& c, std::unique_ptr<Gateway> gateway)
      : AdmitPolicy(c.name, "concurrency", c.identity, c.spec.rate), gateway_(std::move(gateway)) {}

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

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const auto& spec = std::get<ConcurrencyPolicy>(c.spec.body);
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
  return PolicyKind{
      .name = "concurrency", .rate_family = false, .admit_family = true, .build = build};
}

}  // namespace sluice::server
