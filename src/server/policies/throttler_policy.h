// throttler_policy.h: the throttler kind's parts, shared by its files: the spec, the policy
// (throttler_policy.cpp), its config (throttler_config.cpp) and its routes
// (throttler_routes.cpp), which throttler.cpp registers. Internal to the kind.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/probes/probe.h"
#include "backends/probes/registry.h"
#include "server/registry.h"
#include "server/shared_rule_mirror.h"
#include "sluice/backends/shared_rules.h"
#include "sluice/config/config.h"
#include "sluice/core/status.h"
#include "sluice/core/throttler.h"

namespace sluice::server::throttler_detail {

using probes::Probe;

// How a metric's probe is made, once the server it runs in is known (probe_env()).
using probes::MakeProbe;

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
bool has_metric(const std::vector<MetricSpec>& metrics, std::string_view name);

// What a probe reads of the server: a policy's utilisation, in flight / limit, looked up by name
// among the policies the server serves now (so a reload that replaces it is followed).
probes::ProbeEnv probe_env(std::shared_ptr<const PolicyDirectory> directory);

class ThrottlerPolicy final : public Policy {
 public:
  // `shared`: the coordinator's table of spec.shared_rules (null: the state file keeps the rules).
  ThrottlerPolicy(const BuildContext& c, const ThrottlerSpec& spec,
                  std::shared_ptr<SharedRules> shared);
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
  void throttle(const std::string& app, Nanos duration, std::optional<double> ratio, Done done);
  // The longest throttle: what freno's "no TTL" (never expires) is here.
  static constexpr Nanos longest_throttle() { return kMaxThrottle; }
  void unthrottle(const std::string& app, Done done);
  void exempt(const std::string& app, bool exempt, Done done);
  // Sets `app`'s metric set (empty: every metric) and thresholds (each over the config's; a
  // threshold of 0 drops the run-time one) at run time; `clear`: drops both first.
  void set_rule(const std::string& app, const std::optional<std::vector<std::string>>& metrics,
                const std::map<std::string, double>& thresholds, bool clear, Done done);
  // The apps with a rule (config or run time): throttled until when, ratio, exempt.
  nlohmann::json rules_json() const;
  // Per metric: whether load over its threshold is unexplained now (no check refused), how
  // often it became so and for how long in all.
  nlohmann::json unexplained_json() const;
  // freno's /throttled-apps: each app throttled now under `app + suffix`, {"ExpireAt": the
  // wall-clock expiry (RFC 3339, UTC), "Ratio"}.
  void freno_throttled_apps(nlohmann::json& out, const std::string& suffix) const;
  // freno's /recent-apps: each app that checked within `last_minutes` (0: any), under
  // "app/<its last client's address>", {"CheckedAtEpoch" (seconds), "MinutesSinceChecked"}.
  void freno_recent_apps(nlohmann::json& out, std::int64_t last_minutes) const;

  // freno's skip-host: `host`'s samples are left out of the shard scope for `ttl` (kept in
  // memory, a restart forgets it; or in the shared rules' table). At most kMaxSkippedHosts at
  // once. `done` as the rule verbs'.
  void skip_host(const std::string& host, Nanos ttl, Done done);
  void recover_host(const std::string& host, Done done);
  // freno's /skipped-hosts: each host skipped now, with its wall-clock end (RFC 3339, UTC).
  void freno_skipped_hosts(nlohmann::json& out) const;

  // The apps that checked, most recent first: the audit.
  nlohmann::json recent_apps_json() const;

  // Vitess's /throttler/status, its field names and shapes (ThrottlerStatus): what applies to a
  // sluice throttler is filled in (every server is its own leader, always open and enabled);
  // Keyspace, Query and CustomQuery are empty (sluice's metrics come from probes, not one query).
  // The first metric is the default one ("self", "shard", "default" keys).
  nlohmann::json vitess_status_json() const;

  // `threshold` > 0: the caller's own for every metric (freno's check-read).
  ThrottleResult check(std::string_view app, ThrottleScope scope, bool low_priority,
                       std::string_view client, double threshold = 0);

 protected:
  // A probe's command still running would hold a reload or SIGTERM up to its timeout.
  void on_retiring() noexcept override;

  void describe(nlohmann::json& j, PolicyInfo& info) const override;

  void metrics(std::vector<prometheus::MetricFamily>& out) const override;

 private:
  // With mu_ held.
  Nanos interval_at(Nanos now) const;

