#include "serve.h"

#include <fmt/core.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "server/engine.h"
#include "sluice/config/config.h"
#include "sluice/core/text.h"
#include "transport/grpc_health.h"
#include "transport/grpc_kind_methods.h"
#include "transport/grpc_listener.h"
#include "transport/grpc_service.h"
#include "transport/http_server.h"

namespace sluice::cli {
namespace {

void log(const std::string& line) {
  const std::time_t t = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  fmt::print(stderr, "{} sluice: {}\n", stamp, line);
  std::fflush(stderr);
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "-" : out;
}

// Loads the file or the embedded default; prints every error.
std::optional<SluiceConfig> load(const std::string& path) {
  const server::PolicyRegistry& kinds = server::PolicyRegistry::builtin();
  const ConfigLoad l =
      path.empty() ? load_config(default_config_yaml(), kinds) : load_config_file(path, kinds);
  const std::string source = path.empty() ? "<embedded default>" : path;
  for (const ConfigError& e : l.warnings) log("warning: " + e.to_string(source));
  for (const ConfigError& e : l.errors) log("error: " + e.to_string(source));
  return l.config;
}

// Why a reload to `next` needs a restart instead (empty: it does not): every setting it changes
// that a running server cannot take, each with its value in force and the file's.
std::string restart_needed(const ServerSettings& started, const ServerSettings& next,
                           const ServeOptions& options) {
  std::string out;
  for (const RestartOnlyChange& c : restart_only_changes(started, next)) {
    out += (out.empty() ? "" : ", ") + c.setting + " (" + c.running + " -> " + c.next + ")";
    const std::string& flag = c.setting == "server.grpc"   ? options.grpc
                              : c.setting == "server.http" ? options.http
                                                           : std::string();
    if (!flag.empty()) out += " [--" + c.setting.substr(7) + " " + flag + " overrides it]";
  }
  if (out.empty()) return out;
  return "changed " + out +
         ": a running server cannot apply these (its listeners and node id are set when it "
         "starts); restart it to apply them, or put them back to reload the rest";
}

// Runs the lease sweeper until stopped; logs what the policies tell (Engine::take_notices) and
// each change of readiness (a problem /readyz starts or stops reporting: a fleet guard refused
// its node id, a coordinator lost); gives memory back once many health Watch streams have ended.
class Sweeper {
 public:
  Sweeper(server::Engine& engine, const transport::HealthService& health)
      : engine_(engine), health_(health), thread_([this] { run(); }) {}
  ~Sweeper() { stop(); }
  void stop() {
    {
      const std::lock_guard lock(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      lock.unlock();
      const std::size_t n = engine_.expire_leases();
      if (n > 0) log(fmt::format("expired {} lease(s) whose client stopped heartbeating", n));
      for (const std::string& line : engine_.take_notices()) log("warning: " + line);
      if (++round_ % 20 == 0) {  // once a second
        log_readiness();
        give_back_memory();
      }
      lock.lock();
      cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_; });
    }
  }
  // A problem is told once, and again when it ends; its figures (a time left, a count) may
  // change meanwhile without being told again: problems are compared with digits blanked.
  void log_readiness() {
    std::map<std::string, std::string> now;  // by its text with digits blanked
    for (std::string& p : engine_.readiness().problems) {
      std::string shape = p;
      std::replace_if(
          shape.begin(), shape.end(), [](char c) { return c >= '0' && c <= '9'; }, '#');
      now.emplace(std::move(shape), std::move(p));
    }
    for (const auto& [shape, p] : now)
      if (!problems_.contains(shape)) log("not ready: " + p);
    for (const auto& [shape, p] : problems_)
      if (!now.contains(shape)) log("ready again after: " + p);
    problems_ = std::move(now);
  }
  // A Watch stream's memory (about 22 KB, measured) goes back to glibc's malloc when it ends,
  // and malloc keeps most of it from the system: the process would stay as large as at its most
  // Watch streams. Once 256 or more have ended since the last time (checked once a second),
  // malloc_trim gives the free pages back.
  void give_back_memory() {
    const std::uint64_t ended = health_.watches_ended();
    if (ended - trimmed_at_ < 256) return;
    trimmed_at_ = ended;
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }
  server::Engine& engine_;
  const transport::HealthService& health_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::uint64_t round_ = 0;                      // the sweeper thread's only
  std::uint64_t trimmed_at_ = 0;                 // the sweeper thread's only: watches_ended()
  std::map<std::string, std::string> problems_;  // the sweeper thread's only
  std::thread thread_;
};

}  // namespace

