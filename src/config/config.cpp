#include "sluice/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <utility>

#include "sluice/gateway_validation.h"

namespace sluice {
namespace {

template <class E>
using Names = std::vector<std::pair<std::string_view, E>>;

// Walks the YAML tree, collecting every error with its position, and remembers each field's
// position by path so that issues found later (the gateway's validation) can point at a line.
class Reader {
 public:
  std::vector<ConfigError> errors;
  std::vector<ConfigError> warnings;
  std::map<std::string, YAML::Mark> marks;

  void error(const YAML::Node& n, const std::string& path, std::string message) {
    errors.push_back(make(n.IsDefined() ? n.Mark() : YAML::Mark::null_mark(), path, message));
  }
  void error_at(const YAML::Mark& m, const std::string& path, std::string message) {
    errors.push_back(make(m, path, std::move(message)));
  }

  static ConfigError make(const YAML::Mark& m, const std::string& path, std::string message) {
    ConfigError e;
    e.path = path;
    if (m.line >= 0) {
      e.line = m.line + 1;
      e.column = m.column + 1;
    }
    e.message = std::move(message);
    return e;
  }

  // A mapping (or absent: false without an error when optional).
  bool map(const YAML::Node& n, const std::string& path, bool required = false) {
    if (!n.IsDefined() || n.IsNull()) {
      if (required) error(n, path, "is required");
      return false;
    }
    marks.emplace(path, n.Mark());
    if (!n.IsMap()) {
      error(n, path, "must be a mapping");
      return false;
    }
    return true;
  }

  bool sequence(const YAML::Node& n, const std::string& path) {
    if (!n.IsDefined() || n.IsNull()) return false;
    marks.emplace(path, n.Mark());
    if (!n.IsSequence()) {
      error(n, path, "must be a list");
      return false;
    }
    return true;
  }

  // Every key of `n` must be one of `allowed`.
  void keys(const YAML::Node& n, const std::string& path,
            std::initializer_list<std::string_view> allowed) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar()) {
        error(it->first, path, "keys must be plain names");
        continue;
      }
      const std::string key = it->first.Scalar();
      bool known = false;
      for (std::string_view a : allowed) known = known || a == key;
      if (!known) {
        std::string list;
        for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        error(it->first, join(path, key), "unknown key (expected one of: " + list + ")");
      }
    }
  }

  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }

  std::optional<std::string> str(const YAML::Node& parent, std::string_view key,
                                 const std::string& path, bool required = false) {
    const YAML::Node n = parent[std::string(key)];
    const std::string p = join(path, key);
    if (!n.IsDefined() || n.IsNull()) {
      if (required) error(parent, p, "is required");
      return std::nullopt;
    }
    marks.emplace(p, n.Mark());
    if (!n.IsScalar()) {
      error(n, p, "must be a string");
      return std::nullopt;
    }
    return n.Scalar();
  }

  std::optional<std::uint64_t> uint(const YAML::Node& parent, std::string_view key,
                                    const std::string& path, std::uint64_t min, std::uint64_t max,
                                    bool required = false) {
    const std::optional<std::string> s = str(parent, key, path, required);
    if (!s) return std::nullopt;
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), v);
    const YAML::Node n = parent[std::string(key)];
    if (ec != std::errc{} || end != s->data() + s->size()) {
      error(n, join(path, key), "must be a whole number, not '" + *s + "'");
      return std::nullopt;
    }
    if (v < min || v > max) {
      error(n, join(path, key),
            "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], not " + *s);
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::uint32_t> u32(const YAML::Node& parent, std::string_view key,
                                   const std::string& path, std::uint32_t min = 0) {
    const auto v = uint(parent, key, path, min, std::numeric_limits<std::uint32_t>::max());
    return v ? std::optional<std::uint32_t>(static_cast<std::uint32_t>(*v)) : std::nullopt;
  }

  std::optional<bool> boolean(const YAML::Node& parent, std::string_view key,
                              const std::string& path) {
    const std::optional<std::string> s = str(parent, key, path);
    if (!s) return std::nullopt;
    if (*s == "true") return true;
    if (*s == "false") return false;
    error(parent[std::string(key)], join(path, key), "must be true or false, not '" + *s + "'");
    return std::nullopt;
  }

  std::optional<Nanos> duration(const YAML::Node& parent, std::string_view key,
                                const std::string& path) {
    const std::optional<std::string> s = str(parent, key, path);
    if (!s) return std::nullopt;
    const std::optional<Nanos> d = parse_duration(*s);
    if (!d || *d <= Nanos{0}) {
      error(parent[std::string(key)], join(path, key),
            "must be a positive duration such as 250ms or 2s, not '" + *s + "'");
      return std::nullopt;
    }
    return d;
  }

  template <class E>
  std::optional<E> choice(const YAML::Node& parent, std::string_view key, const std::string& path,
                          const Names<E>& names, bool required = false) {
    const std::optional<std::string> s = str(parent, key, path, required);
    if (!s) return std::nullopt;
    std::string list;
    for (const auto& [name, value] : names) {
      if (name == *s) return value;
      list += (list.empty() ? "" : ", ") + std::string(name);
    }
    error(parent[std::string(key)], join(path, key),
          "must be one of " + list + ", not '" + *s + "'");
    return std::nullopt;
  }

  // A gateway issue's path ("upstreams[2].concurrency_limit.per_tenant_max") under `base`, at
  // the position of the longest prefix of it that was read.
  YAML::Mark mark_of(const std::string& base, const std::string& path) const {
    std::string p = base + "." + path;
    while (true) {
      if (auto it = marks.find(p); it != marks.end()) return it->second;
      const std::size_t cut = p.find_last_of(".[");
      if (cut == std::string::npos || cut == 0) return YAML::Mark::null_mark();
      p.resize(cut);
    }
  }
};

