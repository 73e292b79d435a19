// demo.h: `sluice demo`, the main job until `sluice serve` lands.
#pragma once

#include <cstdint>

namespace sluice::cli {

struct DemoOptions {
  unsigned threads = 8;
  double seconds = 2.0;
  std::uint32_t seed = 1;
};

// Runs the demo and prints its table; returns the process exit code (non-zero if any level was
// ever seen past its max).
int run_demo(const DemoOptions& options);

}  // namespace sluice::cli
