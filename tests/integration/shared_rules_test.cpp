// Shared rules (sluice/backends/shared_rules.h) on memory, a real Redis, a real PostgreSQL and a
// real etcd under one typed suite: what every backend must do alike (values round-trip byte for
// byte, deadlines on the backend's clock, entries dropped at their deadline, the key bound counted
// atomically, bad input named); then the server's mirror of one scope (server/shared_rule_mirror.h)
// over two servers' worth of mirrors: a write through one reaches the other within its interval, a
// coordinator away keeps the last copy, and the mirror may be ended from inside its own answer.
#include "server/shared_rule_mirror.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "sluice/backends/shared_rules.h"
#include "sluice/testing/servers.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Nanos kTimeout = seconds(5);

struct MemoryBackend {
  // One table per name, as one server holds one (two "connections" to it are the same object);
  // a suite's start is a new server, with none.
  static std::map<std::string, std::shared_ptr<SharedRules>>& tables() {
    static std::map<std::string, std::shared_ptr<SharedRules>> t;
    return t;
  }
  struct Server {
    Status start() {
      tables().clear();
      return {};
    }
    void stop() { tables().clear(); }
  };
  static std::shared_ptr<SharedRules> make(const Server& /*server*/, const std::string& name) {
    static SteadyClock clock;
    std::shared_ptr<SharedRules>& t = tables()[name];
    if (t == nullptr) t = memory_shared_rules(clock);
    return t;
  }
};

struct RedisBackend {
  using Server = testing::RedisServer;
  static std::shared_ptr<SharedRules> make(const Server& server, const std::string& name) {
    RedisOptions o = redis_shared_rules_options();
    o.port = server.port();
    o.key_prefix = name + ":rules:";
    auto r = redis_shared_rules(o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r.value()) : nullptr;
  }
};

struct PostgresBackend {
  using Server = testing::PostgresServer;
  static std::shared_ptr<SharedRules> make(const Server& server, const std::string& name) {
    PostgresOptions o = postgres_shared_rules_options();
    o.conninfo = server.conninfo();
    o.table_prefix = name + "_rules";
    auto r = postgres_shared_rules(o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r.value()) : nullptr;
  }
};

struct EtcdBackend {
  using Server = testing::EtcdCluster;
  static std::shared_ptr<SharedRules> make(const Server& server, const std::string& name) {
    EtcdOptions o = etcd_shared_rules_options();
    o.endpoints = server.endpoints();
    o.key_prefix = name + "/rules/";
    auto r = etcd_shared_rules(o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r.value()) : nullptr;
  }
};

template <typename Backend>
class SharedRulesBackends : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = std::make_unique<typename Backend::Server>();
    status_ = server_->start();
  }
  static void TearDownTestSuite() {
    server_->stop();
    server_.reset();
  }
  void SetUp() override { ASSERT_TRUE(status_.ok()) << status_.to_string(); }

  // A fresh table (its own key prefix or table) per test.
  std::shared_ptr<SharedRules> make() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "t";
    for (const char c : std::string(info->name()))
      name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name.size() > 40) name.resize(40);
    return Backend::make(*server_, name);
  }

  static std::unique_ptr<typename Backend::Server> server_;
  static Status status_;
};
template <typename Backend>
std::unique_ptr<typename Backend::Server> SharedRulesBackends<Backend>::server_;
template <typename Backend>
Status SharedRulesBackends<Backend>::status_;

struct BackendName {
  template <typename Backend>
  static std::string GetName(int) {
    if (std::is_same_v<Backend, MemoryBackend>) return "Memory";
    if (std::is_same_v<Backend, EtcdBackend>) return "Etcd";
    return std::is_same_v<Backend, RedisBackend> ? "Redis" : "Postgres";
  }
};
#if defined(__SANITIZE_THREAD__)  // gRPC is not built with ThreadSanitizer (scripts/test.sh)
using Backends = ::testing::Types<MemoryBackend, RedisBackend, PostgresBackend>;
#else
using Backends = ::testing::Types<MemoryBackend, RedisBackend, PostgresBackend, EtcdBackend>;
#endif
TYPED_TEST_SUITE(SharedRulesBackends, Backends, BackendName);

