// rate_headers.h: the HTTP fields that tell a client its rate limits: the IETF draft's
// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, structured fields),
// the older `X-RateLimit-Limit`, `-Remaining` and `-Reset`, and `Retry-After` on a refusal.
//
//   RateLimit-Policy: "api-rate";q=100;w=60          each limit's quota and window (seconds)
//   RateLimit: "api-rate";r=42;t=17                  what is left of it, and the seconds until
//                                                    it is back in full (t)
//   X-RateLimit-Limit: 100, X-RateLimit-Remaining: 42, X-RateLimit-Reset: 17
//                                                    the most constrained limit only
//   Retry-After: 17                                  refused: the seconds until the same call
//                                                    could pass (never when it never can)
//
// A limit's name is a structured-field string: '"' and '\' are escaped, and a byte outside
// printable ASCII (which a string may not hold) is written as '?'. Seconds are rounded up, so
// a client that waits as told is never early. `w` is left out when the window is not known.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "server/routes.h"
#include "sluice/core/clock.h"

namespace sluice::server {

enum class RateLimitHeaders : std::uint8_t { kNone, kIetf, kXRateLimit, kBoth };
// "none", "ietf", "x-ratelimit", "both".
[[nodiscard]] std::string_view to_string(RateLimitHeaders h) noexcept;
[[nodiscard]] std::optional<RateLimitHeaders> rate_limit_headers_named(std::string_view name);

struct QuotaState {
  std::string_view name;        // the limit's name
  std::uint64_t quota = 0;      // its limit
  std::optional<Nanos> window;  // its window, when known
  std::uint64_t remaining = 0;
  Nanos reset{0};  // until it is back to its full quota
};

// `s` as a structured-field string (quoted).
[[nodiscard]] std::string sf_string(std::string_view s);
// Whole seconds, rounded up (Nanos::max(): the largest a header can say).
[[nodiscard]] std::uint64_t ceil_seconds(Nanos d) noexcept;

// Appends the fields of `which` for `limits` (in order; X-RateLimit-* for the one with the
// least remaining) to `out`, and Retry-After when `retry_after` is set and finite (whatever
// `which` is).
void add_rate_limit_headers(RateLimitHeaders which, std::span<const QuotaState> limits,
                            std::optional<Nanos> retry_after, NameValues& out);

}  // namespace sluice::server
