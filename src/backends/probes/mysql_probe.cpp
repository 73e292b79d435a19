// MySQL/MariaDB probes (probe.h): replication lag, heartbeat lag and Threads_running, over
// libmariadb, one connection per host kept between samples.
//
// A host's sample (connect when needed, then its queries) is bounded by `timeout` as a whole:
// every call runs through libmariadb's non-blocking API (mysql_real_connect_start and _cont,
// and the same for the query and its result), each wait a poll() of the connection's socket
// against the sample's deadline. A call that reaches the deadline is abandoned and the
// connection closed (the next sample reconnects), as the library allows in the middle of a
// non-blocking call. (The blocking API's timeouts are whole seconds per phase: 200 ms would
// have meant a second or more.) Resolving a host name is the one step outside the bound: the
// library does it before its first wait.
#include <mysql.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/call_gate.h"
#include "backends/probes/probe.h"
#include "backends/probes/registry.h"

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

using backend_detail::mono_now;

// Runs one call of the non-blocking API to its end or to `deadline`, whichever comes first:
// `start()` begins it, `resume(events)` goes on after the events it waited for. True when it
// ended (its own result tells how); false at the deadline, the call left in the middle.
template <class Start, class Resume>
bool finish_by(MYSQL* m, Nanos deadline, Start start, Resume resume) {
  int wait = start();
  while (wait != 0) {
    const Nanos left = deadline - mono_now();
    if (left <= Nanos{0}) return false;
    pollfd p{mysql_get_socket(m), 0, 0};
    if ((wait & MYSQL_WAIT_READ) != 0) p.events |= POLLIN;
    if ((wait & MYSQL_WAIT_WRITE) != 0) p.events |= POLLOUT;
    if ((wait & MYSQL_WAIT_EXCEPT) != 0) p.events |= POLLPRI;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    int timeout_ms = static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
    // The library's own timeout (none is set here, so it asks for none; honoured if it does).
    bool library_timeout = false;
    if ((wait & MYSQL_WAIT_TIMEOUT) != 0) {
      const unsigned own = mysql_get_timeout_value_ms(m);
      if (own <= static_cast<unsigned>(timeout_ms)) {
        timeout_ms = static_cast<int>(own);
        library_timeout = true;
      }
    }
    const int n = poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    int events = 0;
    if (n < 0) {
      events = wait & (MYSQL_WAIT_READ | MYSQL_WAIT_WRITE);  // the call finds the error itself
    } else if (n == 0) {
      if (!library_timeout) continue;  // the deadline, checked above
      events = MYSQL_WAIT_TIMEOUT;
    } else {
      if ((p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) events |= MYSQL_WAIT_READ;
      if ((p.revents & (POLLOUT | POLLHUP | POLLERR)) != 0) events |= MYSQL_WAIT_WRITE;
      if ((p.revents & POLLPRI) != 0) events |= MYSQL_WAIT_EXCEPT;
      events &= wait | MYSQL_WAIT_EXCEPT;
    }
    wait = resume(events);
  }
  return true;
}

// "no answer within 200 ms (the timeout)".
std::string no_answer(Nanos timeout) {
  return "no answer within " +
         std::to_string(std::chrono::ceil<std::chrono::milliseconds>(timeout).count()) +
         " ms (the timeout)";
}

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
  // Host i's number, within the timeout from now (connecting first when needed).
  std::optional<double> measure(std::size_t i, std::string& error) {
    const Nanos deadline = backend_detail::deadline_after(options_.timeout);
    if (!conns_[i] && !connect(i, deadline, error)) return std::nullopt;
    MYSQL* m = conns_[i].get();
    switch (options_.measure) {
      case MysqlMeasure::kLag:
        return lag(m, deadline, error);
      case MysqlMeasure::kHeartbeat: {
        auto rows = query(m, heartbeat_sql_, deadline, error);
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
        auto rows = query(m, "SHOW GLOBAL STATUS LIKE 'Threads_running'", deadline, error);
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
  std::optional<double> lag(MYSQL* m, Nanos deadline, std::string& error) {
    std::optional<Rows> rows;
    if (!legacy_syntax_) {
      rows = query(m, "SHOW REPLICA STATUS", deadline, error);
      if (!rows && mysql_errno(m) == kErParseError) {
        legacy_syntax_ = true;  // a server older than the REPLICA spelling
        error.clear();
      } else if (!rows) {
        return std::nullopt;
      }
    }
    if (legacy_syntax_) rows = query(m, "SHOW SLAVE STATUS", deadline, error);
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

  bool connect(std::size_t i, Nanos deadline, std::string& error) {
    Conn c(mysql_init(nullptr));
    if (!c) {
      error = "mysql_init: out of memory";
      return false;
    }
    const unsigned tcp = MYSQL_PROTOCOL_TCP;
    mysql_options(c.get(), MYSQL_OPT_NONBLOCK, nullptr);  // the default stack for its calls
    mysql_options(c.get(), MYSQL_OPT_PROTOCOL, &tcp);
    const Endpoint& e = options_.hosts[i];
    const char* password = options_.password.empty() ? nullptr : options_.password.c_str();
    MYSQL* m = c.get();
    MYSQL* connected = nullptr;
    const bool ended = finish_by(
        m, deadline,
        [&] {
          return mysql_real_connect_start(&connected, m, e.host.c_str(), options_.user.c_str(),
                                          password, nullptr, static_cast<unsigned>(e.port), nullptr,
                                          0);
        },
        [&](int events) { return mysql_real_connect_cont(&connected, m, events); });
    if (!ended || connected == nullptr) {
      error =
          "cannot connect: " + (ended ? std::string(mysql_error(m)) : no_answer(options_.timeout));
      return false;
    }
    conns_[i] = std::move(c);
    return true;
  }

  std::optional<Rows> query(MYSQL* m, const std::string& sql, Nanos deadline,
                            std::string& error) const {
    int failed = 0;
    if (!finish_by(
            m, deadline, [&] { return mysql_real_query_start(&failed, m, sql.data(), sql.size()); },
            [&](int events) { return mysql_real_query_cont(&failed, m, events); })) {
      error = no_answer(options_.timeout);
      return std::nullopt;
    }
    if (failed != 0) {
      error = std::string(mysql_error(m));
      return std::nullopt;
    }
    MYSQL_RES* stored = nullptr;
    if (!finish_by(
            m, deadline, [&] { return mysql_store_result_start(&stored, m); },
            [&](int events) { return mysql_store_result_cont(&stored, m, events); })) {
      error = no_answer(options_.timeout);
      return std::nullopt;
    }
    Result res(stored);  // every row in memory: reading them does no I/O
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

void add_mysql_probes(ProbeRegistry& r) {
  const auto type = [](std::string name, MysqlMeasure measure,
                       std::vector<std::string_view> settings) {
    return ProbeType{std::move(name), std::move(settings),
                     [measure](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
                       MysqlProbeOptions o;
                       o.measure = measure;
                       o.hosts = read_hosts(s, 3306);
                       o.user = s.str("user", true).value_or("");
                       o.password = read_password(s);
                       o.timeout = c.timeout;
                       if (auto t = s.str("heartbeat_table")) {
                         if (std::string error = heartbeat_table_error(*t); !error.empty())
                           s.error("heartbeat_table", error);
                         o.heartbeat_table = *t;
                       }
                       if (auto u = s.boolean("heartbeat_utc")) o.heartbeat_utc = *u;
                       return [o](const ProbeEnv&) { return mysql_probe(o); };
                     }};
  };
  r.add(type("mysql_lag", MysqlMeasure::kLag,
             {"hosts", "user", "password", "password_env", "timeout"}));
  r.add(type("mysql_heartbeat", MysqlMeasure::kHeartbeat,
             {"hosts", "user", "password", "password_env", "timeout", "heartbeat_table",
              "heartbeat_utc"}));
  r.add(type("mysql_threads_running", MysqlMeasure::kThreadsRunning,
             {"hosts", "user", "password", "password_env", "timeout"}));
}

}  // namespace sluice::probes
