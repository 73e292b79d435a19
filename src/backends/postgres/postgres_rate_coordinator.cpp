// The PostgreSQL rate coordinator: two round trips per call on one libpq connection.
//
//   1. BEGIN; SET LOCAL timeouts; pg_advisory_xact_lock on "<prefix>:<key>"; (a lease: insert
//      the origin row if there is none); read the server's clock, the origin, the key's ledger
//      row and its region rows (ordered by region, "C");
//   2. (after sluice::lease or sluice::reconcile ran here on the Ledger built from the rows)
//      upsert the ledger row and replace its region rows if the ledger changed, sweep idle keys
//      when it is time; COMMIT.
//
// Unsigned counts are numeric columns (a uint64 does not fit a bigint); times are bigint ns.
// Every wait goes through poll() on the connection's socket with the call's deadline (libpq's
// asynchronous API, the connection in non-blocking mode). Past the deadline the connection is
// dropped (the next call reconnects); after a failed statement it is rolled back or dropped, so
// the connection is always idle between calls.
#include "sluice/postgres_rate_coordinator.h"

#include <libpq-fe.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
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

constexpr const char* kDefaultPrefix = "sluice_fed";
constexpr std::size_t kMaxPrefix = 55;  // + "_regions" stays within PostgreSQL's 63-byte names
constexpr Nanos kConnectTimeout = std::chrono::seconds(10);
constexpr Nanos kSweepEvery = std::chrono::seconds(10);  // coordinator time between sweeps
constexpr Nanos kMinIdle = std::chrono::minutes(1);      // a key is kept at least this long
constexpr int kSweepBatch = 1000;

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

