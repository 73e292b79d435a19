// http_server.h: the server's HTTP side (Boost.Beast on Asio coroutines).
//
// Endpoints:
//   GET  /metrics          Prometheus text exposition (Engine::metrics_text)
//   GET  /healthz          200 while the process serves; 503 naming a listener that cannot
//                          accept connections
//   GET  /readyz           200 when every policy serves as configured (a fail-closed fleet guard
//                          reached its coordinator; a local-only one serves on its own limit in
//                          an outage, listed as degraded) and the server is not draining; else
//                          503 with the reasons
//   GET  /v1/policies      JSON state of every policy
//   POST /v1/check, /v1/peek, /v1/check_many, /v1/admit, /v1/release, /v1/heartbeat
//                          JSON mirrors of the gRPC calls (field names as in the proto; durations
//                          as *_ms numbers). A denied check is 429 with Retry-After; a refused
//                          admit is the refusal's status (429 or 503) with its problem+json body.
//   POST /admin/reload     reloads the config file; needs `Authorization: Bearer <admin_token>`
//                          when the config sets one (401 with a Bearer challenge without it)
//   (a kind's routes)      whatever the policy kinds register (server/routes.h), matched after
//                          the endpoints above, their query parsed and admin token checked here
// A check (or a kind's route) that its policy decides later parks its session: the coroutine
// is suspended, no thread waits, and the answer is written when the decision comes.
// Bad input is 400 with {"error": {"code", "message"}}, the message naming the field (an unknown
// field too); a body over 1 MiB is 413, headers over 8 KiB are 431, and both close the
// connection.
//
// Connections (HttpOptions): a client has `request_timeout` to send a whole request once its
// first byte came, and to take the whole response; a keep-alive connection with no request
// under way is closed after `idle_timeout`; past the listener's connection cap, a new
// connection is answered 503 and closed (listener.h). /healthz answers 503 while a listener
// attached to the engine cannot accept connections, naming it.
//
// Thread-safety: start() and stop() from one thread; handlers run on the server's own threads.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/completion.h"
#include "server/engine.h"
#include "sluice/core/status.h"
#include "transport/listener.h"

namespace sluice::transport {

struct ReloadOutcome {
  bool ok = false;
  std::string message;  // a summary, or every error (one per line)
};

struct HttpOptions {
  int threads = 1;
  ListenerOptions listener;
  Nanos idle_timeout = std::chrono::seconds(60);     // a kept-alive connection with no request
  Nanos request_timeout = std::chrono::seconds(10);  // to send one request, or take its answer
};

class HttpServer {
 public:
  // `reload`: what POST /admin/reload runs (null: the endpoint answers 501).
  HttpServer(server::Engine& engine, std::function<ReloadOutcome()> reload);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and starts the server's threads. Returns the bound port (port 0: any free
  // one). Its listener reports to the engine (Engine::attach) until stop().
  [[nodiscard]] StatusOr<int> start(const std::string& address, const HttpOptions& options);
  [[nodiscard]] StatusOr<int> start(const std::string& address, int threads = 1) {
    HttpOptions o;
    o.threads = threads;
    return start(address, o);
  }
  // Stops accepting, closes connections and joins the threads. Idempotent.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// One request to one response, without a socket (the tests drive it directly).
struct HttpExchange {
  std::string method;
  std::string target;
  std::string body;
  std::string authorization;
  std::string peer;  // "ip:port", when known
  // Out:
  unsigned status = 200;
  std::string content_type;
  std::string response;
  std::vector<std::pair<std::string, std::string>> headers;
};

// How a deferred answer reaches the session: the render fills the exchange once the session
// resumes (on its own thread).
using HttpRender = server::Once<void(HttpExchange&)>;
class HttpLater {
 public:
  // Parks the exchange: the session answers once the returned function is called (once, from
  // any thread) with the render. At most once per exchange.
  [[nodiscard]] virtual server::Once<void(HttpRender)> park() = 0;
  // After park(): `hook` is called (at most once, from any thread) if the client closes its
  // connection before the answer is written. Default: the client's going is not watched.
  virtual void on_cancel(server::Once<void()> hook) { (void)hook; }

 protected:
  ~HttpLater() = default;
};

// Answers `x` now, or parks it through `later`.
void handle_http(server::Engine& engine, const std::function<ReloadOutcome()>& reload,
                 HttpExchange& x, HttpLater& later);
// The same, waiting on this thread for a parked answer (tests).
void handle_http(server::Engine& engine, const std::function<ReloadOutcome()>& reload,
                 HttpExchange& x);

}  // namespace sluice::transport
