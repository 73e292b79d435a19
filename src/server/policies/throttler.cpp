// The throttler kind: the collaborative check API that batch jobs ask before each chunk of work
// (sluice/throttler.h decides), over metrics its probes sample in loops of their own (one
// per metric), so a check is a lookup and never waits on a database.
//
//   kind: throttler
//   shard: main              # what a check's `shard=` (or freno's store name) selects; default:
//                            #   the policy's name. A check naming no shard gets the first
//                            #   throttler of the config.
//   scope: shard             # the default scope: shard (the worst host) or self (the first)
//   default_app: default     # the app of a check that names none
//   fast_interval: 100ms     # sampling while checks come
//   dormant_interval: 5s     # sampling once no check came for idle_after (and before any)
//   idle_after: 10s
//   stale_intervals: 5       # a sample older than this many of its interval counts as over
//   low_priority_hold: 1s    # p=low is refused this long after a normal app was refused
//   metrics:                 # at least one
//     load:
//       probe: loadavg       # the host's 1-minute load average (/proc/loadavg)
//       threshold: 8         # over it: 429 (> 0)
//       ignore_hosts: 0      # shard scope: the worst hosts not counted
//     api:
//       probe: policy        # a sluice policy's utilisation: in flight / limit (an adaptive,
//       policy: search       #   fleet or other admit-family policy with one limit)
//       threshold: 0.9
//     queue:
//       probe: command       # a command that prints a number (its first word), run by
//       command: "cat /var/run/queue-depth"   # /bin/sh -c; non-zero exit, no number or
//       timeout: 1s          # running past `timeout` (then killed) is a failed probe
//       threshold: 1000
//   apps:                    # rules by app name; `all` applies to apps without their own
//     gh-ost:
//       metrics: [load]      # default: every metric
//       thresholds: {load: 4}
//     rescue:
//       exempt: true         # passes whatever the metrics say
//
// Routes (GET and HEAD; HEAD answers the status alone, as gh-ost's --throttle-http polls it):
//   /throttler/check?app=A[&scope=self|shard][&shard=S][&p=low]   the Vitess shape
//   /throttler/check-self?app=A[...]                               scope self
//   /check/{app}/{store_type}/{store_name}                         the freno shape (store_name
//                                                                  is the shard)
// Status: 200 ok, 429 over a threshold (or a probe failed, or its sample is stale: fail
// closed), 417 the app is throttled, 404 an unknown metric or shard, 400 a malformed argument.
//
// Admin verbs (GET or POST; 401 without `Authorization: Bearer <server.admin_token>` when the
// server has one), each taking `shard=` too and answering the app's rule now:
//   /throttler/throttle-app?app=A[&duration=1h][&ratio=1]   refuse A (417) with that
//                                                           probability until the time is up
//   /throttler/unthrottle-app?app=A
//   /throttler/exempt-app?app=A[&exempt=true|false]
//   /throttle-app/A[/TTL_MINUTES[/RATIO]], /unthrottle-app/A  the freno shape (TTL 0: an hour)
// `app=all` throttles every app (an exempt one still passes). The rules are kept in the
// server's state file (server.state_file), each expiry as wall-clock time, so a restart keeps
// the time left; servers do not share them (each its own file). Listings (GET, no token):
// /throttler/throttled-apps (every app with a rule) and /throttler/recent-apps (the apps that
// checked, most recent first, with counts, rate and last client address).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "server/registry.h"
#include "sluice/config.h"
#include "sluice/throttler.h"

namespace sluice::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

enum class ProbeKind { kLoadAvg, kCommand, kPolicy };

struct MetricSpec {
  std::string name;
  ProbeKind probe = ProbeKind::kLoadAvg;
  double threshold = 0;
  std::size_t ignore_hosts = 0;
  std::string command;  // kCommand
  Nanos timeout = std::chrono::seconds(1);
  std::string policy;  // kPolicy
};

struct ThrottlerSpec final : PolicyBody {
  std::string shard;
  ThrottleOptions options;
  Nanos fast_interval = std::chrono::milliseconds(100);
  Nanos dormant_interval = std::chrono::seconds(5);
  Nanos idle_after = std::chrono::seconds(10);
  double stale_intervals = ThrottleMetric{}.stale_intervals;
  std::vector<MetricSpec> metrics;
  std::map<std::string, ThrottleAppRule, std::less<>> apps;
};

double secs(Nanos d) { return std::chrono::duration<double>(d).count(); }

