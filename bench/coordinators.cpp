// Coordinator heartbeats against the servers' own load tools doing the same work in the same run
// (the targets: at least 0.8x of each tool's rate):
//
//   Redis: RedisCoordinator::heartbeat, one connection, sequential calls, Redis TIME, with 8
//     and 50 live nodes on one key, against `redis-benchmark -c 1 -r N EVALSHA <the script>`
//     on the same hash key with the same arguments (__rand_int__ picks among the same N ids);
//   PostgreSQL: PostgresCoordinator::heartbeat, server clock, 8 live nodes, against `pgbench
//     -c 1` sending the coordinator's two round trips (its statements, `\;`-joined into the
//     same two queries, with a fixed realistic write in place of the heartbeat core's).
//
// The tools' figures enter the ratio table as manual-time benchmarks: one repetition is one run
// of the tool and its time per operation is 1 / (the requests or transactions per second the
// tool reports). The table compares time per heartbeat, so "0.8x the tool's rate" reads as a
// ratio <= 1.25x; the "ops_per_s" counters give the rates. Both servers are throwaway
// (sluice/testing/servers.h): 127.0.0.1, a free port, stopped at exit. With a
// --benchmark_min_time below 0.1 s (the smoke test) the tools' runs are tiny.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/ratio_main.h"
#include "sluice/backends/postgres_coordinator.h"
#include "sluice/backends/redis_coordinator.h"
#include "sluice/testing/servers.h"

extern char** environ;

namespace {

using sluice::Grant;
using sluice::Nanos;
using sluice::NodeReport;
using sluice::Status;
using sluice::StatusCode;

constexpr Nanos kTimeout = std::chrono::seconds(1);
constexpr Nanos kLease = std::chrono::seconds(10);
constexpr std::uint32_t kLocalLimit = 100;
constexpr const char* kRedisPrefix = "sluice:fleet:";
constexpr const char* kTablePrefix = "sluice_fleet";
constexpr int kPostgresNodes = 8;
constexpr int kPostgresFirstId = 10;  // ids n_000000000010..: pgbench writes 'n_0000000000:node'
static_assert(kPostgresFirstId >= 10 && kPostgresFirstId + kPostgresNodes <= 100);

bool g_short = false;  // --benchmark_min_time < 0.1: keep the tools' runs tiny

bool short_run(int argc, char** argv) {
  const std::string flag = "--benchmark_min_time=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(flag, 0) == 0)
      return std::strtod(argv[i] + flag.size(), nullptr) < 0.1;
  return false;
}

// redis-benchmark's __rand_int__ is 12 zero-padded digits.
std::string node_id(int i) {
  std::string digits = std::to_string(i);
  return "n_" + std::string(12 - digits.size(), '0') + digits;
}

std::string key_for(int nodes) { return "bench-" + std::to_string(nodes); }

std::int64_t to_us(Nanos d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

// ---- running a tool ----

struct ToolRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

void read_all(int fd, std::string& out) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return;
    }
  }
}

// Runs argv[0] (looked up on PATH) to completion, capturing what it prints.
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
  if (rc == 0) read_all(fds[0], out.output);
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
  for (std::string line; std::getline(in, line);) out.push_back(line);
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

// ---- the fleet ----

// N nodes heartbeating one key in turn; each acks the generation it was granted and reports
// half its share in flight.
class Fleet {
 public:
  Fleet(sluice::ConcurrencyCoordinator& coordinator, std::string key, int nodes, int first_id)
      : coordinator_(coordinator), key_(std::move(key)) {
    for (int i = 0; i < nodes; ++i)
      reports_.push_back(NodeReport{.node_id = node_id(first_id + i),
                                    .l_local = kLocalLimit,
                                    .in_flight = 0,
                                    .acked_generation = 0,
                                    .lease_ttl = kLease});
  }

  // One heartbeat of the next node in turn.
  Status step() {
    NodeReport& r = reports_[next_++ % reports_.size()];
    auto g = coordinator_.heartbeat(key_, r, kTimeout);
    if (!g.ok()) return g.status();
    last_ = g.value();
    r.acked_generation = last_.generation;
    r.in_flight = last_.share / 2;
    return {};
  }

