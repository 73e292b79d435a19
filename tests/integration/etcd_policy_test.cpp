// A fleet policy on an `etcd` coordinator, as a user configures it: two servers (engines) on one
// etcd share the policy's ceiling (never more admitted between them than it, and all of it once
// both hold their shares), and when one closes the other takes the whole of it. Two regions'
// federated policies share one budget per window on it. The config's
// checks name an etcd coordinator's bad settings and the roles it does not serve.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/coordinators.h"
#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string yaml(const std::string& node, const std::string& endpoint) {
  return "server:\n  node_id: " + node +
         "\ncoordinators:\n  cluster:\n    kind: etcd\n    endpoints: [\"" + endpoint +
         "\"]\n    key_prefix: policy-test/\npolicies:\n  f:\n    kind: fleet\n"
         "    coordinator: cluster\n    algorithm: fixed\n    limit: 6\n    heartbeat: 100ms\n"
         "    lease_ttl: 1s\n";
}

// Admits as many calls as `engine` allows (up to 10), then releases them: how many it admitted.
int admit_all(Engine& engine) {
  std::vector<std::string> leases;
  for (int i = 0; i < 10; ++i) {
    auto a = engine.admit(AdmitCall{"f", "k"});
    if (!a.ok() || !a.value().admitted) break;
    leases.push_back(a.value().lease_id);
  }
  for (const std::string& l : leases)
    EXPECT_TRUE(engine.release(l, CallResult::kSuccess, std::nullopt).ok());
  return static_cast<int>(leases.size());
}

TEST(EtcdPolicy, TwoServersShareTheCeilingAndOneTakesItAllWhenTheOtherCloses) {
  testing::EtcdCluster etcd;
  const Status started = etcd.start(1);
  ASSERT_TRUE(started.ok()) << started.to_string();
  auto a = Engine::create(config_of(yaml("a", etcd.endpoint(0))), SteadyClock::instance());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = Engine::create(config_of(yaml("b", etcd.endpoint(0))), SteadyClock::instance());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  // Held at once (a call admitted stays admitted while the other server admits): never above 6.
  int both = 0;
  const auto until = std::chrono::steady_clock::now() + seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    std::vector<std::pair<Engine*, std::string>> held;
    for (Engine* e : {a.value().get(), b.value().get()})
      for (int i = 0; i < 10; ++i) {
        auto r = e->admit(AdmitCall{"f", "k"});
        if (!r.ok() || !r.value().admitted) break;
        held.emplace_back(e, r.value().lease_id);
      }
    both = static_cast<int>(held.size());
    ASSERT_LE(both, 6) << "two servers admitted more than the fleet's ceiling";
    for (const auto& [e, lease] : held)
      EXPECT_TRUE(e->release(lease, CallResult::kSuccess, std::nullopt).ok());
    if (both == 6) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(both, 6);  // each holds its share of 3 (after the first use's window)
  a.value()->close();
  int alone = 0;
  const auto later = std::chrono::steady_clock::now() + seconds(10);
  while (std::chrono::steady_clock::now() < later && (alone = admit_all(*b.value())) < 6)
    std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(alone, 6) << "the closed server's share never came back";
  b.value()->close();
}

