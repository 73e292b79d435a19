#include "sluice/sim/scenarios.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "sluice/sim/fleet_sim.h"

namespace sluice::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

Nanos scaled(Nanos d, double scale) {
  return Nanos{static_cast<std::int64_t>(static_cast<double>(d.count()) * scale)};
}

// A plot series of at most ~1000 points: each point is the largest value of its stride (peaks,
// which the plots are about, survive the thinning).
std::vector<std::pair<double, double>> series(const FleetSimResult& r, auto value,
                                              Nanos from = Nanos{0}, Nanos to = Nanos::max()) {
  std::vector<const Sample*> in;
  for (const Sample& s : r.samples)
    if (s.t >= from && s.t <= to) in.push_back(&s);
  std::vector<std::pair<double, double>> out;
  const std::size_t stride = std::max<std::size_t>(1, in.size() / 1000);
  for (std::size_t i = 0; i < in.size(); i += stride) {
    double peak = 0;
    for (std::size_t j = i; j < std::min(i + stride, in.size()); ++j)
      peak = std::max(peak, static_cast<double>(value(*in[j])));
    out.emplace_back(std::chrono::duration<double>(in[i]->t).count(), peak);
  }
  return out;
}

// A horizontal reference line over the span of `like`.
PlotSeries reference(const std::string& label, double y, const PlotSeries& like) {
  PlotSeries s{label, "#000000", {}, true};
  if (!like.points.empty())
    s.points = {{like.points.front().first, y}, {like.points.back().first, y}};
  return s;
}

// Nodes with L_local fixed at the backend's capacity C = 40 (so L_global = C at all times).
FleetSimConfig fixed_fleet(int nodes, double load) {
  FleetSimConfig c;
  c.nodes = nodes;
  c.capacity = 40;
  c.fixed_limit = 40;
  c.algorithm = AlgorithmKind::kFixed;
  c.load = load;
  return c;
}

void claim(ScenarioOutput& out, bool holds, const std::string& what) {
  if (!holds) out.failed_claims.push_back(what);
}

// ---- fan-out ----

