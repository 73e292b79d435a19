// Federation against what a region would otherwise do, each on the same throwaway server in the
// same run:
//
//   1. FederatedLimiter::check (batch 16, RedisRateCoordinator, coordinator calls on an IoPool of
//      4 threads) against a per-request Redis limiter: one EVALSHA of a fixed-window Lua script
//      per check on the same Redis, 64 checks in flight on one pipelined hiredis connection (a
//      sliding window of 64 outstanding commands). The federated side also keeps 64 checks in
//      flight (check() with a callback; those decided from escrow are answered at once). Key
//      mixes: "busy" = 64 keys in turn (limit 2^50 per hour: never binds), "over" = the same 64
//      keys with their budget spent (limit 64 per hour, spent before the clock starts: every
//      check is a refusal), "tail" = 100,000 keys in turn with a 1 s window, so a key's escrow
//      has expired by its next check (every check leases; a key that comes round again also
//      reconciles its expired escrow), "hot" = one key (limit 2^50 per hour). Redis's own
//      counters (INFO stats total_commands_processed, INFO commandstats cmdstat_evalsha) are
//      read before and after each run: commands and server time per admitted check.
//   2. RedisRateCoordinator::lease against `redis-benchmark` sending the same EVALSHA (same
//      script, key and arguments), at 1 and 50 connections (50 coordinators on 50 threads), and
//      the tool pipelined (-P 16) against lease_many() with 16 leases per call on 50 threads.
//      PostgresRateCoordinator::lease against `pgbench -c 1` running the same two round trips (its
//      statements, joined the same way) on one key and on 64 keys.
//   3. In process: FederatedLimiter::try_check from escrow (memory coordinator, inline executor)
//      against RateLimiter::check (fixed window), same 64 keys, caller's time.
//
// Time per operation is what the ratio table compares: ">= 50x the decisions/s" is a ratio
// <= 0.02, ">= 10x" <= 0.1, ">= 1.0x" <= 1.0, ">= 0.8x the tool's rate" <= 1.25. Counters
// give the rates.
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/floor.h"
#include "common/ratio_main.h"
#include "federation/io_pool.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/backends/postgres_rate_coordinator.h"
#include "sluice/backends/redis_rate_coordinator.h"
#include "sluice/federation/federation.h"
#include "sluice/local/rate_limiter.h"
#include "sluice/testing/servers.h"

extern char** environ;

namespace {

using sluice::Nanos;
using sluice::Status;

constexpr int kInFlight = 64;
constexpr int kBusyKeys = 64;
constexpr int kTailKeys = 100'000;
constexpr std::uint64_t kHuge = std::uint64_t{1} << 50;
constexpr Nanos kHour = std::chrono::hours(1);
constexpr Nanos kTimeout = std::chrono::seconds(1);

bool g_short = false;  // --benchmark_min_time < 0.1: keep the tools' runs tiny

bool short_run(int argc, char** argv) {
  const std::string flag = "--benchmark_min_time=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(flag, 0) == 0)
      return std::strtod(argv[i] + flag.size(), nullptr) < 0.1;
  return false;
}

const std::vector<std::string>& key_names(int n) {
  static std::map<int, std::vector<std::string>> sets;
  std::vector<std::string>& v = sets[n];
  if (v.empty())
    for (int i = 0; i < n; ++i) v.push_back("tenant-" + std::to_string(i));
  return v;
}

// ---- running a tool ----

struct ToolRun {
  int exit_code = -1;
  std::string output;
};

ToolRun run_tool(const std::vector<std::string>& args) {
  ToolRun out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {-1, "pipe failed"};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc == 0) {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n > 0)
        out.output.append(buf, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR)
        break;
    }
  }
  ::close(fds[0]);
  if (rc != 0) return {-1, "cannot run " + args[0] + ": " + std::strerror(rc)};
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(line);
  }
  return out;
}

// redis-benchmark --csv: a header line, then "<test>","<rps>",...; 0 if absent.
double csv_rps(const std::string& text) {
  for (const std::string& line : lines_of(text)) {
    const std::size_t sep = line.find("\",\"");
    if (line.rfind("\"test\"", 0) == 0 || sep == std::string::npos) continue;
    return std::strtod(line.c_str() + sep + 3, nullptr);
  }
  return 0;
}

