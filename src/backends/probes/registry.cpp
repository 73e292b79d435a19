#include "backends/probes/registry.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "sluice/core/text.h"

namespace sluice::probes {

bool ProbeType::takes(std::string_view setting) const {
  return std::find(settings.begin(), settings.end(), setting) != settings.end();
}

void ProbeRegistry::add(ProbeType type) {
  for (ProbeType& t : types_)
    if (t.name == type.name) {
      t = std::move(type);
      return;
    }
  types_.push_back(std::move(type));
}

const ProbeType* ProbeRegistry::find(std::string_view name) const {
  for (const ProbeType& t : types_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<std::string_view> ProbeRegistry::names() const {
  std::vector<std::string_view> out;
  for (const ProbeType& t : types_) out.emplace_back(t.name);
  return out;
}

std::vector<std::string_view> ProbeRegistry::settings() const {
  std::vector<std::string_view> out;
  for (const ProbeType& t : types_)
    for (std::string_view s : t.settings)
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

const ProbeRegistry& builtin_probes() {
  static const ProbeRegistry registry = [] {
    ProbeRegistry r;
    add_host_probes(r);
    add_policy_probe(r);
    add_mysql_probes(r);
    add_postgres_probes(r);
    add_redis_probe(r);
    add_http_probe(r);
    return r;
  }();
  return registry;
}

std::vector<Endpoint> read_hosts(ProbeSettings& s, int default_port) {
  std::vector<Endpoint> out;
  const auto list = s.strings("hosts");
  if (!list) {
    if (!s.has("hosts")) s.error("hosts", "is required: the hosts to sample, host[:port] each");
    return out;
  }
  if (list->empty()) s.error("hosts", "must name at least one host");
  for (const std::string& h : *list) {
    HostPort hp;
    if (std::string error = parse_host_port(h, hp, 1, default_port); !error.empty())
      s.error("hosts", error);
    else
      out.push_back(Endpoint{std::move(hp.host), hp.port});
  }
  return out;
}

std::string read_password(ProbeSettings& s) {
  if (s.has("password") && s.has("password_env"))
    s.error("password_env", "give password or password_env, not both");
  if (auto env = s.str("password_env")) {
    const char* v = std::getenv(env->c_str());
    if (v == nullptr) {
      s.error("password_env", "names " + *env + ", which is not set");
      return {};
    }
    return v;
  }
  return s.str("password").value_or("");
}

}  // namespace sluice::probes
