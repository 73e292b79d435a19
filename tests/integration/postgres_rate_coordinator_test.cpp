// The PostgreSQL rate coordinator against a real PostgreSQL the suite starts on loopback: tables
// and the origin row created on first use, the server's clock as the coordinator's, the
// state-loss rule when the tables are emptied or the origin row deleted, the sweep of idle keys,
// a held key lock, bad input, and the lease latency. Concurrent regions and health, alike on
// every backend, are in rate_coordinator_backends_test.cpp; replies equal to the memory and Redis
// coordinators' step by step in rate_coordinator_conformance_test.cpp.
#include "sluice/backends/postgres_rate_coordinator.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "integration/server_clients.h"
#include "sluice/backends/memory_rate_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(5);
// A window no test outlasts (a window boundary mid-test would change the counts).
constexpr Nanos kLong = std::chrono::hours(24 * 365 * 10);

LeaseRequest request(std::string region, std::uint64_t limit, Nanos period, std::uint64_t want) {
  LeaseRequest r;
  r.region = std::move(region);
  r.spec = {limit, period};
  r.want = want;
  return r;
}

using test_clients::RawConn;

class PostgresRateCoordinatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.status().to_string(); }

  static PostgresOptions options(std::string prefix) {
    PostgresOptions o = PostgresRateCoordinator::default_options();
    o.conninfo = server_->conninfo();
    o.table_prefix = std::move(prefix);
    return o;
  }
  static std::unique_ptr<PostgresRateCoordinator> connect(std::string prefix,
                                                          const Clock* clock = nullptr) {
    auto c = PostgresRateCoordinator::connect(options(std::move(prefix)), clock);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    return std::move(c.value());
  }
  // A coordinator on the server's clock whose tables have been in use for long: an old origin.
  static std::unique_ptr<PostgresRateCoordinator> connect_settled(const std::string& prefix) {
    auto c = connect(prefix);
    RawConn raw(server_->conninfo());
    raw.value("INSERT INTO " + prefix +
              "_origin VALUES (1, 0, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) ON "
              "CONFLICT DO NOTHING");
    return c;
  }

  static testing::SuiteServer<testing::PostgresServer> server_;
};
testing::SuiteServer<testing::PostgresServer> PostgresRateCoordinatorTest::server_;

TEST_F(PostgresRateCoordinatorTest, CreatesItsTablesOnFirstUseAndItsOriginOnTheFirstLease) {
  RawConn raw(server_->conninfo());
  EXPECT_EQ(raw.value("SELECT to_regclass('first_fed_ledger')"), "");
  ManualClock clock(seconds(7'000'000));
  auto pg = connect("first_fed", &clock);
  ASSERT_NE(pg, nullptr);
  for (const char* table : {"first_fed_ledger", "first_fed_regions", "first_fed_origin"})
    EXPECT_EQ(raw.value(std::string("SELECT to_regclass('") + table + "')"), table);
  EXPECT_EQ(raw.value("SELECT count(*) FROM first_fed_origin"), "0");
  const auto lost = pg->lease("orders", request("us", 10, seconds(1), 4), kTimeout);
  ASSERT_TRUE(lost.ok()) << lost.status().to_string();
  EXPECT_EQ(lost.value().status, LeaseStatus::kStateLost);  // new tables: the first window
  EXPECT_EQ(raw.value("SELECT origin_ns FROM first_fed_origin"), "7000000000000000");
  clock.advance(seconds(1));
  const auto r = pg->lease("orders", request("us", 10, seconds(1), 4), kTimeout);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().status, LeaseStatus::kGranted);
  EXPECT_EQ(r.value().granted, 4u);
  EXPECT_EQ(raw.value("SELECT granted || '/' || lim || '/' || window_start FROM first_fed_ledger "
                      "WHERE key = 'orders'"),
            "4/10/7000001000000000");
  EXPECT_EQ(raw.value("SELECT region || ':' || granted FROM first_fed_regions"), "us:4");
}