std::vector<SharedRule> listed(SharedRules& r, std::string_view scope) {
  auto got = r.list(scope, kTimeout);
  EXPECT_TRUE(got.ok()) << got.status().to_string();
  return got.ok() ? got.value() : std::vector<SharedRule>{};
}

TYPED_TEST(SharedRulesBackends, ValuesRoundTripByteForByteInKeyOrderPerScope) {
  auto r = this->make();
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(listed(*r, "main").empty());
  const std::string odd = "{\"a\": \"x y\\nz\"}\n 1 0 \xc3\xa9 '; DROP TABLE x; --";
  ASSERT_TRUE(r->put("main", "b/2", odd, false, Nanos{0}, false, 10, kTimeout).ok());
  ASSERT_TRUE(r->put("main", "a/1", "", false, Nanos{0}, false, 10, kTimeout).ok());
  ASSERT_TRUE(r->put("other", "a/1", "elsewhere", false, Nanos{0}, false, 10, kTimeout).ok());
  const auto got = listed(*r, "main");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].key, "a/1");
  EXPECT_EQ(got[0].value, "");
  EXPECT_EQ(got[1].key, "b/2");
  EXPECT_EQ(got[1].value, odd);
  EXPECT_FALSE(got[1].has_deadline);
  EXPECT_EQ(got[1].left, Nanos{0});
  // A put replaces; an erase removes, and erasing nothing is fine.
  ASSERT_TRUE(r->put("main", "a/1", "second", false, Nanos{0}, false, 10, kTimeout).ok());
  ASSERT_TRUE(r->erase("main", "b/2", kTimeout).ok());
  ASSERT_TRUE(r->erase("main", "never", kTimeout).ok());
  const auto after = listed(*r, "main");
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].value, "second");
  ASSERT_EQ(listed(*r, "other").size(), 1u);
}

TYPED_TEST(SharedRulesBackends, DeadlinesAreTheTimeLeftOnTheBackendsClock) {
  auto r = this->make();
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->put("s", "keep", "v", true, seconds(60), false, 10, kTimeout).ok());
  ASSERT_TRUE(r->put("s", "drop", "v", true, seconds(60), true, 10, kTimeout).ok());
  const auto got = listed(*r, "s");
  ASSERT_EQ(got.size(), 2u);
  for (const SharedRule& e : got) {
    EXPECT_TRUE(e.has_deadline);
    EXPECT_GT(e.left, seconds(55)) << e.key;
    EXPECT_LE(e.left, seconds(60)) << e.key;
  }
  EXPECT_TRUE(got[0].drop_at_deadline);  // "drop"
  EXPECT_FALSE(got[1].drop_at_deadline);
}

TYPED_TEST(SharedRulesBackends, AnEntryPutToDropAtItsDeadlineIsGoneOnceItPasses) {
  auto r = this->make();
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->put("s", "drop", "v", true, milliseconds(150), true, 10, kTimeout).ok());
  ASSERT_TRUE(r->put("s", "keep", "v", true, milliseconds(150), false, 10, kTimeout).ok());
  ASSERT_EQ(listed(*r, "s").size(), 2u);
  std::this_thread::sleep_for(milliseconds(400));
  const auto got = listed(*r, "s");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, "keep");
  EXPECT_TRUE(got[0].has_deadline);
  EXPECT_LT(got[0].left, Nanos{0});  // past, and said so
}

TYPED_TEST(SharedRulesBackends, ANewKeyPastTheBoundIsRefusedAndAKeyPastItsDeadlineMakesRoom) {
  auto r = this->make();
  ASSERT_NE(r, nullptr);
  ASSERT_TRUE(r->put("s", "a", "1", false, Nanos{0}, false, 3, kTimeout).ok());
  ASSERT_TRUE(r->put("s", "b", "1", false, Nanos{0}, false, 3, kTimeout).ok());
  ASSERT_TRUE(r->put("s", "c", "1", true, milliseconds(150), true, 3, kTimeout).ok());
  const Status full = r->put("s", "d", "1", false, Nanos{0}, false, 3, kTimeout);
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition) << full.to_string();
  EXPECT_NE(full.message().find("holds 3 keys"), std::string::npos) << full.message();
  // A key it holds may change at the bound.
  EXPECT_TRUE(r->put("s", "a", "2", false, Nanos{0}, false, 3, kTimeout).ok());
  // Another scope has its own bound.
  EXPECT_TRUE(r->put("t", "d", "1", false, Nanos{0}, false, 3, kTimeout).ok());
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_TRUE(r->put("s", "d", "1", false, Nanos{0}, false, 3, kTimeout).ok());
  EXPECT_EQ(listed(*r, "s").size(), 3u);
}

