#include "sluice/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <system_error>
#include <utility>
#include <vector>

#include "config/reader.h"
#include "sluice/core/text.h"

namespace sluice {
namespace {

using config_detail::Names;
using config_detail::Reader;

const Names<Aggregate> kAggregates = {{"median", Aggregate::kMedian}, {"min", Aggregate::kMin}};
const Names<Allocation> kAllocations = {{"equal-split", Allocation::kEqualSplit},
                                        {"demand-proportional", Allocation::kDemandProportional}};

// What a role is, as an error names it.
std::string_view role_name(CoordinatorRole role) {
  switch (role) {
    case CoordinatorRole::kConcurrency:
      return "a fleet (the concurrency interface)";
    case CoordinatorRole::kRateBudget:
      return "a federated budget (the rate-budget interface)";
    case CoordinatorRole::kRegionalEscrow:
      return "a regional escrow (the regional pool)";
    case CoordinatorRole::kSharedRules:
      return "a throttler's shared rules";
    case CoordinatorRole::kSharedRate:
      return "a shared rate limit (the shared rate interface)";
  }
  return "this";
}

void read_server(Reader& r, const YAML::Node& n, ServerSettings& out) {
  if (!r.map(n, "server")) return;
  r.keys(n, "server",
         {"grpc", "http", "envoy_grpc", "admin_token", "node_id", "lease_ttl", "max_lease_ttl",
          "shutdown_grace", "state_file", "max_connections", "idle_timeout", "request_timeout",
          "keepalive", "max_streams_per_connection", "max_watch_streams", "rate_limit_headers",
          "shadow_mode"});
  for (auto [key, field] :
       {std::pair<std::string_view, std::string*>{"grpc", &out.grpc},
        std::pair<std::string_view, std::string*>{"http", &out.http},
        std::pair<std::string_view, std::string*>{"envoy_grpc", &out.envoy_grpc}}) {
    if (auto s = r.str(n, key, "server")) {
      HostPort ignored;
      if (parse_host_port(*s, ignored).empty())
        *field = *s;
      else
        r.error(n[std::string(key)], "server." + std::string(key),
                "must be host:port with a port in 1..65535, not '" + *s + "'");
    }
  }
  if (auto s = r.str(n, "admin_token", "server")) out.admin_token = *s;
  if (auto s = r.str(n, "node_id", "server")) out.node_id = *s;
  if (auto s = r.str(n, "state_file", "server")) out.state_file = *s;
  if (auto d = r.duration(n, "lease_ttl", "server")) out.lease_ttl = *d;
  if (auto d = r.duration(n, "max_lease_ttl", "server")) out.max_lease_ttl = *d;
  if (auto d = r.duration(n, "shutdown_grace", "server")) out.shutdown_grace = *d;
  if (auto v = r.uint(n, "max_connections", "server", 1, 1U << 24)) out.max_connections = *v;
  if (auto v = r.uint(n, "max_streams_per_connection", "server", 1, 1U << 20))
    out.max_streams_per_connection = *v;
  if (auto v = r.uint(n, "max_watch_streams", "server", 1, 1U << 20)) out.max_watch_streams = *v;
  if (auto v = r.choice(n, "rate_limit_headers", "server",
                        Names<std::string>{{"ietf", "ietf"},
                                           {"x-ratelimit", "x-ratelimit"},
                                           {"both", "both"},
                                           {"none", "none"}}))
    out.rate_limit_headers = *v;
  if (auto v = r.boolean(n, "shadow_mode", "server")) out.shadow_mode = *v;
  for (auto [key, field] :
       {std::pair<std::string_view, Nanos*>{"idle_timeout", &out.idle_timeout},
        std::pair<std::string_view, Nanos*>{"request_timeout", &out.request_timeout},
        std::pair<std::string_view, Nanos*>{"keepalive", &out.keepalive}}) {
    if (auto d = r.duration(n, key, "server")) {
      if (*d >= std::chrono::milliseconds(100))
        *field = *d;
      else
        r.error(n[std::string(key)], "server." + std::string(key), "must be at least 100ms");
    }
  }
  if (out.lease_ttl > out.max_lease_ttl)
    r.error(n["lease_ttl"].IsDefined() ? n["lease_ttl"] : n, "server.lease_ttl",
            "must not exceed server.max_lease_ttl");
}

void read_coordinator(Reader& r, const YAML::Node& n, const std::string& path,
                      const PolicyKinds& kinds, CoordinatorSpec& out) {
  if (!r.map(n, path, true)) return;
  const YAML::Node kind_node = n["kind"];
  const auto kind = r.str(n, "kind", path, true);
  if (!kind) return;
  const CoordinatorBackendParser* backend = kinds.coordinator_backend(*kind);
  if (backend == nullptr) {
    std::string list;
    for (const std::string& k : kinds.coordinator_backend_names())
      list += (list.empty() ? "" : ", ") + k;
    r.error(kind_node, path + ".kind", "must be one of " + list + ", not '" + *kind + "'");
    return;
  }
  out.kind = *kind;
  if (auto a = r.choice(n, "aggregate", path, kAggregates)) out.rules.aggregate = *a;
  if (auto a = r.choice(n, "allocation", path, kAllocations)) out.rules.allocation = *a;
  if (auto h = r.boolean(n, "acknowledged_handoff", path)) out.rules.acknowledged_handoff = *h;
  ConfigSection section = r.section(n, path);
  std::vector<std::string_view> keys = {"kind", "aggregate", "allocation", "acknowledged_handoff"};
  keys.insert(keys.end(), backend->keys.begin(), backend->keys.end());
  section.keys(keys);
  if (backend->parse) backend->parse(section, out);
}

void read_policy(Reader& r, const YAML::Node& n, const std::string& path, const std::string& name,
                 const PolicyKinds& kinds, SluiceConfig& cfg) {
  if (!r.map(n, path, true)) return;
  const YAML::Node kind_node = n["kind"];
  const auto kind = r.str(n, "kind", path, true);
  if (!kind) return;
  const PolicyKindParser* parser = kinds.parser(*kind);
  if (parser == nullptr) {
    std::string list;
    for (const std::string& k : kinds.kind_names()) list += (list.empty() ? "" : ", ") + k;
    r.error(kind_node, path + ".kind", "must be one of " + list + ", not '" + *kind + "'");
    return;
  }
  PolicySpec spec;
  spec.kind = *kind;
  ConfigSection section = r.section(n, path);
  spec.body = parser->parse(name, section, spec);
  if (parser->admit_family) {
    if (auto s = r.str(n, "rate", path)) spec.rate = *s;
  }
  if (auto v = r.boolean(n, "shadow", path)) spec.shadow = *v;
  // Shadow mode is how the policy is served, not what it is: turning it on or off keeps the
  // policy (its state, escrow, fleet membership) as it is.
  YAML::Node identity = YAML::Clone(n);
  identity.remove("shadow");
  spec.fingerprint += YAML::Dump(identity);
  cfg.policies[name] = std::move(spec);
}

// A config without a policy serves nothing: an empty file, or a missing or empty `policies:`,
// is an error.
constexpr std::string_view kNeedsAPolicy = "a config needs at least one policy";

// An error about the whole file (no line, no field), as the only one.
ConfigLoad file_error(std::string message) {
  ConfigLoad out;
  out.errors.push_back(Reader::make(YAML::Mark::null_mark(), "", std::move(message)));
  return out;
}

// Why `name` cannot name a policy or a coordinator (empty: it can). A control character (a NUL,
// a newline) would not survive the file being written out again, nor a log line or a metric
// label.
std::string name_problem(const std::string& name, std::string_view what) {
  if (name.empty()) return "a " + std::string(what) + " needs a name";
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", c);
      return "a " + std::string(what) + " name must not contain control characters (byte " + hex +
             " at offset " + std::to_string(i) + ")";
    }
  }
  return {};
}

