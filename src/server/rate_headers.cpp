#include "server/rate_headers.h"

#include <algorithm>

namespace sluice::server {

std::string_view to_string(RateLimitHeaders h) noexcept {
  switch (h) {
    case RateLimitHeaders::kNone:
      return "none";
    case RateLimitHeaders::kIetf:
      return "ietf";
    case RateLimitHeaders::kXRateLimit:
      return "x-ratelimit";
    case RateLimitHeaders::kBoth:
      return "both";
  }
  return "none";
}

std::optional<RateLimitHeaders> rate_limit_headers_named(std::string_view name) {
  for (RateLimitHeaders h : {RateLimitHeaders::kNone, RateLimitHeaders::kIetf,
                             RateLimitHeaders::kXRateLimit, RateLimitHeaders::kBoth})
    if (to_string(h) == name) return h;
  return std::nullopt;
}

std::string sf_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c > 0x7E) {
      out += '?';
    } else {
      out += ch;
    }
  }
  out += '"';
  return out;
}

std::uint64_t ceil_seconds(Nanos d) noexcept {
  if (d <= Nanos{0}) return 0;
  const auto ns = static_cast<std::uint64_t>(d.count());
  return ns / 1'000'000'000 + (ns % 1'000'000'000 != 0 ? 1 : 0);
}

void add_rate_limit_headers(RateLimitHeaders which, std::span<const QuotaState> limits,
                            std::optional<Nanos> retry_after, NameValues& out) {
  if (!limits.empty() && (which == RateLimitHeaders::kIetf || which == RateLimitHeaders::kBoth)) {
    std::string policy;
    std::string state;
    for (const QuotaState& q : limits) {
      const std::string name = sf_string(q.name);
      if (!policy.empty()) {
        policy += ", ";
        state += ", ";
      }
      policy += name + ";q=" + std::to_string(q.quota);
      if (q.window)
        policy += ";w=" + std::to_string(std::max<std::uint64_t>(1, ceil_seconds(*q.window)));
      state += name + ";r=" + std::to_string(q.remaining) +
               ";t=" + std::to_string(ceil_seconds(q.reset));
    }
    out.emplace_back("RateLimit-Policy", std::move(policy));
    out.emplace_back("RateLimit", std::move(state));
  }
  if (!limits.empty() &&
      (which == RateLimitHeaders::kXRateLimit || which == RateLimitHeaders::kBoth)) {
    const QuotaState& least = *std::min_element(
        limits.begin(), limits.end(),
        [](const QuotaState& a, const QuotaState& b) { return a.remaining < b.remaining; });
    out.emplace_back("X-RateLimit-Limit", std::to_string(least.quota));
    out.emplace_back("X-RateLimit-Remaining", std::to_string(least.remaining));
    out.emplace_back("X-RateLimit-Reset", std::to_string(ceil_seconds(least.reset)));
  }
  if (retry_after && *retry_after != Nanos::max())
    out.emplace_back("Retry-After", std::to_string(ceil_seconds(*retry_after)));
}

}  // namespace sluice::server
