#include "sluice/local/gateway_validation.h"

#include <cstdint>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "local/gateway_merge.h"

namespace sluice {
namespace {

std::string at(std::string_view list, std::size_t i) {
  return std::string(list) + "[" + std::to_string(i) + "]";
}

// Appended piece by piece: `"'" + std::string(s)` trips g++ 12's bogus -Wrestrict at -O3
// (GCC bug 105651).
std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

class Validator {
 public:
  explicit Validator(const GatewayConfig& config) : c_(config) {}

  ValidationReport run() {
    check_tenants();
    check_cycles();
    check_upstreams();
    check_bindings();
    check_tenant_budgets();
    check_problem();
    return std::move(report_);
  }

 private:
  void error(std::string path, std::string message) {
    report_.errors.push_back({std::move(path), std::move(message)});
  }
  void warning(std::string path, std::string message) {
    report_.warnings.push_back({std::move(path), std::move(message)});
  }

  // Records `id` in `index`, reporting an empty or repeated id at `path`.
  void index_id(std::unordered_map<std::string_view, std::size_t>& index, std::string_view id,
                std::size_t i, const std::string& path) {
    if (id.empty()) return error(path, "must not be empty");
    if (!index.emplace(id, i).second) error(path, "duplicate id " + quoted(id));
  }

  void check_positive(const std::optional<std::uint32_t>& v, const std::string& path) {
    if (v && *v == 0) error(path, "is 0; must be > 0 (rule 1)");
  }

  void check_tenants() {
    for (std::size_t i = 0; i < c_.tenants.size(); ++i)
      index_id(tenants_, c_.tenants[i].id, i, at("tenants", i) + ".id");
    parent_.assign(c_.tenants.size(), std::nullopt);
    for (std::size_t i = 0; i < c_.tenants.size(); ++i) {
      const TenantConfig& t = c_.tenants[i];
      const std::string path = at("tenants", i);
      check_positive(t.global_concurrency_limit, path + ".global_concurrency_limit");
      if (!t.parent) continue;
      const auto it = tenants_.find(*t.parent);
      if (it == tenants_.end())
        error(path + ".parent", "unknown tenant " + quoted(*t.parent));
      else
        parent_[i] = it->second;
    }
  }

  // A parent chain longer than the number of tenants has a cycle; report it once per cycle
  // member, at the member's parent field.
  void check_cycles() {
    in_cycle_.assign(c_.tenants.size(), false);
    for (std::size_t i = 0; i < c_.tenants.size(); ++i) {
      std::optional<std::size_t> p = parent_[i];
      std::size_t steps = 0;
      while (p && *p != i && steps++ <= c_.tenants.size()) p = parent_[*p];
      if (p && *p == i) {
        in_cycle_[i] = true;
        error(at("tenants", i) + ".parent",
              "tenant " + quoted(c_.tenants[i].id) + " is its own ancestor (parent cycle)");
      }
    }
  }

  // True when `ancestor` is a strict ancestor of `tenant` (both indexes valid).
  bool is_ancestor(std::size_t ancestor, std::size_t tenant) const {
    std::optional<std::size_t> p = parent_[tenant];
    for (std::size_t steps = 0; p && steps <= c_.tenants.size(); ++steps) {
      if (*p == ancestor) return true;
      p = parent_[*p];
    }
    return false;
  }

  void check_limit(const ConcurrencyLimit& l, const std::string& path, bool in_binding) {
    if (in_binding && l.sharing)
      error(path + ".sharing", "only an upstream's limit says how it is shared");
    check_positive(l.max_concurrent, path + ".max_concurrent");
    check_positive(l.per_tenant_max, path + ".per_tenant_max");
    if (l.max_concurrent && l.per_tenant_max && *l.per_tenant_max > *l.max_concurrent)
      error(path + ".per_tenant_max", std::to_string(*l.per_tenant_max) +
                                          " exceeds max_concurrent " +
                                          std::to_string(*l.max_concurrent) + " (rule 2)");
    if (l.strategy != Strategy::kQueue) return;
    if (l.queue.max_depth == 0) error(path + ".queue.max_depth", "must be > 0 for queue");
    if (l.queue.timeout <= Nanos{0}) error(path + ".queue.timeout", "must be > 0 for queue");
  }

