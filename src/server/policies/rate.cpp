// The rate kind: a RateLimiter (fixed window, sliding window or GCRA) per policy.
#include "server/policies/rate.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>

#include "server/json_text.h"
#include "sluice/local/rate_limiter.h"

namespace sluice::server {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// How often a policy's loop sweeps its idle keys: as often as a key can go idle
// (idle_within: a period for a fixed window), within [1 s, 60 s]. A sweep scans every key held,
// and the keys held are those used within idle_within, so in the long run a sweep costs about
// one key's scan per check (more only where idle_within exceeds 60 s).
Nanos sweep_interval(const RateRule& r) {
  return std::clamp<Nanos>(idle_within(r), std::chrono::seconds(1), std::chrono::seconds(60));
}

class RateLimitPolicy final : public Policy, public RateFamily {
 public:
  RateLimitPolicy(const BuildContext& c, std::unique_ptr<RateLimiter> limiter)
      : Policy(c.name, "rate", c.spec.rate), limiter_(std::move(limiter)) {
    start_loop(c.clock, [this](Nanos now) {
      limiter_->sweep(now);
      return now + sweep_interval(limiter_->rule());
    });
  }
  // The loop uses the limiter: stopped before the members go.
  ~RateLimitPolicy() override { retire(); }
  RateLimitPolicy(const RateLimitPolicy&) = delete;
  RateLimitPolicy& operator=(const RateLimitPolicy&) = delete;

  // In place when the strategy and the period stay (a new limit, burst or max_keys): every
  // key keeps what it has spent (sluice/core/rate_strategy.h: carry). Otherwise rebuilt: a new
  // strategy or period starts every key afresh.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const RateSpec& spec = *c.spec.as<RateSpec>();
    if (spec.shared || !can_carry(limiter_->rule(), spec.rule)) return Reconfiguration{};
    const RateRule to = spec.rule;
    const std::size_t max_keys = spec.max_keys;
    return Reconfiguration([this, to, max_keys] { limiter_->reconfigure(to, max_keys); });
  }

  [[nodiscard]] RateFamily* rate_family() noexcept override { return this; }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    RateDecision d = limiter_->check(key, hits, now);
    (d.allowed ? allowed_ : denied_).fetch_add(1, std::memory_order_relaxed);
    if (d.key_capacity) key_capacity_denied_.fetch_add(1, std::memory_order_relaxed);
    return d;
  }
  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    return limiter_->peek(key, hits, now);
  }
  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    limiter_->refund(key, hits, now);
  }
  StatusOr<RateCharge> charge(std::string_view key, std::uint64_t hits, Nanos now) override {
    RateCharge c = limiter_->charge(key, hits, now);
    if (!c.recorded) {
      key_capacity_denied_.fetch_add(1, std::memory_order_relaxed);
      std::string why = "key: rate policy " + name() + " holds state for its max_keys (";
      why += std::to_string(limiter_->max_keys());
      why += ") keys; the charge of new key '";
      why += key;
      why += "' was not recorded";
      return Status(StatusCode::kResourceExhausted, std::move(why));
    }
    charged_.fetch_add(hits, std::memory_order_relaxed);
    if (hits > 0 && c.overdraft > 0) overdrawn_.fetch_add(1, std::memory_order_relaxed);
    return c;
  }
  Rejection refusal(std::string_view key, const RateDecision& d) const override {
    const RateRule r = limiter_->rule();
    std::ostringstream detail;
    if (d.key_capacity)
      detail << "Rate policy " << name() << " holds state for its max_keys ("
             << limiter_->max_keys() << ") keys; new key '" << key
             << "' is refused until some fall idle";
    else
      detail << "Rate policy " << name() << " allows " << r.limit << " per " << seconds_of(r.period)
             << "s for key '" << key << "'";
    return rate_refusal(name(), detail.str(), d);
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    const RateRule r = limiter_->rule();
    info.limit = r.limit;
    j["strategy"] = std::string(to_string(r.strategy));
    j["limit"] = r.limit;
    j["period_seconds"] = seconds_of(r.period);
    if (r.burst != 0) j["burst"] = r.burst;
    j["keys"] = limiter_->keys();
    j["max_keys"] = limiter_->max_keys();
    j["key_capacity_denied"] = key_capacity_denied_.load(std::memory_order_relaxed);
    j["allowed"] = allowed_.load(std::memory_order_relaxed);
    j["denied"] = denied_.load(std::memory_order_relaxed);
    j["charged"] = charged_.load(std::memory_order_relaxed);
    j["overdrawn"] = overdrawn_.load(std::memory_order_relaxed);
  }
  void metrics(std::vector<MetricFamily>& out) const override {
    out.push_back(by_label("sluice_rate_decisions_total", "Rate checks by decision", "decision",
                           {{"allowed", allowed_.load()}, {"denied", denied_.load()}}));
    out.push_back(one("sluice_rate_keys", "Keys the rate policy holds state for", MetricType::Gauge,
                      static_cast<double>(limiter_->keys())));
    out.push_back(one("sluice_rate_max_keys", "Keys the rate policy may hold state for",
                      MetricType::Gauge, static_cast<double>(limiter_->max_keys())));
    out.push_back(one("sluice_rate_key_capacity_denied_total",
                      "Checks of new keys refused because the policy held max_keys keys",
                      MetricType::Counter,
                      static_cast<double>(key_capacity_denied_.load(std::memory_order_relaxed))));
    out.push_back(one("sluice_rate_limit", "Hits per period", MetricType::Gauge,
                      static_cast<double>(limiter_->rule().limit)));
    out.push_back(one("sluice_rate_charged_hits_total", "Hits charged after the fact (Charge)",
                      MetricType::Counter,
                      static_cast<double>(charged_.load(std::memory_order_relaxed))));
    out.push_back(one(
        "sluice_rate_overdrawn_total", "Charges that left their key past its limit (an overdraft)",
        MetricType::Counter, static_cast<double>(overdrawn_.load(std::memory_order_relaxed))));
  }

 private:
  std::unique_ptr<RateLimiter> limiter_;
  std::atomic<std::uint64_t> allowed_{0}, denied_{0}, key_capacity_denied_{0};
  std::atomic<std::uint64_t> charged_{0}, overdrawn_{0};
};

