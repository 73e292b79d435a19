// retry_budget.h: how many retries callers may make, as a share of their calls, so that
// retrying cannot multiply the load on a backend that is failing.
//
// What it is: over the last `window` (in 10 buckets), retries are allowed while
//   retries <= ratio x calls + per_second x window seconds,
// where calls are first attempts and retries are the attempts after a first. The share bounds
// the extra load to `ratio` (10% by default) when every call fails; the allowance lets a caller
// with little traffic retry at all. A retry that does not fit is not made: the caller takes the
// failure it has.
//
// Layout: each bucket is one 64-bit word (sluice's bucket word: its epoch, calls and retries);
// record_call() is one compare-exchange, try_retry() reads the window and spends with one
// compare-exchange on the current bucket that re-checks the sum, so concurrent retries never
// spend past the budget. Counts saturate at 2^20 - 1 per bucket.
//
// Thread-safety: every member is safe to call concurrently; lock-free.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "sluice/core/clock.h"

namespace sluice {

struct RetryBudgetOptions {
  double ratio = 0.1;                       // retries per call, 0..1
  double per_second = 10;                   // retries a second allowed on top, >= 0
  Nanos window = std::chrono::seconds(10);  // counted over this much time, >= 10 ms
  friend bool operator==(const RetryBudgetOptions&, const RetryBudgetOptions&) = default;
};
// Why `o` is unusable, naming the field; empty when it is fine.
[[nodiscard]] std::string_view retry_budget_error(const RetryBudgetOptions& o) noexcept;

class RetryBudget {
 public:
  static constexpr std::size_t kBuckets = 10;

  // `o` must pass retry_budget_error().
  explicit RetryBudget(RetryBudgetOptions o = {}) noexcept;

  // A first attempt was made at `now`.
  void record_call(Nanos now) noexcept;
  // Spends one retry at `now` if it fits; false: it does not (make no retry).
  [[nodiscard]] bool try_retry(Nanos now) noexcept;

  struct Counts {
    std::uint64_t calls = 0, retries = 0;
    double allowed = 0;  // retries the window allows now
  };
  [[nodiscard]] Counts counts(Nanos now) const noexcept;
  [[nodiscard]] const RetryBudgetOptions& options() const noexcept { return options_; }

 private:
  // The window's sums at `now`, leaving out the bucket of `skip_slot` (kBuckets: none).
  Counts sums(Nanos now, std::size_t skip_slot) const noexcept;

  const RetryBudgetOptions options_;
  const Nanos width_;
  std::array<std::atomic<std::uint64_t>, kBuckets> slots_{};
};

}  // namespace sluice
