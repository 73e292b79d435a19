// fixed_limit.h: a limit that never changes.
//
// Update rule:  L' = L  (samples are ignored; min_limit == max_limit == L).
// Regimes: one. Useful as a static ceiling, as the control arm of an experiment, and for a
// guard whose ceiling is set only from outside (AdaptiveGuard::set_cap). It is the one
// algorithm that does not back off on drops: by definition it does not adapt.
//
// Thread-safety: limit() is immutable after construction; update() has no effect, so any
// number of threads may call either. (The LimitAlgorithm contract still serialises update().)
#pragma once

#include <cstdint>
#include <string_view>

#include "sluice/core/limit_algorithm.h"

namespace sluice {

struct FixedLimitOptions {
  // The limit. Default 20 (the initial limit the adaptive algorithms start from).
  std::uint32_t limit = 20;
};

class FixedLimit final : public LimitAlgorithm {
 public:
  explicit FixedLimit(FixedLimitOptions options = {}) noexcept : limit_(options.limit) {}

  std::uint32_t update(const LimitSample& sample) noexcept override;
  [[nodiscard]] std::uint32_t limit() const noexcept override { return limit_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "fixed"; }

 private:
  const std::uint32_t limit_;
};

}  // namespace sluice
