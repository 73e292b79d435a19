// The PostgreSQL coordinator against a real PostgreSQL the suite starts on loopback: grants
// equal to the memory coordinator's step by step (8 configs), server time, tables created on
// first use, GlobalCap under concurrent heartbeats from two connections, timeouts on a held
// lock and on a hanging backend, bad input, and a server that goes away.
#include "sluice/backends/postgres_coordinator.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "integration/server_clients.h"
#include "sluice/backends/memory_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(5);

NodeReport report(std::string id, std::uint32_t l_local, std::uint32_t in_flight = 0,
                  std::uint64_t acked = 0, Nanos lease = seconds(2)) {
  return NodeReport{std::move(id), l_local, in_flight, acked, lease};
}

using test_clients::RawConn;

std::string config_name(const CoordinatorConfig& c) {
  return std::string(to_string(c.aggregate)) + "/" + std::string(to_string(c.allocation)) +
         (c.acknowledged_handoff ? "/handoff" : "");
}

std::vector<CoordinatorConfig> all_configs() {
  std::vector<CoordinatorConfig> out;
  for (Aggregate a : {Aggregate::kMedian, Aggregate::kMin})
    for (Allocation l : {Allocation::kEqualSplit, Allocation::kDemandProportional})
      for (bool handoff : {false, true}) out.push_back({a, l, handoff});
  return out;
}

// The suite's fixture; the class under test is sluice::PostgresCoordinator.
class PostgresCoordinatorTest : public ::testing::Test {
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

  static std::unique_ptr<PostgresCoordinator> connect(std::string prefix,
                                                      CoordinatorConfig config = {},
                                                      const Clock* clock = nullptr) {
    auto c = PostgresCoordinator::connect(options(std::move(prefix)), config, clock);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    if (!c.ok()) return nullptr;
    return std::move(c.value());
  }

  static testing::SuiteServer<testing::PostgresServer> server_;
};
testing::SuiteServer<testing::PostgresServer> PostgresCoordinatorTest::server_;

// Replays one script through the memory coordinator and a PostgresCoordinator on the same
// ManualClock and compares every grant.
struct Replay {
  ManualClock& clock;
  MemoryCoordinator& memory;
  ConcurrencyCoordinator& pg;
  std::string key;
  std::string where;
  std::map<std::string, std::uint64_t> last_generation;
  int step = 0;

  void beat(const std::string& id, std::uint32_t l_local, std::uint32_t in_flight, bool ack,
            Nanos lease = seconds(2)) {
    ++step;
    const NodeReport r = report(id, l_local, in_flight, ack ? last_generation[id] : 0, lease);
    const StatusOr<Grant> want = memory.heartbeat(key, r, kTimeout);
    const StatusOr<Grant> got = pg.heartbeat(key, r, kTimeout);
    ASSERT_TRUE(want.ok() && got.ok())
        << where << " step " << step << ": " << got.status().to_string();
    EXPECT_EQ(got.value(), want.value()) << where << " step " << step << " node " << id;
    last_generation[id] = want.value().generation;
  }
  void leave(const std::string& id) {
    ++step;
    ASSERT_TRUE(memory.leave(key, id, 0, kTimeout).ok());
    const Status s = pg.leave(key, id, 0, kTimeout);
    ASSERT_TRUE(s.ok()) << where << " step " << step << ": " << s.to_string();
  }
};

