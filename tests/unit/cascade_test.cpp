// The cascade's health arithmetic (sluice/core/cascade.h): success rate from the weighted buckets,
// the sticky bucket and the clean slate, the weight and its floor, and the weighted random order
// checked against its exact distribution with a chi-square test at a fixed seed.
#include "sluice/core/cascade.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

namespace sluice {
namespace {

using Basis = CascadeHealth::Basis;

TEST(CascadeHealth, ACleanSlateCountsAsHealthy) {
  const CascadeHealth h = cascade_health({}, {}, 3);
  EXPECT_EQ(h.basis, Basis::kCleanSlate);
  EXPECT_EQ(h.success_rate, 1);
  EXPECT_EQ(h.weight, 1);
  const std::array<CascadeBucket, 6> empty{};
  EXPECT_EQ(cascade_health(empty, {}, 3).basis, Basis::kCleanSlate);
}

TEST(CascadeHealth, RecentBucketsWeighNewestHeaviestByTheDecay) {
  // Newest first: 10 finished, none succeeded; then 10 finished, all succeeded. With decay 3:
  // (0 * 3 + 10 * 1) / (10 * 3 + 10 * 1) = 0.25.
  const std::array<CascadeBucket, 2> b{{{10, 0}, {10, 10}}};
  const CascadeHealth h = cascade_health(b, {}, 3);
  EXPECT_EQ(h.basis, Basis::kRecent);
  EXPECT_DOUBLE_EQ(h.success_rate, 0.25);
  EXPECT_DOUBLE_EQ(h.weight, 0.25 * 0.25 * 0.25);
  // Decay 1: the plain ratio.
  CascadeHealthOptions flat;
  flat.decay = 1;
  EXPECT_DOUBLE_EQ(cascade_health(b, {}, 3, flat).success_rate, 0.5);
  // Three buckets: 1, 3, 9 from the oldest.
  const std::array<CascadeBucket, 3> c{{{1, 1}, {0, 0}, {1, 0}}};
  EXPECT_DOUBLE_EQ(cascade_health(c, {}, 3).success_rate, 9.0 / 10.0);
}

TEST(CascadeHealth, ANodeFailingEverythingRecentlyWeighsNothingButOneLastSeenFailingIsFloored) {
  const std::array<CascadeBucket, 6> failing{{{5, 0}}};
  const CascadeHealth recent = cascade_health(failing, {100, 100}, 4);
  EXPECT_EQ(recent.basis, Basis::kRecent);  // recent data wins over the sticky bucket
  EXPECT_EQ(recent.weight, 0);

  const std::array<CascadeBucket, 6> quiet{};
  const CascadeHealth sticky = cascade_health(quiet, {8, 0}, 4);
  EXPECT_EQ(sticky.basis, Basis::kSticky);
  EXPECT_EQ(sticky.success_rate, 0);
  EXPECT_DOUBLE_EQ(sticky.weight, 0.0001 / 4);  // the floor on the weight, not the rate
  const CascadeHealth half = cascade_health(quiet, {8, 4}, 4);
  EXPECT_DOUBLE_EQ(half.success_rate, 0.5);
  EXPECT_DOUBLE_EQ(half.weight, 0.125);
  // More successes than calls (a torn read) count as all succeeded, no more.
  EXPECT_EQ(cascade_health(quiet, {2, 7}, 4).success_rate, 1);
}

TEST(CascadeHealth, OptionsAreChecked) {
  EXPECT_EQ(cascade_health_error({}), "");
  CascadeHealthOptions o;
  o.decay = 0.5;
  EXPECT_EQ(cascade_health_error(o), "decay: must be a number >= 1");
  o = {};
  o.exponent = 0;
  EXPECT_EQ(cascade_health_error(o), "exponent: must be a number > 0");
  o = {};
  o.floor_numerator = 2;
  EXPECT_EQ(cascade_health_error(o), "floor: must be in (0, 1]");
}

struct Draws {
  std::mt19937_64 rng{20261125};
  UniformDraw draw() {
    return [this] { return std::uniform_real_distribution<double>(0, 1)(rng); };
  }
};

// Pearson's statistic of `observed` against `expected` probabilities over `n` trials.
double chi_square(const std::vector<double>& expected, const std::vector<int>& observed, int n) {
  double x = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i] * n;
    x += (observed[i] - e) * (observed[i] - e) / e;
  }
  return x;
}

TEST(CascadeOrder, TheWeightedOrderIsDistributedAsSuccessiveWeightedDrawsChiSquare) {
  // Three nodes of weights 1, 2, 3: each of the 6 orders has probability
  // w_a / 6 * w_b / (6 - w_a). 60,000 orders; the 0.1% critical value of chi-square with 5
  // degrees of freedom is 20.52.
  const std::vector<double> w = {1, 2, 3};
  std::map<std::vector<std::size_t>, int> seen;
  Draws d;
  const UniformDraw draw = d.draw();
  std::vector<std::size_t> order;
  constexpr int kTrials = 60'000;
  for (int t = 0; t < kTrials; ++t) {
    weighted_order(w, draw, order);
    ++seen[order];
  }
  std::vector<double> expected;
  std::vector<int> observed;
  std::vector<std::size_t> perm = {0, 1, 2};
  do {
    const double first = w[perm[0]] / 6, second = w[perm[1]] / (6 - w[perm[0]]);
    expected.push_back(first * second);
    observed.push_back(seen[perm]);
  } while (std::next_permutation(perm.begin(), perm.end()));
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_LT(chi_square(expected, observed, kTrials), 20.52);
}

