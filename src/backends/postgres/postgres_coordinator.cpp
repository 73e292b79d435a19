// The PostgreSQL coordinator: two round trips per heartbeat on one libpq connection.
//
//   1. BEGIN; SET LOCAL timeouts; pg_advisory_xact_lock(hashtextextended(key, 0)); read the
//      key's generation and ceiling, the server's clock and the key's node rows (ordered by id,
//      "C");
//   2. (after sluice::heartbeat ran here on the FleetState built from the rows) upsert the
//      reporter, delete the evicted nodes, upsert the generation and ceiling; COMMIT.
//
// Tables: <prefix>_keys(key, generation, ceiling) and <prefix>_nodes(key, node_id, l_local,
// in_flight, share, expires_ns, acked, unacked_gen[], unacked_share[], estimated), created on
// every (re)connect by a transaction serialised on an advisory lock of its own (so concurrent
// first uses never race on the catalog); tables from before ceiling and estimated get them.
//
// Every wait goes through poll() on the connection's socket with the call's deadline (libpq's
// asynchronous API, the connection in non-blocking mode). Past the deadline the connection is
// dropped (the next call reconnects); after a failed statement it is rolled back or dropped, so
// the connection is always idle between calls.
#include "sluice/postgres_coordinator.h"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "backends/call_gate.h"

