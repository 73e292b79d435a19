// http_api.cpp: the HTTP API (handle_http): each route of the server and of the kinds, read
// from an exchange and answered into it; the sockets are http_server.cpp's.
#include "transport/http_server.h"

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "server/json_text.h"
#include "transport/check_text.h"
#include "transport/ui_assets.h"
#include "transport/wire.h"

namespace sluice::transport {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;
using server::AdmitCall;
using server::AdmitResult;
using server::CheckCall;
using server::Engine;
using server::Readiness;

namespace {

double ms_of(Nanos d) { return static_cast<double>(d.count()) / 1e6; }

using server::json_text;

unsigned http_status(StatusCode c) {
  switch (c) {
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAlreadyExists:
      return 409;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kResourceExhausted:
      return 429;
    default:
      return 500;
  }
}

std::string code_name(StatusCode c) {
  std::string s(to_string(c));
  for (char& ch : s)
    if (ch == ' ') ch = '_';
  return s;
}

void error(HttpExchange& x, const Status& s) {
  x.status = http_status(s.code());
  x.content_type = "application/json";
  x.response =
      json_text(json{{"error", {{"code", code_name(s.code())}, {"message", s.message()}}}});
}

void ok_json(HttpExchange& x, const json& j, unsigned status = 200) {
  x.status = status;
  x.content_type = "application/json";
  x.response = json_text(j);
}

// The request body as a JSON object; an error names what is wrong. A key twice in one object
// is an error (a parser keeps one of the two silently, and not every parser the same one).
StatusOr<json> body_object(const HttpExchange& x) {
  std::vector<std::set<std::string, std::less<>>> open;  // per open object, its keys so far
  std::optional<std::string> twice;  // the first key seen twice ("" is a key too)
  const json::parser_callback_t keys = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == json::parse_event_t::key && !open.empty() && parsed.is_string()) {
      if (!open.back().insert(parsed.get_ref<const std::string&>()).second && !twice)
        twice = parsed.get<std::string>();
    }
    return true;
  };
  json j = json::parse(x.body, keys, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status(StatusCode::kInvalidArgument, "body: not valid JSON");
  if (twice)
    return Status(StatusCode::kInvalidArgument,
                  "body: the key " + json_text(json(*twice)) + " appears twice in one object");
  if (!j.is_object()) return Status(StatusCode::kInvalidArgument, "body: must be a JSON object");
  return j;
}

// Reads optional typed fields, remembering the first error (with its field's name). After the
// reads, status() is also an error for a field none of them asked for (a misspelt `ttl` must
// not silently become the default `ttl_ms`).
class Fields {
 public:
  explicit Fields(const json& j, std::string prefix = {}) : j_(j), prefix_(std::move(prefix)) {}
  std::string_view str(const char* name) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return {};
    if (!it->is_string()) {
      fail(name, "must be a string");
      return {};
    }
    return it->get_ref<const std::string&>();
  }
  std::optional<std::int64_t> integer(const char* name) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer()) {
      fail(name, "must be an integer");
      return std::nullopt;
    }
    if (it->is_number_unsigned() &&
        it->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      fail(name, "must be at most 9223372036854775807");
      return std::nullopt;
    }
    return it->get<std::int64_t>();
  }
  // Milliseconds; with `positive`, 0 is refused too (naming this field, not the engine's).
  std::optional<Nanos> millis(const char* name, bool positive = false) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_number()) {
      fail(name, "must be a number (milliseconds)");
      return std::nullopt;
    }
    const double v = it->get<double>();
    if (!(v >= 0) || v > 1e12) {
      fail(name, "must be a non-negative number of milliseconds");
      return std::nullopt;
    }
    if (positive && v == 0) {
      fail(name, "must be more than 0 milliseconds");
      return std::nullopt;
    }
    return Nanos{static_cast<std::int64_t>(std::llround(v * 1e6))};
  }
  // A JSON array (absent or null: nullptr).
  const json* list(const char* name) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return nullptr;
    if (!it->is_array()) {
      fail(name, "must be a list");
      return nullptr;
    }
    return &*it;
  }
  // true or false; absent or null: false.
  bool flag(const char* name) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return false;
    if (!it->is_boolean()) {
      fail(name, "must be true or false");
      return false;
    }
    return it->get<bool>();
  }
  // A list of strings, appended to `out` as values of the attribute `attribute` (views into the
  // document); absent or null: nothing.
  void string_views(const char* name, std::string_view attribute,
                    std::vector<server::CallAttribute>& out) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return;
    if (!it->is_array()) return fail(name, "must be a list of strings");
    for (const json& e : *it) {
      if (!e.is_string()) return fail(name, "must be a list of strings");
      out.push_back({attribute, e.get_ref<const std::string&>()});
    }
  }
  // An object of attributes (server::CallAttribute), appended to `out` in order: each value a
  // string, or a list of strings (a list attribute); absent or null: nothing. The views point
  // into the document.
  void attributes(const char* name, std::vector<server::CallAttribute>& out) {
    asked_.push_back(name);
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return;
    if (!it->is_object())
      return fail(name, "must be an object of names to strings (or lists of strings)");
    for (auto e = it->begin(); e != it->end(); ++e) {
      const std::string& n = e.key();  // the document's own key
      const json& value = e.value();
      if (value.is_string()) {
        out.push_back({n, value.get_ref<const std::string&>()});
        continue;
      }
      if (!value.is_array()) return fail(name, "values must be strings or lists of strings");
      for (const json& v : value) {
        if (!v.is_string()) return fail(name, "values must be strings or lists of strings");
        out.push_back({n, v.get_ref<const std::string&>()});
      }
    }
  }
  [[nodiscard]] const Status& status() {
    if (status_.ok())
      for (const auto& [key, value] : j_.items())
        if (std::find(asked_.begin(), asked_.end(), key) == asked_.end()) {
          std::string known;
          for (std::string_view a : asked_) known += (known.empty() ? "" : ", ") + std::string(a);
          status_ = Status(StatusCode::kInvalidArgument,
                           prefix_ + key + ": unknown field (known: " + known + ")");
          break;
        }
    return status_;
  }

 private:
  void fail(const char* name, const char* why) {
    if (status_.ok()) status_ = Status(StatusCode::kInvalidArgument, prefix_ + name + ": " + why);
  }
  const json& j_;
  std::string prefix_;
  Status status_;
  std::vector<std::string_view> asked_;
};

