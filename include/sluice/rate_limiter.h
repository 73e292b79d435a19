// rate_limiter.h: per-key rate limits (fixed window, sliding window, GCRA), local.
//
// What it is: RateLimiter is the interface a policy checks a key against (the server's Check);
// make_rate_limiter() builds the local one: one RateRule for every key, the key's state in a
// sharded hash map (the shard picked by the key's hash, each shard behind its own mutex, so a
// hot key serialises only the keys of its shard), the decision made by the pure strategy
// functions of sluice/rate_strategy.h.
//
// Memory: a key's state is 8 bytes (GCRA), 16 (fixed window) or 24 (sliding window), plus the
// key itself and the hash map's node (about 64 bytes with a short key). A key whose state decides
// exactly like a fresh one (its window is over, its bucket is full again) is idle and may be
// forgotten without changing any decision: each shard sweeps its idle keys whenever it has
// doubled since its last sweep, so memory follows the keys active within one period, however
// many distinct keys come and go (amortised O(1) per new key).
//
// Time: check(key, hits) reads the limiter's Clock once; check(key, hits, now) takes the time
// from the caller, so a server can read the clock once per request or per batch.
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "sluice/clock.h"
#include "sluice/rate_strategy.h"
#include "sluice/status.h"

namespace sluice {

class RateLimiter {
 public:
  virtual ~RateLimiter() = default;
  // Admits `hits` for `key` (all or nothing) and returns the decision. hits == 0 consumes
  // nothing and reports the key's allowance.
  [[nodiscard]] virtual RateDecision check(std::string_view key, std::uint64_t hits = 1) = 0;
  [[nodiscard]] virtual RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) = 0;
  // The decision `check` would give, without consuming anything.
  [[nodiscard]] virtual RateDecision peek(std::string_view key, std::uint64_t hits,
                                          Nanos now) const = 0;
  // Gives back `hits` a check of `key` at `now` admitted (sluice/rate_strategy.h: refund). A caller
  // rolling back an all-or-nothing batch uses it; between the check and the refund, other
  // callers see the hits as spent (they may be refused, never over-admitted).
  virtual void refund(std::string_view key, std::uint64_t hits, Nanos now) = 0;
  [[nodiscard]] virtual const RateRule& rule() const noexcept = 0;
  // Keys held now (idle ones not yet swept included).
  [[nodiscard]] virtual std::size_t keys() const = 0;
};

struct RateLimiterOptions {
  RateRule rule;
  // Number of shards; a power of two in [1, 4096]. Default 64.
  std::size_t shards = 64;

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

// Bytes of per-key state of a strategy (not counting the key and the map's node).
[[nodiscard]] std::size_t state_bytes(RateStrategy strategy) noexcept;

// `clock` must outlive the limiter.
[[nodiscard]] StatusOr<std::unique_ptr<RateLimiter>> make_rate_limiter(
    const RateLimiterOptions& options, const Clock& clock);

}  // namespace sluice
