#include "sluice/redis_rate_coordinator.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "backends/call_gate.h"
#include "backends/redis/escrow_script.h"

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

constexpr const char* kDefaultPrefix = "sluice:fed:";
constexpr std::uint64_t kMaxExact = std::uint64_t{1} << 53;  // Lua doubles are exact below
constexpr std::int64_t kMinTtlMs = 60'000;                   // an idle key's hash lives at least

// What is left of a deadline, as a socket timeout (at least 1 ms: 0 would mean "no timeout").
timeval to_timeval(Nanos d) {
  d = std::max(d, Nanos{std::chrono::milliseconds(1)});
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

// Nanoseconds to whole microseconds, rounded down (also before the epoch).
std::int64_t floor_us(Nanos d) { return std::chrono::floor<std::chrono::microseconds>(d).count(); }

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

std::string text_of(const redisReply* r) { return std::string(r->str, r->len); }

// Why the options cannot be used (empty when they can).
std::string options_error(const RedisOptions& o) {
  if (o.host.empty()) return "redis: host must not be empty";
  if (o.port <= 0 || o.port > 65535) return "redis: port must be in 1..65535";
  if (o.connect_timeout <= Nanos{0}) return "redis: connect_timeout must be > 0";
  if (o.key_prefix.empty()) return "redis: key_prefix must not be empty";
  if (o.key_prefix == RedisOptions{}.key_prefix)
    return "redis: key_prefix must not be the fleet coordinator's \"" + o.key_prefix +
           "\" (the federation's default is \"" + kDefaultPrefix + "\")";
  if (o.database < 0) return "redis: database must be >= 0";
  return {};
}

// The script's status codes, in its order.
constexpr LeaseStatus kStatuses[] = {LeaseStatus::kGranted, LeaseStatus::kSpent,
                                     LeaseStatus::kWindowEnding, LeaseStatus::kStateLost,
                                     LeaseStatus::kSpecMismatch};

StatusOr<LeaseReply> lease_reply_of(const redisReply* r) {
  const Status bad(StatusCode::kInternal, "redis: unexpected lease reply");
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 8) return bad;
  std::int64_t v[8];
  for (std::size_t i = 0; i < 8; ++i) {
    if (r->element[i]->type != REDIS_REPLY_INTEGER) return bad;
    v[i] = r->element[i]->integer;
  }
  if (v[0] < 0 || v[0] >= static_cast<std::int64_t>(std::size(kStatuses)) || v[1] < 0 || v[5] < 0 ||
      v[6] < 0)
    return bad;
  const auto us = [](std::int64_t x) { return Nanos{std::chrono::microseconds(x)}; };
  LeaseReply out;
  out.status = kStatuses[v[0]];
  out.granted = static_cast<std::uint64_t>(v[1]);
  out.window_start = us(v[2]);
  out.window_end = us(v[3]);
  out.coordinator_now = us(v[4]);
  out.remaining = static_cast<std::uint64_t>(v[5]);
  out.spec = BudgetSpec{static_cast<std::uint64_t>(v[6]), us(v[7])};
  return out;
}

}  // namespace

struct RedisRateCoordinator::Impl {
  RedisOptions options;
  const Clock* caller_clock = nullptr;
  backend_detail::CallGate gate;  // one call at a time; waiting counts against its deadline
  Context ctx;                    // guarded by gate; null when disconnected
  std::string sha;                // guarded by gate

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

  // A command whose error reply becomes `code` (the connection dropped).
  StatusOr<Reply> checked(const std::vector<std::string>& args, Deadline deadline, StatusCode code,
                          const std::string& what) {
    auto r = command(args, deadline);
    if (r.ok() && r.value()->type == REDIS_REPLY_ERROR) {
      ctx.reset();
      return Status(code, "redis: " + what + ": " + text_of(r.value().get()));
    }
    return r;
  }

