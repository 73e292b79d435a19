// The fleet simulation (sim/): deterministic, and every scenario's claims hold on shortened runs.
// The full-length tables are in docs/simulations/fleet.md (sluice sim fleet).
#include <gtest/gtest.h>

#include "sluice/sim/fleet_sim.h"
#include "sluice/sim/scenarios.h"

namespace sluice::sim {
namespace {

TEST(FleetSim, SameSeedSameRunDifferentSeedDifferentRun) {
  FleetSimConfig c;
  c.nodes = 3;
  c.duration = std::chrono::seconds(3);
  c.warmup = std::chrono::seconds(1);
  const std::string a = to_csv(run_fleet_sim(c));
  EXPECT_EQ(a, to_csv(run_fleet_sim(c)));
  c.seed = 2;
  EXPECT_NE(a, to_csv(run_fleet_sim(c)));
}

TEST(FleetSim, BadConfigNamesTheField) {
  FleetSimConfig c;
  c.weights = {1, 2};
  EXPECT_NE(c.validate().find("weights"), std::string::npos);
  c = {};
  c.duration = c.warmup;
  EXPECT_NE(c.validate().find("duration"), std::string::npos);
  c = {};
  c.partitions = {Partition{9, {}, {}}};
  EXPECT_NE(c.validate().find("partitions"), std::string::npos);
  EXPECT_EQ(FleetSimConfig{}.validate(), "");
}

TEST(FleetSim, IndependentFixedGuardsOvershootAndTheFleetGuardDoesNot) {
  FleetSimConfig c;
  c.nodes = 4;
  c.algorithm = AlgorithmKind::kFixed;
  c.fixed_limit = c.capacity;
  c.load = 4.0;
  c.duration = std::chrono::seconds(4);
  c.warmup = std::chrono::seconds(1);
  c.guard = GuardKind::kIndependent;
  const FleetSimResult independent = run_fleet_sim(c);
  EXPECT_GT(independent.max_over_capacity, 3.0);
  c.guard = GuardKind::kFleet;
  c.coordinator.acknowledged_handoff = true;
  const FleetSimResult fleet = run_fleet_sim(c);
  EXPECT_LE(fleet.max_over_capacity, 1.0);
  EXPECT_GT(fleet.heartbeats, 100u);
  EXPECT_GT(fleet.goodput, 0.8);
}

class Scenario : public ::testing::TestWithParam<std::string> {};

TEST_P(Scenario, ClaimsHoldOnAShortenedRun) {
  const ScenarioOutput out = run_scenario(GetParam(), 0.3);
  EXPECT_FALSE(out.table.empty());
  EXPECT_FALSE(out.files.empty());
  for (const std::string& f : out.failed_claims) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(FleetSim, Scenario, ::testing::ValuesIn(scenario_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

TEST(FleetSim, UnknownScenarioIsAnError) {
  const ScenarioOutput out = run_scenario("nope");
  ASSERT_EQ(out.failed_claims.size(), 1u);
  EXPECT_NE(out.failed_claims[0].find("nope"), std::string::npos);
}

}  // namespace
}  // namespace sluice::sim