// Waits until the socket is ready for `events`; a Status for a timeout or a failure.
Status wait_socket(const PGconn* c, short events, Nanos deadline) {
  const int fd = PQsocket(c);
  if (fd < 0) return unavailable(c);
  for (;;) {
    int ms = -1;
    if (deadline != kNoDeadline) {
      const Nanos left = deadline - mono_now();
      if (left <= Nanos{0})
        return Status(StatusCode::kDeadlineExceeded, "postgres: no reply within the timeout");
      ms = static_cast<int>(std::min<std::int64_t>(ceil_ms(left), INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return {};
    if (n < 0 && errno != EINTR)
      return Status(StatusCode::kUnavailable,
                    std::string("postgres: poll failed: ") + std::strerror(errno));
  }
}

// A statement's failure as a Status with retry meaning.
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

// Opens a connection without blocking past `deadline`; non-blocking mode on success.
StatusOr<Conn> open_connection(const std::string& conninfo, Nanos deadline) {
  Conn c(PQconnectStart(conninfo.c_str()));
  if (!c) throw std::bad_alloc();
  if (PQstatus(c.get()) == CONNECTION_BAD) return unavailable(c.get());
  PostgresPollingStatusType st = PGRES_POLLING_WRITING;
  while (st != PGRES_POLLING_OK) {
    if (st == PGRES_POLLING_FAILED) return unavailable(c.get());
    Status s = wait_socket(c.get(), st == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline);
    if (s.code() == StatusCode::kDeadlineExceeded)
      return Status(StatusCode::kDeadlineExceeded, "postgres: no connection within the timeout");
    if (!s.ok()) return s;
    st = PQconnectPoll(c.get());
  }
  if (PQsetnonblocking(c.get(), 1) != 0) return unavailable(c.get());
  return c;
}

template <typename T>
bool parse_int(const char* s, T& out) {
  const char* end = s + std::strlen(s);
  const auto [p, ec] = std::from_chars(s, end, out);
  return ec == std::errc{} && p == end;
}

// a + b, saturated at INT64_MAX (b >= 0).
std::int64_t add_sat(std::int64_t a, std::int64_t b) {
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

// When a ledger may be deleted: max(3 periods, kMinIdle) after the last time it saw.
std::int64_t idle_after(const Ledger& l) {
  const std::int64_t p = l.spec.period.count();
  const std::int64_t keep = p > INT64_MAX / 3 ? INT64_MAX : std::max(3 * p, kMinIdle.count());
  return add_sat(l.clock_high, keep);
}

// The ledger columns after key, in the read query's order (parse_ledger follows it).
constexpr const char* kLedgerFields =
    "window_start, clock_high, lim, period_ns, granted, returned, forfeited";

struct Loaded {
  Ledger ledger;
  Nanos now{0};
  std::int64_t origin = INT64_MIN;  // coordinator time of the origin; INT64_MIN: none read
};

}  // namespace

struct PostgresRateCoordinator::Impl {
  PostgresOptions options;
  const Clock* caller_clock = nullptr;
  std::string ledger_table, regions_table, origin_table;
  backend_detail::CallGate gate;        // one call at a time; waiting counts against its deadline
  Conn conn;                            // guarded by gate; null when disconnected
  std::int64_t last_sweep = INT64_MIN;  // guarded by gate: coordinator time of the last sweep

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

  // Serialised on an advisory lock of its own, so concurrent first uses never race on the
  // catalog.
  Status create_tables(Nanos deadline) {
    std::string sql = begin_sql(deadline);
    sql += "SET LOCAL client_min_messages = warning;";
    sql += "SELECT pg_advisory_xact_lock(hashtext('sluice'), hashtext('" + options.table_prefix +
           "'));";
    sql += "CREATE TABLE IF NOT EXISTS " + ledger_table +
           " (key text PRIMARY KEY, window_start bigint NOT NULL, clock_high bigint NOT NULL,"
           " lim numeric NOT NULL, period_ns bigint NOT NULL, granted numeric NOT NULL,"
           " returned numeric NOT NULL, forfeited numeric NOT NULL, idle_after bigint NOT NULL);";
    sql += "CREATE INDEX IF NOT EXISTS " + ledger_table + "_idle ON " + ledger_table +
           " (idle_after);";
    sql += "CREATE TABLE IF NOT EXISTS " + regions_table +
           " (key text NOT NULL, region text NOT NULL, granted numeric NOT NULL,"
           " relinquished numeric NOT NULL, relinquished_window bigint NOT NULL,"
           " PRIMARY KEY (key, region));";
    sql += "CREATE TABLE IF NOT EXISTS " + origin_table +
           " (id int PRIMARY KEY CHECK (id = 1), origin_ns bigint NOT NULL);";
    sql += "COMMIT;";
    return run(sql, deadline);
  }

  // BEGIN and the server-side timeouts: statements and lock waits get 3/4 of what is left (so
  // that their error, and a ROLLBACK, still arrive in time); an idle transaction ends when the
  // whole call would have.
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

  StatusOr<std::string> literal(std::string_view s, const char* what) {
    if (s.find('\0') != std::string_view::npos)
      return Status(StatusCode::kInvalidArgument, std::string(what) + ": must not contain NUL");
    std::unique_ptr<char, void (*)(void*)> q(PQescapeLiteral(conn.get(), s.data(), s.size()),
                                             &PQfreemem);
    if (!q)
      return Status(StatusCode::kInvalidArgument, std::string(what) + ": cannot be quoted: " +
                                                      trimmed(PQerrorMessage(conn.get())));
    return std::string(q.get());
  }

  // Sends `sql` and collects every result; a timeout or a lost connection drops the connection.
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
      if (Status s = wait_socket(c, POLLIN | POLLOUT, deadline); !s.ok()) return s;
      if (PQconsumeInput(c) == 0) return unavailable(c);
    }
  }

  Status await_input(Nanos deadline) {
    PGconn* c = conn.get();
    if (Status s = wait_socket(c, POLLIN, deadline); !s.ok()) return s;
    if (PQconsumeInput(c) == 0) return unavailable(c);
    return {};
  }

  // The first failed statement as a Status; after a failure the connection is idle or dropped.
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

  // exec + check for statements that end the transaction.
  Status run(const std::string& sql, Nanos deadline) {
    auto rs = exec(sql, deadline);
    if (!rs.ok()) return rs.status();
    if (Status s = check(rs.value(), deadline); !s.ok()) return s;
    if (PQtransactionStatus(conn.get()) == PQTRANS_IDLE) return {};
    recover(deadline);
    return Status(StatusCode::kInternal, "postgres: transaction left open");
  }

  // The coordinator's clock as SQL: the caller's in test mode, else the server's (whole us).
  std::string now_sql() const {
    if (caller_clock != nullptr) return std::to_string(caller_clock->now().count());
    return "((extract(epoch FROM clock_timestamp()) * 1e6)::bigint * 1000)";
  }

  // Round trip 1: lock the key; a lease creates the origin row if there is none; read the
  // clock, the origin and the key's ledger.
  StatusOr<Loaded> lock_and_read(const std::string& k, bool with_origin, Nanos deadline) {
    std::string sql = begin_sql(deadline);
    sql +=
        "SELECT pg_advisory_xact_lock(hashtextextended(" + literal_prefix() + " || " + k + ", 0));";
    if (with_origin)
      sql += "INSERT INTO " + origin_table + " (id, origin_ns) VALUES (1, " + now_sql() +
             ") ON CONFLICT (id) DO NOTHING;";
    sql += "SELECT " + now_sql() + ", (SELECT origin_ns FROM " + origin_table + " WHERE id = 1), " +
           kLedgerFields + " FROM (SELECT 1) AS one LEFT JOIN " + ledger_table + " ON key = " + k +
           ";";
    sql += "SELECT region, granted, relinquished, relinquished_window FROM " + regions_table +
           " WHERE key = " + k + " ORDER BY region COLLATE \"C\";";
    auto rs = exec(sql, deadline);
    if (!rs.ok()) return rs.status();
    if (Status s = check(rs.value(), deadline); !s.ok()) return s;
    auto loaded = parse_loaded(rs.value());
    if (!loaded.ok()) recover(deadline);
    return loaded;
  }

  std::string literal_prefix() const { return "'" + options.table_prefix + ":'"; }

  static StatusOr<Loaded> parse_loaded(const Results& rs) {
    const Status bad(StatusCode::kInternal, "postgres: unexpected rows in the ledger tables");
    if (rs.size() < 2) return bad;
    const PGresult* head = rs[rs.size() - 2].get();
    const PGresult* rows = rs.back().get();
    if (PQntuples(head) != 1 || PQnfields(head) != 9 || PQnfields(rows) != 4) return bad;
    Loaded out;
    std::int64_t now = 0;
    if (!parse_int(PQgetvalue(head, 0, 0), now)) return bad;
    out.now = Nanos{now};
    if (!PQgetisnull(head, 0, 1) && !parse_int(PQgetvalue(head, 0, 1), out.origin)) return bad;
    if (PQgetisnull(head, 0, 2)) return out;  // no ledger row: a key not leased (or swept)
    Ledger& l = out.ledger;
    std::int64_t period = 0;
    const auto v = [&](int col) { return PQgetvalue(head, 0, col); };
    if (!parse_int(v(2), l.window_start) || !parse_int(v(3), l.clock_high) ||
        !parse_int(v(4), l.spec.limit) || !parse_int(v(5), period) || !parse_int(v(6), l.granted) ||
        !parse_int(v(7), l.returned) || !parse_int(v(8), l.forfeited))
      return bad;
    l.spec.period = Nanos{period};
    l.regions.resize(static_cast<std::size_t>(PQntuples(rows)));
    for (int i = 0; i < PQntuples(rows); ++i) {
      RegionLedger& r = l.regions[static_cast<std::size_t>(i)];
      r.region = PQgetvalue(rows, i, 0);
      if (!parse_int(PQgetvalue(rows, i, 1), r.granted) ||
          !parse_int(PQgetvalue(rows, i, 2), r.relinquished) ||
          !parse_int(PQgetvalue(rows, i, 3), r.relinquished_window))
        return bad;
    }
    const auto by_region = [](const RegionLedger& a, const RegionLedger& b) {
      return a.region < b.region;
    };
    if (!std::is_sorted(l.regions.begin(), l.regions.end(), by_region))
      std::sort(l.regions.begin(), l.regions.end(), by_region);
    return out;
  }

  // Round trip 2: the ledger if it changed, a sweep when due; COMMIT.
  Status write_and_commit(const std::string& k, const Ledger& before, const Ledger& l, Nanos now,
                          bool may_sweep, Nanos deadline) {
    std::string sql;
    if (l != before) {
      sql += "INSERT INTO " + ledger_table + " (key, " + kLedgerFields + ", idle_after) VALUES (" +
             k + ", " + std::to_string(l.window_start) + ", " + std::to_string(l.clock_high) +
             ", " + std::to_string(l.spec.limit) + ", " + std::to_string(l.spec.period.count()) +
             ", " + std::to_string(l.granted) + ", " + std::to_string(l.returned) + ", " +
             std::to_string(l.forfeited) + ", " + std::to_string(idle_after(l)) +
             ") ON CONFLICT (key) DO UPDATE SET window_start = EXCLUDED.window_start,"
             " clock_high = EXCLUDED.clock_high, lim = EXCLUDED.lim,"
             " period_ns = EXCLUDED.period_ns, granted = EXCLUDED.granted,"
             " returned = EXCLUDED.returned, forfeited = EXCLUDED.forfeited,"
             " idle_after = EXCLUDED.idle_after;";
      sql += "DELETE FROM " + regions_table + " WHERE key = " + k + ";";
      if (!l.regions.empty()) {
        sql += "INSERT INTO " + regions_table +
               " (key, region, granted, relinquished, relinquished_window) VALUES ";
        for (std::size_t i = 0; i < l.regions.size(); ++i) {
          const RegionLedger& r = l.regions[i];
          auto id = literal(r.region, "region");
          if (!id.ok()) return id.status();
          sql += (i > 0 ? ", (" : "(") + k + ", " + id.value() + ", " + std::to_string(r.granted) +
                 ", " + std::to_string(r.relinquished) + ", " +
                 std::to_string(r.relinquished_window) + ")";
        }
        sql += ";";
      }
    }
    if (may_sweep && (last_sweep == INT64_MIN || now.count() - last_sweep >= kSweepEvery.count())) {
      // Idle keys other than this one, skipping rows another call holds.
      sql += "WITH idle AS (SELECT key FROM " + ledger_table + " WHERE idle_after < " +
             std::to_string(now.count()) + " AND key <> " + k + " ORDER BY idle_after LIMIT " +
             std::to_string(kSweepBatch) + " FOR UPDATE SKIP LOCKED), gone AS (DELETE FROM " +
             ledger_table +
             " AS l USING idle WHERE l.key = idle.key RETURNING l.key) DELETE FROM " +
             regions_table + " WHERE key IN (SELECT key FROM gone);";
      last_sweep = now.count();
    }
    sql += "COMMIT;";
    return run(sql, deadline);
  }

  StatusOr<LeaseReply> lease_locked(std::string_view key, const LeaseRequest& request,
                                    Nanos deadline) {
    if (Status s = ensure_connected(deadline); !s.ok()) return s;
    auto k = literal(key, "key");
    if (!k.ok()) return k.status();
    if (auto region = literal(request.region, "region"); !region.ok()) return region.status();
    auto loaded = lock_and_read(k.value(), true, deadline);
    if (!loaded.ok()) return loaded.status();
    Loaded& m = loaded.value();
    if (m.origin == INT64_MIN) {
      recover(deadline);
      return Status(StatusCode::kInternal, "postgres: the origin row is missing after its insert");
    }
    const Ledger before = m.ledger;
    const std::int64_t origin_window = window_of(Nanos{m.origin}, request.spec.period).count();
    const LeaseReply reply = sluice::lease(m.ledger, request, m.now, origin_window);
    if (Status s = write_and_commit(k.value(), before, m.ledger, m.now, true, deadline); !s.ok())
      return s;
    return reply;
  }

  StatusOr<std::uint64_t> reconcile_locked(std::string_view key, std::string_view region,
                                           Nanos window_start, std::uint64_t relinquished,
                                           Nanos deadline) {
    if (Status s = ensure_connected(deadline); !s.ok()) return s;
    auto k = literal(key, "key");
    if (!k.ok()) return k.status();
    if (auto id = literal(region, "region"); !id.ok()) return id.status();
    auto loaded = lock_and_read(k.value(), false, deadline);
    if (!loaded.ok()) return loaded.status();
    Loaded& m = loaded.value();
    const Ledger before = m.ledger;
    const std::uint64_t given =
        sluice::reconcile(m.ledger, region, window_start, relinquished, m.now);
    if (Status s = write_and_commit(k.value(), before, m.ledger, m.now, false, deadline); !s.ok())
      return s;
    return given;
  }
};

PostgresRateCoordinator::PostgresRateCoordinator(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
PostgresRateCoordinator::~PostgresRateCoordinator() = default;

PostgresOptions PostgresRateCoordinator::default_options() {
  PostgresOptions o;
  o.table_prefix = kDefaultPrefix;
  return o;
}

StatusOr<std::unique_ptr<PostgresRateCoordinator>> PostgresRateCoordinator::open(
    PostgresOptions options, const Clock* caller_clock) {
  if (Status s = validate_prefix(options.table_prefix); !s.ok()) return s;
  char* err = nullptr;
  PQconninfoOption* parsed = PQconninfoParse(options.conninfo.c_str(), &err);
  if (parsed == nullptr) {
    std::string why = err != nullptr ? trimmed(err) : "out of memory";
    PQfreemem(err);
    return Status(StatusCode::kInvalidArgument, "postgres: bad conninfo: " + why);
  }
  PQconninfoFree(parsed);
  auto impl = std::make_unique<Impl>();
  impl->ledger_table = options.table_prefix + "_ledger";
  impl->regions_table = options.table_prefix + "_regions";
  impl->origin_table = options.table_prefix + "_origin";
  impl->options = std::move(options);
  impl->caller_clock = caller_clock;
  return std::unique_ptr<PostgresRateCoordinator>(new PostgresRateCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<PostgresRateCoordinator>> PostgresRateCoordinator::connect(
    PostgresOptions options, const Clock* caller_clock) {
  auto c = open(std::move(options), caller_clock);
  if (!c.ok()) return c;
  Impl& m = *c.value()->impl_;
  const Status s = m.serialized<Status>(
      kConnectTimeout, [&](Nanos deadline) { return m.ensure_connected(deadline); });
  if (!s.ok()) return s;
  return c;
}

StatusOr<LeaseReply> PostgresRateCoordinator::lease(std::string_view key,
                                                    const LeaseRequest& request,
                                                    Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (std::string why = validate(request); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  return impl_->serialized<StatusOr<LeaseReply>>(
      timeout, [&](Nanos deadline) { return impl_->lease_locked(key, request, deadline); });
}

StatusOr<std::uint64_t> PostgresRateCoordinator::reconcile(std::string_view key,
                                                           std::string_view region,
                                                           Nanos window_start,
                                                           std::uint64_t relinquished,
                                                           Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (region.empty()) return Status(StatusCode::kInvalidArgument, "region: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  return impl_->serialized<StatusOr<std::uint64_t>>(timeout, [&](Nanos deadline) {
    return impl_->reconcile_locked(key, region, window_start, relinquished, deadline);
  });
}

Status PostgresRateCoordinator::health(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  return impl_->serialized<Status>(timeout, [&](Nanos deadline) {
    if (Status s = impl_->ensure_connected(deadline); !s.ok()) return s;
    auto rs = impl_->exec("SELECT 1", deadline);
    if (!rs.ok()) return rs.status();
    return impl_->check(rs.value(), deadline);
  });
}

}  // namespace sluice