void read_coordinators(Reader& r, const YAML::Node& cs, const PolicyKinds& kinds,
                       SluiceConfig& cfg) {
  if (!r.map(cs, "coordinators")) return;
  for (auto it = cs.begin(); it != cs.end(); ++it) {
    const std::string name = it->first.IsScalar() ? it->first.Scalar() : "";
    if (const std::string why = name_problem(name, "coordinator"); !why.empty()) {
      r.error(it->first, "coordinators", why);
      continue;
    }
    const std::string path = "coordinators." + name;
    read_coordinator(r, it->second, path, kinds, cfg.coordinators[name]);
    cfg.coordinators[name].fingerprint = YAML::Dump(it->second);
  }
}

// A policy's name, and where the file names it.
struct PolicyName {
  std::string name;
  YAML::Mark at;
};

// Reads every policy; returns their names in the file's order.
std::vector<PolicyName> read_policies(Reader& r, const YAML::Node& root, const PolicyKinds& kinds,
                                      SluiceConfig& cfg) {
  std::vector<PolicyName> order;
  const YAML::Node ps = root["policies"];
  if (!ps.IsDefined() || ps.IsNull()) {
    r.error(ps.IsDefined() ? ps : root, "policies",
            "is required (" + std::string(kNeedsAPolicy) + ")");
    return order;
  }
  if (!r.map(ps, "policies")) return order;
  if (ps.size() == 0) r.error(ps, "policies", "is empty (" + std::string(kNeedsAPolicy) + ")");
  for (auto it = ps.begin(); it != ps.end(); ++it) {
    const std::string name = it->first.IsScalar() ? it->first.Scalar() : "";
    if (const std::string why = name_problem(name, "policy"); !why.empty()) {
      r.error(it->first, "policies", why);
      continue;
    }
    read_policy(r, it->second, "policies." + name, name, kinds, cfg);
    if (cfg.policies.contains(name)) order.push_back({name, it->first.Mark()});
  }
  return order;
}

