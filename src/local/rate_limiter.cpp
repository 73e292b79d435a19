#include "sluice/local/rate_limiter.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/string_map.h"

namespace sluice {
namespace {

constexpr std::size_t kMinSweep = 64;
// A shard's hash table is shrunk after a sweep that leaves it this many times too large.
constexpr std::size_t kShrinkFactor = 8;
// Buckets a timed sweep scans per hold of a shard's lock (about as many keys).
constexpr std::size_t kSweepBuckets = 1024;

template <class State>
class ShardedLimiter final : public RateLimiter {
 public:
  ShardedLimiter(const RateLimiterOptions& o, const Clock& clock)
      : clock_(clock),
        shards_(o.shards),
        mask_(o.shards - 1),
        max_keys_(o.max_keys),
        rule_(o.rule) {
    for (Shard& s : shards_) s.rule = o.rule;
  }

  RateDecision check(std::string_view key, std::uint64_t hits) override {
    return check(key, hits, clock_.now());
  }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    const std::size_t h = StringHash{}(key);
    Shard& shard = shards_[shard_of(h)];
    const std::lock_guard lock(shard.mu);
    now = shard.advance(now);
    auto it = shard.map.find(HashedKey{key, h});  // hashed once, for the shard and the map
    if (it != shard.map.end()) return decide(it->second, shard.rule, hits, now);
    State fresh;
    const RateDecision d = decide(fresh, shard.rule, hits, now);
    if (!is_idle(fresh, shard.rule, now)) {  // nothing to remember for a refused or empty request
      if (!reserve_key(shard, now)) return capacity_refusal(shard, d, now);
      shard.map.emplace(std::string(key), fresh);
      if (shard.map.size() >= shard.sweep_at) sweep_locked(shard, now);
    }
    return d;
  }

