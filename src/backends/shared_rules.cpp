// The bounds every SharedRules backend checks (sluice/backends/shared_rules.h), and the memory
// backend.
#include "sluice/backends/shared_rules.h"

#include <map>
#include <mutex>
#include <utility>

namespace sluice {

Status SharedRules::check(std::string_view scope, std::string_view key, std::string_view value) {
  const auto bad = [](std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); };
  if (scope.empty() || scope.size() > kMaxScopeBytes)
    return bad("scope: must be 1 to " + std::to_string(kMaxScopeBytes) + " bytes");
  if (key.empty() || key.size() > kMaxKeyBytes)
    return bad("key: must be 1 to " + std::to_string(kMaxKeyBytes) + " bytes");
  if (value.size() > kMaxValueBytes)
    return bad("value: must be at most " + std::to_string(kMaxValueBytes) + " bytes");
  return {};
}

namespace {

// The tables in this process. Deadlines on the clock, in whole milliseconds as the other
// backends hold them (a deadline is rounded up).
class MemorySharedRules final : public SharedRules {
 public:
  explicit MemorySharedRules(const Clock& clock) : clock_(clock) {}

  StatusOr<std::vector<SharedRule>> list(std::string_view scope,
                                         Nanos /*timeout*/) noexcept override {
    if (Status s = check(scope, "k", ""); !s.ok()) return s;
    try {
      const std::lock_guard lock(mu_);
      const Nanos now = clock_.now();
      std::vector<SharedRule> out;
      const auto t = tables_.find(scope);
      if (t == tables_.end()) return out;
      sweep(t->second, now);
      for (const auto& [key, e] : t->second)
        out.push_back(
            {key, e.value, e.has_deadline, e.has_deadline ? e.deadline - now : Nanos{0}, e.drop});
      return out;
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("memory: list: ") + e.what());
    }
  }

  Status put(std::string_view scope, std::string_view key, std::string_view value,
             bool has_deadline, Nanos left, bool drop_at_deadline, std::size_t max_keys,
             Nanos /*timeout*/) noexcept override {
    if (Status s = check(scope, key, value); !s.ok()) return s;
    try {
      const std::lock_guard lock(mu_);
      const Nanos now = clock_.now();
      Table& table = tables_[std::string(scope)];
      sweep(table, now);
      if (!table.contains(key) && table.size() >= max_keys)
        return Status(StatusCode::kFailedPrecondition, "scope " + std::string(scope) + " holds " +
                                                           std::to_string(table.size()) +
                                                           " keys, the most it may");
      Entry& e = table[std::string(key)];
      e.value = std::string(value);
      e.has_deadline = has_deadline;
      e.deadline =
          has_deadline ? now + std::chrono::ceil<std::chrono::milliseconds>(left) : Nanos{0};
      e.drop = has_deadline && drop_at_deadline;
      return {};
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("memory: put: ") + e.what());
    }
  }

  Status erase(std::string_view scope, std::string_view key, Nanos /*timeout*/) noexcept override {
    if (Status s = check(scope, key, ""); !s.ok()) return s;
    const std::lock_guard lock(mu_);
    if (const auto t = tables_.find(scope); t != tables_.end()) {
      if (const auto e = t->second.find(key); e != t->second.end()) t->second.erase(e);
      if (t->second.empty()) tables_.erase(t);
    }
    return {};
  }

  std::string_view backend() const noexcept override { return "memory"; }

 private:
  struct Entry {
    std::string value;
    bool has_deadline = false;
    Nanos deadline{0};
    bool drop = false;
  };
  using Table = std::map<std::string, Entry, std::less<>>;

  static void sweep(Table& table, Nanos now) {
    std::erase_if(table,
                  [&](const auto& kv) { return kv.second.drop && kv.second.deadline <= now; });
  }

  const Clock& clock_;
  std::mutex mu_;
  std::map<std::string, Table, std::less<>> tables_;  // guarded by mu_
};

}  // namespace

std::unique_ptr<SharedRules> memory_shared_rules(const Clock& clock) {
  return std::make_unique<MemorySharedRules>(clock);
}

RedisOptions redis_shared_rules_options() {
  RedisOptions o;
  o.key_prefix = "sluice:rules:";
  return o;
}

PostgresOptions postgres_shared_rules_options() {
  PostgresOptions o;
  o.table_prefix = "sluice_rules";
  return o;
}

}  // namespace sluice