  void check_upstreams() {
    for (std::size_t i = 0; i < c_.upstreams.size(); ++i) {
      const UpstreamConfig& u = c_.upstreams[i];
      const std::string path = at("upstreams", i);
      index_id(upstreams_, u.id, i, path + ".id");
      if (u.host.empty()) error(path + ".host", "must not be empty");
      if (!tenants_.contains(u.owner)) error(path + ".owner", "unknown tenant " + quoted(u.owner));
      if (u.concurrency_limit)
        check_limit(*u.concurrency_limit, path + ".concurrency_limit", false);
      check_routes(u, path);
    }
  }

  void check_routes(const UpstreamConfig& u, const std::string& path) {
    // 0: the upstream sets no max (a plain value: g++ 12 misreads an optional here).
    const std::uint32_t upstream_max =
        u.concurrency_limit ? u.concurrency_limit->max_concurrent.value_or(0) : 0;
    std::unordered_map<std::string_view, std::size_t> ids;
    for (std::size_t j = 0; j < u.routes.size(); ++j) {
      const RouteConfig& r = u.routes[j];
      const std::string rpath = path + "." + at("routes", j);
      index_id(ids, r.id, j, rpath + ".id");
      check_positive(r.max_concurrent, rpath + ".max_concurrent");
      if (r.max_concurrent && upstream_max > 0 && *r.max_concurrent > upstream_max)
        error(rpath + ".max_concurrent", std::to_string(*r.max_concurrent) +
                                             " exceeds the upstream's max_concurrent " +
                                             std::to_string(upstream_max) + " (rule 3)");
    }
  }

  void check_bindings() {
    std::set<std::pair<std::size_t, std::size_t>> seen;
    for (std::size_t k = 0; k < c_.bindings.size(); ++k) {
      const BindingConfig& b = c_.bindings[k];
      const std::string path = at("bindings", k);
      const auto t = tenants_.find(b.tenant);
      const auto u = upstreams_.find(b.upstream);
      if (t == tenants_.end()) error(path + ".tenant", "unknown tenant " + quoted(b.tenant));
      if (u == upstreams_.end())
        error(path + ".upstream", "unknown upstream " + quoted(b.upstream));
      if (b.concurrency_limit) check_limit(*b.concurrency_limit, path + ".concurrency_limit", true);
      if (t == tenants_.end() || u == upstreams_.end()) continue;
      if (!seen.emplace(t->second, u->second).second)
        error(path, "duplicate binding of tenant " + quoted(b.tenant) + " to upstream " +
                        quoted(b.upstream));
      check_binding_scope(b, t->second, u->second, path);
      check_binding_merge(b, c_.upstreams[u->second], path);
    }
  }

  void check_binding_scope(const BindingConfig& b, std::size_t tenant, std::size_t upstream,
                           const std::string& path) {
    const auto owner = tenants_.find(c_.upstreams[upstream].owner);
    if (owner == tenants_.end() || in_cycle_[tenant]) return;  // reported elsewhere
    if (owner->second == tenant)
      error(path + ".upstream", "tenant " + quoted(b.tenant) + " owns upstream " +
                                    quoted(b.upstream) + "; bindings are for an ancestor's");
    else if (!is_ancestor(owner->second, tenant))
      error(path + ".upstream", "upstream " + quoted(b.upstream) + " is owned by " +
                                    quoted(owner->first) + ", not an ancestor of tenant " +
                                    quoted(b.tenant));
  }

