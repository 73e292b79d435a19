// sluice_load: gRPC load against sluice's API and against a raw gRPC echo service, in one run.
//
// Both servers run in this process on 127.0.0.1 with the same gRPC settings (callback API, one
// server each), the client too (callback API, a fixed number of calls outstanding: closed
// loop). The echo service answers a request shaped like Check's with a fixed reply: it is the
// floor, what gRPC itself costs here, so "Check / echo" is the share of gRPC's throughput that
// sluice keeps once it decides. Then an open loop sends Checks at half the best closed-loop
// Check rate, on a fixed schedule, and measures each call's latency from the time it was due
// (no coordinated omission): the p99 a half-loaded server gives.
//
// Usage: sluice_load [--seconds S] [--levels 1,4,16,64] [--markdown]
// Prints a table; with --markdown, the table as Markdown (for bench/README.md).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "server/grpc_service.h"
#include "sluice/config.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "sluice_bench/v1/echo.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace pb = sluice::v1;
namespace eb = sluice_bench::v1;

// Latency histogram: 1 us buckets up to 100 ms, lock-free.
class Histogram {
 public:
  void add(std::chrono::nanoseconds d) {
    const auto us = static_cast<std::size_t>(std::max<std::int64_t>(0, d.count() / 1000));
    buckets_[std::min(us, kBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t count() const { return count_.load(); }
  // The q-quantile in microseconds (upper edge of its bucket).
  [[nodiscard]] double quantile(double q) const {
    const std::uint64_t n = count();
    if (n == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(q * static_cast<double>(n - 1)) + 1;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < kBuckets; ++i) {
      seen += buckets_[i].load(std::memory_order_relaxed);
      if (seen >= rank) return static_cast<double>(i + 1);
    }
    return static_cast<double>(kBuckets);
  }

 private:
  static constexpr std::size_t kBuckets = 100'000;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_ {
    new std::atomic<std::uint64_t>[ kBuckets ]()
  };
  std::atomic<std::uint64_t> count_{0};
};

class EchoService final : public eb::Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* ctx, const eb::EchoRequest* req,
                                 eb::EchoResponse* resp) override {
    eb::EchoDecision* d = resp->mutable_decision();
    d->set_allowed(!req->key().empty());
    d->set_limit(1000);
    d->set_remaining(999);
    d->mutable_reset_after()->set_nanos(1000);
    d->mutable_retry_after();
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

std::unique_ptr<grpc::Server> listen(grpc::Service* service, int& port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(service);
  return b.BuildAndStart();
}

enum class Kind { kEcho, kCheck, kAdmitRelease };
const char* name(Kind k) {
  switch (k) {
    case Kind::kEcho:
      return "echo (floor)";
    case Kind::kCheck:
      return "Check";
    case Kind::kAdmitRelease:
      return "Admit+Release";
  }
  return "?";
}

struct Stubs {
  std::unique_ptr<eb::Echo::Stub> echo;
  std::unique_ptr<pb::Sluice::Stub> sluice;
};

// One call in flight (its context, request and reply), re-issued on completion.
class Driver {
 public:
  Driver(Stubs& stubs, Kind kind) : stubs_(stubs), kind_(kind) {}

  // Issues one call due at `due`; `done` runs when it (and, for Admit+Release, its release) ends.
  void issue(Clock::time_point due, std::function<void(bool ok)> done) {
    auto* c = new Call{};
    c->due = due;
    c->done = std::move(done);
    const std::string key = "k" + std::to_string(next_key_.fetch_add(1) % 1024);
    switch (kind_) {
      case Kind::kEcho:
        c->echo_req.set_policy("bench-rate");
        c->echo_req.set_key(key);
        stubs_.echo->async()->Echo(&c->ctx, &c->echo_req, &c->echo_resp,
                                   [this, c](grpc::Status s) { finish(c, s.ok()); });
        break;
      case Kind::kCheck:
        c->check_req.set_policy("bench-rate");
        c->check_req.set_key(key);
        stubs_.sluice->async()->Check(
            &c->ctx, &c->check_req, &c->check_resp,
            [this, c](grpc::Status s) { finish(c, s.ok() && c->check_resp.decision().allowed()); });
        break;
      case Kind::kAdmitRelease:
        c->admit_req.set_policy("bench-concurrency");
        c->admit_req.set_key(key);
        stubs_.sluice->async()->Admit(
            &c->ctx, &c->admit_req, &c->admit_resp, [this, c](grpc::Status s) {
              if (!s.ok() || !c->admit_resp.admitted()) return finish(c, false);
              c->release_req.set_lease_id(c->admit_resp.lease_id());
              stubs_.sluice->async()->Release(&c->ctx2, &c->release_req, &c->release_resp,
                                              [this, c](grpc::Status s2) { finish(c, s2.ok()); });
            });
        break;
    }
  }
  Histogram latency;
  std::atomic<std::uint64_t> errors{0};

 private:
  struct Call {
    grpc::ClientContext ctx, ctx2;
    eb::EchoRequest echo_req;
    eb::EchoResponse echo_resp;
    pb::CheckRequest check_req;
    pb::CheckResponse check_resp;
    pb::AdmitRequest admit_req;
    pb::AdmitResponse admit_resp;
    pb::ReleaseRequest release_req;
    pb::ReleaseResponse release_resp;
    Clock::time_point due;
    std::function<void(bool)> done;
  };
  void finish(Call* c, bool ok) {
    latency.add(Clock::now() - c->due);
    if (!ok) errors.fetch_add(1, std::memory_order_relaxed);
    auto done = std::move(c->done);
    delete c;
    done(ok);
  }
  Stubs& stubs_;
  Kind kind_;
  std::atomic<std::uint64_t> next_key_{0};
};

struct Result {
  Kind kind;
  int concurrency = 0;  // 0: open loop
  double ops_per_s = 0;
  double p50_us = 0, p99_us = 0;
  std::uint64_t errors = 0;
};

// Closed loop: `concurrency` calls outstanding for `seconds` (after a short warm-up).
Result closed_loop(Stubs& stubs, Kind kind, int concurrency, double seconds) {
  const auto warmup = std::chrono::milliseconds(200);
  Driver warm(stubs, kind);
  Driver d(stubs, kind);
  std::atomic<int> running{concurrency};
  std::mutex mu;
  std::condition_variable cv;
  const auto start = Clock::now();
  const auto measure_from = start + warmup;
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(seconds));
  std::function<void(bool)> on_done;
  on_done = [&](bool) {
    const auto now = Clock::now();
    if (now >= end) {
      if (running.fetch_sub(1) == 1) {
        const std::lock_guard lock(mu);
        cv.notify_all();
      }
      return;
    }
    (now < measure_from ? warm : d).issue(Clock::now(), on_done);
  };
  for (int i = 0; i < concurrency; ++i) warm.issue(Clock::now(), on_done);
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return running.load() == 0; });
  }
  Result r{kind, concurrency};
  r.ops_per_s = static_cast<double>(d.latency.count()) / seconds;
  r.p50_us = d.latency.quantile(0.50);
  r.p99_us = d.latency.quantile(0.99);
  r.errors = d.errors.load() + warm.errors.load();
  return r;
}

