// config.h: sluice's configuration file (YAML): coordinators and named policies.
//
// What it is: load_config() parses and checks a whole file and returns either a SluiceConfig or
// every problem found, each with its YAML line and column and the field's path
// (`policies.checkout.limit`). The text must be UTF-8. Unknown keys are errors (a typo must not
// silently become a default), and so is a key given twice in one mapping (at the second, naming
// the first's line). A config serves at least one policy: an empty file, one of only comments,
// or a missing or empty `policies:` is an error. The schema:
//
//   server:                      # optional
//     grpc: 127.0.0.1:7070       # host:port; default 127.0.0.1:7070
//     http: 127.0.0.1:8080       # host:port; default 127.0.0.1:8080
//     envoy_grpc: 127.0.0.1:8081 # a second gRPC port, for Envoy's rate limit service as
//                                #   envoyproxy/ratelimit serves it; default: none
//     admin_token: "..."         # bearer token for admin endpoints (reload, rules); default
//                                #   none: they answer loopback clients only
//     node_id: gw-1              # this server's id in fleets; default hostname-pid-random
//     lease_ttl: 30s             # an Admit's lease when the call asks for none
//     max_lease_ttl: 10m         # the longest lease a call may ask for
//     shutdown_grace: 10s        # SIGTERM: how long in-flight calls may finish
//     state_file: <path>         # rules set at run time, kept across restarts; default none
//     max_connections: 10000     # per port; idle_timeout: 60s, request_timeout: 10s,
//                                # keepalive: 30s (each at least 100ms): ServerSettings
//     max_streams_per_connection: 1000   # gRPC calls open at once on one connection
//     max_watch_streams: 1000            # gRPC health Watch streams open at once, server-wide
//     rate_limit_headers: ietf           # an HTTP check's rate limit fields: ietf (RateLimit-
//                                        #   Policy, RateLimit), x-ratelimit, both or none
//     shadow_mode: false                 # every policy in shadow (each policy's `shadow`):
//                                        #   decides and counts, never refuses
//     # A reload refuses a change to grpc, http, node_id, max_connections, idle_timeout,
//     # request_timeout, keepalive, max_streams_per_connection or max_watch_streams
//     # (restart_only_changes); it takes the rest.
//   coordinators:                # optional; "memory" (embedded) always exists
//     <name>:
//       kind: <a coordinator backend>  # the backends the loader is given (PolicyKinds); each
//                                      # parses its own fields (sluice's: memory, redis and
//                                      # postgres, src/server/coordinators/*.cpp, each file's
//                                      # settings listed at its top)
//       # A policy's use of a coordinator is checked against the roles its backend serves
//       # (CoordinatorBackendParser::serves), and no two fleet policies may join one
//       # coordinator's store under one key (CoordinatorUse).
//       aggregate: median | min                                  # default median
//       allocation: equal-split | demand-proportional            # default equal-split
//       acknowledged_handoff: true | false                       # default false
//   policies:                    # required: at least one
//     <name>:
//       kind: <a policy kind>        # the kinds the loader is given (PolicyKinds); each parses
//                                    # its own fields (sluice's: src/server/policies/*.cpp,
//                                    # documented in config/example.yaml)
//       rate: <rate policy>          # kinds of the admit family: a call passes that rate policy
//                                    # first (429 when over, no permit taken), then the limit
//       shadow: true                 # every kind but throttler: decide and count, never refuse
//                                    #   (PolicySpec::shadow); default false
//
// Durations are an integer and a unit: ns, us, ms, s, m, h ("250ms", "2s").
//
// Thread-safety: pure functions.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/config/config_section.h"
#include "sluice/core/clock.h"
#include "sluice/core/fleet.h"
#include "sluice/core/postgres_options.h"
#include "sluice/core/redis_options.h"

