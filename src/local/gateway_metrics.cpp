#include "sluice/local/gateway_metrics.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <utility>

#include "local/gateway_state.h"
#include "sluice/local/gateway.h"

namespace sluice {
namespace {

using gateway_detail::Level;

struct Sum {
  double in_flight = 0;
  double max = 0;
  bool limited = false;
  bool has_units = false;  // the level exists on this host (else: only a counter)
  double exceeded = 0;
};
using Key = std::pair<std::string, LimitLevel>;

void add(std::map<Key, Sum>& sums, const std::string& host, LimitLevel level, const Level& l,
         bool limited) {
  Sum& s = sums[{host, level}];
  s.has_units = true;
  // Admitted units only: a refused acquirer's instant increment is not a call in flight.
  s.in_flight += std::min(l.sem.in_flight(), l.max());
  if (limited) {
    s.max += l.max();
    s.limited = true;
  }
}

prometheus::ClientMetric::Label label(std::string name, std::string value) {
  return {std::move(name), std::move(value)};
}

prometheus::MetricFamily family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

}  // namespace

std::vector<prometheus::MetricFamily> GatewayMetrics::Collect() const {
  const gateway_detail::State& st = *gateway_.state_;
  std::map<Key, Sum> sums;
  for (const auto& t : st.tenants)
    if (t.global_limited) add(sums, "*", LimitLevel::kTenant, *t.global, true);
  for (const auto& p : st.pools)
    add(sums, p.upstream->host, LimitLevel::kUpstream, p.level, p.limited);
  for (const auto& slot : st.accesses) {
    const gateway_detail::Access& a = slot->access;
    if (a.binding != nullptr) add(sums, a.upstream->host, LimitLevel::kBinding, *a.binding, true);
    if (a.per_tenant != nullptr)
      add(sums, a.upstream->host, LimitLevel::kPerTenant, *a.per_tenant, true);
  }
  for (const auto& u : st.upstreams) {
    for (const auto& r : u.routes)
      if (r.limited) add(sums, u.host, LimitLevel::kRoute, r.level, true);
    for (std::size_t i = 0; i < kLimitLevelCount; ++i)
      sums[{u.host, static_cast<LimitLevel>(i)}].exceeded +=
          static_cast<double>(u.exceeded[i].load(std::memory_order_relaxed));
  }

  using prometheus::MetricType;
  auto in_flight = family("sluice_requests_in_flight",
                          "Calls holding a concurrency unit, by host and level", MetricType::Gauge);
  auto exceeded = family("sluice_concurrency_limit_exceeded_total",
                         "Calls rejected, by host and the level that refused", MetricType::Counter);
  auto usage = family("sluice_concurrency_usage_ratio", "in_flight / limit_max, by host and level",
                      MetricType::Gauge);
  auto max = family("sluice_concurrency_limit_max", "Configured max concurrent, by host and level",
                    MetricType::Gauge);
  for (const auto& [key, s] : sums) {
    const std::vector<prometheus::ClientMetric::Label> labels = {
        label("host", key.first), label("level", std::string(to_string(key.second)))};
    prometheus::ClientMetric m;
    m.label = labels;
    m.counter.value = s.exceeded;
    // Counters by the destination host (a level that exists there, or that has refused).
    if (key.first != "*" && (s.has_units || s.exceeded > 0)) exceeded.metric.push_back(m);
    if (!s.has_units) continue;
    m.gauge.value = s.in_flight;
    in_flight.metric.push_back(m);
    if (!s.limited) continue;
    m.gauge.value = s.max > 0 ? s.in_flight / s.max : 0.0;
    usage.metric.push_back(m);
    m.gauge.value = s.max;
    max.metric.push_back(m);
  }
  std::vector<prometheus::MetricFamily> out = {std::move(in_flight), std::move(exceeded),
                                               std::move(usage), std::move(max)};
  if (!st.config.metrics.per_tenant) return out;

  auto tenant = family("sluice_tenant_requests_in_flight",
                       "Calls in flight of one tenant across every upstream", MetricType::Gauge);
  auto tenant_upstream = family(
      "sluice_tenant_upstream_requests_in_flight",
      "Calls in flight of one tenant to one host, where per_tenant_max applies", MetricType::Gauge);
  for (const auto& t : st.tenants) {
    prometheus::ClientMetric m;
    m.label = {label("tenant_id", t.id)};
    m.gauge.value = std::min(t.global->sem.in_flight(), t.global->max());
    tenant.metric.push_back(std::move(m));
  }
  for (const auto& slot : st.accesses) {
    const gateway_detail::Access& a = slot->access;
    if (a.per_tenant == nullptr) continue;
    prometheus::ClientMetric m;
    m.label = {label("host", a.upstream->host), label("tenant_id", a.tenant->id)};
    m.gauge.value = std::min(a.per_tenant->sem.in_flight(), a.per_tenant->max());
    tenant_upstream.metric.push_back(std::move(m));
  }
  out.push_back(std::move(tenant));
  out.push_back(std::move(tenant_upstream));
  return out;
}

}  // namespace sluice
