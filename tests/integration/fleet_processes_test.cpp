// Four fleet guards in four processes over one real Redis: the end-to-end requirements.
//
//   - L_global = 8 shared by 4 nodes, 30,000 jobs of 5 ms: no admission above L_global once
//     membership is stable (none at all with acknowledged handoff); the throughput against the
//     ideal L_global / 5 ms = 1,600 jobs/s (18.75 s for 30,000 jobs) is printed as a figure
//     (target >= 0.9, recorded in bench/README.md), not asserted.
//   - 4 nodes admitting 2,000 calls/s each: Redis commands per admitted call <= 0.01, read from
//     the server's own counters.
//   - 3 nodes, L_global = 12, one stopped (SIGSTOP) past its lease while its calls run on in the
//     backend: no more than L_global calls in the backend at once when calls end by their
//     deadline (a few seconds each run), and the over-admission when they outlive the lease.
//
// Each node is a sluice_fleet_worker process (tests/tools/fleet_worker.cpp). The workers count
// fleet-wide in a shared-memory file (permits held, violations and their times, jobs, the start
// barrier, when membership became stable) and report the totals themselves (the worker's
// report mode), so the file's layout lives in one place. Real processes, a real server and real
// sleeps: this suite runs on wall-clock time (about 50 s), and a failure names the worker and
// shows its output. Every child is stopped by its pid and reaped, also when an assertion fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/testing/servers.h"

extern char** environ;

namespace sluice {
namespace {

namespace fs = std::filesystem;
using std::chrono::duration;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kNodes = 4;
constexpr int kLimit = 8;  // every node's L_local, so L_global (the median) too
constexpr std::int64_t kJobs = 30'000;
constexpr Nanos kJob = milliseconds(5);
constexpr Nanos kIdeal = kJob * kJobs / kLimit;  // 18.75 s: L_global / 5 ms = 1,600 jobs/s
constexpr int kRate = 2'000;                     // calls/s per node
constexpr int kRateSeconds = 5;
constexpr double kMaxCommandsPerCall = 0.01;

using Report = std::map<std::string, std::int64_t>;

std::string read_tail(const std::string& path, std::size_t max = 3000) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > max ? "..." + s.substr(s.size() - max) : s;
}

double secs(Nanos d) { return duration<double>(d).count(); }

// A child process (posix_spawn) with stdout and stderr in files of its own. Destroying it
// kills it (SIGKILL, by its pid) if it still runs, and reaps it.
class Child {
 public:
  Child(std::string name, const std::vector<std::string>& args, const std::string& dir)
      : name_(std::move(name)), out_(dir + "/" + name_ + ".out"), err_(dir + "/" + name_ + ".err") {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Child() { kill(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  [[nodiscard]] bool started() const { return pid_ > 0 || exited_; }
  [[nodiscard]] bool exited() const { return exited_; }
  // The exit code; -1 if it was killed by a signal or has not exited.
  [[nodiscard]] int exit_code() const { return exit_code_; }

  // Waits until the child exits or the SteadyClock reaches `deadline`; false on timeout.
  bool wait_until(Nanos deadline) {
    while (!reap(WNOHANG)) {
      if (pid_ <= 0 || SteadyClock::instance().now() >= deadline) return exited_;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return true;
  }
  // Sends `sig` (SIGSTOP, SIGCONT) to the child by its pid; false if it is gone.
  bool signal(int sig) { return pid_ > 0 && ::kill(pid_, sig) == 0; }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    reap(0);
  }
  [[nodiscard]] std::string out() const { return read_tail(out_); }
  [[nodiscard]] std::string describe() const {
    std::string s = name_ + (exited_ ? " exited with " + std::to_string(exit_code_) : " timed out");
    return s + "\n  stderr: " + read_tail(err_) + "\n  stdout: " + read_tail(out_) + "\n";
  }

 private:
  bool reap(int flags) {
    int status = 0;
    pid_t r = 0;
    while ((r = ::waitpid(pid_, &status, flags)) < 0 && errno == EINTR) {
    }
    if (r != pid_) return false;
    pid_ = -1;
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  }

  std::string name_, out_, err_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_code_ = -1;
};

// The sum of `calls` over every command in INFO commandstats, and the calls per command.
struct CommandStats {
  std::int64_t total = 0;
  std::map<std::string, std::int64_t> calls;
  [[nodiscard]] std::int64_t of(const std::string& command) const {
    const auto it = calls.find(command);
    return it == calls.end() ? 0 : it->second;
  }
};

CommandStats command_stats(int port) {
  const std::string cmd =
      "redis-cli -h 127.0.0.1 -p " + std::to_string(port) + " INFO commandstats 2>&1";
  CommandStats stats;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 512> buf{};
    while (std::fgets(buf.data(), buf.size(), p) != nullptr) {
      const std::string line = buf.data();  // cmdstat_<name>:calls=<n>,usec=...
      const std::size_t colon = line.find(":calls="), comma = line.find(',', colon);
      if (line.rfind("cmdstat_", 0) != 0 || colon == std::string::npos) continue;
      const std::int64_t n = std::stoll(line.substr(colon + 7, comma - colon - 7));
      stats.calls[line.substr(8, colon - 8)] = n;
      stats.total += n;
    }
    ::pclose(p);
  }
  return stats;
}

class FleetProcesses : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }

