#include "sluice/rate_limiter.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "core/string_map.h"

namespace sluice {
namespace {

constexpr std::size_t kMinSweep = 64;

template <class State>
class ShardedLimiter final : public RateLimiter {
 public:
  ShardedLimiter(const RateLimiterOptions& o, const Clock& clock)
      : rule_(o.rule), clock_(clock), shards_(o.shards), mask_(o.shards - 1) {}

  RateDecision check(std::string_view key, std::uint64_t hits) override {
    return check(key, hits, clock_.now());
  }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos now) override {
    const std::size_t h = StringHash{}(key);
    Shard& shard = shards_[shard_of(h)];
    const std::lock_guard lock(shard.mu);
    now = shard.advance(now);
    auto it = shard.map.find(key);
    if (it != shard.map.end()) return decide(it->second, rule_, hits, now);
    State fresh;
    const RateDecision d = decide(fresh, rule_, hits, now);
    if (!is_idle(fresh, rule_, now)) {  // nothing to remember for a refused or empty request
      shard.map.emplace(std::string(key), fresh);
      if (shard.map.size() >= shard.sweep_at) sweep(shard, now);
    }
    return d;
  }

  RateDecision peek(std::string_view key, std::uint64_t hits, Nanos now) const override {
    const std::size_t h = StringHash{}(key);
    const Shard& shard = shards_[shard_of(h)];
    const std::lock_guard lock(shard.mu);
    now = std::max(now, shard.latest);
    State s;
    if (auto it = shard.map.find(key); it != shard.map.end()) s = it->second;
    return decide(s, rule_, hits, now, /*commit=*/false);
  }

  void refund(std::string_view key, std::uint64_t hits, Nanos now) override {
    Shard& shard = shards_[shard_of(StringHash{}(key))];
    const std::lock_guard lock(shard.mu);
    if (auto it = shard.map.find(key); it != shard.map.end())
      sluice::refund(it->second, rule_, hits, now);
  }

  const RateRule& rule() const noexcept override { return rule_; }

  std::size_t keys() const override {
    std::size_t n = 0;
    for (const Shard& s : shards_) {
      const std::lock_guard lock(s.mu);
      n += s.map.size();
    }
    return n;
  }

 private:
  struct alignas(64) Shard {
    mutable std::mutex mu;
    StringMap<State> map;
    std::size_t sweep_at = kMinSweep;
    // The latest time a check of this shard decided at. Callers read the clock before taking
    // the lock, so a check can arrive with a time older than one already decided; it decides
    // at this time instead. Otherwise a window strategy would move a key back into a window
    // that has ended (losing the newer window's count), and a sweep would drop keys a late
    // check still counts: either way, over-admission at a window boundary.
    Nanos latest{INT64_MIN};
    Nanos advance(Nanos now) noexcept {
      latest = std::max(latest, now);
      return latest;
    }
  };

  // The high bits pick the shard; the map uses the whole hash.
  std::size_t shard_of(std::size_t h) const noexcept { return (h >> 20) & mask_; }

  void sweep(Shard& shard, Nanos now) {
    std::erase_if(shard.map, [&](const auto& kv) { return is_idle(kv.second, rule_, now); });
    shard.sweep_at = std::max(kMinSweep, 2 * shard.map.size());
  }

  const RateRule rule_;
  const Clock& clock_;
  std::vector<Shard> shards_;
  const std::size_t mask_;
};

}  // namespace

std::string RateLimiterOptions::validate() const {
  if (std::string why = rule.validate(); !why.empty()) return "rule: " + why;
  if (shards == 0 || shards > 4096 || (shards & (shards - 1)) != 0)
    return "shards must be a power of two in [1, 4096]";
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
