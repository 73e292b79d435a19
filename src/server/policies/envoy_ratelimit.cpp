// The envoy_ratelimit kind (envoy_ratelimit.h): Envoy's rate limit service over
// envoyproxy/ratelimit's rules, each limit a RateLimiter on this server or a FederatedLimiter
// shared through a coordinator.
#include "server/policies/envoy_ratelimit.h"

#include <google/protobuf/arena.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <limits>
#include <map>
#include <memory_resource>
#include <mutex>
#include <span>
#include <utility>

#include "api/decode_errors.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "federation/io_pool.h"
#include "sluice/core/rate_coordinator.h"

namespace sluice::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
namespace pb = envoy::service::ratelimit::v3;

constexpr std::size_t kMaxMetricNames = 10'000;
constexpr std::size_t kMaxOverrides = 1'024;
constexpr std::size_t kMaxDescriptors = 256;
// The entry that makes a descriptor a charge (Envoy: a generic_key action with this
// descriptor_key, in a rate limit sent with apply_on_stream_done).
constexpr std::string_view kChargeEntry = "sluice_charge";
constexpr std::size_t kMaxDescriptorBytes = 16 * 1024;
constexpr std::size_t kShards = 16;
constexpr std::size_t kFederatedReasons =
    static_cast<std::size_t>(FederatedReason::kBudgetShort) + 1;
constexpr std::string_view kMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

struct HitCounts {
  std::atomic<std::uint64_t> within{0}, over{0}, shadow{0};
};

// A limit at work: a limiter on this server or one shared through the coordinator (neither
// when requests_per_unit is 0: every request is over it), and its hits, under its rule's
// metric name.
struct Counter {
  rls::Rule rule;  // a copy: the tree it came from may be gone (an override's is its own)
  std::shared_ptr<RateLimiter> limiter;
  std::unique_ptr<FederatedLimiter> shared;
  HitCounts hits;
  Nanos next_sweep{0};  // the sweeping loop's alone
  [[nodiscard]] bool zero() const { return limiter == nullptr && shared == nullptr; }
};

// One generation of the rule files: the tree and a counter per limit (null: unlimited).
struct Generation {
  std::shared_ptr<const rls::RuleTree> tree;
  std::vector<std::shared_ptr<Counter>> counters;  // by rule id
};

// The coordinator the shared limits lease from, with the threads that call it.
struct Sharing {
  Sharing(std::shared_ptr<RateCoordinator> c, FederationOptions o, std::string policy,
          std::size_t threads)
      : coordinator(std::move(c)),
        options(std::move(o)),
        prefix(std::move(policy)),
        pool(threads) {}
  std::shared_ptr<RateCoordinator> coordinator;
  FederationOptions options;  // the region resolved; budget and budget_id are each limit's
  std::string prefix;         // the policy's name, the start of every budget's name
  IoPool pool;
};

// A budget's name at the coordinator: no ':' (the coordinator's separator), so ':' and '%'
// are written %3A and %25.
std::string budget_name(const std::string& prefix, const std::string& path, const rls::Limit& l) {
  std::string raw = prefix + "/" + path + "/" + std::to_string(l.requests_per_unit) + "_per_" +
                    std::string(rls::name_of(l.unit));
  std::string out;
  out.reserve(raw.size());
  for (const char ch : raw) {
    if (ch == ':')
      out += "%3A";
    else if (ch == '%')
      out += "%25";
    else
      out += ch;
  }
  return out;
}

std::size_t keys_of(const Counter& c) {
  if (c.limiter != nullptr) return c.limiter->keys();
  if (c.shared != nullptr) return c.shared->stats().keys;
  return 0;
}

Nanos sweep_interval(const Counter& c) {
  return std::clamp<Nanos>(rls::period_of(c.rule.limit.unit), std::chrono::seconds(1),
                           std::chrono::seconds(60));
}

// Whether a rule's limit is shared: it says so, or the policy has a coordinator and it does
// not say otherwise.
bool is_shared(const rls::Rule& r, const Sharing* sharing) {
  return sharing != nullptr && r.shared.value_or(true) && !r.limit.unlimited;
}

// The counter of a rule's limit (a fresh one).
StatusOr<std::shared_ptr<Counter>> make_counter(const rls::Rule& r, std::size_t max_keys,
                                                const Clock& clock, Sharing* sharing) {
  auto c = std::make_shared<Counter>();
  c->rule = r;
  const rls::Limit& l = r.limit;
  if (l.unlimited || l.requests_per_unit == 0) return c;
  if (is_shared(r, sharing)) {
    FederationOptions o = sharing->options;
    o.budget.limit = l.requests_per_unit;
    o.budget.period = rls::period_of(l.unit);
    o.budget_id = budget_name(sharing->prefix, r.path, l);
    o.max_keys = max_keys;
    if (std::string why = o.validate(); !why.empty())
      return Status(StatusCode::kInvalidArgument, r.path + ": " + why);
    c->shared = std::make_unique<FederatedLimiter>(*sharing->coordinator, clock, std::move(o),
                                                   sharing->pool.executor());
    return c;
  }
  RateLimiterOptions o;
  o.rule.strategy = r.strategy;
  o.rule.limit = l.requests_per_unit;
  o.rule.period = rls::period_of(l.unit);
  o.shards = kShards;
  o.max_keys = max_keys;
  auto made = make_rate_limiter(o, clock);
  if (!made.ok()) return made.status();
  c->limiter = std::move(made.value());
  return c;
}

