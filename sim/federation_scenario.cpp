// `sluice sim federation`: the table of sluice/sim/federation_sim.h's schemes by skew, its CSV
// and plot, and the claims the run must show.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "sluice/sim/federation_sim.h"
#include "sluice/sim/fleet_sim.h"

namespace sluice::sim {
namespace {

void claim(ScenarioOutput& out, bool holds, const std::string& what) {
  if (!holds) out.failed_claims.push_back(what);
}

// A run of the options' windows, seed, delay and batch at `load` and `skew`.
FederationSimConfig run_config(const FederationScenarioOptions& o, double load, double skew) {
  FederationSimConfig c;
  c.load = load;
  c.skew = skew;
  c.windows = o.windows;
  c.seed = o.seed;
  c.one_way = o.one_way;
  c.batch = o.batch;
  return c;
}

struct SkewRow {
  double skew = 0;
  FederationSimResult independent, fixed, federated;
};

std::vector<SkewRow> run_skews(const FederationScenarioOptions& o, double load,
                               const std::vector<double>& skews) {
  std::vector<SkewRow> rows;
  for (const double s : skews) {
    SkewRow& row = rows.emplace_back();
    row.skew = s;
    FederationSimConfig c = run_config(o, load, s);
    c.scheme = FederationScheme::kIndependent;
    row.independent = run_federation_sim(c);
    c.scheme = FederationScheme::kStatic;
    row.fixed = run_federation_sim(c);
    c.scheme = FederationScheme::kFederated;
    row.federated = run_federation_sim(c);
  }
  return rows;
}

constexpr std::uint64_t kWeightedLimit = FederationSimConfig{}.limit;

struct WeightedRow {
  std::uint64_t hits = 1;
  double skew = 0;
  FederationSimResult fixed, federated;
  double bound = 0;  // weighted_bound()
};

// The stranding bound stated for weighted checks: each region may hold below its next check's
// size (or a batch's leftover) at a window's end, and the coordinator may keep below one
// check's size that no region's need fits.
double weighted_bound(const WeightedRow& r, const FederationScenarioOptions& o) {
  const double per_region = static_cast<double>(std::max(r.hits - 1, o.batch));
  return 3 * per_region + static_cast<double>(r.hits - 1);
}

std::vector<WeightedRow> run_weighted(const FederationScenarioOptions& o) {
  std::vector<WeightedRow> rows;
  for (const std::uint64_t hits : {std::uint64_t{8}, std::uint64_t{40}, std::uint64_t{100}})
    for (const double s : {0.0, 0.5, 1.0}) {
      WeightedRow& row = rows.emplace_back();
      row.hits = hits;
      row.skew = s;
      FederationSimConfig c = run_config(o, o.load, s);
      c.hits = hits;
      c.scheme = FederationScheme::kStatic;
      row.fixed = run_federation_sim(c);
      c.scheme = FederationScheme::kFederated;
      row.federated = run_federation_sim(c);
      row.bound = weighted_bound(row, o);
    }
  return rows;
}

// Units demanded but not admitted in a window: min(offered, limit) - admitted (what U_capacity
// misses), the mean and the largest over the windows.
std::pair<double, double> unserved(const FederationSimResult& r, std::uint64_t limit) {
  double sum = 0, most = 0;
  for (const FederationWindow& w : r.windows) {
    const double lost = static_cast<double>(std::min(w.offered, limit)) -
                        static_cast<double>(std::min(w.admitted, std::min(w.offered, limit)));
    sum += lost;
    most = std::max(most, lost);
  }
  return {r.windows.empty() ? 0 : sum / static_cast<double>(r.windows.size()), most};
}

std::string weighted_table(const std::vector<WeightedRow>& rows) {
  std::string t =
      "| units per check | skew | static U_capacity | federated U_capacity | max admitted per "
      "window / limit | federated units demanded, not admitted, per window (mean / max) | "
      "stated bound |\n|---|---|---|---|---|---|---|\n";
  for (const WeightedRow& r : rows) {
    const auto [mean, most] = unserved(r.federated, kWeightedLimit);
    t += "| " + std::to_string(r.hits) + " | " + number("%.2f", r.skew) + " | " +
         number("%.3f", r.fixed.u_capacity) + " | " + number("%.3f", r.federated.u_capacity) +
         " | " + number("%.3f", r.federated.max_admitted_over_limit) + " | " +
         number("%.1f", mean) + " / " + number("%.0f", most) + " | " + number("%.0f", r.bound) +
         " |\n";
  }
  return t;
}

std::string weighted_csv(const std::vector<WeightedRow>& rows) {
  std::string t =
      "hits,skew,static_u_capacity,federated_u_capacity,max_admitted_over_limit,mean_unserved,"
      "max_unserved,bound\n";
  for (const WeightedRow& r : rows) {
    const auto [mean, most] = unserved(r.federated, kWeightedLimit);
    t += std::to_string(r.hits) + "," + number("%.2f", r.skew) + "," +
         number("%.4f", r.fixed.u_capacity) + "," + number("%.4f", r.federated.u_capacity) + "," +
         number("%.4f", r.federated.max_admitted_over_limit) + "," + number("%.2f", mean) + "," +
         number("%.0f", most) + "," + number("%.0f", r.bound) + "\n";
  }
  return t;
}

std::string table(const std::vector<SkewRow>& rows) {
  std::string t =
      "| skew | static U_capacity | federated U_capacity | max admitted per window / limit | "
      "independent admitted / limit |\n|---|---|---|---|---|\n";
  for (const SkewRow& r : rows)
    t += "| " + number("%.2f", r.skew) + " | " + number("%.3f", r.fixed.u_capacity) + " | " +
         number("%.3f", r.federated.u_capacity) + " | " +
         number("%.3f", r.federated.max_admitted_over_limit) + " | " +
         number("%.3f", r.independent.max_admitted_over_limit) + " |\n";
  return t;
}

// Per region (region 0 the hot one), per window: "a / b / c".
std::string by_region(const FederationSimResult& r, const std::vector<std::uint64_t>& values) {
  std::string out;
  for (const std::uint64_t v : values) {
    if (!out.empty()) out += " / ";
    out += number("%.1f", static_cast<double>(v) / static_cast<double>(r.windows.size()));
  }
  return out;
}

std::string diagnostics(const std::vector<SkewRow>& rows) {
  std::string t =
      "| skew | federated mean admitted / limit | stranded escrow per window | budget never "
      "leased per window | admitted per window, by region | escrow forfeited per window, by region "
      "| coordinator leases per "
      "admission | reconciles |\n"
      "|---|---|---|---|---|---|---|---|\n";
  for (const SkewRow& r : rows)
    t += "| " + number("%.2f", r.skew) + " | " +
         number("%.3f", r.federated.mean_admitted_over_limit) + " | " +
         number("%.1f", r.federated.mean_stranded) + " | " +
         number("%.1f", r.federated.mean_unleased) + " | " +
         by_region(r.federated, r.federated.region_admitted) + " | " +
         by_region(r.federated, r.federated.region_forfeited) + " | " +
         number("%.4f", r.federated.leases_per_admission) + " | " +
         std::to_string(r.federated.reconciles) + " |\n";
  return t;
}

std::string csv(const std::vector<SkewRow>& rows) {
  std::string out =
      "skew,static_u_capacity,federated_u_capacity,federated_max_admitted_over_limit,"
      "federated_mean_admitted_over_limit,independent_max_admitted_over_limit,"
      "independent_mean_admitted_over_limit,federated_stranded_per_window,"
      "federated_unleased_per_window,federated_leases_per_admission\n";
  for (const SkewRow& r : rows) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%.2f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,%.2f,%.5f\n", r.skew,
                  r.fixed.u_capacity, r.federated.u_capacity, r.federated.max_admitted_over_limit,
                  r.federated.mean_admitted_over_limit, r.independent.max_admitted_over_limit,
                  r.independent.mean_admitted_over_limit, r.federated.mean_stranded,
                  r.federated.mean_unleased, r.federated.leases_per_admission);
    out += buf;
  }
  return out;
}

