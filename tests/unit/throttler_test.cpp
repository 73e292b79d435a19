// The throttler's check (sluice/core/throttler.h), rule by rule, on explicit time: thresholds, the
// fail-closed samples (failed, stale, missing), staleness judged against the interval a sample
// was taken under, scopes and ignored hosts, app rules (metric sets, thresholds, exempt, `all`,
// explicit throttles with a ratio), low priority, the audit's bounded app count and the probing
// cadence.
#include "sluice/core/throttler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Rules = std::map<std::string, ThrottleAppRule, std::less<>>;

const Nanos kNow = seconds(1000);
const Nanos kFast = milliseconds(100);

ThrottleSample sample(std::string host, double value, Nanos age = milliseconds(50),
                      Nanos interval = kFast) {
  ThrottleSample s;
  s.host = std::move(host);
  s.value = value;
  s.taken_at = kNow - age;
  s.interval = interval;
  return s;
}

ThrottleMetric metric(std::string name, double threshold, std::vector<ThrottleSample> hosts) {
  ThrottleMetric m;
  m.name = std::move(name);
  m.threshold = threshold;
  m.stale_intervals = 2;
  m.hosts = std::move(hosts);
  return m;
}

struct Throttler {
  explicit Throttler(std::vector<ThrottleMetric> m) : metrics(std::move(m)) {}

  std::vector<ThrottleMetric> metrics;
  Rules rules;
  ThrottleOptions options;
  ThrottlerState state;

  std::map<std::string, Nanos, std::less<>> skipped;

  ThrottleResult check(std::string_view app, ThrottleScope scope = ThrottleScope::kDefault,
                       bool low = false, double random = 0.5, Nanos now = kNow) {
    ThrottleCheck c{app, scope, low, random};
    c.skipped_hosts = &skipped;
    return throttle_check(metrics, rules, options, state, c, "127.0.0.1:5000", now);
  }
};

TEST(Throttler, UnderEveryThresholdIsOkAndTheNearestMetricIsReported) {
  Throttler t({metric("lag", 5, {sample("r1", 1.0)}), metric("load", 8, {sample("self", 6.0)})});
  const ThrottleResult r = t.check("gh-ost");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.reason, "ok");
  EXPECT_EQ(r.app, "gh-ost");
  EXPECT_EQ(r.metric, "load");  // 6 / 8 is nearer its threshold than 1 / 5
  EXPECT_DOUBLE_EQ(r.value, 6.0);
  EXPECT_DOUBLE_EQ(r.threshold, 8.0);
  ASSERT_EQ(r.metrics.size(), 2u);
  EXPECT_FALSE(r.metrics[0].over);
  EXPECT_EQ(r.scope, "shard");
}

TEST(Throttler, AMetricOverItsThresholdRefuses429NamingItsValueAndHost) {
  Throttler t({metric("lag", 5, {sample("r1", 7.2)}), metric("load", 8, {sample("self", 6.0)})});
  const ThrottleResult r = t.check("vreplication");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.reason, "threshold_exceeded");
  EXPECT_EQ(r.metric, "lag");
  EXPECT_DOUBLE_EQ(r.value, 7.2);
  EXPECT_DOUBLE_EQ(r.threshold, 5.0);
  EXPECT_NE(r.message.find("r1"), std::string::npos) << r.message;
  // At the threshold exactly is not over.
  t.metrics[0].hosts[0].value = 5.0;
  EXPECT_EQ(t.check("vreplication").status, 200u);
}

TEST(Throttler, AFailedMissingOrStaleSampleCountsAsOverAndSaysSo) {
  Throttler t({metric("lag", 5, {sample("r1", 0.1)})});
  t.metrics[0].hosts[0].error = "connection refused";
  ThrottleResult r = t.check("a");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.reason, "probe_failed");
  EXPECT_NE(r.message.find("connection refused"), std::string::npos) << r.message;

  t.metrics[0].hosts[0] = ThrottleSample{};  // never sampled
  t.metrics[0].hosts[0].host = "r1";
  r = t.check("a");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.reason, "no_sample");

  // Stale: older than 2 fast intervals (200 ms).
  t.metrics[0].hosts[0] = sample("r1", 0.1, milliseconds(201));
  r = t.check("a");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.reason, "stale_sample");
  t.metrics[0].hosts[0] = sample("r1", 0.1, milliseconds(200));
  EXPECT_EQ(t.check("a").status, 200u);

  t.metrics[0].hosts.clear();
  EXPECT_EQ(t.check("a").reason, "no_sample");
}