// Where an error about `path` goes: the field's mark when it was read, else its nearest parent's
// that was.
YAML::Mark mark_of(const Reader& r, std::string path) {
  while (true) {
    if (auto at = r.marks.find(path); at != r.marks.end()) return at->second;
    const std::size_t dot = path.rfind('.');
    if (dot == std::string::npos) return YAML::Mark::null_mark();
    path.resize(dot);
  }
}

// The data a coordinator keeps its members in: its backend's store, or (empty: each memory
// coordinator is its own) its name.
std::string store_of(const std::string& name, const CoordinatorSpec& c) {
  return c.store.empty() ? c.kind + "\n" + name : c.kind + "\n" + c.store;
}

// Each use of a coordinator by a policy: the coordinator's backend must serve it.
void check_roles(Reader& r, const SluiceConfig& cfg, const PolicyKinds& kinds) {
  for (const auto& [name, p] : cfg.policies) {
    for (const CoordinatorUse& u : p.uses) {
      const auto c = cfg.coordinators.find(u.coordinator);
      if (c == cfg.coordinators.end()) continue;
      const CoordinatorBackendParser* backend = kinds.coordinator_backend(c->second.kind);
      if (backend == nullptr || backend->serves(u.role)) continue;
      std::vector<std::string> able;  // "a, b or c"
      for (const std::string& k : kinds.coordinator_backend_names())
        if (const CoordinatorBackendParser* b = kinds.coordinator_backend(k);
            b != nullptr && b->serves(u.role))
          able.push_back(k);
      std::string serving;
      for (std::size_t i = 0; i < able.size(); ++i)
        serving += (i == 0 ? "" : i + 1 == able.size() ? " or " : ", ") + able[i];
      const std::string path = "policies." + name + "." + u.field;
      r.error_at(mark_of(r, path), path,
                 "coordinator '" + u.coordinator + "' is a " + c->second.kind +
                     " coordinator, which cannot hold " + std::string(role_name(u.role)) +
                     " (name a " + serving + " coordinator)");
    }
  }
}

// No two policies join one coordinator's data as members under one key: one server beats under
// one node id, so they would share one member record, and each would admit up to the whole
// share. An error at the second, in the file's order.
void check_members(Reader& r, const SluiceConfig& cfg, const std::vector<PolicyName>& order) {
  struct First {
    std::string policy, coordinator;
    int line = 0;
  };
  std::map<std::string, First> first;  // store, role and key -> the first member
  for (const auto& [name, named_at] : order) {
    for (const CoordinatorUse& u : cfg.policies.at(name).uses) {
      const auto c = cfg.coordinators.find(u.coordinator);
      if (u.member_key.empty() || c == cfg.coordinators.end()) continue;
      const std::string id = store_of(u.coordinator, c->second) + "\n" +
                             std::to_string(static_cast<int>(u.role)) + "\n" + u.member_key;
      const auto [at, fresh] = first.try_emplace(id, First{name, u.coordinator, named_at.line + 1});
      if (fresh) continue;
      const First& f = at->second;
      const std::string where = f.coordinator == u.coordinator
                                    ? "coordinator '" + u.coordinator + "'"
                                    : "coordinator '" + u.coordinator + "' (the same " +
                                          c->second.kind + " data as coordinator '" +
                                          f.coordinator + "')";
      const std::string path = "policies." + name + "." + u.member_key_field;
      r.error_at(mark_of(r, path), path,
                 "policies " + f.policy + " (line " + std::to_string(f.line) + ") and " + name +
                     " both join " + where + " under key '" + u.member_key +
                     "': one server is one member of a key (one node id), so the two would share "
                     "one member record and each admit up to the whole share; give each policy "
                     "its own key");
    }
  }
}

