// bucket_word.h: one time bucket of two counters in a single 64-bit word, for windows that are
// updated with one compare-exchange (cascade_stats.cpp, retry_budget.cpp).
//
// Layout: [epoch:24][a:20][b:20]. The epoch is the bucket's time (now / width) modulo 2^24;
// the two counters saturate at kCountMask.
#pragma once

#include <cstdint>

namespace sluice::bucket_word {

inline constexpr std::uint64_t kEpochBits = 24;
inline constexpr std::uint64_t kEpochMask = (1ull << kEpochBits) - 1;
inline constexpr std::uint64_t kCountMask = (1ull << 20) - 1;
inline constexpr std::uint32_t kHalfRange = 1u << (kEpochBits - 1);

constexpr std::uint64_t pack(std::uint32_t epoch, std::uint32_t a, std::uint32_t b) noexcept {
  return (static_cast<std::uint64_t>(epoch & kEpochMask) << 40) | ((a & kCountMask) << 20) |
         (b & kCountMask);
}
constexpr std::uint32_t epoch_of(std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>(w >> 40);
}
constexpr std::uint32_t a_of(std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>((w >> 20) & kCountMask);
}
constexpr std::uint32_t b_of(std::uint64_t w) noexcept {
  return static_cast<std::uint32_t>(w & kCountMask);
}
// How many epochs `tag` is behind `epoch` (modulo 2^24); >= kHalfRange: it is ahead.
constexpr std::uint32_t behind(std::uint32_t epoch, std::uint32_t tag) noexcept {
  return static_cast<std::uint32_t>((epoch - tag) & kEpochMask);
}

}  // namespace sluice::bucket_word
