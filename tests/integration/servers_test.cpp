// The test harness's throwaway servers: they start on loopback and stop by pid, and they do not
// outlive a test process that dies without stopping them: a process that started a Redis and a
// PostgreSQL is killed with SIGKILL (as a test runner does on timeout: no destructor runs), and
// both servers must stop and their directories go, by their guards.
#include "sluice/testing/servers.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

extern char** environ;

namespace sluice::testing {
namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;

// Whether a process `pid` exists and is not a zombie.
bool running(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const std::string stat(buf, n);
  const std::size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Polls `done` every 50 ms for up to `limit`; whether it came true.
template <typename F>
bool eventually(F done, milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return done();
}

TEST(TestServers, RedisStartsOnAFreeLoopbackPortAndStopsByPid) {
  RedisServer redis;
  const Status s = redis.start();
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_GT(redis.port(), 0);
  const pid_t pid = redis.pid();
  ASSERT_GT(pid, 0);
  EXPECT_EQ(::kill(pid, 0), 0);
  redis.stop();
  EXPECT_NE(::kill(pid, 0), 0);
}

TEST(TestServers, PostgresStartsOnAFreeLoopbackPortAndStopsByPid) {
  PostgresServer pg;
  const Status s = pg.start();
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_NE(pg.conninfo().find("host=127.0.0.1"), std::string::npos);
  const pid_t pid = pg.pid();
  ASSERT_GT(pid, 0);
  pg.stop();
  EXPECT_NE(::kill(pid, 0), 0);
}

TEST(TestServers, GuardsStopServersWhoseOwnerWasKilled) {
#ifndef SLUICE_SERVER_OWNER
  GTEST_SKIP() << "sluice_server_owner is not built";
#else
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  char arg0[] = SLUICE_SERVER_OWNER;
  char* argv[] = {arg0, nullptr};
  pid_t owner = -1;
  const int rc = ::posix_spawn(&owner, arg0, &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ASSERT_EQ(rc, 0) << "cannot spawn " << arg0;

  // Its report: "redis PID DIR", "postgres PID DIR", "ready" (or EOF if it failed).
  std::string report;
  char c;
  while (report.find("ready\n") == std::string::npos && ::read(out[0], &c, 1) == 1) report += c;
  ::close(out[0]);
  std::istringstream in(report);
  std::string redis_tag, redis_dir, pg_tag, pg_dir;
  pid_t redis = -1, postgres = -1;
  in >> redis_tag >> redis >> redis_dir >> pg_tag >> postgres >> pg_dir;
  if (redis_tag != "redis" || pg_tag != "postgres" || redis <= 0 || postgres <= 0) {
    ::kill(owner, SIGKILL);
    ::waitpid(owner, nullptr, 0);
    FAIL() << "the owner did not report its servers: '" << report << "'";
  }
  ASSERT_TRUE(running(redis));
  ASSERT_TRUE(running(postgres));
  ASSERT_TRUE(fs::exists(redis_dir));
  ASSERT_TRUE(fs::exists(pg_dir));

  // The owner dies with no chance to clean up.
  ASSERT_EQ(::kill(owner, SIGKILL), 0);
  ASSERT_EQ(::waitpid(owner, nullptr, 0), owner);

  // The guards notice within a second, ask each server to stop (SIGKILL after 5 s) and remove
  // the directories.
  EXPECT_TRUE(eventually([&] { return !running(redis); }, milliseconds(15'000)))
      << "redis-server " << redis << " outlived its owner";
  EXPECT_TRUE(eventually([&] { return !running(postgres); }, milliseconds(15'000)))
      << "postgres " << postgres << " outlived its owner";
  EXPECT_TRUE(eventually([&] { return !fs::exists(redis_dir); }, milliseconds(5'000)))
      << redis_dir << " was left behind";
  EXPECT_TRUE(eventually([&] { return !fs::exists(pg_dir); }, milliseconds(5'000)))
      << pg_dir << " was left behind";
#endif
}

}  // namespace
}  // namespace sluice::testing
