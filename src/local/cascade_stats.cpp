// cascade_stats.h: the lock-free rolling window of stat buckets.
#include "sluice/local/cascade_stats.h"

#include <algorithm>

#include <optional>
#include <utility>

#include "local/bucket_ring.h"

namespace sluice {
namespace {

namespace ring = bucket_ring;
using ring::behind;
using ring::epoch_of;
using ring::kHalfRange;
// [epoch][finished][succeeded]
constexpr std::uint32_t finished_of(std::uint64_t w) noexcept { return ring::a_of(w); }
constexpr std::uint32_t succeeded_of(std::uint64_t w) noexcept { return ring::b_of(w); }

}  // namespace

std::string_view cascade_stats_error(const CascadeStatsOptions& o) noexcept {
  if (o.buckets < 1 || o.buckets > CascadeNodeStats::kMaxBuckets) return "buckets: must be 1..16";
  if (o.width <= Nanos{0}) return "bucket_width: must be more than 0";
  return {};
}

CascadeNodeStats::CascadeNodeStats(CascadeStatsOptions o) noexcept : options_(o) {}

void CascadeNodeStats::record(bool success, Nanos now) noexcept {
  const ring::Position p = ring::position(now, options_.width, options_.buckets);
  // Saturated: a fair sample already. A slot holding a newer bucket (a caller whose clock read
  // is behind): dropped. An older bucket: replaced.
  const ring::Update u =
      ring::update(slots_[p.slot], p, [success](std::uint32_t finished, std::uint32_t succeeded) {
        using NewCounts = std::optional<std::pair<std::uint32_t, std::uint32_t>>;
        if (finished >= kMaxCount) return NewCounts{};
        return NewCounts{{finished + 1, succeeded + (success ? 1 : 0)}};
      });
  const std::uint64_t old = u.replaced;
  if (u.outcome != ring::Outcome::kWritten || old == 0 || epoch_of(old) == p.epoch) return;
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
  const ring::Position p = ring::position(now, options_.width, options_.buckets);
  const std::size_t b = options_.buckets;
  return {p.e64, slots_[p.slot].load(std::memory_order_acquire),
          slots_[p.slot == 0 ? b - 1 : p.slot - 1].load(std::memory_order_acquire)};
}

CascadeNodeStats::Snapshot CascadeNodeStats::snapshot(Nanos now) const noexcept {
  Snapshot out;
  const std::size_t b = options_.buckets;
  const ring::Position p = ring::position(now, options_.width, b);
  out.count = b;
  std::uint64_t newest_aged = sticky_.load(std::memory_order_acquire);
  ring::walk(
      std::span(slots_.data(), b), p,
      [&](std::size_t i, std::size_t, std::uint64_t w, std::uint32_t d) {
        if (d == i) {
          out.historical[i] = {finished_of(w), succeeded_of(w)};
        } else if (d >= b && d < kHalfRange &&
                   (finished_of(newest_aged) == 0 || behind(p.epoch, epoch_of(newest_aged)) > d)) {
          newest_aged = w;  // aged out, not yet replaced, newer than the sticky word's
        }
      });
  if (finished_of(newest_aged) > 0 &&
      behind(p.epoch, epoch_of(newest_aged)) >= static_cast<std::uint32_t>(b))
    out.sticky = {finished_of(newest_aged), succeeded_of(newest_aged)};
  return out;
}

}  // namespace sluice
