// Unit tests of the gateway's configuration values: the merge table (gateway_merge.h), the
// validation rules (gateway_validation.h) and the rendering of a rejection
// (rejection.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "local/gateway_merge.h"
#include "sluice/local/gateway_config.h"
#include "sluice/local/gateway_validation.h"
#include "sluice/local/rejection.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// ---------------------------------------------------------------------------------------------
// Helpers

ConcurrencyLimit Limit(std::optional<std::uint32_t> max_concurrent,
                       std::optional<std::uint32_t> per_tenant_max = std::nullopt,
                       std::optional<Sharing> sharing = std::nullopt) {
  ConcurrencyLimit l;
  l.sharing = sharing;
  l.max_concurrent = max_concurrent;
  l.per_tenant_max = per_tenant_max;
  return l;
}

ConcurrencyLimit QueueLimit(std::optional<std::uint32_t> max_concurrent, std::uint32_t depth,
                            Nanos timeout, std::optional<Sharing> sharing = std::nullopt) {
  ConcurrencyLimit l = Limit(max_concurrent, std::nullopt, sharing);
  l.strategy = Strategy::kQueue;
  l.queue.max_depth = depth;
  l.queue.timeout = timeout;
  return l;
}

void ExpectLimit(const EffectiveLimit& actual, bool private_pool,
                 std::optional<std::uint32_t> max_concurrent,
                 std::optional<std::uint32_t> per_tenant_max) {
  EXPECT_EQ(actual.private_pool, private_pool);
  EXPECT_EQ(actual.max_concurrent, max_concurrent);
  EXPECT_EQ(actual.per_tenant_max, per_tenant_max);
}

// An issue at exactly `path` whose message matches `message`.
template <typename M>
auto Issue(const std::string& path, M message) {
  return AllOf(Field(&ConfigIssue::path, path), Field(&ConfigIssue::message, message));
}

auto AtPath(const std::string& path) { return Field(&ConfigIssue::path, path); }

// A realistic, valid config:
//   tenants:   [0] acme (root, global 100), [1] acme-eu (child of acme, global 50),
//              [2] acme-eu-dev (child of acme-eu, no global limit)
//   upstreams: [0] openai    owned by acme, inherit, max 100, per_tenant 20, queue(50, 2 s),
//                            routes [0] chat (max 60), [1] embeddings (no max)
//              [1] anthropic owned by acme, private, max 40
//              [2] internal  owned by acme-eu, unlimited
//   bindings:  [0] acme-eu     -> openai    (max 30, per_tenant 10)
//              [1] acme-eu     -> anthropic (max 10)
//              [2] acme-eu-dev -> openai    (nothing of its own)
//              [3] acme-eu-dev -> internal  (nothing of its own)
GatewayConfig ValidConfig() {
  GatewayConfig c;
  c.tenants = {
      {"acme", std::nullopt, 100},
      {"acme-eu", "acme", 50},
      {"acme-eu-dev", "acme-eu", std::nullopt},
  };
  ConcurrencyLimit openai =
      QueueLimit(100, 50, std::chrono::seconds(2), std::optional<Sharing>(Sharing::kInherit));
  openai.per_tenant_max = 20;
  c.upstreams = {
      {"openai", "api.openai.com", "acme", openai, {{"chat", 60}, {"embeddings", std::nullopt}}},
      {"anthropic", "api.anthropic.com", "acme", Limit(40, std::nullopt, Sharing::kPrivate), {}},
      {"internal", "internal.acme.eu", "acme-eu", std::nullopt, {}},
  };
  c.bindings = {
      {"acme-eu", "openai", Limit(30, 10)},
      {"acme-eu", "anthropic", Limit(10)},
      {"acme-eu-dev", "openai", std::nullopt},
      {"acme-eu-dev", "internal", std::nullopt},
  };
  return c;
}

// ---------------------------------------------------------------------------------------------
// stricter / owner_limit / merge_binding

static_assert(stricter(std::nullopt, std::nullopt) == std::nullopt);
static_assert(stricter(std::nullopt, 7u) == 7u);
static_assert(stricter(7u, std::nullopt) == 7u);
static_assert(stricter(3u, 7u) == 3u);
static_assert(stricter(7u, 3u) == 3u);

TEST(GatewayMergeStricter, UnsetMeansUnlimitedAndTheSmallerWins) {
  EXPECT_EQ(stricter(std::nullopt, std::nullopt), std::nullopt);
  EXPECT_EQ(stricter(std::nullopt, 5u), 5u);
  EXPECT_EQ(stricter(5u, std::nullopt), 5u);
  EXPECT_EQ(stricter(5u, 9u), 5u);
  EXPECT_EQ(stricter(9u, 5u), 5u);
  EXPECT_EQ(stricter(4u, 4u), 4u);
  EXPECT_EQ(stricter(0u, 4u), 0u);
}

TEST(GatewayMergeOwner, NoUpstreamLimitIsUnlimitedWithDefaults) {
  const EffectiveLimit l = owner_limit(std::nullopt);
  ExpectLimit(l, false, std::nullopt, std::nullopt);
  EXPECT_EQ(l.strategy, Strategy::kReject);
  EXPECT_EQ(l.queue.max_depth, QueueOptions{}.max_depth);
  EXPECT_EQ(l.queue.timeout, QueueOptions{}.timeout);
}

TEST(GatewayMergeOwner, TakesTheUpstreamLimitAsItStands) {
  ConcurrencyLimit up = QueueLimit(100, 7, std::chrono::milliseconds(250), Sharing::kPrivate);
  up.per_tenant_max = 20;
  const EffectiveLimit l = owner_limit(up);
  // The owner uses its own pool even when the upstream is private: private_pool is only for
  // a descendant's separate pool.
  ExpectLimit(l, false, 100u, 20u);
  EXPECT_EQ(l.strategy, Strategy::kQueue);
  EXPECT_EQ(l.queue.max_depth, 7u);
  EXPECT_EQ(l.queue.timeout, std::chrono::milliseconds(250));
}

// merge_binding(upstream's limit, binding's own limit) for each sharing mode: the effective
// limit (private pool?, max_concurrent, per_tenant_max), or none at all.
struct MergeCase {
  const char* name;
  std::optional<ConcurrencyLimit> upstream;
  std::optional<ConcurrencyLimit> own;
  bool has_limit = true;  // false: merge_binding gives no effective limit
  bool private_pool = false;
  std::optional<std::uint32_t> max_concurrent;
  std::optional<std::uint32_t> per_tenant_max;
};