// One metric's sampler: fills in every host's sample (value or error), called from the loop.
class Probe {
 public:
  virtual ~Probe() = default;
  virtual void sample(std::vector<ThrottleSample>& hosts) = 0;
};

// The host's 1-minute load average, from /proc/loadavg.
class LoadAvgProbe final : public Probe {
 public:
  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = "self";
    std::ifstream in("/proc/loadavg");
    double v = 0;
    if (in >> v && std::isfinite(v)) {
      s.value = v;
      s.error.clear();
    } else {
      s.error = "cannot read /proc/loadavg";
    }
  }
};

// A command's number: `/bin/sh -c command`, its standard output's first word, within
// `timeout` (past it the command's process group is killed). Its own process group, standard
// input from /dev/null, standard error discarded.
class CommandProbe final : public Probe {
 public:
  CommandProbe(std::string command, Nanos timeout)
      : command_(std::move(command)), timeout_(timeout) {}

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = "self";
    std::string error;
    const std::optional<double> v = run(error);
    if (v) {
      s.value = *v;
      s.error.clear();
    } else {
      s.error = std::move(error);
    }
  }

 private:
  std::optional<double> run(std::string& error) const {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) {
      error = "pipe: " + std::string(std::strerror(errno));
      return std::nullopt;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      error = "fork: " + std::string(std::strerror(errno));
      ::close(out[0]);
      ::close(out[1]);
      return std::nullopt;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, STDIN_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // as the child does: whichever runs first
    ::close(out[1]);
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    bool timed_out = false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{out[0], POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // end of output
      if (text.size() < 4096) text.append(buf, static_cast<std::size_t>(n));
    }
    ::close(out[0]);
    if (timed_out) ::kill(-pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (timed_out) {
      error = "command did not finish within " + std::to_string(secs(timeout_)) + "s";
      return std::nullopt;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      error = WIFEXITED(status)
                  ? "command exited with " + std::to_string(WEXITSTATUS(status))
                  : "command was killed by signal " + std::to_string(WTERMSIG(status));
      return std::nullopt;
    }
    std::istringstream in(text);
    std::string word;
    in >> word;
    double v = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
    if (word.empty() || ec != std::errc{} || end != word.data() + word.size() ||
        !std::isfinite(v)) {
      error = "command printed '" + word.substr(0, 64) + "', not a number";
      return std::nullopt;
    }
    return v;
  }

  const std::string command_;
  const Nanos timeout_;
};

// A sluice policy's utilisation, in flight / limit, looked up by name among the policies the
// server serves now (so a reload that replaces it is followed); the host is its name.
class PolicyProbe final : public Probe {
 public:
  PolicyProbe(std::shared_ptr<const PolicyDirectory> directory, std::string policy)
      : directory_(std::move(directory)), policy_(std::move(policy)) {}

  void sample(std::vector<ThrottleSample>& hosts) override {
    hosts.resize(1);
    ThrottleSample& s = hosts.front();
    s.host = policy_;
    const std::shared_ptr<Policy> p = directory_ ? directory_->find(policy_) : nullptr;
    if (p == nullptr) {
      s.error = "no policy named '" + policy_ + "' is serving";
      return;
    }
    if (p->admit_family() == nullptr) {
      s.error = "policy " + policy_ + " is a " + p->kind() + " policy: it has no calls in flight";
      return;
    }
    const PolicyInfo info = p->info();
    if (info.limit == 0) {
      s.error = "policy " + policy_ + " has no single limit";
      return;
    }
    s.value = static_cast<double>(info.in_flight) / static_cast<double>(info.limit);
    s.error.clear();
  }

 private:
  const std::shared_ptr<const PolicyDirectory> directory_;
  const std::string policy_;
};

std::unique_ptr<Probe> make_probe(const MetricSpec& m,
                                  const std::shared_ptr<const PolicyDirectory>& directory) {
  switch (m.probe) {
    case ProbeKind::kLoadAvg:
      return std::make_unique<LoadAvgProbe>();
    case ProbeKind::kCommand:
      return std::make_unique<CommandProbe>(m.command, m.timeout);
    case ProbeKind::kPolicy:
      return std::make_unique<PolicyProbe>(directory, m.policy);
  }
  return nullptr;
}