  void SetUp() override {
    ASSERT_TRUE(server_.ok()) << server_.status().to_string();
#ifndef SLUICE_FLEET_WORKER
    GTEST_SKIP() << "sluice_fleet_worker is not built (no Redis backend)";
#endif
    std::string pattern = (fs::temp_directory_path() / "sluice-fleet-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  static std::vector<std::string> worker_args(const std::string& run) {
#ifdef SLUICE_FLEET_WORKER
    const std::string worker = SLUICE_FLEET_WORKER;
#else
    const std::string worker;
#endif
    return {worker, "--shm=" + run + ".shm", "--nodes=" + std::to_string(kNodes),
            "--limit=" + std::to_string(kLimit)};
  }

  // Runs kNodes workers (`flags` plus their own --node, --key and --port) to completion, then
  // reads the run's totals into `report`.
  ::testing::AssertionResult run_fleet(const std::string& run,
                                       const std::vector<std::string>& flags, Nanos timeout,
                                       Report& report) const {
    std::vector<std::unique_ptr<Child>> workers;
    for (int i = 1; i <= kNodes; ++i) {
      std::vector<std::string> args = worker_args(dir_ + "/" + run);
      args.insert(args.end(), flags.begin(), flags.end());
      args.push_back("--node=" + run + "-" + std::to_string(i));
      args.push_back("--key=" + run);
      args.push_back("--port=" + std::to_string(server_->port()));
      workers.push_back(std::make_unique<Child>(run + "-" + std::to_string(i), args, dir_));
      if (!workers.back()->started())
        return ::testing::AssertionFailure() << "cannot spawn " << args[0];
    }
    const Nanos deadline = SteadyClock::instance().now() + timeout;
    std::string failures;
    for (const auto& w : workers)
      if (!w->wait_until(deadline) || w->exit_code() != 0) failures += w->describe();
    if (!failures.empty()) return ::testing::AssertionFailure() << "worker failed:\n" << failures;
    for (const auto& w : workers) std::printf("  %s", w->out().c_str());  // the node's stats
    return read_report(run, report);
  }

  ::testing::AssertionResult read_report(const std::string& run, Report& report) const {
    std::vector<std::string> args = worker_args(dir_ + "/" + run);
    args.push_back("--mode=report");
    Child reporter(run + "-report", args, dir_);
    if (!reporter.wait_until(SteadyClock::instance().now() + seconds(10)) ||
        reporter.exit_code() != 0)
      return ::testing::AssertionFailure() << reporter.describe();
    std::istringstream in(reporter.out());
    std::string name;
    std::int64_t value = 0;
    while (in >> name >> value) report[name] = value;
    if (report.size() < 10) return ::testing::AssertionFailure() << reporter.describe();
    return ::testing::AssertionSuccess();
  }

  // The jobs run: kJobs jobs of kJob, each node's callers starting at once after every node's
  // first grant. Checks what both handoff modes share; prints the figures.
  void run_jobs(const std::string& run, bool handoff, Report& r) const {
    const std::vector<std::string> flags = {
        "--mode=jobs",
        std::string("--handoff=") + (handoff ? "1" : "0"),
        "--jobs=" + std::to_string(kJobs),
        "--job-us=" +
            std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(kJob).count()),
        "--threads=8",
        "--heartbeat-ms=100"};
    ASSERT_TRUE(run_fleet(run, flags, seconds(90), r));
    const Nanos elapsed = std::chrono::microseconds(r["elapsed_us"]);
    std::printf(
        "[fleet] %s: %lld jobs in %.2f s (ideal %.2f s): throughput %.3f of ideal; violations "
        "%lld (before stable %lld, after %lld); max in flight %lld; stable %.2f s after start; "
        "rejected %lld; late releases %lld (over the limit only with overdue permits: %lld)\n",
        run.c_str(), static_cast<long long>(r["jobs_done"]), secs(elapsed), secs(kIdeal),
        secs(kIdeal) / secs(elapsed), static_cast<long long>(r["violations"]),
        static_cast<long long>(r["violations_before_stable"]),
        static_cast<long long>(r["violations_after_stable"]),
        static_cast<long long>(r["max_in_flight"]), r["stable_after_start_us"] / 1e6,
        static_cast<long long>(r["rejected"]), static_cast<long long>(r["late_releases"]),
        static_cast<long long>(r["overdue_excess"]));
    EXPECT_EQ(r["jobs_done"], kJobs);
    EXPECT_EQ(r["in_flight"], 0) << "every admitted call was released";
    EXPECT_EQ(r["stable"], 1) << "every node was granted with the whole fleet";
    EXPECT_EQ(r["violations_after_stable"], 0) << "admitted above L_global = " << kLimit;
    EXPECT_GT(elapsed, Nanos{0});
    // Throughput is a figure, not a test verdict (timings depend on the machine's load): the
    // line above prints it; bench/README.md records it against the >= 0.9 target.
  }

