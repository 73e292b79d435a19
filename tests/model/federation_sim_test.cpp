// The federation simulation (sim/federation_sim.cpp): deterministic; the production
// FederatedLimiter never admits more than the limit in a window at any skew, and pools the
// budget (U_capacity >= 0.98 at every skew) where a static partition binds the hot region at
// L / K and independent limiters overshoot. The full table is in docs/simulations/federation.md
// (sluice sim federation).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <tuple>

#include "sluice/sim/federation_sim.h"

namespace sluice::sim {
namespace {

FederationSimConfig config(FederationScheme scheme, double skew, int windows = 10) {
  FederationSimConfig c;
  c.scheme = scheme;
  c.skew = skew;
  c.windows = windows;
  return c;
}

std::string summary(const FederationSimResult& r) {
  std::string out;
  for (const FederationWindow& w : r.windows)
    out += std::to_string(w.offered) + "/" + std::to_string(w.admitted) + "/" +
           std::to_string(w.handed_out) + "/" + std::to_string(w.leases) + " ";
  return out;
}

TEST(FederationSim, SameSeedSameRunDifferentSeedDifferentRun) {
  FederationSimConfig c = config(FederationScheme::kFederated, 0.5, 3);
  const std::string a = summary(run_federation_sim(c));
  EXPECT_EQ(a, summary(run_federation_sim(c)));
  c.seed = 2;
  EXPECT_NE(a, summary(run_federation_sim(c)));
}

// On callers' clocks (the etcd coordinator's time): regions 20 ms behind, right and ahead, the
// hot one the slowest. With the coordinator saying an uncertainty of 40 ms no window, counted on
// the fastest clock, goes over the limit; saying 0, one does (20 windows: the docs' run).
TEST(FederationSim, OnCallersClocksTheUncertaintyKeepsEveryWindowWithinTheLimit) {
  using std::chrono::milliseconds;
  for (const double skew : {0.0, 0.5, 1.0}) {
    FederationSimConfig c = config(FederationScheme::kFederated, skew, 20);
    c.clock_offsets = {milliseconds(-20), Nanos{0}, milliseconds(20)};
    c.clock_uncertainty = milliseconds(40);
    ASSERT_EQ(c.validate(), "");
    const FederationSimResult with = run_federation_sim(c);
    EXPECT_LE(with.max_admitted_over_limit, 1.0) << "skew " << skew << ": " << summary(with);
    EXPECT_GE(with.u_capacity, 0.98) << "skew " << skew;
    c.clock_uncertainty = Nanos{0};
    const FederationSimResult without = run_federation_sim(c);
    if (skew == 0.5) {
      EXPECT_GT(without.max_admitted_over_limit, 1.0) << summary(without);
    }
  }
  FederationSimConfig bad = config(FederationScheme::kFederated, 0);
  bad.clock_offsets = {Nanos{0}};
  EXPECT_EQ(bad.validate(), "clock_offsets: one per region");
  bad.clock_offsets.clear();
  bad.clock_uncertainty = std::chrono::milliseconds(1);
  EXPECT_EQ(bad.validate(), "clock_uncertainty: needs clock_offsets");
}

// Charges after the response (each admitted check charges 0..8 more hits 20 ms later): what a
// window spends (its admissions and the charges paid in it) never exceeds the limit, charges
// are paid from the budget, and what no budget covers is forgiven.
TEST(FederationSim, ChargesNeverLetAWindowSpendMoreThanTheLimit) {
  for (const double skew : {0.0, 0.5, 1.0}) {
    FederationSimConfig c = config(FederationScheme::kFederated, skew);
    c.charge_max = 8;
    const FederationSimResult r = run_federation_sim(c);
    std::uint64_t admitted = 0, charged = 0, forgiven = 0, spent = 0;
    for (const FederationWindow& w : r.windows) {
      EXPECT_LE(w.spent, c.limit) << "skew " << skew << ": " << summary(r);
      EXPECT_GE(w.spent, w.admitted) << "skew " << skew;
      admitted += w.admitted;
      charged += w.charged;
      forgiven += w.forgiven;
      spent += w.spent;
    }
    EXPECT_LE(r.max_spent_over_limit, 1.0);
    EXPECT_GT(charged, 0U);
    EXPECT_GT(spent, admitted) << "charges paid from the budget, skew " << skew;
    EXPECT_GT(forgiven, 0U) << "at 1.2 x L some charges find the budget spent, skew " << skew;
    EXPECT_LE(forgiven, charged);
    // Every charged hit is paid (spent beyond the admissions) or forgiven, but for what is
    // still owed at the run's end (a few hits per region).
    EXPECT_LE(spent - admitted + forgiven, charged);
  }
}

TEST(FederationSim, BadConfigNamesTheField) {
  EXPECT_EQ(FederationSimConfig{}.validate(), "");
  FederationSimConfig c;
  c.skew = 1.5;
  EXPECT_NE(c.validate().find("skew"), std::string::npos);
  c = {};
  c.batch = 0;
  EXPECT_NE(c.validate().find("batch"), std::string::npos);
  c = {};
  c.one_way = c.window;
  EXPECT_NE(c.validate().find("one_way"), std::string::npos);
  c = {};
  c.load = 0;
  EXPECT_NE(c.validate().find("load"), std::string::npos);
  c = {};
  c.hits = c.limit + 1;
  EXPECT_EQ(c.validate(), "hits: must be in 1..limit");
  c.hits = 0;
  EXPECT_EQ(c.validate(), "hits: must be in 1..limit");
  c = {};
  c.charge_max = 4;
  c.scheme = FederationScheme::kStatic;
  EXPECT_EQ(c.validate(), "charge_max: needs the federated scheme");
}

// (skew, offered load / limit). At 1.2 x L the budget runs out before each window ends; at
// exactly L regions still hold escrow when a window ends, which is where an expiry too late
// would show as a window over the limit.
class BySkew : public ::testing::TestWithParam<std::tuple<double, double>> {
 protected:
  FederationSimConfig config_of(FederationScheme scheme) const {
    FederationSimConfig c = config(scheme, std::get<0>(GetParam()));
    c.load = std::get<1>(GetParam());
    return c;
  }
};

// The bound in every window, and the pooling, at the default batch and a 2 ms round trip.
TEST_P(BySkew, FederatedNeverOvershootsAndPoolsTheBudget) {
  const FederationSimResult r = run_federation_sim(config_of(FederationScheme::kFederated));
  for (std::size_t k = 0; k < r.windows.size(); ++k) {
    const FederationWindow& w = r.windows[k];
    EXPECT_LE(w.admitted, 1000u) << "window " << k;
    // What the coordinator handed out for a window covers what was admitted in it.
    EXPECT_LE(w.admitted, w.handed_out) << "window " << k;
    EXPECT_LE(w.handed_out, 1000u) << "window " << k;
  }
  EXPECT_LE(r.max_admitted_over_limit, 1.0);
  EXPECT_GE(r.u_capacity, 0.98);
  // Escrow, not a call per request: about one lease per batch of 16.
  EXPECT_LT(r.leases_per_admission, 0.1);
}

// Just below s = 1 the cold regions see a few requests per window. Were a key's first lease in
// a window a whole batch there, most of it would expire unspent in every cold region while the
// hot one is refused (0.978 at s = 0.99): a quiet key leases what it spent the window before.
TEST(FederationSim, QuietRegionsStrandLittleJustBelowFullSkew) {
  for (const double skew : {0.95, 0.99}) {
    FederationSimConfig c = config(FederationScheme::kFederated, skew);
    c.load = 1.2;
    const FederationSimResult r = run_federation_sim(c);
    EXPECT_LE(r.max_admitted_over_limit, 1.0) << "s = " << skew;
    EXPECT_GE(r.u_capacity, 0.98) << "s = " << skew;
  }
}

TEST_P(BySkew, StaticPartitionNeverOvershoots) {
  const FederationSimResult r = run_federation_sim(config_of(FederationScheme::kStatic));
  EXPECT_LE(r.max_admitted_over_limit, 1.0);
}

INSTANTIATE_TEST_SUITE_P(FederationSim, BySkew,
                         ::testing::Combine(::testing::ValuesIn(federation_skews()),
                                            ::testing::Values(1.2, 1.0)),
                         [](const auto& info) {
                           return "s" +
                                  std::to_string(static_cast<int>(std::get<0>(info.param) * 100)) +
                                  "_load" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param) * 10));
                         });

