// sluice_load: gRPC load against sluice's API and against a raw gRPC echo service, in one run.
//
// Both services run in a server process that this one starts (itself, with --serve) on
// 127.0.0.1, with the same gRPC settings (callback API, one server each); the client runs here
// (callback API, a fixed number of calls outstanding: closed loop). With two or more CPUs the
// server is pinned to one CPU and the client to another, so neither steals the other's core and
// a latency figure is the server's, not the scheduler's. The echo service answers a request
// shaped like Check's with a fixed reply: it is the floor, what gRPC itself costs here, so
// "Check / echo" is the share of gRPC's throughput that sluice keeps once it decides. Then an
// open loop sends Checks at half the best closed-loop Check rate, on a fixed schedule, and
// measures each call's latency from the time it was due (no coordinated omission): the p99 a
// half-loaded server gives, next to the echo floor's p99 at the same rate in an interleaved run,
// repeated --repeat times. A probe of the CPUs' own stalls (time the machine gives to no one
// here) is printed with it: a p99 cannot be lower than the stalls allow. Envoy's
// ShouldRateLimit (an envoy_ratelimit policy: one descriptor per call, a limit per user) is
// measured the same way against Check, closed loop and open loop at half the best Check rate.
//
// With --redis, the same tool starts a redis-server of its own and compares ShouldRateLimit
// requests of three descriptors each (user: 1,024 values, tenant: 16, route: 8; limits per
// second that never refuse) on two servers in the server process, closed loop at each level:
//   - sluice: an envoy_ratelimit policy whose limits are shared through that Redis (a Redis
//     coordinator: decided from escrow, leases in batches of 4,096);
//   - a per-request Redis limiter doing what envoyproxy/ratelimit does: for each descriptor an
//     INCRBY of the window's counter and an EXPIRE, all of a request's commands pipelined in one
//     round trip, on a connection of the handling thread's own (a synchronous gRPC server).
// Redis's own count of the commands it ran (INFO stats) gives the commands per request.
//
// Usage: sluice_load [--seconds S] [--levels 1,4,16,64] [--repeat N] [--rate R]
//                    [--connections N] [--no-pin] [--markdown]
//                    [--redis [--redis-window second|minute] [--redis-cpu SHARE]]
//        sluice_load --serve                  (the server process alone; prints its ports)
//        sluice_load --send check|rls N PORT  (N calls, one at a time, to a --serve process)
//   --rate R         the open loop's rate (default: half the best closed-loop Check rate)
//   --connections N  the open loop's connections, each with its own issuing thread (default 1)
//   --no-pin         let the scheduler place both processes
//   --redis-window   the window of --redis's limits, on both servers (default second)
//   --redis-cpu S    hold Redis to a share S (0 < S <= 1) of one CPU with a cgroup's CPU quota,
//                    as much as it has for each server when 1/S servers like this one share it
//                    (needs a writable cgroup cpu controller: root)
// Prints a table; with --markdown, the table as Markdown (for bench/README.md).
#include <grpcpp/grpcpp.h>

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "server/engine.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"
#include "sluice/v1/sluice.grpc.pb.h"
#include "sluice_bench/v1/echo.grpc.pb.h"
#include "transport/grpc_kind_methods.h"
#include "transport/grpc_service.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace pb = sluice::v1;
namespace eb = sluice_bench::v1;
namespace rls = envoy::service::ratelimit::v3;

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

std::unique_ptr<grpc::Server> listen(std::initializer_list<grpc::Service*> services, int& port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  for (grpc::Service* s : services) b.RegisterService(s);
  return b.BuildAndStart();
}

enum class Kind {
  kEcho,
  kCheck,
  kFederatedCheck,
  kAdmitRelease,
  kShouldRateLimit,
  kSharedRls,  // three descriptors, limits shared through Redis (sluice)
  kRedisRls,   // three descriptors, INCRBY + EXPIRE each on Redis (the per-request baseline)
};
const char* name(Kind k) {
  switch (k) {
    case Kind::kEcho:
      return "echo (floor)";
    case Kind::kCheck:
      return "Check";
    case Kind::kFederatedCheck:
      return "Check (federated)";
    case Kind::kAdmitRelease:
      return "Admit+Release";
    case Kind::kShouldRateLimit:
      return "ShouldRateLimit";
    case Kind::kSharedRls:
      return "ShouldRateLimit x3, shared (sluice)";
    case Kind::kRedisRls:
      return "ShouldRateLimit x3, INCRBY+EXPIRE";
  }
  return "?";
}

struct Stubs {
  std::unique_ptr<eb::Echo::Stub> echo;
  std::unique_ptr<pb::Sluice::Stub> sluice;
  std::unique_ptr<rls::RateLimitService::Stub> rls;       // on sluice's port
  std::unique_ptr<rls::RateLimitService::Stub> baseline;  // the per-request Redis limiter's
};

// Latencies and failures of a run's calls (shared by the threads that issue them).
struct Tally {
  Histogram latency;
  std::atomic<std::uint64_t> errors{0};
  // Federated checks denied as "budget_spent": with a limit of 10^9 per window, only the last
  // milliseconds of a window (where no region may lease) deny, and that is the policy's rule,
  // not a failure.
  std::atomic<std::uint64_t> window_end_denials{0};
  std::mutex mu;
  std::string first_error;  // what the first failed call said (for a failing run's log)

  void fail(std::string what) {
    if (errors.fetch_add(1, std::memory_order_relaxed) != 0) return;
    const std::lock_guard lock(mu);
    first_error = std::move(what);
  }
};

// Issues calls of one kind on one connection, recording each into a tally.
class Driver {
 public:
  Driver(Stubs& stubs, Kind kind, Tally& tally) : stubs_(stubs), kind_(kind), tally_(tally) {}