class ThrottlerPolicy final : public Policy {
 public:
  ThrottlerPolicy(const BuildContext& c, const ThrottlerSpec& spec)
      : Policy(c.name, "throttler", ""),
        clock_(c.clock),
        spec_(spec),
        directory_(c.directory),
        state_store_(c.runtime_state()),
        rules_(spec.apps),
        rng_(std::random_device{}()) {
    load_runtime_rules();
    for (const MetricSpec& m : spec_.metrics) {
      ThrottleMetric tm;
      tm.name = m.name;
      tm.threshold = m.threshold;
      tm.stale_intervals = spec_.stale_intervals;
      tm.ignore_hosts = m.ignore_hosts;
      metrics_.push_back(std::move(tm));
      probes_.push_back(make_probe(m, c.directory));
      last_sampled_.push_back(Nanos{INT64_MIN});
      last_.push_back(Last::kOk);
    }
    for (std::size_t i = 0; i < metrics_.size(); ++i)
      start_loop(c.clock, [this, i](Nanos now) { return tick(i, now); });
  }
  ~ThrottlerPolicy() override { retire(); }
  ThrottlerPolicy(const ThrottlerPolicy&) = delete;
  ThrottlerPolicy& operator=(const ThrottlerPolicy&) = delete;

  [[nodiscard]] const std::string& shard() const noexcept { return spec_.shard; }

  // ---- rules set at run time (admin), kept in the server's state file ----

