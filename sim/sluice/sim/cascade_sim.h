// cascade_sim.h: a deterministic discrete-event simulation of a client spreading calls over the
// replicas of one backend, some of them failing: the fallback cascade against round-robin,
// random and power-of-two-choices.
//
// What it is: Poisson arrivals at `rate` per second, for `duration`, each sent to one of `nodes`
// nodes that a strategy picks. The strategies run on the same arrivals and the same node
// behaviour (see "Same traffic" below):
//   cascade       the production FallbackCascade (sluice/local/fallback_cascade.h) with the
//                 strategy's FallbackCascadeOptions, on the simulation's ManualClock and a
//                 seeded UniformDraw; each call is finished with how it went;
//   round-robin   node (call number mod nodes);
//   random        a uniformly random node;
//   p2c           power of two choices: two distinct random nodes, the one with fewer calls
//                 in flight (the first drawn on a tie).
// Every node has the same concurrency limit (`limit`, an AdaptiveGuard with a fixed algorithm)
// under every strategy: the cascade walks on to the next node when one is full and refuses only
// when every node is; the other strategies refuse a call whose picked node is full (a failure).
//
// Node behaviour, decided when a call is sent, from the node's state at that time:
//   healthy    success after base + Exp(mean base) (a latency draw);
//   kSlow      success after slow_factor x that latency;
//   kDown      a fast error after error_latency (CascadeOutcome::kFailed);
//   kBlackHole no answer: the caller's timeout ends the call (kTimeout);
//   kShedding  with probability `fraction` a fast refusal as overloaded after error_latency
//              (an HTTP 429: kOverload), else as healthy;
//   kFailing   with probability `fraction` a fast error (kFailed), else as healthy.
// A call whose latency reaches `timeout` ends at the timeout as kTimeout. A node is bad while a
// FaultSpell covers it, healthy otherwise.
//
// Same traffic: the arrival times and, for each call, its two uniform draws (outcome, latency)
// come from one generator seeded with `seed`; the strategies' own random choices come from a
// second one. So every strategy sees the same calls at the same times, and a node in a given
// state treats a given call the same way whichever strategy sent it there. The same seed gives
// the same run, bit for bit.
//
// Measures: see CascadeSimResult. Shares are counted in windows of `window` (1 s) aligned on
// the start: a node's share of a window is the calls it took (admitted under its limit) over
// the calls that arrived in it; the fair share is 1 / nodes.
//
// Thread-safety: none (one simulation, one thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/local/fallback_cascade.h"
#include "sluice/sim/scenarios.h"

namespace sluice::sim {

enum class NodeFault : std::uint8_t { kDown, kBlackHole, kSlow, kShedding, kFailing };

[[nodiscard]] std::string_view to_string(NodeFault f) noexcept;

// Node `node` behaves as `fault` during [start, end).
struct FaultSpell {
  int node = 0;
  Nanos start{0};
  Nanos end = Nanos::max();
  NodeFault fault = NodeFault::kDown;
  double fraction = 1;  // kShedding, kFailing: the probability a call is refused / fails
};

struct CascadeScenario {
  std::string name;
  std::string description;
  std::vector<FaultSpell> spells;
  // Whether some node is healthy throughout (the success-rate claim applies).
  bool healthy_node = true;
};

enum class StrategyKind : std::uint8_t { kCascade, kRoundRobin, kRandom, kPowerOfTwo };

struct CascadeStrategy {
  std::string name;
  StrategyKind kind = StrategyKind::kCascade;
  FallbackCascadeOptions cascade;  // kCascade only
  // Whether the recovery claim (a healed node back within six buckets) is checked for it.
  bool recovery_claim = true;
};

struct CascadeSimConfig {
  int nodes = 5;
  std::uint32_t limit = 32;                            // each node's concurrency limit
  double rate = 1000;                                  // arrivals per second, all nodes
  Nanos duration = std::chrono::seconds(120);          // arrivals stop then; calls finish
  Nanos base_latency = std::chrono::milliseconds(10);  // a healthy call: base + Exp(mean base)
  double slow_factor = 10;                             // kSlow: this many times the latency
  Nanos error_latency = std::chrono::milliseconds(1);  // a fast error or 429
  Nanos timeout = std::chrono::seconds(1);             // the caller gives up
  Nanos window = std::chrono::seconds(1);              // share windows
  std::uint64_t seed = 1;

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

// One window of the run: calls that arrived in it, those of them that succeeded, and the calls
// each node took.
struct CascadeWindow {
  std::uint32_t arrivals = 0;
  std::uint32_t succeeded = 0;
  std::vector<std::uint32_t> taken;
};

struct CascadeSimResult {
  std::uint64_t arrivals = 0;
  std::uint64_t succeeded = 0, timeouts = 0, overloads = 0, failed = 0;
  std::uint64_t refused = 0;  // no node taken: the picked node (cascade: every node) was full
  double success_rate = 0;    // succeeded / arrivals
  // The 99th percentile of the time a caller waited for a call a node took, whatever its
  // outcome (a timeout counts as `timeout`); refused calls have none.
  Nanos p99{0};
  std::uint64_t calls_to_bad = 0;  // calls a node took while it was bad
  // The watched node: the node the scenario's spells concern when they concern one node.
  std::optional<int> watched;
  // From the start of its first bad spell to the end of the first window, starting at or after
  // it and before its last spell ends, where its share was below 10% of the fair share.
  std::optional<Nanos> detect;
  // When detected: from the end of its last bad spell to the end of the first window, starting
  // at or after it, where its share was at least 50% of the fair share.
  std::optional<Nanos> recover;
  Nanos observed_after_heal{0};  // from that end to the end of the run's last window
  std::vector<CascadeWindow> windows;
  std::vector<std::uint64_t> node_taken, node_succeeded;  // per node, over the run
  std::uint32_t max_in_flight = 0;  // most calls one node held at once (<= limit)
};

// Runs one strategy through one scenario. Precondition: config.validate() is empty and every
// spell names a node below config.nodes.
[[nodiscard]] CascadeSimResult run_cascade_sim(const CascadeSimConfig& config,
                                               const CascadeScenario& scenario,
                                               const CascadeStrategy& strategy);

// The scenarios of `sluice sim cascade` for `nodes` nodes (node 0 is the one that goes bad).
[[nodiscard]] std::vector<CascadeScenario> cascade_scenarios(int nodes = 5);
// The strategies compared, the cascade variants first.
[[nodiscard]] std::vector<CascadeStrategy> cascade_strategies();

// `sluice sim cascade`: every strategy through every scenario (or the one named): the table, the
// all-degraded scenario's shares against the nodes' weights, CSV and SVG. Claims: each cascade's
// success rate is at least round-robin's in every scenario with a healthy node, and higher
// wherever round-robin lost a call; every strategy with recovery_claim brings a healed node back
// (its share to 50% of the fair share) within its window, six buckets of 5 s by default; in
// all-degraded, each cascade without breakers gives the nodes it still calls shares close to
// their weights' (a breaker opens on a node that fails calls in a row, so one with breakers is
// reported, not held to it).
struct CascadeEvaluationOptions {
  std::string scenario = "all";
  std::uint64_t seed = 1;
  double rate = 1000;                          // CascadeSimConfig::rate
  Nanos duration = std::chrono::seconds(120);  // CascadeSimConfig::duration (>= 80 s: the
                                               // scenarios' spells end by 75 s)
};
[[nodiscard]] ScenarioOutput run_cascade_evaluation(const CascadeEvaluationOptions& options);

}  // namespace sluice::sim