void PrintTo(const MergeCase& c, std::ostream* os) { *os << c.name; }

constexpr auto kNone = std::nullopt;

const MergeCase kMergeCases[] = {
    // private: the binding's own limit, in a separate pool.
    {"PrivateOwnLimitInASeparatePool", Limit(100, 20, Sharing::kPrivate), Limit(10, 5), true, true,
     10, 5},
    // A private pool is separate: the owner's max does not bound it.
    {"PrivateOwnLimitLooserThanTheOwnersIsKeptNotMinned", Limit(10, 5, Sharing::kPrivate),
     Limit(500, 50), true, true, 500, 50},
    {"PrivateOwnPerTenantMaxUnsetStaysUnsetEvenIfUpstreamHasOne", Limit(100, 20, Sharing::kPrivate),
     Limit(10), true, true, 10, kNone},
    {"PrivateWithoutOwnLimitHasNoEffectiveLimit", Limit(100, 20, Sharing::kPrivate), kNone, false,
     false, kNone, kNone},
    {"PrivateWithoutOwnMaxConcurrentHasNoEffectiveLimit", Limit(100, 20, Sharing::kPrivate),
     Limit(kNone), false, false, kNone, kNone},
    {"PrivateWithOnlyAnOwnPerTenantMaxHasNoEffectiveLimit", Limit(100, 20, Sharing::kPrivate),
     Limit(kNone, 5), false, false, kNone, kNone},
    // inherit: the ancestor's pool; each field the stricter of the two.
    {"InheritNothingOwnTakesTheAncestorsLimit", Limit(100, 20, Sharing::kInherit), kNone, true,
     false, 100, 20},
    {"InheritEmptyOwnLimitTakesTheAncestorsLimit", Limit(100, 20, Sharing::kInherit), Limit(kNone),
     true, false, 100, 20},
    {"InheritStricterOwnLimitWins", Limit(100, 20, Sharing::kInherit), Limit(30, 10), true, false,
     30, 10},
    {"InheritLooserOwnLimitLosesToTheAncestors", Limit(100, 20, Sharing::kInherit), Limit(300, 80),
     true, false, 100, 20},
    // Own max stricter, ancestor's per_tenant stricter: each field takes its own minimum.
    {"InheritMinIsFieldByField", Limit(100, 20, Sharing::kInherit), Limit(30, 25), true, false, 30,
     20},
    {"InheritMinIsFieldByFieldTheOtherWayRound", Limit(100, 20, Sharing::kInherit), Limit(150, 5),
     true, false, 100, 5},
    {"InheritOwnFieldFillsAnUnsetAncestorField", Limit(100, kNone, Sharing::kInherit),
     Limit(kNone, 7), true, false, 100, 7},
    // enforce: the stricter wins in both directions.
    {"EnforceNothingOwnTakesTheAncestorsLimit", Limit(100, 20, Sharing::kEnforce), kNone, true,
     false, 100, 20},
    {"EnforceStricterOwnLimitWins", Limit(100, 20, Sharing::kEnforce), Limit(30, 10), true, false,
     30, 10},
    {"EnforceLooserOwnLimitLoses", Limit(100, 20, Sharing::kEnforce), Limit(300, 80), true, false,
     100, 20},
    {"EnforceMixedTakesEachFieldsMinimum", Limit(100, 20, Sharing::kEnforce), Limit(300, 5), true,
     false, 100, 5},
    // No upstream limit behaves as inherit with every field unlimited: min(unlimited, own) is own,
    // in the shared pool.
    {"NoUpstreamLimitOwnLimitApplies", kNone, Limit(30, 10), true, false, 30, 10},
    {"UpstreamLimitWithoutMaxIsUnlimitedForThatField", Limit(kNone, 20), Limit(30, 50), true, false,
     30, 20},
};

class GatewayMergeTable : public ::testing::TestWithParam<MergeCase> {};

TEST_P(GatewayMergeTable, EffectiveLimit) {
  const MergeCase& c = GetParam();
  const auto l = merge_binding(c.upstream, c.own);
  if (!c.has_limit) {
    EXPECT_EQ(l, std::nullopt);
    return;
  }
  ASSERT_TRUE(l.has_value());
  ExpectLimit(*l, c.private_pool, c.max_concurrent, c.per_tenant_max);
}

INSTANTIATE_TEST_SUITE_P(GatewayMerge, GatewayMergeTable, ::testing::ValuesIn(kMergeCases),
                         [](const ::testing::TestParamInfo<MergeCase>& i) { return i.param.name; });

TEST(GatewayMergePrivate, StrategyAndQueueComeFromTheBinding) {
  const ConcurrencyLimit up = QueueLimit(100, 50, std::chrono::seconds(9), Sharing::kPrivate);
  const auto rejecting = merge_binding(up, Limit(10));
  ASSERT_TRUE(rejecting.has_value());
  EXPECT_EQ(rejecting->strategy, Strategy::kReject);
  EXPECT_EQ(rejecting->queue.max_depth, QueueOptions{}.max_depth);

  const auto queueing = merge_binding(up, QueueLimit(10, 3, std::chrono::milliseconds(40)));
  ASSERT_TRUE(queueing.has_value());
  EXPECT_EQ(queueing->strategy, Strategy::kQueue);
  EXPECT_EQ(queueing->queue.max_depth, 3u);
  EXPECT_EQ(queueing->queue.timeout, std::chrono::milliseconds(40));
}

TEST(GatewayMergeUnsetSharing, BehavesAsInherit) {
  const std::vector<std::optional<ConcurrencyLimit>> owns = {std::nullopt,  Limit(std::nullopt),
                                                             Limit(30, 10), Limit(300, 80),
                                                             Limit(30, 80), Limit(std::nullopt, 5)};
  for (const auto& own : owns) {
    const auto unset = merge_binding(Limit(100, 20), own);
    const auto inherit = merge_binding(Limit(100, 20, Sharing::kInherit), own);
    ASSERT_TRUE(unset.has_value());
    ASSERT_TRUE(inherit.has_value());
    EXPECT_EQ(unset->private_pool, inherit->private_pool);
    EXPECT_EQ(unset->max_concurrent, inherit->max_concurrent);
    EXPECT_EQ(unset->per_tenant_max, inherit->per_tenant_max);
  }
  // Spot check of one row so a shared bug in both cannot hide.
  const auto l = merge_binding(Limit(100, 20), Limit(30, 80));
  ASSERT_TRUE(l.has_value());
  ExpectLimit(*l, false, 30u, 20u);
}

