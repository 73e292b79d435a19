// retry_budget.h: a share of the calls, counted in a lock-free window.
#include "sluice/local/retry_budget.h"

#include <optional>
#include <utility>

#include "local/bucket_ring.h"

namespace sluice {
namespace {

namespace ring = bucket_ring;
// A bucket's new counters ([epoch][calls][retries]), or none: the bucket stays as it is.
using NewCounts = std::optional<std::pair<std::uint32_t, std::uint32_t>>;

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
  const ring::Position p = ring::position(now, width_, kBuckets);
  // Saturated: not counted. A slot holding a newer bucket (a clock read behind): not counted.
  (void)ring::update(slots_[p.slot], p, [](std::uint32_t calls, std::uint32_t retries) {
    return calls >= ring::kCountMask ? NewCounts{} : NewCounts{{calls + 1, retries}};
  });
}

RetryBudget::Counts RetryBudget::sums(Nanos now, std::size_t skip_slot) const noexcept {
  Counts c;
  ring::walk(slots_, ring::position(now, width_, kBuckets),
             [&](std::size_t i, std::size_t slot, std::uint64_t w, std::uint32_t behind) {
               if (slot == skip_slot || behind != i) return;  // skipped, aged out or ahead
               c.calls += ring::a_of(w);
               c.retries += ring::b_of(w);
             });
  return c;
}

bool RetryBudget::try_retry(Nanos now) noexcept {
  const ring::Position p = ring::position(now, width_, kBuckets);
  const Counts others = sums(now, p.slot);
  const double allowance =
      options_.per_second * std::chrono::duration<double>(options_.window).count();
  // A slot holding a newer bucket (a clock read behind): not spent.
  const ring::Update u =
      ring::update(slots_[p.slot], p, [&](std::uint32_t calls, std::uint32_t retries) {
        if (retries >= ring::kCountMask) return NewCounts{};
        const double total_calls = static_cast<double>(others.calls + calls);
        const double spent = static_cast<double>(others.retries + retries) + 1;
        if (spent > options_.ratio * total_calls + allowance) return NewCounts{};
        return NewCounts{{calls, retries + 1}};
      });
  return u.outcome == ring::Outcome::kWritten;
}

RetryBudget::Counts RetryBudget::counts(Nanos now) const noexcept {
  Counts c = sums(now, kBuckets);
  c.allowed = options_.ratio * static_cast<double>(c.calls) +
              options_.per_second * std::chrono::duration<double>(options_.window).count();
  return c;
}

}  // namespace sluice