namespace sluice {
namespace {

struct ConnDeleter {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
using Conn = std::unique_ptr<PGconn, ConnDeleter>;

struct ResultDeleter {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;
using Results = std::vector<Result>;

constexpr Nanos kDefaultConnectTimeout = std::chrono::seconds(10);
constexpr std::size_t kMaxPrefix = 57;  // + "_nodes" stays within PostgreSQL's 63-byte names

using backend_detail::deadline_after;
using backend_detail::kNoDeadline;
using backend_detail::mono_now;

std::int64_t ceil_ms(Nanos d) { return std::chrono::ceil<std::chrono::milliseconds>(d).count(); }

std::string trimmed(const char* s) {
  std::string out = s != nullptr ? s : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t'))
    out.pop_back();
  return out;
}

Status unavailable(const PGconn* c) {
  std::string why = trimmed(PQerrorMessage(c));
  return Status(StatusCode::kUnavailable,
                "postgres: " + (why.empty() ? std::string("connection lost") : why));
}

Status timed_out() {
  return Status(StatusCode::kDeadlineExceeded, "postgres: no reply within the timeout");
}

enum class Wait : std::uint8_t { kReady, kTimeout, kError };

// Waits until the connection's socket is ready for `events` or `deadline` passes.
Wait wait_socket(const PGconn* c, short events, Nanos deadline) {
  const int fd = PQsocket(c);
  if (fd < 0) return Wait::kError;
  for (;;) {
    int ms = -1;
    if (deadline != kNoDeadline) {
      const Nanos left = deadline - mono_now();
      if (left <= Nanos{0}) return Wait::kTimeout;
      ms = static_cast<int>(std::min<std::int64_t>(ceil_ms(left), INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return Wait::kReady;
    if (n < 0 && errno != EINTR) return Wait::kError;
  }
}

Status wait_failed(Wait w, const PGconn* c) {
  if (w == Wait::kTimeout) return timed_out();
  if (PQsocket(c) < 0) return unavailable(c);
  return Status(StatusCode::kUnavailable,
                std::string("postgres: poll failed: ") + std::strerror(errno));
}

// A statement's failure as a Status: lost connections, timeouts, conflicts, text that is not
// in the connection's encoding, the rest.
Status sql_error(const PGresult* r, const PGconn* c) {
  const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  const std::string code = state != nullptr ? state : "";
  std::string why = trimmed(PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY));
  if (why.empty()) why = trimmed(PQresultErrorMessage(r));
  if (why.empty()) why = trimmed(PQerrorMessage(c));
  const std::string message = "postgres: " + why + (code.empty() ? "" : " (SQLSTATE " + code + ")");
  if (PQstatus(c) == CONNECTION_BAD || code.rfind("08", 0) == 0 || code == "57P01" ||
      code == "57P02" || code == "57P03")
    return Status(StatusCode::kUnavailable, message);
  if (code == "55P03" || code == "57014") return Status(StatusCode::kDeadlineExceeded, message);
  if (code == "40001" || code == "40P01") return Status(StatusCode::kAborted, message);
  if (code == "22021") return Status(StatusCode::kInvalidArgument, message);  // bad encoding
  return Status(StatusCode::kInternal, message);
}

// The table prefix is spliced into SQL as an identifier: [a-z_][a-z0-9_]*.
Status validate_prefix(const std::string& p) {
  const auto lower = [](char ch) { return (ch >= 'a' && ch <= 'z') || ch == '_'; };
  const bool ok = !p.empty() && p.size() <= kMaxPrefix && lower(p[0]) &&
                  std::all_of(p.begin(), p.end(),
                              [&](char ch) { return lower(ch) || (ch >= '0' && ch <= '9'); });
  if (ok) return {};
  return Status(StatusCode::kInvalidArgument,
                "postgres: table_prefix must match [a-z_][a-z0-9_]* (at most " +
                    std::to_string(kMaxPrefix) + " characters)");
}

Nanos connect_budget_of(const char* value) {
  int seconds = 0;
  const char* end = value + std::strlen(value);
  const auto [p, ec] = std::from_chars(value, end, seconds);
  if (ec != std::errc{} || p != end) return Nanos{-1};
  if (seconds <= 0) return kNoDeadline;               // libpq: wait indefinitely
  return std::chrono::seconds(std::max(seconds, 2));  // libpq: at least 2 s
}

// How long connect() may take: the conninfo's connect_timeout, else PGCONNECT_TIMEOUT, else
// 10 s. kInvalidArgument naming conninfo when libpq cannot parse it.
StatusOr<Nanos> connect_budget(const std::string& conninfo) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(conninfo.c_str(), &err);
  if (opts == nullptr) {
    std::string why = err != nullptr ? trimmed(err) : "out of memory";
    PQfreemem(err);
    return Status(StatusCode::kInvalidArgument, "postgres: bad conninfo: " + why);
  }
  const char* value = nullptr;
  for (const PQconninfoOption* o = opts; o->keyword != nullptr; ++o)
    if (std::strcmp(o->keyword, "connect_timeout") == 0 && o->val != nullptr && *o->val != '\0')
      value = o->val;
  if (value == nullptr) value = std::getenv("PGCONNECT_TIMEOUT");
  const Nanos budget = value != nullptr ? connect_budget_of(value) : kDefaultConnectTimeout;
  PQconninfoFree(opts);
  if (budget < Nanos{0})
    return Status(StatusCode::kInvalidArgument,
                  "postgres: bad conninfo: connect_timeout must be an integer");
  return budget;
}

// Opens a connection without blocking past `deadline`; non-blocking mode on success.
StatusOr<Conn> open_connection(const std::string& conninfo, Nanos deadline) {
  Conn c(PQconnectStart(conninfo.c_str()));
  if (!c) throw std::bad_alloc();
  if (PQstatus(c.get()) == CONNECTION_BAD) return unavailable(c.get());
  PostgresPollingStatusType st = PGRES_POLLING_WRITING;
  while (st != PGRES_POLLING_OK) {
    if (st == PGRES_POLLING_FAILED) return unavailable(c.get());
    const Wait w = wait_socket(c.get(), st == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline);
    if (w == Wait::kTimeout)
      return Status(StatusCode::kDeadlineExceeded, "postgres: no connection within the timeout");
    if (w == Wait::kError) return wait_failed(w, c.get());
    st = PQconnectPoll(c.get());
  }
  if (PQsetnonblocking(c.get(), 1) != 0) return unavailable(c.get());
  return c;
}

// Parses the decimal text of a column into T (false on anything else).
template <typename T>
bool parse_int(const char* s, T& out) {
  const char* end = s + std::strlen(s);
  const auto [p, ec] = std::from_chars(s, end, out);
  return ec == std::errc{} && p == end;
}

// "{1,2,3}" or "{}" (a bigint[] column as text).
bool parse_array(const char* s, std::vector<std::int64_t>& out) {
  const std::size_t n = std::strlen(s);
  if (n < 2 || s[0] != '{' || s[n - 1] != '}') return false;
  const char* p = s + 1;
  const char* const end = s + n - 1;
  while (p < end) {
    std::int64_t v = 0;
    const auto [q, ec] = std::from_chars(p, end, v);
    if (ec != std::errc{}) return false;
    out.push_back(v);
    p = q;
    if (p < end && *p++ != ',') return false;
  }
  return true;
}

// One row of <prefix>_nodes (columns in the order of the read query).
bool parse_node(const PGresult* r, int row, FleetNode& n) {
  auto v = [&](int col) { return PQgetvalue(r, row, col); };
  std::int64_t expires = 0;
  std::vector<std::int64_t> gens, shares;
  n.id = v(0);
  if (!parse_int(v(1), n.l_local) || !parse_int(v(2), n.in_flight) || !parse_int(v(3), n.share) ||
      !parse_int(v(4), expires) || !parse_int(v(5), n.acked_generation) ||
      !parse_array(v(6), gens) || !parse_array(v(7), shares) || gens.size() != shares.size())
    return false;
  const std::string_view estimated = v(8);  // a boolean: "t" or "f"
  if (estimated != "t" && estimated != "f") return false;
  n.estimated = estimated == "t";
  n.expires_at = Nanos{expires};
  for (std::size_t i = 0; i < gens.size(); ++i) {
    if (gens[i] < 0 || shares[i] < 0 || shares[i] > UINT32_MAX) return false;
    n.unacked.push_back(
        {static_cast<std::uint64_t>(gens[i]), static_cast<std::uint32_t>(shares[i])});
  }
  return true;
}

std::string array_sql(const std::vector<IssuedGrant>& grants, bool generations) {
  std::string s = "'{";
  for (std::size_t i = 0; i < grants.size(); ++i) {
    if (i > 0) s += ',';
    s += generations ? std::to_string(grants[i].generation) : std::to_string(grants[i].share);
  }
  return s + "}'";
}

std::string joined(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

// The columns of <prefix>_nodes after (key): the read query's order, which parse_node follows.
constexpr const char* kNodeFields =
    "node_id, l_local, in_flight, share, expires_ns, acked, unacked_gen, unacked_share, estimated";
constexpr const char* kNodeUpdate =
    "l_local = EXCLUDED.l_local, in_flight = EXCLUDED.in_flight, share = EXCLUDED.share,"
    " expires_ns = EXCLUDED.expires_ns, acked = EXCLUDED.acked,"
    " unacked_gen = EXCLUDED.unacked_gen, unacked_share = EXCLUDED.unacked_share,"
    " estimated = EXCLUDED.estimated";

struct Loaded {
  FleetState state;
  Nanos server_now{0};
};

}  // namespace

struct PostgresCoordinator::Impl {
  PostgresOptions options;
  CoordinatorConfig config;
  const Clock* caller_clock = nullptr;
  std::string keys_table, nodes_table;
  Nanos connect_budget{0};        // how long a connect may take (conninfo's connect_timeout)
  backend_detail::CallGate gate;  // one call at a time; waiting counts against its deadline
  Conn conn;                      // guarded by gate; null when disconnected

  // Runs `body(deadline)` with the mutex held, the whole call within `timeout`. Nothing throws
  // out of it; an exception drops the connection (it may be mid-protocol).
  template <typename R, typename F>
  R serialized(Nanos timeout, F&& body) noexcept {
    try {
      const Nanos deadline = deadline_after(timeout);
      const backend_detail::CallGate::Hold hold(gate, timeout);
      if (!hold.held())
        return Status(StatusCode::kDeadlineExceeded,
                      "postgres: the connection stayed busy for the whole timeout");
      try {
        return body(deadline);
      } catch (...) {
        conn.reset();
        throw;
      }
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::kInternal, "out of memory");
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, std::string("postgres: ") + e.what());
    }
  }

