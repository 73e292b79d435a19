#include "server/engine.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "server/coordinators.h"
#include "server/policy.h"

namespace sluice::server {

using nlohmann::json;

namespace {

// A string field: present when `required`, and at most `max` bytes.
Status check_field(std::string_view field, std::string_view v, std::size_t max, bool required) {
  if (v.empty()) return required ? invalid(field, "must not be empty") : Status{};
  if (v.size() > max)
    return invalid(field,
                   "is " + std::to_string(v.size()) + " bytes; at most " + std::to_string(max));
  return {};
}

// A lease TTL a call asks for.
Status check_ttl(Nanos ttl, Nanos max) {
  if (ttl <= Nanos{0}) return invalid("ttl", "must be > 0");
  if (ttl > max)
    return invalid("ttl", "must be at most the server's max_lease_ttl (" +
                              std::to_string(seconds_of(max)) + "s)");
  return {};
}

Status check_lease_id(std::string_view id) {
  if (id.empty()) return invalid("lease_id", "must not be empty");
  if (!well_formed_lease_id(id)) return invalid("lease_id", "must be 32 hex digits");
  return {};
}

Status no_such_lease() {
  return Status(StatusCode::kNotFound,
                "lease_id: no such lease (never issued, already released, or expired)");
}

Status check_name(std::string_view field, std::string_view v) {
  return check_field(field, v, kMaxNameBytes, true);
}

std::string node_id_default() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] != '\0' ? host : "sluice") + "-" + std::to_string(getpid()) + "-" +
         new_lease_id().substr(0, 8);
}

}  // namespace

// ---- the policy set ----

class PolicySet {
 public:
  // A policy as built (`base`: what it shows, what leases count on, what a reload keeps or
  // retires) and as served (`served`: the base, or the base behind its chained rate policy).
  struct Entry {
    std::shared_ptr<Policy> base;
    std::shared_ptr<Policy> served;
  };

  ServerSettings settings;
  std::uint64_t generation = 1;
  std::map<std::string, Entry, std::less<>> policies;
  std::map<std::string, std::shared_ptr<NamedCoordinator>, std::less<>> coordinators;
  std::vector<std::string> warnings;  // from building this set (a coordinator not reached)

  [[nodiscard]] std::shared_ptr<Policy> find(std::string_view name) const {
    auto it = policies.find(name);
    return it == policies.end() ? nullptr : it->second.served;
  }
};

