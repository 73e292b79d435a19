// Uses the installed headers and library the way a user's program would; exits non-zero if
// the semaphore or the gateway does not behave.
#include <sluice/gateway.h>
#include <sluice/gateway_metrics.h>
#include <sluice/semaphore.h>

#include <cstdio>

int main() {
  sluice::Semaphore sem(1);
  auto first = sem.try_acquire();
  auto second = sem.try_acquire();
  if (!first || second || sem.in_flight() != 1) return 1;
  first->release();
  if (sem.in_flight() != 0) return 2;

  sluice::GatewayConfig config;
  config.tenants = {{"acme", std::nullopt, std::nullopt}};
  sluice::UpstreamConfig upstream;
  upstream.id = "api";
  upstream.host = "api.example.com";
  upstream.owner = "acme";
  upstream.concurrency_limit = sluice::ConcurrencyLimit{};
  upstream.concurrency_limit->max_concurrent = 1;
  config.upstreams = {upstream};
  sluice::GatewayBuild built = sluice::Gateway::create(config);
  if (!built.gateway) return 3;
  sluice::Admission a = built.gateway->try_acquire("acme", "api");
  sluice::Admission b = built.gateway->try_acquire("acme", "api");
  if (!a || b || b.rejection() == nullptr) return 4;
  if (sluice::to_http_response(*b.rejection()).status != 503) return 5;
  if (sluice::GatewayMetrics(*built.gateway).Collect().empty()) return 6;
  std::puts("consumer: sluice::sluice found and working");
  return 0;
}
