// postgres_options.h: how to reach a PostgreSQL coordinator
// (sluice/backends/postgres_coordinator.h).
//
// What it is: a plain value, apart from the coordinator itself, so that a config can name a
// PostgreSQL server without pulling in the PostgreSQL backend (library sluice::postgres, libpq),
// and the one rule for a table prefix, which the config loader and the backends both apply.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sluice {

struct PostgresOptions {
  // libpq connection string, e.g. "host=db port=5432 user=sluice dbname=sluice sslmode=require".
  std::string conninfo;
  // Prefix of the tables this coordinator creates and uses. Default "sluice_fleet".
  std::string table_prefix = "sluice_fleet";

  // The longest prefix each coordinator takes: its longest table name stays within
  // PostgreSQL's 63-byte identifiers (the fleet's "<prefix>_nodes", federation's
  // "<prefix>_regions").
  static constexpr std::size_t kFleetMaxPrefix = 57;
  static constexpr std::size_t kRateMaxPrefix = 55;
};

// Why `prefix` cannot prefix a coordinator's tables (it is spliced into SQL as an identifier):
// "must match [a-z_][a-z0-9_]* (at most <max_size> characters)"; empty when it can.
[[nodiscard]] std::string table_prefix_problem(std::string_view prefix, std::size_t max_size);

}  // namespace sluice
