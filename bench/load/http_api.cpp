// The HTTP API's handlers without the sockets: handle_http as a session calls it, for GET
// /healthz (the floor), POST /v1/check (a JSON Check of one hit, over 1000 keys, on a GCRA
// policy that never denies) and GET /throttler/check (a throttler policy's cached samples). The
// session's own work (reading, parsing and writing HTTP) is the same for every path, so what a
// path costs here beyond /healthz is what moves its ratio in bench/load/wrk.sh. Each reports
// the heap allocations per request.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/allocations.h"
#include "common/ratio_main.h"
#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"
#include "transport/http_server.h"

namespace {

using sluice::server::Engine;
using sluice::transport::HttpExchange;

constexpr const char* kConfig = R"(
policies:
  bench-rate: {kind: rate, strategy: gcra, limit: 1000000000, period: 1s}
  db:
    kind: throttler
    metrics:
      load: {probe: loadavg, threshold: 100000}
)";

std::unique_ptr<Engine> make_engine() {
  sluice::ConfigLoad load = sluice::load_config(kConfig, sluice::server::PolicyRegistry::builtin());
  if (!load.config) {
    std::fprintf(stderr, "bench_http_api: %s\n", load.errors.front().to_string("config").c_str());
    std::abort();
  }
  return std::move(Engine::create(*load.config, sluice::SteadyClock::instance()).value());
}

// `make(i)` fills the i-th request; each is answered as the server would, and must be 200.
template <class Make>
void serve(benchmark::State& state, Make make) {
  auto engine = make_engine();
  const std::function<sluice::transport::ReloadOutcome()> reload;
  // Until the first answer is 200 (a throttler's first sample comes from its probe, at start).
  for (int tries = 0; tries < 500; ++tries) {
    HttpExchange x;
    make(x, 0);
    sluice::transport::handle_http(*engine, reload, x);
    if (x.status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::uint64_t i = 0;
  const std::uint64_t before = sluice::bench::allocations_so_far();
  for (auto _ : state) {
    HttpExchange x;
    make(x, i++);
    sluice::transport::handle_http(*engine, reload, x);
    if (x.status != 200) {
      state.SkipWithError(("status " + std::to_string(x.status) + ": " + x.response).c_str());
      break;
    }
    benchmark::DoNotOptimize(x.response.data());
  }
  sluice::bench::per_iteration_allocations(state, before, "allocs/request");
  engine->close();
}

void BM_Http_Healthz(benchmark::State& state) {
  serve(state, [](HttpExchange& x, std::uint64_t) {
    x.method = "GET";
    x.target = "/healthz";
    x.peer = "127.0.0.1:40000";
  });
}

void BM_Http_Check(benchmark::State& state) {
  std::vector<std::string> bodies;
  for (int k = 0; k < 1000; ++k)
    bodies.push_back(R"({"policy":"bench-rate","key":"user-)" + std::to_string(k) +
                     R"(","hits":1})");
  serve(state, [&bodies](HttpExchange& x, std::uint64_t i) {
    x.method = "POST";
    x.target = "/v1/check";
    x.body = bodies[i % bodies.size()];
    x.peer = "127.0.0.1:40000";
  });
}

void BM_Http_ThrottlerCheck(benchmark::State& state) {
  serve(state, [](HttpExchange& x, std::uint64_t) {
    x.method = "GET";
    x.target = "/throttler/check?app=gh-ost";
    x.peer = "127.0.0.1:40000";
  });
}

}  // namespace

BENCHMARK(BM_Http_Healthz);
BENCHMARK(BM_Http_Check);
BENCHMARK(BM_Http_ThrottlerCheck);

SLUICE_BENCH_RATIO("BM_Http_Check", "BM_Http_Healthz", 0);
SLUICE_BENCH_RATIO("BM_Http_ThrottlerCheck", "BM_Http_Healthz", 0);

SLUICE_BENCH_MAIN();
