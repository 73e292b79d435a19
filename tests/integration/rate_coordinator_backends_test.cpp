// The Redis and PostgreSQL rate coordinators under one typed suite, for what both must do alike
// whatever they store in: regions racing through two coordinators on one server together get
// exactly the limit, and health answers while the server does and is kUnavailable where no
// server listens. Each backend's storage, clock, state loss and timeouts are in its own test
// (redis_rate_coordinator_test.cpp, postgres_rate_coordinator_test.cpp); replies equal step by
// step to the memory coordinator's are in rate_coordinator_conformance_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "integration/server_clients.h"
#include "sluice/backends/postgres_rate_coordinator.h"
#include "sluice/backends/redis_rate_coordinator.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(5);
// A window no test outlasts (a window boundary mid-test would change the counts).
constexpr Nanos kLong = std::chrono::hours(24 * 365 * 10);

// A backend as the suite uses it: its server, a coordinator on the key space `name` (its origin
// long past when `settled`: a first window not spent), and one where no server listens.
struct RedisBackend {
  using Server = testing::RedisServer;
  static constexpr std::uint64_t kRaceLimit = 600;

  static StatusOr<std::unique_ptr<RateCoordinator>> connect(const Server& server,
                                                            const std::string& name, bool settled) {
    RedisOptions o = RedisRateCoordinator::default_options();
    o.port = server.port();
    o.key_prefix = name + ":fed:";
    if (settled) {
      EXPECT_TRUE(test_clients::settle_federation(server.port(), o.key_prefix));
    }
    auto c = RedisRateCoordinator::connect(o);
    if (!c.ok()) return c.status();
    return std::unique_ptr<RateCoordinator>(std::move(c.value()));
  }
  static std::unique_ptr<RateCoordinator> nowhere() {
    RedisOptions o = RedisRateCoordinator::default_options();
    o.port = testing::free_port();
    auto c = RedisRateCoordinator::open(o);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c.value()) : nullptr;
  }
};

struct PostgresBackend {
  using Server = testing::PostgresServer;
  static constexpr std::uint64_t kRaceLimit = 300;

  static StatusOr<std::unique_ptr<RateCoordinator>> connect(const Server& server,
                                                            const std::string& name, bool settled) {
    PostgresOptions o = PostgresRateCoordinator::default_options();
    o.conninfo = server.conninfo();
    o.table_prefix = name + "_fed";
    auto c = PostgresRateCoordinator::connect(o);
    if (!c.ok()) return c.status();
    if (settled) {
      test_clients::RawConn raw(server.conninfo());
      raw.value("INSERT INTO " + o.table_prefix +
                "_origin VALUES (1, 0, "
                "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)) ON CONFLICT DO NOTHING");
    }
    return std::unique_ptr<RateCoordinator>(std::move(c.value()));
  }
  static std::unique_ptr<RateCoordinator> nowhere() {
    PostgresOptions o = PostgresRateCoordinator::default_options();
    o.conninfo = "host=127.0.0.1 port=" + std::to_string(testing::free_port()) + " user=postgres";
    auto c = PostgresRateCoordinator::open(o);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c.value()) : nullptr;
  }
};

template <typename Backend>
class RateCoordinatorBackends : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_.start(); }
  static void TearDownTestSuite() { server_.stop(); }
  void SetUp() override { ASSERT_TRUE(server_.ok()) << server_.status().to_string(); }

  static std::unique_ptr<RateCoordinator> connect(const std::string& name, bool settled = false) {
    auto c = Backend::connect(*server_.operator->(), name, settled);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c.value()) : nullptr;
  }

  static testing::SuiteServer<typename Backend::Server> server_;
};
template <typename Backend>
testing::SuiteServer<typename Backend::Server> RateCoordinatorBackends<Backend>::server_;

struct BackendName {
  template <typename Backend>
  static std::string GetName(int) {
    return std::is_same_v<Backend, RedisBackend> ? "Redis" : "Postgres";
  }
};
using Backends = ::testing::Types<RedisBackend, PostgresBackend>;
TYPED_TEST_SUITE(RateCoordinatorBackends, Backends, BackendName);

LeaseRequest request(std::string region, std::uint64_t limit, Nanos period, std::uint64_t want) {
  LeaseRequest r;
  r.region = std::move(region);
  r.spec = {limit, period};
  r.want = want;
  return r;
}

