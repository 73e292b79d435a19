#include "server/labels.h"

#include <algorithm>
#include <tuple>

namespace sluice::server {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

bool safe_label_value(std::string_view value) noexcept {
  if (value.empty() || value.size() > kMaxLabelValueBytes) return false;
  return std::all_of(value.begin(), value.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b >= 0x20 && b <= 0x7e;
  });
}

std::string BoundedLabels::label(std::string_view value) {
  const bool safe = safe_label_value(value) && value != overflow_;
  std::lock_guard<std::mutex> lock(mu_);
  if (safe) {
    if (admitted_.find(value) != admitted_.end()) return std::string(value);
    if (admitted_.size() < max_values_) return *admitted_.emplace(value).first;
  }
  ++overflowed_;
  return overflow_;
}

std::size_t BoundedLabels::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admitted_.size();
}

std::uint64_t BoundedLabels::overflowed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return overflowed_;
}

void TopK::add(std::string_view key, std::uint64_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  total_ += n;
  if (k_ == 0) return;
  if (auto it = counters_.find(key); it != counters_.end()) {
    bump(it->second, n);
  } else if (counters_.size() < k_) {
    const auto pos = counters_.emplace(std::string(key), Counter{}).first;
    pos->second.slot = by_count_.emplace(n, &pos->first);
  } else {
    replace_min(key, n);
  }
}

void TopK::bump(Counter& c, std::uint64_t n) {
  auto node = by_count_.extract(c.slot);
  node.key() += n;
  c.slot = by_count_.insert(std::move(node));
}

// The smallest counter (count m) goes to `key` as (m + n, error m). Both nodes are reused.
void TopK::replace_min(std::string_view key, std::uint64_t n) {
  const auto min = by_count_.begin();
  const std::uint64_t m = min->first;
  auto node = counters_.extract(counters_.find(*min->second));
  node.key().assign(key);
  node.mapped().error = m;
  auto pos = counters_.insert(std::move(node)).position;
  min->second = &pos->first;
  pos->second.slot = min;
  bump(pos->second, n);
}

std::vector<TopK::Entry> TopK::top() const {
  std::vector<Entry> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.reserve(counters_.size());
    for (const auto& [key, c] : counters_) out.push_back(Entry{key, c.slot->first, c.error});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return std::tie(b.count, a.key) < std::tie(a.count, b.key);
  });
  return out;
}

std::uint64_t TopK::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

MetricFamily top_k_family(const std::string& name, const std::string& help,
                          const std::string& label, const TopK& t) {
  MetricFamily f{name, help, MetricType::Counter, {}};
  std::uint64_t folded = 0;
  bool any_folded = false;
  for (const auto& e : t.top()) {
    if (!safe_label_value(e.key) || e.key == kOverflowLabel) {
      folded += e.count;
      any_folded = true;
      continue;
    }
    ClientMetric m;
    m.label = {{label, e.key}};
    m.counter.value = static_cast<double>(e.count);
    f.metric.push_back(std::move(m));
  }
  if (any_folded) {
    ClientMetric m;
    m.label = {{label, std::string(kOverflowLabel)}};
    m.counter.value = static_cast<double>(folded);
    f.metric.push_back(std::move(m));
  }
  return f;
}

}  // namespace sluice::server
