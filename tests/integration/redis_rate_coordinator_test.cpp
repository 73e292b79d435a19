// The Redis rate coordinator against real redis-servers the test starts on loopback: its storage
// (one MessagePack string per key in one slot, expiring, an earlier version's hash still read;
// an origin marker that does not), Redis TIME as the
// coordinator's clock, the state-loss rule across a SIGKILL and restart, the maxmemory-policy
// check, NOSCRIPT reload, timeouts, bad input, and the lease latency. Concurrent regions and
// health, alike on every backend, are in rate_coordinator_backends_test.cpp; replies equal to the
// memory and PostgreSQL coordinators' step by step in rate_coordinator_conformance_test.cpp.
#include "sluice/backends/redis_rate_coordinator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/redis/redis_connection.h"
#include "integration/server_clients.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(2);
// A window no test outlasts (a window boundary mid-test would change the counts).
constexpr Nanos kLong = std::chrono::hours(24 * 365 * 10);

using test_clients::cli;

LeaseRequest request(std::string region, std::uint64_t limit, Nanos period, std::uint64_t want,
                     Nanos min_left = Nanos{0}) {
  LeaseRequest r;
  r.region = std::move(region);
  r.spec = {limit, period};
  r.want = want;
  r.min_window_left = min_left;
  return r;
}

// The ledger at `key`, decoded by the script's own MessagePack library: the form's version,
// window start, clock_high, limit, period, granted, returned, forfeited, then per region its id,
// granted, relinquished and relinquished window ("-" for none). Empty: no ledger.
std::vector<std::string> ledger(int port, const std::string& key) {
  const std::string out = cli(port,
                              "EVAL \"local v = redis.call('GET', KEYS[1]) if not v then return {} "
                              "end v = cmsgpack.unpack(v) for i = 1, #v do if v[i] == false then "
                              "v[i] = '-' end end return v\" 1 '" +
                                  key + "'");
  std::vector<std::string> fields;
  if (out.empty()) return fields;
  std::size_t at = 0;
  for (std::size_t nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1)
    fields.push_back(out.substr(at, nl - at));
  fields.push_back(out.substr(at));
  return fields;
}
// The units granted in the ledger's window ("" with no ledger).
std::string granted_in(int port, const std::string& key) {
  const auto l = ledger(port, key);
  return l.size() > 5 ? l[5] : std::string();
}

// How many times the server has run `command` (INFO commandstats, which counts the commands
// scripts run too).
long long calls_of(int port, const std::string& command) {
  const std::string stat = test_clients::info_field(port, "commandstats", "cmdstat_" + command);
  const auto at = stat.find("calls=");
  return at == std::string::npos ? 0 : std::stoll(stat.substr(at + 6));
}

// The wall clock, which Redis TIME follows (only to check that the coordinator reads it).
Nanos wall_now() { return std::chrono::system_clock::now().time_since_epoch(); }

class RedisRateCoordinatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.status().to_string(); }

  static RedisOptions options(const std::string& prefix) {
    RedisOptions o = RedisRateCoordinator::default_options();
    o.port = server_->port();
    o.key_prefix = prefix;
    return o;
  }
  static std::unique_ptr<RedisRateCoordinator> connect(const std::string& prefix,
                                                       const Clock* clock = nullptr) {
    auto c = RedisRateCoordinator::connect(options(prefix), clock);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    return std::move(c.value());
  }
  // A coordinator on Redis TIME whose Redis has run long enough: its origin is long past.
  static std::unique_ptr<RedisRateCoordinator> connect_settled(const std::string& prefix) {
    EXPECT_TRUE(test_clients::settle_federation(server_->port(), prefix));
    return connect(prefix);
  }

  static testing::SuiteServer<testing::RedisServer> server_;
};
testing::SuiteServer<testing::RedisServer> RedisRateCoordinatorTest::server_;