TYPED_TEST(RateCoordinatorBackends, ConcurrentRegionsTogetherGetExactlyTheLimit) {
  constexpr std::uint64_t kLimit = TypeParam::kRaceLimit;
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<RateCoordinator>> coordinators;
  coordinators.push_back(this->connect("race", true));
  coordinators.push_back(this->connect("race"));
  ASSERT_NE(coordinators[0], nullptr);
  ASSERT_NE(coordinators[1], nullptr);
  std::atomic<std::uint64_t> granted{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      RateCoordinator& c = *coordinators[static_cast<std::size_t>(t % 2)];
      const LeaseRequest req = request("region-" + std::to_string(t), kLimit, kLong, 7);
      for (;;) {
        const auto r = c.lease("race", req, kTimeout);
        if (!r.ok()) {
          ++failures;
          return;
        }
        if (r.value().status != LeaseStatus::kGranted) return;
        granted += r.value().granted;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(granted.load(), kLimit);  // never more, and every unit went out
}

// lease_many() (pipelined on Redis, one lease after another on PostgreSQL) replies to each call
// as lease() would, in order, and a bad call fails alone.
TYPED_TEST(RateCoordinatorBackends, LeaseManyRepliesAsOneLeaseAfterAnother) {
  auto many = this->connect("many", true);
  auto one = this->connect("one", true);
  ASSERT_NE(many, nullptr);
  ASSERT_NE(one, nullptr);
  const std::vector<std::string> keys = {"a", "b", "a", "c", "b", "a", "a"};
  std::vector<LeaseRequest> reqs;
  for (std::size_t i = 0; i < keys.size(); ++i)
    reqs.push_back(request(i % 2 == 0 ? "eu" : "us", 40, kLong, 5 + 4 * i));
  reqs[3].region.clear();  // refused alone, naming the field
  for (int round = 0; round < 3; ++round) {
    std::vector<LeaseCall> calls;
    for (std::size_t i = 0; i < keys.size(); ++i) calls.push_back(LeaseCall{keys[i], &reqs[i]});
    const std::vector<StatusOr<LeaseReply>> got = many->lease_many(calls, kTimeout);
    ASSERT_EQ(got.size(), keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const StatusOr<LeaseReply> want = one->lease(keys[i], reqs[i], kTimeout);
      ASSERT_EQ(got[i].ok(), want.ok()) << "round " << round << " call " << i;
      if (!want.ok()) {
        EXPECT_EQ(got[i].status().code(), StatusCode::kInvalidArgument);
        EXPECT_NE(got[i].status().message().find("region"), std::string::npos);
        continue;
      }
      LeaseReply a = got[i].value(), b = want.value();
      a.coordinator_now = b.coordinator_now = Nanos{0};  // each server call reads its clock
      EXPECT_EQ(a, b) << "round " << round << " call " << i;
    }
  }
  // By now every key's budget is spent: the replies said so alike.
  EXPECT_EQ(one->lease("a", reqs[0], kTimeout).value().status, LeaseStatus::kSpent);
  // `keys[i]` leased with `reqs[i]` in one lease_many() call: each reply as lease()'s on the other
  // coordinator, in order (the replies are returned).
  const auto as_one_after_another = [&](const std::vector<std::string>& keys,
                                        const std::vector<LeaseRequest>& reqs) {
    std::vector<LeaseCall> calls;
    for (std::size_t i = 0; i < keys.size(); ++i) calls.push_back(LeaseCall{keys[i], &reqs[i]});
    std::vector<StatusOr<LeaseReply>> got = many->lease_many(calls, kTimeout);
    EXPECT_EQ(got.size(), calls.size());
    for (std::size_t i = 0; i < calls.size() && i < got.size(); ++i) {
      const StatusOr<LeaseReply> want = one->lease(keys[i], reqs[i], kTimeout);
      EXPECT_TRUE(got[i].ok() && want.ok()) << "call " << i;
      if (!got[i].ok() || !want.ok()) continue;
      LeaseReply a = got[i].value(), b = want.value();
      a.coordinator_now = b.coordinator_now = Nanos{0};
      EXPECT_EQ(a, b) << "call " << i;
    }
    return got;
  };
  // More calls than one script call takes on Redis (64), keys repeated within and across the
  // script calls, some with a need.
  std::vector<std::string> many_keys;
  std::vector<LeaseRequest> many_reqs;
  for (std::size_t i = 0; i < 150; ++i) {
    many_keys.push_back("k" + std::to_string(i % 37));
    LeaseRequest r = request(i % 3 == 0 ? "eu" : "us", 60, kLong, 3 + i % 9);
    r.need = i % 4 == 0 ? r.want : 0;
    many_reqs.push_back(std::move(r));
  }
  (void)as_one_after_another(many_keys, many_reqs);
  // One region and budget throughout (one script call on Redis): keys without a ledger that
  // share a want and need, a key twice, and one whose ledger holds another budget.
  const LeaseRequest other = request("eu", 61, kLong, 4);
  ASSERT_TRUE(many->lease("other", other, kTimeout).ok());
  ASSERT_TRUE(one->lease("other", other, kTimeout).ok());
  std::vector<std::string> shared_keys;
  std::vector<LeaseRequest> shared_reqs;
  for (std::size_t i = 0; i < 40; ++i) {
    shared_keys.push_back(i == 7 || i == 30 ? "twice"
                          : i == 12         ? "other"
                                            : "fresh" + std::to_string(i));
    LeaseRequest r = request("eu", 500, kLong, i % 5 == 0 ? 9 : 7);
    r.need = i % 10 == 0 ? 2 : 0;
    shared_reqs.push_back(std::move(r));
  }
  const std::vector<StatusOr<LeaseReply>> shared = as_one_after_another(shared_keys, shared_reqs);
  ASSERT_EQ(shared.size(), shared_keys.size());
  ASSERT_TRUE(shared[12].ok() && shared[30].ok());
  EXPECT_EQ(shared[12].value().status, LeaseStatus::kSpecMismatch);
  EXPECT_EQ(shared[12].value().spec.limit, 61u);          // the ledger's budget
  EXPECT_EQ(shared[30].value().remaining, 500u - 7 - 9);  // its two leases
}

TYPED_TEST(RateCoordinatorBackends,
           HealthAnswersWhenTheServerDoesAndIsUnavailableWhereNoneListens) {
  auto c = this->connect("health", true);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->health(kTimeout).ok());
  auto nowhere = TypeParam::nowhere();
  ASSERT_NE(nowhere, nullptr);
  EXPECT_EQ(nowhere->health(seconds(2)).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sluice
