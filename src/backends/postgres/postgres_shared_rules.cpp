// SharedRules on PostgreSQL (sluice/backends/shared_rules.h): one table, every deadline on the
// server's clock (clock_timestamp(), whole milliseconds); a put holds the scope's advisory lock, so
// its count of keys and its write are one step.
#include <libpq-fe.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "sluice/backends/shared_rules.h"

namespace sluice {
namespace {

using postgres_detail::PgConnection;

constexpr std::size_t kMaxTable = 63;  // PostgreSQL's identifiers
constexpr const char* kNowMs = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

bool parse_int(const char* s, std::int64_t& out) {
  const char* end = s + std::char_traits<char>::length(s);
  const auto [p, ec] = std::from_chars(s, end, out);
  return ec == std::errc() && p == end;
}

// The last result that has rows: the SELECT (or RETURNING) of a call.
const PGresult* last_rows(const PgConnection::Results& rs) {
  for (auto it = rs.rbegin(); it != rs.rend(); ++it)
    if (PQresultStatus(it->get()) == PGRES_TUPLES_OK) return it->get();
  return nullptr;
}

// Connects, then quotes each text as an SQL literal, in order (an error names the field of the
// first that cannot be one).
StatusOr<std::vector<std::string>> connect_and_quote(
    PgConnection::Session& db,
    std::initializer_list<std::pair<std::string_view, const char*>> texts) {
  if (Status c = db.connect(); !c.ok()) return c;
  std::vector<std::string> out;
  for (const auto& [text, field] : texts) {
    auto q = db.literal(text, field);
    if (!q.ok()) return q.status();
    out.push_back(std::move(q.value()));
  }
  return out;
}

class PostgresSharedRules final : public SharedRules {
 public:
  explicit PostgresSharedRules(PostgresOptions o)
      : table_(o.table_prefix),
        conn_(std::move(o), "CREATE TABLE IF NOT EXISTS " + table_ +
                                " (scope text NOT NULL, key text NOT NULL, value text NOT NULL,"
                                " deadline_ms bigint NOT NULL, drop_at_deadline boolean NOT NULL,"
                                " PRIMARY KEY (scope, key));") {}

  StatusOr<std::vector<SharedRule>> list(std::string_view scope, Nanos timeout) noexcept override {
    if (Status s = check(scope, "k", ""); !s.ok()) return s;
    return conn_.call(timeout, [&](PgConnection::Session& db) -> StatusOr<std::vector<SharedRule>> {
      auto q = connect_and_quote(db, {{scope, "scope"}});
      if (!q.ok()) return q.status();
      const std::string& S = q.value()[0];
      // One row even for an empty scope (the clock's), so now is always read.
      const std::string sql =
          db.begin() + "WITH c AS (SELECT " + kNowMs + " AS n), gone AS (DELETE FROM " + table_ +
          " USING c WHERE scope = " + S +
          " AND drop_at_deadline AND deadline_ms <= c.n) "
          "SELECT c.n, t.key, t.value, t.deadline_ms, t.drop_at_deadline FROM c LEFT JOIN " +
          table_ + " AS t ON t.scope = " + S +
          " AND NOT (t.drop_at_deadline AND t.deadline_ms <= c.n) ORDER BY t.key COLLATE \"C\";"
          "COMMIT;";
      auto rs = db.query(sql);
      if (!rs.ok()) return rs.status();
      const PGresult* rows = last_rows(rs.value());
      const Status bad(StatusCode::kInternal, "postgres: unexpected rows in the rules table");
      if (rows == nullptr || PQnfields(rows) != 5 || PQntuples(rows) < 1) return bad;
      std::vector<SharedRule> out;
      for (int i = 0; i < PQntuples(rows); ++i) {
        std::int64_t now = 0, deadline = 0;
        if (!parse_int(PQgetvalue(rows, i, 0), now)) return bad;
        if (PQgetisnull(rows, i, 1)) continue;  // the empty scope's one row
        if (!parse_int(PQgetvalue(rows, i, 3), deadline)) return bad;
        SharedRule e;
        e.key.assign(PQgetvalue(rows, i, 1), PQgetlength(rows, i, 1));
        e.value.assign(PQgetvalue(rows, i, 2), PQgetlength(rows, i, 2));
        e.has_deadline = deadline != 0;
        e.left = e.has_deadline ? Nanos{std::chrono::milliseconds(deadline - now)} : Nanos{0};
        e.drop_at_deadline = e.has_deadline && PQgetvalue(rows, i, 4)[0] == 't';
        out.push_back(std::move(e));
      }
      return out;
    });
  }