// Every window of every run: what was offered, admitted and (federated) handed out.
std::string windows_csv(const std::vector<SkewRow>& rows) {
  std::string out = "skew,scheme,window,offered,admitted,handed_out,leases\n";
  for (const SkewRow& r : rows) {
    const std::pair<FederationScheme, const FederationSimResult*> runs[] = {
        {FederationScheme::kIndependent, &r.independent},
        {FederationScheme::kStatic, &r.fixed},
        {FederationScheme::kFederated, &r.federated}};
    for (const auto& [scheme, result] : runs) {
      for (std::size_t k = 0; k < result->windows.size(); ++k) {
        const FederationWindow& w = result->windows[k];
        out += number("%.2f", r.skew) + "," + std::string(to_string(scheme)) + "," +
               std::to_string(k) + "," + std::to_string(w.offered) + "," +
               std::to_string(w.admitted) + "," + std::to_string(w.handed_out) + "," +
               std::to_string(w.leases) + "\n";
      }
    }
  }
  return out;
}

// U_capacity by skew, static and federated, over the table's skews and those near 1.
std::string plot(std::vector<SkewRow> rows, double load, std::uint64_t batch) {
  std::sort(rows.begin(), rows.end(),
            [](const SkewRow& a, const SkewRow& b) { return a.skew < b.skew; });
  PlotSeries fixed{"static partition (L/K each)", "#d62728", {}, false};
  PlotSeries federated{"federated (batch " + std::to_string(batch) + ")", "#2ca02c", {}, false};
  for (const SkewRow& r : rows) {
    fixed.points.emplace_back(r.skew, r.fixed.u_capacity);
    federated.points.emplace_back(r.skew, r.federated.u_capacity);
  }
  PlotSeries target{"0.98 (the target)", "#000000", {{0.0, 0.98}, {1.0, 0.98}}, true};
  return svg_plot("U_capacity by skew: K = 3 regions, L = 1000 per 1 s, offered " +
                      number("%.1f", load) + " x L",
                  "U_capacity", {fixed, federated, target}, "skew s");
}

// The federated scheme at s = 0 and s = 1 as the region-coordinator delay grows.
struct RoundTripRow {
  Nanos one_way{0};
  FederationSimResult uniform, hot;
};

std::vector<RoundTripRow> run_round_trips(const FederationScenarioOptions& o) {
  std::vector<RoundTripRow> rows;
  for (const int ms : {1, 5, 10, 20, 40}) {
    RoundTripRow& row = rows.emplace_back();
    row.one_way = std::chrono::milliseconds(ms);
    FederationSimConfig c = run_config(o, o.load, 0.0);
    c.one_way = row.one_way;
    row.uniform = run_federation_sim(c);
    c.skew = 1.0;
    row.hot = run_federation_sim(c);
  }
  return rows;
}

std::string round_trip_table(const std::vector<RoundTripRow>& rows, std::uint64_t batch) {
  std::string t =
      "| one-way delay (ms) | round trip (ms) | batch / round trip (per s) | federated "
      "U_capacity, s = 0 | federated U_capacity, s = 1 | max admitted per window / limit |\n"
      "|---|---|---|---|---|---|\n";
  for (const RoundTripRow& r : rows) {
    const double ms = std::chrono::duration<double, std::milli>(r.one_way).count();
    t +=
        "| " + number("%.0f", ms) + " | " + number("%.0f", 2 * ms) + " | " +
        number("%.0f", static_cast<double>(batch) / (2 * ms / 1000)) + " | " +
        number("%.3f", r.uniform.u_capacity) + " | " + number("%.3f", r.hot.u_capacity) + " | " +
        number("%.3f", std::max(r.uniform.max_admitted_over_limit, r.hot.max_admitted_over_limit)) +
        " |\n";
  }
  return t;
}