const Names<Aggregate> kAggregates = {{"median", Aggregate::kMedian}, {"min", Aggregate::kMin}};
const Names<Allocation> kAllocations = {{"equal-split", Allocation::kEqualSplit},
                                        {"demand-proportional", Allocation::kDemandProportional}};
const Names<AlgorithmSpec::Kind> kAlgorithms = {{"fixed", AlgorithmSpec::Kind::kFixed},
                                                {"aimd", AlgorithmSpec::Kind::kAimd},
                                                {"vegas", AlgorithmSpec::Kind::kVegas},
                                                {"gradient2", AlgorithmSpec::Kind::kGradient2}};

void read_server(Reader& r, const YAML::Node& n, ServerSettings& out) {
  if (!r.map(n, "server")) return;
  r.keys(
      n, "server",
      {"grpc", "http", "admin_token", "node_id", "lease_ttl", "max_lease_ttl", "shutdown_grace"});
  for (auto [key, field] : {std::pair<std::string_view, std::string*>{"grpc", &out.grpc},
                            std::pair<std::string_view, std::string*>{"http", &out.http}}) {
    if (auto s = r.str(n, key, "server")) {
      std::string host;
      int port = 0;
      if (parse_host_port(*s, host, port))
        *field = *s;
      else
        r.error(n[std::string(key)], "server." + std::string(key),
                "must be host:port with a port in 1..65535, not '" + *s + "'");
    }
  }
  if (auto s = r.str(n, "admin_token", "server")) out.admin_token = *s;
  if (auto s = r.str(n, "node_id", "server")) out.node_id = *s;
  if (auto d = r.duration(n, "lease_ttl", "server")) out.lease_ttl = *d;
  if (auto d = r.duration(n, "max_lease_ttl", "server")) out.max_lease_ttl = *d;
  if (auto d = r.duration(n, "shutdown_grace", "server")) out.shutdown_grace = *d;
  if (out.lease_ttl > out.max_lease_ttl)
    r.error(n["lease_ttl"].IsDefined() ? n["lease_ttl"] : n, "server.lease_ttl",
            "must not exceed server.max_lease_ttl");
}

