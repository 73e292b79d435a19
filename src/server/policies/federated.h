// federated.h: the federated kind's fields (src/server/policies/federated.cpp): one global rate
// budget per key across regions, with no overshoot (sluice/federation/federation.h).
//
//   kind: federated
//   strategy: fixed-window      # the only strategy federation runs (see below); the default
//   limit: 1000                 # hits per window for every region together, required
//   window: 60s                 # the global window, on the coordinator's clock; default 1s
//   region: us-east             # this server's region at the coordinator; default the server's
//                               #   node id: every process a region of its own, which is also
//                               #   how processes of one region share one coordinator (each
//                               #   leases its own batches; the bound holds for any number)
//   budget: <name>              # the budget's name at the coordinator, shared by the regions
//                               #   that split it; default the policy's name
//   batch: 16                   # units per lease; default 16
//   coordinator: global         # a coordinator of the config; default memory
//   regional_escrow: l2        # a coordinator (memory or redis) holding this region's pool,
//                               #   shared by the region's processes
//                               #   (sluice/federation/federation.h); default none: each
//                               #   process leases for itself
//   regional_batch: 64          # what a process the pool leaves short leases for it; default
//                               #   4 x batch; needs regional_escrow. The coordinator grants at
//                               #   most remaining / (2 x regions) at once, so the pool saves
//                               #   lease calls only where that is well above a batch
//   outage: fail-closed         # fail-closed (default) or regional-only (needs regional_escrow:
//                               #   the pool's balance serves through a coordinator outage,
//                               #   past its window: a window may then exceed the limit by what
//                               #   the pools held when the outage began)
//   coordinator_health_check: 5s  # in a regional-only outage, how often checks probe the
//                               #   coordinator
//   lease_timeout: 250ms        # each coordinator call's bound (a check waits at most this)
//   retry_backoff: 1s           # after a failed call, refuse without calling for this long
//   drift_ppm: 1000             # how much faster the coordinator's clock may run than ours
//   min_window_left: 5ms        # grant nothing when the window has less left than this
//   io_threads: 4               # coordinator calls in flight at once
//   max_keys: 1000000           # keys held at once; a new key beyond it is refused
//                               #   (reason key_capacity) until idle ones are forgotten
//
// Why only fixed windows: a fixed window's budget is a count that starts whole at each window
// boundary, so a region can hold part of it as escrow that dies with the window (Δ = 0). A
// sliding window's allowance at an instant depends on when in the previous window its hits
// fell, and a token bucket's refills continuously: neither has a boundary at which escrow could
// expire without being either lost or carried over (overshoot). Both are refused by field name.
//
// Reload: an unchanged spec keeps the policy, its escrow with it; a changed one builds a new
// policy, and the old one gives its unspent escrow back to the window.
#pragma once

#include <cstddef>
#include <string>

#include "server/registry.h"
#include "sluice/federation/federation.h"

namespace sluice::server {

struct FederatedSpec final : PolicyBody {
  FederationOptions options;
  std::string coordinator = "memory";
  std::string regional_escrow;  // a coordinator's name; empty: none
  std::size_t io_threads = 4;
};

[[nodiscard]] PolicyKind federated_kind();

}  // namespace sluice::server