  // Every node once: the key then holds exactly these N live nodes.
  Status warm() {
    for (std::size_t i = 0; i < reports_.size(); ++i)
      if (Status s = step(); !s.ok()) return s;
    if (last_.nodes != reports_.size())
      return Status(StatusCode::kInternal, "the key holds " + std::to_string(last_.nodes) +
                                               " nodes, not " + std::to_string(reports_.size()));
    return {};
  }

  [[nodiscard]] const Grant& last() const { return last_; }

 private:
  sluice::ConcurrencyCoordinator& coordinator_;
  std::string key_;
  std::vector<NodeReport> reports_;
  std::size_t next_ = 0;
  Grant last_;
};

// Times `fleet.step()` per iteration; the rate goes to the "ops_per_s" counter.
void run_heartbeats(benchmark::State& state, Fleet& fleet) {
  if (Status s = fleet.warm(); !s.ok()) {
    state.SkipWithError(s.to_string().c_str());
    return;
  }
  const Nanos start = sluice::SteadyClock::instance().now();
  for (auto _ : state) {
    if (Status s = fleet.step(); !s.ok()) {
      state.SkipWithError(s.to_string().c_str());
      break;
    }
  }
  const double secs =
      std::chrono::duration<double>(sluice::SteadyClock::instance().now() - start).count();
  if (secs > 0) state.counters["ops_per_s"] = static_cast<double>(state.iterations()) / secs;
}

// A tool's rate as the time of one iteration (Iterations(1), UseManualTime()).
void report_rate(benchmark::State& state, double per_s, const ToolRun& run) {
  if (run.exit_code != 0 || per_s <= 0) {
    state.SkipWithError(("tool failed: " + run.output.substr(0, 500)).c_str());
    return;
  }
  state.SetIterationTime(1.0 / per_s);
  state.counters["ops_per_s"] = per_s;
}

// ---- Redis ----

// Members are destroyed in reverse: the coordinator before its server.
struct RedisFixture {
  sluice::testing::RedisServer server;
  std::unique_ptr<sluice::RedisCoordinator> coordinator;
  std::string error;  // non-empty: no Redis benchmark can run

  RedisFixture() {
    if (Status s = server.start(); !s.ok()) {
      error = s.to_string();
      return;
    }
    sluice::RedisOptions o;
    o.port = server.port();
    o.key_prefix = kRedisPrefix;
    auto c = sluice::RedisCoordinator::connect(o, sluice::CoordinatorConfig{});
    if (!c.ok()) {
      error = c.status().to_string();
      return;
    }
    coordinator = std::move(c.value());
  }
};

RedisFixture& redis_fixture() {
  static RedisFixture f;
  return f;
}

void BM_RedisCoordinator(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const int nodes = static_cast<int>(state.range(0));
  Fleet fleet(*f.coordinator, key_for(nodes), nodes, 0);
  run_heartbeats(state, fleet);
}

std::string port(const RedisFixture& f) { return std::to_string(f.server.port()); }