// pgbench: "tps = 1234.5 (without initial connection time)"; 0 if absent.
double pgbench_tps(const std::string& text) {
  for (const std::string& line : lines_of(text))
    if (line.rfind("tps = ", 0) == 0 && line.find("without initial") != std::string::npos)
      return std::strtod(line.c_str() + 6, nullptr);
  return 0;
}

void report_rate(benchmark::State& state, double per_s, const ToolRun& run) {
  if (run.exit_code != 0 || per_s <= 0 || run.output.find("Error") != std::string::npos) {
    state.SkipWithError(("tool failed: " + run.output.substr(0, 500)).c_str());
    return;
  }
  state.SetIterationTime(1.0 / per_s);
  state.counters["ops_per_s"] = per_s;
}

// ---- Redis ----

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;
struct ContextFree {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextFree>;

// The per-request limiter: a fixed window per key, one INCRBY (and a PEXPIRE on the window's
// first hit) per check; the caller names the window in the key.
constexpr const char* kFixedWindowScript =
    "local n = redis.call('INCRBY', KEYS[1], ARGV[1])\n"
    "if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\n"
    "if n > tonumber(ARGV[3]) then return {0, n} end\n"
    "return {1, n}\n";

struct RedisFixture {
  sluice::testing::RedisServer server;
  Context ctx;  // the per-request limiter's connection, and INFO
  std::string fixed_window_sha;
  std::string run_id;  // the server's (the lease script's last argument)
  std::string error;

  RedisFixture() {
    if (Status s = server.start(); !s.ok()) {
      error = s.to_string();
      return;
    }
    ctx = connect();
    if (!ctx) return;
    Reply r(
        static_cast<redisReply*>(redisCommand(ctx.get(), "SCRIPT LOAD %s", kFixedWindowScript)));
    if (!r || r->type != REDIS_REPLY_STRING) {
      error = "SCRIPT LOAD failed";
      return;
    }
    fixed_window_sha.assign(r->str, r->len);
    // A coordinator that has kept its state for hours: the origin marker (the time this Redis
    // was first found empty) three hours back, so that the current window is not the one a
    // fresh Redis must count as spent.
    Reply t(static_cast<redisReply*>(redisCommand(ctx.get(), "TIME")));
    if (!t || t->type != REDIS_REPLY_ARRAY || t->elements != 2) {
      error = "TIME failed";
      return;
    }
    const long long origin_us = (std::atoll(t->element[0]->str) - 3 * 3600) * 1'000'000LL;
    Reply set(static_cast<redisReply*>(
        redisCommand(ctx.get(), "SET %sorigin %lld", options().key_prefix.c_str(), origin_us)));
    if (!set || set->type == REDIS_REPLY_ERROR) error = "cannot write the origin marker";
    // and the server marker naming this server as it is (its run_id, no key evicted).
    run_id = info_field("server", "run_id");
    Reply server_marker(static_cast<redisReply*>(
        redisCommand(ctx.get(), "SET %sserver %s:%s", options().key_prefix.c_str(), run_id.c_str(),
                     info_field("stats", "evicted_keys").c_str())));
    if (run_id.empty() || !server_marker || server_marker->type == REDIS_REPLY_ERROR)
      error = "cannot write the server marker";
  }

  // The value of `field` in INFO `section` ("" when absent).
  std::string info_field(const char* section, const std::string& field) {
    Reply r(static_cast<redisReply*>(redisCommand(ctx.get(), "INFO %s", section)));
    if (!r || r->type != REDIS_REPLY_STRING) return {};
    const std::string info(r->str, r->len);
    const auto at = info.find(field + ":");
    if (at == std::string::npos) return {};
    const auto end = info.find_first_of("\r\n", at);
    return info.substr(at + field.size() + 1,
                       end == std::string::npos ? std::string::npos : end - at - field.size() - 1);
  }

  Context connect() {
    Context c(redisConnect("127.0.0.1", server.port()));
    if (!c || c->err) {
      error = "cannot connect to redis";
      return nullptr;
    }
    return c;
  }