ConfigLoad read(const YAML::Node& root, const PolicyKinds& kinds) {
  Reader r;
  SluiceConfig cfg;
  cfg.coordinators["memory"] = CoordinatorSpec{};
  if (!root.IsMap()) {
    r.error(root, "", "the file must be a mapping with server, coordinators and policies");
  } else {
    r.unique_keys(root, "");
    r.keys(root, "", {"server", "coordinators", "policies"});
    read_server(r, root["server"], cfg.server);
    read_coordinators(r, root["coordinators"], kinds, cfg);
    const std::vector<PolicyName> order = read_policies(r, root, kinds, cfg);
    // Cross-references.
    for (const auto& [name, p] : cfg.policies) {
      if (!p.rate.empty()) {
        const std::string path = "policies." + name + ".rate";
        const auto at = r.marks.find(path);
        const auto chained = cfg.policies.find(p.rate);
        const PolicyKindParser* k =
            chained == cfg.policies.end() ? nullptr : kinds.parser(chained->second.kind);
        if (k == nullptr || !k->rate_family) {
          std::string rate_kinds;
          for (const std::string& name : kinds.kind_names())
            if (const PolicyKindParser* kp = kinds.parser(name); kp != nullptr && kp->rate_family)
              rate_kinds += (rate_kinds.empty() ? "" : " or ") + name;
          r.error_at(at != r.marks.end() ? at->second : YAML::Mark::null_mark(), path,
                     "no rate policy named '" + p.rate + "' (rate must name a policy of kind " +
                         rate_kinds + ")");
        }
      }
      for (std::size_t i = 0; i < p.coordinators.size(); ++i) {
        const std::string& c = p.coordinators[i];
        if (cfg.coordinators.contains(c)) continue;
        const std::string path = "policies." + name + "." +
                                 (i < p.coordinator_fields.size() ? p.coordinator_fields[i]
                                                                  : std::string("coordinator"));
        const auto at = r.marks.find(path);
        r.error_at(at != r.marks.end() ? at->second : YAML::Mark::null_mark(), path,
                   "no coordinator named '" + c + "'");
      }
    }
    check_roles(r, cfg, kinds);
    check_members(r, cfg, order);
  }
  ConfigLoad out;
  out.errors = std::move(r.errors);
  out.warnings = std::move(r.warnings);
  if (out.errors.empty()) out.config = std::move(cfg);
  return out;
}

}  // namespace

std::vector<RestartOnlyChange> restart_only_changes(const ServerSettings& running,
                                                    const ServerSettings& next) {
  std::vector<RestartOnlyChange> out;
  const auto text = [&](std::string_view setting, const std::string& a, const std::string& b) {
    if (a != b)
      out.push_back({"server." + std::string(setting), a.empty() ? "unset" : "'" + a + "'",
                     b.empty() ? "unset" : "'" + b + "'"});
  };
  const auto duration = [&](std::string_view setting, Nanos a, Nanos b) {
    if (a != b)
      out.push_back({"server." + std::string(setting), format_duration(a), format_duration(b)});
  };
  text("grpc", running.grpc, next.grpc);
  text("http", running.http, next.http);
  text("envoy_grpc", running.envoy_grpc, next.envoy_grpc);
  text("node_id", running.node_id, next.node_id);
  if (running.max_connections != next.max_connections)
    out.push_back({"server.max_connections", std::to_string(running.max_connections),
                   std::to_string(next.max_connections)});
  duration("idle_timeout", running.idle_timeout, next.idle_timeout);
  duration("request_timeout", running.request_timeout, next.request_timeout);
  duration("keepalive", running.keepalive, next.keepalive);
  if (running.max_streams_per_connection != next.max_streams_per_connection)
    out.push_back({"server.max_streams_per_connection",
                   std::to_string(running.max_streams_per_connection),
                   std::to_string(next.max_streams_per_connection)});
  if (running.max_watch_streams != next.max_watch_streams)
    out.push_back({"server.max_watch_streams", std::to_string(running.max_watch_streams),
                   std::to_string(next.max_watch_streams)});
  return out;
}

void PolicySpec::use(CoordinatorUse u) {
  if (std::find(coordinators.begin(), coordinators.end(), u.coordinator) == coordinators.end()) {
    coordinator_fields.resize(coordinators.size(), "coordinator");
    coordinators.push_back(u.coordinator);
    coordinator_fields.push_back(u.field);
  }
  uses.push_back(std::move(u));
}

