// pg_connection.h (private): one libpq connection to one PostgreSQL server, for the PostgreSQL
// coordinators: connect with a deadline, the user's setup transaction on every (re)connect,
// transactions whose statements and lock waits end with the call, and reconnect after a failure.
//
// What it is: the connection a PostgreSQL backend needs and nothing of what it stores. A
// (re)connect opens the connection (libpq's asynchronous API, non-blocking mode) and runs the
// user's `setup` statements (CREATE TABLE IF NOT EXISTS ...) in one transaction serialised on
// the advisory lock (hashtext('sluice'), hashtext(table_prefix)), so that concurrent first uses
// never race on the catalog; a failed setup drops the connection. An empty setup runs nothing
// (no transaction, no lock: a read-only user on a replica connects as is). `conninfo` goes to
// libpq as is (sslmode, passwords, service files).
//
// Timeouts: a call holds the connection for its whole length and waiting for it counts against
// the call's timeout. Every wait on the socket is a poll() bounded by the call's deadline;
// begin() opens a transaction whose statement_timeout and lock_timeout are 3/4 of what is left
// (so that the server's error, and a ROLLBACK, still arrive in time) and whose
// idle_in_transaction_session_timeout is all of it (a client gone mid-call frees its locks).
//
// State between calls: the connection is idle (no open transaction) or dropped. A timeout or a
// lost connection drops it; a failed statement rolls the transaction back (or drops the
// connection when that fails); the next call reconnects. Nothing is retried.
//
// Errors are values, never exceptions, with retry meaning: kUnavailable (cannot connect,
// connection lost, server shutting down), kDeadlineExceeded (no reply in time, lock_timeout,
// statement_timeout, or the connection stayed busy with other calls for the whole timeout),
// kAborted (serialization failure, deadlock), kInvalidArgument (text that cannot be quoted or is
// not in the connection's encoding, a bad conninfo or table prefix), kInternal (the rest, and an
// exception in a call's body, which also drops the connection).
//
// Thread-safety: every member is safe to call concurrently; calls are serialised. A Session
// exists only inside call() and must not escape it.
//
// Use:
//   PgConnection conn(options, "CREATE TABLE IF NOT EXISTS t (k text PRIMARY KEY);");
//   Status s = conn.call(timeout, [&](PgConnection::Session& db) -> Status {
//     if (Status c = db.connect(); !c.ok()) return c;
//     auto k = db.literal(key, "key");
//     if (!k.ok()) return k.status();
//     return db.run(db.begin() + "INSERT INTO t VALUES (" + k.value() + ");COMMIT;");
//   });
#pragma once

#include <libpq-fe.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backends/call_gate.h"
#include "sluice/core/postgres_options.h"
#include "sluice/core/status.h"

namespace sluice::postgres_detail {

// The server's current WAL timeline as SQL (the first 8 hex digits of its WAL file's name):
// every promotion and every archive recovery starts a new one, so a coordinator that finds
// another timeline than the one it wrote its origin on has gone back in its history.
inline constexpr const char* kTimelineSql = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)";

class PgConnection {
 public:
  struct ResultDeleter {
    void operator()(PGresult* r) const noexcept { PQclear(r); }
  };
  using Result = std::unique_ptr<PGresult, ResultDeleter>;
  using Results = std::vector<Result>;

  // The calls made while holding the connection (inside call()), each within its deadline.
  // All but connect() need a connection: call connect() first.
  class Session {
   public:
    // Connects and runs the setup unless connected.
    [[nodiscard]] Status connect();
    // BEGIN and the transaction's timeouts from what is left of the deadline.
    [[nodiscard]] std::string begin() const;
    // `text` as an SQL string literal; kInvalidArgument naming `field` when it cannot be one.
    [[nodiscard]] StatusOr<std::string> literal(std::string_view text, const char* field);
    // Sends `sql` (one or more statements) and returns every statement's result; the first
    // failed statement as a Status instead (the connection then idle or dropped).
    [[nodiscard]] StatusOr<Results> query(const std::string& sql);
    // query() for statements that end the transaction: ok when every one succeeded and no
    // transaction is left open.
    [[nodiscard]] Status run(const std::string& sql);
    // Ends an open transaction (ROLLBACK), or drops the connection when that fails.
    void rollback();
    // The deadline on the steady clock (backend_detail::mono_now()).
    [[nodiscard]] Nanos deadline() const noexcept { return deadline_; }

   private:
    friend class PgConnection;
    Session(PgConnection& conn, Nanos deadline) noexcept : conn_(conn), deadline_(deadline) {}
    PgConnection& conn_;
    Nanos deadline_;
  };

  // table_prefix is spliced into SQL as an identifier: [a-z_][a-z0-9_]*, at most `max_size`
  // characters. kInvalidArgument naming table_prefix otherwise.
  [[nodiscard]] static Status validate_prefix(const std::string& prefix, std::size_t max_size);
  // How long a connect may take: the conninfo's connect_timeout, else PGCONNECT_TIMEOUT, else
  // 10 s (at least 2 s, libpq's floor; 0 or less: no limit). kInvalidArgument naming conninfo
  // when libpq cannot parse it.
  [[nodiscard]] static StatusOr<Nanos> connect_budget(const std::string& conninfo);

  // Does not connect: the first call does. `setup`: statements run on every (re)connect.
  PgConnection(PostgresOptions options, std::string setup);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  // Runs `body(Session&)` holding the connection, the whole call (the wait for the connection
  // included) within `timeout`, and returns what it returns (Status or StatusOr<T>).
  template <typename F>
  std::invoke_result_t<F&, Session&> call(Nanos timeout, F&& body) noexcept;

  // Connects unless connected: one call() of Session::connect().
  [[nodiscard]] Status connect(Nanos timeout) noexcept;

 private:
  struct ConnDeleter {
    void operator()(PGconn* c) const noexcept { PQfinish(c); }
  };
  using Conn = std::unique_ptr<PGconn, ConnDeleter>;

  // The members below need the gate held.
  Status ensure_connected(Nanos deadline);
  StatusOr<Results> exec(const std::string& sql, Nanos deadline);
  Status flush(Nanos deadline);
  Status await_input(Nanos deadline);
  Status check(const Results& rs, Nanos deadline);
  void recover(Nanos deadline);
  Status run(const std::string& sql, Nanos deadline);
  void drop() noexcept { conn_.reset(); }

  const PostgresOptions options_;
  const std::string setup_;
  backend_detail::CallGate gate_;  // one call at a time; waiting counts against its deadline
  Conn conn_;                      // guarded by gate_; null when disconnected
};

template <typename F>
std::invoke_result_t<F&, PgConnection::Session&> PgConnection::call(Nanos timeout,
                                                                    F&& body) noexcept {
  Session session(*this, backend_detail::deadline_after(timeout));
  return backend_detail::call_holding(
      gate_, timeout, "postgres: the connection stayed busy for the whole timeout",
      "postgres: ", [&] { return body(session); },
      [this]() noexcept { drop(); });  // it may be mid-protocol
}

}  // namespace sluice::postgres_detail