namespace {

// The coordinators `config`'s policies use, reusing from `old` (may be null) every one whose
// spec is unchanged.
Status build_coordinators(const SluiceConfig& config, const Clock& clock, const PolicySet* old,
                          PolicySet& set) {
  for (const auto& [policy, spec] : config.policies) {
    for (const std::string& name : spec.coordinators) {
      if (set.coordinators.contains(name)) continue;
      const CoordinatorSpec& cs = config.coordinators.at(name);
      if (old != nullptr) {
        auto it = old->coordinators.find(name);
        if (it != old->coordinators.end() && it->second->fingerprint == cs.fingerprint) {
          set.coordinators.emplace(name, it->second);
          continue;
        }
      }
      std::string warning;
      auto named = make_coordinator(name, cs, clock, warning);
      if (!named.ok()) return named.status();
      if (!warning.empty()) set.warnings.push_back(std::move(warning));
      set.coordinators.emplace(name, std::move(named.value()));
    }
  }
  return {};
}

// Builds `config` into a set of generation `generation` with `kinds`, reusing from `old` (may
// be null) every coordinator and policy whose spec is unchanged.
StatusOr<std::shared_ptr<PolicySet>> build(const SluiceConfig& config, const Clock& clock,
                                           const PolicyRegistry& kinds, const PolicySet* old,
                                           const std::string& node_id, std::uint64_t generation) {
  auto set = std::make_shared<PolicySet>();
  set->settings = config.server;
  set->settings.node_id = node_id;
  set->generation = generation;
  if (Status s = build_coordinators(config, clock, old, *set); !s.ok()) return s;
  // A fleet guard built by a reload joins under an id of its own: the guard it replaces is
  // still a member until it leaves, and its leave must not take the new guard's record (and
  // share) with it. While both are members the fleet splits among one node more: safe.
  const std::string policy_node =
      generation == 1 ? node_id : node_id + "/" + std::to_string(generation);
  const auto fleet = [&set](const std::string& name) { return set->coordinators.at(name)->fleet; };
  for (const auto& [name, spec] : config.policies) {
    std::string identity = spec.fingerprint;
    for (const std::string& c : spec.coordinators)
      identity += "\n#coordinator " + c + "\n" + set->coordinators.at(c)->fingerprint;
    if (old != nullptr) {
      auto it = old->policies.find(name);
      if (it != old->policies.end() && it->second.base->identity() == identity) {
        set->policies.emplace(name, PolicySet::Entry{it->second.base, it->second.base});
        continue;
      }
    }
    const PolicyKind* kind = kinds.find(spec.kind);
    if (kind == nullptr)
      return Status(StatusCode::kInvalidArgument,
                    "policy " + name + ": no policy kind named '" + spec.kind + "'");
    auto p = kind->build(BuildContext(name, spec, std::move(identity), clock, policy_node, fleet));
    if (!p.ok()) return Status(p.status().code(), "policy " + name + ": " + p.status().message());
    set->policies.emplace(name, PolicySet::Entry{p.value(), p.value()});
  }
  // Rate chaining: a policy naming a rate policy is served behind it.
  for (auto& [name, entry] : set->policies) {
    const std::string& rate = entry.base->rate_name();
    if (rate.empty()) continue;
    auto it = set->policies.find(rate);
    if (it == set->policies.end() || it->second.base->rate_family() == nullptr ||
        entry.base->admit_family() == nullptr)
      return Status(StatusCode::kInvalidArgument,
                    "policy " + name + ": rate: no rate policy named '" + rate + "'");
    entry.served = chain_rate(entry.base, it->second.base);
  }
  return set;
}

}  // namespace

// ---- the engine ----

StatusOr<std::unique_ptr<Engine>> Engine::create(const SluiceConfig& config, const Clock& clock,
                                                 const PolicyRegistry& kinds) {
  const std::string node_id =
      config.server.node_id.empty() ? node_id_default() : config.server.node_id;
  auto set = build(config, clock, kinds, nullptr, node_id, 1);
  if (!set.ok()) return set.status();
  return std::unique_ptr<Engine>(new Engine(clock, kinds, std::move(set.value())));
}

Engine::Engine(const Clock& clock, const PolicyRegistry& kinds,
               std::shared_ptr<const PolicySet> set)
    : clock_(clock), kinds_(kinds), set_(std::move(set)) {}

Engine::~Engine() { close(); }

std::shared_ptr<const PolicySet> Engine::current() const {
  const std::lock_guard lock(set_mu_);
  return set_;
}

Status Engine::usable() const {
  if (draining()) return Status(StatusCode::kUnavailable, "the server is shutting down");
  return {};
}

namespace {

// "an adaptive policy": a policy's kind as a message names it.
std::string a_kind(const Policy& p) { return kinds_phrase({p.kind()}); }

// The rate family of the policy a Check, Peek or CheckMany names.
StatusOr<RateFamily*> rate_policy(const PolicySet& set, const PolicyRegistry& kinds,
                                  std::string_view name) {
  if (Status s = check_name("policy", name); !s.ok()) return s;
  std::shared_ptr<Policy> p = set.find(name);
  if (p == nullptr)
    return Status(StatusCode::kNotFound, "policy: no policy named '" + std::string(name) + "'");
  RateFamily* rate = p->rate_family();
  if (rate == nullptr)
    return Status(
        StatusCode::kFailedPrecondition,
        "policy: '" + std::string(name) + "' is " + a_kind(*p) + "; Check and Peek take " +
            kinds_phrase(kinds.kinds_of(&PolicyKindParser::rate_family)) + " (use Admit)");
  return rate;  // `set` keeps it alive
}

Status check_call(const CheckCall& c) {
  if (Status s = check_field("key", c.key, kMaxKeyBytes, true); !s.ok()) return s;
  if (c.hits < 1) return invalid("hits", "must be >= 1, not " + std::to_string(c.hits));
  if (c.hits > kMaxHits)
    return invalid("hits",
                   "must be <= " + std::to_string(kMaxHits) + ", not " + std::to_string(c.hits));
  return {};
}

}  // namespace

