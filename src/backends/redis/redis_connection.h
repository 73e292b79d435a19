// redis_connection.h (private): one hiredis connection to one Redis server, with the Lua scripts
// its user runs on it, for the Redis coordinators (and anything else that runs scripts there).
//
// What it is: the connection a Redis backend needs and nothing of what it stores. On every
// (re)connect, within the earlier of the call's deadline and RedisOptions::connect_timeout, it
// sends AUTH (password, or ACL user and password) when a password is set, SELECT when the
// database is not 0, ROLE with sentinels (a server that is not a primary is refused, and the
// next sentinel's primary tried), INFO server when the user tracks the server's run_id, the user's
// ConnectCheck when it has one, and SCRIPT LOAD of each script.
// eval(i, keys, args) runs script i by its SHA; a NOSCRIPT reply (a restarted or flushed server)
// loads every script again and retries the call once. key_prefix is not read: keys are the
// user's.
//
// With sentinels (RedisOptions::sentinels), each (re)connect first asks them in turn for the
// primary's address. A READONLY reply (the server became a replica: a failover) drops the
// connection and fails the call with kUnavailable, so that the next call asks again.
//
// Timeouts and reconnects: a call holds the connection for its whole length, waiting for it
// counts against the call's timeout, and every read and write on the socket is bounded by what
// is left of it. A failed I/O (a timeout, a lost or refused connection) drops the connection;
// the next call reconnects. A connection the server closed while it was idle (a restart closes
// them all) is found before a call is written on it, and made again within that call. Nothing is
// retried but the NOSCRIPT case above: a call that timed out may or may not have run on the server.
//
// Errors are values, never exceptions: kDeadlineExceeded (no reply in time, or the connection
// stayed busy with other calls for the whole timeout), kUnavailable (cannot connect, connection
// lost), kPermissionDenied (AUTH refused), kInvalidArgument (SELECT refused, no script i), what
// the ConnectCheck returns, kInternal (a script's error reply, SCRIPT LOAD refused, an exception
// in a call's body). A reply of any other command is handed back as is, error replies included:
// what an error means is the caller's to say.
//
// Thread-safety: every member is safe to call concurrently; calls are serialised (one command
// on the wire at a time). A Session exists only inside call() and must not escape it.
//
// Use (one script, one key, two arguments; several commands under one timeout with call()):
//   RedisConnection conn(options, {{"counter", kCounterLua}});
//   StatusOr<RedisConnection::Reply> r = conn.eval(0, {"k"}, {"1", "60000"}, timeout);
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/call_gate.h"
#include "sluice/core/redis_options.h"
#include "sluice/core/status.h"

namespace sluice::redis_detail {

class RedisConnection {
 public:
  struct ReplyDeleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  // One script call's KEYS and ARGV (eval_many).
  struct EvalCall {
    std::vector<std::string> keys;
    std::vector<std::string> args;
  };

  // A Lua script: `name` appears in its error messages ("redis: <name> script failed: ...").
  struct Script {
    std::string name;
    std::string source;
  };

  // A command sent on every (re)connect after AUTH and SELECT, before the scripts load; its
  // reply (an error reply included) goes to `verify`, whose non-ok Status refuses the
  // connection (dropped; the call fails with that Status).
  struct ConnectCheck {
    std::vector<std::string> command;
    std::function<Status(const redisReply&)> verify;
  };

