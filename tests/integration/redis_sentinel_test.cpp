// A Redis connection through Redis Sentinel (backends/redis/redis_connection.h, RedisOptions::
// sentinels) against real servers the test starts on loopback: a primary, a replica and three
// sentinels. The connection asks the sentinels for the primary (passing over one that cannot be
// reached), follows a failover after the primary is SIGKILLed, and leaves a primary that a
// failover turned into a replica under an open connection; options and names it cannot use are
// refused with what was wrong.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "backends/redis/redis_connection.h"
#include "integration/server_clients.h"
#include "sluice/testing/servers.h"

namespace sluice::redis_detail {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using test_clients::cli;

constexpr Nanos kTimeout = seconds(2);
constexpr const char* kMaster = "sluice-primary";

// A primary, a replica of it and three sentinels with a quorum of 2 (a primary silent for
// 500 ms is down).
class SentinelSet {
 public:
  Status start() {
    if (Status s = primary.start({}, 0, {"--repl-diskless-sync-delay", "0"}); !s.ok()) return s;
    if (Status s = replica.start(); !s.ok()) return s;
    if (cli(replica.port(), "REPLICAOF 127.0.0.1 " + std::to_string(primary.port())) != "OK")
      return Status(StatusCode::kInternal, "REPLICAOF refused");
    for (auto& s : sentinels)
      if (Status st = s.start(primary.port(), kMaster, 2, 500, 2000); !st.ok()) return st;
    // The replica in sync, and every sentinel aware of it (failover needs a known replica) and
    // of the others (CKQUORUM: sentinels learn of each other from hello messages every 2 s, and
    // a primary killed before that is never failed over).
    for (int i = 0; i < 1000; ++i) {
      bool ready = cli(replica.port(), "INFO replication").find("master_link_status:up") !=
                   std::string::npos;
      for (auto& s : sentinels)
        ready = ready &&
                cli(s.port(), std::string("SENTINEL replicas ") + kMaster)
                        .find(std::to_string(replica.port())) != std::string::npos &&
                cli(s.port(), std::string("SENTINEL CKQUORUM ") + kMaster).starts_with("OK");
      if (ready) return {};
      std::this_thread::sleep_for(milliseconds(20));
    }
    return Status(StatusCode::kDeadlineExceeded, "the replica or the sentinels never caught up");
  }

  RedisOptions options(int dead_port = 0) const {
    RedisOptions o;
    o.host.clear();  // not read with sentinels
    o.port = 0;
    o.master_name = kMaster;
    if (dead_port > 0) o.sentinels.push_back({"127.0.0.1", dead_port});
    for (const auto& s : sentinels) o.sentinels.push_back({"127.0.0.1", s.port()});
    return o;
  }

  testing::RedisServer primary, replica;
  testing::RedisSentinel sentinels[3];
};

// The port of the server a connection's commands reach.
int served_by(RedisConnection& conn) {
  auto r = conn.command({"INFO", "server"}, kTimeout);
  if (!r.ok() || r.value()->type != REDIS_REPLY_STRING) return -1;
  const std::string info(r.value()->str, r.value()->len);
  const auto at = info.find("tcp_port:");
  return at == std::string::npos ? -1 : std::stoi(info.substr(at + 9));
}

// Writes until one lands (or `limit` passes): how long that took.
Nanos write_until_it_lands(RedisConnection& conn, Nanos limit, std::string& last_error) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < limit) {
    auto r = conn.command({"SET", "sentinel:k", "after"}, kTimeout);
    if (r.ok() && r.value()->type == REDIS_REPLY_STATUS)
      return std::chrono::steady_clock::now() - start;
    last_error = r.ok() ? std::string(r.value()->str, r.value()->len) : r.status().to_string();
    std::this_thread::sleep_for(milliseconds(50));
  }
  return Nanos::max();
}

TEST(RedisSentinel, ConnectsToThePrimaryTheSentinelsNamePassingOverOneThatIsDown) {
  SentinelSet set;
  ASSERT_TRUE(set.start().ok());
  RedisConnection conn(set.options(testing::free_port()), {});
  EXPECT_EQ(served_by(conn), set.primary.port());
  auto r = conn.command({"SET", "sentinel:k", "v"}, kTimeout);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(cli(set.primary.port(), "GET sentinel:k"), "v");
}

