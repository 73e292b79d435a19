// The HTTP API without a socket: transport::handle_http over a fresh Engine (fuzz_support.h).
//
// An input is one or more requests separated by the line "~~". Each request is:
//   byte 0   the endpoint (low 4 bits: the table below; 14 and 15 take the whole target from
//            the input) and the method (bits 4-5: the endpoint's own, GET, POST, HEAD)
//   byte 1   bits 0-1: how far the clock moves first (0, 10ms, 1s, 2m; expired leases are
//            swept); bit 2: a wrong admin token; bit 3: no Authorization header
//   then     a line appended to the endpoint's path (a query, or the whole target), and the
//            rest: the body. "LEASE" in the body stands for the last lease an admit returned.
//
// Invariants: the status is in 200..599; a JSON content type comes with a body that parses (an
// error is {"error": {"code", "message"}} with a message, or, from the throttler's routes, a
// freno/Vitess answer whose StatusCode is the status); a 405 says Allow; an admit is a lease
// (200) or a refusal whose problem+json carries the response's status; a check's status agrees
// with its `allowed` (in shadow, allowed with would_deny is 200), and an RLS answer (POST /json)
// with its overallCode; the engine's lease count is always admits minus releases and expiries; and
// after the input, the listings still answer (fuzz_support.h: check_listings).
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "fuzz_support.h"
#include "transport/http_server.h"