  // A connection that is up, with the tables in place.
  Status ensure_connected(Nanos deadline) {
    if (conn && PQstatus(conn.get()) == CONNECTION_OK) return {};
    conn.reset();
    auto c = open_connection(options.conninfo, deadline);
    if (!c.ok()) return c.status();
    conn = std::move(c.value());
    if (Status s = create_tables(deadline); !s.ok()) {
      conn.reset();
      return s;
    }
    return {};
  }

  Status create_tables(Nanos deadline) {
    std::string sql = begin_sql(deadline);
    sql += "SET LOCAL client_min_messages = warning;";
    sql += "SELECT pg_advisory_xact_lock(hashtext('sluice'), hashtext('" + options.table_prefix +
           "'));";
    sql += "CREATE TABLE IF NOT EXISTS " + keys_table +
           " (key text PRIMARY KEY, generation bigint NOT NULL);";
    sql += "CREATE TABLE IF NOT EXISTS " + nodes_table +
           " (key text NOT NULL, node_id text NOT NULL, l_local bigint NOT NULL,"
           " in_flight bigint NOT NULL, share bigint NOT NULL, expires_ns bigint NOT NULL,"
           " acked bigint NOT NULL, unacked_gen bigint[] NOT NULL,"
           " unacked_share bigint[] NOT NULL, PRIMARY KEY (key, node_id));";
    // Columns added since the first release: tables made before get them here.
    sql += "ALTER TABLE " + keys_table +
           " ADD COLUMN IF NOT EXISTS ceiling bigint NOT NULL DEFAULT 0;";
    sql += "ALTER TABLE " + nodes_table +
           " ADD COLUMN IF NOT EXISTS estimated boolean NOT NULL DEFAULT true;";
    sql += "COMMIT;";
    return run(sql, deadline);
  }

