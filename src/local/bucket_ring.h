// bucket_ring.h (private): a lock-free ring of time buckets, each bucket one 64-bit word of two
// counters, for windows updated with one compare-exchange per event: the cascade's stat buckets
// (cascade_stats.cpp) and the retry budget (retry_budget.cpp).
//
// What it is: the bucket of `now` is epoch e = now / width, kept in slot e % size of an array of
// atomic words the owner holds. update() moves that bucket on in a compare-exchange loop: from
// the counts its slot holds when the word is that epoch's, from zero when the slot is empty or
// holds an older bucket (which it replaces); a slot holding a newer bucket (a caller whose clock
// read is behind) is left alone. walk() visits the slots of the last `size` epochs with each
// word and how many epochs behind `now` the word's bucket is (exactly i for the live bucket i
// epochs back; anything else is aged out, or ahead).
//
// Word layout: [epoch:24][a:20][b:20]. The epoch is e modulo 2^24; the counters saturate at
// kCountMask (the owner's step decides what saturation means). An all-zero word is an empty slot.
//
// Thread-safety: update() and walk() from any thread, lock-free; a walk sees each word as one
// atomic read (acquire), not the ring as one snapshot.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "sluice/core/clock.h"

namespace sluice::bucket_ring {

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

// Where `now` falls in a ring of `size` buckets `width` wide.
struct Position {
  std::uint64_t e64;    // the epoch, whole
  std::uint32_t epoch;  // the epoch as a word holds it
  std::size_t slot;     // its slot
};
inline Position position(Nanos now, Nanos width, std::size_t size) noexcept {
  const auto e64 = static_cast<std::uint64_t>(now.count() / width.count());
  return {e64, static_cast<std::uint32_t>(e64 & kEpochMask), static_cast<std::size_t>(e64 % size)};
}

enum class Outcome : std::uint8_t {
  kWritten,   // the bucket holds the step's counts
  kDeclined,  // the step left the bucket as it was
  kAhead,     // the slot holds a newer bucket: nothing done
};
struct Update {
  Outcome outcome;
  std::uint64_t
      replaced;  // kWritten: the word written over (an older bucket, 0 or the same epoch's)
};

// Moves the bucket of `p` on: step(a, b) gets its counts (0, 0 for a fresh bucket) and returns
// std::optional<std::pair<std::uint32_t, std::uint32_t>>, the new counts, or nullopt to leave
// it. The step may run more than once (a lost compare-exchange retries with the new counts).
template <class Step>
Update update(std::atomic<std::uint64_t>& slot, const Position& p, Step step) noexcept {
  std::uint64_t old = slot.load(std::memory_order_relaxed);
  for (;;) {
    std::uint32_t a = 0, b = 0;
    if (old != 0 && epoch_of(old) == p.epoch) {
      a = a_of(old);
      b = b_of(old);
    } else if (old != 0 && behind(p.epoch, epoch_of(old)) >= kHalfRange) {
      return {Outcome::kAhead, old};
    }
    const std::optional<std::pair<std::uint32_t, std::uint32_t>> next = step(a, b);
    if (!next) return {Outcome::kDeclined, old};
    if (slot.compare_exchange_weak(old, pack(p.epoch, next->first, next->second),
                                   std::memory_order_acq_rel, std::memory_order_relaxed))
      return {Outcome::kWritten, old};
  }
}

// Visits the slots of epochs p.e64, p.e64 - 1, ... (at most slots.size() of them, none before
// epoch 0), newest first: visit(i, slot index, word, how many epochs the word is behind p) for
// each slot that is not empty. The word is live for epoch p.e64 - i when that count is i.
template <class Visit>
void walk(std::span<const std::atomic<std::uint64_t>> slots, const Position& p,
          Visit visit) noexcept {
  const std::size_t n = slots.size();
  std::size_t slot = p.slot;
  for (std::size_t i = 0; i < n && i <= p.e64; ++i, slot = slot == 0 ? n - 1 : slot - 1) {
    const std::uint64_t w = slots[slot].load(std::memory_order_acquire);
    if (w != 0) visit(i, slot, w, behind(p.epoch, epoch_of(w)));
  }
}

}  // namespace sluice::bucket_ring