// The rate limit fields of a check's answer (server/rate_headers.h), for the policy `policy`.
void rate_headers(HttpExchange& x, server::RateLimitHeaders which, std::string_view policy,
                  const RateDecision& d) {
  const server::QuotaState q{.name = policy,
                             .quota = d.limit,
                             .window = std::nullopt,
                             .remaining = d.remaining,
                             .reset = d.reset_after};
  server::add_rate_limit_headers(which, std::span(&q, 1),
                                 d.allowed ? std::nullopt : std::optional<Nanos>(d.retry_after),
                                 x.headers);
}

std::optional<CheckCall> check_call(Fields& f) {
  CheckCall c;
  c.policy = f.str("policy");
  c.key = f.str("key");
  c.hits = f.integer("hits").value_or(1);
  if (!f.status().ok()) return std::nullopt;
  return c;
}

// `detail`: what the policy says of a refusal with a reason (Engine::refusal_detail).
void render_check(HttpExchange& x, const StatusOr<RateDecision>& d, bool consume,
                  server::RateLimitHeaders which, std::string_view policy,
                  const std::string& detail = {}) {
  if (!d.ok()) return error(x, d.status());
  rate_headers(x, which, policy, d.value());
  x.status = d.value().allowed || !consume ? 200 : 429;
  x.content_type = "application/json";
  x.response = check_decision_text(d.value(), detail);
}

void render_check_many(HttpExchange& x, const StatusOr<server::CheckManyResult>& r) {
  if (!r.ok()) return error(x, r.status());
  json ds = json::array();
  for (const RateDecision& d : r.value().decisions) ds.push_back(decision_json(d));
  ok_json(x,
          {{"allowed", r.value().allowed},
           {"denied_index", r.value().denied_index},
           {"decisions", std::move(ds)}},
          r.value().allowed ? 200 : 429);
}

