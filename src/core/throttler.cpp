#include "sluice/core/throttler.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <utility>

#include "sluice/core/text.h"

namespace sluice {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int64_t kNone = INT64_MIN;

std::string seconds_text(Nanos d) {
  std::ostringstream out;
  out << std::setprecision(3) << std::chrono::duration<double>(d).count() << "s";
  return out.str();
}

// One host's sample judged at `now`: its badness (a failed, stale or missing sample ranks above
// any value) and what it says.
struct Judged {
  const ThrottleSample* sample = nullptr;
  bool bad = false;
  std::string reason;  // "ok" / "probe_failed" / "stale_sample" / "no_sample"
  std::string detail;
  double value = 0;
};

// `in_force`: the probe interval in force for the check (0: none given); a sample is judged
// against the longer of it and the interval it was taken under.
Judged judge(const ThrottleSample& s, double stale_intervals, Nanos now, Nanos in_force) {
  Judged j;
  j.sample = &s;
  j.value = s.value;
  j.reason = "ok";
  if (s.taken_at.count() == kNone) {
    j.bad = true;
    j.reason = "no_sample";
    j.detail = "no sample of " + s.host + " yet";
  } else if (!s.error.empty()) {
    j.bad = true;
    j.reason = "probe_failed";
    j.detail = s.host + ": " + s.error;
  } else if (const Nanos interval = std::max(s.interval, in_force); interval > Nanos{0}) {
    const Nanos age = now - s.taken_at;
    const auto bound = Nanos{static_cast<std::int64_t>(std::min(
        static_cast<double>(INT64_MAX), stale_intervals * static_cast<double>(interval.count())))};
    if (age > bound) {
      j.bad = true;
      j.reason = "stale_sample";
      j.detail =
          s.host + ": sample " + seconds_text(age) + " old, stale after " + seconds_text(bound);
    }
  }
  return j;
}

bool worse(const Judged& a, const Judged& b) {
  if (a.bad != b.bad) return a.bad;
  return !a.bad && a.value > b.value;
}

ThrottleMetricResult evaluate(const ThrottleMetric& m, double threshold, ThrottleScope scope,
                              Nanos now, Nanos in_force,
                              const std::map<std::string, Nanos, std::less<>>* skipped) {
  ThrottleMetricResult r;
  r.name = m.name;
  r.scope = std::string(to_string(scope));
  r.threshold = threshold;
  if (m.hosts.empty()) {
    r.over = true;
    r.reason = "no_sample";
    r.detail = "no sample of metric " + m.name + " yet";
    return r;
  }
  std::vector<Judged> hosts;
  if (scope == ThrottleScope::kSelf) {
    hosts.push_back(judge(m.hosts.front(), m.stale_intervals, now, in_force));
  } else {
    const auto is_skipped = [&](const std::string& host) {
      if (skipped == nullptr) return false;
      const auto it = skipped->find(host);
      return it != skipped->end() && now < it->second;
    };
    for (const ThrottleSample& s : m.hosts)
      if (!is_skipped(s.host)) hosts.push_back(judge(s, m.stale_intervals, now, in_force));
    if (hosts.empty()) {
      r.over = true;
      r.reason = "no_sample";
      r.detail = "every host of metric " + m.name + " is skipped";
      return r;
    }
    std::sort(hosts.begin(), hosts.end(), worse);
    const std::size_t ignore = std::min(m.ignore_hosts, hosts.size() - 1);
    hosts.erase(hosts.begin(), hosts.begin() + static_cast<std::ptrdiff_t>(ignore));
  }
  const Judged& w = hosts.front();
  r.host = w.sample->host;
  r.value = w.value;
  r.detail = w.detail;
  if (w.bad) {
    r.over = true;
    r.reason = w.reason;
  } else {
    r.over = w.value > threshold;
    r.reason = r.over ? "threshold_exceeded" : "ok";
  }
  return r;
}

// How far a metric is towards (or past) its threshold: a bad sample is the worst there is.
double severity(const ThrottleMetricResult& r) {
  if (r.over && r.reason != "threshold_exceeded") return kInf;
  if (r.threshold > 0) return r.value / r.threshold;
  return r.value > r.threshold ? kInf : 0;
}

const ThrottleAppRule* rule_of(const std::map<std::string, ThrottleAppRule, std::less<>>& rules,
                               std::string_view app) {
  auto it = rules.find(app);
  return it == rules.end() ? nullptr : &it->second;
}

}  // namespace