  sluice::RedisOptions options() const {
    sluice::RedisOptions o = sluice::RedisRateCoordinator::default_options();
    o.port = server.port();
    return o;
  }

  // One INFO field (e.g. "total_commands_processed"), or one figure ("calls", "usec") of a
  // commandstats entry (e.g. "cmdstat_evalsha"); 0 when absent, -1 when INFO fails.
  double info(const char* section, const std::string& field, const std::string& figure = {}) {
    Reply r(static_cast<redisReply*>(redisCommand(ctx.get(), "INFO %s", section)));
    if (!r || r->type != REDIS_REPLY_STRING) return -1;
    for (const std::string& line : lines_of(std::string(r->str, r->len))) {
      if (line.rfind(field + ":", 0) != 0) continue;
      const std::string rest = line.substr(field.size() + 1);
      if (figure.empty()) return std::strtod(rest.c_str(), nullptr);
      const std::size_t at = rest.find(figure + "=");
      return at == std::string::npos ? 0
                                     : std::strtod(rest.c_str() + at + figure.size() + 1, nullptr);
    }
    return 0;
  }
};

RedisFixture& redis_fixture() {
  static RedisFixture f;
  return f;
}

// The server's own counters over a run, per admitted check: every command it processed (those a
// script runs included), the EVALSHA calls, and the microseconds the server spent in them.
struct CommandCount {
  RedisFixture& f;
  double total0, evalsha0, usec0;
  explicit CommandCount(RedisFixture& fx)
      : f(fx),
        total0(fx.info("stats", "total_commands_processed")),
        evalsha0(fx.info("commandstats", "cmdstat_evalsha", "calls")),
        usec0(fx.info("commandstats", "cmdstat_evalsha", "usec")) {}
  void report(benchmark::State& state, std::uint64_t admitted) {
    const double total = f.info("stats", "total_commands_processed") - total0 - 3;  // our INFOs
    const double evalsha = f.info("commandstats", "cmdstat_evalsha", "calls") - evalsha0;
    const double usec = f.info("commandstats", "cmdstat_evalsha", "usec") - usec0;
    const double per = admitted > 0 ? 1.0 / static_cast<double>(admitted) : 0;
    const double per_op =
        state.iterations() > 0 ? 1.0 / static_cast<double>(state.iterations()) : 0;
    state.counters["admitted"] = static_cast<double>(admitted);
    state.counters["cmds_per_admit"] = total * per;
    state.counters["evalsha_per_admit"] = evalsha * per;
    state.counters["server_us_per_check"] = usec * per_op;
  }
};

enum Mix : int { kBusy = 0, kOver = 1, kTail = 2, kHot = 3 };
const char* const kMixNames[] = {"busy", "over", "tail", "hot"};

int keys_of(Mix mix) { return mix == kTail ? kTailKeys : mix == kHot ? 1 : kBusyKeys; }

// The per-request limiter: EVALSHA per check, 64 outstanding on one connection.
void BM_Floor_RedisPerRequest(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const Mix mix = static_cast<Mix>(state.range(0));
  const auto& keys = key_names(keys_of(mix));
  const std::uint64_t limit = mix == kOver ? 64 : kHuge;
  const Nanos period = mix == kTail ? Nanos(std::chrono::seconds(1)) : kHour;
  const std::string ttl_ms =
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(period).count());
  const std::string lim = std::to_string(limit);
  const sluice::Clock& clock = sluice::SteadyClock::instance();
  std::string sha = f.fixed_window_sha;
  std::size_t i = 0;
  int outstanding = 0;
  std::uint64_t admitted = 0, n = 0;
  std::string key;
  std::int64_t window = clock.now() / period;
  bool failed = false;
  const auto take = [&] {
    void* raw = nullptr;
    if (redisGetReply(f.ctx.get(), &raw) != REDIS_OK) return false;
    Reply r(static_cast<redisReply*>(raw));
    --outstanding;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) return false;
    admitted += r->element[0]->integer == 1 ? 1 : 0;
    return true;
  };
  const auto send = [&] {
    if ((++n & 63) == 0) window = clock.now() / period;
    key = "rl:{" + keys[i++ % keys.size()] + "}:" + std::to_string(window);
    redisAppendCommand(f.ctx.get(), "EVALSHA %s 1 %s 1 %s %s", sha.c_str(), key.c_str(),
                       ttl_ms.c_str(), lim.c_str());
    ++outstanding;
  };
  // Over the limit: spend every key's window first.
  if (mix == kOver)
    for (std::size_t k = 0; k < keys.size() * (limit + 1); ++k) {
      send();
      if (!take()) return state.SkipWithError("redis: per-request script failed");
    }
  admitted = 0;
  CommandCount count(f);
  for (auto _ : state) {
    send();
    if (outstanding >= kInFlight && !take()) {
      failed = true;
      break;
    }
  }
  while (outstanding > 0 && !failed)
    if (!take()) failed = true;
  if (failed) return state.SkipWithError("redis: per-request script failed");
  count.report(state, admitted);
}

