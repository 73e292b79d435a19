// Engine::metrics_text(): the server's Prometheus exposition, every policy's and coordinator's
// families merged under one name each, labelled with what they come from.
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "server/coordinators.h"
#include "server/engine.h"
#include "server/policy.h"
#include "server/policy_set.h"
#include "sluice/core/text.h"

namespace sluice::server {

namespace {

class Families {
 public:
  void add(prometheus::MetricFamily f) {
    prometheus::MetricFamily& into = family(f.name, f.help, f.type);
    for (auto& m : f.metric) into.metric.push_back(std::move(m));
  }
  prometheus::MetricFamily& family(const std::string& name, const std::string& help,
                                   prometheus::MetricType type) {
    auto it = index_.find(name);
    if (it != index_.end()) return out_[it->second];
    index_.emplace(name, out_.size());
    out_.push_back(prometheus::MetricFamily{name, help, type, {}});
    return out_.back();
  }
  // Folds in families from a collectable, each series labelled with the policy.
  void merge(std::vector<prometheus::MetricFamily> fams, const std::string& label,
             const std::string& value) {
    for (auto& f : fams) {
      prometheus::MetricFamily& into = family(f.name, f.help, f.type);
      for (auto& m : f.metric) {
        m.label.insert(m.label.begin(), prometheus::ClientMetric::Label{label, value});
        into.metric.push_back(std::move(m));
      }
    }
  }
  std::vector<prometheus::MetricFamily>& out() { return out_; }

 private:
  std::vector<prometheus::MetricFamily> out_;
  std::map<std::string, std::size_t> index_;
};

}  // namespace

std::string Engine::metrics_text() const {
  const auto set = current();
  Families f;
  using prometheus::MetricType;
  f.add(one("sluice_config_generation",
            "Generation of the config in force (1 at start, +1 per reload)", MetricType::Gauge,
            static_cast<double>(set->generation)));
  f.add(by_label("sluice_config_reloads_total", "Config reloads by result", "result",
                 {{"ok", reloads_.load(std::memory_order_relaxed)},
                  {"error", reload_failures_.load(std::memory_order_relaxed)}}));
  f.add(one("sluice_leases", "Leases held now (admitted calls not yet released or expired)",
            MetricType::Gauge, static_cast<double>(leases_.size())));
  f.add(one("sluice_leases_expired_total",
            "Leases that expired (their client stopped heartbeating)", MetricType::Counter,
            static_cast<double>(leases_.expired_total())));
  f.add(one("sluice_draining", "1 while the server shuts down", MetricType::Gauge,
            draining() ? 1 : 0));
  for (const auto& [name, named] : set->coordinators)
    f.merge(named->collect(), "coordinator", name);
  for (const auto& [name, p] : set->policies) f.merge(p.base->collect(), "policy", name);
  {
    const std::lock_guard lock(parts_mu_);
    for (const auto& [name, part] : parts_) f.merge(part->collect(), "listener", name);
  }
  // The exposition is UTF-8: a label value that is not (a stored string) is written repaired,
  // so one value can never make the whole scrape unreadable.
  std::vector<prometheus::MetricFamily>& out = f.out();
  for (prometheus::MetricFamily& family : out)
    for (prometheus::ClientMetric& m : family.metric)
      for (prometheus::ClientMetric::Label& l : m.label)
        if (!is_utf8(l.value)) l.value = utf8_or_replaced(l.value);
  std::string text = prometheus::TextSerializer().Serialize(out);
  // The text format spells a missing value NaN; the serializer writes "Nan" (a failed throttler
  // sample). A sample's value ends its line, and a label value cannot hold a raw newline.
  for (std::size_t at = text.find(" Nan\n"); at != std::string::npos;
       at = text.find(" Nan\n", at + 5))
    text[at + 3] = 'N';
  return text;
}

}  // namespace sluice::server
