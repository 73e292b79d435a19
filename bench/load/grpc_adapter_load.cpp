// sluice_grpc_adapter_load: what the gRPC call-site adapters (sluice/adapters/grpc_admission.h)
// add to a trivial handler's latency, against the same handler without them, in one run on
// 127.0.0.1. The handler is the standard health service's Check (it answers at once); the calls
// are sequential unary calls on one channel. Setups, run in interleaved rounds so that drift
// falls on all alike:
//   bare            no interceptor (the floor)
//   client/local    the client interceptor admitting through an AdaptiveGuard in process
//   server/local    the server interceptor doing the same on the handler's side
//   client/remote   the client interceptor admitting through a sluice server's Admit and
//                   Release (the engine and its gRPC service, in this process, over loopback)
//   client/remote+k the same with lease reuse (RemoteOptions::lease_reuse, 5 ms): a call
//                   takes the lease the call before it freed, without an Admit; its Release
//                   with keep is sent without waiting
//   client/rate     the same through the server's Check on a rate policy, one per call
//   client/rate+a   the same with an allowance: one Check of 128 hits per 128 calls, sent in
//                   the background when a block is half spent, the calls admitted in the
//                   interceptor (sluice/adapters/rate_allowance.h)
// Each round runs every setup once, in an order shuffled per round (a fixed seed), so that no
// setup always follows the same one. Prints, per setup, the median and p99 latency in
// microseconds over every round, each as a ratio to bare's, and the median over rounds of each
// round's ratio to bare's in that round (paired: drift between rounds cancels).
//   sluice_grpc_adapter_load [--calls N] [--rounds R]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/engine.h"
#include "server/registry.h"
#include "sluice/adapters/grpc_admission.h"
#include "sluice/config/config.h"
#include "sluice/core/fixed_limit.h"
#include "transport/grpc_service.h"

namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
namespace ad = sluice::adapters;
using Clock = std::chrono::steady_clock;

class Trivial final : public Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext* /*ctx*/, const HealthCheckRequest* /*req*/,
                     HealthCheckResponse* resp) override {
    resp->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
};

// The trivial service, bare or (given an admitter) registered by register_admitted.
struct Backend {
  Trivial service;
  std::unique_ptr<grpc::Service> admitted;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  explicit Backend(std::shared_ptr<ad::Admitter> server_side) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    if (server_side)
      admitted = ad::register_admitted<Health>(b, service, std::move(server_side));
    else
      b.RegisterService(&service);
    server = b.BuildAndStart();
  }
  ~Backend() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2)); }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
};

