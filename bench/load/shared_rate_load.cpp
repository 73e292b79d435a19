// sluice_shared_rate_load: decisions per second of a rate policy whose keys a Redis keeps, in
// process (the server's engine, no transport), with the Redis commands each decision costs.
//
// A rate policy `api` on a Redis coordinator at 127.0.0.1:PORT (or on a redis-server this tool
// starts, without --redis-port) is checked by --in-flight clients, each a closed loop of one
// check at a time on keys drawn from --keys, for --seconds. A client calls the engine as a
// transport does (Engine::check with a Deferral): a check the policy defers for its coordinator
// call is answered on the policy's I/O thread, which sends that client's next check, so no
// thread waits per check (as in the gRPC server's callback API). Concurrent checks share
// coordinator calls (the policy batches them). Two modes:
//   under   limits no check reaches (1,000,000 per second per key): every check is a decision
//           at the coordinator;
//   over    1 per 1000 s: after a key's first hit every check is refused, from the refusal
//           cache unless --no-cache (each key's first refusal, made before the clock starts, is
//           the coordinator's).
// Redis's own count of the commands it ran (INFO stats: total_commands_processed), before and
// after, gives the commands per decision. bench/load/shared_rate.sh runs it beside
// rate-limiter-flexible's RateLimiterRedis on the same Redis.
//
// Usage: sluice_shared_rate_load [--redis-port P] [--seconds S] [--in-flight N] [--keys K]
//                                [--mode under|over] [--strategy gcra|sliding-window|
//                                fixed-window] [--no-cache]
// Prints one line of key=value pairs.
#include <hiredis/hiredis.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/backends/redis_shared_rate.h"
#include "sluice/config/config.h"
#include "sluice/testing/servers.h"

namespace {

using sluice::server::CheckCall;
using sluice::server::Engine;

struct Options {
  int redis_port = 0;
  double seconds = 5;
  int in_flight = 64;
  int keys = 1000;
  bool over = false;
  std::string strategy = "gcra";
  bool cache = true;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "sluice_shared_rate_load: %s\nusage: sluice_shared_rate_load [--redis-port P] "
               "[--seconds S] [--in-flight N] [--keys K] [--mode under|over] [--strategy "
               "gcra|sliding-window|fixed-window] [--no-cache]\n",
               why.c_str());
  std::exit(2);
}

template <class T>
T number(const char* flag, const char* text) {
  T v{};
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end || v <= 0)
    usage(std::string(flag) + ": '" + text + "' is not a positive number");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--redis-port") {
      o.redis_port = number<int>("--redis-port", next());
    } else if (a == "--seconds") {
      o.seconds = number<double>("--seconds", next());
    } else if (a == "--in-flight") {
      o.in_flight = number<int>("--in-flight", next());
    } else if (a == "--keys") {
      o.keys = number<int>("--keys", next());
    } else if (a == "--mode") {
      const std::string m = next();
      if (m != "under" && m != "over") usage("--mode: '" + m + "' is neither under nor over");
      o.over = m == "over";
    } else if (a == "--strategy") {
      o.strategy = next();
      if (o.strategy != "gcra" && o.strategy != "sliding-window" && o.strategy != "fixed-window")
        usage("--strategy: '" + o.strategy + "' is not a strategy");
    } else if (a == "--no-cache") {
      o.cache = false;
    } else {
      usage("unknown option '" + a + "'");
    }
  }
  return o;
}

struct Totals {
  std::atomic<bool> stop{false};
  std::atomic<long long> decisions{0}, allowed{0}, errors{0};
  std::mutex mu;
  std::condition_variable cv;
  int stopped = 0;  // clients that saw `stop`; guarded by mu
};

// One closed loop of checks: the next is sent as the last is answered, inline or deferred.
class Client final : public sluice::server::Deferral<sluice::RateDecision> {
 public:
  Client(Engine& engine, const std::vector<std::string>& keys, Totals& totals, std::uint64_t seed)
      : engine_(engine), keys_(keys), totals_(totals), x_(seed) {}

  // Sends checks until one is deferred (its answer sends the next) or the run stops.
  void run() {
    while (!totals_.stop.load(std::memory_order_relaxed)) {
      x_ ^= x_ << 13;
      x_ ^= x_ >> 7;
      x_ ^= x_ << 17;
      sluice::server::Decided<sluice::RateDecision> d =
          engine_.check(CheckCall{"api", keys_[x_ % keys_.size()], 1}, *this);
      if (!d) return;  // deferred
      record(*d);
    }
    const std::lock_guard lock(totals_.mu);
    ++totals_.stopped;
    totals_.cv.notify_all();
  }
  sluice::server::Completion<sluice::RateDecision> defer() override {
    return [this](sluice::StatusOr<sluice::RateDecision> r) {
      record(r);
      run();
    };
  }

