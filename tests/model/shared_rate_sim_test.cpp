// The shared rate loss simulation (sim/shared_rate_sim.h): the documented scenario's claims hold
// on a shortened run (no hit over the rule with the loss rule, some without it, for every
// strategy), a run is the same for the same seed, and a bad config names its field.
#include "sluice/sim/shared_rate_sim.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace sluice::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(SharedRateSim, TheLossRuleKeepsEveryStrategyWithinItsRuleAndWithoutItTheyGoOver) {
  const ScenarioOutput out = shared_rate_loss_scenario(0.25);
  for (const std::string& f : out.failed_claims) ADD_FAILURE() << f;
  EXPECT_NE(out.table.find("| gcra | on |"), std::string::npos) << out.table;
  EXPECT_EQ(out.files.size(), 7u);  // six CSV and the plot
}

SharedRateSimConfig gcra_with_losses(bool rule) {
  SharedRateSimConfig c;
  c.rule.strategy = RateStrategy::kGcra;
  c.rule.limit = 50;
  c.rule.period = seconds(1);
  c.duration = seconds(6);
  c.losses = {{milliseconds(2500), false}, {milliseconds(4700), true}};
  c.loss_rule = rule;
  c.seed = 3;
  return c;
}

TEST(SharedRateSim, SameSeedSameRunAndTheRuleCostsHitsWhereNoRuleOvershoots) {
  const SharedRateSimResult a = run_shared_rate_sim(gcra_with_losses(true));
  const SharedRateSimResult b = run_shared_rate_sim(gcra_with_losses(true));
  EXPECT_EQ(a.admitted, b.admitted);
  EXPECT_EQ(a.admitted_per_bucket, b.admitted_per_bucket);
  EXPECT_EQ(a.excess, 0u);
  const SharedRateSimResult off = run_shared_rate_sim(gcra_with_losses(false));
  EXPECT_EQ(off.offered, a.offered);  // the same arrivals
  EXPECT_GT(off.excess, 0u);
  // Without losses the coordinator is the exact strategy: the rule costs hits against it, and
  // the restored keys without it admit more than it.
  SharedRateSimConfig none = gcra_with_losses(true);
  none.losses.clear();
  const SharedRateSimResult exact = run_shared_rate_sim(none);
  EXPECT_EQ(exact.offered, a.offered);
  EXPECT_EQ(exact.excess, 0u);
  EXPECT_LT(a.admitted, exact.admitted);
  EXPECT_GT(off.admitted, exact.admitted);
  EXPECT_LE(exact.max_per_period, 2.0);  // burst (= limit) + a period's emissions
}

TEST(SharedRateSim, ABadConfigNamesTheField) {
  SharedRateSimConfig c = gcra_with_losses(true);
  c.rule.limit = 0;
  EXPECT_EQ(validate(c).rfind("rule:", 0), 0u) << validate(c);
  c = gcra_with_losses(true);
  c.losses = {{seconds(3), false}, {seconds(2), false}};
  EXPECT_EQ(validate(c).rfind("losses:", 0), 0u) << validate(c);
  c = gcra_with_losses(true);
  c.load = 0;
  EXPECT_EQ(validate(c).rfind("load:", 0), 0u) << validate(c);
  EXPECT_TRUE(validate(gcra_with_losses(true)).empty());
}

}  // namespace
}  // namespace sluice::sim