  // Issues one call due at `due`; `done` runs when it (and, for Admit+Release, its release) ends.
  void issue(Clock::time_point due, std::function<void(bool ok)> done) {
    auto* c = new Call{};
    c->due = due;
    c->done = std::move(done);
    std::string key = "k";  // appended: "k" + std::to_string trips GCC bug 105651 at -O3
    key += std::to_string(next_key_.fetch_add(1) % 1024);
    switch (kind_) {
      case Kind::kEcho:
        c->echo_req.set_policy("bench-rate");
        c->echo_req.set_key(key);
        stubs_.echo->async()->Echo(&c->ctx, &c->echo_req, &c->echo_resp,
                                   [this, c](grpc::Status s) { finish(c, s.ok(), failure(c, s)); });
        break;
      case Kind::kCheck:
      case Kind::kFederatedCheck:
        c->check_req.set_policy(kind_ == Kind::kCheck ? "bench-rate" : "bench-federated");
        c->check_req.set_key(key);
        stubs_.sluice->async()->Check(
            &c->ctx, &c->check_req, &c->check_resp, [this, c](grpc::Status s) {
              if (!s.ok()) return finish(c, false, failure(c, s));
              const pb::Decision& d = c->check_resp.decision();
              if (d.allowed()) return finish(c, true);
              if (kind_ == Kind::kFederatedCheck && d.reason() == "budget_spent") {
                tally_.window_end_denials.fetch_add(1);
                return finish(c, true);
              }
              finish(c, false, failure(c, s));
            });
        break;
      case Kind::kShouldRateLimit: {
        c->rls_req.set_domain("bench");
        auto& e = *c->rls_req.add_descriptors()->add_entries();
        e.set_key("user");
        e.set_value(key);
        stubs_.rls->async()->ShouldRateLimit(
            &c->ctx, &c->rls_req, &c->rls_resp, [this, c](grpc::Status s) {
              if (!s.ok()) return finish(c, false, failure(c, s));
              finish(c, c->rls_resp.overall_code() == rls::RateLimitResponse::OK,
                     "ShouldRateLimit: OVER_LIMIT");
            });
        break;
      }
      case Kind::kSharedRls:
      case Kind::kRedisRls: {
        c->rls_req.set_domain("shared");
        const std::uint64_t n = next_key_.load();
        for (const auto& [k, v] :
             {std::pair{"user", key}, std::pair{"tenant", "t" + std::to_string(n % 16)},
              std::pair{"route", "r" + std::to_string(n % 8)}}) {
          auto& e = *c->rls_req.add_descriptors()->add_entries();
          e.set_key(k);
          e.set_value(v);
        }
        auto& stub = kind_ == Kind::kSharedRls ? stubs_.rls : stubs_.baseline;
        stub->async()->ShouldRateLimit(
            &c->ctx, &c->rls_req, &c->rls_resp, [this, c](grpc::Status s) {
              if (!s.ok()) return finish(c, false, failure(c, s));
              if (c->rls_resp.overall_code() == rls::RateLimitResponse::OK) return finish(c, true);
              // A shared limit leases nothing in a window's last milliseconds (federation's
              // min_window_left): a key that needs a lease then is refused until the next
              // second. The policy's rule, counted apart; any other refusal is a failure.
              const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count() %
                              1000;
              if (kind_ == Kind::kSharedRls && (ms >= 980 || ms < 20)) {
                tally_.window_end_denials.fetch_add(1);
                return finish(c, true);
              }
              finish(c, false, "ShouldRateLimit: OVER_LIMIT");
            });
        break;
      }
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
    rls::RateLimitRequest rls_req;
    rls::RateLimitResponse rls_resp;
    Clock::time_point due;
    std::function<void(bool)> done;
  };
  // What a call that failed said: its gRPC status, or the refusal it got.
  std::string failure(const Call* c, const grpc::Status& s) const {
    std::string out = name(kind_);
    if (!s.ok())
      return out + ": gRPC status " + std::to_string(s.error_code()) + " " + s.error_message();
    if (kind_ == Kind::kAdmitRelease)
      return out + ": not admitted (" + c->admit_resp.rejection().detail() + ")";
    return out + ": denied (reason '" + c->check_resp.decision().reason() + "')";
  }
  void finish(Call* c, bool ok, std::string what = {}) {
    tally_.latency.add(Clock::now() - c->due);
    if (!ok) tally_.fail(std::move(what));
    auto done = std::move(c->done);
    delete c;
    done(ok);
  }
  Stubs& stubs_;
  Kind kind_;
  Tally& tally_;
  std::atomic<std::uint64_t> next_key_{0};
};

struct Result {
  Kind kind;
  int concurrency = 0;  // 0: open loop
  double ops_per_s = 0;
  double p50_us = 0, p99_us = 0;
  std::uint64_t errors = 0;
  std::uint64_t window_end_denials = 0;  // federated checks in a window's last milliseconds
  std::string first_error = {};
  std::uint64_t calls = 0;   // every call completed, warm-up included
  double server_cpu_us = 0;  // the server process's CPU time per call
};

// CPU time (user + system) a process has used so far, in seconds; 0 if unreadable.
double cpu_seconds(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  unsigned long long utime = 0, stime = 0;
  if (p == nullptr || std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                                  &utime, &stime) != 2)
    return 0;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Runs one measurement and charges the server process's CPU time to its calls.
template <typename Run>
Result with_server_cpu(pid_t server, Run run) {
  const double before = cpu_seconds(server);
  Result r = run();
  const double used = cpu_seconds(server) - before;
  if (r.calls > 0) r.server_cpu_us = used * 1e6 / static_cast<double>(r.calls);
  return r;
}

// Closed loop: `concurrency` calls outstanding for `seconds` (after a short warm-up).
Result closed_loop(Stubs& stubs, Kind kind, int concurrency, double seconds) {
  const auto warmup = std::chrono::milliseconds(200);
  Tally warm_tally, tally;
  Driver warm(stubs, kind, warm_tally);
  Driver d(stubs, kind, tally);
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
  r.ops_per_s = static_cast<double>(tally.latency.count()) / seconds;
  r.p50_us = tally.latency.quantile(0.50);
  r.p99_us = tally.latency.quantile(0.99);
  r.errors = tally.errors.load() + warm_tally.errors.load();
  r.window_end_denials = tally.window_end_denials.load() + warm_tally.window_end_denials.load();
  r.first_error = !warm_tally.first_error.empty() ? warm_tally.first_error : tally.first_error;
  r.calls = tally.latency.count() + warm_tally.latency.count();
  return r;
}

// Open loop: calls due every 1/rate s for `seconds`, spread round-robin over the connections,
// each issued by its own thread; latency from each call's due time.
Result open_loop(std::vector<Stubs>& connections, Kind kind, double rate, double seconds) {
  Tally tally;
  std::atomic<std::int64_t> outstanding{0};
  std::atomic<std::uint64_t> skipped{0};  // reported through `errors`
  const auto period = std::chrono::duration<double>(1.0 / rate);
  const auto start = Clock::now() + std::chrono::milliseconds(10);
  const auto n = static_cast<std::int64_t>(rate * seconds);
  const auto k = static_cast<std::int64_t>(connections.size());
  std::vector<std::thread> issuers;
  for (std::int64_t t = 0; t < k; ++t) {
    issuers.emplace_back([&, t] {
      Driver d(connections[static_cast<std::size_t>(t)], kind, tally);
      for (std::int64_t i = t; i < n; i += k) {
        const auto due = start + std::chrono::duration_cast<Clock::duration>(period * i);
        std::this_thread::sleep_until(due);
        if (outstanding.load() > 10'000) {  // the server has fallen behind: count, do not pile up
          skipped.fetch_add(1);
          continue;
        }
        outstanding.fetch_add(1);
        d.issue(due, [&](bool) { outstanding.fetch_sub(1); });
      }
      while (outstanding.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  for (std::thread& t : issuers) t.join();
  Result r{kind, 0};
  r.ops_per_s = static_cast<double>(tally.latency.count()) / seconds;
  r.p50_us = tally.latency.quantile(0.50);
  r.p99_us = tally.latency.quantile(0.99);
  r.errors = tally.errors.load() + skipped.load();
  r.calls = tally.latency.count();
  return r;
}

// The envoy_ratelimit policy's rule file: a limit per user that never refuses (written to a
// fresh directory under /tmp; the path, or "" when it cannot be written).
std::string rules_file() {
  char dir[] = "/tmp/sluice-load-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return "";
  const std::string path = std::string(dir) + "/bench.yaml";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "";
  std::fputs(
      "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n"
      "      requests_per_unit: 4000000000\n",
      f);
  std::fclose(f);
  return path;
}

// The three-descriptor rules of --redis: limits per `unit` that never refuse (the path, or "").
std::string shared_rules_file(const char* unit) {
  char dir[] = "/tmp/sluice-load-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return "";
  const std::string path = std::string(dir) + "/shared.yaml";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return "";
  std::fputs("domain: shared\ndescriptors:\n", f);
  for (const char* key : {"user", "tenant", "route"})
    std::fprintf(f,
                 "  - key: %s\n    rate_limit:\n      unit: %s\n"
                 "      requests_per_unit: 4000000000\n",
                 key, unit);
  std::fclose(f);
  return path;
}

// The coordinator and the policy of --redis: the three-descriptor rules, shared through Redis.
std::string shared_config(int redis_port, int window_s) {
  return "  bench-rls-shared:\n    kind: envoy_ratelimit\n    config: " +
         shared_rules_file(window_s == 60 ? "minute" : "second") +
         "\n    coordinator: global\n    region: bench\n    batch: 4096\n"
         "    lease_timeout: 1s\ncoordinators:\n  global:\n    kind: redis\n"
         "    address: 127.0.0.1:" +
         std::to_string(redis_port) + "\n";
}

// What envoyproxy/ratelimit does per request, as the floor --redis measures sluice against: a
// fixed window per descriptor, its counter's INCRBY and EXPIRE, every command of the request
// pipelined in one round trip to Redis, on a connection of the handling thread's own.
class RedisFixedWindowService final : public rls::RateLimitService::CallbackService {
 public:
  RedisFixedWindowService(int redis_port, int window_s) : port_(redis_port), window_s_(window_s) {}

  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                            const rls::RateLimitRequest* req,
                                            rls::RateLimitResponse* resp) override {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(decide(req, resp));
    return r;
  }

 private:
  grpc::Status decide(const rls::RateLimitRequest* req, rls::RateLimitResponse* resp) {
    thread_local std::unique_ptr<redisContext, decltype(&redisFree)> conn(nullptr, &redisFree);
    if (conn == nullptr || conn->err != 0) conn.reset(redisConnect("127.0.0.1", port_));
    if (conn == nullptr || conn->err != 0)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "redis: cannot connect");
    const std::int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
    const std::uint32_t hits = std::max<std::uint32_t>(1, req->hits_addend());
    for (const auto& d : req->descriptors()) {
      std::string key = req->domain();
      for (const auto& e : d.entries()) {
        key += '_';
        key += e.key();
        key += '_';
        key += e.value();
      }
      key += '_';
      key += std::to_string(now_s / window_s_);
      redisAppendCommand(conn.get(), "INCRBY %b %u", key.data(), key.size(), hits);
      redisAppendCommand(conn.get(), "EXPIRE %b %d", key.data(), key.size(), window_s_);
    }
    bool over = false;
    for (int i = 0; i < req->descriptors_size(); ++i) {
      for (int reply_of = 0; reply_of < 2; ++reply_of) {
        void* raw = nullptr;
        if (redisGetReply(conn.get(), &raw) != REDIS_OK || raw == nullptr) {
          conn.reset();
          return grpc::Status(grpc::StatusCode::UNAVAILABLE, "redis: no reply");
        }
        auto* r = static_cast<redisReply*>(raw);
        const bool counted = reply_of == 0 && r->type == REDIS_REPLY_INTEGER;
        auto* status = counted ? resp->add_statuses() : nullptr;
        if (counted) {
          over = over || r->integer > kLimit;
          status->set_code(r->integer > kLimit ? rls::RateLimitResponse::OVER_LIMIT
                                               : rls::RateLimitResponse::OK);
          status->set_limit_remaining(
              static_cast<std::uint32_t>(std::max<long long>(0, kLimit - r->integer)));
        }
        freeReplyObject(r);
      }
    }
    resp->set_overall_code(over ? rls::RateLimitResponse::OVER_LIMIT : rls::RateLimitResponse::OK);
    return grpc::Status::OK;
  }

  static constexpr long long kLimit = 4'000'000'000;
  const int port_;
  const int window_s_;  // the windows' length, seconds
};

// Redis's count of the commands it has run (INFO stats total_commands_processed); -1 if unread.
long long redis_commands(int port) {
  std::unique_ptr<redisContext, decltype(&redisFree)> c(redisConnect("127.0.0.1", port),
                                                        &redisFree);
  if (c == nullptr || c->err != 0) return -1;
  auto* r = static_cast<redisReply*>(redisCommand(c.get(), "INFO stats"));
  if (r == nullptr) return -1;
  long long n = -1;
  if (r->type == REDIS_REPLY_STRING) {
    const std::string_view text(r->str, r->len);
    const std::string_view field = "total_commands_processed:";
    if (const auto at = text.find(field); at != std::string_view::npos)
      n = std::atoll(std::string(text.substr(at + field.size(), 24)).c_str());
  }
  freeReplyObject(r);
  return n - 1;  // not counting this INFO itself
}

// The server process (--serve): sluice's service over its engine and the echo service, each on
// a free loopback port; with `redis_port`, the per-request Redis limiter too, and sluice's shared
// limits on that Redis. Prints "ports SLUICE ECHO BASELINE" and serves until its stdin closes
// (the client process ended, however it ended).
int serve(int redis_port, int window_s) {
  // sluice: a rate policy that never denies and a concurrency policy that never refuses, so
  // every call does the full work of a decision.
  const sluice::ConfigLoad cfg = sluice::load_config(
      std::string(R"(
policies:
  bench-rate:
    kind: rate
    strategy: gcra
    limit: 1000000000
    period: 1s
  bench-federated:
    kind: federated
    region: bench
    limit: 1000000000
    window: 60s
    batch: 1024
  bench-concurrency:
    kind: adaptive
    algorithm: fixed
    limit: 1000000
  bench-rls:
    kind: envoy_ratelimit
    config: )") +
          rules_file() + "\n" +
          (redis_port > 0 ? shared_config(redis_port, window_s) : std::string()),
      sluice::server::PolicyRegistry::builtin());
  if (!cfg.config) {
    for (const sluice::ConfigError& e : cfg.errors)
      std::fprintf(stderr, "sluice_load: %s\n", e.to_string("<embedded config>").c_str());
    return 1;
  }
  auto engine = sluice::server::Engine::create(*cfg.config, sluice::SteadyClock::instance());
  if (!engine.ok()) {
    std::fprintf(stderr, "sluice_load: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  sluice::transport::GrpcService sluice_service(*engine.value());
  sluice::transport::RateLimitService rls_service(*engine.value());
  EchoService echo_service;
  int sluice_port = 0, echo_port = 0, baseline_port = 0;
  auto sluice_server = listen({&sluice_service, &rls_service}, sluice_port);
  auto echo_server = listen({&echo_service}, echo_port);
  RedisFixedWindowService baseline(redis_port, window_s);
  std::unique_ptr<grpc::Server> baseline_server;
  if (redis_port > 0) baseline_server = listen({&baseline}, baseline_port);
  if (!sluice_server || !echo_server || (redis_port > 0 && !baseline_server)) {
    std::fprintf(stderr, "sluice_load: cannot listen on 127.0.0.1\n");
    return 1;
  }
  std::printf("ports %d %d %d\n", sluice_port, echo_port, baseline_port);
  std::fflush(stdout);
  char buf[256];
  while (::read(STDIN_FILENO, buf, sizeof buf) > 0) {
  }
  sluice_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  echo_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (baseline_server)
    baseline_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  engine.value()->close();
  return 0;
}

// A process held to a share of one CPU: a cgroup of its own (v2's cpu.max, or v1's CFS quota)
// with a quota of `share` of each 10 ms period (1 ms at least, the kernel's floor). Released on
// destruction: the process goes back to the root group and the group is removed.
class CpuQuota {
 public:
  CpuQuota() = default;
  CpuQuota(const CpuQuota&) = delete;
  CpuQuota& operator=(const CpuQuota&) = delete;
  ~CpuQuota() {
    if (dir_.empty()) return;
    write(root_ + "/cgroup.procs", std::to_string(pid_));
    ::rmdir(dir_.c_str());
  }

  // Why `pid` could not be held to `share`; empty when it is.
  std::string hold(pid_t pid, double share) {
    constexpr long kPeriodUs = 10'000;
    const long quota = std::max(1'000L, std::lround(share * kPeriodUs));
    const std::string name = "/sluice-load-" + std::to_string(::getpid());
    std::string limit_file, limit;
    if (std::FILE* f = std::fopen("/sys/fs/cgroup/cgroup.controllers", "r")) {
      char buf[256] = {};
      const bool cpu = std::fgets(buf, sizeof buf, f) != nullptr &&
                       std::string_view(buf).find("cpu") != std::string_view::npos;
      std::fclose(f);
      if (!cpu) return "cgroup v2 without the cpu controller";
      root_ = "/sys/fs/cgroup";
      limit_file = "cpu.max";
      limit = std::to_string(quota) + " " + std::to_string(kPeriodUs);
    } else {
      root_ = "/sys/fs/cgroup/cpu";
    }
    dir_ = root_ + name;
    if (::mkdir(dir_.c_str(), 0755) != 0) {
      const std::string why = dir_ + ": " + std::strerror(errno);
      dir_.clear();
      return why;
    }
    const bool set = limit_file.empty()
                         ? write(dir_ + "/cpu.cfs_period_us", std::to_string(kPeriodUs)) &&
                               write(dir_ + "/cpu.cfs_quota_us", std::to_string(quota))
                         : write(dir_ + "/" + limit_file, limit);
    if (!set) return dir_ + ": cannot set the quota";
    pid_ = pid;
    if (!write(dir_ + "/cgroup.procs", std::to_string(pid)))
      return dir_ + ": cannot move the process";
    return {};
  }

 private:
  static bool write(const std::string& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return false;
    const bool ok = std::fputs(text.c_str(), f) >= 0;
    return std::fclose(f) == 0 && ok;
  }
  std::string root_, dir_;
  pid_t pid_ = -1;
};

// Pins the calling thread, and the threads it starts afterwards, to one CPU; false when it cannot.
bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

// The server process, started before this process makes any gRPC object (gRPC does not survive
// a fork): this executable again, with --serve, on CPU `cpu` (or anywhere when cpu < 0).
struct ServerProcess {
  pid_t pid = -1;
  int to_child = -1;  // the child's stdin: closing it stops the server
  int sluice_port = 0, echo_port = 0, baseline_port = 0;

  bool start(int cpu, int redis_port, int window_s) {
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return false;
    self[n] = '\0';
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      if (cpu >= 0) pin_to(cpu);
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      char arg0[] = "sluice_load", arg1[] = "--serve", arg2[] = "--redis-port", arg4[] = "--window";
      std::string port = std::to_string(redis_port), window = std::to_string(window_s);
      char* args[] = {arg0, arg1, arg2, port.data(), arg4, window.data(), nullptr};
      ::execv(self, args);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_child = in[1];
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(out[0]);
    return std::sscanf(line.c_str(), "ports %d %d %d", &sluice_port, &echo_port, &baseline_port) ==
           3;
  }
  // Stops the server and reaps it; its exit status (0: a clean shutdown).
  int stop() {
    if (to_child >= 0) ::close(to_child);
    to_child = -1;
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
      pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    }
    return 128;
  }
};

// How much of the time the CPUs are taken away from this process: one thread per CPU, pinned,
// reads the clock in a loop for `seconds`; a gap over 50 us between two reads is time the CPU
// ran something else (the hypervisor, an interrupt, another task). On dedicated cores this is
// near 0; every stall of d ms delays each call in flight or due during it by up to d ms, so it
// bounds from below the p99 any server can give here.
struct Stalls {
  double share = 0;           // of all CPU time probed, the share lost to stalls
  double longest_ms = 0;      // the longest stall on any CPU
  double over_1ms_per_s = 0;  // stalls longer than 1 ms, per CPU-second
};
Stalls probe_stalls(const std::vector<int>& cpus, double seconds) {
  struct PerCpu {
    std::int64_t lost_ns = 0, longest_ns = 0, over_1ms = 0;
  };
  std::vector<PerCpu> per(cpus.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    threads.emplace_back([&, i] {
      pin_to(cpus[i]);
      const auto start = Clock::now();
      const auto end = start + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(seconds));
      auto prev = start;
      for (auto now = start; now < end; prev = now) {
        now = Clock::now();
        const std::int64_t gap = std::chrono::nanoseconds(now - prev).count();
        if (gap > 50'000) {
          per[i].lost_ns += gap;
          per[i].longest_ns = std::max(per[i].longest_ns, gap);
          if (gap > 1'000'000) ++per[i].over_1ms;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Stalls st;
  const double cpu_seconds = seconds * static_cast<double>(cpus.size());
  for (const PerCpu& p : per) {
    st.share += static_cast<double>(p.lost_ns) / 1e9 / cpu_seconds;
    st.longest_ms = std::max(st.longest_ms, static_cast<double>(p.longest_ns) / 1e6);
    st.over_1ms_per_s += static_cast<double>(p.over_1ms) / cpu_seconds;
  }
  return st;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// --send: `n` calls of one kind (check: Check on the rate policy; rls: ShouldRateLimit, one
// descriptor), one after the other, to the server on 127.0.0.1:`port`, with the closed loop's
// requests; 0 when every call was answered OK. bench/load/instructions.sh runs the server under
// callgrind and sends these, to count the server's instructions per call of each kind.
int send(std::string_view kind, int n, int port) {
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto sluice = pb::Sluice::NewStub(channel);
  auto limits = rls::RateLimitService::NewStub(channel);
  for (int i = 0; i < n; ++i) {
    std::string key = "k";
    key += std::to_string(i % 1024);
    grpc::ClientContext ctx;
    grpc::Status s;
    bool ok = false;
    if (kind == "check") {
      pb::CheckRequest req;
      req.set_policy("bench-rate");
      req.set_key(key);
      pb::CheckResponse resp;
      s = sluice->Check(&ctx, req, &resp);
      ok = s.ok() && resp.decision().allowed();
    } else {
      rls::RateLimitRequest req;
      req.set_domain("bench");
      auto& e = *req.add_descriptors()->add_entries();
      e.set_key("user");
      e.set_value(key);
      rls::RateLimitResponse resp;
      s = limits->ShouldRateLimit(&ctx, req, &resp);
      ok = s.ok() && resp.overall_code() == rls::RateLimitResponse::OK;
    }
    if (!ok) {
      std::fprintf(stderr, "sluice_load: --send %.*s: call %d: %s\n", static_cast<int>(kind.size()),
                   kind.data(), i, s.ok() ? "refused" : s.error_message().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 2.0;
  std::vector<int> levels = {1, 4, 16, 64};
  int repeat = 3;
  bool markdown = false, pin = true;
  int connection_count = 1;    // --connections: the open loop's connections (one thread each)
  double fixed_rate = 0;       // --rate: the open loop's "half" rate instead of half the best
  bool with_redis = false;     // --redis: sluice's shared limits against a per-request limiter
  int redis_port = 0;          // --serve --redis-port: the Redis of --redis (0: none)
  int window_s = 1;            // --redis-window: the windows of --redis's limits, seconds
  double redis_cpu_share = 0;  // --redis-cpu: Redis's share of one CPU (0: no quota)
  // A whole-text number for option `a`, or a message naming it.
  bool bad_number = false;
  const auto number = [&]<typename T>(std::string_view text, const std::string& a, T& out) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
      std::fprintf(stderr, "sluice_load: %s: '%.*s' is not a number\n", a.c_str(),
                   static_cast<int>(text.size()), text.data());
      bad_number = true;
    }
  };
  for (int i = 1; i < argc && !bad_number; ++i) {
    const std::string a = argv[i];
    if (a == "--serve") {
      if (i + 2 < argc && std::string_view(argv[i + 1]) == "--redis-port")
        number(argv[i + 2], "--redis-port", redis_port);
      if (i + 4 < argc && std::string_view(argv[i + 3]) == "--window")
        number(argv[i + 4], "--window", window_s);
      return bad_number ? 2 : serve(redis_port, window_s);
    } else if (a == "--send" && i + 3 < argc) {
      const std::string_view kind = argv[i + 1];
      int n = 0, port = 0;
      number(argv[i + 2], "--send", n);
      number(argv[i + 3], "--send", port);
      if (bad_number || (kind != "check" && kind != "rls") || n < 0) {
        std::fprintf(stderr, "sluice_load: --send KIND N PORT: KIND is check or rls, N >= 0\n");
        return 2;
      }
      return send(kind, n, port);
    } else if (a == "--seconds" && i + 1 < argc) {
      number(argv[++i], a, seconds);
    } else if (a == "--repeat" && i + 1 < argc) {
      number(argv[++i], a, repeat);
    } else if (a == "--levels" && i + 1 < argc) {
      levels.clear();
      const std::string_view s = argv[++i];
      for (std::size_t p = 0; p <= s.size() && !bad_number;) {
        const std::size_t q = std::min(s.find(',', p), s.size());
        number(s.substr(p, q - p), a, levels.emplace_back());
        p = q + 1;
      }
    } else if (a == "--rate" && i + 1 < argc) {
      number(argv[++i], a, fixed_rate);
    } else if (a == "--connections" && i + 1 < argc) {
      number(argv[++i], a, connection_count);
    } else if (a == "--no-pin") {
      pin = false;
    } else if (a == "--markdown") {
      markdown = true;
    } else if (a == "--redis") {
      with_redis = true;
    } else if (a == "--redis-window" && i + 1 < argc) {
      const std::string_view w = argv[++i];
      if (w != "second" && w != "minute") {
        std::fprintf(stderr, "sluice_load: --redis-window: '%s' is not second or minute\n",
                     argv[i]);
        return 2;
      }
      window_s = w == "minute" ? 60 : 1;
    } else if (a == "--redis-cpu" && i + 1 < argc) {
      number(argv[++i], a, redis_cpu_share);
      if (!bad_number && !(redis_cpu_share > 0 && redis_cpu_share <= 1)) {
        std::fprintf(stderr, "sluice_load: --redis-cpu: a share of one CPU, in (0, 1]\n");
        return 2;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: sluice_load [--seconds S] [--levels 1,4,16] [--repeat N] [--rate R] "
          "[--connections N] [--no-pin] [--markdown] [--redis [--redis-window second|minute] "
          "[--redis-cpu SHARE]]\n");
      return 2;
    }
  }
  if (bad_number) return 2;
  if (!(seconds > 0) || levels.empty() || repeat < 1 || repeat > 100 || fixed_rate < 0 ||
      connection_count < 1 || connection_count > 64 ||
      std::any_of(levels.begin(), levels.end(), [](int l) { return l < 1 || l > 4096; })) {
    std::fprintf(stderr,
                 "sluice_load: --seconds must be > 0, --repeat in 1..100, --rate >= 0, "
                 "--connections in 1..64 and --levels in 1..4096\n");
    return 2;
  }

  // Two CPUs or more: the server on the first this process may use, the client on the next.
  std::vector<int> cpus;
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  pin = pin && cpus.size() >= 2;
  sluice::testing::RedisServer redis;
  CpuQuota redis_quota;  // after redis: released (Redis moved out of it) before Redis stops
  if (with_redis) {
    if (const sluice::Status st = redis.start(); !st.ok()) {
      std::fprintf(stderr, "sluice_load: --redis: %s\n", st.to_string().c_str());
      return 1;
    }
    redis_port = redis.port();
    if (redis_cpu_share > 0) {
      if (const std::string why = redis_quota.hold(redis.pid(), redis_cpu_share); !why.empty()) {
        std::fprintf(stderr, "sluice_load: --redis-cpu: %s\n", why.c_str());
        return 1;
      }
    }
  }
  ServerProcess server;
  if (!server.start(pin ? cpus[0] : -1, redis_port, window_s)) {
    std::fprintf(stderr, "sluice_load: the server process did not start\n");
    server.stop();
    return 1;
  }
  // The machine's own stalls, probed while the server process sits idle.
  const Stalls stalls = probe_stalls(cpus, 2.0);
  if (pin) pin_to(cpus[1]);
  std::printf("server process %d%s, client process %d%s\n", static_cast<int>(server.pid),
              pin ? (" on CPU " + std::to_string(cpus[0])).c_str() : "",
              static_cast<int>(::getpid()),
              pin ? (" on CPU " + std::to_string(cpus[1])).c_str() : "");

  // Each Stubs its own connections (a local subchannel pool: channels share no connection).
  std::vector<Stubs> connections(static_cast<std::size_t>(connection_count));
  for (Stubs& c : connections) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    c.echo = eb::Echo::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(server.echo_port), grpc::InsecureChannelCredentials(), args));
    auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server.sluice_port),
                                             grpc::InsecureChannelCredentials(), args);
    c.sluice = pb::Sluice::NewStub(channel);
    c.rls = rls::RateLimitService::NewStub(channel);
    if (server.baseline_port > 0)
      c.baseline = rls::RateLimitService::NewStub(
          grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(server.baseline_port),
                                    grpc::InsecureChannelCredentials(), args));
  }
  Stubs& stubs = connections.front();

  std::vector<Result> results;
  double best_echo = 0, best_check = 0, best_federated = 0, best_rls = 0;
  for (int c : levels) {
    for (Kind k : {Kind::kEcho, Kind::kCheck, Kind::kFederatedCheck, Kind::kAdmitRelease,
                   Kind::kShouldRateLimit}) {
      results.push_back(
          with_server_cpu(server.pid, [&] { return closed_loop(stubs, k, c, seconds); }));
      if (k == Kind::kEcho) best_echo = std::max(best_echo, results.back().ops_per_s);
      if (k == Kind::kCheck) best_check = std::max(best_check, results.back().ops_per_s);
      if (k == Kind::kFederatedCheck)
        best_federated = std::max(best_federated, results.back().ops_per_s);
      if (k == Kind::kShouldRateLimit) best_rls = std::max(best_rls, results.back().ops_per_s);
    }
  }
  // Open loop, `repeat` times each, interleaved: Check and echo at half the best Check rate,
  // then at a quarter. Calls skipped because 10,000 were outstanding are overload, not failures.
  const double half = fixed_rate > 0 ? fixed_rate : best_check / 2;
  struct Open {
    const char* label;
    Kind kind;
    double rate;
    std::vector<Result> runs = {};
  };
  std::array<Open, 5> open = {
      {{"Check, open loop at half the best Check rate", Kind::kCheck, half},
       {"echo, open loop at the same rate", Kind::kEcho, half},
       {"Check, open loop at a quarter", Kind::kCheck, half / 2},
       {"echo, open loop at a quarter", Kind::kEcho, half / 2},
       {"ShouldRateLimit, open loop at half the best Check rate", Kind::kShouldRateLimit, half}}};
  std::uint64_t skipped = 0;
  for (int r = 0; r < repeat; ++r)
    for (Open& o : open) {
      o.runs.push_back(with_server_cpu(
          server.pid, [&] { return open_loop(connections, o.kind, o.rate, seconds * 1.5); }));
      skipped += o.runs.back().errors;
    }
  std::printf("open-loop calls skipped (over 10,000 outstanding) or failed: %llu\n",
              static_cast<unsigned long long>(skipped));
  // One field of every run of `o`.
  const auto each = [](const Open& o, double Result::*field) {
    std::vector<double> v;
    for (const Result& r : o.runs) v.push_back(r.*field);
    return v;
  };
  const auto p99s = [&](const Open& o) { return each(o, &Result::p99_us); };
  const auto p50s = [&](const Open& o) { return each(o, &Result::p50_us); };
  const auto cpus_of = [&](const Open& o) { return each(o, &Result::server_cpu_us); };
  // Check's p99 over the echo floor's p99 in the run interleaved with it, per run.
  const auto p99_ratios = [&](const Open& check, const Open& echo) {
    std::vector<double> v;
    for (std::size_t i = 0; i < check.runs.size(); ++i)
      v.push_back(check.runs[i].p99_us / std::max(1.0, echo.runs[i].p99_us));
    return v;
  };
  const auto met = [](const Open& o) {
    return std::count_if(o.runs.begin(), o.runs.end(),
                         [](const Result& r) { return r.p99_us <= 2000; });
  };
  const auto runs_text = [&](const Open& o) {
    std::string s;
    for (const double v : p99s(o)) s += (s.empty() ? "" : ", ") + std::to_string(std::lround(v));
    return s;
  };

  // --redis: three descriptors a request, on sluice's shared limits and on the per-request Redis
  // limiter, one after the other at each level; Redis's commands and CPU time per request.
  struct RedisRow {
    int level;
    Result shared, baseline;
    double shared_commands, baseline_commands;    // Redis commands per request
    double shared_redis_cpu, baseline_redis_cpu;  // Redis's CPU time per request, us
  };
  std::vector<RedisRow> redis_rows;
  if (with_redis) {
    // A fresh Redis counts the window of its first lease as spent (coordinator_restarted): one
    // request marks it, and the runs start in the next window (up to a minute's wait).
    {
      grpc::ClientContext ctx;
      rls::RateLimitRequest req;
      req.set_domain("shared");
      auto& e = *req.add_descriptors()->add_entries();
      e.set_key("user");
      e.set_value("first");
      rls::RateLimitResponse resp;
      (void)stubs.rls->ShouldRateLimit(&ctx, req, &resp);
      const std::int64_t window_ms = std::int64_t{window_s} * 1000;
      const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count();
      std::this_thread::sleep_for(std::chrono::milliseconds(window_ms - now_ms % window_ms + 100));
    }
    const auto measured = [&](Kind k, int c, double& commands, double& redis_cpu) {
      const long long before = redis_commands(redis_port);
      const double cpu_before = cpu_seconds(redis.pid());
      Result r = with_server_cpu(server.pid, [&] { return closed_loop(stubs, k, c, seconds); });
      const long long after = redis_commands(redis_port);
      const double calls = std::max<double>(1, static_cast<double>(r.calls));
      commands = static_cast<double>(after - before) / calls;
      redis_cpu = (cpu_seconds(redis.pid()) - cpu_before) * 1e6 / calls;
      return r;
    };
    for (int c : levels) {
      RedisRow row{c, {}, {}, 0, 0, 0, 0};
      row.shared = measured(Kind::kSharedRls, c, row.shared_commands, row.shared_redis_cpu);
      row.baseline = measured(Kind::kRedisRls, c, row.baseline_commands, row.baseline_redis_cpu);
      redis_rows.push_back(row);
      results.push_back(row.shared);  // their failures count with the others'
      results.back().concurrency = -1;
      results.push_back(row.baseline);
      results.back().concurrency = -1;
    }
  }

  std::uint64_t errors = 0, window_end_denials = 0;
  std::string first_error;
  for (const Result& r : results) {
    errors += r.errors;
    window_end_denials += r.window_end_denials;
    if (first_error.empty()) first_error = r.first_error;
  }
  const auto echo_at = [&](int c) {
    for (const Result& r : results)
      if (r.kind == Kind::kEcho && r.concurrency == c) return r.ops_per_s;
    return 0.0;
  };
  if (markdown) {
    std::printf(
        "| call | in flight | calls/s | p50 | p99 | / echo | server CPU per call |\n"
        "|---|---|---|---|---|---|---|\n");
    for (const Result& r : results)
      if (r.concurrency > 0)
        std::printf("| %s | %d | %.0f | %.0f us | %.0f us | %.2fx | %.1f us |\n", name(r.kind),
                    r.concurrency, r.ops_per_s, r.p50_us, r.p99_us,
                    r.ops_per_s / echo_at(r.concurrency), r.server_cpu_us);
    std::printf(
        "\n| open loop (median of %d) | calls/s | p50 | p99 | p99 of each run (us) | server CPU "
        "per call |\n|---|---|---|---|---|---|\n",
        repeat);
    for (const Open& o : open)
      std::printf("| %s | %.0f | %.0f us | %.0f us | %s | %.1f us |\n", o.label, o.rate,
                  median(p50s(o)), median(p99s(o)), runs_text(o).c_str(), median(cpus_of(o)));
  } else {
    std::printf("%-15s %9s %12s %10s %10s %8s %12s\n", "call", "in-flight", "calls/s", "p50(us)",
                "p99(us)", "/echo", "server-cpu/call(us)");
    for (const Result& r : results)
      if (r.concurrency > 0)
        std::printf("%-15s %9d %12.0f %10.0f %10.0f %7.2fx %12.1f\n", name(r.kind), r.concurrency,
                    r.ops_per_s, r.p50_us, r.p99_us, r.ops_per_s / echo_at(r.concurrency),
                    r.server_cpu_us);
    for (const Open& o : open)
      std::printf(
          "%s, %.0f/s: p50 %.0f us, p99 %.0f us (median of %d; each: %s), server CPU %.1f us per "
          "call\n",
          o.label, o.rate, median(p50s(o)), median(p99s(o)), repeat, runs_text(o).c_str(),
          median(cpus_of(o)));
  }
  if (!redis_rows.empty()) {
    std::printf(
        "\n| in flight | sluice, shared on Redis: calls/s | p99 | server CPU / request | Redis "
        "commands / request | Redis CPU / request | per-request Redis limiter: calls/s | p99 | "
        "server CPU / request | Redis commands / request | Redis CPU / request | throughput ratio "
        "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    double best_shared = 0, best_baseline = 0;
    for (const RedisRow& r : redis_rows) {
      best_shared = std::max(best_shared, r.shared.ops_per_s);
      best_baseline = std::max(best_baseline, r.baseline.ops_per_s);
      std::printf(
          "| %d | %.0f | %.0f us | %.1f us | %.3f | %.1f us | %.0f | %.0f us | %.1f us | %.2f | "
          "%.1f us | %.2fx |\n",
          r.level, r.shared.ops_per_s, r.shared.p99_us, r.shared.server_cpu_us, r.shared_commands,
          r.shared_redis_cpu, r.baseline.ops_per_s, r.baseline.p99_us, r.baseline.server_cpu_us,
          r.baseline_commands, r.baseline_redis_cpu,
          r.shared.ops_per_s / std::max(1.0, r.baseline.ops_per_s));
    }
    std::printf(
        "best ShouldRateLimit with 3 descriptors shared through Redis / best per-request Redis "
        "limiter (INCRBY + EXPIRE per descriptor): %.2fx (target >= 5)\n\n",
        best_shared / std::max(1.0, best_baseline));
  }
  std::printf("best Check / best echo throughput: %.2fx (target >= 0.70)\n",
              best_check / best_echo);
  // A federated Check decided from escrow (memory coordinator, 1,024 keys, batch 1,024) against
  // the local rate policy's Check: what federation costs the server per call.
  std::printf("best federated Check / best rate Check throughput: %.2fx (target >= 0.90)\n",
              best_federated / best_check);
  std::printf(
      "p99 at half the best Check rate: %.3f ms, median of %d runs (target <= 2 ms); at or under "
      "2 ms in %d of %d runs, the echo floor in %d of %d\n",
      median(p99s(open[0])) / 1000, repeat, static_cast<int>(met(open[0])), repeat,
      static_cast<int>(met(open[1])), repeat);
  std::printf(
      "p99 of Check / p99 of echo at the same rate: %.2fx at half, %.2fx at a quarter "
      "(median of the per-run ratios)\n",
      median(p99_ratios(open[0], open[1])), median(p99_ratios(open[2], open[3])));
  std::printf(
      "best ShouldRateLimit / best Check throughput: %.2fx (target >= 0.90); p99 of "
      "ShouldRateLimit / p99 of Check at half the best Check rate: %.2fx (median of the per-run "
      "ratios)\n",
      best_rls / best_check, median(p99_ratios(open[4], open[0])));
  std::printf(
      "CPU stalls probed on %zu CPUs for 2 s before the run: %.2f%% of the time lost, longest "
      "%.1f ms, %.1f stalls over 1 ms per CPU-second\n",
      cpus.size(), stalls.share * 100, stalls.longest_ms, stalls.over_1ms_per_s);
  std::printf(
      "federated checks (and shared ShouldRateLimit calls) refused in a window's last "
      "milliseconds (the policy's rule): %llu\n",
      static_cast<unsigned long long>(window_end_denials));
  std::printf("failed calls: %llu\n", static_cast<unsigned long long>(errors));
  if (errors != 0)
    std::fprintf(stderr, "sluice_load: the first failed call: %s\n", first_error.c_str());
  connections.clear();
  const int server_status = server.stop();
  if (server_status != 0)
    std::fprintf(stderr, "sluice_load: the server process exited with %d\n", server_status);
  return errors == 0 && server_status == 0 ? 0 : 1;
}
