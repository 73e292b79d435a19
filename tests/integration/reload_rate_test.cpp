// The rate kind in the engine: a reload that changes a rate policy's limit keeps every key's
// state (reconfigured in place), one that changes its period or strategy starts afresh
// (rebuilt); the key cap refuses new keys with a 429 that says why; and a million keys through
// CheckMany are swept by the policy's loop once idle, with no further traffic, giving the memory
// back.
#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "server/engine.h"
#include "server/policy.h"
#include "server/routes.h"
#include "sluice/config/config.h"
#include "support/config_of.h"

namespace sluice::server {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string rate_yaml(const std::string& strategy, int limit, const std::string& period,
                      int max_keys = 1000) {
  return "policies:\n  limited:\n    kind: rate\n    strategy: " + strategy +
         "\n    limit: " + std::to_string(limit) + "\n    period: " + period +
         "\n    max_keys: " + std::to_string(max_keys) + "\n";
}

// The hits `key` has left: a peek of one hit reports what would remain after it.
std::uint64_t remaining(Engine& e, std::string_view key) {
  auto d = e.peek(CheckCall{"limited", key, 1});
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return d.ok() && d.value().allowed ? d.value().remaining + 1 : 0;
}

nlohmann::json state_of(const Engine& e, const std::string& policy) {
  for (const PolicyInfo& p : e.policies())
    if (p.name == policy) return nlohmann::json::parse(p.state_json);
  return {};
}

const char* const kStrategies[] = {"fixed-window", "sliding-window", "gcra"};

TEST(RateReload, ANewLimitKeepsWhatEachKeySpent) {
  for (const char* strategy : kStrategies) {
    ManualClock clock(seconds(1000));
    auto e = Engine::create(config_of(rate_yaml(strategy, 100, "10s")), clock);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    Engine& engine = *e.value();
    ASSERT_TRUE(engine.check(CheckCall{"limited", "alice", 40}).value().allowed);
    ASSERT_TRUE(engine.check(CheckCall{"limited", "bob", 100}).value().allowed);
    auto r = engine.reload(config_of(rate_yaml(strategy, 50, "10s", 5000)));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"limited"}) << strategy;
    EXPECT_TRUE(r.value().changed.empty()) << strategy;
    EXPECT_EQ(remaining(engine, "alice"), 10u) << strategy << ": 40 of 100 spent, now of 50";
    EXPECT_FALSE(engine.check(CheckCall{"limited", "bob", 1}).value().allowed) << strategy;
    EXPECT_EQ(remaining(engine, "carol"), 50u) << strategy;
    const nlohmann::json st = state_of(engine, "limited");
    EXPECT_EQ(st["limit"], 50) << strategy;
    EXPECT_EQ(st["max_keys"], 5000) << strategy;
    EXPECT_EQ(st["keys"], 2) << strategy;
    // Up again: what was spent still counts.
    r = engine.reload(config_of(rate_yaml(strategy, 200, "10s", 5000)));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().reconfigured, std::vector<std::string>{"limited"}) << strategy;
    EXPECT_EQ(remaining(engine, "alice"), 160u) << strategy;
    EXPECT_EQ(remaining(engine, "bob"), 100u) << strategy;
  }
}

TEST(RateReload, ANewPeriodOrStrategyStartsAfresh) {
  for (const char* strategy : kStrategies) {
    ManualClock clock(seconds(1000));
    auto e = Engine::create(config_of(rate_yaml(strategy, 100, "10s")), clock);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    Engine& engine = *e.value();
    ASSERT_TRUE(engine.check(CheckCall{"limited", "alice", 40}).value().allowed);
    auto r = engine.reload(config_of(rate_yaml(strategy, 100, "20s")));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().changed, std::vector<std::string>{"limited"}) << strategy;
    EXPECT_TRUE(r.value().reconfigured.empty()) << strategy;
    EXPECT_EQ(remaining(engine, "alice"), 100u) << strategy << ": a new period starts afresh";
    ASSERT_TRUE(engine.check(CheckCall{"limited", "alice", 40}).value().allowed);
    const std::string other = std::string(strategy) == "gcra" ? "fixed-window" : "gcra";
    r = engine.reload(config_of(rate_yaml(other, 100, "20s")));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r.value().changed, std::vector<std::string>{"limited"}) << strategy;
    EXPECT_EQ(remaining(engine, "alice"), 100u) << strategy << ": a new strategy starts afresh";
  }
}

