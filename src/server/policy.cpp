#include "server/policy.h"

namespace sluice::server {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily one(const std::string& name, const std::string& help, MetricType type, double value,
                 std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  return MetricFamily{name, help, type, {std::move(m)}};
}

MetricFamily by_label(const std::string& name, const std::string& help, const std::string& label,
                      std::initializer_list<std::pair<const char*, std::uint64_t>> series) {
  MetricFamily f{name, help, MetricType::Counter, {}};
  for (const auto& [value, n] : series) {
    ClientMetric m;
    m.label = {{label, value}};
    m.counter.value = static_cast<double>(n);
    f.metric.push_back(std::move(m));
  }
  return f;
}

void Policy::retire() noexcept {
  if (retired_.exchange(true, std::memory_order_acq_rel)) return;
  on_retire();
}

nlohmann::json Policy::state(PolicyInfo* info) const {
  PolicyInfo scratch;
  PolicyInfo& i = info != nullptr ? *info : scratch;
  i.name = name_;
  i.kind = kind_;
  i.rate = rate_;
  nlohmann::json j = {{"name", name_}, {"kind", kind_}};
  if (!rate_.empty()) j["rate"] = rate_;
  describe(j, i);
  j["retired"] = retired();
  return j;
}

PolicyInfo Policy::info() const {
  PolicyInfo i;
  i.state_json = state(&i).dump();
  return i;
}

std::vector<MetricFamily> Policy::collect() const {
  std::vector<MetricFamily> out;
  out.push_back(one("sluice_policy_info", "Policies in force (value 1), by kind", MetricType::Gauge,
                    1, {{"kind", kind_}}));
  metrics(out);
  return out;
}

}  // namespace sluice::server
