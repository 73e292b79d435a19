// Bounded metric labels (server/labels.h): the (max+1)-th distinct value and every hostile one
// fold into overflow; Space-Saving's guarantee against exact counts over seeded random streams;
// a heavy hitter among one-off keys; concurrent callers; the top-K metric family.
#include "server/labels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace sluice::server {
namespace {

TEST(SafeLabelValue, AcceptsPrintableAsciiUpToTheBound) {
  EXPECT_TRUE(safe_label_value("app-1"));
  EXPECT_TRUE(safe_label_value("a b~!\"\\{}"));
  EXPECT_TRUE(safe_label_value(std::string(kMaxLabelValueBytes, 'x')));
  EXPECT_FALSE(safe_label_value(""));
  EXPECT_FALSE(safe_label_value(std::string(kMaxLabelValueBytes + 1, 'x')));
  EXPECT_FALSE(safe_label_value("line\nbreak"));
  EXPECT_FALSE(safe_label_value(std::string("nul\0byte", 8)));
  EXPECT_FALSE(safe_label_value("del\x7f"));
  EXPECT_FALSE(safe_label_value("caf\xc3\xa9"));
}

TEST(BoundedLabels, AdmitsTheFirstMaxValuesThenFoldsIntoOverflow) {
  BoundedLabels labels(3);
  EXPECT_EQ(labels.label("a"), "a");
  EXPECT_EQ(labels.label("b"), "b");
  EXPECT_EQ(labels.label("a"), "a");
  EXPECT_EQ(labels.label("c"), "c");
  EXPECT_EQ(labels.overflowed(), 0u);

  EXPECT_EQ(labels.label("d"), "__other__");  // the 4th distinct value
  EXPECT_EQ(labels.label("e"), "__other__");
  EXPECT_EQ(labels.label("d"), "__other__");  // still not admitted
  EXPECT_EQ(labels.label("b"), "b");          // admitted ones stay admitted
  EXPECT_EQ(labels.size(), 3u);
  EXPECT_EQ(labels.overflowed(), 3u);
}

TEST(BoundedLabels, HostileValuesFoldAndTakeNoSlot) {
  BoundedLabels labels(2, "other");
  EXPECT_EQ(labels.label(std::string(kMaxLabelValueBytes + 1, 'x')), "other");
  EXPECT_EQ(labels.label(std::string(1 << 20, 'y')), "other");
  EXPECT_EQ(labels.label("evil\n# TYPE x counter"), "other");
  EXPECT_EQ(labels.label(std::string("a\0b", 3)), "other");
  EXPECT_EQ(labels.label("\x1b[2J"), "other");
  EXPECT_EQ(labels.label("\xff\xfe"), "other");
  EXPECT_EQ(labels.label(""), "other");
  EXPECT_EQ(labels.size(), 0u);
  EXPECT_EQ(labels.overflowed(), 7u);

  // The slots are still there for well-formed values.
  EXPECT_EQ(labels.label(std::string(kMaxLabelValueBytes, 'x')),
            std::string(kMaxLabelValueBytes, 'x'));
  EXPECT_EQ(labels.label("ok"), "ok");
  EXPECT_EQ(labels.size(), 2u);
}

TEST(BoundedLabels, TheOverflowValueItselfTakesNoSlot) {
  BoundedLabels labels(1);
  EXPECT_EQ(labels.label("__other__"), "__other__");
  EXPECT_EQ(labels.size(), 0u);
  EXPECT_EQ(labels.label("real"), "real");
}

TEST(BoundedLabels, ZeroMaxValuesFoldsEverything) {
  BoundedLabels labels(0);
  EXPECT_EQ(labels.label("a"), "__other__");
  EXPECT_EQ(labels.size(), 0u);
  EXPECT_EQ(labels.overflowed(), 1u);
}

TEST(BoundedLabels, ConcurrentCallersNeverAdmitMoreThanTheBound) {
  constexpr std::size_t kMax = 10;
  constexpr int kThreads = 8;
  constexpr int kValues = 100;
  BoundedLabels labels(kMax);
  std::vector<std::set<std::string>> as_self(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kValues; ++i) {
        const std::string v = "v" + std::to_string((i + t * 13) % kValues);
        const std::string got = labels.label(v);
        if (got == v) {
          as_self[t].insert(v);
        } else {
          EXPECT_EQ(got, "__other__");
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  std::set<std::string> admitted;
  std::uint64_t self_calls = 0;
  for (const auto& s : as_self) {
    admitted.insert(s.begin(), s.end());
    self_calls += s.size();
  }
  EXPECT_EQ(admitted.size(), kMax);
  EXPECT_EQ(labels.size(), kMax);
  EXPECT_EQ(labels.overflowed(), std::uint64_t{kThreads} * kValues - self_calls);
}

// Checks Space-Saving's guarantee for every key of `exact` (true weights) against `t`.
void expect_guarantee(const TopK& t, const std::map<std::string, std::uint64_t>& exact) {
  const auto top = t.top();
  ASSERT_LE(top.size(), t.k());
  std::uint64_t total = 0;
  for (const auto& [key, n] : exact) total += n;
  ASSERT_EQ(t.total(), total);

  std::map<std::string, TopK::Entry> reported;
  std::uint64_t sum = 0;
  for (const auto& e : top) {
    reported[e.key] = e;
    sum += e.count;
    const std::uint64_t truth = exact.count(e.key) ? exact.at(e.key) : 0;
    EXPECT_LE(e.count - e.error, truth) << e.key;
    EXPECT_GE(e.count, truth) << e.key;
    EXPECT_LE(e.error * t.k(), total) << e.key;  // error <= total / k
  }
  EXPECT_EQ(sum, total);  // every add lands on exactly one counter
  for (const auto& [key, n] : exact) {
    if (n * t.k() > total) {
      EXPECT_TRUE(reported.count(key)) << key << " (" << n << " of " << total << ") is missing";
    }
  }
}

TEST(TopK, ExactWhileAtMostKDistinctKeys) {
  TopK t(4);
  std::map<std::string, std::uint64_t> exact;
  const std::vector<std::pair<std::string, std::uint64_t>> adds = {{"a", 3}, {"b", 1}, {"c", 7},
                                                                   {"a", 2}, {"d", 1}, {"b", 4}};
  for (const auto& [key, n] : adds) {
    t.add(key, n);
    exact[key] += n;
  }
  const auto top = t.top();
  ASSERT_EQ(top.size(), 4u);
  for (const auto& e : top) {
    EXPECT_EQ(e.count, exact[e.key]) << e.key;
    EXPECT_EQ(e.error, 0u) << e.key;
  }
  EXPECT_EQ(t.total(), 18u);
}

TEST(TopK, OrdersByCountDescendingThenKey) {
  TopK t(8);
  t.add("m", 2);
  t.add("z", 5);
  t.add("b", 2);
  t.add("a", 5);
  t.add("q", 1);
  t.add("x", 0);  // nothing happens
  const auto top = t.top();
  std::vector<std::string> keys;
  for (const auto& e : top) keys.push_back(e.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "z", "b", "m", "q"}));
}

TEST(TopK, HeavyHitterAmongOneOffKeysIsReportedWithinItsError) {
  constexpr std::size_t kK = 10;
  TopK t(kK);
  std::map<std::string, std::uint64_t> exact;
  int next = 0;
  for (int round = 0; round < 1000; ++round) {
    t.add("hot");
    ++exact["hot"];
    for (int i = 0; i < 4; ++i) {
      const std::string key = "one-off-" + std::to_string(next++);
      t.add(key);
      ++exact[key];
    }
  }
  const auto top = t.top();
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(top.front().key, "hot");
  EXPECT_LE(top.front().count - top.front().error, 1000u);
  EXPECT_GE(top.front().count, 1000u);
  EXPECT_LE(top.front().error, t.total() / kK);
  expect_guarantee(t, exact);
}

TEST(TopK, RandomStreamsKeepTheGuaranteeAgainstExactCounts) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const std::size_t k = 1 + rng() % 24;
    const int universe = 10 + static_cast<int>(rng() % 2000);
    // Skewed: a key's index is universe * u^skew, so low indexes are heavy.
    const double skew = 1.0 + static_cast<double>(rng() % 5);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    TopK t(k);
    std::map<std::string, std::uint64_t> exact;
    for (int i = 0; i < 20000; ++i) {
      const auto idx = static_cast<int>(universe * std::pow(unit(rng), skew));
      const std::string key = "key-" + std::to_string(idx);
      const std::uint64_t n = 1 + rng() % 4;
      t.add(key, n);
      exact[key] += n;
    }
    expect_guarantee(t, exact);
    if (HasFailure()) return;
  }
}

