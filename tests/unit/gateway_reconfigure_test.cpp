// A gateway built to take another's place (Gateway::create(config, previous) + take_over()):
// levels of the same identity share one counter, so the predecessor's permits stay counted
// where the successor admits and release into it; building changes nothing until take_over;
// lowered maxima drain, raised queue maxima serve waiters at once; levels the new config adds
// start at zero; destroying the predecessor leaves the successor's waiters alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/local/gateway.h"

namespace sluice {
namespace {

using std::chrono::seconds;

// acme (global limit `global`) owns api (max `api`, a route `chat` of max min(chat, api), strategy
// `strategy`) and, when `db`, db (max 10).
GatewayConfig config(std::uint32_t global, std::uint32_t api, std::uint32_t chat, bool db,
                     Strategy strategy = Strategy::kReject) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, global}};
  UpstreamConfig u;
  u.id = "api";
  u.host = "api.example.com";
  u.owner = "acme";
  ConcurrencyLimit l;
  l.max_concurrent = api;
  l.strategy = strategy;
  u.concurrency_limit = l;
  u.routes = {{"chat", std::min(chat, api)}};  // a route may not exceed its upstream
  c.upstreams.push_back(u);
  if (db) {
    u.id = "db";
    u.host = "db.example.com";
    u.routes.clear();
    u.concurrency_limit->max_concurrent = 10;
    u.concurrency_limit->strategy = Strategy::kReject;
    c.upstreams.push_back(u);
  }
  return c;
}

std::unique_ptr<Gateway> fresh(GatewayConfig c) {
  GatewayBuild b = Gateway::create(std::move(c));
  EXPECT_TRUE(b.report.ok()) << b.report.to_string();
  return std::move(b.gateway);
}

std::unique_ptr<Gateway> successor(GatewayConfig c, const Gateway& previous) {
  GatewayBuild b = Gateway::create(std::move(c), previous);
  EXPECT_TRUE(b.report.ok()) << b.report.to_string();
  return std::move(b.gateway);
}

Admission admit(Gateway& g, std::string_view upstream, std::string_view route = {}) {
  return g.try_acquire("acme", upstream, route);
}

LimitLevel refused_at(const Admission& a) {
  EXPECT_NE(a.rejection(), nullptr);
  return a.rejection() != nullptr ? a.rejection()->level : LimitLevel::kTenant;
}

TEST(GatewayReconfigure, APredecessorsPermitCountsUntilReleasedAndLoweringDrains) {
  auto old = fresh(config(10, 3, 3, false));
  Admission a = admit(*old, "api"), b = admit(*old, "api");
  ASSERT_TRUE(a && b);
  auto next = successor(config(10, 1, 3, false), *old);
  // Built, not taken over: the shared pool still has the old max of 3.
  Admission c = admit(*next, "api");
  EXPECT_TRUE(c);
  c.permit().release();
  next->take_over();
  Admission d = admit(*next, "api");
  EXPECT_FALSE(d);
  EXPECT_EQ(refused_at(d), LimitLevel::kUpstream);
  EXPECT_EQ(d.rejection()->max_concurrent, 1u);
  a.permit().release();  // through the predecessor, into the shared counter
  EXPECT_FALSE(admit(*next, "api"));
  b.permit().release();
  Admission e = admit(*next, "api");
  EXPECT_TRUE(e);
  EXPECT_FALSE(admit(*old, "api")) << "the predecessor's targets see the new max too";
  e.permit().release();
  next->take_over();  // again: nothing to do
  EXPECT_TRUE(admit(*next, "api"));
}

TEST(GatewayReconfigure, TenantAndRouteLevelsCarryToo) {
  auto old = fresh(config(2, 10, 2, true));
  Admission on_chat = admit(*old, "api", "chat");
  Admission on_db = admit(*old, "db");
  ASSERT_TRUE(on_chat && on_db);
  auto next = successor(config(2, 10, 1, true), *old);
  next->take_over();
  Admission x = admit(*next, "api");
  EXPECT_FALSE(x);
  EXPECT_EQ(refused_at(x), LimitLevel::kTenant);
  on_db.permit().release();
  Admission y = admit(*next, "api", "chat");
  EXPECT_FALSE(y);
  EXPECT_EQ(refused_at(y), LimitLevel::kRoute);
  on_chat.permit().release();
  EXPECT_TRUE(admit(*next, "api", "chat"));
}

