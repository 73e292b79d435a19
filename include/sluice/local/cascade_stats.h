// cascade_stats.h: one node's rolling window of stat buckets for the fallback cascade, updated
// on the hot path without a lock, a timer or an allocation.
//
// What it is: `buckets` buckets of `width` each (6 x 5 s by default) plus the sticky bucket,
// which keeps the last non-empty bucket to have aged out of the window (cascade.h says how they
// make a success rate). Ageing is lazy: the time of each record() or snapshot() says which
// buckets are in the window; nothing runs between calls, so a node nobody calls costs nothing.
//
// Layout: each bucket is ONE 64-bit atomic word: the bucket's epoch (now / width, 24 bits),
// finished calls (20 bits) and successes (20 bits). record() is one compare-exchange on the
// current epoch's word (slot epoch % buckets): it adds 1 finished and 0 or 1 success together,
// so a reader never sees a success without its call; when the word still holds an older epoch
// it is replaced by the new epoch's first call, and the older bucket, if it had calls, is moved
// to the sticky word (kept only if newer than what that holds). A bucket saturates at 2^20 - 1
// calls (209,715 a second with 5 s buckets): calls past that are not counted in it, which keeps
// its success ratio a fair sample.
//
// A snapshot taken between the replacement of an aged-out bucket and its move to the sticky word
// may miss that bucket as the sticky one; it only matters for a node with no call in the whole
// window, and the next snapshot sees it.
//
// Thread-safety: every member is safe to call concurrently; record() is lock-free.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "sluice/core/cascade.h"
#include "sluice/core/clock.h"

namespace sluice {

struct CascadeStatsOptions {
  std::size_t buckets = 6;                // 1..16
  Nanos width = std::chrono::seconds(5);  // > 0
  friend bool operator==(const CascadeStatsOptions&, const CascadeStatsOptions&) = default;
};

// Why `o` is unusable, naming the field; empty when it is fine.
[[nodiscard]] std::string_view cascade_stats_error(const CascadeStatsOptions& o) noexcept;

class CascadeNodeStats {
 public:
  static constexpr std::size_t kMaxBuckets = 16;
  static constexpr std::uint32_t kMaxCount = (1u << 20) - 1;

  // `o` must pass cascade_stats_error().
  explicit CascadeNodeStats(CascadeStatsOptions o = {}) noexcept;

  // One finished call at `now` (the caller's clock, steady), successful or not.
  void record(bool success, Nanos now) noexcept;

  struct Snapshot {
    std::array<CascadeBucket, kMaxBuckets> historical{};  // newest first, `count` of them
    std::size_t count = 0;
    CascadeBucket sticky;
    [[nodiscard]] std::span<const CascadeBucket> window() const noexcept {
      return {historical.data(), count};
    }
  };
  [[nodiscard]] Snapshot snapshot(Nanos now) const noexcept;

  // What a snapshot at `now` depends on, in three words: the epoch, and the words of its bucket
  // and the one before. Older buckets no longer change (a record lands in the bucket of its
  // clock read, which is at most the previous one but for a caller stalled a whole bucket
  // width), and the sticky word changes only with a record that changes the current one; so an
  // unchanged version means an unchanged snapshot, for caching what is computed from it.
  struct Version {
    std::uint64_t epoch = ~std::uint64_t{0};
    std::uint64_t current = 0, previous = 0;
    friend bool operator==(const Version&, const Version&) = default;
  };
  [[nodiscard]] Version version(Nanos now) const noexcept;

  [[nodiscard]] const CascadeStatsOptions& options() const noexcept { return options_; }

 private:
  const CascadeStatsOptions options_;
  std::array<std::atomic<std::uint64_t>, kMaxBuckets> slots_{};
  std::atomic<std::uint64_t> sticky_{0};
};

}  // namespace sluice
