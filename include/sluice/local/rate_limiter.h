// rate_limiter.h: per-key rate limits (fixed window, sliding window, GCRA), local.
//
// What it is: RateLimiter is the interface a policy checks a key against (the server's Check);
// make_rate_limiter() builds the local one: one RateRule for every key, the key's state in a
// sharded hash map (the shard picked by the key's hash, each shard behind its own mutex, so a
// hot key serialises only the keys of its shard), the decision made by the pure strategy
// functions of sluice/core/rate_strategy.h.
//
// Memory: a key's state is 16 bytes (GCRA, fixed window) or 24 (sliding window), plus the key
// itself and the hash map's node (about 80 bytes with a short key). A key whose state decides
// exactly like a fresh one (its window is over, its bucket is full again) is idle and carries no
// information: forgetting it changes no decision. Idle keys go
//   - on growth: a shard sweeps its idle keys whenever it has doubled since its last sweep
//     (amortised O(1) per new key, on the thread that adds the key), and
//   - on time: sweep(now) sweeps every shard, a slice of 1024 hash buckets (about as many keys)
//     per hold of the shard's lock, so a check waits for at most one slice (a fraction of a
//     millisecond), shrinks a shard's hash table when it has emptied, and, after a sweep that
//     forgot kTrimAfterKeys or more keys, gives freed memory back to the system (malloc_trim).
//     The owner calls it periodically (the server's rate policy: every idle_within(rule),
//     clamped to [1 s, 60 s]), so memory follows the keys that still count even when traffic
//     stops. A million keys take about 100 MB and a sweep of them a few hundred ms of one
//     thread.
// Key cap: at most max_keys keys are held. A check that would add a key beyond it first lets
// its shard sweep its idle keys (at most once per kCapSweepGap per shard, so a flood of new keys
// cannot turn every check into a scan); if there is still no room, the new key is refused
// (RateDecision::key_capacity, retry_after = until its shard may sweep again, at least 1 ns).
// Refusing is the only safe answer: every key held is not idle, i.e. it has spent part of its
// budget, and evicting it would hand that budget back (over-admission). Keys already held are
// never refused for the cap, and a check of 0 hits (which stores nothing) is answered as usual.
// peek answers a new key at the cap with the same refusal (without sweeping: the check itself
// may find room).
//
// Time: check(key, hits) reads the limiter's Clock once; check(key, hits, now) takes the time
// from the caller, so a server can read the clock once per request or per batch.
//
// Thread-safety: every member is safe to call concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/core/status.h"

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
  // Gives back `hits` a check of `key` at `now` admitted (sluice/core/rate_strategy.h: refund). A
  // caller rolling back an all-or-nothing batch uses it; between the check and the refund, other
  // callers see the hits as spent (they may be refused, never over-admitted).
  virtual void refund(std::string_view key, std::uint64_t hits, Nanos now) = 0;
  // Charges `hits` to `key` after the fact, whatever it has left (sluice/core/rate_strategy.h:
  // charge): a charge may take the key past its limit, and its later checks wait that out. A
  // new key at the key cap is not recorded (RateCharge::recorded false, "key_capacity"; the
  // shard sweeps first, as a check would).
  [[nodiscard]] virtual RateCharge charge(std::string_view key, std::uint64_t hits, Nanos now) = 0;
  // The rule it decides by now (a copy: reconfigure may replace it).
  [[nodiscard]] virtual RateRule rule() const = 0;
  [[nodiscard]] virtual std::size_t max_keys() const noexcept = 0;
  // Keys held now (idle ones not yet swept included). Lock-free.
  [[nodiscard]] virtual std::size_t keys() const noexcept = 0;
  // Forgets every key idle at `now` (see Memory above); returns how many.
  virtual std::size_t sweep(Nanos now) = 0;
  // Takes `to` and `max_keys` in place, keeping every key's state (sluice/core/rate_strategy.h:
  // carry): each shard in turn converts its keys at the limiter's clock and decides by `to` from
  // then on. Requires can_carry(rule(), to), `to` valid and max_keys >= 1 (nothing is done
  // otherwise). A lower max_keys refuses new keys until enough have gone; none is evicted.
  virtual void reconfigure(const RateRule& to, std::size_t max_keys) noexcept = 0;
};

// A sweep that forgets this many keys or more gives freed memory back to the system.
inline constexpr std::size_t kTrimAfterKeys = 65536;
// At the key cap, a shard sweeps itself on a new key at most this often.
inline constexpr Nanos kCapSweepGap = std::chrono::seconds(1);
inline constexpr std::size_t kDefaultMaxKeys = 1'000'000;

struct RateLimiterOptions {
  RateRule rule;
  // Number of shards; a power of two in [1, 4096]. Default 64.
  std::size_t shards = 64;
  // The most keys held at once, >= 1 (see Key cap above). Default 1,000,000.
  std::size_t max_keys = kDefaultMaxKeys;

  // Empty when valid, else what is wrong, naming the field.
  [[nodiscard]] std::string validate() const;
};

// Bytes of per-key state of a strategy (not counting the key and the map's node).
[[nodiscard]] std::size_t state_bytes(RateStrategy strategy) noexcept;

// `clock` must outlive the limiter.
[[nodiscard]] StatusOr<std::unique_ptr<RateLimiter>> make_rate_limiter(
    const RateLimiterOptions& options, const Clock& clock);

}  // namespace sluice