TEST_F(PostgresRateCoordinatorTest, TheServersClockIsTheCoordinatorsClock) {
  auto pg = connect_settled("clock_fed");
  ASSERT_NE(pg, nullptr);
  const Nanos before = std::chrono::system_clock::now().time_since_epoch();
  const auto r = pg->lease("clock", request("us", 100, seconds(1), 5), kTimeout);
  const Nanos after = std::chrono::system_clock::now().time_since_epoch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().status, LeaseStatus::kGranted);
  EXPECT_GE(r.value().coordinator_now, before - seconds(1));  // same host: the same wall clock
  EXPECT_LE(r.value().coordinator_now, after + seconds(1));
  EXPECT_EQ(r.value().coordinator_now.count() % 1000, 0);  // whole microseconds
  EXPECT_EQ(r.value().window_start.count() % seconds(1).count(), 0);
  EXPECT_LT(r.value().coordinator_now, r.value().window_end);
}

TEST_F(PostgresRateCoordinatorTest, EmptiedTablesOrAMissingOriginRowLoseTheWindow) {
  ManualClock clock(seconds(8'000'000));
  MemoryRateCoordinator memory(clock);
  auto pg = connect("loss_fed", &clock);
  ASSERT_NE(pg, nullptr);
  RawConn raw(server_->conninfo());
  const LeaseRequest req = request("eu", 50, seconds(1), 5);
  const auto both = [&](LeaseStatus want) {
    const auto m = memory.lease("k", req, kTimeout);
    const auto p = pg->lease("k", req, kTimeout);
    ASSERT_TRUE(m.ok() && p.ok()) << p.status().to_string();
    EXPECT_EQ(p.value(), m.value());
    EXPECT_EQ(p.value().status, want);
  };
  memory.lose_state(seconds(1));
  both(LeaseStatus::kStateLost);
  clock.advance(milliseconds(1200));
  both(LeaseStatus::kGranted);
  // The tables emptied mid-window (a database recreated): the rest of the window is spent.
  raw.value("TRUNCATE loss_fed_ledger, loss_fed_regions, loss_fed_origin");
  memory.lose_state(seconds(1));
  both(LeaseStatus::kStateLost);
  clock.advance(milliseconds(500));
  both(LeaseStatus::kStateLost);
  clock.advance(milliseconds(500));
  both(LeaseStatus::kGranted);
  // A restore from a backup keeps old rows: deleting the origin row makes the window spent.
  raw.value("DELETE FROM loss_fed_origin");
  memory.lose_state(seconds(1));
  both(LeaseStatus::kStateLost);
  clock.advance(seconds(1));
  both(LeaseStatus::kGranted);
  // The origin row records the timeline it was written on, the server's current one.
  EXPECT_EQ(raw.value("SELECT timeline FROM loss_fed_origin"),
            raw.value("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"));
  // Rows written on another timeline (what a promoted standby or a point-in-time recovery
  // serves: the server went back in its history) make the window spent.
  raw.value("UPDATE loss_fed_origin SET timeline = '000000FF'");
  memory.lose_state(seconds(1));
  both(LeaseStatus::kStateLost);
  clock.advance(seconds(1));
  both(LeaseStatus::kGranted);
  // Tables from a version without the timeline: their first lease counts its window as spent.
  raw.value("UPDATE loss_fed_origin SET timeline = NULL");
  memory.lose_state(seconds(1));
  both(LeaseStatus::kStateLost);
  clock.advance(seconds(1));
  both(LeaseStatus::kGranted);
}

