// The federation simulation with several processes per region (sim/federation_sim.cpp): three
// processes sharing a regional pool never admit more than the limit in a window, lose little
// U_capacity against three processes leasing for themselves, and cost fewer coordinator leases;
// in a coordinator outage fail-closed admits nothing beyond a window's own grants, and
// regional-only admits beyond them at most what the pools held at the outage's onset (the
// degraded bound). The tables are in docs/simulations/federation.md (sluice sim federation).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "sluice/sim/federation_sim.h"

namespace sluice::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// How much U_capacity a pool may cost against the processes leasing for themselves (the
// scenario's claim; 0.015 measured at s = 0.75 over 20 windows).
constexpr double kPoolMargin = 0.03;

FederationSimConfig processes(double skew, bool pool, int m = 3, int windows = 10) {
  FederationSimConfig c;
  c.skew = skew;
  c.windows = windows;
  c.processes = m;
  c.regional_pool = pool;
  return c;
}

FederationSimConfig outage(double load, Nanos start, FederationOutage mode,
                           OutageFailure failure = OutageFailure::kRefused) {
  FederationSimConfig c = processes(0.5, true, 3, 12);
  c.load = load;
  c.outage_start = start;
  c.outage_end = start + seconds(3);
  c.outage = mode;
  c.outage_failure = failure;
  return c;
}

std::string summary(const FederationSimResult& r) {
  std::string out;
  for (const FederationWindow& w : r.windows)
    out += std::to_string(w.offered) + "/" + std::to_string(w.admitted) + "/" +
           std::to_string(w.handed_out) + "/" + std::to_string(w.leases) + " ";
  return out + std::to_string(r.onset_pool_balance) + " " + std::to_string(r.beyond_grants);
}

// What the degraded bound allows beyond the windows' own grants: the pools' balance at the
// onset and the refills in flight then (leases the coordinator decided before it).
std::uint64_t onset_bound(const FederationSimResult& r) {
  return r.onset_pool_balance + r.refilled_in_outage;
}

std::uint64_t most_admitted(const FederationSimResult& r) {
  std::uint64_t most = 0;
  for (const FederationWindow& w : r.windows) most = std::max(most, w.admitted);
  return most;
}

TEST(FederationPoolSim, SameSeedSameRunWithPoolsAndAnOutage) {
  FederationSimConfig c = outage(0.6, milliseconds(4900), FederationOutage::kRegionalOnly);
  c.windows = 8;
  const std::string a = summary(run_federation_sim(c));
  EXPECT_EQ(a, summary(run_federation_sim(c)));
  c.seed = 2;
  EXPECT_NE(a, summary(run_federation_sim(c)));
}

TEST(FederationPoolSim, BadConfigNamesTheField) {
  const auto names = [](const FederationSimConfig& c, const std::string& field) {
    return c.validate().find(field) != std::string::npos;
  };
  FederationSimConfig c = processes(0.5, true);
  EXPECT_EQ(c.validate(), "");
  c.processes = 0;
  EXPECT_TRUE(names(c, "processes"));
  c = processes(0.5, false);
  c.scheme = FederationScheme::kStatic;
  EXPECT_TRUE(names(c, "processes"));
  c = processes(0.5, true, 1);
  c.scheme = FederationScheme::kIndependent;
  EXPECT_TRUE(names(c, "regional_pool"));
  c = processes(0.5, false);
  c.regional_batch = 64;
  EXPECT_TRUE(names(c, "regional_batch"));
  c = outage(1.2, seconds(4), FederationOutage::kFailClosed);
  c.outage_end = seconds(3);
  EXPECT_TRUE(names(c, "outage_end"));
  c = outage(1.2, seconds(4), FederationOutage::kRegionalOnly);
  c.regional_pool = false;
  EXPECT_TRUE(names(c, "outage"));
  c = outage(1.2, seconds(4), FederationOutage::kRegionalOnly);
  c.coordinator_health_check = Nanos{0};
  EXPECT_TRUE(names(c, "coordinator_health_check"));
}

class PoolBySkew : public ::testing::TestWithParam<double> {};

// Three processes per region, with and without a pool, at 1.2 x L: the bound in every window,
// the pool used, its U_capacity within the margin and its coordinator cost lower.
TEST_P(PoolBySkew, APoolKeepsTheBoundAndCostsFewerLeases) {
  const FederationSimResult own = run_federation_sim(processes(GetParam(), false));
  const FederationSimResult pooled = run_federation_sim(processes(GetParam(), true));
  for (const FederationSimResult* r : {&own, &pooled}) {
    for (std::size_t k = 0; k < r->windows.size(); ++k) {
      EXPECT_LE(r->windows[k].admitted, 1000u) << "window " << k;
      EXPECT_LE(r->windows[k].admitted, r->windows[k].handed_out) << "window " << k;
    }
    EXPECT_LE(r->max_admitted_over_limit, 1.0);
  }
  EXPECT_EQ(own.pool_taken, 0u);
  EXPECT_GT(pooled.pool_taken, 0u);
  EXPECT_GE(pooled.u_capacity, own.u_capacity - kPoolMargin);
  EXPECT_LT(pooled.leases_per_admission, own.leases_per_admission);
}