ScenarioOutput fan_out(double scale) {
  ScenarioOutput out{"fan-out", {}, {}, {}};
  struct Row {
    std::string label;
    GuardKind guard;
    AlgorithmKind algorithm;
    bool handoff;
    Nanos one_way = milliseconds(2);
  };
  const std::vector<Row> rows = {
      {"independent, fixed limit C per node", GuardKind::kIndependent, AlgorithmKind::kFixed,
       false},
      {"independent, Vegas", GuardKind::kIndependent, AlgorithmKind::kVegas, false},
      {"independent, Gradient2", GuardKind::kIndependent, AlgorithmKind::kGradient2, false},
      {"independent, AIMD", GuardKind::kIndependent, AlgorithmKind::kAimd, false},
      {"fleet guard, fixed L_local = C, default", GuardKind::kFleet, AlgorithmKind::kFixed, false},
      {"fleet guard, fixed L_local = C, handoff", GuardKind::kFleet, AlgorithmKind::kFixed, true},
      {"fleet guard, Vegas, default", GuardKind::kFleet, AlgorithmKind::kVegas, false},
      {"fleet guard, Vegas, handoff", GuardKind::kFleet, AlgorithmKind::kVegas, true},
      {"fleet guard, fixed L_local = C, default, staggered joins, 30 ms one-way", GuardKind::kFleet,
       AlgorithmKind::kFixed, false, milliseconds(30)},
      {"fleet guard, fixed L_local = C, handoff, staggered joins, 30 ms one-way", GuardKind::kFleet,
       AlgorithmKind::kFixed, true, milliseconds(30)},
      {"fleet guard, Vegas, handoff, staggered joins, 30 ms one-way", GuardKind::kFleet,
       AlgorithmKind::kVegas, true, milliseconds(30)},
  };
  out.table =
      "N = 8 nodes, backend C = 40, base latency 10 ms, caller timeout (the call deadline) 40 ms, "
      "offered load 4.0x the backend's ideal throughput, heartbeat 100 ms, node-coordinator "
      "one-way delay 2 ms (lease 200 ms); staggered joins: node i joins at 5 s + i x 0.9 s, "
      "one-way delay 30 ms (lease 300 ms). L_global is the ceiling in force: it follows the "
      "aggregate of the nodes' estimates up at once and down only as fast as in-flight calls "
      "drain; 'draining' counts the samples where it is held above the aggregate.\n\n"
      "| guards | max Σ in-flight / C | mean Σ in-flight / C | max Σ in-flight / L_global | "
      "samples over L_global | draining | goodput (of C / b) | timeouts |\n"
      "|---|---|---|---|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  const std::vector<std::string> colors = {"#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
                                           "#1f77b4", "#bcbd22", "#2ca02c", "#9467bd", "#17becf"};
  std::size_t k = 0;
  for (const Row& row : rows) {
    FleetSimConfig c;
    c.nodes = 8;
    c.capacity = 40;
    c.fixed_limit = 40;
    c.load = 4.0;
    c.guard = row.guard;
    c.algorithm = row.algorithm;
    c.coordinator.acknowledged_handoff = row.handoff;
    c.one_way = row.one_way;
    if (row.one_way > milliseconds(2)) {
      // A 60 ms round trip: the lease must cover heartbeat + round trip + margin + the 40 ms
      // call deadline (else each node refuses calls while its next grant is on its way).
      c.lease_ttl = milliseconds(300);
      // Membership changes while the budget is re-split: node i joins at 5 s + i * 0.9 s.
      c.join_at.assign(8, Nanos{0});
      for (int i = 1; i < 8; ++i)
        c.join_at[static_cast<std::size_t>(i)] =
            scaled(seconds(5), scale) + scaled(milliseconds(900), scale) * i;
    }
    c.duration = scaled(seconds(20), scale);
    c.warmup = scaled(seconds(5), scale);
    const FleetSimResult r = run_fleet_sim(c);
    const bool fleet = row.guard == GuardKind::kFleet;
    out.table += "| " + row.label + " | " + number("%.2f", r.max_over_capacity) + " | " +
                 number("%.2f", r.mean_over_capacity) + " | " +
                 (fleet ? number("%.3f", r.max_over_l_global) : "-") + " | " +
                 (fleet ? std::to_string(r.samples_over_l_global) : "-") + " | " +
                 (fleet ? std::to_string(r.samples_draining) : "-") + " | " +
                 number("%.1f%%", 100 * r.goodput) + " | " + std::to_string(r.timeouts) + " |\n";
    const std::string file = "fan-out-" + std::to_string(k) + ".csv";
    out.files.emplace_back(file, to_csv(r));
    const bool plotted =
        (row.guard == GuardKind::kIndependent &&
         (row.algorithm == AlgorithmKind::kFixed || row.algorithm == AlgorithmKind::kVegas)) ||
        (fleet && row.handoff);
    if (plotted)
      plot.push_back({row.label, colors[k % colors.size()],
                      series(r, [](const Sample& s) { return s.in_flight / 40.0; }), false});
    if (row.guard == GuardKind::kIndependent && row.algorithm == AlgorithmKind::kFixed)
      claim(out, r.max_over_capacity >= 6.0,
            "independent guards with L = C should overshoot to ~N x C, measured " +
                number("%.2f", r.max_over_capacity));
    const bool staggered = row.one_way > milliseconds(2);
    // Every fleet row with handoff, the Vegas joins included: a joiner's initial guess does not
    // count toward the aggregate, and L_global falls no faster than in-flight drains.
    if (fleet && row.handoff)
      claim(out, r.max_over_l_global <= 1.0,
            row.label + ": sum(in_flight) / L_global must stay <= 1.0, measured " +
                number("%.3f", r.max_over_l_global));
    if (fleet && row.algorithm != AlgorithmKind::kFixed && !staggered)
      claim(out, r.goodput >= 0.95,
            row.label + ": goodput must be >= 95% of C, measured " +
                number("%.1f%%", 100 * r.goodput));
    if (fleet && !row.handoff)
      claim(out, r.max_over_l_global <= 2.0,
            row.label + ": the default mode's residual must stay bounded (<= 2x), measured " +
                number("%.3f", r.max_over_l_global));
    ++k;
  }
  plot.push_back(reference("C (the backend's capacity)", 1.0, plot.front()));
  out.files.emplace_back("fan-out.svg", svg_plot("Fan-out: 8 nodes, one backend (C = 40)",
                                                 "sum(in_flight) / C", plot));
  return out;
}

