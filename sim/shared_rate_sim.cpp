#include "sluice/sim/shared_rate_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <random>
#include <string>

#include "sluice/core/shared_rate.h"
#include "sluice/sim/fleet_sim.h"

namespace sluice::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

double secs(Nanos d) { return std::chrono::duration<double>(d).count(); }

// A uniform draw in (0, 1] from 53 bits of the generator: the same on every platform (the
// standard's distributions are not).
double unit(std::mt19937_64& rng) {
  return static_cast<double>((rng() >> 11) + 1) * (1.0 / 9007199254740992.0);
}

// The strategy's state that never loses a write, fed the admitted hits.
struct Exact {
  FixedWindowState fixed;
  SlidingWindowState sliding;
  GcraState gcra;
  RateDecision decide(const RateRule& rule, Nanos now) {
    switch (rule.strategy) {
      case RateStrategy::kFixedWindow:
        return sluice::decide(fixed, rule, 1, now);
      case RateStrategy::kSlidingWindow:
        return sluice::decide(sliding, rule, 1, now);
      case RateStrategy::kGcra:
        break;
    }
    return sluice::decide(gcra, rule, 1, now);
  }
};

}  // namespace

std::string validate(const SharedRateSimConfig& c) {
  if (std::string why = c.rule.validate(); !why.empty()) return "rule: " + why;
  if (!(c.load > 0) || c.load > 1000) return "load: must be in (0, 1000]";
  if (c.duration <= Nanos{0}) return "duration: must be > 0";
  if (c.snapshot_every <= Nanos{0}) return "snapshot_every: must be > 0";
  if (c.bucket <= Nanos{0}) return "bucket: must be > 0";
  if (c.duration / c.bucket > 10'000'000) return "bucket: too small for the duration";
  for (std::size_t i = 1; i < c.losses.size(); ++i)
    if (c.losses[i].at <= c.losses[i - 1].at) return "losses: must be in increasing time order";
  return {};
}

SharedRateSimResult run_shared_rate_sim(const SharedRateSimConfig& c) {
  SharedRateSimResult r;
  const std::size_t buckets = static_cast<std::size_t>(c.duration / c.bucket) + 1;
  r.admitted_per_bucket.assign(buckets, 0);
  r.excess_per_bucket.assign(buckets, 0);
  std::mt19937_64 rng(c.seed);
  // Hits per second offered.
  const double rate = c.load * static_cast<double>(c.rule.limit) / secs(c.rule.period);
  SharedRateState live, snapshot;
  Nanos origin = kNoLoss;
  Nanos next_snapshot = c.snapshot_every;
  std::size_t next_loss = 0;
  Exact exact;
  std::deque<Nanos> window;  // admitted in the last period
  const SharedRateRequest check{SharedRateOp::kCheck, c.rule, 1};
  Nanos t{0};
  while (true) {
    t += Nanos{static_cast<std::int64_t>(-std::log(unit(rng)) / rate * 1e9)};
    if (t >= c.duration) break;
    // What happened at the coordinator before this arrival, in time order.
    while (true) {
      const Nanos loss_at = next_loss < c.losses.size() ? c.losses[next_loss].at : Nanos::max();
      if (next_snapshot <= t && next_snapshot <= loss_at) {
        snapshot = live;
        next_snapshot += c.snapshot_every;
      } else if (loss_at <= t) {
        live = c.losses[next_loss].total ? SharedRateState{} : snapshot;
        if (c.loss_rule) origin = loss_at;
        ++next_loss;
      } else {
        break;
      }
    }
    ++r.offered;
    const SharedRateReply reply = apply(live, check, t, origin);
    const std::size_t b = static_cast<std::size_t>(t / c.bucket);
    if (reply.decision.allowed) {
      ++r.admitted;
      ++r.admitted_per_bucket[b];
      if (!exact.decide(c.rule, t).allowed) ++r.excess;
      window.push_back(t);
      while (!window.empty() && window.front() <= t - c.rule.period) window.pop_front();
      r.max_per_period = std::max(
          r.max_per_period, static_cast<double>(window.size()) / static_cast<double>(c.rule.limit));
    }
    r.excess_per_bucket[b] = r.excess;
  }
  // Buckets with no arrival carry the running total.
  for (std::size_t i = 1; i < buckets; ++i)
    r.excess_per_bucket[i] = std::max(r.excess_per_bucket[i], r.excess_per_bucket[i - 1]);
  return r;
}

