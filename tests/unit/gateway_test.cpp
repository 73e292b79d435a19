// Gateway limits: levels and their rollback, sharing in the live gateway, resolution, the queue
// strategy on explicit time, metrics, a many-thread stress test checking every level at every
// admission, and a model-based property test.
#include "sluice/local/gateway.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sluice/local/gateway_metrics.h"
#include "sluice/testing/gateway_fixtures.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using testing::MetricValue;

ConcurrencyLimit limit(std::optional<std::uint32_t> max, std::optional<std::uint32_t> ptm = {},
                       std::optional<Sharing> sharing = {}) {
  ConcurrencyLimit l;
  l.max_concurrent = max;
  l.per_tenant_max = ptm;
  l.sharing = sharing;
  return l;
}

UpstreamConfig upstream(std::string id, std::string owner, std::optional<ConcurrencyLimit> l,
                        std::vector<RouteConfig> routes = {}) {
  UpstreamConfig u;
  u.host = id + ".example.com";
  u.id = std::move(id);
  u.owner = std::move(owner);
  u.concurrency_limit = std::move(l);
  u.routes = std::move(routes);
  return u;
}

std::unique_ptr<Gateway> build(GatewayConfig config) {
  GatewayBuild b = Gateway::create(std::move(config));
  EXPECT_TRUE(b.report.ok()) << b.report.to_string();
  return std::move(b.gateway);
}

Target target(const Gateway& g, std::string_view tenant, std::string_view up,
              std::string_view route = {}) {
  Resolution r = g.resolve(tenant, up, route);
  EXPECT_TRUE(r.ok()) << r.error()->message();
  return r.ok() ? r.target() : Target{};
}

double in_flight(const Gateway& g, const std::string& host, const std::string& level) {
  return MetricValue(GatewayMetrics(g), "sluice_requests_in_flight",
                     {{"host", host}, {"level", level}})
      .value_or(-1);
}

// ---- levels, rollback, release ----

TEST(GatewayLevels, TenantGlobalLimitRefusesFirstAndTakesNothingElse) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, 2}};
  c.upstreams = {upstream("api", "acme", limit(10))};
  auto g = build(c);
  const Target t = target(*g, "acme", "api");
  Admission a = g->try_acquire(t), b = g->try_acquire(t), d = g->try_acquire(t);
  ASSERT_TRUE(a && b);
  ASSERT_FALSE(d);
  ASSERT_NE(d.rejection(), nullptr);
  EXPECT_EQ(d.rejection()->level, LimitLevel::kTenant);
  EXPECT_EQ(d.rejection()->current_in_flight, 2u);
  EXPECT_EQ(d.rejection()->max_concurrent, 2u);
  EXPECT_EQ(d.rejection()->tenant_id, "acme");
  EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 2);
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 2);
}

TEST(GatewayLevels, UpstreamRefusalGivesTheTenantUnitBack) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, 10}};
  c.upstreams = {upstream("api", "acme", limit(2))};
  auto g = build(c);
  const Target t = target(*g, "acme", "api");
  Admission a = g->try_acquire(t), b = g->try_acquire(t), d = g->try_acquire(t);
  ASSERT_TRUE(a && b);
  ASSERT_NE(d.rejection(), nullptr);
  EXPECT_EQ(d.rejection()->level, LimitLevel::kUpstream);
  EXPECT_EQ(d.rejection()->host, "api.example.com");
  EXPECT_EQ(d.rejection()->upstream_id, "api");
  EXPECT_EQ(d.rejection()->detail(),
            "Upstream api.example.com has reached max concurrent requests (2/2)");
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 2);
}

