#include "sluice/redis_coordinator.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backends/call_gate.h"
#include "backends/redis/heartbeat_script.h"

namespace sluice {
namespace {

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

using backend_detail::deadline_after;
using backend_detail::mono_now;
using Deadline = Nanos;  // on the steady clock

// What is left of a deadline, as a socket timeout (at least 1 ms: 0 would mean "no timeout").
timeval to_timeval(Nanos d) {
  d = std::max(d, Nanos{std::chrono::milliseconds(1)});
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

std::int64_t to_us(Nanos d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}

// A failed I/O on the context: timeout or lost connection (the context is unusable after).
Status io_error(const redisContext* c) {
  const std::string what = c->errstr;
  // hiredis 0.14 reports a socket timeout as an I/O error with EAGAIN's text; later versions
  // have REDIS_ERR_TIMEOUT.
  bool timed_out = c->err == REDIS_ERR_IO &&
                   (what == std::strerror(EAGAIN) || what == std::strerror(EWOULDBLOCK));
#ifdef REDIS_ERR_TIMEOUT
  timed_out = timed_out || c->err == REDIS_ERR_TIMEOUT;
#endif
  if (timed_out) return Status(StatusCode::kDeadlineExceeded, "redis: no reply within the timeout");
  return Status(StatusCode::kUnavailable, "redis: " + what);
}

Status busy() {
  return Status(StatusCode::kDeadlineExceeded,
                "redis: the connection was busy with another call for the whole timeout");
}

}  // namespace

struct RedisCoordinator::Impl {
  RedisOptions options;
  CoordinatorConfig config;
  const Clock* caller_clock = nullptr;
  backend_detail::CallGate gate;  // one call at a time; waiting counts against its deadline
  Context ctx;                    // guarded by gate; null when disconnected
  mutable std::mutex sha_mu;
  std::string sha;  // written under gate and sha_mu; read under either

