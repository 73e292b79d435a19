// The PostgreSQL shared rate store: a batch of calls in one transaction, two round trips.
//
//   1. BEGIN; SET LOCAL timeouts and synchronous_commit; pg_advisory_xact_lock on each key's lock
//      id (ascending: every process takes them in one order); the origin row (inserted when there
//      is none, moved to now on another timeline); the clock and the origin; the keys' rows;
//   2. (after sluice::apply ran each call in order) the changed rows upserted, a sweep of idle
//      rows when it is time; COMMIT.
//
// Numbers that may not fit a bigint (counts are uint64, a GCRA state 128 bits) are numeric
// columns; times are bigint ns.
#include "sluice/backends/postgres_shared_rate.h"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <system_error>
#include <vector>

#include "backends/postgres/pg_connection.h"

namespace sluice {
namespace {

using postgres_detail::kTimelineSql;
using postgres_detail::PgConnection;
using Session = PgConnection::Session;

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

constexpr const char* kDefaultPrefix = "sluice_rate";
constexpr Nanos kConnectTimeout = std::chrono::seconds(10);
constexpr Nanos kSweepEvery = std::chrono::seconds(10);
constexpr int kSweepBatch = 1000;

std::string text_of(i128 v) {
  if (v == 0) return "0";
  const bool negative = v < 0;
  // Digit by digit from the low end, on the magnitude as unsigned (the lowest value included).
  u128 m = negative ? static_cast<u128>(-(v + 1)) + 1 : static_cast<u128>(v);
  std::string out;
  while (m != 0) {
    out.push_back(static_cast<char>('0' + static_cast<int>(m % 10)));
    m /= 10;
  }
  if (negative) out.push_back('-');
  std::reverse(out.begin(), out.end());
  return out;
}

bool parse_i128(const char* s, i128& out) {
  const bool negative = *s == '-';
  if (negative) ++s;
  if (*s == '\0') return false;
  u128 m = 0;
  for (; *s != '\0'; ++s) {
    if (*s < '0' || *s > '9') return false;
    const u128 next = m * 10 + static_cast<unsigned>(*s - '0');
    if (next / 10 != m) return false;  // overflow
    m = next;
  }
  const u128 limit = static_cast<u128>(1) << 127;
  if (m > (negative ? limit : limit - 1)) return false;
  out = negative ? -static_cast<i128>(m - 1) - 1 : static_cast<i128>(m);
  return true;
}

template <typename T>
bool parse_int(const char* s, T& out) {
  const char* end = s + std::strlen(s);
  const auto [p, ec] = std::from_chars(s, end, out);
  return ec == std::errc{} && p == end;
}

// The row's name: a rule of another strategy or period never shares a key's state (the suffix
// has no '|', so the name is one (key, strategy, period) only).
std::string state_key(std::string_view key, const RateRule& rule) {
  std::string out(key);
  out += '|';
  out += to_string(rule.strategy);
  out += '/';
  out += std::to_string(rule.period.count());
  return out;
}

// The advisory lock id of a row: FNV-1a, 64 bits, of "<prefix>:<name>".
std::int64_t lock_id(const std::string& prefix, const std::string& name) {
  std::uint64_t h = 14695981039346656037ull;
  const auto mix = [&](std::string_view s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
  };
  mix(prefix);
  mix(":");
  mix(name);
  return static_cast<std::int64_t>(h);
}

// The state's numbers as the row keeps them: (a, b, c) by strategy.
void to_columns(const SharedRateState& s, RateStrategy strategy, i128 (&v)[3]) {
  switch (strategy) {
    case RateStrategy::kFixedWindow:
      v[0] = s.fixed.window_start, v[1] = s.fixed.count, v[2] = 0;
      return;
    case RateStrategy::kSlidingWindow:
      v[0] = s.sliding.window_start, v[1] = s.sliding.current, v[2] = s.sliding.previous;
      return;
    case RateStrategy::kGcra:
      v[0] = s.gcra.tat_scaled, v[1] = 0, v[2] = 0;
      return;
  }
}

bool from_columns(const i128 (&v)[3], RateStrategy strategy, SharedRateState& s) {
  const auto u64 = [](i128 x, std::uint64_t& out) {
    if (x < 0 || x > static_cast<i128>(UINT64_MAX)) return false;
    out = static_cast<std::uint64_t>(x);
    return true;
  };
  const auto i64 = [](i128 x, std::int64_t& out) {
    if (x < INT64_MIN || x > INT64_MAX) return false;
    out = static_cast<std::int64_t>(x);
    return true;
  };
  switch (strategy) {
    case RateStrategy::kFixedWindow:
      return i64(v[0], s.fixed.window_start) && u64(v[1], s.fixed.count);
    case RateStrategy::kSlidingWindow:
      return i64(v[0], s.sliding.window_start) && u64(v[1], s.sliding.current) &&
             u64(v[2], s.sliding.previous);
    case RateStrategy::kGcra:
      s.gcra.tat_scaled = v[0];
      return true;
  }
  return false;
}

std::string setup_sql(const std::string& state_table, const std::string& origin_table) {
  return "CREATE TABLE IF NOT EXISTS " + state_table +
         " (key text PRIMARY KEY, lim numeric NOT NULL, written_ns bigint NOT NULL,"
         " a numeric NOT NULL, b numeric NOT NULL, c numeric NOT NULL,"
         " idle_after bigint NOT NULL);"
         "CREATE INDEX IF NOT EXISTS " +
         state_table + "_idle ON " + state_table +
         " (idle_after);"
         "CREATE TABLE IF NOT EXISTS " +
         origin_table +
         " (id int PRIMARY KEY CHECK (id = 1), origin_ns bigint NOT NULL, timeline text);";
}

// One row in hand during a batch.
struct InHand {
  RateRule rule;  // the last call's (its strategy and period are the row's)
  SharedRateState state;
  bool changed = false;
};

}  // namespace

struct PostgresSharedRate::Impl {
  Impl(PostgresOptions o, const Clock* clock)
      : state_table(o.table_prefix + "_state"),
        origin_table(o.table_prefix + "_origin"),
        prefix(o.table_prefix),
        caller_clock(clock),
        conn(std::move(o), setup_sql(state_table, origin_table)) {}