TEST_F(RedisRateCoordinatorTest, KeyIsOneExpiringStringInOneSlotAndTheOriginMarkerStays) {
  ManualClock clock(seconds(5'000'000));
  auto redis = connect("sluice:fed:", &clock);
  ASSERT_NE(redis, nullptr);
  const auto first = redis->lease("orders", request("us", 10, seconds(1), 4), kTimeout);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first.value().status, LeaseStatus::kStateLost);  // a fresh Redis: its first window
  const int port = server_->port();
  EXPECT_EQ(cli(port, "TYPE 'sluice:fed:{orders}'"), "string");
  EXPECT_EQ(cli(port, "GET sluice:fed:origin"), "5000000000000");  // microseconds
  EXPECT_EQ(cli(port, "PTTL sluice:fed:origin"), "-1");
  // The server as the lease saw it: its run_id and evicted_keys, kept as long.
  EXPECT_EQ(cli(port, "GET sluice:fed:server"),
            test_clients::info_field(port, "server", "run_id") + ":" +
                test_clients::info_field(port, "stats", "evicted_keys"));
  EXPECT_EQ(cli(port, "PTTL sluice:fed:server"), "-1");
  const int ttl_ms = std::stoi(cli(port, "PTTL 'sluice:fed:{orders}'"));
  EXPECT_GT(ttl_ms, 50'000);  // max(3 periods, 1 minute)
  EXPECT_LE(ttl_ms, 60'000);
  clock.advance(seconds(1));
  const auto next = redis->lease("orders", request("us", 10, seconds(1), 4), kTimeout);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next.value().status, LeaseStatus::kGranted);
  EXPECT_EQ(next.value().granted, 4u);
  const std::vector<std::string> l = ledger(port, "sluice:fed:{orders}");
  ASSERT_EQ(l.size(), 12u) << cli(port, "GET 'sluice:fed:{orders}'");
  EXPECT_EQ(l[0], "1");                                          // the form's version
  EXPECT_EQ(l[1], "5000001000000");                              // the window's start
  EXPECT_EQ((std::vector<std::string>(l.begin() + 3, l.end())),  // limit, period, g, ret, f
            (std::vector<std::string>{"10", "1000000", "4", "0", "0", "us", "4", "0", "-"}));
  // A long period keeps its key for three of them.
  ASSERT_TRUE(redis->lease("daily", request("us", 10, std::chrono::hours(1), 1), kTimeout).ok());
  EXPECT_GT(std::stoll(cli(port, "PTTL 'sluice:fed:{daily}'")), 3LL * 3'600'000 - 60'000);
  // Nothing under the fleet's prefix.
  EXPECT_EQ(cli(port, "KEYS 'sluice:fleet:*'"), "");
}

TEST_F(RedisRateCoordinatorTest, AKeyWithoutALedgerIsLeasedWithOneCommandOnIt) {
  const int port = server_->port();
  auto c = connect_settled("sluice:cold:");
  ASSERT_NE(c, nullptr);
  const LeaseRequest req = request("eu", 100, kLong, 8);
  ASSERT_TRUE(c->lease("held", req, kTimeout).ok());
  // Twenty keys without a ledger, one with, and one twice: one script call.
  std::vector<std::string> keys;
  for (int i = 0; i < 20; ++i) keys.push_back("cold" + std::to_string(i));
  keys.insert(keys.begin() + 5, "held");
  keys.push_back("cold3");
  std::vector<LeaseCall> calls;
  for (const std::string& k : keys) calls.push_back(LeaseCall{k, &req});
  const long long sets = calls_of(port, "set"), gets = calls_of(port, "get");
  const std::vector<StatusOr<LeaseReply>> got = c->lease_many(calls, kTimeout);
  // A fresh key: one SET ... NX GET. A key with a ledger: that SET, which returns it, and the
  // SET that writes it. GET only for the two markers, once for the call.
  EXPECT_EQ(calls_of(port, "set") - sets, 20 + 2 * 2);
  EXPECT_EQ(calls_of(port, "get") - gets, 2);
  ASSERT_EQ(got.size(), keys.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status().to_string();
    EXPECT_EQ(got[i].value().status, LeaseStatus::kGranted) << keys[i];
    EXPECT_EQ(got[i].value().granted, 8u) << keys[i];
  }
  EXPECT_EQ(got[5].value().remaining, 100u - 16);  // "held": its second lease
  EXPECT_EQ(got.back().value().remaining, 100u - 16);
  EXPECT_EQ(granted_in(port, "sluice:cold:{held}"), "16");
  EXPECT_EQ(granted_in(port, "sluice:cold:{cold3}"), "16");
  EXPECT_EQ(granted_in(port, "sluice:cold:{cold4}"), "8");
  const std::vector<std::string> l = ledger(port, "sluice:cold:{cold4}");
  ASSERT_EQ(l.size(), 12u);
  EXPECT_EQ((std::vector<std::string>(l.begin() + 3, l.end())),
            (std::vector<std::string>{"100", std::to_string(kLong.count() / 1000), "8", "0", "0",
                                      "eu", "8", "0", "-"}));
  EXPECT_GT(std::stoll(cli(port, "PTTL 'sluice:cold:{cold4}'")), 0);  // it expires
}

// A server that refuses SET with NX and GET (Redis before 7.0 answers "syntax error") is leased
// with GET and SET instead, with the same replies and ledgers. Played here by the script with
// the GET option misspelt, run by hand beside the script itself on a prefix of its own.
TEST_F(RedisRateCoordinatorTest, AServerWithoutSetNxGetLeasesWithGetAndSetAlike) {
  const int port = server_->port();
  std::string older = RedisRateCoordinator::script();
  const std::string option = "'NX', 'GET'";
  const auto at = older.find(option);
  ASSERT_NE(at, std::string::npos);
  older.replace(at, option.size(), "'NX', 'GETX'");
  ASSERT_EQ(older.find(option), std::string::npos);
  redis_detail::RedisConnection conn(
      options("unused:"), {{"escrow", RedisRateCoordinator::script()}, {"older", older}});
  const std::string run_id = test_clients::info_field(port, "server", "run_id");
  const std::vector<std::string> prefixes = {"sluice:now:", "sluice:older:"};
  std::vector<std::vector<long long>> replies;
  std::vector<long long> ledger_gets;
  for (std::size_t s = 0; s < 2; ++s) {
    const std::string& prefix = prefixes[s];
    ASSERT_TRUE(test_clients::settle_federation(port, prefix));
    const auto many = [&](const std::vector<std::string>& keys, const std::string& now_us) {
      std::vector<std::string> k,
          args = {"many", now_us, "60000",   run_id, std::to_string(keys.size()),
                  "eu",   "50",   "1000000", "0"};
      for (std::size_t i = 0; i < keys.size(); ++i) {
        k.push_back(prefix + "{" + keys[i] + "}");
        args.push_back(i % 2 == 0 ? "7" : "30");  // want
        args.push_back(i % 3 == 0 ? "2" : "0");   // need
      }
      k.push_back(prefix + "origin");
      k.push_back(prefix + "server");
      return conn.eval(s, k, args, kTimeout);
    };
    // A window's first call, then one with two keys that have a ledger and one that has none.
    auto first = many({"a", "b"}, "5000000100000");
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    const long long gets = calls_of(port, "get");
    auto r = many({"a", "c", "b", "c"}, "5000000200000");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ledger_gets.push_back(calls_of(port, "get") - gets - 2);  // less the markers'
    std::vector<long long> v;
    for (std::size_t i = 0; i < r.value()->elements; ++i)
      v.push_back(r.value()->element[i]->integer);
    for (const char* key : {"a", "b", "c"}) {
      const std::vector<std::string> l = ledger(port, prefix + "{" + key + "}");
      for (std::size_t i = 1; i < l.size(); ++i)
        v.push_back(l[i] == "-" ? -1 : l[i] == "eu" ? -2 : std::stoll(l[i]));
    }
    replies.push_back(std::move(v));
  }
  EXPECT_EQ(replies[0], replies[1]);
  ASSERT_GE(replies[0].size(), 20u);
  EXPECT_EQ(replies[0][1], 7);    // "a" granted 7 of what was left
  EXPECT_EQ(replies[0][16], 13);  // the second "c" (30 asked): half of the 25 left, rounded up
  EXPECT_EQ(ledger_gets, (std::vector<long long>{0, 4}));  // the older way reads every ledger
}

TEST_F(RedisRateCoordinatorTest, RedisTimeIsTheCoordinatorsClock) {
  auto redis = connect_settled("time:fed:");
  ASSERT_NE(redis, nullptr);
  const Nanos before = wall_now();
  const auto r = redis->lease("clock", request("us", 100, seconds(1), 5), kTimeout);
  const Nanos after = wall_now();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const LeaseReply& reply = r.value();
  EXPECT_EQ(reply.status, LeaseStatus::kGranted);
  EXPECT_GE(reply.coordinator_now, before - seconds(1));  // same host: the same wall clock
  EXPECT_LE(reply.coordinator_now, after + seconds(1));
  EXPECT_EQ(reply.window_start.count() % seconds(1).count(), 0);
  EXPECT_LE(reply.window_start, reply.coordinator_now);
  EXPECT_LT(reply.coordinator_now, reply.window_end);
  EXPECT_EQ(reply.window_end - reply.window_start, seconds(1));
}

// Waits (on the coordinator's own replies) until the window of `reply` has ended.
void sleep_past(const LeaseReply& reply) {
  std::this_thread::sleep_for(reply.window_end - reply.coordinator_now + milliseconds(20));
}

TEST(RedisRateCoordinator, RestartWithoutPersistenceLosesTheRestOfTheWindow) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  const int port = server.port();
  RedisOptions o = RedisRateCoordinator::default_options();
  o.port = port;
  auto c = RedisRateCoordinator::connect(o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  RedisRateCoordinator& redis = *c.value();
  const LeaseRequest req = request("eu", 1000, seconds(1), 10);
  // A fresh server: the first window is spent.
  auto r = redis.lease("k", req, kTimeout);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().status, LeaseStatus::kStateLost);
  sleep_past(r.value());
  r = redis.lease("k", req, kTimeout);
  ASSERT_TRUE(r.ok());
  if (r.value().window_end - r.value().coordinator_now < milliseconds(600)) {
    sleep_past(r.value());  // leave the restart most of a window
    r = redis.lease("k", req, kTimeout);
    ASSERT_TRUE(r.ok());
  }
  ASSERT_EQ(r.value().status, LeaseStatus::kGranted);
  const Nanos granted_window = r.value().window_start;

  // SIGKILL mid-window, and a new server (no persistence) on the same port.
  ASSERT_EQ(::kill(server.pid(), SIGKILL), 0);
  ::waitpid(server.pid(), nullptr, 0);
  testing::RedisServer restarted;
  ASSERT_TRUE(restarted.start({}, port).ok());
  StatusOr<LeaseReply> lost = Status(StatusCode::kUnavailable, "not called");
  for (int i = 0; i < 3 && !lost.ok(); ++i) lost = redis.lease("k", req, kTimeout);  // reconnects
  ASSERT_TRUE(lost.ok()) << lost.status().to_string();
  EXPECT_EQ(lost.value().status, LeaseStatus::kStateLost);
  EXPECT_EQ(lost.value().granted, 0u);
  EXPECT_EQ(lost.value().window_start, granted_window);  // the window it was granting in
  // Every lease in that window is refused; the next window grants again.
  const Nanos lost_window = lost.value().window_start;
  int refused = 0;
  for (;;) {
    std::this_thread::sleep_for(milliseconds(50));
    r = redis.lease("k", req, kTimeout);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (r.value().window_start != lost_window) break;
    EXPECT_EQ(r.value().status, LeaseStatus::kStateLost);
    ++refused;
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(r.value().window_start, lost_window);
  EXPECT_EQ(r.value().status, LeaseStatus::kGranted);
  EXPECT_EQ(r.value().granted, 10u);
}

// Partial losses (a server that comes back with some of its grants, not none): each case is
// one window on a manual clock, `limit` 30. A region leases 10 before the loss and 10 after
// the point the server comes back to; a server that took the restored ledger at its word would
// grant 20 more in that window (40 on limit 30). Each must count the window as spent instead,
// and grant again in the next.
constexpr std::uint64_t kLossLimit = 30;

// Leases until the coordinator answers (the first call after a restart finds the connection
// gone).
StatusOr<LeaseReply> lease_through(RedisRateCoordinator& redis, const std::string& key,
                                   const LeaseRequest& req) {
  StatusOr<LeaseReply> r = Status(StatusCode::kUnavailable, "not called");
  for (int i = 0; i < 3 && !r.ok(); ++i) r = redis.lease(key, req, kTimeout);
  return r;
}

// A coordinator in test mode (on `clock`) on the Redis at `port`.
StatusOr<std::unique_ptr<RedisRateCoordinator>> connect_test_mode(int port, const Clock& clock) {
  RedisOptions o = RedisRateCoordinator::default_options();
  o.port = port;
  return RedisRateCoordinator::connect(o, &clock);
}

// A coordinator in test mode, past its first window, with 10 granted to "eu" in
// window 1. Returns the request every later lease sends.
LeaseRequest granted_ten(RedisRateCoordinator& redis, ManualClock& clock) {
  const LeaseRequest req = request("eu", kLossLimit, seconds(1), 10);
  const auto first = redis.lease("k", req, kTimeout);  // a fresh Redis: window 0 is spent
  EXPECT_TRUE(first.ok() && first.value().status == LeaseStatus::kStateLost);
  clock.advance(seconds(1));
  const auto r = redis.lease("k", req, kTimeout);
  EXPECT_TRUE(r.ok() && r.value().status == LeaseStatus::kGranted && r.value().granted == 10u);
  return req;
}

// After the loss: the window is spent, the next one grants in full.
void expect_window_spent_then_next_grants(RedisRateCoordinator& redis, ManualClock& clock,
                                          const LeaseRequest& req) {
  const auto lost = lease_through(redis, "k", req);
  ASSERT_TRUE(lost.ok()) << lost.status().to_string();
  EXPECT_EQ(lost.value().status, LeaseStatus::kStateLost);
  EXPECT_EQ(lost.value().granted, 0u);
  clock.advance(seconds(1));
  const auto next = redis.lease("k", req, kTimeout);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next.value().status, LeaseStatus::kGranted);
  EXPECT_EQ(next.value().granted, 10u);
}