void script(Replay& r) {
  // Three joins, then in-flight changes with acknowledged generations.
  r.beat("a", 10, 0, false);
  r.beat("b", 12, 0, false);
  r.beat("c", 8, 0, false);
  r.beat("a", 10, 4, true);
  r.beat("b", 12, 2, true);
  r.beat("c", 8, 0, true);
  r.clock.advance(milliseconds(100));
  r.beat("a", 10, 7, true);
  r.beat("b", 12, 1, false);
  r.beat("c", 8, 3, true, milliseconds(500));  // c's lease is now short
  r.beat("a", 10, 2, true);
  // b leaves (twice: the second is a no-op).
  r.leave("b");
  r.leave("b");
  r.beat("a", 10, 2, true);
  r.beat("c", 8, 1, true, milliseconds(500));
  // c's lease runs out; a's heartbeat evicts it.
  r.clock.advance(seconds(1));
  r.beat("a", 10, 1, true);
  r.beat("b", 12, 0, false);  // rejoins
  r.beat("a", 14, 5, true);
  r.beat("b", 12, 6, true);
  r.beat("c", 9, 0, false);  // rejoins
  r.clock.advance(std::chrono::microseconds(1'234));
  r.beat("a", 14, 3, true);
  r.beat("b", 12, 4, true);
  r.beat("c", 9, 2, true);
  // Everyone but b expires.
  r.clock.advance(seconds(2));
  r.beat("b", 12, 2, true);
  r.beat("a", 10, 0, false);
}

TEST_F(PostgresCoordinatorTest, GrantsEqualTheMemoryCoordinatorsStepByStepInEveryConfig) {
  int index = 0;
  for (const CoordinatorConfig& config : all_configs()) {
    ManualClock clock{Nanos{seconds(1000)}};
    MemoryCoordinator memory(clock, config);
    auto pg = connect("conformance", config, &clock);
    ASSERT_NE(pg, nullptr);
    const std::string key = "conformance-" + std::to_string(index++);
    Replay replay{clock, memory, *pg, key, config_name(config), {}, 0};
    // The tables' first heartbeat finds no origin row (later configs: the row their first
    // wrote, at the same clock time): a loss, so nothing for one lease_ttl (2 s); the memory
    // coordinator is told the same at that instant.
    memory.lose_state();
    replay.key = key + "-origin";
    replay.beat("z", 10, 0, false);
    replay.beat("y", 10, 0, false);
    clock.advance(seconds(2));
    replay.key = key;
    script(replay);
    if (HasFatalFailure()) return;

    // What the tables hold is the memory coordinator's state.
    const auto want = memory.state(key);
    ASSERT_TRUE(want.has_value());
    RawConn raw(server_->conninfo());
    ASSERT_TRUE(raw.ok()) << raw.error();
    const auto rows = raw.rows(
        "SELECT node_id, l_local, in_flight, share, expires_ns, acked,"
        " array_to_string(unacked_gen, ','), array_to_string(unacked_share, ',')"
        " FROM conformance_nodes WHERE key = '" +
        key + "' ORDER BY node_id COLLATE \"C\"");
    ASSERT_EQ(rows.size(), want->nodes.size()) << config_name(config);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const FleetNode& n = want->nodes[i];
      std::string gens, shares;
      for (const IssuedGrant& g : n.unacked) {
        if (!gens.empty()) {
          gens += ',';
          shares += ',';
        }
        gens += std::to_string(g.generation);
        shares += std::to_string(g.share);
      }
      const std::vector<std::string> expect = {n.id,
                                               std::to_string(n.l_local),
                                               std::to_string(n.in_flight),
                                               std::to_string(n.share),
                                               std::to_string(n.expires_at.count()),
                                               std::to_string(n.acked_generation),
                                               gens,
                                               shares};
      EXPECT_EQ(rows[i], expect) << config_name(config);
    }
    EXPECT_EQ(raw.value("SELECT generation FROM conformance_keys WHERE key = '" + key + "'"),
              std::to_string(want->generation));
  }
}

TEST_F(PostgresCoordinatorTest, ServerTimeCountsJoinsAndEvictsAnExpiredLease) {
  auto pg = connect("server_time");
  ASSERT_NE(pg, nullptr);
  const std::string key = "server-time";
  auto a = pg->heartbeat(key, report("a", 10, 0, 0, seconds(30)), kTimeout);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a.value().nodes, 1u);
  auto b = pg->heartbeat(key, report("b", 10, 0, 0, seconds(30)), kTimeout);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b.value().nodes, 2u);
  EXPECT_GT(b.value().generation, a.value().generation);

  auto c = pg->heartbeat(key, report("c", 10, 0, 0, milliseconds(1)), kTimeout);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c.value().nodes, 3u);
  std::this_thread::sleep_for(milliseconds(20));  // server time: nothing else moves it
  auto a2 = pg->heartbeat(key, report("a", 10, 0, 0, seconds(30)), kTimeout);
  ASSERT_TRUE(a2.ok()) << a2.status().to_string();
  EXPECT_EQ(a2.value().nodes, 2u);  // c is gone

  RawConn raw(server_->conninfo());
  ASSERT_TRUE(raw.ok()) << raw.error();
  EXPECT_EQ(raw.value("SELECT string_agg(node_id, ',' ORDER BY node_id) FROM server_time_nodes"
                      " WHERE key = 'server-time'"),
            "a,b");
  // Server time is read in microseconds; the leases here are whole microseconds too.
  EXPECT_EQ(raw.value("SELECT count(*) FROM server_time_nodes WHERE expires_ns % 1000 <> 0"), "0");
}

