// redis_rate_coordinator.h: federation's RateCoordinator on one Redis server (hiredis).
//
// What it is: lease() and reconcile() are each one EVALSHA of one Lua script (a mode argument
// picks the rule) that transcribes the escrow core of sluice/escrow.h rule for rule: the same
// windows, taper, running totals per (region, window), clock_high and statuses; the conformance
// test replays one sequence through it, the memory coordinator and the PostgreSQL one and
// requires identical replies. Coordinator time is Redis TIME read inside the script (Redis 5 and
// later replicate a script's effects, so a script may read the clock and then write), or the
// caller's Clock in test mode. Windows are on that clock.
//
// Keys: a key's ledger is one hash, "<key_prefix>{<key>}" (one hash slot per key); its TTL is
// max(3 periods, 1 minute) from the last call, so an idle key disappears, which changes no reply
// (its window has long ended; only a clock stepping back further than that is no longer held).
// key_prefix must not be the fleet coordinator's: default_options() gives "sluice:fed:", and
// the fleet's default "sluice:fleet:" is refused (the two scripts would share hashes).
//
// State loss (sluice/escrow.h, rule 3): the marker key "<key_prefix>origin" (no TTL) holds the
// coordinator time at which this Redis was first found without it. A lease that finds no marker
// writes one with the current time, and every key's window containing that time counts as spent
// (kStateLost) until it ends. So a fresh, flushed or restarted Redis without persistence DENIES
// THE REST OF ITS FIRST WINDOW for every key: it cannot know what it had granted before. A
// Redis that keeps its data (RDB/AOF) keeps the marker and loses nothing. The marker is a
// second key in the script: the coordinator needs one Redis primary, not a Cluster. A failover
// to a replica that missed recent writes is a state loss this marker cannot see.
//
// Eviction would lose grants silently: connect (and every reconnect) reads
// `CONFIG GET maxmemory-policy` and refuses anything but noeviction (kFailedPrecondition naming
// the setting). Where CONFIG is renamed or not allowed for the user, the connection is refused
// too, with how to allow the check.
//
// Numbers in the script are Lua doubles, exact below 2^53: times are whole microseconds (Redis's
// resolution; in test mode the caller's clock is truncated to the microsecond), so a period
// must be a whole number of microseconds and a reconcile's window_start a window this
// coordinator leased; limit is at most 2^53 (kInvalidArgument naming the field otherwise).
//
// Connection: one hiredis connection, one call at a time; a broken connection is re-established
// on the next call (AUTH, SELECT, the maxmemory-policy check, SCRIPT LOAD). Every call is bounded
// by its timeout: a hanging server yields kDeadlineExceeded, an unreachable one kUnavailable.
// NOSCRIPT (a restarted or flushed server) loads the script again and retries once.
//
// Thread-safety: every member is safe to call concurrently (calls are serialised).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sluice/rate_coordinator.h"
#include "sluice/redis_options.h"

namespace sluice {

class RedisRateCoordinator final : public RateCoordinator {
 public:
  // RedisOptions with this coordinator's key prefix, "sluice:fed:".
  [[nodiscard]] static RedisOptions default_options();

  // Connects, authenticates, checks maxmemory-policy and loads the script. `caller_clock`
  // non-null: test mode (coordinator time from that clock; it must outlive the coordinator).
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisRateCoordinator>> connect(
      RedisOptions options, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects (as every call after a lost connection
  // does), so a coordinator can be built while the server is down.
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisRateCoordinator>> open(
      RedisOptions options, const Clock* caller_clock = nullptr);
  ~RedisRateCoordinator() override;

  [[nodiscard]] StatusOr<LeaseReply> lease(std::string_view key, const LeaseRequest& request,
                                           Nanos timeout) noexcept override;
  // Pipelined: every lease written before any reply is read, one round trip for all.
  [[nodiscard]] std::vector<StatusOr<LeaseReply>> lease_many(std::span<const LeaseCall> calls,
                                                             Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<std::uint64_t> reconcile(std::string_view key, std::string_view region,
                                                  Nanos window_start, std::uint64_t relinquished,
                                                  Nanos timeout) noexcept override;
  // PING within the timeout.
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "redis"; }

  // The script (Lua), e.g. for redis-benchmark.
  [[nodiscard]] static const std::string& script();

  struct Impl;

 private:
  explicit RedisRateCoordinator(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