TEST(TopK, AdversarialChurnKeepsTheGuarantee) {
  // Keys cycle through k + 1 values, so every add of a new key evicts the next one due.
  TopK t(5);
  std::map<std::string, std::uint64_t> exact;
  for (int i = 0; i < 6000; ++i) {
    const std::string key = "c" + std::to_string(i % 6);
    t.add(key);
    ++exact[key];
    if (i % 3 == 0) {
      t.add("steady", 2);
      exact["steady"] += 2;
    }
  }
  expect_guarantee(t, exact);
}

TEST(TopK, MemoryStaysBoundedByK) {
  TopK t(16);
  for (int i = 0; i < 100000; ++i) t.add("distinct-" + std::to_string(i));
  EXPECT_EQ(t.top().size(), 16u);
  EXPECT_EQ(t.total(), 100000u);
}

TEST(TopK, ZeroKHoldsNothingButCountsTotal) {
  TopK t(0);
  t.add("a", 5);
  t.add("b");
  EXPECT_TRUE(t.top().empty());
  EXPECT_EQ(t.total(), 6u);
}

TEST(TopK, ConcurrentAddsKeepTotalExact) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 20000;
  TopK t(16);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&t, th] {
      for (int i = 0; i < kAdds; ++i) {
        t.add("k" + std::to_string((i * 7 + th) % 50), 1 + i % 3);
      }
    });
  }
  for (auto& th : threads) th.join();

  std::uint64_t expected = 0;
  for (int i = 0; i < kAdds; ++i) expected += 1 + i % 3;
  expected *= kThreads;
  EXPECT_EQ(t.total(), expected);
  std::uint64_t sum = 0;
  for (const auto& e : t.top()) sum += e.count;
  EXPECT_EQ(sum, expected);
  EXPECT_LE(t.top().size(), 16u);
}