  // The calls made while holding the connection (inside call()), each within the call's
  // deadline. Each connects first when there is no connection.
  class Session {
   public:
    // One command (argv form); its reply, error replies included.
    [[nodiscard]] StatusOr<Reply> command(const std::vector<std::string>& args);
    // EVALSHA of script `script` with `keys` and `args`; an error reply is kInternal.
    [[nodiscard]] StatusOr<Reply> eval(std::size_t script, const std::vector<std::string>& keys,
                                       const std::vector<std::string>& args);
    // Every call of `calls` as EVALSHA of script `script`, pipelined: all are written before
    // any reply is read (one round trip). One reply per call, in order; an error reply is that
    // call's kInternal; NOSCRIPT loads the scripts and sends the calls it hit again, once. A
    // failed I/O fails them all (the error Status).
    [[nodiscard]] StatusOr<std::vector<StatusOr<Reply>>> eval_many(
        std::size_t script, const std::vector<EvalCall>& calls);
    // Connects (AUTH, SELECT, the check, SCRIPT LOAD) unless connected.
    [[nodiscard]] Status connect();
    // The run_id of the server process this connection talks to (INFO server, read on every
    // (re)connect: a restarted, restored or failed-over server is another process, and every
    // connection to the old one is gone). Connects first; only with `track_run_id`.
    [[nodiscard]] StatusOr<std::string> server_run_id();
    // The deadline on the steady clock (backend_detail::mono_now()).
    [[nodiscard]] Nanos deadline() const noexcept { return deadline_; }

   private:
    friend class RedisConnection;
    Session(RedisConnection& conn, Nanos deadline) noexcept : conn_(conn), deadline_(deadline) {}
    // After server_run_id(): the connection it was read on. A call that would go out on a
    // later one (a reconnect inside the session) fails instead: its arguments name a server
    // that may no longer be the one connected.
    [[nodiscard]] Status still_pinned() const;
    RedisConnection& conn_;
    Nanos deadline_;
    std::uint64_t pinned_ = 0;  // 0: no run_id handed out
  };

  // The check that the server's maxmemory-policy is noeviction (CONFIG GET, on every
  // (re)connect), for a user whose keys must never be evicted: `who` needs it because `lost`
  // (both in its refusal, e.g. "the federation coordinator", "an evicted ledger forgets what it
  // granted"). A user who may not run CONFIG GET is refused too, with the ACL rule to allow it.
  [[nodiscard]] static ConnectCheck noeviction_check(const std::string& who,
                                                     const std::string& lost);
  // Why `options` cannot reach a server (host, port, connect_timeout, database), naming the
  // field; empty when they can. key_prefix is the user's to check.
  [[nodiscard]] static std::string options_error(const RedisOptions& options);

  // Does not connect: the first call does. `options` must pass options_error(). With
  // `track_run_id`, every (re)connect reads the server's run_id (INFO server; a user who may
  // not run INFO is refused with kFailedPrecondition naming the ACL rule that allows it).
  RedisConnection(RedisOptions options, std::vector<Script> scripts, ConnectCheck check = {},
                  bool track_run_id = false);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Runs `body(Session&)` holding the connection, the whole call (the wait for the connection
  // included) within `timeout`, and returns what it returns (Status or StatusOr<T>). An
  // exception out of `body` drops the connection and becomes kInternal.
  template <typename F>
  std::invoke_result_t<F&, Session&> call(Nanos timeout, F&& body) noexcept;

  // Shorthands, each one call().
  [[nodiscard]] StatusOr<Reply> command(const std::vector<std::string>& args,
                                        Nanos timeout) noexcept;
  [[nodiscard]] StatusOr<Reply> eval(std::size_t script, const std::vector<std::string>& keys,
                                     const std::vector<std::string>& args, Nanos timeout) noexcept;
  // Connects unless connected (a failure is returned, and the next call tries again).
  [[nodiscard]] Status connect(Nanos timeout) noexcept;
  // PING within `timeout`: ok when the server answers it (an error reply is kUnavailable).
  [[nodiscard]] Status ping(Nanos timeout) noexcept;

  // Whether a call holds the connection now (a hint for choosing among connections).
  [[nodiscard]] bool busy() const { return gate_.busy(); }

  // The SHA1 of script `script` as the server last reported it (empty before the first load).
  [[nodiscard]] std::string script_sha(std::size_t script) const;
  [[nodiscard]] const RedisOptions& options() const noexcept { return options_; }

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
  };
  using Context = std::unique_ptr<redisContext, ContextDeleter>;

