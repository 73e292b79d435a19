// rate_allowance.cpp: the rules of rate_allowance.h.
#include "sluice/adapters/rate_allowance.h"

#include <algorithm>
#include <stdexcept>

namespace sluice::adapters {

RateAllowances::RateAllowances(std::uint64_t block, std::chrono::nanoseconds hold,
                               std::size_t max_keys)
    : block_(block), hold_(hold), max_keys_(max_keys) {
  if (block < 1) throw std::invalid_argument("allowance: must be >= 1 (hits taken at once)");
  if (hold <= std::chrono::nanoseconds::zero())
    throw std::invalid_argument("allowance_hold: must be > 0");
  if (max_keys < 1) throw std::invalid_argument("allowance_max_keys: must be >= 1");
}

std::optional<LocalDecision> RateAllowances::local(std::string_view key, std::uint64_t hits,
                                                   TimePoint now) {
  std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  Key& k = it->second;
  if (now < k.refused_until) {
    ++stats_.local_refusals;
    return LocalDecision{.allowed = false,
                         .limit = k.last.limit,
                         .remaining = 0,
                         .retry_after = k.refused_until - now};
  }
  if (now >= k.expires) {
    drop(k);
    return std::nullopt;
  }
  if (k.tokens < hits) return std::nullopt;
  k.tokens -= hits;
  ++stats_.local_admits;
  return LocalDecision{
      .allowed = true, .limit = k.last.limit, .remaining = k.last.remaining + k.tokens};
}

std::uint64_t RateAllowances::ask(std::string_view key, std::uint64_t hits) {
  std::uint64_t want = std::max(hits, block_);
  std::lock_guard lock(mu_);
  if (const auto it = keys_.find(key); it != keys_.end() && it->second.last.limit > 0)
    want = std::min(want, it->second.last.limit);
  return std::max(want, hits);
}

std::optional<std::uint64_t> RateAllowances::answered(std::string_view key, std::uint64_t asked,
                                                      std::uint64_t hits, const RateAnswer& answer,
                                                      TimePoint now) {
  const bool granted = answer.allowed && !answer.would_deny;
  std::lock_guard lock(mu_);
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    if (keys_.size() >= max_keys_) forget_expired(now);
    if (keys_.size() >= max_keys_) {  // no room: asked every time
      if (granted || asked == hits) return std::nullopt;
      return hits;
    }
    it = keys_.emplace(std::string(key), Key{}).first;
  }
  Key& k = it->second;
  k.last = answer;
  if (granted) {
    if (asked > hits) {
      drop(k);
      k.tokens = asked - hits;
      k.expires = now + hold_;
      ++stats_.blocks_granted;
    }
    return std::nullopt;
  }
  if (asked > hits) {
    ++stats_.blocks_refused;
    if (!answer.would_deny && !answer.has_reason && answer.remaining >= hits &&
        answer.remaining < asked)
      return answer.remaining;
    return hits;
  }
  if (!answer.allowed && answer.retry_after &&
      *answer.retry_after > std::chrono::nanoseconds::zero())
    k.refused_until = now + *answer.retry_after;
  return std::nullopt;
}

std::uint64_t RateAllowances::held(std::string_view key) const {
  std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  return it == keys_.end() ? 0 : it->second.tokens;
}

std::size_t RateAllowances::keys() const {
  std::lock_guard lock(mu_);
  return keys_.size();
}

AllowanceStats RateAllowances::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void RateAllowances::drop(Key& k) {
  stats_.hits_dropped += k.tokens;
  k.tokens = 0;
}

void RateAllowances::forget_expired(TimePoint now) {
  for (auto it = keys_.begin(); it != keys_.end();) {
    if (now >= it->second.expires && now >= it->second.refused_until) {
      drop(it->second);
      it = keys_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace sluice::adapters
