// aimd_limit.h: loss-based additive-increase / multiplicative-decrease limit.
//
// Update rule, once per sample:
//   L' = clamp(floor(L * backoff_ratio))   if dropped or rtt > timeout
//   L' = clamp(L + 1)                      else if 2 * in_flight >= L
//   L' = L                                 otherwise
// where clamp(x) = min(max_limit, max(min_limit, x)).
//
// Regimes:
//   - busy and healthy (at least half the limit in use, no drop): grows by one per sample;
//   - app-limited (less than half in use): holds, so an idle caller does not inflate the limit;
//   - overloaded (a drop or an RTT above `timeout` in the sample): shrinks by backoff_ratio
//     (always by at least one, down to min_limit).
// It ignores RTT below the timeout, so it reacts to loss, never to queueing delay.
//
// Thread-safety: not thread-safe (see LimitAlgorithm); the guard serialises calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "sluice/core/limit_algorithm.h"

namespace sluice {

struct AimdOptions {
  std::uint32_t initial_limit = 20;  // default 20
  std::uint32_t min_limit = 20;      // default 20
  std::uint32_t max_limit = 200;     // default 200
  // Multiplier applied on a drop; must be in [0.5, 1). Default 0.9.
  double backoff_ratio = 0.9;
  // An RTT above this counts as a drop; must be > 0. Default 5 s.
  Nanos timeout = std::chrono::seconds(5);

  // Empty when valid, else what is wrong (for config loading). The constructor repairs what
  // this rejects (orders min/max, clamps the rest) so a running guard is never undefined.
  [[nodiscard]] std::string_view validate() const noexcept;
};

class AimdLimit final : public LimitAlgorithm {
 public:
  explicit AimdLimit(AimdOptions options = {}) noexcept;

  std::uint32_t update(const LimitSample& sample) noexcept override;
  [[nodiscard]] std::uint32_t limit() const noexcept override { return limit_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "aimd"; }
  [[nodiscard]] const AimdOptions& options() const noexcept { return options_; }

 private:
  AimdOptions options_;
  std::uint32_t limit_;
};

}  // namespace sluice
