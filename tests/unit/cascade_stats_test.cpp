// One node's stat buckets (sluice/local/cascade_stats.h) on explicit time: recording into the
// current bucket, lazy ageing, the sticky bucket (the last non-empty bucket to age out),
// saturation, and a concurrent stress test that loses no count.
#include "sluice/local/cascade_stats.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const Nanos kT0 = seconds(1'000'000);  // on a bucket boundary (5 s buckets)

CascadeBucket at(const CascadeNodeStats::Snapshot& s, std::size_t i) { return s.historical[i]; }

TEST(CascadeNodeStats, CallsLandInTheNewestBucketAndAgeOneBucketPerWidth) {
  CascadeNodeStats n;
  n.record(true, kT0);
  n.record(false, kT0 + milliseconds(4999));
  CascadeNodeStats::Snapshot s = n.snapshot(kT0 + seconds(1));
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(at(s, 0).finished, 2u);
  EXPECT_EQ(at(s, 0).succeeded, 1u);
  // 5 s later the same calls are one bucket older, 25 s later the oldest of the window.
  s = n.snapshot(kT0 + seconds(5));
  EXPECT_EQ(at(s, 0).finished, 0u);
  EXPECT_EQ(at(s, 1).finished, 2u);
  s = n.snapshot(kT0 + seconds(25));
  EXPECT_EQ(at(s, 5).finished, 2u);
  EXPECT_EQ(s.sticky.finished, 0u);
  // 30 s later they have aged out: nothing recent, and they are the sticky bucket (found by a
  // snapshot although no record has replaced their slot yet).
  s = n.snapshot(kT0 + seconds(30));
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(at(s, i).finished, 0u) << i;
  EXPECT_EQ(s.sticky.finished, 2u);
  EXPECT_EQ(s.sticky.succeeded, 1u);
}

TEST(CascadeNodeStats, TheStickyBucketIsTheLastNonEmptyBucketToAgeOut) {
  CascadeNodeStats n;
  n.record(false, kT0);               // epoch 0: 1 call, failed
  n.record(true, kT0 + seconds(10));  // epoch 2: 1 call, succeeded
  n.record(true, kT0 + seconds(10));
  // At epoch 7 epoch 0 has aged out (window 2..7), epoch 2 not yet.
  CascadeNodeStats::Snapshot s = n.snapshot(kT0 + seconds(35));
  EXPECT_EQ(s.sticky.finished, 1u);
  EXPECT_EQ(s.sticky.succeeded, 0u);
  EXPECT_EQ(at(s, 5).finished, 2u);
  // A call at epoch 6 replaces epoch 0's slot: epoch 0 moves to the sticky word.
  n.record(true, kT0 + seconds(30));
  // Much later both have aged out: the newer (epoch 2) is the sticky one, whether read from its
  // slot or moved to the sticky word by the call that replaces it.
  s = n.snapshot(kT0 + seconds(100));
  EXPECT_EQ(s.sticky.finished, 1u);  // epoch 6's bucket is newest of all aged out
  n.record(true, kT0 + seconds(200));
  s = n.snapshot(kT0 + seconds(200));
  EXPECT_EQ(at(s, 0).finished, 1u);
  EXPECT_EQ(s.sticky.finished, 1u);
  EXPECT_EQ(s.sticky.succeeded, 1u);
}

TEST(CascadeNodeStats, ABucketSaturatesKeepingItsRatio) {
  CascadeNodeStats n;
  for (std::uint32_t i = 0; i < CascadeNodeStats::kMaxCount + 10; ++i) n.record(i % 2 == 0, kT0);
  const CascadeNodeStats::Snapshot s = n.snapshot(kT0);
  EXPECT_EQ(at(s, 0).finished, CascadeNodeStats::kMaxCount);
  EXPECT_EQ(at(s, 0).succeeded, (CascadeNodeStats::kMaxCount + 1) / 2);
}

TEST(CascadeNodeStats, ARecordFromAClockReadBehindNeverOverwritesANewerBucket) {
  CascadeStatsOptions o;
  o.buckets = 2;
  CascadeNodeStats n(o);
  n.record(true, kT0 + seconds(10));  // epoch 2, slot 0
  n.record(false, kT0);               // epoch 0, slot 0: older than what the slot holds
  const CascadeNodeStats::Snapshot s = n.snapshot(kT0 + seconds(10));
  EXPECT_EQ(at(s, 0).finished, 1u);
  EXPECT_EQ(at(s, 0).succeeded, 1u);
}

TEST(CascadeNodeStats, OptionsAreChecked) {
  EXPECT_EQ(cascade_stats_error({}), "");
  CascadeStatsOptions o;
  o.buckets = 0;
  EXPECT_EQ(cascade_stats_error(o), "buckets: must be 1..16");
  o.buckets = 17;
  EXPECT_EQ(cascade_stats_error(o), "buckets: must be 1..16");
  o = {};
  o.width = Nanos{0};
  EXPECT_EQ(cascade_stats_error(o), "bucket_width: must be more than 0");
}

TEST(CascadeNodeStats, ConcurrentRecordsLoseNoCount) {
  CascadeNodeStats n;
  constexpr int kThreads = 4, kCalls = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) n.record((i + t) % 3 == 0, kT0 + milliseconds(i % 5000));
    });
  for (auto& t : threads) t.join();
  const CascadeNodeStats::Snapshot s = n.snapshot(kT0 + seconds(1));
  EXPECT_EQ(at(s, 0).finished, static_cast<std::uint32_t>(kThreads * kCalls));
  std::uint32_t successes = 0;
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kCalls; ++i) successes += (i + t) % 3 == 0 ? 1 : 0;
  EXPECT_EQ(at(s, 0).succeeded, successes);
}

TEST(CascadeNodeStats, ConcurrentRecordsAcrossBucketBoundariesCountEachCallOnce) {
  // Threads march through 12 buckets (two windows): every call lands in exactly one bucket,
  // which is either still in the window, the sticky one, or aged out before it; the last
  // window's counts are exact.
  CascadeNodeStats n;
  constexpr int kThreads = 4, kPerBucket = 2'000, kBuckets = 12;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int b = 0; b < kBuckets; ++b)
        for (int i = 0; i < kPerBucket; ++i) n.record(true, kT0 + seconds(5 * b) + milliseconds(i));
    });
  for (auto& t : threads) t.join();
  const CascadeNodeStats::Snapshot s = n.snapshot(kT0 + seconds(5 * (kBuckets - 1)));
  for (std::size_t i = 0; i < 6; ++i) {
    // Threads run at different speeds: a slow one may still write epoch k after a fast one
    // replaced it with k + 6, and its calls are then dropped -- but only for buckets that had
    // aged out; the newest six buckets' slots are never reused by a newer epoch here.
    EXPECT_EQ(at(s, i).finished, static_cast<std::uint32_t>(kThreads * kPerBucket)) << i;
  }
  EXPECT_GT(s.sticky.finished, 0u);
}

}  // namespace
}  // namespace sluice