// ---- join ramp ----

ScenarioOutput join_ramp(double scale) {
  ScenarioOutput out{"join-ramp", {}, {}, {}};
  struct Row {
    std::string label;
    bool handoff;
    bool eager;
  };
  const std::vector<Row> rows = {{"default (occupancy cap)", false, false},
                                 {"acknowledged handoff", true, false},
                                 {"acknowledged handoff + eager handoff", true, true}};
  const Nanos join = scaled(seconds(5), scale) + milliseconds(37);
  out.table =
      "4 busy nodes (fixed L_local = C = 40, offered load 2.0x), a fifth joins at t = " +
      number("%.3f", std::chrono::duration<double>(join).count()) +
      " s; heartbeat 100 ms (debounce 10 ms), one-way delay 2 ms, calls of 10 ms. Ramp: from "
      "the join until the joiner's share reaches floor(L_global / 5) = 8. Eager handoff is "
      "guard-side only, so the incumbents learn of the joiner at their next periodic beat (up to "
      "one heartbeat); the ramp after that is the part eager handoff shortens, toward the "
      "physical floor: the incumbents' calls drain and a round trip carries the freed budget.\n\n" +
      "| mode | ramp (ms) | ramp (heartbeats) | incumbents noticed the joiner after (ms) | "
      "ramp after that (ms) | max Σ in-flight / L_global after the join | off-cycle beats |\n"
      "|---|---|---|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  const std::vector<std::string> colors = {"#d62728", "#1f77b4", "#2ca02c"};
  std::vector<double> ramps, after_notice;
  std::size_t k = 0;
  for (const Row& row : rows) {
    FleetSimConfig c = fixed_fleet(5, 2.0);
    c.join_at = {Nanos{0}, Nanos{0}, Nanos{0}, Nanos{0}, join};
    c.coordinator.acknowledged_handoff = row.handoff;
    c.eager_handoff = row.eager;
    c.duration = join + seconds(3);
    c.warmup = join;
    c.sample_every = milliseconds(1);
    const FleetSimResult r = run_fleet_sim(c);
    const auto& at = r.fair_share_at.back();
    const double ramp_ms = at ? std::chrono::duration<double, std::milli>(*at).count() : -1;
    ramps.push_back(ramp_ms);
    const auto& noticed = r.incumbents_noticed_after;
    const double noticed_ms =
        noticed ? std::chrono::duration<double, std::milli>(*noticed).count() : -1;
    after_notice.push_back(at && noticed ? ramp_ms - noticed_ms : -1);
    out.table += "| " + row.label + " | " + (at ? number("%.0f", ramp_ms) : "never") + " | " +
                 (at ? number("%.2f", ramp_ms / 100.0) : "-") + " | " +
                 (noticed ? number("%.0f", noticed_ms) : "never") + " | " +
                 (at && noticed ? number("%.0f", ramp_ms - noticed_ms) : "-") + " | " +
                 number("%.3f", r.max_over_l_global) + " | " + std::to_string(r.off_cycle_beats) +
                 " |\n";
    out.files.emplace_back("join-ramp-" + std::to_string(k) + ".csv", to_csv(r));
    plot.push_back({row.label + ": joiner's share", colors[k],
                    series(
                        r, [](const Sample& s) { return double(s.node_share.back()); },
                        join - milliseconds(100), join + milliseconds(400)),
                    false});
    claim(out, at.has_value(), row.label + ": the joiner never reached its fair share");
    if (row.handoff)
      claim(out, r.max_over_l_global <= 1.0,
            row.label + ": sum(in_flight) / L_global must stay <= 1.0, measured " +
                number("%.3f", r.max_over_l_global));
    ++k;
  }
  // Eager handoff: near the floor (at most one heartbeat to notice, then drain + round trip,
  // plus the 10 ms debounce), and faster than handoff without it.
  claim(out, ramps[2] >= 0 && ramps[2] <= 100 + 10 + 2 * 4 + 10,
        "eager handoff's ramp must be within one heartbeat + drain + round trip + debounce, "
        "measured " +
            number("%.0f ms", ramps[2]));
  // Once the incumbents know, eager handoff's remaining ramp is the physical floor: their
  // calls drain (10 ms calls) and a round trip (4 ms) plus the joiner's 10 ms debounce.
  claim(out, after_notice[2] >= 0 && after_notice[2] <= 10 + 4 + 10 + 10,
        "after the incumbents noticed, eager handoff's ramp must be near drain + round trip, "
        "measured " +
            number("%.0f ms", after_notice[2]));
  claim(out, ramps[2] >= 0 && ramps[1] >= 0 && ramps[2] < ramps[1],
        "eager handoff must ramp faster than acknowledged handoff alone");
  plot.push_back(reference("fair share", 8.0, plot.front()));
  out.files.emplace_back("join-ramp.svg",
                         svg_plot("Join ramp: the joiner's share (fair share 8)", "share", plot));
  return out;
}