// The first check after an idle spell: the last sample was taken while the probe was dormant
// (every 5 s), 3 s ago. Judged against the fast interval it would be stale and throttle every
// job's first check; judged against the interval it was taken under it is good.
TEST(Throttler, ASampleTakenWhileDormantIsJudgedAgainstTheDormantInterval) {
  Throttler t({metric("lag", 5, {sample("r1", 0.5, seconds(3), seconds(5))})});
  EXPECT_EQ(t.check("gh-ost").status, 200u);
  // ... and is stale once older than two dormant intervals.
  t.metrics[0].hosts[0] = sample("r1", 0.5, seconds(11), seconds(5));
  EXPECT_EQ(t.check("gh-ost").reason, "stale_sample");
}

// The last fast sample once probing went dormant for lack of checks: the first check after
// the idle spell comes before the next (dormant) sample is due, and must not find it stale.
TEST(Throttler, AFastSampleIsJudgedAgainstTheDormantIntervalInForceWhenTheCheckCame) {
  Throttler t({metric("lag", 5, {sample("r1", 0.5, seconds(3), kFast)})});
  ThrottleCheck c{"gh-ost", ThrottleScope::kDefault, false, 0.5};
  EXPECT_EQ(throttle_check(t.metrics, t.rules, t.options, t.state, c, "", kNow).reason,
            "stale_sample");  // judged by its own 100 ms alone: 3 s is stale
  c.interval_in_force = seconds(5);
  EXPECT_EQ(throttle_check(t.metrics, t.rules, t.options, t.state, c, "", kNow).status, 200u);
  // ... and still stale past two of the interval in force.
  t.metrics[0].hosts[0] = sample("r1", 0.5, seconds(11), kFast);
  EXPECT_EQ(throttle_check(t.metrics, t.rules, t.options, t.state, c, "", kNow).reason,
            "stale_sample");
}

TEST(Throttler, ShardScopeIsTheWorstHostAfterIgnoringTheWorstNAndSelfIsTheFirst) {
  Throttler t({metric("lag", 5, {sample("self", 1), sample("r2", 9), sample("r3", 3)})});
  ThrottleResult r = t.check("a", ThrottleScope::kShard);
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.metrics[0].host, "r2");
  EXPECT_EQ(t.check("a", ThrottleScope::kSelf).status, 200u);
  EXPECT_EQ(t.check("a", ThrottleScope::kSelf).metrics[0].host, "self");
  // Ignoring one bad host: the next worst decides.
  t.metrics[0].ignore_hosts = 1;
  r = t.check("a");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.metrics[0].host, "r3");
  // A failed host is the worst there is: it is the one ignored, r2's 9 decides.
  t.metrics[0].hosts[0].error = "timeout";
  r = t.check("a");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.metrics[0].host, "r2");
  // Never all of them: ignoring more than hosts - 1 still judges one.
  t.metrics[0].ignore_hosts = 10;
  EXPECT_EQ(t.check("a").metrics[0].host, "r3");
}

// freno's skip-host: a skipped host is left out of the shard scope until its time; the self
// scope is the first host regardless; every host skipped counts as over.
TEST(Throttler, ASkippedHostIsLeftOutOfTheShardScopeUntilItsTime) {
  Throttler t({metric("lag", 5, {sample("self", 1), sample("r2", 9), sample("r3", 3)})});
  EXPECT_EQ(t.check("a").status, 429u);
  t.skipped["r2"] = kNow + seconds(60);
  ThrottleResult r = t.check("a");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.metrics[0].host, "r3");
  EXPECT_EQ(t.check("a", ThrottleScope::kShard, false, 0.5, kNow + seconds(60)).status,
            429u);  // its time is up
  t.skipped["self"] = kNow + seconds(60);
  t.metrics[0].hosts[0].value = 7;
  EXPECT_EQ(t.check("a", ThrottleScope::kSelf).status, 429u);  // self is self
  EXPECT_EQ(t.check("a", ThrottleScope::kShard).metrics[0].host, "r3");
  t.skipped["r3"] = kNow + seconds(60);
  r = t.check("a");
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.reason, "no_sample");
  EXPECT_NE(r.message.find("every host of metric lag is skipped"), std::string::npos) << r.message;
}

