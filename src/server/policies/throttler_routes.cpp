// throttler_routes.cpp: the throttler kind's routes (throttler_policy.h): the Vitess and freno
// checks, admin verbs and listings over HTTP, and the gRPC check.
#include <charconv>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "api/decode_errors.h"
#include "server/json_text.h"
#include "server/policies/throttler_policy.h"
#include "sluice/core/text.h"
#include "sluice/v1/sluice.pb.h"

namespace sluice::server::throttler_detail {
namespace {

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

// The check's JSON, written directly: it is built for every check (HEAD too, whose
// Content-Length must be the GET body's), and a DOM per check would cost more than the rest of
// the request. Keys in the Vitess/freno shape, then the richer reason/value/threshold.
class JsonWriter {
 public:
  JsonWriter() { out_.reserve(512); }  // a check's answer, with a few metrics
  JsonWriter& key(std::string_view k) {
    comma();
    quoted(k);
    out_ += ':';
    fresh_ = true;
    return *this;
  }
  JsonWriter& text(std::string_view v) {
    comma();
    quoted(v);
    return *this;
  }
  JsonWriter& number(double v) {
    comma();
    if (!std::isfinite(v)) {
      out_ += "null";
      return *this;
    }
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, ec == std::errc{} ? end : buf);
    return *this;
  }
  JsonWriter& boolean(bool v) {
    comma();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& open() {
    comma();
    out_ += '{';
    fresh_ = true;
    return *this;
  }
  JsonWriter& close() {
    out_ += '}';
    fresh_ = false;
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  void comma() {
    if (!fresh_) out_ += ',';
    fresh_ = false;
  }
  void quoted(std::string_view v) {
    if (!is_utf8(v)) return quoted(utf8_or_replaced(v));  // a probe's error, say
    out_ += '"';
    std::size_t run = 0;  // the start of the characters not yet written, all plain
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto u = static_cast<unsigned char>(v[i]);
      if (u >= 0x20 && v[i] != '"' && v[i] != '\\') continue;  // UTF-8 passes through
      out_.append(v.substr(run, i - run));
      if (u < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        const char escape[] = {'\\', 'u', '0', '0', kHex[u >> 4], kHex[u & 15]};
        out_.append(escape, sizeof escape);
      } else {
        const char escape[] = {'\\', v[i]};
        out_.append(escape, sizeof escape);
      }
      run = i + 1;
    }
    out_.append(v.substr(run));
    out_ += '"';
  }
  std::string out_;
  bool fresh_ = true;
};

std::string body_of(const ThrottleResult& r) {
  JsonWriter w;
  w.open().key("StatusCode").number(r.status);
  w.key("ResponseCode")
      .number(vitess_response_code(r.status, r.reason))
      .key("Value")
      .number(r.value);
  w.key("Threshold").number(r.threshold).key("Message").text(r.message);
  w.key("RecentlyChecked").boolean(r.recently_checked).key("AppName").text(r.app);
  w.key("MetricName").text(r.metric).key("Scope").text(r.scope).key("Metrics").open();
  for (const ThrottleMetricResult& m : r.metrics) {
    const unsigned status = m.over ? 429 : 200;
    w.key(m.name).open().key("StatusCode").number(status);
    w.key("ResponseCode").number(vitess_response_code(status, m.reason));
    w.key("Value").number(m.value).key("Threshold").number(m.threshold);
    w.key("Message").text(m.detail).key("Scope").text(m.scope).key("Host").text(m.host);
    w.key("reason").text(m.reason).close();
  }
  w.close().key("reason").text(r.reason).key("value").number(r.value);
  w.key("threshold").number(r.threshold).close();
  return w.take();
}

RouteReply reply_of(const ThrottleResult& r) {
  RouteReply out;
  out.status = r.status;
  out.body = body_of(r);
  return out;
}

RouteReply bad_request(const std::string& message) {
  RouteReply out;
  out.status = 400;
  out.body = json_text(nlohmann::json{{"StatusCode", 400}, {"Message", message}});
  return out;
}

RouteReply not_found(const Status& s) {
  RouteReply out;
  out.status = 404;
  out.body = json_text(nlohmann::json{{"StatusCode", 404}, {"Message", s.message()}});
  return out;
}

RouteReply ok_json(nlohmann::json body) {
  RouteReply out;
  out.body = json_text(body);
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

// The app a route names: its {app} segment, else its `app=` argument.
std::string app_of(const RouteRequest& req) {
  const std::string_view segment = req.param("app");
  return std::string(!segment.empty() ? segment : req.arg("app").value_or(""));
}

// freno's {ttl_minutes} segment: `fallback` when absent or 0, else that many minutes (a year at
// most).
StatusOr<Nanos> freno_ttl(const RouteRequest& req, Nanos fallback) {
  const std::string_view minutes = req.param("ttl_minutes");
  if (minutes.empty()) return fallback;
  std::uint64_t m = 0;
  const auto [end, ec] = std::from_chars(minutes.data(), minutes.data() + minutes.size(), m);
  if (ec != std::errc{} || end != minutes.data() + minutes.size() ||
      std::chrono::minutes(m) > ThrottlerPolicy::longest_throttle())
    return Status(StatusCode::kInvalidArgument,
                  "ttl_minutes: must be a whole number of minutes up to a year, not '" +
                      std::string(minutes) + "'");
  return m > 0 ? Nanos{std::chrono::minutes(m)} : fallback;
}

}  // namespace

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
                     const std::string_view app = req.arg("app").value_or("");
                     if (std::string why = app.empty() ? "" : app_name_error(app); !why.empty())
                       return bad_request(why);
                     return reply_of(t.value()->check(app, *scope, p == "low", req.peer));
                   }};
}

