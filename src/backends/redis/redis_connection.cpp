#include "backends/redis/redis_connection.h"

#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::redis_detail {
namespace {

using backend_detail::deadline_after;
using backend_detail::mono_now;

// What is left of a deadline, as a socket timeout (at least 1 ms: 0 would mean "no timeout").
timeval to_timeval(Nanos d) {
  d = std::max(d, Nanos{std::chrono::milliseconds(1)});
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
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

std::string text_of(const redisReply* r) { return std::string(r->str, r->len); }

std::string address_of(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

// A server that turned into a replica under an open connection answers writes so.
bool read_only(const redisReply& r) {
  return r.type == REDIS_REPLY_ERROR && std::string_view(r.str, r.len).substr(0, 8) == "READONLY";
}

using SentinelContext = std::unique_ptr<redisContext, void (*)(redisContext*)>;

// One command on `c` within `deadline` (at least 1 ms: the caller checks that time is left);
// a failed I/O leaves `c` unusable.
StatusOr<RedisConnection::Reply> ask(redisContext* c, const std::vector<std::string>& args,
                                     Nanos deadline) {
  redisSetTimeout(c, to_timeval(deadline - mono_now()));
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  RedisConnection::Reply r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (!r) return io_error(c);
  return r;
}

// The primary's address as the sentinel at `at` has it, within `deadline`.
StatusOr<RedisAddress> primary_named_by(const RedisAddress& at, const RedisOptions& o,
                                        Nanos deadline) {
  const Nanos left = deadline - mono_now();
  if (left <= Nanos{0}) return Status(StatusCode::kDeadlineExceeded, "no time left to connect");
  SentinelContext c(redisConnectWithTimeout(at.host.c_str(), at.port, to_timeval(left)), redisFree);
  if (!c) return Status(StatusCode::kUnavailable, "cannot allocate a connection");
  if (c->err != 0)
    return Status(StatusCode::kUnavailable, std::string("cannot connect: ") + c->errstr);
  if (!o.sentinel_password.empty()) {
    auto r = ask(c.get(), {"AUTH", o.sentinel_password}, deadline);
    if (!r.ok()) return r.status();
    if (r.value()->type == REDIS_REPLY_ERROR)
      return Status(StatusCode::kPermissionDenied, "AUTH failed: " + text_of(r.value().get()));
  }
  auto r = ask(c.get(), {"SENTINEL", "get-master-addr-by-name", o.master_name}, deadline);
  if (!r.ok()) return r.status();
  const redisReply& v = *r.value();
  if (v.type == REDIS_REPLY_ERROR)
    return Status(StatusCode::kUnavailable, "SENTINEL get-master-addr-by-name: " + text_of(&v));
  if (v.type == REDIS_REPLY_NIL)
    return Status(StatusCode::kNotFound, "monitors no primary named '" + o.master_name + "'");
  if (v.type != REDIS_REPLY_ARRAY || v.elements != 2 || v.element[0]->type != REDIS_REPLY_STRING ||
      v.element[1]->type != REDIS_REPLY_STRING)
    return Status(StatusCode::kUnavailable, "SENTINEL get-master-addr-by-name: not an address");
  RedisAddress out;
  out.host = text_of(v.element[0]);
  const std::string port = text_of(v.element[1]);
  char* end = nullptr;
  const long n = std::strtol(port.c_str(), &end, 10);
  if (end == port.c_str() || *end != '\0' || n <= 0 || n > 65535)
    return Status(StatusCode::kUnavailable,
                  "SENTINEL get-master-addr-by-name: port '" + port + "'");
  out.port = static_cast<int>(n);
  return out;
}

}  // namespace

RedisConnection::ConnectCheck RedisConnection::noeviction_check(const std::string& who,
                                                                const std::string& lost) {
  const auto text = [](const redisReply* r) { return std::string(r->str, r->len); };
  return {{"CONFIG", "GET", "maxmemory-policy"}, [who, lost, text](const redisReply& reply) {
            if (reply.type == REDIS_REPLY_ERROR)
              return Status(StatusCode::kFailedPrecondition,
                            "redis: cannot check maxmemory-policy (CONFIG GET maxmemory-policy: " +
                                text(&reply) + "): " + who +
                                " needs maxmemory-policy noeviction and must be able to verify "
                                "it; allow CONFIG GET for this user (ACL: +config|get) and do not "
                                "rename CONFIG");
            if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
                reply.element[1]->type != REDIS_REPLY_STRING)
              return Status(StatusCode::kInternal,
                            "redis: unexpected CONFIG GET maxmemory-policy reply");
            const std::string policy = text(reply.element[1]);
            if (policy == "noeviction") return Status();
            return Status(StatusCode::kFailedPrecondition,
                          "redis: maxmemory-policy is " + policy + ": " + who +
                              " needs maxmemory-policy noeviction (" + lost +
                              "); set it with CONFIG SET maxmemory-policy noeviction or in "
                              "redis.conf");
          }};
}

std::string RedisConnection::options_error(const RedisOptions& o) {
  if (o.connect_timeout <= Nanos{0}) return "redis: connect_timeout must be > 0";
  if (o.database < 0) return "redis: database must be >= 0";
  if (o.sentinels.empty()) {
    if (!o.master_name.empty()) return "redis: master_name needs sentinels";
    if (o.host.empty()) return "redis: host must not be empty";
    if (o.port <= 0 || o.port > 65535) return "redis: port must be in 1..65535";
    return {};
  }
  if (o.master_name.empty()) return "redis: sentinels need a master_name";
  for (const RedisAddress& a : o.sentinels) {
    if (a.host.empty()) return "redis: a sentinel's host must not be empty";
    if (a.port <= 0 || a.port > 65535) return "redis: a sentinel's port must be in 1..65535";
  }
  return {};
}

RedisConnection::RedisConnection(RedisOptions options, std::vector<Script> scripts,
                                 ConnectCheck check, bool track_run_id)
    : options_(std::move(options)),
      scripts_(std::move(scripts)),
      check_(std::move(check)),
      track_run_id_(track_run_id),
      shas_(scripts_.size()) {}

RedisConnection::~RedisConnection() = default;

StatusOr<RedisConnection::Reply> RedisConnection::command(const std::vector<std::string>& args,
                                                          Nanos timeout) noexcept {
  return call(timeout, [&](Session& s) { return s.command(args); });
}

StatusOr<RedisConnection::Reply> RedisConnection::eval(std::size_t script,
                                                       const std::vector<std::string>& keys,
                                                       const std::vector<std::string>& args,
                                                       Nanos timeout) noexcept {
  return call(timeout, [&](Session& s) { return s.eval(script, keys, args); });
}

Status RedisConnection::connect(Nanos timeout) noexcept {
  return call(timeout, [](Session& s) { return s.connect(); });
}

std::string RedisConnection::script_sha(std::size_t script) const {
  const std::lock_guard lock(sha_mu_);
  return script < shas_.size() ? shas_[script] : std::string();
}

StatusOr<RedisConnection::Reply> RedisConnection::Session::command(
    const std::vector<std::string>& args) {
  if (Status s = connect(); !s.ok()) return s;
  return conn_.send(args, deadline_);
}

StatusOr<RedisConnection::Reply> RedisConnection::Session::eval(
    std::size_t script, const std::vector<std::string>& keys,
    const std::vector<std::string>& args) {
  if (Status s = still_pinned(); !s.ok()) return s;
  return conn_.eval_locked(script, keys, args, deadline_, pinned_);
}

StatusOr<std::vector<StatusOr<RedisConnection::Reply>>> RedisConnection::Session::eval_many(
    std::size_t script, const std::vector<EvalCall>& calls) {
  if (Status s = still_pinned(); !s.ok()) return s;
  return conn_.eval_many_locked(script, calls, deadline_, pinned_);
}

StatusOr<std::string> RedisConnection::Session::server_run_id() {
  if (!conn_.track_run_id_)
    return Status(StatusCode::kInternal, "redis: this connection does not track the run_id");
  if (Status s = connect(); !s.ok()) return s;
  pinned_ = conn_.connects_;
  return conn_.run_id_;
}

Status RedisConnection::Session::still_pinned() const {
  if (pinned_ == 0 || (conn_.ctx_ && conn_.connects_ == pinned_)) return {};
  return Status(StatusCode::kUnavailable,
                "redis: the connection was lost during the call (the server may have changed)");
}

Status RedisConnection::ping(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  return call(timeout, [](Session& s) -> Status {
    auto r = s.command({"PING"});
    if (!r.ok()) return r.status();
    if (r.value()->type == REDIS_REPLY_ERROR)
      return Status(StatusCode::kUnavailable, "redis: PING: " + text_of(r.value().get()));
    return {};
  });
}

Status RedisConnection::Session::connect() {
  if (conn_.ctx_) return {};
  return conn_.connect_locked(deadline_);
}

bool RedisConnection::peer_closed() const noexcept {
  // An idle connection has nothing to read: a readable one (end of file, a reset, or anything
  // the server sent unasked) was closed or is out of step.
  pollfd p{};
  p.fd = ctx_->fd;
  p.events = POLLIN | POLLRDHUP;
  return ::poll(&p, 1, 0) != 0;
}

StatusOr<RedisConnection::Reply> RedisConnection::send(const std::vector<std::string>& args,
                                                       Nanos deadline) {
  if (!ctx_) return Status(StatusCode::kUnavailable, "redis: not connected");
  const Nanos left = deadline - mono_now();
  if (left <= Nanos{0})
    return Status(StatusCode::kDeadlineExceeded, "redis: no time left for the call");
  auto r = ask(ctx_.get(), args, deadline);
  if (!r.ok()) {
    drop();
    return r.status();
  }
  if (read_only(*r.value())) return moved(*r.value());
  return r;
}

Status RedisConnection::moved(const redisReply& reply) {
  Status s(StatusCode::kUnavailable,
           "redis: " + at_ + " is a replica now (" + text_of(&reply) + "): the primary moved");
  drop();
  return s;
}

StatusOr<RedisConnection::Reply> RedisConnection::checked(const std::vector<std::string>& args,
                                                          Nanos deadline, StatusCode code,
                                                          const char* what) {
  auto r = send(args, deadline);
  if (r.ok() && r.value()->type == REDIS_REPLY_ERROR) {
    drop();
    return Status(code, std::string("redis: ") + what + ": " + text_of(r.value().get()));
  }
  return r;
}

// All before the earlier of the call's deadline and connect_timeout from now: a reconnect to a
// hung server must not outlast the call. With sentinels, each is asked in turn for the primary
// until one names an address that is a primary; a sentinel gets its share of the time left (an
// equal part with the ones not asked yet), so that one that hangs leaves the others theirs.
Status RedisConnection::connect_locked(Nanos deadline) {
  deadline = std::min(deadline, deadline_after(options_.connect_timeout));
  if (options_.sentinels.empty()) return connect_to(options_.host, options_.port, deadline);
  std::string why;
  std::vector<std::string> tried;
  Status last(StatusCode::kUnavailable, "");
  const std::size_t n = options_.sentinels.size();
  for (std::size_t i = 0; i < n; ++i) {
    const RedisAddress& sentinel = options_.sentinels[i];
    const std::string name = address_of(sentinel.host, sentinel.port);
    const Nanos left = deadline - mono_now();
    if (left <= Nanos{0}) break;
    const Nanos share = mono_now() + left / static_cast<std::int64_t>(n - i);
    auto primary = primary_named_by(sentinel, options_, share);
    if (!primary.ok()) {
      why += "; sentinel " + name + ": " + primary.status().message();
      continue;
    }
    const std::string at = address_of(primary.value().host, primary.value().port);
    if (std::find(tried.begin(), tried.end(), at) != tried.end()) continue;
    tried.push_back(at);
    last = connect_to(primary.value().host, primary.value().port, deadline);
    if (last.ok()) return last;
    why += "; " + at + " (named by sentinel " + name + "): " + last.message();
    if (last.code() != StatusCode::kUnavailable) return last;  // AUTH refused, a script...
  }
  const bool late = deadline <= mono_now();
  return Status(late ? StatusCode::kDeadlineExceeded : StatusCode::kUnavailable,
                "redis: no primary for '" + options_.master_name + "' could be reached" + why);
}

Status RedisConnection::connect_to(const std::string& host, int port, Nanos deadline) {
  const Nanos left = deadline - mono_now();
  if (left <= Nanos{0})
    return Status(StatusCode::kDeadlineExceeded, "redis: no time left to connect");
  const std::string at = address_of(host, port);
  Context c(redisConnectWithTimeout(host.c_str(), port, to_timeval(left)));
  if (!c) return Status(StatusCode::kUnavailable, "redis: cannot allocate a connection");
  if (c->err != 0)
    return Status(StatusCode::kUnavailable, "redis: cannot connect to " + at + ": " + c->errstr);
  ctx_ = std::move(c);
  at_ = at;
  ++connects_;
  if (!options_.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!options_.username.empty()) auth.push_back(options_.username);
    auth.push_back(options_.password);
    if (auto r = checked(auth, deadline, StatusCode::kPermissionDenied, "AUTH failed"); !r.ok())
      return r.status();
  }
  if (options_.database != 0) {
    auto r = checked({"SELECT", std::to_string(options_.database)}, deadline,
                     StatusCode::kInvalidArgument, "SELECT failed");
    if (!r.ok()) return r.status();
  }
  if (!options_.sentinels.empty()) {
    // The sentinels' word may be stale (a failover under way): the server's own is final.
    auto r = send({"ROLE"}, deadline);
    if (!r.ok()) return r.status();
    const redisReply& v = *r.value();
    const std::string role =
        v.type == REDIS_REPLY_ARRAY && v.elements > 0 && v.element[0]->type == REDIS_REPLY_STRING
            ? text_of(v.element[0])
            : (v.type == REDIS_REPLY_ERROR ? text_of(&v) : "no role");
    if (role != "master") {
      drop();
      return Status(StatusCode::kUnavailable,
                    "redis: " + at + " is not a primary (ROLE: " + role + ")");
    }
  }
  if (track_run_id_) {
    auto r = send({"INFO", "server"}, deadline);
    if (!r.ok()) return r.status();
    std::string id;
    if (r.value()->type == REDIS_REPLY_STRING) {
      const std::string info = text_of(r.value().get());
      if (const auto at = info.find("run_id:"); at != std::string::npos) {
        const auto end = info.find_first_of("\r\n", at);
        id = info.substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
      }
    }
    if (id.empty()) {
      const std::string why = r.value()->type == REDIS_REPLY_ERROR
                                  ? text_of(r.value().get())
                                  : std::string("no run_id in the reply");
      drop();
      return Status(StatusCode::kFailedPrecondition,
                    "redis: cannot read the server's run_id (INFO server: " + why +
                        "): the coordinator tells a restarted, restored or failed-over server "
                        "by it; allow INFO for this user (ACL: +info) and do not rename INFO");
    }
    run_id_ = std::move(id);
  }
  if (!check_.command.empty()) {
    auto r = send(check_.command, deadline);
    if (!r.ok()) return r.status();
    if (Status s = check_.verify(*r.value()); !s.ok()) {
      drop();
      return s;
    }
  }
  return load_scripts_locked(deadline);
}

