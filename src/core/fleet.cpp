#include "sluice/core/fleet.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

namespace sluice {
namespace {

std::vector<FleetNode>::iterator find_node(std::vector<FleetNode>& nodes, std::string_view id) {
  return std::lower_bound(nodes.begin(), nodes.end(), id,
                          [](const FleetNode& n, std::string_view key) { return n.id < key; });
}

bool same_process(std::uint64_t a, std::uint64_t b) { return a == 0 || b == 0 || a == b; }

std::uint32_t reserve(const FleetNode& n, bool handoff) {
  std::uint32_t r = std::max(n.share, n.in_flight);
  if (handoff)
    for (const IssuedGrant& g : n.unacked) r = std::max(r, g.share);
  return r;
}

// Equal split of `budget` over `count` nodes: the node at `rank` (0-based, id order).
std::uint32_t split(std::uint64_t budget, std::uint64_t count, std::uint64_t rank) {
  if (count == 0) return 0;
  return static_cast<std::uint32_t>(budget / count + (rank < budget % count ? 1 : 0));
}

// The target of nodes[self] under the configured allocation.
std::uint32_t target_of(const std::vector<FleetNode>& nodes, std::size_t self, std::uint32_t limit,
                        Allocation allocation) {
  if (allocation == Allocation::kEqualSplit) return split(limit, nodes.size(), self);
  auto satisfied = [](const FleetNode& n) { return n.in_flight < n.share; };
  std::uint64_t probes = 0, hungry = 0, hungry_rank = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (satisfied(nodes[i])) {
      ++probes;
    } else {
      if (i < self) ++hungry_rank;
      ++hungry;
    }
  }
  if (satisfied(nodes[self])) return 1;
  const std::uint64_t pool = limit > probes ? limit - probes : 0;
  return split(pool, hungry, hungry_rank);
}

}  // namespace

std::string_view to_string(Aggregate a) noexcept { return a == Aggregate::kMin ? "min" : "median"; }

std::string_view to_string(Allocation a) noexcept {
  return a == Allocation::kDemandProportional ? "demand-proportional" : "equal-split";
}

std::string validate(const NodeReport& r) {
  if (r.node_id.empty()) return "node_id must not be empty";
  if (r.lease_ttl <= Nanos{0}) return "lease_ttl must be > 0";
  return {};
}

std::uint32_t aggregate_limit(const FleetState& state, Aggregate aggregate) {
  if (state.nodes.empty()) return 0;
  std::vector<std::uint32_t> v;
  v.reserve(state.nodes.size());
  for (const FleetNode& n : state.nodes)
    if (n.estimated) v.push_back(n.l_local);
  if (v.empty())  // no estimate yet: every node's initial guess counts
    for (const FleetNode& n : state.nodes) v.push_back(n.l_local);
  if (aggregate == Aggregate::kMin) return *std::min_element(v.begin(), v.end());
  // The lower median: index (n - 1) / 2 of the sorted values.
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>((v.size() - 1) / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

std::uint32_t ceiling_in_force(const FleetState& state, const CoordinatorConfig& config) {
  std::uint64_t committed = 0;
  for (const FleetNode& n : state.nodes) committed += reserve(n, config.acknowledged_handoff);
  const std::uint64_t held = std::min<std::uint64_t>(state.ceiling, committed);
  return static_cast<std::uint32_t>(
      std::max<std::uint64_t>(aggregate_limit(state, config.aggregate), held));
}

std::string clash_text(std::string_view node_id, std::uint64_t instance, Nanos expires_in) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(instance));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(expires_in);
  return "node id '" + std::string(node_id) + "' is held by another live member (instance " + hex +
         ", its record expires in " + std::to_string(ms.count()) +
         " ms unless it reports again): each member needs a node id of its own";
}

std::string clash(const FleetState& state, const NodeReport& report, Nanos now) {
  const auto it =
      std::lower_bound(state.nodes.begin(), state.nodes.end(), report.node_id,
                       [](const FleetNode& n, std::string_view key) { return n.id < key; });
  if (it == state.nodes.end() || it->id != report.node_id || it->expires_at <= now ||
      same_process(it->instance, report.instance))
    return {};
  return clash_text(report.node_id, it->instance, it->expires_at - now);
}

bool recovering(Nanos lost_at, Nanos now, Nanos lease_ttl) noexcept {
  return lost_at != kNeverLost && now >= lost_at && now - lost_at < lease_ttl;
}

Grant heartbeat(FleetState& state, const NodeReport& report, Nanos now,
                const CoordinatorConfig& config, Nanos lost_at) {
  // 1. Upsert the reporter.
  auto it = find_node(state.nodes, report.node_id);
  if (it == state.nodes.end() || it->id != report.node_id) {
    it = state.nodes.insert(it, FleetNode{});
    it->id = report.node_id;
  } else if (!same_process(it->instance, report.instance)) {
    // Another process's record, expired (clash() is empty): the reporter joins afresh, as
    // step 2 would have evicted the record for any other reporter.
    *it = FleetNode{};
    it->id = report.node_id;
  }
  it->instance = report.instance;
  it->l_local = report.l_local;
  it->estimated = report.estimated;
  it->in_flight = report.in_flight;
  it->expires_at = now + report.lease_ttl;
  it->acked_generation = std::max(it->acked_generation, report.acked_generation);
  const std::uint64_t acked = it->acked_generation;
  std::erase_if(it->unacked, [&](const IssuedGrant& g) { return g.generation < acked; });

  // 2. Evict every other node whose lease expired.
  std::erase_if(state.nodes,
                [&](const FleetNode& n) { return n.id != report.node_id && n.expires_at <= now; });
  it = find_node(state.nodes, report.node_id);
  const auto self = static_cast<std::size_t>(it - state.nodes.begin());

  // 3. The aggregate, and the ceiling in force: it falls no faster than what is held drains.
  const std::uint32_t aggregate = aggregate_limit(state, config.aggregate);
  const std::uint32_t limit = ceiling_in_force(state, config);
  state.ceiling = limit;

  // 4-5. Target (toward the aggregate), capped by what the others hold.
  const std::uint32_t target = target_of(state.nodes, self, aggregate, config.allocation);
  std::uint64_t others = 0;
  for (std::size_t i = 0; i < state.nodes.size(); ++i)
    if (i != self) others += reserve(state.nodes[i], config.acknowledged_handoff);
  const std::uint64_t room = limit > others ? limit - others : 0;
  // Within lease_ttl of a loss, nothing: what the nodes hold is still being rebuilt.
  const bool quarantined = recovering(lost_at, now, report.lease_ttl);
  const auto share =
      quarantined ? 0U : static_cast<std::uint32_t>(std::min<std::uint64_t>(target, room));

  // 6. Issue.
  state.generation = std::max(state.generation, acked) + 1;
  it->share = share;
  if (config.acknowledged_handoff) it->unacked.push_back({state.generation, share});
  return Grant{share,
               limit,
               aggregate,
               static_cast<std::uint32_t>(state.nodes.size()),
               state.generation,
               quarantined};
}

bool leave(FleetState& state, std::string_view node_id, std::uint64_t instance) {
  const auto it = find_node(state.nodes, node_id);
  if (it == state.nodes.end() || it->id != node_id || !same_process(it->instance, instance))
    return false;
  state.nodes.erase(it);
  return true;
}

}  // namespace sluice
