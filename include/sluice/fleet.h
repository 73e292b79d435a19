// fleet.h: the fleet guard's heartbeat core: one global concurrency ceiling shared by a fleet.
//
// What it is: the pure decision every coordinator (memory, Redis, PostgreSQL) makes when a node
// heartbeats. A node reports its locally inferred limit L_local and its in-flight count; the
// coordinator keeps one FleetState per key and answers with a Grant:
//
//   1. upsert the reporting node (L_local, in_flight, lease expiry = now + lease_ttl; with
//      acknowledged handoff, forget the grants its acked generation supersedes);
//   2. evict every other node whose lease expired (expires_at <= now);
//   3. L_global = aggregate of the live nodes' L_local: the median (default) or the minimum,
//      never a sum (every node estimates the same backend). The median of an even count is
//      the LOWER of the two middle values (the conservative one);
//   4. target: equal split, floor(L/N) plus 1 for the first L mod N node ids in lexicographic
//      order; or demand-proportional: a satisfied node (in_flight < its last share) gets a
//      1-slot probe, and the hungry nodes (in_flight >= share) split the rest equally (the
//      first ones in id order take the remainder), so with L >= N no hungry node gets 0;
//   5. share = max(0, min(target, L_global - sum over the other live nodes of reserve(other))),
//      reserve(peer) = max(share, in_flight), or with acknowledged handoff
//      max(in_flight, largest share granted to the peer that it has not confirmed superseding);
//   6. the grant gets the key's next generation.
//
// Guarantees: GlobalCap (sum of live shares <= L_global at constant L_global, under any order
// of heartbeats, joins, leaves and expiries); the occupancy cap keeps sum of in-flight <=
// L_global in the synchronous model, and acknowledged handoff keeps it when grant replies and
// reports are delayed (tests/model/fleet_model_test.cpp searches every interleaving).
//
// Thread-safety: pure functions on values; a coordinator serialises the calls per key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/clock.h"

namespace sluice {

enum class Aggregate : std::uint8_t { kMedian, kMin };
enum class Allocation : std::uint8_t { kEqualSplit, kDemandProportional };

[[nodiscard]] std::string_view to_string(Aggregate a) noexcept;
[[nodiscard]] std::string_view to_string(Allocation a) noexcept;

// Fleet-wide rules: they belong to the coordinator, so a fleet cannot mix them.
struct CoordinatorConfig {
  Aggregate aggregate = Aggregate::kMedian;         // default median
  Allocation allocation = Allocation::kEqualSplit;  // default equal split
  bool acknowledged_handoff = false;                // default off (occupancy cap only)
};

struct NodeReport {
  std::string node_id;          // unique per process; non-empty
  std::uint32_t l_local = 0;    // the node's own adaptive limit
  std::uint32_t in_flight = 0;  // calls it holds now
  // Generation of the grant the node enforces (read together with in_flight); 0 before any.
  std::uint64_t acked_generation = 0;
  Nanos lease_ttl{0};  // > 0; the node's record expires this long after the heartbeat
};

struct Grant {
  std::uint32_t share = 0;     // admit while in_flight < min(share, L_local)
  std::uint32_t l_global = 0;  // the fleet's ceiling
  std::uint32_t nodes = 0;     // live nodes, the reporter included
  std::uint64_t generation = 0;
  friend bool operator==(const Grant&, const Grant&) = default;
};

struct IssuedGrant {
  std::uint64_t generation = 0;
  std::uint32_t share = 0;
  friend bool operator==(const IssuedGrant&, const IssuedGrant&) = default;
};

struct FleetNode {
  std::string id;
  std::uint32_t l_local = 0;
  std::uint32_t in_flight = 0;
  std::uint32_t share = 0;  // the last share granted
  Nanos expires_at{0};
  std::uint64_t acked_generation = 0;
  // With acknowledged handoff: grants issued to the node that its acks have not superseded
  // (generation >= acked_generation), oldest first.
  std::vector<IssuedGrant> unacked;
  friend bool operator==(const FleetNode&, const FleetNode&) = default;
};

struct FleetState {
  std::vector<FleetNode> nodes;  // sorted by id
  std::uint64_t generation = 0;  // of the last grant issued for this key
  friend bool operator==(const FleetState&, const FleetState&) = default;
};

// Empty when the report is usable, else what is wrong with which field.
[[nodiscard]] std::string validate(const NodeReport& report);

// The heartbeat: updates `state` and returns the reporter's grant. Precondition: validate(report)
// is empty. Depends on nothing but its arguments.
Grant heartbeat(FleetState& state, const NodeReport& report, Nanos now,
                const CoordinatorConfig& config);

// A node leaves: its record (and with it its reserve) goes at once. False if it was not there.
bool leave(FleetState& state, std::string_view node_id);

// The aggregate of the live nodes' L_local (0 with no nodes).
[[nodiscard]] std::uint32_t aggregate_limit(const FleetState& state, Aggregate aggregate);

}  // namespace sluice