// WeightedDraws, drawn to the end, is the same distribution (the cascade's lazy order).
TEST(CascadeOrder, LazyDrawsAreDistributedAsSuccessiveWeightedDrawsChiSquare) {
  const std::vector<double> w = {1, 2, 3, 0};
  std::map<std::vector<std::size_t>, int> seen;
  Draws d;
  const UniformDraw draw = d.draw();
  std::vector<std::uint8_t> taken;
  constexpr int kTrials = 60'000;
  for (int t = 0; t < kTrials; ++t) {
    WeightedDraws draws(w, taken);
    std::vector<std::size_t> order;
    while (const auto i = draws.next(draw)) order.push_back(*i);
    ASSERT_EQ(order.size(), 4u);
    ASSERT_EQ(order[3], 3u);  // the weight-0 node last
    order.pop_back();
    ++seen[order];
  }
  std::vector<double> expected;
  std::vector<int> observed;
  std::vector<std::size_t> perm = {0, 1, 2};
  do {
    expected.push_back(w[perm[0]] / 6 * w[perm[1]] / (6 - w[perm[0]]));
    observed.push_back(seen[perm]);
  } while (std::next_permutation(perm.begin(), perm.end()));
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_LT(chi_square(expected, observed, kTrials), 20.52);
  // Every weight 0: a uniform order.
  const std::vector<double> zeros = {0, 0, 0};
  std::map<std::vector<std::size_t>, int> uniform;
  for (int t = 0; t < 30'000; ++t) {
    WeightedDraws draws(zeros, taken);
    std::vector<std::size_t> order;
    while (const auto i = draws.next(draw)) order.push_back(*i);
    ++uniform[order];
  }
  std::vector<int> counts;
  for (const auto& [o, count] : uniform) counts.push_back(count);
  EXPECT_EQ(counts.size(), 6u);
  EXPECT_LT(chi_square(std::vector<double>(6, 1.0 / 6), counts, 30'000), 20.52);
}

TEST(CascadeOrder, ZeroWeightsComeLastAndAllZeroIsAUniformShuffle) {
  Draws d;
  const UniformDraw draw = d.draw();
  std::vector<std::size_t> order;
  // A floored node (1e-5) is still before the zero-weight ones.
  const std::vector<double> w = {0, 1, 0, 1e-5, 1};
  for (int t = 0; t < 1000; ++t) {
    weighted_order(w, draw, order);
    ASSERT_EQ(order.size(), 5u);
    EXPECT_TRUE((order[3] == 0 || order[3] == 2) && (order[4] == 0 || order[4] == 2));
    EXPECT_NE(order[0], 3u);
  }
  // Every weight 0: each of the 6 orders equally likely (chi-square, 5 degrees of freedom).
  const std::vector<double> zeros = {0, 0, 0};
  std::map<std::vector<std::size_t>, int> seen;
  constexpr int kTrials = 30'000;
  for (int t = 0; t < kTrials; ++t) {
    weighted_order(zeros, draw, order);
    ++seen[order];
  }
  std::vector<int> observed;
  for (const auto& [o, count] : seen) observed.push_back(count);
  EXPECT_EQ(observed.size(), 6u);
  EXPECT_LT(chi_square(std::vector<double>(6, 1.0 / 6), observed, kTrials), 20.52);
}

TEST(CascadeOrder, TheApproximationPutsAWeightedPickFirstAndTheRestByRate) {
  Draws d;
  const UniformDraw draw = d.draw();
  const std::vector<double> rates = {0.9, 0.5, 1.0, 0.0};
  std::vector<double> weights;
  for (const double r : rates) weights.push_back(r * r * r);
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int> first(4, 0);
  std::vector<std::size_t> order;
  constexpr int kTrials = 40'000;
  for (int t = 0; t < kTrials; ++t) {
    approximate_order(rates, weights, draw, order);
    ++first[order[0]];
    // After the promoted one, descending rate.
    std::vector<std::size_t> rest(order.begin() + 1, order.end());
    EXPECT_TRUE(std::is_sorted(rest.begin(), rest.end(),
                               [&](std::size_t a, std::size_t b) { return rates[a] > rates[b]; }));
  }
  EXPECT_EQ(first[3], 0);  // weight 0 is never promoted
  // The first position is the weighted pick: chi-square over the three weighted nodes, 2
  // degrees of freedom (0.1%: 13.82).
  EXPECT_LT(chi_square({weights[0] / total, weights[1] / total, weights[2] / total},
                       {first[0], first[1], first[2]}, kTrials),
            13.82);
}

}  // namespace
}  // namespace sluice