// An 80 ms round trip (regions on other continents): checks queue while a lease is in flight,
// and the next lease asks for all of them, so a region is not held to one batch per round trip
// (16 / 80 ms = 200 per second, a fifth of the limit).
TEST(FederationSim, AnEightyMillisecondRoundTripStillPoolsTheBudget) {
  for (const double skew : {0.0, 1.0}) {
    FederationSimConfig c = config(FederationScheme::kFederated, skew);
    c.one_way = std::chrono::milliseconds(40);
    const FederationSimResult r = run_federation_sim(c);
    EXPECT_LE(r.max_admitted_over_limit, 1.0) << "s = " << skew;
    EXPECT_GE(r.u_capacity, 0.9) << "s = " << skew;
  }
}

TEST(FederationSim, StaticPartitionBindsTheHotRegionAtItsShare) {
  const FederationSimResult r = run_federation_sim(config(FederationScheme::kStatic, 1.0));
  EXPECT_NEAR(r.u_capacity, 1.0 / 3, 0.01);
  // Uniform load over the three shares: the partition costs nothing.
  EXPECT_GE(run_federation_sim(config(FederationScheme::kStatic, 0.0)).u_capacity, 0.999);
}

TEST(FederationSim, IndependentLimitersOvershoot) {
  // 1.2 x L offered, 0.4 x L per region: each region's own limit of L admits all of it.
  const FederationSimResult r = run_federation_sim(config(FederationScheme::kIndependent, 0.0));
  EXPECT_GT(r.max_admitted_over_limit, 1.1);
  EXPECT_GT(r.mean_admitted_over_limit, 1.1);
}

TEST(FederationSim, ScenarioClaimsHold) {
  FederationScenarioOptions o;
  o.windows = 5;
  const ScenarioOutput out = run_federation_scenario(o);
  EXPECT_NE(out.table.find("| skew | static U_capacity | federated U_capacity | max admitted per "
                           "window / limit | independent admitted / limit |"),
            std::string::npos);
  // The regional pool's and the coordinator outage's tables (federation_pool_sim_test.cpp
  // asserts their bounds).
  EXPECT_NE(out.table.find("### Three processes per region, with and without a regional pool"),
            std::string::npos);
  EXPECT_NE(out.table.find("### Coordinator outage"), std::string::npos);
  bool plotted = false, outage_plotted = false, pool_csv = false;
  for (const auto& [name, content] : out.files) {
    if (name == "federation-load-1.2.svg")
      plotted = content.find("skew s") != std::string::npos &&
                content.find("<polyline") != std::string::npos;
    if (name == "federation-outage.svg")
      outage_plotted = content.find("regional-only") != std::string::npos &&
                       content.find("<polyline") != std::string::npos;
    if (name == "federation-pool.csv") pool_csv = content.find("\n0.75,3,64,") != std::string::npos;
  }
  EXPECT_TRUE(plotted);
  EXPECT_TRUE(outage_plotted);
  EXPECT_TRUE(pool_csv);
  for (const std::string& f : out.failed_claims) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace sluice::sim