  // BEGIN and the server-side timeouts: statements and lock waits get 3/4 of what is left (so
  // that their error, and a ROLLBACK, still arrive in time); an idle transaction (a client
  // that went away mid-call) ends when the whole call would have.
  static std::string begin_sql(Nanos deadline) {
    std::string sql = "BEGIN;";
    if (deadline == kNoDeadline) return sql;
    const std::int64_t left = std::max<std::int64_t>(ceil_ms(deadline - mono_now()), 1);
    const std::string server = std::to_string(std::max<std::int64_t>(left * 3 / 4, 1));
    sql += "SET LOCAL lock_timeout = " + server + ";";
    sql += "SET LOCAL statement_timeout = " + server + ";";
    sql += "SET LOCAL idle_in_transaction_session_timeout = " + std::to_string(left) + ";";
    return sql;
  }

  // `s` as an SQL string literal (kInvalidArgument if it cannot be one).
  StatusOr<std::string> literal(std::string_view s, const char* what) {
    if (s.find('\0') != std::string_view::npos)
      return Status(StatusCode::kInvalidArgument, std::string(what) + " must not contain NUL");
    std::unique_ptr<char, void (*)(void*)> q(PQescapeLiteral(conn.get(), s.data(), s.size()),
                                             &PQfreemem);
    if (!q)
      return Status(StatusCode::kInvalidArgument, "postgres: cannot quote the " +
                                                      std::string(what) + ": " +
                                                      trimmed(PQerrorMessage(conn.get())));
    return std::string(q.get());
  }

  // Sends `sql` (one or more statements) and collects every result. A timeout or a lost
  // connection drops the connection.
  StatusOr<Results> exec(const std::string& sql, Nanos deadline) {
    PGconn* c = conn.get();
    Status s = PQsendQuery(c, sql.c_str()) != 0 ? flush(deadline) : unavailable(c);
    Results out;
    while (s.ok()) {
      while (s.ok() && PQisBusy(c) != 0) s = await_input(deadline);
      if (!s.ok()) break;
      Result r(PQgetResult(c));
      if (!r) return out;
      out.push_back(std::move(r));
    }
    conn.reset();
    return s;
  }

  Status flush(Nanos deadline) {
    PGconn* c = conn.get();
    for (;;) {
      const int f = PQflush(c);
      if (f == 0) return {};
      if (f < 0) return unavailable(c);
      if (const Wait w = wait_socket(c, POLLIN | POLLOUT, deadline); w != Wait::kReady)
        return wait_failed(w, c);
      if (PQconsumeInput(c) == 0) return unavailable(c);
    }
  }

  Status await_input(Nanos deadline) {
    PGconn* c = conn.get();
    if (const Wait w = wait_socket(c, POLLIN, deadline); w != Wait::kReady)
      return wait_failed(w, c);
    if (PQconsumeInput(c) == 0) return unavailable(c);
    return {};
  }

  // The first failed statement among `rs` as a Status (ok when all succeeded); after a
  // failure the connection is left idle or dropped.
  Status check(const Results& rs, Nanos deadline) {
    for (const Result& r : rs) {
      const ExecStatusType st = PQresultStatus(r.get());
      if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) continue;
      Status s = sql_error(r.get(), conn.get());
      recover(deadline);
      return s;
    }
    return {};
  }

  // Leaves the connection idle (ROLLBACK of an open or failed transaction) or drops it.
  void recover(Nanos deadline) {
    if (!conn) return;
    if (PQstatus(conn.get()) != CONNECTION_OK) {
      conn.reset();
      return;
    }
    if (PQtransactionStatus(conn.get()) == PQTRANS_IDLE) return;
    const auto r = exec("ROLLBACK", deadline);
    if (conn && (!r.ok() || PQtransactionStatus(conn.get()) != PQTRANS_IDLE)) conn.reset();
  }