std::string round_trip_csv(const std::vector<RoundTripRow>& rows) {
  std::string out =
      "one_way_ms,federated_u_capacity_s0,federated_u_capacity_s1,max_admitted_over_limit_s0,"
      "max_admitted_over_limit_s1\n";
  for (const RoundTripRow& r : rows) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.0f,%.4f,%.4f,%.4f,%.4f\n",
                  std::chrono::duration<double, std::milli>(r.one_way).count(),
                  r.uniform.u_capacity, r.hot.u_capacity, r.uniform.max_admitted_over_limit,
                  r.hot.max_admitted_over_limit);
    out += buf;
  }
  return out;
}

std::string setup(const FederationScenarioOptions& o, double load) {
  return "K = 3 regions, one key, limit L = 1000 per window of 1 s (windows aligned on the one "
         "clock), " +
         std::to_string(o.windows) + " windows, seed " + std::to_string(o.seed) +
         "; Poisson arrivals of 1 hit, offered " + number("%.1f", load) +
         " x L per window in all; region 0 gets the share s + (1 - s) / 3, the others (1 - s) "
         "/ 3 each; a refused request is lost. Federated: batch " +
         std::to_string(o.batch) + " (a refill starts below " +
         std::to_string(std::max<std::uint64_t>(1, o.batch / 4)) +
         "), "
         "region-coordinator one-way delay " +
         number("%.1f", std::chrono::duration<double, std::milli>(o.one_way).count()) +
         " ms (round trip " +
         number("%.1f", 2 * std::chrono::duration<double, std::milli>(o.one_way).count()) +
         " ms), drift allowance 1000 ppm, min_window_left 5 ms (the FederationOptions "
         "defaults). U_capacity: mean over windows of admitted / min(offered, L). Independent: "
         "max over windows of admitted / L.\n\n";
}

// ---- processes per region, with and without a regional pool ----

constexpr int kProcesses = 3;
// How much U_capacity three processes sharing a pool may lose against three leasing for
// themselves: the pool's remainder of a regional batch strands at a window's end in a region
// whose demand is below it (0.015 at s = 0.75 over 20 windows).
constexpr double kPoolMargin = 0.03;

struct PoolRow {
  double skew = 0;
  // M processes leasing for themselves; sharing a pool (regional batch 4 x batch, the default);
  // sharing a pool whose regional batch is one batch.
  FederationSimResult own, pooled, small;
};

FederationSimConfig pool_config(const FederationScenarioOptions& o, double skew, bool pool) {
  FederationSimConfig c = run_config(o, o.load, skew);
  c.processes = kProcesses;
  c.regional_pool = pool;
  return c;
}

std::vector<PoolRow> run_pools(const FederationScenarioOptions& o) {
  std::vector<PoolRow> rows;
  for (const double s : federation_skews()) {
    PoolRow& row = rows.emplace_back();
    row.skew = s;
    row.own = run_federation_sim(pool_config(o, s, false));
    row.pooled = run_federation_sim(pool_config(o, s, true));
    FederationSimConfig c = pool_config(o, s, true);
    c.regional_batch = 16 * o.batch;
    row.small = run_federation_sim(c);
  }
  return rows;
}

// Each setup of a pool row, with the one-process run of the main table at the same skew.
std::vector<std::pair<std::string, const FederationSimResult*>> pool_setups(const PoolRow& r,
                                                                            const SkewRow& single,
                                                                            std::uint64_t batch) {
  return {{"1 process per region (above)", &single.federated},
          {"3 processes, each its own leases", &r.own},
          {"3 processes, a pool (regional batch " + std::to_string(4 * batch) + ")", &r.pooled},
          {"3 processes, a pool (regional batch " + std::to_string(16 * batch) + ")", &r.small}};
}

std::string pool_table(const std::vector<PoolRow>& rows, const std::vector<SkewRow>& single,
                       std::uint64_t batch) {
  std::string t =
      "| skew | setup | U_capacity | max admitted per window / limit | stranded escrow per window "
      "| coordinator leases per admission |\n|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (const auto& [setup, r] : pool_setups(rows[i], single[i], batch))
      t += "| " + number("%.2f", rows[i].skew) + " | " + setup + " | " +
           number("%.3f", r->u_capacity) + " | " + number("%.3f", r->max_admitted_over_limit) +
           " | " + number("%.1f", r->mean_stranded) + " | " +
           number("%.4f", r->leases_per_admission) + " |\n";
  return t;
}

std::string pool_csv(const std::vector<PoolRow>& rows, const std::vector<SkewRow>& single,
                     std::uint64_t batch) {
  std::string out =
      "skew,processes,regional_batch,u_capacity,max_admitted_over_limit,stranded_per_window,"
      "leases_per_admission,pool_taken_per_window\n";
  // processes and regional batch (0: no pool) of each setup, in pool_setups' order.
  const std::string keys[] = {"1,0", "3,0", "3," + std::to_string(4 * batch),
                              "3," + std::to_string(16 * batch)};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto setups = pool_setups(rows[i], single[i], batch);
    for (std::size_t j = 0; j < setups.size(); ++j) {
      const FederationSimResult* r = setups[j].second;
      char buf[160];
      std::snprintf(buf, sizeof buf, ",%.4f,%.4f,%.2f,%.5f,%.1f\n", r->u_capacity,
                    r->max_admitted_over_limit, r->mean_stranded, r->leases_per_admission,
                    static_cast<double>(r->pool_taken) / static_cast<double>(r->windows.size()));
      out += number("%.2f", rows[i].skew) + "," + keys[j] + buf;
    }
  }
  return out;
}

// Coordinator leases per admission as the processes per region grow, at one skew.
struct ProcessRow {
  int processes = 1;
  FederationSimResult own, pooled;
};

std::vector<ProcessRow> run_processes(const FederationScenarioOptions& o, double skew) {
  std::vector<ProcessRow> rows;
  for (const int m : {1, 3, 6, 9}) {
    ProcessRow& row = rows.emplace_back();
    row.processes = m;
    FederationSimConfig c = pool_config(o, skew, false);
    c.processes = m;
    row.own = run_federation_sim(c);
    c.regional_pool = true;
    row.pooled = run_federation_sim(c);
  }
  return rows;
}

