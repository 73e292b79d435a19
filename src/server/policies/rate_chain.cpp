// Rate chaining as composition: an admit-family policy served behind a rate-family policy.
#include "server/policy.h"

namespace sluice::server {
namespace {

class RateChain final : public Policy, public AdmitFamily, public AdmitGate {
 public:
  RateChain(std::shared_ptr<Policy> inner, std::shared_ptr<Policy> rate)
      : Policy(inner->name(), inner->kind(), inner->rate_name()),
        inner_(std::move(inner)),
        rate_(std::move(rate)) {}

  [[nodiscard]] AdmitFamily* admit_family() noexcept override { return this; }

  // The engine gives a served policy no gate of its own: this one is the gate.
  StatusOr<AdmitDecision> admit(const AdmitCall& call, Nanos now, AdmitGate* /*none*/) override {
    return inner_->admit_family()->admit(call, now, this);
  }
  Decided<AdmitDecision> admit_or_defer(const AdmitCall& call, Nanos now, AdmitGate* /*none*/,
                                        Deferral<AdmitDecision>& later) override {
    return inner_->admit_family()->admit_or_defer(call, now, this, later);
  }

  // Keyed by the call's key, or (a concurrency call naming none) by its tenant.
  StatusOr<std::optional<Rejection>> pass(const AdmitCall& call, Nanos now,
                                          std::shared_ptr<const void>& owner) override {
    const std::string_view key = call.key.empty() ? call.tenant : call.key;
    if (key.empty())
      return invalid("key", "must not be empty: policy '" + name() + "' chains rate policy '" +
                                rate_->name() + "', keyed by it");
    RateFamily& rate = *rate_->rate_family();
    const RateDecision d = rate.check(key, 1, now);
    if (d.allowed) return std::optional<Rejection>();
    owner = rate_;
    return std::optional<Rejection>(rate.refusal(key, d));
  }

  [[nodiscard]] PolicyReadiness readiness() const override { return inner_->readiness(); }

 protected:
  // What it shows is the inner policy's (the engine reads that one directly).
  void describe(nlohmann::json& j, PolicyInfo& info) const override { j = inner_->state(&info); }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    for (auto& f : inner_->collect()) out.push_back(std::move(f));
  }

 private:
  std::shared_ptr<Policy> inner_;
  std::shared_ptr<Policy> rate_;
};

}  // namespace

std::shared_ptr<Policy> chain_rate(std::shared_ptr<Policy> inner, std::shared_ptr<Policy> rate) {
  return std::make_shared<RateChain>(std::move(inner), std::move(rate));
}

}  // namespace sluice::server
