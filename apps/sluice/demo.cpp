// sluice demo: drives the gateway limits with concurrent callers on an embedded config and
// prints, per host and level, the configured max, the peak in flight seen by a sampler, and
// what was admitted and refused; then one rejection as the problem+json a client would get.
#include "demo.h"

#include <fmt/core.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sluice/local/gateway.h"
#include "sluice/local/gateway_metrics.h"

namespace sluice::cli {
namespace {

ConcurrencyLimit limit(std::uint32_t max, std::optional<std::uint32_t> per_tenant = {},
                       std::optional<Sharing> sharing = {}) {
  ConcurrencyLimit l;
  l.max_concurrent = max;
  l.per_tenant_max = per_tenant;
  l.sharing = sharing;
  return l;
}

// Two organisations. acme owns a shared LLM upstream (inherited by its two teams, one with a
// stricter limit of its own) and a private billing upstream (a team brings its own pool);
// globex owns a search upstream and has a global limit across everything it calls.
GatewayConfig demo_config() {
  GatewayConfig c;
  c.tenants = {{"acme", std::nullopt, 24},
               {"acme-eu", "acme", 12},
               {"acme-lab", "acme", 6},
               {"globex", std::nullopt, 5}};
  UpstreamConfig llm;
  llm.id = "llm";
  llm.host = "llm.example.com";
  llm.owner = "acme";
  llm.concurrency_limit = limit(10, 5, Sharing::kInherit);
  llm.routes = {{"chat", 6}, {"embed", std::nullopt}};
  UpstreamConfig billing;
  billing.id = "billing";
  billing.host = "billing.example.com";
  billing.owner = "acme";
  billing.concurrency_limit = limit(3, std::nullopt, Sharing::kPrivate);
  UpstreamConfig search;
  search.id = "search";
  search.host = "search.example.com";
  search.owner = "globex";
  search.concurrency_limit = limit(8);
  search.routes = {{"query", 4}};
  c.upstreams = {llm, billing, search};
  c.bindings = {{"acme-eu", "llm", std::nullopt},
                {"acme-lab", "llm", limit(2)},
                {"acme-lab", "billing", limit(2)}};
  return c;
}

struct Call {
  const char* tenant;
  const char* upstream;
  const char* route;
};

constexpr Call kCalls[] = {
    {"acme", "llm", "chat"},     {"acme", "llm", "embed"},      {"acme-eu", "llm", "chat"},
    {"acme-eu", "llm", "embed"}, {"acme-lab", "llm", "chat"},   {"acme", "billing", ""},
    {"acme-lab", "billing", ""}, {"globex", "search", "query"}, {"globex", "search", ""},
};

double value_of(const prometheus::ClientMetric& m, prometheus::MetricType type) {
  return type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
}

std::string label(const prometheus::ClientMetric& m, const std::string& name) {
  for (const auto& l : m.label)
    if (l.name == name) return l.value;
  return {};
}

}  // namespace

int run_demo(const DemoOptions& options) {
  GatewayBuild build = Gateway::create(demo_config());
  if (!build.gateway) {
    fmt::print(stderr, "demo config is invalid:\n{}", build.report.to_string());
    return 1;
  }
  Gateway& g = *build.gateway;
  GatewayMetrics metrics(g);
  std::vector<Target> targets;
  for (const Call& c : kCalls) targets.push_back(g.resolve(c.tenant, c.upstream, c.route).target());

  fmt::print("sluice demo: {} callers for {:.1f} s on the embedded gateway config\n",
             options.threads, options.seconds);
  fmt::print("  tenants acme(24) > acme-eu(12), acme-lab(6); globex(5)\n");
  fmt::print("  llm: max 10, per tenant 5, inherit (acme-lab bound with max 2), chat max 6\n");
  fmt::print(
      "  billing: private max 3 (acme-lab brings its own pool of 2); search: max 8, "
      "query max 4\n\n");

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> admitted{0}, refused{0};
  std::mutex sample_mu;
  std::map<std::pair<std::string, std::string>, double> peak;
  std::optional<Rejection> example;

  std::thread sampler([&] {
    while (!stop.load()) {
      for (const auto& f : metrics.Collect()) {
        if (f.name != "sluice_requests_in_flight") continue;
        const std::lock_guard lock(sample_mu);
        for (const auto& m : f.metric) {
          double& p = peak[{label(m, "host"), label(m, "level")}];
          p = std::max(p, m.gauge.value);
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> callers;
  for (unsigned t = 0; t < options.threads; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 rng(options.seed + t);
      std::uniform_int_distribution<std::size_t> pick(0, targets.size() - 1);
      std::uniform_int_distribution<int> hold_us(100, 2000);
      while (!stop.load(std::memory_order_relaxed)) {
        Admission a = g.try_acquire(targets[pick(rng)]);
        if (!a) {
          refused.fetch_add(1, std::memory_order_relaxed);
          if (const Rejection* r = a.rejection(); r != nullptr && t == 0 && !example) {
            const std::lock_guard lock(sample_mu);
            example = *r;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          continue;
        }
        admitted.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::sleep_for(std::chrono::microseconds(hold_us(rng)));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(options.seconds));
  stop = true;
  for (auto& c : callers) c.join();
  sampler.join();

  std::map<std::pair<std::string, std::string>, std::map<std::string, double>> rows;
  for (const auto& f : metrics.Collect())
    for (const auto& m : f.metric)
      rows[{label(m, "host"), label(m, "level")}][f.name] = value_of(m, f.type);

  fmt::print("{:<22} {:<11} {:>5} {:>6} {:>10} {:>9}\n", "host", "level", "max", "peak",
             "in flight", "refused");
  bool within = true;
  for (const auto& [key, v] : rows) {
    const auto max = v.find("sluice_concurrency_limit_max");
    const auto exceeded = v.find("sluice_concurrency_limit_exceeded_total");
    const auto in_flight = v.find("sluice_requests_in_flight");
    const double p = peak[key];
    if (max != v.end() && p > max->second) within = false;
    fmt::print("{:<22} {:<11} {:>5} {:>6} {:>10} {:>9}\n", key.first, key.second,
               max == v.end() ? std::string("-") : fmt::format("{:.0f}", max->second),
               in_flight == v.end() ? std::string("-") : fmt::format("{:.0f}", p),
               in_flight == v.end() ? std::string("-") : fmt::format("{:.0f}", in_flight->second),
               exceeded == v.end() ? std::string("-") : fmt::format("{:.0f}", exceeded->second));
  }
  fmt::print("\ncalls admitted {}, refused {}; peak in flight within max at every sample: {}\n",
             admitted.load(), refused.load(), within ? "yes" : "NO");
  if (example) {
    const HttpResponse r = to_http_response(*example);
    fmt::print("\nexample rejection: HTTP {}, Retry-After: {}\n{}\n", r.status,
               r.header("Retry-After"), r.body);
  }
  return within ? 0 : 1;
}

}  // namespace sluice::cli