// The fields of a rate policy with a coordinator (shared_rate.h).
void parse_shared(ConfigSection& s, PolicySpec& spec, RateSpec& body) {
  static const char* const kFields[] = {"budget", "coordinator_timeout", "retry_backoff",
                                        "outage", "refusal_cache",       "io_threads",
                                        "lease",  "lease_hold"};
  const std::optional<std::string> coordinator = s.str("coordinator");
  if (!coordinator) {
    for (const char* f : kFields)
      if (s.has(f))
        s.error(f, "applies to a rate policy whose keys a coordinator keeps: set coordinator");
    return;
  }
  SharedRateSettings& o = body.shared.emplace();
  o.coordinator = *coordinator;
  spec.use("coordinator", o.coordinator, CoordinatorRole::kSharedRate);
  if (auto v = s.str("budget")) {
    if (v->empty() || v->find(':') != std::string::npos)
      s.error("budget",
              "must be a name without ':' (the keys' name at the coordinator), not '" + *v + "'");
    o.budget = *v;
  }
  if (auto d = s.duration("coordinator_timeout")) o.coordinator_timeout = *d;
  if (auto d = s.duration("retry_backoff")) o.retry_backoff = *d;
  if (auto v = s.choice<bool>("outage", {{"fail-closed", false}, {"fail-open", true}}))
    o.fail_open = *v;
  if (auto v = s.boolean("refusal_cache")) o.refusal_cache = *v;
  if (auto v = s.uint("io_threads", 1, 64)) o.io_threads = *v;
  if (auto v = s.uint("lease", 1, std::numeric_limits<std::uint32_t>::max())) {
    const RateRule& r = body.rule;
    if (r.strategy != RateStrategy::kGcra)
      s.error("lease", "leases hits of a GCRA key to decide here: it needs strategy gcra");
    else if (*v > (r.burst != 0 ? r.burst : r.limit))
      s.error("lease", "must be at most the burst (" +
                           std::to_string(r.burst != 0 ? r.burst : r.limit) + ")");
    o.lease = *v;
  }
  if (auto d = s.duration("lease_hold")) {
    if (o.lease == 0) s.error("lease_hold", "is how long leased hits are kept: it needs lease");
    o.lease_hold = *d;
  }
}

