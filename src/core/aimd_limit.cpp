#include "sluice/core/aimd_limit.h"

#include <algorithm>
#include <cmath>

namespace sluice {
namespace {

AimdOptions repaired(AimdOptions o) noexcept {
  if (o.max_limit < o.min_limit) std::swap(o.min_limit, o.max_limit);
  o.initial_limit = std::clamp(o.initial_limit, o.min_limit, o.max_limit);
  if (!(o.backoff_ratio >= 0.5 && o.backoff_ratio < 1.0)) o.backoff_ratio = 0.9;
  if (o.timeout <= Nanos{0}) o.timeout = std::chrono::seconds(5);
  return o;
}

}  // namespace

std::string_view AimdOptions::validate() const noexcept {
  if (min_limit > max_limit) return "aimd: min_limit must be <= max_limit";
  if (initial_limit < min_limit || initial_limit > max_limit)
    return "aimd: initial_limit must be within [min_limit, max_limit]";
  if (!(backoff_ratio >= 0.5 && backoff_ratio < 1.0))
    return "aimd: backoff_ratio must be in [0.5, 1)";
  if (timeout <= Nanos{0}) return "aimd: timeout must be > 0";
  return {};
}

AimdLimit::AimdLimit(AimdOptions options) noexcept
    : options_(repaired(options)), limit_(options_.initial_limit) {}

std::uint32_t AimdLimit::update(const LimitSample& sample) noexcept {
  std::uint64_t next = limit_;
  if (sample.dropped || sample.rtt > options_.timeout) {
    // floor(L * ratio) < L for every L >= 1 because ratio < 1: a drop always lowers the limit.
    next = static_cast<std::uint64_t>(
        std::floor(static_cast<double>(limit_) * options_.backoff_ratio));
  } else if (2 * std::uint64_t{sample.in_flight} >= limit_) {
    next = std::uint64_t{limit_} + 1;
  }
  limit_ = static_cast<std::uint32_t>(
      std::clamp<std::uint64_t>(next, options_.min_limit, options_.max_limit));
  return limit_;
}

}  // namespace sluice