  // Throttles `app` for `duration` with probability `ratio` (an app "all": every app).
  Status throttle(const std::string& app, Nanos duration, double ratio) {
    if (Status s = check_app(app); !s.ok()) return s;
    if (!(ratio > 0 && ratio <= 1)) return bad("ratio: must be in (0, 1]");
    if (duration <= Nanos{0} || duration > kMaxThrottle)
      return bad("duration: must be positive and at most a year");
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    r.until_unix_ms =
        unix_ms_now() + std::chrono::ceil<std::chrono::milliseconds>(duration).count();
    r.ratio = ratio;
    return save(app, r);
  }
  Status unthrottle(const std::string& app) {
    if (Status s = check_app(app); !s.ok()) return s;
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    r.until_unix_ms = 0;
    r.ratio = 1;
    return save(app, r);
  }
  Status exempt(const std::string& app, bool exempt) {
    if (Status s = check_app(app); !s.ok()) return s;
    if (app == "all") return bad("app: 'all' cannot be exempt (name the apps)");
    const std::lock_guard lock(admin_mu_);
    RuntimeRule r = runtime_rule(app);
    r.exempt = exempt;
    return save(app, r);
  }
  // The apps with a rule (config or run time): throttled until when, ratio, exempt.
  nlohmann::json rules_json() const {
    const Nanos now = clock_.now();
    const std::lock_guard lock(mu_);
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [app, r] : rules_) {
      const bool throttled = now < r.throttled_until;
      if (!throttled && !r.exempt && r.metrics.empty() && r.thresholds.empty()) continue;
      nlohmann::json j = {{"exempt", r.exempt}};
      if (throttled) {
        j["throttled_seconds_left"] = secs(r.throttled_until - now);
        j["ratio"] = r.ratio;
      }
      if (!r.metrics.empty()) j["metrics"] = r.metrics;
      if (!r.thresholds.empty()) j["thresholds"] = r.thresholds;
      out[app] = std::move(j);
    }
    return out;
  }
  // The apps that checked, most recent first: the audit.
  nlohmann::json recent_apps_json() const {
    const Nanos now = clock_.now();
    const std::lock_guard lock(mu_);
    std::vector<std::pair<Nanos, std::string>> order;
    for (const auto& [name, a] : state_.apps) order.emplace_back(a.last_check, name);
    std::sort(order.rbegin(), order.rend());
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [at, name] : order) {
      const ThrottleAppStats& a = state_.apps.at(name);
      const double span = secs(a.last_check - a.first_check);
      out.push_back(
          {{"app", name},
           {"checks", a.checks},
           {"refused", a.refused},
           {"seconds_since_last_check", secs(now - at)},
           {"checks_per_second", span > 0 ? static_cast<double>(a.checks - 1) / span : 0.0},
           {"last_client", a.last_client}});
    }
    return out;
  }

  ThrottleResult check(std::string_view app, ThrottleScope scope, bool low_priority,
                       std::string_view client) {
    const Nanos now = clock_.now();
    bool was_dormant = false;
    ThrottleResult r;
    {
      const std::lock_guard lock(mu_);
      was_dormant = interval_at(now) != spec_.fast_interval;
      const double draw = std::uniform_real_distribution<double>(0, 1)(rng_);
      r = throttle_check(metrics_, rules_, spec_.options, state_,
                         ThrottleCheck{app, scope, low_priority, draw}, client, now);
    }
    if (was_dormant) wake_loops();  // sample at the fast interval from now on
    return r;
  }

 protected:
  void describe(nlohmann::json& j, PolicyInfo& /*info*/) const override {
    const Nanos now = clock_.now();
    const std::lock_guard lock(mu_);
    j["shard"] = spec_.shard;
    j["probing"] = interval_at(now) == spec_.fast_interval ? "fast" : "dormant";
    nlohmann::json metrics = nlohmann::json::array();
    for (const ThrottleMetric& m : metrics_) {
      nlohmann::json hosts = nlohmann::json::array();
      for (const ThrottleSample& s : m.hosts) {
        nlohmann::json h = {{"host", s.host}, {"value", s.value}};
        if (s.taken_at.count() != INT64_MIN) h["age_seconds"] = secs(now - s.taken_at);
        if (!s.error.empty()) h["error"] = s.error;
        hosts.push_back(std::move(h));
      }
      metrics.push_back({{"name", m.name}, {"threshold", m.threshold}, {"hosts", hosts}});
    }
    j["metrics"] = std::move(metrics);
    nlohmann::json apps = nlohmann::json::object();
    for (const auto& [name, a] : state_.apps)
      apps[name] = {{"checks", a.checks},
                    {"refused", a.refused},
                    {"last_client", a.last_client},
                    {"seconds_since_last_check", secs(now - a.last_check)}};
    j["apps"] = std::move(apps);
  }

  void metrics(std::vector<MetricFamily>& out) const override {
    const Nanos now = clock_.now();
    const std::lock_guard lock(mu_);
    MetricFamily checks{"sluice_throttler_checks_total",
                        "Throttler checks by app (bounded)",
                        MetricType::Counter,
                        {}};
    MetricFamily refused{"sluice_throttler_refused_total",
                         "Throttler checks refused by app (bounded)",
                         MetricType::Counter,
                         {}};
    for (const auto& [name, a] : state_.apps) {
      ClientMetric c;
      c.label = {{"app", name}};
      c.counter.value = static_cast<double>(a.checks);
      checks.metric.push_back(c);
      c.counter.value = static_cast<double>(a.refused);
      refused.metric.push_back(std::move(c));
    }
    MetricFamily value{"sluice_throttler_metric_value",
                       "The latest sample of a throttler metric",
                       MetricType::Gauge,
                       {}};
    MetricFamily age{"sluice_throttler_sample_age_seconds",
                     "How old a throttler metric's latest sample is",
                     MetricType::Gauge,
                     {}};
    for (const ThrottleMetric& m : metrics_)
      for (const ThrottleSample& s : m.hosts) {
        if (s.taken_at.count() == INT64_MIN) continue;
        ClientMetric c;
        c.label = {{"metric", m.name}, {"host", s.host}};
        c.gauge.value = s.error.empty() ? s.value : std::nan("");
        value.metric.push_back(c);
        c.gauge.value = secs(now - s.taken_at);
        age.metric.push_back(std::move(c));
      }
    out.push_back(std::move(checks));
    out.push_back(std::move(refused));
    out.push_back(std::move(value));
    out.push_back(std::move(age));
  }

 private:
  // With mu_ held.
  Nanos interval_at(Nanos now) const {
    return probe_interval(state_.last_check, now, spec_.fast_interval, spec_.dormant_interval,
                          spec_.idle_after);
  }

  // Samples metric `i` when it is due at the interval in force (the fast one after a failed
  // sample, so a probe that failed while dormant, or before the policies it reads were
  // published, is retried at once), outside the lock: a probe may take a while, and each
  // metric has its own loop, so a slow probe delays no other metric's samples. Returns when it
  // is due next. A sample is stamped with the time its probe started (the oldest its reading
  // can be) and the interval in force then.
  Nanos tick(std::size_t i, Nanos now) {
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
    last_sampled_[i] = started;
    last_[i] = !failed ? Last::kOk : unpublished ? Last::kFailedUnpublished : Last::kFailed;
    if (!failed) return started + interval;
    if (unpublished) return started + kBeforePublish;
    return started + std::min(interval, spec_.fast_interval);
  }

  // An app's rule as set at run time, as the state file keeps it (expiry in wall-clock
  // milliseconds, so that a restart keeps the time left; 0: not throttled).
  struct RuntimeRule {
    std::int64_t until_unix_ms = 0;
    double ratio = 1;
    bool exempt = false;
  };
  static constexpr Nanos kMaxThrottle = std::chrono::hours(24 * 366);
  static constexpr Nanos kBeforePublish = std::chrono::milliseconds(1);

  static Status bad(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status check_app(const std::string& app) {
    if (app.empty()) return bad("app: must name an app");
    if (app.size() > 256) return bad("app: at most 256 bytes");
    return {};
  }
  static std::int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // The rule stored for `app` (the defaults when none).
  RuntimeRule runtime_rule(const std::string& app) const {
    RuntimeRule r;
    auto v = state_store_.get(app);
    if (v.ok() && v.value()) {
      const nlohmann::json& j = *v.value();
      r.until_unix_ms = j.value("throttled_until_unix_ms", std::int64_t{0});
      r.ratio = j.value("ratio", 1.0);
      r.exempt = j.value("exempt", false);
    }
    return r;
  }
  // Stores `r` for `app` (durably; erased when it says nothing) and applies it.
  Status save(const std::string& app, const RuntimeRule& r) {
    const bool empty = r.until_unix_ms == 0 && !r.exempt;
    Status s = empty ? state_store_.erase(app)
                     : state_store_.put(app, {{"throttled_until_unix_ms", r.until_unix_ms},
                                              {"ratio", r.ratio},
                                              {"exempt", r.exempt}});
    if (!s.ok()) return s;
    apply(app, r);
    return {};
  }
  // Applies a stored rule over the config's rule for `app`.
  void apply(const std::string& app, const RuntimeRule& r) {
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
    const bool says_nothing =
        config == spec_.apps.end() && !rule.exempt && rule.throttled_until.count() == INT64_MIN;
    if (says_nothing)
      rules_.erase(app);
    else
      rules_[app] = std::move(rule);
  }
  // At start: every stored rule, less the throttles that ran out while the server was down
  // (erased from the file, so it does not keep what no longer says anything).
  void load_runtime_rules() {
    const std::int64_t now_ms = unix_ms_now();
    for (const auto& [app, v] : state_store_.list()) {
      (void)v;
      RuntimeRule r = runtime_rule(app);
      if (r.until_unix_ms != 0 && r.until_unix_ms <= now_ms) {
        r.until_unix_ms = 0;
        r.ratio = 1;
        if (!(r.exempt
                  ? state_store_.put(
                        app, {{"throttled_until_unix_ms", 0}, {"ratio", 1.0}, {"exempt", true}})
                  : state_store_.erase(app))
                 .ok())
          continue;  // kept in the file; it says nothing now either way
      }
      apply(app, r);
    }
  }

  const Clock& clock_;
  const ThrottlerSpec spec_;
  const std::shared_ptr<const PolicyDirectory> directory_;  // null without an engine
  RuntimeState state_store_;
  std::mutex admin_mu_;  // one admin change at a time (read, change, write a rule)
  std::vector<std::unique_ptr<Probe>> probes_;  // probes_[i] used by metric i's loop only
  mutable std::mutex mu_;
  std::vector<ThrottleMetric> metrics_;  // guarded by mu_
  std::vector<Nanos> last_sampled_;      // guarded by mu_
  // How the last sample went: ok, failed, or failed before the first publish.
  enum class Last { kOk, kFailed, kFailedUnpublished };
  std::vector<Last> last_;                                     // guarded by mu_
  ThrottlerState state_;                                       // guarded by mu_
  std::map<std::string, ThrottleAppRule, std::less<>> rules_;  // config + run time; mu_
  std::mt19937_64 rng_;                                        // guarded by mu_
};

