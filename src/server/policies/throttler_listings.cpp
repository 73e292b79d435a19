// throttler_listings.cpp: what a throttler policy shows (throttler_policy.h): its listings and
// freno's, Vitess's /throttler/status, describe() and its metrics.
#include "server/policies/throttler_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <utility>

#include "sluice/core/clock.h"

namespace sluice::server::throttler_detail {
namespace {

// The address in a transport's peer ("ip:port", "[ip6]:port"), without the port; anything
// else (a transport's name) as it is.
std::string_view address_of(std::string_view peer) {
  if (peer.size() > 2 && peer.front() == '[') {
    const auto close = peer.find(']');
    return close == std::string_view::npos ? peer : peer.substr(1, close - 1);
  }
  const auto colon = peer.find(':');
  return colon != std::string_view::npos && colon == peer.rfind(':') ? peer.substr(0, colon) : peer;
}

// Unix time in milliseconds as RFC 3339 in UTC, "2026-11-27T20:00:00.125Z".
std::string rfc3339_utc(std::int64_t unix_ms) {
  const std::int64_t s = unix_ms >= 0 ? unix_ms / 1000 : (unix_ms - 999) / 1000;
  const auto t = static_cast<std::time_t>(s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
                              tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                              tm.tm_sec, static_cast<int>(unix_ms - s * 1000));
  return std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
}

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

double secs(Nanos d) { return std::chrono::duration<double>(d).count(); }

// A client address without its port ("10.0.0.7:51500" -> "10.0.0.7", "[::1]:80" -> "::1"): the
// port changes with every connection.
std::string host_of(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;
  return address.substr(0, colon);
}

}  // namespace

nlohmann::json ThrottlerPolicy::rules_json() const {
  const Nanos now = clock_.now();
  const std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [app, r] : rules_) {
    const bool throttled = now < r.throttled_until;
    if (!throttled && !r.exempt && r.metrics.empty() && r.thresholds.empty()) continue;
    nlohmann::json j = {{"exempt", r.exempt}};
    if (throttled) {
      j["throttled_seconds_left"] = secs(r.throttled_until - now);
      j["ratio"] = r.ratio;
    }
    if (!r.metrics.empty()) j["metrics"] = r.metrics;
    if (!r.thresholds.empty()) j["thresholds"] = r.thresholds;
    out[app] = std::move(j);
  }
  return out;
}

nlohmann::json ThrottlerPolicy::unexplained_json() const {
  const std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t i = 0; i < metrics_.size(); ++i)
    out[metrics_[i].name] = {{"now", audits_[i].unexplained},
                             {"episodes", audits_[i].episodes},
                             {"seconds", secs(audits_[i].unexplained_for)}};
  return out;
}

void ThrottlerPolicy::freno_throttled_apps(nlohmann::json& out, const std::string& suffix) const {
  const Nanos now = clock_.now();
  const std::int64_t now_ms = unix_ms_now();
  const std::lock_guard lock(mu_);
  for (const auto& [app, r] : rules_) {
    if (!(now < r.throttled_until)) continue;
    const std::int64_t at_ms =
        now_ms + std::chrono::ceil<std::chrono::milliseconds>(r.throttled_until - now).count();
    out[app + suffix] = {{"ExpireAt", rfc3339_utc(at_ms)}, {"Ratio", r.ratio}};
  }
}

void ThrottlerPolicy::freno_recent_apps(nlohmann::json& out, std::int64_t last_minutes) const {
  const Nanos now = clock_.now();
  const std::int64_t now_s = unix_ms_now() / 1000;
  const std::lock_guard lock(mu_);
  for (const auto& [name, a] : state_.apps) {
    const std::int64_t ago_s = std::chrono::floor<std::chrono::seconds>(now - a.last_check).count();
    const std::int64_t minutes = ago_s / 60;
    if (last_minutes > 0 && minutes > last_minutes) continue;
    out[name + "/" + std::string(address_of(a.last_client))] = {{"CheckedAtEpoch", now_s - ago_s},
                                                                {"MinutesSinceChecked", minutes}};
  }
}

