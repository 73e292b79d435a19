// The adaptive kind: an AdaptiveGuard (a concurrency limit inferred from latency, or fixed).
#include "server/policies/adaptive.h"

#include <atomic>
#include <string>

#include "server/policies/admit_policy.h"

namespace sluice::server {
namespace {

class AdaptiveLimitPolicy final : public AdmitPolicy {
 public:
  AdaptiveLimitPolicy(const BuildContext& c, const AlgorithmSpec& algorithm)
      : AdmitPolicy(c.name, "adaptive", c.spec.rate),
        guard_(guard_for(c, algorithm)),
        spec_(algorithm),
        kind_(algorithm.kind) {
    if (auto* was = dynamic_cast<const AdaptiveLimitPolicy*>(c.predecessor.get()))
      count_leases_of(*was);
  }

  // It reads no attribute: nothing to resolve.
  StatusOr<std::unique_ptr<ResolvedAdmit>> resolve(const AdmitCall& /*call*/,
                                                   Nanos /*now*/) override {
    return resolved([this](Nanos /*now*/, Deferral<AdmitDecision>& /*later*/) {
      return Decided<AdmitDecision>(take());
    });
  }

  // In place, always: the guard (and so every permit in flight, which stays counted against
  // the new limit) is kept and only its algorithm is replaced. The same algorithm with other
  // limits keeps the limit it learned, clamped to the new [min_limit, max_limit] (its RTT
  // history starts afresh); another algorithm, or a fixed limit's new value, starts at the
  // spec's limit.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const AlgorithmSpec next = c.spec.as<AdaptiveSpec>()->algorithm;
    if (const std::string_view why = next.validate(); !why.empty())
      return Status(StatusCode::kInvalidArgument, std::string(why));
    const bool keep = next.kind == spec_.kind && next.kind != AlgorithmSpec::Kind::kFixed;
    // Built now, so that applying cannot fail; a keeping change rebuilds it when applied from
    // the limit learned by then, and falls back to this one if that allocation fails.
    std::unique_ptr<LimitAlgorithm> prepared =
        keep ? make_algorithm(next, guard_->algorithm_limit()) : make_algorithm(next);
    return Reconfiguration([this, next, keep, prepared = std::move(prepared)]() mutable {
      std::unique_ptr<LimitAlgorithm> algorithm = std::move(prepared);
      if (keep) {
        try {
          algorithm = make_algorithm(next, guard_->algorithm_limit());
        } catch (...) {  // out of memory: the limit learned when the reload was prepared
        }
      }
      kind_.store(next.kind, std::memory_order_relaxed);
      guard_->replace_algorithm(std::move(algorithm));
      spec_ = next;
    });
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    j["algorithm"] = std::string(algorithm_name(kind_.load(std::memory_order_relaxed)));
    describe_guard(guard_->stats(), j, info);
    describe_admissions(j);
  }
  void metrics(std::vector<prometheus::MetricFamily>& out) const override {
    admission_metrics(out);
    guard_metrics(guard_->stats(), out);
  }

 private:
  AdmitDecision take() {
    AdmitDecision out;
    if (std::optional<GuardPermit> p = guard_->acquire()) {
      out.permit = lease(GuardLease{std::move(*p)});
    } else {
      count_limit_refusal();
      out.refusal = guard_refusal(name(), guard_->stats());
      out.refusal_owner = shared_from_this();
    }
    return out;
  }

  // A new guard, or the predecessor's (BuildContext::predecessor: the calls it admitted stay
  // counted against this limit) with the new spec's algorithm, as a reload in place would do.
  static std::shared_ptr<AdaptiveGuard> guard_for(const BuildContext& c,
                                                  const AlgorithmSpec& algorithm) {
    auto* was = dynamic_cast<const AdaptiveLimitPolicy*>(c.predecessor.get());
    if (was == nullptr) return std::make_shared<AdaptiveGuard>(make_algorithm(algorithm), c.clock);
    const bool keep =
        algorithm.kind == was->spec_.kind && algorithm.kind != AlgorithmSpec::Kind::kFixed;
    was->guard_->replace_algorithm(keep ? make_algorithm(algorithm, was->guard_->algorithm_limit())
                                        : make_algorithm(algorithm));
    return was->guard_;
  }

  std::shared_ptr<AdaptiveGuard> guard_;
  // The spec in force: read and written only by reconfigure() and the change it returns (the
  // engine runs one reload at a time).
  AlgorithmSpec spec_;
  std::atomic<AlgorithmSpec::Kind> kind_;  // spec_.kind, for describe() (relaxed: a label)
};

std::shared_ptr<const PolicyBody> parse(const std::string& /*name*/, ConfigSection& s,
                                        PolicySpec& /*spec*/) {
  s.keys(
      {"kind", "algorithm", "limit", "initial_limit", "min_limit", "max_limit", "rate", "shadow"});
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