  // The members below need the gate held.
  StatusOr<Reply> send(const std::vector<std::string>& args, Nanos deadline);
  StatusOr<Reply> checked(const std::vector<std::string>& args, Nanos deadline, StatusCode code,
                          const char* what);
  Status connect_locked(Nanos deadline);
  Status connect_to(const std::string& host, int port, Nanos deadline);
  // A READONLY reply (the server is a replica now): drops the connection; kUnavailable.
  Status moved(const redisReply& reply);
  Status load_scripts_locked(Nanos deadline);
  // `pinned` non-zero: never reconnect (the caller's arguments name the connected server).
  StatusOr<Reply> eval_locked(std::size_t script, const std::vector<std::string>& keys,
                              const std::vector<std::string>& args, Nanos deadline,
                              std::uint64_t pinned = 0);
  StatusOr<std::vector<StatusOr<Reply>>> eval_many_locked(std::size_t script,
                                                          const std::vector<EvalCall>& calls,
                                                          Nanos deadline, std::uint64_t pinned = 0);
  // Whether the server closed the idle connection (checked as a call begins: it is then made
  // again within the call instead of failing it). Needs ctx_.
  [[nodiscard]] bool peer_closed() const noexcept;
  void drop() noexcept {
    ctx_.reset();
    run_id_.clear();
  }

  const RedisOptions options_;
  const std::vector<Script> scripts_;
  const ConnectCheck check_;
  const bool track_run_id_;
  std::string run_id_;  // guarded by gate_: the connected server's (empty when not connected)
  std::string at_;      // guarded by gate_: the connected server's host:port
  std::uint64_t connects_ = 0;     // guarded by gate_: connections made so far
  backend_detail::CallGate gate_;  // one call at a time; waiting counts against its deadline
  Context ctx_;                    // guarded by gate_; null when disconnected
  mutable std::mutex sha_mu_;
  std::vector<std::string> shas_;  // one per script; written under gate_ and sha_mu_
};

template <typename F>
std::invoke_result_t<F&, RedisConnection::Session&> RedisConnection::call(Nanos timeout,
                                                                          F&& body) noexcept {
  Session session(*this, backend_detail::deadline_after(timeout));
  return backend_detail::call_holding(
      gate_, timeout, "redis: the connection was busy with another call for the whole timeout",
      "redis: ",
      [&] {
        if (ctx_ && peer_closed()) drop();
        return body(session);
      },
      [this]() noexcept { drop(); });  // it may be mid-protocol
}

// Two connections to one server with one set of scripts: a call takes a free one while the
// other's call is on its way (a batch being built or its replies read), so Redis has the next
// call to run at once.
class RedisLanes {
 public:
  RedisLanes(const RedisOptions& options, const std::vector<RedisConnection::Script>& scripts,
             const RedisConnection::ConnectCheck& check, bool track_run_id) {
    for (auto& c : lanes_)
      c = std::make_unique<RedisConnection>(options, scripts, check, track_run_id);
  }
  // A free connection if there is one, else the next in turn (its call waits for it).
  RedisConnection& lane() {
    const unsigned first = next_.fetch_add(1, std::memory_order_relaxed);
    for (unsigned i = 0; i < lanes_.size(); ++i) {
      RedisConnection& c = *lanes_[(first + i) % lanes_.size()];
      if (!c.busy()) return c;
    }
    return *lanes_[first % lanes_.size()];
  }
  // Connects both, each within its connect_timeout; the first failure.
  [[nodiscard]] Status connect() {
    for (auto& c : lanes_)
      if (Status s = c->connect(c->options().connect_timeout); !s.ok()) return s;
    return {};
  }

 private:
  std::array<std::unique_ptr<RedisConnection>, 2> lanes_;
  std::atomic<unsigned> next_{0};
};

}  // namespace sluice::redis_detail