void read_coordinator(Reader& r, const YAML::Node& n, const std::string& path,
                      CoordinatorSpec& out) {
  if (!r.map(n, path, true)) return;
  const auto kind =
      r.choice<CoordinatorSpec::Kind>(n, "kind", path,
                                      {{"memory", CoordinatorSpec::Kind::kMemory},
                                       {"redis", CoordinatorSpec::Kind::kRedis},
                                       {"postgres", CoordinatorSpec::Kind::kPostgres}},
                                      true);
  if (!kind) return;
  out.kind = *kind;
  if (auto a = r.choice(n, "aggregate", path, kAggregates)) out.rules.aggregate = *a;
  if (auto a = r.choice(n, "allocation", path, kAllocations)) out.rules.allocation = *a;
  if (auto h = r.boolean(n, "acknowledged_handoff", path)) out.rules.acknowledged_handoff = *h;
  switch (*kind) {
    case CoordinatorSpec::Kind::kMemory:
      r.keys(n, path, {"kind", "aggregate", "allocation", "acknowledged_handoff"});
      break;
    case CoordinatorSpec::Kind::kRedis:
      r.keys(n, path,
             {"kind", "aggregate", "allocation", "acknowledged_handoff", "address", "username",
              "password", "database", "key_prefix", "connect_timeout"});
      if (auto s = r.str(n, "address", path)) {
        if (!parse_host_port(*s, out.redis.host, out.redis.port))
          r.error(n["address"], path + ".address",
                  "must be host:port with a port in 1..65535, not '" + *s + "'");
      }
      if (auto d = r.duration(n, "connect_timeout", path)) out.redis.connect_timeout = *d;
      if (auto s = r.str(n, "username", path)) out.redis.username = *s;
      if (auto s = r.str(n, "password", path)) out.redis.password = *s;
      if (auto v = r.uint(n, "database", path, 0, 1 << 20))
        out.redis.database = static_cast<int>(*v);
      if (auto s = r.str(n, "key_prefix", path)) {
        if (s->empty())
          r.error(n["key_prefix"], path + ".key_prefix", "must not be empty");
        else
          out.redis.key_prefix = *s;
      }
      break;
    case CoordinatorSpec::Kind::kPostgres:
      r.keys(
          n, path,
          {"kind", "aggregate", "allocation", "acknowledged_handoff", "conninfo", "table_prefix"});
      if (auto s = r.str(n, "conninfo", path, true)) out.postgres.conninfo = *s;
      if (auto s = r.str(n, "table_prefix", path)) out.postgres.table_prefix = *s;
      break;
  }
}

void read_algorithm(Reader& r, const YAML::Node& n, const std::string& path, AlgorithmSpec& out) {
  if (auto k = r.choice(n, "algorithm", path, kAlgorithms)) out.kind = *k;
  out.limit = r.u32(n, "limit", path, 1);
  out.initial_limit = r.u32(n, "initial_limit", path, 1);
  out.min_limit = r.u32(n, "min_limit", path, 1);
  out.max_limit = r.u32(n, "max_limit", path, 1);
  if (out.kind == AlgorithmSpec::Kind::kFixed && !n["limit"].IsDefined())
    r.error(n, path + ".limit", "is required for the fixed algorithm");
  if (out.kind != AlgorithmSpec::Kind::kFixed && n["limit"].IsDefined())
    r.error(n["limit"], path + ".limit",
            "applies to the fixed algorithm only (use initial_limit, min_limit, max_limit)");
  if (const std::string_view why = out.validate(); !why.empty())
    r.error(n, path, std::string(why) + " (the algorithm's defaults fill in the limits not set)");
}

std::optional<ConcurrencyLimit> read_limit(Reader& r, const YAML::Node& n,
                                           const std::string& path) {
  if (!r.map(n, path)) return std::nullopt;
  r.keys(n, path, {"sharing", "max_concurrent", "per_tenant_max", "strategy", "queue"});
  ConcurrencyLimit l;
  l.sharing = r.choice<Sharing>(n, "sharing", path,
                                {{"private", Sharing::kPrivate},
                                 {"inherit", Sharing::kInherit},
                                 {"enforce", Sharing::kEnforce}});
  l.max_concurrent = r.u32(n, "max_concurrent", path);
  l.per_tenant_max = r.u32(n, "per_tenant_max", path);
  if (auto s = r.choice<Strategy>(n, "strategy", path,
                                  {{"reject", Strategy::kReject}, {"queue", Strategy::kQueue}}))
    l.strategy = *s;
  const YAML::Node q = n["queue"];
  if (r.map(q, path + ".queue")) {
    r.keys(q, path + ".queue", {"max_depth", "timeout"});
    if (auto d = r.u32(q, "max_depth", path + ".queue")) l.queue.max_depth = *d;
    if (auto t = r.duration(q, "timeout", path + ".queue")) l.queue.timeout = *t;
  }
  return l;
}

template <class F>
void each(Reader& r, const YAML::Node& n, const std::string& path, F&& f) {
  if (!r.sequence(n, path)) return;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (r.map(n[i], p, true)) f(n[i], p);
  }
}

