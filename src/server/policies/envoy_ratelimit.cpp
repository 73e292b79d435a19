// The envoy_ratelimit kind (envoy_ratelimit.h): Envoy's rate limit service over
// envoyproxy/ratelimit's rules, each limit a fixed-window RateLimiter on this server.
#include "server/policies/envoy_ratelimit.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "api/decode_errors.h"
#include "envoy/service/ratelimit/v3/rls.pb.h"

namespace sluice::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
namespace pb = envoy::service::ratelimit::v3;

constexpr std::size_t kMaxMetricNames = 10'000;
constexpr std::size_t kMaxOverrides = 1'024;
constexpr std::size_t kMaxDescriptors = 256;
constexpr std::size_t kMaxDescriptorBytes = 16 * 1024;
constexpr std::size_t kShards = 16;
constexpr std::string_view kMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

struct HitCounts {
  std::atomic<std::uint64_t> within{0}, over{0}, shadow{0};
};

// A limit at work: its limiter (null when requests_per_unit is 0: every request is over it)
// and its hits, under its rule's metric name.
struct Counter {
  rls::Rule rule;  // a copy: the tree it came from may be gone (an override's is its own)
  std::shared_ptr<RateLimiter> limiter;
  HitCounts hits;
  Nanos next_sweep{0};  // the sweeping loop's alone
};

// One generation of the rule files: the tree and a counter per limit (null: unlimited).
struct Generation {
  std::shared_ptr<const rls::RuleTree> tree;
  std::vector<std::shared_ptr<Counter>> counters;  // by rule id
};

Nanos sweep_interval(const Counter& c) {
  return std::clamp<Nanos>(rls::period_of(c.rule.limit.unit), std::chrono::seconds(1),
                           std::chrono::seconds(60));
}

StatusOr<std::shared_ptr<RateLimiter>> make_limiter(const rls::Limit& l, std::size_t max_keys,
                                                    const Clock& clock) {
  if (l.unlimited || l.requests_per_unit == 0) return std::shared_ptr<RateLimiter>();
  RateLimiterOptions o;
  o.rule.strategy = RateStrategy::kFixedWindow;
  o.rule.limit = l.requests_per_unit;
  o.rule.period = rls::period_of(l.unit);
  o.shards = kShards;
  o.max_keys = max_keys;
  auto made = make_rate_limiter(o, clock);
  if (!made.ok()) return made.status();
  return std::shared_ptr<RateLimiter>(std::move(made.value()));
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
                           std::size_t max_keys, const Clock& clock) {
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
    if (it != kept.end() && it->second->rule.limit.unit == r->limit.unit &&
        (it->second->limiter != nullptr) == (r->limit.requests_per_unit != 0)) {
      p.next->counters.push_back(it->second);
      p.retune.emplace_back(it->second, r->limit);
      continue;
    }
    auto c = std::make_shared<Counter>();
    c->rule = *r;
    auto limiter = make_limiter(r->limit, max_keys, clock);
    if (!limiter.ok()) return limiter.status();
    c->limiter = std::move(limiter.value());
    p.next->counters.push_back(std::move(c));
  }
  return p;
}

class EnvoyRateLimitPolicy final : public Policy {
 public:
  EnvoyRateLimitPolicy(const BuildContext& c, const EnvoyRateLimitSpec& spec,
                       std::shared_ptr<Generation> generation)
      : Policy(c.name, "envoy_ratelimit", ""),
        clock_(c.clock),
        generation_(std::move(generation)),
        shadow_mode_(spec.shadow_mode),
        headers_(spec.response_headers),
        max_keys_(spec.max_keys),
        files_(spec.files) {
    start_loop(c.clock, [this](Nanos now) { return sweep(now); });
  }
  ~EnvoyRateLimitPolicy() override { retire(); }
  EnvoyRateLimitPolicy(const EnvoyRateLimitPolicy&) = delete;
  EnvoyRateLimitPolicy& operator=(const EnvoyRateLimitPolicy&) = delete;

