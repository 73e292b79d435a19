// sluice: the command-line entry point (the project's only main()).
#include <fmt/core.h>

#include <CLI/CLI.hpp>

#include "demo.h"
#include "sim.h"
#include "sluice/config.h"

int main(int argc, char** argv) {
  CLI::App app{"sluice: admission control for shared backends"};
  app.require_subcommand(1);
  app.add_subcommand("version", "print the version")->callback([] {
    fmt::print("sluice 0.1.0\n");
  });

  sluice::cli::DemoOptions demo;
  int exit_code = 0;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "drive the gateway limits with concurrent callers and print what each level did");
  demo_cmd->add_option("--threads", demo.threads, "concurrent callers")
      ->check(CLI::Range(1u, 256u));
  demo_cmd->add_option("--seconds", demo.seconds, "how long to run")
      ->check(CLI::Range(0.01, 3600.0));
  demo_cmd->add_option("--seed", demo.seed, "seed of the callers' random choices");
  demo_cmd->callback([&] { exit_code = sluice::cli::run_demo(demo); });

  sluice::cli::SimOptions sim;
  CLI::App* sim_cmd = app.add_subcommand("sim", "deterministic simulations");
  sim_cmd->require_subcommand(1);
  CLI::App* sim_fleet = sim_cmd->add_subcommand(
      "fleet", "the fleet guard's scenarios: a table per scenario, CSV and SVG with --out");
  sim_fleet->add_option("--scenario", sim.scenario, "fan-out, join-ramp, partition, skew or all")
      ->check(CLI::IsMember({"fan-out", "join-ramp", "partition", "skew", "all"}));
  sim_fleet->add_option("--out", sim.out_dir, "directory for the CSV and SVG files");
  sim_fleet->add_option("--scale", sim.scale, "shorten every run (0.05..1)")
      ->check(CLI::Range(0.05, 1.0));
  sim_fleet->callback([&] { exit_code = sluice::cli::run_sim_fleet(sim); });

  std::string config_path;
  CLI::App* validate_cmd = app.add_subcommand(
      "validate", "check a config file: every error with its line and column; exit 1 if any");
  validate_cmd->add_option("config", config_path, "the YAML config file")->required();
  validate_cmd->callback([&] {
    const sluice::ConfigLoad load = sluice::load_config_file(config_path);
    for (const sluice::ConfigError& e : load.warnings)
      fmt::print(stderr, "warning: {}\n", e.to_string(config_path));
    for (const sluice::ConfigError& e : load.errors)
      fmt::print(stderr, "error: {}\n", e.to_string(config_path));
    if (!load.config) {
      fmt::print(stderr, "{}: {} error(s)\n", config_path, load.errors.size());
      exit_code = 1;
      return;
    }
    fmt::print("{}: ok ({} policies, {} coordinators)\n", config_path, load.config->policies.size(),
               load.config->coordinators.size());
  });

  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
