// Decisions that finish later, under load, in the engine alone (so the sanitizer builds, which
// leave the transports out, run them): a kind whose every check defers to its own loop, called
// from many threads through Check and CheckMany, reloaded in place and retired mid-flight.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/engine.h"
#include "server/registry.h"
#include "sluice/config/config.h"

namespace sluice::server {
namespace {

struct LaterSpec final : PolicyBody {
  std::uint64_t limit = 1;
};

// Each key may spend `limit` hits in all; every check is decided by the policy's loop.
class LaterPolicy final : public Policy, public RateFamily {
 public:
  LaterPolicy(const BuildContext& c, std::uint64_t limit)
      : Policy(c.name, "later", c.spec.rate), limit_(limit) {}
  ~LaterPolicy() override { retire(); }

  void start(const Clock& clock) {
    start_loop(clock, [this](Nanos now) {
      std::vector<Pending> batch;
      {
        const std::lock_guard lock(mu_);
        batch.swap(pending_);
      }
      for (Pending& p : batch) p.done(check(p.key, p.hits, now));
      return now + std::chrono::milliseconds(1);
    });
  }

  RateFamily* rate_family() noexcept override { return this; }

  RateDecision check(std::string_view key, std::uint64_t hits, Nanos /*now*/) override {
    const std::lock_guard lock(mu_);
    std::uint64_t& spent = spent_[std::string(key)];
    RateDecision d;
    d.limit = limit_.load();
    d.allowed = spent + hits <= d.limit;
    if (d.allowed) spent += hits;
    d.remaining = d.limit - std::min(d.limit, spent);
    d.retry_after = d.allowed ? Nanos{0} : Nanos::max();
    return d;
  }
  Decided<RateDecision> check_or_defer(std::string_view key, std::uint64_t hits, Nanos /*now*/,
                                       Deferral<RateDecision>& later) override {
    {
      const std::lock_guard lock(mu_);
      // Retired: on_retire() already answered what it held; nothing would answer this one.
      if (retired()) return Status(StatusCode::kUnavailable, "retired");
      pending_.push_back(Pending{std::string(key), hits, later.defer()});
    }
    wake_loops();
    return std::nullopt;
  }
  RateDecision peek(std::string_view /*key*/, std::uint64_t /*hits*/,
                    Nanos /*now*/) const override {
    return {};
  }
  void refund(std::string_view key, std::uint64_t hits, Nanos /*now*/) override {
    const std::lock_guard lock(mu_);
    spent_[std::string(key)] -= hits;
  }
  Rejection refusal(std::string_view /*key*/, const RateDecision& /*d*/) const override {
    return {};
  }
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const std::uint64_t limit = c.spec.as<LaterSpec>()->limit;
    return Reconfiguration([this, limit] { limit_.store(limit); });
  }

  [[nodiscard]] std::uint64_t spent(const std::string& key) const {
    const std::lock_guard lock(mu_);
    auto it = spent_.find(key);
    return it == spent_.end() ? 0 : it->second;
  }

 protected:
  void describe(nlohmann::json& /*j*/, PolicyInfo& /*info*/) const override {}
  void metrics(std::vector<prometheus::MetricFamily>& /*out*/) const override {}
  void on_retire() noexcept override {
    std::vector<Pending> left;
    {
      const std::lock_guard lock(mu_);
      left.swap(pending_);
    }
    for (Pending& p : left) p.done(Status(StatusCode::kUnavailable, "retired"));
  }