TEST(GatewayMergeNoUpstreamLimit, NothingOwnIsUnlimited) {
  const auto l = merge_binding(std::nullopt, std::nullopt);
  ASSERT_TRUE(l.has_value());
  ExpectLimit(*l, false, std::nullopt, std::nullopt);
  EXPECT_EQ(l->strategy, Strategy::kReject);
}

TEST(GatewayMergeSharedPool, InheritStrategyAndQueueComeFromTheUpstream) {
  const ConcurrencyLimit up = QueueLimit(100, 7, std::chrono::seconds(3), Sharing::kInherit);
  const auto l = merge_binding(up, QueueLimit(10, 2, std::chrono::milliseconds(5)));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->strategy, Strategy::kQueue);
  EXPECT_EQ(l->queue.max_depth, 7u);
  EXPECT_EQ(l->queue.timeout, std::chrono::seconds(3));
  EXPECT_EQ(l->max_concurrent, 10u);
}

TEST(GatewayMergeSharedPool, EnforceStrategyAndQueueComeFromTheUpstream) {
  const ConcurrencyLimit up = QueueLimit(100, 7, std::chrono::seconds(3), Sharing::kEnforce);
  const auto l = merge_binding(up, Limit(10));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->strategy, Strategy::kQueue);
  EXPECT_EQ(l->queue.max_depth, 7u);
  EXPECT_EQ(l->queue.timeout, std::chrono::seconds(3));
}

TEST(GatewayMergeSharedPool, BindingQueueStrategyIsIgnoredOnARejectingPool) {
  const auto inherit =
      merge_binding(Limit(100, 20), QueueLimit(10, 2, std::chrono::milliseconds(5)));
  ASSERT_TRUE(inherit.has_value());
  EXPECT_EQ(inherit->strategy, Strategy::kReject);
  EXPECT_EQ(inherit->queue.max_depth, QueueOptions{}.max_depth);

  const auto enforce = merge_binding(Limit(100, 20, Sharing::kEnforce),
                                     QueueLimit(10, 2, std::chrono::milliseconds(5)));
  ASSERT_TRUE(enforce.has_value());
  EXPECT_EQ(enforce->strategy, Strategy::kReject);

  const auto no_limit = merge_binding(std::nullopt, QueueLimit(10, 2, std::chrono::seconds(1)));
  ASSERT_TRUE(no_limit.has_value());
  EXPECT_EQ(no_limit->strategy, Strategy::kReject);
  EXPECT_EQ(no_limit->queue.max_depth, QueueOptions{}.max_depth);
}

// One change to the valid config, and the one error it must cause: at which field, with which
// words in the message.
struct ValidationErrorCase {
  const char* name;
  void (*change)(GatewayConfig&);
  const char* path;
  std::vector<std::string> words;
};

void PrintTo(const ValidationErrorCase& c, std::ostream* os) { *os << c.name; }

const ValidationErrorCase kValidationErrorCases[] = {
    {"Rule1UpstreamMaxConcurrentZeroIsAnError",
     [](GatewayConfig& c) { c.upstreams[1].concurrency_limit->max_concurrent = 0; },
     "upstreams[1].concurrency_limit.max_concurrent",
     {"> 0", "rule 1"}},
    {"Rule1UpstreamPerTenantMaxZeroIsAnError",
     [](GatewayConfig& c) { c.upstreams[0].concurrency_limit->per_tenant_max = 0; },
     "upstreams[0].concurrency_limit.per_tenant_max",
     {"> 0", "rule 1"}},
    {"Rule1RouteMaxConcurrentZeroIsAnError",
     [](GatewayConfig& c) { c.upstreams[0].routes[1].max_concurrent = 0; },
     "upstreams[0].routes[1].max_concurrent",
     {"> 0", "rule 1"}},
    {"Rule1BindingMaxConcurrentZeroIsAnError",
     [](GatewayConfig& c) { c.bindings[1].concurrency_limit->max_concurrent = 0; },
     "bindings[1].concurrency_limit.max_concurrent",
     {"> 0"}},
    {"Rule1BindingPerTenantMaxZeroIsAnError",
     [](GatewayConfig& c) { c.bindings[0].concurrency_limit->per_tenant_max = 0; },
     "bindings[0].concurrency_limit.per_tenant_max",
     {"> 0"}},
    {"Rule2PerTenantMaxAboveMaxConcurrentIsAnError",
     [](GatewayConfig& c) { c.upstreams[0].concurrency_limit->per_tenant_max = 120; },
     "upstreams[0].concurrency_limit.per_tenant_max",
     {"120", "100", "rule 2"}},
    {"Rule2AppliesToABindingsOwnLimit",
     [](GatewayConfig& c) {
       c.bindings[0].concurrency_limit->per_tenant_max = 31;  // own max is 30
     },
     "bindings[0].concurrency_limit.per_tenant_max",
     {"31", "30", "rule 2"}},
    {"Rule3RouteMaxAboveUpstreamMaxIsAnError",
     [](GatewayConfig& c) { c.upstreams[0].routes[0].max_concurrent = 150; },
     "upstreams[0].routes[0].max_concurrent",
     {"150", "100", "rule 3"}},
    {"IdsEmptyTenantId",
     [](GatewayConfig& c) {
       c.tenants.push_back({"", std::nullopt, std::nullopt});
     },
     "tenants[3].id",
     {"empty"}},
    {"IdsDuplicateTenantId",
     [](GatewayConfig& c) {
       c.tenants.push_back({"acme-eu", std::nullopt, std::nullopt});
     },
     "tenants[3].id",
     {"duplicate", "'acme-eu'"}},
    {"IdsEmptyUpstreamId",
     [](GatewayConfig& c) {
       c.upstreams.push_back({"", "h.example", "acme", std::nullopt, {}});
     },
     "upstreams[3].id",
     {"empty"}},
    {"IdsDuplicateUpstreamId",
     [](GatewayConfig& c) {
       c.upstreams.push_back({"internal", "other.example", "acme", std::nullopt, {}});
     },
     "upstreams[3].id",
     {"duplicate", "'internal'"}},
    {"IdsEmptyHost",
     [](GatewayConfig& c) { c.upstreams[2].host.clear(); },
     "upstreams[2].host",
     {"empty"}},
    {"RefsUnknownParent",
     [](GatewayConfig& c) {
       c.tenants.push_back({"orphan", "nobody", std::nullopt});
     },
     "tenants[3].parent",
     {"unknown tenant", "'nobody'"}},
    {"RefsUnknownBindingTenant",
     [](GatewayConfig& c) { c.bindings[2].tenant = "nobody"; },
     "bindings[2].tenant",
     {"unknown tenant", "'nobody'"}},
    {"RefsUnknownBindingUpstream",
     [](GatewayConfig& c) { c.bindings[2].upstream = "nowhere"; },
     "bindings[2].upstream",
     {"unknown upstream", "'nowhere'"}},
    {"BindingsNonAncestorsUpstreamIsAnError",
     [](GatewayConfig& c) {
       c.tenants.push_back({"globex", std::nullopt, std::nullopt});
       c.upstreams.push_back({"globex-api", "api.globex.com", "globex", std::nullopt, {}});
       c.bindings.push_back({"acme-eu", "globex-api", std::nullopt});
     },
     "bindings[4].upstream",
     {"'globex-api'", "'globex'", "not an ancestor", "'acme-eu'"}},
    {"BindingsDescendantsUpstreamIsAnError",
     [](GatewayConfig& c) {
       c.bindings.push_back({"acme", "internal", std::nullopt});  // internal is acme-eu's
     },
     "bindings[4].upstream",
     {"'internal'", "'acme-eu'", "not an ancestor", "'acme'"}},
    {"BindingsOwnUpstreamIsAnError",
     [](GatewayConfig& c) {
       c.bindings.push_back({"acme-eu", "internal", std::nullopt});
     },
     "bindings[4].upstream",
     {"'acme-eu'", "owns", "'internal'"}},
    {"BindingsDuplicateBinding",
     [](GatewayConfig& c) {
       c.bindings.push_back({"acme-eu", "openai", std::nullopt});
     },
     "bindings[4]",
     {"duplicate", "'acme-eu'", "'openai'"}},
    {"BindingsPrivateUpstreamWithoutOwnLimit",
     [](GatewayConfig& c) { c.bindings[1].concurrency_limit = std::nullopt; },
     "bindings[1].concurrency_limit",
     {"'anthropic'", "private", "max_concurrent"}},
    {"BindingsPrivateUpstreamWithOwnLimitButNoMaxConcurrent",
     [](GatewayConfig& c) { c.bindings[1].concurrency_limit = Limit(std::nullopt, 5); },
     "bindings[1].concurrency_limit.max_concurrent",
     {"'anthropic'", "private"}},
    {"QueueZeroDepthWithQueueStrategy",
     [](GatewayConfig& c) { c.upstreams[0].concurrency_limit->queue.max_depth = 0; },
     "upstreams[0].concurrency_limit.queue.max_depth",
     {"> 0", "queue"}},
    {"QueueZeroTimeoutWithQueueStrategy",
     [](GatewayConfig& c) { c.upstreams[0].concurrency_limit->queue.timeout = Nanos{0}; },
     "upstreams[0].concurrency_limit.queue.timeout",
     {"> 0", "queue"}},
    {"ProblemEmptyTypeIsAnError",
     [](GatewayConfig& c) { c.problem.type.clear(); },
     "problem.type",
     {"empty"}},
};

