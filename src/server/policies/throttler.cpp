// The throttler kind: the collaborative check API that batch jobs ask before each chunk of work
// (sluice/throttler.h decides), over metrics its probes sample in loops of their own (one
// per metric), so a check is a lookup and never waits on a database.
//
//   kind: throttler
//   shard: main              # what a check's `shard=` (or freno's store name) selects; default:
//                            #   the policy's name. A check naming no shard gets the first
//                            #   throttler of the config.
//   scope: shard             # the default scope: shard (the worst host) or self (the first)
//   default_app: default     # the app of a check that names none
//   fast_interval: 100ms     # sampling while checks come
//   dormant_interval: 5s     # sampling once no check came for idle_after (and before any)
//   idle_after: 10s
//   stale_intervals: 5       # a sample older than this many of its interval counts as over;
//                            #   a probe's timeout must keep samples fresh (metric_probe())
//   low_priority_hold: 1s    # p=low is refused this long after a normal app was refused
//   unexplained_after: 10s   # a metric over its threshold this long while no check was
//                            #   refused: load no checking app explains (the audit's signal,
//                            #   sluice_throttler_unexplained_load{metric}); longer than a
//                            #   client's longest backoff
//   metrics:                 # at least one
//     load:
//       probe: loadavg       # the host's 1-minute load average (/proc/loadavg)
//       threshold: 8         # over it: 429 (> 0)
//       ignore_hosts: 0      # shard scope: the worst hosts not counted
//     api:
//       probe: policy        # a sluice policy's utilisation: in flight / limit (an adaptive,
//       policy: search       #   fleet or other admit-family policy with one limit)
//       threshold: 0.9
//     queue:
//       probe: command       # a command that prints a number (its first word), run by
//       command: "cat /var/run/queue-depth"   # /bin/sh -c; non-zero exit, no number or
//       timeout: 200ms       # running past `timeout` (then killed) is a failed probe (default:
//                            #   1s or the longest that keeps samples fresh, if less)
//       threshold: 1000
//     lag:
//       probe: mysql_heartbeat   # or mysql_lag (Seconds_Behind_Source/_Master),
//       hosts: [10.0.0.2:3306, 10.0.0.3]   # mysql_threads_running; every host is sampled
//       user: throttler          # (REPLICATION CLIENT, SELECT on the heartbeat table)
//       password_env: THROTTLER_DB_PASSWORD   # or password: ...
//       heartbeat_table: meta.heartbeat       # pt-heartbeat's table; heartbeat_utc: true
//       timeout: 200ms           # per host and sample: connect and query, in all
//       threshold: 1             # seconds
//     pg:
//       probe: postgres_lag      # or postgres_active (backends running a query)
//       hosts: [10.0.0.4:5432]
//       conninfo: "user=throttler dbname=postgres sslmode=require"   # keyword=value
//       threshold: 1
//     cache:
//       probe: redis             # an INFO field, or replica_offset_lag (bytes, on a primary)
//       hosts: [10.0.0.5:6379]
//       field: used_memory
//       threshold: 4e9
//     queue_http:
//       probe: http              # GET; a 2xx body that starts with a number
//       url: http://127.0.0.1:9000/queue-depth
//       threshold: 1000
// What each probe measures, exactly: backends/probes/probe.h.
//   apps:                    # rules by app name; `all` applies to apps without their own
//                            # (metrics and thresholds: `all` cannot be exempt)
//     gh-ost:
//       metrics: [load]      # default: every metric
//       thresholds: {load: 4}
//     rescue:
//       exempt: true         # passes whatever the metrics say
//
// Routes (GET and HEAD; HEAD answers the status alone, as gh-ost's --throttle-http polls it):
//   /throttler/check?app=A[&scope=self|shard][&shard=S][&p=low]   the Vitess shape
//   /throttler/check-self?app=A[...]                               scope self
//   /check/{app}/{store_type}/{store_name}                         the freno shape (store_name
//                                                                  is the shard)
// Status: 200 ok, 429 over a threshold (or a probe failed, or its sample is stale: fail
// closed), 417 the app is throttled, 404 an unknown metric or shard, 400 a malformed argument;
// the JSON's StatusCode is the same and ResponseCode Vitess's (sluice/throttler.h:
// vitess_response_code).
//
// Admin verbs (GET or POST; 401 without `Authorization: Bearer <server.admin_token>` when the
// server has one), each taking `shard=` too and answering the app's rule now:
//   /throttler/throttle-app?app=A[&duration=1h][&ratio=1]   refuse A (417) with that
//                                                           probability until the time is up
//   /throttler/unthrottle-app?app=A
//   /throttler/exempt-app?app=A[&exempt=true|false]
//   /throttler/app-rule?app=A[&metrics=lag,load][&thresholds=lag:2,load:8][&clear=true]
//                            the app's metric set and thresholds (over the config's; a
//                            threshold of 0, or metrics= empty, drops the run-time one)
//   /throttle-app/A[/ttl/MINUTES][/ratio/R][?store_name=S], /unthrottle-app/A[?store_name=S]
//                            the freno shape, also HEAD: store S's throttler, or without it
//                            every one; no TTL or 0: a year (freno: never expires); no ratio:
//                            the app's current one, else 1; ratio 0 lifts it; answered
//                            {"StatusCode":200,"Message":"OK"}
//   /skip-host/H[/ttl/MINUTES], /recover-host/H   freno's: host H's samples left out of every
//                            metric's shard scope (no TTL or 0: an hour), kept in memory
// `app=all` throttles every app (an exempt one still passes). The rules are kept in the
// server's state file (server.state_file), each expiry as wall-clock time, so a restart keeps
// the time left (each server its own file); or, with `shared_rules: COORDINATOR`, in that
// coordinator's table for the shard (sluice/shared_rules.h), skipped hosts too, which every
// server naming it reads every shared_rules_interval (server/shared_rule_mirror.h): a verb is
// answered once the coordinator holds the change. Listings (GET, no token):
// /throttler/status (Vitess's ThrottlerStatus), /throttler/throttled-apps (every app with a
// rule) and /throttler/recent-apps (the apps that checked, most recent first, with counts, rate
// and last client address; and per metric whether its load is unexplained by refused checks,
// sluice/throttler.h: audit_load); in
// freno's shapes /throttled-apps, /recent-apps[/MINUTES], /skipped-hosts, and /lb-check,
// /_ping, /status, /leader-check (HEAD too).
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "backends/probes/probe.h"
#include "server/json_text.h"
#include "server/proto_wire.h"
#include "server/registry.h"
#include "server/shared_rule_mirror.h"
#include "sluice/config.h"
#include "sluice/shared_rules.h"
#include "sluice/text.h"
#include "sluice/throttler.h"