StatusOr<RateDecision> Engine::check(const CheckCall& call) {
  if (Status s = usable(); !s.ok()) return s;
  const auto set = current();
  auto p = rate_policy(*set, kinds_, call.policy);
  if (!p.ok()) return p.status();
  if (Status s = check_call(call); !s.ok()) return s;
  return p.value()->check(call.key, static_cast<std::uint64_t>(call.hits), clock_.now());
}

StatusOr<RateDecision> Engine::peek(const CheckCall& call) const {
  if (Status s = usable(); !s.ok()) return s;
  const auto set = current();
  auto p = rate_policy(*set, kinds_, call.policy);
  if (!p.ok()) return p.status();
  if (Status s = check_call(call); !s.ok()) return s;
  return p.value()->peek(call.key, static_cast<std::uint64_t>(call.hits), clock_.now());
}

StatusOr<CheckManyResult> Engine::check_many(std::span<const CheckCall> calls) {
  if (Status s = usable(); !s.ok()) return s;
  if (calls.empty()) return invalid("checks", "must not be empty");
  if (calls.size() > kMaxBatch)
    return invalid("checks", "has " + std::to_string(calls.size()) + " entries; at most " +
                                 std::to_string(kMaxBatch));
  const auto set = current();
  // Validate everything before debiting anything.
  std::vector<RateFamily*> ps;
  ps.reserve(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    auto p = rate_policy(*set, kinds_, calls[i].policy);
    Status s = p.ok() ? check_call(calls[i]) : p.status();
    if (!s.ok()) return Status(s.code(), "checks[" + std::to_string(i) + "]." + s.message());
    ps.push_back(p.value());
  }
  const Nanos now = clock_.now();
  CheckManyResult out;
  out.decisions.reserve(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const auto hits = static_cast<std::uint64_t>(calls[i].hits);
    out.decisions.push_back(ps[i]->check(calls[i].key, hits, now));
    if (!out.decisions.back().allowed) {
      out.denied_index = static_cast<int>(i);
      for (std::size_t j = 0; j < i; ++j)
        ps[j]->refund(calls[j].key, static_cast<std::uint64_t>(calls[j].hits), now);
      return out;
    }
  }
  out.allowed = true;
  return out;
}

StatusOr<AdmitResult> Engine::admit(const AdmitCall& call) {
  if (Status s = usable(); !s.ok()) return s;
  const auto set = current();
  if (Status s = check_name("policy", call.policy); !s.ok()) return s;
  std::shared_ptr<Policy> p = set->find(call.policy);
  if (p == nullptr)
    return Status(StatusCode::kNotFound,
                  "policy: no policy named '" + std::string(call.policy) + "'");
  AdmitFamily* admit = p->admit_family();
  if (admit == nullptr)
    return Status(StatusCode::kFailedPrecondition,
                  "policy: '" + std::string(call.policy) + "' is " + a_kind(*p) + "; Admit takes " +
                      kinds_phrase(kinds_.kinds_of(&PolicyKindParser::admit_family)) +
                      " (use Check)");
  if (Status s = check_field("key", call.key, kMaxKeyBytes, false); !s.ok()) return s;
  for (auto [field, v] : {std::pair<const char*, std::string_view>{"tenant", call.tenant},
                          {"upstream", call.upstream},
                          {"route", call.route}})
    if (Status s = check_field(field, v, kMaxNameBytes, false); !s.ok()) return s;
  const Nanos ttl = call.ttl.value_or(set->settings.lease_ttl);
  if (Status s = check_ttl(ttl, set->settings.max_lease_ttl); !s.ok()) return s;

  const Nanos now = clock_.now();
  auto d = admit->admit(call, now, nullptr);
  if (!d.ok()) return d.status();
  AdmitResult out;
  if (!d.value().permit) {
    // A chained rate hit stays spent when the limit refuses: the call was attempted (as in the
    // gateway's order, where the rate limiter counts every request it lets through).
    out.refusal = std::move(d.value().refusal);
    out.refusal_owner = std::move(d.value().refusal_owner);
    return out;
  }
  Lease lease{std::move(*d.value().permit), now, ttl, now + ttl};
  out.lease_id = leases_.insert(std::move(lease));  // if this throws, the permit goes back
  out.admitted = true;
  out.ttl = ttl;
  return out;
}