TEST(GatewayLevels, PerTenantMaxIsolatesTenantsOnASharedUpstream) {
  auto g = build(testing::many_tenants(2, 10, 2, 100));
  const Target t0 = target(*g, "t0", "api"), t1 = target(*g, "t1", "api");
  Admission a = g->try_acquire(t0), b = g->try_acquire(t0), d = g->try_acquire(t0);
  ASSERT_TRUE(a && b);
  ASSERT_NE(d.rejection(), nullptr);
  EXPECT_EQ(d.rejection()->level, LimitLevel::kPerTenant);
  EXPECT_EQ(d.rejection()->max_concurrent, 2u);
  Admission e = g->try_acquire(t1);
  EXPECT_TRUE(e);                                              // the other tenant is unaffected
  EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 3);  // the refusal was rolled back
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 3);
  EXPECT_EQ(in_flight(*g, "api.example.com", "per_tenant"), 3);
}

TEST(GatewayLevels, RouteRefusalRollsBackEveryEarlierLevel) {
  auto g = build(testing::many_tenants(2, 10, 5, 100, /*route_max=*/1));
  const Target chat = target(*g, "t0", "api", "chat");
  Admission a = g->try_acquire(chat);
  ASSERT_TRUE(a);
  Admission b = g->try_acquire(target(*g, "t1", "api", "chat"));
  ASSERT_NE(b.rejection(), nullptr);
  EXPECT_EQ(b.rejection()->level, LimitLevel::kRoute);
  EXPECT_EQ(b.rejection()->route_id, "chat");
  EXPECT_EQ(b.rejection()->tenant_id, "t1");
  EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 1);
  EXPECT_EQ(in_flight(*g, "api.example.com", "per_tenant"), 1);
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 1);
  // An unlimited route and a call naming no route are bounded by the upstream only.
  Admission e = g->try_acquire(target(*g, "t1", "api", "embed"));
  Admission n = g->try_acquire(target(*g, "t1", "api"));
  EXPECT_TRUE(e && n);
}

TEST(GatewayLevels, PermitReleasesEveryLevelOnceAndSurvivesMoves) {
  auto g = build(testing::many_tenants(1, 4, 3, 4, 3));
  const Target t = target(*g, "t0", "api", "chat");
  {
    Admission a = g->try_acquire(t);
    ASSERT_TRUE(a);
    GatewayPermit p = std::move(a.permit());
    EXPECT_FALSE(a.permit().held());
    GatewayPermit q;
    q = std::move(p);
    EXPECT_TRUE(q.held());
    EXPECT_EQ(q.target(), t);
    EXPECT_EQ(in_flight(*g, "api.example.com", "route"), 1);
    q.release();
    q.release();  // idempotent
    EXPECT_FALSE(q.held());
    EXPECT_EQ(in_flight(*g, "api.example.com", "route"), 0);
    Admission b = g->try_acquire(t);  // released by the destructor at scope end
    EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 1);
  }
  for (const char* level : {"upstream", "per_tenant", "route"})
    EXPECT_EQ(in_flight(*g, "api.example.com", level), 0) << level;
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 0);
}

// A streaming call holds its permit for the whole stream: its slot is not free until it ends.
TEST(GatewayLevels, StreamingCallHoldsItsSlotUntilTheStreamEnds) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, std::nullopt}};
  c.upstreams = {upstream("llm", "acme", limit(1))};
  auto g = build(c);
  const Target t = target(*g, "acme", "llm");
  auto stream = std::make_unique<Admission>(g->try_acquire(t));
  ASSERT_TRUE(*stream);
  for (int chunk = 0; chunk < 100; ++chunk) EXPECT_FALSE(g->try_acquire(t));
  stream.reset();  // the stream ends (or its client disconnects)
  EXPECT_TRUE(g->try_acquire(t));
}

