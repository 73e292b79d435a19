#include "server/policy.h"

#include "local/tick_loop.h"
#include "server/json_text.h"
#include "server/registry.h"

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

StatusOr<RateCharge> RateFamily::charge(std::string_view /*key*/, std::uint64_t /*hits*/,
                                        Nanos /*now*/) {
  return Status(StatusCode::kFailedPrecondition, "its kind takes no charges");
}

Policy::Policy(std::string name, std::string kind, std::string rate)
    : name_(std::move(name)), kind_(std::move(kind)), rate_(std::move(rate)) {}

Policy::~Policy() {
  for (auto& loop : loops_) loop->stop();
}

void Policy::start_loop(const Clock& clock, std::function<Nanos(Nanos now)> tick) {
  loops_.push_back(std::make_unique<TickLoop>(clock, std::move(tick)));
}

void Policy::wake_loops() noexcept {
  for (auto& loop : loops_) loop->wake();
}

void Policy::retire() noexcept {
  if (retired_.exchange(true, std::memory_order_acq_rel)) return;
  on_retiring();
  for (auto& loop : loops_) loop->stop();
  on_retire();
}

StatusOr<Policy::Reconfiguration> Policy::reconfigure(const BuildContext& /*c*/) {
  return Reconfiguration{};
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
  const std::uint64_t denied = shadow_denied_.load(std::memory_order_relaxed);
  if (shadow() || denied > 0) {
    j["shadow"] = shadow();
    j["shadow_denied"] = denied;
  }
  j["retired"] = retired();
  return j;
}

PolicyInfo Policy::info() const {
  PolicyInfo i;
  i.state_json = json_text(state(&i));
  return i;
}

std::vector<MetricFamily> Policy::collect() const {
  std::vector<MetricFamily> out;
  out.push_back(one("sluice_policy_info", "Policies in force (value 1), by kind", MetricType::Gauge,
                    1, {{"kind", kind_}}));
  metrics(out);
  const std::uint64_t denied = shadow_denied_.load(std::memory_order_relaxed);
  if (shadow() || denied > 0)
    out.push_back(one("sluice_shadow_denied_total",
                      "Calls the policy would have refused, allowed because it runs in shadow",
                      MetricType::Counter, static_cast<double>(denied)));
  return out;
}

}  // namespace sluice::server
