// The adaptive kind: an AdaptiveGuard (a concurrency limit inferred from latency, or fixed).
#include "server/policies/admit_policy.h"
#include "server/registry.h"
#include "sluice/algorithm_spec.h"

namespace sluice::server {
namespace {

class AdaptiveLimitPolicy final : public AdmitPolicy {
 public:
  AdaptiveLimitPolicy(const BuildContext& c, const AlgorithmSpec& algorithm)
      : AdmitPolicy(c.name, "adaptive", c.identity, c.spec.rate),
        guard_(make_algorithm(algorithm), c.clock) {}

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

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const auto& spec = std::get<AdaptivePolicy>(c.spec.body);
  return std::shared_ptr<Policy>(std::make_shared<AdaptiveLimitPolicy>(c, spec.algorithm));
}

}  // namespace

PolicyKind adaptive_kind() {
  return PolicyKind{.name = "adaptive", .rate_family = false, .admit_family = true, .build = build};
}

}  // namespace sluice::server