std::string process_table(const std::vector<ProcessRow>& rows) {
  std::string t =
      "| processes per region | U_capacity, own leases | U_capacity, pool | coordinator leases "
      "per admission, own leases | coordinator leases per admission, pool | max admitted per "
      "window / limit (both) |\n|---|---|---|---|---|---|\n";
  for (const ProcessRow& r : rows)
    t += "| " + std::to_string(r.processes) + " | " + number("%.3f", r.own.u_capacity) + " | " +
         number("%.3f", r.pooled.u_capacity) + " | " + number("%.4f", r.own.leases_per_admission) +
         " | " + number("%.4f", r.pooled.leases_per_admission) + " | " +
         number("%.3f", std::max(r.own.max_admitted_over_limit, r.pooled.max_admitted_over_limit)) +
         " |\n";
  return t;
}

// Coordinator leases per admission by processes per region, with and without a pool.
std::string process_plot(const std::vector<ProcessRow>& rows) {
  PlotSeries own{"each process its own leases", "#d62728", {}, false};
  PlotSeries pooled{"a pool per region", "#2ca02c", {}, false};
  for (const ProcessRow& r : rows) {
    own.points.emplace_back(r.processes, r.own.leases_per_admission);
    pooled.points.emplace_back(r.processes, r.pooled.leases_per_admission);
  }
  return svg_plot("Coordinator leases per admission: K = 3 regions, s = 0.5",
                  "lease calls per admission", {own, pooled}, "processes per region");
}

// ---- a coordinator outage ----

constexpr int kOutageWindows = 12;

struct OutageRun {
  FederationSimConfig config;
  FederationSimResult result;
};

std::string outage_label(const FederationSimConfig& c) {
  std::string out =
      std::string(to_string(c.outage)) + ", " + std::string(to_string(c.outage_failure));
  if (c.outage == FederationOutage::kRegionalOnly)
    out += ", probe every " +
           number("%g s", std::chrono::duration<double>(c.coordinator_health_check).count());
  return out;
}

std::string outage_span(const FederationSimConfig& c) {
  return number("%.2f", std::chrono::duration<double>(c.outage_start).count()) + "-" +
         number("%.2f s", std::chrono::duration<double>(c.outage_end).count());
}

// Three processes per region sharing a pool, the coordinator unreachable during [start, end).
FederationSimConfig outage_config(const FederationScenarioOptions& o, double load, double skew,
                                  Nanos start, Nanos end) {
  FederationSimConfig c = pool_config(o, skew, true);
  c.load = load;
  c.windows = kOutageWindows;
  c.outage_start = start;
  c.outage_end = end;
  return c;
}

// Fail-closed and regional-only (probing at the default interval, and every second), the
// coordinator's calls refused or timing out, unreachable during [start, start + 3 s) at s = 0.5.
std::vector<OutageRun> run_outages(const FederationScenarioOptions& o, double load, Nanos start) {
  const Nanos probe = FederationOptions{}.coordinator_health_check;
  const struct {
    FederationOutage mode;
    OutageFailure failure;
    Nanos health_check;
  } specs[] = {{FederationOutage::kFailClosed, OutageFailure::kRefused, probe},
               {FederationOutage::kRegionalOnly, OutageFailure::kRefused, probe},
               {FederationOutage::kRegionalOnly, OutageFailure::kRefused, std::chrono::seconds(1)},
               {FederationOutage::kFailClosed, OutageFailure::kTimeout, probe},
               {FederationOutage::kRegionalOnly, OutageFailure::kTimeout, probe}};
  std::vector<OutageRun> runs;
  for (const auto& spec : specs) {
    FederationSimConfig c = outage_config(o, load, 0.5, start, start + std::chrono::seconds(3));
    c.outage_failure = spec.failure;
    c.outage = spec.mode;
    c.coordinator_health_check = spec.health_check;
    runs.push_back({c, run_federation_sim(c)});
  }
  return runs;
}

// A short outage across a window's end at s = 0.75, where the cold regions' pools still hold
// units when the window ends and the coordinator is back early in the next one: regional-only
// spends those units in a window that also gets its whole limit.
std::vector<OutageRun> run_short_outages(const FederationScenarioOptions& o) {
  std::vector<OutageRun> runs;
  for (const FederationOutage m :
       {FederationOutage::kFailClosed, FederationOutage::kRegionalOnly}) {
    FederationSimConfig c = outage_config(o, o.load, 0.75, std::chrono::milliseconds(5970),
                                          std::chrono::milliseconds(6050));
    c.outage = m;
    c.coordinator_health_check = std::chrono::milliseconds(100);
    runs.push_back({c, run_federation_sim(c)});
  }
  return runs;
}

// The windows the outage touches: from the one it begins in to the one it ends in.
bool in_outage(const FederationSimConfig& c, std::size_t k) {
  const auto first = static_cast<std::size_t>(c.outage_start / c.window);
  const auto last = static_cast<std::size_t>(c.outage_end / c.window);
  return k >= first && k <= last;
}

// The degraded bound's budget: what the pools held at the onset, counting the refills in flight
// then (their leases reached the coordinator before it).
std::uint64_t onset_bound(const FederationSimResult& r) {
  return r.onset_pool_balance + r.refilled_in_outage;
}

std::uint64_t excess_over_limit(const OutageRun& r) {
  std::uint64_t most = 0;
  for (std::size_t k = 0; k < r.result.windows.size(); ++k)
    if (in_outage(r.config, k) && r.result.windows[k].admitted > r.config.limit)
      most = std::max(most, r.result.windows[k].admitted - r.config.limit);
  return most;
}

std::string outage_windows_table(const std::vector<OutageRun>& runs) {
  std::string t = "| window | offered / limit |";
  std::string rule = "|---|---|";
  for (const OutageRun& r : runs) {
    t += " " + outage_label(r.config) + " |";
    rule += "---|";
  }
  t += "\n" + rule + "\n";
  const OutageRun& first = runs.front();
  const auto limit = static_cast<double>(first.config.limit);
  for (std::size_t k = 2; k < first.result.windows.size(); ++k) {
    t += "| " + std::to_string(k) + (in_outage(first.config, k) ? " (outage)" : "") + " | " +
         number("%.3f", static_cast<double>(first.result.windows[k].offered) / limit) + " |";
    for (const OutageRun& r : runs) {
      const FederationWindow& w = r.result.windows[k];
      t += " " + number("%.3f", static_cast<double>(w.admitted) / limit);
      if (w.admitted > w.handed_out) t += " (+" + std::to_string(w.admitted - w.handed_out) + ")";
      t += " |";
    }
    t += "\n";
  }
  return t;
}

