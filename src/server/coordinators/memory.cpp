// The `memory` coordinator backend: embedded in the server, the default (a coordinator named
// "memory" always exists). It has no settings of its own beyond the fleet's rules (aggregate,
// allocation, acknowledged_handoff); each memory coordinator keeps its own data. It serves every
// role: the fleet, federation's budget and regional pool, a throttler's shared rules, shared rate
// limits (within this one server).
#include "server/coordinators.h"
#include "sluice/backends/memory_coordinator.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/memory_regional_escrow.h"
#include "sluice/backends/memory_shared_rate.h"
#include "sluice/backends/shared_rules.h"

namespace sluice::server {

CoordinatorBackend memory_backend() {
  CoordinatorBackend b;
  b.name = "memory";
  b.roles = {CoordinatorRole::kConcurrency, CoordinatorRole::kRateBudget,
             CoordinatorRole::kRegionalEscrow, CoordinatorRole::kSharedRules,
             CoordinatorRole::kSharedRate};
  b.connect = [](const std::string&, const CoordinatorSpec& spec, const Clock& clock,
                 std::string&) -> StatusOr<std::unique_ptr<ConcurrencyCoordinator>> {
    return std::unique_ptr<ConcurrencyCoordinator>(
        std::make_unique<MemoryCoordinator>(clock, spec.rules));
  };
  b.offer = [](const CoordinatorSpec&, const Clock& clock, NamedCoordinator& named) {
    named.offer<RateCoordinator>(std::make_shared<TimedRateCoordinator>(
        std::make_unique<MemoryRateCoordinator>(clock), clock, named.stats));
    named.offer<RegionalEscrow>(std::make_shared<TimedRegionalEscrow>(
        std::make_shared<MemoryRegionalEscrow>(clock), clock, named.stats));
    named.offer<SharedRules>(std::shared_ptr<SharedRules>(memory_shared_rules(clock)));
    named.offer<SharedRateStore>(std::make_shared<TimedSharedRate>(
        std::make_unique<MemorySharedRate>(clock), clock, named.stats));
  };
  return b;
}

}  // namespace sluice::server
