#include "sluice/core/rls_rules.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <set>
#include <utility>

namespace sluice::rls {
namespace {

struct UnitName {
  std::string_view name;
  Unit unit;
};
constexpr std::array<UnitName, 7> kUnits{{{"SECOND", Unit::kSecond},
                                          {"MINUTE", Unit::kMinute},
                                          {"HOUR", Unit::kHour},
                                          {"DAY", Unit::kDay},
                                          {"WEEK", Unit::kWeek},
                                          {"MONTH", Unit::kMonth},
                                          {"YEAR", Unit::kYear}}};

bool equal_upper(std::string_view a, std::string_view upper) noexcept {
  if (a.size() != upper.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const char c = a[i] >= 'a' && a[i] <= 'z' ? static_cast<char>(a[i] - 'a' + 'A') : a[i];
    if (c != upper[i]) return false;
  }
  return true;
}

// The name a rule (or an entry) has in its level: "key_value", or "key" without a value.
std::string level_name(std::string_view key, std::string_view value) {
  std::string out(key);
  if (!value.empty()) {
    out += '_';
    out += value;
  }
  return out;
}

void append_counted(std::string& out, std::string_view s) {
  out += std::to_string(s.size());
  out += ':';
  out += s;
}

}  // namespace

std::optional<Unit> unit_named(std::string_view name) noexcept {
  for (const UnitName& u : kUnits)
    if (equal_upper(name, u.name)) return u.unit;
  return std::nullopt;
}

std::optional<Unit> unit_of(std::uint32_t wire) noexcept {
  if (wire == 0 || wire > 7) return std::nullopt;
  return static_cast<Unit>(wire);
}

std::string_view name_of(Unit u) noexcept {
  for (const UnitName& n : kUnits)
    if (n.unit == u) return n.name;
  return "UNKNOWN";
}

Nanos period_of(Unit u) noexcept {
  using std::chrono::hours;
  switch (u) {
    case Unit::kSecond:
      return std::chrono::seconds(1);
    case Unit::kMinute:
      return std::chrono::minutes(1);
    case Unit::kHour:
      return hours(1);
    case Unit::kDay:
      return hours(24);
    case Unit::kWeek:
      return hours(24 * 7);
    case Unit::kMonth:
      return hours(24 * 30);
    case Unit::kYear:
      return hours(24 * 365);
    case Unit::kUnknown:
      break;
  }
  return Nanos{0};
}

bool wildcard_match(std::string_view pattern, std::string_view value) noexcept {
  const std::size_t first = pattern.find('*');
  if (first == std::string_view::npos) return pattern == value;
  const std::size_t last = pattern.rfind('*');
  const std::string_view head = pattern.substr(0, first);
  const std::string_view tail = pattern.substr(last + 1);
  if (value.size() < head.size() + tail.size()) return false;
  if (!value.starts_with(head) || !value.ends_with(tail)) return false;
  // The middle parts, in order, each at its first place after the one before.
  if (last == first) return true;
  std::string_view rest = value.substr(head.size(), value.size() - head.size() - tail.size());
  std::string_view middle = pattern.substr(first + 1, last - first - 1);
  while (!middle.empty()) {
    const std::size_t star = middle.find('*');
    const std::string_view part = middle.substr(0, star);
    if (!part.empty()) {
      const std::size_t at = rest.find(part);
      if (at == std::string_view::npos) return false;
      rest.remove_prefix(at + part.size());
    }
    if (star == std::string_view::npos) break;
    middle.remove_prefix(star + 1);
  }
  return true;
}

// A level of a domain's tree: its rules by level name, the wildcard ones in the file's order.
struct RuleTree::Node {
  struct Child {
    std::string key;    // the rule's key
    std::string value;  // its value (may hold '*')
    bool value_to_metric = false;
    bool share_threshold = false;
    const Rule* rule = nullptr;  // its limit, if any
    std::unique_ptr<Node> below;
  };
  std::map<std::string, Child, std::less<>> children;
  std::vector<std::string> wildcards;  // level names of children whose name holds '*'
};

RuleTree::RuleTree() = default;
RuleTree::~RuleTree() = default;
RuleTree::RuleTree(RuleTree&&) noexcept = default;
RuleTree& RuleTree::operator=(RuleTree&&) noexcept = default;

namespace {

void check_rules(const std::vector<DescriptorRule>& rules, const std::string& at,
                 std::vector<RuleError>& errors) {
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const DescriptorRule& r = rules[i];
    const std::string here = at + "descriptors[" + std::to_string(i) + "]";
    if (r.key.empty()) errors.push_back({here + ".key", "is required (a non-empty key)"});
    if (r.share_threshold && r.value.find('*') == std::string::npos)
      errors.push_back({here + ".share_threshold",
                        "needs a wildcard value (one with '*'); value is '" + r.value + "'"});
    if (r.rate_limit) {
      const Limit& l = *r.rate_limit;
      if (l.unlimited && l.unit != Unit::kUnknown)
        errors.push_back({here + ".rate_limit.unit", "must not be set when unlimited is true"});
      if (!l.unlimited && l.unit == Unit::kUnknown)
        errors.push_back({here + ".rate_limit.unit",
                          "is required: second, minute, hour, day, week, month or year"});
      for (std::size_t j = 0; j < l.replaces.size(); ++j) {
        const std::string p = here + ".rate_limit.replaces[" + std::to_string(j) + "].name";
        if (l.replaces[j].empty())
          errors.push_back({p, "is required (the name of the limit it replaces)"});
        else if (l.replaces[j] == l.name)
          errors.push_back({p, "names this limit itself ('" + l.name + "')"});
      }
    }
    check_rules(r.descriptors, here + ".", errors);
  }
}

}  // namespace