namespace sluice {

struct ServerSettings {
  std::string grpc = "127.0.0.1:7070";
  std::string http = "127.0.0.1:8080";
  // A port of its own for Envoy's rate limit service (the envoy_ratelimit kind), as
  // envoyproxy/ratelimit's 8081: the same gRPC server (every service) on a second listener,
  // with the same connection settings. Empty: none (ShouldRateLimit is served on `grpc`).
  std::string envoy_grpc;
  std::string admin_token;                     // empty: admin endpoints for loopback clients
  std::string node_id;                         // this server in fleets; empty: hostname-pid-random
  Nanos lease_ttl = std::chrono::seconds(30);  // an Admit's lease when the call names none
  Nanos max_lease_ttl = std::chrono::minutes(10);   // the longest lease a call may ask for
  Nanos shutdown_grace = std::chrono::seconds(10);  // SIGTERM: how long in-flight calls may finish
  // Where rules set at run time (through a kind's admin endpoints) are kept across restarts;
  // empty: in memory only. Read at start; a reload keeps the file the server started with.
  std::string state_file;
  // Connections, on each port: at most this many open (later ones are shed; the default is
  // lowered to fit the process's file-descriptor limit, and so is a larger setting, with a
  // warning); closed after idle_timeout with no request under way (gRPC: no call); a request
  // must arrive in full, and its answer be taken, within request_timeout (HTTP); gRPC pings a
  // connection quiet for `keepalive` and closes it if the ping goes unanswered.
  std::size_t max_connections = 10000;
  Nanos idle_timeout = std::chrono::seconds(60);
  Nanos request_timeout = std::chrono::seconds(10);
  Nanos keepalive = std::chrono::seconds(30);
  // gRPC calls (HTTP/2 streams) open at once on one connection: the server announces it
  // (SETTINGS_MAX_CONCURRENT_STREAMS), so a client queues its further calls, and refuses the
  // streams of a client that does not (REFUSED_STREAM). With max_connections it bounds what
  // held calls (Watch, queued Admits) can cost.
  std::size_t max_streams_per_connection = 1000;
  // gRPC health Watch streams (grpc.health.v1.Health/Watch) open at once on the whole server;
  // a Watch past it is finished at once with RESOURCE_EXHAUSTED naming this setting.
  std::size_t max_watch_streams = 1000;
  // The rate limit fields of an HTTP check's answer (POST /v1/check, /v1/peek): "ietf" (the
  // draft's RateLimit-Policy and RateLimit), "x-ratelimit" (X-RateLimit-Limit, -Remaining,
  // -Reset), "both" or "none"; Retry-After on a refusal whatever it is.
  std::string rate_limit_headers = "ietf";
  // Every policy runs in shadow, as if each said `shadow: true` (PolicySpec::shadow).
  bool shadow_mode = false;
};

// A server setting that a running server cannot take from a reload, with its value in force
// and the reloaded file's (restart_only_changes).
struct RestartOnlyChange {
  std::string setting;  // "server.grpc"
  std::string running;  // as a person reads it ("127.0.0.1:7070", "60s", "unset")
  std::string next;
};
// The settings that differ between the settings a server started with and a reloaded file's,
// of those a reload cannot apply: the listeners (grpc, http) and their connection settings
// (envoy_grpc, max_connections, idle_timeout, request_timeout, keepalive,
// max_streams_per_connection, max_watch_streams) are set when the server starts,
// and its fleets know it by node_id. A reload that changes any of them is refused, naming each
// (the old config keeps serving); the other server settings are taken by a reload, except
// state_file (kept, with a warning). Empty: none.
[[nodiscard]] std::vector<RestartOnlyChange> restart_only_changes(const ServerSettings& running,
                                                                  const ServerSettings& next);

// What a policy asks of a coordinator it names.
enum class CoordinatorRole : std::uint8_t {
  kConcurrency,     // the fleet's concurrency interface (sluice/core/coordinator.h)
  kRateBudget,      // federation's rate-budget interface (sluice/core/rate_coordinator.h)
  kRegionalEscrow,  // federation's regional pool (sluice/core/regional_escrow.h)
  kSharedRules,     // a throttler's rules set at run time (sluice/backends/shared_rules.h)
  kSharedRate,      // a rate policy's keys kept at the coordinator (sluice/core/shared_rate.h)
};

// A coordinator of the config: its backend (`kind:`), the fleet's rules, and the backend's own
// settings as its parser read them.
struct CoordinatorSpec {
  std::string kind = "memory";  // the backend's name, as in the file
  CoordinatorConfig rules;      // aggregate, allocation, acknowledged_handoff
  std::any options;             // the backend's own settings (RedisOptions, PostgresOptions...)
  // Where it keeps its data: two coordinators with one store share one set of member records
  // (one Redis database and key prefix, one PostgreSQL conninfo and table prefix). Empty: its
  // own (each memory coordinator).
  std::string store;
  // The spec as parsed (canonical YAML): equal means unchanged, and a reload keeps the
  // coordinator (its connections and state) as it is.
  std::string fingerprint;

