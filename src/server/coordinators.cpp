#include "server/coordinators.h"

#include <map>

#include "server/registry.h"

namespace sluice::server {

StatusOr<std::shared_ptr<NamedCoordinator>> make_coordinator(const CoordinatorBackend& backend,
                                                             const std::string& name,
                                                             const CoordinatorSpec& spec,
                                                             const Clock& clock,
                                                             std::string& warning) {
  StatusOr<std::unique_ptr<ConcurrencyCoordinator>> inner =
      backend.connect(name, spec, clock, warning);
  if (!inner.ok()) return inner.status();
  auto named = std::make_shared<NamedCoordinator>();
  named->fingerprint = spec.fingerprint;
  named->stats = std::make_shared<CoordinatorCallStats>();
  named->backend = std::string(inner.value()->backend());
  named->offer<ConcurrencyCoordinator>(
      std::make_shared<TimedConcurrencyCoordinator>(std::move(inner.value()), clock, named->stats));
  if (backend.offer) backend.offer(spec, clock, *named);
  return named;
}

std::vector<ConfigError> check_before_connecting(const SluiceConfig& config,
                                                 const PolicyRegistry& registry) {
  std::map<std::string, std::vector<CoordinatorRole>> used;  // as the engine builds them
  for (const auto& [name, policy] : config.policies) {
    for (const std::string& c : policy.coordinators)
      used[c].push_back(CoordinatorRole::kConcurrency);
    for (const CoordinatorUse& u : policy.uses) used[u.coordinator].push_back(u.role);
  }
  std::vector<ConfigError> out;
  for (const auto& [name, roles] : used) {
    const auto spec = config.coordinators.find(name);
    if (spec == config.coordinators.end()) continue;  // the loader's error
    const CoordinatorBackend* backend = registry.find_backend(spec->second.kind);
    if (backend == nullptr || !backend->problems) continue;
    for (std::string& problem : backend->problems(spec->second, roles))
      out.push_back(ConfigError{.path = "coordinators." + name, .message = std::move(problem)});
  }
  return out;
}

}  // namespace sluice::server