// `calls` sequential calls; their latencies in microseconds.
std::vector<double> run(Health::Stub& stub, int calls) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(calls));
  HealthCheckRequest req;
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext ctx;
    HealthCheckResponse resp;
    const auto t0 = Clock::now();
    const grpc::Status s = stub.Check(&ctx, req, &resp);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!s.ok()) {
      std::fprintf(stderr, "sluice_grpc_adapter_load: a call failed: %s\n",
                   s.error_message().c_str());
      std::exit(1);
    }
  }
  return us;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 2000, rounds = 5;
  for (int i = 1; i < argc; i += 2) {
    const bool known =
        std::strcmp(argv[i], "--calls") == 0 || std::strcmp(argv[i], "--rounds") == 0;
    char* end = nullptr;
    const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (!known || i + 1 >= argc || end == argv[i + 1] || *end != '\0' || v < 1 || v > 10'000'000) {
      std::fprintf(stderr,
                   "sluice_grpc_adapter_load: %s%s: usage: [--calls N>=10] [--rounds R>=1]\n",
                   argv[i], i + 1 < argc ? (std::string(" '") + argv[i + 1] + "'").c_str() : "");
      return 2;
    }
    (std::strcmp(argv[i], "--calls") == 0 ? calls : rounds) = static_cast<int>(v);
  }
  if (calls < 10) {
    std::fprintf(stderr, "sluice_grpc_adapter_load: --calls: at least 10\n");
    return 2;
  }
  // The remote sluice: an adaptive policy with room for every call.
  sluice::server::PolicyRegistry kinds = sluice::server::PolicyRegistry::builtin();
  sluice::ConfigLoad load = sluice::load_config(
      "policies:\n  backend:\n    kind: adaptive\n    algorithm: fixed\n    limit: 1000\n"
      "  budget:\n    kind: rate\n    limit: 1000000000\n    period: 1s\n",
      kinds);
  auto engine =
      sluice::server::Engine::create(*load.config, sluice::SteadyClock::instance(), kinds);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.status().to_string().c_str());
    return 1;
  }
  sluice::transport::GrpcService service(*engine.value());
  grpc::ServerBuilder sb;
  int sluice_port = 0;
  sb.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &sluice_port);
  sb.RegisterService(&service);
  auto sluice_server = sb.BuildAndStart();

  sluice::AdaptiveGuard guard(
      std::make_unique<sluice::FixedLimit>(sluice::FixedLimitOptions{.limit = 1000}),
      sluice::SteadyClock::instance());
  auto local = std::make_shared<ad::LocalAdmitter>(guard);
  auto remote = std::make_shared<ad::RemoteAdmitter>(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(sluice_port),
                          grpc::InsecureChannelCredentials()),
      ad::RemoteOptions{.policy = "backend"});

  const auto sluice_channel = [&] {
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(sluice_port),
                               grpc::InsecureChannelCredentials());
  };
  ad::RemoteOptions reusing{.policy = "backend"};
  reusing.lease_reuse = std::chrono::milliseconds(5);
  auto kept = std::make_shared<ad::RemoteAdmitter>(sluice_channel(), reusing);
  auto rate = std::make_shared<ad::RemoteRateAdmitter>(sluice_channel(),
                                                       ad::RemoteRateOptions{.policy = "budget"});
  ad::RemoteRateOptions with_allowance{.policy = "budget"};
  with_allowance.allowance = 128;
  with_allowance.allowance_hold = std::chrono::milliseconds(100);
  auto allowance = std::make_shared<ad::RemoteRateAdmitter>(sluice_channel(), with_allowance);

  Backend plain(nullptr), guarded(local);
  const auto target = [](const Backend& b) { return "127.0.0.1:" + std::to_string(b.port); };
  struct Setup {
    const char* name;
    std::unique_ptr<Health::Stub> stub;
    std::vector<double> us;
  };
  std::vector<Setup> setups;
  setups.push_back(
      {"bare",
       Health::NewStub(grpc::CreateChannel(target(plain), grpc::InsecureChannelCredentials())),
       {}});
  setups.push_back({"client/local",
                    Health::NewStub(ad::admitted_channel(
                        target(plain), grpc::InsecureChannelCredentials(), local)),
                    {}});
  setups.push_back(
      {"server/local",
       Health::NewStub(grpc::CreateChannel(target(guarded), grpc::InsecureChannelCredentials())),
       {}});
  setups.push_back({"client/remote",
                    Health::NewStub(ad::admitted_channel(
                        target(plain), grpc::InsecureChannelCredentials(), remote)),
                    {}});
  setups.push_back({"client/remote+k",
                    Health::NewStub(ad::admitted_channel(target(plain),
                                                         grpc::InsecureChannelCredentials(), kept)),
                    {}});
  setups.push_back({"client/rate",
                    Health::NewStub(ad::admitted_channel(target(plain),
                                                         grpc::InsecureChannelCredentials(), rate)),
                    {}});
  setups.push_back({"client/rate+a",
                    Health::NewStub(ad::admitted_channel(
                        target(plain), grpc::InsecureChannelCredentials(), allowance)),
                    {}});
  for (Setup& s : setups) run(*s.stub, std::min(calls, 200));  // connect and warm up
  std::vector<std::size_t> order(setups.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 shuffle(20261203);
  // Per round and setup: its p50 and p99 over bare's in the same round.
  std::vector<std::vector<double>> p50_ratios(setups.size()), p99_ratios(setups.size());
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), shuffle);
    std::vector<std::vector<double>> round(setups.size());
    for (const std::size_t i : order) {
      round[i] = run(*setups[i].stub, calls);
      setups[i].us.insert(setups[i].us.end(), round[i].begin(), round[i].end());
    }
    const double p50 = quantile(round[0], 0.5), p99 = quantile(round[0], 0.99);
    for (std::size_t i = 0; i < setups.size(); ++i) {
      p50_ratios[i].push_back(quantile(round[i], 0.5) / p50);
      p99_ratios[i].push_back(quantile(round[i], 0.99) / p99);
    }
  }
  const double bare_p50 = quantile(setups[0].us, 0.5), bare_p99 = quantile(setups[0].us, 0.99);
  std::printf("%-16s %10s %10s %10s %10s %12s %12s\n", "setup", "p50 us", "p99 us", "p50/bare",
              "p99/bare", "p50 (paired)", "p99 (paired)");
  for (std::size_t i = 0; i < setups.size(); ++i) {
    const Setup& s = setups[i];
    const double p50 = quantile(s.us, 0.5), p99 = quantile(s.us, 0.99);
    std::printf("%-16s %10.1f %10.1f %10.3f %10.3f %12.3f %12.3f\n", s.name, p50, p99,
                p50 / bare_p50, p99 / bare_p99, quantile(p50_ratios[i], 0.5),
                quantile(p99_ratios[i], 0.5));
  }
  setups.clear();
  const std::uint64_t on_kept = kept->calls_on_kept_leases();
  remote.reset();  // waits for the releases sent
  kept.reset();    // releases the waiting leases, and waits for that too
  const bool released =
      engine.value()->policies().front().state_json.find("\"in_flight\":0") != std::string::npos;
  std::printf("%d calls x %d rounds per setup; in flight at the end: guard %u, sluice %s\n", calls,
              rounds, guard.stats().in_flight, released ? "0" : "not 0");
  std::printf("lease reuse: %llu calls carried by a kept lease\n",
              static_cast<unsigned long long>(on_kept));
  const ad::AllowanceStats a = allowance->allowance_stats();
  std::printf(
      "allowance: %llu calls admitted in the interceptor, %llu waited for a Check; %llu blocks "
      "refilled in the background (%llu refused); %llu hits dropped\n",
      static_cast<unsigned long long>(a.local_admits),
      static_cast<unsigned long long>(a.calls_asked),
      static_cast<unsigned long long>(a.refills_granted),
      static_cast<unsigned long long>(a.refills_refused),
      static_cast<unsigned long long>(a.hits_dropped));
  sluice_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  engine.value()->close();
  return released && guard.stats().in_flight == 0 ? 0 : 1;
}
