// fleet.h: the fleet kind's fields (src/server/policies/fleet.cpp).
//
//   kind: fleet
//   the adaptive kind's algorithm fields, plus
//   coordinator: memory          # a coordinator of the config; default memory
//   key: <name>                  # the fleet's key at the coordinator; default the policy's name.
//                                # One server is one member of a key (its node id): a second
//                                # fleet policy on the same key and coordinator is an error
//   heartbeat: 1s                # default 1s
//   lease_ttl: 2s                # default 2 x heartbeat
//   outage: fail-closed | local-only
//   self_fence, fence_safety_margin (0s allowed), eager_handoff, min_heartbeat, call_timeout
//                                 # each as sluice/fleet/fleet_guard.h describes it
//   call_deadline: 500ms          # longest an admitted call may run; + heartbeat +
//                                 # fence_safety_margin must be < lease_ttl
//                                 (sluice/fleet/fleet_guard.h)
//   rate: <rate policy>          # optional: passed first
//
// A reload that changes the spec but keeps the coordinator, the key, the algorithm and the call
// deadline in force (set call_deadline: its default follows heartbeat and lease_ttl) takes it
// in place: the guard keeps its membership, share and in-flight calls. Anything else builds a
// new guard, and the old one leaves (its calls still held count on that guard only).
#pragma once

#include <string>

#include "server/registry.h"
#include "sluice/core/algorithm_spec.h"
#include "sluice/fleet/fleet_guard.h"

namespace sluice::server {

struct FleetSpec final : PolicyBody {
  AlgorithmSpec algorithm;
  std::string coordinator = "memory";
  FleetGuardOptions guard;  // node_id is left empty: the server fills in its own
};

[[nodiscard]] PolicyKind fleet_kind();

}  // namespace sluice::server
