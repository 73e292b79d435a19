// The Redis backends' connection (backends/redis/redis_connection.h) against real redis-servers
// the test starts on loopback, as a user with scripts of its own sees it: scripts run by index
// with keys and arguments, every script loaded again after SCRIPT FLUSH, a script's error reply
// named, AUTH and SELECT, the connect check, a hanging server, a busy connection.
#include "backends/redis/redis_connection.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "integration/server_clients.h"
#include "sluice/testing/servers.h"

namespace sluice::redis_detail {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(2);

using test_clients::cli;

const char* const kAdd = "return redis.call('INCRBY', KEYS[1], ARGV[1])";
const char* const kJoin = "return redis.call('GET', KEYS[1]) .. ':' .. ARGV[1] .. ':' .. #KEYS";
const char* const kFail = "return redis.error_reply('refused by the script')";

std::vector<RedisConnection::Script> scripts() {
  return {{"add", kAdd}, {"join", kJoin}, {"fail", kFail}};
}

RedisOptions options_for(int port) {
  RedisOptions o;
  o.port = port;
  return o;
}

class RedisConnectionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.status().to_string(); }

  static testing::SuiteServer<testing::RedisServer> server_;
};
testing::SuiteServer<testing::RedisServer> RedisConnectionTest::server_;

TEST_F(RedisConnectionTest, ScriptsRunByIndexWithKeysAndArgumentsAndAllReloadAfterAFlush) {
  RedisConnection conn(options_for(server_->port()), scripts());
  auto added = conn.eval(0, {"conn:n"}, {"5"}, kTimeout);
  ASSERT_TRUE(added.ok()) << added.status().to_string();
  EXPECT_EQ(added.value()->integer, 5);
  auto joined = conn.eval(1, {"conn:n", "conn:other"}, {"x"}, kTimeout);
  ASSERT_TRUE(joined.ok()) << joined.status().to_string();
  EXPECT_EQ(std::string(joined.value()->str, joined.value()->len), "5:x:2");
  // The SHAs are the server's: SCRIPT LOAD of the same text gives the same.
  EXPECT_EQ(conn.script_sha(0), cli(server_->port(), std::string("SCRIPT LOAD \"") + kAdd + "\""));
  EXPECT_NE(conn.script_sha(0), conn.script_sha(1));

  ASSERT_EQ(cli(server_->port(), "SCRIPT FLUSH"), "OK");
  auto again = conn.eval(1, {"conn:n"}, {"y"}, kTimeout);  // NOSCRIPT: reload, retry once
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(std::string(again.value()->str, again.value()->len), "5:y:1");
  // Every script came back, not only the one that was called.
  EXPECT_EQ(cli(server_->port(), "SCRIPT EXISTS " + conn.script_sha(0) + " " + conn.script_sha(2)),
            "1\n1");
  EXPECT_EQ(conn.eval(0, {"conn:n"}, {"1"}, kTimeout).value()->integer, 6);  // ran once
}

// A restarted server closes every connection: the next call on one finds it closed before it
// writes, connects again (reading the run_id again) and succeeds, where it would fail on the
// dead connection. Played by CLIENT KILL, which closes them as a restart does.
TEST_F(RedisConnectionTest, AConnectionTheServerClosedWhileIdleIsMadeAgainWithinTheNextCall) {
  RedisConnection conn(options_for(server_->port()), scripts(), {}, /*track_run_id=*/true);
  auto first = conn.eval(0, {"conn:closed"}, {"1"}, kTimeout);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  auto client = conn.command({"CLIENT", "ID"}, kTimeout);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string id = std::to_string(client.value()->integer);
  ASSERT_EQ(cli(server_->port(), "CLIENT KILL ID " + id), "1");
  const auto run_id = conn.call(kTimeout, [](RedisConnection::Session& s) -> StatusOr<std::string> {
    auto r = s.server_run_id();
    if (!r.ok()) return r.status();
    auto added = s.eval(0, {"conn:closed"}, {"1"});
    if (!added.ok()) return added.status();
    return r.value() + ":" + std::to_string(added.value()->integer);
  });
  ASSERT_TRUE(run_id.ok()) << run_id.status().to_string();
  EXPECT_EQ(run_id.value(), test_clients::info_field(server_->port(), "server", "run_id") + ":2");
  // Another connection now.
  EXPECT_NE(std::to_string(conn.command({"CLIENT", "ID"}, kTimeout).value()->integer), id);
}

TEST_F(RedisConnectionTest, AScriptsErrorReplyNamesTheScriptAndOtherRepliesComeBackAsTheyAre) {
  RedisConnection conn(options_for(server_->port()), scripts());
  const auto failed = conn.eval(2, {"conn:k"}, {}, kTimeout);
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("fail script failed"), std::string::npos)
      << failed.status().to_string();
  EXPECT_NE(failed.status().message().find("refused by the script"), std::string::npos);
  const auto no_such = conn.eval(3, {"conn:k"}, {}, kTimeout);
  EXPECT_EQ(no_such.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_such.status().message().find("script"), std::string::npos);
  // A command's error reply is the caller's to judge.
  const auto wrong = conn.command({"INCR", "conn:k", "extra"}, kTimeout);
  ASSERT_TRUE(wrong.ok()) << wrong.status().to_string();
  EXPECT_EQ(wrong.value()->type, REDIS_REPLY_ERROR);
  // The connection survived all three.
  EXPECT_TRUE(conn.command({"PING"}, kTimeout).ok());
}

