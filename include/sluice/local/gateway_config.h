// gateway_config.h: the gateway's concurrency configuration as plain values.
//
// What it is: tenants (a tree through `parent`), upstreams (each owned by one tenant, with an
// optional concurrency limit and its routes) and bindings (a descendant tenant using an
// ancestor's upstream, optionally with a limit of its own), plus how rejections are rendered
// and which metrics are exported. A YAML loader fills these structs; nothing here parses.
//
// Defaults (each field states its own): an upstream without `concurrency_limit` is unlimited;
// a route without `max_concurrent` is bounded only by its upstream; a tenant without
// `global_concurrency_limit` has no global limit.
//
// Who may call what: a tenant may use an upstream it owns directly, and an ancestor's upstream
// only through a binding (the binding is where the ancestor's `sharing` is applied, see
// gateway_merge.h).
//
// Invariants: none are enforced by the types; validate() (gateway_validation.h) checks a config
// and Gateway::create refuses one with errors.
//
// Thread-safety: plain values; no synchronisation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/clock.h"

namespace sluice {

// How descendants of the owner share an upstream's limit (the merge table in gateway_merge.h).
enum class Sharing {
  kPrivate,  // a descendant must bring its own limit and gets a separate pool
  kInherit,  // a descendant shares the owner's pool; its own limit may only make it stricter
  kEnforce,  // as kInherit: the owner's limit always applies, the stricter of the two wins
};

// What happens when the upstream level is full.
enum class Strategy {
  kReject,  // reject at once
  kQueue,   // wait in a bounded FIFO queue at the upstream level, up to a timeout
};

struct QueueOptions {
  // Most waiters the queue holds; an arrival finding it full is rejected. Default 100.
  std::uint32_t max_depth = 100;
  // Longest a waiter waits before it is rejected (expired by Gateway::tick). Default 5 s.
  Nanos timeout = std::chrono::seconds(5);
};

struct ConcurrencyLimit {
  // Only an upstream's limit says how it is shared; it must stay unset in a binding.
  // Default (unset on an upstream): kInherit.
  std::optional<Sharing> sharing;
  // In-flight calls across all tenants of the pool. Default: unlimited.
  std::optional<std::uint32_t> max_concurrent;
  // In-flight calls of any one tenant on this upstream. Default: no per-tenant cap.
  std::optional<std::uint32_t> per_tenant_max;
  // Default kReject.
  Strategy strategy = Strategy::kReject;
  // Used when strategy == kQueue.
  QueueOptions queue;
};

struct TenantConfig {
  std::string id;
  // The parent tenant's id. Default: none (a root tenant).
  std::optional<std::string> parent;
  // In-flight calls of this tenant across all upstreams. Default: no global limit.
  std::optional<std::uint32_t> global_concurrency_limit;
};

struct RouteConfig {
  // Unique within its upstream.
  std::string id;
  // In-flight calls to this route, from every tenant. Default: bounded only by the upstream.
  std::optional<std::uint32_t> max_concurrent;
};

struct UpstreamConfig {
  std::string id;
  std::string host;
  // The owning tenant's id.
  std::string owner;
  // Default: unlimited.
  std::optional<ConcurrencyLimit> concurrency_limit;
  std::vector<RouteConfig> routes;
};

// A descendant tenant using an ancestor's upstream.
struct BindingConfig {
  std::string tenant;
  std::string upstream;
  // The descendant's own limit. Required when the upstream is kPrivate. Default: none.
  std::optional<ConcurrencyLimit> concurrency_limit;
};

// How a rejection is rendered as problem+json.
struct ProblemOptions {
  // HTTP status of a rejection; must be 4xx or 5xx. Default 503 (429 is the common alternative).
  std::uint16_t status = 503;
  // Retry-After header and `retry_after_seconds` field. Default 1.
  std::uint32_t retry_after_seconds = 1;
  // The problem `type` URI. Default below.
  std::string type = "urn:sluice:problem:concurrency-limit-exceeded";
  std::string title = "Concurrency Limit Exceeded";
};

struct GatewayMetricsOptions {
  // Export sluice_tenant_requests_in_flight{tenant_id} and the per-tenant-on-upstream series.
  // High cardinality. Default off.
  bool per_tenant = false;
};

struct GatewayConfig {
  std::vector<TenantConfig> tenants;
  std::vector<UpstreamConfig> upstreams;
  std::vector<BindingConfig> bindings;
  ProblemOptions problem;
  GatewayMetricsOptions metrics;
};

}  // namespace sluice