std::string outage_summary(const std::vector<OutageRun>& runs) {
  std::string t =
      "| outage | load, skew | mode, failure | pools' balance at onset + refills in flight | "
      "escrow held by processes at onset | released to the pools during the outage | admitted "
      "beyond the windows' own grants | most admitted over the limit in a window | refused: "
      "coordinator unreachable | refused: regional balance spent |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const OutageRun& r : runs) {
    std::uint64_t unreachable = 0, spent = 0;
    for (const FederationWindow& w : r.result.windows) {
      unreachable += w.refused_unreachable;
      spent += w.refused_balance_spent;
    }
    t += "| " + outage_span(r.config) + " | " + number("%.1f", r.config.load) + ", " +
         number("%.2f", r.config.skew) + " | " + outage_label(r.config) + " | " +
         std::to_string(r.result.onset_pool_balance) + " + " +
         std::to_string(r.result.refilled_in_outage) + " | " +
         std::to_string(r.result.onset_escrow_held) + " | " +
         std::to_string(r.result.released_in_outage) + " | " +
         std::to_string(r.result.beyond_grants) + " | " + std::to_string(excess_over_limit(r)) +
         " | " + std::to_string(unreachable) + " | " + std::to_string(spent) + " |\n";
  }
  return t;
}

// Admitted / limit per window (at the window's middle) through the outage, by mode.
std::string outage_plot(const std::vector<OutageRun>& runs) {
  static const char* const kColors[] = {"#d62728", "#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd"};
  std::vector<PlotSeries> series;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    PlotSeries s{outage_label(runs[i].config), kColors[i % 5], {}, i >= 3};
    for (std::size_t k = 0; k < runs[i].result.windows.size(); ++k)
      s.points.emplace_back(static_cast<double>(k) + 0.5,
                            static_cast<double>(runs[i].result.windows[k].admitted) /
                                static_cast<double>(runs[i].config.limit));
    series.push_back(std::move(s));
  }
  const FederationSimConfig& c = runs.front().config;
  const double start = std::chrono::duration<double>(c.outage_start).count();
  const double end = std::chrono::duration<double>(c.outage_end).count();
  // The outage as a box from 0 to the limit.
  series.push_back({"outage " + outage_span(c),
                    "#000000",
                    {{start, 0.0}, {start, 1.0}, {end, 1.0}, {end, 0.0}},
                    true});
  return svg_plot("Admitted / limit per window through a coordinator outage (load " +
                      number("%.1f", c.load) + ", s = 0.5)",
                  "admitted / limit", series, "time (s)");
}

std::string outage_csv(const std::vector<OutageRun>& runs) {
  std::string out =
      "outage_start_s,outage_end_s,load,skew,mode,failure,health_check_s,window,in_outage,offered,"
      "admitted,handed_out,leases,refused_unreachable,refused_balance_spent,onset_pool_balance,"
      "refilled_in_outage,released_in_outage,onset_escrow_held\n";
  for (const OutageRun& r : runs) {
    const FederationSimConfig& c = r.config;
    char head[160];
    std::snprintf(head, sizeof head, "%.2f,%.2f,%.1f,%.2f,%s,%s,%g,",
                  std::chrono::duration<double>(c.outage_start).count(),
                  std::chrono::duration<double>(c.outage_end).count(), c.load, c.skew,
                  std::string(to_string(c.outage)).c_str(),
                  std::string(to_string(c.outage_failure)).c_str(),
                  std::chrono::duration<double>(c.coordinator_health_check).count());
    for (std::size_t k = 0; k < r.result.windows.size(); ++k) {
      const FederationWindow& w = r.result.windows[k];
      out += head + std::to_string(k) + "," + (in_outage(c, k) ? "1" : "0") + "," +
             std::to_string(w.offered) + "," + std::to_string(w.admitted) + "," +
             std::to_string(w.handed_out) + "," + std::to_string(w.leases) + "," +
             std::to_string(w.refused_unreachable) + "," + std::to_string(w.refused_balance_spent) +
             "," + std::to_string(r.result.onset_pool_balance) + "," +
             std::to_string(r.result.refilled_in_outage) + "," +
             std::to_string(r.result.released_in_outage) + "," +
             std::to_string(r.result.onset_escrow_held) + "\n";
    }
  }
  return out;
}

// Charges after the response: every admitted check of 1 hit charges 0 .. kChargeMax more
// hits 20 ms later, at each skew.
constexpr std::uint64_t kChargeMax = 8;

struct ChargeRow {
  double skew = 0;
  FederationSimResult federated;
};

std::vector<ChargeRow> run_charges(const FederationScenarioOptions& o) {
  std::vector<ChargeRow> rows;
  for (const double s : federation_skews()) {
    FederationSimConfig c = run_config(o, o.load, s);
    c.charge_max = kChargeMax;
    rows.push_back({s, run_federation_sim(c)});
  }
  return rows;
}

struct ChargeTotals {
  std::uint64_t admitted = 0, charged = 0, forgiven = 0, spent = 0;
};

ChargeTotals charge_totals(const FederationSimResult& r) {
  ChargeTotals t;
  for (const FederationWindow& w : r.windows) {
    t.admitted += w.admitted;
    t.charged += w.charged;
    t.forgiven += w.forgiven;
    t.spent += w.spent;
  }
  return t;
}

