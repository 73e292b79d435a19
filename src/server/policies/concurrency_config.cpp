// The concurrency kind's config section (concurrency.h): the gateway's tenants, upstreams,
// bindings, problem and metrics, read with their lines and checked by the gateway's own
// validation.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "server/policies/concurrency.h"
#include "sluice/local/gateway_validation.h"

namespace sluice::server {
namespace {

// A tenant's, upstream's or route's id: a name that calls give and metrics label, so no control
// characters (a carriage return in one would not even survive the config written back out).
std::optional<std::string> read_id(ConfigSection& s) {
  std::optional<std::string> v = s.str("id", true);
  if (!v) return v;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const auto c = static_cast<unsigned char>((*v)[i]);
    if (c >= 0x20 && c != 0x7f) continue;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", c);
    s.error("id", std::string("must not contain control characters (byte ") + byte + " at offset " +
                      std::to_string(i) + ")");  // the load fails: one error
    break;
  }
  return v;
}

std::optional<ConcurrencyLimit> read_limit(ConfigSection& parent, std::string_view key) {
  std::optional<ConfigSection> s = parent.map(key);
  if (!s) return std::nullopt;
  s->keys({"sharing", "max_concurrent", "per_tenant_max", "strategy", "queue"});
  ConcurrencyLimit l;
  l.sharing = s->choice<Sharing>("sharing", {{"private", Sharing::kPrivate},
                                             {"inherit", Sharing::kInherit},
                                             {"enforce", Sharing::kEnforce}});
  l.max_concurrent = s->u32("max_concurrent");
  l.per_tenant_max = s->u32("per_tenant_max");
  if (auto v = s->choice<Strategy>("strategy",
                                   {{"reject", Strategy::kReject}, {"queue", Strategy::kQueue}}))
    l.strategy = *v;
  if (std::optional<ConfigSection> q = s->map("queue")) {
    q->keys({"max_depth", "timeout"});
    if (auto d = q->u32("max_depth")) l.queue.max_depth = *d;
    if (auto t = q->duration("timeout")) l.queue.timeout = *t;
  }
  return l;
}

void read_gateway(ConfigSection& s, GatewayConfig& g) {
  s.each("tenants", [&](ConfigSection& t) {
    t.keys({"id", "parent", "global_concurrency_limit"});
    TenantConfig c;
    if (auto v = read_id(t)) c.id = *v;
    c.parent = t.str("parent");
    c.global_concurrency_limit = t.u32("global_concurrency_limit");
    g.tenants.push_back(std::move(c));
  });
  s.each("upstreams", [&](ConfigSection& u) {
    u.keys({"id", "host", "owner", "concurrency_limit", "routes"});
    UpstreamConfig c;
    if (auto v = read_id(u)) c.id = *v;
    if (auto v = u.str("host")) c.host = *v;
    if (auto v = u.str("owner", true)) c.owner = *v;
    c.concurrency_limit = read_limit(u, "concurrency_limit");
    u.each("routes", [&](ConfigSection& rt) {
      rt.keys({"id", "max_concurrent"});
      RouteConfig route;
      if (auto v = read_id(rt)) route.id = *v;
      route.max_concurrent = rt.u32("max_concurrent");
      c.routes.push_back(std::move(route));
    });
    g.upstreams.push_back(std::move(c));
  });
  s.each("bindings", [&](ConfigSection& b) {
    b.keys({"tenant", "upstream", "concurrency_limit"});
    BindingConfig c;
    if (auto v = b.str("tenant", true)) c.tenant = *v;
    if (auto v = b.str("upstream", true)) c.upstream = *v;
    c.concurrency_limit = read_limit(b, "concurrency_limit");
    g.bindings.push_back(std::move(c));
  });
  if (std::optional<ConfigSection> pr = s.map("problem")) {
    pr->keys({"status", "retry_after_seconds", "type", "title"});
    if (auto v = pr->uint("status", 0, 999)) g.problem.status = static_cast<std::uint16_t>(*v);
    if (auto v = pr->u32("retry_after_seconds")) g.problem.retry_after_seconds = *v;
    if (auto v = pr->str("type")) g.problem.type = *v;
    if (auto v = pr->str("title")) g.problem.title = *v;
  }
  if (std::optional<ConfigSection> m = s.map("metrics")) {
    m->keys({"per_tenant"});
    if (auto b = m->boolean("per_tenant")) g.metrics.per_tenant = *b;
  }
  // The gateway's own validation, its issues placed at the fields they name.
  const ValidationReport report = validate(g);
  for (const ConfigIssue& i : report.errors) s.error_at(i.path, i.message);
  for (const ConfigIssue& i : report.warnings) s.warning_at(i.path, i.message);
}

}  // namespace

std::shared_ptr<const PolicyBody> parse_concurrency(const std::string& /*name*/, ConfigSection& s,
                                                    PolicySpec& /*spec*/) {
  s.keys({"kind", "tenants", "upstreams", "bindings", "problem", "metrics", "rate", "shadow"});
  auto body = std::make_shared<ConcurrencySpec>();
  read_gateway(s, body->gateway);
  return body;
}

}  // namespace sluice::server
