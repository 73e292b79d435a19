// probe.h (private): the throttler's samplers of the systems it protects, each a Probe that
// reads one number per host: replication lag and busy threads of MySQL/MariaDB replicas,
// replication lag and active backends of PostgreSQL, a numeric INFO field of Redis, a number
// from an HTTP URL, the host's load average, and a command's number.
//
// What it is: a Probe is called from one metric's sampling loop (never from a check): sample()
// fills one ThrottleSample per host, in the order the hosts were given, with a value or an
// error that says what went wrong ("replica: replication is not running (Slave_SQL_Running:
// No)"). It leaves taken_at and interval to the caller. A network probe keeps one connection
// per host between samples (connecting costs the database more than asking does) and drops it
// after a failure; the next sample reconnects. Every host's sample is bounded by `timeout`
// (connect and query); the hosts of one metric are sampled one after another, so a host that
// does not answer delays its metric's next sample by up to `timeout`, and no other metric's.
//
// The measurements (each host's number):
//   mysql_lag        SHOW REPLICA STATUS (SHOW SLAVE STATUS on servers without it):
//                    Seconds_Behind_Source / _Master. NULL (a replication thread stopped) and
//                    no row (not a replica) are errors, naming the threads' state.
//   mysql_heartbeat  now minus the newest `ts` of a pt-heartbeat table (`ts` written on the
//                    primary every interval as 'YYYY-MM-DDTHH:MM:SS.ffffff', UTC with
//                    heartbeat_utc, the server's local time without), read on the replica:
//                    the lag these tools trust, since it measures what arrived, end to end.
//   mysql_threads_running   SHOW GLOBAL STATUS 'Threads_running'.
//   postgres_lag     on a replica (pg_is_in_recovery()): 0 while everything received has been
//                    replayed (an idle primary sends nothing, so the last replayed transaction
//                    grows old without any lag), else now() minus the last replayed
//                    transaction's commit time; an error when its WAL receiver is not streaming.
//                    On a primary: the worst replay_lag of pg_stat_replication (NULL, nothing
//                    outstanding: 0); an error when no replica is streaming.
//   postgres_active  backends whose state is 'active', less the probe's own.
//   redis            an INFO field (connected_clients, used_memory, instantaneous_ops_per_sec,
//                    any field whose value is a number), or replica_offset_lag: on a primary,
//                    the worst master_repl_offset minus a replica's acknowledged offset (bytes);
//                    an error when no replica is connected.
//   http             GET of a URL (http:// only): a 2xx answer whose body starts with a number.
//   loadavg          the 1-minute load average (/proc/loadavg), host "self".
//   command          `/bin/sh -c command`: its output's first word, exit 0, within the timeout
//                    (then its process group is killed), host "self".
//
// Thread-safety: one thread samples a probe at a time (its metric's loop).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/clock.h"
#include "sluice/core/throttler.h"

namespace sluice::probes {

class Probe {
 public:
  virtual ~Probe() = default;
  // One sample per host, in order; `hosts` holds the previous samples (or nothing).
  virtual void sample(std::vector<ThrottleSample>& hosts) = 0;
  // Ends a sample in progress soon and fails every later one at once (the policy is retiring:
  // a reload replaced it, or the server stops). From any thread. Default: nothing (a sample
  // that only waits for its own timeout).
  virtual void cancel() noexcept {}
};

// A host to reach: "host:port" (an IPv6 address in brackets), the port defaulting per system.
struct Endpoint {
  std::string host;
  int port = 0;
  [[nodiscard]] std::string name() const;
};

enum class MysqlMeasure { kLag, kHeartbeat, kThreadsRunning };
struct MysqlProbeOptions {
  MysqlMeasure measure = MysqlMeasure::kLag;
  std::vector<Endpoint> hosts;
  std::string user;
  std::string password;
  std::string heartbeat_table = "meta.heartbeat";  // kHeartbeat: [db.]table
  bool heartbeat_utc = true;
  Nanos timeout = std::chrono::seconds(1);
};
// Why `table` cannot be a heartbeat table name ([db.]table of [A-Za-z0-9_$]); empty when it can.
[[nodiscard]] std::string heartbeat_table_error(const std::string& table);
[[nodiscard]] std::unique_ptr<Probe> mysql_probe(MysqlProbeOptions options);

enum class PostgresMeasure { kLag, kActive };
struct PostgresProbeOptions {
  PostgresMeasure measure = PostgresMeasure::kLag;
  std::vector<Endpoint> hosts;
  std::string conninfo;  // the rest of each host's libpq conninfo (user, dbname, sslmode, ...)
  Nanos timeout = std::chrono::seconds(1);
};
[[nodiscard]] std::unique_ptr<Probe> postgres_probe(PostgresProbeOptions options);

struct RedisProbeOptions {
  std::vector<Endpoint> hosts;
  std::string field = "connected_clients";  // an INFO field, or "replica_offset_lag"
  std::string username;
  std::string password;
  Nanos timeout = std::chrono::seconds(1);
};
[[nodiscard]] std::unique_ptr<Probe> redis_probe(RedisProbeOptions options);

struct HttpProbeOptions {
  std::string url;  // http://host[:port]/path
  Nanos timeout = std::chrono::seconds(1);
};
// Why `url` cannot be probed (http:// only, a host); empty when it can.
[[nodiscard]] std::string http_url_error(const std::string& url);
[[nodiscard]] std::unique_ptr<Probe> http_probe(HttpProbeOptions options);

[[nodiscard]] std::unique_ptr<Probe> loadavg_probe();
[[nodiscard]] std::unique_ptr<Probe> command_probe(std::string command, Nanos timeout);

// One sample per endpoint, in order, each from `measure(i, error)`: its value, or `error`.
void sample_each(std::vector<ThrottleSample>& hosts, const std::vector<Endpoint>& endpoints,
                 const std::function<std::optional<double>(std::size_t, std::string&)>& measure);

// The number a text starts with (leading blanks skipped, up to the next blank); false when
// it is not a finite number. `word` gets the first word (for the error).
bool leading_number(const std::string& text, double& value, std::string& word);

}  // namespace sluice::probes