// ---- partition ----

ScenarioOutput partition(double scale) {
  ScenarioOutput out{"partition", {}, {}, {}};
  const Nanos start = scaled(seconds(5), scale), end = start + scaled(seconds(5), scale);
  out.table =
      "4 busy nodes (fixed L_local = C = 40, offered load 2.0x), heartbeat 100 ms, lease 200 ms, "
      "fail-closed; node 0's heartbeats hang (no error, no reply) from t = " +
      number("%.1f", std::chrono::duration<double>(start).count()) + " s to " +
      number("%.1f", std::chrono::duration<double>(end).count()) +
      " s; the coordinator call timeout is 10 s (longer than the partition), so only the fence "
      "bounds the stale share. With self-fencing the node stops admitting once a call could "
      "outlive its lease (lease - 25 ms margin - 40 ms call deadline) and fences at the lease's "
      "end minus the margin; by then its calls have ended, so on_fenced finds none to abort.\n\n"
      "| mode | max Σ in-flight / L_global | samples over L_global | node 0 fenced | aborted "
      "calls |\n|---|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  for (const bool fence : {false, true}) {
    FleetSimConfig c = fixed_fleet(4, 2.0);
    c.coordinator.acknowledged_handoff = true;
    c.self_fence = fence;
    c.call_timeout_coordinator = seconds(10);
    c.partitions = {Partition{0, start, end}};
    c.duration = end + scaled(seconds(3), scale);
    c.warmup = scaled(seconds(2), scale);
    c.sample_every = milliseconds(2);
    const FleetSimResult r = run_fleet_sim(c);
    const std::string label = fence ? "self-fencing" : "no self-fencing";
    out.table += "| " + label + " | " + number("%.3f", r.max_over_l_global) + " | " +
                 std::to_string(r.samples_over_l_global) + " | " + (r.fences > 0 ? "yes" : "no") +
                 " | " + std::to_string(r.aborted) + " |\n";
    out.files.emplace_back(std::string("partition-") + (fence ? "fenced" : "unfenced") + ".csv",
                           to_csv(r));
    plot.push_back({label, fence ? "#2ca02c" : "#d62728",
                    series(r,
                           [](const Sample& s) {
                             return s.l_global ? double(s.in_flight) / s.l_global : 0.0;
                           }),
                    false});
    if (fence)
      claim(out, r.max_over_l_global <= 1.0,
            "with self-fencing sum(in_flight) / L_global must stay <= 1.0, measured " +
                number("%.3f", r.max_over_l_global));
    else
      claim(out, r.max_over_l_global > 1.0,
            "without self-fencing the partition should show the overshoot, measured " +
                number("%.3f", r.max_over_l_global));
  }
  plot.push_back(reference("L_global", 1.0, plot.front()));
  out.files.emplace_back("partition.svg", svg_plot("Partition of node 0: sum(in_flight) / L_global",
                                                   "sum(in_flight) / L_global", plot));
  return out;
}

