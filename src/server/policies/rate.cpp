// The rate kind: a RateLimiter (fixed window, sliding window or GCRA) per policy.
#include <sstream>

#include "server/registry.h"
#include "sluice/rate_limiter.h"

namespace sluice::server {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

class RateLimitPolicy final : public Policy, public RateFamily {
 public:
  RateLimitPolicy(const BuildContext& c, std::unique_ptr<RateLimiter> limiter)
      : Policy(c.name, "rate", c.identity, c.spec.rate), limiter_(std::move(limiter)) {}

  [[nodiscard]] RateFamily* rate_family() noexcept override { return this; }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    RateDecision d = limiter_->check(key, hits, now);
    (d.allowed ? allowed_ : denied_).fetch_add(1, std::memory_order_relaxed);
    return d;
  }
  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    return limiter_->peek(key, hits, now);
  }
  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    limiter_->refund(key, hits, now);
  }
  Rejection refusal(std::string_view key, const RateDecision& d) const override {
    const RateRule& r = limiter_->rule();
    Rejection out;
    out.source = "rate";
    out.limit_type = "rate";
    out.status = 429;
    out.type = "urn:sluice:problem:rate-limit-exceeded";
    out.title = "Rate Limit Exceeded";
    std::ostringstream detail;
    detail << "Rate policy " << name() << " allows " << r.limit << " per " << seconds_of(r.period)
           << "s for key '" << key << "'";
    if (d.retry_after != Nanos::max())
      detail << "; retry after " << seconds_of(d.retry_after) << "s";
    out.detail_text = detail.str();
    out.retry_after = d.retry_after;
    out.policy = name();
    out.current_in_flight = d.limit - std::min(d.limit, d.remaining);
    out.max_concurrent = d.limit;
    out.remaining = d.remaining;
    return out;
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    const RateRule& r = limiter_->rule();
    info.limit = r.limit;
    j["strategy"] = std::string(to_string(r.strategy));
    j["limit"] = r.limit;
    j["period_seconds"] = seconds_of(r.period);
    if (r.burst != 0) j["burst"] = r.burst;
    j["keys"] = limiter_->keys();
    j["allowed"] = allowed_.load(std::memory_order_relaxed);
    j["denied"] = denied_.load(std::memory_order_relaxed);
  }
  void metrics(std::vector<MetricFamily>& out) const override {
    out.push_back(by_label("sluice_rate_decisions_total", "Rate checks by decision", "decision",
                           {{"allowed", allowed_.load()}, {"denied", denied_.load()}}));
    out.push_back(one("sluice_rate_keys", "Keys the rate policy holds state for", MetricType::Gauge,
                      static_cast<double>(limiter_->keys())));
    out.push_back(one("sluice_rate_limit", "Hits per period", MetricType::Gauge,
                      static_cast<double>(limiter_->rule().limit)));
  }

 private:
  std::unique_ptr<RateLimiter> limiter_;
  std::atomic<std::uint64_t> allowed_{0}, denied_{0};
};

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const auto& spec = std::get<RatePolicy>(c.spec.body);
  auto limiter = make_rate_limiter(RateLimiterOptions{spec.rule, 64}, c.clock);
  if (!limiter.ok()) return limiter.status();
  return std::shared_ptr<Policy>(std::make_shared<RateLimitPolicy>(c, std::move(limiter.value())));
}

}  // namespace

PolicyKind rate_kind() {
  return PolicyKind{.name = "rate", .rate_family = true, .admit_family = false, .build = build};
}

}  // namespace sluice::server