std::string charge_table(const std::vector<ChargeRow>& rows) {
  std::string t =
      "| skew | checks admitted / limit | hits charged / limit | charged hits forgiven | spent "
      "/ limit (mean) | spent / limit (max) |\n|---|---|---|---|---|---|\n";
  for (const ChargeRow& r : rows) {
    const ChargeTotals c = charge_totals(r.federated);
    const double per = static_cast<double>(FederationSimConfig{}.limit) *
                       static_cast<double>(r.federated.windows.size());
    t += "| " + number("%.2f", r.skew) + " | " +
         number("%.3f", static_cast<double>(c.admitted) / per) + " | " +
         number("%.3f", static_cast<double>(c.charged) / per) + " | " +
         number("%.1f%%", c.charged > 0 ? 100.0 * static_cast<double>(c.forgiven) /
                                              static_cast<double>(c.charged)
                                        : 0.0) +
         " | " + number("%.3f", r.federated.mean_spent_over_limit) + " | " +
         number("%.3f", r.federated.max_spent_over_limit) + " |\n";
  }
  return t;
}

std::string charge_csv(const std::vector<ChargeRow>& rows) {
  std::string out = "skew,window,offered,admitted,charged,forgiven,spent,handed_out,leases\n";
  for (const ChargeRow& r : rows)
    for (std::size_t k = 0; k < r.federated.windows.size(); ++k) {
      const FederationWindow& w = r.federated.windows[k];
      out += number("%.2f", r.skew) + "," + std::to_string(k) + "," + std::to_string(w.offered) +
             "," + std::to_string(w.admitted) + "," + std::to_string(w.charged) + "," +
             std::to_string(w.forgiven) + "," + std::to_string(w.spent) + "," +
             std::to_string(w.handed_out) + "," + std::to_string(w.leases) + "\n";
    }
  return out;
}

// On callers' clocks (a coordinator with no clock of its own, etcd's): three regions whose clocks
// are kClockOffset ahead, right and behind (max_clock_offset ε = kClockOffset), the coordinator
// stating an uncertainty of 2ε, or 0 (what happens without it), against one clock for all.
constexpr Nanos kClockOffset = std::chrono::milliseconds(20);

struct ClockRow {
  double skew = 0;
  FederationSimResult one_clock, with_uncertainty, without;
};

std::vector<ClockRow> run_clocks(const FederationScenarioOptions& o) {
  std::vector<ClockRow> rows;
  for (const double s : {0.0, 0.5, 1.0}) {
    ClockRow& row = rows.emplace_back();
    row.skew = s;
    FederationSimConfig c = run_config(o, o.load, s);
    row.one_clock = run_federation_sim(c);
    c.clock_offsets = {-kClockOffset, Nanos{0}, kClockOffset};  // the hot region the slowest
    c.clock_uncertainty = 2 * kClockOffset;
    row.with_uncertainty = run_federation_sim(c);
    c.clock_uncertainty = Nanos{0};
    row.without = run_federation_sim(c);
  }
  return rows;
}

std::string clock_table(const std::vector<ClockRow>& rows) {
  std::string t =
      "| skew | one clock: U_capacity | callers' clocks, uncertainty 2ε: U_capacity | max "
      "admitted / L | without the uncertainty: max admitted / L | windows over L |\n"
      "|---|---|---|---|---|---|\n";
  for (const ClockRow& r : rows) {
    int over = 0;
    for (const FederationWindow& w : r.without.windows)
      over += w.admitted > FederationSimConfig{}.limit ? 1 : 0;
    t += "| " + number("%.2f", r.skew) + " | " + number("%.4f", r.one_clock.u_capacity) + " | " +
         number("%.4f", r.with_uncertainty.u_capacity) + " | " +
         number("%.4f", r.with_uncertainty.max_admitted_over_limit) + " | " +
         number("%.4f", r.without.max_admitted_over_limit) + " | " + std::to_string(over) + " of " +
         std::to_string(r.without.windows.size()) + " |\n";
  }
  return t;
}

std::string clock_csv(const std::vector<ClockRow>& rows) {
  std::string out = "skew,run,window,offered,admitted,handed_out,leases\n";
  for (const ClockRow& r : rows)
    for (const auto& [name, res] :
         {std::pair<const char*, const FederationSimResult*>{"one-clock", &r.one_clock},
          {"uncertainty", &r.with_uncertainty},
          {"without", &r.without}})
      for (std::size_t k = 0; k < res->windows.size(); ++k) {
        const FederationWindow& w = res->windows[k];
        out += number("%.2f", r.skew) + "," + name + "," + std::to_string(k) + "," +
               std::to_string(w.offered) + "," + std::to_string(w.admitted) + "," +
               std::to_string(w.handed_out) + "," + std::to_string(w.leases) + "\n";
      }
  return out;
}

}  // namespace