// A FederatedLimiter on the Redis coordinator; 64 checks in flight.
void BM_FederatedRedis(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const Mix mix = static_cast<Mix>(state.range(0));
  const auto& keys = key_names(keys_of(mix));
  auto coordinator = sluice::RedisRateCoordinator::connect(f.options());
  if (!coordinator.ok()) return state.SkipWithError(coordinator.status().to_string().c_str());
  const sluice::Clock& clock = sluice::SteadyClock::instance();
  sluice::FederationOptions o;
  o.region = "bench";
  // A budget of its own per run: the coordinator's ledgers of earlier runs do not carry over.
  static int run = 0;
  o.budget_id = std::string(kMixNames[mix]) + std::to_string(run++);
  o.budget.limit = mix == kOver ? 64 : kHuge;
  o.budget.period = mix == kTail ? Nanos(std::chrono::seconds(1)) : kHour;
  o.batch = 16;
  std::atomic<int> in_flight{0};
  std::atomic<std::uint64_t> admitted{0};
  {
    sluice::IoPool pool(4);
    sluice::FederatedLimiter limiter(*coordinator.value(), clock, o, pool.executor());
    if (mix == kOver) {
      // Spend every key's budget: each refuses once it is known to be spent.
      for (const std::string& k : keys)
        for (int tries = 0; tries < 1000; ++tries)
          if (!limiter.check_wait(k, 1).rate.allowed) break;
      if (limiter.check_wait(keys[0], 1).reason != sluice::FederatedReason::kBudgetSpent)
        return state.SkipWithError("the budget is not spent");
    }
    const auto done = [&](sluice::FederatedDecision d) {
      if (d.rate.allowed) admitted.fetch_add(1, std::memory_order_relaxed);
      if (in_flight.fetch_sub(1, std::memory_order_acq_rel) == kInFlight) in_flight.notify_one();
    };
    CommandCount count(f);
    std::size_t i = 0;
    std::uint64_t n = 0;
    Nanos now = clock.now();
    for (auto _ : state) {
      if ((++n & 63) == 0) now = clock.now();
      for (int cur = in_flight.load(std::memory_order_acquire); cur >= kInFlight;
           cur = in_flight.load(std::memory_order_acquire))
        in_flight.wait(cur, std::memory_order_acquire);
      in_flight.fetch_add(1, std::memory_order_acq_rel);
      limiter.check(keys[i++ % keys.size()], 1, now, done);
    }
    for (int cur = in_flight.load(); cur > 0; cur = in_flight.load())
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    count.report(state, admitted.load());
    const sluice::FederationStats st = limiter.stats();
    state.counters["leases"] = static_cast<double>(st.leases);
    state.counters["lease_failures"] = static_cast<double>(st.lease_failures);
    state.counters["units_per_lease"] =
        st.leases > 0 ? static_cast<double>(st.granted) / static_cast<double>(st.leases) : 0.0;
  }
}

// ---- coordinator leases ----

sluice::LeaseRequest lease_request(std::uint64_t want) {
  sluice::LeaseRequest r;
  r.region = "bench";
  r.spec.limit = kHuge;
  r.spec.period = kHour;
  r.want = want;
  r.min_window_left = std::chrono::milliseconds(5);
  return r;
}