// The generation of `tree`, taking over the counters of `old` (may be null) whose path and
// unit stay: they keep what they have counted, with the new requests_per_unit once `apply`
// runs (their limiters are shared until then and must not change before it).
struct Prepared {
  std::shared_ptr<Generation> next;
  // Counters kept, with their new limit: applied on commit (their limiters take the new
  // requests_per_unit; the rest of what a counter holds, its path and unit, stays as it was).
  std::vector<std::pair<std::shared_ptr<Counter>, rls::Limit>> retune;
};

StatusOr<Prepared> prepare(const std::shared_ptr<const rls::RuleTree>& tree, const Generation* old,
                           std::size_t max_keys, const Clock& clock, Sharing* sharing) {
  std::map<std::string, std::shared_ptr<Counter>, std::less<>> kept;
  if (old != nullptr)
    for (const auto& c : old->counters)
      if (c != nullptr) kept.emplace(c->rule.path, c);
  Prepared p;
  p.next = std::make_shared<Generation>();
  p.next->tree = tree;
  for (const auto& r : tree->rules()) {
    if (r->limit.unlimited) {
      p.next->counters.push_back(nullptr);
      continue;
    }
    auto it = kept.find(r->path);
    if (it != kept.end()) {
      const Counter& was = *it->second;
      const bool shared = is_shared(*r, sharing);
      // A shared budget's name has its limit: a new limit is a new budget.
      const bool same = was.rule.limit.unit == r->limit.unit && was.rule.strategy == r->strategy &&
                        (was.shared != nullptr) == shared &&
                        was.zero() == (r->limit.requests_per_unit == 0) &&
                        (!shared || was.rule.limit.requests_per_unit == r->limit.requests_per_unit);
      if (same) {
        p.next->counters.push_back(it->second);
        p.retune.emplace_back(it->second, r->limit);
        continue;
      }
    }
    auto c = make_counter(*r, max_keys, clock, sharing);
    if (!c.ok()) return c.status();
    p.next->counters.push_back(std::move(c.value()));
  }
  return p;
}

// One request being decided: what its answer needs once every limit has answered (some after
// a lease). Holds no request bytes: the keys and names are its own.
struct Pending {
  // The arrays below take their memory from here first: a request of up to two descriptors
  // is decided with this one allocation (the Pending's own), which stays small enough for
  // malloc's per-thread cache.
  std::array<std::byte, 512> buffer;
  std::pmr::monotonic_buffer_resource memory{buffer.data(), buffer.size()};
  std::shared_ptr<Generation> g;  // the matched rules point into its tree
  std::pmr::vector<std::shared_ptr<Counter>> counters{&memory};
  std::pmr::vector<const rls::Rule*> matched{&memory};
  std::pmr::vector<rls::Applied> applied{&memory};
  std::pmr::vector<std::string> keys{&memory};
  std::pmr::vector<std::string> metrics{&memory};
  std::pmr::vector<std::uint64_t> hits{&memory};
  std::pmr::vector<char> charge{&memory};  // by descriptor: a charge (its sluice_charge entry)
  std::pmr::vector<std::optional<FederatedDecision>> decisions{&memory};  // what each got
  Nanos now{0};
  // The handoff between decide() and the leases' callbacks: whichever comes last answers.
  std::mutex mu;
  std::size_t started = 0, received = 0;  // leases waited for, and answered
  bool returned = false;                  // decide() has returned (deferred)
  Completion<RlsAnswer> done;
};

class EnvoyRateLimitPolicy final : public Policy {
 public:
  EnvoyRateLimitPolicy(const BuildContext& c, const EnvoyRateLimitSpec& spec,
                       std::shared_ptr<Sharing> sharing, std::shared_ptr<Generation> generation)
      : Policy(c.name, "envoy_ratelimit", ""),
        clock_(c.clock),
        sharing_(std::move(sharing)),
        sharing_spec_(spec.sharing),
        generation_(std::move(generation)),
        shadow_mode_(spec.shadow_mode),
        headers_(spec.response_headers),
        max_keys_(spec.max_keys),
        files_(spec.files) {
    remember_shared(*generation_.load());
    start_loop(c.clock, [this](Nanos now) { return sweep(now); });
  }
  // The loop first; then the requests still waiting for a lease (each is answered within
  // lease_timeout); then the shared limits give their unspent escrow back, on this thread.
  ~EnvoyRateLimitPolicy() override {
    retire();
    {
      std::unique_lock lock(deferred_mu_);
      deferred_cv_.wait(lock, [this] { return deferred_ == 0; });
    }
    generation_.store(nullptr);
    std::vector<std::shared_ptr<Counter>> all;
    {
      const std::lock_guard lock(mu_);
      all = std::move(owned_);
      overrides_.clear();
    }
    const Nanos now = clock_.now();
    for (const auto& c : all) c->shared->relinquish_all(now);
    all.clear();  // waits for each limiter's calls, then the pool stops with sharing_
  }
  EnvoyRateLimitPolicy(const EnvoyRateLimitPolicy&) = delete;
  EnvoyRateLimitPolicy& operator=(const EnvoyRateLimitPolicy&) = delete;