std::shared_ptr<const PolicyBody> parse(const std::string& /*name*/, ConfigSection& s,
                                        PolicySpec& spec) {
  s.keys({"kind", "strategy", "limit", "period", "burst", "max_keys", "shadow", "coordinator",
          "budget", "coordinator_timeout", "retry_backoff", "outage", "refusal_cache", "io_threads",
          "lease", "lease_hold"});
  auto body = std::make_shared<RateSpec>();
  RateRule& rule = body->rule;
  if (auto v = s.choice<RateStrategy>("strategy", {{"fixed-window", RateStrategy::kFixedWindow},
                                                   {"sliding-window", RateStrategy::kSlidingWindow},
                                                   {"gcra", RateStrategy::kGcra}}))
    rule.strategy = *v;
  if (auto v = s.uint("limit", 1, std::numeric_limits<std::uint32_t>::max(), true)) rule.limit = *v;
  if (auto d = s.duration("period")) rule.period = *d;
  if (auto v = s.uint("burst", 1, std::numeric_limits<std::uint32_t>::max())) rule.burst = *v;
  if (auto v = s.uint("max_keys", 1, kMaxRateKeys)) body->max_keys = *v;
  // The rule's own check ("<field> <what is wrong>"), placed at the field it names.
  if (const std::string why = rule.validate(); !why.empty()) {
    const std::string field = why.substr(0, why.find(' '));
    s.error(field, why.substr(field.size() + 1));
  }
  parse_shared(s, spec, *body);
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const RateSpec& spec = *c.spec.as<RateSpec>();
  if (spec.shared) {
    auto store =
        c.coordinator<SharedRateStore>(spec.shared->coordinator, "shared rate limits' interface");
    if (!store.ok()) return store.status();
    if (std::string why = store.value()->rule_error(spec.rule); !why.empty())
      return Status(StatusCode::kInvalidArgument,
                    "coordinator " + spec.shared->coordinator + ": " + why);
    return make_shared_rate_policy(c, spec.rule, spec.max_keys, *spec.shared,
                                   std::move(store.value()));
  }
  RateLimiterOptions o;
  o.rule = spec.rule;
  o.shards = 64;
  o.max_keys = spec.max_keys;
  auto limiter = make_rate_limiter(o, c.clock);
  if (!limiter.ok()) return limiter.status();
  return std::shared_ptr<Policy>(std::make_shared<RateLimitPolicy>(c, std::move(limiter.value())));
}

}  // namespace

Rejection rate_refusal(std::string_view policy, std::string detail, const RateDecision& d) {
  Rejection out;
  out.source = "rate";
  out.limit_type = "rate";
  out.status = 429;
  out.type = "urn:sluice:problem:rate-limit-exceeded";
  out.title = "Rate Limit Exceeded";
  std::ostringstream text;
  text << detail;
  if (d.retry_after != Nanos::max()) text << "; retry after " << seconds_of(d.retry_after) << "s";
  out.detail_text = text.str();
  out.retry_after = d.retry_after;
  out.policy = policy;
  out.current_in_flight = d.limit - std::min(d.limit, d.remaining);
  out.max_concurrent = d.limit;
  out.remaining = d.remaining;
  return out;
}

// POST /admin/rate/{policy}/adopt: shared_rate.h, adopt_coordinator.
HttpRoute adopt_route() {
  return HttpRoute{
      {"POST"},
      "/admin/rate/{policy}/adopt",
      true,
      [](const RouteRequest& req, const KindPolicies& ps,
         Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        const std::string_view name = req.param("policy");
        RouteReply out;
        for (const std::shared_ptr<Policy>& p : ps) {
          if (p->name() != name) continue;
          const Status s = adopt_coordinator(*p, std::chrono::seconds(5));
          out.status = s.ok() ? 200
                       : s.code() == StatusCode::kInvalidArgument ||
                               s.code() == StatusCode::kFailedPrecondition
                           ? 400
                           : 503;
          out.body = json_text(s.ok() ? nlohmann::json{{"policy", name}, {"adopted", true}}
                                      : nlohmann::json{{"error", s.message()}});
          return out;
        }
        out.status = 404;
        // The name is the caller's bytes: json_text, not dump(), which throws on
        // what is not UTF-8.
        out.body = json_text(
            nlohmann::json{{"error", "policy: no rate policy named '" + std::string(name) + "'"}});
        return out;
      }};
}

PolicyKind rate_kind() {
  PolicyKind kind("rate", PolicyKind::kRate, parse, build);
  kind.routes.push_back(adopt_route());
  return kind;
}

}  // namespace sluice::server