void ThrottlerPolicy::freno_skipped_hosts(nlohmann::json& out) const {
  const Nanos now = clock_.now();
  const std::int64_t now_ms = unix_ms_now();
  const std::lock_guard lock(mu_);
  for (const auto& [host, until] : skipped_hosts_)
    if (now < until)
      out[host] =
          rfc3339_utc(now_ms + std::chrono::ceil<std::chrono::milliseconds>(until - now).count());
}

nlohmann::json ThrottlerPolicy::recent_apps_json() const {
  const Nanos now = clock_.now();
  const std::lock_guard lock(mu_);
  std::vector<std::pair<Nanos, std::string>> order;
  for (const auto& [name, a] : state_.apps) order.emplace_back(a.last_check, name);
  std::sort(order.rbegin(), order.rend());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [at, name] : order) {
    const ThrottleAppStats& a = state_.apps.at(name);
    const double span = secs(a.last_check - a.first_check);
    out.push_back({{"app", name},
                   {"checks", a.checks},
                   {"refused", a.refused},
                   {"seconds_since_last_check", secs(now - at)},
                   {"checks_per_second", span > 0 ? static_cast<double>(a.checks - 1) / span : 0.0},
                   {"last_client", a.last_client}});
  }
  return out;
}

nlohmann::json ThrottlerPolicy::vitess_status_json() const {
  const Nanos now = clock_.now();
  const std::int64_t now_ms = unix_ms_now();
  const auto wall = [&](Nanos at) {
    return rfc3339_utc(now_ms - std::chrono::floor<std::chrono::milliseconds>(now - at).count());
  };
  const std::lock_guard lock(mu_);
  const Nanos in_force = interval_at(now);
  nlohmann::json aggregated = nlohmann::json::object();
  nlohmann::json thresholds = nlohmann::json::object();
  nlohmann::json health = nlohmann::json::object();
  for (std::size_t i = 0; i < metrics_.size(); ++i) {
    const ThrottleMetric& m = metrics_[i];
    thresholds[m.name] = m.threshold;
    for (const ThrottleScope scope : {ThrottleScope::kSelf, ThrottleScope::kShard}) {
      const ThrottleMetricResult r =
          judge_metric(m, m.threshold, scope, now, in_force, &skipped_hosts_);
      nlohmann::json v = nlohmann::json::object();
      if (r.reason == "ok" || r.reason == "threshold_exceeded")
        v["Value"] = r.value;
      else
        v["Error"] = r.detail.empty() ? r.reason : r.detail;
      aggregated[std::string(to_string(scope)) + "/" + m.name] = v;
      if (i == 0) aggregated[std::string(to_string(scope))] = std::move(v);
    }
    if (last_healthy_[i].count() != INT64_MIN)
      health[m.name] = {{"LastHealthyAt", wall(last_healthy_[i])},
                        {"SecondsSinceLastHealthy",
                         std::chrono::floor<std::chrono::seconds>(now - last_healthy_[i]).count()}};
  }
  if (!metrics_.empty()) thresholds["default"] = metrics_.front().threshold;
  nlohmann::json throttled = nlohmann::json::array();
  nlohmann::json checked_metrics = nlohmann::json::object();
  for (const auto& [app, r] : rules_) {
    const bool active = now < r.throttled_until;
    if (active || r.exempt)
      throttled.push_back(
          {{"AppName", app},
           {"ExpireAt", active ? wall(r.throttled_until) : std::string("0001-01-01T00:00:00Z")},
           {"Ratio", active ? r.ratio : 0.0},
           {"Exempt", r.exempt}});
    if (!r.metrics.empty()) {
      std::string joined;
      for (const std::string& m : r.metrics) joined += (joined.empty() ? "" : ",") + m;
      checked_metrics[app] = joined;
    }
  }
  nlohmann::json recent = nlohmann::json::object();
  for (const auto& [name, a] : state_.apps)
    recent[name] = {{"AppName", name},
                    {"CheckedAt", wall(a.last_check)},
                    {"StatusCode", a.last_status},
                    {"ResponseCode", a.last_response_code}};
  return {{"Keyspace", ""},
          {"Shard", spec_.shard},
          {"IsLeader", true},
          {"IsOpen", true},
          {"IsEnabled", true},
          {"IsDormant", in_force != spec_.fast_interval},
          {"RecentlyChecked", state_.last_check.count() != INT64_MIN &&
                                  now - state_.last_check < spec_.options.recently},
          {"Query", ""},
          {"CustomQuery", ""},
          {"Threshold", metrics_.empty() ? 0.0 : metrics_.front().threshold},
          {"MetricNameUsedAsDefault", metrics_.empty() ? "" : metrics_.front().name},
          {"AggregatedMetrics", std::move(aggregated)},
          {"MetricsThresholds", std::move(thresholds)},
          {"MetricsHealth", std::move(health)},
          {"ThrottledApps", std::move(throttled)},
          {"AppCheckedMetrics", std::move(checked_metrics)},
          {"RecentApps", std::move(recent)}};
}

