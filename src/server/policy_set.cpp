// policy_set.cpp: building a config generation (policy_set.h).
#include "server/policy_set.h"

#include "server/shadow.h"

namespace sluice::server {
namespace {

// The coordinators `config`'s policies use, reusing from `old` (may be null) every one whose
// spec is unchanged.
Status build_coordinators(const SluiceConfig& config, const PolicyRegistry& registry,
                          const Clock& clock, const PolicySet* old, PolicySet& set) {
  for (const auto& [policy, spec] : config.policies) {
    for (const std::string& name : spec.coordinators) {
      if (set.coordinators.contains(name)) continue;
      const CoordinatorSpec& cs = config.coordinators.at(name);
      if (old != nullptr) {
        auto it = old->coordinators.find(name);
        if (it != old->coordinators.end() && it->second->fingerprint == cs.fingerprint) {
          set.coordinators.emplace(name, it->second);
          continue;
        }
      }
      const CoordinatorBackend* backend = registry.find_backend(cs.kind);
      if (backend == nullptr)
        return Status(StatusCode::kInvalidArgument,
                      "coordinator " + name + ": no coordinator backend '" + cs.kind + "'");
      std::string warning;
      auto named = make_coordinator(*backend, name, cs, clock, warning);
      if (!named.ok()) return named.status();
      if (!warning.empty()) set.warnings.push_back(std::move(warning));
      set.coordinators.emplace(name, std::move(named.value()));
    }
  }
  return {};
}

// Retires every policy `set` built that `old` (may be null) does not serve: a set that failed
// to build, or to commit, must not leave loops or fleet memberships behind.
void retire_built(const PolicySet& set, const PolicySet* old) {
  for (const auto& [name, entry] : set.policies) {
    if (old != nullptr) {
      auto it = old->policies.find(name);  // a carried-over policy keeps its name
      if (it != old->policies.end() && it->second.base == entry.base) continue;
    }
    entry.base->retire();
  }
}

// Builds `config` into a set of generation `generation` with `kinds`, reusing from `old` (may
// be null) every coordinator and policy whose spec is unchanged, and carrying over (to
// reconfigure at commit) every one that can take its changed spec in place.
Status build_set(const SluiceConfig& config, const Clock& clock, const PolicyRegistry& kinds,
                 const PolicySet* old, const RetiredPolicies* retired, const std::string& node_id,
                 std::uint64_t generation, const std::shared_ptr<RuntimeStateStore>& state,
                 const std::shared_ptr<const PolicyDirectory>& directory,
                 const std::shared_ptr<Notices>& notices, PolicySet& set) {
  set.settings = config.server;
  set.settings.node_id = node_id;
  if (old != nullptr && config.server.state_file != old->settings.state_file) {
    set.warnings.push_back("server.state_file: a change takes effect at restart; still using '" +
                           old->settings.state_file + "'");
    set.settings.state_file = old->settings.state_file;
  }
  set.generation = generation;
  if (Status s = build_coordinators(config, kinds, clock, old, set); !s.ok()) return s;
  // A fleet guard built by a reload joins under an id of its own: the guard it replaces is
  // still a member until it leaves, and its leave must not take the new guard's record (and
  // share) with it. While both are members the fleet splits among one node more: safe.
  const std::string policy_node =
      generation == 1 ? node_id : node_id + "/" + std::to_string(generation);
  const auto coordinators = [&set](const std::string& name) -> std::shared_ptr<NamedCoordinator> {
    auto it = set.coordinators.find(name);
    return it == set.coordinators.end() ? nullptr : it->second;
  };
  for (const auto& [name, spec] : config.policies) {
    std::string identity = spec.fingerprint;
    for (const std::string& c : spec.coordinators)
      identity += "\n#coordinator " + c + "\n" + set.coordinators.at(c)->fingerprint;
    const PolicySet::Entry* was = nullptr;
    if (old != nullptr) {
      auto it = old->policies.find(name);
      if (it != old->policies.end()) was = &it->second;
    }
    if (was != nullptr && was->identity == identity) {
      set.policies.emplace(
          name, PolicySet::Entry{was->base, nullptr, std::move(identity), false, nullptr});
      continue;
    }
    const PolicyKind* kind = kinds.find(spec.kind);
    if (kind == nullptr)
      return Status(StatusCode::kInvalidArgument,
                    "policy " + name + ": no policy kind named '" + spec.kind + "'");
    BuildContext context(name, spec, clock, policy_node, coordinators, state, directory);
    context.notices = notices;
    if (was != nullptr && was->base->kind() == spec.kind && was->base->rate_name() == spec.rate) {
      auto in_place = was->base->reconfigure(context);
      if (!in_place.ok())
        return Status(in_place.status().code(),
                      "policy " + name + ": " + in_place.status().message());
      if (in_place.value()) {
        set.reconfigurations.emplace_back(name, std::move(in_place.value()));
        set.policies.emplace(
            name, PolicySet::Entry{was->base, nullptr, std::move(identity), false, nullptr});
        continue;
      }
    }
    // What it follows: the policy it rebuilds, or one of its name a reload retired that still
    // holds leases (BuildContext::predecessor).
    BuildContext built = context;
    if (was != nullptr && was->base->kind() == spec.kind) {
      built.predecessor = was->base;
    } else if (was == nullptr && retired != nullptr) {
      if (auto it = retired->find(name); it != retired->end())
        if (std::shared_ptr<Policy> r = it->second.lock(); r != nullptr && r->kind() == spec.kind)
          built.predecessor = std::move(r);
    }
    auto p = kind->build(built);
    if (!p.ok()) return Status(p.status().code(), "policy " + name + ": " + p.status().message());
    set.policies.emplace(name,
                         PolicySet::Entry{p.value(), nullptr, std::move(identity), false, nullptr});
  }
  // Rate chaining: a policy naming a rate policy passes it between resolving and taking.
  for (auto& [name, entry] : set.policies) {
    const std::string& rate = entry.base->rate_name();
    if (rate.empty()) continue;
    auto it = set.policies.find(rate);
    if (it == set.policies.end() || it->second.base->rate_family() == nullptr ||
        entry.base->admit_family() == nullptr)
      return Status(StatusCode::kInvalidArgument,
                    "policy " + name + ": rate: no rate policy named '" + rate + "'");
    entry.rate = it->second.base;
  }
  // Shadow mode: the policy's own `shadow`, or the server's switch.
  for (auto& [name, entry] : set.policies) {
    entry.shadow = config.server.shadow_mode || config.policies.at(name).shadow;
    if (entry.shadow && entry.base->rate_family() != nullptr)
      entry.shadow_rate = std::make_shared<ShadowRate>(*entry.base);
  }
  return {};
}

}  // namespace

StatusOr<std::shared_ptr<PolicySet>> build_policy_set(
    const SluiceConfig& config, const Clock& clock, const PolicyRegistry& kinds,
    const PolicySet* old, const RetiredPolicies* retired, const std::string& node_id,
    std::uint64_t generation, const std::shared_ptr<RuntimeStateStore>& state,
    const std::shared_ptr<const PolicyDirectory>& directory,
    const std::shared_ptr<Notices>& notices) {
  auto set = std::make_shared<PolicySet>();
  if (Status s = build_set(config, clock, kinds, old, retired, node_id, generation, state,
                           directory, notices, *set);
      !s.ok()) {
    retire_built(*set, old);
    return s;
  }
  for (const auto& [name, entry] : set->policies)
    set->by_kind[std::string(entry.base->kind())].push_back(entry.base);
  return set;
}

void publish(PolicyDirectory& directory, const PolicySet& set) {
  PolicyDirectory::Policies policies;
  for (const auto& [name, entry] : set.policies) {
    entry.base->set_shadow(entry.shadow);
    policies.emplace(name, entry.base);
  }
  directory.publish(std::move(policies));
}

}  // namespace sluice::server
