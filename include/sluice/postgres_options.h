// postgres_options.h: how to reach a PostgreSQL coordinator (sluice/postgres_coordinator.h).
//
// What it is: a plain value, apart from the coordinator itself, so that a config can name a
// PostgreSQL server without pulling in the PostgreSQL backend (library sluice::postgres, libpq).
#pragma once

#include <string>

namespace sluice {

struct PostgresOptions {
  // libpq connection string, e.g. "host=db port=5432 user=sluice dbname=sluice sslmode=require".
  std::string conninfo;
  // Prefix of the tables this coordinator creates and uses. Default "sluice_fleet".
  std::string table_prefix = "sluice_fleet";
};

}  // namespace sluice
