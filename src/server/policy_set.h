// policy_set.h (private to the engine): one config generation as the engine serves it: each
// policy as built and as served, the coordinators they use, and how a set is built from a config
// (reusing what an older set has unchanged).
//
// Thread-safety: a set is built by one thread, then only read (shared, const).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/coordinators.h"
#include "server/engine.h"
#include "server/policy.h"
#include "server/registry.h"
#include "server/routes.h"
#include "sluice/config/config.h"

namespace sluice::server {

class PolicySet {
 public:
  // A policy as built (`base`: what it serves and shows, what leases count on, what a reload
  // keeps or retires) and the rate policy its admits pass first (`rate: R`; null: none).
  struct Entry {
    std::shared_ptr<Policy> base;
    std::shared_ptr<Policy> rate;
    // The spec's fingerprint, plus every coordinator's it uses: equal means unchanged.
    std::string identity;
    // Shadow mode (its `shadow`, or server.shadow_mode): its refusals become would_deny
    // answers (shadow.h); `shadow_rate` is its rate family so answering (rate kinds only).
    bool shadow = false;
    std::shared_ptr<RateFamily> shadow_rate;
    // The rate family the engine serves it through: shadow_rate in shadow, else its own.
    [[nodiscard]] RateFamily* rate_family() const {
      return shadow_rate != nullptr ? shadow_rate.get() : base->rate_family();
    }
  };

  ServerSettings settings;
  std::uint64_t generation = 1;
  std::map<std::string, Entry, std::less<>> policies;
  std::map<std::string, std::shared_ptr<NamedCoordinator>, std::less<>> coordinators;
  // The policies of each kind, in the order of their names (what a kind's route is given).
  std::map<std::string, KindPolicies, std::less<>> by_kind;
  std::vector<std::string> warnings;  // from building this set (a coordinator not reached)
  // What a reload prepared (policies carried over whose new spec they take in place), by name;
  // applied when it commits.
  std::vector<std::pair<std::string, Policy::Reconfiguration>> reconfigurations;

  [[nodiscard]] const Entry* entry(std::string_view name) const {
    auto it = policies.find(name);
    return it == policies.end() ? nullptr : &it->second;
  }
  [[nodiscard]] std::shared_ptr<Policy> find(std::string_view name) const {
    const Entry* e = entry(name);
    return e == nullptr ? nullptr : e->base;
  }
};

// Builds `config` into a set of generation `generation` with `kinds`, reusing from `old` (may be
// null) every coordinator and policy whose spec is unchanged, and carrying over (to reconfigure
// at commit) every one that can take its changed spec in place. On an error, every policy it
// built is retired again.
[[nodiscard]] StatusOr<std::shared_ptr<PolicySet>> build_policy_set(
    const SluiceConfig& config, const Clock& clock, const PolicyRegistry& kinds,
    const PolicySet* old, const RetiredPolicies* retired, const std::string& node_id,
    std::uint64_t generation, const std::shared_ptr<RuntimeStateStore>& state,
    const std::shared_ptr<const PolicyDirectory>& directory,
    const std::shared_ptr<Notices>& notices);

// Publishes `set`'s policies to `directory`, and marks each in shadow or not as `set` serves it.
void publish(PolicyDirectory& directory, const PolicySet& set);

}  // namespace sluice::server