// ---- the config ----

std::shared_ptr<const PolicyBody> parse(const std::string& name, ConfigSection& s,
                                        PolicySpec& /*spec*/) {
  s.keys({"kind", "shard", "scope", "default_app", "fast_interval", "dormant_interval",
          "idle_after", "stale_intervals", "low_priority_hold", "metrics", "apps"});
  auto body = std::make_shared<ThrottlerSpec>();
  body->shard = name;
  if (auto v = s.str("shard")) {
    if (v->empty()) s.error("shard", "must not be empty");
    body->shard = *v;
  }
  if (auto v = s.choice<ThrottleScope>(
          "scope", {{"shard", ThrottleScope::kShard}, {"self", ThrottleScope::kSelf}}))
    body->options.default_scope = *v;
  if (auto v = s.str("default_app")) {
    if (v->empty()) s.error("default_app", "must not be empty");
    body->options.default_app = *v;
  }
  if (auto d = s.duration("fast_interval")) body->fast_interval = *d;
  if (auto d = s.duration("dormant_interval")) body->dormant_interval = *d;
  if (auto d = s.duration("idle_after")) body->idle_after = *d;
  if (auto d = s.duration("low_priority_hold")) body->options.low_priority_hold = *d;
  if (body->dormant_interval < body->fast_interval)
    s.error("dormant_interval", "must be at least fast_interval");
  if (auto v = s.number("stale_intervals")) {
    if (*v < 1)
      s.error("stale_intervals", "must be >= 1 (a sample is due every interval)");
    else
      body->stale_intervals = *v;
  }
  s.named("metrics", [&](const std::string& metric, ConfigSection& m) {
    m.keys({"probe", "threshold", "ignore_hosts", "command", "timeout", "policy"});
    MetricSpec spec;
    spec.name = metric;
    if (auto p = m.choice<ProbeKind>("probe",
                                     {{"loadavg", ProbeKind::kLoadAvg},
                                      {"command", ProbeKind::kCommand},
                                      {"policy", ProbeKind::kPolicy}},
                                     true))
      spec.probe = *p;
    if (auto v = m.str("policy", spec.probe == ProbeKind::kPolicy)) {
      if (spec.probe != ProbeKind::kPolicy)
        m.error("policy", "is for probe: policy");
      else if (v->empty() || *v == name)
        m.error("policy", v->empty() ? "must name a policy" : "must name another policy");
      spec.policy = *v;
    }
    if (auto c = m.str("command", spec.probe == ProbeKind::kCommand)) {
      if (spec.probe != ProbeKind::kCommand)
        m.error("command", "is for probe: command");
      else if (c->empty())
        m.error("command", "must not be empty");
      spec.command = *c;
    }
    if (auto d = m.duration("timeout")) {
      if (spec.probe != ProbeKind::kCommand) m.error("timeout", "is for probe: command");
      spec.timeout = *d;
    }
    if (auto t = m.number("threshold", true)) {
      if (*t <= 0)
        m.error("threshold", "must be > 0");
      else
        spec.threshold = *t;
    }
    if (auto v = m.uint("ignore_hosts", 0, 1000)) spec.ignore_hosts = *v;
    body->metrics.push_back(std::move(spec));
  });
  if (body->metrics.empty() && !s.has("metrics"))
    s.error("metrics", "is required: at least one metric to check");
  const auto known = [&](const std::string& metric) {
    return std::any_of(body->metrics.begin(), body->metrics.end(),
                       [&](const MetricSpec& m) { return m.name == metric; });
  };
  s.named("apps", [&](const std::string& app, ConfigSection& a) {
    a.keys({"metrics", "thresholds", "exempt"});
    ThrottleAppRule rule;
    if (auto v = a.strings("metrics")) {
      for (const std::string& m : *v)
        if (!known(m)) a.error("metrics", "names '" + m + "', which is not one of the metrics");
      rule.metrics = *v;
    }
    if (auto v = a.numbers("thresholds"))
      for (const auto& [metric, t] : *v) {
        if (!known(metric))
          a.error_at("thresholds." + metric, "is not one of the metrics");
        else if (t <= 0)
          a.error_at("thresholds." + metric, "must be > 0");
        rule.thresholds[metric] = t;
      }
    if (auto v = a.boolean("exempt")) rule.exempt = *v;
    body->apps[app] = std::move(rule);
  });
  return body;
}