// Open loop: calls due every 1/rate s for `seconds`; latency from each call's due time.
Result open_loop(Stubs& stubs, Kind kind, double rate, double seconds) {
  Driver d(stubs, kind);
  std::atomic<std::int64_t> outstanding{0};
  const auto period = std::chrono::duration<double>(1.0 / rate);
  const auto start = Clock::now() + std::chrono::milliseconds(10);
  const auto n = static_cast<std::int64_t>(rate * seconds);
  std::uint64_t skipped = 0;  // reported through `errors`
  for (std::int64_t i = 0; i < n; ++i) {
    const auto due = start + std::chrono::duration_cast<Clock::duration>(period * i);
    std::this_thread::sleep_until(due);
    if (outstanding.load() > 10'000) {  // the server has fallen behind: count, do not pile up
      ++skipped;
      continue;
    }
    outstanding.fetch_add(1);
    d.issue(due, [&](bool) { outstanding.fetch_sub(1); });
  }
  while (outstanding.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  Result r{kind, 0};
  r.ops_per_s = static_cast<double>(d.latency.count()) / seconds;
  r.p50_us = d.latency.quantile(0.50);
  r.p99_us = d.latency.quantile(0.99);
  r.errors = d.errors.load() + skipped;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  std::vector<int> levels = {1, 4, 16, 64};
  bool markdown = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--levels" && i + 1 < argc) {
      levels.clear();
      std::string s = argv[++i];
      for (std::size_t p = 0; p <= s.size();) {
        const std::size_t q = std::min(s.find(',', p), s.size());
        levels.push_back(std::atoi(s.substr(p, q - p).c_str()));
        p = q + 1;
      }
    } else if (a == "--markdown") {
      markdown = true;
    } else {
      std::fprintf(stderr, "usage: sluice_load [--seconds S] [--levels 1,4,16] [--markdown]\n");
      return 2;
    }
  }
  if (!(seconds > 0) || levels.empty() ||
      std::any_of(levels.begin(), levels.end(), [](int l) { return l < 1 || l > 4096; })) {
    std::fprintf(stderr, "sluice_load: --seconds must be > 0 and --levels in 1..4096\n");
    return 2;
  }

  // sluice: a rate policy that never denies and a concurrency policy that never refuses, so
  // every call does the full work of a decision.
  const sluice::ConfigLoad cfg = sluice::load_config(R"(
policies:
  bench-rate:
    kind: rate
    strategy: gcra
    limit: 1000000000
    period: 1s
  bench-concurrency:
    kind: adaptive
    algorithm: fixed
    limit: 1000000
)");
  if (!cfg.config) {
    std::fprintf(stderr, "sluice_load: bad embedded config\n");
    return 1;
  }
  auto engine = sluice::server::Engine::create(*cfg.config, sluice::SteadyClock::instance());
  if (!engine.ok()) {
    std::fprintf(stderr, "sluice_load: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  sluice::server::GrpcService sluice_service(*engine.value());
  EchoService echo_service;
  int sluice_port = 0, echo_port = 0;
  auto sluice_server = listen(&sluice_service, sluice_port);
  auto echo_server = listen(&echo_service, echo_port);
  if (!sluice_server || !echo_server) {
    std::fprintf(stderr, "sluice_load: cannot listen on 127.0.0.1\n");
    return 1;
  }
  Stubs stubs;
  stubs.echo = eb::Echo::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(echo_port),
                                                     grpc::InsecureChannelCredentials()));
  stubs.sluice = pb::Sluice::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(sluice_port),
                                                         grpc::InsecureChannelCredentials()));

  std::vector<Result> results;
  double best_echo = 0, best_check = 0;
  for (int c : levels) {
    for (Kind k : {Kind::kEcho, Kind::kCheck, Kind::kAdmitRelease}) {
      results.push_back(closed_loop(stubs, k, c, seconds));
      if (k == Kind::kEcho) best_echo = std::max(best_echo, results.back().ops_per_s);
      if (k == Kind::kCheck) best_check = std::max(best_check, results.back().ops_per_s);
    }
  }
  const double half = best_check / 2;
  const Result open = open_loop(stubs, Kind::kCheck, half, seconds * 1.5);
  const Result open_echo = open_loop(stubs, Kind::kEcho, half, seconds * 1.5);
  const Result quarter = open_loop(stubs, Kind::kCheck, half / 2, seconds * 1.5);
  const Result quarter_echo = open_loop(stubs, Kind::kEcho, half / 2, seconds * 1.5);

  // Calls the open loop skipped because 10,000 were outstanding are overload, not failures.
  std::printf("open-loop calls skipped (over 10,000 outstanding) or failed: %llu\n",
              static_cast<unsigned long long>(open.errors + open_echo.errors + quarter.errors +
                                              quarter_echo.errors));
  std::uint64_t errors = 0;
  for (const Result& r : results) errors += r.errors;
  const auto echo_at = [&](int c) {
    for (const Result& r : results)
      if (r.kind == Kind::kEcho && r.concurrency == c) return r.ops_per_s;
    return 0.0;
  };
  if (markdown) {
    std::printf("| call | in flight | calls/s | p50 | p99 | / echo |\n|---|---|---|---|---|---|\n");
    for (const Result& r : results)
      std::printf("| %s | %d | %.0f | %.0f us | %.0f us | %.2fx |\n", name(r.kind), r.concurrency,
                  r.ops_per_s, r.p50_us, r.p99_us, r.ops_per_s / echo_at(r.concurrency));
    std::printf(
        "| Check, open loop at half the best Check rate | - | %.0f | %.0f us | %.0f us | - |\n",
        open.ops_per_s, open.p50_us, open.p99_us);
    std::printf("| echo, open loop at the same rate | - | %.0f | %.0f us | %.0f us | - |\n",
                open_echo.ops_per_s, open_echo.p50_us, open_echo.p99_us);
    std::printf("| Check, open loop at a quarter | - | %.0f | %.0f us | %.0f us | - |\n",
                quarter.ops_per_s, quarter.p50_us, quarter.p99_us);
    std::printf("| echo, open loop at a quarter | - | %.0f | %.0f us | %.0f us | - |\n",
                quarter_echo.ops_per_s, quarter_echo.p50_us, quarter_echo.p99_us);
  } else {
    std::printf("%-15s %9s %12s %10s %10s %8s\n", "call", "in-flight", "calls/s", "p50(us)",
                "p99(us)", "/echo");
    for (const Result& r : results)
      std::printf("%-15s %9d %12.0f %10.0f %10.0f %7.2fx\n", name(r.kind), r.concurrency,
                  r.ops_per_s, r.p50_us, r.p99_us, r.ops_per_s / echo_at(r.concurrency));
    std::printf(
        "open loop: Check at %.0f/s (half the best closed-loop Check rate): p50 %.0f us, "
        "p99 %.0f us; echo at the same rate: p50 %.0f us, p99 %.0f us\n",
        half, open.p50_us, open.p99_us, open_echo.p50_us, open_echo.p99_us);
  }
  std::printf("best Check / best echo throughput: %.2fx (target >= 0.70)\n",
              best_check / best_echo);
  std::printf("p99 at half the best Check rate: %.3f ms (target <= 2 ms)\n", open.p99_us / 1000);
  std::printf("failed calls: %llu\n", static_cast<unsigned long long>(errors));
  sluice_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  echo_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  engine.value()->close();
  return errors == 0 ? 0 : 1;
}
