// gateway_fixtures.h: gateway configs and a metric reader shared by tests, benchmarks and the
// demo's checks.
//
// What it is: builders for the configurations the suite keeps needing (a root tenant owning one
// upstream, many descendant tenants bound to it) and `MetricValue`, which reads one series out
// of a Collectable by name and labels, so tests can observe every level's count the way an
// operator would.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sluice/local/gateway_config.h"

namespace sluice::testing {

// The id of `many_tenants`' i-th descendant: "t<i>". (Appended, not `"t" + std::to_string(i)`,
// which trips g++ 12's bogus -Wrestrict at -O3: GCC bug 105651.)
inline std::string tenant_id(std::uint32_t i) {
  std::string id = "t";
  id += std::to_string(i);
  return id;
}

// One root tenant "root" owning upstream "api" (host "api.example.com") with routes "chat" and
// "embed", plus `tenants` descendants "t0".."t<n-1>" bound to it. The upstream is shared
// (inherit) with the given max_concurrent / per_tenant_max; each descendant has a global limit.
inline GatewayConfig many_tenants(std::uint32_t tenants, std::uint32_t upstream_max,
                                  std::uint32_t per_tenant_max, std::uint32_t tenant_global,
                                  std::optional<std::uint32_t> route_max = std::nullopt) {
  GatewayConfig c;
  c.tenants.push_back({"root", std::nullopt, std::nullopt});
  UpstreamConfig u;
  u.id = "api";
  u.host = "api.example.com";
  u.owner = "root";
  ConcurrencyLimit l;
  l.sharing = Sharing::kInherit;
  l.max_concurrent = upstream_max;
  l.per_tenant_max = per_tenant_max;
  u.concurrency_limit = l;
  u.routes = {{"chat", route_max}, {"embed", std::nullopt}};
  c.upstreams.push_back(std::move(u));
  c.tenants.reserve(tenants + 1);
  c.bindings.reserve(tenants);
  for (std::uint32_t i = 0; i < tenants; ++i) {
    const std::string id = tenant_id(i);
    c.tenants.push_back({id, std::string("root"), tenant_global});
    c.bindings.push_back({id, "api", std::nullopt});
  }
  return c;
}

// The value of the series `name` whose labels include every pair in `labels`; nullopt if
// there is none.
inline std::optional<double> MetricValue(
    const prometheus::Collectable& source, const std::string& name,
    const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const auto& family : source.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      bool match = true;
      for (const auto& [k, v] : labels) {
        bool found = false;
        for (const auto& l : m.label) found = found || (l.name == k && l.value == v);
        match = match && found;
      }
      if (!match) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return m.counter.value;
        case prometheus::MetricType::Gauge:
          return m.gauge.value;
        default:
          return m.untyped.value;
      }
    }
  }
  return std::nullopt;
}

}  // namespace sluice::testing
