// `sluice sim cascade`: the scenarios and strategies of sluice/sim/cascade_sim.h, the table, its
// CSV and plots, and the claims the run must show.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "sluice/sim/cascade_sim.h"
#include "sluice/sim/fleet_sim.h"

namespace sluice::sim {
namespace {

using std::chrono::seconds;

double secs(Nanos d) { return std::chrono::duration<double>(d).count(); }

void claim(ScenarioOutput& out, bool holds, const std::string& what) {
  if (!holds) out.failed_claims.push_back(what);
}

const char* const kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* color(std::size_t i) { return kColors[i % (sizeof kColors / sizeof kColors[0])]; }

// One scenario's runs, one per strategy (in cascade_strategies() order).
struct ScenarioRuns {
  CascadeScenario scenario;
  std::vector<CascadeSimResult> results;
};

// How long a strategy may take to bring a healed node back: the cascade's window (its bucket
// count x width: by then nothing of the bad spell is left in it); the same for the others.
Nanos recovery_bound(const CascadeStrategy& s) {
  const CascadeStatsOptions stats =
      s.kind == StrategyKind::kCascade ? s.cascade.stats : CascadeStatsOptions{};
  return stats.width * static_cast<std::int64_t>(stats.buckets);
}

bool heals(const CascadeSimResult& r) { return r.watched && r.observed_after_heal > Nanos{0}; }

std::string detect_cell(const CascadeSimResult& r) {
  if (!r.watched) return "-";
  return r.detect ? number("%.0f s", secs(*r.detect)) : "never";
}

std::string recover_cell(const CascadeSimResult& r) {
  if (!r.detect || !heals(r)) return "-";
  return r.recover ? number("%.0f s", secs(*r.recover))
                   : "never (> " + number("%.0f", secs(r.observed_after_heal)) + " s)";
}

std::string table(const std::vector<ScenarioRuns>& runs,
                  const std::vector<CascadeStrategy>& strategies) {
  std::string t =
      "| scenario | strategy | success rate | p99 latency | calls to bad nodes | detect | "
      "recover |\n|---|---|---|---|---|---|---|\n";
  for (const ScenarioRuns& s : runs) {
    for (std::size_t i = 0; i < strategies.size(); ++i) {
      const CascadeSimResult& r = s.results[i];
      const bool one_bad = r.watched.has_value();
      t += "| " + s.scenario.name + " | " + strategies[i].name + " | " +
           number("%.2f%%", 100 * r.success_rate) + " | " +
           number("%.0f ms", std::chrono::duration<double, std::milli>(r.p99).count()) + " | " +
           (one_bad ? std::to_string(r.calls_to_bad) : "-") + " | " + detect_cell(r) + " | " +
           recover_cell(r) + " |\n";
    }
  }
  return t;
}

// The fraction of calls each node failed in the scenario's spells (0 for a healthy node).
std::vector<double> failing_fractions(const CascadeScenario& s, int nodes) {
  std::vector<double> f(static_cast<std::size_t>(nodes), 0.0);
  for (const FaultSpell& spell : s.spells)
    if (spell.fault == NodeFault::kFailing)
      f[static_cast<std::size_t>(spell.node)] = spell.fraction;
  return f;
}

double share_of(const CascadeSimResult& r, std::size_t node) {
  return r.arrivals ? static_cast<double>(r.node_taken[node]) / static_cast<double>(r.arrivals)
                    : 0.0;
}

// Each node's share of the calls against the share its weight (success rate ^ exponent) gives.
std::vector<double> expected_shares(const std::vector<double>& fails, double exponent) {
  std::vector<double> w;
  double total = 0;
  for (const double f : fails) total += w.emplace_back(std::pow(1 - f, exponent));
  for (double& x : w) x /= total;
  return w;
}

std::size_t windows_without_calls(const CascadeSimResult& r, std::size_t node) {
  return static_cast<std::size_t>(std::count_if(r.windows.begin(), r.windows.end(),
                                                [&](const auto& w) { return w.taken[node] == 0; }));
}

// A cascade's spreading over the last `tail` windows of the all-degraded scenario: the nodes in
// play (a call in each of those windows), and each one's share of the calls they took against
// its weight's share (rate ^ exponent over the sum over the nodes in play); 0 for the others.
struct Spread {
  std::vector<bool> in_play;
  std::vector<double> share, expected;
};

Spread spread(const CascadeSimResult& r, const std::vector<double>& fails, double exponent,
              std::size_t tail) {
  const std::size_t first = r.windows.size() > tail ? r.windows.size() - tail : 0;
  Spread out{std::vector<bool>(fails.size(), true), std::vector<double>(fails.size(), 0.0),
             std::vector<double>(fails.size(), 0.0)};
  double taken = 0, weight = 0;
  for (std::size_t n = 0; n < fails.size(); ++n) {
    for (std::size_t k = first; k < r.windows.size(); ++k) {
      out.in_play[n] = out.in_play[n] && r.windows[k].taken[n] > 0;
      out.share[n] += r.windows[k].taken[n];
    }
    if (!out.in_play[n]) out.share[n] = 0;
    out.expected[n] = out.in_play[n] ? std::pow(1 - fails[n], exponent) : 0.0;
    taken += out.share[n];
    weight += out.expected[n];
  }
  for (std::size_t n = 0; n < fails.size(); ++n) {
    out.share[n] = taken > 0 ? out.share[n] / taken : 0.0;
    out.expected[n] = weight > 0 ? out.expected[n] / weight : 0.0;
  }
  return out;
}

std::string spread_header(const std::vector<CascadeStrategy>& strategies, double exponent,
                          std::size_t tail) {
  std::string t = "| node | success rate | rate^" + number("%g", exponent) + " / sum (all nodes) |";
  std::string rule = "|---|---|---|";
  for (const CascadeStrategy& st : strategies) {
    t += " share, " + st.name + " |";
    rule += "---|";
    if (st.kind != StrategyKind::kCascade) continue;
    const std::string last = "last " + std::to_string(tail) + " s, " + st.name;
    t += " seconds without a call, " + st.name + " | share of the calls to nodes in play, " + last +
         " | rate^" + number("%g", st.cascade.health.exponent) + " / sum over nodes in play, " +
         last + " |";
    rule += "---|---|---|";
  }
  return t + "\n" + rule + "\n";
}

// All-degraded: each node's share of the calls over the run, and for a cascade the seconds in
// which it took no call and its spreading over the last `tail` windows (see Spread).
std::string spread_table(const ScenarioRuns& s, const std::vector<CascadeStrategy>& strategies,
                         int nodes, std::size_t tail) {
  const std::vector<double> fails = failing_fractions(s.scenario, nodes);
  const double exponent = strategies.front().cascade.health.exponent;
  const std::vector<double> expected = expected_shares(fails, exponent);
  std::string t = spread_header(strategies, exponent, tail);
  for (std::size_t n = 0; n < fails.size(); ++n) {
    t += "| node-" + std::to_string(n) + " | " + number("%.0f%%", 100 * (1 - fails[n])) + " | " +
         number("%.1f%%", 100 * expected[n]) + " |";
    for (std::size_t i = 0; i < strategies.size(); ++i) {
      const CascadeSimResult& r = s.results[i];
      t += ' ';
      t += number("%.1f%%", 100 * share_of(r, n));
      t += " |";
      if (strategies[i].kind != StrategyKind::kCascade) continue;
      const Spread sp = spread(r, fails, strategies[i].cascade.health.exponent, tail);
      // (appended piece by piece: g++ 12 at -O3 warns falsely on `" " + string&&`)
      t += ' ';
      t += std::to_string(windows_without_calls(r, n));
      t += " | ";
      if (sp.in_play[n]) {
        t += number("%.1f%%", 100 * sp.share[n]);
        t += " | ";
        t += number("%.1f%%", 100 * sp.expected[n]);
      } else {
        t += "out | out";
      }
      t += " |";
    }
    t += "\n";
  }
  return t;
}

std::string summary_csv(const std::vector<ScenarioRuns>& runs,
                        const std::vector<CascadeStrategy>& strategies) {
  std::string out =
      "scenario,strategy,arrivals,succeeded,timeouts,overloads,failed,refused,success_rate,"
      "p99_ms,calls_to_bad,detect_s,recover_s\n";
  for (const ScenarioRuns& s : runs) {
    for (std::size_t i = 0; i < strategies.size(); ++i) {
      const CascadeSimResult& r = s.results[i];
      char buf[256];
      std::snprintf(
          buf, sizeof buf, ",%llu,%llu,%llu,%llu,%llu,%llu,%.6f,%.3f,%llu,",
          static_cast<unsigned long long>(r.arrivals), static_cast<unsigned long long>(r.succeeded),
          static_cast<unsigned long long>(r.timeouts), static_cast<unsigned long long>(r.overloads),
          static_cast<unsigned long long>(r.failed), static_cast<unsigned long long>(r.refused),
          r.success_rate, std::chrono::duration<double, std::milli>(r.p99).count(),
          static_cast<unsigned long long>(r.calls_to_bad));
      out += s.scenario.name + "," + strategies[i].name + buf +
             (r.detect ? number("%.0f", secs(*r.detect)) : "") + "," +
             (r.recover ? number("%.0f", secs(*r.recover)) : "") + "\n";
    }
  }
  return out;
}

// Every window of every run: arrivals, successes and the calls each node took.
std::string windows_csv(const std::vector<ScenarioRuns>& runs,
                        const std::vector<CascadeStrategy>& strategies, Nanos window, int nodes) {
  std::string out = "scenario,strategy,t_s,arrivals,succeeded";
  for (int n = 0; n < nodes; ++n) out += ",taken_" + std::to_string(n);
  out += "\n";
  for (const ScenarioRuns& s : runs) {
    for (std::size_t i = 0; i < strategies.size(); ++i) {
      const CascadeSimResult& r = s.results[i];
      for (std::size_t k = 0; k < r.windows.size(); ++k) {
        const CascadeWindow& w = r.windows[k];
        out += s.scenario.name + "," + strategies[i].name + "," +
               number("%.0f", secs(window * static_cast<std::int64_t>(k))) + "," +
               std::to_string(w.arrivals) + "," + std::to_string(w.succeeded);
        for (const std::uint32_t taken : w.taken) {
          out += ',';
          out += std::to_string(taken);
        }
        out += "\n";
      }
    }
  }
  return out;
}

// A dashed horizontal line over [0, end_s].
PlotSeries level(const std::string& label, double y, double end_s, const char* c = "#000000") {
  return {label, c, {{0.0, y}, {end_s, y}}, true};
}

// The first strategy's (the cascade's) share of calls per node, per window.
std::string shares_svg(const ScenarioRuns& s, const CascadeStrategy& strategy, Nanos window,
                       int nodes) {
  const CascadeSimResult& r = s.results.front();
  std::vector<PlotSeries> plot;
  for (std::size_t n = 0; n < static_cast<std::size_t>(nodes); ++n) {
    PlotSeries p{"node-" + std::to_string(n), color(n), {}, false};
    for (std::size_t k = 0; k < r.windows.size(); ++k) {
      const CascadeWindow& w = r.windows[k];
      p.points.emplace_back(secs(window * static_cast<std::int64_t>(k + 1)),
                            w.arrivals ? static_cast<double>(w.taken[n]) / w.arrivals : 0.0);
    }
    plot.push_back(std::move(p));
  }
  const double end = secs(window * static_cast<std::int64_t>(r.windows.size()));
  const double fair = 1.0 / nodes;
  plot.push_back(level("fair share", fair, end));
  plot.push_back(level("50% of fair share (recovered)", 0.5 * fair, end, "#7f7f7f"));
  plot.push_back(level("10% of fair share (detected)", 0.1 * fair, end, "#bbbbbb"));
  return svg_plot(s.scenario.name + ": each node's share of calls per second, " + strategy.name,
                  "share of calls", plot);
}

// Each strategy's success rate per window.
std::string success_svg(const ScenarioRuns& s, const std::vector<CascadeStrategy>& strategies,
                        Nanos window) {
  std::vector<PlotSeries> plot;
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    PlotSeries p{strategies[i].name, color(i), {}, false};
    for (std::size_t k = 0; k < s.results[i].windows.size(); ++k) {
      const CascadeWindow& w = s.results[i].windows[k];
      p.points.emplace_back(secs(window * static_cast<std::int64_t>(k + 1)),
                            w.arrivals ? static_cast<double>(w.succeeded) / w.arrivals : 0.0);
    }
    plot.push_back(std::move(p));
  }
  return svg_plot(s.scenario.name + ": success rate per second by strategy", "success rate", plot);
}

void success_claims(ScenarioOutput& out, const ScenarioRuns& s,
                    const std::vector<CascadeStrategy>& strategies) {
  if (!s.scenario.healthy_node) return;
  const auto rr = std::find_if(strategies.begin(), strategies.end(),
                               [](const auto& st) { return st.kind == StrategyKind::kRoundRobin; });
  if (rr == strategies.end()) return;
  const CascadeSimResult& base = s.results[static_cast<std::size_t>(rr - strategies.begin())];
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    if (strategies[i].kind != StrategyKind::kCascade) continue;
    const double mine = s.results[i].success_rate, theirs = base.success_rate;
    const bool holds = base.succeeded == base.arrivals ? mine >= theirs : mine > theirs;
    claim(out, holds,
          s.scenario.name + ": " + strategies[i].name + "'s success rate " + number("%.4f", mine) +
              " must beat round-robin's " + number("%.4f", theirs));
  }
}

