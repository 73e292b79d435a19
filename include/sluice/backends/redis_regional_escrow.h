// redis_regional_escrow.h: federation's RegionalEscrow (regional pool, L2) on one Redis server
// (hiredis), shared by the processes of one region.
//
// What it is: take(), refill() and release() are each one EVALSHA of one Lua script (a mode
// argument picks the rule) that transcribes the pool rules of sluice/core/escrow.h (P1-P3) rule for
// rule; the conformance test replays one sequence through it and the memory pool and requires
// identical replies. Pool time is Redis TIME read inside the script, or the caller's Clock in
// test mode (truncated to the microsecond). Expiries handed in are rounded down to the
// microsecond (earlier, so never later than the window's end). A Redis whose clock steps back
// stands still at the latest time it showed instead: pool escrow would then outlive its window
// by the step, so the pool's Redis needs a clock that does not step (NTP slewing, as usual).
//
// Keys: a key's pool is one hash, "<key_prefix>{<key>}", default prefix "sluice:pool:" (the
// fleet's "sluice:fleet:" is refused). It expires an hour after its own expiry (the
// regional-only outage mode serves a balance past its window until then), or an hour after the
// last call for an empty pool. Unlike the global coordinator, the pool does not require
// noeviction: an evicted or lost pool loses the units it held (that region serves less), never
// lets one be spent twice or outside its window.
//
// Connection: one hiredis connection, one call at a time, re-established on the next call after
// a failure; every call is bounded by its timeout; NOSCRIPT loads the script again and retries
// once (src/backends/redis/redis_connection.h).
//
// Thread-safety: every member is safe to call concurrently (calls are serialised).
#pragma once

#include <memory>
#include <string>

#include "sluice/core/redis_options.h"
#include "sluice/core/regional_escrow.h"

namespace sluice {

class RedisRegionalEscrow final : public RegionalEscrow {
 public:
  // RedisOptions with this pool's key prefix, "sluice:pool:".
  [[nodiscard]] static RedisOptions default_options();

  // Connects, authenticates and loads the script. `caller_clock` non-null: test mode (pool time
  // from that clock; it must outlive the pool).
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisRegionalEscrow>> connect(
      RedisOptions options, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects.
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisRegionalEscrow>> open(
      RedisOptions options, const Clock* caller_clock = nullptr);
  ~RedisRegionalEscrow() override;

  [[nodiscard]] StatusOr<PoolReply> take(std::string_view key, std::uint64_t want,
                                         Nanos refill_hold, bool past_expiry,
                                         Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<PoolReply> refill(std::string_view key, Nanos window_start,
                                           std::uint64_t units, Nanos expires_at,
                                           Nanos timeout) noexcept override;
  [[nodiscard]] StatusOr<PoolReply> release(std::string_view key, Nanos window_start,
                                            std::uint64_t units, Nanos timeout) noexcept override;
  // PING within the timeout.
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "redis"; }

  struct Impl;

 private:
  explicit RedisRegionalEscrow(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