void ThrottlerPolicy::describe(nlohmann::json& j, PolicyInfo& /*info*/) const {
  if (shared_ != nullptr) {
    const SharedRuleMirror::Health h = shared_->health();
    nlohmann::json r = {{"coordinator", spec_.shared_rules},
                        {"backend", shared_->backend()},
                        {"reads", h.reads},
                        {"read_failures", h.failures}};
    if (h.last_read)
      r["seconds_since_read"] = secs(std::chrono::system_clock::now() - *h.last_read);
    if (!h.last_error.empty()) r["last_error"] = h.last_error;
    j["shared_rules"] = std::move(r);
  }
  const Nanos now = clock_.now();
  const std::lock_guard lock(mu_);
  j["shard"] = spec_.shard;
  j["probing"] = interval_at(now) == spec_.fast_interval ? "fast" : "dormant";
  nlohmann::json metrics = nlohmann::json::array();
  for (const ThrottleMetric& m : metrics_) {
    nlohmann::json hosts = nlohmann::json::array();
    for (const ThrottleSample& s : m.hosts) {
      nlohmann::json h = {{"host", s.host}, {"value", s.value}};
      if (s.taken_at.count() != INT64_MIN) h["age_seconds"] = secs(now - s.taken_at);
      if (!s.error.empty()) h["error"] = s.error;
      hosts.push_back(std::move(h));
    }
    metrics.push_back({{"name", m.name},
                       {"threshold", m.threshold},
                       {"hosts", hosts},
                       {"unexplained_load", audits_[&m - metrics_.data()].unexplained}});
  }
  j["metrics"] = std::move(metrics);
  nlohmann::json apps = nlohmann::json::object();
  for (const auto& [name, a] : state_.apps)
    apps[name] = {{"checks", a.checks},
                  {"refused", a.refused},
                  {"last_client", a.last_client},
                  {"seconds_since_last_check", secs(now - a.last_check)}};
  j["apps"] = std::move(apps);
}