class GatewayValidationErrorTable : public ::testing::TestWithParam<ValidationErrorCase> {};

TEST_P(GatewayValidationErrorTable, ReportsOneErrorAtTheField) {
  const ValidationErrorCase& e = GetParam();
  GatewayConfig c = ValidConfig();
  e.change(c);
  const ValidationReport r = validate(c);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.errors.size(), 1u) << r.to_string();
  EXPECT_EQ(r.errors[0].path, e.path);
  for (const std::string& w : e.words) EXPECT_THAT(r.errors[0].message, HasSubstr(w));
}

INSTANTIATE_TEST_SUITE_P(GatewayValidation, GatewayValidationErrorTable,
                         ::testing::ValuesIn(kValidationErrorCases),
                         [](const ::testing::TestParamInfo<ValidationErrorCase>& i) {
                           return i.param.name;
                         });

// ---------------------------------------------------------------------------------------------
// validate(): the base config

TEST(GatewayValidation, RealisticConfigHasNoErrorsAndNoWarnings) {
  const ValidationReport r = validate(ValidConfig());
  EXPECT_TRUE(r.ok());
  EXPECT_THAT(r.errors, IsEmpty()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
  EXPECT_EQ(r.to_string(), "");
}

TEST(GatewayValidation, EmptyConfigIsValid) {
  const ValidationReport r = validate(GatewayConfig{});
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty());
}

TEST(GatewayValidation, ReportsEveryProblemAtOnce) {
  GatewayConfig c = ValidConfig();
  c.tenants[1].global_concurrency_limit = 0;
  c.upstreams[0].routes[0].max_concurrent = 0;
  c.problem.status = 200;
  const ValidationReport r = validate(c);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.errors, ElementsAre(AtPath("tenants[1].global_concurrency_limit"),
                                    AtPath("upstreams[0].routes[0].max_concurrent"),
                                    AtPath("problem.status")));
}

// Rule 1
// --------------------------------------------------------------------------------------

TEST(GatewayValidationRule1, GlobalConcurrencyLimitZeroIsAnError) {
  GatewayConfig c = ValidConfig();
  c.tenants[1].global_concurrency_limit = 0;
  const ValidationReport r = validate(c);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.errors, ElementsAre(Issue("tenants[1].global_concurrency_limit",
                                          AllOf(HasSubstr("> 0"), HasSubstr("rule 1")))));
  // A zero global limit is an error, not also a rule 4 budget warning.
  EXPECT_THAT(r.warnings, Not(Contains(AtPath("tenants[1].global_concurrency_limit"))));
}

TEST(GatewayValidationRule1, PositiveValuesAreFine) {
  GatewayConfig c = ValidConfig();
  c.tenants[2].global_concurrency_limit = 1;
  c.upstreams[1].concurrency_limit->max_concurrent = 1;
  c.bindings[1].concurrency_limit->max_concurrent = 1;
  c.upstreams[0].routes[1].max_concurrent = 1;
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

// Rule 2
// --------------------------------------------------------------------------------------

TEST(GatewayValidationRule2, PerTenantMaxEqualToMaxConcurrentIsFine) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].concurrency_limit->per_tenant_max = 100;
  c.tenants[0].global_concurrency_limit = 1000;  // keep rule 4 quiet
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
}

TEST(GatewayValidationRule2, NoMaxConcurrentMeansNoUpperBound) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].concurrency_limit->max_concurrent = std::nullopt;
  c.upstreams[0].concurrency_limit->per_tenant_max = 5000;
  c.upstreams[0].routes[0].max_concurrent = 5000;
  c.tenants[0].global_concurrency_limit = 10000;
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