  // exec + check, for statements whose results are not needed.
  Status run(const std::string& sql, Nanos deadline) {
    auto rs = exec(sql, deadline);
    if (!rs.ok()) return rs.status();
    if (Status s = check(rs.value(), deadline); !s.ok()) return s;
    if (PQtransactionStatus(conn.get()) == PQTRANS_IDLE) return {};
    recover(deadline);
    return Status(StatusCode::kInternal, "postgres: transaction left open");
  }

  // Round trip 1: lock the key, read its generation, the server's time and its nodes.
  StatusOr<Loaded> lock_and_read(const std::string& k, Nanos deadline) {
    std::string sql = begin_sql(deadline);
    sql += "SELECT pg_advisory_xact_lock(hashtextextended(" + k + ", 0));";
    sql += "SELECT (SELECT generation FROM " + keys_table + " WHERE key = " + k +
           "), (extract(epoch FROM clock_timestamp()) * 1e6)::bigint, (SELECT ceiling FROM " +
           keys_table + " WHERE key = " + k + ");";
    sql += std::string("SELECT ") + kNodeFields + " FROM " + nodes_table + " WHERE key = " + k +
           " ORDER BY node_id COLLATE \"C\";";
    auto rs = exec(sql, deadline);
    if (!rs.ok()) return rs.status();
    if (Status s = check(rs.value(), deadline); !s.ok()) return s;
    auto loaded = parse_loaded(rs.value());
    if (!loaded.ok()) recover(deadline);
    return loaded;
  }

  static StatusOr<Loaded> parse_loaded(const Results& rs) {
    const Status bad(StatusCode::kInternal, "postgres: unexpected rows in the coordinator tables");
    if (rs.size() < 2) return bad;
    const PGresult* head = rs[rs.size() - 2].get();
    const PGresult* rows = rs.back().get();
    if (PQntuples(head) != 1 || PQnfields(head) != 3 || PQnfields(rows) != 9) return bad;
    Loaded out;
    std::int64_t server_us = 0;
    if (!PQgetisnull(head, 0, 0) && !parse_int(PQgetvalue(head, 0, 0), out.state.generation))
      return bad;
    if (!parse_int(PQgetvalue(head, 0, 1), server_us)) return bad;
    if (!PQgetisnull(head, 0, 2) && !parse_int(PQgetvalue(head, 0, 2), out.state.ceiling))
      return bad;
    out.server_now = std::chrono::microseconds(server_us);
    out.state.nodes.resize(static_cast<std::size_t>(PQntuples(rows)));
    for (int i = 0; i < PQntuples(rows); ++i)
      if (!parse_node(rows, i, out.state.nodes[static_cast<std::size_t>(i)])) return bad;
    const auto by_id = [](const FleetNode& a, const FleetNode& b) { return a.id < b.id; };
    if (!std::is_sorted(out.state.nodes.begin(), out.state.nodes.end(), by_id))
      std::sort(out.state.nodes.begin(), out.state.nodes.end(), by_id);
    return out;
  }

  // Round trip 2: the reporter's row, the evicted rows, the generation; COMMIT.
  Status write_and_commit(const std::string& k, const std::string& self, const FleetState& state,
                          const FleetNode& me, const std::vector<std::string>& evicted,
                          Nanos deadline) {
    const std::string values =
        joined({k, self, std::to_string(me.l_local), std::to_string(me.in_flight),
                std::to_string(me.share), std::to_string(me.expires_at.count()),
                std::to_string(me.acked_generation), array_sql(me.unacked, true),
                array_sql(me.unacked, false), me.estimated ? "true" : "false"});
    std::string sql = "INSERT INTO " + nodes_table + " (key, " + kNodeFields + ") VALUES (" +
                      values + ") ON CONFLICT (key, node_id) DO UPDATE SET " + kNodeUpdate + ";";
    if (!evicted.empty())
      sql += "DELETE FROM " + nodes_table + " WHERE key = " + k + " AND node_id IN (" +
             joined(evicted) + ");";
    sql += "INSERT INTO " + keys_table + " (key, generation, ceiling) VALUES (" + k + ", " +
           std::to_string(state.generation) + ", " + std::to_string(state.ceiling) +
           ") ON CONFLICT (key) DO UPDATE SET generation = EXCLUDED.generation,"
           " ceiling = EXCLUDED.ceiling;";
    sql += "COMMIT;";
    return run(sql, deadline);
  }