TEST(GatewayLevels, UnlimitedUpstreamStillCountsInFlight) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, std::nullopt}};
  c.upstreams = {upstream("free", "acme", std::nullopt)};
  auto g = build(c);
  std::vector<Admission> held;
  for (int i = 0; i < 50; ++i) held.push_back(g->try_acquire(target(*g, "acme", "free")));
  for (auto& a : held) ASSERT_TRUE(a);
  EXPECT_EQ(in_flight(*g, "free.example.com", "upstream"), 50);
  GatewayMetrics m(*g);
  EXPECT_FALSE(MetricValue(m, "sluice_concurrency_limit_max", {{"host", "free.example.com"}}));
}

// ---- sharing, as the merge table says, in the live gateway ----

GatewayConfig family(Sharing sharing, std::optional<std::uint32_t> upstream_max,
                     std::optional<ConcurrencyLimit> child_limit) {
  GatewayConfig c;
  c.tenants = {{"parent", std::nullopt, std::nullopt}, {"child", "parent", std::nullopt}};
  c.upstreams = {upstream("api", "parent", limit(upstream_max, std::nullopt, sharing))};
  c.bindings = {{"child", "api", std::move(child_limit)}};
  return c;
}

TEST(GatewaySharing, InheritWithoutOwnLimitSharesTheOwnersPool) {
  auto g = build(family(Sharing::kInherit, 2, std::nullopt));
  Admission p = g->try_acquire(target(*g, "parent", "api"));
  Admission c1 = g->try_acquire(target(*g, "child", "api"));
  ASSERT_TRUE(p && c1);
  Admission c2 = g->try_acquire(target(*g, "child", "api"));
  Admission p2 = g->try_acquire(target(*g, "parent", "api"));
  ASSERT_NE(c2.rejection(), nullptr);
  EXPECT_EQ(c2.rejection()->level, LimitLevel::kUpstream);
  EXPECT_FALSE(p2);  // the child's call counts in the parent's pool
}

TEST(GatewaySharing, InheritWithStricterOwnLimitAddsABindingLevel) {
  auto g = build(family(Sharing::kInherit, 10, limit(1)));
  Admission c1 = g->try_acquire(target(*g, "child", "api"));
  Admission c2 = g->try_acquire(target(*g, "child", "api"));
  ASSERT_TRUE(c1);
  ASSERT_NE(c2.rejection(), nullptr);
  EXPECT_EQ(c2.rejection()->level, LimitLevel::kBinding);
  EXPECT_EQ(c2.rejection()->max_concurrent, 1u);
  EXPECT_TRUE(g->try_acquire(target(*g, "parent", "api")));  // pool has room
}

TEST(GatewaySharing, EnforceKeepsTheAncestorsStricterLimit) {
  GatewayBuild b = Gateway::create(family(Sharing::kEnforce, 2, limit(5)));
  ASSERT_TRUE(b.gateway);
  EXPECT_FALSE(b.report.warnings.empty());  // the looser own limit is flagged
  Gateway& g = *b.gateway;
  Admission c1 = g.try_acquire(target(g, "child", "api"));
  Admission c2 = g.try_acquire(target(g, "child", "api"));
  Admission c3 = g.try_acquire(target(g, "child", "api"));
  ASSERT_TRUE(c1 && c2);
  ASSERT_NE(c3.rejection(), nullptr);
  EXPECT_EQ(c3.rejection()->level, LimitLevel::kUpstream);
  EXPECT_EQ(c3.rejection()->max_concurrent, 2u);  // min(2, 5)
}

TEST(GatewaySharing, PrivateBindingGetsASeparatePool) {
  auto g = build(family(Sharing::kPrivate, 1, limit(3)));
  Admission p = g->try_acquire(target(*g, "parent", "api"));
  ASSERT_TRUE(p);  // the parent's pool (max 1) is now full
  std::vector<Admission> child;
  for (int i = 0; i < 3; ++i) child.push_back(g->try_acquire(target(*g, "child", "api")));
  for (auto& a : child) EXPECT_TRUE(a);
  Admission more = g->try_acquire(target(*g, "child", "api"));
  ASSERT_NE(more.rejection(), nullptr);
  EXPECT_EQ(more.rejection()->level, LimitLevel::kUpstream);
  EXPECT_EQ(more.rejection()->max_concurrent, 3u);
  // Both pools report under the upstream's host: 1 + 3 in flight of 1 + 3.
  EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 4);
}

