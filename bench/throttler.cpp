// The throttler's in-process check (sluice/core/throttler.h: throttle_check), the lookup behind
// every GET/HEAD /throttler/check: one metric on one host, and three metrics of three hosts
// each (a shard's replicas), for an app with a rule, against the floor (an atomic pair). The
// samples are cached values, as the server's probes leave them; the check reads them, decides,
// builds its result (names, values, reasons) and records the app in the audit.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/floor.h"
#include "common/ratio_main.h"
#include "sluice/core/throttler.h"

namespace {

using sluice::Nanos;
using sluice::ThrottleMetric;
using sluice::ThrottleSample;

std::vector<ThrottleMetric> metrics(int count, int hosts, Nanos now) {
  std::vector<ThrottleMetric> out;
  for (int m = 0; m < count; ++m) {
    ThrottleMetric metric;
    metric.name = "metric-" + std::to_string(m);
    metric.threshold = 10;
    metric.stale_intervals = 5;
    for (int h = 0; h < hosts; ++h) {
      ThrottleSample s;
      s.host = "replica-" + std::to_string(h) + ":3306";
      s.value = 0.5 + h;
      s.taken_at = now - std::chrono::milliseconds(20);
      s.interval = std::chrono::milliseconds(100);
      metric.hosts.push_back(std::move(s));
    }
    out.push_back(std::move(metric));
  }
  return out;
}

void run(benchmark::State& state, int count, int hosts) {
  const Nanos now = std::chrono::seconds(1000);
  const std::vector<ThrottleMetric> m = metrics(count, hosts, now);
  std::map<std::string, sluice::ThrottleAppRule, std::less<>> rules;
  rules["gh-ost"].thresholds["metric-0"] = 20;
  const sluice::ThrottleOptions options;
  sluice::ThrottlerState audit;
  const sluice::ThrottleCheck check{"gh-ost", sluice::ThrottleScope::kDefault, false, 0.5};
  for (auto _ : state)
    benchmark::DoNotOptimize(
        sluice::throttle_check(m, rules, options, audit, check, "10.0.0.7:51500", now));
}

void BM_Throttle_OneMetric(benchmark::State& state) { run(state, 1, 1); }
void BM_Throttle_ThreeMetricsOfThreeHosts(benchmark::State& state) { run(state, 3, 3); }

}  // namespace

using sluice::bench::BM_Floor_FetchAddSub;
BENCHMARK(BM_Floor_FetchAddSub);
BENCHMARK(BM_Throttle_OneMetric);
BENCHMARK(BM_Throttle_ThreeMetricsOfThreeHosts);

SLUICE_BENCH_RATIO("BM_Throttle_OneMetric", "BM_Floor_FetchAddSub", 0);
SLUICE_BENCH_RATIO("BM_Throttle_ThreeMetricsOfThreeHosts", "BM_Floor_FetchAddSub", 0);

SLUICE_BENCH_MAIN();
