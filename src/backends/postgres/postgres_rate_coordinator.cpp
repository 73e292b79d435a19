// The PostgreSQL rate coordinator: two round trips per call on one libpq connection.
//
//   1. BEGIN; SET LOCAL timeouts and synchronous_commit; pg_advisory_xact_lock on "<prefix>:<key>";
//   (a lease: insert
//      the origin row if there is none); read the server's clock, the origin, the key's ledger
//      row and its region rows (ordered by region, "C");
//   2. (after sluice::lease or sluice::reconcile ran here on the Ledger built from the rows)
//      upsert the ledger row and replace its region rows if the ledger changed, sweep idle keys
//      when it is time; COMMIT.
//
// Unsigned counts are numeric columns (a uint64 does not fit a bigint); times are bigint ns.
// The connection is a PgConnection (pg_connection.h): every wait bounded by the call's deadline,
// the connection dropped past it (the next call reconnects) and rolled back or dropped after a
// failed statement, so that it is always idle between calls.
#include "sluice/backends/postgres_rate_coordinator.h"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "backends/postgres/pg_connection.h"

namespace sluice {
namespace {

using postgres_detail::kTimelineSql;
using postgres_detail::PgConnection;
using Session = PgConnection::Session;
using Results = PgConnection::Results;

constexpr const char* kDefaultPrefix = "sluice_fed";
constexpr std::size_t kMaxPrefix = PostgresOptions::kRateMaxPrefix;  // + "_regions"
constexpr Nanos kConnectTimeout = std::chrono::seconds(10);
constexpr Nanos kSweepEvery = std::chrono::seconds(10);  // coordinator time between sweeps
constexpr Nanos kMinIdle = std::chrono::minutes(1);      // a key is kept at least this long
constexpr int kSweepBatch = 1000;

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

// The tables, created on every (re)connect.
std::string setup_sql(const std::string& ledger_table, const std::string& regions_table,
                      const std::string& origin_table) {
  std::string sql = "CREATE TABLE IF NOT EXISTS " + ledger_table +
                    " (key text PRIMARY KEY, window_start bigint NOT NULL,"
                    " clock_high bigint NOT NULL, lim numeric NOT NULL, period_ns bigint NOT NULL,"
                    " granted numeric NOT NULL, returned numeric NOT NULL,"
                    " forfeited numeric NOT NULL, idle_after bigint NOT NULL);";
  sql +=
      "CREATE INDEX IF NOT EXISTS " + ledger_table + "_idle ON " + ledger_table + " (idle_after);";
  sql += "CREATE TABLE IF NOT EXISTS " + regions_table +
         " (key text NOT NULL, region text NOT NULL, granted numeric NOT NULL,"
         " relinquished numeric NOT NULL, relinquished_window bigint NOT NULL,"
         " PRIMARY KEY (key, region));";
  sql += "CREATE TABLE IF NOT EXISTS " + origin_table +
         " (id int PRIMARY KEY CHECK (id = 1), origin_ns bigint NOT NULL);";
  // The WAL timeline the origin was written on (tables from before it had none: NULL).
  sql += "ALTER TABLE " + origin_table + " ADD COLUMN IF NOT EXISTS timeline text;";
  return sql;
}

}  // namespace

struct PostgresRateCoordinator::Impl {
  Impl(PostgresOptions o, const Clock* clock)
      : ledger_table(o.table_prefix + "_ledger"),
        regions_table(o.table_prefix + "_regions"),
        origin_table(o.table_prefix + "_origin"),
        lock_prefix("'" + o.table_prefix + ":'"),
        caller_clock(clock),
        conn(std::move(o), setup_sql(ledger_table, regions_table, origin_table)) {}

  const std::string ledger_table, regions_table, origin_table;
  const std::string lock_prefix;  // '<prefix>:' as SQL: the key's advisory lock is on it || key
  const Clock* const caller_clock;
  PgConnection conn;
  std::int64_t last_sweep = INT64_MIN;  // guarded by conn: coordinator time of the last sweep

  // The coordinator's clock as SQL: the caller's in test mode, else the server's (whole us).
  std::string now_sql() const {
    if (caller_clock != nullptr) return std::to_string(caller_clock->now().count());
    return "((extract(epoch FROM clock_timestamp()) * 1e6)::bigint * 1000)";
  }