TEST(RedisConnection, AuthAndSelectOnEveryConnectAndAWrongPasswordIsPermissionDenied) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start("conn-pass").ok());
  RedisOptions o = options_for(server.port());
  o.password = "conn-pass";
  o.database = 3;
  RedisConnection conn(o, scripts());
  ASSERT_TRUE(conn.eval(0, {"in3"}, {"7"}, kTimeout).ok());
  EXPECT_EQ(cli(server.port(), "-a conn-pass --no-auth-warning -n 3 GET in3"), "7");
  EXPECT_EQ(cli(server.port(), "-a conn-pass --no-auth-warning -n 0 EXISTS in3"), "0");
  // Dropped by the server: the next call but one reconnects, with AUTH and SELECT again.
  ASSERT_NE(cli(server.port(), "-a conn-pass --no-auth-warning CLIENT KILL TYPE normal"), "0");
  StatusOr<RedisConnection::Reply> r = Status(StatusCode::kUnavailable, "not called");
  for (int i = 0; i < 2 && !r.ok(); ++i) r = conn.eval(0, {"in3"}, {"1"}, kTimeout);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->integer, 8);
  o.password = "wrong";
  RedisConnection refused(o, scripts());
  EXPECT_EQ(refused.connect(kTimeout).code(), StatusCode::kPermissionDenied);
}

TEST_F(RedisConnectionTest, TheConnectCheckRunsOnEveryConnectAndARefusalKeepsNoConnection) {
  std::atomic<int> checks{0};
  std::atomic<bool> accept{false};
  RedisConnection conn(options_for(server_->port()), scripts(),
                       {{"CONFIG", "GET", "maxmemory-policy"}, [&](const redisReply& reply) {
                          ++checks;
                          EXPECT_EQ(reply.type, REDIS_REPLY_ARRAY);
                          if (accept) return Status();
                          return Status(StatusCode::kFailedPrecondition, "not yet");
                        }});
  EXPECT_EQ(conn.eval(0, {"conn:c"}, {"1"}, kTimeout).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(conn.command({"PING"}, kTimeout).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(checks.load(), 2);  // refused, so each call connected again
  EXPECT_EQ(cli(server_->port(), "EXISTS conn:c"), "0");
  accept = true;
  EXPECT_TRUE(conn.eval(0, {"conn:c"}, {"1"}, kTimeout).ok());
  EXPECT_TRUE(conn.eval(0, {"conn:c"}, {"1"}, kTimeout).ok());
  EXPECT_EQ(checks.load(), 3);  // kept once accepted
}

TEST(RedisConnection, AHangingServerTimesOutAndTheNextCallReconnects) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  RedisConnection conn(options_for(server.port()), scripts());
  ASSERT_TRUE(conn.connect(kTimeout).ok());
  ASSERT_EQ(::kill(server.pid(), SIGSTOP), 0);
  const auto start = std::chrono::steady_clock::now();
  const auto hung = conn.eval(0, {"k"}, {"1"}, milliseconds(200));
  EXPECT_EQ(hung.status().code(), StatusCode::kDeadlineExceeded) << hung.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
  ASSERT_EQ(::kill(server.pid(), SIGCONT), 0);
  const auto after = conn.eval(0, {"k"}, {"1"}, kTimeout);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  RedisConnection nowhere(options_for(testing::free_port()), scripts());
  EXPECT_EQ(nowhere.connect(kTimeout).code(), StatusCode::kUnavailable);
}

TEST_F(RedisConnectionTest, ACallWaitingForABusyConnectionGivesUpAtItsTimeout) {
  RedisConnection conn(options_for(server_->port()), scripts());
  std::promise<void> entered, release;
  std::thread holder([&] {
    const Status s = conn.call(kTimeout, [&](RedisConnection::Session& session) -> Status {
      entered.set_value();
      release.get_future().wait();
      return session.command({"PING"}).status();
    });
    EXPECT_TRUE(s.ok()) << s.to_string();
  });
  entered.get_future().wait();
  const auto busy = conn.command({"PING"}, milliseconds(50));
  EXPECT_EQ(busy.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(busy.status().message().find("busy"), std::string::npos);
  release.set_value();
  holder.join();
  EXPECT_TRUE(conn.command({"PING"}, kTimeout).ok());
}

TEST_F(RedisConnectionTest, AnExceptionInACallIsAnErrorAndDropsTheConnection) {
  RedisConnection conn(options_for(server_->port()), scripts());
  const auto id = [&] {
    auto r = conn.command({"CLIENT", "ID"}, kTimeout);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? r.value()->integer : -1;
  };
  const long long before = id();
  EXPECT_EQ(id(), before);  // one connection, kept
  const Status thrown = conn.call(kTimeout, [](RedisConnection::Session&) -> Status {
    throw std::runtime_error("body failed");
  });
  EXPECT_EQ(thrown.code(), StatusCode::kInternal);
  EXPECT_NE(thrown.message().find("body failed"), std::string::npos);
  EXPECT_NE(id(), before);  // a new connection
}

}  // namespace
}  // namespace sluice::redis_detail
