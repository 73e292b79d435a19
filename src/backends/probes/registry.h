// registry.h (private): the probes a throttler metric may name, by name: each with the settings
// it reads and how it makes its Probe (probe.h) from them. The throttler's config reads a
// metric's settings through it, so a new probe is its own file and one line in builtin_probes().
//
// What it is: a ProbeType is a probe's name ("mysql_lag"), the settings it takes beside probe,
// threshold and ignore_hosts ("timeout" among them when each host's sample is bounded), and
// read(): it reads those settings from a ProbeSettings (reporting a bad one there, naming the
// setting) and returns how to make the Probe once the server it runs in is known (a ProbeEnv).
// The registry keeps the types in the order they were added (the order an error lists them in).
//
// Thread-safety: a registry is built, then only read; builtin_probes() is built once.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/probes/probe.h"
#include "sluice/core/clock.h"

namespace sluice::probes {

// A metric's settings as a probe reads them, and where it reports a bad one: the throttler's
// config section, adapted (the config layer sits above this one).
class ProbeSettings {
 public:
  virtual ~ProbeSettings() = default;
  [[nodiscard]] virtual bool has(std::string_view key) const = 0;
  // A scalar; nullopt when absent (an error when `required`).
  [[nodiscard]] virtual std::optional<std::string> str(std::string_view key,
                                                       bool required = false) = 0;
  // A list of scalars; nullopt when absent or not one (an error).
  [[nodiscard]] virtual std::optional<std::vector<std::string>> strings(std::string_view key) = 0;
  [[nodiscard]] virtual std::optional<bool> boolean(std::string_view key) = 0;
  virtual void error(std::string_view key, const std::string& message) = 0;
};

// What a probe may need of the server it samples for, once that is known.
struct ProbeEnv {
  // The utilisation (in flight / limit) of the server's policy `name` now, or nullopt with
  // `error` saying why there is none. Empty: the server serves no policies to read.
  std::function<std::optional<double>(const std::string& name, std::string& error)>
      policy_utilisation;
};

// What reading a metric's settings is told of the metric.
struct ProbeContext {
  std::string policy;  // the throttler's own name (a policy probe may not read itself)
  Nanos timeout;       // each host's sample bound, for a probe that takes "timeout"
};

using MakeProbe = std::function<std::unique_ptr<Probe>(const ProbeEnv&)>;

struct ProbeType {
  std::string name;
  std::vector<std::string_view> settings;  // beside probe, threshold and ignore_hosts
  // Reads the settings (each bad one reported on `s`); how to make the probe (null: none).
  std::function<MakeProbe(ProbeSettings& s, const ProbeContext& c)> read;
  [[nodiscard]] bool takes(std::string_view setting) const;
};

class ProbeRegistry {
 public:
  // Adds `type` (one of the same name is replaced, keeping its place).
  void add(ProbeType type);
  [[nodiscard]] const ProbeType* find(std::string_view name) const;
  // Every name, in the order added.
  [[nodiscard]] std::vector<std::string_view> names() const;
  // Every setting some probe takes, each once, in the order first added.
  [[nodiscard]] std::vector<std::string_view> settings() const;

 private:
  std::vector<ProbeType> types_;
};

// loadavg, command, policy, mysql_lag, mysql_heartbeat, mysql_threads_running, postgres_lag,
// postgres_active, redis, http.
[[nodiscard]] const ProbeRegistry& builtin_probes();

// Each probe file's types (builtin_probes() adds them in this order).
void add_host_probes(ProbeRegistry& r);      // loadavg, command (host_probes.cpp)
void add_policy_probe(ProbeRegistry& r);     // policy (policy_probe.cpp)
void add_mysql_probes(ProbeRegistry& r);     // mysql_probe.cpp
void add_postgres_probes(ProbeRegistry& r);  // postgres_probe.cpp
void add_redis_probe(ProbeRegistry& r);      // redis_probe.cpp
void add_http_probe(ProbeRegistry& r);       // http_probe.cpp

// The readers the network probes share: `hosts` ("host[:port]" each, at least one; required),
// and `password` or `password_env` (the environment variable that holds it, read now).
[[nodiscard]] std::vector<Endpoint> read_hosts(ProbeSettings& s, int default_port);
[[nodiscard]] std::string read_password(ProbeSettings& s);

}  // namespace sluice::probes