namespace {

using nlohmann::json;
using sluice::fuzz::EngineUnderTest;
using sluice::fuzz::require;
using sluice::transport::HttpExchange;

struct Endpoint {
  const char* path;
  const char* method;
};
constexpr Endpoint kEndpoints[16] = {{"/metrics", "GET"},
                                     {"/healthz", "GET"},
                                     {"/readyz", "GET"},
                                     {"/v1/policies", "GET"},
                                     {"/v1/check", "POST"},
                                     {"/v1/peek", "POST"},
                                     {"/v1/check_many", "POST"},
                                     {"/v1/admit", "POST"},
                                     {"/v1/release", "POST"},
                                     {"/v1/heartbeat", "POST"},
                                     {"/admin/reload", "POST"},
                                     {"/v1/charge", "POST"},
                                     {"/v1/release", "POST"},
                                     {"/v1/check", "POST"},
                                     {"", "POST"},
                                     {"", "GET"}};
constexpr const char* kMethods[4] = {nullptr, "GET", "POST", "HEAD"};
constexpr std::string_view kSeparator = "\n~~\n";

std::string header(const HttpExchange& x, std::string_view name) {
  for (const auto& [n, v] : x.headers)
    if (n == name) return v;
  return {};
}

std::string describe(const HttpExchange& x) {
  return x.method + " " + x.target + " -> " + std::to_string(x.status) + " " + x.content_type +
         " " + x.response.substr(0, 400);
}

void check_answer(EngineUnderTest& t, const HttpExchange& x) {
  require(x.status >= 200 && x.status <= 599, "status out of range: " + describe(x));
  const bool is_json = x.content_type == "application/json";
  const bool is_problem = x.content_type == "application/problem+json";
  json j;
  if (is_json || is_problem) {
    j = json::parse(x.response, nullptr, /*allow_exceptions=*/false);
    require(!j.is_discarded(), "a JSON content type with a body that is not JSON: " + describe(x));
  }
  if (x.status == 405) require(!header(x, "Allow").empty(), "a 405 without Allow: " + describe(x));

  std::string_view path = x.target;
  path = path.substr(0, path.find('?'));
  const bool check = path == "/v1/check" || path == "/v1/check_many";
  const bool rls = path == "/json";  // Envoy's rate limit service: 429 is OVER_LIMIT
  // Errors; a denied check's 429 is a decision, and a failed reload says so in its own shape.
  // The throttler's checks answer in the shape Vitess and freno clients parse: its StatusCode
  // is the response's, with a Message.
  // (freno's listings, when they answer, are maps keyed by app or host names: any word.)
  const bool listing = x.status == 200 && (path == "/throttled-apps" || path == "/skipped-hosts" ||
                                           path.rfind("/recent-apps", 0) == 0);
  if (is_json && j.is_object() && j.contains("StatusCode") && !listing) {
    require(j["StatusCode"].is_number_unsigned() && j["StatusCode"].get<unsigned>() == x.status &&
                j["Message"].is_string(),
            "a throttler answer's StatusCode must be its status, with a Message: " + describe(x));
    return;
  }
  if (is_json && x.status >= 400 && !((check || rls) && x.status == 429) &&
      path != "/admin/reload") {
    require(j.is_object() && j.contains("error") && j["error"].is_object() &&
                j["error"].value("code", "") != "" && j["error"].value("message", "") != "",
            "an error without {error: {code, message}}: " + describe(x));
  }
  if (x.method != "POST") return;
  if (path == "/v1/admit") {
    if (x.status == 200) {
      require(is_json && j.value("admitted", false) && j["lease_id"].is_string(),
              "an admit's 200 is a lease: " + describe(x));
      t.admitted(j["lease_id"].get<std::string>());
    } else if (is_problem) {
      require(x.status == 429 || x.status == 503, "a refusal is 429 or 503: " + describe(x));
      require(
          j.is_object() && j.value("status", 0u) == x.status && j["type"].is_string() &&
              j["title"].is_string() && j["detail"].is_string(),
          "a refusal's problem+json must carry its status, type, title and detail: " + describe(x));
    }
  } else if (path == "/v1/release" && x.status == 200) {
    require(is_json && j.value("released", false), "a release's 200 says released: " + describe(x));
    t.released();
  } else if (check && (x.status == 200 || x.status == 429)) {
    require(is_json && j.contains("allowed") && j["allowed"].is_boolean() &&
                j["allowed"].get<bool>() == (x.status == 200),
            "a check's status must agree with allowed: " + describe(x));
  } else if (rls && (x.status == 200 || x.status == 429)) {
    require(is_json && j.is_object() &&
                j.value("overallCode", "") == (x.status == 429 ? "OVER_LIMIT" : "OK"),
            "an RLS answer's status must agree with its overallCode: " + describe(x));
  } else if (path == "/v1/charge" && x.status == 200) {
    require(is_json && j["remaining"].is_number_unsigned() && j["limit"].is_number_unsigned() &&
                j["remaining"].get<std::uint64_t>() <= j["limit"].get<std::uint64_t>() &&
                (j["overdraft"].get<std::uint64_t>() == 0 || j["remaining"] == 0),
            "a charge's 200 is the key's allowance, none left while overdrawn: " + describe(x));
  } else if (path == "/v1/peek" && x.status != 200) {
    require(x.status >= 400, "a peek is 200 or an error: " + describe(x));
  }
}

void run_one(EngineUnderTest& t, std::string_view req,
             const std::function<sluice::transport::ReloadOutcome()>& reload) {
  if (req.size() < 2) return;
  const auto sel = static_cast<unsigned char>(req[0]);
  const auto flags = static_cast<unsigned char>(req[1]);
  req.remove_prefix(2);
  const std::size_t nl = req.find('\n');
  const std::string_view line = req.substr(0, nl);
  std::string body(nl == std::string_view::npos ? std::string_view() : req.substr(nl + 1));
  for (std::size_t at = body.find("LEASE"); at != std::string::npos;
       at = body.find("LEASE", at + t.last_lease().size()))
    body.replace(at, 5, t.last_lease());

  t.advance(flags & 3u);
  const Endpoint& e = kEndpoints[sel & 15u];
  HttpExchange x;
  const char* m = kMethods[(sel >> 4) & 3u];
  x.method = m != nullptr ? m : e.method;
  x.target = std::string(e.path) + std::string(line);
  x.body = std::move(body);
  if ((flags & 8u) == 0) x.authorization = (flags & 4u) != 0 ? "Bearer wrong" : "Bearer secret";
  x.peer = "127.0.0.1:4242";
  sluice::transport::handle_http(t.engine(), reload, x);
  check_answer(t, x);
  t.check_leases("after a request");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  EngineUnderTest t;
  const auto reload = [&t]() -> sluice::transport::ReloadOutcome {
    auto r = t.engine().reload(sluice::fuzz::engine_config());
    return {r.ok(), r.ok() ? "reloaded" : r.status().to_string()};
  };
  for (int n = 0; n < 64 && !in.empty(); ++n) {
    const std::size_t cut = in.find(kSeparator);
    run_one(t, in.substr(0, cut), reload);
    if (cut == std::string_view::npos) break;
    in.remove_prefix(cut + kSeparator.size());
  }
  t.check_listings();
  return 0;
}