std::vector<RuleError> RuleTree::add(std::string_view domain,
                                     const std::vector<DescriptorRule>& rules, bool merge) {
  std::vector<RuleError> errors;
  if (domain.empty()) errors.push_back({"domain", "is required (a non-empty domain)"});
  check_rules(rules, "", errors);
  auto existing = domains_.find(domain);
  if (existing != domains_.end() && !merge)
    errors.push_back({"domain", "domain '" + std::string(domain) +
                                    "' is configured already (in another file); a domain is "
                                    "one file's unless merge_domains is true"});
  if (!errors.empty()) return errors;

  // Duplicates, against the tree as it is and within these rules, before anything changes.
  struct Dup {
    static void find(const std::vector<DescriptorRule>& rules, const Node* level,
                     const std::string& at, const std::string& prefix,
                     std::vector<RuleError>& errors) {
      std::set<std::string, std::less<>> seen;
      for (std::size_t i = 0; i < rules.size(); ++i) {
        const DescriptorRule& r = rules[i];
        const std::string name = level_name(r.key, r.value);
        const std::string here = at + "descriptors[" + std::to_string(i) + "]";
        const bool before = level != nullptr && level->children.contains(name);
        if (!seen.insert(name).second || before) {
          errors.push_back({here, "duplicate descriptor '" + prefix + name + "' (key '" + r.key +
                                      "'" + (r.value.empty() ? "" : ", value '" + r.value + "'") +
                                      ")"});
          continue;
        }
        find(r.descriptors, nullptr, here + ".", prefix + name + ".", errors);
      }
    }
  };
  Node* root = existing == domains_.end() ? nullptr : existing->second.get();
  Dup::find(rules, root, "", std::string(domain) + ".", errors);
  if (!errors.empty()) return errors;

  if (root == nullptr) {
    auto made = std::make_unique<Node>();
    root = made.get();
    domains_.emplace(std::string(domain), std::move(made));
  }
  struct Insert {
    RuleTree& tree;
    std::string domain;
    void into(Node& level, const std::vector<DescriptorRule>& rules, const std::string& prefix) {
      for (const DescriptorRule& r : rules) {
        const std::string name = level_name(r.key, r.value);
        Node::Child c;
        c.key = r.key;
        c.value = r.value;
        c.value_to_metric = r.value_to_metric;
        c.share_threshold = r.share_threshold;
        if (r.rate_limit) {
          auto rule = std::make_unique<Rule>();
          rule->id = tree.rules_.size();
          rule->domain = domain;
          rule->path = prefix + name;
          rule->limit = *r.rate_limit;
          rule->shadow_mode = r.shadow_mode;
          rule->quota_mode = r.quota_mode;
          rule->detailed_metric = r.detailed_metric;
          rule->shared = r.sluice_shared;
          rule->strategy = r.sluice_strategy;
          c.rule = rule.get();
          tree.rules_.push_back(std::move(rule));
        }
        if (!r.descriptors.empty()) {
          c.below = std::make_unique<Node>();
          into(*c.below, r.descriptors, prefix + name + ".");
        }
        if (name.find('*') != std::string::npos) level.wildcards.push_back(name);
        level.children.emplace(name, std::move(c));
      }
    }
  };
  Insert{*this, std::string(domain)}.into(*root, rules, std::string(domain) + ".");
  return errors;
}