StatusOr<Nanos> Engine::release(std::string_view lease_id, CallResult result,
                                std::optional<Nanos> rtt) {
  if (Status s = check_lease_id(lease_id); !s.ok()) return s;
  if (rtt && *rtt < Nanos{0}) return invalid("rtt", "must not be negative");
  const Nanos now = clock_.now();
  std::optional<Lease> lease = leases_.take(lease_id, now);
  if (!lease) return no_such_lease();
  const Nanos held = now - lease->admitted_at;
  lease->permit.finish(CallEnd{result, rtt.value_or(held), CallEnd::By::kClient});
  return held;
}

StatusOr<Nanos> Engine::heartbeat(std::string_view lease_id, std::optional<Nanos> ttl) {
  if (Status s = check_lease_id(lease_id); !s.ok()) return s;
  if (ttl)
    if (Status s = check_ttl(*ttl, current()->settings.max_lease_ttl); !s.ok()) return s;
  const Nanos now = clock_.now();
  const std::optional<Nanos> applied = leases_.extend(lease_id, ttl, now);
  if (!applied) return no_such_lease();
  return *applied;
}

std::size_t Engine::expire_leases() { return leases_.expire(clock_.now()); }

ServerSettings Engine::settings() const { return current()->settings; }
std::uint64_t Engine::generation() const { return current()->generation; }

std::vector<PolicyInfo> Engine::policies() const {
  const auto set = current();
  std::vector<PolicyInfo> out;
  for (const auto& [name, p] : set->policies) out.push_back(p.base->info());
  return out;
}

std::string Engine::policies_json() const {
  const auto set = current();
  json j = json::object();
  j["generation"] = set->generation;
  j["node_id"] = set->settings.node_id;
  j["leases"] = leases_.size();
  j["draining"] = draining();
  json ps = json::array();
  for (const auto& [name, p] : set->policies) ps.push_back(p.base->state());
  j["policies"] = std::move(ps);
  return j.dump();
}

std::vector<std::string> Engine::warnings() const { return current()->warnings; }

Readiness Engine::readiness() const {
  Readiness r;
  if (draining()) r.problems.push_back("the server is shutting down");
  const auto set = current();
  for (const auto& [name, p] : set->policies) {
    const PolicyReadiness pr = p.base->readiness();
    if (!pr.serving)
      r.problems.push_back("policy " + name + ": " + pr.why);
    else if (!pr.why.empty())
      r.degraded.push_back("policy " + name + ": " + pr.why);
  }
  r.ready = r.problems.empty();
  return r;
}