void recovery_claims(ScenarioOutput& out, const ScenarioRuns& s,
                     const std::vector<CascadeStrategy>& strategies) {
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    const CascadeSimResult& r = s.results[i];
    if (!strategies[i].recovery_claim || !r.detect || !heals(r)) continue;
    const Nanos bound = recovery_bound(strategies[i]);
    claim(out, r.recover && *r.recover <= bound,
          s.scenario.name + ": " + strategies[i].name + " must bring the healed node back within " +
              number("%.0f s", secs(bound)) + ", measured " + recover_cell(r));
  }
}

// Whether the all-degraded spreading is claimed for `s`: a cascade without breakers. A breaker
// opens on a node that fails `failures` calls in a row, by design, and a node failing 30-50% of
// its calls does that often: a cascade with breakers concentrates its calls on the nodes whose
// breakers are closed, so spreading in proportion to health is not its goal. Its shares are
// reported, not claimed.
bool spread_claimed(const CascadeStrategy& s) {
  return s.kind == StrategyKind::kCascade && !s.cascade.breaker;
}

// All-degraded: among the nodes a cascade without breakers still calls at the end of the run,
// each one's share of their calls is within a fifth of its weight's share, or 1.5 points for a
// small share (whose weight, a cube of a noisy rate, is the noisiest). A node it left out is
// reported, not claimed (docs/simulations/cascade.md).
void spread_claims(ScenarioOutput& out, const ScenarioRuns& s,
                   const std::vector<CascadeStrategy>& strategies, int nodes, std::size_t tail) {
  if (s.scenario.healthy_node) return;
  const std::vector<double> fails = failing_fractions(s.scenario, nodes);
  for (std::size_t i = 0; i < strategies.size(); ++i) {
    if (!spread_claimed(strategies[i])) continue;
    const Spread sp = spread(s.results[i], fails, strategies[i].cascade.health.exponent, tail);
    for (std::size_t n = 0; n < fails.size(); ++n)
      claim(out,
            !sp.in_play[n] ||
                std::abs(sp.share[n] - sp.expected[n]) <= std::max(0.2 * sp.expected[n], 0.015),
            s.scenario.name + ": " + strategies[i].name + " gave node-" + std::to_string(n) + " " +
                number("%.3f", sp.share[n]) + " of the calls to the nodes in play, its weight " +
                number("%.3f", sp.expected[n]));
  }
}

