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

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void claim(ScenarioOutput& out, bool holds, const std::string& what) {
  if (!holds) out.failed_claims.push_back(what);
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
    FederationSimConfig c;
    c.load = load;
    c.skew = s;
    c.windows = o.windows;
    c.seed = o.seed;
    c.one_way = o.one_way;
    c.batch = o.batch;
    c.scheme = FederationScheme::kIndependent;
    row.independent = run_federation_sim(c);
    c.scheme = FederationScheme::kStatic;
    row.fixed = run_federation_sim(c);
    c.scheme = FederationScheme::kFederated;
    row.federated = run_federation_sim(c);
  }
  return rows;
}

std::string table(const std::vector<SkewRow>& rows) {
  std::string t =
      "| skew | static U_capacity | federated U_capacity | max admitted per window / limit | "
      "independent admitted / limit |\n|---|---|---|---|---|\n";
  for (const SkewRow& r : rows)
    t += "| " + fmt("%.2f", r.skew) + " | " + fmt("%.3f", r.fixed.u_capacity) + " | " +
         fmt("%.3f", r.federated.u_capacity) + " | " +
         fmt("%.3f", r.federated.max_admitted_over_limit) + " | " +
         fmt("%.3f", r.independent.max_admitted_over_limit) + " |\n";
  return t;
}

// Per region (region 0 the hot one), per window: "a / b / c".
std::string by_region(const FederationSimResult& r, const std::vector<std::uint64_t>& values) {
  std::string out;
  for (const std::uint64_t v : values) {
    if (!out.empty()) out += " / ";
    out += fmt("%.1f", static_cast<double>(v) / static_cast<double>(r.windows.size()));
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
    t += "| " + fmt("%.2f", r.skew) + " | " + fmt("%.3f", r.federated.mean_admitted_over_limit) +
         " | " + fmt("%.1f", r.federated.mean_stranded) + " | " +
         fmt("%.1f", r.federated.mean_unleased) + " | " +
         by_region(r.federated, r.federated.region_admitted) + " | " +
         by_region(r.federated, r.federated.region_forfeited) + " | " +
         fmt("%.4f", r.federated.leases_per_admission) + " | " +
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
        out += fmt("%.2f", r.skew) + "," + std::string(to_string(scheme)) + "," +
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
  return svg_plot(
      "U_capacity by skew: K = 3 regions, L = 1000 per 1 s, offered " + fmt("%.1f", load) + " x L",
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
    FederationSimConfig c;
    c.load = o.load;
    c.windows = o.windows;
    c.seed = o.seed;
    c.batch = o.batch;
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
    t += "| " + fmt("%.0f", ms) + " | " + fmt("%.0f", 2 * ms) + " | " +
         fmt("%.0f", static_cast<double>(batch) / (2 * ms / 1000)) + " | " +
         fmt("%.3f", r.uniform.u_capacity) + " | " + fmt("%.3f", r.hot.u_capacity) + " | " +
         fmt("%.3f", std::max(r.uniform.max_admitted_over_limit, r.hot.max_admitted_over_limit)) +
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
         "; Poisson arrivals of 1 hit, offered " + fmt("%.1f", load) +
         " x L per window in all; region 0 gets the share s + (1 - s) / 3, the others (1 - s) "
         "/ 3 each; a refused request is lost. Federated: batch " +
         std::to_string(o.batch) + " (a refill starts below " +
         std::to_string(std::max<std::uint64_t>(1, o.batch / 4)) +
         "), "
         "region-coordinator one-way delay " +
         fmt("%.1f", std::chrono::duration<double, std::milli>(o.one_way).count()) +
         " ms (round trip " +
         fmt("%.1f", 2 * std::chrono::duration<double, std::milli>(o.one_way).count()) +
         " ms), drift allowance 1000 ppm, min_window_left 5 ms (the FederationOptions "
         "defaults). U_capacity: mean over windows of admitted / min(offered, L). Independent: "
         "max over windows of admitted / L.\n\n";
}

}  // namespace

ScenarioOutput run_federation_scenario(const FederationScenarioOptions& o) {
  ScenarioOutput out{"federation", {}, {}, {}};
  const auto bounded = [&](const FederationSimResult& r, const std::string& at) {
    claim(out, r.max_admitted_over_limit <= 1.0,
          "federated max admitted per window / limit must be <= 1" + at + ", measured " +
              fmt("%.4f", r.max_admitted_over_limit));
  };
  std::vector<double> loads = {o.load};
  if (o.load != 1.0) loads.push_back(1.0);
  for (const double load : loads) {
    const bool main_load = load == o.load;
    const std::string tag = "load-" + fmt("%.1f", load);
    const std::vector<SkewRow> rows = run_skews(o, load, federation_skews());
    const std::vector<SkewRow> near_one = run_skews(o, load, {0.9, 0.95, 0.99});
    std::vector<SkewRow> all = rows;
    all.insert(all.end(), near_one.begin(), near_one.end());
    out.table += "### Offered " + fmt("%.1f", load) + " x L\n\n" + setup(o, load) + table(rows) +
                 "\nBetween s = 0.75 and s = 1 (the cold regions' load falls towards 0):\n\n" +
                 table(near_one) + "\nWhere the federated budget went:\n\n" + diagnostics(all) +
                 "\n";
    out.files.emplace_back("federation-" + tag + ".csv", csv(all));
    out.files.emplace_back("federation-" + tag + "-windows.csv", windows_csv(all));
    out.files.emplace_back("federation-" + tag + ".svg", plot(all, load, o.batch));
    for (const SkewRow& r : all)
      bounded(r.federated, " at s = " + fmt("%.2f", r.skew) + ", load " + fmt("%.1f", load));
    if (!main_load) continue;
    for (const SkewRow& r : all)
      claim(out, r.federated.u_capacity >= 0.98,
            "federated U_capacity must be >= 0.98 at s = " + fmt("%.2f", r.skew) + ", measured " +
                fmt("%.4f", r.federated.u_capacity));
    claim(out, std::abs(rows.back().fixed.u_capacity - 1.0 / 3.0) <= 0.01,
          "static U_capacity at s = 1 must be about 1/K, measured " +
              fmt("%.4f", rows.back().fixed.u_capacity));
    claim(out, rows.front().independent.max_admitted_over_limit > 1.0,
          "independent limiters must overshoot at s = 0, measured " +
              fmt("%.4f", rows.front().independent.max_admitted_over_limit));
  }
  const std::vector<RoundTripRow> trips = run_round_trips(o);
  out.table += "### Round trip (offered " + fmt("%.1f", o.load) +
               " x L, federated only)\n\nAs above, with a longer region-coordinator delay. A "
               "region has one lease of a key in flight at a time; the checks that queue behind "
               "it are what the next lease asks for (at least a batch). Were each lease a batch, "
               "a region could admit at most batch / round trip per second (third column). "
               "Escrow expires one one-way delay before its window ends (the region cannot tell "
               "when in the round trip the coordinator decided), which is what the longest "
               "delays cost.\n\n" +
               round_trip_table(trips, o.batch) + "\n";
  out.files.emplace_back("federation-round-trip.csv", round_trip_csv(trips));
  for (const RoundTripRow& r : trips) {
    const std::string at =
        " at one-way " +
        fmt("%.0f ms", std::chrono::duration<double, std::milli>(r.one_way).count());
    bounded(r.uniform, at + ", s = 0");
    bounded(r.hot, at + ", s = 1");
  }
  return out;
}

}  // namespace sluice::sim