TEST(RateKeyCap, ANewKeyBeyondMaxKeysIsRefusedAndSaysWhy) {
  ManualClock clock(seconds(1000));
  auto e = Engine::create(config_of(rate_yaml("gcra", 5, "1m", 3)), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  for (const char* k : {"a", "b", "c"})
    ASSERT_TRUE(engine.check(CheckCall{"limited", k, 1}).value().allowed);
  auto no = engine.check(CheckCall{"limited", "d", 1});
  ASSERT_TRUE(no.ok());
  EXPECT_FALSE(no.value().allowed);
  EXPECT_TRUE(no.value().key_capacity);
  EXPECT_TRUE(engine.check(CheckCall{"limited", "a", 1}).value().allowed) << "held keys serve";
  // The 429 the transports send says why.
  const KindPolicies rate = *engine.policies_of("rate");
  ASSERT_EQ(rate.size(), 1u);
  const Rejection why = rate[0]->rate_family()->refusal("d", no.value());
  EXPECT_EQ(why.status, 429);
  EXPECT_NE(why.detail_text.find("max_keys (3)"), std::string::npos) << why.detail_text;
  EXPECT_NE(why.detail_text.find("new key 'd' is refused"), std::string::npos) << why.detail_text;
  const std::string metrics = engine.metrics_text();
  EXPECT_NE(metrics.find("sluice_rate_key_capacity_denied_total{policy=\"limited\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_rate_max_keys{policy=\"limited\"} 3"), std::string::npos);
  EXPECT_NE(metrics.find("sluice_rate_keys{policy=\"limited\"} 3"), std::string::npos);
}

TEST(RateKeyCap, MaxKeysIsValidated) {
  for (const char* bad : {"0", "100000001", "many"}) {
    const std::string yaml =
        "policies:\n  limited:\n    kind: rate\n    limit: 5\n    max_keys: " + std::string(bad) +
        "\n";
    ConfigLoad l = load_config(yaml, PolicyRegistry::builtin());
    ASSERT_FALSE(l.config.has_value()) << bad;
    ASSERT_FALSE(l.errors.empty());
    EXPECT_NE(l.errors[0].to_string("test").find("max_keys"), std::string::npos)
        << l.errors[0].to_string("test");
  }
}

// Under a sanitizer, memory comes from the sanitizer's allocator (malloc_trim does not apply, and
// freed blocks wait in a quarantine), and every check is several times slower: the sweep is
// checked on fewer keys and without the resident-memory bound.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

long rss_mib() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * sysconf(_SC_PAGESIZE) / (1024 * 1024);
}

// A million distinct keys through CheckMany, every one still counting while time stands still;
// then no traffic: once the keys are idle, the policy's own loop (every second here) forgets
// them and the resident memory they took goes back.
TEST(RateKeySweep, AMillionKeysThroughCheckManyAreSweptAndTheMemoryReturns) {
  ManualClock clock(seconds(1000));
  constexpr int kKeys = kSanitized ? 100'000 : 1'000'000;
  auto e = Engine::create(config_of(rate_yaml("gcra", 10, "1s", kKeys)), clock);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  Engine& engine = *e.value();
  const long before = rss_mib();
  std::vector<std::string> keys(kMaxBatch);
  std::vector<CheckCall> calls(kMaxBatch);
  for (int i = 0; i < kKeys; i += static_cast<int>(kMaxBatch)) {
    const std::size_t n = std::min<std::size_t>(kMaxBatch, static_cast<std::size_t>(kKeys - i));
    for (std::size_t j = 0; j < n; ++j) {
      keys[j] = "user-" + std::to_string(i + static_cast<int>(j));
      calls[j] = CheckCall{"limited", keys[j], 1};
    }
    auto r = engine.check_many(std::span<const CheckCall>(calls.data(), n));
    ASSERT_TRUE(r.ok() && r.value().allowed) << "batch at " << i;
  }
  EXPECT_EQ(state_of(engine, "limited")["keys"], kKeys);
  // The cap is reached: the next new key is refused, an old one still served.
  EXPECT_TRUE(engine.check(CheckCall{"limited", "one-more", 1}).value().key_capacity);
  EXPECT_TRUE(engine.check(CheckCall{"limited", "user-17", 1}).value().allowed);
  const long peak = rss_mib();
  clock.advance(seconds(2));  // every bucket full again; no check from here on
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while (state_of(engine, "limited")["keys"] != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(state_of(engine, "limited")["keys"], 0) << "the loop did not sweep";
  const long after = rss_mib();
  RecordProperty("rss_mib", std::to_string(before) + " -> " + std::to_string(peak) + " -> " +
                                std::to_string(after));
  std::printf("resident MiB: %ld before, %ld with a million keys, %ld after the sweep\n", before,
              peak, after);
  if (kSanitized) return;
  EXPECT_GT(peak - before, 40) << "a million keys should take tens of MiB";
  EXPECT_LT(after - before, (peak - before) / 4) << "the sweep gave little memory back";
}

}  // namespace
}  // namespace sluice::server