  // The backend's settings as its type; null when they are of another type (another backend).
  template <class Options>
  [[nodiscard]] const Options* options_as() const noexcept {
    return std::any_cast<Options>(&options);
  }
};

// How the loader reads one coordinator backend's section (the server's registry gives them:
// server/coordinator_backend.h).
struct CoordinatorBackendParser {
  std::string name;                    // the `kind:` it reads
  std::vector<CoordinatorRole> roles;  // the interfaces a coordinator of it serves
  std::vector<std::string_view> keys;  // its own keys, beyond kind and the fleet's rules
  // Reads its own keys of the section into spec.options and spec.store; errors go to the
  // section. Null: it has none (options stay empty, the store is the coordinator's own).
  std::function<void(ConfigSection& section, CoordinatorSpec& spec)> parse;

  [[nodiscard]] bool serves(CoordinatorRole role) const noexcept {
    for (CoordinatorRole r : roles)
      if (r == role) return true;
    return false;
  }
};

// One use of a coordinator by a policy (PolicySpec::use).
struct CoordinatorUse {
  std::string field;        // the policy's field naming it ("coordinator", "regional_escrow")
  std::string coordinator;  // a name in SluiceConfig::coordinators
  CoordinatorRole role = CoordinatorRole::kConcurrency;
  // Set when the policy joins the coordinator as a member under the server's node id (a fleet
  // policy): its key there, and the field that sets it (the key defaults to the policy's name).
  // The loader refuses a second member of one key at one coordinator in a config: the two
  // would beat under one node id into one member record, each taking the whole share.
  std::string member_key;
  std::string member_key_field;
};

// A policy kind's own fields, as its parser read them (each kind defines its body).
struct PolicyBody {
  virtual ~PolicyBody() = default;
};

struct PolicySpec {
  std::string kind;                        // as in the file's `kind:`
  std::shared_ptr<const PolicyBody> body;  // the kind's own fields
  // Kinds of the admit family: the rate policy a call passes first (429, no permit taken);
  // empty: none.
  std::string rate;
  // `shadow: true` (every kind but throttler): the policy decides and counts as configured but
  // never refuses. A call it would have refused is allowed (admitted, with a lease that holds
  // no permit) and answered with would_deny and what it would have said; nothing is debited
  // for it; sluice_shadow_denied_total{policy} counts them. A queueing kind still queues. Not
  // part of the fingerprint: a reload that only turns it on or off keeps the policy as it is.
  bool shadow = false;
  // The coordinators (by name) the policy uses; each must be in SluiceConfig::coordinators.
  std::vector<std::string> coordinators;
  // The field that names each of `coordinators`, for errors ("coordinator" where missing).
  std::vector<std::string> coordinator_fields;
  // What the policy asks of each (use() records them): the loader checks that the coordinator's
  // kind serves it, and that no two policies join one coordinator as members under one key.
  std::vector<CoordinatorUse> uses;
  // The spec as parsed (canonical YAML): equal means unchanged. A kind's parser that reads
  // files the section names puts their content here; the loader appends the section's YAML.
  std::string fingerprint;

  // Records `u`, and its coordinator in `coordinators` (once, with u.field).
  void use(CoordinatorUse u);
  // The same for a use that joins as no member.
  void use(std::string field, std::string coordinator, CoordinatorRole role) {
    use(CoordinatorUse{std::move(field), std::move(coordinator), role, {}, {}});
  }

