// retry_budget.h: a share of the calls, counted in a lock-free window.
#include "sluice/local/retry_budget.h"

#include "local/bucket_word.h"

namespace sluice {
namespace {

using bucket_word::behind;
using bucket_word::epoch_of;
using bucket_word::kCountMask;
using bucket_word::kEpochMask;
using bucket_word::kHalfRange;
using bucket_word::pack;
// [epoch][calls][retries]
constexpr std::uint32_t calls_of(std::uint64_t w) noexcept { return bucket_word::a_of(w); }
constexpr std::uint32_t retries_of(std::uint64_t w) noexcept { return bucket_word::b_of(w); }

}  // namespace

std::string_view retry_budget_error(const RetryBudgetOptions& o) noexcept {
  if (!(o.ratio >= 0 && o.ratio <= 1)) return "ratio: must be 0..1";
  if (!(o.per_second >= 0 && o.per_second <= 1e6)) return "per_second: must be 0..1000000";
  if (o.window < std::chrono::milliseconds(10)) return "window: must be at least 10ms";
  return {};
}

RetryBudget::RetryBudget(RetryBudgetOptions o) noexcept
    : options_(o), width_(o.window / static_cast<std::int64_t>(kBuckets)) {}

void RetryBudget::record_call(Nanos now) noexcept {
  const auto e64 = static_cast<std::uint64_t>(now.count() / width_.count());
  const auto epoch = static_cast<std::uint32_t>(e64 & kEpochMask);
  std::atomic<std::uint64_t>& slot = slots_[e64 % kBuckets];
  std::uint64_t old = slot.load(std::memory_order_relaxed);
  for (;;) {
    std::uint64_t next;
    if (epoch_of(old) == epoch) {
      if (calls_of(old) >= kCountMask) return;  // saturated
      next = pack(epoch, calls_of(old) + 1, retries_of(old));
    } else if (behind(epoch, epoch_of(old)) >= kHalfRange && old != 0) {
      return;  // the slot holds a newer bucket (a clock read behind): not counted
    } else {
      next = pack(epoch, 1, 0);
    }
    if (slot.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed))
      return;
  }
}

RetryBudget::Counts RetryBudget::sums(Nanos now, std::size_t skip_slot) const noexcept {
  const auto e64 = static_cast<std::uint64_t>(now.count() / width_.count());
  const auto epoch = static_cast<std::uint32_t>(e64 & kEpochMask);
  Counts c;
  for (std::size_t i = 0; i < kBuckets && i <= e64; ++i) {
    const std::size_t slot = (e64 - i) % kBuckets;
    if (slot == skip_slot) continue;
    const std::uint64_t w = slots_[slot].load(std::memory_order_acquire);
    if (w == 0 || behind(epoch, epoch_of(w)) != i) continue;  // empty, aged out or ahead
    c.calls += calls_of(w);
    c.retries += retries_of(w);
  }
  return c;
}

bool RetryBudget::try_retry(Nanos now) noexcept {
  const auto e64 = static_cast<std::uint64_t>(now.count() / width_.count());
  const auto epoch = static_cast<std::uint32_t>(e64 & kEpochMask);
  const std::size_t slot_index = e64 % kBuckets;
  const Counts others = sums(now, slot_index);
  const double allowance =
      options_.per_second * std::chrono::duration<double>(options_.window).count();
  std::atomic<std::uint64_t>& slot = slots_[slot_index];
  std::uint64_t old = slot.load(std::memory_order_relaxed);
  for (;;) {
    std::uint32_t calls = 0, retries = 0;
    if (epoch_of(old) == epoch) {
      calls = calls_of(old);
      retries = retries_of(old);
    } else if (behind(epoch, epoch_of(old)) >= kHalfRange && old != 0) {
      return false;  // the slot holds a newer bucket: a clock read behind; not spent
    }
    if (retries >= kCountMask) return false;
    const double total_calls = static_cast<double>(others.calls + calls);
    const double spent = static_cast<double>(others.retries + retries) + 1;
    if (spent > options_.ratio * total_calls + allowance) return false;
    const std::uint64_t next = pack(epoch, calls, retries + 1);
    if (slot.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed))
      return true;
  }
}

RetryBudget::Counts RetryBudget::counts(Nanos now) const noexcept {
  Counts c = sums(now, kBuckets);
  c.allowed = options_.ratio * static_cast<double>(c.calls) +
              options_.per_second * std::chrono::duration<double>(options_.window).count();
  return c;
}

}  // namespace sluice
