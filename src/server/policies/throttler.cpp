// The throttler kind: the collaborative check API that batch jobs ask before each chunk of work
// (sluice/core/throttler.h decides), over metrics its probes sample in loops of their own (one
// per metric), so a check is a lookup and never waits on a database.
//
//   kind: throttler
//   shard: main              # what a check's `shard=` (or freno's store name) selects; default:
//                            #   the policy's name. A check naming no shard gets the first
//                            #   throttler of the config.
//   scope: shard             # the default scope: shard (the worst host) or self (the first)
//   default_app: default     # the app of a check that names none
//   fast_interval: 100ms     # sampling while checks come
//   dormant_interval: 5s     # sampling once no check came for idle_after (and before any)
//   idle_after: 10s
//   stale_intervals: 5       # a sample older than this many of its interval counts as over;
//                            #   a probe's timeout must keep samples fresh
//                            #   (throttler_config.cpp: metric_probe())
//   low_priority_hold: 1s    # p=low is refused this long after a normal app was refused
//   unexplained_after: 10s   # a metric over its threshold this long while no check was
//                            #   refused: load no checking app explains (the audit's signal,
//                            #   sluice_throttler_unexplained_load{metric}); longer than a
//                            #   client's longest backoff
//   shared_rules: rules      # a coordinator (redis, postgres or etcd) that holds the rules set
//                            #   at run time, shared by every server naming it (default: none,
//                            #   this server's own, in server.state_file)
//   shared_rules_interval: 1s   # how often the table is read (10ms to 1m)
//   metrics:                 # at least one
//     load:
//       probe: loadavg       # the host's 1-minute load average (/proc/loadavg)
//       threshold: 8         # over it: 429 (> 0)
//       ignore_hosts: 0      # shard scope: the worst hosts not counted
//     api:
//       probe: policy        # a sluice policy's utilisation: in flight / limit (an adaptive,
//       policy: search       #   fleet or other admit-family policy with one limit)
//       threshold: 0.9
//     queue:
//       probe: command       # a command that prints a number (its first word), run by
//       command: "cat /var/run/queue-depth"   # /bin/sh -c; non-zero exit, no number or
//       timeout: 200ms       # running past `timeout` (then killed) is a failed probe (default:
//                            #   1s or the longest that keeps samples fresh, if less)
//       threshold: 1000
//     lag:
//       probe: mysql_heartbeat   # or mysql_lag (Seconds_Behind_Source/_Master),
//       hosts: [10.0.0.2:3306, 10.0.0.3]   # mysql_threads_running; every host is sampled
//       user: throttler          # (REPLICATION CLIENT, SELECT on the heartbeat table)
//       password_env: THROTTLER_DB_PASSWORD   # or password: ...
//       heartbeat_table: meta.heartbeat       # pt-heartbeat's table; heartbeat_utc: true
//       timeout: 200ms           # per host and sample: connect and query, in all
//       threshold: 1             # seconds
//     pg:
//       probe: postgres_lag      # or postgres_active (backends running a query)
//       hosts: [10.0.0.4:5432]
//       conninfo: "user=throttler dbname=postgres sslmode=require"   # keyword=value
//       threshold: 1
//     cache:
//       probe: redis             # an INFO field, or replica_offset_lag (bytes, on a primary)
//       hosts: [10.0.0.5:6379]
//       field: used_memory
//       threshold: 4e9
//     queue_http:
//       probe: http              # GET; a 2xx body that starts with a number
//       url: http://127.0.0.1:9000/queue-depth
//       threshold: 1000
// What each probe measures, exactly: backends/probes/probe.h.
//   apps:                    # rules by app name; `all` applies to apps without their own
//                            # (metrics and thresholds: `all` cannot be exempt)
//     gh-ost:
//       metrics: [load]      # default: every metric
//       thresholds: {load: 4}
//     rescue:
//       exempt: true         # passes whatever the metrics say
//
// Routes (GET and HEAD; HEAD answers the status alone, as gh-ost's --throttle-http polls it):
//   /throttler/check?app=A[&scope=self|shard][&shard=S][&p=low]   the Vitess shape
//   /throttler/check-self?app=A[...]                               scope self
//   /check/{app}/{store_type}/{store_name}                         the freno shape (store_name
//                                                                  is the shard)
// Status: 200 ok, 429 over a threshold (or a probe failed, or its sample is stale: fail
// closed), 417 the app is throttled, 404 an unknown metric or shard, 400 a malformed argument;
// the JSON's StatusCode is the same and ResponseCode Vitess's (sluice/core/throttler.h:
// vitess_response_code).
//
// Admin verbs (GET or POST; 401 without `Authorization: Bearer <server.admin_token>` when the
// server has one), each taking `shard=` too and answering the app's rule now:
//   /throttler/throttle-app?app=A[&duration=1h][&ratio=1]   refuse A (417) with that
//                                                           probability until the time is up
//   /throttler/unthrottle-app?app=A
//   /throttler/exempt-app?app=A[&exempt=true|false]
//   /throttler/app-rule?app=A[&metrics=lag,load][&thresholds=lag:2,load:8][&clear=true]
//                            the app's metric set and thresholds (over the config's; a
//                            threshold of 0, or metrics= empty, drops the run-time one)
//   /throttle-app/A[/ttl/MINUTES][/ratio/R][?store_name=S], /unthrottle-app/A[?store_name=S]
//                            the freno shape, also HEAD: store S's throttler, or without it
//                            every one; no TTL or 0: a year (freno: never expires); no ratio:
//                            the app's current one, else 1; ratio 0 lifts it; answered
//                            {"StatusCode":200,"Message":"OK"}
//   /skip-host/H[/ttl/MINUTES], /recover-host/H   freno's: host H's samples left out of every
//                            metric's shard scope (no TTL or 0: an hour), kept in memory
// `app=all` throttles every app (an exempt one still passes). The rules are kept in the
// server's state file (server.state_file), each expiry as wall-clock time, so a restart keeps
// the time left (each server its own file); or, with `shared_rules: COORDINATOR`, in that
// coordinator's table for the shard (sluice/backends/shared_rules.h), skipped hosts too, which
// every server naming it reads every shared_rules_interval (server/shared_rule_mirror.h): a verb is
// answered once the coordinator holds the change. Listings (GET, no token):
// /throttler/status (Vitess's ThrottlerStatus), /throttler/throttled-apps (every app with a
// rule) and /throttler/recent-apps (the apps that checked, most recent first, with counts, rate
// and last client address; and per metric whether its load is unexplained by refused checks,
// sluice/core/throttler.h: audit_load); in
// freno's shapes /throttled-apps, /recent-apps[/MINUTES], /skipped-hosts, and /lb-check,
// /_ping, /status, /leader-check (HEAD too).
//
// Where each part is: this file registers the kind, its routes in the order they are matched;
// throttler_policy.h declares what the other files share. throttler_policy.cpp is the policy at
// work (checks, sampling, the rules set at run time, skipped hosts) and throttler_listings.cpp
// what it shows (the listings, Vitess's status, describe, metrics); throttler_config.cpp reads
// its config (the probes, parse, build); throttler_routes.cpp answers the routes and the gRPC
// check.
#include "server/policies/throttler_policy.h"
#include "server/registry.h"

