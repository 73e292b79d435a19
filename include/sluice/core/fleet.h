// fleet.h: the fleet guard's heartbeat core: one global concurrency ceiling shared by a fleet.
//
// What it is: the pure decision every coordinator (memory, Redis, PostgreSQL) makes when a node
// heartbeats. A node reports its locally inferred limit L_local and its in-flight count; the
// coordinator keeps one FleetState per key and answers with a Grant:
//
//   1. upsert the reporting node (L_local, whether it is an estimate, in_flight, lease expiry =
//      now + lease_ttl; with acknowledged handoff, forget the grants its acked generation
//      supersedes);
//   2. evict every other node whose lease expired (expires_at <= now);
//   3. A = aggregate of the live nodes' L_local: the median (default) or the minimum, never a
//      sum (every node estimates the same backend). The median of an even count is the LOWER
//      of the two middle values (the conservative one). Only estimates count: a node whose
//      L_local is still its algorithm's initial guess (no window has closed) is left out, unless
//      no live node has an estimate (then every node counts). So a cold joiner does not pull
//      the fleet's ceiling down;
//      L_global, the ceiling in force = max(A, min(previous L_global, committed)), committed =
//      sum over the live nodes of reserve(node). L_global follows A up at once, and down only
//      as fast as what the nodes hold drains: calls already admitted are never revoked, so a
//      ceiling that fell below them would be one the fleet is over. The grant says both
//      (l_global and l_aggregate: below l_global while the fleet drains);
//   4. target (from A, the ceiling the fleet is moving to): equal split, floor(A/N) plus 1 for
//      the first A mod N node ids in lexicographic order; or demand-proportional: a satisfied
//      node (in_flight < its last share) gets a 1-slot probe, and the hungry nodes (in_flight
//      >= share) split the rest equally (the first ones in id order take the remainder), so
//      with A >= N no hungry node gets 0;
//   5. share = max(0, min(target, L_global - sum over the other live nodes of reserve(other))),
//      reserve(peer) = max(share, in_flight), or with acknowledged handoff
//      max(in_flight, largest share granted to the peer that it has not confirmed superseding);
//   6. the grant gets the key's next generation.
//
// A coordinator that lost state (a Redis restarted without its last writes, a failover to a
// replica behind it) forgets the nodes, what they hold and what it granted them; the nodes keep
// their calls and, for up to lease_ttl, their grants. Until one lease_ttl has passed since the
// coordinator found the loss (`lost_at`), every grant is share 0 and says `recovering`: the
// reports it records meanwhile rebuild what the live nodes hold, and every grant from before
// the loss has expired by the end (a node of the fleet beats more often than its lease_ttl). A
// fleet's nodes share one lease_ttl (the policy's), so the reporter's is the fleet's.
//
// One node id, one member: a report also carries its member's instance (a random number each
// member, a fleet guard, draws once). A live record (expires_at > now) another instance wrote
// holds the id: clash() says so, and the coordinator refuses the heartbeat and changes nothing
// (two servers given one server.node_id would otherwise overwrite one record, and each take the
// share it grants). The id is free again once that record expires or its member leaves; a
// leave() by another instance leaves the record alone. Instance 0 (not said) matches any.
//
// Guarantees: GlobalCap (sum of live shares <= L_global under any order of heartbeats, joins,
// leaves, expiries and changes of L_local); the occupancy cap keeps sum of in-flight <=
// L_global in the synchronous model, and acknowledged handoff keeps it when grant replies and
// reports are delayed (tests/model/fleet_model_test.cpp searches every interleaving, with
// L_local constant and with L_local moving between two values); the loss rule keeps both through
// a coordinator that loses its whole state between any two steps (the same search,
// spec/fleet_heartbeat.pml -DLOSS, and docs/simulations/fleet.md's coordinator loss).
//
// Thread-safety: pure functions on values; a coordinator serialises the calls per key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"

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
  // False while l_local is only the algorithm's initial guess (no sample window has closed).
  bool estimated = true;
  // Which member reports (sluice::clash): drawn at random once per member; 0: not said.
  std::uint64_t instance = 0;
};

struct Grant {
  std::uint32_t share = 0;        // admit while in_flight < min(share, L_local)
  std::uint32_t l_global = 0;     // the fleet's ceiling in force
  std::uint32_t l_aggregate = 0;  // the aggregate of L_local; < l_global while the fleet drains
  std::uint32_t nodes = 0;        // live nodes, the reporter included
  std::uint64_t generation = 0;
  bool recovering = false;  // share 0: the coordinator found a loss of state within a lease_ttl
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
  bool estimated = true;
  std::uint32_t in_flight = 0;
  std::uint32_t share = 0;  // the last share granted
  Nanos expires_at{0};
  std::uint64_t acked_generation = 0;
  // With acknowledged handoff: grants issued to the node that its acks have not superseded
  // (generation >= acked_generation), oldest first.
  std::vector<IssuedGrant> unacked;
  std::uint64_t instance = 0;  // of the member that wrote the record; 0: not said
  friend bool operator==(const FleetNode&, const FleetNode&) = default;
};

struct FleetState {
  std::vector<FleetNode> nodes;  // sorted by id
  std::uint64_t generation = 0;  // of the last grant issued for this key
  std::uint32_t ceiling = 0;     // L_global in force at the last heartbeat
  friend bool operator==(const FleetState&, const FleetState&) = default;
};

// Empty when the report is usable, else what is wrong with which field.
[[nodiscard]] std::string validate(const NodeReport& report);

// Empty unless another process holds the report's node id at `now` (a live record of the id
// whose instance differs, both non-zero); then why, naming the id and when the record expires.
[[nodiscard]] std::string clash(const FleetState& state, const NodeReport& report, Nanos now);
// clash()'s words for `node_id`, held by `instance` whose record expires in `expires_in` (for a
// coordinator that finds the clash elsewhere: the Redis script).
[[nodiscard]] std::string clash_text(std::string_view node_id, std::uint64_t instance,
                                     Nanos expires_in);

// `lost_at` of a coordinator that has never lost state (or cannot: the memory one, whose nodes
// live and die with it).
inline constexpr Nanos kNeverLost = Nanos::min();

// The heartbeat: updates `state` and returns the reporter's grant. `lost_at`: the coordinator
// time at which it last found it may have lost state (kNeverLost: never). Preconditions:
// validate(report) and clash(state, report, now) are empty. Depends on nothing but its
// arguments.
Grant heartbeat(FleetState& state, const NodeReport& report, Nanos now,
                const CoordinatorConfig& config, Nanos lost_at = kNeverLost);

// Whether a heartbeat at `now` falls within `lease_ttl` of a loss found at `lost_at`.
[[nodiscard]] bool recovering(Nanos lost_at, Nanos now, Nanos lease_ttl) noexcept;

// A node leaves: its record (and with it its reserve) goes at once. False if it was not there,
// or another instance wrote it (instance 0 on either side matches).
bool leave(FleetState& state, std::string_view node_id, std::uint64_t instance = 0);

// The aggregate of the live nodes' L_local (estimates only, unless there is none; 0 with no
// nodes).
[[nodiscard]] std::uint32_t aggregate_limit(const FleetState& state, Aggregate aggregate);

// L_global in force for `state` (step 3): max(aggregate, min(state.ceiling, committed)).
[[nodiscard]] std::uint32_t ceiling_in_force(const FleetState& state, const CoordinatorConfig& c);

}  // namespace sluice