// ---- loss ----

ScenarioOutput loss(double scale) {
  ScenarioOutput out{"loss", {}, {}, {}};
  const Nanos at = scaled(seconds(5), scale);
  out.table =
      "4 busy nodes (fixed L_local = C = L_global = 40, offered load 2.0x), heartbeat 100 ms "
      "(the nodes' beats 23 ms apart), lease 200 ms, acknowledged handoff, fail-closed; the "
      "coordinator loses every record at "
      "t = " +
      number("%.1f", std::chrono::duration<double>(at).count()) +
      " s, while the nodes hold their shares and calls (a Redis back empty at once). With the "
      "loss rule it grants share 0 for one lease from then; without it, the first node to beat "
      "is granted L_global as if alone.\n\n"
      "| coordinator | max Σ in-flight / L_global | samples over L_global | goodput (of C / b) |"
      "\n|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  for (const bool rule : {false, true}) {
    FleetSimConfig c = fixed_fleet(4, 2.0);
    c.coordinator.acknowledged_handoff = true;
    c.coordinator_losses = {at};
    c.loss_rule = rule;
    // Beats spread over the heartbeat (node i joins at i x 23 ms), as a real fleet's are.
    c.join_at = {Nanos{0}, milliseconds(23), milliseconds(46), milliseconds(69)};
    c.duration = at + scaled(seconds(3), scale);
    c.warmup = scaled(seconds(2), scale);
    c.sample_every = milliseconds(2);
    const FleetSimResult r = run_fleet_sim(c);
    const std::string label = rule ? "loss rule" : "no loss rule";
    // L_global is C throughout (every L_local is C): the bound is Σ in-flight <= C.
    out.table += "| " + label + " | " + number("%.3f", r.max_over_capacity) + " | " +
                 std::to_string(r.samples_over_l_global) + " | " +
                 number("%.1f%%", 100 * r.goodput) + " |\n";
    out.files.emplace_back(std::string("loss-") + (rule ? "rule" : "no-rule") + ".csv", to_csv(r));
    plot.push_back(
        {label, rule ? "#2ca02c" : "#d62728",
         series(r, [c](const Sample& s) { return double(s.in_flight) / double(c.capacity); }),
         false});
    if (rule)
      claim(out, r.max_over_capacity <= 1.0,
            "with the loss rule sum(in_flight) / L_global must stay <= 1.0, measured " +
                number("%.3f", r.max_over_capacity));
    else
      claim(out, r.max_over_capacity > 1.0,
            "without the loss rule the loss should show the overshoot, measured " +
                number("%.3f", r.max_over_capacity));
  }
  plot.push_back(reference("L_global", 1.0, plot.front()));
  out.files.emplace_back("loss.svg", svg_plot("The coordinator loses its state: sum(in_flight) / "
                                              "L_global",
                                              "sum(in_flight) / L_global", plot));
  return out;
}