TEST_F(PostgresCoordinatorTest, CreatesItsTablesOnFirstUse) {
  RawConn raw(server_->conninfo());
  ASSERT_TRUE(raw.ok()) << raw.error();
  const std::string count =
      "SELECT count(*) FROM information_schema.tables"
      " WHERE table_name IN ('fresh_tables_keys', 'fresh_tables_nodes')";
  ASSERT_EQ(raw.value(count), "0");
  auto pg = connect("fresh_tables");
  ASSERT_NE(pg, nullptr);
  EXPECT_EQ(raw.value(count), "2");
  // A second coordinator on the same tables finds them in place.
  auto again = connect("fresh_tables");
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->heartbeat("k", report("a", 4), kTimeout).ok());
  EXPECT_EQ(raw.value("SELECT count(*) FROM fresh_tables_nodes"), "1");
}

struct Issued {
  std::uint64_t generation = 0;
  std::size_t node = 0;
  std::uint32_t share = 0;
  std::uint32_t l_global = 0;
};

TEST_F(PostgresCoordinatorTest, ConcurrentHeartbeatsFromTwoConnectionsKeepTheGlobalCap) {
  constexpr int kThreads = 4, kBeats = 200;
  constexpr std::uint32_t kLimit = 16;
  constexpr std::uint32_t kSeed = 20261122;
  const CoordinatorConfig config{Aggregate::kMedian, Allocation::kDemandProportional, true};
  // Both connect at once on fresh tables: concurrent first use must not fail.
  std::unique_ptr<PostgresCoordinator> coordinators[2];
  {
    std::vector<std::thread> connecting;
    for (auto& c : coordinators)
      connecting.emplace_back([&c, &config] { c = connect("concurrent", config); });
    for (auto& t : connecting) t.join();
  }
  ASSERT_NE(coordinators[0], nullptr);
  ASSERT_NE(coordinators[1], nullptr);

  std::vector<std::vector<Issued>> issued(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      PostgresCoordinator& pg = *coordinators[t % 2];
      std::mt19937 rng(kSeed + static_cast<std::uint32_t>(t));
      const std::string id = "n" + std::to_string(t);
      Grant last;
      for (int i = 0; i < kBeats; ++i) {
        const auto in_flight = static_cast<std::uint32_t>(rng() % (last.share + 1));
        auto g = pg.heartbeat("shared", report(id, kLimit, in_flight, last.generation, seconds(60)),
                              seconds(10));
        if (!g.ok()) {
          errors[t] = g.status().to_string();
          return;
        }
        last = g.value();
        issued[t].push_back(
            {last.generation, static_cast<std::size_t>(t), last.share, last.l_global});
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) ASSERT_EQ(e, "") << "seed " << kSeed;

  std::vector<Issued> all;
  for (const auto& v : issued) all.insert(all.end(), v.begin(), v.end());
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kThreads * kBeats));
  std::sort(all.begin(), all.end(),
            [](const Issued& a, const Issued& b) { return a.generation < b.generation; });
  // In generation order (the order the advisory lock serialised them), the latest share of
  // every node never sums past L_global.
  std::vector<std::uint32_t> latest(kThreads, 0);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i > 0) {
      ASSERT_NE(all[i].generation, all[i - 1].generation) << "duplicate generation";
    }
    EXPECT_EQ(all[i].l_global, kLimit);
    latest[all[i].node] = all[i].share;
    std::uint32_t sum = 0;
    for (std::uint32_t s : latest) sum += s;
    ASSERT_LE(sum, kLimit) << "after generation " << all[i].generation << ", seed " << kSeed;
  }
  RawConn raw(server_->conninfo());
  ASSERT_TRUE(raw.ok()) << raw.error();
  EXPECT_LE(std::stoul(raw.value("SELECT sum(share) FROM concurrent_nodes WHERE key = 'shared'")),
            kLimit);
  EXPECT_EQ(raw.value("SELECT generation FROM concurrent_keys WHERE key = 'shared'"),
            std::to_string(all.back().generation));
}

