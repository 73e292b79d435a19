// postgres_shared_rate.h: shared rate limits' SharedRateStore on PostgreSQL (libpq).
//
// What it is: apply_many() is one transaction for a whole batch of calls, in two round trips:
// BEGIN, synchronous_commit on, pg_advisory_xact_lock on each key (in one order for every process,
// so two batches never deadlock), the origin row, the server's clock and the keys' rows; then,
// after the C++ core (sluice/core/shared_rate.h: apply) ran each call in order on those states,
// the changed rows written back and COMMIT. The replies are the memory store's, exactly (the same
// code decides them; the conformance test runs both on one sequence). apply() is a batch of one.
// Coordinator time is the server's clock (clock_timestamp(), microseconds), or the caller's Clock
// in test mode.
//
// Tables, created on first use with the prefix `table_prefix` (default_options(): "sluice_rate"):
// <prefix>_state (one row per key, strategy and period: lim, written_ns and the state's numbers as
// numeric columns; a GCRA state is tat * limit, 128 bits) and <prefix>_origin (one row).
//
// State loss: as the federation coordinator on PostgreSQL (postgres_rate_coordinator.h): the
// origin row holds the time the tables were last found to have lost writes and the WAL timeline
// then; no origin row, or another timeline (a promoted standby, a point-in-time recovery), makes
// now the origin, and every key's state written before it is raised to a spent key's. Every
// transaction sets synchronous_commit on, so a crash and restart of the same server loses nothing
// it acknowledged. adopt() writes the origin row with an origin long past, for tables no shared
// rate limit has used before.
//
// Clean-up: piggybacked on calls, at most once per 10 s of coordinator time, in their
// transaction: up to 1000 rows that decide like fresh keys (core/shared_rate.h: idle_at) are
// deleted, which changes no reply.
//
// Connection: one libpq connection, one batch at a time; every call bounded by its timeout.
//
// Thread-safety: every member is safe to call concurrently (calls are serialised).
#pragma once

#include <memory>
#include <string>

#include "sluice/core/postgres_options.h"
#include "sluice/core/shared_rate.h"

namespace sluice {

class PostgresSharedRate final : public SharedRateStore {
 public:
  // PostgresOptions with this store's table prefix, "sluice_rate" (conninfo empty).
  [[nodiscard]] static PostgresOptions default_options();
  // The longest table prefix it accepts (<prefix>_origin must fit PostgreSQL's 63 bytes).
  static constexpr std::size_t kMaxPrefix = 56;

  // Connects and creates the tables if needed. `caller_clock` non-null: test mode.
  [[nodiscard]] static StatusOr<std::unique_ptr<PostgresSharedRate>> connect(
      PostgresOptions options, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects and creates the tables.
  [[nodiscard]] static StatusOr<std::unique_ptr<PostgresSharedRate>> open(
      PostgresOptions options, const Clock* caller_clock = nullptr);
  ~PostgresSharedRate() override;

  [[nodiscard]] StatusOr<SharedRateReply> apply(std::string_view key,
                                                const SharedRateRequest& request,
                                                Nanos timeout) noexcept override;
  [[nodiscard]] std::vector<StatusOr<SharedRateReply>> apply_many(
      std::span<const SharedRateCall> calls, Nanos timeout) noexcept override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "postgres"; }

  // Writes the origin row with an origin at time 0 on the current timeline: no loss known.
  [[nodiscard]] Status adopt(Nanos timeout) noexcept override;

  struct Impl;

 private:
  explicit PostgresSharedRate(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