TEST(GatewaySharing, PrivateBindingWithoutOwnLimitIsRefusedAtCreate) {
  GatewayBuild b = Gateway::create(family(Sharing::kPrivate, 1, std::nullopt));
  EXPECT_FALSE(b.gateway);
  ASSERT_FALSE(b.report.errors.empty());
  EXPECT_EQ(b.report.errors[0].path, "bindings[0].concurrency_limit");
}

TEST(GatewaySharing, GrandchildMayBindAGrandparentsUpstream) {
  GatewayConfig c = family(Sharing::kInherit, 4, std::nullopt);
  c.tenants.push_back({"grandchild", "child", std::nullopt});
  c.bindings.push_back({"grandchild", "api", limit(1)});
  auto g = build(c);
  Admission a = g->try_acquire(target(*g, "grandchild", "api"));
  EXPECT_TRUE(a);
  EXPECT_FALSE(g->try_acquire(target(*g, "grandchild", "api")));
}

// ---- resolution ----

TEST(GatewayResolve, NamesWhatIsUnknownOrNotBound) {
  GatewayConfig c = family(Sharing::kInherit, 4, std::nullopt);
  c.tenants.push_back({"stranger", std::nullopt, std::nullopt});
  c.upstreams[0].routes = {{"chat", 1}};
  auto g = build(c);
  auto code = [&](std::string_view t, std::string_view u, std::string_view r) {
    Resolution res = g->resolve(t, u, r);
    return res.ok() ? std::optional<ResolveError::Code>{} : res.error()->code;
  };
  EXPECT_EQ(code("nobody", "api", ""), ResolveError::Code::kUnknownTenant);
  EXPECT_EQ(code("child", "nothing", ""), ResolveError::Code::kUnknownUpstream);
  EXPECT_EQ(code("child", "api", "nope"), ResolveError::Code::kUnknownRoute);
  EXPECT_EQ(code("stranger", "api", ""), ResolveError::Code::kNotBound);
  EXPECT_FALSE(code("child", "api", "chat").has_value());
  EXPECT_EQ(g->resolve("stranger", "api").error()->message(),
            "upstream: tenant 'stranger' may not call upstream 'api': it neither owns it nor has a "
            "binding to it");
  Admission by_name = g->try_acquire("nobody", "api");
  ASSERT_NE(by_name.error(), nullptr);
  EXPECT_EQ(by_name.error()->message(), "tenant: unknown tenant 'nobody'");
  EXPECT_TRUE(g->try_acquire("child", "api", "chat"));
}

TEST(GatewayCreate, RefusesAnInvalidConfigAndKeepsWarnings) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, std::nullopt}};
  c.upstreams = {upstream("api", "acme", limit(0))};
  GatewayBuild b = Gateway::create(c);
  EXPECT_FALSE(b.gateway);
  ASSERT_EQ(b.report.errors.size(), 1u);
  EXPECT_EQ(b.report.errors[0].path, "upstreams[0].concurrency_limit.max_concurrent");
}

TEST(GatewayRejection, StatusAndRetryAfterFollowTheConfig) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, std::nullopt}};
  c.upstreams = {upstream("api", "acme", limit(1))};
  c.problem.status = 429;
  c.problem.retry_after_seconds = 7;
  auto g = build(c);
  Admission a = g->try_acquire("acme", "api");
  Admission b = g->try_acquire("acme", "api");
  ASSERT_TRUE(a);
  ASSERT_NE(b.rejection(), nullptr);
  const HttpResponse r = to_http_response(*b.rejection());
  EXPECT_EQ(r.status, 429);
  EXPECT_EQ(r.header("retry-after"), "7");
  EXPECT_EQ(r.header("Content-Type"), "application/problem+json");
  EXPECT_NE(r.body.find("\"limit_type\":\"upstream\""), std::string::npos);
  EXPECT_NE(r.body.find("\"current_in_flight\":1"), std::string::npos);
}