namespace sluice::server {
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

using probes::Probe;

// How a metric's probe is made (the server's policy directory: for a policy probe).
using MakeProbe =
    std::function<std::unique_ptr<Probe>(const std::shared_ptr<const PolicyDirectory>&)>;

struct MetricSpec {
  std::string name;
  double threshold = 0;
  std::size_t ignore_hosts = 0;
  MakeProbe make;
};

struct ThrottlerSpec final : PolicyBody {
  std::string shard;
  ThrottleOptions options;
  Nanos fast_interval = std::chrono::milliseconds(100);
  Nanos dormant_interval = std::chrono::seconds(5);
  Nanos idle_after = std::chrono::seconds(10);
  Nanos unexplained_after = std::chrono::seconds(10);
  double stale_intervals = ThrottleMetric{}.stale_intervals;
  std::vector<MetricSpec> metrics;
  std::map<std::string, ThrottleAppRule, std::less<>> apps;
  // The coordinator whose table holds the rules set at run time, shared by every server that
  // names it (empty: this server's own, in its state file), and how often it is read.
  std::string shared_rules;
  Nanos shared_rules_interval = std::chrono::seconds(1);
};

// Whether `metrics` has one named `name`.
bool has_metric(const std::vector<MetricSpec>& metrics, std::string_view name) {
  return std::any_of(metrics.begin(), metrics.end(),
                     [&](const MetricSpec& m) { return m.name == name; });
}

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

// A sluice policy's utilisation, in flight / limit, looked up by name among the policies the
// server serves now (so a reload that replaces it is followed); the host is its name.
class PolicyProbe final : public Probe {
 public:
  PolicyProbe(std::shared_ptr<const PolicyDirectory> directory, std::string policy)
      : directory_(std::move(directory)), policy_(std::move(policy)) {}

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = policy_;
    const std::shared_ptr<Policy> p = directory_ ? directory_->find(policy_) : nullptr;
    if (p == nullptr) {
      s.error = "no policy named '" + policy_ + "' is serving";
      return;
    }
    if (p->admit_family() == nullptr) {
      s.error = "policy " + policy_ + " is a " + p->kind() + " policy: it has no calls in flight";
      return;
    }
    const PolicyInfo info = p->info();
    if (info.limit == 0) {
      s.error = "policy " + policy_ + " has no single limit";
      return;
    }
    s.value = static_cast<double>(info.in_flight) / static_cast<double>(info.limit);
    s.error.clear();
  }

 private:
  const std::shared_ptr<const PolicyDirectory> directory_;
  const std::string policy_;
};

class ThrottlerPolicy final : public Policy {
 public:
  // `shared`: the coordinator's table of spec.shared_rules (null: the state file keeps the rules).
  ThrottlerPolicy(const BuildContext& c, const ThrottlerSpec& spec,
                  std::shared_ptr<SharedRules> shared)
      : Policy(c.name, "throttler", ""),
        clock_(c.clock),
        spec_(spec),
        directory_(c.directory),
        notices_(c.notices),
        state_store_(c.runtime_state()),
        rules_(spec.apps),
        rng_(std::random_device{}()) {
    if (shared == nullptr) load_runtime_rules();
    for (const MetricSpec& m : spec_.metrics) {
      ThrottleMetric tm;
      tm.name = m.name;
      tm.threshold = m.threshold;
      tm.stale_intervals = spec_.stale_intervals;
      tm.ignore_hosts = m.ignore_hosts;
      metrics_.push_back(std::move(tm));
      probes_.push_back(m.make(c.directory));
      last_sampled_.push_back(Nanos{INT64_MIN});
      last_healthy_.push_back(Nanos{INT64_MIN});
      audits_.emplace_back();
      last_.push_back(Last::kOk);
    }
    for (std::size_t i = 0; i < metrics_.size(); ++i)
      start_loop(c.clock, [this, i](Nanos now) { return tick(i, now); });
    // Last: its first read applies what the coordinator holds, through shared_changed().
    if (shared != nullptr)
      shared_ = std::make_unique<SharedRuleMirror>(
          std::move(shared), spec_.shard, spec_.shared_rules_interval, kSharedTimeout,
          [this](const std::string& key, const SharedRuleMirror::Entry* e) {
            shared_changed(key, e);
          });
  }
  ~ThrottlerPolicy() override { retire(); }
  ThrottlerPolicy(const ThrottlerPolicy&) = delete;
  ThrottlerPolicy& operator=(const ThrottlerPolicy&) = delete;

  [[nodiscard]] const std::string& shard() const noexcept { return spec_.shard; }

  // ---- rules set at run time (admin), kept in the server's state file ----

  // Each verb answers `done` once: at once for bad input, else when the state file holds the
  // change (the rule applies from then on). A transport thread never waits for the disk.
  using Done = RuntimeStateStore::Done;

