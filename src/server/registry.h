// registry.h: the policy kinds and coordinator backends a server knows, by name: each kind's
// families and builder, each backend's parser and connector (coordinators.h).
//
// What it is: a kind is one file under src/server/policies/ that defines `PolicyKind
// <name>_kind()`: its config parser (the loader calls it for the kind's section and the kind
// checks its own fields there), its families, its builder and any routes and gRPC methods of
// its own (routes.h); plus one entry in the list of
// built-in kinds (policies/builtin.cpp). The loader reads a file and the engine builds every
// policy through the registry it was given (PolicyRegistry::builtin() by default; a test may
// add a kind of its own), so neither knows any kind.
//
// Thread-safety: a registry is built, then only read (concurrently).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "server/coordinators.h"
#include "server/notices.h"
#include "server/policy.h"
#include "server/routes.h"
#include "server/runtime_state.h"
#include "sluice/config/config.h"
#include "sluice/core/clock.h"
#include "sluice/core/coordinator.h"
#include "sluice/core/status.h"

namespace sluice::server {

// The policies the server serves now, by name, as a policy looks another up at run time (a
// throttler's probe of a policy's utilisation): the engine publishes each config generation
// when it starts serving it. It holds weak references, so a lookup never keeps a retired policy
// alive; during a reload a lookup sees the generation still serving.
class PolicyDirectory {
 public:
  using Policies = std::map<std::string, std::weak_ptr<Policy>, std::less<>>;
  // The policy named `name` now (null: none, or retired and gone).
  [[nodiscard]] std::shared_ptr<Policy> find(std::string_view name) const {
    const std::lock_guard lock(mu_);
    auto it = policies_.find(name);
    return it == policies_.end() ? nullptr : it->second.lock();
  }
  void publish(Policies policies) {
    const std::lock_guard lock(mu_);
    policies_.swap(policies);
    published_ = true;
  }
  // Whether a generation was published yet (false while the server builds its first).
  [[nodiscard]] bool published() const {
    const std::lock_guard lock(mu_);
    return published_;
  }

 private:
  mutable std::mutex mu_;
  Policies policies_;
  bool published_ = false;
};

// What a builder gets: the policy's name and spec, the clock, the server's node id for this
// config generation, the config's coordinators (each interface of each, timed into its
// metrics), the server's runtime-state store (rules set at run time, persisted) and the
// directory of the policies it serves (null in a context without an engine).
class BuildContext {
 public:
  using Coordinators = std::function<std::shared_ptr<NamedCoordinator>(const std::string& name)>;

  BuildContext(const std::string& name, const PolicySpec& spec, const Clock& clock,
               const std::string& node_id, Coordinators coordinators,
               std::shared_ptr<RuntimeStateStore> state,
               std::shared_ptr<const PolicyDirectory> directory = nullptr)
      : name(name),
        spec(spec),
        clock(clock),
        node_id(node_id),
        directory(std::move(directory)),
        coordinators_(std::move(coordinators)),
        state_(std::move(state)) {}

  const std::string& name;
  const PolicySpec& spec;
  const Clock& clock;
  const std::string& node_id;
  const std::shared_ptr<const PolicyDirectory> directory;
  // A policy of the same name and kind that this one follows while calls it admitted may still
  // run: the one a reload rebuilds (it could not take the new spec in place), or one a reload
  // removed that still holds leases when a later reload adds the name back. A kind whose limits
  // count calls in flight takes its counts over (the same guard, gateway levels, nodes), so
  // that a limit holds across the two instead of admitting its calls a second time; its own
  // leases still finish into it. Null: none.
  std::shared_ptr<Policy> predecessor;

  // Where the policy tells the operator what its log should say while it serves (null: nobody
  // listens; a context without an engine).
  std::shared_ptr<Notices> notices;

  // Interface I (ConcurrencyCoordinator, and the rate-budget and escrow interfaces to come) of
  // the coordinator named `coordinator` (one the spec lists in spec.coordinators). An error
  // when it does not serve I: "coordinator <name> (<backend>) does not serve <what>".
  template <class I>
  [[nodiscard]] StatusOr<std::shared_ptr<I>> coordinator(const std::string& coordinator,
                                                         std::string_view what) const {
    std::shared_ptr<NamedCoordinator> named = coordinators_ ? coordinators_(coordinator) : nullptr;
    if (named == nullptr)
      return Status(StatusCode::kInvalidArgument, "no coordinator named '" + coordinator + "'");
    StatusOr<std::shared_ptr<I>> got = named->get<I>();
    if (!got.ok())
      return Status(got.status().code(),
                    "coordinator " + coordinator + ": " + got.status().message());
    std::shared_ptr<I> i = std::move(got.value());
    if (i == nullptr)
      return Status(StatusCode::kInvalidArgument, "coordinator " + coordinator + " (" +
                                                      named->backend + ") does not serve " +
                                                      std::string(what));
    return i;
  }

  // The policy's runtime state: rules set at run time, kept in the server's state file (scoped
  // to the policy's name, so a rebuilt or restarted policy finds them again).
  [[nodiscard]] RuntimeState runtime_state() const { return RuntimeState(state_, name); }

 private:
  Coordinators coordinators_;
  std::shared_ptr<RuntimeStateStore> state_;
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
  // Calls of its own, served by the transports beside the families (routes.h).
  std::vector<HttpRoute> routes;
  std::vector<GrpcMethod> methods;
};

class PolicyRegistry final : public PolicyKinds {
 public:
  // Adds a kind; false (and nothing changes) when one of that name is registered already, or
  // one of its routes or gRPC methods is malformed or taken by another kind.
  bool add(PolicyKind kind);
  [[nodiscard]] const PolicyKind* find(std::string_view name) const;
  // The names of the kinds (in registration order) that answer the family
  // (&PolicyKindParser::rate_family or &PolicyKindParser::admit_family).
  [[nodiscard]] std::vector<std::string> kinds_of(bool PolicyKindParser::*family) const;

  // Adds a coordinator backend; false (and nothing changes) when one of that name is
  // registered already.
  bool add_backend(CoordinatorBackend backend);
  [[nodiscard]] const CoordinatorBackend* find_backend(std::string_view name) const;

  // PolicyKinds (what the config loader asks).
  [[nodiscard]] const PolicyKindParser* parser(std::string_view kind) const override {
    return find(kind);
  }
  [[nodiscard]] std::vector<std::string> kind_names() const override;
  [[nodiscard]] const CoordinatorBackendParser* coordinator_backend(
      std::string_view kind) const override {
    return find_backend(kind);
  }
  [[nodiscard]] std::vector<std::string> coordinator_backend_names() const override;

  // Every kind's HTTP routes, and its gRPC method named `name` (null: none).
  [[nodiscard]] const Router& router() const noexcept { return router_; }
  struct Method {
    std::string kind;
    GrpcMethod method;
  };
  [[nodiscard]] const Method* method(std::string_view name) const;
  [[nodiscard]] const std::vector<Method>& methods() const noexcept { return methods_; }

  // The kinds and coordinator backends sluice ships (policies/builtin.cpp).
  [[nodiscard]] static const PolicyRegistry& builtin();

 private:
  std::vector<PolicyKind> kinds_;
  std::vector<CoordinatorBackend> backends_;
  Router router_;
  std::vector<Method> methods_;
};

// "an adaptive, fleet or concurrency policy": the kinds as a message lists them.
[[nodiscard]] std::string kinds_phrase(const std::vector<std::string>& kinds);

}  // namespace sluice::server