Status RedisConnection::load_scripts_locked(Nanos deadline) {
  for (std::size_t i = 0; i < scripts_.size(); ++i) {
    auto r = checked({"SCRIPT", "LOAD", scripts_[i].source}, deadline, StatusCode::kInternal,
                     "SCRIPT LOAD failed");
    if (!r.ok()) return r.status();
    if (r.value()->type != REDIS_REPLY_STRING) {
      drop();
      return Status(StatusCode::kInternal, "redis: SCRIPT LOAD did not return a SHA");
    }
    const std::lock_guard lock(sha_mu_);
    shas_[i] = text_of(r.value().get());
  }
  return {};
}

StatusOr<RedisConnection::Reply> RedisConnection::eval_locked(std::size_t script,
                                                              const std::vector<std::string>& keys,
                                                              const std::vector<std::string>& args,
                                                              Nanos deadline,
                                                              std::uint64_t pinned) {
  if (script >= scripts_.size())
    return Status(StatusCode::kInvalidArgument, "script: no script " + std::to_string(script) +
                                                    " (" + std::to_string(scripts_.size()) +
                                                    " loaded)");
  std::vector<std::string> full = {"EVALSHA", "", std::to_string(keys.size())};
  full.reserve(3 + keys.size() + args.size());
  full.insert(full.end(), keys.begin(), keys.end());
  full.insert(full.end(), args.begin(), args.end());
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!ctx_) {
      if (pinned != 0) return Status(StatusCode::kUnavailable, "redis: the connection was lost");
      if (Status s = connect_locked(deadline); !s.ok()) return s;
    }
    full[1] = shas_[script];
    auto r = send(full, deadline);
    if (!r.ok()) return r.status();
    if (r.value()->type != REDIS_REPLY_ERROR) return r;
    const std::string err = text_of(r.value().get());
    if (attempt == 0 && err.rfind("NOSCRIPT", 0) == 0) {
      if (Status s = load_scripts_locked(deadline); !s.ok()) return s;
      continue;  // a restarted or flushed server: load the scripts and retry once
    }
    return Status(StatusCode::kInternal,
                  "redis: " + scripts_[script].name + " script failed: " + err);
  }
  return Status(StatusCode::kInternal, "redis: script missing after reload");
}