  // (Re)connects, authenticates, selects, checks the eviction policy and loads the script, all
  // before the earlier of the call's deadline and connect_timeout from now.
  Status connect_locked(Deadline deadline) {
    deadline = std::min(deadline, deadline_after(options.connect_timeout));
    const Nanos left = deadline - mono_now();
    if (left <= Nanos{0})
      return Status(StatusCode::kDeadlineExceeded, "redis: no time left to connect");
    Context c(redisConnectWithTimeout(options.host.c_str(), options.port, to_timeval(left)));
    if (!c) return Status(StatusCode::kUnavailable, "redis: cannot allocate a connection");
    if (c->err != 0)
      return Status(StatusCode::kUnavailable, "redis: cannot connect to " + options.host + ":" +
                                                  std::to_string(options.port) + ": " + c->errstr);
    ctx = std::move(c);
    if (!options.password.empty()) {
      std::vector<std::string> auth = {"AUTH"};
      if (!options.username.empty()) auth.push_back(options.username);
      auth.push_back(options.password);
      if (auto r = checked(auth, deadline, StatusCode::kPermissionDenied, "AUTH failed"); !r.ok())
        return r.status();
    }
    if (options.database != 0) {
      auto r = checked({"SELECT", std::to_string(options.database)}, deadline,
                       StatusCode::kInvalidArgument, "SELECT failed");
      if (!r.ok()) return r.status();
    }
    if (Status s = check_eviction_locked(deadline); !s.ok()) return s;
    return load_script_locked(deadline);
  }

  // An evicted ledger would forget what it granted: only noeviction will do.
  Status check_eviction_locked(Deadline deadline) {
    auto r = command({"CONFIG", "GET", "maxmemory-policy"}, deadline);
    if (!r.ok()) return r.status();
    const redisReply* reply = r.value().get();
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string err = text_of(reply);
      ctx.reset();
      return Status(StatusCode::kFailedPrecondition,
                    "redis: cannot check maxmemory-policy (CONFIG GET maxmemory-policy: " + err +
                        "): the federation coordinator needs maxmemory-policy noeviction and "
                        "must be able to verify it; allow CONFIG GET for this user (ACL: "
                        "+config|get) and do not rename CONFIG");
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[1]->type != REDIS_REPLY_STRING) {
      ctx.reset();
      return Status(StatusCode::kInternal, "redis: unexpected CONFIG GET maxmemory-policy reply");
    }
    const std::string policy = text_of(reply->element[1]);
    if (policy == "noeviction") return {};
    ctx.reset();
    return Status(StatusCode::kFailedPrecondition,
                  "redis: maxmemory-policy is " + policy +
                      ": the federation coordinator needs maxmemory-policy noeviction (an "
                      "evicted ledger forgets what it granted); set it with CONFIG SET "
                      "maxmemory-policy noeviction or in redis.conf");
  }

  Status load_script_locked(Deadline deadline) {
    auto r = checked({"SCRIPT", "LOAD", redis_detail::escrow_script()}, deadline,
                     StatusCode::kInternal, "SCRIPT LOAD failed");
    if (!r.ok()) return r.status();
    if (r.value()->type != REDIS_REPLY_STRING)
      return Status(StatusCode::kInternal, "redis: SCRIPT LOAD did not return a SHA");
    sha = text_of(r.value().get());
    return {};
  }

  // Runs the script with `args` (after EVALSHA sha 2 KEYS...), reloading it once on NOSCRIPT.
  StatusOr<Reply> run_script(std::string_view key, std::vector<std::string> args,
                             Deadline deadline) {
    std::vector<std::string> full = {"EVALSHA", "", "2",
                                     options.key_prefix + "{" + std::string(key) + "}",
                                     options.key_prefix + "origin"};
    full.insert(full.end(), std::make_move_iterator(args.begin()),
                std::make_move_iterator(args.end()));
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!ctx) {
        if (Status s = connect_locked(deadline); !s.ok()) return s;
      }
      full[1] = sha;
      auto r = command(full, deadline);
      if (!r.ok()) return r.status();
      if (r.value()->type != REDIS_REPLY_ERROR) return r;
      const std::string err = text_of(r.value().get());
      if (attempt == 0 && err.rfind("NOSCRIPT", 0) == 0) {
        if (Status s = load_script_locked(deadline); !s.ok()) return s;
        continue;  // a restarted or flushed server: load the script and retry once
      }
      return Status(StatusCode::kInternal, "redis: escrow script failed: " + err);
    }
    return Status(StatusCode::kInternal, "redis: script missing after reload");
  }

  // The caller's time in test mode; empty: the script reads Redis TIME.
  std::string now_arg() const {
    return caller_clock != nullptr ? std::to_string(floor_us(caller_clock->now())) : std::string();
  }

  // Runs `body(deadline)` holding the gate, the whole call within `timeout`; never throws.
  template <typename R, typename F>
  R serialized(Nanos timeout, F&& body) noexcept {
    try {
      const Deadline deadline = deadline_after(timeout);
      const backend_detail::CallGate::Hold hold(gate, timeout);
      if (!hold.held()) return busy();
      try {
        return body(deadline);
      } catch (...) {
        ctx.reset();  // it may be mid-protocol
        throw;
      }
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kInternal, "out of memory");
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("redis: ") + e.what());
    }
  }
};

