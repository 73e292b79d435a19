// The PostgreSQL coordinator: two round trips per heartbeat on one libpq connection.
//
//   1. BEGIN; SET LOCAL timeouts; pg_advisory_xact_lock(hashtextextended(key, 0)); create
//      the origin row if there is none, or move it to now when the server's WAL timeline is
//      not the one it was written on; read the key's generation and ceiling, the server's
//      clock, the origin and the key's node rows (ordered by id, "C");
//   2. (after sluice::heartbeat ran here on the FleetState built from the rows) upsert the
//      reporter, delete the evicted nodes, upsert the generation and ceiling; COMMIT.
//
// Tables: <prefix>_keys(key, generation, ceiling), <prefix>_nodes(key, node_id, l_local,
// in_flight, share, expires_ns, acked, unacked_gen[], unacked_share[], estimated, instance) and
// <prefix>_origin(id = 1, origin_ns, timeline): the coordinator time at which it last found it
// may have lost state (sluice/core/fleet.h: lost_at), and the timeline it was then on. No row
// (empty or new tables) or another timeline (a replica promoted by a failover, a point-in-time
// recovery: either may lack the last heartbeats) is a loss: the origin moves to now, and for
// one lease_ttl every grant is share 0.
// created on every (re)connect by a transaction serialised on an advisory lock of its own (so
// concurrent first uses never race on the catalog); tables from before ceiling, estimated and
// instance get them. A heartbeat under a node id another live instance holds (sluice::clash)
// rolls back and writes nothing; leave deletes a row only of its own instance.
//
// The connection is a PgConnection (pg_connection.h): every wait bounded by the call's deadline,
// the connection dropped past it (the next call reconnects) and rolled back or dropped after a
// failed statement, so that it is always idle between calls.
#include "sluice/backends/postgres_coordinator.h"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <chrono>
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

constexpr std::size_t kMaxPrefix = PostgresOptions::kFleetMaxPrefix;  // + "_nodes"

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
  std::int64_t instance = 0;  // the bits of the uint64, as a bigint holds them
  if (!parse_int(v(9), instance)) return false;
  n.instance = static_cast<std::uint64_t>(instance);
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
    "node_id, l_local, in_flight, share, expires_ns, acked, unacked_gen, unacked_share, estimated,"
    " instance";
constexpr const char* kNodeUpdate =
    "l_local = EXCLUDED.l_local, in_flight = EXCLUDED.in_flight, share = EXCLUDED.share,"
    " expires_ns = EXCLUDED.expires_ns, acked = EXCLUDED.acked,"
    " unacked_gen = EXCLUDED.unacked_gen, unacked_share = EXCLUDED.unacked_share,"
    " estimated = EXCLUDED.estimated, instance = EXCLUDED.instance";

struct Loaded {
  FleetState state;
  Nanos server_now{0};
  Nanos origin{0};  // coordinator time of the last loss found
};

// The tables, created on every (re)connect; tables from before ceiling and estimated get them.
std::string setup_sql(const std::string& keys_table, const std::string& nodes_table,
                      const std::string& origin_table) {
  std::string sql = "CREATE TABLE IF NOT EXISTS " + keys_table +
                    " (key text PRIMARY KEY, generation bigint NOT NULL);";
  sql += "CREATE TABLE IF NOT EXISTS " + nodes_table +
         " (key text NOT NULL, node_id text NOT NULL, l_local bigint NOT NULL,"
         " in_flight bigint NOT NULL, share bigint NOT NULL, expires_ns bigint NOT NULL,"
         " acked bigint NOT NULL, unacked_gen bigint[] NOT NULL,"
         " unacked_share bigint[] NOT NULL, PRIMARY KEY (key, node_id));";
  // Columns added since the first release: tables made before get them here.
  sql +=
      "ALTER TABLE " + keys_table + " ADD COLUMN IF NOT EXISTS ceiling bigint NOT NULL DEFAULT 0;";
  sql += "ALTER TABLE " + nodes_table +
         " ADD COLUMN IF NOT EXISTS estimated boolean NOT NULL DEFAULT true;";
  sql += "ALTER TABLE " + nodes_table +
         " ADD COLUMN IF NOT EXISTS instance bigint NOT NULL DEFAULT 0;";
  sql += "CREATE TABLE IF NOT EXISTS " + origin_table +
         " (id int PRIMARY KEY CHECK (id = 1), origin_ns bigint NOT NULL, timeline text);";
  return sql;
}

}  // namespace

struct PostgresCoordinator::Impl {
  Impl(PostgresOptions o, CoordinatorConfig c, const Clock* clock, Nanos budget)
      : keys_table(o.table_prefix + "_keys"),
        nodes_table(o.table_prefix + "_nodes"),
        origin_table(o.table_prefix + "_origin"),
        config(c),
        caller_clock(clock),
        connect_budget(budget),
        conn(std::move(o), setup_sql(keys_table, nodes_table, origin_table)) {}

