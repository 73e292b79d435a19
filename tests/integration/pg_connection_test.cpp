// The PostgreSQL backends' connection (backends/postgres/pg_connection.h) against a real
// PostgreSQL the suite starts on loopback: the setup on every (re)connect, a failed statement
// rolled back on a connection that is kept, a held lock ending at the call's timeout, text that
// cannot be quoted, a busy connection, an unreachable server, bad options.
#include "backends/postgres/pg_connection.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "integration/server_clients.h"
#include "sluice/testing/servers.h"

namespace sluice::postgres_detail {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(5);

using test_clients::RawConn;

class PgConnectionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.status().to_string(); }

  static PostgresOptions options(std::string prefix) {
    PostgresOptions o;
    o.conninfo = server_->conninfo();
    o.table_prefix = std::move(prefix);
    return o;
  }

  static testing::SuiteServer<testing::PostgresServer> server_;
};
testing::SuiteServer<testing::PostgresServer> PgConnectionTest::server_;

// The backend's process id: which server connection a call ran on.
StatusOr<std::string> backend_pid(PgConnection& conn) {
  return conn.call(kTimeout, [](PgConnection::Session& db) -> StatusOr<std::string> {
    if (Status s = db.connect(); !s.ok()) return s;
    auto rs = db.query("SELECT pg_backend_pid()");
    if (!rs.ok()) return rs.status();
    return std::string(PQgetvalue(rs.value().back().get(), 0, 0));
  });
}

TEST_F(PgConnectionTest, TheSetupRunsOnEveryConnectAndAgainAfterTheServerDropsTheConnection) {
  RawConn raw(server_->conninfo());
  raw.value("CREATE TABLE conn_setups (n int)");
  PgConnection conn(options("conn_setup"), "INSERT INTO conn_setups VALUES (1);");
  EXPECT_EQ(raw.value("SELECT count(*) FROM conn_setups"), "0");  // nothing before a call
  const auto pid = backend_pid(conn);
  ASSERT_TRUE(pid.ok()) << pid.status().to_string();
  EXPECT_EQ(backend_pid(conn).value(), pid.value());  // kept
  EXPECT_EQ(raw.value("SELECT count(*) FROM conn_setups"), "1");
  EXPECT_EQ(raw.value("SELECT pg_terminate_backend(" + pid.value() + ")"), "t");
  StatusOr<std::string> again = Status(StatusCode::kUnavailable, "not called");
  for (int i = 0; i < 2 && !again.ok(); ++i) {
    again = backend_pid(conn);
    if (!again.ok()) {
      EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
    }
  }
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_NE(again.value(), pid.value());
  EXPECT_EQ(raw.value("SELECT count(*) FROM conn_setups"), "2");
}

TEST_F(PgConnectionTest, AFailedSetupIsTheCallsErrorAndKeepsNoConnection) {
  PgConnection conn(options("conn_bad_setup"), "SELECT * FROM conn_no_such_table;");
  const Status s = conn.connect(kTimeout);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("42P01"), std::string::npos) << s.to_string();  // undefined table
  RawConn raw(server_->conninfo());
  raw.value("CREATE TABLE conn_no_such_table (n int)");
  EXPECT_TRUE(conn.connect(kTimeout).ok());  // the next call connected and set up again
}

TEST_F(PgConnectionTest, AFailedStatementIsRolledBackAndTheConnectionKept) {
  PgConnection conn(options("conn_fail"), "");
  const auto pid = backend_pid(conn);
  ASSERT_TRUE(pid.ok()) << pid.status().to_string();
  const Status failed = conn.call(kTimeout, [](PgConnection::Session& db) {
    return db.run(db.begin() + "SELECT 1/0;COMMIT;");
  });
  EXPECT_EQ(failed.code(), StatusCode::kInternal);
  EXPECT_NE(failed.message().find("22012"), std::string::npos) << failed.to_string();
  EXPECT_EQ(backend_pid(conn).value(), pid.value());  // idle again, not dropped
  // A transaction a call leaves open is rolled back and is an error.
  const Status open =
      conn.call(kTimeout, [](PgConnection::Session& db) { return db.run("BEGIN"); });
  EXPECT_EQ(open.code(), StatusCode::kInternal);
  EXPECT_EQ(backend_pid(conn).value(), pid.value());
}