StatusOr<ReloadSummary> Engine::reload(const SluiceConfig& config) {
  const std::lock_guard lock(reload_mu_);
  const auto old = current();
  // The node id stays: fleets know this server by it.
  auto next = build(config, clock_, kinds_, old.get(), old->settings.node_id, old->generation + 1);
  if (!next.ok()) {
    reload_failures_.fetch_add(1, std::memory_order_relaxed);
    return next.status();
  }
  std::shared_ptr<PolicySet> set = std::move(next.value());
  ReloadSummary summary;
  summary.generation = set->generation;
  summary.warnings = set->warnings;
  for (const auto& [name, p] : set->policies) {
    auto it = old->policies.find(name);
    if (it == old->policies.end())
      summary.added.push_back(name);
    else if (it->second.base == p.base)
      summary.kept.push_back(name);
    else
      summary.changed.push_back(name);
  }
  std::vector<Policy*> replaced;
  for (const auto& [name, p] : old->policies) {
    auto it = set->policies.find(name);
    if (it == set->policies.end()) summary.removed.push_back(name);
    if (it == set->policies.end() || it->second.base != p.base) replaced.push_back(p.base.get());
  }
  // Serve the new set first, then retire what it replaced (a fleet policy's retire waits for
  // its runner and leaves its fleet): calls never see a gap where the policy refuses.
  std::shared_ptr<const PolicySet> previous = std::move(set);
  {
    const std::lock_guard lock(set_mu_);
    set_.swap(previous);
  }  // `previous` (the old set, still held by `old`) is released outside the lock
  for (Policy* p : replaced) p->retire();
  reloads_.fetch_add(1, std::memory_order_relaxed);
  return summary;
}

void Engine::close() {
  draining_.store(true, std::memory_order_relaxed);
  leases_.clear();
  const auto set = current();
  for (const auto& [name, p] : set->policies) p.base->retire();
}

// ---- metrics ----

namespace {

class Families {
 public:
  void add(prometheus::MetricFamily f) {
    prometheus::MetricFamily& into = family(f.name, f.help, f.type);
    for (auto& m : f.metric) into.metric.push_back(std::move(m));
  }
  prometheus::MetricFamily& family(const std::string& name, const std::string& help,
                                   prometheus::MetricType type) {
    auto it = index_.find(name);
    if (it != index_.end()) return out_[it->second];
    index_.emplace(name, out_.size());
    out_.push_back(prometheus::MetricFamily{name, help, type, {}});
    return out_.back();
  }
  // Folds in families from a collectable, each series labelled with the policy.
  void merge(std::vector<prometheus::MetricFamily> fams, const std::string& label,
             const std::string& value) {
    for (auto& f : fams) {
      prometheus::MetricFamily& into = family(f.name, f.help, f.type);
      for (auto& m : f.metric) {
        m.label.insert(m.label.begin(), prometheus::ClientMetric::Label{label, value});
        into.metric.push_back(std::move(m));
      }
    }
  }
  std::vector<prometheus::MetricFamily>& out() { return out_; }

 private:
  std::vector<prometheus::MetricFamily> out_;
  std::map<std::string, std::size_t> index_;
};

}  // namespace

std::string Engine::metrics_text() const {
  const auto set = current();
  Families f;
  using prometheus::MetricType;
  f.add(one("sluice_config_generation",
            "Generation of the config in force (1 at start, +1 per reload)", MetricType::Gauge,
            static_cast<double>(set->generation)));
  f.add(by_label("sluice_config_reloads_total", "Config reloads by result", "result",
                 {{"ok", reloads_.load(std::memory_order_relaxed)},
                  {"error", reload_failures_.load(std::memory_order_relaxed)}}));
  f.add(one("sluice_leases", "Leases held now (admitted calls not yet released or expired)",
            MetricType::Gauge, static_cast<double>(leases_.size())));
  f.add(one("sluice_leases_expired_total",
            "Leases that expired (their client stopped heartbeating)", MetricType::Counter,
            static_cast<double>(leases_.expired_total())));
  f.add(one("sluice_draining", "1 while the server shuts down", MetricType::Gauge,
            draining() ? 1 : 0));
  for (const auto& [name, named] : set->coordinators)
    f.merge(named->collect(), "coordinator", name);
  for (const auto& [name, p] : set->policies) f.merge(p.base->collect(), "policy", name);
  return prometheus::TextSerializer().Serialize(f.out());
}

}  // namespace sluice::server