// "a, b" of the names of the strategies `pick` holds for; "none" when it holds for none.
template <typename Pick>
std::string names_where(const std::vector<CascadeStrategy>& strategies, Pick pick) {
  std::string list;
  for (const CascadeStrategy& s : strategies)
    if (pick(s)) list += (list.empty() ? "" : ", ") + s.name;
  return list.empty() ? "none" : list;
}

// Which strategies the recovery claim is checked for, and which it is not.
std::string recovery_note(const std::vector<CascadeStrategy>& strategies) {
  std::string t = "The recovery claim is checked for " +
                  names_where(strategies, [](const auto& s) { return s.recovery_claim; });
  if (!std::all_of(strategies.begin(), strategies.end(),
                   [](const auto& s) { return s.recovery_claim; }))
    t += "; not for " + names_where(strategies, [](const auto& s) { return !s.recovery_claim; });
  return t + ".";
}

// Which cascades the all-degraded spreading is claimed for, and why not for the others.
std::string spread_note(const std::vector<CascadeStrategy>& strategies) {
  std::string t = "The spreading is claimed for " + names_where(strategies, spread_claimed);
  const std::string reported = names_where(strategies, [](const auto& s) {
    return s.kind == StrategyKind::kCascade && !spread_claimed(s);
  });
  if (reported != "none")
    t += "; reported, not claimed, for " + reported +
         " (a breaker opens on a node that fails several calls in a row, by design, so spreading "
         "in proportion to health is not its goal)";
  return t + ".\n\n";
}

