// sluice: the command-line entry point (the project's only main()).
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "client.h"
#include "demo.h"
#include "serve.h"
#include "server/coordinators.h"
#include "server/registry.h"
#include "sim.h"
#include "sluice/config/config.h"
#include "sluice/core/text.h"
#include "sluice/sim/cascade_sim.h"
#include "throttler_cli.h"
#include "top.h"

int main(int argc, char** argv) {
  CLI::App app{"sluice: admission control for shared backends"};
  app.require_subcommand(1);
  // The project's version (CMake's project(VERSION)), as `sluice --version` and `sluice version`.
  const std::string version = std::string("sluice ") + SLUICE_VERSION;
  app.set_version_flag("--version", version, "print the version and exit");
  app.add_subcommand("version", "print the version")->callback([&] {
    fmt::print("{}\n", version);
  });

  sluice::cli::DemoOptions demo;
  int exit_code = 0;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "drive the gateway limits with concurrent callers and print what each level did");
  demo_cmd->add_option("--threads", demo.threads, "concurrent callers")
      ->check(CLI::Range(1u, 256u));
  demo_cmd->add_option("--seconds", demo.seconds, "how long to run")
      ->check(CLI::Range(0.01, 3600.0));
  demo_cmd->add_option("--seed", demo.seed, "seed of the callers' random choices");
  demo_cmd->callback([&] { exit_code = sluice::cli::run_demo(demo); });

  sluice::cli::SimOptions sim;
  CLI::App* sim_cmd = app.add_subcommand("sim", "deterministic simulations");
  sim_cmd->require_subcommand(1);
  CLI::App* sim_fleet = sim_cmd->add_subcommand(
      "fleet", "the fleet guard's scenarios: a table per scenario, CSV and SVG with --out");
  sim_fleet
      ->add_option("--scenario", sim.scenario, "fan-out, join-ramp, partition, freeze, skew or all")
      ->check(CLI::IsMember({"fan-out", "join-ramp", "partition", "freeze", "skew", "all"}));
  sim_fleet->add_option("--out", sim.out_dir, "directory for the CSV and SVG files");
  sim_fleet->add_option("--scale", sim.scale, "shorten every run (0.05..1)")
      ->check(CLI::Range(0.05, 1.0));
  sim_fleet->callback([&] { exit_code = sluice::cli::run_sim_fleet(sim); });
  sluice::cli::FederationSimOptions sim_fed;
  CLI::App* sim_federation = sim_cmd->add_subcommand(
      "federation",
      "one global rate budget across 3 regions by skew, with processes sharing a regional pool "
      "and through a coordinator outage: tables, CSV and SVG with --out");
  sim_federation->add_option("--out", sim_fed.out_dir, "directory for the CSV and SVG files");
  sim_federation->add_option("--windows", sim_fed.windows, "windows of 1 s per run")
      ->check(CLI::Range(1, 10000));
  sim_federation->add_option("--seed", sim_fed.seed, "seed of the arrivals");
  sim_federation->add_option("--batch", sim_fed.batch, "units per lease (default 16)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1000}));
  sim_federation->callback([&] { exit_code = sluice::cli::run_sim_federation(sim_fed); });
  sluice::cli::CascadeSimOptions sim_casc;
  CLI::App* sim_cascade = sim_cmd->add_subcommand(
      "cascade",
      "the fallback cascade (with and without breakers) against round-robin, random and "
      "power-of-two-choices over 5 nodes, one of them failing: a table, CSV and SVG with --out");
  std::vector<std::string> cascade_names = {"all"};
  for (const auto& s : sluice::sim::cascade_scenarios()) cascade_names.push_back(s.name);
  sim_cascade->add_option("--scenario", sim_casc.scenario, "one scenario, or all (default)")
      ->check(CLI::IsMember(cascade_names));
  sim_cascade->add_option("--out", sim_casc.out_dir, "directory for the CSV and SVG files");
  sim_cascade->add_option("--seed", sim_casc.seed, "seed of the arrivals and node behaviour");
  sim_cascade
      ->add_option("--rate", sim_casc.rate,
                   "arrivals per second (default 1000; the 5 nodes serve about 8000)")
      ->check(CLI::Range(50.0, 4000.0));
  sim_cascade->add_option("--seconds", sim_casc.seconds, "the run's length (default 120)")
      ->check(CLI::Range(80.0, 3600.0));
  sim_cascade->callback([&] { exit_code = sluice::cli::run_sim_cascade(sim_casc); });
  sluice::cli::SharedRateSimOptions sim_rate;
  CLI::App* sim_shared_rate = sim_cmd->add_subcommand(
      "shared-rate",
      "a shared rate limit's coordinator restarted from its snapshot, with and without the loss "
      "rule, for each strategy: a table, CSV and SVG with --out");
  sim_shared_rate->add_option("--out", sim_rate.out_dir, "directory for the CSV and SVG files");
  sim_shared_rate->add_option("--seed", sim_rate.seed, "seed of the arrivals");
  sim_shared_rate->add_option("--scale", sim_rate.scale, "shorten the run (0.05..1)")
      ->check(CLI::Range(0.05, 1.0));
  sim_shared_rate->callback([&] { exit_code = sluice::cli::run_sim_shared_rate(sim_rate); });

  std::string config_path;
  CLI::App* validate_cmd = app.add_subcommand(
      "validate",
      "check a config file as `sluice serve` does before it connects: every error with its line "
      "and column; exit 1 if any");
  validate_cmd->add_option("config", config_path, "the YAML config file")->required();
  validate_cmd->callback([&] {
    sluice::ConfigLoad load =
        sluice::load_config_file(config_path, sluice::server::PolicyRegistry::builtin());
    // Then what `sluice serve` checks of the coordinators before it connects to them.
    if (load.config)
      load.errors = sluice::server::check_before_connecting(
          *load.config, sluice::server::PolicyRegistry::builtin());
    for (const sluice::ConfigError& e : load.warnings)
      fmt::print(stderr, "warning: {}\n", e.to_string(config_path));
    for (const sluice::ConfigError& e : load.errors)
      fmt::print(stderr, "error: {}\n", e.to_string(config_path));
    if (!load.errors.empty()) {
      fmt::print(stderr, "{}: {} error(s)\n", config_path, load.errors.size());
      exit_code = 1;
      return;
    }
    fmt::print("{}: ok ({} policies, {} coordinators)\n", config_path, load.config->policies.size(),
               load.config->coordinators.size());
  });

  sluice::cli::ServeOptions serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve", "run the server (gRPC + HTTP); SIGHUP reloads the config, SIGTERM drains and stops");
  serve_cmd->add_option("--config,-c", serve.config,
                        "YAML config file (default: the embedded default, config/default.yaml)");
  serve_cmd->add_option("--grpc", serve.grpc,
                        "gRPC listen address host:port (overrides the config)");
  serve_cmd->add_option("--http", serve.http,
                        "HTTP listen address host:port (overrides the config)");
  serve_cmd->add_option("--http-threads", serve.http_threads, "HTTP threads")
      ->check(CLI::Range(1, 64));
  serve_cmd->callback([&] { exit_code = sluice::cli::run_serve(serve); });

  app.add_subcommand("default-config", "print the embedded default config")->callback([] {
    fmt::print("{}", sluice::cli::default_config_yaml());
  });

  // Clients of a running server.
  sluice::cli::ClientOptions client;
  if (const char* env = std::getenv("SLUICE_SERVER")) client.server = env;
  const auto client_flags = [&](CLI::App* c) {
    c->add_option("--server,-s", client.server,
                  "the server's gRPC address host:port (default $SLUICE_SERVER or 127.0.0.1:7070)")
        ->check(
            [](const std::string& text) -> std::string {
              sluice::HostPort ignored;
              if (sluice::parse_host_port(text, ignored).empty()) return {};
              return "must be host:port with a port in 1..65535, not '" + text + "'";
            },
            "HOST:PORT");
    // $SLUICE_SERVER stands for --server when none is given: the same check, naming it.
    c->parse_complete_callback([c, &client] {
      const char* env = std::getenv("SLUICE_SERVER");
      if (env == nullptr || c->count("--server") > 0) return;
      sluice::HostPort ignored;
      if (!sluice::parse_host_port(client.server, ignored).empty())
        throw CLI::ValidationError(
            "SLUICE_SERVER",
            "must be host:port with a port in 1..65535, not '" + client.server + "'");
    });
    c->add_option("--timeout", client.timeout_seconds, "seconds to wait for the reply")
        ->check(CLI::Range(0.001, 3600.0));
    c->add_flag("--json", client.json, "print the reply as JSON");
  };
  sluice::cli::CheckArgs check;
  for (const char* name : {"check", "peek"}) {
    const bool peek = std::string_view(name) == "peek";
    CLI::App* c = app.add_subcommand(
        name, peek ? "the decision a check would get, consuming nothing"
                   : "check a key against a rate policy (exit 0 allowed, 1 denied, 2 error)");
    c->add_option("policy", check.policy, "a rate policy")->required();
    c->add_option("key", check.key, "the key (user, API key, ...)")->required();
    c->add_option("--hits,-n", check.hits, "hits to take (default 1)");
    client_flags(c);
    c->callback([&, peek] {
      check.peek = peek;
      exit_code = sluice::cli::run_check(client, check);
    });
  }
  sluice::cli::ChargeArgs charge;
  CLI::App* charge_cmd = app.add_subcommand(
      "charge",
      "charge hits to a key after the fact, whatever it has left (negative: give them back)");
  charge_cmd->add_option("policy", charge.policy, "a rate or federated policy")->required();
  charge_cmd->add_option("key", charge.key, "the key (user, API key, ...)")->required();
  charge_cmd->add_option("hits", charge.hits, "hits to charge (> 0) or give back (< 0)")
      ->required();
  client_flags(charge_cmd);
  charge_cmd->callback([&] { exit_code = sluice::cli::run_charge(client, charge); });
  sluice::cli::AdmitArgs admit;
  CLI::App* admit_cmd = app.add_subcommand(
      "admit", "admit one call; prints its lease id (exit 0 admitted, 1 refused, 2 error)");
  admit_cmd->add_option("policy", admit.policy, "an adaptive, fleet, concurrency or cascade policy")
      ->required();
  admit_cmd->add_option("--key,-k", admit.key, "the caller's key (for a chained rate policy)");
  admit_cmd->add_option("--tenant,-t", admit.tenant, "concurrency policies: the tenant");
  admit_cmd->add_option("--upstream,-u", admit.upstream, "concurrency policies: the upstream");
  admit_cmd->add_option("--route,-r", admit.route, "concurrency policies: the route");
  admit_cmd->add_option("--ttl", admit.ttl, "the lease's TTL, e.g. 30s (default: the server's)");
  admit_cmd->add_option("--exclude,-x", admit.exclude,
                        "cascade policies: a node not to choose (repeatable)");
  admit_cmd->add_option("--attribute,-a", admit.attributes,
                        "name=value: an attribute the policy's kind reads (repeatable; a name "
                        "given more than once is a list); --tenant and the like are shorthands");
  admit_cmd->add_option("--max-wait", admit.max_wait,
                        "concurrency policies with a queue: the most to wait in it, e.g. 500ms "
                        "(default: the queue's timeout; 0s: do not wait); --timeout bounds it too");
  client_flags(admit_cmd);
  admit_cmd->callback([&] { exit_code = sluice::cli::run_admit(client, admit); });
  sluice::cli::ReleaseArgs release;
  CLI::App* release_cmd = app.add_subcommand("release", "release a lease");
  release_cmd->add_option("lease_id", release.lease_id, "the lease id Admit returned")->required();
  release_cmd->add_option("--outcome", release.outcome,
                          "success, dropped, timeout, overload, ignored or failed");
  release_cmd->add_option("--rtt", release.rtt, "the call's RTT, e.g. 20ms (default: time held)");
  release_cmd->add_option("--cost", release.cost,
                          "what the call cost its policy's chained rate policy, in hits (the "
                          "admit took 1; the rest is charged now)");
  client_flags(release_cmd);
  release_cmd->callback([&] { exit_code = sluice::cli::run_release(client, release); });
  std::string heartbeat_lease, heartbeat_ttl;
  CLI::App* heartbeat_cmd = app.add_subcommand("heartbeat", "extend a lease");
  heartbeat_cmd->add_option("lease_id", heartbeat_lease, "the lease id")->required();
  heartbeat_cmd->add_option("--ttl", heartbeat_ttl, "the new TTL (default: the lease's)");
  client_flags(heartbeat_cmd);
  heartbeat_cmd->callback(
      [&] { exit_code = sluice::cli::run_heartbeat(client, heartbeat_lease, heartbeat_ttl); });
  CLI::App* policies_cmd = app.add_subcommand("policies", "list a running server's policies");
  client_flags(policies_cmd);
  policies_cmd->callback([&] { exit_code = sluice::cli::run_policies(client); });
  sluice::cli::TopOptions top;
  std::string top_sort = "name";
  CLI::App* top_cmd = app.add_subcommand(
      "top", "a running server's policies in the terminal, refreshing (q or Ctrl-C quits)");
  top_cmd->add_option("--interval,-i", top.interval_seconds, "seconds between refreshes")
      ->check(CLI::Range(0.1, 3600.0));
  top_cmd
      ->add_option("--sort", top_sort,
                   "name, kind, util (in flight / limit), rate or refused (per second)")
      ->check(
          [](const std::string& text) -> std::string {
            sluice::cli::TopSort ignored;
            return sluice::cli::parse_top_sort(text, ignored)
                       ? std::string()
                       : "must be name, kind, util, rate or refused, not '" + text + "'";
          },
          "KEY");
  top_cmd->add_option("--filter", top.filter, "only policies whose name or kind holds this");
  top_cmd->add_flag("--once", top.once,
                    "print one frame (rates over one interval) and exit; the default when not "
                    "on a terminal");
  client_flags(top_cmd);
  top_cmd->callback([&] {
    (void)sluice::cli::parse_top_sort(top_sort, top.sort);
    exit_code = sluice::cli::run_top(client, top);
  });

  // The throttler, over the server's HTTP API.
  sluice::cli::ThrottlerCliOptions throttler;
  if (const char* env = std::getenv("SLUICE_HTTP")) throttler.http = env;
  if (const char* env = std::getenv("SLUICE_ADMIN_TOKEN")) throttler.token = env;
  CLI::App* throttler_cmd =
      app.add_subcommand("throttler", "ask a running server's throttler, or set its per-app rules");
  throttler_cmd->require_subcommand(1);
  const auto throttler_flags = [&](CLI::App* c) {
    c->add_option("--http", throttler.http,
                  "the server's HTTP base URL (default $SLUICE_HTTP or http://127.0.0.1:8080)");
    c->add_option("--shard", throttler.shard, "the throttler's shard (default: the first)");
    c->add_option("--timeout", throttler.timeout_seconds, "seconds to wait for each reply")
        ->check(CLI::Range(0.001, 3600.0));
    c->add_flag("--json", throttler.json, "print the reply as JSON");
  };
  sluice::cli::ThrottlerCheckArgs throttler_check;
  CLI::App* tcheck = throttler_cmd->add_subcommand(
      "check", "may APP do one more chunk of work? (exit 0 yes, 1 no, 2 error or unreachable)");
  tcheck->add_option("app", throttler_check.app, "the app that asks (default sluice-cli)");
  tcheck->add_option("--scope", throttler_check.scope, "self or shard (default: the server's)");
  tcheck->add_flag("--low", throttler_check.low_priority, "ask at low priority (p=low)");
  tcheck->add_option("--wait", throttler_check.wait,
                     "wait until allowed, at most this long (e.g. 10m), backing off 1s-2s-4s");
  throttler_flags(tcheck);
  tcheck->callback(
      [&] { exit_code = sluice::cli::run_throttler_check(throttler, throttler_check); });
  std::string throttled_app, throttle_duration, throttle_ratio;
  for (const char* verb : {"throttle", "unthrottle", "exempt", "unexempt"}) {
    const std::string v = verb;
    CLI::App* c = throttler_cmd->add_subcommand(
        verb, v == "throttle"     ? "refuse APP (417) until the duration is up"
              : v == "unthrottle" ? "lift APP's throttle"
              : v == "exempt"     ? "let APP pass whatever the metrics say"
                                  : "end APP's exemption");
    c->add_option("app", throttled_app, "the app (all: every app)")->required();
    if (v == "throttle") {
      c->add_option("--duration", throttle_duration, "how long (default 1h)");
      c->add_option("--ratio", throttle_ratio, "the probability of refusal, (0, 1] (default 1)");
    }
    c->add_option("--token", throttler.token,
                  "the server's admin token (default $SLUICE_ADMIN_TOKEN)");
    throttler_flags(c);
    c->callback([&, v] {
      exit_code = sluice::cli::run_throttler_admin(throttler, v, throttled_app, throttle_duration,
                                                   throttle_ratio);
    });
  }
  std::string rule_metrics;
  std::vector<std::string> rule_thresholds;
  bool rule_clear = false;
  CLI::App* trule = throttler_cmd->add_subcommand(
      "rule", "set APP's metric set and thresholds at run time (kept across restarts)");
  trule->add_option("app", throttled_app, "the app (all: apps without a rule of their own)")
      ->required();
  trule->add_option("--metrics", rule_metrics,
                    "the metrics APP is checked on, comma-separated (-: drop the run-time set)");
  trule->add_option("--threshold", rule_thresholds,
                    "METRIC=NUMBER, APP's own threshold (repeatable; 0 drops it)");
  trule->add_flag("--clear", rule_clear, "drop APP's run-time metric set and thresholds first");
  trule->add_option("--token", throttler.token,
                    "the server's admin token (default $SLUICE_ADMIN_TOKEN)");
  throttler_flags(trule);
  trule->callback([&] {
    exit_code = sluice::cli::run_throttler_rule(throttler, throttled_app, rule_metrics,
                                                rule_thresholds, rule_clear);
  });
  CLI::App* tapps = throttler_cmd->add_subcommand(
      "apps", "the apps with rules, and the apps that checked (counts, rate, last address)");
  throttler_flags(tapps);
  tapps->callback([&] { exit_code = sluice::cli::run_throttler_apps(throttler); });

  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