TEST_F(PgConnectionTest, AHeldLockEndsAtTheCallsTimeoutAndTheConnectionIsKept) {
  PgConnection conn(options("conn_lock"), "");
  const auto pid = backend_pid(conn);
  ASSERT_TRUE(pid.ok()) << pid.status().to_string();
  RawConn raw(server_->conninfo());
  raw.value("BEGIN");
  raw.value("SELECT pg_advisory_xact_lock(4242)");
  const auto start = std::chrono::steady_clock::now();
  const Status blocked = conn.call(milliseconds(300), [](PgConnection::Session& db) {
    return db.run(db.begin() + "SELECT pg_advisory_xact_lock(4242);COMMIT;");
  });
  EXPECT_EQ(blocked.code(), StatusCode::kDeadlineExceeded) << blocked.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
  raw.value("COMMIT");
  EXPECT_EQ(backend_pid(conn).value(), pid.value());
}

TEST_F(PgConnectionTest, TextThatCannotBeALiteralIsRefusedNamingTheField) {
  PgConnection conn(options("conn_literal"), "");
  const auto quoted = conn.call(kTimeout, [](PgConnection::Session& db) -> StatusOr<std::string> {
    if (Status s = db.connect(); !s.ok()) return s;
    return db.literal("it's", "key");
  });
  ASSERT_TRUE(quoted.ok()) << quoted.status().to_string();
  EXPECT_EQ(quoted.value(), "'it''s'");
  const auto nul = conn.call(kTimeout, [](PgConnection::Session& db) -> StatusOr<std::string> {
    if (Status s = db.connect(); !s.ok()) return s;
    return db.literal(std::string("a\0b", 3), "region");
  });
  EXPECT_EQ(nul.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(nul.status().message().rfind("region", 0), 0u) << nul.status().to_string();
}

TEST_F(PgConnectionTest, ACallWaitingForABusyConnectionGivesUpAtItsTimeout) {
  PgConnection conn(options("conn_busy"), "");
  std::promise<void> entered, release;
  std::thread holder([&] {
    const Status s = conn.call(kTimeout, [&](PgConnection::Session& db) -> Status {
      entered.set_value();
      release.get_future().wait();
      return db.connect();
    });
    EXPECT_TRUE(s.ok()) << s.to_string();
  });
  entered.get_future().wait();
  const Status busy = conn.connect(milliseconds(50));
  EXPECT_EQ(busy.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(busy.message().find("busy"), std::string::npos);
  release.set_value();
  holder.join();
  EXPECT_TRUE(conn.connect(kTimeout).ok());
}

TEST(PgConnection, AnUnreachableServerIsUnavailableAndBadOptionsNameTheirField) {
  PostgresOptions o;
  o.conninfo = "host=127.0.0.1 port=" + std::to_string(testing::free_port()) + " user=postgres";
  PgConnection nowhere(o, "");
  EXPECT_EQ(nowhere.connect(seconds(2)).code(), StatusCode::kUnavailable);
  EXPECT_NE(PgConnection::validate_prefix("Bad-Prefix", 20).message().find("table_prefix"),
            std::string::npos);
  EXPECT_FALSE(PgConnection::validate_prefix(std::string(21, 'a'), 20).ok());
  EXPECT_TRUE(PgConnection::validate_prefix(std::string(20, 'a'), 20).ok());
  EXPECT_NE(PgConnection::connect_budget("no_such_option=1").status().message().find("conninfo"),
            std::string::npos);
  EXPECT_EQ(PgConnection::connect_budget("connect_timeout=5").value(), seconds(5));
  EXPECT_EQ(PgConnection::connect_budget("connect_timeout=1").value(), seconds(2));  // libpq
  EXPECT_NE(
      PgConnection::connect_budget("connect_timeout=x").status().message().find("connect_timeout"),
      std::string::npos);
}

}  // namespace
}  // namespace sluice::postgres_detail