  // Samples metric `i` when it is due at the interval in force (the fast one after a failed
  // sample, so a probe that failed while dormant, or before the policies it reads were
  // published, is retried at once), outside the lock: a probe may take a while, and each
  // metric has its own loop, so a slow probe delays no other metric's samples. Returns when it
  // is due next. A sample is stamped with the time its probe started (the oldest its reading
  // can be) and the interval in force then.
  Nanos tick(std::size_t i, Nanos now);

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
    [[nodiscard]] nlohmann::json to_json() const;
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
  static Status too_many_rules();
  static Status check_app(const std::string& app);
  // The rule stored for `app` (the defaults when none; a stored one build() found unreadable
  // cannot be here: the policy was refused).
  RuntimeRule runtime_rule(const std::string& app) const;
  // A rule as the coordinator's table keeps it: the state file's form less its throttle's end,
  // which is the entry's deadline (dropped with it when the rule says nothing else).
  static StatusOr<RuntimeRule> shared_rule_of(const SharedRuleMirror::Entry& e);
  static SharedRuleMirror::Entry shared_entry_of(const RuntimeRule& r);
  // The coordinator's table gained, changed or lost (`e` null) an entry: an app's rule or a
  // skipped host. On the mirror's thread.
  void shared_changed(const std::string& key, const SharedRuleMirror::Entry* e);

 public:
  // A rule as the state file keeps it, every field checked: an error names the first that is
  // not what this server writes.
  static StatusOr<RuntimeRule> rule_of(const nlohmann::json& j);

 private:
  // Stores `r` for `app` (durably; erased when it says nothing) and applies it.
  // Writes `r` for `app` to the state file: erased when it says nothing.
  Status store(const std::string& app, const RuntimeRule& r);
  // Stores `r` for `app` (seen at once by runtime_rule(), so the next verb builds on it) and
  // applies it once the state file holds it; `done` then. Called under admin_mu_.
  void save(const std::string& app, const RuntimeRule& r, Done done);
  // Applies a stored rule over the config's rule for `app`.
  void apply(const std::string& app, const RuntimeRule& r);
  // At start: every stored rule, less the throttles that ran out while the server was down
  // (erased from the file, so it does not keep what no longer says anything).
  void load_runtime_rules();

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

// ---- the config (throttler_config.cpp) ----

// A throttler's spec from its section of the config (errors recorded on `s`).
std::shared_ptr<const PolicyBody> parse(const std::string& name, ConfigSection& s,
                                        PolicySpec& spec);
// The policy of a parsed spec; refused when its state file holds a rule it cannot read.
StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c);

// ---- the routes (throttler_routes.cpp), which throttler.cpp registers ----

// The checks: the Vitess shape (`self`: /throttler/check-self) and freno's; the gRPC method.
HttpRoute vitess_route(std::string pattern, bool self);
HttpRoute freno_route(std::string pattern, bool if_exists);
Decided<std::string> grpc_check(std::string_view request, const KindPolicies& ps,
                                Deferral<std::string>& later);

// An admin verb's action on one throttler: answers `done` once (throttler_routes.cpp:
// admin_route()).
using Done = ThrottlerPolicy::Done;
using AdminAction = std::function<void(const RouteRequest&, ThrottlerPolicy&, Done)>;
// The Vitess verbs (/throttler/...), answering the app's rule now, and freno's, answering its
// "OK" once every throttler named has the change.
HttpRoute admin_route(std::string pattern, AdminAction action);
HttpRoute freno_admin_route(std::string pattern, AdminAction action);
void vitess_throttle(const RouteRequest& req, ThrottlerPolicy& t, Done done);
void unthrottle_app(const RouteRequest& req, ThrottlerPolicy& t, Done done);
void vitess_app_rule(const RouteRequest& req, ThrottlerPolicy& t, Done done);
void vitess_exempt(const RouteRequest& req, ThrottlerPolicy& t, Done done);
void freno_throttle(const RouteRequest& req, ThrottlerPolicy& t, Done done);
void freno_skip_host(const RouteRequest& req, ThrottlerPolicy& t, Done done);
void freno_recover_host(const RouteRequest& req, ThrottlerPolicy& t, Done done);

// The listings: freno's, its fixed answers (freno_ok(): its "OK"), and the Vitess shapes.
HttpRoute freno_skipped_hosts_listing(std::string pattern);
HttpRoute freno_listing(std::string pattern, bool recent);
RouteReply freno_ok();
HttpRoute freno_status(std::string pattern, std::string body);
HttpRoute vitess_listing(std::string pattern, bool recent);
HttpRoute vitess_status_route(std::string pattern);

}  // namespace sluice::server::throttler_detail