constexpr const char* kLeaseKey = "lease-bench";
constexpr std::size_t kPipelined = 16;  // leases per pipelined call, as redis-benchmark -P 16

// One coordinator per thread (its own connection), leases in a loop.
void BM_RedisLease(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  auto c = sluice::RedisRateCoordinator::connect(f.options());
  if (!c.ok()) return state.SkipWithError(c.status().to_string().c_str());
  const sluice::LeaseRequest req = lease_request(16);
  for (auto _ : state) {
    auto r = c.value()->lease(kLeaseKey, req, kTimeout);
    if (!r.ok() || r.value().status != sluice::LeaseStatus::kGranted) {
      state.SkipWithError(r.ok() ? "lease not granted" : r.status().to_string().c_str());
      break;
    }
  }
}

// The same, 16 leases per call pipelined (lease_many: one round trip), one coordinator per
// thread: what redis-benchmark -P 16 does. One iteration is 16 leases.
void BM_RedisLeasePipelined(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  auto c = sluice::RedisRateCoordinator::connect(f.options());
  if (!c.ok()) return state.SkipWithError(c.status().to_string().c_str());
  const sluice::LeaseRequest req = lease_request(16);
  const std::vector<sluice::LeaseCall> calls(kPipelined, sluice::LeaseCall{kLeaseKey, &req});
  for (auto _ : state) {
    const auto r = c.value()->lease_many(calls, kTimeout);
    const bool ok = r.size() == calls.size() && std::all_of(r.begin(), r.end(), [](const auto& x) {
                      return x.ok() && x.value().status == sluice::LeaseStatus::kGranted;
                    });
    if (!ok) {
      state.SkipWithError("a pipelined lease failed or was not granted");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kPipelined));
}

