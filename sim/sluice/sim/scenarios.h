// scenarios.h: the fleet guard's simulation scenarios and the claims each must show.
//
//   fan-out    N = 8 nodes in front of one backend: independent guards overshoot it (the
//              overshoot factor, measured), the fleet guard keeps sum(in_flight) / L_global
//              <= 1.0 at every sample with acknowledged handoff and reports the default
//              mode's bounded residual; goodput >= 95% of the backend's ideal.
//   join-ramp  a fifth node joins a busy fleet of four: how long until it holds its fair share,
//              default vs acknowledged handoff vs handoff + eager handoff.
//   partition  one node's heartbeats hang for 5 s: sum(in_flight) / L_global without and with
//              self-fencing.
//   freeze     one node of three stalls for 8 s, past its lease, while its calls run on in the
//              backend: before (calls outlive the lease) and with a call deadline the backend
//              honours (sum(in_flight) / L_global <= 1.0), fail-closed and local-only.
//   skew       two busy nodes and two nearly idle ones: utilization of L_global with equal
//              split vs demand-proportional allocation.
//
// Each scenario returns a Markdown table, CSV and SVG files, and the list of claims that did
// not hold (empty: all held). `scale` < 1 shortens every run (for the test suite).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::sim {

struct ScenarioOutput {
  std::string name;
  std::string table;                                       // Markdown
  std::vector<std::pair<std::string, std::string>> files;  // file name, content
  std::vector<std::string> failed_claims;
};

[[nodiscard]] const std::vector<std::string>& scenario_names();

// Empty `failed_claims` and a table for a known name; for an unknown name, failed_claims says so.
[[nodiscard]] ScenarioOutput run_scenario(std::string_view name, double scale = 1.0);

}  // namespace sluice::sim