  // In place unless the sharing changes: the new rules, each limit that stays keeping its
  // counters.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const EnvoyRateLimitSpec& spec = *c.spec.as<EnvoyRateLimitSpec>();
    if (!spec.sharing.same(sharing_spec_)) return Reconfiguration();
    const std::shared_ptr<Generation> now = generation();
    auto p = prepare(spec.rules, now.get(), spec.max_keys, clock_, sharing_.get());
    if (!p.ok()) return p.status();
    return Reconfiguration([this, p = std::move(p.value()), shadow = spec.shadow_mode,
                            headers = spec.response_headers, max_keys = spec.max_keys,
                            files = spec.files]() mutable {
      for (auto& [counter, limit] : p.retune) {
        if (counter->limiter != nullptr) {
          RateRule to = counter->limiter->rule();
          to.limit = limit.requests_per_unit;
          counter->limiter->reconfigure(to, max_keys);
        }
      }
      remember_shared(*p.next);
      generation_.store(std::move(p.next), std::memory_order_release);
      {
        // The limits requests set take the new max_keys too, and so do those made from now.
        const std::lock_guard lock(mu_);
        files_ = std::move(files);
        max_keys_ = max_keys;
        for (const auto& [_, c] : overrides_)
          if (c->limiter != nullptr) c->limiter->reconfigure(c->limiter->rule(), max_keys);
      }
      shadow_mode_.store(shadow, std::memory_order_relaxed);
      headers_.store(headers, std::memory_order_relaxed);
    });
  }

  [[nodiscard]] bool has_domain(std::string_view domain) const {
    return generation()->tree->has_domain(domain);
  }

  // The answer now, or nullopt when a shared limit waits for a lease: `later` then gets it,
  // within lease_timeout.
  Decided<RlsAnswer> decide(const RlsRequest& req, Deferral<RlsAnswer>& later) {
    if (req.domain.empty()) return invalid("domain: must not be empty");
    if (req.descriptors.empty())
      return invalid("descriptors: must not be empty (a request has at least one)");
    if (req.descriptors.size() > kMaxDescriptors)
      return invalid("descriptors: " + std::to_string(req.descriptors.size()) +
                     " descriptors; a request has at most " + std::to_string(kMaxDescriptors));
    auto p = std::make_shared_for_overwrite<Pending>();  // the buffer is not zeroed first
    p->g = generation();
    const std::size_t n = req.descriptors.size();
    p->counters.resize(n);
    p->matched.assign(n, nullptr);
    p->keys.resize(n);
    p->metrics.resize(n);
    p->hits.assign(n, 0);
    p->charge.assign(n, 0);
    p->decisions.resize(n);
    std::vector<rls::Entry> unmarked;  // a charge's entries without its marker
    const bool known = p->g->tree->has_domain(req.domain);
    if (!known) unknown_domain_.fetch_add(1, std::memory_order_relaxed);
    for (std::size_t i = 0; i < n; ++i) {
      const RlsDescriptor& d = req.descriptors[i];
      if (d.entries.empty()) return invalid(at(i) + ".entries: must not be empty");
      std::size_t bytes = 0;
      for (const rls::Entry& e : d.entries) bytes += e.key.size() + e.value.size();
      if (bytes > kMaxDescriptorBytes)
        return invalid(at(i) + ".entries: " + std::to_string(bytes) +
                       " bytes of keys and values; "
                       "a descriptor has at most " +
                       std::to_string(kMaxDescriptorBytes));
      if (!known) continue;
      // A charge (the call is over: its cost is counted, never refused) says so with an entry
      // keyed sluice_charge, which is not part of what it is counted under.
      const std::vector<rls::Entry>* entries = &d.entries;
      if (std::any_of(d.entries.begin(), d.entries.end(),
                      [](const rls::Entry& e) { return e.key == kChargeEntry; })) {
        unmarked.clear();
        for (const rls::Entry& e : d.entries)
          if (e.key != kChargeEntry) unmarked.push_back(e);
        if (unmarked.empty())
          return invalid(at(i) + ".entries: " + std::string(kChargeEntry) +
                         " marks a charge of the entries beside it; there are none");
        p->charge[i] = 1;
        entries = &unmarked;
      }
      if (d.limit) {
        const std::optional<rls::Unit> unit = rls::unit_of(d.limit->unit);
        if (!unit)
          return invalid(at(i) + ".limit.unit: must be a unit (SECOND ... YEAR), not " +
                         std::to_string(d.limit->unit));
        auto c = override_counter(d.limit->requests_per_unit, *unit);
        if (!c.ok()) return Status(c.status().code(), at(i) + ".limit: " + c.status().message());
        p->counters[i] = std::move(c.value());
        p->matched[i] = &p->counters[i]->rule;
        p->keys[i] = rls::counter_of(*entries);
        p->metrics[i] = p->counters[i]->rule.path;
        continue;
      }
      rls::Match m = p->g->tree->match(req.domain, *entries);
      if (m.rule == nullptr) continue;
      p->matched[i] = m.rule;
      p->counters[i] = p->g->counters[m.rule->id];
      p->keys[i] = std::move(m.counter);
      p->metrics[i] = std::move(m.metric);
    }

    const std::vector<rls::Applied> applied = rls::applied(p->matched);
    p->applied.assign(applied.begin(), applied.end());
    p->now = clock_.now();
    for (std::size_t i = 0; i < n; ++i) {
      if (p->applied[i] != rls::Applied::kLimit) continue;
      Counter& c = *p->counters[i];
      const RlsDescriptor& d = req.descriptors[i];
      p->hits[i] = d.hits_addend ? *d.hits_addend : std::max<std::uint64_t>(1, req.hits_addend);
      if (p->charge[i]) {
        p->decisions[i] = charged(c, p->keys[i], p->hits[i], p->now);
        continue;
      }
      if (c.limiter != nullptr) {
        const RateDecision dec = c.limiter->check(p->keys[i], p->hits[i], p->now);
        p->decisions[i] = FederatedDecision{
            dec, dec.allowed ? FederatedReason::kAdmitted : FederatedReason::kBudgetSpent};
      } else if (c.shared != nullptr) {
        if (auto dec = c.shared->try_check(p->keys[i], p->hits[i], p->now)) {
          p->decisions[i] = *dec;
          continue;
        }
        {
          const std::lock_guard lock(p->mu);
          ++p->started;
        }
        c.shared->check(p->keys[i], p->hits[i], p->now,
                        [this, p, i](FederatedDecision dec) { on_lease(p, i, dec); });
      }
    }
    {
      std::unique_lock lock(p->mu);
      if (p->received < p->started) {
        {
          const std::lock_guard count(deferred_mu_);
          ++deferred_;
        }
        p->done = later.defer();
        p->returned = true;
        return std::nullopt;
      }
    }
    return finish(*p);
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    const std::shared_ptr<Generation> g = generation();
    std::size_t keys = 0;
    std::size_t limits = 0;
    std::size_t shared = 0;
    FederationStats leases;
    for (const auto& c : g->counters) {
      if (c == nullptr) continue;
      ++limits;
      keys += keys_of(*c);
      if (c->shared == nullptr) continue;
      ++shared;
      const FederationStats st = c->shared->stats();
      leases.leases += st.leases;
      leases.lease_failures += st.lease_failures;
    }
    info.limit = 0;
    if (sharing_ != nullptr) {
      j["coordinator"] = std::string(sharing_->coordinator->backend());
      j["region"] = sharing_->options.region;
      j["shared_limits"] = shared;
      j["leases"] = leases.leases;
      j["lease_failures"] = leases.lease_failures;
      j["outage"] = sharing_spec_.outage == RlsOutage::kError ? "error" : "over-limit";
      nlohmann::json refusals = nlohmann::json::object();
      for (std::size_t r = 1; r < kFederatedReasons; ++r)
        if (const std::uint64_t v = shared_refusals_[r].load(std::memory_order_relaxed); v > 0)
          refusals[std::string(to_string(static_cast<FederatedReason>(r)))] = v;
      j["shared_refusals"] = std::move(refusals);
    }
    j["domains"] = g->tree->domains();
    j["limits"] = limits;
    j["keys"] = keys;
    j["shadow_mode"] = shadow_mode_.load(std::memory_order_relaxed);
    {
      const std::lock_guard lock(mu_);
      j["files"] = files_;
    }
    j["ok"] = requests_ok_.load(std::memory_order_relaxed);
    j["over_limit"] = requests_over_.load(std::memory_order_relaxed);
    j["unavailable"] = requests_unavailable_.load(std::memory_order_relaxed);
    j["unknown_domain"] = unknown_domain_.load(std::memory_order_relaxed);
    j["charged"] = charged_.load(std::memory_order_relaxed);
  }

  void metrics(std::vector<MetricFamily>& out) const override {
    out.push_back(
        by_label("sluice_rls_requests_total", "ShouldRateLimit answers by overall code", "code",
                 {{"ok", requests_ok_.load(std::memory_order_relaxed)},
                  {"over_limit", requests_over_.load(std::memory_order_relaxed)},
                  {"unavailable", requests_unavailable_.load(std::memory_order_relaxed)}}));
    out.push_back(one("sluice_rls_unknown_domain_total",
                      "ShouldRateLimit requests for a domain no rule file has (answered OK)",
                      MetricType::Counter,
                      static_cast<double>(unknown_domain_.load(std::memory_order_relaxed))));
    out.push_back(one("sluice_rls_charged_hits_total",
                      "Hits charged by descriptors marked sluice_charge (counted, never refused)",
                      MetricType::Counter,
                      static_cast<double>(charged_.load(std::memory_order_relaxed))));
    const std::shared_ptr<Generation> g = generation();
    MetricFamily hits{"sluice_rls_hits_total",
                      "Hits of envoy_ratelimit limits by rule and result",
                      MetricType::Counter,
                      {}};
    std::size_t keys = 0;
    std::size_t limits = 0;
    const auto add = [&hits](const std::string& rule, const HitCounts& h) {
      for (auto [result, v] :
           {std::pair{"within_limit", &h.within}, std::pair{"over_limit", &h.over},
            std::pair{"shadow_mode", &h.shadow}}) {
        ClientMetric m;
        m.label = {{"rule", rule}, {"result", result}};
        m.counter.value = static_cast<double>(v->load(std::memory_order_relaxed));
        hits.metric.push_back(std::move(m));
      }
    };
    std::size_t shared = 0;
    FederationStats leases;
    for (const auto& c : g->counters) {
      if (c == nullptr) continue;
      ++limits;
      keys += keys_of(*c);
      add(c->rule.path, c->hits);
      if (c->shared == nullptr) continue;
      ++shared;
      const FederationStats st = c->shared->stats();
      leases.leases += st.leases;
      leases.lease_failures += st.lease_failures;
    }
    {
      const std::lock_guard lock(mu_);
      for (const auto& [name, h] : named_hits_) add(name, *h);
    }
    out.push_back(std::move(hits));
    out.push_back(one("sluice_rls_limits", "Limits the rule files configure", MetricType::Gauge,
                      static_cast<double>(limits)));
    out.push_back(one("sluice_rls_keys", "Counters the limits hold", MetricType::Gauge,
                      static_cast<double>(keys)));
    if (sharing_ == nullptr) return;
    out.push_back(one("sluice_rls_shared_limits", "Limits shared through the coordinator",
                      MetricType::Gauge, static_cast<double>(shared)));
    MetricFamily refusals{"sluice_rls_shared_refusals_total",
                          "Refusals of shared limits by reason (coordinator_restarted: the "
                          "coordinator lost its state, so the window counts as spent)",
                          MetricType::Counter,
                          {}};
    for (std::size_t r = 1; r < kFederatedReasons; ++r) {
      ClientMetric m;
      m.label = {{"reason", std::string(to_string(static_cast<FederatedReason>(r)))}};
      m.counter.value = static_cast<double>(shared_refusals_[r].load(std::memory_order_relaxed));
      refusals.metric.push_back(std::move(m));
    }
    out.push_back(std::move(refusals));
    out.push_back(one("sluice_rls_leases_total",
                      "Escrow lease calls the shared limits made to the coordinator",
                      MetricType::Counter, static_cast<double>(leases.leases)));
    out.push_back(one("sluice_rls_lease_failures_total",
                      "Lease calls of the shared limits that failed or timed out",
                      MetricType::Counter, static_cast<double>(leases.lease_failures)));
  }

 private:
  static Status invalid(std::string why) {
    return Status(StatusCode::kInvalidArgument, std::move(why));
  }
  static std::string at(std::size_t i) { return "descriptors[" + std::to_string(i) + "]"; }

  // A lease's answer for descriptor `i` of `p`: the last one answers the request.
  void on_lease(const std::shared_ptr<Pending>& p, std::size_t i, const FederatedDecision& d) {
    {
      const std::lock_guard lock(p->mu);
      p->decisions[i] = d;
      ++p->received;
      if (!p->returned || p->received < p->started) return;
    }
    StatusOr<RlsAnswer> a = finish(*p);
    Completion<RlsAnswer> done = std::move(p->done);
    done(std::move(a));
    // The last touch of this policy: its destructor waits for this count.
    const std::lock_guard count(deferred_mu_);
    --deferred_;
    deferred_cv_.notify_all();
  }

  // The answer once every limit of `p` has decided. It lets go of the counters: a shared
  // limiter is only ever destroyed on the policy's own threads, never in a lease's callback.
  StatusOr<RlsAnswer> finish(Pending& p) {
    const std::size_t n = p.matched.size();
    RlsAnswer out;
    out.statuses.resize(n);
    std::array<std::byte, 256> buffer;  // the two arrays below, for up to 16 descriptors
    std::pmr::monotonic_buffer_resource memory(buffer.data(), buffer.size());
    std::pmr::vector<rls::Outcome> outcomes(n, &memory);
    std::pmr::vector<std::uint64_t> taken(n, 0, &memory);  // hits added, given back if over
    std::optional<std::size_t> unreachable;  // a limit that counts and could not be decided
    const bool shadow_all = shadow_mode_.load(std::memory_order_relaxed) || shadow();
    for (std::size_t i = 0; i < n; ++i) {
      RlsStatus& s = out.statuses[i];
      if (p.applied[i] == rls::Applied::kUnlimited) {
        s.remaining = std::numeric_limits<std::uint32_t>::max();
        continue;
      }
      if (p.applied[i] != rls::Applied::kLimit) continue;
      const rls::Rule& r = *p.matched[i];
      s.limit = RlsStatus::Current{r.limit.requests_per_unit, r.limit.unit, r.limit.name};
      bool over = true;
      if (const std::optional<FederatedDecision>& d = p.decisions[i]) {
        over = !d->rate.allowed;
        if (!over && !p.charge[i]) taken[i] = p.hits[i];  // a charge stays whatever happens
        s.remaining = static_cast<std::uint32_t>(
            std::min<std::uint64_t>(d->rate.remaining, std::numeric_limits<std::uint32_t>::max()));
        s.until_reset = d->rate.reset_after;
        if (over && p.counters[i]->shared != nullptr) {
          shared_refusals_[static_cast<std::size_t>(d->reason)].fetch_add(
              1, std::memory_order_relaxed);
          if (d->reason == FederatedReason::kCoordinatorUnreachable && !r.shadow_mode &&
              !shadow_all && !unreachable)
            unreachable = i;
        }
      } else {
        s.until_reset = window_left(r.limit.unit, p.now);
      }
      outcomes[i] = rls::Outcome{
          .over = over, .quota = r.quota_mode, .shadow = r.shadow_mode, .limited = true};
      s.over = over && !r.shadow_mode;
    }
    const bool over = rls::over_limit(outcomes);
    const bool error = unreachable && sharing_spec_.outage == RlsOutage::kError;
    out.over = over && !shadow_all;
    if (out.over || error) {
      // Refused: what it added goes back, so a refused request costs no limit anything.
      for (std::size_t i = 0; i < n; ++i) {
        if (taken[i] == 0) continue;
        Counter& c = *p.counters[i];
        if (c.limiter != nullptr)
          c.limiter->refund(p.keys[i], taken[i], p.now);
        else
          c.shared->refund(p.keys[i], taken[i], p.now);
        out.statuses[i].remaining = static_cast<std::uint32_t>(
            std::min<std::uint64_t>(std::uint64_t{out.statuses[i].remaining} + taken[i],
                                    p.matched[i]->limit.requests_per_unit));
      }
    }
    if (error) {
      requests_unavailable_.fetch_add(1, std::memory_order_relaxed);
      const std::string path = p.matched[*unreachable]->path;
      p.counters.clear();
      p.g.reset();
      return Status(StatusCode::kUnavailable,
                    at(*unreachable) + ": the shared limit " + path +
                        " cannot be decided: its coordinator cannot be reached and this server "
                        "holds no escrow for it (outage: error; over-limit would refuse)");
    }
    count(p.counters, p.metrics, outcomes, over, shadow_all);
    add_headers(out, p.matched, p.applied);
    p.counters.clear();
    p.g.reset();
    return out;
  }

  // A charge of `hits` to `key` under counter `c`: counted whatever is left (an overdraft
  // makes the limit's later checks wait), so its status is OK; OVER_LIMIT only when it could
  // not be recorded (a new key while the limit holds max_keys).
  FederatedDecision charged(Counter& c, const std::string& key, std::uint64_t hits, Nanos now) {
    RateDecision d;
    if (c.limiter == nullptr && c.shared == nullptr) {  // requests_per_unit 0: nothing to count
      d.allowed = true;
      return FederatedDecision{d, FederatedReason::kAdmitted};
    }
    const RateCharge ch =
        c.limiter != nullptr ? c.limiter->charge(key, hits, now) : c.shared->charge(key, hits, now);
    if (ch.recorded) charged_.fetch_add(hits, std::memory_order_relaxed);
    d.allowed = ch.recorded;
    d.limit = ch.limit;
    d.remaining = ch.remaining;
    d.reset_after = ch.reset_after;
    d.retry_after = ch.retry_after;
    d.reason = ch.reason;
    return FederatedDecision{
        d, ch.recorded ? FederatedReason::kAdmitted : FederatedReason::kKeyCapacity};
  }

  // Every shared counter is kept here as well as where it serves, so that the last reference
  // to it is never a request's (dropped on a lease's thread): sweep() lets go of those no
  // generation or request holds any more, on the policy's loop.
  void remember_shared(const Generation& g) {
    const std::lock_guard lock(mu_);
    for (const auto& c : g.counters)
      if (c != nullptr && c->shared != nullptr &&
          std::find(owned_.begin(), owned_.end(), c) == owned_.end())
        owned_.push_back(c);
  }

  [[nodiscard]] std::shared_ptr<Generation> generation() const {
    return generation_.load(std::memory_order_acquire);
  }

  // The headers for Envoy to add: every limit applied, in the request's order; Retry-After
  // when over, until the last limit that refused it starts its next window.
  void add_headers(RlsAnswer& out, std::span<const rls::Rule* const> matched,
                   std::span<const rls::Applied> applied) const {
    const RateLimitHeaders which = headers_.load(std::memory_order_relaxed);
    if (which == RateLimitHeaders::kNone) return;
    std::vector<QuotaState> limits;
    std::optional<Nanos> retry;
    for (std::size_t i = 0; i < out.statuses.size(); ++i) {
      const RlsStatus& s = out.statuses[i];
      if (applied[i] != rls::Applied::kLimit || !s.limit) continue;
      const rls::Rule& r = *matched[i];
      const Nanos reset = s.until_reset.value_or(Nanos{0});
      limits.push_back(QuotaState{.name = r.limit.name.empty() ? r.path : r.limit.name,
                                  .quota = s.limit->requests_per_unit,
                                  .window = rls::period_of(s.limit->unit),
                                  .remaining = s.remaining,
                                  .reset = reset});
      if (out.over && s.over) retry = std::max(retry.value_or(Nanos{0}), reset);
    }
    add_rate_limit_headers(which, limits, retry, out.headers);
  }

  // What is left of the window of `unit` at `now` (a limit of 0 has no limiter to ask).
  static Nanos window_left(rls::Unit unit, Nanos now) {
    const Nanos period = rls::period_of(unit);
    return period - Nanos{now.count() % period.count()};
  }

  // The counter of a limit a request sets (one per distinct limit, at most kMaxOverrides).
  StatusOr<std::shared_ptr<Counter>> override_counter(std::uint32_t per, rls::Unit unit) {
    const std::lock_guard lock(mu_);
    const auto key = std::pair{static_cast<std::uint32_t>(unit), per};
    if (auto it = overrides_.find(key); it != overrides_.end()) return it->second;
    if (overrides_.size() >= kMaxOverrides)
      return Status(StatusCode::kResourceExhausted,
                    "this policy counts " + std::to_string(kMaxOverrides) +
                        " distinct override limits already; no more are taken");
    rls::Rule rule;
    rule.limit.requests_per_unit = per;
    rule.limit.unit = unit;
    rule.path = "override." + std::to_string(per) + "_per_" + std::string(rls::name_of(unit));
    auto c = make_counter(rule, max_keys_, clock_, sharing_.get());  // under mu_
    if (!c.ok()) return c.status();
    if (c.value()->shared != nullptr) owned_.push_back(c.value());
    overrides_.emplace(key, c.value());
    return c.value();
  }

  void count(std::span<const std::shared_ptr<Counter>> counters,
             std::span<const std::string> metrics, std::span<const rls::Outcome> outcomes,
             bool over, bool shadow_all) {
    std::uint64_t shadowed = 0;
    for (std::size_t i = 0; i < counters.size(); ++i) {
      const rls::Outcome& o = outcomes[i];
      if (!o.limited) continue;
      HitCounts* h = &counters[i]->hits;
      if (metrics[i] != counters[i]->rule.path) h = named(metrics[i]);
      if (!o.over) {
        h->within.fetch_add(1, std::memory_order_relaxed);
      } else if (o.shadow) {
        h->shadow.fetch_add(1, std::memory_order_relaxed);
        ++shadowed;
      } else {
        h->over.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (over && shadow_all) ++shadowed;
    if (shadowed > 0) count_shadow_denied(shadowed);
    (over && !shadow_all ? requests_over_ : requests_ok_).fetch_add(1, std::memory_order_relaxed);
  }

  // The hits of a metric name a rule's detailed_metric or value_to_metric made.
  HitCounts* named(const std::string& name) {
    const std::lock_guard lock(mu_);
    auto it = named_hits_.find(name);
    if (it == named_hits_.end()) {
      const std::string key = named_hits_.size() < kMaxMetricNames ? name : "(other)";
      it = named_hits_.find(key);
      if (it == named_hits_.end())
        it = named_hits_.emplace(key, std::make_unique<HitCounts>()).first;
    }
    return it->second.get();
  }

  Nanos sweep(Nanos now) {
    const std::shared_ptr<Generation> g = generation();
    std::vector<std::shared_ptr<Counter>> all(g->counters.begin(), g->counters.end());
    std::vector<std::shared_ptr<Counter>> gone;  // shared limits no rule or request holds
    {
      const std::lock_guard lock(mu_);
      for (const auto& [_, c] : overrides_) all.push_back(c);
      for (auto it = owned_.begin(); it != owned_.end();) {
        if (it->use_count() == 1) {
          gone.push_back(std::move(*it));
          it = owned_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& c : gone) c->shared->relinquish_all(now);
    gone.clear();
    for (const auto& c : all) {
      if (c == nullptr || c->zero() || now < c->next_sweep) continue;
      if (c->limiter != nullptr)
        c->limiter->sweep(now);
      else
        c->shared->sweep(now);
      c->next_sweep = now + sweep_interval(*c);
    }
    return now + std::chrono::seconds(1);
  }

  const Clock& clock_;
  const std::shared_ptr<Sharing> sharing_;  // null: every limit is this server's own
  const RlsSharing sharing_spec_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<Counter>> owned_;  // every shared counter; guarded by mu_
  std::mutex deferred_mu_;
  std::condition_variable deferred_cv_;
  std::size_t deferred_ = 0;  // requests waiting for a lease; guarded by deferred_mu_
  // Swapped whole by a reload; read per request without a lock.
  std::atomic<std::shared_ptr<Generation>> generation_;
  std::atomic<bool> shadow_mode_;
  std::atomic<RateLimitHeaders> headers_;
  std::size_t max_keys_;            // guarded by mu_
  std::vector<std::string> files_;  // guarded by mu_
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::shared_ptr<Counter>>
      overrides_;                                                              // guarded by mu_
  std::map<std::string, std::unique_ptr<HitCounts>, std::less<>> named_hits_;  // guarded by mu_
  // Refusals of shared limits, by FederatedReason.
  std::array<std::atomic<std::uint64_t>, kFederatedReasons> shared_refusals_{};
  std::atomic<std::uint64_t> requests_ok_{0}, requests_over_{0}, requests_unavailable_{0},
      unknown_domain_{0}, charged_{0};
};

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const EnvoyRateLimitSpec& spec = *c.spec.as<EnvoyRateLimitSpec>();
  std::shared_ptr<Sharing> sharing;
  if (!spec.sharing.coordinator.empty()) {
    auto coordinator = c.coordinator<RateCoordinator>(
        spec.sharing.coordinator, "a rate-budget interface (for shared limits)");
    if (!coordinator.ok()) return coordinator.status();
    FederationOptions o = spec.sharing.options;
    if (o.region.empty()) o.region = c.node_id;
    sharing = std::make_shared<Sharing>(std::move(coordinator.value()), std::move(o), c.name,
                                        spec.sharing.io_threads);
  }
  auto p = prepare(spec.rules, nullptr, spec.max_keys, c.clock, sharing.get());
  if (!p.ok()) return p.status();
  return std::shared_ptr<Policy>(std::make_shared<EnvoyRateLimitPolicy>(c, spec, std::move(sharing),
                                                                        std::move(p.value().next)));
}

// A Deferral of `To` offered as one of `From`: the answer goes through `map`.
template <class From, class To>
class MappedDeferral final : public Deferral<From> {
 public:
  using Map = std::function<StatusOr<To>(StatusOr<From>)>;
  MappedDeferral(Deferral<To>& outer, Map map) : outer_(outer), map_(std::move(map)) {}
  Completion<From> defer() override {
    return
        [done = outer_.defer(), map = map_](StatusOr<From> v) mutable { done(map(std::move(v))); };
  }
  void on_cancel(Once<void()> hook) override { outer_.on_cancel(std::move(hook)); }

 private:
  Deferral<To>& outer_;
  Map map_;
};

// The policy that serves `domain`: the first that has it, else the first (which answers an
// unknown domain); an error when none is configured.
StatusOr<EnvoyRateLimitPolicy*> serving(const KindPolicies& ps, std::string_view domain) {
  if (ps.empty())
    return Status(StatusCode::kNotFound,
                  "no envoy_ratelimit policy is configured (kind: envoy_ratelimit)");
  for (const auto& p : ps) {
    auto* e = static_cast<EnvoyRateLimitPolicy*>(p.get());
    if (e->has_domain(domain)) return e;
  }
  return static_cast<EnvoyRateLimitPolicy*>(ps.front().get());
}

RlsRequest request_of(const pb::RateLimitRequest& in) {
  RlsRequest r;
  r.domain = in.domain();
  r.hits_addend = in.hits_addend();
  r.descriptors.reserve(static_cast<std::size_t>(in.descriptors_size()));
  for (const auto& d : in.descriptors()) {
    RlsDescriptor& out = r.descriptors.emplace_back();
    out.entries.reserve(static_cast<std::size_t>(d.entries_size()));
    for (const auto& e : d.entries()) out.entries.push_back({e.key(), e.value()});
    if (d.has_limit())
      out.limit = RlsDescriptor::Override{d.limit().requests_per_unit(),
                                          static_cast<std::uint32_t>(d.limit().unit())};
    if (d.has_hits_addend()) out.hits_addend = d.hits_addend().value();
  }
  return r;
}

void fill(pb::RateLimitResponse& out, const RlsAnswer& a) {
  out.set_overall_code(a.over ? pb::RateLimitResponse::OVER_LIMIT : pb::RateLimitResponse::OK);
  for (const RlsStatus& s : a.statuses) {
    pb::RateLimitResponse::DescriptorStatus& w = *out.add_statuses();
    w.set_code(s.over ? pb::RateLimitResponse::OVER_LIMIT : pb::RateLimitResponse::OK);
    w.set_limit_remaining(s.remaining);
    if (s.limit) {
      pb::RateLimitResponse::RateLimit& l = *w.mutable_current_limit();
      l.set_requests_per_unit(s.limit->requests_per_unit);
      l.set_unit(static_cast<pb::RateLimitResponse::RateLimit::Unit>(s.limit->unit));
      if (!s.limit->name.empty()) l.set_name(s.limit->name);
    }
    if (s.until_reset) {
      // Whole seconds, rounded up, as the window's end is never sooner than said.
      w.mutable_duration_until_reset()->set_seconds(
          static_cast<std::int64_t>(ceil_seconds(*s.until_reset)));
    }
  }
  for (const auto& [name, value] : a.headers) {
    auto& h = *out.add_response_headers_to_add();
    h.set_key(name);
    h.set_value(value);
  }
}

pb::RateLimitResponse response_of(const RlsAnswer& a) {
  pb::RateLimitResponse out;
  fill(out, a);
  return out;
}

// `in` decided by the policy that serves its domain: now, or through `later` when a shared
// limit waits for a lease.
Decided<RlsAnswer> answer(const pb::RateLimitRequest& in, const KindPolicies& ps,
                          Deferral<RlsAnswer>& later) {
  auto p = serving(ps, in.domain());
  if (!p.ok()) return p.status();
  return p.value()->decide(request_of(in), later);
}

// The request and the answer of one gRPC call are built in an arena that starts on the stack:
// a request of a few descriptors and its answer take no heap allocation of their own.
constexpr std::size_t kArenaBlock = 2048;

Decided<std::string> grpc_should_rate_limit(std::string_view request, const KindPolicies& ps,
                                            Deferral<std::string>& later) {
  alignas(std::max_align_t) std::array<char, kArenaBlock> block;
  google::protobuf::ArenaOptions options;
  options.initial_block = block.data();
  options.initial_block_size = block.size();
  google::protobuf::Arena arena(options);
  auto* in = google::protobuf::Arena::CreateMessage<pb::RateLimitRequest>(&arena);
  if (std::string why = api::decode(request, *in); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  MappedDeferral<RlsAnswer, std::string> mapped(later,
                                                [](StatusOr<RlsAnswer> a) -> StatusOr<std::string> {
                                                  if (!a.ok()) return a.status();
                                                  return response_of(a.value()).SerializeAsString();
                                                });
  Decided<RlsAnswer> a = answer(*in, ps, mapped);
  if (!a) return std::nullopt;
  if (!a->ok()) return a->status();
  auto* out = google::protobuf::Arena::CreateMessage<pb::RateLimitResponse>(&arena);
  fill(*out, a->value());
  return out->SerializeAsString();
}

// envoyproxy/ratelimit's HTTP form: the request and the answer in protobuf's JSON mapping;
// 200 when OK, 429 when over the limit.
StatusOr<RouteReply> json_reply(StatusOr<RlsAnswer> a) {
  if (!a.ok()) return a.status();
  const pb::RateLimitResponse r = response_of(a.value());
  RouteReply reply;
  reply.status = r.overall_code() == pb::RateLimitResponse::OVER_LIMIT ? 429 : 200;
  if (auto s = google::protobuf::util::MessageToJsonString(r, &reply.body); !s.ok())
    return Status(StatusCode::kInternal,
                  "answer: " + std::string(s.message().data(), s.message().size()));
  reply.body += '\n';
  return reply;
}

Decided<RouteReply> json_should_rate_limit(const RouteRequest& req, const KindPolicies& ps,
                                           Deferral<RouteReply>& later) {
  pb::RateLimitRequest in;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(req.body.data(), req.body.size()), &in, parse);
      !s.ok())
    return Status(StatusCode::kInvalidArgument,
                  "body: not a RateLimitRequest in JSON: " +
                      std::string(s.message().data(), s.message().size()));
  MappedDeferral<RlsAnswer, RouteReply> mapped(later, json_reply);
  Decided<RlsAnswer> out = answer(in, ps, mapped);
  if (!out) return std::nullopt;
  return json_reply(std::move(*out));
}

}  // namespace

PolicyKind envoy_ratelimit_kind() {
  PolicyKind kind("envoy_ratelimit", 0, parse_envoy_ratelimit, build);
  kind.methods.push_back(GrpcMethod{std::string(kMethod), grpc_should_rate_limit});
  kind.routes.push_back(HttpRoute{{"POST"}, "/json", false, json_should_rate_limit});
  return kind;
}

}  // namespace sluice::server