// ---- metrics ----

TEST(GatewayMetricsTest, ExportsInFlightExceededUsageAndMax) {
  auto g = build(testing::many_tenants(2, 4, 2, 100, 3));
  GatewayMetrics m(*g);
  const Target t0 = target(*g, "t0", "api", "chat");
  Admission a = g->try_acquire(t0), b = g->try_acquire(t0), c = g->try_acquire(t0);
  ASSERT_TRUE(a && b);
  ASSERT_FALSE(c);
  const std::vector<std::pair<std::string, std::string>> up = {{"host", "api.example.com"},
                                                               {"level", "upstream"}};
  EXPECT_EQ(MetricValue(m, "sluice_requests_in_flight", up), 2);
  EXPECT_EQ(MetricValue(m, "sluice_concurrency_limit_max", up), 4);
  EXPECT_EQ(MetricValue(m, "sluice_concurrency_usage_ratio", up), 0.5);
  EXPECT_EQ(MetricValue(m, "sluice_concurrency_limit_exceeded_total",
                        {{"host", "api.example.com"}, {"level", "per_tenant"}}),
            1);
  EXPECT_EQ(MetricValue(m, "sluice_concurrency_limit_exceeded_total", up), 0);
  // per_tenant: the caps of 2 of three tenants (the owner too), summed; route: one limited.
  EXPECT_EQ(MetricValue(m, "sluice_concurrency_limit_max",
                        {{"host", "api.example.com"}, {"level", "per_tenant"}}),
            6);
  EXPECT_EQ(MetricValue(m, "sluice_requests_in_flight",
                        {{"host", "api.example.com"}, {"level", "route"}}),
            2);
  EXPECT_FALSE(MetricValue(m, "sluice_tenant_requests_in_flight", {{"tenant_id", "t0"}}));
}

TEST(GatewayMetricsTest, PerTenantSeriesOnlyWhenEnabled) {
  GatewayConfig c = testing::many_tenants(2, 4, 2, 100);
  c.tenants[0].global_concurrency_limit.reset();
  c.metrics.per_tenant = true;
  auto g = build(c);
  GatewayMetrics m(*g);
  Admission a = g->try_acquire("t1", "api");
  Admission r = g->try_acquire("root", "api");  // a tenant without a global limit is counted
  ASSERT_TRUE(a && r);
  EXPECT_EQ(MetricValue(m, "sluice_tenant_requests_in_flight", {{"tenant_id", "t1"}}), 1);
  EXPECT_EQ(MetricValue(m, "sluice_tenant_requests_in_flight", {{"tenant_id", "t0"}}), 0);
  EXPECT_EQ(MetricValue(m, "sluice_tenant_requests_in_flight", {{"tenant_id", "root"}}), 1);
  EXPECT_EQ(MetricValue(m, "sluice_tenant_upstream_requests_in_flight",
                        {{"tenant_id", "t1"}, {"host", "api.example.com"}}),
            1);
}

// ---- queue strategy, on explicit time ----

GatewayConfig queued(std::uint32_t max, std::uint32_t depth, Nanos timeout,
                     std::optional<std::uint32_t> route_max = std::nullopt) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, 10}};
  ConcurrencyLimit l = limit(max);
  l.strategy = Strategy::kQueue;
  l.queue = {depth, timeout};
  c.upstreams = {upstream("api", "acme", l, {{"chat", route_max}, {"free", std::nullopt}})};
  return c;
}

