// PostgreSQL probes (probe.h): replication lag (replica or primary) and active backends, over
// the PostgreSQL backends' libpq connection, one per host kept between samples.
#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/postgres/pg_connection.h"
#include "backends/probes/probe.h"
#include "backends/probes/registry.h"

namespace sluice::probes {
namespace {

using postgres_detail::PgConnection;

// One statement for both roles. On a replica: the WAL receiver's status, whether everything
// received has been replayed, and seconds since the last replayed transaction committed. On a
// primary: how many replicas stream and their worst replay_lag in seconds.
constexpr const char* kLagSql =
    "SELECT pg_is_in_recovery(),"
    " CASE WHEN pg_is_in_recovery() THEN (SELECT status FROM pg_stat_wal_receiver) END,"
    " CASE WHEN pg_is_in_recovery() THEN"
    "   COALESCE(pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn(), false) END,"
    " CASE WHEN pg_is_in_recovery() THEN"
    "   EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END,"
    " CASE WHEN NOT pg_is_in_recovery() THEN"
    "   (SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming') END,"
    " CASE WHEN NOT pg_is_in_recovery() THEN"
    "   (SELECT COALESCE(max(EXTRACT(EPOCH FROM replay_lag)), 0) FROM pg_stat_replication"
    "    WHERE state = 'streaming') END";
constexpr const char* kActiveSql =
    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()";

std::optional<std::string> text(PGresult* r, int col) {
  if (PQntuples(r) < 1 || col >= PQnfields(r) || PQgetisnull(r, 0, col)) return std::nullopt;
  return std::string(PQgetvalue(r, 0, col));
}
std::optional<double> number(PGresult* r, int col) {
  const auto t = text(r, col);
  if (!t) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(t->data(), t->data() + t->size(), v);
  if (ec != std::errc{} || end != t->data() + t->size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A conninfo value, quoted as libpq reads one ('...' with \ and ' escaped).
std::string quoted(const std::string& v) {
  std::string out = "'";
  for (const char c : v) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}

class PostgresProbe final : public Probe {
 public:
  explicit PostgresProbe(PostgresProbeOptions options) : options_(std::move(options)) {
    for (const Endpoint& e : options_.hosts) {
      PostgresOptions o;
      // The host's own, after the user's: libpq takes the last of a repeated keyword.
      o.conninfo =
          options_.conninfo + " host=" + quoted(e.host) + " port=" + std::to_string(e.port);
      conns_.push_back(std::make_unique<PgConnection>(std::move(o), ""));
    }
  }

  void sample(std::vector<ThrottleSample>& hosts) override {
    sample_each(hosts, options_.hosts,
                [this](std::size_t i, std::string& error) { return measure(*conns_[i], error); });
  }

 private:
  std::optional<double> measure(PgConnection& conn, std::string& error) {
    const bool lag = options_.measure == PostgresMeasure::kLag;
    auto rs = conn.call(options_.timeout,
                        [&](PgConnection::Session& db) -> StatusOr<PgConnection::Results> {
                          if (Status c = db.connect(); !c.ok()) return c;
                          return db.query(lag ? kLagSql : kActiveSql);
                        });
    if (!rs.ok()) {
      error = rs.status().message();
      return std::nullopt;
    }
    if (rs.value().empty()) {
      error = "postgres: no result";
      return std::nullopt;
    }
    PGresult* r = rs.value().front().get();
    if (!lag) {
      const auto v = number(r, 0);
      if (!v) error = "postgres: pg_stat_activity gave no count";
      return v;
    }
    if (text(r, 0) == "t") {  // a replica
      const auto receiver = text(r, 1);
      if (receiver != "streaming") {
        error = "replica is not streaming from its primary (WAL receiver: " +
                receiver.value_or("none") + ")";
        return std::nullopt;
      }
      if (text(r, 2) == "t") return 0.0;  // everything received is replayed
      const auto since = number(r, 3);
      if (!since) {
        error = "replica has replayed no transaction yet (lag unknown)";
        return std::nullopt;
      }
      return std::max(0.0, *since);
    }
    const auto streaming = number(r, 4);
    if (!streaming || *streaming < 1) {
      error = "primary: no replica is streaming (pg_stat_replication)";
      return std::nullopt;
    }
    return number(r, 5).value_or(0.0);
  }

  const PostgresProbeOptions options_;
  std::vector<std::unique_ptr<PgConnection>> conns_;  // per host
};

}  // namespace

std::unique_ptr<Probe> postgres_probe(PostgresProbeOptions options) {
  return std::make_unique<PostgresProbe>(std::move(options));
}

void add_postgres_probes(ProbeRegistry& r) {
  const auto type = [](std::string name, PostgresMeasure measure) {
    return ProbeType{
        std::move(name),
        {"hosts", "conninfo", "password_env", "timeout"},
        [measure](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
          PostgresProbeOptions o;
          o.measure = measure;
          o.hosts = read_hosts(s, 5432);
          o.conninfo = s.str("conninfo").value_or("");
          if (o.conninfo.find("://") != std::string::npos)
            s.error("conninfo",
                    "must be keyword=value pairs (the hosts are added to it), not a URI");
          if (s.has("password_env")) {
            std::string p = read_password(s);
            std::string q = "'";
            for (const char ch : p)
              q += (ch == '\\' || ch == '\'') ? std::string{'\\', ch} : std::string{ch};
            o.conninfo += " password=" + q + "'";
          }
          o.timeout = c.timeout;
          return [o](const ProbeEnv&) { return postgres_probe(o); };
        }};
  };
  r.add(type("postgres_lag", PostgresMeasure::kLag));
  r.add(type("postgres_active", PostgresMeasure::kActive));
}

}  // namespace sluice::probes