// ---- freeze ----

// Runs at full length whatever the scale (28 simulated seconds take milliseconds): the
// overshoot before the fix depends on where the freeze falls in the beat and call cycles.
ScenarioOutput freeze() {
  ScenarioOutput out{"freeze", {}, {}, {}};
  const Nanos start = seconds(10), end = start + seconds(8);
  out.table =
      "3 nodes (fixed L_local = C = L_global = 12, offered load 1.5x), calls of 2-3 s (base "
      "latency 2 s), heartbeat 1 s; node 0 freezes (a stop-the-world pause: it handles nothing, "
      "its calls go on in the backend) from t = " +
      number("%.1f", std::chrono::duration<double>(start).count()) +
      " s for 8 s, past its lease. "
      "Before: lease 2 s and no call deadline, so its calls outlive its lease and the others "
      "take its share while they run. After: call_deadline 3 s (so lease_ttl defaults to 4.5 s: "
      "deadline + heartbeat + 2 x margin) and the backend stops a call at its deadline.\n\n"
      "| mode | calls | max Σ in-flight / L_global | samples over L_global | timeouts |\n"
      "|---|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  const std::vector<std::string> colors = {"#d62728", "#ff7f0e", "#2ca02c", "#1f77b4"};
  std::size_t k = 0;
  for (const bool honour : {false, true}) {
    for (const OutageMode mode : {OutageMode::kFailClosed, OutageMode::kLocalOnly}) {
      FleetSimConfig c = fixed_fleet(3, 1.5);
      c.capacity = 12;
      c.fixed_limit = 12;
      c.base_latency = seconds(2);
      c.call_timeout = seconds(3);
      c.heartbeat = seconds(1);
      c.call_timeout_coordinator = seconds(1);
      c.coordinator.acknowledged_handoff = true;
      c.outage = mode;
      c.honour_deadline = honour;
      if (honour) {
        c.call_deadline = seconds(3);
      } else {
        c.lease_ttl = seconds(2);  // the old default; the guard's default deadline is ignored
      }
      c.freezes = {Freeze{0, start, end}};
      c.duration = end + seconds(10);
      c.warmup = seconds(5);
      c.sample_every = milliseconds(10);
      const FleetSimResult r = run_fleet_sim(c);
      const std::string label =
          std::string(mode == OutageMode::kFailClosed ? "fail-closed" : "local-only");
      const std::string calls = honour ? "call_deadline 3 s, honoured by the backend"
                                       : "lease 2 s, calls outlive it (before)";
      out.table += "| " + label + " | " + calls + " | " + number("%.3f", r.max_over_l_global) +
                   " | " + std::to_string(r.samples_over_l_global) + " | " +
                   std::to_string(r.timeouts) + " |\n";
      out.files.emplace_back("freeze-" + std::to_string(k) + ".csv", to_csv(r));
      plot.push_back({label + ", " + (honour ? "call deadline" : "before"), colors[k],
                      series(r,
                             [](const Sample& s) {
                               return s.l_global ? double(s.in_flight) / s.l_global : 0.0;
                             }),
                      false});
      if (honour)
        claim(out, r.max_over_l_global <= 1.0,
              label +
                  " with the call deadline: sum(in_flight) / L_global must stay <= 1.0, "
                  "measured " +
                  number("%.3f", r.max_over_l_global));
      else
        claim(out, r.max_over_l_global > 1.0,
              label + " before: the frozen node's calls should outlive its lease, measured " +
                  number("%.3f", r.max_over_l_global));
      ++k;
    }
  }
  plot.push_back(reference("L_global", 1.0, plot.front()));
  out.files.emplace_back("freeze.svg", svg_plot("Node 0 frozen for 8 s: sum(in_flight) / L_global",
                                                "sum(in_flight) / L_global", plot));
  return out;
}

// ---- skew ----