ScenarioOutput shared_rate_loss_scenario(double scale, std::uint64_t seed) {
  ScenarioOutput out{"shared-rate-loss", {}, {}, {}};
  const auto scaled = [&](Nanos d) {
    return Nanos{static_cast<std::int64_t>(static_cast<double>(d.count()) * scale)};
  };
  const Nanos duration = scaled(seconds(40));
  const std::vector<CoordinatorLoss> losses = {{scaled(milliseconds(8400)), false},
                                               {scaled(milliseconds(17700)), false},
                                               {scaled(milliseconds(26100)), false},
                                               {scaled(milliseconds(33300)), true}};
  std::string when;
  for (const CoordinatorLoss& l : losses)
    when += (when.empty() ? "" : ", ") + number("%.1f s", secs(l.at)) + (l.total ? " (total)" : "");
  out.table =
      "One hot key at 100 hits per second (period 1 s; GCRA with a burst of 20), checked one hit "
      "at a time by Poisson arrivals at 3x that rate for " +
      number("%.0f", secs(duration)) +
      " s. The coordinator snapshots the key every second and restarts from its last snapshot at " +
      when +
      " (total: from nothing), finding each loss at once. Excess: admitted hits that the "
      "same strategy, never losing a write and fed the same admitted hits, refuses. Against no "
      "loss: hits admitted less those a coordinator that never lost its state admits on the same "
      "arrivals (the rule's cost where negative). Max in a period: the most hits admitted in any "
      "interval of 1 s, over the limit (GCRA's own bound "
      "is (burst + limit) / limit = 1.2; the windows' 2.0 across a boundary).\n\n"
      "| strategy | loss rule | offered | admitted | against no loss | excess | "
      "max in a period / limit |\n|---|---|---|---|---|---|---|\n";
  std::vector<PlotSeries> plot;
  const std::vector<std::string> colors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"};
  std::size_t k = 0;
  for (const RateStrategy strategy :
       {RateStrategy::kGcra, RateStrategy::kSlidingWindow, RateStrategy::kFixedWindow}) {
    SharedRateSimConfig base;
    base.rule.strategy = strategy;
    base.rule.limit = 100;
    base.rule.period = seconds(1);
    base.rule.burst = strategy == RateStrategy::kGcra ? 20 : 0;
    base.load = 3.0;
    base.duration = duration;
    base.seed = seed;
    const SharedRateSimResult never = run_shared_rate_sim(base);
    for (const bool rule_on : {true, false}) {
      SharedRateSimConfig c = base;
      c.losses = losses;
      c.loss_rule = rule_on;
      const SharedRateSimResult r = run_shared_rate_sim(c);
      const std::string name =
          std::string(to_string(strategy)) + (rule_on ? "-with-rule" : "-without-rule");
      out.table +=
          "| " + std::string(to_string(strategy)) + " | " + (rule_on ? "on" : "off") + " | " +
          std::to_string(r.offered) + " | " + std::to_string(r.admitted) + " | " +
          number("%+.0f", static_cast<double>(r.admitted) - static_cast<double>(never.admitted)) +
          " | " + std::to_string(r.excess) + " | " + number("%.2f", r.max_per_period) + " |\n";
      std::string csv = "t_s,admitted,excess_so_far\n";
      for (std::size_t i = 0; i < r.admitted_per_bucket.size(); ++i)
        csv += number("%.1f", secs(c.bucket * static_cast<std::int64_t>(i))) + "," +
               std::to_string(r.admitted_per_bucket[i]) + "," +
               std::to_string(r.excess_per_bucket[i]) + "\n";
      out.files.emplace_back("shared-rate-loss-" + name + ".csv", csv);
      if (rule_on) {
        if (r.excess != 0)
          out.failed_claims.push_back(name + ": no hit may be admitted over the rule, measured " +
                                      std::to_string(r.excess));
      } else if (r.excess == 0) {
        out.failed_claims.push_back(name +
                                    ": without the loss rule a restore from a snapshot "
                                    "should admit over the rule, measured none");
      }
      if (strategy != RateStrategy::kSlidingWindow) {
        // Hits admitted in the last second, per bucket.
        PlotSeries s{std::string(to_string(strategy)) + (rule_on ? ", loss rule" : ", no rule"),
                     colors[k % colors.size()],
                     {},
                     !rule_on};
        const std::size_t per = static_cast<std::size_t>(c.rule.period / c.bucket);
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < r.admitted_per_bucket.size(); ++i) {
          sum += r.admitted_per_bucket[i];
          if (i >= per) sum -= r.admitted_per_bucket[i - per];
          s.points.emplace_back(secs(c.bucket * static_cast<std::int64_t>(i + 1)),
                                static_cast<double>(sum) / static_cast<double>(c.rule.limit));
        }
        plot.push_back(std::move(s));
        ++k;
      }
    }
  }
  out.table +=
      "\nWithout the rule a key restored from its snapshot has forgotten what it spent since, and "
      "the coordinator admits it again; with the rule every state written before the loss is "
      "raised to spent at the loss, so nothing is admitted over the rule, at the cost of the "
      "hits it then refuses: up to one period of a fixed window's budget, two of a sliding "
      "window's, a "
      "burst's worth of GCRA's emission time, after each loss.\n";
  PlotSeries limit{"limit", "#000000", {}, true};
  if (!plot.empty())
    limit.points = {{plot.front().points.front().first, 1.0},
                    {plot.front().points.back().first, 1.0}};
  plot.push_back(limit);
  out.files.emplace_back("shared-rate-loss.svg",
                         svg_plot("A shared rate limit's coordinator restarted from its snapshot",
                                  "hits admitted in the last second / limit", plot));
  return out;
}

}  // namespace sluice::sim