ScenarioOutput run_federation_scenario(const FederationScenarioOptions& o) {
  ScenarioOutput out{"federation", {}, {}, {}};
  const auto bounded = [&](const FederationSimResult& r, const std::string& at) {
    claim(out, r.max_admitted_over_limit <= 1.0,
          "federated max admitted per window / limit must be <= 1" + at + ", measured " +
              number("%.4f", r.max_admitted_over_limit));
  };
  std::vector<SkewRow> main_rows;  // one process per region at `load`, for the pool table
  std::vector<double> loads = {o.load};
  if (o.load != 1.0) loads.push_back(1.0);
  for (const double load : loads) {
    const bool main_load = load == o.load;
    const std::string tag = "load-" + number("%.1f", load);
    const std::vector<SkewRow> rows = run_skews(o, load, federation_skews());
    const std::vector<SkewRow> near_one = run_skews(o, load, {0.9, 0.95, 0.99});
    std::vector<SkewRow> all = rows;
    all.insert(all.end(), near_one.begin(), near_one.end());
    out.table += "### Offered " + number("%.1f", load) + " x L\n\n" + setup(o, load) + table(rows) +
                 "\nBetween s = 0.75 and s = 1 (the cold regions' load falls towards 0):\n\n" +
                 table(near_one) + "\nWhere the federated budget went:\n\n" + diagnostics(all) +
                 "\n";
    out.files.emplace_back("federation-" + tag + ".csv", csv(all));
    out.files.emplace_back("federation-" + tag + "-windows.csv", windows_csv(all));
    out.files.emplace_back("federation-" + tag + ".svg", plot(all, load, o.batch));
    for (const SkewRow& r : all)
      bounded(r.federated, " at s = " + number("%.2f", r.skew) + ", load " + number("%.1f", load));
    if (!main_load) continue;
    main_rows = rows;
    for (const SkewRow& r : all)
      claim(out, r.federated.u_capacity >= 0.98,
            "federated U_capacity must be >= 0.98 at s = " + number("%.2f", r.skew) +
                ", measured " + number("%.4f", r.federated.u_capacity));
    claim(out, std::abs(rows.back().fixed.u_capacity - 1.0 / 3.0) <= 0.01,
          "static U_capacity at s = 1 must be about 1/K, measured " +
              number("%.4f", rows.back().fixed.u_capacity));
    claim(out, rows.front().independent.max_admitted_over_limit > 1.0,
          "independent limiters must overshoot at s = 0, measured " +
              number("%.4f", rows.front().independent.max_admitted_over_limit));
  }
  const std::vector<RoundTripRow> trips = run_round_trips(o);
  out.table += "### Round trip (offered " + number("%.1f", o.load) +
               " x L, federated only)\n\nAs above, with a longer region-coordinator delay. A "
               "region has one lease of a key in flight at a time; the checks that queue behind "
               "it are what the next lease asks for (at least a batch). Were each lease a batch, "
               "a region could admit at most batch / round trip per second (third column). "
               "Escrow expires one one-way delay before its window ends (the region cannot tell "
               "when in the round trip the coordinator decided), which is what the longest "
               "delays cost.\n\n" +
               round_trip_table(trips, o.batch) + "\n";
  out.files.emplace_back("federation-round-trip.csv", round_trip_csv(trips));
  // Processes sharing a regional pool.
  {
    const std::vector<PoolRow> pools = run_pools(o);
    out.table += "### Three processes per region, with and without a regional pool (offered " +
                 number("%.1f", o.load) +
                 " x L)\n\nAs above, with each region's arrivals spread at random over 3 "
                 "processes, each its own FederatedLimiter: leasing for itself, or sharing the "
                 "region's pool (a MemoryRegionalEscrow behind the same one-way delay). Leases "
                 "count coordinator calls only.\n\n" +
                 pool_table(pools, main_rows, o.batch) + "\n";
    out.files.emplace_back("federation-pool.csv", pool_csv(pools, main_rows, o.batch));
    const std::vector<ProcessRow> procs = run_processes(o, 0.5);
    out.table += "By processes per region, s = 0.50:\n\n" + process_table(procs) + "\n";
    out.files.emplace_back("federation-pool-processes.svg", process_plot(procs));
    for (const PoolRow& r : pools) {
      const std::string at = " at s = " + number("%.2f", r.skew);
      bounded(r.own, " with 3 processes" + at);
      bounded(r.pooled, " with 3 processes and a pool" + at);
      bounded(r.small, " with 3 processes and a pool of regional batch 256" + at);
      claim(out, r.pooled.u_capacity >= r.own.u_capacity - kPoolMargin,
            "U_capacity with a pool must be within " + number("%.2f", kPoolMargin) +
                " of 3 processes leasing for themselves" + at + ", measured " +
                number("%.4f", r.pooled.u_capacity) + " vs " + number("%.4f", r.own.u_capacity));
      claim(out, r.pooled.leases_per_admission < r.own.leases_per_admission,
            "a pool must cost fewer coordinator leases per admission" + at + ", measured " +
                number("%.4f", r.pooled.leases_per_admission) + " vs " +
                number("%.4f", r.own.leases_per_admission));
    }
    for (const ProcessRow& r : procs) {
      bounded(r.own, " with " + std::to_string(r.processes) + " processes");
      bounded(r.pooled, " with " + std::to_string(r.processes) + " processes and a pool");
    }
  }
  // Checks of many units.
  {
    const std::vector<WeightedRow> weighted = run_weighted(o);
    out.table += "### Checks of many units (offered " + number("%.1f", o.load) +
                 " x L, one process per region)\n\nEvery check asks for `hits` units all or "
                 "nothing; offered and admitted count units. A check larger than a region's "
                 "escrow leases what it lacks as the lease's need: the coordinator grants at "
                 "least that or, with less left in the window, nothing (the check is refused as "
                 "budget_short). Units demanded and not admitted in a window (min(offered, L) - "
                 "admitted) are what a region held at the window's end below its next check's "
                 "size (or a batch's leftover), and what the coordinator kept below every "
                 "waiting check's need: the stated bound is K x max(hits - 1, batch) + hits - "
                 "1.\n\n" +
                 weighted_table(weighted) + "\n";
    out.files.emplace_back("federation-weighted.csv", weighted_csv(weighted));
    for (const WeightedRow& r : weighted) {
      const std::string at =
          " with checks of " + std::to_string(r.hits) + " units at s = " + number("%.2f", r.skew);
      bounded(r.federated, at);
      claim(out, r.federated.u_capacity >= r.fixed.u_capacity,
            "federated U_capacity must be at least the static partition's" + at + ", measured " +
                number("%.4f", r.federated.u_capacity) + " vs " +
                number("%.4f", r.fixed.u_capacity));
      claim(out, unserved(r.federated, kWeightedLimit).second <= r.bound,
            "federated units demanded and not admitted in a window must be at most K x "
            "max(hits - 1, batch) + hits - 1" +
                at + ", measured " + number("%.0f", unserved(r.federated, kWeightedLimit).second));
    }
  }
  // A coordinator outage.
  {
    std::vector<OutageRun> runs = run_outages(o, o.load, std::chrono::milliseconds(4500));
    out.table +=
        "### Coordinator outage\n\n3 processes per region sharing a pool, " +
        std::to_string(kOutageWindows) +
        " windows, s = 0.50; the coordinator unreachable for 3 s (refused: each call fails one "
        "round trip after it is made; timeout: at lease_timeout, 250 ms); the pools stay "
        "reachable. Admitted / limit per window; (+n): admitted beyond the window's own "
        "grants.\n\nOffered " +
        number("%.1f", o.load) + " x L, outage 4.50-7.50 s:\n\n" + outage_windows_table(runs) +
        "\nOffered 0.6 x L, outage 4.90-7.90 s (the pools still hold units when it begins):\n\n";
    const std::vector<OutageRun> low = run_outages(o, 0.6, std::chrono::milliseconds(4900));
    out.table += outage_windows_table(low) + "\n";
    const std::vector<OutageRun> brief = run_short_outages(o);
    out.table += "An 80 ms outage across a window's end (5.97-6.05 s), s = 0.75, offered " +
                 number("%.1f", o.load) + " x L:\n\n" + outage_windows_table(brief) + "\n";
    out.files.emplace_back("federation-outage.svg", outage_plot(runs));
    runs.insert(runs.end(), low.begin(), low.end());
    runs.insert(runs.end(), brief.begin(), brief.end());
    out.table += outage_summary(runs) + "\n";
    out.files.emplace_back("federation-outage.csv", outage_csv(runs));
    for (const OutageRun& r : runs) {
      const std::string what = outage_label(r.config) + ", outage " + outage_span(r.config) +
                               ", load " + number("%.1f", r.config.load);
      if (r.config.outage == FederationOutage::kFailClosed) {
        bounded(r.result, " in a fail-closed outage (" + what + ")");
        claim(out, r.result.beyond_grants == 0,
              "fail-closed must admit nothing beyond a window's own grants (" + what +
                  "), measured " + std::to_string(r.result.beyond_grants));
        continue;
      }
      claim(out, r.result.outages > 0, "regional-only must enter the outage (" + what + ")");
      claim(out, r.result.beyond_grants <= onset_bound(r.result),
            "regional-only must admit beyond the windows' own grants at most the pools' balance "
            "at the onset with the refills in flight (" +
                what + "), measured " + std::to_string(r.result.beyond_grants) + " > " +
                std::to_string(onset_bound(r.result)));
      claim(out, excess_over_limit(r) <= onset_bound(r.result),
            "regional-only must exceed the limit in a window by at most the pools' balance at "
            "the onset (" +
                what + "), measured " + std::to_string(excess_over_limit(r)));
    }
  }
  // Charges after the response.
  {
    const std::vector<ChargeRow> charges = run_charges(o);
    out.table += "### Charges after the response (offered " + number("%.1f", o.load) +
                 " x L, one process per region)\n\nEvery admitted check of 1 hit is followed "
                 "20 ms later by a charge of 0 to " +
                 std::to_string(kChargeMax) +
                 " more hits (uniform) on the region that admitted it: the rest of a cost known "
                 "only after the response. The offered load counts those hits: checks arrive " +
                 number("%.1f", o.load) + " x L / " + number("%.0f", 1.0 + kChargeMax / 2.0) +
                 " per window. Spent: the units the limiters spent in the window (admitted checks "
                 "and paid charges), from their counters at the window's start and end; a charge "
                 "no budget covers is owed, paid first from the next grant, or forgiven when the "
                 "window is spent or over.\n\n" +
                 charge_table(charges) + "\n";
    out.files.emplace_back("federation-charges.csv", charge_csv(charges));
    for (const ChargeRow& r : charges) {
      const std::string at = " with charges at s = " + number("%.2f", r.skew);
      bounded(r.federated, at);
      claim(out, r.federated.max_spent_over_limit <= 1.0,
            "federated max spent per window / limit must be <= 1" + at + ", measured " +
                number("%.4f", r.federated.max_spent_over_limit));
      const ChargeTotals c = charge_totals(r.federated);
      claim(out, c.spent > c.admitted + c.forgiven,
            "charges must be paid from the budget" + at + ": spent " + std::to_string(c.spent) +
                ", admitted " + std::to_string(c.admitted));
    }
  }
  // On callers' clocks.
  {
    const std::vector<ClockRow> rows = run_clocks(o);
    const double eps_ms = std::chrono::duration<double, std::milli>(kClockOffset).count();
    out.table +=
        "### On its callers' clocks (etcd)\n\nA coordinator with no clock of its own decides each "
        "call at its caller's clock, or at the latest time it decided the key at when that is "
        "later (sluice/backends/etcd_rate_coordinator.h). Three regions, offered " +
        number("%.1f", o.load) + " x L, whose clocks read " + number("%.0f", eps_ms) +
        " ms ahead, right and " + number("%.0f", eps_ms) +
        " ms behind (max_clock_offset ε = " + number("%.0f ms", eps_ms) +
        "); the coordinator says an uncertainty of 2ε, which ends each region's escrow 2ε early "
        "and asks 2ε more of a window to be left, or says 0. Windows are counted on the fastest "
        "region's clock (the true clock + ε), the latest any caller reads: a window's grants "
        "are made at or after its start on it, and with the uncertainty spent before its end. "
        "The first window is ε shorter than the others. The hot region is the slowest: "
        "without the uncertainty its escrow outlives the window on the fastest clock by up to "
        "2ε, while the next window's grants are spent (at s = 1 by itself: it spends on its own "
        "clock's windows, 2ε behind the frame).\n\n" +
        clock_table(rows) + "\n";
    out.files.emplace_back("federation-callers-clocks.csv", clock_csv(rows));
    bool overshoots = false;
    for (const ClockRow& r : rows) {
      const std::string at = " on callers' clocks at s = " + number("%.2f", r.skew);
      bounded(r.with_uncertainty, at);
      claim(out, r.with_uncertainty.u_capacity >= r.one_clock.u_capacity - 0.05,
            "the uncertainty must cost at most 0.05 of U_capacity" + at + ", measured " +
                number("%.4f", r.with_uncertainty.u_capacity) + " against " +
                number("%.4f", r.one_clock.u_capacity));
      overshoots |= r.without.max_admitted_over_limit > 1.0;
    }
    claim(out, overshoots,
          "without the uncertainty, some window on callers' clocks must go over L (the rule is "
          "what keeps it)");
  }
  for (const RoundTripRow& r : trips) {
    const std::string at =
        " at one-way " +
        number("%.0f ms", std::chrono::duration<double, std::milli>(r.one_way).count());
    bounded(r.uniform, at + ", s = 0");
    bounded(r.hot, at + ", s = 1");
  }
  return out;
}

}  // namespace sluice::sim