RedisRateCoordinator::RedisRateCoordinator(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
RedisRateCoordinator::~RedisRateCoordinator() = default;

RedisOptions RedisRateCoordinator::default_options() {
  RedisOptions o;
  o.key_prefix = kDefaultPrefix;
  return o;
}

const std::string& RedisRateCoordinator::script() { return redis_detail::escrow_script(); }

StatusOr<std::unique_ptr<RedisRateCoordinator>> RedisRateCoordinator::open(
    RedisOptions options, const Clock* caller_clock) {
  if (std::string why = options_error(options); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->caller_clock = caller_clock;
  return std::unique_ptr<RedisRateCoordinator>(new RedisRateCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<RedisRateCoordinator>> RedisRateCoordinator::connect(
    RedisOptions options, const Clock* caller_clock) {
  auto c = open(std::move(options), caller_clock);
  if (!c.ok()) return c;
  Impl& m = *c.value()->impl_;
  const Status s = m.serialized<Status>(
      m.options.connect_timeout, [&](Deadline deadline) { return m.connect_locked(deadline); });
  if (!s.ok()) return s;
  return c;
}

StatusOr<LeaseReply> RedisRateCoordinator::lease(std::string_view key, const LeaseRequest& request,
                                                 Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (std::string why = validate(request); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  if (request.spec.period % std::chrono::microseconds(1) != Nanos{0})
    return Status(StatusCode::kInvalidArgument,
                  "period: must be a whole number of microseconds on the redis coordinator");
  if (request.spec.limit > kMaxExact)
    return Status(StatusCode::kInvalidArgument,
                  "limit: must be at most 2^53 on the redis coordinator");
  Impl& m = *impl_;
  return m.serialized<StatusOr<LeaseReply>>(timeout, [&](Deadline deadline) {
    // A grant never exceeds the limit, so a larger want asks for the same.
    const std::uint64_t want = std::min(request.want, request.spec.limit);
    const auto min_left = std::chrono::ceil<std::chrono::microseconds>(request.min_window_left);
    auto r = m.run_script(
        key,
        {"lease", m.now_arg(), std::to_string(kMinTtlMs), request.region,
         std::to_string(request.spec.limit), std::to_string(floor_us(request.spec.period)),
         std::to_string(want), std::to_string(min_left.count())},
        deadline);
    if (!r.ok()) return StatusOr<LeaseReply>(r.status());
    return lease_reply_of(r.value().get());
  });
}

StatusOr<std::uint64_t> RedisRateCoordinator::reconcile(std::string_view key,
                                                        std::string_view region, Nanos window_start,
                                                        std::uint64_t relinquished,
                                                        Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (region.empty()) return Status(StatusCode::kInvalidArgument, "region: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (window_start % std::chrono::microseconds(1) != Nanos{0})
    return Status(StatusCode::kInvalidArgument,
                  "window_start: must be a window this coordinator leased (whole microseconds)");
  Impl& m = *impl_;
  return m.serialized<StatusOr<std::uint64_t>>(timeout, [&](Deadline deadline) {
    // Never more than any limit: a larger total gives back the same (what the region held).
    const std::uint64_t total = std::min(relinquished, kMaxExact);
    auto r = m.run_script(key,
                          {"reconcile", m.now_arg(), std::to_string(kMinTtlMs), std::string(region),
                           std::to_string(floor_us(window_start)), std::to_string(total)},
                          deadline);
    if (!r.ok()) return StatusOr<std::uint64_t>(r.status());
    const redisReply* reply = r.value().get();
    if (reply->type != REDIS_REPLY_INTEGER || reply->integer < 0)
      return StatusOr<std::uint64_t>(
          Status(StatusCode::kInternal, "redis: unexpected reconcile reply"));
    return StatusOr<std::uint64_t>(static_cast<std::uint64_t>(reply->integer));
  });
}

Status RedisRateCoordinator::health(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  Impl& m = *impl_;
  return m.serialized<Status>(timeout, [&](Deadline deadline) {
    auto r = m.command({"PING"}, deadline);
    if (!r.ok()) return r.status();
    if (r.value()->type == REDIS_REPLY_ERROR)
      return Status(StatusCode::kUnavailable, "redis: PING: " + text_of(r.value().get()));
    return Status();
  });
}

}  // namespace sluice
