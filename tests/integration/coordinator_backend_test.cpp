// The coordinator seam: a backend that exists only in this test ("ledger"), with a setting of
// its own, a role set of its own and a check of its own, is read by the loader, refused where it
// serves no role, checked before connecting and connected by the engine, through one
// registration (PolicyRegistry::add_backend) and no other edit.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/coordinators.h"
#include "server/engine.h"
#include "server/registry.h"
#include "sluice/backends/memory_coordinator.h"
#include "sluice/config/config.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;

struct LedgerOptions {
  std::string shelf;
};

// The heartbeats each shelf answered.
struct Shelves {
  std::mutex mu;
  std::map<std::string, int> beats;
  int beats_of(const std::string& shelf) {
    const std::lock_guard lock(mu);
    return beats[shelf];
  }
};

// Member records in a MemoryCoordinator, every heartbeat counted on its shelf.
class LedgerCoordinator final : public ConcurrencyCoordinator {
 public:
  LedgerCoordinator(const Clock& clock, CoordinatorConfig rules, std::string shelf,
                    std::shared_ptr<Shelves> shelves)
      : inner_(clock, rules), shelf_(std::move(shelf)), shelves_(std::move(shelves)) {}
  StatusOr<Grant> heartbeat(std::string_view key, const NodeReport& report,
                            Nanos timeout) noexcept override {
    {
      const std::lock_guard lock(shelves_->mu);
      ++shelves_->beats[shelf_];
    }
    return inner_.heartbeat(key, report, timeout);
  }
  Status leave(std::string_view key, std::string_view node_id, std::uint64_t instance,
               Nanos timeout) noexcept override {
    return inner_.leave(key, node_id, instance, timeout);
  }
  const CoordinatorConfig& config() const noexcept override { return inner_.config(); }
  std::string_view backend() const noexcept override { return "ledger"; }

 private:
  MemoryCoordinator inner_;
  const std::string shelf_;
  const std::shared_ptr<Shelves> shelves_;
};

CoordinatorBackend ledger_backend(std::shared_ptr<Shelves> shelves) {
  CoordinatorBackend b;
  b.name = "ledger";
  b.roles = {CoordinatorRole::kConcurrency};
  b.keys = {"shelf"};
  b.parse = [](ConfigSection& s, CoordinatorSpec& spec) {
    LedgerOptions o;
    if (auto v = s.str("shelf", true)) {
      if (v->empty()) s.error("shelf", "must not be empty");
      o.shelf = *v;
    }
    spec.store = o.shelf;
    spec.options = std::move(o);
  };
  b.connect = [shelves](const std::string&, const CoordinatorSpec& spec, const Clock& clock,
                        std::string&) -> StatusOr<std::unique_ptr<ConcurrencyCoordinator>> {
    return std::unique_ptr<ConcurrencyCoordinator>(std::make_unique<LedgerCoordinator>(
        clock, spec.rules, spec.options_as<LedgerOptions>()->shelf, shelves));
  };
  b.problems = [](const CoordinatorSpec& spec, const std::vector<CoordinatorRole>&) {
    std::vector<std::string> out;
    if (spec.options_as<LedgerOptions>()->shelf == "closed")
      out.push_back("ledger: shelf 'closed' takes no members");
    return out;
  };
  return b;
}

class CoordinatorBackendSeam : public ::testing::Test {
 protected:
  CoordinatorBackendSeam() : kinds_(PolicyRegistry::builtin()) {
    EXPECT_TRUE(kinds_.add_backend(ledger_backend(shelves_)));
  }
  ConfigLoad load(const std::string& yaml) const { return load_config(yaml, kinds_); }
  static std::string error_at(const ConfigLoad& l, const std::string& path) {
    for (const ConfigError& e : l.errors)
      if (e.path == path) return e.message;
    std::string all;
    for (const ConfigError& e : l.errors) all += "\n  " + e.path + ": " + e.message;
    return "no error at " + path + "; errors:" + all;
  }

  std::shared_ptr<Shelves> shelves_ = std::make_shared<Shelves>();
  PolicyRegistry kinds_;
};