// Rule 3
// --------------------------------------------------------------------------------------

TEST(GatewayValidationRule3, RouteMaxEqualToUpstreamMaxIsFine) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].routes[0].max_concurrent = 100;
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

TEST(GatewayValidationRule3, FineWhenTheUpstreamHasNoMax) {
  GatewayConfig c = ValidConfig();
  c.upstreams[2].routes = {{"bulk", 100000}};  // internal: no concurrency_limit at all
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();

  c.upstreams[2].concurrency_limit = Limit(std::nullopt, 10);  // a limit without max
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

// Rule 4 (warning)
// ----------------------------------------------------------------------------

TEST(GatewayValidationRule4, GlobalLimitEqualToOwnedPerTenantSumIsAWarning) {
  GatewayConfig c = ValidConfig();
  c.upstreams[1].concurrency_limit->per_tenant_max = 30;  // acme owns openai (20) + this (30)
  c.tenants[0].global_concurrency_limit = 50;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings,
              ElementsAre(Issue("tenants[0].global_concurrency_limit",
                                AllOf(HasSubstr("50 should be > 50"), HasSubstr("rule 4")))));
}

TEST(GatewayValidationRule4, GlobalLimitAboveTheSumIsFine) {
  GatewayConfig c = ValidConfig();
  c.upstreams[1].concurrency_limit->per_tenant_max = 30;
  c.tenants[0].global_concurrency_limit = 51;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
}

TEST(GatewayValidationRule4, GlobalLimitBelowTheSumIsAWarningNotAnError) {
  GatewayConfig c = ValidConfig();
  c.tenants[0].global_concurrency_limit = 5;  // owns openai with per_tenant_max 20
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(r.warnings,
              ElementsAre(Issue("tenants[0].global_concurrency_limit",
                                AllOf(HasSubstr("5 should be > 20"), HasSubstr("rule 4")))));
}

TEST(GatewayValidationRule4, BoundUpstreamsCountAfterTheMerge) {
  GatewayConfig c = ValidConfig();
  // acme-eu: openai merged per_tenant_max = min(20, own 10) = 10 < 15: fine.
  c.tenants[1].global_concurrency_limit = 15;
  EXPECT_THAT(validate(c).warnings, IsEmpty()) << validate(c).to_string();

  // Without its own per_tenant_max the binding inherits 20 >= 15: warning.
  c.bindings[0].concurrency_limit->per_tenant_max = std::nullopt;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, ElementsAre(Issue("tenants[1].global_concurrency_limit",
                                            HasSubstr("15 should be > 20"))));
}

TEST(GatewayValidationRule4, SumsOwnedAndBoundUpstreams) {
  GatewayConfig c = ValidConfig();
  // acme-eu owns internal (per_tenant 8), binds openai (merged 10) and anthropic (private,
  // own per_tenant 4): 22.
  c.upstreams[2].concurrency_limit = Limit(std::nullopt, 8);
  c.bindings[1].concurrency_limit->per_tenant_max = 4;
  c.bindings[3].concurrency_limit = Limit(std::nullopt, 8);  // acme-eu-dev: no global limit
  c.tenants[1].global_concurrency_limit = 22;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, ElementsAre(Issue("tenants[1].global_concurrency_limit",
                                            HasSubstr("22 should be > 22"))));

  c.tenants[1].global_concurrency_limit = 23;
  EXPECT_THAT(validate(c).warnings, IsEmpty()) << validate(c).to_string();
}

TEST(GatewayValidationRule4, NoPerTenantMaxAnywhereMeansNoWarning) {
  GatewayConfig c = ValidConfig();
  c.tenants[2].global_concurrency_limit = 1;  // acme-eu-dev uses openai (20) and internal
  EXPECT_THAT(validate(c).warnings, ElementsAre(AtPath("tenants[2].global_concurrency_limit")));

  c.upstreams[0].concurrency_limit->per_tenant_max = std::nullopt;
  c.bindings[0].concurrency_limit->per_tenant_max = std::nullopt;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
}

// Ids
// -----------------------------------------------------------------------------------------

TEST(GatewayValidationIds, EmptyAndDuplicateRouteIds) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].routes.push_back({"chat", 5});
  c.upstreams[0].routes.push_back({"", 5});
  const ValidationReport r = validate(c);
  EXPECT_THAT(r.errors, ElementsAre(Issue("upstreams[0].routes[2].id",
                                          AllOf(HasSubstr("duplicate"), HasSubstr("'chat'"))),
                                    Issue("upstreams[0].routes[3].id", HasSubstr("empty"))));
}