  // The ids of `before` missing from `after` (both sorted), quoted.
  StatusOr<std::vector<std::string>> evicted_ids(const std::vector<FleetNode>& before,
                                                 const std::vector<FleetNode>& after) {
    std::vector<std::string> out;
    auto it = after.begin();
    for (const FleetNode& n : before) {
      while (it != after.end() && it->id < n.id) ++it;
      if (it != after.end() && it->id == n.id) continue;
      auto q = literal(n.id, "node_id");
      if (!q.ok()) return q.status();
      out.push_back(std::move(q.value()));
    }
    return out;
  }

  StatusOr<Grant> heartbeat_locked(std::string_view key, const NodeReport& report, Nanos deadline) {
    if (Status s = ensure_connected(deadline); !s.ok()) return s;
    auto k = literal(key, "key");
    if (!k.ok()) return k.status();
    auto self = literal(report.node_id, "node_id");
    if (!self.ok()) return self.status();
    auto loaded = lock_and_read(k.value(), deadline);
    if (!loaded.ok()) return loaded.status();
    FleetState& state = loaded.value().state;
    const std::vector<FleetNode> before = state.nodes;
    const Nanos now = caller_clock != nullptr ? caller_clock->now() : loaded.value().server_now;
    const Grant g = sluice::heartbeat(state, report, now, config);
    auto evicted = evicted_ids(before, state.nodes);
    if (!evicted.ok()) {
      recover(deadline);
      return evicted.status();
    }
    const auto me = std::find_if(state.nodes.begin(), state.nodes.end(),
                                 [&](const FleetNode& n) { return n.id == report.node_id; });
    if (Status s = write_and_commit(k.value(), self.value(), state, *me, evicted.value(), deadline);
        !s.ok())
      return s;
    return g;
  }

  Status leave_locked(std::string_view key, std::string_view node_id, Nanos deadline) {
    if (Status s = ensure_connected(deadline); !s.ok()) return s;
    auto k = literal(key, "key");
    if (!k.ok()) return k.status();
    auto id = literal(node_id, "node_id");
    if (!id.ok()) return id.status();
    std::string sql = begin_sql(deadline);
    sql += "SELECT pg_advisory_xact_lock(hashtextextended(" + k.value() + ", 0));";
    sql += "DELETE FROM " + nodes_table + " WHERE key = " + k.value() +
           " AND node_id = " + id.value() + ";";
    sql += "COMMIT;";
    return run(sql, deadline);
  }
};

PostgresCoordinator::PostgresCoordinator(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
PostgresCoordinator::~PostgresCoordinator() = default;

const CoordinatorConfig& PostgresCoordinator::config() const noexcept { return impl_->config; }

StatusOr<std::unique_ptr<PostgresCoordinator>> PostgresCoordinator::open(
    PostgresOptions options, CoordinatorConfig config, const Clock* caller_clock) {
  if (Status s = validate_prefix(options.table_prefix); !s.ok()) return s;
  const auto budget = connect_budget(options.conninfo);
  if (!budget.ok()) return budget.status();
  auto impl = std::make_unique<Impl>();
  impl->connect_budget = budget.value();
  impl->keys_table = options.table_prefix + "_keys";
  impl->nodes_table = options.table_prefix + "_nodes";
  impl->options = std::move(options);
  impl->config = config;
  impl->caller_clock = caller_clock;
  return std::unique_ptr<PostgresCoordinator>(new PostgresCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<PostgresCoordinator>> PostgresCoordinator::connect(
    PostgresOptions options, CoordinatorConfig config, const Clock* caller_clock) {
  auto c = open(std::move(options), config, caller_clock);
  if (!c.ok()) return c;
  Impl& m = *c.value()->impl_;
  const Status s = m.serialized<Status>(
      m.connect_budget, [&](Nanos deadline) { return m.ensure_connected(deadline); });
  if (s.code() == StatusCode::kDeadlineExceeded)  // as libpq's own connect_timeout reports it
    return Status(StatusCode::kUnavailable, s.message() + " (connect_timeout)");
  if (!s.ok()) return s;
  return c;
}

StatusOr<Grant> PostgresCoordinator::heartbeat(std::string_view key, const NodeReport& report,
                                               Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (std::string why = validate(report); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  return impl_->serialized<StatusOr<Grant>>(
      timeout, [&](Nanos deadline) { return impl_->heartbeat_locked(key, report, deadline); });
}

Status PostgresCoordinator::leave(std::string_view key, std::string_view node_id,
                                  Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (node_id.empty()) return Status(StatusCode::kInvalidArgument, "node_id must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  return impl_->serialized<Status>(
      timeout, [&](Nanos deadline) { return impl_->leave_locked(key, node_id, deadline); });
}

}  // namespace sluice
