// serve.h: `sluice serve`: the server (gRPC + HTTP) over a config file or the embedded default.
#pragma once

#include <string>

namespace sluice::cli {

struct ServeOptions {
  std::string config;  // empty: the embedded default (config/default.yaml)
  std::string grpc;    // overrides server.grpc when set (port 0: any free port)
  std::string http;    // overrides server.http when set
  int http_threads = 1;
};

// The embedded default config's YAML text.
const char* default_config_yaml();

// Runs until SIGTERM or SIGINT; SIGHUP reloads the config file. Exit code 0 after a clean
// shutdown, 1 when the config or a listener fails.
int run_serve(const ServeOptions& options);

}  // namespace sluice::cli