TEST_F(PostgresCoordinatorTest, AHeldKeyLockYieldsDeadlineExceededAndTheNextCallSucceeds) {
  auto pg = connect("timeouts");
  ASSERT_NE(pg, nullptr);
  RawConn holder(server_->conninfo());
  ASSERT_TRUE(holder.ok()) << holder.error();
  holder.rows("SELECT pg_advisory_lock(hashtextextended('held', 0))");

  const SteadyClock& clock = SteadyClock::instance();
  const Nanos start = clock.now();
  auto g = pg->heartbeat("held", report("a", 8), milliseconds(200));
  const Nanos waited = clock.now() - start;
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kDeadlineExceeded) << g.status().to_string();
  EXPECT_LT(waited, seconds(1));
  EXPECT_EQ(holder.value("SELECT count(*) FROM timeouts_nodes WHERE key = 'held'"), "0");
  const Status left = pg->leave("held", "a", 0, milliseconds(200));
  EXPECT_EQ(left.code(), StatusCode::kDeadlineExceeded) << left.to_string();

  holder.rows("SELECT pg_advisory_unlock(hashtextextended('held', 0))");
  auto later = pg->heartbeat("held", report("a", 8), kTimeout);
  ASSERT_TRUE(later.ok()) << later.status().to_string();
  // The tables' first committed heartbeat (the others rolled back): nothing for a lease_ttl.
  EXPECT_TRUE(later.value().recovering);
  EXPECT_EQ(later.value().share, 0u);
}

// Resumes a stopped process when the test ends, however it ends.
struct Resume {
  pid_t pid;
  ~Resume() { ::kill(pid, SIGCONT); }
};

TEST_F(PostgresCoordinatorTest, AHangingBackendYieldsDeadlineExceededAndTheNextCallReconnects) {
  PostgresOptions o = options("hanging");
  o.conninfo += " application_name=sluice_hang_test";
  auto c = PostgresCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  PostgresCoordinator& pg = *c.value();
  ASSERT_TRUE(pg.heartbeat("hang", report("a", 8), kTimeout).ok());

  // The coordinator's backend process stops answering (the server, not the lock, hangs).
  RawConn raw(server_->conninfo());
  ASSERT_TRUE(raw.ok()) << raw.error();
  const auto pid = static_cast<pid_t>(std::stol(
      raw.value("SELECT pid FROM pg_stat_activity WHERE application_name = 'sluice_hang_test'")));
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  {
    const Resume resume{pid};
    const SteadyClock& clock = SteadyClock::instance();
    const Nanos start = clock.now();
    auto g = pg.heartbeat("hang", report("a", 8), milliseconds(200));
    const Nanos waited = clock.now() - start;
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kDeadlineExceeded) << g.status().to_string();
    EXPECT_LT(waited, seconds(1));
  }
  auto later = pg.heartbeat("hang", report("a", 8), kTimeout);  // on a new connection
  ASSERT_TRUE(later.ok()) << later.status().to_string();
}