TEST(GatewayReconfigure, ARemovedUpstreamStillCountsForItsTenantAndAnAddedOneStartsAtZero) {
  auto old = fresh(config(2, 10, 10, true));
  Admission on_db = admit(*old, "db");
  Admission on_db2 = admit(*old, "db");
  ASSERT_TRUE(on_db && on_db2);
  auto next = successor(config(2, 10, 10, false), *old);
  next->take_over();
  EXPECT_NE(admit(*next, "db").error(), nullptr);
  EXPECT_FALSE(admit(*next, "api")) << "two calls on the removed db hold the tenant's 2";
  on_db.permit().release();
  Admission a = admit(*next, "api");
  EXPECT_TRUE(a);
  on_db2.permit().release();
  a.permit().release();
  // db comes back as a new upstream; the old one's counter was the predecessor's.
  Admission held = admit(*next, "api");
  auto last = successor(config(5, 10, 10, true), *next);
  last->take_over();
  std::vector<Admission> on_new_db;
  for (int i = 0; i < 4; ++i) {  // the tenant's 5, minus the call held on api
    on_new_db.push_back(admit(*last, "db"));
    EXPECT_TRUE(on_new_db.back()) << i;
  }
  EXPECT_EQ(refused_at(admit(*last, "db")), LimitLevel::kTenant);
}

TEST(GatewayReconfigure, ARaisedQueueMaxServesWaitersAtTakeOver) {
  auto old = fresh(config(10, 1, 10, false, Strategy::kQueue));
  Admission held = admit(*old, "api");
  ASSERT_TRUE(held);
  std::optional<Admission> served;
  AcquireTicket t = old->acquire_async(old->resolve("acme", "api").target(), seconds(0),
                                       [&](Admission a) { served.emplace(std::move(a)); });
  ASSERT_TRUE(t.queued());
  ASSERT_FALSE(served.has_value());
  auto next = successor(config(10, 2, 10, false, Strategy::kQueue), *old);
  EXPECT_FALSE(served.has_value()) << "building changes nothing";
  next->take_over();
  ASSERT_TRUE(served.has_value());
  EXPECT_TRUE(served->admitted());
}

TEST(GatewayReconfigure, APredecessorsReleaseServesTheSuccessorsWaiterAndItsEndLeavesThemAlone) {
  auto old = fresh(config(10, 1, 10, false, Strategy::kQueue));
  Admission held = admit(*old, "api");
  ASSERT_TRUE(held);
  auto next = successor(config(10, 1, 10, false, Strategy::kQueue), *old);
  next->take_over();
  const Target t = next->resolve("acme", "api").target();
  std::vector<bool> outcomes;
  const auto record = [&](Admission a) {
    outcomes.push_back(a.admitted());
    if (a.admitted()) a.permit().release();
  };
  ASSERT_TRUE(next->acquire_async(t, seconds(0), record).queued());
  held.permit().release();  // through the predecessor: hands the unit to the successor's waiter
  ASSERT_EQ(outcomes, std::vector<bool>{true});
  Admission busy = admit(*next, "api");
  ASSERT_TRUE(busy);
  ASSERT_TRUE(next->acquire_async(t, seconds(0), record).queued());
  old.reset();  // rejects only its own waiters
  EXPECT_EQ(outcomes.size(), 1u);
  busy.permit().release();
  EXPECT_EQ(outcomes, (std::vector<bool>{true, true}));
}

TEST(GatewayReconfigure, APoolWhoseStrategyChangesStartsAtZero) {
  auto old = fresh(config(10, 1, 10, false, Strategy::kReject));
  Admission held = admit(*old, "api");
  ASSERT_TRUE(held);
  auto next = successor(config(10, 1, 10, false, Strategy::kQueue), *old);
  next->take_over();
  Admission a = admit(*next, "api");
  EXPECT_TRUE(a) << "a new queue pool: the reject pool's call is not counted in it";
  EXPECT_FALSE(admit(*old, "api")) << "and the old pool still counts it";
}

}  // namespace
}  // namespace sluice
