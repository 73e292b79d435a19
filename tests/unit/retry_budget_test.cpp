// The retry budget (sluice/local/retry_budget.h) on a manual clock: retries fit within ratio x
// calls plus the allowance over the window, old calls age out, and concurrent retries never spend
// past the budget.
#include "sluice/local/retry_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

RetryBudgetOptions options(double ratio, double per_second) {
  RetryBudgetOptions o;
  o.ratio = ratio;
  o.per_second = per_second;
  o.window = seconds(10);
  return o;
}

int retries_allowed(RetryBudget& b, Nanos now) {
  int n = 0;
  while (n < 1'000'000 && b.try_retry(now)) ++n;
  return n;
}

TEST(RetryBudget, OptionsAreCheckedByName) {
  EXPECT_EQ(retry_budget_error(options(0.1, 10)), "");
  EXPECT_EQ(retry_budget_error(options(1.5, 10)), "ratio: must be 0..1");
  EXPECT_EQ(retry_budget_error(options(0.1, -1)), "per_second: must be 0..1000000");
  RetryBudgetOptions o = options(0.1, 1);
  o.window = milliseconds(1);
  EXPECT_EQ(retry_budget_error(o), "window: must be at least 10ms");
}

TEST(RetryBudget, RetriesAreAShareOfTheCallsPlusTheAllowance) {
  RetryBudget b(options(0.1, 1));  // 10% of calls + 1/s x 10 s
  const Nanos t = seconds(1000);
  EXPECT_EQ(retries_allowed(b, t), 10);  // the allowance alone
  for (int i = 0; i < 500; ++i) b.record_call(t + milliseconds(i));
  EXPECT_EQ(retries_allowed(b, t + seconds(1)), 50);  // 10 + 50 in all
  const RetryBudget::Counts c = b.counts(t + seconds(1));
  EXPECT_EQ(c.calls, 500u);
  EXPECT_EQ(c.retries, 60u);
  EXPECT_DOUBLE_EQ(c.allowed, 60);
}

TEST(RetryBudget, NoAllowanceAndNoCallsMeansNoRetry) {
  RetryBudget b(options(0.5, 0));
  EXPECT_FALSE(b.try_retry(seconds(1000)));
  b.record_call(seconds(1000));
  b.record_call(seconds(1000));
  EXPECT_TRUE(b.try_retry(seconds(1000)));
  EXPECT_FALSE(b.try_retry(seconds(1000)));
}

TEST(RetryBudget, CallsAndRetriesAgeOutOfTheWindow) {
  RetryBudget b(options(1, 0));
  const Nanos t = seconds(1000);
  for (int i = 0; i < 20; ++i) b.record_call(t);
  EXPECT_EQ(retries_allowed(b, t), 20);
  EXPECT_EQ(b.counts(t + seconds(9)).retries, 20u);
  // 10 s later the calls (and the retries spent on them) have left the window.
  EXPECT_EQ(b.counts(t + seconds(10)).calls, 0u);
  EXPECT_EQ(retries_allowed(b, t + seconds(10)), 0);
  b.record_call(t + seconds(10));
  EXPECT_EQ(retries_allowed(b, t + seconds(10)), 1);
}

TEST(RetryBudget, ConcurrentRetriesNeverSpendPastTheBudget) {
  RetryBudget b(options(0.25, 0));
  const Nanos t = seconds(1000);
  for (int i = 0; i < 4000; ++i) b.record_call(t);
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i)
        if (b.try_retry(t)) ++granted;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(granted.load(), 1000);
}

}  // namespace
}  // namespace sluice
