// The test harness's throwaway servers: they start on loopback and stop by pid.
#include "sluice/testing/servers.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace sluice::testing {
namespace {

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

}  // namespace
}  // namespace sluice::testing