TEST(RedisRateCoordinator, ALedgerAnEarlierVersionLeftAsAHashIsHonouredAndRewritten) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  ManualClock clock(seconds(7'000'000));
  auto c = connect_test_mode(server.port(), clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const LeaseRequest req = granted_ten(*c.value(), clock);  // window 7,000,001 s
  // The same window as the earlier version wrote it: the whole budget granted, 20 of it to "us",
  // which gave 5 back in the window before.
  const std::string limit = std::to_string(kLossLimit);
  ASSERT_EQ(cli(server.port(), "DEL 'sluice:fed:{k}'"), "1");
  ASSERT_EQ(cli(server.port(), "HSET 'sluice:fed:{k}' w 7000001000000 h 7000001000000 lim " +
                                   limit + " p 1000000 g " + limit +
                                   " ret 0 f 3 r:eu 10:0: r:us 20:5:7000000000000"),
            "9");
  const auto spent = c.value()->lease("k", req, kTimeout);
  ASSERT_TRUE(spent.ok()) << spent.status().to_string();
  EXPECT_EQ(spent.value().status, LeaseStatus::kSpent);  // the hash's grants count
  EXPECT_EQ(spent.value().remaining, 0u);
  EXPECT_EQ(cli(server.port(), "TYPE 'sluice:fed:{k}'"), "string");
  std::vector<std::string> l = ledger(server.port(), "sluice:fed:{k}");
  ASSERT_EQ(l.size(), 16u);
  EXPECT_EQ((std::vector<std::string>(l.begin() + 3, l.begin() + 8)),
            (std::vector<std::string>{limit, "1000000", limit, "0", "3"}));
  // Both regions, in either order, with what each had.
  std::vector<std::string> regions = {l[8] + ":" + l[9] + ":" + l[10] + ":" + l[11],
                                      l[12] + ":" + l[13] + ":" + l[14] + ":" + l[15]};
  std::sort(regions.begin(), regions.end());
  EXPECT_EQ(regions, (std::vector<std::string>{"eu:10:0:-", "us:20:5:7000000000000"}));
  // The next window rolls it as the earlier version would have: both keep their totals.
  clock.advance(seconds(1));
  const auto next = c.value()->lease("k", req, kTimeout);
  ASSERT_TRUE(next.ok() && next.value().status == LeaseStatus::kGranted);
  EXPECT_EQ(granted_in(server.port(), "sluice:fed:{k}"), "10");
}