StatusOr<std::shared_ptr<Policy>> build(const BuildContext& c) {
  return std::shared_ptr<Policy>(std::make_shared<ThrottlerPolicy>(c, *c.spec.as<ThrottlerSpec>()));
}

// ---- the routes ----

// The throttler a check names by shard (or the first one when it names none).
StatusOr<std::shared_ptr<ThrottlerPolicy>> find(const KindPolicies& ps,
                                                std::optional<std::string_view> shard) {
  for (const std::shared_ptr<Policy>& p : ps) {
    auto t = std::static_pointer_cast<ThrottlerPolicy>(p);
    if (!shard || t->shard() == *shard) return t;
  }
  if (ps.empty()) return Status(StatusCode::kNotFound, "no throttler is configured");
  return Status(StatusCode::kNotFound, "no throttler serves shard '" + std::string(*shard) + "'");
}

nlohmann::json body_of(const ThrottleResult& r) {
  nlohmann::json metrics = nlohmann::json::object();
  for (const ThrottleMetricResult& m : r.metrics) {
    metrics[m.name] = {{"StatusCode", m.over ? 429 : 200},
                       {"Value", m.value},
                       {"Threshold", m.threshold},
                       {"Message", m.detail},
                       {"Scope", m.scope},
                       {"Host", m.host},
                       {"reason", m.reason}};
  }
  return {{"StatusCode", r.status},
          {"Value", r.value},
          {"Threshold", r.threshold},
          {"Message", r.message},
          {"RecentlyChecked", r.recently_checked},
          {"AppName", r.app},
          {"MetricName", r.metric},
          {"Scope", r.scope},
          {"Metrics", std::move(metrics)},
          {"reason", r.reason},
          {"value", r.value},
          {"threshold", r.threshold}};
}