void read_gateway(Reader& r, const YAML::Node& n, const std::string& base, GatewayConfig& g) {
  auto rel = [&](const std::string& p) { return base + "." + p; };
  each(r, n["tenants"], rel("tenants"), [&](const YAML::Node& t, const std::string& p) {
    r.keys(t, p, {"id", "parent", "global_concurrency_limit"});
    TenantConfig c;
    if (auto s = r.str(t, "id", p, true)) c.id = *s;
    c.parent = r.str(t, "parent", p);
    c.global_concurrency_limit = r.u32(t, "global_concurrency_limit", p);
    g.tenants.push_back(std::move(c));
  });
  each(r, n["upstreams"], rel("upstreams"), [&](const YAML::Node& u, const std::string& p) {
    r.keys(u, p, {"id", "host", "owner", "concurrency_limit", "routes"});
    UpstreamConfig c;
    if (auto s = r.str(u, "id", p, true)) c.id = *s;
    if (auto s = r.str(u, "host", p)) c.host = *s;
    if (auto s = r.str(u, "owner", p, true)) c.owner = *s;
    c.concurrency_limit = read_limit(r, u["concurrency_limit"], p + ".concurrency_limit");
    each(r, u["routes"], p + ".routes", [&](const YAML::Node& rt, const std::string& rp) {
      r.keys(rt, rp, {"id", "max_concurrent"});
      RouteConfig route;
      if (auto s = r.str(rt, "id", rp, true)) route.id = *s;
      route.max_concurrent = r.u32(rt, "max_concurrent", rp);
      c.routes.push_back(std::move(route));
    });
    g.upstreams.push_back(std::move(c));
  });
  each(r, n["bindings"], rel("bindings"), [&](const YAML::Node& b, const std::string& p) {
    r.keys(b, p, {"tenant", "upstream", "concurrency_limit"});
    BindingConfig c;
    if (auto s = r.str(b, "tenant", p, true)) c.tenant = *s;
    if (auto s = r.str(b, "upstream", p, true)) c.upstream = *s;
    c.concurrency_limit = read_limit(r, b["concurrency_limit"], p + ".concurrency_limit");
    g.bindings.push_back(std::move(c));
  });
  const YAML::Node pr = n["problem"];
  if (r.map(pr, rel("problem"))) {
    r.keys(pr, rel("problem"), {"status", "retry_after_seconds", "type", "title"});
    if (auto v = r.uint(pr, "status", rel("problem"), 0, 999))
      g.problem.status = static_cast<std::uint16_t>(*v);
    if (auto v = r.u32(pr, "retry_after_seconds", rel("problem")))
      g.problem.retry_after_seconds = *v;
    if (auto s = r.str(pr, "type", rel("problem"))) g.problem.type = *s;
    if (auto s = r.str(pr, "title", rel("problem"))) g.problem.title = *s;
  }
  const YAML::Node m = n["metrics"];
  if (r.map(m, rel("metrics"))) {
    r.keys(m, rel("metrics"), {"per_tenant"});
    if (auto b = r.boolean(m, "per_tenant", rel("metrics"))) g.metrics.per_tenant = *b;
  }
  // The gateway's own validation, its issues placed at the fields they name.
  const ValidationReport report = validate(g);
  for (const ConfigIssue& i : report.errors)
    r.error_at(r.mark_of(base, i.path), rel(i.path), i.message);
  for (const ConfigIssue& i : report.warnings)
    r.warnings.push_back(Reader::make(r.mark_of(base, i.path), rel(i.path), i.message));
}

void read_fleet(Reader& r, const YAML::Node& n, const std::string& path, const std::string& name,
                FleetPolicy& f) {
  read_algorithm(r, n, path, f.algorithm);
  if (auto s = r.str(n, "coordinator", path)) f.coordinator = *s;
  f.guard.key = name;
  if (auto s = r.str(n, "key", path)) f.guard.key = *s;
  if (auto d = r.duration(n, "heartbeat", path)) f.guard.heartbeat = *d;
  f.guard.lease_ttl = r.duration(n, "lease_ttl", path);
  if (auto o = r.choice<OutageMode>(
          n, "outage", path,
          {{"fail-closed", OutageMode::kFailClosed}, {"local-only", OutageMode::kLocalOnly}}))
    f.guard.outage = *o;
  if (auto b = r.boolean(n, "self_fence", path)) f.guard.self_fence = *b;
  f.guard.fence_safety_margin = r.duration(n, "fence_safety_margin", path);
  if (auto b = r.boolean(n, "eager_handoff", path)) f.guard.eager_handoff = *b;
  f.guard.min_heartbeat = r.duration(n, "min_heartbeat", path);
  f.guard.call_timeout = r.duration(n, "call_timeout", path);
  // The guard's own rules between fields (lease > heartbeat, ...), node_id aside.
  FleetGuardOptions probe = f.guard;
  probe.node_id = "check";
  if (std::string why = probe.validate(); !why.empty()) r.error(n, path, why);
}