// A decision of T that a policy defers parks the exchange; `render` writes it when it comes.
template <class T, class Render>
class ParkOn final : public server::Deferral<T> {
 public:
  ParkOn(HttpLater& later, Render render) : later_(later), render_(std::move(render)) {}
  server::Completion<T> defer() override {
    return [park = later_.park(), render = render_](StatusOr<T> v) mutable {
      park([v = std::move(v), render](HttpExchange& x) { render(x, v); });
    };
  }
  void on_cancel(server::Once<void()> hook) override { later_.on_cancel(std::move(hook)); }

 private:
  HttpLater& later_;
  Render render_;
};

void do_check(Engine& engine, HttpExchange& x, bool consume, HttpLater& later) {
  // The plain shape of a body is read as it is; any other through a document (its errors).
  std::optional<CheckCall> c = plain_check_body(x.body);
  std::optional<json> body;
  if (!c) {
    auto parsed = body_object(x);
    if (!parsed.ok()) return error(x, parsed.status());
    body.emplace(std::move(parsed.value()));
    Fields f(*body);
    c = check_call(f);
    if (!c) return error(x, f.status());
  }
  const server::RateLimitHeaders which = engine.rate_limit_headers();
  if (!consume) return render_check(x, engine.peek(*c), false, which, c->policy);
  // A refusal with a reason gets the policy's words; a deferred one outlives the body the call
  // points into, so the render keeps its own copy of the names.
  const auto render = [&engine, which, policy = std::string(c->policy), key = std::string(c->key),
                       hits = c->hits](HttpExchange& out, const StatusOr<RateDecision>& d) {
    render_check(
        out, d, true, which, policy,
        d.ok() ? engine.refusal_detail(CheckCall{policy, key, hits}, d.value()) : std::string());
  };
  ParkOn<RateDecision, decltype(render)> park(later, render);
  if (auto d = engine.check(*c, park)) render(x, *d);
}

void do_check_many(Engine& engine, HttpExchange& x, HttpLater& later) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  const json& j = body.value();
  auto it = j.find("checks");
  if (it == j.end() || !it->is_array())
    return error(x, Status(StatusCode::kInvalidArgument, "checks: must be an array"));
  for (const auto& [key, value] : j.items())
    if (key != "checks")
      return error(x,
                   Status(StatusCode::kInvalidArgument, key + ": unknown field (known: checks)"));
  std::vector<CheckCall> calls;
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string prefix = "checks[" + std::to_string(i) + "].";
    if (!e.is_object())
      return error(x, Status(StatusCode::kInvalidArgument,
                             "checks[" + std::to_string(i) + "]: must be an object"));
    Fields f(e, prefix);
    auto c = check_call(f);
    if (!c) return error(x, f.status());
    calls.push_back(*c);
  }
  const auto render = [](HttpExchange& out, const StatusOr<server::CheckManyResult>& r) {
    render_check_many(out, r);
  };
  ParkOn<server::CheckManyResult, decltype(render)> park(later, render);
  if (auto r = engine.check_many(calls, park)) render_check_many(x, *r);
}

// A kind's answer attributes as JSON: one value a string, a name given more than once a list.
json attributes_json(const server::AnswerAttributes& attributes) {
  json j = json::object();
  for (const auto& [name, value] : attributes) {
    auto it = j.find(name);
    if (it == j.end())
      j[name] = value;
    else if (it->is_array())
      it->push_back(value);
    else
      *it = json::array({*it, value});
  }
  return j;
}

void render_admit(HttpExchange& x, const StatusOr<server::AdmitResult>& r) {
  if (!r.ok()) return error(x, r.status());
  const AdmitResult& a = r.value();
  if (a.admitted) {
    json j = {{"admitted", true}, {"lease_id", a.lease_id}, {"ttl_ms", ms_of(a.ttl)}};
    if (a.reusable) j["reusable"] = true;
    if (!a.chosen.empty()) j["chosen"] = a.chosen;
    if (!a.attributes.empty()) j["attributes"] = attributes_json(a.attributes);
    if (a.call_timeout) j["call_deadline_ms"] = ms_of(*a.call_timeout);
    if (a.waited > Nanos{0}) j["waited_ms"] = ms_of(a.waited);
    if (a.would_deny) {  // admitted in shadow: the refusal it would have been
      j["would_deny"] = true;
      j["rejection"] = json::parse(problem_json(a.refusal));
    }
    return ok_json(x, j);
  }
  HttpResponse res = to_http_response(a.refusal);
  x.status = res.status;
  x.response = std::move(res.body);
  for (HttpHeader& h : res.headers) {
    if (h.name == "Content-Type")
      x.content_type = std::move(h.value);
    else
      x.headers.emplace_back(std::move(h.name), std::move(h.value));
  }
}