 private:
  void record(const sluice::StatusOr<sluice::RateDecision>& d) {
    totals_.decisions.fetch_add(1, std::memory_order_relaxed);
    if (!d.ok() || !d.value().reason.empty()) totals_.errors.fetch_add(1);
    if (d.ok() && d.value().allowed) totals_.allowed.fetch_add(1, std::memory_order_relaxed);
  }
  Engine& engine_;
  const std::vector<std::string>& keys_;
  Totals& totals_;
  std::uint64_t x_;
};

// INFO stats' total_commands_processed (-1 when it cannot be read).
long long commands(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  long long n = -1;
  if (c != nullptr && c->err == 0) {
    auto* r = static_cast<redisReply*>(redisCommand(c, "INFO stats"));
    if (r != nullptr && r->type == REDIS_REPLY_STRING) {
      const char* at = std::strstr(r->str, "total_commands_processed:");
      if (at != nullptr) n = std::atoll(at + std::strlen("total_commands_processed:"));
    }
    if (r != nullptr) freeReplyObject(r);
  }
  if (c != nullptr) redisFree(c);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  sluice::testing::RedisServer own;
  int port = o.redis_port;
  if (port == 0) {
    if (sluice::Status s = own.start(); !s.ok()) {
      std::fprintf(stderr, "sluice_shared_rate_load: redis-server: %s\n", s.to_string().c_str());
      return 1;
    }
    port = own.port();
  }
  {  // A Redis new to shared rate limits: no loss to count.
    sluice::RedisOptions ro = sluice::RedisSharedRate::default_options();
    ro.port = port;
    auto store = sluice::RedisSharedRate::connect(ro);
    if (!store.ok() || !store.value()->adopt(std::chrono::seconds(5)).ok()) {
      std::fprintf(stderr, "sluice_shared_rate_load: cannot reach the Redis at port %d\n", port);
      return 1;
    }
  }
  const std::string yaml =
      "coordinators:\n  shared:\n    kind: redis\n    address: 127.0.0.1:" + std::to_string(port) +
      "\npolicies:\n  api:\n    kind: rate\n    strategy: " + o.strategy +
      (o.over ? "\n    limit: 1\n    period: 1000s\n" : "\n    limit: 1000000\n    period: 1s\n") +
      "    coordinator: shared\n    refusal_cache: " + (o.cache ? "true" : "false") + "\n";
  sluice::ConfigLoad load = sluice::load_config(yaml, sluice::server::PolicyRegistry::builtin());
  if (!load.config) {
    std::fprintf(stderr, "sluice_shared_rate_load: config: %s\n",
                 load.errors.empty() ? "?" : load.errors.front().message.c_str());
    return 1;
  }
  auto engine = Engine::create(*load.config, sluice::SteadyClock::instance());
  if (!engine.ok()) {
    std::fprintf(stderr, "sluice_shared_rate_load: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  std::vector<std::string> keys;
  for (int k = 0; k < o.keys; ++k) keys.push_back("user:" + std::to_string(k));
  // Every key once first (twice over the limit: its first refusal is the coordinator's), so
  // that "over" measures refusals only, from the cache when it is on.
  for (int round = 0; round < (o.over ? 2 : 1); ++round)
    for (const std::string& k : keys) (void)engine.value()->check(CheckCall{"api", k, 1});

  const long long before = commands(port);
  Totals totals;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < o.in_flight; ++i)
    clients.push_back(std::make_unique<Client>(
        *engine.value(), keys, totals, 0x9E3779B97F4A7C15ull * static_cast<unsigned>(i + 1)));
  const auto start = std::chrono::steady_clock::now();
  // Two threads start them (each client then runs on whichever thread answers it; a client whose
  // checks are all answered inline, from the refusal cache, keeps its starter thread).
  std::vector<std::thread> starters;
  for (int t = 0; t < 2; ++t)
    starters.emplace_back([&, t] {
      for (std::size_t i = t; i < clients.size(); i += 2) clients[i]->run();
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  totals.stop = true;
  for (std::thread& t : starters) t.join();
  {
    std::unique_lock lock(totals.mu);
    totals.cv.wait(lock, [&] { return totals.stopped == static_cast<int>(clients.size()); });
  }
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const long long decisions = totals.decisions.load(), allowed = totals.allowed.load(),
                  errors = totals.errors.load();
  const long long after = commands(port);
  const double per_decision =
      before >= 0 && after >= 0 && decisions > 0
          ? static_cast<double>(after - before - 1) / static_cast<double>(decisions)
          : -1;
  std::printf(
      "tool=sluice mode=%s strategy=%s cache=%s in_flight=%d keys=%d decisions=%lld "
      "per_second=%.0f allowed=%lld errors=%lld redis_commands_per_decision=%.4f\n",
      o.over ? "over" : "under", o.strategy.c_str(), o.cache ? "on" : "off", o.in_flight, o.keys,
      decisions, static_cast<double>(decisions) / took, allowed, errors, per_decision);
  return errors == 0 && decisions > 0 ? 0 : 1;
}