TEST(Throttler, AnAppsRuleSetsItsMetricsAndThresholdsAndAllIsTheCatchAll) {
  Throttler t({metric("lag", 5, {sample("r1", 7)}), metric("load", 8, {sample("self", 1)})});
  t.rules["purge"].metrics = {"load"};
  EXPECT_EQ(t.check("purge").status, 200u);  // lag is not its metric
  EXPECT_EQ(t.check("purge").metrics.size(), 1u);
  t.rules["migrate"].thresholds["lag"] = 10;
  EXPECT_EQ(t.check("migrate").status, 200u);
  EXPECT_EQ(t.check("other").status, 429u);  // defaults
  t.rules["all"].thresholds["lag"] = 20;
  EXPECT_EQ(t.check("other").status, 200u);  // `all` for apps without a rule
  t.rules["purge"].metrics = {"lag", "replication"};
  const ThrottleResult r = t.check("purge");
  EXPECT_EQ(r.status, 404u);
  EXPECT_EQ(r.reason, "unknown_metric");
  EXPECT_EQ(r.metric, "replication");
}

TEST(Throttler, ACheckersOwnThresholdReplacesEveryMetricsThresholdForThatCheckOnly) {
  Throttler t({metric("lag", 5, {sample("r1", 7)}), metric("load", 8, {sample("self", 1)})});
  t.rules["purge"].thresholds["lag"] = 6;
  ThrottleCheck c{"purge", ThrottleScope::kDefault, false, 0.5};
  c.threshold = 10;  // a reader that tolerates 10 s of lag (freno's check-read)
  ThrottleResult r = throttle_check(t.metrics, t.rules, t.options, t.state, c, "", kNow);
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.metrics.at(0).threshold, 10);
  c.threshold = 0.5;  // and one that tolerates less: the load metric is now over too
  r = throttle_check(t.metrics, t.rules, t.options, t.state, c, "", kNow);
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.metrics.at(1).reason, "threshold_exceeded");
  EXPECT_EQ(t.check("purge").status, 429u);  // the rule's 6 again without it
}

// Checks a minute apart: samples taken under a long interval stay good for that long.
const Nanos kSlow = seconds(100);

TEST(Throttler, AnExplicitlyThrottledAppIsRefused417WithItsRatioUntilItsExpiry) {
  Throttler t({metric("lag", 5, {sample("r1", 1, milliseconds(50), kSlow)})});
  t.rules["batch"].throttled_until = kNow + seconds(60);
  t.rules["batch"].ratio = 0.25;
  EXPECT_EQ(t.check("batch", ThrottleScope::kDefault, false, 0.1).status, 417u);
  EXPECT_EQ(t.check("batch", ThrottleScope::kDefault, false, 0.1).reason, "app_throttled");
  EXPECT_EQ(t.check("batch", ThrottleScope::kDefault, false, 0.3).status, 200u);
  EXPECT_EQ(t.check("batch", ThrottleScope::kDefault, false, 0.1, kNow + seconds(60)).status,
            200u);  // expired
  // Still obeys the metrics: over the threshold is 429, not 417.
  t.metrics[0].hosts[0].value = 9;
  EXPECT_EQ(t.check("batch", ThrottleScope::kDefault, false, 0.1).status, 429u);
  // `all` throttles every app, even one with a rule of its own.
  t.metrics[0].hosts[0].value = 1;
  t.rules["all"].throttled_until = kNow + seconds(1);
  EXPECT_EQ(t.check("anyone", ThrottleScope::kDefault, false, 0.99).status, 417u);
  t.rules["migrate"].thresholds["lag"] = 6;
  EXPECT_EQ(t.check("migrate", ThrottleScope::kDefault, false, 0.99).status, 417u);
}