RouteReply reply_of(const ThrottleResult& r) {
  RouteReply out;
  out.status = r.status;
  out.body = body_of(r).dump();
  return out;
}

RouteReply bad_request(const std::string& message) {
  RouteReply out;
  out.status = 400;
  out.body = nlohmann::json{{"StatusCode", 400}, {"Message", message}}.dump();
  return out;
}

RouteReply not_found(const Status& s) {
  RouteReply out;
  out.status = 404;
  out.body = nlohmann::json{{"StatusCode", 404}, {"Message", s.message()}}.dump();
  return out;
}

// /throttler/check and /throttler/check-self (`self`: the scope is self whatever is asked).
HttpRoute vitess_route(std::string pattern, bool self) {
  return HttpRoute{{"GET", "HEAD"},
                   std::move(pattern),
                   false,
                   [self](const RouteRequest& req, const KindPolicies& ps,
                          Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                     auto t = find(ps, req.arg("shard"));
                     if (!t.ok()) return not_found(t.status());
                     const std::optional<ThrottleScope> scope =
                         self ? std::optional<ThrottleScope>(ThrottleScope::kSelf)
                              : parse_scope(req.arg("scope").value_or(""));
                     if (!scope)
                       return bad_request("scope: must be self or shard, not '" +
                                          std::string(*req.arg("scope")) + "'");
                     const std::string_view p = req.arg("p").value_or("");
                     if (!p.empty() && p != "low" && p != "normal")
                       return bad_request("p: must be low or normal, not '" + std::string(p) + "'");
                     return reply_of(t.value()->check(req.arg("app").value_or(""), *scope,
                                                      p == "low", req.peer));
                   }};
}

RouteReply ok_json(nlohmann::json body) {
  RouteReply out;
  out.body = body.dump();
  return out;
}

// An admin change's answer: 200 with the app's rules now, or the error (400 for bad input).
Decided<RouteReply> changed(const Status& s, const ThrottlerPolicy& t, const std::string& app) {
  if (!s.ok()) return s;
  nlohmann::json rules = t.rules_json();
  return ok_json(
      {{"app", app}, {"rule", rules.contains(app) ? rules[app] : nlohmann::json::object()}});
}

// A duration argument ("30m", "1h"); `fallback` when absent.
StatusOr<Nanos> duration_arg(std::optional<std::string_view> text, Nanos fallback,
                             const char* name) {
  if (!text) return fallback;
  const std::optional<Nanos> d = parse_duration(*text);
  if (!d || *d <= Nanos{0})
    return Status(StatusCode::kInvalidArgument, std::string(name) +
                                                    ": must be a positive duration such as 30m "
                                                    "or 1h, not '" +
                                                    std::string(*text) + "'");
  return *d;
}

StatusOr<double> ratio_arg(std::optional<std::string_view> text) {
  if (!text) return 1.0;
  double v = 0;
  const auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc{} || end != text->data() + text->size() || !(v > 0 && v <= 1))
    return Status(StatusCode::kInvalidArgument,
                  "ratio: must be a number in (0, 1], not '" + std::string(*text) + "'");
  return v;
}

// An admin route of the throttler named by `shard=` (or the first).
using AdminAction = std::function<Decided<RouteReply>(const RouteRequest&, ThrottlerPolicy&)>;
HttpRoute admin_route(std::string pattern, AdminAction action) {
  return HttpRoute{
      {"GET", "POST"},
      std::move(pattern),
      true,
      [action = std::move(action)](const RouteRequest& req, const KindPolicies& ps,
                                   Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        auto t = find(ps, req.arg("shard"));
        if (!t.ok()) return not_found(t.status());
        return action(req, *t.value());
      }};
}

// The app a route names: its {app} segment, else its `app=` argument.
std::string app_of(const RouteRequest& req) {
  const std::string_view segment = req.param("app");
  return std::string(!segment.empty() ? segment : req.arg("app").value_or(""));
}

