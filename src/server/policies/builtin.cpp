// The policy kinds sluice ships, in the order messages list them. A kind is its file plus one
// entry here.
#include "server/registry.h"

namespace sluice::server {

#define SLUICE_BUILTIN_POLICY_KINDS(X) \
  X(rate) X(adaptive) X(fleet) X(concurrency) X(federated) X(throttler) X(cascade)

#define SLUICE_DECLARE_KIND(name) PolicyKind name##_kind();
SLUICE_BUILTIN_POLICY_KINDS(SLUICE_DECLARE_KIND)
#undef SLUICE_DECLARE_KIND

const PolicyRegistry& PolicyRegistry::builtin() {
  static const PolicyRegistry registry = [] {
    PolicyRegistry r;
#define SLUICE_ADD_KIND(name) r.add(name##_kind());
    SLUICE_BUILTIN_POLICY_KINDS(SLUICE_ADD_KIND)
#undef SLUICE_ADD_KIND
    return r;
  }();
  return registry;
}

}  // namespace sluice::server
