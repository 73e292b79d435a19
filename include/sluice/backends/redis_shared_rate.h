// redis_shared_rate.h: shared rate limits' SharedRateStore on one Redis server (hiredis).
//
// What it is: apply() is one EVALSHA of one Lua script that transcribes sluice/core/shared_rate.h's
// apply() rule for rule (src/backends/redis/shared_rate_script.cpp): the fixed window, the sliding
// window and GCRA with the local strategies' exact arithmetic, the carry to a new limit and the
// raise after a loss. Replies are the same as the memory store's for the same sequence of calls at
// the same times (the conformance test, on a real Redis), which are the local strategies' own.
// Coordinator time is Redis TIME read inside the script, or the caller's Clock in test mode
// (truncated to the microsecond). apply_many() sends up to 64 calls per script call, the calls
// pipelined (one round trip for all).
//
// Cost: one EVALSHA per batch of up to 64 calls, which runs INFO stats and GET on the two markers
// once, then per call a GET of the key and, when the call changes its state (an admitted check, a
// refund, a charge), a SET ... PX: 2.1 Redis commands per admitted check at ~25 calls a batch
// (bench/README.md). A refused check, or a peek, writes nothing.
//
// Keys: a key's state is one string, "<key_prefix>{<key>}<strategy>/<period_us>" (41 bytes packed
// with struct.pack: the layout, and how to read it, are in the script's source), that expires a
// second after it decides like a fresh key (core/shared_rate.h: idle_at; ten minutes in test
// mode). key_prefix must be neither the fleet's nor the federation's (default_options():
// "sluice:rate:").
//
// State loss: the origin and server markers ("<key_prefix>origin", "<key_prefix>server") as the
// federation coordinator keeps them (redis_rate_coordinator.h): a Redis found empty of them, or
// restarted (another run_id, whatever it reloaded), or that evicted keys, makes now the origin,
// and every key's state written before it is raised to a spent key's (shared_rate.h). So no key
// admits more than its rule through a restart from an RDB snapshot, an AOF, no persistence, or a
// failover. The first call to a new Redis (or a new key_prefix) makes an origin too: for up to one
// idle_within of each rule, keys are refused as if spent. adopt() tells the store that a Redis is
// new (it writes the markers as the current server's, with an origin long past), for an operator
// who knows that no shared rate limit has used it before, and for tests.
//
// Rules: the period must be a whole number of microseconds; a sliding window's limit * period_us
// and a GCRA rule's burst * period_us must be at most 2^50 (1.1e15: e.g. 10,000 per day, or
// 1,000,000 per 18 minutes), so that the script's numbers stay exact (Lua doubles); rule_error()
// says which field is out of range, and the `rate` kind refuses such a policy when it loads.
// Counts and debts that charges pile up past the limit saturate at 2^52 (fixed window),
// min(2^43, 2^51 / period_us) (sliding window) and 2^51 us * limit (GCRA): the overdraft a charge
// reports beyond those is the saturated one.
//
// Eviction would forget states: connect (and every reconnect) refuses a maxmemory-policy other than
// noeviction, as the federation coordinator does.
//
// Connections: two, one call at a time on each (as the federation coordinator's). Every call is
// bounded by its timeout, the wait for a connection included.
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <memory>
#include <string>

#include "sluice/core/redis_options.h"
#include "sluice/core/shared_rate.h"

namespace sluice {

class RedisSharedRate final : public SharedRateStore {
 public:
  // RedisOptions with this store's key prefix, "sluice:rate:".
  [[nodiscard]] static RedisOptions default_options();

  // Connects, authenticates, checks maxmemory-policy and loads the script. `caller_clock`
  // non-null: test mode (it must outlive the store).
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisSharedRate>> connect(
      RedisOptions options, const Clock* caller_clock = nullptr);
  // Checks the options only: the first call connects.
  [[nodiscard]] static StatusOr<std::unique_ptr<RedisSharedRate>> open(
      RedisOptions options, const Clock* caller_clock = nullptr);
  ~RedisSharedRate() override;

  [[nodiscard]] StatusOr<SharedRateReply> apply(std::string_view key,
                                                const SharedRateRequest& request,
                                                Nanos timeout) noexcept override;
  [[nodiscard]] std::vector<StatusOr<SharedRateReply>> apply_many(
      std::span<const SharedRateCall> calls, Nanos timeout) noexcept override;
  [[nodiscard]] std::string rule_error(const RateRule& rule) const override;
  [[nodiscard]] Status health(Nanos timeout) noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "redis"; }

  // Writes the markers as the connected server's, with the origin at time 0: no loss known. For a
  // Redis no shared rate limit has used before (with this key_prefix); on one that did, it forgets
  // that a restart may have lost their states.
  [[nodiscard]] Status adopt(Nanos timeout) noexcept override;

  // The script (Lua).
  [[nodiscard]] static const std::string& script();

  struct Impl;

 private:
  explicit RedisSharedRate(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
