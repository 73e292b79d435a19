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
  if (now >= k.expires) {  // the older block expired first
    drop(k);
  } else if (now >= k.older_expires) {
    stats_.hits_dropped += k.older_tokens;
    k.older_tokens = 0;
  }
  if (k.older_tokens + k.tokens < hits) {
    if (now >= k.refused_until) return std::nullopt;
    ++stats_.local_refusals;  // hits held are spent first: they were granted
    return LocalDecision{.allowed = false,
                         .limit = k.last.limit,
                         .remaining = 0,
                         .retry_after = k.refused_until - now};
  }
  const std::uint64_t older = std::min(k.older_tokens, hits);
  k.older_tokens -= older;
  k.tokens -= hits - older;
  ++stats_.local_admits;
  LocalDecision d{.allowed = true,
                  .limit = k.last.limit,
                  .remaining = k.last.remaining + k.older_tokens + k.tokens};
  if (!k.refill_asked && !k.refilling && k.granted > 1 && k.tokens * 2 <= k.granted) {
    k.refill_asked = true;
    k.refilling = true;
    d.refill = k.last.limit > 0 ? std::min(block_, k.last.limit) : block_;
  }
  return d;
}

std::uint64_t RateAllowances::ask(std::string_view key, std::uint64_t hits) {
  std::uint64_t want = std::max(hits, block_);
  std::lock_guard lock(mu_);
  ++stats_.calls_asked;
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
      push(k, asked - hits, asked, now);
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

void RateAllowances::refilled(std::string_view key, std::uint64_t asked,
                              const std::optional<RateAnswer>& answer, TimePoint now) {
  const bool granted = answer && answer->allowed && !answer->would_deny;
  std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  if (it != keys_.end()) it->second.refilling = false;
  if (!granted) {
    ++stats_.refills_refused;
    return;
  }
  ++stats_.refills_granted;
  if (it == keys_.end()) {  // forgotten meanwhile (max_keys): nowhere to hold them
    stats_.hits_dropped += asked;
    return;
  }
  Key& k = it->second;
  k.last = *answer;
  push(k, asked, asked, now);
}

std::uint64_t RateAllowances::held(std::string_view key) const {
  std::lock_guard lock(mu_);
  const auto it = keys_.find(key);
  return it == keys_.end() ? 0 : it->second.older_tokens + it->second.tokens;
}

std::size_t RateAllowances::keys() const {
  std::lock_guard lock(mu_);
  return keys_.size();
}

AllowanceStats RateAllowances::stats() const {
  std::lock_guard lock(mu_);
  AllowanceStats s = stats_;
  for (const auto& [key, k] : keys_) s.hits_held += k.older_tokens + k.tokens;
  return s;
}

void RateAllowances::drop(Key& k) {
  stats_.hits_dropped += k.older_tokens + k.tokens;
  k.older_tokens = 0;
  k.tokens = 0;
}

void RateAllowances::push(Key& k, std::uint64_t tokens, std::uint64_t granted, TimePoint now) {
  stats_.hits_dropped += k.older_tokens;  // fewer than a call's hits, or expired
  k.older_tokens = 0;
  if (now < k.expires) {
    std::swap(k.older_tokens, k.tokens);
    k.older_expires = k.expires;
  }
  stats_.hits_dropped += k.tokens;
  k.tokens = tokens;
  k.granted = granted;
  k.refill_asked = false;
  k.expires = now + hold_;
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
