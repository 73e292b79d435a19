// postgres_rate_coordinator.h: federation's RateCoordinator on PostgreSQL (libpq).
//
// What it is: each lease() and reconcile() is one transaction: pg_advisory_xact_lock on the key
// (calls on one key are serialised across every process), read the key's ledger, run the same
// C++ escrow core as every other coordinator (sluice/core/escrow.h), write the ledger back if it
// changed, commit. Coordinator time is the server's clock (clock_timestamp(), microseconds, read
// after the lock), or the caller's Clock in test mode; windows are on that clock.
//
// Tables, created on first use (CREATE TABLE IF NOT EXISTS) with the prefix `table_prefix`
// (default_options(): "sluice_fed"): <prefix>_ledger (one row per key), <prefix>_regions (one row
// per key and region) and <prefix>_origin (one row).
//
// State loss (sluice/core/escrow.h, rule 3): the origin row holds the coordinator time at which the
// tables were last found to have lost grants they may have acknowledged, and the server's WAL
// timeline then. A lease that finds no origin row, or one written on another timeline, writes
// the current time and timeline, and every key's window containing that time counts as spent
// (kStateLost) until it ends: new, truncated or recreated tables deny the rest of their first
// window, and so does a server that went back in its history — a standby promoted by a failover
// (an asynchronous one may lack the last grants) or a point-in-time recovery (both start a new
// timeline). A grant must be durable before its reply leaves: every transaction sets
// synchronous_commit on for itself (SET LOCAL), whatever the server's default, so a crash and
// restart of the same server loses nothing and says nothing (the server's fsync must be on, its
// default: with fsync off a machine crash can forget acknowledged commits). Not detected: a
// restore that brings an older copy of the data directory back on the same timeline (a file
// copy or a base backup started without archive recovery); after one, delete the origin row
// (DELETE FROM <prefix>_origin) so that the window it resumes in counts as spent. Tables from a
// version without the timeline column gain it on connect, and their first lease counts its
// window as spent.
//
// Clean-up: piggybacked on lease calls, at most once per 10 s of coordinator time per
// coordinator, in the lease's own transaction: up to 1000 keys idle for max(3 periods, 1 minute)
// are deleted (rows locked by another call are skipped, never waited for). Deleting an idle key
// changes no reply (its window has long ended; only a clock stepping back further than that is
// no longer held).
//
// Connection: one libpq connection, one call at a time; a broken connection is re-established
// on the next call. `conninfo` is passed to libpq as is. Every call is bounded by its timeout
// (statement_timeout and lock_timeout on the server, poll() with the deadline on the client):
// exceeding it yields kDeadlineExceeded; an unreachable server kUnavailable.
//
// Thread-safety: every member is safe to call concurrently (calls are serialised).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sluice/core/postgres_options.h"
#include "sluice/core/rate_coordinator.h"

namespace sluice {

class PostgresRateCoordinator final : public RateCoordinator {
 public:
  // PostgresOptions with this coordinator's table prefix, "sluice_fed" (conninfo empty).
  [[nodiscard]] static PostgresOptions default_options();

  // Connects and creates the tables if needed. `caller_clock` non-null: test mode (coordinator
  // time from that clock; it must outlive the coordinator).
  [[nodiscard]] static StatusOr<std::unique_ptr<PostgresRateCoordinator>> connect(
      PostgresOptions options, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects and creates the tables.
  [[nodiscard]] static StatusOr<std::unique_ptr<PostgresRateCoordinator>> open(
      PostgresOptions options, const Clock* caller_clock = nullptr);
  ~PostgresRateCoordinator() override;

  [[nodiscard]] StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                                           Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                                  Nanos window_start, std::uint64_t relinquished,
                                                  Nanos timeout) noexcept override;
  // SELECT 1 within the timeout.
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "postgres"; }

  struct Impl;

 private:
  explicit PostgresRateCoordinator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