int run_serve(const ServeOptions& options) {
  // Signals go to sigwait below, never to a handler on a random thread: block them before any
  // thread starts (threads inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::optional<SluiceConfig> config = load(options.config);
  if (!config) {
    log("the config has errors; not starting");
    return 1;
  }
  for (const auto& [what, value] :
       {std::pair<const char*, const std::string&>{"grpc", options.grpc},
        std::pair<const char*, const std::string&>{"http", options.http}}) {
    HostPort ignored;
    if (!value.empty() && !parse_host_port(value, ignored, /*min_port=*/0).empty()) {
      log(fmt::format("{0} address (--{0}): must be host:port with a port in 0..65535, not '{1}'",
                      what, value));
      return 1;
    }
  }
  // The file's settings a reload may not change (restart_only_changes), before the flags.
  const ServerSettings started = config->server;
  if (!options.grpc.empty()) config->server.grpc = options.grpc;
  if (!options.http.empty()) config->server.http = options.http;
  const SteadyClock& clock = SteadyClock::instance();
  auto created = server::Engine::create(*config, clock);
  if (!created.ok()) {
    log("cannot start: " + created.status().message());
    return 1;
  }
  server::Engine& engine = *created.value();
  for (const std::string& w : engine.warnings()) log("warning: " + w);

  std::mutex reload_mu;
  const auto reload = [&]() -> transport::ReloadOutcome {
    const std::lock_guard lock(reload_mu);
    if (options.config.empty()) {
      log("reload: serving the embedded default config: there is no file to reload");
      return {false, "serving the embedded default config: there is no file to reload"};
    }
    std::optional<SluiceConfig> next = load(options.config);
    if (!next) {
      engine.note_reload_failure();
      log("reload rejected: the config has errors (above); the old config keeps serving");
      return {false, "the config has errors (see the server log); the old config keeps serving"};
    }
    if (const std::string why = restart_needed(started, next->server, options); !why.empty()) {
      engine.note_reload_failure();
      log("reload rejected: " + why + "; the old config keeps serving");
      return {false, why + "; the old config keeps serving"};
    }
    auto r = engine.reload(*next);
    if (!r.ok()) {
      log("reload rejected: " + r.status().message() + "; the old config keeps serving");
      return {false, r.status().message() + "; the old config keeps serving"};
    }
    const server::ReloadSummary& s = r.value();
    for (const std::string& w : s.warnings) log("warning: " + w);
    const std::string msg = fmt::format(
        "reloaded (generation {}): added {}, changed {}, removed {}, kept {}{}", s.generation,
        joined(s.added), joined(s.changed), joined(s.removed), joined(s.kept),
        s.reconfigured.empty() ? "" : "; reconfigured in place " + joined(s.reconfigured));
    log(msg);
    return {true, msg};
  };

  // Connections: the cap on each port fits the process's file-descriptor limit.
  const ServerSettings& ss = config->server;
  transport::ListenerOptions listen;
  listen.max_connections =
      transport::fd_budget(ss.max_connections, /*listeners=*/ss.envoy_grpc.empty() ? 2 : 3);
  if (listen.max_connections < ss.max_connections)
    log(
        fmt::format("connections: at most {} per port (server.max_connections is {}), to fit "
                    "the file-descriptor limit",
                    listen.max_connections, ss.max_connections));
  const auto ms = [](Nanos d) {
    return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // grpc.health.v1.Health: sluice's own (gRPC's default one cannot cap its Watch streams).
  transport::HealthService health(ss.max_watch_streams);
  transport::GrpcService service(engine);
  transport::GrpcKindMethods kind_methods(engine);         // the methods policy kinds register
  transport::RateLimitService rate_limit_service(engine);  // Envoy's, for envoy_ratelimit
  // The port is sluice's own listener's (grpc_listener.h): the server is built with none.
  transport::GrpcListener grpc_listener(engine, listen);
  auto grpc_port = grpc_listener.bind(ss.grpc);
  if (!grpc_port.ok()) {
    log("cannot start: " + grpc_port.status().message());
    return 1;
  }
  // Envoy's rate limit service on a port of its own (server.envoy_grpc): the same server.
  std::optional<transport::GrpcListener> envoy_listener;
  int envoy_port = 0;
  if (!ss.envoy_grpc.empty()) {
    envoy_listener.emplace(engine, listen, "envoy_grpc");
    auto bound = envoy_listener->bind(ss.envoy_grpc);
    if (!bound.ok()) {
      log("cannot start: " + bound.status().message());
      return 1;
    }
    envoy_port = bound.value();
  }
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(ss.idle_timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(ss.keepalive));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             ms(std::min<Nanos>(ss.keepalive, std::chrono::seconds(10))));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Clients may ping as often as every 10 s (a client's keepalive of 10 s or more is welcome).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(ss.max_streams_per_connection));
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  builder.RegisterService(&rate_limit_service);
  builder.RegisterCallbackGenericService(&kind_methods);
  std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
  if (!grpc_server) {
    log("cannot start the gRPC server");
    return 1;
  }
  grpc_listener.start(grpc_server.get());
  if (envoy_listener) envoy_listener->start(grpc_server.get());
  health.set_status("", true);
  health.set_status(sluice::v1::Sluice::service_full_name(), true);
  health.set_status(envoy::service::ratelimit::v3::RateLimitService::service_full_name(), true);

  transport::HttpServer http(engine, reload);
  transport::HttpOptions http_options;
  http_options.threads = options.http_threads;
  http_options.listener = listen;
  http_options.idle_timeout = ss.idle_timeout;
  http_options.request_timeout = ss.request_timeout;
  auto http_port = http.start(ss.http, http_options);
  if (!http_port.ok()) {
    log("cannot start: " + http_port.status().message());
    grpc_listener.stop();
    if (envoy_listener) envoy_listener->stop();
    health.shutdown();
    grpc_server->Shutdown(std::chrono::system_clock::now());
    return 1;
  }
  Sweeper sweeper(engine, health);
  const auto host = [](const std::string& a) { return a.substr(0, a.rfind(':')); };
  log(fmt::format(
      "serving {} policies ({}) as node {}: grpc {}:{}, http {}:{}{}", config->policies.size(),
      options.config.empty() ? "embedded default config" : options.config,
      engine.settings().node_id, host(config->server.grpc), grpc_port.value(),
      host(config->server.http), http_port.value(),
      envoy_listener ? fmt::format(", envoy grpc {}:{}", host(ss.envoy_grpc), envoy_port)
                     : std::string()));

  while (true) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      log("SIGHUP: reloading " +
          (options.config.empty() ? std::string("(embedded default)") : options.config));
      (void)reload();
      continue;
    }
    break;
  }

  // Graceful shutdown: refuse new work, let leased calls finish (up to the grace period), then
  // stop the listeners and leave every fleet.
  const auto grace = engine.settings().shutdown_grace;
  log(fmt::format("shutting down: refusing new calls; waiting up to {}s for {} lease(s)",
                  std::chrono::duration<double>(grace).count(), engine.leases()));
  engine.drain();
  health.set_status("", false);
  health.set_status(sluice::v1::Sluice::service_full_name(), false);
  health.set_status(envoy::service::ratelimit::v3::RateLimitService::service_full_name(), false);
  const auto until = std::chrono::steady_clock::now() + grace;
  sigset_t stop_now;
  sigemptyset(&stop_now);
  sigaddset(&stop_now, SIGTERM);
  sigaddset(&stop_now, SIGINT);
  while (engine.leases() > 0 && std::chrono::steady_clock::now() < until) {
    // A second SIGTERM (or SIGINT) ends the wait at once.
    const timespec tick{0, 20'000'000};
    if (sigtimedwait(&stop_now, nullptr, &tick) > 0) {
      log(fmt::format("second signal: stopping now, {} lease(s) still held", engine.leases()));
      break;
    }
  }
  const std::size_t left = engine.leases();
  grpc_listener.stop();
  if (envoy_listener) envoy_listener->stop();
  health.shutdown();  // ends every Watch stream, so the server need not wait for them
  grpc_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  http.stop();
  sweeper.stop();
  engine.close();
  log(fmt::format("stopped ({} lease(s) were still held and have been released; fleets left)",
                  left));
  return 0;
}

}  // namespace sluice::cli
