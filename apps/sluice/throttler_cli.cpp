#include "throttler_cli.h"

#include <fmt/core.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/http/http_client.h"
#include "sluice/backends/throttler_client.h"
#include "sluice/config/config.h"

namespace sluice::cli {
namespace {

using backend_detail::HttpAnswer;
using backend_detail::HttpUrl;
using backend_detail::url_encode;
using nlohmann::json;

Nanos timeout_of(const ThrottlerCliOptions& o) {
  return std::chrono::duration_cast<Nanos>(std::chrono::duration<double>(o.timeout_seconds));
}

std::string answer_text(const ThrottlerAnswer& a) {
  std::string out = a.ok ? "allowed" : "refused";
  if (a.status != 0) out += fmt::format(" ({})", a.status);
  out += ": " + a.reason;
  if (!a.metric.empty())
    out += fmt::format(", {} {:g} (threshold {:g})", a.metric, a.value, a.threshold);
  if (!a.ok && !a.message.empty()) out += " -- " + a.message;
  return out;
}

json answer_json(const ThrottlerAnswer& a) {
  return {{"ok", a.ok},
          {"status", a.status},
          {"reason", a.reason},
          {"unreachable", a.unreachable},
          {"metric", a.metric},
          {"value", a.value},
          {"threshold", a.threshold},
          {"message", a.message}};
}

// One HTTP call to the server; the answer, or nullopt with the error printed.
std::optional<HttpAnswer> call(const ThrottlerCliOptions& o, const std::string& method,
                               const std::string& target) {
  HttpUrl url;
  if (std::string e = backend_detail::parse_http_url(o.http, url); !e.empty()) {
    fmt::print(stderr, "sluice: --http: {}\n", e);
    return std::nullopt;
  }
  std::vector<std::string> headers = {"Accept: application/json"};
  if (!o.token.empty()) headers.push_back("Authorization: Bearer " + o.token);
  std::string base = url.target == "/" ? "" : url.target;
  if (!base.empty() && base.back() == '/') base.pop_back();
  HttpAnswer a = backend_detail::http_request(url, method, base + target, headers, timeout_of(o));
  if (!a.error.empty()) {
    fmt::print(stderr, "sluice: {}: {}\n", o.http, a.error);
    return std::nullopt;
  }
  return a;
}

std::string shard_arg(const ThrottlerCliOptions& o) {
  return o.shard.empty() ? "" : "&shard=" + url_encode(o.shard);
}

}  // namespace

int run_throttler_check(const ThrottlerCliOptions& o, const ThrottlerCheckArgs& a) {
  ThrottlerClientOptions co;
  co.url = o.http;
  co.app = a.app;
  co.shard = o.shard;
  co.scope = a.scope;
  co.low_priority = a.low_priority;
  co.timeout = timeout_of(o);
  auto client = ThrottlerClient::create(co);
  if (!client.ok()) {
    fmt::print(stderr, "sluice: {}\n", client.status().message());
    return 2;
  }
  ThrottlerAnswer last;
  if (a.wait.empty()) {
    last = client.value().check();
  } else {
    const std::optional<Nanos> wait = parse_duration(a.wait);
    if (!wait || *wait <= Nanos{0}) {
      fmt::print(stderr, "sluice: --wait: '{}' is not a duration (e.g. 30s, 10m)\n", a.wait);
      return 2;
    }
    WaitHooks hooks;
    hooks.on_wait = [&](const ThrottlerAnswer& refused, Nanos delay) {
      if (!o.json)
        fmt::print(stderr, "{}; checking again in {:.1f}s\n", answer_text(refused),
                   std::chrono::duration<double>(delay).count());
    };
    last = wait_until_allowed([&] { return client.value().check(); }, *wait, {}, hooks).last;
  }
  if (o.json)
    fmt::print("{}\n", answer_json(last).dump());
  else
    fmt::print("{}\n", answer_text(last));
  // Unreachable, an unknown shard or metric, a malformed argument: not a refusal but an error.
  if (last.unreachable || last.status == 404 || last.status == 400) return 2;
  return last.ok ? 0 : 1;
}

namespace {

// POSTs an admin verb's `target` and prints the app's rule as the server now has it.
int admin_call(const ThrottlerCliOptions& o, const std::string& verb, const std::string& app,
               const std::string& target) {
  const auto a = call(o, "POST", target + shard_arg(o));
  if (!a) return 2;
  const json body = json::parse(a->body, nullptr, false);
  if (a->status != 200) {
    std::string why = a->body.substr(0, 200);
    if (body.is_object() && body.contains("error") && body["error"].is_object())
      why = body["error"].value("message", why);
    else if (body.is_object() && body.contains("Message") && body["Message"].is_string())
      why = body["Message"].get<std::string>();
    fmt::print(stderr, "sluice: {} {}: {} {}\n", verb, app, a->status, why);
    return 2;
  }
  if (o.json) {
    fmt::print("{}\n", a->body);
  } else {
    const json rule = body.is_object() ? body.value("rule", json::object()) : json::object();
    fmt::print("{}: {}\n", app, rule.empty() ? "no rule (defaults)" : rule.dump());
  }
  return 0;
}

}  // namespace

int run_throttler_rule(const ThrottlerCliOptions& o, const std::string& app,
                       const std::string& metrics, const std::vector<std::string>& thresholds,
                       bool clear) {
  std::string target = "/throttler/app-rule?app=" + url_encode(app);
  if (metrics == "-")
    target += "&metrics=";
  else if (!metrics.empty())
    target += "&metrics=" + url_encode(metrics);
  std::string pairs;
  for (const std::string& t : thresholds) {
    const auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == t.size()) {
      fmt::print(stderr, "sluice: --threshold: expected METRIC=NUMBER, not '{}'\n", t);
      return 2;
    }
    if (!pairs.empty()) pairs.push_back(',');
    pairs.append(t, 0, eq);
    pairs.push_back(':');
    pairs.append(t, eq + 1);
  }
  if (!pairs.empty()) target += "&thresholds=" + url_encode(pairs);
  if (clear) target += "&clear=true";
  return admin_call(o, "rule", app, target);
}

