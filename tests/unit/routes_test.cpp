// The router kinds' HTTP routes go through (server/routes.h): patterns, path parameters,
// percent-decoding and query parsing.
#include "server/routes.h"

#include <gtest/gtest.h>

namespace sluice::server {
namespace {

HttpRoute route(std::string pattern) {
  return HttpRoute{{"GET"},
                   std::move(pattern),
                   false,
                   [](const RouteRequest&, const KindPolicies&,
                      Deferral<RouteReply>&) -> Decided<RouteReply> { return RouteReply{}; }};
}

TEST(Routes, PatternsAreCheckedWhole) {
  EXPECT_EQ(check_pattern("/check/{app}/{type}/{name}"), "");
  EXPECT_EQ(check_pattern("/throttler/check"), "");
  EXPECT_EQ(check_pattern("check"), "must start with '/'");
  EXPECT_EQ(check_pattern("/a//b"), "has an empty segment");
  EXPECT_EQ(check_pattern("/a/x{b}"), "a parameter must be a whole segment, {name}");
  EXPECT_EQ(check_pattern("/a/{}"), "a parameter must be a whole segment, {name}");
  EXPECT_EQ(check_pattern("/a/{b}/{b}"), "names parameter {b} twice");
}

TEST(Routes, LiteralSegmentsWinOverParameters) {
  Router r;
  ASSERT_TRUE(r.add("k", route("/check/{app}/{type}/{name}")));
  ASSERT_TRUE(r.add("k", route("/check/all/{type}/{name}")));
  EXPECT_FALSE(r.add("j", route("/check/{a}/{b}/{c}")));  // the same shape
  EXPECT_FALSE(r.add("j", route("/bad//x")));
  auto m = r.match("/check/gh-ost/mysql/main");
  ASSERT_NE(m.entry, nullptr);
  EXPECT_EQ(m.entry->route.pattern, "/check/{app}/{type}/{name}");
  EXPECT_EQ(m.params, (NameValues{{"app", "gh-ost"}, {"type", "mysql"}, {"name", "main"}}));
  m = r.match("/check/all/mysql/main");
  ASSERT_NE(m.entry, nullptr);
  EXPECT_EQ(m.entry->route.pattern, "/check/all/{type}/{name}");
  EXPECT_EQ(r.match("/check/a/b").entry, nullptr);       // too few segments
  EXPECT_EQ(r.match("/check/a/b/c/d").entry, nullptr);   // too many
  EXPECT_EQ(r.match("/check//b/c").entry, nullptr);      // an empty parameter
  EXPECT_EQ(r.match("/check/a%zz/b/c").entry, nullptr);  // a malformed escape
  m = r.match("/check/my%20app/b/c");
  ASSERT_NE(m.entry, nullptr);
  EXPECT_EQ(m.params.front().second, "my app");
}

TEST(Routes, QueriesAreDecodedInOrder) {
  auto q = parse_query("app=gh-ost&p=low&&scope=self&flag&name=a%2Fb+c");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(
      q.value(),
      (NameValues{
          {"app", "gh-ost"}, {"p", "low"}, {"scope", "self"}, {"flag", ""}, {"name", "a/b c"}}));
  RouteRequest req;
  req.query = q.value();
  EXPECT_EQ(req.arg("p"), "low");
  EXPECT_FALSE(req.arg("shard").has_value());
  auto bad = parse_query("app=%4");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "query: app: malformed percent-escape");
  EXPECT_FALSE(parse_query("=x").ok());
  EXPECT_EQ(percent_decode("a+b", false), "a+b");  // '+' is a space only in a query
  EXPECT_EQ(percent_decode("a+b", true), "a b");
  EXPECT_FALSE(percent_decode("%", true).has_value());
  EXPECT_FALSE(percent_decode("%a", true).has_value());
}

}  // namespace
}  // namespace sluice::server