TEST(TopKFamily, OneCounterSeriesPerEntryLabelledByKey) {
  TopK t(4);
  t.add("app-a", 5);
  t.add("app-b", 2);
  const auto f = top_k_family("sluice_top_apps", "Heaviest apps", "app", t);
  EXPECT_EQ(f.name, "sluice_top_apps");
  EXPECT_EQ(f.help, "Heaviest apps");
  EXPECT_EQ(f.type, prometheus::MetricType::Counter);
  ASSERT_EQ(f.metric.size(), 2u);
  ASSERT_EQ(f.metric[0].label.size(), 1u);
  EXPECT_EQ(f.metric[0].label[0].name, "app");
  EXPECT_EQ(f.metric[0].label[0].value, "app-a");
  EXPECT_EQ(f.metric[0].counter.value, 5.0);
  EXPECT_EQ(f.metric[1].label[0].value, "app-b");
  EXPECT_EQ(f.metric[1].counter.value, 2.0);
}

TEST(TopKFamily, UnsafeKeysAreSummedIntoOneOverflowSeries) {
  TopK t(8);
  t.add("fine", 4);
  t.add("bad\nkey", 3);
  t.add(std::string(kMaxLabelValueBytes + 1, 'x'), 2);
  t.add("__other__", 1);  // a client naming the overflow value gets no series of its own
  const auto f = top_k_family("m", "h", "key", t);
  ASSERT_EQ(f.metric.size(), 2u);
  EXPECT_EQ(f.metric[0].label[0].value, "fine");
  EXPECT_EQ(f.metric[0].counter.value, 4.0);
  EXPECT_EQ(f.metric[1].label[0].value, "__other__");
  EXPECT_EQ(f.metric[1].counter.value, 6.0);

  TopK empty(3);
  EXPECT_TRUE(top_k_family("m", "h", "key", empty).metric.empty());
}

}  // namespace
}  // namespace sluice::server
