// cascade.h: the health arithmetic of the fallback cascade (send each call to the healthiest
// node that has room), pure: a node's success rate from its stat buckets, its weight, and the
// weighted random order the cascade walks.
//
// Success rate (a node's stat buckets: `historical` newest first, plus the `sticky` bucket that
// keeps the last non-empty bucket to age out of the window):
//   - finished calls in the historical buckets: the ratio of successes to finished calls, each
//     bucket's counts weighted `decay` times the next older one's (newest heaviest), so a node
//     going bad shows within a bucket;
//   - none there, but the sticky bucket has some: its own ratio (a node that stopped getting
//     calls, for its health or for lack of traffic, keeps what was last known of it);
//   - neither: 1 (a clean slate counts as healthy, so a new node competes with known ones).
//
// Weight: the rate to the power `exponent` (3 by default), and, for a node judged by its sticky
// bucket alone, never below `floor_numerator / nodes` (0.0001 / nodes by default). That floor is
// on the WEIGHT. Flooring the rate instead and then cubing it, as the cascade's source describes,
// gives a node last seen failing everything (0.0001/3 = 3.3e-5 with three nodes) a weight of
// (3.3e-5)^3 = 3.7e-14: next to two healthy nodes of weight 1 it would come first once in about
// 5e13 orders, and with the cascade's traffic it would never be tried again -- against the
// source's own promise that such a node "could be brought back into service quickly at a high
// request rate". Floored as a weight it comes first once in 2 / 3.3e-5 = 60,000 orders: at
// 10,000 calls a second it gets a call every few seconds, which is what brings it back (and
// costs little if it is still bad). A node whose recent buckets show 0% success has weight 0: it
// is not picked while any other node can be (it stays last in the order, tried only when every
// other node is full).
//
// Order (weighted_order): an exact weighted random permutation -- the order of successive draws
// without replacement, each node drawn with probability its weight over the weights left. It is
// made in one pass by Efraimidis and Spirakis' method: each node of weight w > 0 gets the key
// u^(1/w) for u uniform in (0, 1), and the nodes sorted by descending key are distributed exactly
// as those successive draws (O(n log n), one random number per node, no rejection). It is used
// rather than the source's cheaper approximation because it is exact for every position, not
// only the first: a cascade that overflows to its second and third choices spreads that
// overflow in proportion to health too. Nodes of weight 0 follow, in uniform random order; when
// every weight is 0 the whole order is a uniform random shuffle (no node is preferred, none is
// left out). approximate_order() is the source's approximation (shuffle, stable-sort by
// descending rate, promote one weighted pick to the front), for callers that want it.
//
// WeightedDraws makes the same order lazily, one node at a time, by the successive draws
// themselves (a cumulative-weight scan per draw, one random number): O(n) for the first node
// instead of O(n log n) and a random number per node. A cascade usually stops at its first
// choice, so that is what acquire() uses.
//
// Thread-safety: pure functions; the random source is the caller's (one per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace sluice {

// One stat bucket: calls finished, and how many of them succeeded (<= finished).
struct CascadeBucket {
  std::uint32_t finished = 0;
  std::uint32_t succeeded = 0;
};

struct CascadeHealthOptions {
  double decay = 3;                 // each bucket weighs this many times the next older (>= 1)
  double exponent = 3;              // weight = rate ^ exponent (> 0)
  double floor_numerator = 0.0001;  // the sticky-only weight floor is this / nodes
  friend bool operator==(const CascadeHealthOptions&, const CascadeHealthOptions&) = default;
};

// Why `o` is unusable, naming the field; empty when it is fine.
[[nodiscard]] std::string_view cascade_health_error(const CascadeHealthOptions& o) noexcept;

struct CascadeHealth {
  enum class Basis { kRecent, kSticky, kCleanSlate };
  Basis basis = Basis::kCleanSlate;
  double success_rate = 1;  // in [0, 1]
  double weight = 1;        // >= 0
};

// A node's health from its `historical` buckets (newest first) and its `sticky` bucket, among
// `nodes` nodes (>= 1).
[[nodiscard]] CascadeHealth cascade_health(std::span<const CascadeBucket> historical,
                                           CascadeBucket sticky, std::size_t nodes,
                                           const CascadeHealthOptions& o = {});

// A uniform draw in [0, 1): the caller's random source.
using UniformDraw = std::function<double()>;

// The indices 0..weights.size()-1 in an exact weighted random order (see above). Weights must
// be >= 0 and finite (a negative or non-finite weight counts as 0).
void weighted_order(std::span<const double> weights, const UniformDraw& draw,
                    std::vector<std::size_t>& order);

// The source's approximation: shuffle, order by descending `rates` (stable), then move one node
// picked with probability weight / total weight to the front (none when every weight is 0).
// Successive weighted draws without replacement over `weights` (which must outlive it): next()
// is distributed as the next position of weighted_order() given the positions drawn before;
// nullopt once every node was drawn.
class WeightedDraws {
 public:
  // `taken` is scratch (one flag per node), reused across draws.
  WeightedDraws(std::span<const double> weights, std::vector<std::uint8_t>& taken);
  [[nodiscard]] std::optional<std::size_t> next(const UniformDraw& draw);

 private:
  std::span<const double> weights_;
  std::vector<std::uint8_t>& taken_;
  double total_ = 0;          // the positive weights not drawn yet
  std::size_t positive_ = 0;  // how many of them
  std::size_t zero_ = 0;      // weight-0 nodes not drawn yet
};

void approximate_order(std::span<const double> rates, std::span<const double> weights,
                       const UniformDraw& draw, std::vector<std::size_t>& order);

}  // namespace sluice
