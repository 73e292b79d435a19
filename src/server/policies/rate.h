// rate.h: the rate kind's fields (src/server/policies/rate.cpp).
//
//   kind: rate
//   strategy: fixed-window | sliding-window | gcra   # default gcra
//   limit: 100                                       # hits per period, required
//   period: 1s                                       # default 1s
//   burst: 20                                        # gcra only
//   max_keys: 1000000                                # keys held at once, default 1,000,000
//   coordinator: shared                              # keep the keys at a coordinator, shared
//                                                    #   by every server (shared_rate.h has
//                                                    #   the fields that come with it)
//
// Reload: a changed rate policy whose strategy and period stay the same (a new limit, burst or
// max_keys) is reconfigured in place and every key keeps what it has spent (a key that spent
// 40 of 100 has 10 left of a new limit of 50; sluice/core/rate_strategy.h: carry). A new strategy
// or period builds a new policy: every key starts afresh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "server/policies/shared_rate.h"
#include "server/registry.h"
#include "sluice/core/rate_strategy.h"
#include "sluice/local/rate_limiter.h"

namespace sluice::server {

// The largest max_keys a config may set.
inline constexpr std::uint64_t kMaxRateKeys = 100'000'000;

struct RateSpec final : PolicyBody {
  RateRule rule;
  std::size_t max_keys = kDefaultMaxKeys;
  std::optional<SharedRateSettings> shared;  // with a coordinator
};

[[nodiscard]] PolicyKind rate_kind();

// The 429 a rate-family policy named `policy` gives for `d`, a denied check: `detail` says what
// the policy allows; the retry time is appended to it. Its views point into `policy`.
[[nodiscard]] Rejection rate_refusal(std::string_view policy, std::string detail,
                                     const RateDecision& d);

}  // namespace sluice::server