  void check_binding_merge(const BindingConfig& b, const UpstreamConfig& u,
                           const std::string& path) {
    const auto& up = u.concurrency_limit;
    const Sharing sharing = up ? up->sharing.value_or(Sharing::kInherit) : Sharing::kInherit;
    if (!merge_binding(up, b.concurrency_limit)) {
      const std::string field =
          b.concurrency_limit ? ".concurrency_limit.max_concurrent" : ".concurrency_limit";
      error(path + field, "upstream " + quoted(u.id) +
                              " is private: the binding must provide its own max_concurrent");
      return;
    }
    if (sharing == Sharing::kPrivate || !b.concurrency_limit) return;
    const auto& own = *b.concurrency_limit;
    if (own.strategy == Strategy::kQueue)
      warning(path + ".concurrency_limit.strategy",
              "ignored: calls wait in the upstream's shared pool, with the upstream's strategy");
    if (!up) return;
    warn_looser(own.max_concurrent, up->max_concurrent, path + ".concurrency_limit.max_concurrent");
    warn_looser(own.per_tenant_max, up->per_tenant_max, path + ".concurrency_limit.per_tenant_max");
  }

  void warn_looser(const std::optional<std::uint32_t>& own,
                   const std::optional<std::uint32_t>& upstream, const std::string& path) {
    if (own && upstream && *own > *upstream)
      warning(path, std::to_string(*own) + " is looser than the upstream's " +
                        std::to_string(*upstream) + "; the stricter " + std::to_string(*upstream) +
                        " applies");
  }

  // Rule 4: sum of the effective per_tenant_max of every upstream a tenant uses.
  void check_tenant_budgets() {
    std::vector<std::uint64_t> sum(c_.tenants.size(), 0);
    for (const UpstreamConfig& u : c_.upstreams) {
      const auto owner = tenants_.find(u.owner);
      const auto ptm = owner_limit(u.concurrency_limit).per_tenant_max;
      if (owner != tenants_.end() && ptm) sum[owner->second] += *ptm;
    }
    for (const BindingConfig& b : c_.bindings) {
      const auto t = tenants_.find(b.tenant);
      const auto u = upstreams_.find(b.upstream);
      if (t == tenants_.end() || u == upstreams_.end()) continue;
      const auto merged =
          merge_binding(c_.upstreams[u->second].concurrency_limit, b.concurrency_limit);
      if (merged && merged->per_tenant_max) sum[t->second] += *merged->per_tenant_max;
    }
    for (std::size_t i = 0; i < c_.tenants.size(); ++i) {
      const auto& global = c_.tenants[i].global_concurrency_limit;
      if (global && *global > 0 && sum[i] > 0 && *global <= sum[i])
        warning(at("tenants", i) + ".global_concurrency_limit",
                std::to_string(*global) + " should be > " + std::to_string(sum[i]) +
                    ", the sum of per_tenant_max across the upstreams it uses (rule 4)");
    }
  }

  void check_problem() {
    if (c_.problem.status < 400 || c_.problem.status > 599)
      error("problem.status", std::to_string(c_.problem.status) + " is not a 4xx or 5xx status");
    if (c_.problem.type.empty()) error("problem.type", "must not be empty");
  }

  const GatewayConfig& c_;
  ValidationReport report_;
  std::unordered_map<std::string_view, std::size_t> tenants_;
  std::unordered_map<std::string_view, std::size_t> upstreams_;
  std::vector<std::optional<std::size_t>> parent_;
  std::vector<bool> in_cycle_;
};

}  // namespace

std::string ValidationReport::to_string() const {
  std::string out;
  for (const auto& e : errors) out += "error: " + e.path + ": " + e.message + "\n";
  for (const auto& w : warnings) out += "warning: " + w.path + ": " + w.message + "\n";
  return out;
}

ValidationReport validate(const GatewayConfig& config) { return Validator(config).run(); }

}  // namespace sluice