// freno's checks: /check/{app}/{store_type}/{store_name} (the store name is the shard),
// /check-read/.../{threshold} with the reader's own threshold, and their -if-exists forms, which
// answer 200 for a store no throttler serves (a client that may ask about stores not yet
// throttled); ?p=low for a low-priority app.
HttpRoute freno_route(std::string pattern, bool if_exists) {
  return HttpRoute{
      {"GET", "HEAD"},
      std::move(pattern),
      false,
      [if_exists](const RouteRequest& req, const KindPolicies& ps,
                  Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        auto t = find(ps, req.param("store_name"));
        if (!t.ok()) {
          if (!if_exists) return not_found(t.status());
          return ok_json({{"StatusCode", 200}, {"Message", t.status().message()}});
        }
        double threshold = 0;
        if (const std::string_view text = req.param("threshold"); !text.empty()) {
          const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), threshold);
          if (ec != std::errc{} || end != text.data() + text.size() || !(threshold > 0) ||
              !std::isfinite(threshold))
            return bad_request("threshold: must be a number > 0, not '" + std::string(text) + "'");
        }
        if (std::string why = app_name_error(req.param("app")); !why.empty())
          return bad_request(why);
        // freno: p=low is low priority, any other p normal.
        const bool low = req.arg("p") == std::optional<std::string_view>("low");
        return reply_of(
            t.value()->check(req.param("app"), ThrottleScope::kDefault, low, req.peer, threshold));
      }};
}

