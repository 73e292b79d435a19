// coordinators.h: the config's coordinators as the server holds them: by name, each interface
// a policy may ask of it, every call timed into the coordinator's one latency histogram.
//
// What it is: NamedCoordinator is one coordinator of the config (of a backend: memory, Redis,
// PostgreSQL; CoordinatorBackend below) with the spec's fingerprint (a reload keeps it when
// unchanged) and every interface it serves, by type (the fleet's ConcurrencyCoordinator,
// federation's RateCoordinator and RegionalEscrow),
// each decorated to time its calls into the one CoordinatorCallStats, and a throttler's
// SharedRules (whose calls are not timed). An interface may be offered lazily: it is connected
// when the first policy asks for it (so a Redis that only fleet policies use is never held to
// federation's requirements), and a failure to connect fails that policy's build, naming the
// coordinator. A policy asks for the interface it needs through its BuildContext; its identity
// includes every coordinator it names. make_coordinator() connects one.
//
// Thread-safety: a NamedCoordinator is built once, then shared read-only; its interfaces are
// safe to call concurrently.
#pragma once

#include <prometheus/metric_family.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <typeindex>
#include <vector>

#include "sluice/backends/timed_coordinator.h"
#include "sluice/config/config.h"
#include "sluice/core/clock.h"
#include "sluice/core/coordinator.h"
#include "sluice/core/status.h"

namespace sluice::server {

struct NamedCoordinator {
  std::string fingerprint;  // the spec's: equal means unchanged
  std::string backend;      // "memory", "redis", "postgres"
  std::shared_ptr<CoordinatorCallStats> stats;

  // Serves interface I (decorated into `stats`). For the builder of this coordinator.
  template <class I>
  void offer(std::shared_ptr<I> i) {
    std::shared_ptr<void> made = std::move(i);
    offer_lazy<I>([made] { return StatusOr<std::shared_ptr<void>>(made); });
  }
  // Serves interface I, made by `make` when it is first asked for (a failure is kept for no one:
  // the next ask tries again).
  template <class I>
  void offer_lazy(std::function<StatusOr<std::shared_ptr<void>>()> make) {
    auto slot = std::make_shared<Lazy>();
    slot->make = std::move(make);
    interfaces_.insert_or_assign(std::type_index(typeid(I)), std::move(slot));
  }
  // Interface I: null when it does not serve it, an error when it could not be made.
  template <class I>
  [[nodiscard]] StatusOr<std::shared_ptr<I>> get() const {
    auto it = interfaces_.find(std::type_index(typeid(I)));
    if (it == interfaces_.end()) return std::shared_ptr<I>();
    Lazy& slot = *it->second;
    const std::lock_guard lock(slot.mu);
    if (slot.made == nullptr) {
      StatusOr<std::shared_ptr<void>> made = slot.make();
      if (!made.ok()) return made.status();
      slot.made = std::move(made.value());
    }
    return std::static_pointer_cast<I>(slot.made);
  }

  // sluice_coordinator_call_seconds and sluice_coordinator_errors_total.
  [[nodiscard]] std::vector<prometheus::MetricFamily> collect() const {
    return stats->collect(backend);
  }

 private:
  struct Lazy {
    std::mutex mu;
    std::function<StatusOr<std::shared_ptr<void>>()> make;
    std::shared_ptr<void> made;  // guarded by mu
  };
  std::map<std::type_index, std::shared_ptr<Lazy>> interfaces_;
};

// A coordinator backend (`kind:` memory, redis, postgres, etcd): how the loader reads its section
// (CoordinatorBackendParser) and how the server connects a coordinator of it. A backend is its
// client code under src/backends/<name>/, one file under src/server/coordinators/ that defines
// `CoordinatorBackend <name>_backend()`, and one entry in policies/builtin.cpp.
struct CoordinatorBackend : CoordinatorBackendParser {
  // The fleet's interface of coordinator `name` (every backend serves it), connected; an error
  // names the coordinator. A server that cannot be reached now is no error: the interface then
  // connects on its first call, and `warning` says so (make_coordinator).
  std::function<StatusOr<std::unique_ptr<ConcurrencyCoordinator>>(
      const std::string& name, const CoordinatorSpec& spec, const Clock& clock,
      std::string& warning)>
      connect;
  // Offers its other interfaces (those of the roles it serves beyond the fleet's) on `named`,
  // lazily where they connect (a policy's first ask connects them), each timed into
  // named.stats but the shared rules. Null: it serves no other.
  std::function<void(const CoordinatorSpec& spec, const Clock& clock, NamedCoordinator& named)>
      offer;
  // What connect() and the interfaces of `roles` would refuse of the spec's options, without
  // connecting: each problem as the backend words it. Null: nothing to check.
  std::function<std::vector<std::string>(const CoordinatorSpec& spec,
                                         const std::vector<CoordinatorRole>& roles)>
      problems;
};

// Connects the coordinator `spec` describes, of `backend`. An error names it. A server that
// cannot be reached now (unavailable, or no answer in time) is not an error: the coordinator
// connects on its first call, the fleet policies on it start in their outage mode (and /readyz
// says not ready), and `warning` says so. Anything else (bad options, a password Redis refuses)
// is; libpq reports a login PostgreSQL refuses as unavailable, so that one is a warning.
[[nodiscard]] StatusOr<std::shared_ptr<NamedCoordinator>> make_coordinator(
    const CoordinatorBackend& backend, const std::string& name, const CoordinatorSpec& spec,
    const Clock& clock, std::string& warning);

class PolicyRegistry;

// What the server would refuse of every coordinator the config's policies use, with the roles
// they use it in, before it connects anywhere (each backend's problems()): a conninfo libpq
// cannot parse, a table prefix too long for federation's tables, beyond what the loader checks
// (`sluice validate` reports them as errors). No I/O.
[[nodiscard]] std::vector<ConfigError> check_before_connecting(const SluiceConfig& config,
                                                               const PolicyRegistry& registry);

}  // namespace sluice::server