void read_policy(Reader& r, const YAML::Node& n, const std::string& path, const std::string& name,
                 SluiceConfig& cfg) {
  if (!r.map(n, path, true)) return;
  const YAML::Node kind_node = n["kind"];
  const auto kind = r.str(n, "kind", path, true);
  if (!kind) return;
  if (*kind == "rate") {
    r.keys(n, path, {"kind", "strategy", "limit", "period", "burst"});
    RatePolicy p;
    if (auto s = r.choice<RateStrategy>(n, "strategy", path,
                                        {{"fixed-window", RateStrategy::kFixedWindow},
                                         {"sliding-window", RateStrategy::kSlidingWindow},
                                         {"gcra", RateStrategy::kGcra}}))
      p.rule.strategy = *s;
    if (auto v = r.uint(n, "limit", path, 1, std::numeric_limits<std::uint32_t>::max(), true))
      p.rule.limit = *v;
    if (auto d = r.duration(n, "period", path)) p.rule.period = *d;
    if (auto v = r.uint(n, "burst", path, 1, std::numeric_limits<std::uint32_t>::max()))
      p.rule.burst = *v;
    // The rule's own check ("<field> <what is wrong>"), placed at the field it names.
    if (const std::string why = p.rule.validate(); !why.empty()) {
      const std::string field = why.substr(0, why.find(' '));
      r.error(n[field].IsDefined() ? n[field] : n, path + "." + field,
              why.substr(field.size() + 1));
    }
    cfg.policies[name].body = p;
  } else if (*kind == "adaptive") {
    r.keys(n, path,
           {"kind", "algorithm", "limit", "initial_limit", "min_limit", "max_limit", "rate"});
    AdaptivePolicy p;
    read_algorithm(r, n, path, p.algorithm);
    cfg.policies[name].body = p;
  } else if (*kind == "fleet") {
    r.keys(n, path,
           {"kind", "algorithm", "limit", "initial_limit", "min_limit", "max_limit", "coordinator",
            "key", "heartbeat", "lease_ttl", "outage", "self_fence", "fence_safety_margin",
            "eager_handoff", "min_heartbeat", "call_timeout", "rate"});
    FleetPolicy p;
    read_fleet(r, n, path, name, p);
    cfg.policies[name].coordinators = {p.coordinator};
    cfg.policies[name].body = p;
  } else if (*kind == "concurrency") {
    r.keys(n, path, {"kind", "tenants", "upstreams", "bindings", "problem", "metrics", "rate"});
    ConcurrencyPolicy p;
    read_gateway(r, n, path, p.gateway);
    cfg.policies[name].body = p;
  } else if (*kind == "federated") {
    r.error(kind_node, path + ".kind",
            "'federated' (a global rate budget across regions) is not built in this version of "
            "sluice yet");
  } else {
    r.error(kind_node, path + ".kind",
            "must be one of rate, adaptive, fleet, concurrency, federated, not '" + *kind + "'");
  }
  if (auto it = cfg.policies.find(name); it != cfg.policies.end()) {
    PolicySpec& spec = it->second;
    if (*kind != "rate") {
      if (auto s = r.str(n, "rate", path)) spec.rate = *s;
    }
    spec.fingerprint = YAML::Dump(n);
  }
}

