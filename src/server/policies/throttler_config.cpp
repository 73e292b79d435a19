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

// The probes a metric may name, and the settings each takes beside probe, threshold and
// ignore_hosts.
enum class ProbeKind {
  kLoadAvg,
  kCommand,
  kPolicy,
  kMysqlLag,
  kMysqlHeartbeat,
  kMysqlThreadsRunning,
  kPostgresLag,
  kPostgresActive,
  kRedis,
  kHttp
};
const std::map<std::string, std::vector<std::string_view>, std::less<>>& probe_settings() {
  static const std::map<std::string, std::vector<std::string_view>, std::less<>> settings = {
      {"loadavg", {}},
      {"command", {"command", "timeout"}},
      {"policy", {"policy"}},
      {"mysql_lag", {"hosts", "user", "password", "password_env", "timeout"}},
      {"mysql_heartbeat",
       {"hosts", "user", "password", "password_env", "timeout", "heartbeat_table",
        "heartbeat_utc"}},
      {"mysql_threads_running", {"hosts", "user", "password", "password_env", "timeout"}},
      {"postgres_lag", {"hosts", "conninfo", "password_env", "timeout"}},
      {"postgres_active", {"hosts", "conninfo", "password_env", "timeout"}},
      {"redis", {"hosts", "field", "username", "password", "password_env", "timeout"}},
      {"http", {"url", "timeout"}},
  };
  return settings;
}

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
  m.keys({"probe", "threshold", "ignore_hosts", "command", "timeout", "policy", "hosts", "user",
          "password", "password_env", "heartbeat_table", "heartbeat_utc", "conninfo", "field",
          "username", "url"});
  const std::optional<ProbeKind> kind =
      m.choice<ProbeKind>("probe",
                          {{"loadavg", ProbeKind::kLoadAvg},
                           {"command", ProbeKind::kCommand},
                           {"policy", ProbeKind::kPolicy},
                           {"mysql_lag", ProbeKind::kMysqlLag},
                           {"mysql_heartbeat", ProbeKind::kMysqlHeartbeat},
                           {"mysql_threads_running", ProbeKind::kMysqlThreadsRunning},
                           {"postgres_lag", ProbeKind::kPostgresLag},
                           {"postgres_active", ProbeKind::kPostgresActive},
                           {"redis", ProbeKind::kRedis},
                           {"http", ProbeKind::kHttp}},
                          true);
  if (!kind) return nullptr;
  const std::string probe = *m.str("probe");
  const auto& allowed = probe_settings().at(probe);
  for (std::string_view key :
       {"command", "timeout", "policy", "hosts", "user", "password", "password_env",
        "heartbeat_table", "heartbeat_utc", "conninfo", "field", "username", "url"})
    if (m.has(key) && std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      m.error(key, "is not a setting of probe: " + probe);

  // A probe with a timeout: 1 s by default, less when the samples would go stale first.
  const Nanos longest = fresh.longest_timeout();
  Nanos timeout = std::min<Nanos>(std::chrono::seconds(1), longest);
  const bool timed = std::find(allowed.begin(), allowed.end(), "timeout") != allowed.end();
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
  // hosts: "host[:port]" each, at least one.
  const auto hosts = [&](int default_port) {
    std::vector<probes::Endpoint> out;
    const auto list = m.strings("hosts");
    if (!list) {
      if (!m.has("hosts")) m.error("hosts", "is required: the hosts to sample, host[:port] each");
      return out;
    }
    if (list->empty()) m.error("hosts", "must name at least one host");
    for (const std::string& h : *list) {
      probes::Endpoint e;
      if (std::string error = probes::parse_endpoint(h, default_port, e); !error.empty())
        m.error("hosts", error);
      else
        out.push_back(std::move(e));
    }
    return out;
  };
  // password, or password_env: the environment variable that holds it (read now).
  const auto password = [&]() -> std::string {
    if (m.has("password") && m.has("password_env"))
      m.error("password_env", "give password or password_env, not both");
    if (auto env = m.str("password_env")) {
      const char* v = std::getenv(env->c_str());
      if (v == nullptr) {
        m.error("password_env", "names " + *env + ", which is not set");
        return {};
      }
      return v;
    }
    return m.str("password").value_or("");
  };

  switch (*kind) {
    case ProbeKind::kLoadAvg:
      return [](const auto&) { return probes::loadavg_probe(); };
    case ProbeKind::kCommand: {
      std::string command = m.str("command", true).value_or("");
      if (m.has("command") && command.empty()) m.error("command", "must not be empty");
      return [command, timeout](const auto&) { return probes::command_probe(command, timeout); };
    }
    case ProbeKind::kPolicy: {
      std::string target = m.str("policy", true).value_or("");
      if (m.has("policy") && (target.empty() || target == policy))
        m.error("policy", target.empty() ? "must name a policy" : "must name another policy");
      return [target](const std::shared_ptr<const PolicyDirectory>& directory) {
        return policy_probe(directory, target);
      };
    }
    case ProbeKind::kMysqlLag:
    case ProbeKind::kMysqlHeartbeat:
    case ProbeKind::kMysqlThreadsRunning: {
      probes::MysqlProbeOptions o;
      o.measure = *kind == ProbeKind::kMysqlLag         ? probes::MysqlMeasure::kLag
                  : *kind == ProbeKind::kMysqlHeartbeat ? probes::MysqlMeasure::kHeartbeat
                                                        : probes::MysqlMeasure::kThreadsRunning;
      o.hosts = hosts(3306);
      o.user = m.str("user", true).value_or("");
      o.password = password();
      o.timeout = timeout;
      if (auto t = m.str("heartbeat_table")) {
        if (std::string error = probes::heartbeat_table_error(*t); !error.empty())
          m.error("heartbeat_table", error);
        o.heartbeat_table = *t;
      }
      if (auto u = m.boolean("heartbeat_utc")) o.heartbeat_utc = *u;
      return [o](const auto&) { return probes::mysql_probe(o); };
    }
    case ProbeKind::kPostgresLag:
    case ProbeKind::kPostgresActive: {
      probes::PostgresProbeOptions o;
      o.measure = *kind == ProbeKind::kPostgresLag ? probes::PostgresMeasure::kLag
                                                   : probes::PostgresMeasure::kActive;
      o.hosts = hosts(5432);
      o.conninfo = m.str("conninfo").value_or("");
      if (o.conninfo.find("://") != std::string::npos)
        m.error("conninfo", "must be keyword=value pairs (the hosts are added to it), not a URI");
      if (m.has("password_env")) {
        std::string p = password();
        std::string q = "'";
        for (const char c : p)
          q += (c == '\\' || c == '\'') ? std::string{'\\', c} : std::string{c};
        o.conninfo += " password=" + q + "'";
      }
      o.timeout = timeout;
      return [o](const auto&) { return probes::postgres_probe(o); };
    }
    case ProbeKind::kRedis: {
      probes::RedisProbeOptions o;
      o.hosts = hosts(6379);
      o.field = m.str("field", true).value_or("");
      if (m.has("field") && o.field.empty()) m.error("field", "must name an INFO field");
      o.username = m.str("username").value_or("");
      o.password = password();
      o.timeout = timeout;
      return [o](const auto&) { return probes::redis_probe(o); };
    }
    case ProbeKind::kHttp: {
      probes::HttpProbeOptions o;
      o.url = m.str("url", true).value_or("");
      if (m.has("url"))
        if (std::string error = probes::http_url_error(o.url); !error.empty())
          m.error("url", error);
      o.timeout = timeout;
      return [o](const auto&) { return probes::http_probe(o); };
    }
  }
  return nullptr;
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