  // Freeze mode (3 nodes, L_global 12, heartbeat 100 ms): node 1 is stopped (SIGSTOP) for
  // 1.2 s, past its lease, once calls are running, then continued; the run's calls last 3 s.
  void run_freeze(const std::string& run, const std::vector<std::string>& flags,
                  Report& report) const {
    constexpr int kFreezeNodes = 3;
    std::vector<std::unique_ptr<Child>> workers;
    for (int i = 1; i <= kFreezeNodes; ++i) {
      std::vector<std::string> args = {worker_args(dir_ + "/" + run)[0],
                                       "--shm=" + dir_ + "/" + run + ".shm",
                                       "--nodes=" + std::to_string(kFreezeNodes),
                                       "--limit=12",
                                       "--mode=freeze",
                                       "--threads=8",
                                       "--seconds=3",
                                       "--heartbeat-ms=100",
                                       "--node=" + run + "-" + std::to_string(i),
                                       "--key=" + run,
                                       "--port=" + std::to_string(server_->port())};
      args.insert(args.end(), flags.begin(), flags.end());
      workers.push_back(std::make_unique<Child>(run + "-" + std::to_string(i), args, dir_));
      ASSERT_TRUE(workers.back()->started()) << "cannot spawn " << args[0];
    }
    // Once the callers have started (every node held its fair share), let calls build up,
    // then stop node 1 past its lease.
    const Nanos give_up = SteadyClock::instance().now() + seconds(20);
    Report now;
    while (now["started"] == 0 && SteadyClock::instance().now() < give_up) {
      std::this_thread::sleep_for(milliseconds(50));
      now.clear();
      ASSERT_TRUE(read_report(run, now));
    }
    ASSERT_EQ(now["started"], 1) << workers[0]->describe();
    std::this_thread::sleep_for(milliseconds(500));
    ASSERT_TRUE(workers[0]->signal(SIGSTOP));
    std::this_thread::sleep_for(milliseconds(1200));
    ASSERT_TRUE(workers[0]->signal(SIGCONT));
    const Nanos deadline = SteadyClock::instance().now() + seconds(30);
    std::string failures;
    for (const auto& w : workers)
      if (!w->wait_until(deadline) || w->exit_code() != 0) failures += w->describe();
    ASSERT_TRUE(failures.empty()) << "worker failed:\n" << failures;
    ASSERT_TRUE(read_report(run, report));
    std::printf(
        "[fleet] %s: %lld calls, at most %lld in the backend at once (L_global 12), a "
        "peer evicted: %lld\n  frozen node: %s",
        run.c_str(), static_cast<long long>(report["calls"]),
        static_cast<long long>(report["max_overlap"]), static_cast<long long>(report["evicted"]),
        workers[0]->out().c_str());
  }