TEST_F(PostgresRateCoordinatorTest, IdleKeysAreSweptByLaterLeasesWithoutChangingReplies) {
  ManualClock clock(seconds(9'000'000));
  MemoryRateCoordinator memory(clock);
  auto pg = connect("sweep_fed", &clock);
  ASSERT_NE(pg, nullptr);
  RawConn raw(server_->conninfo());
  memory.lose_state(seconds(1));
  const auto both = [&](const std::string& key) {
    const LeaseRequest req = request("us", 20, seconds(1), 3);
    const auto m = memory.lease(key, req, kTimeout);
    const auto p = pg->lease(key, req, kTimeout);
    ASSERT_TRUE(m.ok() && p.ok()) << p.status().to_string();
    EXPECT_EQ(p.value(), m.value());
  };
  both("idle");  // the origin window
  clock.advance(seconds(1));
  both("idle");
  EXPECT_EQ(raw.value("SELECT count(*) FROM sweep_fed_regions WHERE key = 'idle'"), "1");
  clock.advance(seconds(59));  // idle for less than a minute: kept
  both("busy");
  EXPECT_EQ(raw.value("SELECT count(*) FROM sweep_fed_ledger WHERE key = 'idle'"), "1");
  clock.advance(seconds(11));  // idle for more than max(3 periods, 1 minute), a sweep is due
  both("busy");
  EXPECT_EQ(raw.value("SELECT count(*) FROM sweep_fed_ledger WHERE key = 'idle'"), "0");
  EXPECT_EQ(raw.value("SELECT count(*) FROM sweep_fed_regions WHERE key = 'idle'"), "0");
  EXPECT_EQ(raw.value("SELECT count(*) FROM sweep_fed_ledger WHERE key = 'busy'"), "1");
  both("idle");  // a swept key answers as if it had been kept
  const auto late = pg->reconcile("idle", "us", seconds(9'000'001), 3, kTimeout);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late.value(), memory.reconcile("idle", "us", seconds(9'000'001), 3, kTimeout).value());
}

TEST_F(PostgresRateCoordinatorTest, AHeldKeyLockYieldsDeadlineExceededAndTheNextCallSucceeds) {
  auto pg = connect_settled("lock_fed");
  ASSERT_NE(pg, nullptr);
  RawConn raw(server_->conninfo());
  raw.value("BEGIN");
  raw.value("SELECT pg_advisory_xact_lock(hashtextextended('lock_fed:' || 'held', 0))");
  const auto start = std::chrono::steady_clock::now();
  const auto blocked = pg->lease("held", request("us", 10, kLong, 1), milliseconds(300));
  EXPECT_EQ(blocked.status().code(), StatusCode::kDeadlineExceeded) << blocked.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
  raw.value("COMMIT");
  const auto r = pg->lease("held", request("us", 10, kLong, 1), kTimeout);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value().status, LeaseStatus::kGranted);
}

TEST_F(PostgresRateCoordinatorTest, BadInputIsRefusedNamingTheField) {
  auto pg = connect_settled("bad_fed");
  ASSERT_NE(pg, nullptr);
  const auto message = [&](const StatusOr<LeaseReply>& r) -> std::string {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  };
  EXPECT_NE(message(pg->lease("", request("us", 5, seconds(1), 1), kTimeout)).find("key"),
            std::string::npos);
  EXPECT_NE(message(pg->lease("k", request("us", 0, seconds(1), 1), kTimeout)).find("limit"),
            std::string::npos);
  EXPECT_NE(message(pg->lease("k", request(std::string("u\0s", 3), 5, seconds(1), 1), kTimeout))
                .find("region"),
            std::string::npos);
  EXPECT_EQ(pg->reconcile("k", "", seconds(1), 1, kTimeout).status().code(),
            StatusCode::kInvalidArgument);
  RawConn raw(server_->conninfo());
  EXPECT_EQ(raw.value("SELECT count(*) FROM bad_fed_ledger"), "0");
  PostgresOptions o = options("Bad-Prefix");
  EXPECT_NE(PostgresRateCoordinator::open(o).status().message().find("table_prefix"),
            std::string::npos);
  o = options("ok_fed");
  o.conninfo = "no_such_option=1";
  EXPECT_NE(PostgresRateCoordinator::open(o).status().message().find("conninfo"),
            std::string::npos);
}

TEST_F(PostgresRateCoordinatorTest, LeaseLatency) {
  auto pg = connect_settled("latency_fed");
  ASSERT_NE(pg, nullptr);
  constexpr int kLeases = 1000;
  const LeaseRequest req = request("us", 1'000'000'000, kLong, 1);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLeases; ++i) {
    const auto r = pg->lease("latency", req, kTimeout);
    ASSERT_TRUE(r.ok() && r.value().status == LeaseStatus::kGranted) << r.status().to_string();
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  std::printf("[latency] postgres lease: %.1f us mean over %d sequential leases (loopback)\n",
              static_cast<double>(us) / kLeases, kLeases);
}

}  // namespace
}  // namespace sluice
