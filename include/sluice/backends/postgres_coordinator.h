// postgres_coordinator.h: a ConcurrencyCoordinator on PostgreSQL (libpq).
//
// What it is: each heartbeat is one transaction: pg_advisory_xact_lock on the key (so calls on
// one key are serialised across every process), read the key's rows, run the same C++
// heartbeat core as every other coordinator (sluice/core/fleet.h), write the changed rows back,
// commit. The tables are created on first use (CREATE TABLE IF NOT EXISTS). Coordinator time
// is the server's clock (clock_timestamp(), in microseconds), or the caller's Clock in test
// mode so that a conformance test can replay one sequence through every backend.
//
// Connection: one libpq connection per coordinator, guarded by a mutex; a broken connection is
// re-established on the next call. `conninfo` is passed to libpq as is (sslmode, passwords,
// service files). Every call is bounded by its timeout (statement_timeout and
// lock_timeout on the server, plus a client-side wait); exceeding it yields kDeadlineExceeded.
//
// Thread-safety: every member is safe to call concurrently (calls are serialised).
#pragma once

#include <memory>
#include <string>

#include "sluice/core/coordinator.h"
#include "sluice/core/postgres_options.h"

namespace sluice {

class PostgresCoordinator final : public ConcurrencyCoordinator {
 public:
  // Connects and creates the tables if needed. `caller_clock` non-null: test mode (coordinator
  // time from that clock; it must outlive the coordinator).
  [[nodiscard]] static StatusOr<std::unique_ptr<PostgresCoordinator>> connect(
      PostgresOptions options, CoordinatorConfig config, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects and creates the tables (as every call
  // after a lost connection does), so a coordinator can be built while the server is down.
  [[nodiscard]] static StatusOr<std::unique_ptr<PostgresCoordinator>> open(
      PostgresOptions options, CoordinatorConfig config, const Clock* caller_clock = nullptr);
  ~PostgresCoordinator() override;

  [[nodiscard]] StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                                          Nanos timeout) noexcept override;
  [[nodiscard]] Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
                             Nanos timeout) noexcept override;
  [[nodiscard]] const CoordinatorConfig& config() const noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "postgres"; }

  struct Impl;

 private:
  explicit PostgresCoordinator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