// Appended piece by piece: `":" + std::to_string(line)` trips g++ 12's bogus -Wrestrict at -O3
// (GCC bug 105651).
std::string ConfigError::to_string(std::string_view source) const {
  std::string out(source);
  if (line > 0) {
    out += ':';
    out += std::to_string(line);
    out += ':';
    out += std::to_string(column);
  }
  out += ": ";
  if (!path.empty()) {
    out += path;
    out += ": ";
  }
  out += message;
  return out;
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

std::string format_duration(Nanos d) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kHour = 3'600'000'000'000, kMinute = 60'000'000'000;
  const std::int64_t ns = d.count();
  if (ns < 0) return "-" + format_duration(Nanos{ns < -kMax ? kMax : -ns});
  if (ns == 0) return "0s";
  if (ns % kHour == 0) return std::to_string(ns / kHour) + "h";
  if (ns % kMinute == 0) return std::to_string(ns / kMinute) + "m";
  struct Unit {
    std::int64_t ns;
    const char* name;
  };
  constexpr Unit kUnits[] = {{1'000'000'000, "s"}, {1'000'000, "ms"}, {1'000, "us"}};
  for (const Unit& u : kUnits) {
    if (ns < u.ns) continue;
    // In thousandths of the unit, rounded half up. A value that rounds is formatted as rounded,
    // so that 59.9996s is "1m" and 999.9996ms is "1s".
    const std::int64_t step = u.ns / 1000;
    const std::int64_t q = ns / step + (ns % step * 2 >= step ? 1 : 0);
    if (ns <= kMax - step && q * step != ns) return format_duration(Nanos{q * step});
    std::string out = std::to_string(q / 1000);
    if (const std::int64_t frac = q % 1000; frac != 0) {
      std::string digits = std::to_string(frac);
      digits.insert(0, 3 - digits.size(), '0');
      digits.erase(digits.find_last_not_of('0') + 1);
      out += '.';
      out += digits;
    }
    return out + u.name;
  }
  return std::to_string(ns) + "ns";
}

namespace {

// The offset of the first control character YAML text may not contain (every C0 control but
// tab, newline and carriage return, and DEL); npos when there is none. yaml-cpp reads some of
// them into names as other bytes.
std::size_t first_control(std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return i;
  }
  return std::string_view::npos;
}

// A config that cannot be read at all, with one error at byte `offset` of `yaml`:
// "<what>: byte 0xNN<after>".
ConfigLoad text_error(std::string_view yaml, std::size_t offset, const std::string& what,
                      const std::string& after) {
  YAML::Mark at;
  const std::string_view before = yaml.substr(0, offset);
  at.line = static_cast<int>(std::count(before.begin(), before.end(), '\n'));
  const std::size_t line_start = before.rfind('\n');
  at.column =
      static_cast<int>(line_start == std::string_view::npos ? offset : offset - line_start - 1);
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned char>(yaml[offset]));
  ConfigLoad out;
  out.errors.push_back(Reader::make(at, "", what + ": byte " + std::string(hex) + after));
  return out;
}

// The offset of a "---" line that starts a second document (after a line of content); npos
// when there is none. A "---" before any content starts the first.
std::size_t second_document(std::string_view text) {
  bool content = false;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool marker =
        line.substr(0, 3) == "---" && (line.size() == 3 || line[3] == ' ' || line[3] == '\t');
    if (marker && content) return at;
    const std::size_t first = line.find_first_not_of(" \t");
    if (!marker && first != std::string_view::npos && line[first] != '#' && line[0] != '%' &&
        line.substr(0, 3) != "...")
      content = true;
    at = end + 1;
  }
  return std::string_view::npos;
}

}  // namespace

