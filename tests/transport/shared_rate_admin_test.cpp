// POST /admin/rate/{policy}/adopt over the HTTP API: a shared rate policy on a Redis no shared
// rate limit has used counts every key as spent at its first call (a loss it cannot rule out);
// the operator who knows the Redis is new adopts it, and the key is decided on its own state
// from then on (the refusal the loss made is no longer cached either). A local rate policy, or
// an unknown name, is refused naming it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"
#include "transport/http_server.h"

namespace sluice::transport {
namespace {

std::pair<unsigned, std::string> call(server::Engine& e, const std::string& method,
                                      const std::string& target, const std::string& body = {}) {
  HttpExchange x;
  x.method = method;
  x.target = target;
  x.body = body;
  x.peer = "127.0.0.1:1";  // loopback: admin routes need no token when none is set
  handle_http(e, nullptr, x);
  return {x.status, x.response};
}

bool allowed(server::Engine& e, const std::string& key) {
  const auto [status, body] =
      call(e, "POST", "/v1/check", R"({"policy":"api","key":")" + key + R"("})");
  EXPECT_TRUE(status == 200 || status == 429) << status << " " << body;
  return status == 200;
}

TEST(SharedRateAdmin, AdoptingANewRedisEndsTheFirstUseLoss) {
  testing::RedisServer redis;
  ASSERT_TRUE(redis.start().ok());
  const std::string yaml = "coordinators:\n  shared:\n    kind: redis\n    address: 127.0.0.1:" +
                           std::to_string(redis.port()) +
                           "\npolicies:\n  api:\n    kind: rate\n    strategy: fixed-window\n"
                           "    limit: 5\n    period: 1000s\n    coordinator: shared\n"
                           "  local:\n    kind: rate\n    limit: 5\n";
  ConfigLoad load = load_config(yaml, server::PolicyRegistry::builtin());
  ASSERT_TRUE(load.config.has_value());
  auto e = server::Engine::create(*load.config, SteadyClock::instance());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  // A Redis met for the first time: the key counts as spent for its window.
  EXPECT_FALSE(allowed(*e.value(), "k"));
  const auto [status, body] = call(*e.value(), "POST", "/admin/rate/api/adopt");
  ASSERT_EQ(status, 200u) << body;
  EXPECT_EQ(nlohmann::json::parse(body)["adopted"], true);
  int admitted = 0;
  for (int i = 0; i < 8; ++i) admitted += allowed(*e.value(), "k");
  EXPECT_EQ(admitted, 5);
  const auto local = call(*e.value(), "POST", "/admin/rate/local/adopt");
  EXPECT_EQ(local.first, 400u);
  EXPECT_NE(local.second.find("keeps no keys at a coordinator"), std::string::npos) << local.second;
  const auto unknown = call(*e.value(), "POST", "/admin/rate/nope/adopt");
  EXPECT_EQ(unknown.first, 404u);
  EXPECT_NE(unknown.second.find("'nope'"), std::string::npos) << unknown.second;
  EXPECT_EQ(call(*e.value(), "GET", "/admin/rate/api/adopt").first, 405u);
  // A name that is not UTF-8 is answered (404), not an exception.
  const auto bytes = call(*e.value(), "POST", "/admin/rate/%FF%FE/adopt");
  EXPECT_EQ(bytes.first, 404u) << bytes.second;
}

}  // namespace
}  // namespace sluice::transport