  const std::string state_table, origin_table, prefix;
  const Clock* const caller_clock;
  PgConnection conn;
  std::int64_t last_sweep = INT64_MIN;  // guarded by conn

  std::string now_sql() const {
    if (caller_clock != nullptr) return std::to_string(caller_clock->now().count());
    return "((extract(epoch FROM clock_timestamp()) * 1e6)::bigint * 1000)";
  }

  // The calls `sent` of `calls` (each valid), as one transaction; their replies into `out`.
  Status run(Session& db, std::span<const SharedRateCall> calls,
             const std::vector<std::size_t>& sent, std::vector<StatusOr<SharedRateReply>>& out) {
    if (Status s = db.connect(); !s.ok()) return s;
    std::map<std::string, InHand> rows;  // by name
    std::vector<std::string> names(sent.size());
    std::string list;  // the rows' names as SQL literals
    std::vector<std::int64_t> locks;
    for (std::size_t i = 0; i < sent.size(); ++i) {
      const SharedRateCall& c = calls[sent[i]];
      names[i] = state_key(c.key, c.request->rule);
      if (rows.count(names[i]) != 0) continue;
      auto lit = db.literal(names[i], "key");
      if (!lit.ok()) return lit.status();
      list += (list.empty() ? "" : ", ") + lit.value();
      rows[names[i]].rule = c.request->rule;
      locks.push_back(lock_id(prefix, names[i]));
    }
    std::sort(locks.begin(), locks.end());
    locks.erase(std::unique(locks.begin(), locks.end()), locks.end());
    std::string sql = db.begin();
    sql += "SET LOCAL synchronous_commit = on;";
    for (std::int64_t id : locks)
      sql += "SELECT pg_advisory_xact_lock(" + std::to_string(id) + ");";
    sql += "INSERT INTO " + origin_table + " AS o (id, origin_ns, timeline) VALUES (1, " +
           now_sql() + ", " + kTimelineSql +
           ") ON CONFLICT (id) DO UPDATE SET origin_ns = EXCLUDED.origin_ns,"
           " timeline = EXCLUDED.timeline WHERE o.timeline IS DISTINCT FROM EXCLUDED.timeline;";
    sql += "SELECT " + now_sql() + ", (SELECT origin_ns FROM " + origin_table + " WHERE id = 1);";
    sql += "SELECT key, lim, written_ns, a, b, c FROM " + state_table + " WHERE key IN (" + list +
           ");";
    auto rs = db.query(sql);
    if (!rs.ok()) return rs.status();
    const Status bad(StatusCode::kInternal, "postgres: unexpected rows in the shared rate tables");
    const auto& results = rs.value();
    if (results.size() < 2) {
      db.rollback();
      return bad;
    }
    const PGresult* head = results[results.size() - 2].get();
    const PGresult* found = results.back().get();
    std::int64_t now = 0, origin = 0;
    if (PQntuples(head) != 1 || PQnfields(head) != 2 || PQnfields(found) != 6 ||
        !parse_int(PQgetvalue(head, 0, 0), now) || PQgetisnull(head, 0, 1) ||
        !parse_int(PQgetvalue(head, 0, 1), origin)) {
      db.rollback();
      return bad;
    }
    for (int r = 0; r < PQntuples(found); ++r) {
      auto it = rows.find(PQgetvalue(found, r, 0));
      i128 v[3] = {0, 0, 0};
      std::uint64_t lim = 0;
      std::int64_t written = 0;
      if (it == rows.end() || !parse_int(PQgetvalue(found, r, 1), lim) ||
          !parse_int(PQgetvalue(found, r, 2), written) ||
          !parse_i128(PQgetvalue(found, r, 3), v[0]) ||
          !parse_i128(PQgetvalue(found, r, 4), v[1]) ||
          !parse_i128(PQgetvalue(found, r, 5), v[2]) ||
          !from_columns(v, it->second.rule.strategy, it->second.state)) {
        db.rollback();
        return bad;
      }
      it->second.state.limit = lim;
      it->second.state.written = written;
    }
    for (std::size_t i = 0; i < sent.size(); ++i) {
      InHand& h = rows[names[i]];
      bool changed = false;
      const SharedRateRequest& request = *calls[sent[i]].request;
      out[sent[i]] = sluice::apply(h.state, request, Nanos{now}, Nanos{origin}, &changed);
      h.changed = h.changed || changed;
      h.rule = request.rule;
    }
    return write_and_commit(db, rows, now);
  }

