// The rate kind: a RateLimiter (fixed window, sliding window or GCRA) per policy.
#include "server/policies/rate.h"

#include <limits>
#include <sstream>

#include "sluice/rate_limiter.h"

namespace sluice::server {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

class RateLimitPolicy final : public Policy, public RateFamily {
 public:
  RateLimitPolicy(const BuildContext& c, std::unique_ptr<RateLimiter> limiter)
      : Policy(c.name, "rate", c.spec.rate), limiter_(std::move(limiter)) {}

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

std::shared_ptr<const PolicyBody> parse(const std::string& /*name*/, ConfigSection& s,
                                        PolicySpec& /*spec*/) {
  s.keys({"kind", "strategy", "limit", "period", "burst"});
  auto body = std::make_shared<RateSpec>();
  RateRule& rule = body->rule;
  if (auto v = s.choice<RateStrategy>("strategy", {{"fixed-window", RateStrategy::kFixedWindow},
                                                   {"sliding-window", RateStrategy::kSlidingWindow},
                                                   {"gcra", RateStrategy::kGcra}}))
    rule.strategy = *v;
  if (auto v = s.uint("limit", 1, std::numeric_limits<std::uint32_t>::max(), true)) rule.limit = *v;
  if (auto d = s.duration("period")) rule.period = *d;
  if (auto v = s.uint("burst", 1, std::numeric_limits<std::uint32_t>::max())) rule.burst = *v;
  // The rule's own check ("<field> <what is wrong>"), placed at the field it names.
  if (const std::string why = rule.validate(); !why.empty()) {
    const std::string field = why.substr(0, why.find(' '));
    s.error(field, why.substr(field.size() + 1));
  }
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const RateSpec& spec = *c.spec.as<RateSpec>();
  auto limiter = make_rate_limiter(RateLimiterOptions{spec.rule, 64}, c.clock);
  if (!limiter.ok()) return limiter.status();
  return std::shared_ptr<Policy>(std::make_shared<RateLimitPolicy>(c, std::move(limiter.value())));
}

}  // namespace

PolicyKind rate_kind() { return PolicyKind("rate", PolicyKind::kRate, parse, build); }

}  // namespace sluice::server
