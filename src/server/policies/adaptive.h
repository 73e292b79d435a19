// adaptive.h: the adaptive kind's fields (src/server/policies/adaptive.cpp).
//
//   kind: adaptive
//   algorithm: fixed | aimd | vegas | gradient2      # default gradient2
//   limit: 10                                        # fixed only
//   initial_limit, min_limit, max_limit              # aimd, vegas, gradient2 only (refused for
//                                                    # fixed); the algorithm's defaults otherwise
//   rate: <rate policy>                              # optional: passed first
#pragma once

#include "server/registry.h"
#include "sluice/core/algorithm_spec.h"

namespace sluice::server {

struct AdaptiveSpec final : PolicyBody {
  AlgorithmSpec algorithm;
};

[[nodiscard]] PolicyKind adaptive_kind();

}  // namespace sluice::server
