// gateway_validation.h: checks a GatewayConfig before a Gateway is built from it.
//
// What it is: validate() returns every problem at once, errors and warnings apart, each naming
// the field path (`upstreams[2].concurrency_limit.per_tenant_max`) and what is wrong with it.
// Rules:
//   1. every max_concurrent, per_tenant_max and global_concurrency_limit that is set is > 0;
//   2. per_tenant_max <= max_concurrent (same limit);
//   3. a route's max_concurrent <= its upstream's max_concurrent (if both are set);
//   4. (warning) a tenant's global limit should be > the sum of the per_tenant_max of the
//      upstreams it uses (owned ones and bound ones, after the merge);
//   plus: non-empty and unique ids, known parent / owner / tenant / upstream ids, no parent
//   cycles, bindings only to a strict ancestor's upstream and at most one per (tenant,
//   upstream), a private upstream's binding has its own max_concurrent, `sharing` only on an
//   upstream, positive queue depth and timeout for the queue strategy, a 4xx/5xx status.
//   Warnings also flag a binding limit looser than the upstream's (the stricter one applies) and
//   a queue strategy in a non-private binding (the shared pool's strategy applies).
//
// Thread-safety: pure function of its argument.
#pragma once

#include <string>
#include <vector>

#include "sluice/local/gateway_config.h"

namespace sluice {

struct ConfigIssue {
  std::string path;     // e.g. "upstreams[2].concurrency_limit.per_tenant_max"
  std::string message;  // what is wrong, with the offending values
};

struct ValidationReport {
  std::vector<ConfigIssue> errors;    // the config must not be used
  std::vector<ConfigIssue> warnings;  // usable, but probably not what was meant
  [[nodiscard]] bool ok() const noexcept { return errors.empty(); }
  // One line per issue: "error: <path>: <message>".
  [[nodiscard]] std::string to_string() const;
};

[[nodiscard]] ValidationReport validate(const GatewayConfig& config);

}  // namespace sluice