void do_admit(Engine& engine, HttpExchange& x, HttpLater& later) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  AdmitCall c{.policy = f.str("policy"), .key = f.str("key")};
  // The shorthand fields first (an empty one gives none), then `attributes`, as over gRPC.
  std::vector<server::CallAttribute> attributes;
  for (const char* name : {"tenant", "upstream", "route"})
    if (const std::string_view v = f.str(name); !v.empty()) attributes.push_back({name, v});
  c.ttl = f.millis("ttl_ms", true);
  f.string_views("exclude", "exclude", attributes);
  c.max_wait = f.millis("max_wait_ms");
  f.attributes("attributes", attributes);
  c.attributes = attributes;
  if (!f.status().ok()) return error(x, f.status());
  const auto render = [](HttpExchange& out, const StatusOr<server::AdmitResult>& r) {
    render_admit(out, r);
  };
  ParkOn<server::AdmitResult, decltype(render)> park(later, render);
  if (auto r = engine.admit(c, park)) render_admit(x, *r);
}

json charge_json(const RateCharge& c) {
  return {{"limit", c.limit},
          {"remaining", c.remaining},
          {"overdraft", c.overdraft},
          {"pending", c.pending},
          {"reset_after_ms", ms_of(c.reset_after)},
          {"retry_after_ms", ms_of(c.retry_after)}};
}

void do_release(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  const std::string_view lease = f.str("lease_id");
  const std::string_view outcome = f.str("outcome");
  const std::optional<Nanos> rtt = f.millis("rtt_ms");
  const std::optional<std::int64_t> cost = f.integer("cost");
  const bool keep = f.flag("keep");
  std::vector<server::CallEnd> earlier;
  const json* calls = f.list("earlier");
  if (!f.status().ok()) return error(x, f.status());
  const StatusOr<server::CallResult> o =
      outcome.empty() ? server::CallResult::kSuccess : call_result_of(outcome);
  if (!o.ok()) return error(x, o.status());
  if (calls != nullptr) {
    for (std::size_t i = 0; i < calls->size(); ++i) {
      const std::string at = "earlier[" + std::to_string(i) + "]";
      if (!(*calls)[i].is_object())
        return error(x, server::invalid(at, "must be an object {outcome, rtt_ms}"));
      Fields e((*calls)[i], at + ".");
      const std::string_view word = e.str("outcome");
      const std::optional<Nanos> took = e.millis("rtt_ms");
      if (!e.status().ok()) return error(x, e.status());
      if (!took) return error(x, server::invalid(at + ".rtt_ms", "required"));
      const StatusOr<server::CallResult> r =
          word.empty() ? server::CallResult::kSuccess : call_result_of(word, at + ".outcome");
      if (!r.ok()) return error(x, r.status());
      earlier.push_back({r.value(), *took, server::CallEnd::By::kClient});
    }
  }
  auto released = engine.release(lease, o.value(), rtt, cost, keep, earlier);
  if (!released.ok()) return error(x, released.status());
  json j = {{"released", !keep}, {"held_ms", ms_of(released.value().held)}};
  if (keep) j["kept"] = released.value().kept;
  if (released.value().charged) j["charged"] = charge_json(*released.value().charged);
  ok_json(x, j);
}

void do_charge(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  CheckCall c;
  c.policy = f.str("policy");
  c.key = f.str("key");
  c.hits = f.integer("hits").value_or(0);
  if (!f.status().ok()) return error(x, f.status());
  auto charged = engine.charge(c);
  if (!charged.ok()) return error(x, charged.status());
  ok_json(x, charge_json(charged.value()));
}

void do_heartbeat(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  const std::string_view lease = f.str("lease_id");
  const std::optional<Nanos> ttl = f.millis("ttl_ms", true);
  if (!f.status().ok()) return error(x, f.status());
  auto applied = engine.heartbeat(lease, ttl);
  if (!applied.ok()) return error(x, applied.status());
  ok_json(x, {{"ttl_ms", ms_of(applied.value())}});
}

