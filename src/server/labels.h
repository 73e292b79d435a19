// labels.h: metric labels whose values clients choose, with a bound on how many series they make.
//
// What it is: per-app, per-node and top-K metrics label their series with values that come from
// requests, so a hostile client that sends a new value on every call would otherwise grow
// /metrics and the server's memory without bound. Two answers:
//   - BoundedLabels admits the first `max_values` distinct values and folds every later one
//     into one overflow value ("__other__"): the series are exact for the values admitted.
//   - TopK keeps the k heaviest keys of a stream with the Space-Saving algorithm (Metwally,
//     Agrawal and El Abbadi, "Efficient computation of frequent and top-k elements in data
//     streams", ICDT 2005), whatever order the keys arrive in: the series are approximate,
//     with a stated error, and follow the keys that are heavy now.
// A value is only used as a label if it is a safe label value (safe_label_value()): 1 to
// kMaxLabelValueBytes bytes of printable ASCII. Anything else (a 1 MB key, a newline, bytes that
// are not ASCII) goes to the overflow value, so what a client sends can neither break the
// exposition format nor make long series.
//
// Thread-safety: every member of both classes is safe to call concurrently (each holds one
// mutex; nothing is called while it is held).
#pragma once

#include <prometheus/metric_family.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/string_map.h"

namespace sluice::server {

// The longest label value a client's value may become.
inline constexpr std::size_t kMaxLabelValueBytes = 128;
// The label value that stands for every value not given a series of its own.
inline constexpr std::string_view kOverflowLabel = "__other__";

// Whether `value` may be used as a label value as it is: 1 to kMaxLabelValueBytes bytes, each
// printable ASCII (0x20 to 0x7e). Empty is not (Prometheus reads an empty value as no label).
[[nodiscard]] bool safe_label_value(std::string_view value) noexcept;

// The first `max_values` distinct safe values, each as itself; everything else as `overflow`.
//
// Invariants: size() <= max_values; a value once admitted is admitted for the object's life
// (its series never changes name); a value equal to `overflow`, or not safe, takes no slot.
// Memory: at most max_values values of at most kMaxLabelValueBytes bytes each.
class BoundedLabels {
 public:
  explicit BoundedLabels(std::size_t max_values, std::string overflow = std::string(kOverflowLabel))
      : max_values_(max_values), overflow_(std::move(overflow)) {}

  // `value` if it is admitted or can be (there is a slot left and it is safe); else overflow.
  [[nodiscard]] std::string label(std::string_view value);

  // How many values are admitted.
  [[nodiscard]] std::size_t size() const;
  // How many calls to label() were answered with the overflow value.
  [[nodiscard]] std::uint64_t overflowed() const;
  [[nodiscard]] std::size_t max_values() const noexcept { return max_values_; }
  [[nodiscard]] const std::string& overflow() const noexcept { return overflow_; }

 private:
  const std::size_t max_values_;
  const std::string overflow_;
  mutable std::mutex mu_;
  std::unordered_set<std::string, StringHash, std::equal_to<>> admitted_;  // guarded by mu_
  std::uint64_t overflowed_ = 0;                                           // guarded by mu_
};

// The heaviest keys of a weighted stream, in memory bounded by k (Space-Saving).
//
// The rule: keep at most k (key, count, error) counters. add(key, n):
//   - key has a counter:            count += n
//   - fewer than k counters:        a new counter (key, n, 0)
//   - otherwise:                    take the counter with the smallest count m (any, if tied),
//                                   give it to key as (key, m + n, m)
// Every add puts n on exactly one counter, so the counts sum to total(), and when k counters
// are held the smallest count is at most total()/k.
//
// The guarantee, for each entry of top(), with `true` the key's weight since add() began:
//   count - error <= true <= count        (count overestimates by at most error)
//   error <= total() / k
// and every key whose true weight is greater than total()/k is in top(). A key not in top()
// has a true weight of at most the smallest count. With at most k distinct keys every count is
// exact (error 0).
//
// Regimes: a skewed stream (a few heavy keys among many light ones) is reported with small
// errors; a flat stream of many keys churns the counters, and top() then holds keys of weight
// near total()/k whose errors are about as large as their counts.
//
// Keys are stored as given (whole; callers bound their length, as request keys are bounded),
// and top_k_family() decides which may be label values. k == 0 holds nothing (total() still
// counts). add() is O(log k) and allocates only while fewer than k keys are held (an evicted
// counter's storage is reused for the key that takes it).
class TopK {
 public:
  struct Entry {
    std::string key;
    std::uint64_t count = 0;
    std::uint64_t error = 0;
  };

  explicit TopK(std::size_t k) : k_(k) {}
  TopK(const TopK&) = delete;
  TopK& operator=(const TopK&) = delete;

  // Adds n to key's weight (n == 0: nothing happens).
  void add(std::string_view key, std::uint64_t n = 1);

  // The counters, by count descending, then by key ascending; at most k.
  [[nodiscard]] std::vector<Entry> top() const;
  // The sum of every n added.
  [[nodiscard]] std::uint64_t total() const;
  [[nodiscard]] std::size_t k() const noexcept { return k_; }

 private:
  // Counters ordered by count; each names its key (the key string lives in counters_).
  using ByCount = std::multimap<std::uint64_t, const std::string*>;
  struct Counter {
    std::uint64_t error = 0;
    ByCount::iterator slot;  // its place in by_count_; slot->first is its count
  };

  void bump(Counter& c, std::uint64_t n);  // count += n
  void replace_min(std::string_view key, std::uint64_t n);

  const std::size_t k_;
  mutable std::mutex mu_;
  StringMap<Counter> counters_;  // guarded by mu_; at most k_ entries
  ByCount by_count_;             // guarded by mu_; one entry per counter
  std::uint64_t total_ = 0;      // guarded by mu_
};

// A counter family `name` with one series per entry of t.top(), labelled `label`=key, valued by
// its count. Keys that are not safe label values, and a key equal to kOverflowLabel, are summed
// into one series labelled kOverflowLabel (present only if there are any), so every series has
// a distinct, safe label value.
[[nodiscard]] prometheus::MetricFamily top_k_family(const std::string& name,
                                                    const std::string& help,
                                                    const std::string& label, const TopK& t);

}  // namespace sluice::server
