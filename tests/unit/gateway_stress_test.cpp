// Gateway admission under concurrency and against a model.
//
// Stress: many threads and tenants acquire and release at random; shadow counters (raised
// after an admission, lowered before its release) are checked against every level's max at
// every admission, so a single over-admission at any level, even for an instant, fails the
// test. Property: random operation sequences on a config exercising every level kind and
// every sharing mode are compared step by step with a model of the ADR's semantics.
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

#include "sluice/local/gateway.h"
#include "sluice/local/gateway_metrics.h"
#include "sluice/testing/gateway_fixtures.h"

namespace sluice {
namespace {

using testing::MetricValue;

constexpr std::uint32_t kTenants = 64;
constexpr std::uint32_t kUpstreamMax = 16;
constexpr std::uint32_t kPerTenantMax = 3;
constexpr std::uint32_t kTenantGlobal = 4;
constexpr std::uint32_t kRouteMax = 5;

struct Shadow {
  std::atomic<std::uint32_t> upstream{0};
  std::atomic<std::uint32_t> route{0};
  std::array<std::atomic<std::uint32_t>, kTenants> tenant{};
  std::atomic<bool> exceeded{false};

  static void raise(std::atomic<std::uint32_t>& c, std::uint32_t max, std::atomic<bool>& bad) {
    if (c.fetch_add(1) + 1 > max) bad = true;
  }
};

TEST(GatewayStress, NoLevelIsEverPastItsMaxUnderEightThreads) {
  GatewayBuild b = Gateway::create(
      testing::many_tenants(kTenants, kUpstreamMax, kPerTenantMax, kTenantGlobal, kRouteMax));
  ASSERT_TRUE(b.gateway) << b.report.to_string();
  Gateway& g = *b.gateway;
  std::vector<std::array<Target, 3>> targets;  // no route, chat, embed
  for (std::uint32_t i = 0; i < kTenants; ++i) {
    const std::string id = testing::tenant_id(i);
    targets.push_back({g.resolve(id, "api").target(), g.resolve(id, "api", "chat").target(),
                       g.resolve(id, "api", "embed").target()});
  }
  Shadow shadow;
  std::atomic<std::uint64_t> admitted{0}, rejected{0};
  constexpr int kThreads = 8, kOps = 20000;
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(1234 + th);
      struct Held {
        GatewayPermit permit;
        std::uint32_t tenant;
        bool chat;
      };
      std::vector<Held> held;
      auto drop_one = [&] {
        const std::size_t i = rng() % held.size();
        Held h = std::move(held[i]);
        held[i] = std::move(held.back());
        held.pop_back();
        shadow.upstream.fetch_sub(1);
        shadow.tenant[h.tenant].fetch_sub(1);
        if (h.chat) shadow.route.fetch_sub(1);
        h.permit.release();
      };
      for (int op = 0; op < kOps; ++op) {
        if (!held.empty() && (held.size() >= 6 || rng() % 2 == 0)) {
          drop_one();
          continue;
        }
        const std::uint32_t tenant = rng() % kTenants;
        const std::uint32_t which = rng() % 3;
        Admission a = g.try_acquire(targets[tenant][which]);
        if (!a) {
          ASSERT_NE(a.rejection(), nullptr);
          rejected.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        admitted.fetch_add(1, std::memory_order_relaxed);
        Shadow::raise(shadow.upstream, kUpstreamMax, shadow.exceeded);
        Shadow::raise(shadow.tenant[tenant], std::min(kTenantGlobal, kPerTenantMax),
                      shadow.exceeded);
        if (which == 1) Shadow::raise(shadow.route, kRouteMax, shadow.exceeded);
        held.push_back({std::move(a.permit()), tenant, which == 1});
      }
      while (!held.empty()) drop_one();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(shadow.exceeded.load());
  EXPECT_GT(admitted.load(), 1000u);
  EXPECT_GT(rejected.load(), 0u);  // the limits were actually reached
  GatewayMetrics m(g);
  for (const char* level : {"upstream", "per_tenant", "route"})
    EXPECT_EQ(MetricValue(m, "sluice_requests_in_flight",
                          {{"host", "api.example.com"}, {"level", level}}),
              0)
        << level;
  EXPECT_EQ(MetricValue(m, "sluice_requests_in_flight", {{"host", "*"}, {"level", "tenant"}}), 0);
}

// Queue strategy under threads: every call waits (acquire_wait) with a timeout far beyond the
// test's length, so a lost wake-up shows as a timed-out call; the pool is checked at every
// admission.
TEST(GatewayStress, QueuedCallsAreAllServedAndThePoolNeverOverAdmits) {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, std::nullopt}};
  UpstreamConfig u;
  u.id = "api";
  u.host = "api.example.com";
  u.owner = "acme";
  ConcurrencyLimit l;
  l.max_concurrent = 2;
  l.strategy = Strategy::kQueue;
  l.queue = {64, std::chrono::minutes(5)};
  u.concurrency_limit = l;
  c.upstreams = {u};
  GatewayBuild b = Gateway::create(c);
  ASSERT_TRUE(b.gateway) << b.report.to_string();
  Gateway& g = *b.gateway;
  const Target t = g.resolve("acme", "api").target();
  std::atomic<std::uint32_t> in_pool{0};
  std::atomic<bool> exceeded{false};
  std::atomic<int> served{0}, refused{0};
  constexpr int kThreads = 6, kOps = 1500;
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&] {
      for (int op = 0; op < kOps; ++op) {
        Admission a = g.acquire_wait(t, std::chrono::minutes(5));
        if (!a) {
          refused.fetch_add(1);
          continue;
        }
        if (in_pool.fetch_add(1) + 1 > 2) exceeded = true;
        std::this_thread::yield();
        in_pool.fetch_sub(1);
        a.permit().release();
        served.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(exceeded.load());
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(served.load(), kThreads * kOps);
  EXPECT_EQ(MetricValue(GatewayMetrics(g), "sluice_requests_in_flight",
                        {{"host", "api.example.com"}, {"level", "upstream"}}),
            0);
}

// ---- model-based property ----

struct ModelLevel {
  LimitLevel kind;
  std::string key;
  std::uint32_t max;
};
struct ModelPath {
  const char* tenant;
  const char* upstream;
  const char* route;
  std::vector<ModelLevel> levels;  // in acquisition order
};

GatewayConfig model_config() {
  GatewayConfig c;
  c.tenants = {{"root", std::nullopt, 3}, {"a", "root", 2}, {"b", "root", std::nullopt}};
  UpstreamConfig up;
  up.id = "up";
  up.host = "up.example.com";
  up.owner = "root";
  ConcurrencyLimit ul;
  ul.sharing = Sharing::kInherit;
  ul.max_concurrent = 3;
  ul.per_tenant_max = 2;
  up.concurrency_limit = ul;
  up.routes = {{"r", 1}, {"s", std::nullopt}};
  UpstreamConfig priv;
  priv.id = "priv";
  priv.host = "priv.example.com";
  priv.owner = "root";
  ConcurrencyLimit pl;
  pl.sharing = Sharing::kPrivate;
  pl.max_concurrent = 1;
  priv.concurrency_limit = pl;
  c.upstreams = {up, priv};
  ConcurrencyLimit a_up;
  a_up.max_concurrent = 2;  // stricter than the pool's 3: a binding level
  ConcurrencyLimit a_priv;
  a_priv.max_concurrent = 2;  // a private pool of its own
  c.bindings = {{"a", "up", a_up}, {"b", "up", std::nullopt}, {"a", "priv", a_priv}};
  return c;
}

std::vector<ModelPath> model_paths() {
  using L = LimitLevel;
  return {
      {"root",
       "up",
       "",
       {{L::kTenant, "root", 3}, {L::kUpstream, "up", 3}, {L::kPerTenant, "root@up", 2}}},
      {"root",
       "up",
       "r",
       {{L::kTenant, "root", 3},
        {L::kUpstream, "up", 3},
        {L::kPerTenant, "root@up", 2},
        {L::kRoute, "r", 1}}},
      {"a",
       "up",
       "",
       {{L::kTenant, "a", 2},
        {L::kUpstream, "up", 3},
        {L::kBinding, "a@up", 2},
        {L::kPerTenant, "a@up-pt", 2}}},
      {"a",
       "up",
       "r",
       {{L::kTenant, "a", 2},
        {L::kUpstream, "up", 3},
        {L::kBinding, "a@up", 2},
        {L::kPerTenant, "a@up-pt", 2},
        {L::kRoute, "r", 1}}},
      {"b", "up", "s", {{L::kUpstream, "up", 3}, {L::kPerTenant, "b@up", 2}}},
      {"root", "priv", "", {{L::kTenant, "root", 3}, {L::kUpstream, "priv", 1}}},
      {"a", "priv", "", {{L::kTenant, "a", 2}, {L::kUpstream, "priv-a", 2}}},
  };
}

RC_GTEST_PROP(GatewayProperty, MatchesTheModelAndNeverLeaks, ()) {
  GatewayBuild b = Gateway::create(model_config());
  RC_ASSERT(b.gateway != nullptr);
  Gateway& g = *b.gateway;
  const std::vector<ModelPath> paths = model_paths();
  std::map<std::string, std::uint32_t> count;
  struct Held {
    GatewayPermit permit;
    std::size_t path;
  };
  std::vector<Held> held;
  const auto ops = *rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 3));
  for (int op : ops) {
    if (op == 0 && !held.empty()) {
      const auto i = *rc::gen::inRange<std::size_t>(0, held.size());
      for (const auto& l : paths[held[i].path].levels) --count[l.key];
      held[i].permit.release();
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const auto p = *rc::gen::inRange<std::size_t>(0, paths.size());
    const ModelPath& path = paths[p];
    std::optional<LimitLevel> refuser;
    for (const auto& l : path.levels) {
      if (count[l.key] >= l.max) {
        refuser = l.kind;
        break;
      }
    }
    Admission a = g.try_acquire(path.tenant, path.upstream, path.route);
    RC_ASSERT(a.admitted() == !refuser.has_value());
    if (refuser) {
      RC_ASSERT(a.rejection() != nullptr);
      RC_ASSERT(a.rejection()->level == *refuser);
      continue;
    }
    for (const auto& l : path.levels) ++count[l.key];
    held.push_back({std::move(a.permit()), p});
  }
  held.clear();
  GatewayMetrics m(g);
  for (const char* host : {"up.example.com", "priv.example.com"})
    RC_ASSERT(MetricValue(m, "sluice_requests_in_flight",
                          {{"host", host}, {"level", "upstream"}}) == 0.0);
  RC_ASSERT(MetricValue(m, "sluice_requests_in_flight", {{"host", "*"}, {"level", "tenant"}}) ==
            0.0);
}

}  // namespace
}  // namespace sluice