TEST(Throttler, AnExemptAppPassesWhateverTheMetricsAndThrottlesSay) {
  Throttler t({metric("lag", 5, {sample("r1", 50)})});
  t.rules["rescue"].exempt = true;
  t.rules["all"].throttled_until = kNow + seconds(60);
  const ThrottleResult r = t.check("rescue");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.reason, "exempt");
  EXPECT_TRUE(r.metrics[0].over);  // still reported
}

// Vitess names an app by several ':'-separated parts ("<uuid>:vreplication:online-ddl"): a rule
// on any part applies (the whole name's first, then the first part's), as Vitess's throttler
// reads them.
TEST(Throttler, AnAppNameOfSeveralPartsIsEachOfThem) {
  Throttler t({metric("lag", 5, {sample("r1", 1)}), metric("load", 8, {sample("r1", 7)})});
  const std::string name = "4b3c:vreplication:online-ddl";
  EXPECT_EQ(t.check(name).status, 200u);
  t.rules["online-ddl"].throttled_until = kNow + seconds(60);
  EXPECT_EQ(t.check(name).status, 417u);
  EXPECT_EQ(t.check(name).app, name);  // reported (and audited) under its whole name
  EXPECT_EQ(t.check("online-ddl-other").status, 200u);  // a part is a whole part
  EXPECT_EQ(t.check("online-ddl:x").status, 417u);
  // A part that is exempt exempts the name; a part's thresholds and metric set apply.
  t.rules["vreplication"].exempt = true;
  EXPECT_EQ(t.check(name).reason, "exempt");
  t.rules.erase("vreplication");
  t.rules.erase("online-ddl");
  t.rules["vreplication"].metrics = {"load"};
  t.rules["vreplication"].thresholds["load"] = 6;
  const ThrottleResult r = t.check(name);
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.metric, "load");
  EXPECT_EQ(r.threshold, 6);
  // The whole name's own rule comes first.
  t.rules[name].metrics = {"lag"};
  EXPECT_EQ(t.check(name).status, 200u);
  EXPECT_EQ(t.check(":::").status, 200u);  // empty parts name nothing
}

TEST(Throttler, LowPriorityYieldsWhileANormalAppWasRefusedRecently) {
  Throttler t({metric("lag", 5, {sample("r1", 1, milliseconds(50), kSlow)})});
  EXPECT_EQ(t.check("bg", ThrottleScope::kDefault, true).status, 200u);
  t.rules["ddl"].throttled_until = kNow + seconds(60);
  ASSERT_EQ(t.check("ddl", ThrottleScope::kDefault, false, 0).status, 417u);
  ThrottleResult r = t.check("bg", ThrottleScope::kDefault, true, 0.5, kNow + milliseconds(500));
  EXPECT_EQ(r.status, 429u);
  EXPECT_EQ(r.reason, "low_priority");
  // A normal-priority app is not held back by it, and the hold ends.
  EXPECT_EQ(t.check("web", ThrottleScope::kDefault, false, 0.5, kNow + milliseconds(600)).status,
            200u);
  EXPECT_EQ(t.check("bg", ThrottleScope::kDefault, true, 0.5, kNow + seconds(1)).status, 200u);
  // A refused low-priority check does not itself hold others back.
  t.metrics[0].hosts[0].value = 9;
  ASSERT_EQ(t.check("bg", ThrottleScope::kDefault, true, 0.5, kNow + seconds(5)).status, 429u);
  t.metrics[0].hosts[0].value = 1;
  EXPECT_EQ(t.check("bg2", ThrottleScope::kDefault, true, 0.5, kNow + seconds(5) + kFast).status,
            200u);
}

