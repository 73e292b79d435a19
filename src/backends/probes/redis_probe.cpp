// The Redis probe (probe.h): a numeric INFO field, or a primary's worst replica offset lag, over
// the Redis backends' hiredis connection, one per host kept between samples.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/probes/probe.h"
#include "backends/probes/registry.h"
#include "backends/redis/redis_connection.h"

namespace sluice::probes {
namespace {

using redis_detail::RedisConnection;

std::optional<double> number(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

// INFO's "field:value" lines (sections and comments skipped).
std::map<std::string, std::string, std::less<>> info_fields(std::string_view text) {
  std::map<std::string, std::string, std::less<>> out;
  while (!text.empty()) {
    const auto eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const auto colon = line.find(':');
    if (line.empty() || line.front() == '#' || colon == std::string_view::npos) continue;
    out.emplace(std::string(line.substr(0, colon)), std::string(line.substr(colon + 1)));
  }
  return out;
}

// A replica line of INFO replication ("ip=..,port=..,state=online,offset=N,lag=0"): its offset.
std::optional<double> replica_offset(std::string_view line) {
  for (std::string_view rest = line; !rest.empty();) {
    const auto comma = rest.find(',');
    const std::string_view kv = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (kv.substr(0, 7) == "offset=") return number(kv.substr(7));
  }
  return std::nullopt;
}

class RedisProbe final : public Probe {
 public:
  explicit RedisProbe(RedisProbeOptions options) : options_(std::move(options)) {
    for (const Endpoint& e : options_.hosts) {
      RedisOptions o;
      o.host = e.host;
      o.port = e.port;
      o.username = options_.username;
      o.password = options_.password;
      o.connect_timeout = options_.timeout;
      conns_.push_back(
          std::make_unique<RedisConnection>(std::move(o), std::vector<RedisConnection::Script>{}));
    }
    offset_lag_ = options_.field == "replica_offset_lag";
  }

  void sample(std::vector<ThrottleSample>& hosts) override {
    sample_each(hosts, options_.hosts,
                [this](std::size_t i, std::string& error) { return measure(*conns_[i], error); });
  }

 private:
  std::optional<double> measure(RedisConnection& conn, std::string& error) {
    auto reply = offset_lag_ ? conn.command({"INFO", "replication"}, options_.timeout)
                             : conn.command({"INFO"}, options_.timeout);  // the default sections
    if (!reply.ok()) {
      error = reply.status().message();
      return std::nullopt;
    }
    const redisReply& r = *reply.value();
    if (r.type != REDIS_REPLY_STRING) {
      error = "redis: INFO answered " +
              (r.type == REDIS_REPLY_ERROR ? std::string(r.str, r.len) : std::string("no text"));
      return std::nullopt;
    }
    const auto fields = info_fields(std::string_view(r.str, r.len));
    if (!offset_lag_) {
      const auto f = fields.find(options_.field);
      if (f == fields.end()) {
        error = "redis: INFO has no field " + options_.field;
        return std::nullopt;
      }
      const auto v = number(f->second);
      if (!v) error = "redis: INFO " + options_.field + " is '" + f->second + "', not a number";
      return v;
    }
    const auto role = fields.find("role");
    if (role == fields.end() || role->second != "master") {
      error = "redis: replica_offset_lag is measured on the primary; this server's role is " +
              (role == fields.end() ? std::string("unknown") : role->second);
      return std::nullopt;
    }
    const auto head = fields.find("master_repl_offset");
    const auto primary = head == fields.end() ? std::nullopt : number(head->second);
    if (!primary) {
      error = "redis: INFO replication has no master_repl_offset";
      return std::nullopt;
    }
    std::optional<double> worst;
    for (const auto& [name, value] : fields) {
      if (name.rfind("slave", 0) != 0 || !number(std::string_view(name).substr(5))) continue;
      const auto offset = replica_offset(value);
      if (!offset) continue;
      worst = std::max(worst.value_or(0.0), std::max(0.0, *primary - *offset));
    }
    if (!worst) error = "redis: no replica is connected to this primary";
    return worst;
  }

  const RedisProbeOptions options_;
  bool offset_lag_ = false;
  std::vector<std::unique_ptr<RedisConnection>> conns_;  // per host
};

}  // namespace

std::unique_ptr<Probe> redis_probe(RedisProbeOptions options) {
  return std::make_unique<RedisProbe>(std::move(options));
}

void add_redis_probe(ProbeRegistry& r) {
  r.add({"redis",
         {"hosts", "field", "username", "password", "password_env", "timeout"},
         [](ProbeSettings& s, const ProbeContext& c) -> MakeProbe {
           RedisProbeOptions o;
           o.hosts = read_hosts(s, 6379);
           o.field = s.str("field", true).value_or("");
           if (s.has("field") && o.field.empty()) s.error("field", "must name an INFO field");
           o.username = s.str("username").value_or("");
           o.password = read_password(s);
           o.timeout = c.timeout;
           return [o](const ProbeEnv&) { return redis_probe(o); };
         }});
}

}  // namespace sluice::probes