// freno: /throttle-app/{app}[/{ttl_minutes}[/{ratio}]] (a TTL of 0 or none: an hour).
Decided<RouteReply> freno_throttle(const RouteRequest& req, ThrottlerPolicy& t) {
  Nanos ttl = std::chrono::hours(1);
  const std::string_view minutes = req.param("ttl_minutes");
  if (!minutes.empty()) {
    std::uint64_t m = 0;
    const auto [end, ec] = std::from_chars(minutes.data(), minutes.data() + minutes.size(), m);
    if (ec != std::errc{} || end != minutes.data() + minutes.size() || m > 366 * 24 * 60)
      return Status(
          StatusCode::kInvalidArgument,
          "ttl_minutes: must be a whole number of minutes, not '" + std::string(minutes) + "'");
    if (m > 0) ttl = std::chrono::minutes(m);
  }
  const std::string_view ratio_text = req.param("ratio");
  auto ratio =
      ratio_arg(ratio_text.empty() ? std::nullopt : std::optional<std::string_view>(ratio_text));
  if (!ratio.ok()) return ratio.status();
  const std::string app = app_of(req);
  return changed(t.throttle(app, ttl, ratio.value()), t, app);
}

PolicyKind throttler_kind_impl() {
  PolicyKind kind("throttler", 0, parse, build);
  kind.routes.push_back(vitess_route("/throttler/check", false));
  kind.routes.push_back(vitess_route("/throttler/check-self", true));
  kind.routes.push_back(HttpRoute{{"GET", "HEAD"},
                                  "/check/{app}/{store_type}/{store_name}",
                                  false,
                                  [](const RouteRequest& req, const KindPolicies& ps,
                                     Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                                    auto t = find(ps, req.param("store_name"));
                                    if (!t.ok()) return not_found(t.status());
                                    return reply_of(t.value()->check(req.param("app"),
                                                                     ThrottleScope::kDefault, false,
                                                                     req.peer));
                                  }});
  // Rules at run time (admin; kept in server.state_file): the Vitess and freno verbs.
  kind.routes.push_back(
      admin_route("/throttler/throttle-app", [](const RouteRequest& req, ThrottlerPolicy& t) {
        auto d = duration_arg(req.arg("duration"), std::chrono::hours(1), "duration");
        if (!d.ok()) return Decided<RouteReply>(d.status());
        auto ratio = ratio_arg(req.arg("ratio"));
        if (!ratio.ok()) return Decided<RouteReply>(ratio.status());
        const std::string app = app_of(req);
        return changed(t.throttle(app, d.value(), ratio.value()), t, app);
      }));
  kind.routes.push_back(
      admin_route("/throttler/unthrottle-app", [](const RouteRequest& req, ThrottlerPolicy& t) {
        const std::string app = app_of(req);
        return changed(t.unthrottle(app), t, app);
      }));
  kind.routes.push_back(
      admin_route("/throttler/exempt-app", [](const RouteRequest& req, ThrottlerPolicy& t) {
        const std::string_view e = req.arg("exempt").value_or("true");
        if (e != "true" && e != "false")
          return Decided<RouteReply>(
              Status(StatusCode::kInvalidArgument,
                     "exempt: must be true or false, not '" + std::string(e) + "'"));
        const std::string app = app_of(req);
        return changed(t.exempt(app, e == "true"), t, app);
      }));
  for (const char* pattern : {"/throttle-app/{app}", "/throttle-app/{app}/{ttl_minutes}",
                              "/throttle-app/{app}/{ttl_minutes}/{ratio}"})
    kind.routes.push_back(admin_route(pattern, freno_throttle));
  kind.routes.push_back(
      admin_route("/unthrottle-app/{app}", [](const RouteRequest& req, ThrottlerPolicy& t) {
        const std::string app = app_of(req);
        return changed(t.unthrottle(app), t, app);
      }));
  // Read-only listings: the rules, and the apps that checked (the audit).
  const auto listing = [](std::string pattern, bool recent) {
    return HttpRoute{{"GET"},
                     std::move(pattern),
                     false,
                     [recent](const RouteRequest& req, const KindPolicies& ps,
                              Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                       auto t = find(ps, req.arg("shard"));
                       if (!t.ok()) return not_found(t.status());
                       return ok_json(recent
                                          ? nlohmann::json{{"apps", t.value()->recent_apps_json()}}
                                          : nlohmann::json{{"apps", t.value()->rules_json()}});
                     }};
  };
  kind.routes.push_back(listing("/throttler/throttled-apps", false));
  kind.routes.push_back(listing("/throttler/recent-apps", true));
  return kind;
}

}  // namespace

PolicyKind throttler_kind() { return throttler_kind_impl(); }

}  // namespace sluice::server
