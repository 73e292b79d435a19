#include "sim.h"

#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "sluice/sim/cascade_sim.h"
#include "sluice/sim/federation_sim.h"
#include "sluice/sim/scenarios.h"
#include "sluice/sim/shared_rate_sim.h"

namespace sluice::cli {

namespace {

// Creates `dir` (when not empty) and writes `out`'s files into it; false after printing why not.
bool write_files(std::string_view command, const std::string& dir, const sim::ScenarioOutput& out) {
  if (dir.empty()) return true;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    fmt::print(stderr, "sluice sim {}: --out {}: {}\n", command, dir, ec.message());
    return false;
  }
  for (const auto& [file, content] : out.files) {
    const std::filesystem::path path = std::filesystem::path(dir) / file;
    std::ofstream f(path);
    f << content;
    if (!f) {
      fmt::print(stderr, "sluice sim {}: cannot write {}\n", command, path.string());
      return false;
    }
  }
  return true;
}

}  // namespace

int run_sim_federation(const FederationSimOptions& options) {
  sim::FederationScenarioOptions o;
  o.windows = options.windows;
  o.seed = options.seed;
  o.batch = options.batch;
  const sim::ScenarioOutput out = sim::run_federation_scenario(o);
  fmt::print("## federation\n\n{}", out.table);
  if (!write_files("federation", options.out_dir, out)) return 2;
  if (out.failed_claims.empty()) {
    fmt::print("claims: all held\n");
    return 0;
  }
  for (const std::string& f : out.failed_claims) fmt::print("claim FAILED: {}\n", f);
  return 1;
}

int run_sim_cascade(const CascadeSimOptions& options) {
  sim::CascadeEvaluationOptions o;
  o.scenario = options.scenario;
  o.seed = options.seed;
  o.rate = options.rate;
  o.duration = std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(options.seconds));
  const sim::ScenarioOutput out = sim::run_cascade_evaluation(o);
  if (out.table.empty()) {
    for (const std::string& f : out.failed_claims)
      fmt::print(stderr, "sluice sim cascade: {}\n", f);
    return 2;
  }
  fmt::print("## cascade\n\n{}\n", out.table);
  if (!write_files("cascade", options.out_dir, out)) return 2;
  if (out.failed_claims.empty()) {
    fmt::print("claims: all held\n");
    return 0;
  }
  for (const std::string& f : out.failed_claims) fmt::print("claim FAILED: {}\n", f);
  return 1;
}

int run_sim_shared_rate(const SharedRateSimOptions& options) {
  const sim::ScenarioOutput out = sim::shared_rate_loss_scenario(options.scale, options.seed);
  fmt::print("## shared-rate-loss\n\n{}\n", out.table);
  if (!write_files("shared-rate", options.out_dir, out)) return 2;
  if (out.failed_claims.empty()) {
    fmt::print("claims: all held\n");
    return 0;
  }
  for (const std::string& f : out.failed_claims) fmt::print("claim FAILED: {}\n", f);
  return 1;
}

int run_sim_fleet(const SimOptions& options) {
  std::vector<std::string> names;
  if (options.scenario == "all") {
    names = sim::scenario_names();
  } else {
    names.push_back(options.scenario);
  }
  if (!options.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.out_dir, ec);
    if (ec) {
      fmt::print(stderr, "sluice sim fleet: --out {}: {}\n", options.out_dir, ec.message());
      return 2;
    }
  }
  int failed = 0;
  for (const std::string& name : names) {
    const sim::ScenarioOutput out = sim::run_scenario(name, options.scale);
    if (out.table.empty()) {
      for (const std::string& f : out.failed_claims)
        fmt::print(stderr, "sluice sim fleet: {}\n", f);
      return 2;
    }
    fmt::print("## {}\n\n{}\n", name, out.table);
    if (!write_files("fleet", options.out_dir, out)) return 2;
    if (out.failed_claims.empty()) {
      fmt::print("claims: all held\n\n");
    } else {
      for (const std::string& f : out.failed_claims) fmt::print("claim FAILED: {}\n", f);
      fmt::print("\n");
      ++failed;
    }
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace sluice::cli