  const std::string keys_table, nodes_table, origin_table;
  const CoordinatorConfig config;
  const Clock* const caller_clock;
  const Nanos connect_budget;  // how long a connect may take (conninfo's connect_timeout)
  PgConnection conn;

  // The coordinator's clock as SQL, in ns: the caller's in test mode, else the server's (whole
  // microseconds).
  std::string now_sql() const {
    if (caller_clock != nullptr) return std::to_string(caller_clock->now().count());
    return "((extract(epoch FROM clock_timestamp()) * 1e6)::bigint * 1000)";
  }

  // Round trip 1: lock the key; create or move the origin; read the key's generation, the
  // server's time, the origin and the key's nodes.
  StatusOr<Loaded> lock_and_read(Session& db, const std::string& k) const {
    std::string sql = db.begin();
    sql += "SELECT pg_advisory_xact_lock(hashtextextended(" + k + ", 0));";
    sql += "INSERT INTO " + origin_table + " AS o (id, origin_ns, timeline) VALUES (1, " +
           now_sql() + ", " + kTimelineSql +
           ") ON CONFLICT (id) DO UPDATE SET origin_ns = EXCLUDED.origin_ns,"
           " timeline = EXCLUDED.timeline WHERE o.timeline IS DISTINCT FROM EXCLUDED.timeline;";
    sql += "SELECT (SELECT generation FROM " + keys_table + " WHERE key = " + k +
           "), (extract(epoch FROM clock_timestamp()) * 1e6)::bigint, (SELECT ceiling FROM " +
           keys_table + " WHERE key = " + k + "), (SELECT origin_ns FROM " + origin_table +
           " WHERE id = 1);";
    sql += std::string("SELECT ") + kNodeFields + " FROM " + nodes_table + " WHERE key = " + k +
           " ORDER BY node_id COLLATE \"C\";";
    auto rs = db.query(sql);
    if (!rs.ok()) return rs.status();
    auto loaded = parse_loaded(rs.value());
    if (!loaded.ok()) db.rollback();
    return loaded;
  }

  static StatusOr<Loaded> parse_loaded(const Results& rs) {
    const Status bad(StatusCode::kInternal, "postgres: unexpected rows in the coordinator tables");
    if (rs.size() < 2) return bad;
    const PGresult* head = rs[rs.size() - 2].get();
    const PGresult* rows = rs.back().get();
    if (PQntuples(head) != 1 || PQnfields(head) != 4 || PQnfields(rows) != 10) return bad;
    Loaded out;
    std::int64_t server_us = 0;
    if (!PQgetisnull(head, 0, 0) && !parse_int(PQgetvalue(head, 0, 0), out.state.generation))
      return bad;
    if (!parse_int(PQgetvalue(head, 0, 1), server_us)) return bad;
    if (!PQgetisnull(head, 0, 2) && !parse_int(PQgetvalue(head, 0, 2), out.state.ceiling))
      return bad;
    out.server_now = std::chrono::microseconds(server_us);
    std::int64_t origin_ns = 0;
    if (PQgetisnull(head, 0, 3) || !parse_int(PQgetvalue(head, 0, 3), origin_ns)) return bad;
    out.origin = Nanos{origin_ns};
    out.state.nodes.resize(static_cast<std::size_t>(PQntuples(rows)));
    for (int i = 0; i < PQntuples(rows); ++i)
      if (!parse_node(rows, i, out.state.nodes[static_cast<std::size_t>(i)])) return bad;
    const auto by_id = [](const FleetNode& a, const FleetNode& b) { return a.id < b.id; };
    if (!std::is_sorted(out.state.nodes.begin(), out.state.nodes.end(), by_id))
      std::sort(out.state.nodes.begin(), out.state.nodes.end(), by_id);
    return out;
  }

  // Round trip 2: the reporter's row, the evicted rows, the generation; COMMIT.
  Status write_and_commit(Session& db, const std::string& k, const std::string& self,
                          const FleetState& state, const FleetNode& me,
                          const std::vector<std::string>& evicted) const {
    const std::string values =
        joined({k, self, std::to_string(me.l_local), std::to_string(me.in_flight),
                std::to_string(me.share), std::to_string(me.expires_at.count()),
                std::to_string(me.acked_generation), array_sql(me.unacked, true),
                array_sql(me.unacked, false), me.estimated ? "true" : "false",
                std::to_string(static_cast<std::int64_t>(me.instance))});
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
    return db.run(sql);
  }