TEST(GatewayValidationIds, SameRouteIdOnDifferentUpstreamsIsFine) {
  GatewayConfig c = ValidConfig();
  c.upstreams[1].routes = {{"chat", 5}};
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

// Unknown references
// --------------------------------------------------------------------------

TEST(GatewayValidationRefs, ParentDeclaredLaterIsKnown) {
  GatewayConfig c = ValidConfig();
  c.tenants.insert(c.tenants.begin(), {"late-child", "zeta", std::nullopt});
  c.tenants.push_back({"zeta", std::nullopt, std::nullopt});
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

TEST(GatewayValidationRefs, UnknownOwner) {
  GatewayConfig c = ValidConfig();
  c.upstreams[2].owner = "nobody";
  const ValidationReport r = validate(c);
  EXPECT_THAT(r.errors, Contains(Issue("upstreams[2].owner",
                                       AllOf(HasSubstr("unknown tenant"), HasSubstr("'nobody'")))));
  // The binding to it is not also blamed for scope (its owner is reported already).
  EXPECT_THAT(r.errors, Not(Contains(AtPath("bindings[3].upstream"))));
  EXPECT_EQ(r.errors.size(), 1u) << r.to_string();
}

TEST(GatewayValidationRefs, UnknownTenantAndUpstreamInOneBindingAreBothReported) {
  GatewayConfig c = ValidConfig();
  c.bindings[0].tenant = "ghost";
  c.bindings[0].upstream = "nowhere";
  EXPECT_THAT(validate(c).errors,
              ElementsAre(Issue("bindings[0].tenant", HasSubstr("'ghost'")),
                          Issue("bindings[0].upstream", HasSubstr("'nowhere'"))));
}

// Parent cycles
// -------------------------------------------------------------------------------

TEST(GatewayValidationCycles, TwoTenantCycleReportsEachMember) {
  GatewayConfig c = ValidConfig();
  c.tenants.push_back({"a", "b", std::nullopt});  // [3]
  c.tenants.push_back({"b", "a", std::nullopt});  // [4]
  c.tenants.push_back({"c", "a", std::nullopt});  // [5]: below the cycle, not in it
  const ValidationReport r = validate(c);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.errors,
              ElementsAre(Issue("tenants[3].parent", AllOf(HasSubstr("'a'"), HasSubstr("cycle"))),
                          Issue("tenants[4].parent", AllOf(HasSubstr("'b'"), HasSubstr("cycle")))));
}

TEST(GatewayValidationCycles, SelfParent) {
  GatewayConfig c = ValidConfig();
  c.tenants[2].parent = "acme-eu-dev";
  const ValidationReport r = validate(c);
  EXPECT_THAT(r.errors, Contains(Issue("tenants[2].parent",
                                       AllOf(HasSubstr("'acme-eu-dev'"), HasSubstr("cycle")))));
  // Bindings of a tenant in a cycle are not additionally blamed for scope.
  EXPECT_THAT(r.errors, Not(Contains(AtPath("bindings[2].upstream"))));
  EXPECT_THAT(r.errors, Not(Contains(AtPath("bindings[3].upstream"))));
}

TEST(GatewayValidationCycles, LongerCycle) {
  GatewayConfig c;
  c.tenants = {{"x", "z", std::nullopt}, {"y", "x", std::nullopt}, {"z", "y", std::nullopt}};
  const ValidationReport r = validate(c);
  EXPECT_THAT(r.errors, ElementsAre(AtPath("tenants[0].parent"), AtPath("tenants[1].parent"),
                                    AtPath("tenants[2].parent")));
}

// Binding scope
// -------------------------------------------------------------------------------

TEST(GatewayValidationBindings, GrandparentsUpstreamIsFine) {
  GatewayConfig c = ValidConfig();
  c.bindings.push_back({"acme-eu-dev", "anthropic", Limit(3)});
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

TEST(GatewayValidationBindings, SharingInABindingIsAnError) {
  for (const Sharing s : {Sharing::kPrivate, Sharing::kInherit, Sharing::kEnforce}) {
    GatewayConfig c = ValidConfig();
    c.bindings[0].concurrency_limit->sharing = s;
    EXPECT_THAT(validate(c).errors,
                ElementsAre(Issue("bindings[0].concurrency_limit.sharing", HasSubstr("upstream"))));
  }
}

TEST(GatewayValidationBindings, SharingOnAnUpstreamIsFine) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].concurrency_limit->sharing = Sharing::kEnforce;
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

// Queue options
// -------------------------------------------------------------------------------

TEST(GatewayValidationQueue, NegativeTimeoutWithQueueStrategy) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].concurrency_limit->queue.timeout = Nanos{-1};
  EXPECT_THAT(validate(c).errors,
              ElementsAre(AtPath("upstreams[0].concurrency_limit.queue.timeout")));
}

TEST(GatewayValidationQueue, PrivateBindingQueueIsChecked) {
  GatewayConfig c = ValidConfig();
  c.bindings[1].concurrency_limit = QueueLimit(10, 0, Nanos{0});
  EXPECT_THAT(validate(c).errors,
              ElementsAre(AtPath("bindings[1].concurrency_limit.queue.max_depth"),
                          AtPath("bindings[1].concurrency_limit.queue.timeout")));
}

TEST(GatewayValidationQueue, ZeroQueueOptionsIgnoredForRejectStrategy) {
  GatewayConfig c = ValidConfig();
  ConcurrencyLimit& l = *c.upstreams[1].concurrency_limit;
  ASSERT_EQ(l.strategy, Strategy::kReject);
  l.queue.max_depth = 0;
  l.queue.timeout = Nanos{0};
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

// problem options
// -----------------------------------------------------------------------------

TEST(GatewayValidationProblem, StatusOutside4xx5xxIsAnError) {
  for (const std::uint16_t status : {0, 200, 302, 399, 600, 999}) {
    GatewayConfig c = ValidConfig();
    c.problem.status = status;
    EXPECT_THAT(validate(c).errors,
                ElementsAre(Issue("problem.status", AllOf(HasSubstr(std::to_string(status)),
                                                          HasSubstr("4xx or 5xx")))))
        << status;
  }
}

TEST(GatewayValidationProblem, StatusInside4xx5xxIsFine) {
  for (const std::uint16_t status : {400, 429, 503, 599}) {
    GatewayConfig c = ValidConfig();
    c.problem.status = status;
    EXPECT_TRUE(validate(c).ok()) << status << ": " << validate(c).to_string();
  }
}

// Warnings about bindings
// ---------------------------------------------------------------------

TEST(GatewayValidationWarnings, LooserBindingMaxConcurrent) {
  GatewayConfig c = ValidConfig();
  c.bindings[0].concurrency_limit->max_concurrent = 150;  // upstream: 100
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, ElementsAre(Issue("bindings[0].concurrency_limit.max_concurrent",
                                            AllOf(HasSubstr("150 is looser"), HasSubstr("100"),
                                                  HasSubstr("stricter 100 applies")))));
}

TEST(GatewayValidationWarnings, LooserBindingPerTenantMax) {
  GatewayConfig c = ValidConfig();
  c.bindings[0].concurrency_limit->per_tenant_max = 25;  // upstream: 20, own max 30
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, ElementsAre(Issue("bindings[0].concurrency_limit.per_tenant_max",
                                            AllOf(HasSubstr("25 is looser"), HasSubstr("20")))));
}

TEST(GatewayValidationWarnings, EqualBindingLimitIsNotLooser) {
  GatewayConfig c = ValidConfig();
  c.bindings[0].concurrency_limit = Limit(100, 20);
  c.tenants[1].global_concurrency_limit = 21;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
}

TEST(GatewayValidationWarnings, LooserLimitOnEnforceUpstreamAlsoWarns) {
  GatewayConfig c = ValidConfig();
  c.upstreams[0].concurrency_limit->sharing = Sharing::kEnforce;
  c.bindings[0].concurrency_limit->max_concurrent = 101;
  EXPECT_THAT(validate(c).warnings,
              ElementsAre(AtPath("bindings[0].concurrency_limit.max_concurrent")));
}

TEST(GatewayValidationWarnings, LooserLimitOnPrivateUpstreamIsNotAWarning) {
  GatewayConfig c = ValidConfig();
  c.bindings[1].concurrency_limit->max_concurrent = 400;  // upstream anthropic: 40, private
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
}