void ThrottlerPolicy::metrics(std::vector<MetricFamily>& out) const {
  if (shared_ != nullptr) {
    const SharedRuleMirror::Health h = shared_->health();
    MetricFamily failures{"sluice_throttler_shared_rules_read_failures_total",
                          "Reads of the shared rules' table that failed (the last copy read "
                          "stays in force)",
                          MetricType::Counter,
                          {}};
    failures.metric.emplace_back().counter.value = static_cast<double>(h.failures);
    out.push_back(std::move(failures));
    if (h.last_read) {
      MetricFamily age{"sluice_throttler_shared_rules_age_seconds",
                       "Seconds since the shared rules' table was last read",
                       MetricType::Gauge,
                       {}};
      age.metric.emplace_back().gauge.value = secs(std::chrono::system_clock::now() - *h.last_read);
      out.push_back(std::move(age));
    }
  }
  const Nanos now = clock_.now();
  const std::lock_guard lock(mu_);
  MetricFamily checks{"sluice_throttler_checks_total",
                      "Throttler checks by app (bounded)",
                      MetricType::Counter,
                      {}};
  MetricFamily refused{"sluice_throttler_refused_total",
                       "Throttler checks refused by app (bounded)",
                       MetricType::Counter,
                       {}};
  MetricFamily last{"sluice_throttler_seconds_since_check",
                    "Seconds since an app last checked (bounded)",
                    MetricType::Gauge,
                    {}};
  MetricFamily client{"sluice_throttler_app_client",
                      "1 for the address an app last checked from (the host, bounded: one per "
                      "app)",
                      MetricType::Gauge,
                      {}};
  for (const auto& [name, a] : state_.apps) {
    ClientMetric c;
    c.label = {{"app", name}};
    c.counter.value = static_cast<double>(a.checks);
    checks.metric.push_back(c);
    c.counter.value = static_cast<double>(a.refused);
    refused.metric.push_back(c);
    ClientMetric g;
    g.label = {{"app", name}};
    g.gauge.value = secs(now - a.last_check);
    last.metric.push_back(g);
    g.label.push_back({"client", host_of(a.last_client)});
    g.gauge.value = 1;
    client.metric.push_back(std::move(g));
  }
  MetricFamily value{"sluice_throttler_metric_value",
                     "The latest sample of a throttler metric",
                     MetricType::Gauge,
                     {}};
  MetricFamily age{"sluice_throttler_sample_age_seconds",
                   "How old a throttler metric's latest sample is",
                   MetricType::Gauge,
                   {}};
  for (const ThrottleMetric& m : metrics_)
    for (const ThrottleSample& s : m.hosts) {
      if (s.taken_at.count() == INT64_MIN) continue;
      ClientMetric c;
      c.label = {{"metric", m.name}, {"host", s.host}};
      c.gauge.value = s.error.empty() ? s.value : std::nan("");
      value.metric.push_back(c);
      c.gauge.value = secs(now - s.taken_at);
      age.metric.push_back(std::move(c));
    }
  MetricFamily unexplained{"sluice_throttler_unexplained_load",
                           "1 while a metric is over its threshold and no check was refused "
                           "for unexplained_after: load from work that does not check",
                           MetricType::Gauge,
                           {}};
  MetricFamily unexplained_seconds{"sluice_throttler_unexplained_load_seconds_total",
                                   "Time a metric's load went unexplained by refused checks",
                                   MetricType::Counter,
                                   {}};
  MetricFamily threshold{"sluice_throttler_metric_threshold",
                         "A throttler metric's threshold (an app's rule may set its own)",
                         MetricType::Gauge,
                         {}};
  for (std::size_t i = 0; i < metrics_.size(); ++i) {
    ClientMetric c;
    c.label = {{"metric", metrics_[i].name}};
    c.gauge.value = metrics_[i].threshold;
    threshold.metric.push_back(c);
    c.gauge.value = audits_[i].unexplained ? 1 : 0;
    unexplained.metric.push_back(c);
    ClientMetric t;
    t.label = {{"metric", metrics_[i].name}};
    t.counter.value = secs(audits_[i].unexplained_for);
    unexplained_seconds.metric.push_back(std::move(t));
  }
  out.push_back(std::move(checks));
  out.push_back(std::move(refused));
  out.push_back(std::move(last));
  out.push_back(std::move(client));
  out.push_back(std::move(unexplained));
  out.push_back(std::move(unexplained_seconds));
  out.push_back(std::move(value));
  out.push_back(std::move(threshold));
  out.push_back(std::move(age));
}

}  // namespace sluice::server::throttler_detail
