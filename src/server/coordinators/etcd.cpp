// The `etcd` coordinator backend (src/backends/etcd): an etcd v3 cluster (3.4 or later) that every
// server of a fleet reaches over gRPC. Its settings:
//   endpoints: [host:port, ...]   the members' client addresses; default [127.0.0.1:2379]
//   username, password            etcd's authentication (both or neither)
//   key_prefix: text              the fleet's keys; default "sluice/fleet/"
//   connect_timeout: duration     how long a member may take to connect; default 1s
//   ca_file: path                 TLS to every member, verified against this CA (PEM)
//   cert_file, key_file: path     with ca_file: this client's certificate (--client-cert-auth)
//   max_clock_offset: duration    federation: the most any server's wall clock is off; default
//                                 100ms (sluice/backends/etcd_rate_coordinator.h)
// Federation's keys ("<prefix>fed/", or "sluice/fed/" beside the default prefix) and the shared
// rules' ("<prefix>rules/", or "sluice/rules/") sit beside the fleet's. Two coordinators with the
// same endpoints and key prefix keep one set of records. It serves the fleet, federation and a
// throttler's shared rules.
#include <algorithm>

#include "server/coordinators.h"
#include "server/coordinators/connect.h"
#include "sluice/backends/etcd_coordinator.h"
#include "sluice/backends/etcd_rate_coordinator.h"
#include "sluice/backends/shared_rules.h"
#include "sluice/core/etcd_options.h"
#include "sluice/core/text.h"

namespace sluice::server {
namespace {

using coordinator_detail::has;

// `o` for another use of the same cluster: `beside` appended to a prefix of the user's, or
// `standalone` in place of the fleet's default.
EtcdOptions prefixed(EtcdOptions o, const std::string& standalone, const std::string& beside) {
  o.key_prefix = o.key_prefix == EtcdOptions{}.key_prefix ? standalone : o.key_prefix + beside;
  return o;
}
EtcdOptions rules_options(const EtcdOptions& o) {
  return prefixed(o, etcd_shared_rules_options().key_prefix, "rules/");
}
EtcdOptions rate_options(const EtcdOptions& o) {
  return prefixed(o, EtcdRateCoordinator::default_options().key_prefix, "fed/");
}

void parse(ConfigSection& s, CoordinatorSpec& spec) {
  EtcdOptions o;
  if (auto list = s.strings("endpoints")) {
    if (list->empty()) s.error("endpoints", "must name at least one member (host:port)");
    o.endpoints.clear();
    for (const std::string& one : *list) {
      HostPort hp;
      if (parse_host_port(one, hp).empty())
        o.endpoints.push_back(one);
      else
        s.error("endpoints", "each must be host:port with a port in 1..65535, not '" + one + "'");
    }
  }
  if (auto u = s.str("username")) o.username = *u;
  if (auto p = s.str("password")) o.password = *p;
  if (o.username.empty() != o.password.empty())
    s.error(o.username.empty() ? "username" : "password",
            "etcd's authentication needs both username and password");
  if (auto d = s.duration("connect_timeout")) o.connect_timeout = *d;
  if (auto f = s.str("ca_file")) o.ca_file = *f;
  if (auto f = s.str("cert_file")) o.cert_file = *f;
  if (auto f = s.str("key_file")) o.key_file = *f;
  if (auto d = s.duration("max_clock_offset")) o.max_clock_offset = *d;
  if (auto k = s.str("key_prefix")) {
    if (k->empty())
      s.error("key_prefix", "must not be empty");
    else
      o.key_prefix = *k;
  }
  // One store: the cluster (its members, in any order) and the prefix.
  std::vector<std::string> members = o.endpoints;
  std::sort(members.begin(), members.end());
  std::string where;
  for (const std::string& e : members) where += e + ",";
  spec.store = where + "\n" + o.key_prefix;
  spec.options = std::move(o);
}

}  // namespace

CoordinatorBackend etcd_backend() {
  CoordinatorBackend b;
  b.name = "etcd";
  b.roles = {CoordinatorRole::kConcurrency, CoordinatorRole::kRateBudget,
             CoordinatorRole::kSharedRules};
  b.keys = {"endpoints", "username",  "password", "key_prefix",      "connect_timeout",
            "ca_file",   "cert_file", "key_file", "max_clock_offset"};
  b.parse = parse;
  b.connect = [](const std::string& name, const CoordinatorSpec& spec, const Clock&,
                 std::string& warning) {
    return coordinator_detail::connect_or_open<EtcdCoordinator>(
        name, *spec.options_as<EtcdOptions>(), spec.rules, warning);
  };
  b.offer = [](const CoordinatorSpec& spec, const Clock& clock, NamedCoordinator& named) {
    const EtcdOptions& o = *spec.options_as<EtcdOptions>();
    coordinator_detail::offer_rate<EtcdRateCoordinator>(named, rate_options(o), clock);
    coordinator_detail::offer_rules<EtcdOptions>(named, rules_options(o), &etcd_shared_rules);
  };
  // open() checks the options and connects to nothing; the interface it returns is dropped.
  b.problems = [](const CoordinatorSpec& spec, const std::vector<CoordinatorRole>& roles) {
    const EtcdOptions& o = *spec.options_as<EtcdOptions>();
    std::vector<std::string> out;
    if (Status s = EtcdCoordinator::open(o, spec.rules).status(); !s.ok())
      out.push_back(s.message());
    // The same cluster's options: only what federation adds is checked again.
    if (out.empty() && has(roles, CoordinatorRole::kRateBudget))
      if (Status s = EtcdRateCoordinator::open(rate_options(o)).status(); !s.ok())
        out.push_back("federation's keys: " + s.message());
    return out;
  };
  return b;
}

}  // namespace sluice::server