  // Throttles `app` for `duration` with probability `ratio` (an app "all": every app); no ratio:
  // the one it is throttled with now (freno's rule), else 1.
  void throttle(const std::string& app, Nanos duration, std::optional<double> ratio, Done done) {
    if (Status s = check_app(app); !s.ok()) return done(std::move(s));
    if (ratio && !(*ratio > 0 && *ratio <= 1)) return done(bad("ratio: must be in (0, 1]"));
    if (duration <= Nanos{0} || duration > kMaxThrottle)
      return done(bad("duration: must be positive and at most a year"));
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    const std::int64_t now_ms = unix_ms_now();
    if (!ratio) ratio = r.until_unix_ms > now_ms ? r.ratio : 1.0;
    r.until_unix_ms = now_ms + std::chrono::ceil<std::chrono::milliseconds>(duration).count();
    r.ratio = *ratio;
    save(app, r, std::move(done));
  }
  // The longest throttle: what freno's "no TTL" (never expires) is here.
  static constexpr Nanos longest_throttle() { return kMaxThrottle; }
  void unthrottle(const std::string& app, Done done) {
    if (Status s = check_app(app); !s.ok()) return done(std::move(s));
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    r.until_unix_ms = 0;
    r.ratio = 1;
    save(app, r, std::move(done));
  }
  void exempt(const std::string& app, bool exempt, Done done) {
    if (Status s = check_app(app); !s.ok()) return done(std::move(s));
    if (app == "all") return done(bad("app: 'all' cannot be exempt (name the apps)"));
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    r.exempt = exempt;
    save(app, r, std::move(done));
  }
  // Sets `app`'s metric set (empty: every metric) and thresholds (each over the config's; a
  // threshold of 0 drops the run-time one) at run time; `clear`: drops both first.
  void set_rule(const std::string& app, const std::optional<std::vector<std::string>>& metrics,
                const std::map<std::string, double>& thresholds, bool clear, Done done) {
    if (Status s = check_app(app); !s.ok()) return done(std::move(s));
    const auto known = [&](const std::string& m) { return has_metric(spec_.metrics, m); };
    if (metrics)
      for (const std::string& m : *metrics)
        if (!known(m))
          return done(bad("metrics: '" + m + "' is not one of the throttler's metrics"));
    for (const auto& [m, t] : thresholds) {
      if (!known(m))
        return done(bad("thresholds: '" + m + "' is not one of the throttler's metrics"));
      if (!(t >= 0) || !std::isfinite(t))
        return done(bad("thresholds: " + m + " must be a number > 0 (0 drops it)"));
    }
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    if (clear) {
      r.metrics.clear();
      r.thresholds.clear();
    }
    if (metrics) r.metrics = *metrics;
    for (const auto& [m, t] : thresholds) {
      if (t == 0)
        r.thresholds.erase(m);
      else
        r.thresholds[m] = t;
    }
    save(app, r, std::move(done));
  }
  // The apps with a rule (config or run time): throttled until when, ratio, exempt.
  nlohmann::json rules_json() const {
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
  // Per metric: whether load over its threshold is unexplained now (no check refused), how
  // often it became so and for how long in all.
  nlohmann::json unexplained_json() const {
    const std::lock_guard lock(mu_);
    nlohmann::json out = nlohmann::json::object();
    for (std::size_t i = 0; i < metrics_.size(); ++i)
      out[metrics_[i].name] = {{"now", audits_[i].unexplained},
                               {"episodes", audits_[i].episodes},
                               {"seconds", secs(audits_[i].unexplained_for)}};
    return out;
  }
  // freno's /throttled-apps: each app throttled now under `app + suffix`, {"ExpireAt": the
  // wall-clock expiry (RFC 3339, UTC), "Ratio"}.
  void freno_throttled_apps(nlohmann::json& out, const std::string& suffix) const {
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
  // freno's /recent-apps: each app that checked within `last_minutes` (0: any), under
  // "app/<its last client's address>", {"CheckedAtEpoch" (seconds), "MinutesSinceChecked"}.
  void freno_recent_apps(nlohmann::json& out, std::int64_t last_minutes) const {
    const Nanos now = clock_.now();
    const std::int64_t now_s = unix_ms_now() / 1000;
    const std::lock_guard lock(mu_);
    for (const auto& [name, a] : state_.apps) {
      const std::int64_t ago_s =
          std::chrono::floor<std::chrono::seconds>(now - a.last_check).count();
      const std::int64_t minutes = ago_s / 60;
      if (last_minutes > 0 && minutes > last_minutes) continue;
      out[name + "/" + std::string(address_of(a.last_client))] = {{"CheckedAtEpoch", now_s - ago_s},
                                                                  {"MinutesSinceChecked", minutes}};
    }
  }

  // freno's skip-host: `host`'s samples are left out of the shard scope for `ttl` (kept in
  // memory, a restart forgets it; or in the shared rules' table). At most kMaxSkippedHosts at
  // once. `done` as the rule verbs'.
  void skip_host(const std::string& host, Nanos ttl, Done done) {
    if (std::string why = app_name_error(host); !why.empty())
      return done(bad("host" + why.substr(3)));
    const Nanos now = clock_.now();
    const auto too_many = [] {
      return bad("host: at most " + std::to_string(kMaxSkippedHosts) +
                 " hosts are skipped at once (recover some first)");
    };
    if (shared_ != nullptr) {
      if (!shared_->get(kHostKey + host) && shared_->count(kHostKey) >= kMaxSkippedHosts)
        return done(too_many());
      SharedRuleMirror::Entry e;
      e.has_deadline = true;
      e.deadline_unix_ms =
          unix_ms_now() + std::chrono::ceil<std::chrono::milliseconds>(ttl).count();
      e.drop_at_deadline = true;
      return shared_->put_async(kHostKey + host, std::move(e), kMaxSharedKeys, std::move(done));
    }
    {
      const std::lock_guard lock(mu_);
      std::erase_if(skipped_hosts_, [&](const auto& e) { return !(now < e.second); });
      if (!skipped_hosts_.contains(host) && skipped_hosts_.size() >= kMaxSkippedHosts)
        return done(too_many());
      skipped_hosts_[host] = now + ttl;
    }
    done(Status());
  }
  void recover_host(const std::string& host, Done done) {
    if (shared_ != nullptr) {
      if (std::string why = app_name_error(host); !why.empty())
        return done(bad("host" + why.substr(3)));
      return shared_->erase_async(kHostKey + host, std::move(done));
    }
    {
      const std::lock_guard lock(mu_);
      if (const auto it = skipped_hosts_.find(host); it != skipped_hosts_.end())
        skipped_hosts_.erase(it);
    }
    done(Status());
  }
  // freno's /skipped-hosts: each host skipped now, with its wall-clock end (RFC 3339, UTC).
  void freno_skipped_hosts(nlohmann::json& out) const {
    const Nanos now = clock_.now();
    const std::int64_t now_ms = unix_ms_now();
    const std::lock_guard lock(mu_);
    for (const auto& [host, until] : skipped_hosts_)
      if (now < until)
        out[host] =
            rfc3339_utc(now_ms + std::chrono::ceil<std::chrono::milliseconds>(until - now).count());
  }

  // The apps that checked, most recent first: the audit.
  nlohmann::json recent_apps_json() const {
    const Nanos now = clock_.now();
    const std::lock_guard lock(mu_);
    std::vector<std::pair<Nanos, std::string>> order;
    for (const auto& [name, a] : state_.apps) order.emplace_back(a.last_check, name);
    std::sort(order.rbegin(), order.rend());
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [at, name] : order) {
      const ThrottleAppStats& a = state_.apps.at(name);
      const double span = secs(a.last_check - a.first_check);
      out.push_back(
          {{"app", name},
           {"checks", a.checks},
           {"refused", a.refused},
           {"seconds_since_last_check", secs(now - at)},
           {"checks_per_second", span > 0 ? static_cast<double>(a.checks - 1) / span : 0.0},
           {"last_client", a.last_client}});
    }
    return out;
  }

  // Vitess's /throttler/status, its field names and shapes (ThrottlerStatus): what applies to a
  // sluice throttler is filled in (every server is its own leader, always open and enabled);
  // Keyspace, Query and CustomQuery are empty (sluice's metrics come from probes, not one query).
  // The first metric is the default one ("self", "shard", "default" keys).
  nlohmann::json vitess_status_json() const {
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
        health[m.name] = {
            {"LastHealthyAt", wall(last_healthy_[i])},
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

  // `threshold` > 0: the caller's own for every metric (freno's check-read).
  ThrottleResult check(std::string_view app, ThrottleScope scope, bool low_priority,
                       std::string_view client, double threshold = 0) {
    const Nanos now = clock_.now();
    bool was_dormant = false;
    ThrottleResult r;
    {
      const std::lock_guard lock(mu_);
      const Nanos in_force = interval_at(now);
      was_dormant = in_force != spec_.fast_interval;
      const double draw = std::uniform_real_distribution<double>(0, 1)(rng_);
      ThrottleCheck c{app, scope, low_priority, draw, threshold, in_force};
      if (!skipped_hosts_.empty()) c.skipped_hosts = &skipped_hosts_;
      r = throttle_check(metrics_, rules_, spec_.options, state_, c, client, now);
    }
    if (was_dormant) wake_loops();  // sample at the fast interval from now on
    return r;
  }

 protected:
  // A probe's command still running would hold a reload or SIGTERM up to its timeout.
  void on_retiring() noexcept override {
    for (const std::unique_ptr<Probe>& p : probes_) p->cancel();
  }

  void describe(nlohmann::json& j, PolicyInfo& /*info*/) const override {
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

  void metrics(std::vector<MetricFamily>& out) const override {
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
        age.metric.emplace_back().gauge.value =
            secs(std::chrono::system_clock::now() - *h.last_read);
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
    for (std::size_t i = 0; i < metrics_.size(); ++i) {
      ClientMetric c;
      c.label = {{"metric", metrics_[i].name}};
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
    out.push_back(std::move(age));
  }

 private:
  // With mu_ held.
  Nanos interval_at(Nanos now) const {
    return probe_interval(state_.last_check, now, spec_.fast_interval, spec_.dormant_interval,
                          spec_.idle_after);
  }

  // Samples metric `i` when it is due at the interval in force (the fast one after a failed
  // sample, so a probe that failed while dormant, or before the policies it reads were
  // published, is retried at once), outside the lock: a probe may take a while, and each
  // metric has its own loop, so a slow probe delays no other metric's samples. Returns when it
  // is due next. A sample is stamped with the time its probe started (the oldest its reading
  // can be) and the interval in force then.
  Nanos tick(std::size_t i, Nanos now) {
    Nanos interval;
    std::vector<ThrottleSample> hosts;
    {
      const std::lock_guard lock(mu_);
      interval = interval_at(now);
      const Nanos last = last_sampled_[i];
      const Nanos wait = last_[i] == Last::kOk       ? interval
                         : last_[i] == Last::kFailed ? std::min(interval, spec_.fast_interval)
                                                     : kBeforePublish;
      if (last.count() != INT64_MIN && last + wait > now) return last + wait;
      hosts = metrics_[i].hosts;
    }
    // Before the engine has published its first generation a policy probe cannot find the
    // policies it reads: a sample that started then and failed is retried a millisecond later
    // (right after the build), so the server's first check already sees a good one.
    const bool unpublished = directory_ != nullptr && !directory_->published();
    const Nanos started = clock_.now();
    probes_[i]->sample(hosts);
    bool failed = false;
    for (ThrottleSample& s : hosts) {
      s.taken_at = started;
      s.interval = interval;
      failed = failed || !s.error.empty();
    }
    const std::lock_guard lock(mu_);
    metrics_[i].hosts = std::move(hosts);
    const Nanos sampled = clock_.now();
    audit_load(metrics_[i], state_, spec_.unexplained_after, sampled, audits_[i]);
    if (!judge_metric(metrics_[i], metrics_[i].threshold, ThrottleScope::kShard, sampled, interval,
                      &skipped_hosts_)
             .over)
      last_healthy_[i] = sampled;
    last_sampled_[i] = started;
    last_[i] = !failed ? Last::kOk : unpublished ? Last::kFailedUnpublished : Last::kFailed;
    if (!failed) return started + interval;
    if (unpublished) return started + kBeforePublish;
    return started + std::min(interval, spec_.fast_interval);
  }

 public:
  // An app's rule as set at run time, as the state file keeps it (expiry in wall-clock
  // milliseconds, so that a restart keeps the time left; 0: not throttled).
  struct RuntimeRule {
    std::int64_t until_unix_ms = 0;
    double ratio = 1;
    bool exempt = false;
    std::vector<std::string> metrics;          // non-empty: the app's metric set
    std::map<std::string, double> thresholds;  // per metric, over the config's
    [[nodiscard]] bool says_nothing() const {
      return until_unix_ms == 0 && !exempt && metrics.empty() && thresholds.empty();
    }
    [[nodiscard]] nlohmann::json to_json() const {
      nlohmann::json j = {
          {"throttled_until_unix_ms", until_unix_ms}, {"ratio", ratio}, {"exempt", exempt}};
      if (!metrics.empty()) j["metrics"] = metrics;
      if (!thresholds.empty()) j["thresholds"] = thresholds;
      return j;
    }
  };

 private:
  static constexpr Nanos kMaxThrottle = std::chrono::hours(24 * 366);
  static constexpr std::size_t kMaxRuntimeRules = 1000;
  static constexpr std::size_t kMaxSkippedHosts = 1000;
  // A shared table's keys: "app/<app>" for an app's rule, "host/<host>" for a skipped host; at
  // most both bounds at once (the coordinator holds that one; this server checks each).
  static inline const std::string kAppKey = "app/";
  static inline const std::string kHostKey = "host/";
  static constexpr std::size_t kMaxSharedKeys = kMaxRuntimeRules + kMaxSkippedHosts;
  // Each call to the coordinator's table, a read or a write.
  static constexpr Nanos kSharedTimeout = std::chrono::seconds(1);
  static constexpr Nanos kBeforePublish = std::chrono::milliseconds(1);

  static Status bad(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status too_many_rules() {
    return Status(StatusCode::kFailedPrecondition,
                  "app: " + std::to_string(kMaxRuntimeRules) +
                      " apps have rules set at run time, the most a throttler keeps; "
                      "unthrottle some first");
  }
  static Status check_app(const std::string& app) {
    if (std::string why = app_name_error(app); !why.empty()) return bad(std::move(why));
    return {};
  }
  static std::int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // The rule stored for `app` (the defaults when none; a stored one build() found unreadable
  // cannot be here: the policy was refused).
  RuntimeRule runtime_rule(const std::string& app) const {
    if (shared_ != nullptr) {
      const std::optional<SharedRuleMirror::Entry> e = shared_->get(kAppKey + app);
      if (!e) return RuntimeRule{};
      StatusOr<RuntimeRule> r = shared_rule_of(*e);
      return r.ok() ? std::move(r.value()) : RuntimeRule{};
    }
    auto v = state_store_.get(app);
    if (!v.ok() || !v.value()) return RuntimeRule{};
    StatusOr<RuntimeRule> r = rule_of(*v.value());
    return r.ok() ? std::move(r.value()) : RuntimeRule{};
  }
  // A rule as the coordinator's table keeps it: the state file's form less its throttle's end,
  // which is the entry's deadline (dropped with it when the rule says nothing else).
  static StatusOr<RuntimeRule> shared_rule_of(const SharedRuleMirror::Entry& e) {
    nlohmann::json j = nlohmann::json::parse(e.value, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return bad("the rule: not JSON");
    if (j.is_object() && j.contains("throttled_until_unix_ms"))
      return bad("the rule: throttled_until_unix_ms is the entry's deadline, not a field");
    StatusOr<RuntimeRule> r = rule_of(j);
    if (r.ok() && e.has_deadline)
      r.value().until_unix_ms = std::max<std::int64_t>(1, e.deadline_unix_ms);
    return r;
  }
  static SharedRuleMirror::Entry shared_entry_of(const RuntimeRule& r) {
    nlohmann::json j = r.to_json();
    j.erase("throttled_until_unix_ms");
    RuntimeRule rest = r;
    rest.until_unix_ms = 0;
    rest.ratio = 1;
    SharedRuleMirror::Entry e;
    e.value = j.dump();
    e.has_deadline = r.until_unix_ms != 0;
    e.deadline_unix_ms = r.until_unix_ms;
    e.drop_at_deadline = e.has_deadline && rest.says_nothing();
    return e;
  }
  // The coordinator's table gained, changed or lost (`e` null) an entry: an app's rule or a
  // skipped host. On the mirror's thread.
  void shared_changed(const std::string& key, const SharedRuleMirror::Entry* e) {
    if (key.starts_with(kHostKey)) {
      const std::string host = key.substr(kHostKey.size());
      const Nanos now = clock_.now();
      const std::lock_guard lock(mu_);
      if (e == nullptr || !e->has_deadline) {
        if (const auto it = skipped_hosts_.find(host); it != skipped_hosts_.end())
          skipped_hosts_.erase(it);
        return;
      }
      skipped_hosts_[host] = now + std::chrono::milliseconds(e->deadline_unix_ms - unix_ms_now());
      return;
    }
    if (!key.starts_with(kAppKey)) return;  // a later version's; not this one's to read
    const std::string app = key.substr(kAppKey.size());
    if (e == nullptr) return apply(app, RuntimeRule{});
    StatusOr<RuntimeRule> r = shared_rule_of(*e);
    if (!r.ok() || !app_name_error(app).empty()) {
      if (notices_)
        notices_->tell("policy " + name() + ": the shared rule for app " + json_text(app) +
                       " is not one this server can read (" +
                       (r.ok() ? app_name_error(app) : r.status().message()) + "); ignored");
      return apply(app, RuntimeRule{});
    }
    apply(app, r.value());
  }

 public:
  // A rule as the state file keeps it, every field checked: an error names the first that is
  // not what this server writes.
  static StatusOr<RuntimeRule> rule_of(const nlohmann::json& j) {
    const auto wrong = [&](const char* field, const char* want) {
      const auto at = j.find(field);
      return Status(StatusCode::kInvalidArgument,
                    std::string(field) + ": must be " + want + ", not " +
                        json_text(at != j.end() ? *at : nlohmann::json()).substr(0, 64));
    };
    if (!j.is_object()) return Status(StatusCode::kInvalidArgument, "the rule: must be an object");
    RuntimeRule r;
    if (const auto f = j.find("throttled_until_unix_ms"); f != j.end()) {
      if (!f->is_number_integer() || f->get<std::int64_t>() < 0)
        return wrong("throttled_until_unix_ms", "a whole number of milliseconds >= 0");
      r.until_unix_ms = f->get<std::int64_t>();
    }
    if (const auto f = j.find("ratio"); f != j.end()) {
      if (!f->is_number() || !(f->get<double>() > 0 && f->get<double>() <= 1))
        return wrong("ratio", "a number in (0, 1]");
      r.ratio = f->get<double>();
    }
    if (const auto f = j.find("exempt"); f != j.end()) {
      if (!f->is_boolean()) return wrong("exempt", "true or false");
      r.exempt = f->get<bool>();
    }
    if (const auto f = j.find("metrics"); f != j.end()) {
      if (!f->is_array()) return wrong("metrics", "a list of metric names");
      for (const auto& name : *f) {
        if (!name.is_string()) return wrong("metrics", "a list of metric names");
        r.metrics.push_back(name.get<std::string>());
      }
    }
    if (const auto f = j.find("thresholds"); f != j.end()) {
      if (!f->is_object()) return wrong("thresholds", "an object of metric: number > 0");
      for (const auto& [metric, v] : f->items()) {
        if (!v.is_number() || !(v.get<double>() > 0))
          return wrong("thresholds", "an object of metric: number > 0");
        r.thresholds[metric] = v.get<double>();
      }
    }
    return r;
  }

 private:
  // Stores `r` for `app` (durably; erased when it says nothing) and applies it.
  // Writes `r` for `app` to the state file: erased when it says nothing.
  Status store(const std::string& app, const RuntimeRule& r) {
    return r.says_nothing() ? state_store_.erase(app) : state_store_.put(app, r.to_json());
  }
  // Stores `r` for `app` (seen at once by runtime_rule(), so the next verb builds on it) and
  // applies it once the state file holds it; `done` then. Called under admin_mu_.
  void save(const std::string& app, const RuntimeRule& r, Done done) {
    if (shared_ != nullptr) {
      // Applied when the coordinator holds it (shared_changed()), as every other server will.
      if (r.says_nothing()) return shared_->erase_async(kAppKey + app, std::move(done));
      if (!shared_->get(kAppKey + app) && shared_->count(kAppKey) >= kMaxRuntimeRules)
        return done(too_many_rules());
      return shared_->put_async(kAppKey + app, shared_entry_of(r), kMaxSharedKeys, std::move(done));
    }
    // Rules are bounded: each change rewrites the state file, so their number bounds its cost.
    if (!r.says_nothing()) {
      const auto stored = state_store_.get(app);
      if (stored.ok() && !stored.value() && state_store_.size() >= kMaxRuntimeRules)
        return done(too_many_rules());
    }
    // The caller keeps this policy alive until `done` is called (the routes hold it).
    Done applied = [this, app, r, done = std::move(done)](Status s) mutable {
      if (s.ok()) apply(app, r);
      done(std::move(s));
    };
    if (r.says_nothing())
      state_store_.erase_async(app, std::move(applied));
    else
      state_store_.put_async(app, r.to_json(), std::move(applied));
  }
  // Applies a stored rule over the config's rule for `app`.
  void apply(const std::string& app, const RuntimeRule& r) {
    const Nanos now = clock_.now();
    const std::int64_t left_ms = r.until_unix_ms - unix_ms_now();
    const std::lock_guard lock(mu_);
    auto config = spec_.apps.find(app);
    ThrottleAppRule rule = config != spec_.apps.end() ? config->second : ThrottleAppRule{};
    if (r.until_unix_ms != 0 && left_ms > 0) {
      rule.throttled_until = now + std::chrono::milliseconds(left_ms);
      rule.ratio = r.ratio;
    }
    rule.exempt = rule.exempt || r.exempt;
    // A metric the config no longer has is dropped (the app then checks the rest, or the
    // defaults when none is left), so an old rule cannot make every check a 404.
    const auto known = [&](const std::string& m) { return has_metric(spec_.metrics, m); };
    std::vector<std::string> metrics;
    for (const std::string& m : r.metrics)
      if (known(m)) metrics.push_back(m);
    if (!metrics.empty()) rule.metrics = std::move(metrics);
    for (const auto& [m, t] : r.thresholds)
      if (known(m)) rule.thresholds[m] = t;
    const bool says_nothing = config == spec_.apps.end() && !rule.exempt &&
                              rule.throttled_until.count() == INT64_MIN && rule.metrics.empty() &&
                              rule.thresholds.empty();
    if (says_nothing)
      rules_.erase(app);
    else
      rules_[app] = std::move(rule);
  }
  // At start: every stored rule, less the throttles that ran out while the server was down
  // (erased from the file, so it does not keep what no longer says anything).
  void load_runtime_rules() {
    const std::int64_t now_ms = unix_ms_now();
    for (const auto& [app, v] : state_store_.list()) {
      (void)v;
      RuntimeRule r = runtime_rule(app);
      if (r.until_unix_ms != 0 && r.until_unix_ms <= now_ms) {
        r.until_unix_ms = 0;
        r.ratio = 1;
        if (!store(app, r).ok()) continue;  // kept in the file; it says nothing now either way
      }
      apply(app, r);
    }
  }

  const Clock& clock_;
  const ThrottlerSpec spec_;
  const std::shared_ptr<const PolicyDirectory> directory_;  // null without an engine
  const std::shared_ptr<Notices> notices_;                  // null without an engine
  RuntimeState state_store_;
  std::mutex admin_mu_;  // one admin change at a time (read, change, write a rule)
  std::vector<std::unique_ptr<Probe>> probes_;  // probes_[i] used by metric i's loop only
  mutable std::mutex mu_;
  std::vector<ThrottleMetric> metrics_;  // guarded by mu_
  std::vector<Nanos> last_sampled_;      // guarded by mu_
  std::vector<Nanos> last_healthy_;      // per metric: its shard scope last under; mu_
  std::vector<LoadAudit> audits_;        // per metric; guarded by mu_
  // How the last sample went: ok, failed, or failed before the first publish.
  enum class Last { kOk, kFailed, kFailedUnpublished };
  std::vector<Last> last_;                                     // guarded by mu_
  ThrottlerState state_;                                       // guarded by mu_
  std::map<std::string, ThrottleAppRule, std::less<>> rules_;  // config + run time; mu_
  std::map<std::string, Nanos, std::less<>> skipped_hosts_;    // host -> until (clock_); mu_
  std::mt19937_64 rng_;                                        // guarded by mu_
  // Last, so it stops first: its thread calls shared_changed(). Null: rules are this server's.
  std::unique_ptr<SharedRuleMirror> shared_;
};

// ---- the config ----

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
        return std::unique_ptr<Probe>(std::make_unique<PolicyProbe>(directory, target));
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

// ---- the routes ----

// The throttler a check names by shard (or the first one when it names none).
StatusOr<std::shared_ptr<ThrottlerPolicy>> find(const KindPolicies& ps,
                                                std::optional<std::string_view> shard) {
  for (const std::shared_ptr<Policy>& p : ps) {
    auto t = std::static_pointer_cast<ThrottlerPolicy>(p);
    if (!shard || t->shard() == *shard) return t;
  }
  if (ps.empty()) return Status(StatusCode::kNotFound, "no throttler is configured");
  return Status(StatusCode::kNotFound, "no throttler serves shard '" + std::string(*shard) + "'");
}

// The check's JSON, written directly: it is built for every check (HEAD too, whose
// Content-Length must be the GET body's), and a DOM per check would cost more than the rest of
// the request. Keys in the Vitess/freno shape, then the richer reason/value/threshold.
class JsonWriter {
 public:
  JsonWriter() { out_.reserve(512); }  // a check's answer, with a few metrics
  JsonWriter& key(std::string_view k) {
    comma();
    quoted(k);
    out_ += ':';
    fresh_ = true;
    return *this;
  }
  JsonWriter& text(std::string_view v) {
    comma();
    quoted(v);
    return *this;
  }
  JsonWriter& number(double v) {
    comma();
    if (!std::isfinite(v)) {
      out_ += "null";
      return *this;
    }
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, ec == std::errc{} ? end : buf);
    return *this;
  }
  JsonWriter& boolean(bool v) {
    comma();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& open() {
    comma();
    out_ += '{';
    fresh_ = true;
    return *this;
  }
  JsonWriter& close() {
    out_ += '}';
    fresh_ = false;
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  void comma() {
    if (!fresh_) out_ += ',';
    fresh_ = false;
  }
  void quoted(std::string_view v) {
    if (!is_utf8(v)) return quoted(utf8_or_replaced(v));  // a probe's error, say
    out_ += '"';
    std::size_t run = 0;  // the start of the characters not yet written, all plain
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto u = static_cast<unsigned char>(v[i]);
      if (u >= 0x20 && v[i] != '"' && v[i] != '\\') continue;  // UTF-8 passes through
      out_.append(v.substr(run, i - run));
      if (u < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        const char escape[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 15]};
        out_.append(escape, sizeof escape);
      } else {
        const char escape[] = {'\\', v[i]};
        out_.append(escape, sizeof escape);
      }
      run = i + 1;
    }
    out_.append(v.substr(run));
    out_ += '"';
  }
  std::string out_;
  bool fresh_ = true;
};

std::string body_of(const ThrottleResult& r) {
  JsonWriter w;
  w.open().key("StatusCode").number(r.status);
  w.key("ResponseCode")
      .number(vitess_response_code(r.status, r.reason))
      .key("Value")
      .number(r.value);
  w.key("Threshold").number(r.threshold).key("Message").text(r.message);
  w.key("RecentlyChecked").boolean(r.recently_checked).key("AppName").text(r.app);
  w.key("MetricName").text(r.metric).key("Scope").text(r.scope).key("Metrics").open();
  for (const ThrottleMetricResult& m : r.metrics) {
    const unsigned status = m.over ? 429 : 200;
    w.key(m.name).open().key("StatusCode").number(status);
    w.key("ResponseCode").number(vitess_response_code(status, m.reason));
    w.key("Value").number(m.value).key("Threshold").number(m.threshold);
    w.key("Message").text(m.detail).key("Scope").text(m.scope).key("Host").text(m.host);
    w.key("reason").text(m.reason).close();
  }
  w.close().key("reason").text(r.reason).key("value").number(r.value);
  w.key("threshold").number(r.threshold).close();
  return w.take();
}

RouteReply reply_of(const ThrottleResult& r) {
  RouteReply out;
  out.status = r.status;
  out.body = body_of(r);
  return out;
}

RouteReply bad_request(const std::string& message) {
  RouteReply out;
  out.status = 400;
  out.body = json_text(nlohmann::json{{"StatusCode", 400}, {"Message", message}});
  return out;
}

RouteReply not_found(const Status& s) {
  RouteReply out;
  out.status = 404;
  out.body = json_text(nlohmann::json{{"StatusCode", 404}, {"Message", s.message()}});
  return out;
}

// /throttler/check and /throttler/check-self (`self`: the scope is self whatever is asked).
HttpRoute vitess_route(std::string pattern, bool self) {
  return HttpRoute{{"GET", "HEAD"},
                   std::move(pattern),
                   false,
                   [self](const RouteRequest& req, const KindPolicies& ps,
                          Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                     auto t = find(ps, req.arg("shard"));
                     if (!t.ok()) return not_found(t.status());
                     const std::optional<ThrottleScope> scope =
                         self ? std::optional<ThrottleScope>(ThrottleScope::kSelf)
                              : parse_scope(req.arg("scope").value_or(""));
                     if (!scope)
                       return bad_request("scope: must be self or shard, not '" +
                                          std::string(*req.arg("scope")) + "'");
                     const std::string_view p = req.arg("p").value_or("");
                     if (!p.empty() && p != "low" && p != "normal")
                       return bad_request("p: must be low or normal, not '" + std::string(p) + "'");
                     const std::string_view app = req.arg("app").value_or("");
                     if (std::string why = app.empty() ? "" : app_name_error(app); !why.empty())
                       return bad_request(why);
                     return reply_of(t.value()->check(app, *scope, p == "low", req.peer));
                   }};
}

RouteReply ok_json(nlohmann::json body) {
  RouteReply out;
  out.body = json_text(body);
  return out;
}

// freno's checks: /check/{app}/{store_type}/{store_name} (the store name is the shard),
// /check-read/.../{threshold} with the reader's own threshold, and their -if-exists forms, which
// answer 200 for a store no throttler serves (a client that may ask about stores not yet
// throttled); ?p=low for a low-priority app.
HttpRoute freno_route(std::string pattern, bool if_exists) {
  return HttpRoute{
      {"GET", "HEAD"},
      std::move(pattern),
      false,
      [if_exists](const RouteRequest& req, const KindPolicies& ps,
                  Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        auto t = find(ps, req.param("store_name"));
        if (!t.ok()) {
          if (!if_exists) return not_found(t.status());
          return ok_json({{"StatusCode", 200}, {"Message", t.status().message()}});
        }
        double threshold = 0;
        if (const std::string_view text = req.param("threshold"); !text.empty()) {
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), threshold);
          if (ec != std::errc{} || end != text.data() + text.size() || !(threshold > 0) ||
              !std::isfinite(threshold))
            return bad_request("threshold: must be a number > 0, not '" + std::string(text) + "'");
        }
        if (std::string why = app_name_error(req.param("app")); !why.empty())
          return bad_request(why);
        // freno: p=low is low priority, any other p normal.
        const bool low = req.arg("p") == std::optional<std::string_view>("low");
        return reply_of(
            t.value()->check(req.param("app"), ThrottleScope::kDefault, low, req.peer, threshold));
      }};
}

// gRPC sluice.v1.Throttler/Check: ThrottlerCheckRequest -> ThrottlerCheckResponse (declared in
// proto/sluice/v1/sluice.proto), read and written with proto_wire.h.
Decided<std::string> grpc_check(std::string_view request, const KindPolicies& ps,
                                Deferral<std::string>& /*later*/) {
  std::string app, shard, scope_text;
  bool low = false;
  double threshold = 0;
  WireReader in(request);
  const char* mistyped = nullptr;  // a field whose wire type is not its declared one
  const auto typed = [&](unsigned type, const char* name) {
    if (in.type() != type) mistyped = name;
    return in.type() == type;
  };
  while (in.next() && mistyped == nullptr) {
    switch (in.field()) {
      case 1:
        if (typed(2, "app")) app = in.bytes_value();
        break;
      case 2:
        if (typed(2, "shard")) shard = in.bytes_value();
        break;
      case 3:
        if (typed(2, "scope")) scope_text = in.bytes_value();
        break;
      case 4:
        if (typed(0, "low_priority")) low = in.varint_value() != 0;
        break;
      case 5:
        if (typed(1, "threshold")) threshold = in.double_value();
        break;
      default:
        break;  // a field of a later version
    }
  }
  if (mistyped != nullptr)
    return Status(StatusCode::kInvalidArgument, std::string(mistyped) + ": wrong wire type");
  if (!in.ok()) return Status(StatusCode::kInvalidArgument, "request: not a ThrottlerCheckRequest");
  if (std::string why = app.empty() ? "" : app_name_error(app); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  if (threshold < 0 || !std::isfinite(threshold))
    return Status(StatusCode::kInvalidArgument, "threshold: must be >= 0 (0: the metrics' own)");
  const std::optional<ThrottleScope> scope = parse_scope(scope_text);
  if (!scope)
    return Status(StatusCode::kInvalidArgument,
                  "scope: must be self or shard, not '" + scope_text + "'");
  auto t = find(ps, shard.empty() ? std::nullopt : std::optional<std::string_view>(shard));
  if (!t.ok()) return t.status();
  const ThrottleResult r = t.value()->check(app, *scope, low, "grpc", threshold);
  WireWriter out;
  out.int32(1, static_cast<std::int32_t>(r.status))
      .str(2, r.reason)
      .dbl(3, r.value)
      .dbl(4, r.threshold)
      .str(5, r.message)
      .str(6, r.app)
      .str(7, r.metric)
      .str(8, r.scope)
      .boolean(9, r.recently_checked);
  for (const ThrottleMetricResult& m : r.metrics) {
    WireWriter w;
    w.str(1, m.name)
        .int32(2, m.over ? 429 : 200)
        .dbl(3, m.value)
        .dbl(4, m.threshold)
        .str(5, m.reason)
        .str(6, m.detail)
        .str(7, m.scope)
        .str(8, m.host);
    out.bytes(10, w.data());
  }
  return out.data();
}

// An admin change's answer: 200 with the app's rules now, or the error (400 for bad input).
Decided<RouteReply> changed(const Status& s, const ThrottlerPolicy& t, const std::string& app) {
  if (!s.ok()) return s;
  nlohmann::json rules = t.rules_json();
  return ok_json(
      {{"app", app}, {"rule", rules.contains(app) ? rules[app] : nlohmann::json::object()}});
}

// A duration argument ("30m", "1h"); `fallback` when absent.
StatusOr<Nanos> duration_arg(std::optional<std::string_view> text, Nanos fallback,
                             const char* name) {
  if (!text) return fallback;
  const std::optional<Nanos> d = parse_duration(*text);
  if (!d || *d <= Nanos{0})
    return Status(StatusCode::kInvalidArgument, std::string(name) +
                                                    ": must be a positive duration such as 30m "
                                                    "or 1h, not '" +
                                                    std::string(*text) + "'");
  return *d;
}

StatusOr<double> ratio_arg(std::optional<std::string_view> text) {
  if (!text) return 1.0;
  double v = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc{} || end != text->data() + text->size() || !(v > 0 && v <= 1))
    return Status(StatusCode::kInvalidArgument,
                  "ratio: must be a number in (0, 1], not '" + std::string(*text) + "'");
  return v;
}

// The app a route names: its {app} segment, else its `app=` argument.
std::string app_of(const RouteRequest& req) {
  const std::string_view segment = req.param("app");
  return std::string(!segment.empty() ? segment : req.arg("app").value_or(""));
}

// An admin route of the throttler named by `shard=` (or the first). Its action answers `done`
// once: at once for bad input, else when the state file holds the change. The call is parked
// meanwhile (deferred): a transport thread never waits for the disk.
using Done = ThrottlerPolicy::Done;
using AdminAction = std::function<void(const RouteRequest&, ThrottlerPolicy&, Done)>;
HttpRoute admin_route(std::string pattern, AdminAction action) {
  return HttpRoute{
      {"GET", "POST"},
      std::move(pattern),
      true,
      [action = std::move(action)](const RouteRequest& req, const KindPolicies& ps,
                                   Deferral<RouteReply>& later) -> Decided<RouteReply> {
        auto t = find(ps, req.arg("shard"));
        if (!t.ok()) return not_found(t.status());
        std::shared_ptr<ThrottlerPolicy> policy = t.value();  // alive until answered
        Completion<RouteReply> answer = later.defer();
        action(req, *policy,
               [answer = std::move(answer), policy, app = app_of(req)](Status s) mutable {
                 answer(*changed(s, *policy, app));
               });
        return std::nullopt;
      }};
}

// freno's admin verbs, as freno routes them (GET and HEAD; POST too): the rule is for the store
// `store_name=` names (that shard's throttler: 404 if none) or, without it, for every store
// (every throttler), as freno's rule without a store holds for all. Answered in freno's shape
// once every throttler's state file holds it: 200 {"StatusCode":200,"Message":"OK"}; bad input
// 400 naming it (freno answers 500).
RouteReply freno_ok() {
  RouteReply out;
  out.body = "{\"StatusCode\":200,\"Message\":\"OK\"}\n";
  return out;
}
HttpRoute freno_admin_route(std::string pattern, AdminAction action) {
  return HttpRoute{
      {"GET", "HEAD", "POST"},
      std::move(pattern),
      true,
      [action = std::move(action)](const RouteRequest& req, const KindPolicies& ps,
                                   Deferral<RouteReply>& later) -> Decided<RouteReply> {
        std::vector<std::shared_ptr<ThrottlerPolicy>> targets;
        if (const auto store = req.arg("store_name")) {
          auto t = find(ps, *store);
          if (!t.ok()) return not_found(t.status());
          targets.push_back(std::move(t.value()));
        } else {
          for (const std::shared_ptr<Policy>& p : ps)
            targets.push_back(std::static_pointer_cast<ThrottlerPolicy>(p));
          if (targets.empty()) return not_found(find(ps, std::nullopt).status());
        }
        // Answered when the last throttler has answered: OK, or the first error.
        struct Join {
          std::mutex mu;
          std::size_t left;
          Status first;
          Completion<RouteReply> answer;
        };
        auto join = std::make_shared<Join>();
        join->left = targets.size();
        join->answer = later.defer();
        for (const std::shared_ptr<ThrottlerPolicy>& t : targets)
          action(req, *t, [join, t](Status s) {
            std::unique_lock lock(join->mu);
            if (!s.ok() && join->first.ok()) join->first = std::move(s);
            if (--join->left > 0) return;
            const Status first = join->first;
            lock.unlock();
            join->answer(first.ok() ? StatusOr<RouteReply>(freno_ok())
                                    : StatusOr<RouteReply>(first));
          });
        return std::nullopt;
      }};
}

// freno: /throttle-app/{app}[/ttl/{ttl_minutes}][/ratio/{ratio}]. No TTL, or 0: freno's rule
// never expires; here it lasts the longest a rule may (a year). No ratio: the one the app is
// throttled with now, else 1; a ratio of 0 (freno: never refused) lifts the throttle.
// freno's {ttl_minutes} segment: `fallback` when absent or 0, else that many minutes (a year at
// most).
StatusOr<Nanos> freno_ttl(const RouteRequest& req, Nanos fallback) {
  const std::string_view minutes = req.param("ttl_minutes");
  if (minutes.empty()) return fallback;
  std::uint64_t m = 0;
  const auto [end, ec] = std::from_chars(minutes.data(), minutes.data() + minutes.size(), m);
  if (ec != std::errc{} || end != minutes.data() + minutes.size() ||
      std::chrono::minutes(m) > ThrottlerPolicy::longest_throttle())
    return Status(StatusCode::kInvalidArgument,
                  "ttl_minutes: must be a whole number of minutes up to a year, not '" +
                      std::string(minutes) + "'");
  return m > 0 ? Nanos{std::chrono::minutes(m)} : fallback;
}

void freno_throttle(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  const StatusOr<Nanos> ttl = freno_ttl(req, ThrottlerPolicy::longest_throttle());
  if (!ttl.ok()) return done(ttl.status());
  std::optional<double> ratio;
  if (const std::string_view text = req.param("ratio"); !text.empty()) {
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || !(v >= 0 && v <= 1))
      return done(Status(StatusCode::kInvalidArgument,
                         "ratio: must be a number in [0, 1], not '" + std::string(text) + "'"));
    if (v == 0) return t.unthrottle(app_of(req), std::move(done));
    ratio = v;
  }
  t.throttle(app_of(req), ttl.value(), ratio, std::move(done));
}

// freno's read-only routes: the rules and the recent apps in its shape (with several
// throttlers, each app under APP/STORE), and the load balancer's and leader checks (every
// sluice server decides alone: each is its own leader).
HttpRoute freno_listing(std::string pattern, bool recent) {
  return HttpRoute{{"GET", "HEAD"},
                   std::move(pattern),
                   false,
                   [recent](const RouteRequest& req, const KindPolicies& ps,
                            Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                     std::int64_t last_minutes = 0;
                     if (const std::string_view text = req.param("last_minutes"); !text.empty()) {
                       const auto [end, ec] =
                           std::from_chars(text.data(), text.data() + text.size(), last_minutes);
                       if (ec != std::errc{} || end != text.data() + text.size())
                         return bad_request("last_minutes: must be a whole number, not '" +
                                            std::string(text) + "'");
                     }
                     nlohmann::json out = nlohmann::json::object();
                     for (const std::shared_ptr<Policy>& p : ps) {
                       const auto t = std::static_pointer_cast<ThrottlerPolicy>(p);
                       if (recent)
                         t->freno_recent_apps(out, last_minutes);
                       else
                         t->freno_throttled_apps(out,
                                                 ps.size() > 1 ? "/" + t->shard() : std::string());
                     }
                     return ok_json(std::move(out));
                   }};
}
// freno: /skip-host/{host_name}[/ttl/{ttl_minutes}] (no TTL, or 0: an hour, as freno's) leaves
// the host out of every metric's shard scope until then; /recover-host/{host_name} ends it.
void freno_skip_host(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  const StatusOr<Nanos> ttl = freno_ttl(req, std::chrono::hours(1));
  if (!ttl.ok()) return done(ttl.status());
  t.skip_host(std::string(req.param("host_name")), ttl.value(), std::move(done));
}

HttpRoute freno_status(std::string pattern, std::string body) {
  return HttpRoute{
      {"GET", "HEAD"},
      std::move(pattern),
      false,
      [body = std::move(body)](const RouteRequest& /*req*/, const KindPolicies& /*ps*/,
                               Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        RouteReply out;
        out.body = body;
        return out;
      }};
}

PolicyKind throttler_kind_impl() {
  PolicyKind kind("throttler", 0, parse, build);
  kind.routes.push_back(vitess_route("/throttler/check", false));
  kind.routes.push_back(vitess_route("/throttler/check-self", true));
  kind.routes.push_back(freno_route("/check/{app}/{store_type}/{store_name}", false));
  kind.routes.push_back(
      freno_route("/check-read/{app}/{store_type}/{store_name}/{threshold}", false));
  kind.routes.push_back(freno_route("/check-if-exists/{app}/{store_type}/{store_name}", true));
  kind.routes.push_back(
      freno_route("/check-read-if-exists/{app}/{store_type}/{store_name}/{threshold}", true));
  kind.methods.push_back(GrpcMethod{"/sluice.v1.Throttler/Check", grpc_check});
  // Rules at run time (admin; kept in server.state_file): the Vitess and freno verbs.
  kind.routes.push_back(admin_route(
      "/throttler/throttle-app", [](const RouteRequest& req, ThrottlerPolicy& t, Done done) {
        auto d = duration_arg(req.arg("duration"), std::chrono::hours(1), "duration");
        if (!d.ok()) return done(d.status());
        auto ratio = ratio_arg(req.arg("ratio"));
        if (!ratio.ok()) return done(ratio.status());
        t.throttle(app_of(req), d.value(), ratio.value(), std::move(done));  // ratio: 1 if none
      }));
  kind.routes.push_back(admin_route("/throttler/unthrottle-app",
                                    [](const RouteRequest& req, ThrottlerPolicy& t, Done done) {
                                      t.unthrottle(app_of(req), std::move(done));
                                    }));
  // An app's metric set and thresholds at run time: metrics=a,b (empty: drop the run-time set),
  // thresholds=lag:2,load:8 (0 drops one), clear=true (drop both first).
  kind.routes.push_back(admin_route(
      "/throttler/app-rule", [](const RouteRequest& req, ThrottlerPolicy& t, Done done) {
        std::optional<std::vector<std::string>> metrics;
        if (const auto text = req.arg("metrics")) {
          metrics.emplace();
          for (std::string_view rest = *text; !rest.empty();) {
            const auto comma = rest.find(',');
            const std::string_view name = rest.substr(0, comma);
            rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
            if (!name.empty()) metrics->emplace_back(name);
          }
        }
        std::map<std::string, double> thresholds;
        for (std::string_view rest = req.arg("thresholds").value_or(""); !rest.empty();) {
          const auto comma = rest.find(',');
          const std::string_view pair = rest.substr(0, comma);
          rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
          const auto colon = pair.find(':');
          double v = 0;
          const std::string_view number =
              colon == std::string_view::npos ? std::string_view{} : pair.substr(colon + 1);
          const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
          if (colon == std::string_view::npos || number.empty() || ec != std::errc{} ||
              end != number.data() + number.size())
            return done(Status(
                StatusCode::kInvalidArgument,
                "thresholds: expected metric:number pairs, not '" + std::string(pair) + "'"));
          thresholds[std::string(pair.substr(0, colon))] = v;
        }
        const std::string_view clear = req.arg("clear").value_or("false");
        if (clear != "true" && clear != "false")
          return done(Status(StatusCode::kInvalidArgument,
                             "clear: must be true or false, not '" + std::string(clear) + "'"));
        t.set_rule(app_of(req), metrics, thresholds, clear == "true", std::move(done));
      }));
  kind.routes.push_back(admin_route(
      "/throttler/exempt-app", [](const RouteRequest& req, ThrottlerPolicy& t, Done done) {
        const std::string_view e = req.arg("exempt").value_or("true");
        if (e != "true" && e != "false")
          return done(Status(StatusCode::kInvalidArgument,
                             "exempt: must be true or false, not '" + std::string(e) + "'"));
        t.exempt(app_of(req), e == "true", std::move(done));
      }));
  for (const char* pattern : {"/throttle-app/{app}", "/throttle-app/{app}/ratio/{ratio}",
                              "/throttle-app/{app}/ttl/{ttl_minutes}",
                              "/throttle-app/{app}/ttl/{ttl_minutes}/ratio/{ratio}"})
    kind.routes.push_back(freno_admin_route(pattern, freno_throttle));
  kind.routes.push_back(freno_admin_route(
      "/unthrottle-app/{app}", [](const RouteRequest& req, ThrottlerPolicy& t, Done done) {
        t.unthrottle(app_of(req), std::move(done));
      }));
  for (const char* pattern : {"/skip-host/{host_name}", "/skip-host/{host_name}/ttl/{ttl_minutes}"})
    kind.routes.push_back(freno_admin_route(pattern, freno_skip_host));
  kind.routes.push_back(freno_admin_route(
      "/recover-host/{host_name}", [](const RouteRequest& req, ThrottlerPolicy& t, Done done) {
        t.recover_host(std::string(req.param("host_name")), std::move(done));
      }));
  kind.routes.push_back(
      HttpRoute{{"GET", "HEAD"},
                "/skipped-hosts",
                false,
                [](const RouteRequest& /*req*/, const KindPolicies& ps,
                   Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                  nlohmann::json out = nlohmann::json::object();
                  for (const std::shared_ptr<Policy>& p : ps)
                    std::static_pointer_cast<ThrottlerPolicy>(p)->freno_skipped_hosts(out);
                  return ok_json(std::move(out));
                }});
  kind.routes.push_back(freno_listing("/throttled-apps", false));
  kind.routes.push_back(freno_listing("/recent-apps", true));
  kind.routes.push_back(freno_listing("/recent-apps/{last_minutes}", true));
  for (const char* pattern : {"/lb-check", "/_ping", "/status"})
    kind.routes.push_back(freno_status(pattern, freno_ok().body));
  kind.routes.push_back(freno_status("/leader-check", "\"HTTP 200\"\n"));
  // Read-only listings: the rules, and the apps that checked (the audit).
  const auto listing = [](std::string pattern, bool recent) {
    return HttpRoute{
        {"GET"},
        std::move(pattern),
        false,
        [recent](const RouteRequest& req, const KindPolicies& ps,
                 Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
          auto t = find(ps, req.arg("shard"));
          if (!t.ok()) return not_found(t.status());
          return ok_json(recent
                             ? nlohmann::json{{"apps", t.value()->recent_apps_json()},
                                              {"unexplained_load", t.value()->unexplained_json()}}
                             : nlohmann::json{{"apps", t.value()->rules_json()}});
        }};
  };
  kind.routes.push_back(listing("/throttler/throttled-apps", false));
  kind.routes.push_back(HttpRoute{{"GET", "HEAD"},
                                  "/throttler/status",
                                  false,
                                  [](const RouteRequest& req, const KindPolicies& ps,
                                     Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                                    auto t = find(ps, req.arg("shard"));
                                    if (!t.ok()) return not_found(t.status());
                                    return ok_json(t.value()->vitess_status_json());
                                  }});
  kind.routes.push_back(listing("/throttler/recent-apps", true));
  return kind;
}

}  // namespace

PolicyKind throttler_kind() { return throttler_kind_impl(); }

}  // namespace sluice::server