  RateCharge charge(std::string_view key, std::uint64_t hits, Nanos now) override {
    const std::size_t h = StringHash{}(key);
    Shard& shard = shards_[shard_of(h)];
    const std::lock_guard lock(shard.mu);
    now = shard.advance(now);
    if (auto it = shard.map.find(HashedKey{key, h}); it != shard.map.end())
      return sluice::charge(it->second, shard.rule, hits, now);
    State fresh;
    RateCharge c = sluice::charge(fresh, shard.rule, hits, now);
    if (is_idle(fresh, shard.rule, now)) return c;  // nothing to remember (no hit)
    if (!reserve_key(shard, now)) {
      State none;
      c = sluice::charge(none, shard.rule, 0, now);
      c.recorded = false;
      c.reason = "key_capacity";
      return c;
    }
    shard.map.emplace(std::string(key), fresh);
    if (shard.map.size() >= shard.sweep_at) sweep_locked(shard, now);
    return c;
  }

  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    const std::size_t h = StringHash{}(key);
    const Shard& shard = shards_[shard_of(h)];
    const std::lock_guard lock(shard.mu);
    now = std::max(now, shard.latest);
    if (auto it = shard.map.find(HashedKey{key, h}); it != shard.map.end()) {
      State s = it->second;
      return decide(s, shard.rule, hits, now, /*commit=*/false);
    }
    // A new key: at the cap, what check would answer unless its shard's sweep made room.
    State fresh;
    const RateDecision d = decide(fresh, shard.rule, hits, now);
    if (!is_idle(fresh, shard.rule, now) && keys() >= max_keys())
      return capacity_refusal(shard, d, now);
    return d;
  }

  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    const std::size_t h = StringHash{}(key);
    Shard& shard = shards_[shard_of(h)];
    const std::lock_guard lock(shard.mu);
    if (auto it = shard.map.find(HashedKey{key, h}); it != shard.map.end())
      sluice::refund(it->second, shard.rule, hits, now);
  }

  RateRule rule() const override {
    const std::lock_guard lock(rule_mu_);
    return rule_;
  }
  std::size_t max_keys() const noexcept override {
    return max_keys_.load(std::memory_order_relaxed);
  }
  std::size_t keys() const noexcept override { return keys_.load(std::memory_order_relaxed); }

  std::size_t sweep(Nanos now) override {
    std::size_t removed = 0;
    for (Shard& shard : shards_) {
      // kSweepBuckets buckets per hold of the lock, so a check waits for a slice, not the
      // shard. A table rehashed in between (by a new key) may make a slice skip or revisit a
      // few keys: a key skipped stays until a later sweep, one revisited is looked at twice.
      for (std::size_t b = 0;;) {
        const std::lock_guard lock(shard.mu);
        const Nanos at = shard.advance(now);
        const std::size_t end = std::min(b + kSweepBuckets, shard.map.bucket_count());
        for (; b < end; ++b) removed += sweep_bucket(shard, b, at);
        if (b < shard.map.bucket_count()) continue;
        shard.sweep_at = std::max(kMinSweep, 2 * shard.map.size());
        shard.swept_at = at;
        // A table sized for a crowd that has gone: rebuilt small (it allocates, here only).
        if (shard.map.bucket_count() > kShrinkFactor * std::max(kMinSweep, shard.map.size()))
          shard.map.rehash(0);
        break;
      }
    }
#if defined(__GLIBC__)
    if (removed >= kTrimAfterKeys) malloc_trim(0);
#endif
    return removed;
  }

  void reconfigure(const RateRule& to, std::size_t max_keys) noexcept override {
    if (!can_carry(rule(), to) || !to.validate().empty() || max_keys == 0) return;
    max_keys_.store(max_keys, std::memory_order_relaxed);
    const Nanos now = clock_.now();
    for (Shard& shard : shards_) {
      const std::lock_guard lock(shard.mu);
      const Nanos at = shard.advance(now);
      sweep_locked(shard, at);
      for (auto& [key, state] : shard.map) carry(state, shard.rule, to, at);
      shard.rule = to;
    }
    const std::lock_guard lock(rule_mu_);
    rule_ = to;
  }

 private:
  struct alignas(64) Shard {
    mutable std::mutex mu;
    StringMap<State> map;
    RateRule rule;  // what this shard decides by (all shards hold the same outside reconfigure)
    std::size_t sweep_at = kMinSweep;
    // The latest time a check of this shard decided at. Callers read the clock before taking
    // the lock, so a check can arrive with a time older than one already decided; it decides
    // at this time instead. Otherwise a window strategy would move a key back into a window
    // that has ended (losing the newer window's count), and a sweep would drop keys a late
    // check still counts: either way, over-admission at a window boundary. A sweep advances
    // it too, for the same reason.
    Nanos latest{INT64_MIN};
    Nanos swept_at{INT64_MIN};  // the last sweep's time; INT64_MIN: none yet
    Nanos advance(Nanos now) noexcept {
      latest = std::max(latest, now);
      return latest;
    }
  };

  // The high bits pick the shard; the map uses the whole hash.
  std::size_t shard_of(std::size_t h) const noexcept { return (h >> 20) & mask_; }

  // Room for one more key under the cap (one atomic add, undone when over). At the cap, the
  // shard may sweep first (at most once per kCapSweepGap).
  bool reserve_key(Shard& shard, Nanos now) {
    if (try_reserve()) return true;
    if (shard.swept_at.count() != INT64_MIN && now - shard.swept_at < kCapSweepGap) return false;
    sweep_locked(shard, now);
    return try_reserve();
  }
  bool try_reserve() noexcept {
    // Relaxed: the count is a bound, not a synchronisation point (each map has its lock).
    if (keys_.fetch_add(1, std::memory_order_relaxed) < max_keys_.load(std::memory_order_relaxed))
      return true;
    keys_.fetch_sub(1, std::memory_order_relaxed);
    return false;
  }

  RateDecision capacity_refusal(const Shard& shard, const RateDecision& fresh, Nanos now) const {
    RateDecision d;
    d.limit = fresh.limit;
    d.key_capacity = true;
    d.reason = "key_capacity";
    const Nanos next_sweep =
        shard.swept_at.count() == INT64_MIN ? now : shard.swept_at + kCapSweepGap;
    d.retry_after = std::max(Nanos{1}, next_sweep - now);
    return d;
  }

  // Forgets the idle keys of bucket `b` (shard.mu held).
  std::size_t sweep_bucket(Shard& shard, std::size_t b, Nanos now) {
    std::size_t removed = 0;
    for (auto it = shard.map.begin(b); it != shard.map.end(b);) {
      if (!is_idle(it->second, shard.rule, now)) {
        ++it;
        continue;
      }
      shard.map.erase(shard.map.find(it->first));  // a bucket's iterator cannot erase
      ++removed;
      it = shard.map.begin(b);  // the bucket again (its iterators are gone; buckets are short)
    }
    keys_.fetch_sub(removed, std::memory_order_relaxed);
    return removed;
  }

  std::size_t sweep_locked(Shard& shard, Nanos now) {
    now = shard.advance(now);
    const std::size_t removed = std::erase_if(
        shard.map, [&](const auto& kv) { return is_idle(kv.second, shard.rule, now); });
    keys_.fetch_sub(removed, std::memory_order_relaxed);
    shard.sweep_at = std::max(kMinSweep, 2 * shard.map.size());
    shard.swept_at = now;
    return removed;
  }

  const Clock& clock_;
  std::vector<Shard> shards_;
  const std::size_t mask_;
  std::atomic<std::size_t> keys_{0};
  std::atomic<std::size_t> max_keys_;
  mutable std::mutex rule_mu_;
  RateRule rule_;  // guarded by rule_mu_; each shard holds its own copy for its decisions
};

}  // namespace

std::string RateLimiterOptions::validate() const {
  if (std::string why = rule.validate(); !why.empty()) return "rule: " + why;
  if (shards == 0 || shards > 4096 || (shards & (shards - 1)) != 0)
    return "shards must be a power of two in [1, 4096]";
  if (max_keys == 0) return "max_keys must be >= 1";
  return {};
}

std::size_t state_bytes(RateStrategy strategy) noexcept {
  switch (strategy) {
    case RateStrategy::kFixedWindow:
      return sizeof(FixedWindowState);
    case RateStrategy::kSlidingWindow:
      return sizeof(SlidingWindowState);
    case RateStrategy::kGcra:
      return sizeof(GcraState);
  }
  return 0;
}

StatusOr<std::unique_ptr<RateLimiter>> make_rate_limiter(const RateLimiterOptions& options,
                                                         const Clock& clock) {
  if (std::string why = options.validate(); !why.empty())
    return Status(StatusCode::kInvalidArgument, "rate limiter: " + why);
  switch (options.rule.strategy) {
    case RateStrategy::kFixedWindow:
      return std::unique_ptr<RateLimiter>(new ShardedLimiter<FixedWindowState>(options, clock));
    case RateStrategy::kSlidingWindow:
      return std::unique_ptr<RateLimiter>(new ShardedLimiter<SlidingWindowState>(options, clock));
    case RateStrategy::kGcra:
      return std::unique_ptr<RateLimiter>(new ShardedLimiter<GcraState>(options, clock));
  }
  return Status(StatusCode::kInvalidArgument, "rate limiter: unknown strategy");
}

}  // namespace sluice
