// concurrency.h: the concurrency (gateway) kind's fields (src/server/policies/concurrency.cpp).
//
//   kind: concurrency
//   tenants, upstreams, bindings, problem, metrics   # sluice/gateway_config.h, checked by the
//                                                    # gateway's own validation, its issues
//                                                    # placed at the lines they name
//   rate: <rate policy>                              # optional: passed first (keyed by the
//                                                    # call's key, else its tenant)
#pragma once

#include "server/registry.h"
#include "sluice/gateway_config.h"

namespace sluice::server {

struct ConcurrencySpec final : PolicyBody {
  GatewayConfig gateway;
};

[[nodiscard]] PolicyKind concurrency_kind();

}  // namespace sluice::server
