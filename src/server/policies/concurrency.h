// concurrency.h: the concurrency (gateway) kind's fields (src/server/policies/concurrency.cpp).
//
//   kind: concurrency
//   tenants, upstreams, bindings, problem, metrics   # sluice/local/gateway_config.h, checked
//                                                    # by the gateway's own validation, its
//                                                    # issues placed at the lines they name
//   rate: <rate policy>                              # optional: passed first (keyed by the
//                                                    # call's key, else its tenant)
//
// An upstream (or private binding) with `strategy: queue` and a max_concurrent keeps a call
// that finds it full waiting in its FIFO queue, deferred (no thread held), until a release
// hands it the slot, or until the earliest of the queue's timeout, the call's max_wait
// (AdmitCall::max_wait: the caller's deadline) and the caller going away (Deferral::on_cancel);
// a policy removed by a reload, or the server draining, answers its waiters UNAVAILABLE at
// once. The policy's loop ticks every 2 ms while calls wait. Metrics and state: per queue,
// the calls waiting, how waits ended and a wait histogram.
#pragma once

#include <memory>
#include <string>

#include "server/registry.h"
#include "sluice/local/gateway_config.h"

namespace sluice::server {

struct ConcurrencySpec final : PolicyBody {
  GatewayConfig gateway;
};

[[nodiscard]] PolicyKind concurrency_kind();

// The kind's parser (concurrency_config.cpp): its section as a ConcurrencySpec.
[[nodiscard]] std::shared_ptr<const PolicyBody> parse_concurrency(const std::string& name,
                                                                  ConfigSection& s,
                                                                  PolicySpec& spec);

}  // namespace sluice::server
