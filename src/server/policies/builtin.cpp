// The policy kinds and coordinator backends sluice ships, in the order messages list them. A
// kind is its file plus one entry here; so is a backend (its file under server/coordinators/,
// over its client code in src/backends/<name>/).
#include "server/registry.h"

namespace sluice::server {

#define SLUICE_BUILTIN_POLICY_KINDS(X) \
  X(rate)                              \
  X(adaptive)                          \
  X(fleet)                             \
  X(concurrency)                       \
  X(federated)                         \
  X(throttler)                         \
  X(cascade)                           \
  X(envoy_ratelimit)

#define SLUICE_BUILTIN_COORDINATOR_BACKENDS(X) X(memory) X(redis) X(postgres) X(etcd)

#define SLUICE_DECLARE_KIND(name) PolicyKind name##_kind();
SLUICE_BUILTIN_POLICY_KINDS(SLUICE_DECLARE_KIND)
#undef SLUICE_DECLARE_KIND
#define SLUICE_DECLARE_BACKEND(name) CoordinatorBackend name##_backend();
SLUICE_BUILTIN_COORDINATOR_BACKENDS(SLUICE_DECLARE_BACKEND)
#undef SLUICE_DECLARE_BACKEND

const PolicyRegistry& PolicyRegistry::builtin() {
  static const PolicyRegistry registry = [] {
    PolicyRegistry r;
#define SLUICE_ADD_KIND(name) r.add(name##_kind());
    SLUICE_BUILTIN_POLICY_KINDS(SLUICE_ADD_KIND)
#undef SLUICE_ADD_KIND
#define SLUICE_ADD_BACKEND(name) r.add_backend(name##_backend());
    SLUICE_BUILTIN_COORDINATOR_BACKENDS(SLUICE_ADD_BACKEND)
#undef SLUICE_ADD_BACKEND
    return r;
  }();
  return registry;
}

}  // namespace sluice::server
