// sim.h: `sluice sim fleet`: the fleet guard's simulation scenarios, `sluice sim federation`:
// one global rate budget across regions against per-region limits, `sluice sim cascade`: the
// fallback cascade against round-robin, random and power-of-two-choices, and `sluice sim
// shared-rate`: a shared rate limit's coordinator restarted from its snapshot, with and without
// the loss rule (sim/).
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

struct CascadeSimOptions {
  std::string scenario = "all";  // one of sim::cascade_scenarios() by name, or all
  std::string out_dir;           // where CSV and SVG files go; empty: none written
  std::uint64_t seed = 1;
  double rate = 1000;    // arrivals per second
  double seconds = 120;  // the run's length
};

// Prints the table; exit code 1 if a claim did not hold, 2 on a bad option or a file that cannot
// be written.
int run_sim_cascade(const CascadeSimOptions& options);

struct SharedRateSimOptions {
  std::string out_dir;  // where CSV and SVG files go; empty: none written
  std::uint64_t seed = 7;
  double scale = 1.0;  // < 1 shortens the run
};

// Prints the table; exit code 1 if a claim did not hold, 2 if a file cannot be written.
int run_sim_shared_rate(const SharedRateSimOptions& options);

}  // namespace sluice::cli
