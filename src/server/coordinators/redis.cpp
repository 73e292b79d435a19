// The `redis` coordinator backend (src/backends/redis): one Redis (6 or later) that every server
// of a fleet reaches. Its settings:
//   address: host:port            default 127.0.0.1:6379 ([v6]:port for IPv6)
//   username, password            AUTH (ACL user, or the legacy password alone)
//   database: 0..1048576          SELECT; default 0
//   key_prefix: text              the fleet's keys; default "sluice:fleet:"
//   connect_timeout: duration     default 1s
//   sentinels: [host:port, ...]   Redis Sentinels to ask for the primary, instead of address
//   master_name: name             the name they monitor it under (needed with sentinels)
//   sentinel_password             AUTH to the sentinels
// Federation's keys ("<prefix>fed:", or "sluice:fed:" beside the default prefix), the regional
// pool's ("<prefix>pool:", "sluice:pool:"), the shared rules' ("<prefix>rules:",
// "sluice:rules:") and shared rate limits' ("<prefix>rate:", "sluice:rate:") sit beside the
// fleet's. Two coordinators with one address, database and key
// prefix keep one set of records. It serves every role.
#include "server/coordinators.h"
#include "server/coordinators/connect.h"
#include "sluice/backends/redis_coordinator.h"
#include "sluice/backends/redis_rate_coordinator.h"
#include "sluice/backends/redis_regional_escrow.h"
#include "sluice/backends/redis_shared_rate.h"
#include "sluice/core/text.h"