// A sentinel that takes connections and never answers (a listening socket nobody accepts on:
// the kernel completes the handshake): the first one asked. It gets its share of connect_timeout
// (a quarter, with three sentinels after it), and the next one names the primary in time.
TEST(RedisSentinel, AHungSentinelTakesOnlyItsShareOfConnectTimeout) {
  SentinelSet set;
  ASSERT_TRUE(set.start().ok());
  const int hung = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(hung, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(hung, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(hung, 16), 0);
  ASSERT_EQ(::getsockname(hung, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  RedisOptions o = set.options();
  o.sentinels.insert(o.sentinels.begin(), RedisAddress{"127.0.0.1", ntohs(addr.sin_port)});
  o.connect_timeout = seconds(1);
  RedisConnection conn(o, {});
  const auto start = std::chrono::steady_clock::now();
  auto r = conn.command({"SET", "sentinel:k", "v"}, seconds(3));
  const Nanos took = std::chrono::steady_clock::now() - start;
  ::close(hung);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(took, milliseconds(200));  // it did wait for the hung one, a quarter of a second
  EXPECT_LT(took, seconds(1));
  EXPECT_EQ(cli(set.primary.port(), "GET sentinel:k"), "v");
}

TEST(RedisSentinel, FollowsAFailoverAfterThePrimaryIsKilled) {
  SentinelSet set;
  ASSERT_TRUE(set.start().ok());
  RedisConnection conn(set.options(), {});
  ASSERT_EQ(served_by(conn), set.primary.port());
  set.primary.kill();
  // Refused while the sentinels still name the dead primary; then the promoted replica.
  std::string why;
  const Nanos took = write_until_it_lands(conn, seconds(30), why);
  ASSERT_NE(took, Nanos::max()) << "no write landed after the failover; last: " << why;
  EXPECT_EQ(served_by(conn), set.replica.port());
  EXPECT_EQ(cli(set.replica.port(), "GET sentinel:k"), "after");
  std::printf("failover after SIGKILL: writes land again after %.2f s\n",
              std::chrono::duration<double>(took).count());
}

TEST(RedisSentinel, APrimaryTurnedReplicaUnderAnOpenConnectionIsLeft) {
  SentinelSet set;
  ASSERT_TRUE(set.start().ok());
  RedisConnection conn(set.options(), {});
  ASSERT_EQ(served_by(conn), set.primary.port());
  // A failover with the old primary alive: it becomes a replica of the promoted one.
  // Refused (NOGOODSLAVE) until the sentinel has the replica's INFO: asked again until then.
  std::string failover;
  for (int i = 0; i < 100 && failover != "OK"; ++i) {
    failover = cli(set.sentinels[0].port(), std::string("SENTINEL FAILOVER ") + kMaster);
    if (failover != "OK") std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_EQ(failover, "OK");
  bool demoted = false;
  for (int i = 0; i < 3000 && !demoted; ++i) {
    demoted = cli(set.primary.port(), "ROLE").find("slave") != std::string::npos;
    if (!demoted) std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(demoted) << "the failover never demoted the primary";
  std::string why;
  const Nanos took = write_until_it_lands(conn, seconds(30), why);
  ASSERT_NE(took, Nanos::max()) << "no write landed after the failover; last: " << why;
  EXPECT_EQ(served_by(conn), set.replica.port());
  EXPECT_EQ(cli(set.replica.port(), "GET sentinel:k"), "after");
}

TEST(RedisSentinel, AWriteToAServerThatBecameAReplicaFailsUnavailableAndIsAskedAgain) {
  testing::RedisServer primary, other;
  ASSERT_TRUE(primary.start().ok());
  ASSERT_TRUE(other.start().ok());
  RedisOptions o;
  o.port = primary.port();
  RedisConnection conn(o, {});
  ASSERT_TRUE(conn.command({"SET", "k", "1"}, kTimeout).ok());
  // Demoted under the open connection (no sentinel: the write is refused, the call fails).
  ASSERT_EQ(cli(primary.port(), "REPLICAOF 127.0.0.1 " + std::to_string(other.port())), "OK");
  StatusOr<RedisConnection::Reply> r = Status(StatusCode::kInternal, "not run");
  for (int i = 0; i < 100; ++i) {
    r = conn.command({"SET", "k", "2"}, kTimeout);
    if (!r.ok()) break;
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().to_string();
  EXPECT_NE(r.status().message().find("is a replica now (READONLY"), std::string::npos)
      << r.status().to_string();
}

TEST(RedisSentinel, AnUnknownMasterNameIsNamedInTheError) {
  testing::RedisServer primary;
  ASSERT_TRUE(primary.start().ok());
  testing::RedisSentinel sentinel;
  ASSERT_TRUE(sentinel.start(primary.port(), kMaster, 1).ok());
  RedisOptions o;
  o.sentinels = {{"127.0.0.1", sentinel.port()}};
  o.master_name = "nope";
  RedisConnection conn(o, {});
  const Status s = conn.connect(kTimeout);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("no primary for 'nope'"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("monitors no primary named 'nope'"), std::string::npos)
      << s.to_string();
}

TEST(RedisSentinel, OptionsItCannotUseAreRefusedNamingTheField) {
  RedisOptions o;
  o.master_name = "m";
  EXPECT_EQ(RedisConnection::options_error(o), "redis: master_name needs sentinels");
  o.sentinels = {{"127.0.0.1", 26379}};
  EXPECT_EQ(RedisConnection::options_error(o), "");
  o.master_name.clear();
  EXPECT_EQ(RedisConnection::options_error(o), "redis: sentinels need a master_name");
  o.master_name = "m";
  o.sentinels = {{"127.0.0.1", 0}};
  EXPECT_EQ(RedisConnection::options_error(o), "redis: a sentinel's port must be in 1..65535");
  o.sentinels = {{"", 26379}};
  EXPECT_EQ(RedisConnection::options_error(o), "redis: a sentinel's host must not be empty");
}

}  // namespace
}  // namespace sluice::redis_detail