  // The body as the kind's type; null when it is of another kind.
  template <class Body>
  [[nodiscard]] const Body* as() const noexcept {
    return dynamic_cast<const Body*>(body.get());
  }
};

// How the loader reads one policy kind's section.
struct PolicyKindParser {
  std::string name;           // the `kind:` it reads
  bool rate_family = false;   // may be named by another policy's `rate:`
  bool admit_family = false;  // may name a `rate:`
  // Reads policy `name`'s section (its keys() must list every key it allows, `kind` and, for
  // the admit family, `rate` included) and may add to spec.coordinators. Errors go to the
  // section.
  std::function<std::shared_ptr<const PolicyBody>(const std::string& name, ConfigSection& section,
                                                  PolicySpec& spec)>
      parse;
};

// The policy kinds and coordinator backends a load knows.
class PolicyKinds {
 public:
  virtual ~PolicyKinds() = default;
  [[nodiscard]] virtual const PolicyKindParser* parser(std::string_view kind) const = 0;
  // Every kind's name, in the order messages list them.
  [[nodiscard]] virtual std::vector<std::string> kind_names() const = 0;
  // The coordinator backend named `kind` (a coordinator's `kind:`); null: none.
  [[nodiscard]] virtual const CoordinatorBackendParser* coordinator_backend(
      std::string_view kind) const = 0;
  // Every backend's name, in the order messages list them.
  [[nodiscard]] virtual std::vector<std::string> coordinator_backend_names() const = 0;
};

struct SluiceConfig {
  ServerSettings server;
  std::map<std::string, CoordinatorSpec> coordinators;  // "memory" always present
  std::map<std::string, PolicySpec> policies;
};

struct ConfigError {
  std::string path;  // e.g. "policies.checkout.limit"
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based; 0 when unknown
  std::string message;
  // "<source>:<line>:<column>: <path>: <message>"
  [[nodiscard]] std::string to_string(std::string_view source) const;
};

struct ConfigLoad {
  std::optional<SluiceConfig> config;  // set iff errors is empty
  std::vector<ConfigError> errors;
  std::vector<ConfigError> warnings;
};

// Parses and checks YAML text, each policy with its kind's parser. Never throws.
[[nodiscard]] ConfigLoad load_config(std::string_view yaml, const PolicyKinds& kinds);
// Reads a file first; a missing or unreadable file, or a directory, is one error (line 0, no
// path: ConfigError::to_string(path) names the file).
[[nodiscard]] ConfigLoad load_config_file(const std::string& path, const PolicyKinds& kinds);

// Another YAML file a kind reads (one its section names: envoyproxy/ratelimit's rules): checked
// as a config file is (a regular file of at most 16 MiB, UTF-8, no control characters, one
// document; one error at line 0 otherwise), then its root, which must be a mapping, read by
// `read` through a ConfigSection whose errors and warnings carry their line and column in that
// file (ConfigError::to_string(path) names it). `empty` is the error of a file with nothing
// in it. Never throws.
struct DocumentLoad {
  std::vector<ConfigError> errors;
  std::vector<ConfigError> warnings;
  std::string text;  // the file as read
};
[[nodiscard]] DocumentLoad load_yaml_file(const std::string& path, std::string_view empty,
                                          const std::function<void(ConfigSection&)>& read);
[[nodiscard]] DocumentLoad load_yaml_text(std::string_view yaml, std::string_view empty,
                                          const std::function<void(ConfigSection&)>& read);

// Parses "250ms", "2s", ...: nullopt when malformed.
[[nodiscard]] std::optional<Nanos> parse_duration(std::string_view text);
// A duration for people: whole hours or minutes as "2h", "10m"; otherwise the largest unit of
// s, ms, us, ns it reaches, with at most three decimals, trailing zeros dropped ("1.5s", "90s",
// "250ms", "1.25ms", "0s"). Whole values ("90s", "250ms") read back with parse_duration.
[[nodiscard]] std::string format_duration(Nanos d);

}  // namespace sluice
