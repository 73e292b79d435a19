// rls_rules.h: the descriptor rules of Envoy's rate limit service as envoyproxy/ratelimit's
// config writes them, and how a request's descriptor finds its limit, as pure values.
//
// What it is: a domain holds a tree of descriptor rules. A rule names a `key` and optionally a
// `value` (empty: any value, each one counted apart; a value with '*' matches any text in
// place of each '*'), optionally a `rate_limit` (requests_per_unit per unit, or unlimited) and
// optionally nested rules. A request's descriptor is an ordered list of (key, value) entries;
// RuleTree::match walks the tree one entry per level, at each level trying, in order,
//   1. the rule whose key and value are the entry's,
//   2. the first rule (in the file's order) whose wildcard value matches the entry's value,
//   3. the rule with the entry's key and no value,
// and stops where no rule matches or the matched rule has no nested rules. The descriptor gets
// a limit only if the rule it reached at its *last* entry has one: a descriptor with more (or
// fewer) entries than the rules are deep gets none (envoyproxy/ratelimit's README, examples 3
// and 4).
//
// Counting: a limit's hits are counted per distinct list of entries that reached it (every
// value a value-less or wildcard rule matched counts apart), except that the entries a
// `share_threshold` wildcard rule matched count as its pattern: every value it matches shares
// one counter. Counter keys are unambiguous (length-prefixed), unlike a join on '_'.
//
// Metric names follow envoyproxy/ratelimit: the rule's path (`domain.key_value.key`), or, with
// `detailed_metric`, the request's own entries, or with `value_to_metric`, the request's values
// at the levels that ask for them.
//
// Which limits a request applies (applied()): an unlimited rule applies none (the descriptor is
// OK, with the most remaining a uint32 holds); a limit whose `name` another matched limit of the
// same request `replaces` applies none either, and is not counted.
//
// Thread-safety: a RuleTree is built once, then only read (concurrently).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/rate_strategy.h"

namespace sluice::rls {

// The unit of a limit; the numbers are the protocol's.
enum class Unit : std::uint8_t {
  kUnknown = 0,
  kSecond = 1,
  kMinute = 2,
  kHour = 3,
  kDay = 4,
  kMonth = 5,
  kYear = 6,
  kWeek = 7,
};

// "second", "MINUTE", ... (any case); nullopt for anything else, "unknown" included.
[[nodiscard]] std::optional<Unit> unit_named(std::string_view name) noexcept;
// A unit from its protocol number; nullopt for 0 (unknown) and numbers no unit has.
[[nodiscard]] std::optional<Unit> unit_of(std::uint32_t wire) noexcept;
// "SECOND", ...; "UNKNOWN" for kUnknown.
[[nodiscard]] std::string_view name_of(Unit u) noexcept;
// The window: a second up to a year of 365 days (a month is 30 days, as envoyproxy/ratelimit
// counts); 0 for kUnknown.
[[nodiscard]] Nanos period_of(Unit u) noexcept;

struct Limit {
  std::uint32_t requests_per_unit = 0;  // 0: every request is over it
  Unit unit = Unit::kUnknown;           // kUnknown iff unlimited
  bool unlimited = false;
  std::string name;                   // what another limit's `replaces` names; may be empty
  std::vector<std::string> replaces;  // the names of limits this one replaces
};

// One rule of a domain's tree, as configured.
struct DescriptorRule {
  std::string key;    // non-empty
  std::string value;  // empty: any value
  std::optional<Limit> rate_limit;
  bool shadow_mode = false;      // decides and counts, never over the limit in the answer
  bool quota_mode = false;       // over the limit only if every quota limit of the request is
  bool detailed_metric = false;  // metrics per request entries
  bool value_to_metric = false;  // metrics with the request's value at this level
  bool share_threshold = false;  // a wildcard value: every value it matches shares one counter
  // sluice's own fields (outside envoyproxy/ratelimit's schema): whether its limit is shared
  // through the policy's coordinator (unset: the policy's default) and how it counts.
  std::optional<bool> sluice_shared;
  RateStrategy sluice_strategy = RateStrategy::kFixedWindow;
  std::vector<DescriptorRule> descriptors;
};

// A limit as the tree holds it.
struct Rule {
  std::size_t id = 0;  // its index in RuleTree::rules()
  std::string domain;
  std::string path;  // "domain.key_value.key": the rules it is nested in, and itself
  Limit limit;
  bool shadow_mode = false;
  bool quota_mode = false;
  bool detailed_metric = false;
  std::optional<bool> shared;  // sluice_shared
  RateStrategy strategy = RateStrategy::kFixedWindow;
};

struct Entry {
  std::string_view key;
  std::string_view value;
};

struct Match {
  const Rule* rule = nullptr;  // null: no limit applies
  std::string counter;         // the key its hits count under, within the rule
  std::string metric;          // the name its metrics go under
};

// A problem in a domain's rules: where (a path below the file's root, "descriptors[1].key")
// and what.
struct RuleError {
  std::string path;
  std::string message;
};

// Whether `value` matches the wildcard `pattern` (each '*' any text, possibly empty; a pattern
// without '*' matches itself only).
[[nodiscard]] bool wildcard_match(std::string_view pattern, std::string_view value) noexcept;

class RuleTree {
 public:
  RuleTree();
  ~RuleTree();
  RuleTree(RuleTree&&) noexcept;
  RuleTree& operator=(RuleTree&&) noexcept;

