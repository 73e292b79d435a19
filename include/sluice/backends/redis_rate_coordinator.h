// redis_rate_coordinator.h: federation's RateCoordinator on one Redis server (hiredis).
//
// What it is: lease() and reconcile() are each one EVALSHA of one Lua script (a mode argument
// picks the rule) that transcribes the escrow core of sluice/core/escrow.h rule for rule: the same
// windows, taper, running totals per (region, window), clock_high and statuses; the conformance
// test replays one sequence through it, the memory coordinator and the PostgreSQL one and
// requires identical replies. Coordinator time is Redis TIME read inside the script (Redis 5 and
// later replicate a script's effects, so a script may read the clock and then write), or the
// caller's Clock in test mode. Windows are on that clock.
//
// Keys: a key's ledger is one string, "<key_prefix>{<key>}" (one hash slot per key), holding a
// MessagePack array (read it with EVAL "return cmsgpack.unpack(redis.call('GET', KEYS[1]))" 1
// <key>; the layout is in escrow_script.cpp). A lease of a key that has no ledger yet (a key's
// first in a window: every lease of a key checked less than once a window) is one command on it,
// SET ... NX GET PX; one of a key with a ledger two (that SET, which then writes nothing and
// returns the ledger, and SET ... PX). A server older than Redis 7.0, which refuses NX with GET, is
// served with GET and SET. A ledger left as a hash by an earlier version is read and rewritten. Its
// TTL is max(3 periods, 1 minute) from the last call, so an idle key disappears, which changes no
// reply (its window has long ended; only a clock stepping back further than that is no longer
// held). key_prefix must not be the fleet coordinator's: default_options() gives "sluice:fed:", and
// the fleet's default "sluice:fleet:" is refused (the two scripts would share keys).
//
// State loss (sluice/core/escrow.h, rule 3): the marker key "<key_prefix>origin" (no TTL) holds the
// coordinator time at which this Redis was last found to have lost grants it may have
// acknowledged, and "<key_prefix>server" (no TTL) the server as the last lease saw it: its
// run_id (read by the connection on every (re)connect: INFO server) and its evicted_keys count
// (read by the script: INFO stats). A lease writes the current time into the origin marker, and
// every key's window containing that time counts as spent (kStateLost) until it ends, when
//   - there is no origin marker: a fresh, flushed or emptied Redis (a restart without
//     persistence);
//   - the run_id is another: another server process. A restart that reloads an RDB snapshot
//     or an AOF may have lost the grants made after it (an RDB taken before them, an AOF with
//     appendfsync everysec through a machine crash, a truncated AOF), and a replica promoted by
//     a failover may lack the last writes its primary acknowledged. The coordinator cannot tell
//     a restart that lost nothing (appendfsync always, a clean SHUTDOWN) from one that did, so
//     EVERY RESTART OR FAILOVER OF THE REDIS DENIES THE REST OF THE WINDOW IT HAPPENS IN;
//   - the evicted_keys count has moved: keys were evicted (a ledger among them, perhaps),
//     whatever the maxmemory-policy now says.
// So Δ = 0 holds with Redis's default persistence (RDB snapshots), with AOF, without
// persistence, and through a failover to a replica, as long as the coordinator talks to the
// Redis directly: a proxy that keeps the client's connection open across a change of server
// hides the change (a restart or failover closes every direct connection, and the run_id is read
// again on the next one). The first lease after upgrading from a version without the server
// marker counts its window as spent too. The markers are two more keys in the script: the
// coordinator needs one Redis primary, not a Cluster.
//
// Eviction would lose grants silently: connect (and every reconnect) reads
// `CONFIG GET maxmemory-policy` and refuses anything but noeviction (kFailedPrecondition naming
// the setting); where CONFIG or INFO is renamed or not allowed for the user, the connection is
// refused too, with how to allow it. A policy changed while serving is caught by its effect:
// the first lease after an eviction counts the window as spent (above).
//
// Numbers in the script are Lua doubles, exact below 2^53: times are whole microseconds (Redis's
// resolution; in test mode the caller's clock is truncated to the microsecond), so a period
// must be a whole number of microseconds and a reconcile's window_start a window this
// coordinator leased; limit is at most 2^53 (kInvalidArgument naming the field otherwise).
//
// lease_many(): leases of one region and budget share a script call (up to 64; the markers are
// read once for them all, and a fresh ledger's lease, the same for every key that asks the same,
// is made once), the calls pipelined in one round trip.
//
// Connections: two hiredis connections, one call at a time on each; a call takes a free one, so
// that Redis has the next call to run while the last one's replies are read (connect() opens
// both). A broken connection is re-established on its next call (AUTH, SELECT, INFO server, the
// maxmemory-policy check, SCRIPT LOAD). Every call is bounded by its timeout, waiting for a
// connection included: a hanging server yields kDeadlineExceeded, an unreachable one
// kUnavailable. NOSCRIPT (a restarted or flushed server) loads the script again and retries once.
//
// Thread-safety: every member is safe to call concurrently (two calls at a time, the rest wait).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sluice/core/rate_coordinator.h"
#include "sluice/core/redis_options.h"

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
  // Up to 64 leases per script call (the server markers, INFO and TIME read once for them all,
  // each lease then exactly as lease() in order), the calls pipelined: one round trip for all.
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
