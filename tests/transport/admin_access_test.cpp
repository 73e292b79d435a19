// Who may use the admin endpoints: with server.admin_token set, a request bearing it (the scheme
// in any case, RFC 9110); without one, this host's own clients only (loopback peers), so a server
// listening on other interfaces takes no rules from the network unless told to.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "sluice/core/clock.h"
#include "transport/http_server.h"

namespace sluice {
namespace {

using server::Engine;
using server::PolicyRegistry;

constexpr const char* kThrottler = R"(
policies:
  db:
    kind: throttler
    metrics:
      load: {probe: loadavg, threshold: 1000}
)";

struct Served {
  explicit Served(const std::string& yaml) : kinds(PolicyRegistry::builtin()) {
    ConfigLoad load = load_config(yaml, kinds);
    EXPECT_TRUE(load.config.has_value());
    auto e = Engine::create(*load.config, clock, kinds);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    engine = std::move(e.value());
  }
  // The status of GET `target` from `peer` with `authorization`.
  unsigned status(const std::string& target, const std::string& peer,
                  const std::string& authorization = "") {
    transport::HttpExchange x;
    x.method = "GET";
    x.target = target;
    x.peer = peer;
    x.authorization = authorization;
    transport::handle_http(*engine, nullptr, x);
    last = x.response;
    return x.status;
  }
  ManualClock clock{std::chrono::seconds(1)};
  PolicyRegistry kinds;
  std::unique_ptr<Engine> engine;
  std::string last;
};

TEST(AdminAccess, WithoutATokenOnlyLoopbackClientsMayChangeRules) {
  Served s(kThrottler);
  const std::string throttle = "/throttler/throttle-app?app=batch&duration=1m";
  for (const char* peer : {"10.1.2.3:40000", "192.168.0.7:1", "2001:db8::1:443", "", "junk"}) {
    EXPECT_EQ(s.status(throttle, peer), 403u) << peer;
    EXPECT_NE(s.last.find("loopback clients only while server.admin_token is unset"),
              std::string::npos)
        << s.last;
  }
  // Checks and listings are for anyone; nothing was throttled.
  const unsigned check = s.status("/throttler/check?app=batch", "10.1.2.3:40000");
  EXPECT_TRUE(check == 200u || check == 429u) << check << " " << s.last;
  ASSERT_EQ(s.status("/throttler/throttled-apps", "10.1.2.3:40000"), 200u);
  EXPECT_EQ(s.last.find("batch"), std::string::npos) << s.last;
  for (const char* peer : {"127.0.0.1:40000", "127.0.0.2:1", "::1:5000", "::ffff:127.0.0.1:80"})
    EXPECT_EQ(s.status(throttle, peer), 200u) << peer << " " << s.last;
  ASSERT_EQ(s.status("/throttler/throttled-apps", "10.1.2.3:40000"), 200u);
  EXPECT_NE(s.last.find("batch"), std::string::npos) << s.last;
}

TEST(AdminAccess, ATokenIsTakenFromAnyHostWithTheBearerSchemeInAnyCase) {
  Served s(std::string("server:\n  admin_token: s3cret\n") + kThrottler);
  const std::string throttle = "/throttler/throttle-app?app=batch&duration=1m";
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1"), 401u);
  EXPECT_EQ(s.status(throttle, "127.0.0.1:1"), 401u);  // a token is set: loopback needs it too
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1", "Bearer wrong"), 401u);
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1", "Basic s3cret"), 401u);
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1", "Bearers3cret"), 401u);
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1", "Bearer s3cret"), 200u);
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1", "bearer s3cret"), 200u);
  EXPECT_EQ(s.status(throttle, "10.1.2.3:1", "BEARER   s3cret"), 200u);
}

TEST(AdminAccess, RulesSetAtRunTimeAreBoundedAndAnExistingOneCanStillChange) {
  Served s(kThrottler);
  const auto throttle = [&](const std::string& app) {
    return s.status("/throttler/throttle-app?app=" + app + "&duration=1m", "127.0.0.1:1");
  };
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(throttle("app-" + std::to_string(i)), 200u) << i;
  const unsigned refused = throttle("one-more");
  EXPECT_TRUE(refused == 400u || refused == 409u) << refused;
  EXPECT_NE(s.last.find("1000 apps have rules set at run time"), std::string::npos) << s.last;
  EXPECT_EQ(throttle("app-7"), 200u);  // a rule that exists changes
  EXPECT_EQ(s.status("/throttler/unthrottle-app?app=app-7", "127.0.0.1:1"), 200u);
  EXPECT_EQ(throttle("one-more"), 200u);  // room again
}

}  // namespace
}  // namespace sluice