// The breakers of the cascade strategies that have them, one sentence each.
std::string breaker_note(const std::vector<CascadeStrategy>& strategies) {
  std::string t;
  for (const CascadeStrategy& s : strategies) {
    if (s.kind != StrategyKind::kCascade || !s.cascade.breaker) continue;
    const CircuitBreakerOptions& b = *s.cascade.breaker;
    t += " Breakers (" + s.name + "): open after " + std::to_string(b.failures) +
         " failures in a row, for " + number("%.0f", secs(b.open_for)) + " s doubling up to " +
         number("%.0f", secs(b.max_open_for)) + " s; " + std::to_string(b.probes) +
         (b.probes == 1 ? " probe" : " probes") + " at a time while half-open.";
  }
  return t;
}

std::string setup(const CascadeSimConfig& c, const std::vector<CascadeStrategy>& strategies,
                  const std::vector<ScenarioRuns>& runs) {
  const FallbackCascadeOptions cascade;
  const CascadeStatsOptions& stats = cascade.stats;
  const CascadeHealthOptions& health = cascade.health;
  std::string t =
      std::to_string(c.nodes) + " nodes, each with a fixed concurrency limit of " +
      std::to_string(c.limit) + " (under every strategy); Poisson arrivals at " +
      number("%.0f", c.rate) + " calls/s for " + number("%.0f", secs(c.duration)) + " s, seed " +
      std::to_string(c.seed) + "; a healthy call takes " +
      number("%.0f", std::chrono::duration<double, std::milli>(c.base_latency).count()) +
      " ms + Exp(mean " +
      number("%.0f", std::chrono::duration<double, std::milli>(c.base_latency).count()) +
      " ms), a slow one " + number("%.0f", c.slow_factor) + " x that, a fast error or 429 " +
      number("%.0f", std::chrono::duration<double, std::milli>(c.error_latency).count()) +
      " ms; the caller's timeout " + number("%.0f", secs(c.timeout)) +
      " s. Cascade: " + std::to_string(stats.buckets) + " buckets of " +
      number("%.0f", secs(stats.width)) + " s, decay " + number("%g", health.decay) +
      ", weight = rate^" + number("%g", health.exponent) + ", sticky floor " +
      number("%g", health.floor_numerator) +
      " / nodes, a revival call to a node at the floor at most every " +
      number("%.0f", secs(cascade.revive_every)) + " s." + breaker_note(strategies) +
      " Shares in windows of " + number("%.0f", secs(c.window)) +
      " s; detect: the bad node's share below 10% of the fair share; recover: back to 50% of it. " +
      recovery_note(strategies) + "\n\n";
  for (const ScenarioRuns& s : runs)
    t += "- " + s.scenario.name + ": " + s.scenario.description + "\n";
  return t + "\n";
}

}  // namespace

