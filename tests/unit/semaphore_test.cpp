#include "sluice/local/semaphore.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

namespace sluice {
namespace {

TEST(Semaphore, AdmitsUpToLimitThenRejects) {
  Semaphore sem(2);
  auto a = sem.try_acquire();
  auto b = sem.try_acquire();
  auto c = sem.try_acquire();
  EXPECT_TRUE(a.has_value());
  EXPECT_TRUE(b.has_value());
  EXPECT_FALSE(c.has_value());
  EXPECT_EQ(sem.in_flight(), 2u);
  EXPECT_EQ(sem.limit(), 2u);
}

TEST(Semaphore, ZeroLimitAdmitsNothing) {
  Semaphore sem(0);
  EXPECT_FALSE(sem.try_acquire().has_value());
  EXPECT_EQ(sem.in_flight(), 0u);
}

TEST(Permit, DestructorReleases) {
  Semaphore sem(1);
  {
    auto p = sem.try_acquire();
    ASSERT_TRUE(p);
    EXPECT_EQ(sem.in_flight(), 1u);
  }
  EXPECT_EQ(sem.in_flight(), 0u);
}

TEST(Permit, ExplicitReleaseIsIdempotent) {
  Semaphore sem(3);
  auto keep = sem.try_acquire();
  auto p = sem.try_acquire();
  ASSERT_TRUE(p);
  EXPECT_EQ(sem.in_flight(), 2u);
  p->release();
  p->release();
  EXPECT_FALSE(p->held());
  EXPECT_EQ(sem.in_flight(), 1u);
  p.reset();  // destroying a released permit gives nothing back twice
  EXPECT_EQ(sem.in_flight(), 1u);
}

TEST(Permit, MoveTransfersOwnership) {
  Semaphore sem(2);
  auto p = sem.try_acquire();
  ASSERT_TRUE(p);
  Permit moved = std::move(*p);
  EXPECT_FALSE(p->held());
  EXPECT_TRUE(moved.held());
  p.reset();
  EXPECT_EQ(sem.in_flight(), 1u);
  Permit other = *sem.try_acquire();
  EXPECT_EQ(sem.in_flight(), 2u);
  other = std::move(moved);  // move-assign releases what `other` held
  EXPECT_EQ(sem.in_flight(), 1u);
  other.release();
  EXPECT_EQ(sem.in_flight(), 0u);
}

TEST(Permit, NoLeakWhenAnExceptionUnwinds) {
  Semaphore sem(1);
  auto work = [&] {
    auto p = sem.try_acquire();
    ASSERT_TRUE(p);
    throw std::runtime_error("backend failed");
  };
  EXPECT_THROW(work(), std::runtime_error);
  EXPECT_EQ(sem.in_flight(), 0u);
}

TEST(Semaphore, LoweringTheLimitDrainsWithoutRevoking) {
  Semaphore sem(4);
  std::vector<Permit> held;
  for (int i = 0; i < 4; ++i) held.push_back(*sem.try_acquire());
  sem.set_limit(2);
  EXPECT_EQ(sem.in_flight(), 4u);  // nothing revoked
  EXPECT_FALSE(sem.try_acquire());
  held.pop_back();
  held.pop_back();
  EXPECT_EQ(sem.in_flight(), 2u);
  EXPECT_FALSE(sem.try_acquire());  // at the new limit
  held.pop_back();
  EXPECT_TRUE(sem.try_acquire());  // below it again
}

TEST(Semaphore, RaisingTheLimitAdmitsMore) {
  Semaphore sem(1);
  auto a = sem.try_acquire();
  EXPECT_FALSE(sem.try_acquire());
  sem.set_limit(2);
  EXPECT_TRUE(sem.try_acquire());
  EXPECT_EQ(sem.snapshot().limit, 2u);
}

TEST(Semaphore, LimitsAboveTheMaximumAreClamped) {
  Semaphore sem(0xFFFF'FFFFu);
  EXPECT_EQ(sem.limit(), Semaphore::kMaxLimit);
  sem.set_limit(0xFFFF'FFFFu);
  EXPECT_EQ(sem.limit(), Semaphore::kMaxLimit);
}

// A refused acquire leaves nothing behind: the count it bumped is rolled back.
TEST(Semaphore, RefusedAcquireRollsBack) {
  Semaphore sem(1);
  auto held = sem.try_acquire();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(sem.try_acquire());
  EXPECT_EQ(sem.in_flight(), 1u);
  EXPECT_EQ(sem.limit(), 1u);
}

TEST(Semaphore, LargestLimitDoesNotOverflowIntoTheCount) {
  Semaphore sem(Semaphore::kMaxLimit);
  auto p = sem.try_acquire();
  ASSERT_TRUE(p);
  EXPECT_EQ(sem.limit(), Semaphore::kMaxLimit);
  EXPECT_EQ(sem.in_flight(), 1u);
}

// 8 threads hammer one semaphore: every holder counts itself in a shadow counter right after
// admission and checks the number of holders never exceeds the limit (a check-then-act
// semaphore fails this); the count returns to zero at the end.
TEST(SemaphoreStress, EightThreadsNeverExceedTheLimit) {
  constexpr std::uint32_t kLimit = 5;
  constexpr int kThreads = 8;
  constexpr int kIterations = 50'000;
  Semaphore sem(kLimit);
  std::atomic<int> holders{0};
  std::atomic<int> max_holders{0};
  std::atomic<long> admitted{0};
  std::atomic<bool> violation{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIterations; ++i) {
        auto p = sem.try_acquire();
        if (!p) continue;
        const int now = holders.fetch_add(1) + 1;
        int seen = max_holders.load();
        while (now > seen && !max_holders.compare_exchange_weak(seen, now)) {
        }
        if (now > static_cast<int>(kLimit)) violation = true;
        admitted.fetch_add(1, std::memory_order_relaxed);
        holders.fetch_sub(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_FALSE(violation.load());
  EXPECT_LE(max_holders.load(), static_cast<int>(kLimit));
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(sem.in_flight(), 0u);
}

// Limit changes racing with acquires: an admission never happens at in_flight >= limit.
TEST(SemaphoreStress, LimitChangesRacingWithAcquires) {
  Semaphore sem(4);
  std::atomic<bool> stop{false};
  std::atomic<bool> violation{false};
  std::atomic<int> holders{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        auto p = sem.try_acquire();
        if (!p) continue;
        if (holders.fetch_add(1) + 1 > 8) violation = true;  // 8 is the largest limit ever set
        holders.fetch_sub(1);
      }
    });
  }
  for (int i = 0; i < 20'000; ++i) sem.set_limit(static_cast<std::uint32_t>(i % 9));
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_FALSE(violation.load());
  EXPECT_EQ(sem.in_flight(), 0u);
}

// Random acquire / release / limit-change sequences: every admission happens strictly below
// the limit in force, and releasing everything returns the count to zero (no leak).
RC_GTEST_PROP(SemaphoreProperty, RandomOpsKeepInFlightBelowLimitAndNeverLeak, ()) {
  const auto initial = *rc::gen::inRange<std::uint32_t>(0, 16);
  const auto ops = *rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 3));
  Semaphore sem(initial);
  std::uint32_t limit = initial;
  std::vector<Permit> held;
  for (int op : ops) {
    if (op == 0) {
      const std::uint32_t before = sem.in_flight();
      auto p = sem.try_acquire();
      RC_ASSERT(p.has_value() == (before < limit));
      if (p) held.push_back(std::move(*p));
    } else if (op == 1 && !held.empty()) {
      const auto idx = *rc::gen::inRange<std::size_t>(0, held.size());
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(idx));
    } else if (op == 2) {
      limit = *rc::gen::inRange<std::uint32_t>(0, 16);
      sem.set_limit(limit);
    }
    RC_ASSERT(sem.in_flight() == held.size());
  }
  held.clear();
  RC_ASSERT(sem.in_flight() == 0u);
}

}  // namespace
}  // namespace sluice
