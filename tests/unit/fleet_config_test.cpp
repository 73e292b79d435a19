// The fleet kind's fields at config load: the call deadline, checked against the lease with a
// message that says why, and its default.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "server/policies/fleet.h"
#include "sluice/config.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

ConfigLoad load_yaml(std::string_view yaml) {
  return load_config(yaml, server::PolicyRegistry::builtin());
}

std::string errors_of(const ConfigLoad& load) {
  std::string all;
  for (const ConfigError& e : load.errors) all += e.to_string("t") + "\n";
  return all;
}

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

}  // namespace
}  // namespace sluice
