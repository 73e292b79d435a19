// throttler_config.cpp: the throttler kind's config (throttler_policy.h): the probes a metric
// may name and their settings, parse() and build().
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <system_error>
#include <utility>

#include "server/json_text.h"
#include "server/policies/throttler_policy.h"

namespace sluice::server::throttler_detail {
namespace {

// A metric's config section as the probes read it (backends/probes/registry.h).
class SectionSettings final : public probes::ProbeSettings {
 public:
  explicit SectionSettings(ConfigSection& m) : m_(m) {}
  bool has(std::string_view key) const override { return m_.has(key); }
  std::optional<std::string> str(std::string_view key, bool required) override {
    return m_.str(key, required);
  }
  std::optional<std::vector<std::string>> strings(std::string_view key) override {
    return m_.strings(key);
  }
  std::optional<bool> boolean(std::string_view key) override { return m_.boolean(key); }
  void error(std::string_view key, const std::string& message) override { m_.error(key, message); }

 private:
  ConfigSection& m_;
};

// `v` in the fewest digits that read back as it.
std::string number_text(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc{} ? end : buf);
}

// How samples stay fresh: a sample is stale past stale_intervals x fast_interval (the window)
// while checks come, and the next one replaces it at most max(fast_interval, timeout) + timeout
// after it was taken (the loop starts the next probe an interval after the last one started, or
// when it ended). The longest probe timeout that keeps every sample fresh is then the window
// minus an interval while that leaves at most an interval, else half the window.
struct Freshness {
  Nanos fast_interval;
  double stale_intervals;
  [[nodiscard]] Nanos window() const {  // at most ~31 years: never past what Nanos holds
    const double ns = static_cast<double>(fast_interval.count()) * stale_intervals;
    return Nanos{static_cast<std::int64_t>(std::min(ns, 1e18))};
  }
  [[nodiscard]] Nanos longest_timeout() const {
    const Nanos w = window();
    return w <= 2 * fast_interval ? w - fast_interval : w / 2;
  }
};

// A metric's probe from its settings (errors reported on `m`; null when it has none).
MakeProbe metric_probe(const std::string& policy, ConfigSection& m, const Freshness& fresh) {
  const probes::ProbeRegistry& registry = probes::builtin_probes();
  std::vector<std::string_view> keys = {"probe", "threshold", "ignore_hosts"};
  for (std::string_view k : registry.settings()) keys.push_back(k);
  m.keys(keys);
  const std::optional<std::string> probe = m.one_of("probe", registry.names(), true);
  if (!probe) return nullptr;
  const probes::ProbeType& type = *registry.find(*probe);
  for (std::string_view key : registry.settings())
    if (m.has(key) && !type.takes(key)) m.error(key, "is not a setting of probe: " + *probe);

  // A probe with a timeout: 1 s by default, less when the samples would go stale first.
  const Nanos longest = fresh.longest_timeout();
  Nanos timeout = std::min<Nanos>(std::chrono::seconds(1), longest);
  const bool timed = type.takes("timeout");
  const std::string why_stale =
      "a probe may take max(fast_interval, timeout) + timeout to replace its sample, and a "
      "sample is stale after stale_intervals (" +
      number_text(fresh.stale_intervals) + ") x fast_interval (" +
      format_duration(fresh.fast_interval) + ") = " + format_duration(fresh.window());
  if (auto d = m.duration("timeout")) {
    if (*d <= Nanos{0} || *d > std::chrono::minutes(1))
      m.error("timeout", "must be more than 0 and at most 1m");
    else if (*d > longest)
      m.error("timeout", "is " + format_duration(*d) + ", too long to keep samples fresh: " +
                             why_stale + "; at most " + format_duration(longest) +
                             " here, or raise stale_intervals or fast_interval");
    else
      timeout = *d;
  } else if (timed && longest <= Nanos{0}) {
    m.error("probe",
            "cannot keep its samples fresh: " + why_stale + "; raise stale_intervals above 1");
  }
  SectionSettings settings(m);
  return type.read(settings, probes::ProbeContext{policy, timeout});
}

}  // namespace

