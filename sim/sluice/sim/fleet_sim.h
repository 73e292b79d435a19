// fleet_sim.h: a deterministic discrete-event simulation of a fleet in front of one backend.
//
// What it is: N nodes, each with Poisson arrivals, admit calls to one shared backend through
// either their own AdaptiveGuard (independent: the fan-out regime) or a FleetGuard sharing one
// MemoryCoordinator (the fleet guard). Everything runs on one ManualClock in one thread: the
// same seed gives the same run, bit for bit. The production code is used as is: the guards,
// the limit algorithms, the heartbeat core; the simulation supplies time, the network between
// nodes and the coordinator (each report and each grant reply takes `one_way` to arrive, so
// grants are applied late and reports are stale: the asynchronous fleet), and the backend.
//
// Backend: capacity C (calls it serves at once without queueing) and base latency b. A call
// admitted while n calls are in flight (itself included) takes b * max(1, n / C): C parallel
// workers behind a queue. A caller gives up at `call_timeout`: the call ends there (the
// backend drops it) and counts as a timeout, released as dropped. Goodput = calls completed
// within the timeout per second, as a fraction of the backend's ideal C / b.
//
// A node can also freeze (a stop-the-world pause, SIGSTOP, a VM stall): while frozen it handles
// nothing (arrivals to it are lost, its beats, replies and releases wait until it thaws), but
// the calls it admitted go on in the backend until they end, or until their deadline when the
// backend honours it (honour_deadline: the caller passed FleetPermit::deadline() on).
//
// Thread-safety: none (one simulation, one thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/fleet.h"
#include "sluice/fleet/fleet_guard.h"

namespace sluice::sim {

enum class GuardKind : std::uint8_t {
  kIndependent,  // an AdaptiveGuard per node, no coordination
  kFleet,        // a FleetGuard per node, one MemoryCoordinator
};

enum class AlgorithmKind : std::uint8_t { kFixed, kVegas, kGradient2, kAimd };

[[nodiscard]] std::string_view to_string(GuardKind k) noexcept;
[[nodiscard]] std::string_view to_string(AlgorithmKind k) noexcept;

// A node's heartbeats hang (never reach the coordinator, no reply) during [start, end).
struct Partition {
  int node = 0;
  Nanos start{0};
  Nanos end{0};
};

// A node is frozen (handles nothing) during [start, end).
struct Freeze {
  int node = 0;
  Nanos start{0};
  Nanos end{0};
};

struct FleetSimConfig {
  int nodes = 8;
  std::uint32_t capacity = 40;                         // C
  Nanos base_latency = std::chrono::milliseconds(10);  // b
  Nanos call_timeout = std::chrono::milliseconds(40);
  // Offered load as a multiple of the backend's ideal throughput C / b, over all nodes.
  double load = 1.5;
  // Relative arrival rates per node (skew); empty: equal.
  std::vector<double> weights;
  // When each node starts (joins); empty: all at 0.
  std::vector<Nanos> join_at;
  GuardKind guard = GuardKind::kFleet;
  AlgorithmKind algorithm = AlgorithmKind::kVegas;
  std::uint32_t fixed_limit = 40;  // L_local of AlgorithmKind::kFixed
  CoordinatorConfig coordinator;
  Nanos heartbeat = std::chrono::milliseconds(100);
  bool eager_handoff = false;
  bool self_fence = true;
  OutageMode outage = OutageMode::kFailClosed;
  std::optional<Nanos> lease_ttl;  // the guard's; unset: its default
  // The guard's call_deadline; unset: call_timeout when the guard accepts it, else its default.
  std::optional<Nanos> call_deadline;
  // The backend stops a call at its deadline (the caller passed it on); false: calls run on.
  bool honour_deadline = true;
  std::vector<Freeze> freezes;
  Nanos call_timeout_coordinator = std::chrono::milliseconds(100);  // the guard's call_timeout
  Nanos one_way = std::chrono::milliseconds(2);  // node <-> coordinator, each way
  std::vector<Partition> partitions;
  // When the coordinator loses every key's state (a Redis back empty). With loss_rule it knows
  // (MemoryCoordinator::lose_state: share 0 for one lease_ttl); without, a coordinator that
  // knows nothing of the fleet takes its place (the behaviour before the rule).
  std::vector<Nanos> coordinator_losses;
  bool loss_rule = true;
  bool abort_on_fence = true;  // on_fenced aborts the node's in-flight calls
  Nanos duration = std::chrono::seconds(20);
  Nanos warmup = std::chrono::seconds(2);  // excluded from the summary figures
  Nanos sample_every = std::chrono::milliseconds(5);
  std::uint64_t seed = 1;

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

struct Sample {
  Nanos t{0};
  std::uint32_t in_flight = 0;    // sum over nodes (what the backend holds)
  std::uint32_t l_global = 0;     // the coordinator's ceiling in force (0 when independent)
  std::uint32_t l_aggregate = 0;  // the aggregate of L_local it is moving to
  std::uint32_t shares = 0;       // sum of the coordinator's live shares (0 when independent)
  std::vector<std::uint32_t> node_in_flight;
  std::vector<std::uint32_t> node_share;  // the share each guard enforces (ceiling if indep.)
};

struct FleetSimResult {
  std::vector<Sample> samples;
  // After warmup:
  double max_over_capacity = 0;   // max sum(in_flight) / C
  double mean_over_capacity = 0;  // mean sum(in_flight) / C
  double max_over_l_global = 0;   // max sum(in_flight) / L_global (fleet only)
  std::uint32_t samples_over_l_global = 0;
  std::uint32_t samples_draining = 0;  // L_global held above the aggregate while calls drain
  double utilization = 0;  // mean sum(in_flight) / L_global (fleet) or / C (independent)
  double goodput = 0;      // completions within the timeout per second / (C / b)
  std::uint64_t arrivals = 0, admitted = 0, rejected = 0, completed = 0, timeouts = 0, aborted = 0;
  std::uint64_t heartbeats = 0, off_cycle_beats = 0, fences = 0;
  double mean_latency_ms = 0;
  // Per node: when its enforced share first reached its fair share floor(L_global / nodes)
  // after it joined (nullopt: never).
  std::vector<std::optional<Nanos>> fair_share_at;
  // When the last node joins after the others: how long until every earlier node enforced a
  // grant that counts it (nullopt: some never did, or no node joined late).
  std::optional<Nanos> incumbents_noticed_after;
};

// Runs one simulation. Precondition: config.validate() is empty.
[[nodiscard]] FleetSimResult run_fleet_sim(const FleetSimConfig& config);

// The samples as CSV: t_ms, in_flight, l_global, shares, then in_flight_<i> and share_<i>.
[[nodiscard]] std::string to_csv(const FleetSimResult& result);

// A line plot (SVG) of sum(in_flight) with L_global and C as references, and optionally each
// node's share; `x_label` names the horizontal axis (time by default).
struct PlotSeries {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (seconds, value)
  bool dashed = false;
};
// `v` printed with the printf format `format` (one double: "%.2f"), for the scenarios' tables.
[[nodiscard]] std::string number(const char* format, double v);

[[nodiscard]] std::string svg_plot(const std::string& title, const std::string& y_label,
                                   const std::vector<PlotSeries>& series,
                                   const std::string& x_label = "time (s)");

}  // namespace sluice::sim