  // Always in place: the new rules, each limit that stays keeping its counters.
  StatusOr<Reconfiguration> reconfigure(const BuildContext& c) override {
    const EnvoyRateLimitSpec& spec = *c.spec.as<EnvoyRateLimitSpec>();
    const std::shared_ptr<Generation> now = generation();
    auto p = prepare(spec.rules, now.get(), spec.max_keys, clock_);
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
      generation_.store(std::move(p.next), std::memory_order_release);
      {
        // The limits requests set take the new max_keys too, and so do those made from now.
        const std::lock_guard lock(mu_);
        files_ = std::move(files);
        max_keys_ = max_keys;
        for (const auto& [_, c] : overrides_) c->limiter->reconfigure(c->limiter->rule(), max_keys);
      }
      shadow_mode_.store(shadow, std::memory_order_relaxed);
      headers_.store(headers, std::memory_order_relaxed);
    });
  }

  [[nodiscard]] bool has_domain(std::string_view domain) const {
    return generation()->tree->has_domain(domain);
  }

  StatusOr<RlsAnswer> decide(const RlsRequest& req) {
    if (req.domain.empty()) return invalid("domain: must not be empty");
    if (req.descriptors.empty())
      return invalid("descriptors: must not be empty (a request has at least one)");
    if (req.descriptors.size() > kMaxDescriptors)
      return invalid("descriptors: " + std::to_string(req.descriptors.size()) +
                     " descriptors; a request has at most " + std::to_string(kMaxDescriptors));
    const std::shared_ptr<Generation> g = generation();
    const std::size_t n = req.descriptors.size();
    std::vector<std::shared_ptr<Counter>> counters(n);
    std::vector<const rls::Rule*> matched(n, nullptr);
    std::vector<std::string> keys(n);
    std::vector<std::string> metrics(n);
    const bool known = g->tree->has_domain(req.domain);
    if (!known) unknown_domain_.fetch_add(1, std::memory_order_relaxed);
    for (std::size_t i = 0; i < n; ++i) {
      const RlsDescriptor& d = req.descriptors[i];
      const std::string at = "descriptors[" + std::to_string(i) + "]";
      if (d.entries.empty()) return invalid(at + ".entries: must not be empty");
      std::size_t bytes = 0;
      for (const rls::Entry& e : d.entries) bytes += e.key.size() + e.value.size();
      if (bytes > kMaxDescriptorBytes)
        return invalid(at + ".entries: " + std::to_string(bytes) +
                       " bytes of keys and values; "
                       "a descriptor has at most " +
                       std::to_string(kMaxDescriptorBytes));
      if (!known) continue;
      if (d.limit) {
        const std::optional<rls::Unit> unit = rls::unit_of(d.limit->unit);
        if (!unit)
          return invalid(at + ".limit.unit: must be a unit (SECOND ... YEAR), not " +
                         std::to_string(d.limit->unit));
        auto c = override_counter(d.limit->requests_per_unit, *unit);
        if (!c.ok()) return Status(c.status().code(), at + ".limit: " + c.status().message());
        counters[i] = std::move(c.value());
        matched[i] = &counters[i]->rule;
        keys[i] = rls::counter_of(d.entries);
        metrics[i] = counters[i]->rule.path;
        continue;
      }
      rls::Match m = g->tree->match(req.domain, d.entries);
      if (m.rule == nullptr) continue;
      matched[i] = m.rule;
      counters[i] = g->counters[m.rule->id];
      keys[i] = std::move(m.counter);
      metrics[i] = std::move(m.metric);
    }

    const std::vector<rls::Applied> applied = rls::applied(matched);
    const Nanos now = clock_.now();
    RlsAnswer out;
    out.statuses.resize(n);
    std::vector<rls::Outcome> outcomes(n);
    std::vector<std::uint64_t> taken(n, 0);  // hits added, given back if the request is over
    for (std::size_t i = 0; i < n; ++i) {
      RlsStatus& s = out.statuses[i];
      if (applied[i] == rls::Applied::kUnlimited) {
        s.remaining = std::numeric_limits<std::uint32_t>::max();
        continue;
      }
      if (applied[i] != rls::Applied::kLimit) continue;
      Counter& c = *counters[i];
      const rls::Limit& l = matched[i]->limit;
      const RlsDescriptor& d = req.descriptors[i];
      const std::uint64_t hits =
          d.hits_addend ? *d.hits_addend : std::max<std::uint64_t>(1, req.hits_addend);
      s.limit = RlsStatus::Current{l.requests_per_unit, l.unit, l.name};
      bool over = true;
      if (c.limiter != nullptr) {
        const RateDecision dec = c.limiter->check(keys[i], hits, now);
        over = !dec.allowed;
        if (dec.allowed) taken[i] = hits;
        s.remaining = static_cast<std::uint32_t>(
            std::min<std::uint64_t>(dec.remaining, std::numeric_limits<std::uint32_t>::max()));
        s.until_reset = dec.reset_after;
      } else {
        s.until_reset = window_left(l.unit, now);
      }
      outcomes[i] = rls::Outcome{.over = over,
                                 .quota = matched[i]->quota_mode,
                                 .shadow = matched[i]->shadow_mode,
                                 .limited = true};
      s.over = over && !matched[i]->shadow_mode;
    }
    const bool over = rls::over_limit(outcomes);
    const bool shadow_all = shadow_mode_.load(std::memory_order_relaxed);
    out.over = over && !shadow_all;
    if (out.over) {
      // Refused: what it added goes back, so a refused request costs no limit anything.
      for (std::size_t i = 0; i < n; ++i) {
        if (taken[i] == 0) continue;
        counters[i]->limiter->refund(keys[i], taken[i], now);
        out.statuses[i].remaining = static_cast<std::uint32_t>(
            std::min<std::uint64_t>(std::uint64_t{out.statuses[i].remaining} + taken[i],
                                    matched[i]->limit.requests_per_unit));
      }
    }
    count(counters, metrics, outcomes, over, shadow_all);
    add_headers(out, matched, applied);
    return out;
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& info) const override {
    const std::shared_ptr<Generation> g = generation();
    std::size_t keys = 0;
    std::size_t limits = 0;
    for (const auto& c : g->counters) {
      if (c == nullptr) continue;
      ++limits;
      if (c->limiter != nullptr) keys += c->limiter->keys();
    }
    info.limit = 0;
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
    j["shadow_denied"] = shadow_denied_.load(std::memory_order_relaxed);
    j["unknown_domain"] = unknown_domain_.load(std::memory_order_relaxed);
  }

  void metrics(std::vector<MetricFamily>& out) const override {
    out.push_back(by_label("sluice_rls_requests_total", "ShouldRateLimit answers by overall code",
                           "code",
                           {{"ok", requests_ok_.load(std::memory_order_relaxed)},
                            {"over_limit", requests_over_.load(std::memory_order_relaxed)}}));
    out.push_back(one("sluice_shadow_denied_total",
                      "Calls a limit in shadow mode would have refused (they were admitted)",
                      MetricType::Counter,
                      static_cast<double>(shadow_denied_.load(std::memory_order_relaxed))));
    out.push_back(one("sluice_rls_unknown_domain_total",
                      "ShouldRateLimit requests for a domain no rule file has (answered OK)",
                      MetricType::Counter,
                      static_cast<double>(unknown_domain_.load(std::memory_order_relaxed))));
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
    for (const auto& c : g->counters) {
      if (c == nullptr) continue;
      ++limits;
      if (c->limiter != nullptr) keys += c->limiter->keys();
      add(c->rule.path, c->hits);
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
  }

 private:
  static Status invalid(std::string why) {
    return Status(StatusCode::kInvalidArgument, std::move(why));
  }

  [[nodiscard]] std::shared_ptr<Generation> generation() const {
    return generation_.load(std::memory_order_acquire);
  }

  // The headers for Envoy to add: every limit applied, in the request's order; Retry-After
  // when over, until the last limit that refused it starts its next window.
  void add_headers(RlsAnswer& out, const std::vector<const rls::Rule*>& matched,
                   const std::vector<rls::Applied>& applied) const {
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
    auto c = std::make_shared<Counter>();
    c->rule.limit.requests_per_unit = per;
    c->rule.limit.unit = unit;
    c->rule.path = "override." + std::to_string(per) + "_per_" + std::string(rls::name_of(unit));
    auto limiter = make_limiter(c->rule.limit, max_keys_, clock_);  // under mu_
    if (!limiter.ok()) return limiter.status();
    c->limiter = std::move(limiter.value());
    overrides_.emplace(key, c);
    return c;
  }

  void count(const std::vector<std::shared_ptr<Counter>>& counters,
             const std::vector<std::string>& metrics, const std::vector<rls::Outcome>& outcomes,
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
    if (shadowed > 0) shadow_denied_.fetch_add(shadowed, std::memory_order_relaxed);
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
    {
      const std::lock_guard lock(mu_);
      for (const auto& [_, c] : overrides_) all.push_back(c);
    }
    for (const auto& c : all) {
      if (c == nullptr || c->limiter == nullptr || now < c->next_sweep) continue;
      c->limiter->sweep(now);
      c->next_sweep = now + sweep_interval(*c);
    }
    return now + std::chrono::seconds(1);
  }

  const Clock& clock_;
  mutable std::mutex mu_;
  // Swapped whole by a reload; read per request without a lock.
  std::atomic<std::shared_ptr<Generation>> generation_;
  std::atomic<bool> shadow_mode_;
  std::atomic<RateLimitHeaders> headers_;
  std::size_t max_keys_;            // guarded by mu_
  std::vector<std::string> files_;  // guarded by mu_
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::shared_ptr<Counter>>
      overrides_;                                                              // guarded by mu_
  std::map<std::string, std::unique_ptr<HitCounts>, std::less<>> named_hits_;  // guarded by mu_
  std::atomic<std::uint64_t> requests_ok_{0}, requests_over_{0}, shadow_denied_{0},
      unknown_domain_{0};
};

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  const EnvoyRateLimitSpec& spec = *c.spec.as<EnvoyRateLimitSpec>();
  auto p = prepare(spec.rules, nullptr, spec.max_keys, c.clock);
  if (!p.ok()) return p.status();
  return std::shared_ptr<Policy>(
      std::make_shared<EnvoyRateLimitPolicy>(c, spec, std::move(p.value().next)));
}

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

