// The adaptive kind: an AdaptiveGuard (a concurrency limit inferred from latency, or fixed).
#include "server/policies/adaptive.h"

#include "server/policies/admit_policy.h"

namespace sluice::server {
namespace {

class AdaptiveLimitPolicy final : public AdmitPolicy {
 public:
  AdaptiveLimitPolicy(const BuildContext& c, const AlgorithmSpec& algorithm)
      : AdmitPolicy(c.name, "adaptive", c.spec.rate), guard_(make_algorithm(algorithm), c.clock) {}

  StatusOr<AdmitDecision> admit(const AdmitCall& call, Nanos now, AdmitGate* gate) override {
    AdmitDecision out;
    auto go_on = pass(gate, call, now, out);
    if (!go_on.ok()) return go_on.status();
    if (!go_on.value()) return out;
    if (std::optional<GuardPermit> p = guard_.acquire()) {
      out.permit = lease(GuardLease{std::move(*p)});
    } else {
      count_limit_refusal();
      out.refusal = guard_refusal(name(), guard_.stats());
      out.refusal_owner = shared_from_this();
    }
    return out;
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    j["algorithm"] = std::string(guard_.algorithm_name());
    describe_guard(guard_.stats(), j, info);
    describe_admissions(j);
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    admission_metrics(out);
    guard_metrics(guard_.stats(), out);
  }

 private:
  AdaptiveGuard guard_;
};

std::shared_ptr<const PolicyBody> parse(const std::string& /*name*/, ConfigSection& s,
                                        PolicySpec& /*spec*/) {
  s.keys({"kind", "algorithm", "limit", "initial_limit", "min_limit", "max_limit", "rate"});
  auto body = std::make_shared<AdaptiveSpec>();
  read_algorithm(s, body->algorithm);
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const AdaptiveSpec& spec = *c.spec.as<AdaptiveSpec>();
  return std::shared_ptr<Policy>(std::make_shared<AdaptiveLimitPolicy>(c, spec.algorithm));
}

}  // namespace

PolicyKind adaptive_kind() { return PolicyKind("adaptive", PolicyKind::kAdmit, parse, build); }

}  // namespace sluice::server
