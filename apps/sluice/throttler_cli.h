// throttler_cli.h: `sluice throttler check|throttle|unthrottle|exempt|apps`: a running server's
// throttler over its HTTP API (the check as batch jobs ask it; the admin verbs with the server's
// admin token).
#pragma once

#include <string>
#include <vector>

namespace sluice::cli {

struct ThrottlerCliOptions {
  std::string http = "http://127.0.0.1:8080";  // the server's HTTP base URL
  std::string token;                           // the server's admin token (admin verbs)
  std::string shard;                           // empty: the first throttler
  double timeout_seconds = 5;
  bool json = false;
};

struct ThrottlerCheckArgs {
  std::string app = "sluice-cli";
  std::string scope;
  bool low_priority = false;
  std::string wait;  // a duration: wait (with backoff) until allowed; empty: one check
};

// Exit codes: 0 allowed / done, 1 refused (or still refused when the wait ran out), 2 error
// (the throttler unreachable, an unknown shard or metric, a bad argument, an admin verb
// refused).
int run_throttler_check(const ThrottlerCliOptions& o, const ThrottlerCheckArgs& a);
// verb: "throttle" (duration, ratio), "unthrottle", "exempt" / "unexempt".
int run_throttler_admin(const ThrottlerCliOptions& o, const std::string& verb,
                        const std::string& app, const std::string& duration,
                        const std::string& ratio);
// An app's metric set and thresholds at run time: `metrics` "lag,load" (empty: unchanged; "-":
// drop the run-time set), `thresholds` "lag=2" each (0 drops one), `clear`: drop both first.
int run_throttler_rule(const ThrottlerCliOptions& o, const std::string& app,
                       const std::string& metrics, const std::vector<std::string>& thresholds,
                       bool clear);
int run_throttler_apps(const ThrottlerCliOptions& o);

}  // namespace sluice::cli