 private:
  struct Pending {
    std::string key;
    std::uint64_t hits;
    Completion<RateDecision> done;
  };
  std::atomic<std::uint64_t> limit_;
  mutable std::mutex mu_;
  std::map<std::string, std::uint64_t> spent_;
  std::vector<Pending> pending_;
};

PolicyKind later_kind() {
  const auto parse = [](const std::string&, ConfigSection& s, PolicySpec&) {
    s.keys({"kind", "limit"});
    auto body = std::make_shared<LaterSpec>();
    if (auto v = s.u32("limit", 1)) body->limit = *v;
    return std::shared_ptr<const PolicyBody>(body);
  };
  const auto build = [](const BuildContext& c) -> StatusOr<std::shared_ptr<Policy>> {
    auto p = std::make_shared<LaterPolicy>(c, c.spec.as<LaterSpec>()->limit);
    p->start(c.clock);
    return std::shared_ptr<Policy>(std::move(p));
  };
  return PolicyKind("later", PolicyKind::kRate, parse, build);
}

class DeferredKind : public ::testing::Test {
 protected:
  void SetUp() override {
    kinds_ = PolicyRegistry::builtin();
    ASSERT_TRUE(kinds_.add(later_kind()));
    auto e = Engine::create(config("100"), SteadyClock::instance(), kinds_);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    engine_ = std::move(e.value());
  }
  SluiceConfig config(const std::string& limit) {
    ConfigLoad l = load_config("policies:\n  a:\n    kind: later\n    limit: " + limit +
                                   "\n  b:\n    kind: later\n    limit: " + limit + "\n",
                               kinds_);
    EXPECT_TRUE(l.config);
    return *l.config;
  }
  std::shared_ptr<LaterPolicy> policy(const std::string& name) {
    for (const auto& p : *engine_->policies_of("later"))
      if (p->name() == name) return std::static_pointer_cast<LaterPolicy>(p);
    return nullptr;
  }

  PolicyRegistry kinds_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(DeferredKind, ManyThreadsOfDeferredChecksAdmitExactlyTheLimit) {
  std::atomic<int> allowed{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 40; ++i) {
        auto d = engine_->check(CheckCall{"a", "k", 1});
        if (!d.ok())
          errors.fetch_add(1);
        else if (d.value().allowed)
          allowed.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(allowed.load(), 100);  // 320 asked, the limit is 100
  EXPECT_EQ(policy("a")->spent("k"), 100u);
}

TEST_F(DeferredKind, ConcurrentCheckManyIsAllOrNothing) {
  // Each CheckMany spends 1 on "x" of a and 2 on "y" of b; b's "y" runs out first (50 calls),
  // so a's "x" must have spent exactly as many as the calls allowed: refunds are exact.
  std::atomic<int> allowed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      const std::vector<CheckCall> calls = {{"a", "x", 1}, {"b", "y", 2}};
      for (int i = 0; i < 20; ++i) {
        auto r = engine_->check_many(calls);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        if (r.value().allowed)
          allowed.fetch_add(1);
        else
          EXPECT_EQ(r.value().denied_index, 1);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(allowed.load(), 50);
  EXPECT_EQ(policy("a")->spent("x"), 50u);
  EXPECT_EQ(policy("b")->spent("y"), 100u);
}

TEST_F(DeferredKind, ReloadsInPlaceAndRetiresUnderLoad) {
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto d = engine_->check(CheckCall{"a", "k" + std::to_string(answered.load() % 7), 1});
        // An error is only UNAVAILABLE (retired) or NOT_FOUND (removed meanwhile).
        if (!d.ok()) {
          EXPECT_TRUE(d.status().code() == StatusCode::kUnavailable ||
                      d.status().code() == StatusCode::kNotFound)
              << d.status().to_string();
        }
        answered.fetch_add(1);
      }
    });
  const auto before = policy("a");
  for (int i = 0; i < 20; ++i) {
    auto r = engine_->reload(config(std::to_string(200 + i)));  // in place: the same policy
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().reconfigured.size(), 2u);
  }
  EXPECT_EQ(policy("a"), before);
  // Removing it retires it with checks in flight: each is answered, none hangs.
  ConfigLoad gone = load_config("policies:\n  b:\n    kind: later\n", kinds_);
  ASSERT_TRUE(gone.config);
  ASSERT_TRUE(engine_->reload(*gone.config).ok());
  EXPECT_TRUE(before->retired());
  const int at = answered.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_GT(answered.load(), at);  // calls still return (NOT_FOUND) after the retire
}

}  // namespace
}  // namespace sluice::server