// redis-benchmark sending the coordinator's lease: EVALSHA sha 3 <ledger key> <origin key>
// <server key> lease "" (Redis TIME) <min ttl ms> <region> <limit> <period us> <want>
// <min left us> <run_id>.
void BM_Floor_RedisBenchmarkLease(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const int clients = static_cast<int>(state.range(0));
  const int pipeline = static_cast<int>(state.range(1));
  Reply load(static_cast<redisReply*>(
      redisCommand(f.ctx.get(), "SCRIPT LOAD %s", sluice::RedisRateCoordinator::script().c_str())));
  if (!load || load->type != REDIS_REPLY_STRING) return state.SkipWithError("SCRIPT LOAD failed");
  const sluice::LeaseRequest req = lease_request(16);
  const std::string prefix = f.options().key_prefix;
  std::vector<std::string> args = {"redis-benchmark",
                                   "-h",
                                   "127.0.0.1",
                                   "-p",
                                   std::to_string(f.server.port()),
                                   "-c",
                                   std::to_string(clients),
                                   "-P",
                                   std::to_string(pipeline),
                                   "-n",
                                   std::to_string(g_short ? 200 : 20'000 * (pipeline > 1 ? 4 : 1)),
                                   "--csv",
                                   "EVALSHA",
                                   std::string(load->str, load->len),
                                   "3",
                                   prefix + "{" + kLeaseKey + "}",
                                   prefix + "origin",
                                   prefix + "server",
                                   "lease",
                                   "",
                                   "60000",
                                   req.region,
                                   std::to_string(req.spec.limit),
                                   std::to_string(req.spec.period.count() / 1000),
                                   std::to_string(req.want),
                                   "5000",
                                   f.run_id};
  for (auto _ : state) {
    const ToolRun run = run_tool(args);
    report_rate(state, csv_rps(run.output), run);
  }
}

struct PostgresFixture {
  sluice::testing::PostgresServer server;
  std::string dir;
  std::string error;
  PostgresFixture() {
    if (Status s = server.start(); !s.ok()) {
      error = s.to_string();
      return;
    }
    dir = (std::filesystem::temp_directory_path() / "sluice-fedbench-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      error = "cannot create a temp dir for pgbench";
      dir.clear();
      return;
    }
    // The tables, and an origin row three hours back (a coordinator that has kept its state:
    // the current window is not the one new tables must count as spent).
    if (auto c = sluice::PostgresRateCoordinator::connect(options()); !c.ok()) {
      error = c.status().to_string();
      return;
    }
    const std::string script = dir + "/origin.sql";
    std::ofstream(script) << "INSERT INTO sluice_fed_origin (id, origin_ns, timeline) VALUES (1, "
                             "((extract(epoch FROM clock_timestamp()) - 10800) * 1e9)::bigint, "
                             "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) "
                             "ON CONFLICT (id) DO UPDATE SET origin_ns = EXCLUDED.origin_ns, "
                             "timeline = EXCLUDED.timeline;\n";
    const ToolRun run = run_tool({"pgbench", "-n", "-t", "1", "-f", script, server.conninfo()});
    if (run.exit_code != 0) error = "cannot write the origin row: " + run.output.substr(0, 300);
  }
  ~PostgresFixture() {
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
  PostgresFixture(const PostgresFixture&) = delete;
  PostgresFixture& operator=(const PostgresFixture&) = delete;
  sluice::PostgresOptions options() const {
    sluice::PostgresOptions o = sluice::PostgresRateCoordinator::default_options();
    o.conninfo = server.conninfo();
    return o;
  }
};

PostgresFixture& postgres_fixture() {
  static PostgresFixture f;
  return f;
}

void BM_PostgresLease(benchmark::State& state) {
  PostgresFixture& f = postgres_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  auto c = sluice::PostgresRateCoordinator::connect(f.options());
  if (!c.ok()) return state.SkipWithError(c.status().to_string().c_str());
  const int nkeys = static_cast<int>(state.range(0));
  const sluice::LeaseRequest req = lease_request(16);
  std::vector<std::string> keys;
  for (int k = 0; k < nkeys; ++k) keys.push_back("pg-" + std::to_string(k));
  std::size_t i = 0;
  for (auto _ : state) {
    auto r = c.value()->lease(keys[i++ % keys.size()], req, kTimeout);
    if (!r.ok() || r.value().status != sluice::LeaseStatus::kGranted) {
      state.SkipWithError(r.ok() ? "lease not granted" : r.status().to_string().c_str());
      break;
    }
  }
}

// The coordinator's lease as a pgbench script
// (src/backends/postgres/postgres_rate_coordinator.cpp): round trip 1 locks the key, keeps the
// origin row, reads the clock, the ledger and the region rows; round trip 2 upserts the ledger,
// replaces the region rows and commits. The values written are a realistic ledger of the same size
// (one region).
std::string pgbench_lease_script(int nkeys) {
  const std::string key = "('pg-' || :k)";
  std::string s = "\\set k random(0, " + std::to_string(nkeys - 1) + ")\n";
  s += "BEGIN \\; SET LOCAL lock_timeout = 750 \\; SET LOCAL statement_timeout = 750 \\; "
       "SET LOCAL idle_in_transaction_session_timeout = 1000 \\; "
       "SELECT pg_advisory_xact_lock(hashtextextended('sluice_fed:' || " +
       key +
       ", 0)) \\; INSERT INTO sluice_fed_origin AS o (id, origin_ns, timeline) VALUES (1, "
       "((extract(epoch FROM clock_timestamp()) * 1e6)::bigint * 1000), "
       "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) ON CONFLICT (id) DO UPDATE SET "
       "origin_ns = EXCLUDED.origin_ns, timeline = EXCLUDED.timeline WHERE o.timeline IS "
       "DISTINCT FROM EXCLUDED.timeline \\; SELECT ((extract(epoch FROM clock_timestamp()) * "
       "1e6)::bigint * 1000), "
       "(SELECT origin_ns FROM sluice_fed_origin WHERE id = 1), window_start, clock_high, lim, "
       "period_ns, granted, returned, forfeited FROM (SELECT 1) AS one LEFT JOIN "
       "sluice_fed_ledger ON key = " +
       key +
       " \\; SELECT region, granted, relinquished, relinquished_window FROM sluice_fed_regions "
       "WHERE key = " +
       key + " ORDER BY region COLLATE \"C\";\n";
  s += "INSERT INTO sluice_fed_ledger (key, window_start, clock_high, lim, period_ns, granted, "
       "returned, forfeited, idle_after) VALUES (" +
       key +
       ", 1764036000000000000, 1764037000000000000, 1125899906842624, 3600000000000, 123456, 0, "
       "0, 1764046800000000000) ON CONFLICT (key) DO UPDATE SET window_start = "
       "EXCLUDED.window_start, clock_high = EXCLUDED.clock_high, lim = EXCLUDED.lim, period_ns "
       "= EXCLUDED.period_ns, granted = EXCLUDED.granted, returned = EXCLUDED.returned, "
       "forfeited = EXCLUDED.forfeited, idle_after = EXCLUDED.idle_after \\; DELETE FROM "
       "sluice_fed_regions WHERE key = " +
       key +
       " \\; INSERT INTO sluice_fed_regions (key, region, granted, relinquished, "
       "relinquished_window) VALUES (" +
       key + ", 'bench', 123456, 0, 0) \\; COMMIT;\n";
  return s;
}

void BM_Floor_PgbenchLease(benchmark::State& state) {
  PostgresFixture& f = postgres_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const int nkeys = static_cast<int>(state.range(0));
  {
    // The tables exist and every key has its rows, as for the coordinator's run.
    auto c = sluice::PostgresRateCoordinator::connect(f.options());
    if (!c.ok()) return state.SkipWithError(c.status().to_string().c_str());
    for (int k = 0; k < nkeys; ++k)
      if (!c.value()->lease("pg-" + std::to_string(k), lease_request(16), kTimeout).ok())
        return state.SkipWithError("lease failed");
  }
  const std::string script = f.dir + "/lease-" + std::to_string(nkeys) + ".sql";
  std::ofstream(script) << pgbench_lease_script(nkeys);
  const std::vector<std::string> args = {
      "pgbench", "-n", "-c", "1", "-T", g_short ? "1" : "3", "-f", script, f.server.conninfo()};
  for (auto _ : state) {
    const ToolRun run = run_tool(args);
    report_rate(state, pgbench_tps(run.output), run);
  }
}

// ---- in process ----

void BM_FederatedEscrow(benchmark::State& state) {
  const sluice::Clock& clock = sluice::SteadyClock::instance();
  sluice::MemoryRateCoordinator coordinator(clock);
  sluice::FederationOptions o;
  o.region = "bench";
  o.budget.limit = kHuge;
  o.budget.period = kHour;
  o.batch = 16;
  sluice::FederatedLimiter limiter(coordinator, clock, o,
                                   [](std::function<void()> task) { task(); });
  const auto& keys = key_names(kBusyKeys);
  std::size_t i = 0;
  std::uint64_t n = 0, decided = 0;
  Nanos now = clock.now();
  for (auto _ : state) {
    if ((++n & 63) == 0) now = clock.now();
    const std::string& k = keys[i++ % keys.size()];
    auto d = limiter.try_check(k, 1, now);
    if (d) {
      ++decided;
      benchmark::DoNotOptimize(d->rate.allowed);
    } else {
      benchmark::DoNotOptimize(limiter.check_wait(k, 1));  // a lease: inline, so already done
    }
  }
  state.counters["from_escrow"] =
      n > 0 ? static_cast<double>(decided) / static_cast<double>(n) : 0.0;
}

void BM_RateLimiterFixedWindow(benchmark::State& state) {
  const sluice::Clock& clock = sluice::SteadyClock::instance();
  sluice::RateLimiterOptions o;
  o.rule.strategy = sluice::RateStrategy::kFixedWindow;
  o.rule.limit = kHuge;
  o.rule.period = kHour;
  auto limiter = std::move(sluice::make_rate_limiter(o, clock).value());
  const auto& keys = key_names(kBusyKeys);
  std::size_t i = 0;
  std::uint64_t n = 0;
  Nanos now = clock.now();
  for (auto _ : state) {
    if ((++n & 63) == 0) now = clock.now();
    benchmark::DoNotOptimize(limiter->check(keys[i++ % keys.size()], 1, now));
  }
}

}  // namespace

BENCHMARK(BM_Floor_RedisPerRequest)
    ->ArgName("mix")
    ->Arg(kBusy)
    ->Arg(kOver)
    ->Arg(kTail)
    ->Arg(kHot)
    ->UseRealTime();
BENCHMARK(BM_FederatedRedis)
    ->ArgName("mix")
    ->Arg(kBusy)
    ->Arg(kOver)
    ->Arg(kTail)
    ->Arg(kHot)
    ->UseRealTime();
BENCHMARK(BM_RedisLease)->Threads(1)->Threads(50)->UseRealTime();
BENCHMARK(BM_RedisLeasePipelined)->Threads(50)->UseRealTime();
BENCHMARK(BM_Floor_RedisBenchmarkLease)
    ->ArgNames({"clients", "pipeline"})
    ->Args({1, 1})
    ->Args({50, 1})
    ->Args({50, 16})
    ->Iterations(1)
    ->UseManualTime();
BENCHMARK(BM_PostgresLease)->ArgName("keys")->Arg(1)->Arg(64)->UseRealTime();
BENCHMARK(BM_Floor_PgbenchLease)->ArgName("keys")->Arg(1)->Arg(64)->Iterations(1)->UseManualTime();
BENCHMARK(BM_FederatedEscrow);
BENCHMARK(BM_RateLimiterFixedWindow);
BENCHMARK(sluice::bench::BM_Floor_FetchAddSub);

// Federated time per decision <= 1/50 (over the limit), <= 1/10 (busy keys), <= 1 (the long
// tail: every check a lease) of the per-request limiter's.
SLUICE_BENCH_RATIO("BM_FederatedRedis/mix:1/real_time", "BM_Floor_RedisPerRequest/mix:1/real_time",
                   0.02);
SLUICE_BENCH_RATIO("BM_FederatedRedis/mix:0/real_time", "BM_Floor_RedisPerRequest/mix:0/real_time",
                   0.1);
SLUICE_BENCH_RATIO("BM_FederatedRedis/mix:2/real_time", "BM_Floor_RedisPerRequest/mix:2/real_time",
                   1.0);
SLUICE_BENCH_RATIO("BM_FederatedRedis/mix:3/real_time", "BM_Floor_RedisPerRequest/mix:3/real_time",
                   0.1);
// Time per lease <= 1.25x the tool's time per operation is >= 0.8x its rate.
SLUICE_BENCH_RATIO("BM_RedisLease/real_time/threads:1",
                   "BM_Floor_RedisBenchmarkLease/clients:1/pipeline:1/iterations:1/manual_time",
                   1.25);
SLUICE_BENCH_RATIO("BM_RedisLease/real_time/threads:50",
                   "BM_Floor_RedisBenchmarkLease/clients:50/pipeline:1/iterations:1/manual_time",
                   1.25);
// A pipelined iteration is 16 leases: >= 0.8x the tool's rate is <= 16 x 1.25 its time per op.
SLUICE_BENCH_RATIO("BM_RedisLeasePipelined/real_time/threads:50",
                   "BM_Floor_RedisBenchmarkLease/clients:50/pipeline:16/iterations:1/manual_time",
                   20);
SLUICE_BENCH_RATIO("BM_PostgresLease/keys:1/real_time",
                   "BM_Floor_PgbenchLease/keys:1/iterations:1/manual_time", 1.25);
SLUICE_BENCH_RATIO("BM_PostgresLease/keys:64/real_time",
                   "BM_Floor_PgbenchLease/keys:64/iterations:1/manual_time", 1.25);
SLUICE_BENCH_RATIO("BM_FederatedEscrow", "BM_RateLimiterFixedWindow", 0);
SLUICE_BENCH_RATIO("BM_FederatedEscrow", "BM_Floor_FetchAddSub", 0);

// ratio_main, with the repetitions of every benchmark interleaved at random unless the command
// line says otherwise: the floors are other processes on a shared machine, and a load that comes
// or goes mid-run then weighs on subject and floor alike.
int main(int argc, char** argv) {
  g_short = short_run(argc, argv);
  std::vector<char*> args(argv, argv + argc);
  std::string interleave = "--benchmark_enable_random_interleaving=true";
  if (!sluice::bench::has_flag(argc, argv, "--benchmark_enable_random_interleaving"))
    args.push_back(interleave.data());
  return sluice::bench::ratio_main(static_cast<int>(args.size()), args.data());
}