TEST_F(PostgresCoordinatorTest, RejectsBadInputWithoutWritingAnything) {
  auto pg = connect("bad_input");
  ASSERT_NE(pg, nullptr);
  auto code = [](const StatusOr<Grant>& g) { return g.status().code(); };
  EXPECT_EQ(code(pg->heartbeat("", report("a", 4), kTimeout)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(pg->heartbeat("k", report("", 4), kTimeout)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(pg->heartbeat("k", report("a", 4, 0, 0, Nanos{0}), kTimeout)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(pg->heartbeat("k", report("a", 4), Nanos{0})), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(pg->heartbeat(std::string("k\0x", 3), report("a", 4), kTimeout)),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(pg->heartbeat("k", report("\xff\xfe", 4), kTimeout)),  // not UTF-8
            StatusCode::kInvalidArgument);
  EXPECT_EQ(code(pg->heartbeat("k\xe2\x82", report("a", 4), kTimeout)),  // cut short
            StatusCode::kInvalidArgument);
  EXPECT_EQ(pg->leave("", "a", 0, kTimeout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pg->leave("k", "", 0, kTimeout).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pg->leave("k", "a", 0, Nanos{0}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(pg->leave("k", "absent", 0, kTimeout).ok());
  RawConn raw(server_->conninfo());
  ASSERT_TRUE(raw.ok()) << raw.error();
  EXPECT_EQ(raw.value("SELECT count(*) FROM bad_input_nodes"), "0");
  EXPECT_EQ(raw.value("SELECT count(*) FROM bad_input_keys"), "0");
  // The connection is still fine.
  EXPECT_TRUE(pg->heartbeat("k", report("a", 4), kTimeout).ok());

  for (const char* prefix : {"x; drop table", "", "Upper", "1abc", "quote'"}) {
    auto bad = PostgresCoordinator::connect(options(prefix), {});
    ASSERT_FALSE(bad.ok()) << prefix;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find("table_prefix"), std::string::npos);
  }
  PostgresOptions unparsable = options("bad_input");
  unparsable.conninfo = "host=127.0.0.1 port";
  auto bad = PostgresCoordinator::connect(unparsable, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("conninfo"), std::string::npos);

  PostgresOptions nobody = options("bad_input");
  nobody.conninfo = "host=127.0.0.1 port=" + std::to_string(testing::free_port()) +
                    " user=postgres dbname=postgres connect_timeout=2";
  auto unreachable = PostgresCoordinator::connect(nobody, {});
  ASSERT_FALSE(unreachable.ok());
  EXPECT_EQ(unreachable.status().code(), StatusCode::kUnavailable)
      << unreachable.status().to_string();
}

TEST_F(PostgresCoordinatorTest, AServerThatStopsYieldsUnavailableNotAHang) {
  testing::PostgresServer own;
  const Status started = own.start();
  ASSERT_TRUE(started.ok()) << started.to_string();
  PostgresOptions o;
  o.conninfo = own.conninfo();
  auto c = PostgresCoordinator::connect(o, {});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  PostgresCoordinator& pg = *c.value();
  ASSERT_TRUE(pg.heartbeat("k", report("a", 4), kTimeout).ok());

  own.stop();
  const SteadyClock& clock = SteadyClock::instance();
  const Nanos start = clock.now();
  auto g = pg.heartbeat("k", report("a", 4), seconds(2));
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kUnavailable) << g.status().to_string();
  // The next call tries to reconnect and is refused.
  auto again = pg.heartbeat("k", report("a", 4), seconds(2));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable) << again.status().to_string();
  EXPECT_EQ(pg.leave("k", "a", 0, seconds(2)).code(), StatusCode::kUnavailable);
  EXPECT_LT(clock.now() - start, seconds(3));
}

}  // namespace
}  // namespace sluice