// Collects what each callback delivered.
struct Outcomes {
  std::vector<std::optional<Admission>> slots;
  AcquireCallback into(std::size_t i) {
    if (slots.size() <= i) slots.resize(i + 1);
    return [this, i](Admission a) {
      ASSERT_FALSE(slots[i].has_value()) << "callback ran twice";
      slots[i].emplace(std::move(a));
    };
  }
  bool decided(std::size_t i) const { return i < slots.size() && slots[i].has_value(); }
  bool admitted(std::size_t i) const { return decided(i) && slots[i]->admitted(); }
};

TEST(GatewayQueue, ReleaseHandsTheUnitToTheHeadWaiterInFifoOrder) {
  auto g = build(queued(1, 10, std::chrono::seconds(5)));
  const Target t = target(*g, "acme", "api");
  Outcomes out;
  const Nanos now{1'000'000};
  [[maybe_unused]] AcquireTicket first = g->acquire_async(t, now, out.into(0));
  ASSERT_TRUE(out.admitted(0));  // decided at once
  EXPECT_FALSE(first.queued());
  [[maybe_unused]] AcquireTicket w1 = g->acquire_async(t, now, out.into(1));
  [[maybe_unused]] AcquireTicket w2 = g->acquire_async(t, now, out.into(2));
  EXPECT_TRUE(w1.queued() && w2.queued());
  EXPECT_FALSE(out.decided(1) || out.decided(2));
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 3);  // waiters hold their tenant unit

  out.slots[0]->permit().release();  // hands over on this thread
  ASSERT_TRUE(out.admitted(1));
  EXPECT_FALSE(out.decided(2));
  EXPECT_FALSE(g->try_acquire(t));  // the unit went to the waiter, not to a newcomer
  out.slots[1]->permit().release();
  ASSERT_TRUE(out.admitted(2));
  EXPECT_FALSE(w2.cancel());  // already decided
  out.slots[2]->permit().release();
  EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 0);
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 0);
}

TEST(GatewayQueue, FullQueueRejectsAtOnce) {
  auto g = build(queued(1, 1, std::chrono::seconds(5)));
  const Target t = target(*g, "acme", "api");
  Outcomes out;
  const Nanos now{0};
  [[maybe_unused]] AcquireTicket a = g->acquire_async(t, now, out.into(0));
  [[maybe_unused]] AcquireTicket b = g->acquire_async(t, now, out.into(1));
  [[maybe_unused]] AcquireTicket c = g->acquire_async(t, now, out.into(2));
  ASSERT_TRUE(out.admitted(0));
  EXPECT_FALSE(out.decided(1));
  ASSERT_TRUE(out.decided(2));
  ASSERT_NE(out.slots[2]->rejection(), nullptr);
  EXPECT_EQ(out.slots[2]->rejection()->reason, RejectReason::kQueueFull);
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 2);  // the rejected call gave its tenant unit back
}

