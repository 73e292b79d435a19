// throttler.h: the collaborative throttler's decision (the check that batch jobs ask before each
// chunk of work, in the shape of the Vitess tablet throttler and GitHub's freno), pure.
//
// What it is: metrics are sampled in the background by probes (the server's; one sample per
// host per metric, cached), so a check is a lookup, never a query. A check of an app decides
// from the cached samples and the app's rules:
//   1. an unknown app gets the defaults; an app's own rule, else the `all` rule, gives its
//      metric set and thresholds (a metric the app names that the throttler does not have is
//      404, reason "unknown_metric");
//   2. an exempt app (its own rule) passes whatever the metrics say (reason "exempt");
//   3. each metric of the set is checked in the scope asked: `self` is the metric's first host,
//      `shard` the worst of its hosts after ignoring up to `ignore_hosts` of the worst (a host
//      whose probe failed, or whose sample is stale, counts as worse than any value). A metric
//      is over when its value is above its threshold, and counts as over (fail closed) when its
//      sample is missing, failed, or older than `stale_intervals` times the longer of the probe
//      interval in force when it was taken and the one in force when the check came: a sample
//      taken while the probe was dormant stays good for as long as a dormant interval allows,
//      and so does the last fast sample once probing has slowed down for lack of checks, so the
//      first check after an idle spell does not fail merely because probing had slowed (the
//      probe speeds up on that check) -- the check never waits for a fresh sample;
//   4. any metric over: 429 (reason names why: threshold_exceeded, probe_failed, stale_sample,
//      no_sample), the worst one reported as the check's metric;
//   5. an app explicitly throttled (its own rule or `all`, until its expiry) is refused 417 with
//      the rule's ratio as the probability (`random` in [0, 1) is the caller's draw);
//   6. a low-priority check (p=low) is refused 429 ("low_priority") while any normal-priority
//      check was refused within `low_priority_hold`: background work yields first;
//   7. otherwise 200.
// An app name of several ':'-separated parts (Vitess's "<uuid>:vreplication:online-ddl") is
// also each of its parts: its own rule is the whole name's, else the first part's that has one;
// any part's rule that exempts (2) or throttles (5) it does so. It is reported and audited
// under the whole name.
// Every check records itself in the ThrottlerState (per-app counts and times for the audit, the
// last refusal of a normal-priority app, "recently checked").
//
// Probing cadence (probe_interval): the fast interval while checks come, the dormant interval
// once none came for `idle_after`: an idle throttler costs the database almost nothing.
//
// Thread-safety: pure functions on caller-owned values (the server holds a lock around a check).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice {

// One probe's latest sample of one host.
struct ThrottleSample {
  std::string host;           // how the probe names it ("replica-1:3306", "self")
  double value = 0;           // meaningful when `error` is empty and taken
  Nanos taken_at{INT64_MIN};  // the caller's clock when taken; INT64_MIN: none yet
  Nanos interval{0};          // the probe interval in force when it was taken
  std::string error;          // the probe failed: why
};

// A metric: its hosts' samples and how it is judged.
struct ThrottleMetric {
  std::string name;
  double threshold = 0;
  double stale_intervals = 5;         // a sample older than this many of its interval is stale
  std::size_t ignore_hosts = 0;       // shard scope: the worst hosts ignored (at most hosts - 1)
  std::vector<ThrottleSample> hosts;  // the first is `self`
};

// An app's rule (set in the config or at run time).
struct ThrottleAppRule {
  std::vector<std::string> metrics;                       // empty: every metric
  std::map<std::string, double, std::less<>> thresholds;  // per metric, over the metric's own
  bool exempt = false;
  // Explicitly throttled until this time (INT64_MIN: not), refused with this probability.
  Nanos throttled_until{INT64_MIN};
  double ratio = 1;
};

enum class ThrottleScope { kDefault, kSelf, kShard };

struct ThrottleCheck {
  std::string_view app;  // empty: the throttler's default app
  ThrottleScope scope = ThrottleScope::kDefault;
  bool low_priority = false;
  double random = 0;  // a uniform draw in [0, 1) for a throttle ratio
  // The caller's own threshold for every metric of this check (freno's check-read: a reader
  // that tolerates more lag, or less, than the writers the thresholds are set for); 0: none.
  double threshold = 0;
  // The probe interval in force when the check came (probe_interval(), before this check wakes
  // the probes): a sample is stale only past stale_intervals of the longer of it and the
  // interval the sample was taken under. 0: the sample's own alone.
  Nanos interval_in_force{0};
  // Hosts skipped until a time (freno's skip-host: a host taken out for maintenance): in the
  // shard scope their samples are left out while now < their time; a metric whose every host
  // is skipped counts as over ("no_sample"). The self scope is the first host whatever this
  // says. Null: none.
  const std::map<std::string, Nanos, std::less<>>* skipped_hosts = nullptr;
};

struct ThrottleOptions {
  std::string default_app = "default";
  ThrottleScope default_scope = ThrottleScope::kShard;
  Nanos low_priority_hold = std::chrono::seconds(1);
  Nanos recently = std::chrono::seconds(1);  // "RecentlyChecked": any check within this
  // Apps the audit tracks by name; checks of further apps are counted under "(other)", so a
  // client inventing app names cannot grow the state or the metrics' cardinality.
  std::size_t max_apps = 1000;
};

