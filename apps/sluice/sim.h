// sim.h: `sluice sim fleet`: the fleet guard's simulation scenarios, and `sluice sim federation`:
// one global rate budget across regions against per-region limits (sim/).
#pragma once

#include <cstdint>
#include <string>

namespace sluice::cli {

struct SimOptions {
  std::string scenario = "all";  // fan-out, join-ramp, partition, skew, all
  std::string out_dir;           // where CSV and SVG files go; empty: none written
  double scale = 1.0;            // < 1 shortens every run
};

// Prints each scenario's table; exit code 1 if a claim did not hold, 2 on bad options.
int run_sim_fleet(const SimOptions& options);

struct FederationSimOptions {
  std::string out_dir;  // where CSV and SVG files go; empty: none written
  int windows = 20;
  std::uint64_t seed = 1;
  std::uint64_t batch = 16;  // each region's lease size
};

// Prints the skew, regional pool and coordinator outage tables; exit code 1 if a claim did not
// hold, 2 if a file cannot be written.
int run_sim_federation(const FederationSimOptions& options);

}  // namespace sluice::cli