  static testing::SuiteServer<testing::RedisServer> server_;
  std::string dir_;
};
testing::SuiteServer<testing::RedisServer> FleetProcesses::server_;

TEST_F(FleetProcesses, AcknowledgedHandoffNeverAdmitsAboveTheGlobalLimit) {
  Report r;
  run_jobs("handoff", true, r);
  EXPECT_EQ(r["violations"], 0) << "acknowledged handoff admitted above L_global = " << kLimit;
}

TEST_F(FleetProcesses, WithoutHandoffNoAdmissionAboveTheGlobalLimitOnceMembershipIsStable) {
  Report r;
  run_jobs("no-handoff", false, r);  // violations_after_stable == 0 is checked there
}

// A node stopped (SIGSTOP) past its lease loses its record and the others take its share,
// while the calls it admitted go on in the backend. With a call deadline the lease covers
// (call_deadline 250 ms, so lease_ttl 400 ms) and a backend that stops each call at its
// deadline, the frozen node's calls are gone before its lease is: never more than L_global in
// the backend at once, fail-closed or local-only, the thaw included (the thawed node does not
// admit on the grant it held before the stop).
TEST_F(FleetProcesses, AFrozenNodePastItsLeaseCausesNoOverAdmissionWhenCallsHonourTheDeadline) {
  for (const std::string outage : {"fail-closed", "local-only"}) {
    Report r;
    run_freeze("freeze-" + outage, {"--deadline-ms=250", "--outage=" + outage}, r);
    if (HasFatalFailure()) return;
    EXPECT_EQ(r["evicted"], 1) << outage << ": the stop did not outlast the lease";
    EXPECT_GE(r["calls"], 24) << outage;
    EXPECT_LE(r["max_overlap"], 12) << outage << ": admitted above L_global";
  }
}

// The same stop when calls outlive the lease (lease 200 ms, calls of 600-900 ms that run on
// past their deadline: what a fleet without the rule did): the harness sees the over-admission
// the deadline rule prevents.
TEST_F(FleetProcesses, AFrozenNodeWhoseCallsOutliveItsLeaseLeadsToOverAdmission) {
  Report r;
  run_freeze("freeze-control",
             {"--lease-ms=200", "--honour=0", "--call-min-ms=600", "--call-max-ms=900"}, r);
  if (HasFatalFailure()) return;
  EXPECT_EQ(r["evicted"], 1);
  EXPECT_GT(r["max_overlap"], 12);
}

// The server's counters include the commands the heartbeat script runs (TIME, HGETALL, HSET,
// PEXPIRE, HDEL on evictions), not only the EVALSHA that runs it: about 5 per heartbeat. So the
// cost is about 5 x nodes / heartbeat over the admitted rate: 0.0025 at the default 1 s
// heartbeat (which this run uses), 0.025 at 100 ms; the 0.01 bound holds from ~250 ms up.
TEST_F(FleetProcesses, CoordinatorCostsAtMostOneRedisCommandPerHundredAdmittedCalls) {
  constexpr int kHeartbeatMs = 1000;  // FleetGuardOptions' default
  const CommandStats calibrate = command_stats(server_->port());
  const CommandStats before = command_stats(server_->port());
  const std::int64_t per_info = before.total - calibrate.total;  // the INFO call itself
  ASSERT_GE(per_info, 1);
  Report r;
  ASSERT_TRUE(run_fleet("rate",
                        {"--mode=rate", "--threads=4", "--rate=" + std::to_string(kRate),
                         "--seconds=" + std::to_string(kRateSeconds), "--call-us=500",
                         "--heartbeat-ms=" + std::to_string(kHeartbeatMs)},
                        seconds(60), r));
  const CommandStats after = command_stats(server_->port());
  const std::int64_t commands = after.total - before.total - per_info;
  const std::int64_t beats = after.of("evalsha") - before.of("evalsha");
  const double per_call = static_cast<double>(commands) / static_cast<double>(r["admitted"]);
  const double per_beat = static_cast<double>(commands) / static_cast<double>(beats);
  std::printf(
      "[fleet] rate: %lld calls admitted (%.0f/s per node, %lld missed), %lld Redis commands "
      "(%lld heartbeats, %.1f commands each): %.4f commands per admitted call at a %d ms "
      "heartbeat (%.4f at 100 ms)\n",
      static_cast<long long>(r["admitted"]),
      static_cast<double>(r["admitted"]) / kNodes / kRateSeconds,
      static_cast<long long>(r["missed"]), static_cast<long long>(commands),
      static_cast<long long>(beats), per_beat, per_call, kHeartbeatMs,
      per_beat * kNodes * 10 / (kNodes * kRate));
  for (const auto& [name, n] : after.calls) {
    const std::int64_t delta = n - before.of(name);
    if (delta > 0) std::printf("[fleet]   %s: %lld\n", name.c_str(), static_cast<long long>(delta));
  }
  // The ratio needs the load to have been offered; half of it is plenty (a loaded machine may
  // pace the callers late).
  EXPECT_GE(r["admitted"], kNodes * kRate * kRateSeconds / 2) << "the load was not offered";
  EXPECT_EQ(r["violations"], 0);
  EXPECT_GT(beats, 0);
  EXPECT_LE(per_call, kMaxCommandsPerCall);
}

}  // namespace
}  // namespace sluice
