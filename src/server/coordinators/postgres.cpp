// The `postgres` coordinator backend (src/backends/postgres): one PostgreSQL that every server of
// a fleet reaches. Its settings:
//   conninfo: text                required: libpq's (keywords or a URI; sslmode passes through)
//   table_prefix: name            the fleet's tables; default sluice_fleet; [a-z_][a-z0-9_]*, at
//                                 most 57 characters
// Federation's tables ("<prefix>_fed", or "sluice_fed" beside the default prefix; a federated
// policy on it needs that to fit federation's 55), the shared rules' table ("<prefix>_rules",
// or "sluice_rules") and shared rate limits' tables ("<prefix>_rate", or "sluice_rate"; at most
// 56) sit beside the fleet's. Two coordinators with one conninfo and table prefix keep one set
// of records. It serves every role but federation's regional pool.
#include "server/coordinators.h"
#include "server/coordinators/connect.h"
#include "sluice/backends/postgres_coordinator.h"
#include "sluice/backends/postgres_rate_coordinator.h"
#include "sluice/backends/postgres_shared_rate.h"
#include "sluice/core/postgres_options.h"

namespace sluice::server {
namespace {

using coordinator_detail::has;

// `o`'s table prefix for another use of the same database: `beside` appended to a prefix of the
// user's, or `standalone` in place of the fleet's default.
PostgresOptions prefixed(PostgresOptions o, const std::string& standalone,
                         const std::string& beside) {
  o.table_prefix =
      o.table_prefix == PostgresOptions{}.table_prefix ? standalone : o.table_prefix + beside;
  return o;
}
PostgresOptions rate_options(const PostgresOptions& o) {
  return prefixed(o, PostgresRateCoordinator::default_options().table_prefix, "_fed");
}
PostgresOptions shared_rate_options(const PostgresOptions& o) {
  return prefixed(o, PostgresSharedRate::default_options().table_prefix, "_rate");
}
PostgresOptions rules_options(const PostgresOptions& o) {
  return prefixed(o, postgres_shared_rules_options().table_prefix, "_rules");
}

void parse(ConfigSection& s, CoordinatorSpec& spec) {
  PostgresOptions o;
  if (auto c = s.str("conninfo", true)) o.conninfo = *c;
  if (auto p = s.str("table_prefix")) {
    // The fleet's rule here; federation's longer table names are checked where a federated
    // policy names the coordinator (the server, before it connects: problems below).
    if (std::string why = table_prefix_problem(*p, PostgresOptions::kFleetMaxPrefix); !why.empty())
      s.error("table_prefix", why + ", not '" + *p + "'");
    else
      o.table_prefix = *p;
  }
  spec.store = o.conninfo + "\n" + o.table_prefix;
  spec.options = std::move(o);
}

}  // namespace

CoordinatorBackend postgres_backend() {
  CoordinatorBackend b;
  b.name = "postgres";
  b.roles = {CoordinatorRole::kConcurrency, CoordinatorRole::kRateBudget,
             CoordinatorRole::kSharedRules, CoordinatorRole::kSharedRate};
  b.keys = {"conninfo", "table_prefix"};
  b.parse = parse;
  b.connect = [](const std::string& name, const CoordinatorSpec& spec, const Clock&,
                 std::string& warning) {
    return coordinator_detail::connect_or_open<PostgresCoordinator>(
        name, *spec.options_as<PostgresOptions>(), spec.rules, warning);
  };
  b.offer = [](const CoordinatorSpec& spec, const Clock& clock, NamedCoordinator& named) {
    const PostgresOptions& o = *spec.options_as<PostgresOptions>();
    coordinator_detail::offer_rate<PostgresRateCoordinator>(named, rate_options(o), clock);
    coordinator_detail::offer_rules<PostgresOptions>(named, rules_options(o),
                                                     &postgres_shared_rules);
    coordinator_detail::offer_shared_rate<PostgresSharedRate>(named, shared_rate_options(o), clock);
  };
  // open() checks the options and connects to nothing; the interface it returns is dropped.
  b.problems = [](const CoordinatorSpec& spec, const std::vector<CoordinatorRole>& roles) {
    const PostgresOptions& o = *spec.options_as<PostgresOptions>();
    std::vector<std::string> out;
    const auto check = [&](const Status& s, const std::string& what) {
      if (!s.ok()) out.push_back(what + s.message());
    };
    check(PostgresCoordinator::open(o, spec.rules).status(), "");
    if (has(roles, CoordinatorRole::kRateBudget))
      check(
          PostgresRateCoordinator::open(rate_options(o)).status(),
          "federation's tables (prefix " + rate_options(o).table_prefix + ", from table_prefix): ");
    if (has(roles, CoordinatorRole::kSharedRules))
      check(postgres_shared_rules(rules_options(o)).status(),
            "the shared rules' table (" + rules_options(o).table_prefix + ", from table_prefix): ");
    if (has(roles, CoordinatorRole::kSharedRate))
      check(PostgresSharedRate::open(shared_rate_options(o)).status(),
            "shared rate limits' tables (prefix " + shared_rate_options(o).table_prefix +
                ", from table_prefix): ");
    return out;
  };
  return b;
}

}  // namespace sluice::server