  // Adds a domain's rules (one file's). Errors, each at its rule: an empty key, two rules of
  // one level with the same key and value, a limit with an unknown unit (or a unit while
  // unlimited), an empty `replaces` name or one naming its own limit, `share_threshold` on a
  // value without '*'. A domain added before is an error at "domain" unless `merge`, when the
  // rules join its tree (a rule already there is then a duplicate). Nothing is added when there
  // is an error.
  [[nodiscard]] std::vector<RuleError> add(std::string_view domain,
                                           const std::vector<DescriptorRule>& rules, bool merge);

  [[nodiscard]] bool has_domain(std::string_view domain) const;
  // The limit `entries` reach in `domain` (none: an unknown domain, or no limit at the last
  // entry).
  [[nodiscard]] Match match(std::string_view domain, std::span<const Entry> entries) const;
  // Every limit, by id.
  [[nodiscard]] const std::vector<std::unique_ptr<Rule>>& rules() const noexcept { return rules_; }
  [[nodiscard]] std::vector<std::string> domains() const;

 private:
  struct Node;
  std::map<std::string, std::unique_ptr<Node>, std::less<>> domains_;
  std::vector<std::unique_ptr<Rule>> rules_;
};

// The counter key of a descriptor's entries as given (a limit the request itself sets).
[[nodiscard]] std::string counter_of(std::span<const Entry> entries);

// What a request's descriptor does with the limit it matched.
enum class Applied : std::uint8_t {
  kNone,       // no limit matched: OK, nothing counted
  kUnlimited,  // an unlimited rule: OK, nothing counted
  kReplaced,   // its limit is replaced by another matched limit: OK, nothing counted
  kLimit,      // its limit decides
};
// For each matched rule (null: none), what it does: unlimited rules apply none, and a limit
// whose name is among the `replaces` of any matched rule (unlimited ones included) is replaced.
[[nodiscard]] std::vector<Applied> applied(std::span<const Rule* const> matched);

// One descriptor's outcome, for the overall answer.
struct Outcome {
  bool over = false;     // over its limit (before shadow mode)
  bool quota = false;    // its rule is in quota mode (or every rule is)
  bool shadow = false;   // its rule is in shadow mode (or every rule is)
  bool limited = false;  // a limit decided it (Applied::kLimit)
};
// Over the limit overall: some limit that is neither in shadow nor in quota mode is over, or
// the request has quota limits and every one of them is over (shadow ones never count as over).
[[nodiscard]] bool over_limit(std::span<const Outcome> outcomes) noexcept;

}  // namespace sluice::rls