namespace {

// The checks every YAML file passes before it is parsed (empty: it passes): UTF-8 text,
// no control characters, one document. `empty` is the error of a file with nothing in it.
std::vector<ConfigError> text_problems(std::string_view yaml, const std::string& empty) {
  if (yaml.find_first_not_of(" \t\r\n") == std::string_view::npos) return file_error(empty).errors;
  // yaml-cpp passes bytes that are not UTF-8 through into names and strings, where every JSON
  // rendering (problem+json, /v1/policies) would fail on them: refuse them here, at their place.
  if (const std::size_t bad = first_non_utf8(yaml); bad != std::string_view::npos) {
    return text_error(yaml, bad, "the file is not UTF-8 text",
                      " does not begin a UTF-8 character here")
        .errors;
  }
  if (const std::size_t bad = first_control(yaml); bad != std::string_view::npos)
    return text_error(yaml, bad, "the file has a control character YAML text may not contain",
                      " here")
        .errors;
  // One document: a file of several would be read up to the first, the rest silently left.
  // Told from the text (a "---" line after content), so a later document is never parsed.
  if (const std::size_t at = second_document(yaml); at != std::string_view::npos) {
    const std::size_t line = static_cast<std::size_t>(
        std::count(yaml.begin(), yaml.begin() + static_cast<long>(at), '\n'));
    ConfigError e;
    e.line = static_cast<int>(line) + 1;
    e.column = 1;
    e.message =
        "the file holds more than one YAML document; a config is one (the second begins here)";
    return {std::move(e)};
  }
  return {};
}

// Reads the file at `path` into `text`; empty when it could, else why not. Looked at before it
// is opened: opening a FIFO would wait for a writer (a reload stuck there would hold SIGTERM
// too), and a config has no business being gigabytes.
std::string read_text(const std::string& path, std::string& text) {
  constexpr std::uintmax_t kMaxBytes = 16U << 20;
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::is_directory(st)) return "is a directory, not a config file";
  if (!ec && !std::filesystem::is_regular_file(st))
    return "is not a regular file (a FIFO, socket or device), not a config file";
  if (const std::uintmax_t size = std::filesystem::file_size(path, ec); !ec && size > kMaxBytes)
    return "is " + std::to_string(size) + " bytes; a config file is at most 16 MiB";
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return err == 0 ? std::string("cannot read the file")
                    : "cannot read the file: " + std::generic_category().message(err);
  }
  std::array<char, 1 << 16> buf{};  // read up to the bound, should the file have grown since
  while (in.read(buf.data(), buf.size()) || in.gcount() > 0) {
    text.append(buf.data(), static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxBytes) return "is over 16 MiB; a config file is at most that";
  }
  if (in.bad()) return "cannot read the file";
  return {};
}

}  // namespace

ConfigLoad load_config(std::string_view yaml, const PolicyKinds& kinds) {
  const std::string needs = " (" + std::string(kNeedsAPolicy) + ", under policies:)";
  if (std::vector<ConfigError> e = text_problems(yaml, "the file is empty" + needs); !e.empty()) {
    ConfigLoad out;
    out.errors = std::move(e);
    return out;
  }
  try {
    const YAML::Node root = YAML::Load(std::string(yaml));
    if (!root.IsDefined() || root.IsNull()) {
      return file_error(yaml.find('#') != std::string_view::npos
                            ? "the file has only comments" + needs
                            : "the file has no settings" + needs);
    }
    return read(root, kinds);
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

ConfigLoad load_config_file(const std::string& path, const PolicyKinds& kinds) {
  std::string text;
  if (std::string why = read_text(path, text); !why.empty()) return file_error(std::move(why));
  return load_config(text, kinds);
}

DocumentLoad load_yaml_text(std::string_view yaml, std::string_view empty,
                            const std::function<void(ConfigSection&)>& read) {
  DocumentLoad out;
  out.text = std::string(yaml);
  out.errors = text_problems(yaml, std::string(empty));
  if (!out.errors.empty()) return out;
  try {
    const YAML::Node root = YAML::Load(out.text);
    Reader r;
    if (!root.IsDefined() || root.IsNull()) {
      out.errors = file_error(std::string(empty)).errors;
      return out;
    }
    if (!r.map(root, "", true)) {
      out.errors = std::move(r.errors);
      return out;
    }
    ConfigSection section = r.section(root, "");
    read(section);
    out.errors = std::move(r.errors);
    out.warnings = std::move(r.warnings);
  } catch (const YAML::Exception& e) {
    out.errors.push_back(Reader::make(e.mark, "", "YAML syntax: " + e.msg));
  } catch (const std::exception& e) {
    out.errors.push_back(Reader::make(YAML::Mark::null_mark(), "", e.what()));
  }
  return out;
}

DocumentLoad load_yaml_file(const std::string& path, std::string_view empty,
                            const std::function<void(ConfigSection&)>& read) {
  std::string text;
  if (std::string why = read_text(path, text); !why.empty()) {
    DocumentLoad out;
    out.errors = file_error(std::move(why)).errors;
    return out;
  }
  return load_yaml_text(text, empty, read);
}

}  // namespace sluice