TEST_F(CoordinatorBackendSeam, IsReadWithItsOwnSettingAndConnectedByTheEngine) {
  EXPECT_FALSE(kinds_.add_backend(ledger_backend(shelves_))) << "a second backend of one name";
  const ConfigLoad l = load(R"(coordinators:
  books: {kind: ledger, shelf: top, aggregate: min}
policies:
  f: {kind: fleet, coordinator: books, algorithm: fixed, limit: 4, heartbeat: 20ms}
)");
  ASSERT_TRUE(l.config.has_value()) << error_at(l, "?");
  const CoordinatorSpec& books = l.config->coordinators.at("books");
  EXPECT_EQ(books.kind, "ledger");
  ASSERT_NE(books.options_as<LedgerOptions>(), nullptr);
  EXPECT_EQ(books.options_as<LedgerOptions>()->shelf, "top");
  EXPECT_EQ(books.rules.aggregate, Aggregate::kMin) << "the fleet's rules are the loader's";
  EXPECT_TRUE(check_before_connecting(*l.config, kinds_).empty());

  auto e = Engine::create(*l.config, SteadyClock::instance(), kinds_);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (shelves_->beats_of("top") == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_GT(shelves_->beats_of("top"), 0) << "the fleet policy beats through the backend";
  // A beat reaching the backend is not yet its reply applied by the node: until the first
  // grant lands the policy refuses (at no cost), so the test waits for the grant, not a beat.
  bool admitted = false;
  while (!admitted && std::chrono::steady_clock::now() < until) {
    const auto a = engine.admit(AdmitCall{"f", "k"});
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    admitted = a.value().admitted;
    if (!admitted) std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(admitted) << "the grant the backend gave reaches the policy";
  engine.close();
}

TEST_F(CoordinatorBackendSeam, ItsKeysRolesAndChecksAreHeld) {
  const ConfigLoad unknown_key = load(R"(coordinators:
  books: {kind: ledger, shelf: top, colour: red}
policies:
  f: {kind: fleet, coordinator: books}
)");
  EXPECT_NE(error_at(unknown_key, "coordinators.books.colour").find("unknown"), std::string::npos)
      << error_at(unknown_key, "coordinators.books.colour");

  const ConfigLoad missing = load(R"(coordinators:
  books: {kind: ledger}
policies:
  f: {kind: fleet, coordinator: books}
)");
  EXPECT_EQ(error_at(missing, "coordinators.books.shelf"), "is required");

  const ConfigLoad wrong_role = load(R"(coordinators:
  books: {kind: ledger, shelf: top}
policies:
  b: {kind: federated, coordinator: books, limit: 10}
)");
  EXPECT_EQ(error_at(wrong_role, "policies.b.coordinator"),
            "coordinator 'books' is a ledger coordinator, which cannot hold a federated budget "
            "(the rate-budget interface) (name a memory, redis, postgres or etcd coordinator)");

  const ConfigLoad no_such = load(R"(coordinators:
  books: {kind: abacus}
policies:
  f: {kind: fleet, coordinator: books}
)");
  EXPECT_EQ(error_at(no_such, "coordinators.books.kind"),
            "must be one of memory, redis, postgres, etcd, ledger, not 'abacus'");

  const ConfigLoad closed = load(R"(coordinators:
  books: {kind: ledger, shelf: closed}
policies:
  f: {kind: fleet, coordinator: books}
)");
  ASSERT_TRUE(closed.config.has_value());
  const std::vector<ConfigError> before = check_before_connecting(*closed.config, kinds_);
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].path, "coordinators.books");
  EXPECT_EQ(before[0].message, "ledger: shelf 'closed' takes no members");

  // Two coordinators on one shelf are one store: one key may have one member there.
  const ConfigLoad shared = load(R"(coordinators:
  a: {kind: ledger, shelf: s}
  b: {kind: ledger, shelf: s}
policies:
  f: {kind: fleet, coordinator: a, key: k}
  g: {kind: fleet, coordinator: b, key: k}
)");
  EXPECT_NE(error_at(shared, "policies.g.key").find("the same ledger data as coordinator 'a'"),
            std::string::npos)
      << error_at(shared, "policies.g.key");

  // The built-in registry knows no ledger.
  const ConfigLoad builtin = load_config(R"(coordinators:
  books: {kind: ledger, shelf: top}
policies:
  f: {kind: fleet, coordinator: books}
)",
                                         PolicyRegistry::builtin());
  EXPECT_EQ(error_at(builtin, "coordinators.books.kind"),
            "must be one of memory, redis, postgres, etcd, not 'ledger'");
}

}  // namespace
}  // namespace sluice::server