  Status write_and_commit(Session& db, const std::map<std::string, InHand>& rows,
                          std::int64_t now) {
    std::string sql, values;
    for (const auto& [name, h] : rows) {
      if (!h.changed) continue;
      auto lit = db.literal(name, "key");
      if (!lit.ok()) {
        db.rollback();
        return lit.status();
      }
      i128 v[3] = {0, 0, 0};
      to_columns(h.state, h.rule.strategy, v);
      // Kept until it decides like a fresh key (past idle_within(rule) when charged past its
      // limit), and never swept before its last write.
      const std::int64_t idle_after = std::max(idle_at(h.state, h.rule).count(), h.state.written);
      values += (values.empty() ? "(" : ", (") + lit.value() + ", " +
                std::to_string(h.state.limit) + ", " + std::to_string(h.state.written) + ", " +
                text_of(v[0]) + ", " + text_of(v[1]) + ", " + text_of(v[2]) + ", " +
                std::to_string(idle_after) + ")";
    }
    if (!values.empty())
      sql += "INSERT INTO " + state_table + " (key, lim, written_ns, a, b, c, idle_after) VALUES " +
             values +
             " ON CONFLICT (key) DO UPDATE SET lim = EXCLUDED.lim,"
             " written_ns = EXCLUDED.written_ns, a = EXCLUDED.a, b = EXCLUDED.b, c = EXCLUDED.c,"
             " idle_after = EXCLUDED.idle_after;";
    if (last_sweep == INT64_MIN || now - last_sweep >= kSweepEvery.count()) {
      sql += "DELETE FROM " + state_table + " WHERE key IN (SELECT key FROM " + state_table +
             " WHERE idle_after < " + std::to_string(now) + " ORDER BY idle_after LIMIT " +
             std::to_string(kSweepBatch) + " FOR UPDATE SKIP LOCKED);";
      last_sweep = now;
    }
    sql += "COMMIT;";
    return db.run(sql);
  }
};

PostgresSharedRate::PostgresSharedRate(std::unique_ptr<Impl> impl) noexcept
    : impl_(std::move(impl)) {}
PostgresSharedRate::~PostgresSharedRate() = default;

PostgresOptions PostgresSharedRate::default_options() {
  PostgresOptions o;
  o.table_prefix = kDefaultPrefix;
  return o;
}

StatusOr<std::unique_ptr<PostgresSharedRate>> PostgresSharedRate::open(PostgresOptions options,
                                                                       const Clock* caller_clock) {
  if (Status s = PgConnection::validate_prefix(options.table_prefix, kMaxPrefix); !s.ok()) return s;
  if (const auto budget = PgConnection::connect_budget(options.conninfo); !budget.ok())
    return budget.status();
  return std::unique_ptr<PostgresSharedRate>(
      new PostgresSharedRate(std::make_unique<Impl>(std::move(options), caller_clock)));
}

StatusOr<std::unique_ptr<PostgresSharedRate>> PostgresSharedRate::connect(
    PostgresOptions options, const Clock* caller_clock) {
  auto s = open(std::move(options), caller_clock);
  if (!s.ok()) return s;
  if (Status st = s.value()->impl_->conn.connect(kConnectTimeout); !st.ok()) return st;
  return s;
}

StatusOr<SharedRateReply> PostgresSharedRate::apply(std::string_view key,
                                                    const SharedRateRequest& request,
                                                    Nanos timeout) noexcept {
  const SharedRateCall call{key, &request};
  std::vector<StatusOr<SharedRateReply>> out = apply_many({&call, 1}, timeout);
  if (out.empty()) return Status(StatusCode::kResourceExhausted, "postgres: out of memory");
  return std::move(out.front());
}

std::vector<StatusOr<SharedRateReply>> PostgresSharedRate::apply_many(
    std::span<const SharedRateCall> calls, Nanos timeout) noexcept {
  std::vector<StatusOr<SharedRateReply>> out;
  try {
    out.reserve(calls.size());
    std::vector<std::size_t> sent;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      Status bad;
      if (timeout <= Nanos{0})
        bad = Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
      else if (calls[i].key.empty())
        bad = Status(StatusCode::kInvalidArgument, "key: must not be empty");
      else if (calls[i].key.find('\0') != std::string_view::npos)
        bad = Status(StatusCode::kInvalidArgument, "key: must not contain NUL");
      else if (std::string why = calls[i].request->rule.validate(); !why.empty())
        bad = Status(StatusCode::kInvalidArgument, std::move(why));
      out.emplace_back(bad.ok() ? Status(StatusCode::kInternal, "postgres: no reply") : bad);
      if (bad.ok()) sent.push_back(i);
    }
    if (sent.empty()) return out;
    Impl& m = *impl_;
    const Status s =
        m.conn.call(timeout, [&](Session& db) -> Status { return m.run(db, calls, sent, out); });
    if (!s.ok())
      for (std::size_t i : sent) out[i] = s;
  } catch (...) {
    out.clear();
  }
  return out;
}

Status PostgresSharedRate::adopt(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  Impl& m = *impl_;
  return m.conn.call(timeout, [&](Session& db) -> Status {
    if (Status s = db.connect(); !s.ok()) return s;
    return db.run(db.begin() + "INSERT INTO " + m.origin_table +
                  " (id, origin_ns, timeline) VALUES (1, 0, " + kTimelineSql +
                  ") ON CONFLICT (id) DO UPDATE SET origin_ns = 0,"
                  " timeline = EXCLUDED.timeline; COMMIT;");
  });
}

Status PostgresSharedRate::health(Nanos timeout) noexcept {
  if (timeout <= Nanos{0}) return Status(StatusCode::kInvalidArgument, "timeout: must be > 0");
  return impl_->conn.call(timeout, [](Session& db) -> Status {
    if (Status s = db.connect(); !s.ok()) return s;
    return db.query("SELECT 1").status();
  });
}

}  // namespace sluice