  // Round trip 1: lock the key; a lease creates the origin row if there is none; read the
  // clock, the origin and the key's ledger.
  StatusOr<Loaded> lock_and_read(Session& db, const std::string& k, bool with_origin) const {
    std::string sql = db.begin();
    sql += "SET LOCAL synchronous_commit = on;";  // a grant is durable before it is answered
    sql += "SELECT pg_advisory_xact_lock(hashtextextended(" + lock_prefix + " || " + k + ", 0));";
    // A timeline other than the origin's is a server that went back in its history: a replica
    // promoted by a failover (it may lack the last grants acknowledged) or a point-in-time
    // recovery. Either counts as a loss: the origin moves to now.
    if (with_origin)
      sql += "INSERT INTO " + origin_table + " AS o (id, origin_ns, timeline) VALUES (1, " +
             now_sql() + ", " + kTimelineSql +
             ") ON CONFLICT (id) DO UPDATE SET origin_ns = EXCLUDED.origin_ns,"
             " timeline = EXCLUDED.timeline WHERE o.timeline IS DISTINCT FROM EXCLUDED.timeline;";
    sql += "SELECT " + now_sql() + ", (SELECT origin_ns FROM " + origin_table + " WHERE id = 1), " +
           kLedgerFields + " FROM (SELECT 1) AS one LEFT JOIN " + ledger_table + " ON key = " + k +
           ";";
    sql += "SELECT region, granted, relinquished, relinquished_window FROM " + regions_table +
           " WHERE key = " + k + " ORDER BY region COLLATE \"C\";";
    auto rs = db.query(sql);
    if (!rs.ok()) return rs.status();
    auto loaded = parse_loaded(rs.value());
    if (!loaded.ok()) db.rollback();
    return loaded;
  }

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
  Status write_and_commit(Session& db, const std::string& k, const Ledger& before, const Ledger& l,
                          Nanos now, bool may_sweep) {
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
          auto id = db.literal(r.region, "region");
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
    return db.run(sql);
  }

  StatusOr<LeaseReply> lease_locked(std::string_view key, const LeaseRequest& request,
                                    Session& db) {
    if (Status s = db.connect(); !s.ok()) return s;
    auto k = db.literal(key, "key");
    if (!k.ok()) return k.status();
    if (auto region = db.literal(request.region, "region"); !region.ok()) return region.status();
    auto loaded = lock_and_read(db, k.value(), true);
    if (!loaded.ok()) return loaded.status();
    Loaded& m = loaded.value();
    if (m.origin == INT64_MIN) {
      db.rollback();
      return Status(StatusCode::kInternal, "postgres: the origin row is missing after its insert");
    }
    const Ledger before = m.ledger;
    const std::int64_t origin_window = window_of(Nanos{m.origin}, request.spec.period).count();
    const LeaseReply reply = sluice::lease(m.ledger, request, m.now, origin_window);
    if (Status s = write_and_commit(db, k.value(), before, m.ledger, m.now, true); !s.ok())
      return s;
    return reply;
  }

  StatusOr<std::uint64_t> reconcile_locked(std::string_view key, std::string_view region,
                                           Nanos window_start, std::uint64_t relinquished,
                                           Session& db) {
    if (Status s = db.connect(); !s.ok()) return s;
    auto k = db.literal(key, "key");
    if (!k.ok()) return k.status();
    if (auto id = db.literal(region, "region"); !id.ok()) return id.status();
    auto loaded = lock_and_read(db, k.value(), false);
    if (!loaded.ok()) return loaded.status();
    Loaded& m = loaded.value();
    const Ledger before = m.ledger;
    const std::uint64_t given =
        sluice::reconcile(m.ledger, region, window_start, relinquished, m.now);
    if (Status s = write_and_commit(db, k.value(), before, m.ledger, m.now, false); !s.ok())
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
  if (Status s = PgConnection::validate_prefix(options.table_prefix, kMaxPrefix); !s.ok()) return s;
  // Refuses what libpq cannot parse; connect() waits kConnectTimeout whatever it says.
  if (const auto budget = PgConnection::connect_budget(options.conninfo); !budget.ok())
    return budget.status();
  auto impl = std::make_unique<Impl>(std::move(options), caller_clock);
  return std::unique_ptr<PostgresRateCoordinator>(new PostgresRateCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<PostgresRateCoordinator>> PostgresRateCoordinator::connect(
    PostgresOptions options, const Clock* caller_clock) {
  auto c = open(std::move(options), caller_clock);
  if (!c.ok()) return c;
  if (Status s = c.value()->impl_->conn.connect(kConnectTimeout); !s.ok()) return s;
  return c;
}

StatusOr<LeaseReply> PostgresRateCoordinator::lease(std::string_view key,
                                                    const LeaseRequest& request,
                                                    Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  if (std::string why = validate(request); !why.empty())
    return Status(StatusCode::kInvalidArgument, std::move(why));
  Impl& m = *impl_;
  return m.conn.call(timeout, [&](Session& db) { return m.lease_locked(key, request, db); });
}

StatusOr<std::uint64_t> PostgresRateCoordinator::reconcile(std::string_view key,
                                                           std::string_view region,
                                                           Nanos window_start,
                                                           std::uint64_t relinquished,
                                                           Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key: must not be empty");
  if (region.empty()) return Status(StatusCode::kInvalidArgument, "region: must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  Impl& m = *impl_;
  return m.conn.call(timeout, [&](Session& db) {
    return m.reconcile_locked(key, region, window_start, relinquished, db);
  });
}

Status PostgresRateCoordinator::health(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  return impl_->conn.call(timeout, [](Session& db) -> Status {
    if (Status s = db.connect(); !s.ok()) return s;
    return db.query("SELECT 1").status();
  });
}

}  // namespace sluice