// Constant-time comparison: a token check must not leak how much of a guess was right.
bool same_token(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(static_cast<unsigned char>(a[i]) ^
                                       static_cast<unsigned char>(b[i]));
  return diff == 0;
}

// Whether `peer` ("address:port", as the session records it) is a loopback address.
bool loopback_peer(std::string_view peer) {
  const std::size_t colon = peer.rfind(':');
  if (colon == std::string_view::npos) return false;
  boost::system::error_code ec;
  const net::ip::address a = net::ip::make_address(std::string(peer.substr(0, colon)), ec);
  if (ec) return false;
  if (a.is_v6() && a.to_v6().is_v4_mapped())
    return net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6()).is_loopback();
  return a.is_loopback();
}

// The token of "Bearer <token>": the scheme in any case, one or more spaces (RFC 9110 11.4,
// RFC 6750 2.1); nullopt for another scheme.
std::optional<std::string_view> bearer_token(std::string_view auth) {
  constexpr std::string_view kScheme = "bearer";
  if (auth.size() <= kScheme.size() || auth[kScheme.size()] != ' ') return std::nullopt;
  for (std::size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(auth[i])) != kScheme[i]) return std::nullopt;
  auth.remove_prefix(kScheme.size());
  while (!auth.empty() && auth.front() == ' ') auth.remove_prefix(1);
  return auth;
}

// Whether the request may use an admin endpoint; if not, `x` is the 401 (no or a wrong token)
// or the 403 (no token is configured and the request is not from this host).
bool admin_allowed(Engine& engine, HttpExchange& x) {
  const std::string token = engine.settings().admin_token;
  if (token.empty()) {
    // Without a token, only this host's own clients (loopback) may change what the server does:
    // a server that listens on other interfaces takes no rules from the network unless told.
    if (loopback_peer(x.peer)) return true;
    error(x, Status(StatusCode::kPermissionDenied,
                    "authorization: admin endpoints answer loopback clients only while "
                    "server.admin_token is unset; set it to allow others"));
    return false;
  }
  if (const auto t = bearer_token(x.authorization); t && same_token(*t, token)) return true;
  x.headers.emplace_back("WWW-Authenticate", "Bearer");
  error(x, Status(StatusCode::kPermissionDenied,
                  "authorization: admin endpoints need 'Authorization: Bearer "
                  "<server.admin_token>'"));
  x.status = 401;  // no (valid) credentials: 401 with the challenge, as RFC 6750 says
  return false;
}

void render_route(HttpExchange& x, const StatusOr<server::RouteReply>& r) {
  if (!r.ok()) return error(x, r.status());
  const server::RouteReply& reply = r.value();
  x.status = reply.status;
  x.content_type = reply.content_type;
  x.response = reply.body;
  for (const auto& h : reply.headers) x.headers.push_back(h);
}

// A kind's route (server/routes.h): its query parsed, its admin token checked.
void do_route(Engine& engine, HttpExchange& x, server::Router::Match& m, std::string_view path,
              HttpLater& later) {
  const server::HttpRoute& route = m.entry->route;
  if (route.admin && !admin_allowed(engine, x)) return;
  server::RouteRequest req;
  req.method = x.method;
  req.path = path;
  req.body = x.body;
  req.peer = x.peer;
  req.params = std::move(m.params);
  if (const std::size_t q = x.target.find('?'); q != std::string::npos) {
    auto query = server::parse_query(std::string_view(x.target).substr(q + 1));
    if (!query.ok()) return error(x, query.status());
    req.query = std::move(query.value());
  }
  const auto render = [](HttpExchange& out, const StatusOr<server::RouteReply>& r) {
    render_route(out, r);
  };
  ParkOn<server::RouteReply, decltype(render)> park(later, render);
  if (auto r = route.handle(req, *engine.policies_of(m.entry->kind), park)) render_route(x, *r);
}

void do_reload(Engine& engine, const std::function<ReloadOutcome()>& reload, HttpExchange& x) {
  if (!admin_allowed(engine, x)) return;
  if (!reload) {
    x.status = 501;
    x.content_type = "application/json";
    x.response = json_text(
        json{{"error", {{"code", "unimplemented"}, {"message", "no config file to reload"}}}});
    return;
  }
  const ReloadOutcome r = reload();
  ok_json(x, {{"reloaded", r.ok}, {"message", r.message}, {"generation", engine.generation()}},
          r.ok ? 200 : 400);
}

}  // namespace