// Two regions' servers, each with a federated policy on one etcd, share one budget per window:
// never more admitted in a window of the etcd coordinator's clock (here every server's: one
// machine) than the limit between them, counted by when each check returned (escrow ends
// 2 x max_clock_offset = 200 ms before its window does), and both admit. The first window is a
// first use's, counted as spent.
TEST(EtcdPolicy, TwoRegionsShareOneFederatedBudget) {
  testing::EtcdCluster etcd;
  const Status started = etcd.start(1);
  ASSERT_TRUE(started.ok()) << started.to_string();
  const auto config = [&](const std::string& region) {
    return "coordinators:\n  cluster:\n    kind: etcd\n    endpoints: [\"" + etcd.endpoint(0) +
           "\"]\n    key_prefix: fed-test/\n    max_clock_offset: 100ms\npolicies:\n  g:\n"
           "    kind: federated\n    coordinator: cluster\n    budget: api\n    region: " +
           region + "\n    limit: 30\n    window: 1s\n    batch: 4\n";
  };
  auto eu = Engine::create(config_of(config("eu")), SteadyClock::instance());
  ASSERT_TRUE(eu.ok()) << eu.status().to_string();
  auto us = Engine::create(config_of(config("us")), SteadyClock::instance());
  ASSERT_TRUE(us.ok()) << us.status().to_string();
  std::map<std::int64_t, int> by_window;  // window (s since the epoch) -> admitted
  int admitted[2] = {0, 0};
  std::set<std::string> reasons;
  const auto until = std::chrono::steady_clock::now() + milliseconds(3500);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 2; ++i) {
      Engine& e = i == 0 ? *eu.value() : *us.value();
      auto d = e.check(CheckCall{"g", "user", 1});
      const std::int64_t after = unix_ns_now().count() / 1'000'000'000;
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      if (!d.value().allowed) {
        reasons.insert(std::string(d.value().reason));
        continue;
      }
      ++admitted[i];
      ++by_window[after];
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
  for (const auto& [window, n] : by_window) EXPECT_LE(n, 30) << "window " << window;
  EXPECT_GT(admitted[0], 0);
  EXPECT_GT(admitted[1], 0);
  EXPECT_GE(by_window.size(), 2u);
  EXPECT_TRUE(reasons.contains("budget_spent")) << "the budget never ran out";
  eu.value()->close();
  us.value()->close();
}

TEST(EtcdPolicy, TheConfigNamesBadSettingsAndRolesItDoesNotServe) {
  const ConfigLoad bad = load_yaml(
      "coordinators:\n  c:\n    kind: etcd\n    endpoints: [\"nohost\"]\n    username: u\n"
      "policies:\n  f:\n    kind: fleet\n    coordinator: c\n    limit: 4\n");
  ASSERT_FALSE(bad.config.has_value());
  const std::string m = errors_of(bad);
  EXPECT_NE(m.find("endpoints"), std::string::npos) << m;
  EXPECT_NE(m.find("password"), std::string::npos) << m;
  // Shared rate limits are not served on etcd; federation is, with its clock offset checked.
  const ConfigLoad role = load_yaml(
      "coordinators:\n  c:\n    kind: etcd\npolicies:\n  p:\n    kind: rate\n"
      "    coordinator: c\n    limit: 100\n");
  ASSERT_FALSE(role.config.has_value());
  EXPECT_NE(errors_of(role).find("etcd"), std::string::npos) << errors_of(role);
  const ConfigLoad offset = load_yaml(
      "coordinators:\n  c:\n    kind: etcd\n    max_clock_offset: -5ms\npolicies:\n  g:\n"
      "    kind: federated\n    coordinator: c\n    region: eu\n    limit: 100\n"
      "    window: 1s\n");
  ASSERT_FALSE(offset.config.has_value());
  EXPECT_NE(errors_of(offset).find("max_clock_offset"), std::string::npos) << errors_of(offset);
  // The TLS files are read before connecting: one that is not there is what `sluice validate`
  // reports, naming the setting.
  const ConfigLoad tls = load_yaml(
      "coordinators:\n  c:\n    kind: etcd\n    ca_file: /nonexistent/ca.pem\npolicies:\n"
      "  f:\n    kind: fleet\n    coordinator: c\n    algorithm: fixed\n    limit: 4\n");
  ASSERT_TRUE(tls.config.has_value()) << errors_of(tls);
  const std::vector<ConfigError> before =
      check_before_connecting(*tls.config, PolicyRegistry::builtin());
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].path, "coordinators.c");
  EXPECT_NE(before[0].message.find("ca_file: cannot read '/nonexistent/ca.pem'"), std::string::npos)
      << before[0].message;
}

}  // namespace
}  // namespace sluice::server