TEST(GatewayValidationWarnings, QueueStrategyInASharedBindingIsIgnored) {
  GatewayConfig c = ValidConfig();
  c.bindings[0].concurrency_limit->strategy = Strategy::kQueue;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, ElementsAre(Issue("bindings[0].concurrency_limit.strategy",
                                            AllOf(HasSubstr("ignored"), HasSubstr("shared")))));
}

TEST(GatewayValidationWarnings, QueueStrategyInAPrivateBindingIsUsed) {
  GatewayConfig c = ValidConfig();
  c.bindings[1].concurrency_limit->strategy = Strategy::kQueue;
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings, IsEmpty()) << r.to_string();
}

// An upstream without a limit is shared (kInherit): a queue strategy in its binding is
// ignored by the merge, and the warning says so.
TEST(GatewayValidationWarnings, QueueStrategyInABindingToAnUnlimitedUpstreamWarns) {
  GatewayConfig c = ValidConfig();
  c.bindings[3].concurrency_limit = QueueLimit(5, 10, std::chrono::seconds(1));
  ASSERT_EQ(
      merge_binding(c.upstreams[2].concurrency_limit, c.bindings[3].concurrency_limit)->strategy,
      Strategy::kReject);
  const ValidationReport r = validate(c);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_THAT(r.warnings,
              ElementsAre(Issue("bindings[3].concurrency_limit.strategy", HasSubstr("ignored"))));
}

// to_string
// -----------------------------------------------------------------------------------

TEST(GatewayValidationReport, ToStringFormatsOneLinePerIssueErrorsFirst) {
  ValidationReport r;
  r.warnings = {{"w.path", "w message"}};
  r.errors = {{"a.b", "first"}, {"c[1].d", "second"}};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.to_string(),
            "error: a.b: first\n"
            "error: c[1].d: second\n"
            "warning: w.path: w message\n");
}

TEST(GatewayValidationReport, OnlyWarningsIsOk) {
  ValidationReport r;
  r.warnings = {{"x", "y"}};
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.to_string(), "warning: x: y\n");
}

TEST(GatewayValidationReport, ToStringOfARealReport) {
  GatewayConfig c = ValidConfig();
  c.problem.status = 600;
  c.bindings[0].concurrency_limit->max_concurrent = 150;
  EXPECT_EQ(validate(c).to_string(),
            "error: problem.status: 600 is not a 4xx or 5xx status\n"
            "warning: bindings[0].concurrency_limit.max_concurrent: 150 is looser than the "
            "upstream's 100; the stricter 100 applies\n");
}

// ---------------------------------------------------------------------------------------------
// Rejection

constexpr std::string_view kType = "urn:sluice:problem:concurrency-limit-exceeded";
constexpr std::string_view kTitle = "Concurrency Limit Exceeded";

Rejection UpstreamRejection() {
  Rejection r;
  r.level = LimitLevel::kUpstream;
  r.reason = RejectReason::kLimitReached;
  r.type = kType;
  r.title = kTitle;
  r.upstream_id = "openai";
  r.host = "api.openai.com";
  r.current_in_flight = 100;
  r.max_concurrent = 100;
  return r;
}

TEST(GatewayRejectionNames, EveryLimitLevel) {
  EXPECT_EQ(to_string(LimitLevel::kTenant), "tenant");
  EXPECT_EQ(to_string(LimitLevel::kUpstream), "upstream");
  EXPECT_EQ(to_string(LimitLevel::kBinding), "binding");
  EXPECT_EQ(to_string(LimitLevel::kPerTenant), "per_tenant");
  EXPECT_EQ(to_string(LimitLevel::kRoute), "route");
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < kLimitLevelCount; ++i)
    names.insert(to_string(static_cast<LimitLevel>(i)));
  EXPECT_EQ(names.size(), kLimitLevelCount);
  EXPECT_EQ(names.count("unknown"), 0u);
}

TEST(GatewayRejectionNames, EveryRejectReason) {
  EXPECT_EQ(to_string(RejectReason::kLimitReached), "limit_reached");
  EXPECT_EQ(to_string(RejectReason::kQueueFull), "queue_full");
  EXPECT_EQ(to_string(RejectReason::kQueueTimeout), "queue_timeout");
}

TEST(GatewayRejectionDetail, AdrExample) {
  EXPECT_EQ(UpstreamRejection().detail(),
            "Upstream api.openai.com has reached max concurrent requests (100/100)");
}

TEST(GatewayRejectionDetail, EveryLevel) {
  Rejection r = UpstreamRejection();
  r.tenant_id = "acme-eu";
  r.route_id = "chat";
  r.current_in_flight = 7;
  r.max_concurrent = 8;
  r.level = LimitLevel::kTenant;
  EXPECT_EQ(r.detail(), "Tenant acme-eu has reached max concurrent requests (7/8)");
  r.level = LimitLevel::kUpstream;
  EXPECT_EQ(r.detail(), "Upstream api.openai.com has reached max concurrent requests (7/8)");
  r.level = LimitLevel::kBinding;
  EXPECT_EQ(r.detail(),
            "Tenant acme-eu has reached its max concurrent requests to upstream api.openai.com "
            "(7/8)");
  r.level = LimitLevel::kPerTenant;
  EXPECT_EQ(r.detail(),
            "Tenant acme-eu has reached max concurrent requests per tenant on upstream "
            "api.openai.com (7/8)");
  r.level = LimitLevel::kRoute;
  EXPECT_EQ(r.detail(),
            "Route chat of upstream api.openai.com has reached max concurrent requests (7/8)");
}

TEST(GatewayRejectionDetail, QueueReasons) {
  Rejection r = UpstreamRejection();
  r.current_in_flight = 100;
  r.max_concurrent = 100;
  r.reason = RejectReason::kQueueFull;
  EXPECT_EQ(r.detail(),
            "Upstream api.openai.com has reached max concurrent requests (100/100) and "
            "its queue "
            "is full");
  r.reason = RejectReason::kQueueTimeout;
  EXPECT_EQ(r.detail(),
            "Upstream api.openai.com has reached max concurrent requests (100/100) and the wait "
            "in its queue timed out");
}

