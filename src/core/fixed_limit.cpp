#include "sluice/core/fixed_limit.h"

namespace sluice {

std::uint32_t FixedLimit::update(const LimitSample& /*sample*/) noexcept { return limit_; }

}  // namespace sluice