TEST(GatewayQueue, TickExpiresWaitersAtTheirDeadline) {
  auto g = build(queued(1, 10, milliseconds(100)));
  const Target t = target(*g, "acme", "api");
  Outcomes out;
  ManualClock clock(Nanos{5'000'000'000});
  [[maybe_unused]] AcquireTicket a = g->acquire_async(t, clock.now(), out.into(0));
  [[maybe_unused]] AcquireTicket w1 = g->acquire_async(t, clock.now(), out.into(1));
  clock.advance(milliseconds(50));
  [[maybe_unused]] AcquireTicket w2 = g->acquire_async(t, clock.now(), out.into(2));
  clock.advance(milliseconds(49));
  EXPECT_EQ(g->tick(clock.now()), 0u);
  clock.advance(milliseconds(1));  // w1's deadline
  EXPECT_EQ(g->tick(clock.now()), 1u);
  ASSERT_TRUE(out.decided(1));
  ASSERT_NE(out.slots[1]->rejection(), nullptr);
  EXPECT_EQ(out.slots[1]->rejection()->reason, RejectReason::kQueueTimeout);
  EXPECT_FALSE(out.decided(2));
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 2);
  clock.advance(milliseconds(50));
  EXPECT_EQ(g->tick(clock.now()), 1u);
  EXPECT_FALSE(out.slots[2]->admitted());
  EXPECT_EQ(MetricValue(GatewayMetrics(*g), "sluice_concurrency_limit_exceeded_total",
                        {{"host", "api.example.com"}, {"level", "upstream"}}),
            2);
}

TEST(GatewayQueue, CancelLeavesTheQueueAndNeverCallsBack) {
  auto g = build(queued(1, 10, std::chrono::seconds(5)));
  const Target t = target(*g, "acme", "api");
  Outcomes out;
  [[maybe_unused]] AcquireTicket a = g->acquire_async(t, Nanos{0}, out.into(0));
  [[maybe_unused]] AcquireTicket w1 = g->acquire_async(t, Nanos{0}, out.into(1));
  [[maybe_unused]] AcquireTicket w2 = g->acquire_async(t, Nanos{0}, out.into(2));
  EXPECT_TRUE(w1.cancel());
  EXPECT_FALSE(w1.cancel());
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 2);
  out.slots[0]->permit().release();
  EXPECT_FALSE(out.decided(1));
  EXPECT_TRUE(out.admitted(2));  // the next waiter got the unit
}

// A handed-over unit whose later level refuses is offered to the next waiter.
TEST(GatewayQueue, WaiterRefusedAtALaterLevelPassesTheUnitOn) {
  auto g = build(queued(2, 10, std::chrono::seconds(5), /*route_max=*/1));
  const Target chat = target(*g, "acme", "api", "chat");
  const Target free = target(*g, "acme", "api", "free");
  Admission on_chat = g->try_acquire(chat);  // pool 1/2, chat 1/1
  Admission on_free = g->try_acquire(free);  // pool 2/2
  ASSERT_TRUE(on_chat && on_free);
  Outcomes out;
  [[maybe_unused]] AcquireTicket w1 = g->acquire_async(chat, Nanos{0}, out.into(0));
  [[maybe_unused]] AcquireTicket w2 = g->acquire_async(free, Nanos{0}, out.into(1));
  ASSERT_TRUE(w1.queued() && w2.queued());
  on_free.permit().release();  // one pool unit: W1 gets it, its route refuses, W2 gets it
  ASSERT_TRUE(out.decided(0));
  ASSERT_NE(out.slots[0]->rejection(), nullptr);
  EXPECT_EQ(out.slots[0]->rejection()->level, LimitLevel::kRoute);
  EXPECT_TRUE(out.admitted(1));
  EXPECT_EQ(in_flight(*g, "api.example.com", "upstream"), 2);
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 2);
}

TEST(GatewayQueue, AcquireWaitTimesOutAndCancels) {
  auto g = build(queued(1, 10, std::chrono::seconds(30)));
  const Target t = target(*g, "acme", "api");
  Admission held = g->try_acquire(t);
  ASSERT_TRUE(held);
  Admission late = g->acquire_wait(t, milliseconds(20));
  ASSERT_NE(late.rejection(), nullptr);
  EXPECT_EQ(late.rejection()->reason, RejectReason::kQueueTimeout);
  EXPECT_EQ(in_flight(*g, "*", "tenant"), 1);
  held.permit().release();
  EXPECT_TRUE(g->acquire_wait(t, milliseconds(20)));
}

TEST(GatewayQueue, AcquireWaitIsServedByAnotherThreadsRelease) {
  auto g = build(queued(1, 10, std::chrono::seconds(30)));
  const Target t = target(*g, "acme", "api");
  Admission held = g->try_acquire(t);
  ASSERT_TRUE(held);
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(20));
    held.permit().release();
  });
  Admission got = g->acquire_wait(t, std::chrono::seconds(30));
  releaser.join();
  EXPECT_TRUE(got);
}

}  // namespace
}  // namespace sluice