StatusOr<pb::RateLimitResponse> answer(const pb::RateLimitRequest& in, const KindPolicies& ps) {
  auto p = serving(ps, in.domain());
  if (!p.ok()) return p.status();
  auto a = p.value()->decide(request_of(in));
  if (!a.ok()) return a.status();
  pb::RateLimitResponse out;
  fill(out, a.value());
  return out;
}

Decided<std::string> grpc_should_rate_limit(std::string_view request, const KindPolicies& ps,
                                            Deferral<std::string>& /*later*/) {
  pb::RateLimitRequest in;
  if (std::string why = api::decode(request, in); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  auto out = answer(in, ps);
  if (!out.ok()) return out.status();
  return out.value().SerializeAsString();
}

// envoyproxy/ratelimit's HTTP form: the request and the answer in protobuf's JSON mapping;
// 200 when OK, 429 when over the limit.
Decided<RouteReply> json_should_rate_limit(const RouteRequest& req, const KindPolicies& ps,
                                           Deferral<RouteReply>& /*later*/) {
  pb::RateLimitRequest in;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(req.body.data(), req.body.size()), &in, parse);
      !s.ok())
    return Status(StatusCode::kInvalidArgument,
                  "body: not a RateLimitRequest in JSON: " +
                      std::string(s.message().data(), s.message().size()));
  auto out = answer(in, ps);
  if (!out.ok()) return out.status();
  RouteReply reply;
  reply.status = out.value().overall_code() == pb::RateLimitResponse::OVER_LIMIT ? 429 : 200;
  if (auto s = google::protobuf::util::MessageToJsonString(out.value(), &reply.body); !s.ok())
    return Status(StatusCode::kInternal,
                  "answer: " + std::string(s.message().data(), s.message().size()));
  reply.body += '\n';
  return reply;
}

}  // namespace

PolicyKind envoy_ratelimit_kind() {
  PolicyKind kind("envoy_ratelimit", 0, parse_envoy_ratelimit, build);
  kind.methods.push_back(GrpcMethod{std::string(kMethod), grpc_should_rate_limit});
  kind.routes.push_back(HttpRoute{{"POST"}, "/json", false, json_should_rate_limit});
  return kind;
}

}  // namespace sluice::server