bool RuleTree::has_domain(std::string_view domain) const {
  return domains_.find(domain) != domains_.end();
}

std::vector<std::string> RuleTree::domains() const {
  std::vector<std::string> out;
  out.reserve(domains_.size());
  for (const auto& [d, _] : domains_) out.push_back(d);
  return out;
}

Match RuleTree::match(std::string_view domain, std::span<const Entry> entries) const {
  Match out;
  auto d = domains_.find(domain);
  if (d == domains_.end() || entries.empty()) return out;
  const Node* level = d->second.get();
  std::string metric(domain);
  std::string detailed(domain);
  std::string counter;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    std::string name(e.key);
    name += '_';
    name += e.value;
    const Node::Child* next = nullptr;
    bool by_value = false;
    bool by_wildcard = false;
    if (auto it = level->children.find(name); it != level->children.end()) {
      next = &it->second;
      by_value = true;
    }
    if (next == nullptr) {
      for (const std::string& w : level->wildcards) {
        if (wildcard_match(w, name)) {
          next = &level->children.find(w)->second;
          by_wildcard = true;
          break;
        }
      }
    }
    if (next == nullptr) {
      if (auto it = level->children.find(e.key); it != level->children.end()) next = &it->second;
    }
    const bool shared = by_wildcard && next->share_threshold;
    append_counted(counter, e.key);
    append_counted(counter, shared ? std::string_view(next->value) : e.value);
    detailed += '.';
    detailed += e.key;
    detailed += '_';
    detailed += shared ? std::string_view(next->value) : e.value;
    metric += '.';
    metric += e.key;
    if (next != nullptr) {
      std::string_view shown;
      if (by_wildcard)
        shown = shared || !next->value_to_metric ? std::string_view(next->value) : e.value;
      else if (by_value || next->value_to_metric)
        shown = e.value;
      if (!shown.empty()) {
        metric += '_';
        metric += shown;
      }
    }
    if (next != nullptr && next->rule != nullptr && i + 1 == entries.size()) out.rule = next->rule;
    if (next == nullptr || next->below == nullptr) break;
    level = next->below.get();
  }
  if (out.rule != nullptr) {
    out.counter = std::move(counter);
    out.metric = out.rule->detailed_metric ? std::move(detailed) : std::move(metric);
  }
  return out;
}

std::string counter_of(std::span<const Entry> entries) {
  std::string out;
  for (const Entry& e : entries) {
    append_counted(out, e.key);
    append_counted(out, e.value);
  }
  return out;
}

std::vector<Applied> applied(std::span<const Rule* const> matched) {
  std::set<std::string_view> replaced;
  for (const Rule* r : matched)
    if (r != nullptr)
      for (const std::string& name : r->limit.replaces) replaced.insert(name);
  std::vector<Applied> out;
  out.reserve(matched.size());
  for (const Rule* r : matched) {
    if (r == nullptr)
      out.push_back(Applied::kNone);
    else if (r->limit.unlimited)
      out.push_back(Applied::kUnlimited);
    else if (!r->limit.name.empty() && replaced.contains(r->limit.name))
      out.push_back(Applied::kReplaced);
    else
      out.push_back(Applied::kLimit);
  }
  return out;
}

bool over_limit(std::span<const Outcome> outcomes) noexcept {
  std::size_t quota = 0;
  std::size_t quota_over = 0;
  for (const Outcome& o : outcomes) {
    if (!o.limited) continue;
    const bool over = o.over && !o.shadow;
    if (o.quota) {
      ++quota;
      if (over) ++quota_over;
    } else if (over) {
      return true;
    }
  }
  return quota > 0 && quota == quota_over;
}

}  // namespace sluice::rls