INSTANTIATE_TEST_SUITE_P(FederationPoolSim, PoolBySkew, ::testing::ValuesIn(federation_skews()),
                         [](const auto& info) {
                           return "s" + std::to_string(static_cast<int>(info.param * 100));
                         });

// The coordinator's cost grows with the processes of a region that lease for themselves; with
// a pool it stays well below (nine processes: 0.064 against 0.093 lease calls per admission).
TEST(FederationPoolSim, APoolHoldsTheLeaseCostDownAsProcessesGrow) {
  const FederationSimResult own = run_federation_sim(processes(0.5, false, 9));
  const FederationSimResult pooled = run_federation_sim(processes(0.5, true, 9));
  EXPECT_LE(pooled.max_admitted_over_limit, 1.0);
  EXPECT_LE(own.max_admitted_over_limit, 1.0);
  EXPECT_LT(pooled.leases_per_admission, 0.8 * own.leases_per_admission);
}

// Fail-closed: a window never admits more than the limit nor anything beyond its own grants,
// the windows wholly inside the outage admit nothing, and leasing resumes after it.
TEST(FederationPoolSim, FailClosedOutageAdmitsNothingBeyondAWindowsGrants) {
  for (const OutageFailure failure : {OutageFailure::kRefused, OutageFailure::kTimeout}) {
    for (const auto& [load, start] :
         {std::pair{1.2, milliseconds(4500)}, std::pair{0.6, milliseconds(4900)}}) {
      const FederationSimResult r =
          run_federation_sim(outage(load, start, FederationOutage::kFailClosed, failure));
      const std::string at = std::string(to_string(failure)) + ", load " + std::to_string(load);
      for (std::size_t k = 0; k < r.windows.size(); ++k) {
        EXPECT_LE(r.windows[k].admitted, 1000u) << at << ", window " << k;
        EXPECT_LE(r.windows[k].admitted, r.windows[k].handed_out) << at << ", window " << k;
      }
      EXPECT_EQ(r.beyond_grants, 0u) << at;
      EXPECT_GT(r.onset_pool_balance, 0u) << at;  // the pools held units it did not serve
      for (const std::size_t k : {5u, 6u}) {
        EXPECT_EQ(r.windows[k].admitted, 0u) << at << ", window " << k;
        EXPECT_GT(r.windows[k].refused_unreachable, 0u) << at << ", window " << k;
      }
      EXPECT_EQ(r.outages, 0u) << at;
      const FederationWindow& last = r.windows.back();
      EXPECT_GE(last.admitted,
                0.95 * static_cast<double>(std::min<std::uint64_t>(last.offered, 1000)))
          << at;
    }
  }
}

// Regional-only: the pools' balance serves past its window, by at most what they held at the
// onset (with the refills in flight then), in total and in any one window over the limit; the
// late onset at 0.6 x L leaves units in the pools that fail-closed never serves. Leasing resumes
// once a probe finds the coordinator back.
TEST(FederationPoolSim, RegionalOnlyOutageStaysWithinWhatThePoolsHeldAtTheOnset) {
  for (const OutageFailure failure : {OutageFailure::kRefused, OutageFailure::kTimeout}) {
    for (const auto& [load, start] :
         {std::pair{1.2, milliseconds(4500)}, std::pair{0.6, milliseconds(4900)}}) {
      const FederationSimResult r =
          run_federation_sim(outage(load, start, FederationOutage::kRegionalOnly, failure));
      const std::string at = std::string(to_string(failure)) + ", load " + std::to_string(load);
      EXPECT_GT(r.outages, 0u) << at;
      EXPECT_LE(r.beyond_grants, onset_bound(r)) << at;
      EXPECT_LE(most_admitted(r), 1000 + onset_bound(r)) << at;
      std::uint64_t spent = 0;
      for (const FederationWindow& w : r.windows) spent += w.refused_balance_spent;
      EXPECT_GT(spent, 0u) << at;
      if (load < 1) {
        EXPECT_GT(r.beyond_grants, 0u) << at;  // the mode did serve past its window
      }
      const FederationWindow& last = r.windows.back();
      EXPECT_GE(last.admitted,
                0.95 * static_cast<double>(std::min<std::uint64_t>(last.offered, 1000)))
          << at;
    }
  }
}

// The same bound across seeds and onsets, the pools holding units at the window's end.
TEST(FederationPoolSim, RegionalOnlyBoundAcrossSeedsAndOnsets) {
  for (const std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    for (const int start_ms : {4500, 4900, 4990}) {
      FederationSimConfig c = outage(0.6, milliseconds(start_ms), FederationOutage::kRegionalOnly);
      c.seed = seed;
      c.windows = 8;
      c.coordinator_health_check = milliseconds(100);
      const FederationSimResult r = run_federation_sim(c);
      EXPECT_LE(r.beyond_grants, onset_bound(r)) << "seed " << seed << ", onset " << start_ms;
      EXPECT_LE(most_admitted(r), 1000 + onset_bound(r)) << "seed " << seed;
    }
  }
}

}  // namespace
}  // namespace sluice::sim
