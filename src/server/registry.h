// registry.h: the policy kinds a server knows, by name: each kind's families and builder.
//
// What it is: a kind is one file under src/server/policies/ that defines `PolicyKind
// <name>_kind()`: its config parser (the loader calls it for the kind's section and the kind
// checks its own fields there), its families and its builder; plus one entry in the list of
// built-in kinds (policies/builtin.cpp). The loader reads a file and the engine builds every
// policy through the registry it was given (PolicyRegistry::builtin() by default; a test may
// add a kind of its own), so neither knows any kind.
//
// Thread-safety: a registry is built, then only read (concurrently).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/policy.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/coordinator.h"
#include "sluice/status.h"

namespace sluice::server {

// What a builder gets: the policy's name, spec and identity, the clock, the server's node id
// for this config generation, and the config's coordinators.
class BuildContext {
 public:
  using FleetCoordinators =
      std::function<std::shared_ptr<ConcurrencyCoordinator>(const std::string& name)>;

  BuildContext(const std::string& name, const PolicySpec& spec, std::string identity,
               const Clock& clock, const std::string& node_id, FleetCoordinators fleet)
      : name(name),
        spec(spec),
        identity(std::move(identity)),
        clock(clock),
        node_id(node_id),
        fleet_(std::move(fleet)) {}

  const std::string& name;
  const PolicySpec& spec;
  std::string identity;
  const Clock& clock;
  const std::string& node_id;

  // The fleet (concurrency coordinator) interface of the coordinator named `coordinator` (one
  // the spec lists in spec.coordinators), timed into that coordinator's metrics.
  [[nodiscard]] std::shared_ptr<ConcurrencyCoordinator> fleet_coordinator(
      const std::string& coordinator) const {
    return fleet_(coordinator);
  }

 private:
  FleetCoordinators fleet_;
};

// A kind: how the loader parses it (name, families, parse: PolicyKindParser) and how the
// engine builds it.
struct PolicyKind : PolicyKindParser {
  using Build = std::function<StatusOr<std::shared_ptr<Policy>>(const BuildContext&)>;
  enum Family : unsigned { kRate = 1, kAdmit = 2 };

  PolicyKind() = default;
  // `families`: kRate, kAdmit or both (kRate | kAdmit).
  PolicyKind(std::string kind_name, unsigned families, decltype(PolicyKindParser::parse) parser,
             Build builder)
      : build(std::move(builder)) {
    name = std::move(kind_name);
    rate_family = (families & kRate) != 0;
    admit_family = (families & kAdmit) != 0;
    parse = std::move(parser);
  }

  Build build;
};

class PolicyRegistry final : public PolicyKinds {
 public:
  // Adds a kind; false (and nothing changes) when one of that name is registered already.
  bool add(PolicyKind kind);
  [[nodiscard]] const PolicyKind* find(std::string_view name) const;
  // The names of the kinds (in registration order) that answer the family
  // (&PolicyKindParser::rate_family or &PolicyKindParser::admit_family).
  [[nodiscard]] std::vector<std::string> kinds_of(bool PolicyKindParser::*family) const;

  // PolicyKinds (what the config loader asks).
  [[nodiscard]] const PolicyKindParser* parser(std::string_view kind) const override {
    return find(kind);
  }
  [[nodiscard]] std::vector<std::string> kind_names() const override;

  // The kinds sluice ships (policies/builtin.cpp).
  [[nodiscard]] static const PolicyRegistry& builtin();

 private:
  std::vector<PolicyKind> kinds_;
};

// "an adaptive, fleet or concurrency policy": the kinds as a message lists them.
[[nodiscard]] std::string kinds_phrase(const std::vector<std::string>& kinds);

}  // namespace sluice::server