TEST(GatewayRejectionProblemJson, EveryFieldOfTheAdrExample) {
  const Rejection r = UpstreamRejection();
  const nlohmann::json j = nlohmann::json::parse(problem_json(r));
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("type"), std::string(kType));
  EXPECT_EQ(j.at("title"), std::string(kTitle));
  ASSERT_TRUE(j.at("status").is_number_integer());
  EXPECT_EQ(j.at("status"), 503);
  EXPECT_EQ(j.at("detail"),
            "Upstream api.openai.com has reached max concurrent requests (100/100)");
  EXPECT_EQ(j.at("upstream_id"), "openai");
  EXPECT_EQ(j.at("host"), "api.openai.com");
  EXPECT_EQ(j.at("limit_type"), "upstream");
  EXPECT_EQ(j.at("reason"), "limit_reached");
  ASSERT_TRUE(j.at("current_in_flight").is_number_integer());
  EXPECT_EQ(j.at("current_in_flight"), 100);
  ASSERT_TRUE(j.at("max_concurrent").is_number_integer());
  EXPECT_EQ(j.at("max_concurrent"), 100);
  ASSERT_TRUE(j.at("retry_after_seconds").is_number_integer());
  EXPECT_EQ(j.at("retry_after_seconds"), 1);
  // Unset optional fields are omitted, not null.
  EXPECT_FALSE(j.contains("instance"));
  EXPECT_FALSE(j.contains("trace_id"));
  EXPECT_FALSE(j.contains("tenant_id"));
  EXPECT_FALSE(j.contains("route_id"));
  EXPECT_EQ(j.size(), 11u) << j.dump();
}

TEST(GatewayRejectionProblemJson, OptionalFieldsWhenSet) {
  Rejection r = UpstreamRejection();
  r.level = LimitLevel::kRoute;
  r.reason = RejectReason::kQueueTimeout;
  r.status = 429;
  r.retry_after = std::chrono::seconds(7);
  r.tenant_id = "acme-eu";
  r.route_id = "chat";
  r.current_in_flight = 3;
  r.max_concurrent = 4;
  r.instance = "/v1/chat/completions";
  r.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  const nlohmann::json j = nlohmann::json::parse(problem_json(r));
  EXPECT_EQ(j.at("status"), 429);
  EXPECT_EQ(j.at("retry_after_seconds"), 7);
  EXPECT_EQ(j.at("limit_type"), "route");
  EXPECT_EQ(j.at("reason"), "queue_timeout");
  EXPECT_EQ(j.at("current_in_flight"), 3);
  EXPECT_EQ(j.at("max_concurrent"), 4);
  EXPECT_EQ(j.at("detail"), r.detail());
  EXPECT_EQ(j.at("instance"), "/v1/chat/completions");
  EXPECT_EQ(j.at("trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(j.at("tenant_id"), "acme-eu");
  EXPECT_EQ(j.at("route_id"), "chat");
  EXPECT_EQ(j.size(), 15u) << j.dump();
}

TEST(GatewayRejectionProblemJson, InstanceAndTraceIdIndependently) {
  Rejection r = UpstreamRejection();
  r.instance = "/a";
  nlohmann::json j = nlohmann::json::parse(problem_json(r));
  EXPECT_EQ(j.at("instance"), "/a");
  EXPECT_FALSE(j.contains("trace_id"));

  r.instance.reset();
  r.trace_id = "t-1";
  j = nlohmann::json::parse(problem_json(r));
  EXPECT_FALSE(j.contains("instance"));
  EXPECT_EQ(j.at("trace_id"), "t-1");
}

TEST(GatewayRejectionProblemJson, StringsAreEscaped) {
  Rejection r = UpstreamRejection();
  r.host = "we\"ird\\host\n";
  r.instance = "/p?q=\"x\"";
  const nlohmann::json j = nlohmann::json::parse(problem_json(r));
  EXPECT_EQ(j.at("host"), "we\"ird\\host\n");
  EXPECT_EQ(j.at("instance"), "/p?q=\"x\"");
}

TEST(GatewayRejectionHttp, DefaultIs503WithProblemJsonHeaders) {
  const Rejection r = UpstreamRejection();
  const HttpResponse resp = to_http_response(r);
  EXPECT_EQ(resp.status, 503);
  EXPECT_EQ(resp.header("Content-Type"), "application/problem+json");
  EXPECT_EQ(resp.header("Retry-After"), "1");
  EXPECT_EQ(resp.header("X-Sluice-Error-Source"), "gateway");
  EXPECT_EQ(resp.body, problem_json(r));
  const nlohmann::json j = nlohmann::json::parse(resp.body);
  EXPECT_EQ(j.at("status"), 503);
}

TEST(GatewayRejectionHttp, StatusAndRetryAfterFollowTheRejection) {
  Rejection r = UpstreamRejection();
  r.status = 429;
  r.retry_after = std::chrono::seconds(30);
  const HttpResponse resp = to_http_response(r);
  EXPECT_EQ(resp.status, 429);
  EXPECT_EQ(resp.header("Retry-After"), "30");
  const nlohmann::json j = nlohmann::json::parse(resp.body);
  EXPECT_EQ(j.at("status"), 429);
  EXPECT_EQ(j.at("retry_after_seconds"), 30);
  EXPECT_EQ(resp.header("Retry-After"), std::to_string(j.at("retry_after_seconds").get<int>()));
}

TEST(GatewayRejectionHttp, HeaderLookupIsCaseInsensitive) {
  const HttpResponse resp = to_http_response(UpstreamRejection());
  EXPECT_EQ(resp.header("content-type"), "application/problem+json");
  EXPECT_EQ(resp.header("CONTENT-TYPE"), "application/problem+json");
  EXPECT_EQ(resp.header("retry-after"), "1");
  EXPECT_EQ(resp.header("x-sluice-error-source"), "gateway");
}

TEST(GatewayRejectionHttp, HeaderLookupNeedsTheWholeName) {
  const HttpResponse resp = to_http_response(UpstreamRejection());
  EXPECT_EQ(resp.header("Content"), "");
  EXPECT_EQ(resp.header("Content-Type-X"), "");
  EXPECT_EQ(resp.header(""), "");
  EXPECT_EQ(resp.header("Missing"), "");
}

TEST(GatewayRejectionHttp, HeaderReturnsTheFirstMatch) {
  HttpResponse resp;
  resp.headers = {{"X-A", "one"}, {"x-a", "two"}};
  EXPECT_EQ(resp.header("X-a"), "one");
}

TEST(GatewayRejectionHttp, DefaultConstructedRejectionIs503) {
  const Rejection r{};
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.retry_after_seconds(), 1u);
  EXPECT_EQ(to_http_response(r).status, 503);
}

}  // namespace
}  // namespace sluice