std::string app_name_error(std::string_view app) {
  if (app.empty()) return "app: must name an app";
  if (app.size() > kMaxAppBytes)
    return "app: is " + std::to_string(app.size()) + " bytes; at most " +
           std::to_string(kMaxAppBytes);
  if (const std::size_t bad = first_non_utf8(app); bad != std::string_view::npos)
    return "app: is not UTF-8 (byte " + std::to_string(bad) + ")";
  return {};
}

std::string_view to_string(ThrottleScope s) noexcept {
  switch (s) {
    case ThrottleScope::kSelf:
      return "self";
    case ThrottleScope::kShard:
      return "shard";
    case ThrottleScope::kDefault:
      break;
  }
  return "";
}

std::optional<ThrottleScope> parse_scope(std::string_view s) noexcept {
  if (s.empty()) return ThrottleScope::kDefault;
  if (s == "self") return ThrottleScope::kSelf;
  if (s == "shard") return ThrottleScope::kShard;
  return std::nullopt;
}

ThrottleResult throttle_check(const std::vector<ThrottleMetric>& metrics,
                              const std::map<std::string, ThrottleAppRule, std::less<>>& rules,
                              const ThrottleOptions& o, ThrottlerState& state,
                              const ThrottleCheck& check, std::string_view client, Nanos now) {
  ThrottleResult out;
  out.app = check.app.empty() ? o.default_app : std::string(check.app);
  const ThrottleScope scope =
      check.scope == ThrottleScope::kDefault ? o.default_scope : check.scope;
  out.scope = std::string(to_string(scope));
  out.recently_checked = state.last_check.count() != kNone && now - state.last_check <= o.recently;

  // 1. The app's rule: its own, else `all`'s, else the defaults. A name of several
  // ':'-separated parts (Vitess's "<uuid>:vreplication:online-ddl") is also each part: the rule
  // is the whole name's, else the first part's that has one; any part exempt or throttled
  // exempts or throttles it.
  const ThrottleAppRule* own = rule_of(rules, out.app);
  std::vector<const ThrottleAppRule*> parts;  // the parts' rules, in order (no whole name's)
  if (out.app.find(':') != std::string::npos)
    for (std::string_view rest = out.app; !rest.empty();) {
      const std::size_t colon = rest.find(':');
      const std::string_view part = rest.substr(0, colon);
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
      if (const ThrottleAppRule* r = part.empty() ? nullptr : rule_of(rules, part)) {
        parts.push_back(r);
        if (own == nullptr) own = r;
      }
    }
  const ThrottleAppRule* all = rule_of(rules, "all");
  const ThrottleAppRule* rule = own != nullptr ? own : all;
  std::vector<const ThrottleMetric*> set;
  if (rule == nullptr || rule->metrics.empty()) {
    for (const ThrottleMetric& m : metrics) set.push_back(&m);
  } else {
    for (const std::string& name : rule->metrics) {
      auto it = std::find_if(metrics.begin(), metrics.end(),
                             [&](const ThrottleMetric& m) { return m.name == name; });
      if (it == metrics.end()) {
        out.status = 404;
        out.reason = "unknown_metric";
        out.metric = name;
        out.message = "app " + out.app + " names metric '" + name + "', which is not configured";
        break;
      }
      set.push_back(&*it);
    }
  }

  if (out.status != 404) {
    // 3. Every metric of the set, in the scope asked.
    for (const ThrottleMetric* m : set) {
      double threshold = m->threshold;
      if (rule != nullptr) {
        auto t = rule->thresholds.find(m->name);
        if (t != rule->thresholds.end()) threshold = t->second;
      }
      if (check.threshold > 0) threshold = check.threshold;
      out.metrics.push_back(
          evaluate(*m, threshold, scope, now, check.interval_in_force, check.skipped_hosts));
    }
    const ThrottleMetricResult* decided = nullptr;
    for (const ThrottleMetricResult& r : out.metrics)
      if (decided == nullptr || severity(r) > severity(*decided)) decided = &r;
    if (decided != nullptr) {
      out.metric = decided->name;
      out.value = decided->value;
      out.threshold = decided->threshold;
    }
    const bool over = decided != nullptr && decided->over;
    const auto throttles = [&](const ThrottleAppRule* r) {
      return r != nullptr && now < r->throttled_until && check.random < r->ratio;
    };
    const bool throttled_now =
        throttles(own) || throttles(all) || std::any_of(parts.begin(), parts.end(), throttles);
    const bool exempt =
        (own != nullptr && own->exempt) ||
        std::any_of(parts.begin(), parts.end(), [](const ThrottleAppRule* r) { return r->exempt; });
    if (exempt) {
      out.reason = "exempt";  // 2.
      out.message = "app " + out.app + " is exempt";
    } else if (over) {
      out.status = 429;  // 4.
      out.reason = decided->reason;
      out.message =
          decided->reason == "threshold_exceeded"
              ? "metric " + decided->name + " is " + std::to_string(decided->value) + " on " +
                    decided->host + ", over its threshold " + std::to_string(decided->threshold)
              : "metric " + decided->name + " counts as over (fail closed): " + decided->detail;
    } else if (throttled_now) {
      out.status = 417;  // 5.
      out.reason = "app_throttled";
      out.message = "app " + out.app + " is throttled";
    } else if (check.low_priority && state.last_normal_refusal.count() != kNone &&
               now - state.last_normal_refusal < o.low_priority_hold) {
      out.status = 429;  // 6.
      out.reason = "low_priority";
      out.message = "low priority: a normal-priority check was refused " +
                    seconds_text(now - state.last_normal_refusal) + " ago";
    } else {
      out.reason = "ok";
    }
  }

  // The record: what the audit and rules 5-6 read.
  state.last_check = now;
  if (out.status == 429 || out.status == 417) {
    state.last_refusal = now;
    if (!check.low_priority) state.last_normal_refusal = now;
  }
  auto it = state.apps.find(out.app);
  if (it == state.apps.end()) {
    const std::string name =
        state.apps.size() < o.max_apps && app_name_error(out.app).empty() ? out.app : "(other)";
    it = state.apps.try_emplace(name).first;
  }
  ThrottleAppStats& a = it->second;
  ++a.checks;
  if (out.status != 200) ++a.refused;
  a.last_status = out.status;
  a.last_response_code = vitess_response_code(out.status, out.reason);
  if (a.first_check.count() == kNone) a.first_check = now;
  a.last_check = now;
  a.last_client = std::string(client);
  return out;
}