void handle_http(Engine& engine, const std::function<ReloadOutcome()>& reload, HttpExchange& x,
                 HttpLater& later) {
  std::string_view path = x.target;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  const bool get = x.method == "GET" || x.method == "HEAD";
  const bool post = x.method == "POST";
  const auto need = [&](bool ok, std::string_view allow) {
    if (ok) return true;
    x.status = 405;
    x.headers.emplace_back("Allow", std::string(allow));
    x.content_type = "application/json";
    x.response = json_text(json{{"error",
                                 {{"code", "method_not_allowed"},
                                  {"message", "method: " + std::string(allow) + " only"}}}});
    return false;
  };
  if (path == "/metrics") {
    if (!need(get, "GET, HEAD")) return;
    x.content_type = "text/plain; version=0.0.4; charset=utf-8";
    x.response = engine.metrics_text();
  } else if (path == "/healthz") {
    if (!need(get, "GET, HEAD")) return;
    const std::vector<std::string> problems = engine.liveness();
    x.status = problems.empty() ? 200 : 503;
    x.content_type = "text/plain";
    x.response = problems.empty() ? "ok\n" : "";
    for (const std::string& p : problems) x.response += p + "\n";
  } else if (path == "/readyz") {
    if (!need(get, "GET, HEAD")) return;
    const Readiness r = engine.readiness();
    x.status = r.ready ? 200 : 503;
    x.content_type = "text/plain";
    x.response = r.ready ? "ready\n" : "";
    for (const std::string& p : r.problems) x.response += p + "\n";
    for (const std::string& d : r.degraded) x.response += "degraded: " + d + "\n";
  } else if (path == "/v1/policies") {
    if (!need(get, "GET, HEAD")) return;
    x.content_type = "application/json";
    x.response = engine.policies_json();
  } else if (path == "/v1/check") {
    if (need(post, "POST")) do_check(engine, x, true, later);
  } else if (path == "/v1/peek") {
    if (need(post, "POST")) do_check(engine, x, false, later);
  } else if (path == "/v1/charge") {
    if (need(post, "POST")) do_charge(engine, x);
  } else if (path == "/v1/check_many") {
    if (need(post, "POST")) do_check_many(engine, x, later);
  } else if (path == "/v1/admit") {
    if (need(post, "POST")) do_admit(engine, x, later);
  } else if (path == "/v1/release") {
    if (need(post, "POST")) do_release(engine, x);
  } else if (path == "/v1/heartbeat") {
    if (need(post, "POST")) do_heartbeat(engine, x);
  } else if (path == "/admin/reload") {
    if (need(post, "POST")) do_reload(engine, reload, x);
  } else if (const EmbeddedFile* f = ui_file(path); f != nullptr) {
    if (!need(get, "GET, HEAD")) return;
    // The page's own files only: no script, style, image or frame from anywhere else.
    x.content_type = std::string(ui_content_type(f->name));
    x.response = std::string(f->body);
    x.headers.emplace_back("Content-Security-Policy",
                           "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
    x.headers.emplace_back("X-Content-Type-Options", "nosniff");
    x.headers.emplace_back("Cache-Control", "no-cache");
  } else if (server::Router::Match m = engine.kinds().router().match(path); m.entry != nullptr) {
    const std::vector<std::string>& methods = m.entry->route.methods;
    std::string allow;
    for (const std::string& method : methods) allow += (allow.empty() ? "" : ", ") + method;
    if (need(std::find(methods.begin(), methods.end(), x.method) != methods.end(), allow))
      do_route(engine, x, m, path, later);
  } else {
    error(x, Status(StatusCode::kNotFound, "path: no endpoint " + std::string(path)));
  }
}

void handle_http(Engine& engine, const std::function<ReloadOutcome()>& reload, HttpExchange& x) {
  struct Waiting final : HttpLater {
    std::optional<server::OneShot<HttpRender>> render;
    server::Once<void(HttpRender)> park() override { return render.emplace().setter(); }
  } waiting;
  handle_http(engine, reload, x, waiting);
  if (waiting.render) waiting.render->get()(x);
}

}  // namespace sluice::transport