ScenarioOutput skew(double scale) {
  ScenarioOutput out{"skew", {}, {}, {}};
  out.table =
      "4 nodes (fixed L_local = C = 40), two busy ones (weight 1 each; offered load 1.5x in all, "
      "so the busy pair alone wants ~1.5 C) and two quiet ones (weight w each); heartbeat "
      "100 ms, acknowledged handoff. Utilization: mean Σ in-flight / L_global.\n\n"
      "| quiet nodes' weight w | equal-split | demand-proportional | gain (points) | "
      "max Σ in-flight / L_global |\n|---|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  const std::vector<std::string> colors = {"#d62728", "#2ca02c"};
  for (const double w : {0.0, 0.01, 0.05}) {
    double util[2] = {0, 0}, worst = 0;
    int k = 0;
    for (const Allocation a : {Allocation::kEqualSplit, Allocation::kDemandProportional}) {
      // The busy pair's load stays 1.5x whatever w is.
      FleetSimConfig c = fixed_fleet(4, 1.5 * (2 + 2 * w) / 2);
      c.weights = {1, 1, w, w};
      c.coordinator.allocation = a;
      c.coordinator.acknowledged_handoff = true;
      c.duration = scaled(seconds(20), scale);
      c.warmup = scaled(seconds(5), scale);
      const FleetSimResult r = run_fleet_sim(c);
      util[k] = r.utilization;
      worst = std::max(worst, r.max_over_l_global);
      const std::string name = std::string(to_string(a)) + "-w" + number("%.2f", w);
      out.files.emplace_back("skew-" + name + ".csv", to_csv(r));
      if (w == 0.0)
        plot.push_back({std::string(to_string(a)), colors[static_cast<std::size_t>(k)],
                        series(r,
                               [](const Sample& s) {
                                 return s.l_global ? double(s.in_flight) / s.l_global : 0.0;
                               }),
                        false});
      claim(out, r.max_over_l_global <= 1.0, name + ": sum(in_flight) / L_global must stay <= 1.0");
      ++k;
    }
    out.table += "| " + number("%.2f", w) + " | " + number("%.1f%%", 100 * util[0]) + " | " +
                 number("%.1f%%", 100 * util[1]) + " | " +
                 number("%+.1f", 100 * (util[1] - util[0])) + " | " + number("%.3f", worst) +
                 " |\n";
    if (w == 0.0)
      claim(out, util[1] - util[0] >= 0.25,
            "with idle quiet nodes demand-proportional must gain >= 25 points, measured " +
                number("%.1f", 100 * (util[1] - util[0])));
  }
  out.table +=
      "\nThe document claims +25 to +50 points. The gain needs quiet nodes that are quiet at "
      "their beats: a node holding even one call when it reports (in_flight >= its 1-slot probe) "
      "counts as hungry and takes an equal part of the pool again, so the gain shrinks as the "
      "quiet nodes' traffic grows.\n";
  out.files.emplace_back("skew.svg", svg_plot("Skew (quiet nodes idle): utilization of L_global",
                                              "sum(in_flight) / L_global", plot));
  return out;
}

}  // namespace

const std::vector<std::string>& scenario_names() {
  static const std::vector<std::string> names = {"fan-out", "join-ramp", "partition",
                                                 "loss",    "freeze",    "skew"};
  return names;
}

ScenarioOutput run_scenario(std::string_view name, double scale) {
  if (name == "fan-out") return fan_out(scale);
  if (name == "join-ramp") return join_ramp(scale);
  if (name == "partition") return partition(scale);
  if (name == "loss") return loss(scale);
  if (name == "freeze") return freeze();
  if (name == "skew") return skew(scale);
  return ScenarioOutput{std::string(name),
                        {},
                        {},
                        {"unknown scenario '" + std::string(name) +
                         "' (fan-out, join-ramp, partition, loss, freeze, skew)"}};
}

}  // namespace sluice::sim
