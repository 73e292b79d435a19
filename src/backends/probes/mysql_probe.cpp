// MySQL/MariaDB probes (probe.h): replication lag, heartbeat lag and Threads_running, over
// libmariadb, one connection per host kept between samples.
#include <mysql.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/probes/probe.h"

namespace sluice::probes {

std::string heartbeat_table_error(const std::string& table) {
  const auto part_ok = [](std::string_view p) {
    return !p.empty() && p.size() <= 64 && std::all_of(p.begin(), p.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || c == '$';
    });
  };
  const auto dot = table.find('.');
  const bool ok = dot == std::string::npos ? part_ok(table)
                                           : part_ok(std::string_view(table).substr(0, dot)) &&
                                                 part_ok(std::string_view(table).substr(dot + 1));
  return ok ? "" : "must be [database.]table, each of letters, digits, '_' or '$'";
}

namespace {

constexpr unsigned kErParseError = 1064;

struct MysqlCloser {
  void operator()(MYSQL* m) const noexcept { mysql_close(m); }
};
struct ResultFreer {
  void operator()(MYSQL_RES* r) const noexcept { mysql_free_result(r); }
};
using Conn = std::unique_ptr<MYSQL, MysqlCloser>;
using Result = std::unique_ptr<MYSQL_RES, ResultFreer>;

// libmariadb's global state, set up once before the first connection of any thread.
void library_init() {
  static std::once_flag once;
  std::call_once(once, [] { mysql_library_init(0, nullptr, nullptr); });
}

std::optional<double> number(const char* text) {
  if (text == nullptr) return std::nullopt;
  const std::string_view s(text);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A result's rows as text (NULL: nullopt), with its column names.
struct Rows {
  std::vector<std::string> columns;
  std::vector<std::vector<std::optional<std::string>>> rows;
  // Column `name` (or its other name) of `row`; nullopt when absent or NULL.
  [[nodiscard]] std::optional<std::string> at(std::size_t row, std::string_view name,
                                              std::string_view other = {}) const {
    for (std::size_t i = 0; i < columns.size(); ++i)
      if (columns[i] == name || (!other.empty() && columns[i] == other)) return rows[row][i];
    return std::nullopt;
  }
};

class MysqlProbe final : public Probe {
 public:
  explicit MysqlProbe(MysqlProbeOptions options)
      : options_(std::move(options)), conns_(options_.hosts.size()) {
    library_init();
    // [db.]table, each part in backquotes (heartbeat_table_error() allows no backquote).
    std::string quoted = "`";
    for (const char c : options_.heartbeat_table) {
      if (c == '.') {
        quoted.append("`.`");
      } else {
        quoted.push_back(c);
      }
    }
    quoted.push_back('`');
    // Microseconds from the newest heartbeat to now; pt-heartbeat writes ts as
    // 'YYYY-MM-DDTHH:MM:SS.ffffff' (UTC with --utc).
    heartbeat_sql_ =
        "SELECT TIMESTAMPDIFF(MICROSECOND, STR_TO_DATE(REPLACE(MAX(ts), 'T', ' '), "
        "'%Y-%m-%d %H:%i:%s.%f'), ";
    heartbeat_sql_.append(options_.heartbeat_utc ? "UTC_TIMESTAMP(6)" : "NOW(6)");
    heartbeat_sql_.append(") FROM ");
    heartbeat_sql_.append(quoted);
  }

  void sample(std::vector<ThrottleSample>& hosts) override {
    sample_each(hosts, options_.hosts, [this](std::size_t i, std::string& error) {
      std::optional<double> v = measure(i, error);
      if (!v) conns_[i].reset();  // reconnect next time
      return v;
    });
  }

 private:
  std::optional<double> measure(std::size_t i, std::string& error) {
    if (!conns_[i] && !connect(i, error)) return std::nullopt;
    MYSQL* m = conns_[i].get();
    switch (options_.measure) {
      case MysqlMeasure::kLag:
        return lag(m, error);
      case MysqlMeasure::kHeartbeat: {
        auto rows = query(m, heartbeat_sql_, error);
        if (!rows) return std::nullopt;
        const auto us = rows->rows.empty()
                            ? std::nullopt
                            : number(rows->rows[0][0] ? rows->rows[0][0]->c_str() : nullptr);
        if (!us) {
          error = "no heartbeat in " + options_.heartbeat_table +
                  " (no row, or ts not 'YYYY-MM-DDTHH:MM:SS.ffffff')";
          return std::nullopt;
        }
        return std::max(0.0, *us / 1e6);  // a primary's clock ahead of the replica's: 0
      }
      case MysqlMeasure::kThreadsRunning: {
        auto rows = query(m, "SHOW GLOBAL STATUS LIKE 'Threads_running'", error);
        if (!rows) return std::nullopt;
        const auto v = rows->rows.empty() || rows->columns.size() < 2
                           ? std::nullopt
                           : number(rows->rows[0][1] ? rows->rows[0][1]->c_str() : nullptr);
        if (!v) error = "SHOW GLOBAL STATUS has no number for Threads_running";
        return v;
      }
    }
    return std::nullopt;
  }

  // Seconds_Behind_Source (or _Master); the worst of several channels.
  std::optional<double> lag(MYSQL* m, std::string& error) {
    std::optional<Rows> rows;
    if (!legacy_syntax_) {
      rows = query(m, "SHOW REPLICA STATUS", error);
      if (!rows && mysql_errno(m) == kErParseError) {
        legacy_syntax_ = true;  // a server older than the REPLICA spelling
        error.clear();
      } else if (!rows) {
        return std::nullopt;
      }
    }
    if (legacy_syntax_) rows = query(m, "SHOW SLAVE STATUS", error);
    if (!rows) return std::nullopt;
    if (rows->rows.empty()) {
      error = "not a replica (SHOW REPLICA STATUS has no row)";
      return std::nullopt;
    }
    double worst = 0;
    for (std::size_t r = 0; r < rows->rows.size(); ++r) {
      const auto seconds = rows->at(r, "Seconds_Behind_Source", "Seconds_Behind_Master");
      const auto v = seconds ? number(seconds->c_str()) : std::nullopt;
      if (!v) {
        const auto io = rows->at(r, "Replica_IO_Running", "Slave_IO_Running").value_or("?");
        const auto sql = rows->at(r, "Replica_SQL_Running", "Slave_SQL_Running").value_or("?");
        std::string last = rows->at(r, "Last_SQL_Error").value_or("");
        if (last.empty()) last = rows->at(r, "Last_IO_Error").value_or("");
        error = "replication is not running (lag unknown: IO thread " + io + ", SQL thread " + sql +
                (last.empty() ? "" : "; " + last.substr(0, 200)) + ")";
        return std::nullopt;
      }
      worst = std::max(worst, *v);
    }
    return worst;
  }

  bool connect(std::size_t i, std::string& error) {
    Conn c(mysql_init(nullptr));
    if (!c) {
      error = "mysql_init: out of memory";
      return false;
    }
    const auto secs = static_cast<unsigned>(std::max<std::int64_t>(
        1, std::chrono::ceil<std::chrono::seconds>(options_.timeout).count()));
    const unsigned tcp = MYSQL_PROTOCOL_TCP;
    mysql_options(c.get(), MYSQL_OPT_CONNECT_TIMEOUT, &secs);
    mysql_options(c.get(), MYSQL_OPT_READ_TIMEOUT, &secs);
    mysql_options(c.get(), MYSQL_OPT_WRITE_TIMEOUT, &secs);
    mysql_options(c.get(), MYSQL_OPT_PROTOCOL, &tcp);
    const Endpoint& e = options_.hosts[i];
    if (mysql_real_connect(c.get(), e.host.c_str(), options_.user.c_str(),
                           options_.password.empty() ? nullptr : options_.password.c_str(), nullptr,
                           static_cast<unsigned>(e.port), nullptr, 0) == nullptr) {
      error = "cannot connect: " + std::string(mysql_error(c.get()));
      return false;
    }
    conns_[i] = std::move(c);
    return true;
  }

  static std::optional<Rows> query(MYSQL* m, const std::string& sql, std::string& error) {
    if (mysql_real_query(m, sql.data(), sql.size()) != 0) {
      error = std::string(mysql_error(m));
      return std::nullopt;
    }
    Result res(mysql_store_result(m));
    if (!res) {
      error = mysql_field_count(m) == 0 ? "the query returned no result set"
                                        : std::string(mysql_error(m));
      return std::nullopt;
    }
    Rows out;
    const unsigned n = mysql_num_fields(res.get());
    const MYSQL_FIELD* fields = mysql_fetch_fields(res.get());
    for (unsigned f = 0; f < n; ++f) out.columns.emplace_back(fields[f].name);
    while (MYSQL_ROW row = mysql_fetch_row(res.get())) {
      auto& r = out.rows.emplace_back();
      for (unsigned f = 0; f < n; ++f)
        r.push_back(row[f] ? std::optional<std::string>(row[f]) : std::nullopt);
    }
    return out;
  }

  const MysqlProbeOptions options_;
  std::string heartbeat_sql_;
  std::vector<Conn> conns_;     // per host; null: reconnect
  bool legacy_syntax_ = false;  // SHOW SLAVE STATUS (the server has no SHOW REPLICA STATUS)
};

}  // namespace

std::unique_ptr<Probe> mysql_probe(MysqlProbeOptions options) {
  return std::make_unique<MysqlProbe>(std::move(options));
}

}  // namespace sluice::probes
