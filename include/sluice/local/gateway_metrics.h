// gateway_metrics.h: the gateway's Prometheus metrics, read from its semaphores at scrape time.
//
// What it is: a prometheus::Collectable. Register it with a prometheus::Registry (or an
// Exposer) next to the Gateway; each Collect() reads the live counts, so the hot path pays
// nothing for metrics: no counter is bumped on admit, no lock is taken and no map is looked up
// per call (a rejection bumps one relaxed atomic of its upstream).
//
// Series (labels host, level; level is "tenant", "upstream", "binding", "per_tenant", "route"):
//   sluice_requests_in_flight               gauge    calls holding a unit at that level
//   sluice_concurrency_limit_exceeded_total counter  rejections by the level that refused
//   sluice_concurrency_usage_ratio          gauge    in_flight / limit_max (limited levels only)
//   sluice_concurrency_limit_max            gauge    configured max (limited levels only)
// Several units of one level on one host (routes, tenants' per-tenant caps, bindings, private
// pools) are summed. The tenant level spans hosts: its gauges carry host="*" and sum over every
// tenant with a global limit; its exceeded counter is labelled with the host the refused call
// was going to. With metrics.per_tenant on (high cardinality), also:
//   sluice_tenant_requests_in_flight{tenant_id}                  every tenant
//   sluice_tenant_upstream_requests_in_flight{tenant_id, host}    where per_tenant_max applies
//
// Thread-safety: Collect() may run concurrently with any Gateway call; the counts it reads are
// each exact at the instant read, not a snapshot across levels. The Gateway must outlive this.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace sluice {

class Gateway;

class GatewayMetrics final : public prometheus::Collectable {
 public:
  explicit GatewayMetrics(const Gateway& gateway) noexcept : gateway_(gateway) {}
  [[nodiscard]] std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Gateway& gateway_;
};

}  // namespace sluice