std::vector<CascadeScenario> cascade_scenarios(int nodes) {
  const Nanos from = seconds(20), to = seconds(50);
  std::vector<CascadeScenario> out = {
      {"healthy", "every node healthy throughout", {}, true},
      {"down",
       "node-0 answers every call with a fast error from 20 s to 50 s",
       {{0, from, to, NodeFault::kDown, 1}},
       true},
      {"black-holed",
       "node-0 answers nothing (calls time out) from 20 s to 50 s",
       {{0, from, to, NodeFault::kBlackHole, 1}},
       true},
      {"slow",
       "node-0 is 10 x slower from 20 s to 50 s",
       {{0, from, to, NodeFault::kSlow, 1}},
       true},
      {"flapping",
       "node-0 fails fast for 5 s, then is healthy for 5 s, six times from 20 s (healthy from "
       "75 s)",
       {},
       true},
      {"shedding",
       "node-0 answers 80% of calls with a fast 429 from 20 s to 50 s",
       {{0, from, to, NodeFault::kShedding, 0.8}},
       true},
      {"dead-from-start",
       "node-0 fails fast from 0 s and never heals",
       {{0, Nanos{0}, Nanos::max(), NodeFault::kDown, 1}},
       true},
      {"all-degraded", "node-i fails 10% x (i + 1) of its calls throughout", {}, false},
  };
  for (int i = 0; i < 6; ++i)
    out[4].spells.push_back({0, seconds(20 + 10 * i), seconds(25 + 10 * i), NodeFault::kDown, 1});
  for (int i = 0; i < nodes; ++i)
    out[7].spells.push_back(
        {i, Nanos{0}, Nanos::max(), NodeFault::kFailing, std::min(0.9, 0.1 * (i + 1))});
  return out;
}