int run_throttler_admin(const ThrottlerCliOptions& o, const std::string& verb,
                        const std::string& app, const std::string& duration,
                        const std::string& ratio) {
  std::string target;
  if (verb == "throttle") {
    target = "/throttler/throttle-app?app=" + url_encode(app);
    if (!duration.empty()) target += "&duration=" + url_encode(duration);
    if (!ratio.empty()) target += "&ratio=" + url_encode(ratio);
  } else if (verb == "unthrottle") {
    target = "/throttler/unthrottle-app?app=" + url_encode(app);
  } else {
    target = "/throttler/exempt-app?app=" + url_encode(app) +
             (verb == "exempt" ? "&exempt=true" : "&exempt=false");
  }
  return admin_call(o, verb, app, target);
}

int run_throttler_apps(const ThrottlerCliOptions& o) {
  const std::string query = o.shard.empty() ? "" : "?shard=" + url_encode(o.shard);
  const auto rules = call(o, "GET", "/throttler/throttled-apps" + query);
  if (!rules) return 2;
  const auto recent = call(o, "GET", "/throttler/recent-apps" + query);
  if (!recent) return 2;
  const json r = json::parse(rules->body, nullptr, false);
  const json c = json::parse(recent->body, nullptr, false);
  if (rules->status != 200 || recent->status != 200 || !r.is_object() || !c.is_object()) {
    fmt::print(stderr, "sluice: {}: {} {}\n", o.http,
               rules->status != 200 ? rules->status : recent->status,
               (rules->status != 200 ? rules->body : recent->body).substr(0, 200));
    return 2;
  }
  if (o.json) {
    fmt::print("{}\n", json{{"rules", r["apps"]}, {"recent", c["apps"]}}.dump());
    return 0;
  }
  fmt::print("rules:\n");
  if (r["apps"].empty()) fmt::print("  (none: every app gets the defaults)\n");
  for (const auto& [app, rule] : r["apps"].items()) fmt::print("  {:<24} {}\n", app, rule.dump());
  fmt::print("apps that checked (most recent first):\n");
  if (c["apps"].empty()) fmt::print("  (none yet)\n");
  for (const json& a : c["apps"])
    fmt::print("  {:<24} {:>8} checks {:>8} refused {:>8.2f}/s  {:.1f}s ago  from {}\n",
               a.value("app", ""), a.value("checks", 0), a.value("refused", 0),
               a.value("checks_per_second", 0.0), a.value("seconds_since_last_check", 0.0),
               a.value("last_client", ""));
  return 0;
}

}  // namespace sluice::cli