std::shared_ptr<const PolicyBody> parse(const std::string& name, ConfigSection& s,
                                        PolicySpec& spec) {
  s.keys({"kind", "shard", "scope", "default_app", "fast_interval", "dormant_interval",
          "idle_after", "unexplained_after", "stale_intervals", "low_priority_hold", "metrics",
          "apps", "shared_rules", "shared_rules_interval"});
  auto body = std::make_shared<ThrottlerSpec>();
  body->shard = name;
  if (auto v = s.str("shard")) {
    if (v->empty()) s.error("shard", "must not be empty");
    body->shard = *v;
  }
  if (auto v = s.choice<ThrottleScope>(
          "scope", {{"shard", ThrottleScope::kShard}, {"self", ThrottleScope::kSelf}}))
    body->options.default_scope = *v;
  if (auto v = s.str("default_app")) {
    if (v->empty()) s.error("default_app", "must not be empty");
    body->options.default_app = *v;
  }
  if (auto d = s.duration("fast_interval")) body->fast_interval = *d;
  if (auto d = s.duration("dormant_interval")) body->dormant_interval = *d;
  if (auto d = s.duration("idle_after")) body->idle_after = *d;
  if (auto d = s.duration("unexplained_after")) {
    if (*d <= Nanos{0})
      s.error("unexplained_after", "must be more than 0");
    else
      body->unexplained_after = *d;
  }
  if (auto d = s.duration("low_priority_hold")) body->options.low_priority_hold = *d;
  if (auto v = s.str("shared_rules")) {
    if (v->empty())
      s.error("shared_rules", "must name a coordinator");
    else
      spec.use("shared_rules", *v, CoordinatorRole::kSharedRules);
    body->shared_rules = *v;
  }
  if (auto d = s.duration("shared_rules_interval")) {
    if (!s.has("shared_rules"))
      s.error("shared_rules_interval", "needs shared_rules (the coordinator it reads)");
    else if (*d < std::chrono::milliseconds(10) || *d > std::chrono::minutes(1))
      s.error("shared_rules_interval", "must be from 10ms to 1m");
    else
      body->shared_rules_interval = *d;
  }
  if (body->dormant_interval < body->fast_interval)
    s.error("dormant_interval", "must be at least fast_interval");
  if (auto v = s.number("stale_intervals")) {
    if (*v < 1)
      s.error("stale_intervals", "must be >= 1 (a sample is due every interval)");
    else
      body->stale_intervals = *v;
  }
  s.named("metrics", [&](const std::string& metric, ConfigSection& m) {
    MetricSpec spec;
    spec.name = metric;
    spec.make = metric_probe(name, m, Freshness{body->fast_interval, body->stale_intervals});
    if (auto t = m.number("threshold", true)) {
      if (*t <= 0)
        m.error("threshold", "must be > 0");
      else
        spec.threshold = *t;
    }
    if (auto v = m.uint("ignore_hosts", 0, 1000)) spec.ignore_hosts = *v;
    body->metrics.push_back(std::move(spec));
  });
  if (body->metrics.empty() && !s.has("metrics"))
    s.error("metrics", "is required: at least one metric to check");
  const auto known = [&](const std::string& metric) { return has_metric(body->metrics, metric); };
  s.named("apps", [&](const std::string& app, ConfigSection& a) {
    a.keys({"metrics", "thresholds", "exempt"});
    ThrottleAppRule rule;
    if (auto v = a.strings("metrics")) {
      for (const std::string& m : *v)
        if (!known(m)) a.error("metrics", "names '" + m + "', which is not one of the metrics");
      rule.metrics = *v;
    }
    if (auto v = a.numbers("thresholds"))
      for (const auto& [metric, t] : *v) {
        if (!known(metric))
          a.error_at("thresholds." + metric, "is not one of the metrics");
        else if (t <= 0)
          a.error_at("thresholds." + metric, "must be > 0");
        rule.thresholds[metric] = t;
      }
    if (auto v = a.boolean("exempt")) {
      // `all` holds the rule of the apps without their own; exempting every app would turn the
      // throttler off, which the admin verb refuses too.
      if (app == "all")
        a.error("exempt",
                "does not apply to 'all', which cannot be exempt (exempt the apps by name)");
      rule.exempt = *v;
    }
    body->apps[app] = std::move(rule);
  });
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  // The rules a state file keeps for this throttler: one that is not what this server writes (a
  // hand edit, another version) refuses the policy, naming the file, the app and the field,
  // rather than serving without it or stopping on it later.
  const RuntimeState state = c.runtime_state();
  for (const auto& [app, v] : state.list()) {
    StatusOr<ThrottlerPolicy::RuntimeRule> r = ThrottlerPolicy::rule_of(v);
    const std::string bad_app = app_name_error(app);
    if (!r.ok() || !bad_app.empty())
      return Status(StatusCode::kInvalidArgument,
                    "state file " + state.store()->path() + ": the rule for app " + json_text(app) +
                        " of scope " + json_text(state.scope()) + ": " +
                        (bad_app.empty() ? r.status().message() : bad_app));
  }
  const auto& spec = *c.spec.as<ThrottlerSpec>();
  std::shared_ptr<SharedRules> shared;
  if (!spec.shared_rules.empty()) {
    auto r = c.coordinator<SharedRules>(spec.shared_rules, "a throttler's shared rules");
    if (!r.ok()) return Status(r.status().code(), "shared_rules: " + r.status().message());
    shared = std::move(r.value());
    if (const std::size_t n = state.list().size(); n > 0 && c.notices)
      c.notices->tell("policy " + c.name + ": " + std::to_string(n) +
                      " rule(s) in the state file are not used: its rules are shared through "
                      "coordinator " +
                      spec.shared_rules);
  }
  return std::shared_ptr<Policy>(std::make_shared<ThrottlerPolicy>(c, spec, std::move(shared)));
}

}  // namespace sluice::server::throttler_detail