  // Sends one command (argv form) and returns its reply; on I/O failure drops the connection.
  StatusOr<Reply> command(const std::vector<std::string>& args, Deadline deadline) {
    if (!ctx) {
      if (Status s = connect_locked(deadline); !s.ok()) return s;
    }
    const Nanos left = deadline - mono_now();
    if (left <= Nanos{0})
      return Status(StatusCode::kDeadlineExceeded, "redis: no time left for the call");
    const timeval tv = to_timeval(left);
    redisSetTimeout(ctx.get(), tv);
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(
        redisCommandArgv(ctx.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) {
      Status s = io_error(ctx.get());
      ctx.reset();
      return s;
    }
    return r;
  }

  // (Re)connects, authenticates, selects and loads the script, all before the earlier of the
  // call's deadline and connect_timeout from now: a reconnect to a hung server must not outlast
  // the call.
  Status connect_locked(Deadline deadline) {
    deadline = std::min(deadline, deadline_after(options.connect_timeout));
    const Nanos left = deadline - mono_now();
    if (left <= Nanos{0})
      return Status(StatusCode::kDeadlineExceeded, "redis: no time left to connect");
    const timeval tv = to_timeval(left);
    Context c(redisConnectWithTimeout(options.host.c_str(), options.port, tv));
    if (!c) return Status(StatusCode::kUnavailable, "redis: cannot allocate a connection");
    if (c->err != 0)
      return Status(StatusCode::kUnavailable, "redis: cannot connect to " + options.host + ":" +
                                                  std::to_string(options.port) + ": " + c->errstr);
    ctx = std::move(c);
    auto check = [&](std::vector<std::string> args, StatusCode code, const char* what) -> Status {
      auto r = command(args, deadline);
      if (!r.ok()) return r.status();
      if (r.value()->type == REDIS_REPLY_ERROR) {
        const std::string err(r.value()->str, r.value()->len);
        ctx.reset();
        return Status(code, std::string("redis: ") + what + ": " + err);
      }
      return {};
    };
    if (!options.password.empty()) {
      std::vector<std::string> auth = {"AUTH"};
      if (!options.username.empty()) auth.push_back(options.username);
      auth.push_back(options.password);
      if (Status s = check(auth, StatusCode::kPermissionDenied, "AUTH failed"); !s.ok()) return s;
    }
    if (options.database != 0) {
      if (Status s = check({"SELECT", std::to_string(options.database)},
                           StatusCode::kInvalidArgument, "SELECT failed");
          !s.ok())
        return s;
    }
    return load_script_locked(deadline);
  }

  Status load_script_locked(Deadline deadline) {
    auto r = command({"SCRIPT", "LOAD", redis_detail::heartbeat_script()}, deadline);
    if (!r.ok()) return r.status();
    if (r.value()->type != REDIS_REPLY_STRING)
      return Status(StatusCode::kInternal, "redis: SCRIPT LOAD did not return a SHA");
    const std::lock_guard lock(sha_mu);
    sha.assign(r.value()->str, r.value()->len);
    return {};
  }

  std::string hash_key(std::string_view key) const {
    return options.key_prefix + "{" + std::string(key) + "}";
  }
};

RedisCoordinator::RedisCoordinator(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
RedisCoordinator::~RedisCoordinator() = default;

const std::string& RedisCoordinator::script() { return redis_detail::heartbeat_script(); }

std::string RedisCoordinator::script_sha() const {
  const std::lock_guard lock(impl_->sha_mu);
  return impl_->sha;
}

const CoordinatorConfig& RedisCoordinator::config() const noexcept { return impl_->config; }

StatusOr<std::unique_ptr<RedisCoordinator>> RedisCoordinator::open(RedisOptions options,
                                                                   CoordinatorConfig config,
                                                                   const Clock* caller_clock) {
  if (options.host.empty())
    return Status(StatusCode::kInvalidArgument, "redis: host must not be empty");
  if (options.port <= 0 || options.port > 65535)
    return Status(StatusCode::kInvalidArgument, "redis: port must be in 1..65535");
  if (options.connect_timeout <= Nanos{0})
    return Status(StatusCode::kInvalidArgument, "redis: connect_timeout must be > 0");
  if (options.key_prefix.empty())
    return Status(StatusCode::kInvalidArgument, "redis: key_prefix must not be empty");
  if (options.database < 0)
    return Status(StatusCode::kInvalidArgument, "redis: database must be >= 0");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->config = config;
  impl->caller_clock = caller_clock;
  return std::unique_ptr<RedisCoordinator>(new RedisCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<RedisCoordinator>> RedisCoordinator::connect(RedisOptions options,
                                                                      CoordinatorConfig config,
                                                                      const Clock* caller_clock) {
  auto c = open(std::move(options), config, caller_clock);
  if (!c.ok()) return c;
  Impl& m = *c.value()->impl_;
  const backend_detail::CallGate::Hold hold(m.gate, m.options.connect_timeout);
  if (Status s = m.connect_locked(deadline_after(m.options.connect_timeout)); !s.ok()) return s;
  return c;
}

StatusOr<Grant> RedisCoordinator::heartbeat(std::string_view key, const NodeReport& report,
                                            Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  if (std::string why = validate(report); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  try {
    const Deadline deadline = deadline_after(timeout);
    Impl& m = *impl_;
    const backend_detail::CallGate::Hold hold(m.gate, timeout);
    if (!hold.held()) return busy();
    const std::int64_t now_us = m.caller_clock != nullptr ? to_us(m.caller_clock->now()) : -1;
    const std::int64_t lease_us = std::max<std::int64_t>(to_us(report.lease_ttl), 1);
    // The hash outlives every lease in it by far; an abandoned key then disappears.
    const std::int64_t key_ttl_ms = std::max<std::int64_t>(lease_us / 100, 60'000);
    std::vector<std::string> args = {
        "EVALSHA",
        "",
        "1",
        m.hash_key(key),
        report.node_id,
        std::to_string(report.l_local),
        std::to_string(report.in_flight),
        std::to_string(report.acked_generation),
        std::to_string(lease_us),
        m.config.aggregate == Aggregate::kMin ? "1" : "0",
        m.config.allocation == Allocation::kDemandProportional ? "1" : "0",
        m.config.acknowledged_handoff ? "1" : "0",
        std::to_string(now_us),
        std::to_string(key_ttl_ms),
        report.estimated ? "1" : "0"};
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!m.ctx) {
        if (Status s = m.connect_locked(deadline); !s.ok()) return s;
      }
      args[1] = m.sha;
      auto r = m.command(args, deadline);
      if (!r.ok()) return r.status();
      const redisReply* reply = r.value().get();
      if (reply->type == REDIS_REPLY_ERROR) {
        const std::string err(reply->str, reply->len);
        if (attempt == 0 && err.rfind("NOSCRIPT", 0) == 0) {
          if (Status s = m.load_script_locked(deadline); !s.ok()) return s;
          continue;  // a restarted or flushed server: load the script and retry once
        }
        return Status(StatusCode::kInternal, "redis: heartbeat script failed: " + err);
      }
      if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 5)
        return Status(StatusCode::kInternal, "redis: unexpected heartbeat reply");
      Grant g;
      g.share = static_cast<std::uint32_t>(reply->element[0]->integer);
      g.l_global = static_cast<std::uint32_t>(reply->element[1]->integer);
      g.nodes = static_cast<std::uint32_t>(reply->element[2]->integer);
      g.generation = static_cast<std::uint64_t>(reply->element[3]->integer);
      g.l_aggregate = static_cast<std::uint32_t>(reply->element[4]->integer);
      return g;
    }
    return Status(StatusCode::kInternal, "redis: script missing after reload");
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInternal, "out of memory");
  }
}

Status RedisCoordinator::leave(std::string_view key, std::string_view node_id,
                               Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (node_id.empty()) return Status(StatusCode::kInvalidArgument, "node_id must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  try {
    const Deadline deadline = deadline_after(timeout);
    Impl& m = *impl_;
    const backend_detail::CallGate::Hold hold(m.gate, timeout);
    if (!hold.held()) return busy();
    auto r = m.command({"HDEL", m.hash_key(key), "n:" + std::string(node_id)}, deadline);
    if (!r.ok()) return r.status();
    if (r.value()->type == REDIS_REPLY_ERROR)
      return Status(StatusCode::kInternal,
                    "redis: HDEL failed: " + std::string(r.value()->str, r.value()->len));
    return {};
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInternal, "out of memory");
  }
}

}  // namespace sluice