ConfigLoad read(const YAML::Node& root) {
  Reader r;
  SluiceConfig cfg;
  cfg.coordinators["memory"] = CoordinatorSpec{};
  if (root.IsDefined() && !root.IsNull() && !root.IsMap()) {
    r.error(root, "", "the file must be a mapping with server, coordinators and policies");
  } else if (root.IsDefined() && !root.IsNull()) {
    r.keys(root, "", {"server", "coordinators", "policies"});
    read_server(r, root["server"], cfg.server);
    const YAML::Node cs = root["coordinators"];
    if (r.map(cs, "coordinators")) {
      for (auto it = cs.begin(); it != cs.end(); ++it) {
        const std::string name = it->first.Scalar();
        const std::string path = "coordinators." + name;
        if (name.empty()) r.error(it->first, path, "a coordinator needs a name");
        read_coordinator(r, it->second, path, cfg.coordinators[name]);
        cfg.coordinators[name].fingerprint = YAML::Dump(it->second);
      }
    }
    const YAML::Node ps = root["policies"];
    if (r.map(ps, "policies")) {
      for (auto it = ps.begin(); it != ps.end(); ++it) {
        const std::string name = it->first.Scalar();
        if (name.empty()) r.error(it->first, "policies", "a policy needs a name");
        read_policy(r, it->second, "policies." + name, name, cfg);
      }
    }
    // Cross-references.
    for (const auto& [name, p] : cfg.policies) {
      if (!p.rate.empty()) {
        const std::string path = "policies." + name + ".rate";
        const auto at = r.marks.find(path);
        const auto chained = cfg.policies.find(p.rate);
        if (chained == cfg.policies.end() || chained->second.kind() != "rate")
          r.error_at(
              at != r.marks.end() ? at->second : YAML::Mark::null_mark(), path,
              "no rate policy named '" + p.rate + "' (rate must name a policy of kind rate)");
      }
      for (const std::string& c : p.coordinators) {
        if (cfg.coordinators.contains(c)) continue;
        const std::string path = "policies." + name + ".coordinator";
        const auto at = r.marks.find(path);
        r.error_at(at != r.marks.end() ? at->second : YAML::Mark::null_mark(), path,
                   "no coordinator named '" + c + "'");
      }
    }
  }
  ConfigLoad out;
  out.errors = std::move(r.errors);
  out.warnings = std::move(r.warnings);
  if (out.errors.empty()) out.config = std::move(cfg);
  return out;
}

}  // namespace

std::string_view PolicySpec::kind() const noexcept {
  switch (body.index()) {
    case 0:
      return "rate";
    case 1:
      return "adaptive";
    case 2:
      return "fleet";
    default:
      return "concurrency";
  }
}

std::string ConfigError::to_string(std::string_view source) const {
  std::string out(source);
  if (line > 0) out += ":" + std::to_string(line) + ":" + std::to_string(column);
  out += ": ";
  if (!path.empty()) out += path + ": ";
  return out + message;
}

bool parse_host_port(std::string_view text, std::string& host, int& port, int min_port) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  int p = 0;
  const char* b = text.data() + colon + 1;
  const char* e = text.data() + text.size();
  const auto [end, ec] = std::from_chars(b, e, p);
  if (ec != std::errc{} || end != e || p < min_port || p > 65535) return false;
  host = std::string(text.substr(0, colon));
  port = p;
  return true;
}

std::optional<Nanos> parse_duration(std::string_view text) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end == text.data() || v < 0) return std::nullopt;
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  std::int64_t scale = 0;
  if (unit == "ns") scale = 1;
  if (unit == "us") scale = 1'000;
  if (unit == "ms") scale = 1'000'000;
  if (unit == "s") scale = 1'000'000'000;
  if (unit == "m") scale = 60'000'000'000;
  if (unit == "h") scale = 3'600'000'000'000;
  if (scale == 0 || v > std::numeric_limits<std::int64_t>::max() / scale) return std::nullopt;
  return Nanos{v * scale};
}

ConfigLoad load_config(std::string_view yaml) {
  try {
    return read(YAML::Load(std::string(yaml)));
  } catch (const YAML::Exception& e) {
    ConfigLoad out;
    out.errors.push_back(Reader::make(e.mark, "", "YAML syntax: " + e.msg));
    return out;
  } catch (const std::exception& e) {
    ConfigLoad out;
    out.errors.push_back(Reader::make(YAML::Mark::null_mark(), "", e.what()));
    return out;
  }
}

ConfigLoad load_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ConfigLoad out;
    out.errors.push_back(
        Reader::make(YAML::Mark::null_mark(), "", "cannot read the file '" + path + "'"));
    return out;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return load_config(ss.str());
}

}  // namespace sluice