ThrottleMetricResult judge_metric(const ThrottleMetric& m, double threshold, ThrottleScope scope,
                                  Nanos now, Nanos in_force,
                                  const std::map<std::string, Nanos, std::less<>>* skipped) {
  return evaluate(m, threshold, scope, now, in_force, skipped);
}

int vitess_response_code(unsigned status, std::string_view reason) noexcept {
  switch (status) {
    case 200:
      return 1;
    case 417:
      return 3;
    case 404:
      return 4;
    case 429:
      return reason == "threshold_exceeded" || reason == "low_priority" ? 2 : 5;
    default:
      return 0;
  }
}

void audit_load(const ThrottleMetric& m, const ThrottlerState& state, Nanos window, Nanos now,
                LoadAudit& audit) {
  const ThrottleMetricResult r =
      evaluate(m, m.threshold, ThrottleScope::kShard, now, Nanos{0}, nullptr);
  const bool over = r.reason == "threshold_exceeded";
  if (!over) {
    audit.over_since = Nanos{kNone};
  } else if (audit.over_since.count() == kNone) {
    audit.over_since = now;
  }
  const bool held_back = state.last_refusal.count() != kNone && now - state.last_refusal < window;
  const bool unexplained = over && now - audit.over_since >= window && !held_back;
  if (audit.unexplained && unexplained && audit.last_audit.count() != kNone)
    audit.unexplained_for += now - audit.last_audit;
  if (unexplained && !audit.unexplained) ++audit.episodes;
  audit.unexplained = unexplained;
  audit.last_audit = now;
}

Nanos probe_interval(Nanos last_check, Nanos now, Nanos fast, Nanos dormant,
                     Nanos idle_after) noexcept {
  if (last_check.count() == kNone || now - last_check > idle_after) return dormant;
  return fast;
}

}  // namespace sluice