TEST(Throttler, TheAuditCountsChecksPerAppWithABoundedNumberOfApps) {
  Throttler t({metric("lag", 5, {sample("r1", 1)})});
  t.options.max_apps = 3;
  EXPECT_FALSE(t.check("a").recently_checked);
  EXPECT_TRUE(
      t.check("a", ThrottleScope::kDefault, false, 0.5, kNow + milliseconds(10)).recently_checked);
  EXPECT_EQ(t.check("").app, "default");
  for (int i = 0; i < 100; ++i) (void)t.check("made-up-" + std::to_string(i));
  EXPECT_EQ(t.state.apps.size(), 4u);  // a, default, made-up-0, (other)
  EXPECT_EQ(t.state.apps.at("a").checks, 2u);
  EXPECT_EQ(t.state.apps.at("(other)").checks, 99u);
  EXPECT_EQ(t.state.apps.at("a").last_client, "127.0.0.1:5000");
  EXPECT_EQ(t.state.apps.at("a").first_check, kNow);
  EXPECT_EQ(t.state.apps.at("a").last_check, kNow + milliseconds(10));
}

// Vitess's CheckThrottlerResponseCode (OK 1, THRESHOLD_EXCEEDED 2, APP_DENIED 3,
// UNKNOWN_METRIC 4, INTERNAL_ERROR 5) for each way a check ends, and the audit keeps an app's
// last status and code (/throttler/status's RecentApps).
TEST(Throttler, EachOutcomeHasVitesssResponseCodeAndTheAuditKeepsTheLast) {
  Throttler t({metric("lag", 5, {sample("r1", 1)})});
  const auto code = [](const ThrottleResult& r) {
    return vitess_response_code(r.status, r.reason);
  };
  EXPECT_EQ(code(t.check("a")), 1);
  t.rules["e"].exempt = true;
  t.metrics[0].hosts[0].value = 9;
  EXPECT_EQ(code(t.check("e")), 1);  // exempt: 200
  EXPECT_EQ(code(t.check("a")), 2);  // over the threshold
  EXPECT_EQ(t.state.apps.at("a").last_status, 429u);
  EXPECT_EQ(t.state.apps.at("a").last_response_code, 2);
  t.metrics[0].hosts[0].value = 1;
  t.rules["slow"].throttled_until = kNow + seconds(60);
  EXPECT_EQ(code(t.check("slow")), 3);
  EXPECT_EQ(t.state.apps.at("slow").last_response_code, 3);
  t.rules["odd"].metrics = {"missing"};
  EXPECT_EQ(code(t.check("odd")), 4);
  // A normal check refused, then a low-priority one held back: THRESHOLD_EXCEEDED, as Vitess.
  t.metrics[0].hosts[0].value = 9;
  (void)t.check("a");
  t.metrics[0].hosts[0].value = 1;
  const ThrottleResult low = t.check("batch", ThrottleScope::kDefault, true);
  EXPECT_EQ(low.reason, "low_priority");
  EXPECT_EQ(code(low), 2);
  // A metric that cannot be read: 429 here (every client backs off), INTERNAL_ERROR for Vitess.
  t.metrics[0].hosts[0].error = "connection refused";
  EXPECT_EQ(code(t.check("b")), 5);
  EXPECT_EQ(vitess_response_code(500, "anything"), 0);
}

TEST(Throttler, AnAppNameIsShortUtf8AndTheAuditStoresNoOther) {
  EXPECT_EQ(app_name_error("gh-ost"), "");
  EXPECT_EQ(app_name_error("1f0e:vreplication:online-ddl"), "");
  EXPECT_EQ(app_name_error("\xc3\xa9t\xc3\xa9"), "");  // UTF-8 beyond ASCII
  EXPECT_EQ(app_name_error(std::string(kMaxAppBytes, 'a')), "");
  EXPECT_EQ(app_name_error(""), "app: must name an app");
  EXPECT_EQ(app_name_error(std::string(kMaxAppBytes + 1, 'a')), "app: is 257 bytes; at most 256");
  EXPECT_EQ(app_name_error("ok\xff"), "app: is not UTF-8 (byte 2)");
  EXPECT_EQ(app_name_error("\xc0\xaf"), "app: is not UTF-8 (byte 0)");      // overlong
  EXPECT_EQ(app_name_error("\xed\xa0\x80"), "app: is not UTF-8 (byte 0)");  // a surrogate
  EXPECT_EQ(app_name_error("we\"ird\\app\n"), "");  // escaped where it is written
  // A caller that skipped the check still cannot store one: it is counted as "(other)".
  Throttler t({metric("lag", 5, {sample("r1", 1)})});
  EXPECT_EQ(t.check("\xff").status, 200u);
  EXPECT_EQ(t.check(std::string(300, 'x')).status, 200u);
  ASSERT_EQ(t.state.apps.size(), 1u);
  EXPECT_EQ(t.state.apps.at("(other)").checks, 2u);
}