  Status put(std::string_view scope, std::string_view key, std::string_view value,
             bool has_deadline, Nanos left, bool drop_at_deadline, std::size_t max_keys,
             Nanos timeout) noexcept override {
    if (Status s = check(scope, key, value); !s.ok()) return s;
    return conn_.call(timeout, [&](PgConnection::Session& db) -> Status {
      auto q = connect_and_quote(db, {{scope, "scope"}, {key, "key"}, {value, "value"}});
      if (!q.ok()) return q.status();
      const std::string& S = q.value()[0];
      const std::string& K = q.value()[1];
      const std::string& V = q.value()[2];
      const std::string where = " WHERE scope = " + S;
      const std::string deadline =
          has_deadline
              ? "GREATEST(1, " + std::string(kNowMs) + " + " +
                    std::to_string(std::chrono::ceil<std::chrono::milliseconds>(left).count()) + ")"
              : std::string("0");
      std::string sql = db.begin();
      // table_ is [a-z_][a-z0-9_]* (validated), so it needs no quoting inside the literal.
      sql += "SELECT pg_advisory_xact_lock(hashtextextended('" + table_ + ":' || " + S + ", 0));";
      sql += "DELETE FROM " + table_ + where +
             " AND drop_at_deadline AND deadline_ms <= " + kNowMs + ";";
      sql += "INSERT INTO " + table_ +
             " (scope, key, value, deadline_ms, drop_at_deadline) SELECT " + S + ", " + K + ", " +
             V + ", " + deadline + ", " + (has_deadline && drop_at_deadline ? "true" : "false") +
             " WHERE EXISTS (SELECT 1 FROM " + table_ + where + " AND key = " + K +
             ") OR (SELECT count(*) FROM " + table_ + where + ") < " + std::to_string(max_keys) +
             " ON CONFLICT (scope, key) DO UPDATE SET value = EXCLUDED.value,"
             " deadline_ms = EXCLUDED.deadline_ms, drop_at_deadline = EXCLUDED.drop_at_deadline"
             " RETURNING 1;";
      sql += "SELECT count(*) FROM " + table_ + where + ";COMMIT;";
      auto rs = db.query(sql);
      if (!rs.ok()) return rs.status();
      const auto& results = rs.value();
      // ..., INSERT ... RETURNING (a row when written), SELECT count(*), COMMIT.
      if (results.size() < 3) return Status(StatusCode::kInternal, "postgres: unexpected results");
      const PGresult* inserted = results[results.size() - 3].get();
      const PGresult* count = results[results.size() - 2].get();
      if (PQntuples(inserted) == 1) return {};
      return Status(StatusCode::kFailedPrecondition,
                    "scope " + std::string(scope) + " holds " +
                        std::string(PQntuples(count) == 1 ? PQgetvalue(count, 0, 0) : "?") +
                        " keys, the most it may");
    });
  }

  Status erase(std::string_view scope, std::string_view key, Nanos timeout) noexcept override {
    if (Status s = check(scope, key, ""); !s.ok()) return s;
    return conn_.call(timeout, [&](PgConnection::Session& db) -> Status {
      auto q = connect_and_quote(db, {{scope, "scope"}, {key, "key"}});
      if (!q.ok()) return q.status();
      return db.run(db.begin() + "DELETE FROM " + table_ + " WHERE scope = " + q.value()[0] +
                    " AND key = " + q.value()[1] + ";COMMIT;");
    });
  }

  std::string_view backend() const noexcept override { return "postgres"; }

 private:
  const std::string table_;
  PgConnection conn_;
};

}  // namespace

StatusOr<std::unique_ptr<SharedRules>> postgres_shared_rules(PostgresOptions options) {
  if (Status s = PgConnection::validate_prefix(options.table_prefix, kMaxTable); !s.ok()) return s;
  if (const auto budget = PgConnection::connect_budget(options.conninfo); !budget.ok())
    return budget.status();
  try {
    return std::unique_ptr<SharedRules>(std::make_unique<PostgresSharedRules>(std::move(options)));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("postgres: ") + e.what());
  }
}

}  // namespace sluice
