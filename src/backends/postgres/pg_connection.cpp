#include "backends/postgres/pg_connection.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace sluice::postgres_detail {
namespace {

using backend_detail::kNoDeadline;
using backend_detail::mono_now;

constexpr Nanos kDefaultConnectTimeout = std::chrono::seconds(10);

std::int64_t ceil_ms(Nanos d) { return std::chrono::ceil<std::chrono::milliseconds>(d).count(); }

std::string trimmed(const char* s) {
  std::string out = s != nullptr ? s : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ' || out.back() == '\t'))
    out.pop_back();
  return out;
}

Status unavailable(const PGconn* c) {
  std::string why = c != nullptr ? trimmed(PQerrorMessage(c)) : "not connected";
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

Nanos connect_budget_of(const char* value) {
  int seconds = 0;
  const char* end = value + std::strlen(value);
  const auto [p, ec] = std::from_chars(value, end, seconds);
  if (ec != std::errc{} || p != end) return Nanos{-1};
  if (seconds <= 0) return kNoDeadline;               // libpq: wait indefinitely
  return std::chrono::seconds(std::max(seconds, 2));  // libpq: at least 2 s
}

}  // namespace

Status PgConnection::validate_prefix(const std::string& p, std::size_t max_size) {
  std::string why = table_prefix_problem(p, max_size);
  if (why.empty()) return {};
  return Status(StatusCode::kInvalidArgument, "postgres: table_prefix " + why);
}

StatusOr<Nanos> PgConnection::connect_budget(const std::string& conninfo) {
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

PgConnection::PgConnection(PostgresOptions options, std::string setup)
    : options_(std::move(options)), setup_(std::move(setup)) {}

PgConnection::~PgConnection() = default;

Status PgConnection::connect(Nanos timeout) noexcept {
  return call(timeout, [](Session& s) { return s.connect(); });
}

Status PgConnection::Session::connect() { return conn_.ensure_connected(deadline_); }

// Statements and lock waits get 3/4 of what is left; an idle transaction (a client that went
// away mid-call) ends when the whole call would have.
std::string PgConnection::Session::begin() const {
  std::string sql = "BEGIN;";
  if (deadline_ == kNoDeadline) return sql;
  const std::int64_t left = std::max<std::int64_t>(ceil_ms(deadline_ - mono_now()), 1);
  const std::string server = std::to_string(std::max<std::int64_t>(left * 3 / 4, 1));
  sql += "SET LOCAL lock_timeout = " + server + ";";
  sql += "SET LOCAL statement_timeout = " + server + ";";
  sql += "SET LOCAL idle_in_transaction_session_timeout = " + std::to_string(left) + ";";
  return sql;
}

StatusOr<std::string> PgConnection::Session::literal(std::string_view text, const char* field) {
  if (text.find('\0') != std::string_view::npos)
    return Status(StatusCode::kInvalidArgument, std::string(field) + ": must not contain NUL");
  PGconn* c = conn_.conn_.get();
  if (c == nullptr) return unavailable(c);
  std::unique_ptr<char, void (*)(void*)> q(PQescapeLiteral(c, text.data(), text.size()),
                                           &PQfreemem);
  if (!q)
    return Status(StatusCode::kInvalidArgument,
                  std::string(field) + ": cannot be quoted: " + trimmed(PQerrorMessage(c)));
  return std::string(q.get());
}

StatusOr<PgConnection::Results> PgConnection::Session::query(const std::string& sql) {
  auto rs = conn_.exec(sql, deadline_);
  if (!rs.ok()) return rs;
  if (Status s = conn_.check(rs.value(), deadline_); !s.ok()) return s;
  return rs;
}

Status PgConnection::Session::run(const std::string& sql) { return conn_.run(sql, deadline_); }

void PgConnection::Session::rollback() { conn_.recover(deadline_); }

// A connection that is up, with the setup done.
Status PgConnection::ensure_connected(Nanos deadline) {
  if (conn_ && PQstatus(conn_.get()) == CONNECTION_OK) return {};
  drop();
  Conn c(PQconnectStart(options_.conninfo.c_str()));
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
  conn_ = std::move(c);
  if (setup_.empty()) return {};  // nothing to set up (a probe's connection): no transaction
  Session session(*this, deadline);
  std::string sql = session.begin();
  sql += "SET LOCAL client_min_messages = warning;";
  sql += "SELECT pg_advisory_xact_lock(hashtext('sluice'), hashtext('" + options_.table_prefix +
         "'));";
  sql += setup_;
  sql += "COMMIT;";
  if (Status s = run(sql, deadline); !s.ok()) {
    drop();
    return s;
  }
  return {};
}

// Sends `sql` and collects every result; a timeout or a lost connection drops the connection.
StatusOr<PgConnection::Results> PgConnection::exec(const std::string& sql, Nanos deadline) {
  PGconn* c = conn_.get();
  if (c == nullptr) return unavailable(c);
  Status s = PQsendQuery(c, sql.c_str()) != 0 ? flush(deadline) : unavailable(c);
  Results out;
  while (s.ok()) {
    while (s.ok() && PQisBusy(c) != 0) s = await_input(deadline);
    if (!s.ok()) break;
    Result r(PQgetResult(c));
    if (!r) return out;
    out.push_back(std::move(r));
  }
  drop();
  return s;
}

Status PgConnection::flush(Nanos deadline) {
  PGconn* c = conn_.get();
  for (;;) {
    const int f = PQflush(c);
    if (f == 0) return {};
    if (f < 0) return unavailable(c);
    if (Status s = wait_socket(c, POLLIN | POLLOUT, deadline); !s.ok()) return s;
    if (PQconsumeInput(c) == 0) return unavailable(c);
  }
}

Status PgConnection::await_input(Nanos deadline) {
  PGconn* c = conn_.get();
  if (Status s = wait_socket(c, POLLIN, deadline); !s.ok()) return s;
  if (PQconsumeInput(c) == 0) return unavailable(c);
  return {};
}

// The first failed statement among `rs` as a Status (ok when all succeeded); after a failure
// the connection is left idle or dropped.
Status PgConnection::check(const Results& rs, Nanos deadline) {
  for (const Result& r : rs) {
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) continue;
    Status s = sql_error(r.get(), conn_.get());
    recover(deadline);
    return s;
  }
  return {};
}

// Leaves the connection idle (ROLLBACK of an open or failed transaction) or drops it.
void PgConnection::recover(Nanos deadline) {
  if (!conn_) return;
  if (PQstatus(conn_.get()) != CONNECTION_OK) {
    drop();
    return;
  }
  if (PQtransactionStatus(conn_.get()) == PQTRANS_IDLE) return;
  const auto r = exec("ROLLBACK", deadline);
  if (conn_ && (!r.ok() || PQtransactionStatus(conn_.get()) != PQTRANS_IDLE)) drop();
}

Status PgConnection::run(const std::string& sql, Nanos deadline) {
  auto rs = exec(sql, deadline);
  if (!rs.ok()) return rs.status();
  if (Status s = check(rs.value(), deadline); !s.ok()) return s;
  if (PQtransactionStatus(conn_.get()) == PQTRANS_IDLE) return {};
  recover(deadline);
  return Status(StatusCode::kInternal, "postgres: transaction left open");
}

}  // namespace sluice::postgres_detail