// The non-compliance audit: load over a threshold that no refused check explains.
TEST(Throttler, LoadOverAThresholdWhileNobodyIsHeldBackIsUnexplained) {
  const Nanos window = seconds(10);
  Throttler t({metric("lag", 5, {sample("r1", 7)})});
  LoadAudit a;
  const auto audit_at = [&](Nanos at, double value) {
    t.metrics[0].hosts[0] = sample("r1", value);
    t.metrics[0].hosts[0].taken_at = at - milliseconds(50);
    audit_load(t.metrics[0], t.state, window, at, a);
  };
  // Over, but not yet for a whole window: not unexplained.
  audit_at(kNow, 7);
  audit_at(kNow + seconds(9), 7);
  EXPECT_FALSE(a.unexplained);
  // A window over with no check at all: unexplained (the load does not ask).
  audit_at(kNow + seconds(10), 7);
  EXPECT_TRUE(a.unexplained);
  EXPECT_EQ(a.episodes, 1u);
  audit_at(kNow + seconds(12), 7);
  EXPECT_EQ(a.unexplained_for, seconds(2));
  // A compliant app checks and is refused: the load is explained (someone is held back).
  EXPECT_EQ(t.check("purge", ThrottleScope::kDefault, false, 0.5, kNow + seconds(12)).status, 429u);
  audit_at(kNow + seconds(13), 7);
  EXPECT_FALSE(a.unexplained);
  // It stops checking while the load stays up: unexplained again a window after its refusal.
  audit_at(kNow + seconds(21), 7);
  EXPECT_FALSE(a.unexplained);
  audit_at(kNow + seconds(22), 7);
  EXPECT_TRUE(a.unexplained);
  EXPECT_EQ(a.episodes, 2u);
  // Under the threshold: nothing to explain; a failed probe is not load either.
  audit_at(kNow + seconds(23), 1);
  EXPECT_FALSE(a.unexplained);
  EXPECT_EQ(a.over_since.count(), INT64_MIN);
  t.metrics[0].hosts[0].error = "cannot connect";
  for (int s = 24; s < 40; ++s) audit_load(t.metrics[0], t.state, window, kNow + seconds(s), a);
  EXPECT_FALSE(a.unexplained);
}

TEST(Throttler, ProbingIsDormantUntilAChecksComesAndAfterAnIdleSpell) {
  const Nanos dormant = seconds(5), idle = seconds(10);
  EXPECT_EQ(probe_interval(Nanos{INT64_MIN}, kNow, kFast, dormant, idle), dormant);
  EXPECT_EQ(probe_interval(kNow - seconds(1), kNow, kFast, dormant, idle), kFast);
  EXPECT_EQ(probe_interval(kNow - seconds(10), kNow, kFast, dormant, idle), kFast);
  EXPECT_EQ(probe_interval(kNow - seconds(11), kNow, kFast, dormant, idle), dormant);
}

TEST(Throttler, ScopesParseAndPrint) {
  EXPECT_EQ(parse_scope(""), ThrottleScope::kDefault);
  EXPECT_EQ(parse_scope("self"), ThrottleScope::kSelf);
  EXPECT_EQ(parse_scope("shard"), ThrottleScope::kShard);
  EXPECT_FALSE(parse_scope("cluster").has_value());
  EXPECT_EQ(to_string(ThrottleScope::kSelf), "self");
}

}  // namespace
}  // namespace sluice
