// cascade_stats.h: the lock-free rolling window of stat buckets.
#include "sluice/local/cascade_stats.h"

#include <algorithm>

#include "local/bucket_word.h"

namespace sluice {
namespace {

using bucket_word::behind;
using bucket_word::epoch_of;
using bucket_word::kEpochMask;
using bucket_word::kHalfRange;
using bucket_word::pack;
// [epoch][finished][succeeded]
constexpr std::uint32_t finished_of(std::uint64_t w) noexcept { return bucket_word::a_of(w); }
constexpr std::uint32_t succeeded_of(std::uint64_t w) noexcept { return bucket_word::b_of(w); }

}  // namespace

std::string_view cascade_stats_error(const CascadeStatsOptions& o) noexcept {
  if (o.buckets < 1 || o.buckets > CascadeNodeStats::kMaxBuckets) return "buckets: must be 1..16";
  if (o.width <= Nanos{0}) return "bucket_width: must be more than 0";
  return {};
}

CascadeNodeStats::CascadeNodeStats(CascadeStatsOptions o) noexcept : options_(o) {}

void CascadeNodeStats::record(bool success, Nanos now) noexcept {
  const std::uint64_t e64 = static_cast<std::uint64_t>(now.count() / options_.width.count());
  const auto epoch = static_cast<std::uint32_t>(e64 & kEpochMask);
  std::atomic<std::uint64_t>& slot = slots_[e64 % options_.buckets];
  std::uint64_t old = slot.load(std::memory_order_relaxed);
  for (;;) {
    const std::uint32_t tag = epoch_of(old);
    std::uint64_t next;
    if (tag == epoch || finished_of(old) == 0) {
      const std::uint32_t f = finished_of(old), s = succeeded_of(old);
      if (tag == epoch && f >= kMaxCount) return;  // saturated: a fair sample already
      next = tag == epoch ? pack(epoch, f + 1, s + (success ? 1 : 0))
                          : pack(epoch, 1, success ? 1 : 0);
    } else if (behind(epoch, tag) >= kHalfRange) {
      return;  // the slot holds a newer bucket (a caller whose clock read is behind): dropped
    } else {
      next = pack(epoch, 1, success ? 1 : 0);  // a bucket aged out: replaced
    }
    if (slot.compare_exchange_weak(old, next, std::memory_order_acq_rel,
                                   std::memory_order_relaxed)) {
      break;
    }
  }
  if (epoch_of(old) == epoch || finished_of(old) == 0) return;
  // The replaced bucket had calls: it is the newest to age out unless the sticky word already
  // holds a newer one.
  std::uint64_t sticky = sticky_.load(std::memory_order_relaxed);
  while (finished_of(sticky) == 0 || behind(epoch_of(old), epoch_of(sticky)) - 1 < kHalfRange - 1) {
    if (sticky_.compare_exchange_weak(sticky, old, std::memory_order_acq_rel,
                                      std::memory_order_relaxed))
      return;
  }
}

CascadeNodeStats::Version CascadeNodeStats::version(Nanos now) const noexcept {
  const std::uint64_t e64 = static_cast<std::uint64_t>(now.count() / options_.width.count());
  const std::size_t b = options_.buckets;
  const std::size_t slot = static_cast<std::size_t>(e64 % b);
  return {e64, slots_[slot].load(std::memory_order_acquire),
          slots_[slot == 0 ? b - 1 : slot - 1].load(std::memory_order_acquire)};
}

CascadeNodeStats::Snapshot CascadeNodeStats::snapshot(Nanos now) const noexcept {
  Snapshot out;
  const std::uint64_t e64 = static_cast<std::uint64_t>(now.count() / options_.width.count());
  const auto epoch = static_cast<std::uint32_t>(e64 & kEpochMask);
  const std::size_t b = options_.buckets;
  out.count = b;
  std::uint64_t newest_aged = sticky_.load(std::memory_order_acquire);
  // The slot of epoch e64 - i, walked down with a wrap rather than a division per bucket.
  std::size_t slot = static_cast<std::size_t>(e64 % b);
  for (std::size_t i = 0; i < b && i <= e64; ++i, slot = slot == 0 ? b - 1 : slot - 1) {
    const std::uint64_t w = slots_[slot].load(std::memory_order_acquire);
    const std::uint32_t tag = epoch_of(w);
    const std::uint32_t d = behind(epoch, tag);
    if (finished_of(w) == 0) continue;
    if (d == i) {
      out.historical[i] = {finished_of(w), succeeded_of(w)};
    } else if (d >= b && d < kHalfRange &&
               (finished_of(newest_aged) == 0 || behind(epoch, epoch_of(newest_aged)) > d)) {
      newest_aged = w;  // aged out, not yet replaced, newer than the sticky word's
    }
  }
  if (finished_of(newest_aged) > 0 &&
      behind(epoch, epoch_of(newest_aged)) >= static_cast<std::uint32_t>(b))
    out.sticky = {finished_of(newest_aged), succeeded_of(newest_aged)};
  return out;
}

}  // namespace sluice
