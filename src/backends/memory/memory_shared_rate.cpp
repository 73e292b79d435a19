#include "sluice/backends/memory_shared_rate.h"

#include <algorithm>

namespace sluice {
namespace {

// The state's name: a rule of another strategy or period never shares a key's state.
std::string state_key(std::string_view key, const RateRule& rule) {
  std::string out(key);
  out += '\x1f';
  out += to_string(rule.strategy);
  out += '/';
  out += std::to_string(rule.period.count());
  return out;
}

}  // namespace

StatusOr<SharedRateReply> MemorySharedRate::apply(std::string_view key,
                                                  const SharedRateRequest& request,
                                                  Nanos /*timeout*/) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (std::string why = request.rule.validate(); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  try {
    const std::string name = state_key(key, request.rule);
    const std::lock_guard lock(mu_);
    const Nanos now = clock_.now();
    auto it = keys_.find(name);
    if (it == keys_.end()) {
      // A peek, or a refused check, of an unknown key writes nothing: decided on a fresh state.
      SharedRateState fresh;
      bool changed = false;
      SharedRateReply out = sluice::apply(fresh, request, now, origin_, &changed);
      if (changed) {
        if (keys_.size() >= sweep_at_) sweep(now);
        keys_.emplace(name, Entry{request.rule, fresh});  // only its strategy and period matter
      }
      return out;
    }
    return sluice::apply(it->second.state, request, now, origin_);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("shared rate: ") + e.what());
  }
}

void MemorySharedRate::sweep(Nanos now) {
  std::erase_if(keys_, [now](const auto& kv) {
    const Entry& e = kv.second;
    RateRule rule = e.rule;  // its strategy and period; the state's scale is its own limit
    rule.limit = e.state.limit;
    switch (rule.strategy) {
      case RateStrategy::kFixedWindow:
        return is_idle(e.state.fixed, rule, now);
      case RateStrategy::kSlidingWindow:
        return is_idle(e.state.sliding, rule, now);
      case RateStrategy::kGcra:
        return is_idle(e.state.gcra, rule, now);
    }
    return false;
  });
  sweep_at_ = std::max<std::size_t>(1024, 2 * keys_.size());
}

Status MemorySharedRate::adopt(Nanos /*timeout*/) noexcept {
  const std::lock_guard lock(mu_);
  origin_ = kNoLoss;
  return {};
}

void MemorySharedRate::lose_state() {
  const std::lock_guard lock(mu_);
  keys_.clear();
  origin_ = clock_.now();
}

std::size_t MemorySharedRate::keys() const {
  const std::lock_guard lock(mu_);
  return keys_.size();
}

}  // namespace sluice