TEST(RedisRateCoordinator, AnyBytesNameARegionAndAnUnreadableLedgerGrantsNothing) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  ManualClock clock(seconds(7'000'000));
  auto c = connect_test_mode(server.port(), clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  (void)granted_ten(*c.value(), clock);  // past the first window
  // Separators, bytes that are not UTF-8, a NUL: each is a region of its own.
  const LeaseRequest req = request("eu", 1000, seconds(1), 10);
  const std::vector<std::string> odd = {"a,b;c:d", std::string("x\0y", 3), "\xff\xfe", "1:2:3:"};
  for (const std::string& region : odd) {
    LeaseRequest r = req;
    r.region = region;
    const auto got = c.value()->lease("odd", r, kTimeout);
    ASSERT_TRUE(got.ok() && got.value().granted == 10u) << got.status().to_string();
  }
  const auto again = c.value()->lease("odd", req, kTimeout);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().granted, 10u);
  EXPECT_EQ(granted_in(server.port(), "sluice:fed:{odd}"), "50");
  // Five regions' records (the NUL would cut redis-cli's output short: counted in Lua).
  EXPECT_EQ(cli(server.port(),
                "EVAL \"return #cmsgpack.unpack(redis.call('GET', KEYS[1]))\" 1 "
                "'sluice:fed:{odd}'"),
            std::to_string(8 + 4 * 5));
  // A ledger that is none of the forms: the lease fails, naming it, and grants nothing.
  ASSERT_EQ(cli(server.port(), "SET 'sluice:fed:{odd}' '1,2,3'"), "OK");
  const auto bad = c.value()->lease("odd", req, kTimeout);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unreadable ledger at sluice:fed:{odd}"), std::string::npos)
      << bad.status().to_string();
  EXPECT_EQ(cli(server.port(), "GET 'sluice:fed:{odd}'"), "1,2,3");
}