  // The ids of `before` missing from `after` (both sorted), quoted.
  static StatusOr<std::vector<std::string>> evicted_ids(Session& db,
                                                        const std::vector<FleetNode>& before,
                                                        const std::vector<FleetNode>& after) {
    std::vector<std::string> out;
    auto it = after.begin();
    for (const FleetNode& n : before) {
      while (it != after.end() && it->id < n.id) ++it;
      if (it != after.end() && it->id == n.id) continue;
      auto q = db.literal(n.id, "node_id");
      if (!q.ok()) return q.status();
      out.push_back(std::move(q.value()));
    }
    return out;
  }

  StatusOr<Grant> heartbeat_locked(Session& db, std::string_view key,
                                   const NodeReport& report) const {
    if (Status s = db.connect(); !s.ok()) return s;
    auto k = db.literal(key, "key");
    if (!k.ok()) return k.status();
    auto self = db.literal(report.node_id, "node_id");
    if (!self.ok()) return self.status();
    auto loaded = lock_and_read(db, k.value());
    if (!loaded.ok()) return loaded.status();
    FleetState& state = loaded.value().state;
    const std::vector<FleetNode> before = state.nodes;
    const Nanos now = caller_clock != nullptr ? caller_clock->now() : loaded.value().server_now;
    if (std::string why = clash(state, report, now); !why.empty()) {
      db.rollback();
      return Status(StatusCode::kAlreadyExists, std::move(why));
    }
    const Grant g = sluice::heartbeat(state, report, now, config, loaded.value().origin);
    auto evicted = evicted_ids(db, before, state.nodes);
    if (!evicted.ok()) {
      db.rollback();
      return evicted.status();
    }
    const auto me = std::find_if(state.nodes.begin(), state.nodes.end(),
                                 [&](const FleetNode& n) { return n.id == report.node_id; });
    if (Status s = write_and_commit(db, k.value(), self.value(), state, *me, evicted.value());
        !s.ok())
      return s;
    return g;
  }

  Status leave_locked(Session& db, std::string_view key, std::string_view node_id,
                      std::uint64_t instance) const {
    if (Status s = db.connect(); !s.ok()) return s;
    auto k = db.literal(key, "key");
    if (!k.ok()) return k.status();
    auto id = db.literal(node_id, "node_id");
    if (!id.ok()) return id.status();
    std::string sql = db.begin();
    sql += "SELECT pg_advisory_xact_lock(hashtextextended(" + k.value() + ", 0));";
    sql +=
        "DELETE FROM " + nodes_table + " WHERE key = " + k.value() + " AND node_id = " + id.value();
    if (instance != 0)  // another instance's row stays (0: a row that does not say is anyone's)
      sql += " AND instance IN (0, " + std::to_string(static_cast<std::int64_t>(instance)) + ")";
    sql += ";";
    sql += "COMMIT;";
    return db.run(sql);
  }
};

PostgresCoordinator::PostgresCoordinator(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
PostgresCoordinator::~PostgresCoordinator() = default;

const CoordinatorConfig& PostgresCoordinator::config() const noexcept { return impl_->config; }

StatusOr<std::unique_ptr<PostgresCoordinator>> PostgresCoordinator::open(
    PostgresOptions options, CoordinatorConfig config, const Clock* caller_clock) {
  if (Status s = PgConnection::validate_prefix(options.table_prefix, kMaxPrefix); !s.ok()) return s;
  const auto budget = PgConnection::connect_budget(options.conninfo);
  if (!budget.ok()) return budget.status();
  auto impl = std::make_unique<Impl>(std::move(options), config, caller_clock, budget.value());
  return std::unique_ptr<PostgresCoordinator>(new PostgresCoordinator(std::move(impl)));
}

StatusOr<std::unique_ptr<PostgresCoordinator>> PostgresCoordinator::connect(
    PostgresOptions options, CoordinatorConfig config, const Clock* caller_clock) {
  auto c = open(std::move(options), config, caller_clock);
  if (!c.ok()) return c;
  Impl& m = *c.value()->impl_;
  const Status s = m.conn.connect(m.connect_budget);
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
  const Impl& m = *impl_;
  return impl_->conn.call(timeout,
                          [&](Session& db) { return m.heartbeat_locked(db, key, report); });
}

Status PostgresCoordinator::leave(std::string_view key, std::string_view node_id,
                                  std::uint64_t instance, Nanos timeout) noexcept {
  if (key.empty()) return Status(StatusCode::kInvalidArgument, "key must not be empty");
  if (node_id.empty()) return Status(StatusCode::kInvalidArgument, "node_id must not be empty");
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout must be > 0");
  const Impl& m = *impl_;
  return impl_->conn.call(timeout,
                          [&](Session& db) { return m.leave_locked(db, key, node_id, instance); });
}

}  // namespace sluice