namespace sluice::server {
namespace {

using coordinator_detail::has;

// `o`'s key prefix for another use of the same Redis: `beside` appended to a prefix of the
// user's, or `standalone` in place of the fleet's default.
RedisOptions prefixed(RedisOptions o, const std::string& standalone, const std::string& beside) {
  o.key_prefix = o.key_prefix == RedisOptions{}.key_prefix ? standalone : o.key_prefix + beside;
  return o;
}
RedisOptions rate_options(const RedisOptions& o) {
  return prefixed(o, RedisRateCoordinator::default_options().key_prefix, "fed:");
}
RedisOptions pool_options(const RedisOptions& o) {
  return prefixed(o, RedisRegionalEscrow::default_options().key_prefix, "pool:");
}
RedisOptions shared_rate_options(const RedisOptions& o) {
  return prefixed(o, RedisSharedRate::default_options().key_prefix, "rate:");
}
RedisOptions rules_options(const RedisOptions& o) {
  return prefixed(o, redis_shared_rules_options().key_prefix, "rules:");
}

void parse(ConfigSection& s, CoordinatorSpec& spec) {
  RedisOptions o;
  if (auto a = s.str("address")) {
    HostPort hp;
    if (parse_host_port(*a, hp).empty()) {
      o.host = hp.host;
      o.port = hp.port;
    } else {
      s.error("address", "must be host:port with a port in 1..65535, not '" + *a + "'");
    }
  }
  if (auto list = s.strings("sentinels")) {
    if (list->empty()) s.error("sentinels", "must name at least one sentinel (host:port)");
    for (const std::string& one : *list) {
      HostPort hp;
      if (parse_host_port(one, hp).empty())
        o.sentinels.push_back(RedisAddress{hp.host, hp.port});
      else
        s.error("sentinels", "each must be host:port with a port in 1..65535, not '" + one + "'");
    }
  }
  if (auto m = s.str("master_name")) {
    if (m->empty())
      s.error("master_name", "must not be empty");
    else
      o.master_name = *m;
  }
  if (auto p = s.str("sentinel_password")) o.sentinel_password = *p;
  if (!o.sentinels.empty() && s.has("address"))
    s.error("address", "names one server; with sentinels the primary is theirs to name");
  if (!o.sentinels.empty() && o.master_name.empty())
    s.error("master_name", "is needed with sentinels: the name they monitor the primary under");
  if (o.sentinels.empty() && !o.master_name.empty())
    s.error("master_name", "needs sentinels (the servers to ask for the primary)");
  if (auto d = s.duration("connect_timeout")) o.connect_timeout = *d;
  if (auto u = s.str("username")) o.username = *u;
  if (auto p = s.str("password")) o.password = *p;
  if (auto v = s.uint("database", 0, 1 << 20)) o.database = static_cast<int>(*v);
  if (auto k = s.str("key_prefix")) {
    if (k->empty())
      s.error("key_prefix", "must not be empty");
    else
      o.key_prefix = *k;
  }
  // One store: the server, or the primary the sentinels name (whatever its address now).
  const std::string where =
      o.sentinels.empty() ? o.host + ":" + std::to_string(o.port) : "sentinel:" + o.master_name;
  spec.store = where + "\n" + std::to_string(o.database) + "\n" + o.key_prefix;
  spec.options = std::move(o);
}

// The regional pool, connected when a federated policy first names the coordinator as its
// regional_escrow, opened to connect on its first call when the server cannot be reached now.
void offer_pool(NamedCoordinator& named, RedisOptions options, const Clock& clock) {
  auto stats = named.stats;
  named.offer_lazy<RegionalEscrow>(
      [options = std::move(options), &clock, stats]() -> StatusOr<std::shared_ptr<void>> {
        auto p = coordinator_detail::connect_or_open<RedisRegionalEscrow>(options);
        if (!p.ok()) return p.status();
        return std::shared_ptr<void>(
            std::shared_ptr<RegionalEscrow>(std::make_shared<TimedRegionalEscrow>(
                std::shared_ptr<RegionalEscrow>(std::move(p.value())), clock, stats)));
      });
}

}  // namespace

CoordinatorBackend redis_backend() {
  CoordinatorBackend b;
  b.name = "redis";
  b.roles = {CoordinatorRole::kConcurrency, CoordinatorRole::kRateBudget,
             CoordinatorRole::kRegionalEscrow, CoordinatorRole::kSharedRules,
             CoordinatorRole::kSharedRate};
  b.keys = {"address",         "username",  "password",    "database",         "key_prefix",
            "connect_timeout", "sentinels", "master_name", "sentinel_password"};
  b.parse = parse;
  b.connect = [](const std::string& name, const CoordinatorSpec& spec, const Clock&,
                 std::string& warning) {
    return coordinator_detail::connect_or_open<RedisCoordinator>(
        name, *spec.options_as<RedisOptions>(), spec.rules, warning);
  };
  b.offer = [](const CoordinatorSpec& spec, const Clock& clock, NamedCoordinator& named) {
    const RedisOptions& o = *spec.options_as<RedisOptions>();
    coordinator_detail::offer_rate<RedisRateCoordinator>(named, rate_options(o), clock);
    offer_pool(named, pool_options(o), clock);
    coordinator_detail::offer_shared_rate<RedisSharedRate>(named, shared_rate_options(o), clock);
    coordinator_detail::offer_rules<RedisOptions>(named, rules_options(o), &redis_shared_rules);
  };
  // open() checks the options and connects to nothing; the interface it returns is dropped.
  b.problems = [](const CoordinatorSpec& spec, const std::vector<CoordinatorRole>& roles) {
    const RedisOptions& o = *spec.options_as<RedisOptions>();
    std::vector<std::string> out;
    const auto check = [&](const Status& s, const std::string& what) {
      if (!s.ok()) out.push_back(what + s.message());
    };
    check(RedisCoordinator::open(o, spec.rules).status(), "");
    if (has(roles, CoordinatorRole::kRateBudget))
      check(RedisRateCoordinator::open(rate_options(o)).status(), "federation's keys: ");
    if (has(roles, CoordinatorRole::kRegionalEscrow))
      check(RedisRegionalEscrow::open(pool_options(o)).status(), "the regional pool's keys: ");
    if (has(roles, CoordinatorRole::kSharedRules))
      check(redis_shared_rules(rules_options(o)).status(), "the shared rules' keys: ");
    if (has(roles, CoordinatorRole::kSharedRate))
      check(RedisSharedRate::open(shared_rate_options(o)).status(), "shared rate limits' keys: ");
    return out;
  };
  return b;
}

}  // namespace sluice::server