// gRPC sluice.v1.Throttler/Check: ThrottlerCheckRequest -> ThrottlerCheckResponse
// (proto/sluice/v1/sluice.proto), read and written with the generated messages.
Decided<std::string> grpc_check(std::string_view request, const KindPolicies& ps,
                                Deferral<std::string>& /*later*/) {
  v1::ThrottlerCheckRequest in;
  if (std::string why = api::decode(request, in); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  const std::string& app = in.app();
  if (std::string why = app.empty() ? "" : app_name_error(app); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  const double threshold = in.threshold();
  if (threshold < 0 || !std::isfinite(threshold))
    return Status(StatusCode::kInvalidArgument, "threshold: must be >= 0 (0: the metrics' own)");
  const std::optional<ThrottleScope> scope = parse_scope(in.scope());
  if (!scope)
    return Status(StatusCode::kInvalidArgument,
                  "scope: must be self or shard, not '" + in.scope() + "'");
  auto t =
      find(ps, in.shard().empty() ? std::nullopt : std::optional<std::string_view>(in.shard()));
  if (!t.ok()) return t.status();
  const ThrottleResult r = t.value()->check(app, *scope, in.low_priority(), "grpc", threshold);
  v1::ThrottlerCheckResponse out;
  out.set_status_code(static_cast<std::int32_t>(r.status));
  out.set_reason(r.reason);
  out.set_value(r.value);
  out.set_threshold(r.threshold);
  out.set_message(r.message);
  out.set_app(r.app);
  out.set_metric(r.metric);
  out.set_scope(r.scope);
  out.set_recently_checked(r.recently_checked);
  for (const ThrottleMetricResult& m : r.metrics) {
    v1::ThrottlerMetric& w = *out.add_metrics();
    w.set_name(m.name);
    w.set_status_code(m.over ? 429 : 200);
    w.set_value(m.value);
    w.set_threshold(m.threshold);
    w.set_reason(m.reason);
    w.set_message(m.detail);
    w.set_scope(m.scope);
    w.set_host(m.host);
  }
  return out.SerializeAsString();
}

// An admin route of the throttler named by `shard=` (or the first). Its action answers `done`
// once: at once for bad input, else when the state file holds the change. The call is parked
// meanwhile (deferred): a transport thread never waits for the disk.
HttpRoute admin_route(std::string pattern, AdminAction action) {
  return HttpRoute{
      {"GET", "POST"},
      std::move(pattern),
      true,
      [action = std::move(action)](const RouteRequest& req, const KindPolicies& ps,
                                   Deferral<RouteReply>& later) -> Decided<RouteReply> {
        auto t = find(ps, req.arg("shard"));
        if (!t.ok()) return not_found(t.status());
        std::shared_ptr<ThrottlerPolicy> policy = t.value();  // alive until answered
        Completion<RouteReply> answer = later.defer();
        action(req, *policy,
               [answer = std::move(answer), policy, app = app_of(req)](Status s) mutable {
                 answer(*changed(s, *policy, app));
               });
        return std::nullopt;
      }};
}

// /throttler/throttle-app?app=A[&duration=1h][&ratio=1].
void vitess_throttle(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  auto d = duration_arg(req.arg("duration"), std::chrono::hours(1), "duration");
  if (!d.ok()) return done(d.status());
  auto ratio = ratio_arg(req.arg("ratio"));
  if (!ratio.ok()) return done(ratio.status());
  t.throttle(app_of(req), d.value(), ratio.value(), std::move(done));  // ratio: 1 if none
}

// /throttler/unthrottle-app?app=A, and freno's /unthrottle-app/{app}.
void unthrottle_app(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  t.unthrottle(app_of(req), std::move(done));
}

// An app's metric set and thresholds at run time: metrics=a,b (empty: drop the run-time set),
// thresholds=lag:2,load:8 (0 drops one), clear=true (drop both first).
void vitess_app_rule(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  std::optional<std::vector<std::string>> metrics;
  if (const auto text = req.arg("metrics")) {
    metrics.emplace();
    for (std::string_view rest = *text; !rest.empty();) {
      const auto comma = rest.find(',');
      const std::string_view name = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      if (!name.empty()) metrics->emplace_back(name);
    }
  }
  std::map<std::string, double> thresholds;
  for (std::string_view rest = req.arg("thresholds").value_or(""); !rest.empty();) {
    const auto comma = rest.find(',');
    const std::string_view pair = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const auto colon = pair.find(':');
    double v = 0;
    const std::string_view number =
        colon == std::string_view::npos ? std::string_view{} : pair.substr(colon + 1);
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (colon == std::string_view::npos || number.empty() || ec != std::errc{} ||
        end != number.data() + number.size())
      return done(
          Status(StatusCode::kInvalidArgument,
                 "thresholds: expected metric:number pairs, not '" + std::string(pair) + "'"));
    thresholds[std::string(pair.substr(0, colon))] = v;
  }
  const std::string_view clear = req.arg("clear").value_or("false");
  if (clear != "true" && clear != "false")
    return done(Status(StatusCode::kInvalidArgument,
                       "clear: must be true or false, not '" + std::string(clear) + "'"));
  t.set_rule(app_of(req), metrics, thresholds, clear == "true", std::move(done));
}

// /throttler/exempt-app?app=A[&exempt=true|false].
void vitess_exempt(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  const std::string_view e = req.arg("exempt").value_or("true");
  if (e != "true" && e != "false")
    return done(Status(StatusCode::kInvalidArgument,
                       "exempt: must be true or false, not '" + std::string(e) + "'"));
  t.exempt(app_of(req), e == "true", std::move(done));
}

// freno's admin verbs, as freno routes them (GET and HEAD; POST too): the rule is for the store
// `store_name=` names (that shard's throttler: 404 if none) or, without it, for every store
// (every throttler), as freno's rule without a store holds for all. Answered in freno's shape
// once every throttler's state file holds it: 200 {"StatusCode":200,"Message":"OK"}; bad input
// 400 naming it (freno answers 500).
RouteReply freno_ok() {
  RouteReply out;
  out.body = "{\"StatusCode\":200,\"Message\":\"OK\"}\n";
  return out;
}
HttpRoute freno_admin_route(std::string pattern, AdminAction action) {
  return HttpRoute{
      {"GET", "HEAD", "POST"},
      std::move(pattern),
      true,
      [action = std::move(action)](const RouteRequest& req, const KindPolicies& ps,
                                   Deferral<RouteReply>& later) -> Decided<RouteReply> {
        std::vector<std::shared_ptr<ThrottlerPolicy>> targets;
        if (const auto store = req.arg("store_name")) {
          auto t = find(ps, *store);
          if (!t.ok()) return not_found(t.status());
          targets.push_back(std::move(t.value()));
        } else {
          for (const std::shared_ptr<Policy>& p : ps)
            targets.push_back(std::static_pointer_cast<ThrottlerPolicy>(p));
          if (targets.empty()) return not_found(find(ps, std::nullopt).status());
        }
        // Answered when the last throttler has answered: OK, or the first error.
        struct Join {
          std::mutex mu;
          std::size_t left;
          Status first;
          Completion<RouteReply> answer;
        };
        auto join = std::make_shared<Join>();
        join->left = targets.size();
        join->answer = later.defer();
        for (const std::shared_ptr<ThrottlerPolicy>& t : targets)
          action(req, *t, [join, t](Status s) {
            std::unique_lock lock(join->mu);
            if (!s.ok() && join->first.ok()) join->first = std::move(s);
            if (--join->left > 0) return;
            const Status first = join->first;
            lock.unlock();
            join->answer(first.ok() ? StatusOr<RouteReply>(freno_ok())
                                    : StatusOr<RouteReply>(first));
          });
        return std::nullopt;
      }};
}

// freno: /throttle-app/{app}[/ttl/{ttl_minutes}][/ratio/{ratio}]. No TTL, or 0: freno's rule
// never expires; here it lasts the longest a rule may (a year). No ratio: the one the app is
// throttled with now, else 1; a ratio of 0 (freno: never refused) lifts the throttle.
void freno_throttle(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  const StatusOr<Nanos> ttl = freno_ttl(req, ThrottlerPolicy::longest_throttle());
  if (!ttl.ok()) return done(ttl.status());
  std::optional<double> ratio;
  if (const std::string_view text = req.param("ratio"); !text.empty()) {
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || !(v >= 0 && v <= 1))
      return done(Status(StatusCode::kInvalidArgument,
                         "ratio: must be a number in [0, 1], not '" + std::string(text) + "'"));
    if (v == 0) return t.unthrottle(app_of(req), std::move(done));
    ratio = v;
  }
  t.throttle(app_of(req), ttl.value(), ratio, std::move(done));
}

// freno: /skip-host/{host_name}[/ttl/{ttl_minutes}] (no TTL, or 0: an hour, as freno's) leaves
// the host out of every metric's shard scope until then; /recover-host/{host_name} ends it.
void freno_skip_host(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  const StatusOr<Nanos> ttl = freno_ttl(req, std::chrono::hours(1));
  if (!ttl.ok()) return done(ttl.status());
  t.skip_host(std::string(req.param("host_name")), ttl.value(), std::move(done));
}

void freno_recover_host(const RouteRequest& req, ThrottlerPolicy& t, Done done) {
  t.recover_host(std::string(req.param("host_name")), std::move(done));
}

// freno's /skipped-hosts: every throttler's skipped hosts.
HttpRoute freno_skipped_hosts_listing(std::string pattern) {
  return HttpRoute{{"GET", "HEAD"},
                   std::move(pattern),
                   false,
                   [](const RouteRequest& /*req*/, const KindPolicies& ps,
                      Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                     nlohmann::json out = nlohmann::json::object();
                     for (const std::shared_ptr<Policy>& p : ps)
                       std::static_pointer_cast<ThrottlerPolicy>(p)->freno_skipped_hosts(out);
                     return ok_json(std::move(out));
                   }};
}

// freno's read-only routes: the rules and the recent apps in its shape (with several
// throttlers, each app under APP/STORE), and the load balancer's and leader checks (every
// sluice server decides alone: each is its own leader).
HttpRoute freno_listing(std::string pattern, bool recent) {
  return HttpRoute{{"GET", "HEAD"},
                   std::move(pattern),
                   false,
                   [recent](const RouteRequest& req, const KindPolicies& ps,
                            Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                     std::int64_t last_minutes = 0;
                     if (const std::string_view text = req.param("last_minutes"); !text.empty()) {
                       const auto [end, ec] =
                           std::from_chars(text.data(), text.data() + text.size(), last_minutes);
                       if (ec != std::errc{} || end != text.data() + text.size())
                         return bad_request("last_minutes: must be a whole number, not '" +
                                            std::string(text) + "'");
                     }
                     nlohmann::json out = nlohmann::json::object();
                     for (const std::shared_ptr<Policy>& p : ps) {
                       const auto t = std::static_pointer_cast<ThrottlerPolicy>(p);
                       if (recent)
                         t->freno_recent_apps(out, last_minutes);
                       else
                         t->freno_throttled_apps(out,
                                                 ps.size() > 1 ? "/" + t->shard() : std::string());
                     }
                     return ok_json(std::move(out));
                   }};
}

HttpRoute freno_status(std::string pattern, std::string body) {
  return HttpRoute{
      {"GET", "HEAD"},
      std::move(pattern),
      false,
      [body = std::move(body)](const RouteRequest& /*req*/, const KindPolicies& /*ps*/,
                               Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        RouteReply out;
        out.body = body;
        return out;
      }};
}

// /throttler/throttled-apps (the rules) and, `recent`, /throttler/recent-apps (the apps that
// checked: the audit).
HttpRoute vitess_listing(std::string pattern, bool recent) {
  return HttpRoute{
      {"GET"},
      std::move(pattern),
      false,
      [recent](const RouteRequest& req, const KindPolicies& ps,
               Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
        auto t = find(ps, req.arg("shard"));
        if (!t.ok()) return not_found(t.status());
        return ok_json(recent ? nlohmann::json{{"apps", t.value()->recent_apps_json()},
                                               {"unexplained_load", t.value()->unexplained_json()}}
                              : nlohmann::json{{"apps", t.value()->rules_json()}});
      }};
}

// Vitess's /throttler/status (ThrottlerPolicy::vitess_status_json()).
HttpRoute vitess_status_route(std::string pattern) {
  return HttpRoute{{"GET", "HEAD"},
                   std::move(pattern),
                   false,
                   [](const RouteRequest& req, const KindPolicies& ps,
                      Deferral<RouteReply>& /*later*/) -> Decided<RouteReply> {
                     auto t = find(ps, req.arg("shard"));
                     if (!t.ok()) return not_found(t.status());
                     return ok_json(t.value()->vitess_status_json());
                   }};
}

}  // namespace sluice::server::throttler_detail