TYPED_TEST(SharedRulesBackends, ConcurrentNewKeysNeverPassTheBound) {
  auto a = this->make();
  auto b = this->make();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::atomic<int> written{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      SharedRules& r = t % 2 == 0 ? *a : *b;
      for (int i = 0; i < 10; ++i)
        if (r.put("race", std::to_string(t) + "/" + std::to_string(i), "v", false, Nanos{0}, false,
                  17, kTimeout)
                .ok())
          ++written;
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(written.load(), 17);
  EXPECT_EQ(listed(*a, "race").size(), 17u);
}

TYPED_TEST(SharedRulesBackends, BadInputIsNamed) {
  auto r = this->make();
  ASSERT_NE(r, nullptr);
  const auto message = [](const Status& s) { return s.message(); };
  EXPECT_EQ(message(r->put("", "k", "v", false, Nanos{0}, false, 9, kTimeout)).rfind("scope:", 0),
            0u);
  EXPECT_EQ(message(r->put("s", "", "v", false, Nanos{0}, false, 9, kTimeout)).rfind("key:", 0),
            0u);
  EXPECT_EQ(message(r->put("s", std::string(513, 'k'), "v", false, Nanos{0}, false, 9, kTimeout))
                .rfind("key:", 0),
            0u);
  EXPECT_EQ(message(r->put("s", "k", std::string(64 * 1024 + 1, 'v'), false, Nanos{0}, false, 9,
                           kTimeout))
                .rfind("value:", 0),
            0u);
  EXPECT_EQ(r->list(std::string(257, 's'), kTimeout).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(listed(*r, "s").empty());
}

// ---- the mirror ----

using server::SharedRuleMirror;

// A table that can be taken away: every call fails kUnavailable while `away`.
class Flaky final : public SharedRules {
 public:
  explicit Flaky(std::shared_ptr<SharedRules> inner) : inner_(std::move(inner)) {}
  std::atomic<bool> away{false};

  StatusOr<std::vector<SharedRule>> list(std::string_view scope, Nanos timeout) noexcept override {
    if (away) return Status(StatusCode::kUnavailable, "flaky: away");
    return inner_->list(scope, timeout);
  }
  Status put(std::string_view scope, std::string_view key, std::string_view value,
             bool has_deadline, Nanos left, bool drop, std::size_t max_keys,
             Nanos timeout) noexcept override {
    if (away) return Status(StatusCode::kUnavailable, "flaky: away");
    return inner_->put(scope, key, value, has_deadline, left, drop, max_keys, timeout);
  }
  Status erase(std::string_view scope, std::string_view key, Nanos timeout) noexcept override {
    if (away) return Status(StatusCode::kUnavailable, "flaky: away");
    return inner_->erase(scope, key, timeout);
  }
  std::string_view backend() const noexcept override { return "flaky"; }

 private:
  std::shared_ptr<SharedRules> inner_;
};

// What a mirror told its owner, as the owner would keep it.
struct Seen {
  std::mutex mu;
  std::map<std::string, SharedRuleMirror::Entry> now;
  int calls = 0;
  SharedRuleMirror::Changed changed() {
    return [this](const std::string& key, const SharedRuleMirror::Entry* e) {
      const std::lock_guard lock(mu);
      ++calls;
      if (e == nullptr)
        now.erase(key);
      else
        now[key] = *e;
    };
  }
  std::optional<SharedRuleMirror::Entry> get(const std::string& key) {
    const std::lock_guard lock(mu);
    const auto it = now.find(key);
    if (it == now.end()) return std::nullopt;
    return it->second;
  }
};

Status wait_done(const std::function<void(SharedRuleMirror::Done)>& start) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  start([p](Status s) { p->set_value(std::move(s)); });
  return f.get();
}

bool eventually(const std::function<bool()>& done, Nanos limit = seconds(5)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

TYPED_TEST(SharedRulesBackends, AMirrorSeesAnotherServersWritesWithinItsIntervalDeadlineIncluded) {
  std::shared_ptr<SharedRules> table = this->make();
  ASSERT_NE(table, nullptr);
  // Already there before either mirror starts: the first read applies it.
  ASSERT_TRUE(table->put("main", "app/early", "{}", false, Nanos{0}, false, 10, kTimeout).ok());
  Seen one, two;
  SharedRuleMirror a(table, "main", milliseconds(50), kTimeout, one.changed());
  SharedRuleMirror b(table, "main", milliseconds(50), kTimeout, two.changed());
  EXPECT_TRUE(one.get("app/early"));
  EXPECT_TRUE(two.get("app/early"));
  const auto unix_ms = [] {
    return std::chrono::duration_cast<milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  SharedRuleMirror::Entry e{"{\"ratio\":0.5}", true, unix_ms() + 60'000, true};
  ASSERT_TRUE(wait_done([&](auto done) { a.put_async("app/x", e, 10, std::move(done)); }).ok());
  // The writer's owner heard of it before the answer; the other within its interval.
  ASSERT_TRUE(one.get("app/x"));
  ASSERT_TRUE(eventually([&] { return two.get("app/x").has_value(); }));
  const SharedRuleMirror::Entry there = *two.get("app/x");
  EXPECT_EQ(there.value, e.value);
  EXPECT_TRUE(there.drop_at_deadline);
  EXPECT_LT(std::llabs(there.deadline_unix_ms - e.deadline_unix_ms), 1000);
  EXPECT_EQ(b.count("app/"), 2u);
  // Read again and again, an unchanged entry is not told again.
  const int calls = two.calls;
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(two.calls, calls);
  ASSERT_TRUE(wait_done([&](auto done) { b.erase_async("app/x", std::move(done)); }).ok());
  ASSERT_TRUE(eventually([&] { return !one.get("app/x").has_value(); }));
  EXPECT_FALSE(a.get("app/x"));
}

TYPED_TEST(SharedRulesBackends, ACoordinatorAwayKeepsTheLastCopyAndAnswersWritesWithItsError) {
  std::shared_ptr<SharedRules> table = this->make();
  ASSERT_NE(table, nullptr);
  auto flaky = std::make_shared<Flaky>(table);
  ASSERT_TRUE(table->put("main", "app/x", "{}", false, Nanos{0}, false, 10, kTimeout).ok());
  Seen seen;
  SharedRuleMirror m(flaky, "main", milliseconds(20), kTimeout, seen.changed());
  ASSERT_TRUE(seen.get("app/x"));
  flaky->away = true;
  ASSERT_TRUE(eventually([&] { return m.health().failures >= 3; }));
  EXPECT_TRUE(seen.get("app/x"));  // kept
  EXPECT_NE(m.health().last_error.find("away"), std::string::npos);
  const Status s = wait_done([&](auto done) {
    m.put_async("app/y", SharedRuleMirror::Entry{"{}", false, 0, false}, 10, std::move(done));
  });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_FALSE(seen.get("app/y"));
  flaky->away = false;
  ASSERT_TRUE(eventually([&] { return m.health().last_error.empty(); }));
  EXPECT_GE(m.health().reads, 2u);
}

TYPED_TEST(SharedRulesBackends, AMirrorEndedFromInsideItsOwnAnswerStopsCleanly) {
  std::shared_ptr<SharedRules> table = this->make();
  ASSERT_NE(table, nullptr);
  Seen seen;
  auto m =
      std::make_unique<SharedRuleMirror>(table, "main", milliseconds(20), kTimeout, seen.changed());
  SharedRuleMirror* raw = m.get();
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  // The answer holds the last reference to the mirror (as a route holds its policy).
  std::shared_ptr<SharedRuleMirror> owner(std::move(m));
  raw->put_async("app/z", SharedRuleMirror::Entry{"{}", false, 0, false}, 10,
                 [owner = std::move(owner), p](Status s) mutable {
                   owner.reset();
                   p->set_value(std::move(s));
                 });
  ASSERT_EQ(f.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  EXPECT_TRUE(seen.get("app/z"));
}

}  // namespace
}  // namespace sluice