TEST(RedisRateCoordinator, RestartFromAnRdbSnapshotTakenMidWindowLosesTheRestOfTheWindow) {
  testing::RedisServer server;  // snapshots only when told (SAVE), as a scheduled one would be
  ASSERT_TRUE(server.start().ok());
  ManualClock clock(seconds(7'000'000));
  auto c = connect_test_mode(server.port(), clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const LeaseRequest req = granted_ten(*c.value(), clock);
  ASSERT_EQ(cli(server.port(), "SAVE"), "OK");  // the snapshot: 10 granted
  // A snapshot costs nothing: the window goes on granting.
  const auto after = c.value()->lease("k", req, kTimeout);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after.value().status, LeaseStatus::kGranted);
  ASSERT_EQ(after.value().granted, 10u);
  server.kill();
  ASSERT_TRUE(server.restart().ok());  // loads the snapshot: 10 granted, not 20
  EXPECT_EQ(granted_in(server.port(), "sluice:fed:{k}"), "10");
  expect_window_spent_then_next_grants(*c.value(), clock, req);
}

TEST(RedisRateCoordinator, RestartFromATruncatedAofLosesTheRestOfTheWindow) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start({}, 0, {"--appendonly", "yes", "--appendfsync", "always"}).ok());
  ManualClock clock(seconds(7'000'000));
  auto c = connect_test_mode(server.port(), clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const LeaseRequest req = granted_ten(*c.value(), clock);
  // The AOF's incremental file as it stands with 10 granted (fsynced at every write).
  std::filesystem::path incr;
  for (const auto& e : std::filesystem::directory_iterator(server.dir() + "/appendonlydir"))
    if (e.path().string().ends_with(".incr.aof")) incr = e.path();
  ASSERT_FALSE(incr.empty());
  const auto kept = std::filesystem::file_size(incr);
  ASSERT_TRUE(c.value()->lease("k", req, kTimeout).ok());  // 20 granted
  server.kill();
  // What a machine crash under appendfsync everysec leaves: the AOF without its last second.
  std::filesystem::resize_file(incr, kept);
  ASSERT_TRUE(server.restart().ok());
  EXPECT_EQ(granted_in(server.port(), "sluice:fed:{k}"), "10");
  expect_window_spent_then_next_grants(*c.value(), clock, req);
}

