// envoyproxy/ratelimit's descriptor rules (sluice/core/rls_rules.h): how a descriptor finds its
// limit, what it is counted under, replaces, and the overall answer. The README's examples as
// YAML, through the server, are in tests/integration/envoy_ratelimit_test.cpp.
#include "sluice/core/rls_rules.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace sluice::rls {
namespace {

DescriptorRule rule(std::string key, std::string value = "", std::optional<std::uint32_t> per = {},
                    Unit unit = Unit::kSecond, std::vector<DescriptorRule> below = {}) {
  DescriptorRule r;
  r.key = std::move(key);
  r.value = std::move(value);
  if (per) {
    r.rate_limit.emplace();
    r.rate_limit->requests_per_unit = *per;
    r.rate_limit->unit = unit;
  }
  r.descriptors = std::move(below);
  return r;
}

const Rule* reach(const RuleTree& t, std::string_view domain, std::vector<Entry> entries) {
  return t.match(domain, entries).rule;
}

TEST(RlsUnits, NamesNumbersAndPeriods) {
  EXPECT_EQ(unit_named("second"), Unit::kSecond);
  EXPECT_EQ(unit_named("MINUTE"), Unit::kMinute);
  EXPECT_EQ(unit_named("Week"), Unit::kWeek);
  EXPECT_EQ(unit_named("unknown"), std::nullopt);
  EXPECT_EQ(unit_named("seconds"), std::nullopt);
  EXPECT_EQ(unit_of(7), Unit::kWeek);
  EXPECT_EQ(unit_of(0), std::nullopt);
  EXPECT_EQ(unit_of(8), std::nullopt);
  EXPECT_EQ(name_of(Unit::kMonth), "MONTH");
  EXPECT_EQ(period_of(Unit::kMonth), std::chrono::hours(24 * 30));
  EXPECT_EQ(period_of(Unit::kYear), std::chrono::hours(24 * 365));
}

TEST(RlsWildcards, TrailingMiddleAndSeveral) {
  EXPECT_TRUE(wildcard_match("key1_value*", "key1_value1"));
  EXPECT_TRUE(wildcard_match("key1_value*", "key1_value"));
  EXPECT_FALSE(wildcard_match("key1_value*", "key1_valu"));
  EXPECT_TRUE(wildcard_match("path_/api/*/action", "path_/api/123/action"));
  EXPECT_FALSE(wildcard_match("path_/api/*/action", "path_/api/123/other"));
  EXPECT_TRUE(wildcard_match("r_/api/*/resource/*/action", "r_/api/v1/resource/123/action"));
  EXPECT_FALSE(wildcard_match("r_/api/*/resource/*/action", "r_/api/v1/res/123/action"));
  EXPECT_FALSE(wildcard_match("a*a", "a"));  // head and tail may not overlap
  EXPECT_TRUE(wildcard_match("a*a", "aa"));
  EXPECT_TRUE(wildcard_match("plain", "plain"));
  EXPECT_FALSE(wildcard_match("plain", "plainer"));
}

// Example 2: nested rules, value-less rules count each value apart, several descriptors.
TEST(RlsMatch, NestedAndValueLessRules) {
  RuleTree t;
  ASSERT_TRUE(t.add("messaging",
                    {rule("message_type", "marketing", {}, Unit::kSecond,
                          {rule("to_number", "", 5, Unit::kDay)}),
                     rule("to_number", "", 100, Unit::kDay)},
                    false)
                  .empty());
  const Rule* marketing =
      reach(t, "messaging", {{"message_type", "marketing"}, {"to_number", "2061111111"}});
  ASSERT_NE(marketing, nullptr);
  EXPECT_EQ(marketing->limit.requests_per_unit, 5U);
  EXPECT_EQ(marketing->path, "messaging.message_type_marketing.to_number");
  const Rule* any = reach(t, "messaging", {{"to_number", "2061111111"}});
  ASSERT_NE(any, nullptr);
  EXPECT_EQ(any->limit.requests_per_unit, 100U);
  // The placeholder level has no limit of its own; another type has no rule at all.
  EXPECT_EQ(reach(t, "messaging", {{"message_type", "marketing"}}), nullptr);
  EXPECT_EQ(reach(t, "messaging", {{"message_type", "billing"}, {"to_number", "1"}}), nullptr);
  EXPECT_EQ(reach(t, "other", {{"to_number", "1"}}), nullptr);
  // Each number is counted apart.
  const std::vector<Entry> a{{"to_number", "1"}};
  const std::vector<Entry> b{{"to_number", "2"}};
  EXPECT_NE(t.match("messaging", a).counter, t.match("messaging", b).counter);
}

// Example 3: key and value before the key alone.
TEST(RlsMatch, MostSpecificFirst) {
  RuleTree t;
  ASSERT_TRUE(t.add("edge_proxy_per_ip",
                    {rule("remote_address", "", 10), rule("remote_address", "50.0.0.5", 0)}, false)
                  .empty());
  EXPECT_EQ(
      reach(t, "edge_proxy_per_ip", {{"remote_address", "50.0.0.1"}})->limit.requests_per_unit,
      10U);
  EXPECT_EQ(
      reach(t, "edge_proxy_per_ip", {{"remote_address", "50.0.0.5"}})->limit.requests_per_unit, 0U);
}

// Example 4: a descriptor matches only at its own depth.
TEST(RlsMatch, DepthMustMatch) {
  RuleTree shallow;
  ASSERT_TRUE(shallow.add("example4", {rule("key", "value", 300)}, false).empty());
  EXPECT_EQ(reach(shallow, "example4", {{"key", "value"}, {"subkey", "subvalue"}}), nullptr);
  EXPECT_NE(reach(shallow, "example4", {{"key", "value"}}), nullptr);
  RuleTree deep;
  ASSERT_TRUE(deep.add("example4",
                       {rule("key", "value", {}, Unit::kSecond, {rule("subkey", "", 300)})}, false)
                  .empty());
  EXPECT_NE(reach(deep, "example4", {{"key", "value"}, {"subkey", "subvalue"}}), nullptr);
  EXPECT_EQ(reach(deep, "example4", {{"key", "value"}}), nullptr);
  // A limit on the way down is not the descriptor's when it goes deeper.
  RuleTree both;
  ASSERT_TRUE(both.add("d", {rule("a", "", 1, Unit::kSecond, {rule("b", "", 2)})}, false).empty());
  EXPECT_EQ(reach(both, "d", {{"a", "x"}, {"b", "y"}})->limit.requests_per_unit, 2U);
  EXPECT_EQ(reach(both, "d", {{"a", "x"}})->limit.requests_per_unit, 1U);
  EXPECT_EQ(reach(both, "d", {{"a", "x"}, {"b", "y"}, {"c", "z"}}), nullptr);
}

// Example 9 and 11: wildcards, first in the file's order; share_threshold shares one counter.
TEST(RlsMatch, WildcardsAndSharedThresholds) {
  RuleTree t;
  DescriptorRule shared = rule("files", "files/*", 10, Unit::kHour);
  shared.share_threshold = true;
  ASSERT_TRUE(t.add("example11",
                    {shared, rule("files_no_share", "files_no_share/*", 10, Unit::kHour),
                     rule("path", "/api/*/action", 20, Unit::kMinute),
                     rule("path", "/api/*", 30, Unit::kMinute)},
                    false)
                  .empty());
  const std::vector<Entry> a{{"files", "files/a.pdf"}}, b{{"files", "files/b.csv"}};
  ASSERT_NE(t.match("example11", a).rule, nullptr);
  EXPECT_EQ(t.match("example11", a).counter, t.match("example11", b).counter);
  const std::vector<Entry> na{{"files_no_share", "files_no_share/a.pdf"}},
      nb{{"files_no_share", "files_no_share/b.csv"}};
  ASSERT_NE(t.match("example11", na).rule, nullptr);
  EXPECT_NE(t.match("example11", na).counter, t.match("example11", nb).counter);
  EXPECT_EQ(reach(t, "example11", {{"path", "/api/1/action"}})->limit.requests_per_unit, 20U);
  EXPECT_EQ(reach(t, "example11", {{"path", "/api/1/other"}})->limit.requests_per_unit, 30U);
  EXPECT_EQ(reach(t, "example11", {{"path", "/web/1"}}), nullptr);
}

// An exact value beats a wildcard, and a wildcard beats the key alone.
TEST(RlsMatch, ExactThenWildcardThenKey) {
  RuleTree t;
  ASSERT_TRUE(
      t.add("d", {rule("k", "", 1), rule("k", "ab*", 2), rule("k", "abc", 3)}, false).empty());
  EXPECT_EQ(reach(t, "d", {{"k", "abc"}})->limit.requests_per_unit, 3U);
  EXPECT_EQ(reach(t, "d", {{"k", "abd"}})->limit.requests_per_unit, 2U);
  EXPECT_EQ(reach(t, "d", {{"k", "xyz"}})->limit.requests_per_unit, 1U);
}

// Counter keys cannot collide through '_' in keys or values.
TEST(RlsMatch, CountersAreUnambiguous) {
  const std::vector<Entry> a{{"a_b", "c"}}, b{{"a", "b_c"}};
  EXPECT_NE(counter_of(a), counter_of(b));
  const std::vector<Entry> c{{"a", "b"}, {"c", "d"}}, d{{"a", "b_c_d"}};
  EXPECT_NE(counter_of(c), counter_of(d));
}

// Examples 8 and 10: metric names.
TEST(RlsMatch, MetricNames) {
  RuleTree t;
  DescriptorRule detailed = rule("key1", "", 10, Unit::kMinute);
  detailed.detailed_metric = true;
  DescriptorRule route = rule(
      "route", "", {}, Unit::kSecond,
      {rule("http_method", "", {}, Unit::kSecond, {rule("subject_id", "", 60, Unit::kMinute)})});
  route.value_to_metric = true;
  route.descriptors[0].value_to_metric = true;
  ASSERT_TRUE(
      t.add("example8", {detailed, rule("key1", "value1", 20, Unit::kMinute)}, false).empty());
  ASSERT_TRUE(t.add("example10", {route}, false).empty());
  const std::vector<Entry> unspecified{{"key1", "unspecified_value"}};
  EXPECT_EQ(t.match("example8", unspecified).metric, "example8.key1_unspecified_value");
  const std::vector<Entry> value1{{"key1", "value1"}};
  EXPECT_EQ(t.match("example8", value1).metric, "example8.key1_value1");
  const std::vector<Entry> api{{"route", "api"}, {"http_method", "GET"}, {"subject_id", "123"}};
  EXPECT_EQ(t.match("example10", api).metric, "example10.route_api.http_method_GET.subject_id");
}

TEST(RlsRules, ErrorsNameTheRule) {
  RuleTree t;
  DescriptorRule unlimited_with_unit = rule("ldap", "", 1);
  unlimited_with_unit.rate_limit->unlimited = true;
  DescriptorRule no_unit = rule("azure", "", 5);
  no_unit.rate_limit->unit = Unit::kUnknown;
  DescriptorRule self = rule("x", "", 1);
  self.rate_limit->name = "n";
  self.rate_limit->replaces = {"n", ""};
  DescriptorRule share = rule("f", "plain", 1);
  share.share_threshold = true;
  auto errors = t.add("d", {unlimited_with_unit, no_unit, self, share, rule("", "v", 1)}, false);
  std::vector<std::string> paths;
  for (const RuleError& e : errors) paths.push_back(e.path);
  EXPECT_EQ(paths, (std::vector<std::string>{
                       "descriptors[0].rate_limit.unit", "descriptors[1].rate_limit.unit",
                       "descriptors[2].rate_limit.replaces[0].name",
                       "descriptors[2].rate_limit.replaces[1].name",
                       "descriptors[3].share_threshold", "descriptors[4].key"}));
  EXPECT_FALSE(t.has_domain("d"));  // nothing added

  auto dup = t.add(
      "d",
      {rule("k", "v", 1), rule("k", "", {}, Unit::kSecond, {rule("a", "", 1), rule("a", "", 2)}),
       rule("k", "v", 2)},
      false);
  ASSERT_EQ(dup.size(), 2U);
  EXPECT_EQ(dup[0].path, "descriptors[1].descriptors[1]");
  EXPECT_NE(dup[0].message.find("'d.k.a'"), std::string::npos) << dup[0].message;
  EXPECT_EQ(dup[1].path, "descriptors[2]");
}

TEST(RlsRules, DomainsMergeOnlyWhenAsked) {
  RuleTree t;
  ASSERT_TRUE(t.add("d", {rule("a", "", 1)}, false).empty());
  auto again = t.add("d", {rule("b", "", 1)}, false);
  ASSERT_EQ(again.size(), 1U);
  EXPECT_EQ(again[0].path, "domain");
  EXPECT_EQ(reach(t, "d", {{"b", "x"}}), nullptr);
  EXPECT_TRUE(t.add("d", {rule("b", "", 2)}, true).empty());
  EXPECT_EQ(reach(t, "d", {{"b", "x"}})->limit.requests_per_unit, 2U);
  // A rule the domain has already is a duplicate, merged or not.
  EXPECT_EQ(t.add("d", {rule("a", "", 3)}, true).size(), 1U);
  EXPECT_EQ(t.rules().size(), 2U);
}

const Rule* named(RuleTree& t, const std::string& path) {
  for (const auto& r : t.rules())
    if (r->path == path) return r.get();
  return nullptr;
}

// Example 7: a matched limit that another matched limit replaces applies nothing.
TEST(RlsApplied, ReplacesAndUnlimited) {
  RuleTree t;
  DescriptorRule specific = rule("user", "bkthomps", 5);
  specific.rate_limit->name = "specific_limit";
  DescriptorRule replacing = rule("user", "bkthomps", 10);
  replacing.rate_limit->replaces = {"specific_limit"};
  DescriptorRule ldap = rule("ldap", "");
  ldap.rate_limit.emplace();
  ldap.rate_limit->unlimited = true;
  ASSERT_TRUE(t.add("example7",
                    {rule("key_1", "value_1", {}, Unit::kSecond, {specific}),
                     rule("key_2", "value_2", {}, Unit::kSecond, {replacing}), ldap},
                    false)
                  .empty());
  const Rule* five = named(t, "example7.key_1_value_1.user_bkthomps");
  const Rule* ten = named(t, "example7.key_2_value_2.user_bkthomps");
  const Rule* unlimited = named(t, "example7.ldap");
  ASSERT_TRUE(five && ten && unlimited);
  const std::vector<const Rule*> alone{five};
  EXPECT_EQ(applied(alone), std::vector<Applied>{Applied::kLimit});
  const std::vector<const Rule*> together{five, ten, nullptr, unlimited};
  EXPECT_EQ(applied(together), (std::vector<Applied>{Applied::kReplaced, Applied::kLimit,
                                                     Applied::kNone, Applied::kUnlimited}));
}

// An outcome: over its limit or not, of a rule in quota and shadow mode or not, limited.
Outcome outcome(bool over, bool quota = false, bool shadow = false, bool limited = true) {
  Outcome o;
  o.over = over;
  o.quota = quota;
  o.shadow = shadow;
  o.limited = limited;
  return o;
}

TEST(RlsOverall, ShadowAndQuota) {
  const auto over = [](std::vector<Outcome> o) { return over_limit(o); };
  EXPECT_FALSE(over({}));
  EXPECT_TRUE(over({outcome(true)}));
  EXPECT_FALSE(over({outcome(true, false, true)}));
  EXPECT_FALSE(over({outcome(true, false, false, false)}));
  // Quota limits: over only when every one of them is.
  EXPECT_FALSE(over({outcome(true, true), outcome(false, true)}));
  EXPECT_TRUE(over({outcome(true, true), outcome(true, true)}));
  EXPECT_FALSE(over({outcome(true, true), outcome(true, true, true)}));
  EXPECT_TRUE(over({outcome(false, true), outcome(true)}));
}

}  // namespace
}  // namespace sluice::rls
