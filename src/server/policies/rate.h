// rate.h: the rate kind's fields (src/server/policies/rate.cpp).
//
//   kind: rate
//   strategy: fixed-window | sliding-window | gcra   # default gcra
//   limit: 100                                       # hits per period, required
//   period: 1s                                       # default 1s
//   burst: 20                                        # gcra only
#pragma once

#include "server/registry.h"
#include "sluice/rate_strategy.h"

namespace sluice::server {

struct RateSpec final : PolicyBody {
  RateRule rule;
};

[[nodiscard]] PolicyKind rate_kind();

}  // namespace sluice::server
