// The fleet kind's fields at config load: the call deadline, checked against the lease with a
// message that says why, and its default; a fence safety margin of 0.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "server/policies/fleet.h"
#include "sluice/config/config.h"
#include "support/config_of.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

using server::errors_of;
using server::load_yaml;

TEST(FleetConfig, CallDeadlineIsReadAndALeaseLongEnoughForItIsDerived) {
  const ConfigLoad load = load_yaml(R"yaml(policies:
  backend:
    kind: fleet
    heartbeat: 1s
    call_deadline: 30s
)yaml");
  ASSERT_TRUE(load.config.has_value()) << errors_of(load);
  const auto& spec = *load.config->policies.at("backend").as<server::FleetSpec>();
  EXPECT_EQ(spec.guard.call_deadline, seconds(30));
  EXPECT_EQ(spec.guard.lease_in_force(), seconds(30) + seconds(1) + milliseconds(500));
}

TEST(FleetConfig, ACallDeadlineThatCouldOutliveTheLeaseIsRefusedSayingWhy) {
  const ConfigLoad load = load_yaml(R"yaml(policies:
  backend:
    kind: fleet
    heartbeat: 1s
    lease_ttl: 3s
    call_deadline: 2s
)yaml");
  EXPECT_FALSE(load.config.has_value());
  const std::string all = errors_of(load);
  EXPECT_NE(all.find("policies.backend.call_deadline: call_deadline (2000 ms)"), std::string::npos)
      << all;
  EXPECT_NE(all.find("must be shorter than lease_ttl (3000 ms)"), std::string::npos) << all;
  EXPECT_NE(all.find("other nodes take its share"), std::string::npos) << all;
}

TEST(FleetConfig, TheDefaultDeadlineFitsTheDefaultLease) {
  const ConfigLoad load = load_yaml("policies:\n  backend:\n    kind: fleet\n");
  ASSERT_TRUE(load.config.has_value()) << errors_of(load);
  const auto& spec = *load.config->policies.at("backend").as<server::FleetSpec>();
  EXPECT_FALSE(spec.guard.call_deadline.has_value());
  EXPECT_EQ(spec.guard.call_deadline_in_force(), milliseconds(375));  // (2 s - 1 s - 250 ms) / 2
}

// fence_safety_margin: 0 fences exactly when the lease runs out on the node's clock
// (sluice/fleet/fleet_guard.h says when that is safe): accepted, and in force as 0, the default
// call deadline then taking the margin's share. A negative margin is not a duration.
TEST(FleetConfig, AFenceSafetyMarginOfZeroIsAcceptedAndInForce) {
  const ConfigLoad load = load_yaml(R"yaml(policies:
  backend:
    kind: fleet
    heartbeat: 1s
    lease_ttl: 2s
    fence_safety_margin: 0s
)yaml");
  ASSERT_TRUE(load.config.has_value()) << errors_of(load);
  const auto& spec = *load.config->policies.at("backend").as<server::FleetSpec>();
  EXPECT_EQ(spec.guard.fence_margin_in_force(), Nanos{0});
  EXPECT_EQ(spec.guard.call_deadline_in_force(), milliseconds(500));  // (2 s - 1 s - 0) / 2

  const ConfigLoad negative =
      load_yaml("policies:\n  backend:\n    kind: fleet\n    fence_safety_margin: -1s\n");
  EXPECT_FALSE(negative.config.has_value());
  EXPECT_NE(errors_of(negative).find("policies.backend.fence_safety_margin: must be a duration "
                                     "such as 0s, 250ms or 2s, not '-1s'"),
            std::string::npos)
      << errors_of(negative);
}

}  // namespace
}  // namespace sluice