StatusOr<std::vector<StatusOr<RedisConnection::Reply>>> RedisConnection::eval_many_locked(
    std::size_t script, const std::vector<EvalCall>& calls, Nanos deadline, std::uint64_t pinned) {
  if (script >= scripts_.size())
    return Status(StatusCode::kInvalidArgument, "script: no script " + std::to_string(script) +
                                                    " (" + std::to_string(scripts_.size()) +
                                                    " loaded)");
  std::vector<StatusOr<Reply>> out;
  out.reserve(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i)
    out.emplace_back(Status(StatusCode::kInternal, "redis: no reply"));
  std::vector<std::size_t> todo(calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) todo[i] = i;
  for (int attempt = 0; attempt < 2 && !todo.empty(); ++attempt) {
    if (!ctx_) {
      if (pinned != 0) return Status(StatusCode::kUnavailable, "redis: the connection was lost");
      if (Status s = connect_locked(deadline); !s.ok()) return s;
    }
    const Nanos left = deadline - mono_now();
    if (left <= Nanos{0})
      return Status(StatusCode::kDeadlineExceeded, "redis: no time left for the call");
    redisSetTimeout(ctx_.get(), to_timeval(left));
    const std::string sha = shas_[script];
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::size_t i : todo) {
      const EvalCall& c = calls[i];
      const std::string nkeys = std::to_string(c.keys.size());
      argv.assign({"EVALSHA", sha.c_str(), nkeys.c_str()});
      lens.assign({7, sha.size(), nkeys.size()});
      for (const auto* part : {&c.keys, &c.args}) {
        for (const std::string& a : *part) {
          argv.push_back(a.data());
          lens.push_back(a.size());
        }
      }
      // Appended to hiredis's output buffer (copied there): written by the first read below.
      if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(),
                                 lens.data()) != REDIS_OK) {
        Status st = io_error(ctx_.get());
        drop();
        return st;
      }
    }
    std::vector<std::size_t> again;
    for (const std::size_t i : todo) {
      void* raw = nullptr;
      if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) {
        Status st = io_error(ctx_.get());
        drop();  // replies still owed would arrive on the next call: the connection is done
        return st;
      }
      Reply r(static_cast<redisReply*>(raw));
      if (read_only(*r)) return moved(*r);  // replies still owed: the connection is dropped
      if (r->type != REDIS_REPLY_ERROR) {
        out[i] = std::move(r);
        continue;
      }
      const std::string err = text_of(r.get());
      if (attempt == 0 && err.rfind("NOSCRIPT", 0) == 0)
        again.push_back(i);
      else
        out[i] = Status(StatusCode::kInternal,
                        "redis: " + scripts_[script].name + " script failed: " + err);
    }
    if (!again.empty() && attempt == 0) {
      // A restarted or flushed server: load the scripts and send those calls again, once.
      if (Status st = load_scripts_locked(deadline); !st.ok()) return st;
    }
    todo = std::move(again);
  }
  for (const std::size_t i : todo)
    out[i] = Status(StatusCode::kInternal, "redis: script missing after reload");
  return out;
}

}  // namespace sluice::redis_detail