// The EVALSHA the coordinator sends for a node of `nodes` on the last grant (src/backends/redis/
// redis_coordinator.cpp), minus the leading "EVALSHA": the server's time, default config.
std::vector<std::string> evalsha_args(const RedisFixture& f, int nodes, const Grant& g,
                                      const std::string& node) {
  const std::int64_t lease_us = to_us(kLease);
  const std::int64_t key_ttl_ms = std::max<std::int64_t>(lease_us / 100, 60'000);
  return {f.coordinator->script_sha(),
          "1",  // one key
          kRedisPrefix + std::string("{") + key_for(nodes) + "}",
          node,
          std::to_string(kLocalLimit),   // l_local
          std::to_string(g.share / 2),   // in_flight
          std::to_string(g.generation),  // acked_generation
          std::to_string(lease_us),
          "0",   // aggregate: median
          "0",   // allocation: equal split
          "0",   // no acknowledged handoff
          "-1",  // now: Redis TIME
          std::to_string(key_ttl_ms)};
}

// The script runs by its SHA on the benchmark's key and sees the same N live nodes.
Status check_evalsha(const RedisFixture& f, int nodes, const Grant& g) {
  std::vector<std::string> args = {"redis-cli", "-h", "127.0.0.1", "-p", port(f), "EVALSHA"};
  for (std::string& a : evalsha_args(f, nodes, g, node_id(0))) args.push_back(std::move(a));
  const ToolRun run = run_tool(args);
  const std::vector<std::string> reply = lines_of(run.output);  // share, l_global, nodes, gen
  if (run.exit_code != 0 || reply.size() != 4 || reply[2] != std::to_string(nodes))
    return Status(StatusCode::kInternal, "redis-cli EVALSHA: " + run.output.substr(0, 500));
  return {};
}

void BM_Floor_RedisBenchmark(benchmark::State& state) {
  RedisFixture& f = redis_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const int nodes = static_cast<int>(state.range(0));
  Fleet fleet(*f.coordinator, key_for(nodes), nodes, 0);
  Status s = fleet.warm();
  if (s.ok()) s = check_evalsha(f, nodes, fleet.last());
  if (!s.ok()) return state.SkipWithError(s.to_string().c_str());
  // About a second per run on the development VM (the tool's clock counts milliseconds).
  const int requests = g_short ? 200 : (nodes <= 8 ? 10'000 : 2'500);
  std::vector<std::string> args = {"redis-benchmark", "-h", "127.0.0.1", "-p", port(f), "-c", "1"};
  args.insert(args.end(), {"-n", std::to_string(requests), "-r", std::to_string(nodes)});
  args.insert(args.end(), {"--csv", "EVALSHA"});
  for (std::string& a : evalsha_args(f, nodes, fleet.last(), "n___rand_int__"))
    args.push_back(std::move(a));
  for (auto _ : state) {
    const ToolRun run = run_tool(args);
    if (run.output.find("Error") != std::string::npos) {  // e.g. "Error from server: NOSCRIPT"
      state.SkipWithError(run.output.substr(0, 500).c_str());
      break;
    }
    report_rate(state, csv_rps(run.output), run);
  }
}

// ---- PostgreSQL ----

struct PostgresFixture {
  sluice::testing::PostgresServer server;
  std::unique_ptr<sluice::PostgresCoordinator> coordinator;
  std::string script_dir;  // pgbench's script
  std::string error;       // non-empty: no PostgreSQL benchmark can run

  PostgresFixture() {
    if (Status s = server.start(); !s.ok()) {
      error = s.to_string();
      return;
    }
    auto c = sluice::PostgresCoordinator::connect({server.conninfo(), kTablePrefix},
                                                  sluice::CoordinatorConfig{});
    if (!c.ok()) {
      error = c.status().to_string();
      return;
    }
    coordinator = std::move(c.value());
    std::string dir = (std::filesystem::temp_directory_path() / "sluice-pgbench-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      error = "cannot create a temp dir for pgbench";
      return;
    }
    script_dir = dir;
  }
  ~PostgresFixture() {
    std::error_code ec;
    if (!script_dir.empty()) std::filesystem::remove_all(script_dir, ec);
  }
  PostgresFixture(const PostgresFixture&) = delete;
  PostgresFixture& operator=(const PostgresFixture&) = delete;
};

PostgresFixture& postgres_fixture() {
  static PostgresFixture f;
  return f;
}

void BM_PostgresCoordinator(benchmark::State& state) {
  PostgresFixture& f = postgres_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  Fleet fleet(*f.coordinator, key_for(kPostgresNodes), kPostgresNodes, kPostgresFirstId);
  run_heartbeats(state, fleet);
}

// The coordinator's two round trips (src/backends/postgres/postgres_coordinator.cpp: begin_sql
// with a 1 s timeout, lock_and_read, write_and_commit with no eviction and no handoff), as a
// pgbench script: a random node among the N upserts the values of the last grant, with a lease
// far in the future (2100-01-01, as many digits as now) so that no node expires.
std::string pgbench_script(const Grant& g) {
  const std::string k = "'" + key_for(kPostgresNodes) + "'";
  const std::string keys = std::string(kTablePrefix) + "_keys";
  const std::string nodes = std::string(kTablePrefix) + "_nodes";
  const std::string fields =
      "node_id, l_local, in_flight, share, expires_ns, acked, unacked_gen, unacked_share";
  const std::string gen = std::to_string(g.generation);
  std::string s = "\\set node random(" + std::to_string(kPostgresFirstId) + ", " +
                  std::to_string(kPostgresFirstId + kPostgresNodes - 1) + ")\n";
  s += "BEGIN \\; SET LOCAL lock_timeout = 750 \\; SET LOCAL statement_timeout = 750 \\; "
       "SET LOCAL idle_in_transaction_session_timeout = 1000 \\; "
       "SELECT pg_advisory_xact_lock(hashtextextended(" +
       k + ", 0)) \\; SELECT (SELECT generation FROM " + keys + " WHERE key = " + k +
       "), (extract(epoch FROM clock_timestamp()) * 1e6)::bigint \\; SELECT " + fields + " FROM " +
       nodes + " WHERE key = " + k + " ORDER BY node_id COLLATE \"C\";\n";
  s += "INSERT INTO " + nodes + " (key, " + fields + ") VALUES (" + k + ", 'n_0000000000:node', " +
       std::to_string(kLocalLimit) + ", " + std::to_string(g.share / 2) + ", " +
       std::to_string(g.share) + ", 4102444800000000000, " + gen +
       ", '{}', '{}') ON CONFLICT (key, node_id) DO UPDATE SET "
       "l_local = EXCLUDED.l_local, in_flight = EXCLUDED.in_flight, share = EXCLUDED.share, "
       "expires_ns = EXCLUDED.expires_ns, acked = EXCLUDED.acked, "
       "unacked_gen = EXCLUDED.unacked_gen, unacked_share = EXCLUDED.unacked_share \\; "
       "INSERT INTO " +
       keys + " (key, generation) VALUES (" + k + ", " + gen +
       ") ON CONFLICT (key) DO UPDATE SET generation = EXCLUDED.generation \\; COMMIT;\n";
  return s;
}

void BM_Floor_Pgbench(benchmark::State& state) {
  PostgresFixture& f = postgres_fixture();
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  Fleet fleet(*f.coordinator, key_for(kPostgresNodes), kPostgresNodes, kPostgresFirstId);
  if (Status s = fleet.warm(); !s.ok()) return state.SkipWithError(s.to_string().c_str());
  const std::string script = f.script_dir + "/heartbeat.sql";
  std::ofstream(script) << pgbench_script(fleet.last());
  // pgbench is a client: the conninfo (user and database included) serves as its dbname.
  const std::vector<std::string> args = {
      "pgbench", "-n", "-c", "1", "-T", g_short ? "1" : "2", "-f", script, f.server.conninfo()};
  for (auto _ : state) {
    const ToolRun run = run_tool(args);
    report_rate(state, pgbench_tps(run.output), run);
  }
  // The coordinator still reads every row pgbench wrote: the same N live nodes.
  if (Status s = fleet.warm(); !s.ok()) state.SkipWithError(s.to_string().c_str());
}

}  // namespace

BENCHMARK(BM_RedisCoordinator)->ArgName("nodes")->Arg(8)->Arg(50)->UseRealTime();
BENCHMARK(BM_Floor_RedisBenchmark)
    ->ArgName("nodes")
    ->Arg(8)
    ->Arg(50)
    ->Iterations(1)
    ->UseManualTime();
BENCHMARK(BM_PostgresCoordinator)->UseRealTime();
BENCHMARK(BM_Floor_Pgbench)->Iterations(1)->UseManualTime();

// Time per heartbeat: <= 1.25x the tool's time per operation is >= 0.8x its rate.
SLUICE_BENCH_RATIO("BM_RedisCoordinator/nodes:8/real_time",
                   "BM_Floor_RedisBenchmark/nodes:8/iterations:1/manual_time", 1.25);
SLUICE_BENCH_RATIO("BM_RedisCoordinator/nodes:50/real_time",
                   "BM_Floor_RedisBenchmark/nodes:50/iterations:1/manual_time", 1.25);
SLUICE_BENCH_RATIO("BM_PostgresCoordinator/real_time", "BM_Floor_Pgbench/iterations:1/manual_time",
                   1.25);

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
