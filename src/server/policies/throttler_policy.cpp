// throttler_policy.cpp: the throttler policy at work (throttler_policy.h): its checks, its
// sampling loops, the rules set at run time (in the state file or a coordinator's shared
// table) and skipped hosts; and what its probes read of the server (probe_env()).
#include "server/policies/throttler_policy.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "server/json_text.h"
#include "sluice/core/clock.h"

namespace sluice::server::throttler_detail {

bool has_metric(const std::vector<MetricSpec>& metrics, std::string_view name) {
  return std::any_of(metrics.begin(), metrics.end(),
                     [&](const MetricSpec& m) { return m.name == name; });
}

probes::ProbeEnv probe_env(std::shared_ptr<const PolicyDirectory> directory) {
  probes::ProbeEnv env;
  env.policy_utilisation = [directory = std::move(directory)](
                               const std::string& name,
                               std::string& error) -> std::optional<double> {
    const std::shared_ptr<Policy> p = directory ? directory->find(name) : nullptr;
    if (p == nullptr) {
      error = "no policy named '" + name + "' is serving";
      return std::nullopt;
    }
    if (p->admit_family() == nullptr) {
      error = "policy " + name + " is a " + p->kind() + " policy: it has no calls in flight";
      return std::nullopt;
    }
    const PolicyInfo info = p->info();
    if (info.limit == 0) {
      error = "policy " + name + " has no single limit";
      return std::nullopt;
    }
    return static_cast<double>(info.in_flight) / static_cast<double>(info.limit);
  };
  return env;
}

ThrottlerPolicy::ThrottlerPolicy(const BuildContext& c, const ThrottlerSpec& spec,
                                 std::shared_ptr<SharedRules> shared)
    : Policy(c.name, "throttler", ""),
      clock_(c.clock),
      spec_(spec),
      directory_(c.directory),
      notices_(c.notices),
      state_store_(c.runtime_state()),
      rules_(spec.apps),
      rng_(std::random_device{}()) {
  if (shared == nullptr) load_runtime_rules();
  const probes::ProbeEnv env = probe_env(c.directory);
  for (const MetricSpec& m : spec_.metrics) {
    ThrottleMetric tm;
    tm.name = m.name;
    tm.threshold = m.threshold;
    tm.stale_intervals = spec_.stale_intervals;
    tm.ignore_hosts = m.ignore_hosts;
    metrics_.push_back(std::move(tm));
    probes_.push_back(m.make(env));
    last_sampled_.push_back(Nanos{INT64_MIN});
    last_healthy_.push_back(Nanos{INT64_MIN});
    audits_.emplace_back();
    last_.push_back(Last::kOk);
  }
  for (std::size_t i = 0; i < metrics_.size(); ++i)
    start_loop(c.clock, [this, i](Nanos now) { return tick(i, now); });
  // Last: its first read applies what the coordinator holds, through shared_changed().
  if (shared != nullptr)
    shared_ = std::make_unique<SharedRuleMirror>(
        std::move(shared), spec_.shard, spec_.shared_rules_interval, kSharedTimeout,
        [this](const std::string& key, const SharedRuleMirror::Entry* e) {
          shared_changed(key, e);
        });
}

void ThrottlerPolicy::throttle(const std::string& app, Nanos duration, std::optional<double> ratio,
                               Done done) {
  if (Status s = check_app(app); !s.ok()) return done(std::move(s));
  if (ratio && !(*ratio > 0 && *ratio <= 1)) return done(bad("ratio: must be in (0, 1]"));
  if (duration <= Nanos{0} || duration > kMaxThrottle)
    return done(bad("duration: must be positive and at most a year"));
  const std::lock_guard lock(admin_mu_);
  RuntimeRule r = runtime_rule(app);
  const std::int64_t now_ms = unix_ms_now();
  if (!ratio) ratio = r.until_unix_ms > now_ms ? r.ratio : 1.0;
  r.until_unix_ms = now_ms + std::chrono::ceil<std::chrono::milliseconds>(duration).count();
  r.ratio = *ratio;
  save(app, r, std::move(done));
}

void ThrottlerPolicy::unthrottle(const std::string& app, Done done) {
  if (Status s = check_app(app); !s.ok()) return done(std::move(s));
  const std::lock_guard lock(admin_mu_);
  RuntimeRule r = runtime_rule(app);
  r.until_unix_ms = 0;
  r.ratio = 1;
  save(app, r, std::move(done));
}

void ThrottlerPolicy::exempt(const std::string& app, bool exempt, Done done) {
  if (Status s = check_app(app); !s.ok()) return done(std::move(s));
  if (app == "all") return done(bad("app: 'all' cannot be exempt (name the apps)"));
  const std::lock_guard lock(admin_mu_);
  RuntimeRule r = runtime_rule(app);
  r.exempt = exempt;
  save(app, r, std::move(done));
}

void ThrottlerPolicy::set_rule(const std::string& app,
                               const std::optional<std::vector<std::string>>& metrics,
                               const std::map<std::string, double>& thresholds, bool clear,
                               Done done) {
  if (Status s = check_app(app); !s.ok()) return done(std::move(s));
  const auto known = [&](const std::string& m) { return has_metric(spec_.metrics, m); };
  if (metrics)
    for (const std::string& m : *metrics)
      if (!known(m)) return done(bad("metrics: '" + m + "' is not one of the throttler's metrics"));
  for (const auto& [m, t] : thresholds) {
    if (!known(m))
      return done(bad("thresholds: '" + m + "' is not one of the throttler's metrics"));
    if (!(t >= 0) || !std::isfinite(t))
      return done(bad("thresholds: " + m + " must be a number > 0 (0 drops it)"));
  }
  const std::lock_guard lock(admin_mu_);
  RuntimeRule r = runtime_rule(app);
  if (clear) {
    r.metrics.clear();
    r.thresholds.clear();
  }
  if (metrics) r.metrics = *metrics;
  for (const auto& [m, t] : thresholds) {
    if (t == 0)
      r.thresholds.erase(m);
    else
      r.thresholds[m] = t;
  }
  save(app, r, std::move(done));
}

void ThrottlerPolicy::skip_host(const std::string& host, Nanos ttl, Done done) {
  if (std::string why = app_name_error(host); !why.empty())
    return done(bad("host" + why.substr(3)));
  const Nanos now = clock_.now();
  const auto too_many = [] {
    return bad("host: at most " + std::to_string(kMaxSkippedHosts) +
               " hosts are skipped at once (recover some first)");
  };
  if (shared_ != nullptr) {
    if (!shared_->get(kHostKey + host) && shared_->count(kHostKey) >= kMaxSkippedHosts)
      return done(too_many());
    SharedRuleMirror::Entry e;
    e.has_deadline = true;
    e.deadline_unix_ms = unix_ms_now() + std::chrono::ceil<std::chrono::milliseconds>(ttl).count();
    e.drop_at_deadline = true;
    return shared_->put_async(kHostKey + host, std::move(e), kMaxSharedKeys, std::move(done));
  }
  {
    const std::lock_guard lock(mu_);
    std::erase_if(skipped_hosts_, [&](const auto& e) { return !(now < e.second); });
    if (!skipped_hosts_.contains(host) && skipped_hosts_.size() >= kMaxSkippedHosts)
      return done(too_many());
    skipped_hosts_[host] = now + ttl;
  }
  done(Status());
}

void ThrottlerPolicy::recover_host(const std::string& host, Done done) {
  if (shared_ != nullptr) {
    if (std::string why = app_name_error(host); !why.empty())
      return done(bad("host" + why.substr(3)));
    return shared_->erase_async(kHostKey + host, std::move(done));
  }
  {
    const std::lock_guard lock(mu_);
    if (const auto it = skipped_hosts_.find(host); it != skipped_hosts_.end())
      skipped_hosts_.erase(it);
  }
  done(Status());
}

ThrottleResult ThrottlerPolicy::check(std::string_view app, ThrottleScope scope, bool low_priority,
                                      std::string_view client, double threshold) {
  const Nanos now = clock_.now();
  bool was_dormant = false;
  ThrottleResult r;
  {
    const std::lock_guard lock(mu_);
    const Nanos in_force = interval_at(now);
    was_dormant = in_force != spec_.fast_interval;
    const double draw = std::uniform_real_distribution<double>(0, 1)(rng_);
    ThrottleCheck c{app, scope, low_priority, draw, threshold, in_force};
    if (!skipped_hosts_.empty()) c.skipped_hosts = &skipped_hosts_;
    r = throttle_check(metrics_, rules_, spec_.options, state_, c, client, now);
  }
  if (was_dormant) wake_loops();  // sample at the fast interval from now on
  return r;
}

void ThrottlerPolicy::on_retiring() noexcept {
  for (const std::unique_ptr<Probe>& p : probes_) p->cancel();
}

Nanos ThrottlerPolicy::interval_at(Nanos now) const {
  return probe_interval(state_.last_check, now, spec_.fast_interval, spec_.dormant_interval,
                        spec_.idle_after);
}

Nanos ThrottlerPolicy::tick(std::size_t i, Nanos now) {
  Nanos interval;
  std::vector<ThrottleSample> hosts;
  {
    const std::lock_guard lock(mu_);
    interval = interval_at(now);
    const Nanos last = last_sampled_[i];
    const Nanos wait = last_[i] == Last::kOk       ? interval
                       : last_[i] == Last::kFailed ? std::min(interval, spec_.fast_interval)
                                                   : kBeforePublish;
    if (last.count() != INT64_MIN && last + wait > now) return last + wait;
    hosts = metrics_[i].hosts;
  }
  // Before the engine has published its first generation a policy probe cannot find the
  // policies it reads: a sample that started then and failed is retried a millisecond later
  // (right after the build), so the server's first check already sees a good one.
  const bool unpublished = directory_ != nullptr && !directory_->published();
  const Nanos started = clock_.now();
  probes_[i]->sample(hosts);
  bool failed = false;
  for (ThrottleSample& s : hosts) {
    s.taken_at = started;
    s.interval = interval;
    failed = failed || !s.error.empty();
  }
  const std::lock_guard lock(mu_);
  metrics_[i].hosts = std::move(hosts);
  const Nanos sampled = clock_.now();
  audit_load(metrics_[i], state_, spec_.unexplained_after, sampled, audits_[i]);
  if (!judge_metric(metrics_[i], metrics_[i].threshold, ThrottleScope::kShard, sampled, interval,
                    &skipped_hosts_)
           .over)
    last_healthy_[i] = sampled;
  last_sampled_[i] = started;
  last_[i] = !failed ? Last::kOk : unpublished ? Last::kFailedUnpublished : Last::kFailed;
  if (!failed) return started + interval;
  if (unpublished) return started + kBeforePublish;
  return started + std::min(interval, spec_.fast_interval);
}

nlohmann::json ThrottlerPolicy::RuntimeRule::to_json() const {
  nlohmann::json j = {
      {"throttled_until_unix_ms", until_unix_ms}, {"ratio", ratio}, {"exempt", exempt}};
  if (!metrics.empty()) j["metrics"] = metrics;
  if (!thresholds.empty()) j["thresholds"] = thresholds;
  return j;
}

Status ThrottlerPolicy::too_many_rules() {
  return Status(StatusCode::kFailedPrecondition,
                "app: " + std::to_string(kMaxRuntimeRules) +
                    " apps have rules set at run time, the most a throttler keeps; "
                    "unthrottle some first");
}

Status ThrottlerPolicy::check_app(const std::string& app) {
  if (std::string why = app_name_error(app); !why.empty()) return bad(std::move(why));
  return {};
}

ThrottlerPolicy::RuntimeRule ThrottlerPolicy::runtime_rule(const std::string& app) const {
  if (shared_ != nullptr) {
    const std::optional<SharedRuleMirror::Entry> e = shared_->get(kAppKey + app);
    if (!e) return RuntimeRule{};
    StatusOr<RuntimeRule> r = shared_rule_of(*e);
    return r.ok() ? std::move(r.value()) : RuntimeRule{};
  }
  auto v = state_store_.get(app);
  if (!v.ok() || !v.value()) return RuntimeRule{};
  StatusOr<RuntimeRule> r = rule_of(*v.value());
  return r.ok() ? std::move(r.value()) : RuntimeRule{};
}

StatusOr<ThrottlerPolicy::RuntimeRule> ThrottlerPolicy::shared_rule_of(
    const SharedRuleMirror::Entry& e) {
  nlohmann::json j = nlohmann::json::parse(e.value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("the rule: not JSON");
  if (j.is_object() && j.contains("throttled_until_unix_ms"))
    return bad("the rule: throttled_until_unix_ms is the entry's deadline, not a field");
  StatusOr<RuntimeRule> r = rule_of(j);
  if (r.ok() && e.has_deadline)
    r.value().until_unix_ms = std::max<std::int64_t>(1, e.deadline_unix_ms);
  return r;
}

SharedRuleMirror::Entry ThrottlerPolicy::shared_entry_of(const RuntimeRule& r) {
  nlohmann::json j = r.to_json();
  j.erase("throttled_until_unix_ms");
  RuntimeRule rest = r;
  rest.until_unix_ms = 0;
  rest.ratio = 1;
  SharedRuleMirror::Entry e;
  e.value = j.dump();
  e.has_deadline = r.until_unix_ms != 0;
  e.deadline_unix_ms = r.until_unix_ms;
  e.drop_at_deadline = e.has_deadline && rest.says_nothing();
  return e;
}

void ThrottlerPolicy::shared_changed(const std::string& key, const SharedRuleMirror::Entry* e) {
  if (key.starts_with(kHostKey)) {
    const std::string host = key.substr(kHostKey.size());
    const Nanos now = clock_.now();
    const std::lock_guard lock(mu_);
    if (e == nullptr || !e->has_deadline) {
      if (const auto it = skipped_hosts_.find(host); it != skipped_hosts_.end())
        skipped_hosts_.erase(it);
      return;
    }
    skipped_hosts_[host] = now + std::chrono::milliseconds(e->deadline_unix_ms - unix_ms_now());
    return;
  }
  if (!key.starts_with(kAppKey)) return;  // a later version's; not this one's to read
  const std::string app = key.substr(kAppKey.size());
  if (e == nullptr) return apply(app, RuntimeRule{});
  StatusOr<RuntimeRule> r = shared_rule_of(*e);
  if (!r.ok() || !app_name_error(app).empty()) {
    if (notices_)
      notices_->tell("policy " + name() + ": the shared rule for app " + json_text(app) +
                     " is not one this server can read (" +
                     (r.ok() ? app_name_error(app) : r.status().message()) + "); ignored");
    return apply(app, RuntimeRule{});
  }
  apply(app, r.value());
}

StatusOr<ThrottlerPolicy::RuntimeRule> ThrottlerPolicy::rule_of(const nlohmann::json& j) {
  const auto wrong = [&](const char* field, const char* want) {
    const auto at = j.find(field);
    return Status(StatusCode::kInvalidArgument,
                  std::string(field) + ": must be " + want + ", not " +
                      json_text(at != j.end() ? *at : nlohmann::json()).substr(0, 64));
  };
  if (!j.is_object()) return Status(StatusCode::kInvalidArgument, "the rule: must be an object");
  RuntimeRule r;
  if (const auto f = j.find("throttled_until_unix_ms"); f != j.end()) {
    if (!f->is_number_integer() || f->get<std::int64_t>() < 0)
      return wrong("throttled_until_unix_ms", "a whole number of milliseconds >= 0");
    r.until_unix_ms = f->get<std::int64_t>();
  }
  if (const auto f = j.find("ratio"); f != j.end()) {
    if (!f->is_number() || !(f->get<double>() > 0 && f->get<double>() <= 1))
      return wrong("ratio", "a number in (0, 1]");
    r.ratio = f->get<double>();
  }
  if (const auto f = j.find("exempt"); f != j.end()) {
    if (!f->is_boolean()) return wrong("exempt", "true or false");
    r.exempt = f->get<bool>();
  }
  if (const auto f = j.find("metrics"); f != j.end()) {
    if (!f->is_array()) return wrong("metrics", "a list of metric names");
    for (const auto& name : *f) {
      if (!name.is_string()) return wrong("metrics", "a list of metric names");
      r.metrics.push_back(name.get<std::string>());
    }
  }
  if (const auto f = j.find("thresholds"); f != j.end()) {
    if (!f->is_object()) return wrong("thresholds", "an object of metric: number > 0");
    for (const auto& [metric, v] : f->items()) {
      if (!v.is_number() || !(v.get<double>() > 0))
        return wrong("thresholds", "an object of metric: number > 0");
      r.thresholds[metric] = v.get<double>();
    }
  }
  return r;
}

Status ThrottlerPolicy::store(const std::string& app, const RuntimeRule& r) {
  return r.says_nothing() ? state_store_.erase(app) : state_store_.put(app, r.to_json());
}

void ThrottlerPolicy::save(const std::string& app, const RuntimeRule& r, Done done) {
  if (shared_ != nullptr) {
    // Applied when the coordinator holds it (shared_changed()), as every other server will.
    if (r.says_nothing()) return shared_->erase_async(kAppKey + app, std::move(done));
    if (!shared_->get(kAppKey + app) && shared_->count(kAppKey) >= kMaxRuntimeRules)
      return done(too_many_rules());
    return shared_->put_async(kAppKey + app, shared_entry_of(r), kMaxSharedKeys, std::move(done));
  }
  // Rules are bounded: each change rewrites the state file, so their number bounds its cost.
  if (!r.says_nothing()) {
    const auto stored = state_store_.get(app);
    if (stored.ok() && !stored.value() && state_store_.size() >= kMaxRuntimeRules)
      return done(too_many_rules());
  }
  // The caller keeps this policy alive until `done` is called (the routes hold it).
  Done applied = [this, app, r, done = std::move(done)](Status s) mutable {
    if (s.ok()) apply(app, r);
    done(std::move(s));
  };
  if (r.says_nothing())
    state_store_.erase_async(app, std::move(applied));
  else
    state_store_.put_async(app, r.to_json(), std::move(applied));
}

void ThrottlerPolicy::apply(const std::string& app, const RuntimeRule& r) {
  const Nanos now = clock_.now();
  const std::int64_t left_ms = r.until_unix_ms - unix_ms_now();
  const std::lock_guard lock(mu_);
  auto config = spec_.apps.find(app);
  ThrottleAppRule rule = config != spec_.apps.end() ? config->second : ThrottleAppRule{};
  if (r.until_unix_ms != 0 && left_ms > 0) {
    rule.throttled_until = now + std::chrono::milliseconds(left_ms);
    rule.ratio = r.ratio;
  }
  rule.exempt = rule.exempt || r.exempt;
  // A metric the config no longer has is dropped (the app then checks the rest, or the
  // defaults when none is left), so an old rule cannot make every check a 404.
  const auto known = [&](const std::string& m) { return has_metric(spec_.metrics, m); };
  std::vector<std::string> metrics;
  for (const std::string& m : r.metrics)
    if (known(m)) metrics.push_back(m);
  if (!metrics.empty()) rule.metrics = std::move(metrics);
  for (const auto& [m, t] : r.thresholds)
    if (known(m)) rule.thresholds[m] = t;
  const bool says_nothing = config == spec_.apps.end() && !rule.exempt &&
                            rule.throttled_until.count() == INT64_MIN && rule.metrics.empty() &&
                            rule.thresholds.empty();
  if (says_nothing)
    rules_.erase(app);
  else
    rules_[app] = std::move(rule);
}

void ThrottlerPolicy::load_runtime_rules() {
  const std::int64_t now_ms = unix_ms_now();
  for (const auto& [app, v] : state_store_.list()) {
    (void)v;
    RuntimeRule r = runtime_rule(app);
    if (r.until_unix_ms != 0 && r.until_unix_ms <= now_ms) {
      r.until_unix_ms = 0;
      r.ratio = 1;
      if (!store(app, r).ok()) continue;  // kept in the file; it says nothing now either way
    }
    apply(app, r);
  }
}

}  // namespace sluice::server::throttler_detail