namespace sluice::server {
namespace throttler_detail {
namespace {

PolicyKind throttler_kind_impl() {
  PolicyKind kind("throttler", 0, parse, build);
  kind.routes.push_back(vitess_route("/throttler/check", false));
  kind.routes.push_back(vitess_route("/throttler/check-self", true));
  kind.routes.push_back(freno_route("/check/{app}/{store_type}/{store_name}", false));
  kind.routes.push_back(
      freno_route("/check-read/{app}/{store_type}/{store_name}/{threshold}", false));
  kind.routes.push_back(freno_route("/check-if-exists/{app}/{store_type}/{store_name}", true));
  kind.routes.push_back(
      freno_route("/check-read-if-exists/{app}/{store_type}/{store_name}/{threshold}", true));
  kind.methods.push_back(GrpcMethod{"/sluice.v1.Throttler/Check", grpc_check});
  // Rules at run time (admin; kept in server.state_file, or shared_rules): the Vitess and freno
  // verbs.
  kind.routes.push_back(admin_route("/throttler/throttle-app", vitess_throttle));
  kind.routes.push_back(admin_route("/throttler/unthrottle-app", unthrottle_app));
  kind.routes.push_back(admin_route("/throttler/app-rule", vitess_app_rule));
  kind.routes.push_back(admin_route("/throttler/exempt-app", vitess_exempt));
  for (const char* pattern : {"/throttle-app/{app}", "/throttle-app/{app}/ratio/{ratio}",
                              "/throttle-app/{app}/ttl/{ttl_minutes}",
                              "/throttle-app/{app}/ttl/{ttl_minutes}/ratio/{ratio}"})
    kind.routes.push_back(freno_admin_route(pattern, freno_throttle));
  kind.routes.push_back(freno_admin_route("/unthrottle-app/{app}", unthrottle_app));
  for (const char* pattern : {"/skip-host/{host_name}", "/skip-host/{host_name}/ttl/{ttl_minutes}"})
    kind.routes.push_back(freno_admin_route(pattern, freno_skip_host));
  kind.routes.push_back(freno_admin_route("/recover-host/{host_name}", freno_recover_host));
  kind.routes.push_back(freno_skipped_hosts_listing("/skipped-hosts"));
  kind.routes.push_back(freno_listing("/throttled-apps", false));
  kind.routes.push_back(freno_listing("/recent-apps", true));
  kind.routes.push_back(freno_listing("/recent-apps/{last_minutes}", true));
  for (const char* pattern : {"/lb-check", "/_ping", "/status"})
    kind.routes.push_back(freno_status(pattern, freno_ok().body));
  kind.routes.push_back(freno_status("/leader-check", "\"HTTP 200\"\n"));
  // Read-only listings: the rules, and the apps that checked (the audit).
  kind.routes.push_back(vitess_listing("/throttler/throttled-apps", false));
  kind.routes.push_back(vitess_status_route("/throttler/status"));
  kind.routes.push_back(vitess_listing("/throttler/recent-apps", true));
  return kind;
}

}  // namespace
}  // namespace throttler_detail

PolicyKind throttler_kind() { return throttler_detail::throttler_kind_impl(); }

}  // namespace sluice::server