std::vector<CascadeStrategy> cascade_strategies() {
  // A cascade variant is one more line: {name, StrategyKind::kCascade, its options, whether the
  // recovery claim is checked for it}.
  FallbackCascadeOptions breaker;
  breaker.breaker = CircuitBreakerOptions{};
  return {
      {"cascade", StrategyKind::kCascade, FallbackCascadeOptions{}, true},
      {"cascade+breaker", StrategyKind::kCascade, breaker, true},
      {"round-robin", StrategyKind::kRoundRobin, {}, true},
      {"random", StrategyKind::kRandom, {}, true},
      {"p2c", StrategyKind::kPowerOfTwo, {}, true},
  };
}

ScenarioOutput run_cascade_evaluation(const CascadeEvaluationOptions& o) {
  ScenarioOutput out{"cascade", {}, {}, {}};
  CascadeSimConfig c;
  c.seed = o.seed;
  c.rate = o.rate;
  c.duration = o.duration;
  if (const std::string e = c.validate(); !e.empty()) {
    out.failed_claims.push_back(e);
    return out;
  }
  const std::vector<CascadeStrategy> strategies = cascade_strategies();
  std::vector<ScenarioRuns> runs;
  for (CascadeScenario& s : cascade_scenarios(c.nodes)) {
    if (o.scenario != "all" && o.scenario != s.name) continue;
    ScenarioRuns& run = runs.emplace_back();
    run.scenario = std::move(s);
    for (const CascadeStrategy& st : strategies)
      run.results.push_back(run_cascade_sim(c, run.scenario, st));
  }
  if (runs.empty()) {
    out.failed_claims.push_back("unknown scenario '" + o.scenario + "'");
    return out;
  }
  out.table = setup(c, strategies, runs) + table(runs, strategies);
  const auto tail = static_cast<std::size_t>(seconds(30) / c.window);
  for (const ScenarioRuns& s : runs) {
    success_claims(out, s, strategies);
    recovery_claims(out, s, strategies);
    spread_claims(out, s, strategies, c.nodes, tail);
    if (!s.scenario.healthy_node)
      out.table += "\n### " + s.scenario.name + ": each node's share against its success rate\n\n" +
                   spread_note(strategies) + spread_table(s, strategies, c.nodes, tail);
    out.files.emplace_back(s.scenario.name + "-shares.svg",
                           shares_svg(s, strategies.front(), c.window, c.nodes));
    out.files.emplace_back(s.scenario.name + "-success.svg", success_svg(s, strategies, c.window));
  }
  out.files.emplace_back("cascade-summary.csv", summary_csv(runs, strategies));
  out.files.emplace_back("cascade-windows.csv", windows_csv(runs, strategies, c.window, c.nodes));
  return out;
}

}  // namespace sluice::sim