TEST(RedisRateCoordinator, AnEvictionWhileServingLosesTheRestOfTheWindow) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  ManualClock clock(seconds(7'000'000));
  auto c = connect_test_mode(server.port(), clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const LeaseRequest req = granted_ten(*c.value(), clock);
  ASSERT_TRUE(c.value()->lease("k", req, kTimeout).ok());  // 20 granted
  // The policy changed while serving (the connection is not re-made, so connect's check does
  // not see it), then memory runs short: volatile-ttl evicts the keys nearest their expiry
  // first, the ledger (a minute) before the filler (a day).
  ASSERT_EQ(cli(server.port(), "CONFIG SET maxmemory-policy volatile-ttl"), "OK");
  const long long used =
      std::stoll(test_clients::info_field(server.port(), "memory", "used_memory"));
  ASSERT_EQ(cli(server.port(), "CONFIG SET maxmemory " + std::to_string(used + 400'000)), "OK");
  const std::string big(10'000, 'x');
  for (int i = 0; i < 200 && cli(server.port(), "EXISTS 'sluice:fed:{k}'") == "1"; ++i)
    cli(server.port(), "SET filler" + std::to_string(i) + " " + big + " EX 86400");
  ASSERT_EQ(cli(server.port(), "EXISTS 'sluice:fed:{k}'"), "0");  // the ledger is gone
  ASSERT_EQ(cli(server.port(), "CONFIG SET maxmemory 0"), "OK");
  expect_window_spent_then_next_grants(*c.value(), clock, req);
}

TEST(RedisRateCoordinator, AReplicaPromotedWithoutTheLastWritesLosesTheRestOfTheWindow) {
  testing::RedisServer primary, replica;
  // No wait for more replicas before the first sync (Redis's default waits 5 s).
  ASSERT_TRUE(primary.start({}, 0, {"--repl-diskless-sync-delay", "0"}).ok());
  ASSERT_TRUE(replica.start().ok());
  ASSERT_EQ(cli(replica.port(), "REPLICAOF 127.0.0.1 " + std::to_string(primary.port())), "OK");
  ManualClock clock(seconds(7'000'000));
  auto c = connect_test_mode(primary.port(), clock);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const LeaseRequest req = granted_ten(*c.value(), clock);
  // The replica has the 10 (read on it: WAIT may count a replica still in its first sync).
  std::string on_replica;
  for (int i = 0; i < 500 && on_replica != "10"; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
    on_replica = granted_in(replica.port(), "sluice:fed:{k}");
  }
  ASSERT_EQ(on_replica, "10");
  // The failover: the replica is promoted while the primary still answers the region, which is
  // granted 10 more that never reach the replica; then the primary dies.
  ASSERT_EQ(cli(replica.port(), "REPLICAOF NO ONE"), "OK");
  const auto last = c.value()->lease("k", req, kTimeout);
  ASSERT_TRUE(last.ok() && last.value().granted == 10u);
  primary.kill();
  EXPECT_EQ(granted_in(replica.port(), "sluice:fed:{k}"), "10");
  // The regions now reach the promoted replica (Sentinel, a moved address: a new connection).
  auto promoted = connect_test_mode(replica.port(), clock);
  ASSERT_TRUE(promoted.ok()) << promoted.status().to_string();
  expect_window_spent_then_next_grants(*promoted.value(), clock, req);
}

TEST(RedisRateCoordinator, EvictionPolicyOtherThanNoevictionIsRefusedAtConnect) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  ASSERT_EQ(cli(server.port(), "CONFIG SET maxmemory-policy allkeys-lru"), "OK");
  RedisOptions o = RedisRateCoordinator::default_options();
  o.port = server.port();
  const auto refused = RedisRateCoordinator::connect(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  const std::string why = refused.status().message();
  EXPECT_NE(why.find("maxmemory-policy is allkeys-lru"), std::string::npos) << why;
  EXPECT_NE(why.find("noeviction"), std::string::npos) << why;
  // A lazily opened coordinator refuses its first call the same way.
  auto lazy = RedisRateCoordinator::open(o);
  ASSERT_TRUE(lazy.ok());
  const auto call = lazy.value()->lease("k", request("us", 5, seconds(1), 1), kTimeout);
  EXPECT_EQ(call.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(cli(server.port(), "DBSIZE"), "0");  // nothing written
  ASSERT_EQ(cli(server.port(), "CONFIG SET maxmemory-policy noeviction"), "OK");
  EXPECT_TRUE(RedisRateCoordinator::connect(o).ok());
}

TEST(RedisRateCoordinator, AUserWhoMayNotReadConfigIsRefusedWithHowToAllowIt) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  ASSERT_EQ(cli(server.port(), "ACL SETUSER fed on '>fed-pass' '~*' '&*' +@all -config"), "OK");
  RedisOptions o = RedisRateCoordinator::default_options();
  o.port = server.port();
  o.username = "fed";
  o.password = "fed-pass";
  const auto refused = RedisRateCoordinator::connect(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  const std::string why = refused.status().message();
  EXPECT_NE(why.find("maxmemory-policy"), std::string::npos) << why;
  EXPECT_NE(why.find("+config|get"), std::string::npos) << why;
  ASSERT_EQ(cli(server.port(), "ACL SETUSER fed '+config|get'"), "OK");
  const auto allowed = RedisRateCoordinator::connect(o);
  EXPECT_TRUE(allowed.ok()) << allowed.status().to_string();
}

TEST_F(RedisRateCoordinatorTest, FlushedScriptIsReloadedAndTheCallRetried) {
  auto redis = connect_settled("flush:fed:");
  ASSERT_NE(redis, nullptr);
  const LeaseRequest req = request("us", 100, kLong, 7);
  ASSERT_TRUE(redis->lease("flush", req, kTimeout).ok());
  EXPECT_EQ(cli(server_->port(), "SCRIPT FLUSH"), "OK");
  const auto r = redis->lease("flush", req, kTimeout);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().remaining, 86u);  // the retried call ran once
}

TEST_F(RedisRateCoordinatorTest, PipelinedLeasesReloadAFlushedScriptAndRunOnce) {
  auto redis = connect_settled("pipe:fed:");
  ASSERT_NE(redis, nullptr);
  const LeaseRequest req = request("us", 100, kLong, 7);
  ASSERT_TRUE(redis->lease("p1", req, kTimeout).ok());
  EXPECT_EQ(cli(server_->port(), "SCRIPT FLUSH"), "OK");
  const std::vector<LeaseCall> calls = {{"p1", &req}, {"p2", &req}, {"p1", &req}};
  const auto r = redis->lease_many(calls, kTimeout);
  ASSERT_EQ(r.size(), 3u);
  for (const auto& x : r) ASSERT_TRUE(x.ok()) << x.status().to_string();
  EXPECT_EQ(r[0].value().remaining, 86u);  // each retried call ran once
  EXPECT_EQ(r[1].value().remaining, 93u);
  EXPECT_EQ(r[2].value().remaining, 79u);
}

TEST_F(RedisRateCoordinatorTest, BadInputIsRefusedNamingTheFieldAndWritesNothing) {
  auto redis = connect_settled("bad:fed:");
  ASSERT_NE(redis, nullptr);
  const auto field_of = [&](const LeaseRequest& req) -> std::string {
    return redis->lease("bad", req, kTimeout).status().message();
  };
  EXPECT_NE(field_of(request("us", 5, Nanos{1'500}, 1)).find("period"), std::string::npos);
  EXPECT_NE(field_of(request("us", (1ULL << 53) + 1, seconds(1), 1)).find("limit"),
            std::string::npos);
  EXPECT_NE(field_of(request("", 5, seconds(1), 1)).find("region"), std::string::npos);
  EXPECT_NE(field_of(request("us", 5, seconds(1), 0)).find("want"), std::string::npos);
  EXPECT_EQ(redis->lease("", request("us", 5, seconds(1), 1), kTimeout).status().code(),
            StatusCode::kInvalidArgument);
  const auto odd_window = redis->reconcile("bad", "us", Nanos{1'000'000'001}, 1, kTimeout);
  EXPECT_EQ(odd_window.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd_window.status().message().find("window_start"), std::string::npos);
  EXPECT_EQ(redis->reconcile("bad", "", seconds(1), 1, kTimeout).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cli(server_->port(), "EXISTS 'bad:fed:{bad}'"), "0");
  // The fleet's prefix would share hashes with the fleet's script.
  RedisOptions fleet = options("x");
  fleet.key_prefix = RedisOptions{}.key_prefix;
  const auto shared = RedisRateCoordinator::connect(fleet);
  EXPECT_EQ(shared.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shared.status().message().find("key_prefix"), std::string::npos);
}

TEST_F(RedisRateCoordinatorTest, ReconcileGivesBackToTheCurrentWindowOnceOnly) {
  auto redis = connect_settled("rec:fed:");
  ASSERT_NE(redis, nullptr);
  const LeaseRequest req = request("us", 100, kLong, 30);
  const auto r = redis->lease("rec", req, kTimeout);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().granted, 30u);
  const Nanos w = r.value().window_start;
  const auto back = redis->reconcile("rec", "us", w, 12, kTimeout);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back.value(), 12u);
  EXPECT_EQ(redis->reconcile("rec", "us", w, 12, kTimeout).value(), 0u);   // a repeat
  EXPECT_EQ(redis->reconcile("rec", "us", w, 40, kTimeout).value(), 18u);  // what it held
  EXPECT_EQ(redis->reconcile("rec", "us", w - kLong, 5, kTimeout).value(), 0u);
  const auto again = redis->lease("rec", request("eu", 100, kLong, 1), kTimeout);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().remaining, 99u);  // 100 - 30 + 30 given back - 1
}

TEST(RedisRateCoordinator, HealthPingsAndAHangingServerTimesOut) {
  testing::RedisServer server;
  ASSERT_TRUE(server.start().ok());
  RedisOptions o = RedisRateCoordinator::default_options();
  o.port = server.port();
  auto c = RedisRateCoordinator::connect(o);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c.value()->health(kTimeout).ok());
  ASSERT_EQ(::kill(server.pid(), SIGSTOP), 0);
  const auto start = std::chrono::steady_clock::now();
  const Status hung = c.value()->health(milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(hung.code(), StatusCode::kDeadlineExceeded) << hung.to_string();
  EXPECT_LT(waited, milliseconds(1500));
  const auto lease = c.value()->lease("k", request("us", 5, seconds(1), 1), milliseconds(200));
  EXPECT_FALSE(lease.ok());
  ASSERT_EQ(::kill(server.pid(), SIGCONT), 0);
  EXPECT_TRUE(c.value()->health(kTimeout).ok());  // reconnected
  RedisOptions nowhere = o;
  nowhere.port = testing::free_port();
  EXPECT_EQ(RedisRateCoordinator::connect(nowhere).status().code(), StatusCode::kUnavailable);
}

TEST_F(RedisRateCoordinatorTest, LeaseLatency) {
  auto redis = connect_settled("latency:fed:");
  ASSERT_NE(redis, nullptr);
  constexpr int kLeases = 2000;
  const LeaseRequest req = request("us", 1'000'000'000, kLong, 1);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLeases; ++i) {
    const auto r = redis->lease("latency", req, kTimeout);
    ASSERT_TRUE(r.ok() && r.value().status == LeaseStatus::kGranted) << r.status().to_string();
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  std::printf("[latency] redis lease: %.1f us mean over %d sequential leases (loopback)\n",
              static_cast<double>(us) / kLeases, kLeases);
}

}  // namespace
}  // namespace sluice
