#include "transport/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

namespace sluice::transport {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;
using server::AdmitCall;
using server::AdmitResult;
using server::CheckCall;
using server::Engine;
using server::Readiness;

namespace {

double ms_of(Nanos d) { return static_cast<double>(d.count()) / 1e6; }

unsigned http_status(StatusCode c) {
  switch (c) {
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
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
  x.response = json{{"error", {{"code", code_name(s.code())}, {"message", s.message()}}}}.dump();
}

void ok_json(HttpExchange& x, const json& j, unsigned status = 200) {
  x.status = status;
  x.content_type = "application/json";
  x.response = j.dump();
}

// The request body as a JSON object; an error names what is wrong.
StatusOr<json> body_object(const HttpExchange& x) {
  json j = json::parse(x.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status(StatusCode::kInvalidArgument, "body: not valid JSON");
  if (!j.is_object()) return Status(StatusCode::kInvalidArgument, "body: must be a JSON object");
  return j;
}

// Reads optional typed fields, remembering the first error (with its field's name).
class Fields {
 public:
  explicit Fields(const json& j, std::string prefix = {}) : j_(j), prefix_(std::move(prefix)) {}
  std::string_view str(const char* name) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return {};
    if (!it->is_string()) {
      fail(name, "must be a string");
      return {};
    }
    return it->get_ref<const std::string&>();
  }
  std::optional<std::int64_t> integer(const char* name) {
    auto it = j_.find(name);
    if (it == j_.end() || it->is_null()) return std::nullopt;
    if (!it->is_number_integer()) {
      fail(name, "must be an integer");
      return std::nullopt;
    }
    return it->get<std::int64_t>();
  }
  std::optional<Nanos> millis(const char* name) {
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
    return Nanos{static_cast<std::int64_t>(std::llround(v * 1e6))};
  }
  [[nodiscard]] const Status& status() const { return status_; }

 private:
  void fail(const char* name, const char* why) {
    if (status_.ok()) status_ = Status(StatusCode::kInvalidArgument, prefix_ + name + ": " + why);
  }
  const json& j_;
  std::string prefix_;
  Status status_;
};

json decision_json(const RateDecision& d) {
  json j = {{"allowed", d.allowed},
            {"limit", d.limit},
            {"remaining", d.remaining},
            {"reset_after_ms", ms_of(d.reset_after)}};
  if (!d.allowed) {
    if (d.retry_after == Nanos::max())
      j["retry_after_ms"] = nullptr;  // never: more hits than the limit
    else
      j["retry_after_ms"] = ms_of(d.retry_after);
  }
  return j;
}

std::string ceil_seconds(Nanos d) {
  return std::to_string(static_cast<std::int64_t>(std::ceil(static_cast<double>(d.count()) / 1e9)));
}

void rate_headers(HttpExchange& x, const RateDecision& d) {
  x.headers.emplace_back("RateLimit-Limit", std::to_string(d.limit));
  x.headers.emplace_back("RateLimit-Remaining", std::to_string(d.remaining));
  x.headers.emplace_back("RateLimit-Reset", ceil_seconds(d.reset_after));
  if (!d.allowed && d.retry_after != Nanos::max())
    x.headers.emplace_back("Retry-After", ceil_seconds(d.retry_after));
}

std::optional<CheckCall> check_call(Fields& f) {
  CheckCall c;
  c.policy = f.str("policy");
  c.key = f.str("key");
  c.hits = f.integer("hits").value_or(1);
  if (!f.status().ok()) return std::nullopt;
  return c;
}

void do_check(Engine& engine, HttpExchange& x, bool consume) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  auto c = check_call(f);
  if (!c) return error(x, f.status());
  auto d = consume ? engine.check(*c) : engine.peek(*c);
  if (!d.ok()) return error(x, d.status());
  rate_headers(x, d.value());
  ok_json(x, decision_json(d.value()), d.value().allowed || !consume ? 200 : 429);
}

void do_check_many(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  const json& j = body.value();
  auto it = j.find("checks");
  if (it == j.end() || !it->is_array())
    return error(x, Status(StatusCode::kInvalidArgument, "checks: must be an array"));
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
  auto r = engine.check_many(calls);
  if (!r.ok()) return error(x, r.status());
  json ds = json::array();
  for (const RateDecision& d : r.value().decisions) ds.push_back(decision_json(d));
  ok_json(x,
          {{"allowed", r.value().allowed},
           {"denied_index", r.value().denied_index},
           {"decisions", std::move(ds)}},
          r.value().allowed ? 200 : 429);
}

void do_admit(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  AdmitCall c{f.str("policy"),   f.str("key"),   f.str("tenant"),
              f.str("upstream"), f.str("route"), f.millis("ttl_ms")};
  if (!f.status().ok()) return error(x, f.status());
  auto r = engine.admit(c);
  if (!r.ok()) return error(x, r.status());
  const AdmitResult& a = r.value();
  if (a.admitted)
    return ok_json(x, {{"admitted", true}, {"lease_id", a.lease_id}, {"ttl_ms", ms_of(a.ttl)}});
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

void do_release(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  const std::string_view lease = f.str("lease_id");
  const std::string_view outcome = f.str("outcome");
  const std::optional<Nanos> rtt = f.millis("rtt_ms");
  if (!f.status().ok()) return error(x, f.status());
  server::CallResult o = server::CallResult::kSuccess;
  if (outcome == "dropped")
    o = server::CallResult::kDropped;
  else if (outcome == "ignored")
    o = server::CallResult::kIgnored;
  else if (outcome == "failed")
    o = server::CallResult::kFailed;
  else if (!outcome.empty() && outcome != "success")
    return error(x, Status(StatusCode::kInvalidArgument,
                           "outcome: must be success, dropped, ignored or failed, not '" +
                               std::string(outcome) + "'"));
  auto held = engine.release(lease, o, rtt);
  if (!held.ok()) return error(x, held.status());
  ok_json(x, {{"released", true}, {"held_ms", ms_of(held.value())}});
}

void do_heartbeat(Engine& engine, HttpExchange& x) {
  auto body = body_object(x);
  if (!body.ok()) return error(x, body.status());
  Fields f(body.value());
  const std::string_view lease = f.str("lease_id");
  const std::optional<Nanos> ttl = f.millis("ttl_ms");
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

void do_reload(Engine& engine, const std::function<ReloadOutcome()>& reload, HttpExchange& x) {
  const std::string token = engine.settings().admin_token;
  if (!token.empty()) {
    constexpr std::string_view kBearer = "Bearer ";
    const std::string_view auth = x.authorization;
    if (auth.substr(0, kBearer.size()) != kBearer ||
        !same_token(auth.substr(kBearer.size()), token)) {
      x.headers.emplace_back("WWW-Authenticate", "Bearer");
      error(x, Status(StatusCode::kPermissionDenied,
                      "authorization: admin endpoints need 'Authorization: Bearer "
                      "<server.admin_token>'"));
      x.status = 401;  // no (valid) credentials: 401 with the challenge, as RFC 6750 says
      return;
    }
  }
  if (!reload) {
    x.status = 501;
    x.content_type = "application/json";
    x.response =
        json{{"error", {{"code", "unimplemented"}, {"message", "no config file to reload"}}}}
            .dump();
    return;
  }
  const ReloadOutcome r = reload();
  ok_json(x, {{"reloaded", r.ok}, {"message", r.message}, {"generation", engine.generation()}},
          r.ok ? 200 : 400);
}

}  // namespace

void handle_http(Engine& engine, const std::function<ReloadOutcome()>& reload, HttpExchange& x) {
  std::string_view path = x.target;
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  const bool get = x.method == "GET" || x.method == "HEAD";
  const bool post = x.method == "POST";
  const auto need = [&](bool ok, const char* allow) {
    if (ok) return true;
    x.status = 405;
    x.headers.emplace_back("Allow", allow);
    x.content_type = "application/json";
    x.response = json{{"error",
                       {{"code", "method_not_allowed"},
                        {"message", std::string("method: ") + allow + " only"}}}}
                     .dump();
    return false;
  };
  if (path == "/metrics") {
    if (!need(get, "GET, HEAD")) return;
    x.content_type = "text/plain; version=0.0.4; charset=utf-8";
    x.response = engine.metrics_text();
  } else if (path == "/healthz") {
    if (!need(get, "GET, HEAD")) return;
    x.content_type = "text/plain";
    x.response = "ok\n";
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
    if (need(post, "POST")) do_check(engine, x, true);
  } else if (path == "/v1/peek") {
    if (need(post, "POST")) do_check(engine, x, false);
  } else if (path == "/v1/check_many") {
    if (need(post, "POST")) do_check_many(engine, x);
  } else if (path == "/v1/admit") {
    if (need(post, "POST")) do_admit(engine, x);
  } else if (path == "/v1/release") {
    if (need(post, "POST")) do_release(engine, x);
  } else if (path == "/v1/heartbeat") {
    if (need(post, "POST")) do_heartbeat(engine, x);
  } else if (path == "/admin/reload") {
    if (need(post, "POST")) do_reload(engine, reload, x);
  } else {
    error(x, Status(StatusCode::kNotFound, "path: no endpoint " + std::string(path)));
  }
}

// ---- the socket side ----

struct HttpServer::Impl {
  Engine& engine;
  std::function<ReloadOutcome()> reload;
  net::io_context ioc;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  bool stopped = false;

  Impl(Engine& e, std::function<ReloadOutcome()> r) : engine(e), reload(std::move(r)) {}

  net::awaitable<void> session(tcp::socket socket) {
    beast::error_code ec;
    socket.set_option(tcp::no_delay(true), ec);
    beast::flat_buffer buffer;
    while (true) {
      http::request_parser<http::string_body> parser;
      parser.body_limit(1 << 20);
      co_await http::async_read(socket, buffer, parser,
                                net::redirect_error(net::use_awaitable, ec));
      if (ec) break;
      http::request<http::string_body> req = parser.release();
      HttpExchange x;
      x.method = std::string(req.method_string());
      x.target = std::string(req.target());
      x.body = std::move(req.body());
      if (auto a = req.find(http::field::authorization); a != req.end())
        x.authorization = std::string(a->value());
      handle_http(engine, reload, x);
      http::response<http::string_body> res{static_cast<http::status>(x.status), req.version()};
      res.set(http::field::server, "sluice");
      res.set(http::field::content_type, x.content_type);
      for (const auto& [k, v] : x.headers) res.set(k, v);
      res.keep_alive(req.keep_alive());
      if (req.method() != http::verb::head) res.body() = std::move(x.response);
      res.prepare_payload();
      co_await http::async_write(socket, res, net::redirect_error(net::use_awaitable, ec));
      if (ec || !res.keep_alive()) break;
    }
    socket.shutdown(tcp::socket::shutdown_send, ec);
  }

  net::awaitable<void> listen() {
    while (acceptor && acceptor->is_open()) {
      beast::error_code ec;
      tcp::socket socket =
          co_await acceptor->async_accept(net::redirect_error(net::use_awaitable, ec));
      if (ec) {
        if (ec == net::error::operation_aborted) break;
        continue;
      }
      net::co_spawn(ioc, session(std::move(socket)), net::detached);
    }
  }
};

HttpServer::HttpServer(Engine& engine, std::function<ReloadOutcome()> reload)
    : impl_(std::make_unique<Impl>(engine, std::move(reload))) {}

HttpServer::~HttpServer() { stop(); }

StatusOr<int> HttpServer::start(const std::string& address, int threads) {
  std::string host;
  int port = 0;
  if (!parse_host_port(address, host, port, /*min_port=*/0))
    return Status(StatusCode::kInvalidArgument,
                  "http address: must be host:port with a port in 0..65535, not '" + address + "'");
  beast::error_code ec;
  const auto ip = net::ip::make_address(host, ec);
  if (ec)
    return Status(StatusCode::kInvalidArgument,
                  "http address: '" + host + "' is not an IP address");
  tcp::endpoint ep(ip, static_cast<unsigned short>(port));
  auto& a = impl_->acceptor.emplace(impl_->ioc);
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    impl_->acceptor.reset();
    return Status(StatusCode::kUnavailable,
                  "http: cannot listen on " + address + ": " + ec.message());
  }
  const int bound = a.local_endpoint().port();
  net::co_spawn(impl_->ioc, impl_->listen(), net::detached);
  for (int i = 0; i < std::max(1, threads); ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  return bound;
}

void HttpServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
  // No thread runs the context any more: the listening socket can be closed here, at once.
  beast::error_code ec;
  if (impl_->acceptor) impl_->acceptor->close(ec);
}

}  // namespace sluice::transport