// What a check found for one metric.
struct ThrottleMetricResult {
  std::string name;
  std::string scope;  // "self" or "shard"
  std::string host;   // the host that decided (the worst counted)
  double value = 0;
  double threshold = 0;
  bool over = false;
  std::string reason;  // "ok", "threshold_exceeded", "probe_failed", "stale_sample", "no_sample"
  std::string detail;  // a failed probe's error, or how stale
};

struct ThrottleResult {
  unsigned status = 200;  // 200, 429, 417 (app throttled), 404 (unknown metric)
  std::string app;        // the app checked (the default app when none was named)
  std::string reason;     // "ok", "exempt", "app_throttled", "low_priority", or the metric's
  std::string message;    // for people: what was over, or what was not found
  // The metric that decided: the worst over, else the one nearest its threshold.
  std::string metric;
  std::string scope;
  double value = 0;
  double threshold = 0;
  bool recently_checked = false;  // another check came within ThrottleOptions::recently
  std::vector<ThrottleMetricResult> metrics;
};

// Per-app audit and the state rules 5-6 need.
struct ThrottleAppStats {
  std::uint64_t checks = 0, refused = 0;
  Nanos first_check{INT64_MIN}, last_check{INT64_MIN};
  std::string last_client;     // the address of its last check (the transport's)
  unsigned last_status = 0;    // its last check's status
  int last_response_code = 0;  // and vitess_response_code() of it
};
struct ThrottlerState {
  Nanos last_check{INT64_MIN};
  Nanos last_refusal{INT64_MIN};  // of any check (429 or 417)
  Nanos last_normal_refusal{INT64_MIN};
  std::map<std::string, ThrottleAppStats, std::less<>> apps;
};

// An app name, wherever one arrives (checks over HTTP and gRPC, the admin verbs, the state
// file): 1 to kMaxAppBytes bytes of UTF-8 (the check routes give a check that names none the
// default app first; the JSON and metrics writers escape what needs it). Why `app` is not one,
// as "app: ...", or "".
inline constexpr std::size_t kMaxAppBytes = 256;
[[nodiscard]] std::string app_name_error(std::string_view app);

[[nodiscard]] std::string_view to_string(ThrottleScope s) noexcept;
// "self", "shard" (or "" for the default); nullopt for anything else.
[[nodiscard]] std::optional<ThrottleScope> parse_scope(std::string_view s) noexcept;

// Decides `check` at `now` and records it in `state` (the client's address `client` for the
// audit). `rules` by app name ("all" applies to every app without a rule of its own). An app
// name app_name_error() refuses is recorded as "(other)": the audit keeps no string a listing
// could not write.
[[nodiscard]] ThrottleResult throttle_check(
    const std::vector<ThrottleMetric>& metrics,
    const std::map<std::string, ThrottleAppRule, std::less<>>& rules, const ThrottleOptions& o,
    ThrottlerState& state, const ThrottleCheck& check, std::string_view client, Nanos now);

// Metric `m` in `scope` at `now`, judged against `threshold` exactly as a check judges it
// (`in_force`: the probe interval in force, for staleness; `skipped`: hosts left out of the shard
// scope until their time), recording nothing.
[[nodiscard]] ThrottleMetricResult judge_metric(
    const ThrottleMetric& m, double threshold, ThrottleScope scope, Nanos now, Nanos in_force,
    const std::map<std::string, Nanos, std::less<>>* skipped = nullptr);

// Vitess's CheckThrottlerResponseCode for a check's status and reason (its "ResponseCode"):
// OK 1 (200, exempt included), THRESHOLD_EXCEEDED 2 (429 over a threshold, or a low-priority
// check held back), APP_DENIED 3 (417), UNKNOWN_METRIC 4 (404), INTERNAL_ERROR 5 (429 because a
// metric could not be read: a failed probe, a stale sample, no sample; Vitess answers those 500,
// sluice 429 so that every client backs off). Not a status sluice gives: 0 (UNDEFINED).
[[nodiscard]] int vitess_response_code(unsigned status, std::string_view reason) noexcept;

// The non-compliance audit of one metric: load that no checking app explains. A collaborative
// throttler only works if what loads the system asks first; when a metric's value has been over
// its threshold (shard scope, the metric's own threshold; a failed probe is not load) for
// `window` and no check was refused within `window`, nobody is being held back: the load comes
// from work that does not check, or that stopped checking while the load rose. Choose `window`
// longer than a compliant client's longest sleep between checks (its backoff cap, 4 s with
// jitter by default), or it would count a compliant client's pause as non-compliance.
struct LoadAudit {
  Nanos over_since{INT64_MIN};  // over its threshold since (INT64_MIN: not over)
  bool unexplained = false;     // now
  std::uint64_t episodes = 0;   // times it became unexplained
  Nanos unexplained_for{0};     // in total
  Nanos last_audit{INT64_MIN};
};
// Updates `audit` from `m`'s samples and the checks recorded in `state`, at `now` (each sample).
void audit_load(const ThrottleMetric& m, const ThrottlerState& state, Nanos window, Nanos now,
                LoadAudit& audit);

// The probe interval in force at `now`: `fast` while a check came within `idle_after`,
// `dormant` otherwise (and before any check).
[[nodiscard]] Nanos probe_interval(Nanos last_check, Nanos now, Nanos fast, Nanos dormant,
                                   Nanos idle_after) noexcept;

}  // namespace sluice
