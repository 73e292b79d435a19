// shared_rate_sim.h: a deterministic simulation of a shared rate limit's coordinator losing
// writes it acknowledged, with and without the loss rule of sluice/core/shared_rate.h.
//
// What it is: one hot key of a `rate` rule kept at a coordinator, checked one hit at a time by
// Poisson arrivals that offer `load` x the rule's rate, for `duration` (the checks of any number
// of servers merge at the coordinator, which alone decides them). The coordinator
// decides every check with the production apply() on its own clock (the simulation's), as every
// backend does. It snapshots the key's state every `snapshot_every` (Redis's RDB save), and at
// each of `losses` it restarts from its last snapshot (the writes since are gone: a partial
// loss), or from nothing (a total loss); it finds the loss at once (the backends' markers, at
// the first call after the restart), so its origin moves to the loss. Two coordinators run on
// the same arrivals: one applies the loss rule (origin = the last loss found), one does not
// (origin = kNoLoss), as a store that trusted its snapshot would.
//
// Measures, per run: the hits admitted, the excess (admitted hits that the same strategy on a
// state that never lost a write, fed the same admitted hits, refuses: the rule's overshoot),
// the most hits admitted in any interval of one period (over the rate, to compare with the
// strategy's own bound). What the loss rule costs is the difference in hits admitted from a run
// without losses on the same arrivals (the arrivals do not depend on the decisions). The same
// seed gives the same run, bit for bit.
//
// Thread-safety: none (one simulation, one thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/sim/scenarios.h"

namespace sluice::sim {

// The coordinator restarts at `at` from its last snapshot, or from nothing (`total`).
struct CoordinatorLoss {
  Nanos at{0};
  bool total = false;
};

struct SharedRateSimConfig {
  RateRule rule;
  double load = 3.0;  // offered hits per second, as a multiple of limit / period
  Nanos duration = std::chrono::seconds(40);
  Nanos snapshot_every = std::chrono::seconds(1);
  std::vector<CoordinatorLoss> losses;
  bool loss_rule = true;
  std::uint64_t seed = 1;
  Nanos bucket = std::chrono::milliseconds(100);  // the CSV's resolution
};

struct SharedRateSimResult {
  std::uint64_t offered = 0;
  std::uint64_t admitted = 0;
  // Admitted hits the never-losing strategy refuses: over the rule.
  std::uint64_t excess = 0;
  // The most hits admitted in any interval of one period, over the limit.
  double max_per_period = 0;
  // Per bucket: start (s), admitted, excess so far.
  std::vector<std::uint64_t> admitted_per_bucket, excess_per_bucket;
};

// Empty when usable, else what is wrong, naming the field.
[[nodiscard]] std::string validate(const SharedRateSimConfig& config);
[[nodiscard]] SharedRateSimResult run_shared_rate_sim(const SharedRateSimConfig& config);

// The documented scenario: the three strategies at 100 hits/s (GCRA with a burst of 20), 3x load,
// snapshots every second, three partial losses and a total one, each run with and without the loss
// rule: a table, CSV per run and an SVG; claims: no excess with the rule, some without it. `scale`
// < 1 shortens it (for the test suite).
[[nodiscard]] ScenarioOutput shared_rate_loss_scenario(double scale = 1.0, std::uint64_t seed = 7);

}  // namespace sluice::sim
